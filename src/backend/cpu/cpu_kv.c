/* cpu_kv.c - quantized KV rows: store with the type's reference quantizer,
 * attend with the type's vec_dot for q.K and a per-row dequantized V slice.
 *
 * Invariant: reduction order per output element depends only on n_pos and
 * the block size, never on threads or batch (as in cpu_attention_row_ref).
 */
#include "backend/cpu/cpu_kv.h"

#include <math.h>
#include <string.h>

#include "kernels/dtype.h"
#include "kernels/kvdtype.h"
#include "util/arch.h"

int cpu_kv_check(uint32_t type, int32_t head_dim, kvant_err *err)
{
    const dtype_traits *tr = dtype_get(type);
    char list[64];
    if (!tr || !kvdtype_ok(type))
        return kvant_err_set(err, KV_EUNSUP, "kv dtype %u: supported are %s", type,
                             kvdtype_list(list, sizeof list));
    if (head_dim < 1 || head_dim % tr->block_size)
        return kvant_err_set(err, KV_EUNSUP, "kv dtype %s needs head_dim a multiple of %d (got %d)",
                             tr->name, tr->block_size, head_dim);
    return KV_OK;
}

cpu_kv_store_fn cpu_kv_store_for(kernel_isa isa, uint32_t type)
{
#if KVANT_X86
    if ((isa == KERNEL_ISA_AVX2 || isa == KERNEL_ISA_AVX512) && type == DT_F16)
        return cpu_kv_store_f16_avx2;
#endif
    (void)isa;
    return dtype_get(type)->from_float;
}

int64_t cpu_kvq_scratch(int32_t block_size, int32_t head_dim)
{
    /* the group's scores; the tile's block of K and V rows as f32 and its
     * tokens' running max and sum; the scalar row's dequantized V row */
    return (int64_t)block_size * CPU_ATTN_GROUP_MAX + 2 * (int64_t)block_size * head_dim +
           2 * CPU_ATTN_TILE_MAX * CPU_ATTN_GROUP_MAX + head_dim + 16;
}

const int32_t *cpu_kv_budget_table(const int32_t *table, int32_t block_size, int32_t sink_blocks,
                                   int32_t recent, int32_t pos, int32_t *vt, int32_t *n_pos)
{
    *n_pos = pos + 1;
    const int32_t lo = pos - recent + 1;
    const int32_t wb = recent > 0 && lo > 0 ? lo / block_size : 0;
    if (wb <= sink_blocks)
        return table; /* nothing skipped yet */
    const int32_t last = pos / block_size;
    memcpy(vt, table, (size_t)sink_blocks * sizeof *vt);
    memcpy(vt + sink_blocks, table + wb, (size_t)(last - wb + 1) * sizeof *vt);
    *n_pos = (sink_blocks - wb) * block_size + pos + 1;
    return vt;
}

#if KVANT_X86
/* The SIMD attention entries of a stored KV dtype and the head sizes they
 * take: the AVX2 rows, groups and tiles ([0]) and their AVX-512 builds
 * ([1]), which serve AVX-512 CPUs: the group and tile twins read each K/V
 * row once for all heads and tokens (docs/PERFORMANCE.md, "Attention on
 * AVX-512"), in wider register tiles than AVX2's sixteen registers hold,
 * with the same bits. */
typedef struct kvq_simd {
    uint32_t type;
    int32_t hd_mult;
    cpu_kvq_row_fn row[2];
    cpu_kvq_group_fn group[2];
    cpu_kvq_tile_fn tile[2];
} kvq_simd;

#define KVQ_SIMD(t, mult, sfx)                                                                  \
    {t, mult, {cpu_kvq_attention_row_##sfx##_avx2, cpu_kvq_attention_row_##sfx##_avx512},      \
     {cpu_kvq_attention_group_##sfx##_avx2, cpu_kvq_attention_group_##sfx##_avx512},           \
     {cpu_kvq_attention_tile_##sfx##_avx2, cpu_kvq_attention_tile_##sfx##_avx512}}
static const kvq_simd k_kvq_simd[] = {KVQ_SIMD(DT_F16, 8, f16), KVQ_SIMD(DT_BF16, 8, bf16),
                                      KVQ_SIMD(DT_Q8_0, 32, q8_0), KVQ_SIMD(DT_Q4_0, 32, q4_0)};

/* The entries for (isa, type, head_dim) and in *col the ISA's column, or
 * NULL (no SIMD entries: the scalar row). */
static const kvq_simd *kvq_simd_for(kernel_isa isa, uint32_t type, int32_t head_dim, int *col)
{
    if (isa != KERNEL_ISA_AVX2 && isa != KERNEL_ISA_AVX512)
        return NULL;
    *col = isa == KERNEL_ISA_AVX512;
    for (size_t i = 0; i < sizeof k_kvq_simd / sizeof k_kvq_simd[0]; i++)
        if (k_kvq_simd[i].type == type && head_dim % k_kvq_simd[i].hd_mult == 0)
            return &k_kvq_simd[i];
    return NULL;
}
#endif

cpu_kvq_group_fn cpu_kvq_attention_group_for(kernel_isa isa, uint32_t type, int32_t head_dim)
{
#if KVANT_X86
    int col = 0;
    const kvq_simd *e = kvq_simd_for(isa, type, head_dim, &col);
    return e ? e->group[col] : NULL;
#else
    (void)isa, (void)type, (void)head_dim;
    return NULL;
#endif
}

cpu_kvq_tile_fn cpu_kvq_attention_tile_for(kernel_isa isa, uint32_t type, int32_t head_dim)
{
#if KVANT_X86
    int col = 0;
    const kvq_simd *e = kvq_simd_for(isa, type, head_dim, &col);
    return e ? e->tile[col] : NULL;
#else
    (void)isa, (void)type, (void)head_dim;
    return NULL;
#endif
}

cpu_kvq_row_fn cpu_kvq_attention_row_for(kernel_isa isa, uint32_t type, int32_t head_dim)
{
#if KVANT_X86
    int col = 0;
    const kvq_simd *e = kvq_simd_for(isa, type, head_dim, &col);
    if (e)
        return e->row[col];
#endif
    (void)isa, (void)type, (void)head_dim;
    return cpu_kvq_attention_row_ref;
}

void cpu_kvq_attention_row_ref(const float *q, const cpu_kvq_seq *s, int32_t n_pos,
                               int32_t head_dim, float scale, float *scratch, float *out)
{
    const dtype_traits *tr = dtype_get(s->type);
    float *vrow = scratch + s->block_size; /* [head_dim] one dequantized V slice */
    float m, l;
    attn_start(s->sinks, 0, &m, &l);
    for (int32_t d = 0; d < head_dim; d++)
        out[d] = 0.0f;
    for (int32_t start = s->p0 - s->p0 % s->block_size; start < n_pos; start += s->block_size) {
        const int32_t lo = start < s->p0 ? s->p0 - start : 0; /* window start in this block */
        int32_t blk = s->table[start / s->block_size];
        int32_t cnt = (n_pos - start < s->block_size ? n_pos - start : s->block_size) - lo;
        const uint8_t *kb = s->k_base + (int64_t)blk * s->block_stride + (int64_t)lo * s->row_stride;
        const uint8_t *vb = s->v_base + (int64_t)blk * s->block_stride + (int64_t)lo * s->row_stride;
        float bm = -INFINITY;
        for (int32_t j = 0; j < cnt; j++) {
            scratch[j] = attn_softcap(tr->vec_dot(head_dim, kb + j * s->row_stride, q) * scale, s->softcap);
            bm = scratch[j] > bm ? scratch[j] : bm;
        }
        float m_new = bm > m ? bm : m;
        float corr = expf(m - m_new);
        l *= corr;
        for (int32_t d = 0; d < head_dim; d++)
            out[d] *= corr;
        for (int32_t j = 0; j < cnt; j++) {
            float p = expf(scratch[j] - m_new);
            tr->to_float(vb + j * s->row_stride, vrow, head_dim);
            l += p;
            for (int32_t d = 0; d < head_dim; d++)
                out[d] += p * vrow[d];
        }
        m = m_new;
    }
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int32_t d = 0; d < head_dim; d++)
        out[d] *= inv;
}
