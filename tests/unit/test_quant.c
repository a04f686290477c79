/* test_quant.c - the quantizer: RTN conversion equals the reference
 * from_float, the importance-weighted search never loses to RTN on its own
 * weighted error (q4_0/q4_1/q5_0, random rows and random importances),
 * type parsing/fallback/recipe, and load-time conversion of the default
 * model (accounting, restore, out-of-memory leaves the model unchanged;
 * skipped with a note when the model file is absent). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype.h"
#include "quant/quant.h"
#include "quant/quant_load.h"
#include "testutil.h"

enum { N = 512 };

static double werr(uint32_t t, const float *x, const float *imp, const void *q)
{
    float y[N];
    dtype_get(t)->to_float(q, y, N);
    double e = 0;
    for (int i = 0; i < N; i++)
        e += (imp ? imp[i] : 1.0) * (x[i] - y[i]) * (x[i] - y[i]);
    return e;
}

static void test_imp(tu_rng *r)
{
    static const uint32_t types[] = {DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q8_0};
    float x[N], imp[N];
    uint8_t a[N * 2], b[N * 2];
    for (size_t k = 0; k < 4; k++) {
        double e_rtn = 0, e_imp = 0, e_rtn_u = 0, e_uni = 0;
        for (int row = 0; row < 20; row++) {
            for (int i = 0; i < N; i++) {
                x[i] = tu_rand_normal(r) * (1 + (i % 7 == 0) * 3);
                float g = tu_rand_normal(r);
                imp[i] = g * g * (i % 5 == 0 ? 20.0f : 1.0f);
            }
            dtype_get(types[k])->from_float(x, a, N);
            quant_row_imp(types[k], x, imp, b, N);
            e_rtn += werr(types[k], x, imp, a);
            e_imp += werr(types[k], x, imp, b);
            quant_row_imp(types[k], x, NULL, b, N);
            e_rtn_u += werr(types[k], x, NULL, a);
            e_uni += werr(types[k], x, NULL, b);
        }
        printf("%s: weighted err RTN %.3f imp %.3f (%.0f%% lower); unweighted RTN %.3f search %.3f\n",
               dtype_get(types[k])->name, e_rtn, e_imp, 100 * (1 - e_imp / e_rtn), e_rtn_u, e_uni);
        CHECKF(e_imp < 0.9 * e_rtn, "%s imp %g rtn %g", dtype_get(types[k])->name, e_imp, e_rtn);
        CHECKF(e_uni < e_rtn_u * 1.02, "%s uniform search %g rtn %g", dtype_get(types[k])->name,
               e_uni, e_rtn_u);
    }
}

static void test_convert(tu_rng *r)
{
    float x[2 * N], tmp[N];
    uint8_t ref[2 * N * 2], got[2 * N * 2];
    for (int i = 0; i < 2 * N; i++)
        x[i] = tu_rand_normal(r);
    static const uint32_t types[] = {DT_Q8_0, DT_Q4_0, DT_Q4_K, DT_Q6_K, DT_F16, DT_MXFP4};
    for (size_t k = 0; k < 6; k++) {
        size_t rb = dtype_row_size(types[k], N);
        dtype_get(types[k])->from_float(x, ref, N);
        dtype_get(types[k])->from_float(x + N, ref + rb, N);
        quant_convert(DT_F32, x, types[k], got, N, 2, NULL, tmp);
        CHECKF(!memcmp(ref, got, 2 * rb), "convert f32->%s != from_float", dtype_get(types[k])->name);
    }
    /* q8_0 -> q8_0 is a copy */
    quant_convert(DT_Q8_0, ref, DT_Q8_0, got, N, 1, NULL, tmp);
    CHECK(!memcmp(ref, got, dtype_row_size(DT_Q8_0, N)));
}

static void test_names(void)
{
    kvant_err err = {0};
    int fell;
    CHECK(quant_parse_type("Q4_K", &err) == DT_Q4_K);
    CHECK(quant_parse_type("q8_0", &err) == DT_Q8_0);
    CHECK(quant_parse_type("mxfp4", &err) == DT_MXFP4);
    CHECK(quant_fit_type(DT_MXFP4, 576, &fell) == DT_MXFP4 && !fell);
    CHECK(quant_parse_type("q9_9", &err) < 0 && strstr(err.msg, "q9_9"));
    CHECK(quant_parse_type("q8_K", &err) < 0);
    CHECK(quant_parse_type(NULL, &err) < 0);
    CHECK(quant_fit_type(DT_Q4_K, 576, &fell) == DT_Q8_0 && fell);
    CHECK(quant_fit_type(DT_Q4_0, 576, &fell) == DT_Q4_0 && !fell);
    CHECK(quant_fit_type(DT_Q4_0, 20, &fell) == DT_F16 && fell);
    CHECK(quant_is_matrix("blk.0.attn_q.weight", 2) && !quant_is_matrix("blk.0.attn_norm.weight", 1));
    CHECK(quant_recipe_type("q4_k_m", "blk.0.attn_v.weight", 576, 30) == DT_Q5_0);
    CHECK(quant_recipe_type("q4_k_m", "blk.0.ffn_down.weight", 1536, 30) == DT_Q6_K);
    CHECK(quant_recipe_type("q4_k_m", "blk.4.ffn_down.weight", 1536, 30) == DT_Q4_K);
    CHECK(quant_recipe_type("q4_k_m", "blk.4.ffn_up.weight", 576, 30) == DT_Q4_0);
    CHECK(quant_recipe_type("q4_k_m", "output.weight", 4096, 30) == DT_Q6_K);
    CHECK(quant_recipe_type("q3_x", "output.weight", 4096, 30) == -1);
}

static void test_load(void)
{
    const char *path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    kvant_err err = {0};
    model *m = model_load(path, &err);
    if (!m) {
        printf("load-time test skipped: %s\n", err.msg);
        return;
    }
    mem_mgr *mem = mem_create(1ull << 32, mem_allocator_host(), &err);
    model_tensor before = m->layers[3].w_down, norm = m->layers[3].ffn_norm;
    mem_fail_nth(mem, 40);
    CHECK(quant_weights_apply(m, DT_Q8_0, mem, &err) == NULL && err.code == KV_ENOMEM);
    CHECK(mem_used(mem) == 0 && m->layers[3].w_down.dev == before.dev);
    quant_weights *qw = quant_weights_apply(m, DT_Q8_0, mem, &err);
    CHECK(qw != NULL);
    if (qw) {
        model_tensor *t = &m->layers[3].w_down;
        CHECK(t->type == DT_Q8_0 && t->dev != t->data && t->nbytes == t->row_bytes * t->ne[1]);
        CHECK(m->layers[3].ffn_norm.dev == norm.dev && m->layers[3].ffn_norm.type == DT_F32);
        CHECK(m->output.dev == m->tok_embd.dev || !m->tied_output);
        CHECK(mem_used(mem) == quant_weights_bytes(qw));
        /* one row dequantized from the copy is close to the original */
        float a[1536], b[1536];
        dtype_get(before.type)->to_float(before.data, a, before.ne[0]);
        dtype_get(t->type)->to_float(t->dev, b, t->ne[0]);
        double e = 0, s = 0;
        for (int i = 0; i < before.ne[0]; i++)
            e += (a[i] - b[i]) * (a[i] - b[i]), s += a[i] * a[i];
        CHECKF(sqrt(e / s) < 0.01, "q8_0 rel err %g", sqrt(e / s));
        quant_weights_free(qw);
        CHECK(mem_used(mem) == 0 && !memcmp(t, &before, sizeof before));
    }
    CHECK(quant_weights_apply(m, DT_Q8_K, mem, &err) == NULL && err.code == KV_EINVAL);
    mem_destroy(mem);
    model_free(m);
}

int main(void)
{
    dtype_init();
    tu_rng r = {777};
    test_imp(&r);
    test_convert(&r);
    test_names();
    test_load();
    return tu_finish("quant");
}
