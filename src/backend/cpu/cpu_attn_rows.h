/* cpu_attn_rows.h - the attention rows' data and function types, and the
 * SIMD twins of the rows and of SwiGLU (cpu_ops_avx2.c, cpu_ops_avx512.c).  Header
 * only: cpu_ops.h and cpu_kv.h, whose .c files pick a row once per KV
 * layout and call it, include it, and so do the SIMD files, which include
 * no header of the module that calls them. */
#ifndef KVANT_CPU_ATTN_ROWS_H
#define KVANT_CPU_ATTN_ROWS_H

#include <math.h>
#include <stdint.h>

/* One query head of one token against positions [p0, n_pos) of a sequence,
 * read through its block table (f32 K/V), online softmax in block order.
 * K of position j is at k_base + table[j / block_size] * block_stride +
 * (j % block_size) * row_stride (head offset already applied to k_base);
 * V likewise.  scratch: [block_size] floats.  p0 > 0: a sliding window
 * (positions before p0 are not read); softcap > 0: each scaled score s
 * becomes softcap * tanh(s / softcap) (attn_softcap); sinks: the softmax of
 * the call's g-th query head also holds exp(sinks[g]), a logit with no value
 * (NULL: none; attn_start). */
typedef struct cpu_attn_seq {
    const float *k_base;
    const float *v_base;
    const int32_t *table;
    int64_t block_stride;
    int64_t row_stride;
    int32_t block_size;
    int32_t p0;
    float softcap;
    const float *sinks;
} cpu_attn_seq;

/* The online softmax's start for the call's g-th head: no mass, or a sink's
 * (its logit the running max, its weight 1, its value none). */
static inline void attn_start(const float *sinks, int32_t g, float *m, float *l)
{
    *m = sinks ? sinks[g] : -INFINITY;
    *l = sinks ? 1.0f : 0.0f;
}

/* The score transform every row applies after the scale (the reference). */
static inline float attn_softcap(float s, float cap)
{
    return cap > 0.0f ? cap * tanhf(s / cap) : s;
}
typedef void (*cpu_attn_row_fn)(const float *q, const cpu_attn_seq *s, int32_t n_pos,
                                int32_t head_dim, float scale, float *scratch, float *out);

/* One sequence's stored K/V for one KV head, addressed in bytes: K of
 * position j is at k_base + table[j / block_size] * block_stride +
 * (j % block_size) * row_stride (head offset already applied); V likewise. */
typedef struct cpu_kvq_seq {
    const uint8_t *k_base;
    const uint8_t *v_base;
    const int32_t *table;
    int64_t block_stride; /* bytes */
    int64_t row_stride;   /* bytes */
    int32_t block_size;
    uint32_t type;
    int32_t p0;           /* first position read (sliding window), as cpu_attn_seq */
    float softcap;        /* as cpu_attn_seq */
    const float *sinks;   /* as cpu_attn_seq */
} cpu_kvq_seq;

/* An attention row over stored rows: out[head_dim] = softmax(q . K_j *
 * scale) V over positions [0, n_pos), online softmax block by block (same
 * order as cpu_attention_row_ref).  q.K is the type's vec_dot on the
 * stored key slice; each V slice is dequantized into scratch (one head_dim
 * row at a time, never the cache). */
typedef void (*cpu_kvq_row_fn)(const float *q, const cpu_kvq_seq *s, int32_t n_pos,
                               int32_t head_dim, float scale, float *scratch, float *out);

/* The SIMD twins: equal to the references (cpu_attention_row_ref,
 * cpu_kvq_attention_row_ref) within rounding (vector exp(); test_ops
 * bounds it).  f32 K/V, AVX-512 (head_dim % 16 == 0): */
void cpu_attention_row_avx512(const float *q, const cpu_attn_seq *s, int32_t n_pos,
                              int32_t head_dim, float scale, float *scratch, float *out);
/* f16 K/V, AVX2 + FMA + F16C (head_dim % 8 == 0): */
void cpu_kvq_attention_row_f16_avx2(const float *q, const cpu_kvq_seq *s, int32_t n_pos,
                                    int32_t head_dim, float scale, float *scratch, float *out);

/* Query heads of one token that share a KV head, attended together: q and
 * out hold nq (1..CPU_ATTN_GROUP_MAX) rows of head_dim; scratch: [nq]
 * [block_size] floats.  Each head's out is bitwise the row function's
 * (cpu_kvq_attention_group_for pairs them): the K and V rows are read and
 * converted once for all nq heads. */
#define CPU_ATTN_GROUP_MAX 4
typedef void (*cpu_kvq_group_fn)(const float *q, int32_t nq, const cpu_kvq_seq *s, int32_t n_pos,
                                 int32_t head_dim, float scale, float *scratch, float *out);
/* The twin of cpu_kvq_attention_row_f16_avx2 (f16 K/V, head_dim % 8 == 0). */
void cpu_kvq_attention_group_f16_avx2(const float *q, int32_t nq, const cpu_kvq_seq *s,
                                      int32_t n_pos, int32_t head_dim, float scale,
                                      float *scratch, float *out);
/* The other stored KV dtypes on AVX2 + FMA + F16C, row and group as for f16:
 * bf16 (head_dim % 8 == 0), q8_0 and q4_0 (head_dim % 32 == 0). */
void cpu_kvq_attention_row_bf16_avx2(const float *q, const cpu_kvq_seq *s, int32_t n_pos,
                                     int32_t head_dim, float scale, float *scratch, float *out);
void cpu_kvq_attention_group_bf16_avx2(const float *q, int32_t nq, const cpu_kvq_seq *s,
                                       int32_t n_pos, int32_t head_dim, float scale,
                                       float *scratch, float *out);
void cpu_kvq_attention_row_q8_0_avx2(const float *q, const cpu_kvq_seq *s, int32_t n_pos,
                                     int32_t head_dim, float scale, float *scratch, float *out);
void cpu_kvq_attention_group_q8_0_avx2(const float *q, int32_t nq, const cpu_kvq_seq *s,
                                       int32_t n_pos, int32_t head_dim, float scale,
                                       float *scratch, float *out);
void cpu_kvq_attention_row_q4_0_avx2(const float *q, const cpu_kvq_seq *s, int32_t n_pos,
                                     int32_t head_dim, float scale, float *scratch, float *out);
void cpu_kvq_attention_group_q4_0_avx2(const float *q, int32_t nq, const cpu_kvq_seq *s,
                                       int32_t n_pos, int32_t head_dim, float scale,
                                       float *scratch, float *out);

/* Tokens of one sequence attended together (a prefill chunk): nt
 * (1..CPU_ATTN_TILE_MAX) tokens of nq heads each, token x's heads at
 * q + x * stride and out + x * stride, its positions [p0[x], n_pos[x])
 * (s->p0 is not read).  Each block's K and V rows are converted once for
 * all the tokens; each token's out is bitwise the group kernel's.
 * scratch: cpu_kvq_scratch floats. */
#define CPU_ATTN_TILE_MAX 16
typedef void (*cpu_kvq_tile_fn)(const float *q, int32_t nq, int32_t nt, int64_t stride,
                                const cpu_kvq_seq *s, const int32_t *p0, const int32_t *n_pos,
                                int32_t head_dim, float scale, float *scratch, float *out);
#define CPU_KVQ_TILE_DECL(sfx, isa)                                                             \
    void cpu_kvq_attention_tile_##sfx##_##isa(const float *q, int32_t nq, int32_t nt,           \
                                              int64_t stride, const cpu_kvq_seq *s,             \
                                              const int32_t *p0, const int32_t *n_pos,          \
                                              int32_t head_dim, float scale, float *scratch,    \
                                              float *out)
CPU_KVQ_TILE_DECL(f16, avx2);
CPU_KVQ_TILE_DECL(bf16, avx2);
CPU_KVQ_TILE_DECL(q8_0, avx2);
CPU_KVQ_TILE_DECL(q4_0, avx2);
/* The AVX-512 builds of the AVX2 rows, groups and tiles (the same source,
 * with AVX-512's thirty-two registers: wider register tiles, every sum in
 * the same order): bitwise the AVX2 entries' results, for AVX-512 CPUs. */
#define CPU_KVQ_AVX512_DECL(sfx)                                                                \
    void cpu_kvq_attention_row_##sfx##_avx512(const float *q, const cpu_kvq_seq *s,             \
                                              int32_t n_pos, int32_t head_dim, float scale,     \
                                              float *scratch, float *out);                      \
    void cpu_kvq_attention_group_##sfx##_avx512(const float *q, int32_t nq,                     \
                                                const cpu_kvq_seq *s, int32_t n_pos,            \
                                                int32_t head_dim, float scale, float *scratch,  \
                                                float *out);                                    \
    CPU_KVQ_TILE_DECL(sfx, avx512)
CPU_KVQ_AVX512_DECL(f16);
CPU_KVQ_AVX512_DECL(bf16);
CPU_KVQ_AVX512_DECL(q8_0);
CPU_KVQ_AVX512_DECL(q4_0);
/* Stores a K or V row: dst = the KV dtype's row of src[0..n). */
typedef void (*cpu_kv_store_fn)(const float *src, void *dst, int64_t n);
/* The f16 store with F16C: bitwise half_f32_to_fp16 of every value (round
 * to nearest even; a NaN becomes the sign and 0x7E00, where F16C would keep
 * its payload). */
void cpu_kv_store_f16_avx2(const float *src, void *dst, int64_t n);
/* cpu_swiglu's (cpu_ops.h) AVX2 + FMA twin: every element through the same
 * 8-wide arithmetic (a short tail padded, not scalar), so an element's
 * result does not depend on where a call's range starts or ends; sigmoid's
 * exp() is the attention rows' vector polynomial (~2 ulp from expf;
 * test_ops bounds it).  Declared here with the attention twins because
 * cpu_ops_avx2.c includes no other header of its module. */
void cpu_swiglu_avx2(const float *gate, const float *up, float *out, int64_t n);

/* The attention rows of the current KV layout, and its K/V row store,
 * picked once in cpu_kv_init from the kernels' ISA (cpu_backend.isa), the
 * KV dtype and head_dim; attn_worker and cpu_kv_store call through them. */
typedef struct cpu_attn_rows {
    cpu_attn_row_fn f32; /* f32 K/V rows */
    cpu_kvq_row_fn kvq;  /* K/V rows stored in another dtype */
    cpu_kvq_group_fn kvq_group; /* several heads of one KV head at once, or NULL */
    cpu_kvq_tile_fn kvq_tile;   /* several tokens of a sequence at once, or NULL */
    cpu_kv_store_fn store;      /* a K or V row into the pool */
} cpu_attn_rows;

#endif
