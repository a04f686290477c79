/* test_plan.c - the what-fits planner against hand-computed cases. */
#include "mem/plan.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype.h"
#include "testutil.h"

/* SmolLM2-135M: 30 layers, n_embd 576, 9 heads (3 kv) of 64, n_ff 1536,
 * vocab 49152, trained context 8192.  weights: a round 100 MB. */
static plan_model smollm(void)
{
    plan_model m = { 30, 576, 9, 3, 64, 1536, 49152, 8192, 100000000ull, 0, 0, 0, 0 };
    return m;
}

/* TinyLlama-1.1B: 22 layers, n_embd 2048, 32 heads (4 kv) of 64, n_ff 5632,
 * vocab 32000, trained context 2048.  weights: 2.2 GB (f16). */
static plan_model tinyllama(void)
{
    plan_model m = { 22, 2048, 32, 4, 64, 5632, 32000, 2048, 2200000000ull, 0, 0, 0, 0 };
    return m;
}

static void test_smollm(void)
{
    plan_model m = smollm();
    /* K+V per token, f32: 30 layers * 2 * 3 heads * 64 * 4 B = 46080 */
    CHECK(plan_kv_bytes_per_token(&m, DT_F32) == 46080);
    /* per-layer KV heads (a pruned model): 90 heads over 30 layers is the
     * uniform case; 70 heads = 70 * 2 * 64 * 4 B = 35840 (f32), 17920
     * (f16), 70 * 2 * 68 = 9520 (q8_0: 34 bytes per 32) */
    m.n_kv_total = 90;
    CHECK(plan_kv_bytes_per_token(&m, DT_F32) == 46080);
    m.n_kv_total = 70;
    CHECK(plan_kv_bytes_per_token(&m, DT_F32) == 35840);
    CHECK(plan_kv_bytes_per_token(&m, DT_F16) == 17920);
    CHECK(plan_kv_bytes_per_token(&m, DT_Q8_0) == 9520);
    kvant_err e0 = {0};
    CHECK(plan_model_check(&m, &e0) == KV_OK);
    m.n_kv_total = 91; /* more than 3 per layer */
    CHECK(plan_model_check(&m, &e0) == KV_EINVAL && strstr(e0.msg, "KV heads over layers"));
    m.n_kv_total = 29; /* a layer without KV heads */
    CHECK(plan_model_check(&m, &e0) == KV_EINVAL);
    m.n_kv_total = 0;
    /* latent attention (DeepSeek-V2-Lite: 27 layers, one row of 512 + 64): the K row
     * alone, 27 * 576 * 2 B = 31104 (f16) */
    plan_model mla = {27, 2048, 16, 1, 576, 10944, 102400, 163840, 1000000000ull, 0, 1, 0, 0};
    CHECK(plan_kv_bytes_per_token(&mla, DT_F16) == 31104);
    mla.v_in_k = 0;
    CHECK(plan_kv_bytes_per_token(&mla, DT_F16) == 62208);

    /* activations, 2048 tokens, 64 seqs, 1 thread (all sizes already
     * multiples of 64 bytes):
     *   x, xn, q, att: 2048 * 576 * 4          = 4,718,592 each -> 18,874,368
     *   k, v:          2048 * (3*64) * 4       = 1,572,864 each ->  3,145,728
     *   gate, up:      2048 * 1536 * 4         = 12,582,912 each -> 25,165,824
     *   logits:        64 * 49152 * 4          = 12,582,912
     *   scratch:       1 * (8192 + 64) * 4     = 33,024
     *   total                                    = 59,801,856 */
    CHECK(plan_activation_bytes(&m, 2048, 64, 1) == 59801856ull);
    plan_act_layout l;
    CHECK(plan_activation_layout(&m, 2048, 64, 3, &l) == 59801856ull + 2 * 33024);
    CHECK(l.x == 0 && l.xn == 4718592 && l.q == 2 * 4718592ull && l.k == 3 * 4718592ull);
    CHECK(l.gate == 4 * 4718592ull + 2 * 1572864ull && l.scratch_stride == 33024);
    CHECK(l.scratch + 3 * l.scratch_stride == l.total);

    /* device 1 GiB at 0.90: budget = floor(1073741824 * 0.9) = 966,367,641
     * pool raw = 966,367,641 - 100,000,000 - 59,801,856   = 806,565,785
     * block    = 16 * 46080                                = 737,280
     * blocks   = floor(806,565,785 / 737,280)              = 1093 (1094 * 737280 = 806,584,320 > raw)
     * tokens   = 1093 * 16 = 17,488; bytes = 805,847,040
     * conc: 17488/512 = 34.15625, /2048 = 8.5390625, /8192 = 2.134765625 */
    plan_config c = plan_config_default();
    CHECK(c.kv_dtype == DT_F16); /* the memory-first default */
    c.kv_dtype = DT_F32;         /* the hand computation below is for f32 */
    c.device_memory = 1ull << 30;
    plan_result r;
    kvant_err err = {0};
    CHECKF(plan_compute(&m, &c, &r, &err) == KV_OK, "%s", err.msg);
    CHECK(r.budget == 966367641ull);
    CHECK(r.weights_bytes == 100000000ull);
    CHECK(r.activation_bytes == 59801856ull);
    CHECK(r.kv_bytes_per_token == 46080);
    CHECK(r.kv_pool_blocks == 1093);
    CHECK(r.kv_pool_tokens == 17488);
    CHECK(r.kv_pool_bytes == 805847040ull);
    CHECK(r.ctx == 8192 && r.fits_one_max_ctx && r.max_ctx_that_fits == 8192 && r.missing_bytes == 0);
    CHECK(r.n_conc == 3);
    CHECK(r.conc_ctx[0] == 512 && r.conc_ctx[1] == 2048 && r.conc_ctx[2] == 8192);
    CHECK(r.conc[0] == 34.15625 && r.conc[1] == 8.5390625 && r.conc[2] == 2.134765625);

    /* JSON */
    char *js = plan_result_json(&r, &m);
    json_error_t je;
    json_t *o = json_loads(js, 0, &je);
    CHECKF(o != NULL, "%s", je.text);
    CHECK(json_integer_value(json_object_get(o, "weights_bytes")) == 100000000);
    CHECK(json_integer_value(json_object_get(o, "kv_bytes_per_token")) == 46080);
    CHECK(json_integer_value(json_object_get(o, "kv_pool_bytes")) == 805847040);
    CHECK(json_integer_value(json_object_get(o, "kv_pool_tokens")) == 17488);
    CHECK(json_integer_value(json_object_get(o, "activation_bytes")) == 59801856);
    CHECK(json_integer_value(json_object_get(o, "budget")) == 966367641);
    CHECK(json_is_true(json_object_get(o, "fits")));
    CHECK(strcmp(json_string_value(json_object_get(o, "kv_dtype")), "f32") == 0);
    json_t *mc = json_object_get(o, "max_concurrency");
    CHECK(json_object_size(mc) == 3);
    CHECK(json_real_value(json_object_get(mc, "2048")) == 8.5390625);
    CHECK(json_integer_value(json_object_get(json_object_get(o, "model"), "n_layers")) == 30);
    json_decref(o);
    free(js);

    /* ctx 1000 adds itself to the concurrency list (sorted, deduped):
     * 512, 1000, 2048, 8192; 17488 / 1000 = 17.488 */
    c.ctx = 1000;
    CHECK(plan_compute(&m, &c, &r, &err) == KV_OK);
    CHECK(r.n_conc == 4 && r.conc_ctx[1] == 1000 && r.conc[1] == 17.488);

    /* Doesn't fit one full sequence: device 200,000,000 at 0.9
     * budget = 180,000,000; raw = 180,000,000 - 159,801,856 = 20,198,144
     * blocks = floor(20,198,144 / 737,280) = 27 (27 * 737,280 = 19,906,560)
     * tokens = 432 < 8192: fits = 0, max_ctx_that_fits = 416 (the largest
     * context with one block to spare for the backend's scratch: 26 x 16)
     * missing = 159,801,856 + 512 * 737,280 - 180,000,000
     *         = 159,801,856 + 377,487,360 - 180,000,000 = 357,289,216 */
    c = plan_config_default();
    c.kv_dtype = DT_F32;
    c.device_memory = 200000000ull;
    CHECKF(plan_compute(&m, &c, &r, &err) == KV_OK, "%s", err.msg);
    CHECK(r.kv_pool_blocks == 27 && r.kv_pool_tokens == 432);
    CHECK(!r.fits_one_max_ctx && r.max_ctx_that_fits == 416);
    CHECK(r.missing_bytes == 357289216ull);
    CHECK(r.conc[0] == 432.0 / 512.0);
}

static void test_tinyllama(void)
{
    plan_model m = tinyllama();
    /* K+V per token, f32: 22 * 2 * 4 * 64 * 4 = 45,056 */
    CHECK(plan_kv_bytes_per_token(&m, DT_F32) == 45056);
    /* activations, 2048 tokens, 64 seqs, 4 threads:
     *   x, xn, q, att: 2048 * 2048 * 4   = 16,777,216 each -> 67,108,864
     *   k, v:          2048 * 256 * 4    =  2,097,152 each ->  4,194,304
     *   gate, up:      2048 * 5632 * 4   = 46,137,344 each -> 92,274,688
     *   logits:        64 * 32000 * 4    =  8,192,000
     *   scratch:       4 * (2048 + 64) * 4 = 33,792
     *   total                              = 171,803,648 */
    CHECK(plan_activation_bytes(&m, 2048, 64, 4) == 171803648ull);

    /* device 4 GiB at 0.9: budget = floor(4,294,967,296 * 0.9) = 3,865,470,566
     * raw    = 3,865,470,566 - 2,200,000,000 - 171,803,648 = 1,493,666,918
     * block  = 16 * 45,056 = 720,896
     * blocks = 2071 (2072 * 720,896 = 1,493,696,512 > raw); tokens 33,136
     * conc:  33136 / 512 = 64.71875, / 2048 = 16.1796875; 8192 > 2048 skipped,
     *        ctx and n_ctx_train dedupe into 2048 */
    plan_config c = plan_config_default();
    c.kv_dtype = DT_F32; /* hand computation in f32 */
    c.device_memory = 4ull << 30;
    c.n_threads = 4;
    plan_result r;
    kvant_err err = {0};
    CHECKF(plan_compute(&m, &c, &r, &err) == KV_OK, "%s", err.msg);
    CHECK(r.budget == 3865470566ull);
    CHECK(r.activation_bytes == 171803648ull);
    CHECK(r.kv_pool_blocks == 2071 && r.kv_pool_tokens == 33136);
    CHECK(r.kv_pool_bytes == 2071ull * 720896);
    CHECK(r.fits_one_max_ctx && r.max_ctx_that_fits == 2048);
    CHECK(r.n_conc == 2 && r.conc_ctx[0] == 512 && r.conc_ctx[1] == 2048);
    CHECK(r.conc[0] == 64.71875 && r.conc[1] == 16.1796875);
    /* the plan's invariants */
    CHECK(r.weights_bytes + r.activation_bytes + r.kv_pool_bytes <= r.budget);
    CHECK(r.budget - r.weights_bytes - r.activation_bytes - r.kv_pool_bytes < 720896);
}

static void test_q8_kv(void)
{
    plan_model m = smollm();
    /* a row of 3 * 64 = 192 elements: f32 768 B; q8_0 6 blocks * 34 = 204 B
     * per token: 30 * 2 * 204 = 12,240 = 46,080 * 34 / 128 */
    uint64_t f32 = plan_kv_bytes_per_token(&m, DT_F32);
    uint64_t q8 = plan_kv_bytes_per_token(&m, DT_Q8_0);
    CHECK(q8 == 12240 && q8 < f32 && q8 * 128 == f32 * 34);
    plan_config c = plan_config_default();
    c.device_memory = 1ull << 30;
    c.kv_dtype = DT_Q8_0;
    plan_result r;
    kvant_err err = {0};
    CHECKF(plan_compute(&m, &c, &r, &err) == KV_OK, "%s", err.msg);
    /* raw 806,565,785 / (16 * 12,240 = 195,840) = 4118 blocks (4119 * 195840 = 806,664,960 > raw) */
    CHECK(r.kv_bytes_per_token == 12240 && r.kv_pool_blocks == 4118);
    /* q4_K needs rows that are multiples of 256 elements: 192 is not */
    c.kv_dtype = DT_Q4_K;
    kvant_err_clear(&err);
    CHECK(plan_compute(&m, &c, &r, &err) == KV_EUNSUP);
    CHECKF(strstr(err.msg, "q4_K") && strstr(err.msg, "192"), "%s", err.msg);
    c.kv_dtype = 99;
    CHECK(plan_compute(&m, &c, &r, &err) == KV_EUNSUP);
}

static void expect_refusal_fwd(const plan_model *m, const plan_config *c);

/* A Gemma-3-like split: 6 layers of 1 KV head of 32 (f16 rows of 64 B, K+V
 * 128 B per layer per token), 5 of them on a 1024 window, context 32768. */
static void test_window_split(void)
{
    plan_model m = { 6, 64, 2, 1, 32, 128, 384, 32768, 1000000ull, 0, 0, 0, 0 };
    plan_config c = plan_config_default();
    c.device_memory = 512ull << 20;
    c.ctx = 32768;
    plan_result one, r;
    kvant_err err = {0};
    CHECKF(plan_compute(&m, &c, &one, &err) == KV_OK, "%s", err.msg);
    c.kv_window = 1024;
    c.kv_window_heads = 5;
    CHECKF(plan_compute(&m, &c, &r, &err) == KV_OK, "%s", err.msg);
    CHECK(one.kv_bytes_per_token == 768 && one.kv_seq_bytes == 32768ull * 768);
    CHECK(r.kv_bytes_per_token == 128 && r.kv_window_bytes_per_token == 640);
    CHECK(plan_window_blocks(1024, 32768, 16) == 65 && plan_window_blocks(1024, 512, 16) == 32);
    CHECK(plan_window_blocks(8, 4096, 8) == 2);
    /* per sequence: 2048 global blocks + 65 window blocks of 16 tokens */
    CHECK(r.kv_seq_bytes == 2048ull * 16 * 128 + 65ull * 16 * 640);
    /* within 1% of (1 x 32768 + 5 x 1024) x 128 */
    const double f = (32768.0 + 5 * 1024.0) * 128.0;
    CHECK(r.kv_seq_bytes / f < 1.01 && r.kv_seq_bytes / f > 0.99);
    /* both pools come out of what one pool had; the window pool is the
     * concurrency's windows plus the margin, the global pool the rest */
    const uint64_t gbb = 16 * 128, wbb = 16 * 640, avail = one.kv_pool_bytes + 16 * 768 - 1;
    CHECK(r.kv_window_margin == 2048 / 16 + 64);
    CHECK((uint64_t)r.kv_pool_blocks * gbb + (uint64_t)r.kv_window_blocks * wbb <= avail + gbb);
    CHECK(r.kv_pool_bytes == (uint64_t)r.kv_pool_blocks * gbb + r.kv_window_bytes);
    const double conc = (double)(r.kv_window_blocks - r.kv_window_margin) / 65.0;
    CHECK(r.conc_ctx[r.n_conc - 1] == 32768 && r.conc[r.n_conc - 1] <= conc + 1e-9);
    CHECK(r.conc[r.n_conc - 1] <= (double)r.kv_pool_tokens / 32768.0 + 1e-9);
    CHECKF(r.conc[r.n_conc - 1] > 4.5 * one.conc[one.n_conc - 1], "%.2f vs %.2f",
           r.conc[r.n_conc - 1], one.conc[one.n_conc - 1]); /* ~5.2x at 32k */
    CHECK(r.fits_one_max_ctx && r.window == 1024);
    /* every layer on the window, or none: not a split */
    c.kv_window_heads = 6;
    expect_refusal_fwd(&m, &c);
    c.kv_window_heads = 0;
    expect_refusal_fwd(&m, &c);
}

static void expect_refusal(const plan_model *m, const plan_config *c, int code,
                           const char *needle)
{
    plan_result r;
    kvant_err err = {0};
    int rc = plan_compute(m, c, &r, &err);
    CHECKF(rc == code && err.code == code && strstr(err.msg, needle),
           "want %d with '%s', got %d: %s", code, needle, rc, err.msg);
}

static void test_refusals(void)
{
    plan_model m = smollm();
    plan_config c = plan_config_default();
    c.kv_dtype = DT_F32; /* hand computation in f32 */
    c.device_memory = 1ull << 30;

    /* budget < weights: 100 MB device at 0.9 = 90 MB < 100 MB of weights.
     * one block needs 100,000,000 + 59,801,856 + 737,280 = 160,539,136 of
     * budget -> 178,376,818 device bytes (ceil(/0.9)) = 170.11 MiB */
    plan_config small = c;
    small.device_memory = 100000000ull;
    expect_refusal(&m, &small, KV_ENOMEM, "weights 95.37 MiB exceed the budget");
    expect_refusal(&m, &small, KV_ENOMEM, "170.11 MiB");

    /* weights fit, activations do not: 170 MB at 0.9 = 153,000,000;
     * 153,000,000 - 100,000,000 - 737,280 = 52,262,720 for activations:
     * tokens t >= 64 (seqs 64): 23,040 * t + 12,582,912 + 33,024 <= 52,262,720
     * (23,040 = 4 * (576*4 + 192*2 + 1536*2)) -> t <= 1720.78 -> 1720 */
    plan_config mid = c;
    mid.device_memory = 170000000ull;
    expect_refusal(&m, &mid, KV_ENOMEM, "max_num_batched_tokens 1720");

    plan_config u = c;
    u.utilization = 0.0;
    expect_refusal(&m, &u, KV_EINVAL, "utilization");
    u.utilization = 1.5;
    expect_refusal(&m, &u, KV_EINVAL, "utilization");
    u.utilization = NAN;
    expect_refusal(&m, &u, KV_EINVAL, "utilization");
    u.utilization = 1.0; /* boundary: allowed */
    plan_result r;
    CHECK(plan_compute(&m, &u, &r, NULL) == KV_OK && r.budget == (1ull << 30));

    plan_config x = c;
    x.ctx = 8193;
    expect_refusal(&m, &x, KV_ERANGE, "ctx 8193 exceeds the model's training context 8192");
    x.ctx = -1;
    expect_refusal(&m, &x, KV_EINVAL, "ctx");

    int bad_bs[] = { 0, 4, 12, 24, 256, -16 };
    for (size_t i = 0; i < sizeof bad_bs / sizeof bad_bs[0]; i++) {
        plan_config b = c;
        b.block_size = bad_bs[i];
        expect_refusal(&m, &b, KV_EINVAL, "block_size");
    }
    int good_bs[] = { 8, 16, 32, 64, 128 };
    for (size_t i = 0; i < sizeof good_bs / sizeof good_bs[0]; i++) {
        plan_config b = c;
        b.block_size = good_bs[i];
        CHECK(plan_compute(&m, &b, &r, NULL) == KV_OK && r.kv_pool_tokens % (uint64_t)good_bs[i] == 0);
    }

    plan_config s = c;
    s.max_num_seqs = 0;
    expect_refusal(&m, &s, KV_EINVAL, "max_num_seqs");
    s = c;
    s.max_num_batched_tokens = -5;
    expect_refusal(&m, &s, KV_EINVAL, "max_num_batched_tokens");
    s = c;
    s.n_threads = 0;
    expect_refusal(&m, &s, KV_EINVAL, "n_threads");

    /* untrusted shapes */
    plan_model b = m;
    b.n_head_kv = 2; /* 9 % 2 != 0 */
    expect_refusal(&b, &c, KV_EINVAL, "n_head_kv");
    b = m;
    b.n_layers = 0;
    expect_refusal(&b, &c, KV_EINVAL, "n_layers");
    b = m;
    b.n_vocab = -1;
    expect_refusal(&b, &c, KV_EINVAL, "n_vocab");
    b = m;
    b.n_ctx_train = 0;
    expect_refusal(&b, &c, KV_EINVAL, "n_ctx_train");
    b = m;
    b.weights_bytes = UINT64_MAX;
    expect_refusal(&b, &c, KV_EINVAL, "weights_bytes");
    b = m;
    b.n_ff = 2000000000;
    expect_refusal(&b, &c, KV_EINVAL, "n_ff");
    CHECK(plan_activation_bytes(&b, 2048, 64, 1) == 0);
    CHECK(plan_activation_bytes(&m, 0, 64, 1) == 0);
}

static void expect_refusal_fwd(const plan_model *m, const plan_config *c)
{
    expect_refusal(m, c, KV_EINVAL, "window group");
}

/* KV that fits itself, context auto and weight placement (plan.h
 * PLAN_KV_FIT_*, fit_ctx, plan_fit_weights), on the hand-computed smollm
 * case above (f32 KV: 737,280-byte blocks). */
static void test_fit(void)
{
    plan_model m = smollm();
    plan_config c = plan_config_default();
    plan_result r;
    kvant_err err = {0};
    c.kv_dtype = DT_F32;
    /* 8 GiB, 8 requests of 2048 tokens: demand 2 x 8 x 128 blocks = 2048
     * (the budget holds ~10,000); start floor(256 MiB / 737,280) = 364 */
    c.device_memory = 8ull << 30;
    c.ctx = 2048;
    c.max_num_seqs = 8;
    c.kv_fit = c.kv_grow = 1;
    CHECKF(plan_compute(&m, &c, &r, &err) == KV_OK, "%s", err.msg);
    CHECK(r.kv_fit && r.kv_pool_blocks == 2048 && r.kv_start_blocks == 364);
    CHECK(r.kv_start_bytes == 364ull * 737280 && r.kv_pool_bytes == 2048ull * 737280);
    c.kv_grow = 0; /* a pool that cannot grow starts at its ceiling */
    CHECK(plan_compute(&m, &c, &r, &err) == KV_OK && r.kv_start_blocks == 2048);
    /* 1 GiB, 64 requests of 8192: the budget binds (1093 blocks as above);
     * start: one request (512 blocks) is more than 256 MiB's 364 */
    c.device_memory = 1ull << 30;
    c.ctx = 0;
    c.max_num_seqs = 64;
    c.kv_grow = 1;
    CHECK(plan_compute(&m, &c, &r, &err) == KV_OK);
    CHECK(r.kv_pool_blocks == 1093 && r.kv_start_blocks == 512 && r.ctx == 8192);
    /* 300 MiB: budget 283,115,520 - 100,000,000 - 59,801,856 leaves 167
     * blocks (2672 tokens): 8192 does not fit; with one block to spare the
     * largest context is 166 x 16 = 2656 */
    c.kv_fit = c.kv_grow = 0;
    c.device_memory = 300ull << 20;
    CHECK(plan_compute(&m, &c, &r, &err) == KV_OK);
    CHECK(r.kv_pool_blocks == 167 && !r.fits_one_max_ctx && r.max_ctx_that_fits == 2656);
    CHECK(r.ctx == 8192 && !r.ctx_auto && r.missing_bytes > 0);
    c.fit_ctx = 1;
    CHECK(plan_compute(&m, &c, &r, &err) == KV_OK);
    CHECK(r.ctx_auto && r.ctx == 2656 && r.fits_one_max_ctx && r.max_ctx_that_fits == 2656);
    c.ctx = 4096; /* an explicit context is kept (and does not fit) */
    CHECK(plan_compute(&m, &c, &r, &err) == KV_OK && r.ctx == 4096 && !r.fits_one_max_ctx);
    c.ctx = 0;
    /* weights: 1 GiB holds them (0); 150 MiB (budget 141,557,760) does not
     * hold them beside 59,801,856 of activations: cap = budget - activations
     * - one 512-token request (32 blocks = 23,592,960; 4096 tokens would take
     * more than a quarter of the budget) - budget / 64 (2,211,840) */
    uint64_t cap = 7;
    c.device_memory = 1ull << 30;
    CHECK(plan_fit_weights(&m, &c, &cap) == 0 && cap == 0);
    c.device_memory = 150ull << 20;
    CHECK(plan_fit_weights(&m, &c, &cap) == 1);
    CHECK(cap == 141557760ull - 59801856ull - 23592960ull - 2211840ull);
    c.device_memory = 60ull << 20; /* not even the workspace: nothing left (cap 0) */
    CHECK(plan_fit_weights(&m, &c, &cap) == 1 && cap == 0);
}

/* A hybrid (Granite-4.0-H-1B-like: 40 layers of which 4 attend, 4 KV heads of
 * 128): KV bytes count the attention layers only, the recurrent state's slots
 * come out of the budget before the KV pool. */
static void test_hybrid(void)
{
    plan_model m = {40, 1536, 12, 4, 128, 6448, 100352, 4096, 1000000000ull, 16, 0, 4,
                    56623104ull};
    kvant_err e0 = {0};
    CHECK(plan_model_check(&m, &e0) == KV_OK);
    CHECK(plan_kv_bytes_per_token(&m, DT_F16) == 16ull * 2 * 128 * 2); /* 8 KiB, not 80 */
    m.n_kv_total = 3; /* fewer KV heads than attention layers */
    CHECK(plan_model_check(&m, &e0) == KV_EINVAL && strstr(e0.msg, "KV heads over layers"));
    m.n_kv_total = 16;
    m.n_kv_layers = 41;
    CHECK(plan_model_check(&m, &e0) == KV_EINVAL);
    m.n_kv_layers = 4;
    plan_config c = plan_config_default();
    c.device_memory = 8ull << 30;
    c.utilization = 1.0;
    c.ctx = 4096;
    plan_result r0, r1;
    CHECK(plan_compute(&m, &c, &r0, &e0) == KV_OK && r0.state_bytes == 0);
    c.state_slots = 20;
    CHECK(plan_compute(&m, &c, &r1, &e0) == KV_OK);
    CHECK(r1.state_bytes == 20ull * 56623104ull && r1.state_slots == 20);
    CHECK(r1.state_slot_bytes == 56623104ull);
    /* the KV pool gave up the state's bytes, to within one block */
    const uint64_t bb = r1.kv_bytes_per_token * (uint64_t)r1.block_size;
    CHECK(r0.kv_pool_bytes - r1.kv_pool_bytes + bb > r1.state_bytes);
    CHECK(r0.kv_pool_bytes - r1.kv_pool_bytes <= r1.state_bytes + bb);
    char line[160];
    CHECK(plan_state_line(&r1, 12, line, sizeof line) && strstr(line, "20 slots") &&
          strstr(line, "12 for running sequences, 8 for the prefix cache"));
    CHECK(plan_state_line(&r0, 0, line, sizeof line) == NULL);
}

int main(void)
{
    test_window_split();
    test_hybrid();
    dtype_init();
    test_smollm();
    test_tinyllama();
    test_q8_kv();
    test_refusals();
    test_fit();
    return tu_finish("test_plan");
}
