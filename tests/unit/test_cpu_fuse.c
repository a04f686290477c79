/* test_cpu_fuse.c - the CPU backend's fused steps against their unfused
 * composition, bitwise:
 *  - matmul_glu (gate and up rows of one claim, then act(gate) * up on
 *    them) against matmul_n of {gate, up} followed by swiglu or geglu, for
 *    f32 (exact path), q4_0 and q8_0 (int8 path), q4_0 with q8_0 (one job,
 *    two types), q4_0 packed as the loader packs it, f32 with q4_0 (two
 *    paths: the fallback), with and without BACKEND_EXACT, and 1, 3 and 37
 *    tokens (one decode row up to several claims of tiles);
 *  - every row of a matmul written once whatever the claims (row counts
 *    from 1 to 4099), against the rows computed in one call;
 *  - rope through the step's cos/sin table (steps up to CPU_ROPE_TOKENS
 *    tokens, two distinct rope settings sharing the slots, a third one
 *    past them) and through each worker's own tables (longer steps, a few
 *    tokens at a time) against cpu_rope_table + cpu_rope_head per token;
 *  - cpu_rmsnorm_row and cpu_rmsnorm_rows (four rows' sums at a time,
 *    the scaling four values at a time) against the plain scalar
 *    specification, 1 to 9 rows of 203 (a tail), into another buffer and
 *    in place. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_ops.h"
#include "kernels/dtype.h"
#include "kernels/matmul.h"
#include "kernels/qpack.h"
#include "testutil.h"

enum { NE0 = 256, ROWS = 200, MAX_TOK = 37 };

typedef struct fx {
    mem_mgr *mem;
    backend *be;
} fx;

static void fx_open(fx *f, unsigned flags)
{
    kvant_err err = {0};
    f->mem = mem_create(1ull << 30, mem_allocator_host(), &err);
    f->be = cpu_backend_create(f->mem, 2, flags, &err);
    KV_ASSERT(f->mem && f->be);
}

static void fx_close(fx *f)
{
    f->be->ops->destroy(f->be);
    CHECK(mem_live_count(f->mem) == 0);
    mem_destroy(f->mem);
}

/* A [rows][ne0] weight of type (packed when asked and supported), random. */
static model_tensor weight(tu_rng *r, uint32_t type, int64_t ne0, int64_t rows, int pack)
{
    const dtype_traits *tr = dtype_get(type);
    float *f = malloc((size_t)(ne0 * rows) * sizeof *f);
    for (int64_t i = 0; i < ne0 * rows; i++)
        f[i] = tu_rand_normal(r) * 0.3f;
    model_tensor t = {0};
    t.type = type;
    t.ne[0] = ne0;
    t.ne[1] = rows;
    t.row_bytes = dtype_row_size(type, ne0);
    t.nbytes = t.row_bytes * (uint64_t)rows;
    void *q = malloc(t.nbytes);
    KV_ASSERT(f && q);
    if (type == DT_F32)
        memcpy(q, f, t.nbytes);
    else
        tr->from_float(f, q, ne0 * rows);
    if (pack && dtype_matmul_packs(type, ne0)) { /* as the loader: where the ISA packs */
        qpack_rows(type, q, q, ne0, rows, t.row_bytes);
        t.packed = 1;
    }
    free(f);
    t.data = t.dev = q;
    t.layer = -1;
    return t;
}

/* One case: fused against unfused over n tokens, both activations. */
static void glu_case(fx *f, uint32_t type, uint32_t up_type, int pack, int32_t n, tu_rng *r)
{
    const backend_ops *op = f->be->ops;
    model_tensor wg = weight(r, type, NE0, ROWS, pack), wu = weight(r, up_type, NE0, ROWS, pack);
    float *x = malloc((size_t)n * NE0 * sizeof *x);
    float *g0 = malloc((size_t)n * ROWS * sizeof *g0), *u0 = malloc((size_t)n * ROWS * sizeof *u0);
    float *g1 = malloc((size_t)n * ROWS * sizeof *g1), *u1 = malloc((size_t)n * ROWS * sizeof *u1);
    for (int64_t i = 0; i < (int64_t)n * NE0; i++)
        x[i] = tu_rand_normal(r);
    int32_t toks[MAX_TOK] = {0}, pos[MAX_TOK] = {0}, seq[MAX_TOK] = {0};
    fwd_seq s = {0};
    fwd_batch b = {n, toks, pos, seq, 1, &s, 0, NULL, 0};
    kvant_err err = {0};
    op->begin_batch(f->be, &b, &err);
    for (int gelu = 0; gelu < 2; gelu++) {
        const model_tensor *W[2] = {&wg, &wu}, *nb[2] = {NULL, NULL};
        float *y[2] = {g0, u0};
        op->matmul_n(f->be, 2, W, nb, x, y, n);
        (gelu ? op->geglu : op->swiglu)(f->be, g0, u0, g0, (int64_t)n * ROWS);
        memset(g1, 0xff, (size_t)n * ROWS * sizeof *g1); /* NaN: every value is written */
        op->matmul_glu(f->be, &wg, &wu, x, g1, u1, n, gelu);
        CHECKF(memcmp(g0, g1, (size_t)n * ROWS * sizeof *g0) == 0,
               "types %u/%u packed %d n %d gelu %d: fused differs", type, up_type, wg.packed, n,
               gelu);
    }
    free((void *)wg.data);
    free((void *)wu.data);
    free(x), free(g0), free(u0), free(g1), free(u1);
}

static void test_glu(void)
{
    tu_rng r = {777};
    static const int32_t ns[] = {1, 3, MAX_TOK};
    for (unsigned exact = 0; exact < 2; exact++) {
        fx f;
        fx_open(&f, exact ? BACKEND_EXACT : 0);
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
            glu_case(&f, DT_F32, DT_F32, 0, ns[i], &r);
            glu_case(&f, DT_Q4_0, DT_Q4_0, 0, ns[i], &r);
            glu_case(&f, DT_Q8_0, DT_Q8_0, 0, ns[i], &r);
            glu_case(&f, DT_Q4_0, DT_Q8_0, 0, ns[i], &r); /* two types, one job */
            glu_case(&f, DT_F32, DT_Q4_0, 0, ns[i], &r);  /* two paths: the fallback */
            if (!exact) /* packed rows exist only on the int8 path */
                glu_case(&f, DT_Q4_0, DT_Q4_0, 1, ns[i], &r);
        }
        fx_close(&f);
    }
}

/* Every row of a matmul is written once, whatever the claims (the job's
 * last chunks are split into quarters): ops->matmul of q8_0 weights of
 * several row counts against the rows computed in one call on this
 * thread (dtype_matmul_rows_q), bitwise. */
static void test_claims(void)
{
    static const int64_t rows_of[] = {1, 5, 64, 100, 1000, 4099};
    fx f;
    fx_open(&f, 0);
    tu_rng r = {4242};
    enum { N = 3 };
    for (size_t i = 0; i < sizeof rows_of / sizeof rows_of[0]; i++) {
        const int64_t rows = rows_of[i];
        model_tensor w = weight(&r, DT_Q8_0, NE0, rows, 0);
        float x[N * NE0];
        float *got = malloc((size_t)(N * rows) * sizeof *got);
        float *ref = malloc((size_t)(N * rows) * sizeof *ref);
        for (int j = 0; j < N * NE0; j++)
            x[j] = tu_rand_normal(&r);
        int32_t toks[N] = {0}, pos[N] = {0}, seq[N] = {0};
        fwd_seq s = {0};
        fwd_batch b = {N, toks, pos, seq, 1, &s, 0, NULL, 0};
        kvant_err err = {0};
        f.be->ops->begin_batch(f.be, &b, &err);
        memset(got, 0xff, (size_t)(N * rows) * sizeof *got);
        f.be->ops->matmul(f.be, &w, NULL, x, got, N);
        dtype_matmul_rows_q(DT_Q8_0, w.data, w.row_bytes, 0, rows, NE0, x, NULL, N, ref, rows);
        CHECKF(memcmp(got, ref, (size_t)(N * rows) * sizeof *got) == 0, "%lld rows differ",
               (long long)rows);
        free((void *)w.data);
        free(got), free(ref);
    }
    fx_close(&f);
}

/* The rope op on n tokens at scattered positions (new ones each step)
 * against the per-token reference, for settings a and b (the two slots;
 * they differ only in base and kind) and c (past them), each used twice
 * (the second use reads the table the first filled). */
static void test_rope(void)
{
    enum { H = 3, HD = 64 };
    fx f;
    fx_open(&f, 0);
    tu_rng r = {99};
    rope_params rp[3] = {
        {.kind = ROPE_NEOX, .n_rot = HD, .base = 10000.0f, .freq_scale = 1.0f, .mscale = 1.0f},
        {.kind = ROPE_NORM, .n_rot = HD, .base = 500000.0f, .freq_scale = 1.0f, .mscale = 1.0f},
        {.kind = ROPE_NEOX, .n_rot = 32, .base = 1000000.0f, .freq_scale = 0.25f, .mscale = 1.1f,
         .ext_factor = 1.0f, .corr_lo = 4.0f, .corr_hi = 20.0f},
    };
    static const int32_t ns[] = {1, 5, 32, 33, 45};
    for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++) {
        const int32_t n = ns[in];
        int32_t toks[64] = {0}, pos[64], seq[64] = {0};
        for (int32_t t = 0; t < n; t++)
            pos[t] = (t * 977 + 13 * (int32_t)in) % 4096;
        fwd_seq s = {0};
        fwd_batch b = {n, toks, pos, seq, 1, &s, 0, NULL, 0};
        kvant_err err = {0};
        f.be->ops->begin_batch(f.be, &b, &err);
        for (int use = 0; use < 2; use++)
            for (int k = 0; k < 3; k++) {
                float x[64 * H * HD], ref[64 * H * HD], cs[HD];
                for (int32_t i = 0; i < n * H * HD; i++)
                    x[i] = ref[i] = tu_rand_normal(&r);
                for (int32_t t = 0; t < n; t++) {
                    cpu_rope_table(pos[t], &rp[k], NULL, cs);
                    for (int32_t h = 0; h < H; h++)
                        cpu_rope_head(ref + (t * H + h) * HD, cs, &rp[k], HD);
                }
                f.be->ops->rope(f.be, x, H, HD, &rp[k]);
                CHECKF(memcmp(x, ref, (size_t)n * H * HD * sizeof *x) == 0,
                       "rope setting %d, %d tokens, use %d: differs from the reference", k, n, use);
            }
    }
    fx_close(&f);
}

static void test_rmsnorm_rows(void)
{
    enum { N = 203, R = 9 }; /* not a multiple of four: a tail */
    tu_rng r = {17};
    static float x[R * N], w[N], ref[R * N], y[R * N];
    for (int32_t i = 0; i < N; i++)
        w[i] = tu_rand_normal(&r);
    for (int64_t rows = 1; rows <= R; rows++) {
        for (int64_t i = 0; i < rows * N; i++)
            x[i] = tu_rand_normal(&r) * (i % 37 == 0 ? 30.0f : 1.0f);
        for (int64_t k = 0; k < rows; k++) { /* the specification, written plainly */
            double ss = 0.0;
            for (int32_t i = 0; i < N; i++)
                ss += (double)x[k * N + i] * x[k * N + i];
            const float scale = (float)(1.0 / sqrt(ss / N + 1e-5f));
            for (int32_t i = 0; i < N; i++)
                ref[k * N + i] = x[k * N + i] * scale * w[i];
        }
        cpu_rmsnorm_row(x + (rows - 1) * N, w, 1e-5f, y, N);
        CHECKF(memcmp(y, ref + (rows - 1) * N, N * sizeof *y) == 0,
               "rmsnorm row %lld == the plain specification", (long long)rows - 1);
        cpu_rmsnorm_rows(x, w, 1e-5f, y, N, rows);
        CHECKF(memcmp(y, ref, (size_t)(rows * N) * sizeof *y) == 0,
               "rmsnorm of %lld rows == the row function per row", (long long)rows);
        cpu_rmsnorm_rows(x, w, 1e-5f, x, N, rows);
        CHECKF(memcmp(x, ref, (size_t)(rows * N) * sizeof *x) == 0,
               "rmsnorm of %lld rows in place == the row function per row", (long long)rows);
    }
}

int main(void)
{
    dtype_init();
    test_rmsnorm_rows();
    test_glu();
    test_claims();
    test_rope();
    return tu_finish("test_cpu_fuse");
}
