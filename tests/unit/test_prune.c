/* test_prune.c - structured pruning end to end on the tiny f32 model
 * (under ASan in `make asan`): statistics from forward passes, a plan that
 * removes a layer, half the FFN channels and one of two KV groups, the
 * written file loads with the new shapes and runs, and refused requests
 * (every layer, fractions >= 1, nothing to prune, too little calibration,
 * an unwritable path) return KV_EINVAL / an error and leave no file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend_select.h"
#include "mem/mem.h"
#include "forward/forward.h"
#include "prune/prune.h"
#include "testutil.h"
#include "tinymodel.h"

enum { BS = 16, NB = 24, STEP = 64 };

typedef struct rig {
    mem_mgr *mem;
    backend *be;
    model *m;
    fwd_ctx f;
    float *logits; /* [STEP][n_vocab] */
} rig;

static int rig_open(rig *r, const char *path)
{
    kvant_err err = {0};
    memset(r, 0, sizeof *r);
    r->m = model_load(path, &err);
    CHECKF(r->m != NULL, "model_load %s: %s", path, err.msg);
    if (!r->m)
        return -1;
    r->mem = mem_create(1ull << 30, mem_allocator_host(), &err);
    r->be = r->mem ? backend_create("cpu", 0, r->mem, 2, 0, &err) : NULL;
    kv_layout lay = fwd_kv_layout(r->m, NB, BS, 0 /* f32 */);
    int rc = !r->be ? -1 : r->be->ops->load_weights(r->be, r->m, &err);
    if (!rc)
        rc = fwd_init(&r->f, r->m, r->be, STEP, STEP, &lay, &err);
    r->logits = malloc((size_t)STEP * r->m->hp.n_vocab * sizeof *r->logits);
    CHECKF(rc == KV_OK && r->logits, "set-up: %s", err.msg);
    return rc;
}

static void rig_close(rig *r)
{
    if (r->f.be)
        fwd_free(&r->f);
    if (r->be) {
        r->be->ops->unload_weights(r->be, r->m);
        r->be->ops->destroy(r->be);
    }
    mem_destroy(r->mem);
    model_free(r->m);
    free(r->logits);
}

/* Runs n_tok tokens (one sequence from position 0) with all logits. */
static int rig_run(rig *r, int n_tok)
{
    int32_t table[NB], tok[STEP], pos[STEP], seq[STEP], outi[STEP];
    for (int i = 0; i < NB; i++)
        table[i] = i;
    fwd_seq fs = {.block_table = table, .n_blocks = NB};
    kvant_err err = {0};
    for (int p0 = 0; p0 < n_tok; p0 += STEP) {
        int n = n_tok - p0 < STEP ? n_tok - p0 : STEP;
        for (int i = 0; i < n; i++) {
            tok[i] = ((p0 + i) * 37 + 11) % 300;
            pos[i] = p0 + i, seq[i] = 0, outi[i] = i;
        }
        fwd_batch b = {n, tok, pos, seq, 1, &fs, n, outi, 0};
        int rc = fwd_run(&r->f, &b, r->logits, &err);
        CHECKF(rc == KV_OK, "fwd_run: %s", err.msg);
        if (rc)
            return rc;
    }
    return KV_OK;
}

static void test_refused(model *m, prune_stats *st, const char *out)
{
    struct { prune_request rq; const char *msg; } cases[6];
    for (int i = 0; i < 6; i++)
        cases[i].rq = prune_request_default();
    cases[0].rq.drop_layers = 2, cases[0].msg = "every layer";
    cases[1].rq.target_params = 1.0, cases[1].msg = "(0, 1)";
    cases[2].rq.heads_keep = 1.5, cases[2].msg = "(0, 1)";
    cases[3].msg = "nothing to prune";
    cases[4].rq.heads_keep = 0.1, cases[4].msg = "fewer than one per layer";
    cases[5].rq.target_params = 0.05, cases[5].rq.method = PRUNE_WIDTH;
    cases[5].msg = "cannot be reached";
    for (int i = 0; i < 6; i++) {
        prune_plan p;
        kvant_err err = {0};
        int rc = prune_plan_make(m, st, &cases[i].rq, &p, &err);
        CHECKF(rc == KV_EINVAL && strstr(err.msg, cases[i].msg), "case %d: rc %d '%s'", i, rc,
               err.msg);
        CHECK(p.keep == NULL);
    }
    CHECK(access(out, F_OK) != 0);
}

/* The Gram accumulator: its diagonal is the sum of x^2 that the separate
 * per-column accumulator holds; symmetric; |G_ij| <= sqrt(G_ii G_jj). */
static void check_gram(model *m, prune_stats *st)
{
    const model_tensor *w = &m->layers[0].w_down;
    int64_t n = w->ne[0], rows = 0;
    const double *g = prune_stats_gram(st, "blk.0.ffn_down.weight", n, &rows);
    const float *imp = prune_stats_imp(st, "blk.0.ffn_down.weight", n);
    CHECK(prune_stats_gram(st, "blk.0.ffn_up.weight", m->layers[0].w_up.ne[0], NULL) == NULL);
    CHECKF(g && imp && rows == 400, "gram %p rows %lld", (const void *)g, (long long)rows);
    if (!g || !imp)
        return;
    double worst = 0;
    int ok = 1;
    for (int64_t i = 0; i < n; i++) {
        double d = g[i * n + i] / (double)rows;
        worst = fmax(worst, fabs(d - imp[i]) / fmax(fabs(imp[i]), 1e-12));
        for (int64_t j = 0; j < n; j++)
            ok &= fabs(g[i * n + j] - g[j * n + i]) <= 1e-6 * fabs(g[i * n + j]) + 1e-9 &&
                  fabs(g[i * n + j]) <= sqrt(g[i * n + i] * g[j * n + j]) * (1 + 1e-5) + 1e-9;
    }
    CHECKF(worst < 1e-4, "gram diagonal vs mean x^2: rel %g", worst);
    CHECK(ok);
}

static void check_pruned(const char *out, int32_t kept_ff);

/* --depth-bias: dropping layer 1 of 2 (the lower Block Influence on this
 * model) leaves layer 0 with an ffn_down.bias equal to layer 1's mean
 * residual change; without it the file has no bias. */
static void check_depth_bias(model *m, prune_stats *st, const char *out)
{
    prune_request rq = prune_request_default();
    rq.drop_layers = 1;
    rq.depth_bias = 1;
    prune_plan p;
    prune_result res;
    kvant_err err = {0};
    int64_t d = m->hp.n_embd;
    float *want = malloc((size_t)d * sizeof *want);
    int rc = prune_plan_make(m, st, &rq, &p, &err);
    CHECKF(rc == KV_OK && want, "plan: %s", err.msg);
    if (rc || !want)
        goto done;
    CHECKF(p.keep[0] && !p.keep[1], "this model drops layer %d", p.keep[0] ? 1 : 0);
    rc = prune_write(m, &p, st, out, &res, &err);
    prune_plan_free(&p);
    CHECKF(rc == KV_OK, "write: %s", err.msg);
    CHECK(prune_stats_layer_mean(st, 1, want) == 0 && prune_stats_layer_mean(st, 2, want) != 0);
    prune_stats_layer_mean(st, 1, want);
    model *m2 = rc ? NULL : model_load(out, &err);
    CHECKF(m2 && m2->layers[0].b_down.data, "reload: %s", err.msg);
    if (m2 && m2->layers[0].b_down.data) {
        const float *b = m2->layers[0].b_down.data;
        double worst = 0, norm = 0;
        for (int64_t i = 0; i < d; i++) {
            worst = fmax(worst, fabs(b[i] - want[i]));
            norm = fmax(norm, fabs(want[i]));
        }
        CHECKF(norm > 0 && worst <= 1e-6 * norm, "bias vs mean change: %g of %g", worst, norm);
    }
    model_free(m2);
    rq.no_bias = 1;
    CHECK(prune_plan_make(m, st, &rq, &p, &err) == KV_EINVAL && strstr(err.msg, "--no-bias"));
done:
    free(want);
}

/* --heads-keep 0.75 of 2 layers x 2 KV groups: the global ranking leaves
 * 1 and 2 groups; the file reloads with per-layer head counts (KV rows of
 * different widths in one block) and runs. */
static void check_per_layer_heads(model *m, prune_stats *st, const char *out)
{
    prune_request rq = prune_request_default();
    rq.heads_keep = 0.75;
    prune_plan p;
    prune_result res;
    kvant_err err = {0};
    int rc = prune_plan_make(m, st, &rq, &p, &err);
    CHECKF(rc == KV_OK, "heads plan: %s", err.msg);
    if (rc)
        return;
    CHECKF(p.kv_n[0] + p.kv_n[1] == 3 && p.kv_n[0] >= 1 && p.kv_n[1] >= 1, "kept %d + %d",
           p.kv_n[0], p.kv_n[1]);
    int32_t want[2] = {p.kv_n[0], p.kv_n[1]};
    rc = prune_write(m, &p, st, out, &res, &err);
    prune_plan_free(&p);
    CHECKF(rc == KV_OK, "heads write: %s", err.msg);
    rig r2 = {0};
    if (rc == KV_OK && rig_open(&r2, out) == 0) {
        const model *m2 = r2.m;
        CHECKF(m2->layers[0].n_head_kv == want[0] && m2->layers[1].n_head_kv == want[1] &&
               m2->layers[0].n_head == 2 * want[0] && m2->hp.n_head_kv == 2 &&
               m2->hp.n_kv_total == 3, "reloaded heads %d/%d %d/%d total %lld",
               m2->layers[0].n_head, m2->layers[0].n_head_kv, m2->layers[1].n_head,
               m2->layers[1].n_head_kv, (long long)m2->hp.n_kv_total);
        CHECK(rig_run(&r2, 70) == KV_OK);
        int finite = 1;
        for (int i = 0; i < 6 * m2->hp.n_vocab; i++)
            finite &= isfinite(r2.logits[i]);
        CHECK(finite);
    }
    rig_close(&r2);
}

static void test_prune(const char *src, const char *out)
{
    rig r;
    if (rig_open(&r, src))
        goto done;
    kvant_err err = {0};
    prune_stats *st = prune_stats_create(r.m, &err);
    CHECKF(st != NULL, "stats: %s", err.msg);
    if (!st)
        goto done;
    prune_stats_track_refit(st);
    /* too little calibration first: 100 tokens */
    prune_stats_attach(st, r.be);
    rig_run(&r, 100);
    prune_stats_detach(st, r.be);
    prune_request rq = prune_request_default();
    rq.drop_layers = 1;
    prune_plan p;
    CHECK(prune_plan_make(r.m, st, &rq, &p, &err) == KV_EINVAL && strstr(err.msg, "too short"));
    prune_stats_attach(st, r.be);
    rig_run(&r, 300);
    prune_stats_detach(st, r.be);
    CHECKF(prune_stats_tokens(st) == 400, "tokens %lld", (long long)prune_stats_tokens(st));
    test_refused(r.m, st, out);
    check_gram(r.m, st);
    rq.ffn_keep = 0.5;
    rq.heads_keep = 0.5;
    int rc = prune_plan_make(r.m, st, &rq, &p, &err);
    CHECKF(rc == KV_OK, "plan: %s", err.msg);
    if (rc)
        goto done_st;
    CHECK(p.n_kept == 1 && p.params_out < p.params_in);
    CHECKF(p.kv_n[p.keep[0] ? 0 : 1] == 1, "KV groups kept %d", p.kv_n[p.keep[0] ? 0 : 1]);
    CHECKF(p.bi[0] > 0 && p.bi[1] > 0 && p.bi[0] < 2 && p.bi[1] < 2, "BI %g %g", p.bi[0],
           p.bi[1]);
    int gone = p.keep[0] ? 1 : 0;
    CHECK(p.bi[gone] <= p.bi[1 - gone]);
    CHECKF(p.ffn_n[1 - gone] % 32 == 0 && p.ffn_n[1 - gone] < 128, "width %d", p.ffn_n[1 - gone]);
    prune_result res;
    rc = prune_write(r.m, &p, st, "/nonexistent-dir/x.gguf", &res, &err);
    CHECK(rc != KV_OK);
    rc = prune_write(r.m, &p, st, out, &res, &err);
    CHECKF(rc == KV_OK, "write: %s", err.msg);
    CHECK(res.bytes_out < res.bytes_in && res.params_out > 0);
    int32_t kept_ff = p.ffn_n[1 - gone];
    prune_plan_free(&p);
    check_pruned(out, kept_ff);
    check_depth_bias(r.m, st, out);
    /* the same plan with the least-squares refit */
    rq.refit = 1;
    rq.no_bias = 1;
    CHECK(prune_plan_make(r.m, st, &rq, &p, &err) == KV_EINVAL && strstr(err.msg, "--no-bias"));
    rq.no_bias = 0;
    rc = prune_plan_make(r.m, st, &rq, &p, &err);
    CHECKF(rc == KV_OK && p.refit, "refit plan: %s", err.msg);
    if (rc == KV_OK) {
        rc = prune_write(r.m, &p, st, out, &res, &err);
        CHECKF(rc == KV_OK && res.requantized == 2, "refit write: %s (%d requantized)", err.msg,
               res.requantized);
        prune_plan_free(&p);
        if (rc == KV_OK)
            check_pruned(out, kept_ff);
    }
    check_per_layer_heads(r.m, st, out);
done_st:
    prune_stats_destroy(st);
done:
    rig_close(&r);
}

static void check_pruned(const char *out, int32_t kept_ff)
{
    rig r2 = {0};
    if (rig_open(&r2, out) == 0) {
        const model_hparams *hp = &r2.m->hp;
        CHECKF(hp->n_layers == 1 && hp->n_head == 2 && hp->n_head_kv == 1 && hp->head_dim == 16,
               "shape %d %d %d %d", hp->n_layers, hp->n_head, hp->n_head_kv, hp->head_dim);
        CHECK(r2.m->layers[0].n_ff == kept_ff && r2.m->layers[0].b_down.data &&
              r2.m->layers[0].bo.data);
        CHECK(rig_run(&r2, 70) == KV_OK);
        int finite = 1;
        for (int i = 0; i < 6 * hp->n_vocab; i++)
            finite &= isfinite(r2.logits[i]);
        CHECK(finite);
    }
    rig_close(&r2);
}

int main(void)
{
    char dir[] = "/tmp/kvant-prune-XXXXXX", src[256], out[256];
    if (!mkdtemp(dir))
        return 1;
    snprintf(src, sizeof src, "%s/tiny.gguf", dir);
    snprintf(out, sizeof out, "%s/pruned.gguf", dir);
    CHECK(tiny_model_write(src, 7) == 0);
    test_prune(src, out);
    unlink(src);
    unlink(out);
    rmdir(dir);
    return tu_finish("test_prune");
}
