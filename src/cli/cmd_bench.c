/* cmd_bench.c - `kvant bench`: llama-bench-style throughput with a roofline.
 *
 *   pp: evaluate p random tokens at positions [0, p) (an empty cache) in
 *       ubatches of up to BENCH_MAX_UBATCH tokens; tok/s = p / time.
 *   tg: n single-token decode steps at positions [0, n); tok/s = n / time.
 *   Both: median and min..max over REPS after a warm-up of 16 tokens.
 *   GB/s = weight bytes a token's matmuls read / time per token (for pp this
 *   is a "virtual" figure: weights are re-used across the ubatch);
 *   GFLOP/s = 2 * matmul params * tokens / time (attention not counted).
 *   --roofline: read bandwidth (1 and T threads), fp32 FMA and int8 VNNI
 *   peaks measured in this process (src/roofline/roofline.h).
 *   --weights-memory: also the stream's bytes, wall time, time inside reads
 *   and time the forward pass waited for a layer over the timed reps.
 *   --batch B: B requests of p random prompt tokens and n max_tokens
 *   (ignore_eos, greedy) through the engine in manual mode; stats sampled
 *   after every step.  TTFT is measured from submission; ITL is the gap
 *   between consecutive tokens of a request.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/tpool.h"
#include "roofline/roofline.h"
#include "cli/cli.h"
#include "model/xcache.h"
#include "engine/engine.h"
#include "kernels/dtype.h"
#include "model/wstream.h"
#include "par/par.h"
#include "par/tp.h"


#define BENCH_MAX_REPS 100
#define BENCH_MAX_UBATCH 512
#define BENCH_MAX_BATCH 1024
#define BENCH_WARMUP_TOKENS 16

typedef struct bench_opts {
    long p, n, reps, batch;
    long max_itl_ms;   /* --batch: engine_config.max_itl_ms */
    int mixed; /* --mixed: request i gets a prompt in [p/8, p] and max_tokens in [n/8, n] */
    int roofline;
    engine_config spec; /* --spec options (cli_spec_parse), with --batch only */
} bench_opts;

typedef struct bench_stat {
    double med, lo, hi; /* tok/s */
    /* --weights-memory: the stream over the timed reps (warm-up excluded) */
    double stream_bytes, stream_wall_s, stream_read_s, stream_wait_s;
} bench_stat;

typedef struct bench_weights {
    double bytes_per_tok;  /* matmul weights read per token */
    double params;         /* matmul parameters (multiply-adds per token) */
    double packed_bytes;   /* of those, repacked at load (CPU int8 kernels) */
} bench_weights;

static double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int bench_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v in place and returns its median (0 when empty). */
static double bench_median(double *v, size_t n)
{
    if (!n)
        return 0.0;
    qsort(v, n, sizeof *v, bench_cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double bench_pct(double *v, size_t n, double q) /* v sorted */
{
    if (!n)
        return 0.0;
    size_t i = (size_t)ceil(q * (double)n) - 1;
    return v[i < n ? i : n - 1];
}

/* frac of t's rows are read per token (1; the used share of stacked experts) */
static void bench_add_part(bench_weights *w, const model_tensor *t, double frac)
{
    if (!t->data || t->ne[1] <= 1)
        return; /* norms, absent biases */
    w->bytes_per_tok += frac * (double)t->nbytes;
    w->params += frac * (double)t->ne[0] * (double)t->ne[1];
    if (t->packed)
        w->packed_bytes += frac * (double)t->nbytes;
}

static void bench_add_tensor(bench_weights *w, const model_tensor *t)
{
    bench_add_part(w, t, 1.0);
}

static bench_weights bench_weight_traffic(const model *m)
{
    bench_weights w = {0, 0, 0};
    for (int32_t l = 0; l < m->hp.n_layers; l++) {
        const model_layer *L = &m->layers[l];
        const model_tensor *ts[] = {&L->wq,     &L->wk,     &L->wv,       &L->wo,
                                    &L->w_gate, &L->w_up,   &L->w_down,   &L->ssm_in,
                                    &L->ssm_out, &L->ssm_z, &L->ssm_beta, &L->ssm_alpha};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
            bench_add_tensor(&w, ts[i]);
        /* experts: a token reads the router, n_expert_used of the stacked
         * experts and the shared one */
        const model_tensor *moe[] = {&L->ffn_gate_inp, &L->gate_shexp, &L->up_shexp,
                                     &L->down_shexp};
        const model_tensor *exps[] = {&L->gate_exps, &L->up_exps, &L->gate_up_exps,
                                      &L->down_exps};
        for (size_t i = 0; L->n_expert && i < 4; i++)
            bench_add_tensor(&w, moe[i]);
        for (size_t i = 0; L->n_expert && i < 4; i++)
            bench_add_part(&w, exps[i], (double)L->n_expert_used / L->n_expert);
    }
    /* the embedding lookup reads one row; the output head reads all of it */
    bench_add_tensor(&w, m->tied_output ? &m->tok_embd : &m->output);
    return w;
}

static void bench_help(void)
{
    char reps[32], batch[48];
    snprintf(reps, sizeof reps, "reps per test, 1..%d", BENCH_MAX_REPS);
    snprintf(batch, sizeof batch, "B requests through the engine, 1..%d", BENCH_MAX_BATCH);
    const cli_opt t[] = {
        {"-p", "N", "prompt tokens (pp test; with --batch: per request)", "512"},
        {"-n", "N", "generated tokens (tg test; with --batch: per request)", "128"},
        {"-r", "REPS", reps, "5"},
        {"--batch", "B", batch, "0 = single-sequence pp and tg"},
        {"--mixed", NULL, "with --batch: prompt and output lengths spread over [1/8, 1] of -p/-n",
         "off"},
        {"--max-itl-ms", "MS", "with --batch: the engine's ITL budget (kvant serve --help), 0: off",
         "200"},
        {"--roofline", NULL, "also measure read bandwidth, fp32 FMA and int8 VNNI peaks", "off"},
    };
    cli_help("kvant bench [options]",
             "Prompt (pp) and generation (tg) speed with GB/s and GFLOP/s, or continuous\n"
             "batching with --batch (TTFT, inter-token latency, KV use).",
             t, CLI_N_OPTS(t));
    cli_spec_help(stdout);
}

/* 0: run; 1: help printed; CLI_EXIT_USAGE: a mistake (one line printed). */
static int bench_parse(int argc, char **argv, cli_common *c, bench_opts *o)
{
    o->p = 512, o->n = 128, o->reps = 5, o->batch = 0, o->roofline = 0;
    o->spec = engine_config_default();
    o->max_itl_ms = (long)o->spec.max_itl_ms;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (cli_is_help(a)) {
            bench_help();
            return 1; /* help printed: nothing to run */
        }
        int r = cli_common_parse(c, argc, argv, &i);
        if (r == 0)
            r = cli_spec_parse(&o->spec, argc, argv, &i);
        if (r < 0)
            return CLI_EXIT_USAGE;
        if (r > 0)
            continue;
        long *dst = !strcmp(a, "-p") ? &o->p : !strcmp(a, "-n") ? &o->n
                  : !strcmp(a, "-r") ? &o->reps : !strcmp(a, "--batch") ? &o->batch
                  : !strcmp(a, "--max-itl-ms") ? &o->max_itl_ms : NULL;
        long hi = dst == &o->reps ? BENCH_MAX_REPS : dst == &o->batch ? BENCH_MAX_BATCH
                : dst == &o->max_itl_ms ? 3600000 : 1 << 20;
        if (dst) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 0, hi, dst))
                return CLI_EXIT_USAGE;
        } else if (!strcmp(a, "--roofline")) {
            o->roofline = 1;
        } else if (!strcmp(a, "--mixed")) {
            o->mixed = 1;
        } else {
            return cli_err_unknown("bench", a);
        }
    }
    if (o->reps < 1 || (o->p < 1 && o->n < 1) || (o->batch && (o->p < 1 || o->n < 1)))
        return cli_err_usage("bench", "need -r >= 1, and -p/-n >= 1 (both with --batch)");
    if (o->spec.spec && !o->batch)
        return cli_err_usage("bench", "--spec runs through the engine: give --batch B "
                                      "(bench/spec.py measures prompt lookup on real texts)");
    return cli_spec_check(&o->spec, "bench");
}

static void bench_random_tokens(int32_t *t, long n, int32_t n_vocab, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (long i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        t[i] = (int32_t)(s % (uint64_t)n_vocab);
    }
}

/* One timed measurement: pp (n_tok tokens in one eval) or tg (n_tok evals
 * of one token).  Returns tok/s, or < 0 on error. */
static double bench_once(cli_session *s, const int32_t *tok, long n_tok, int tg, kvant_err *err)
{
    double t0 = bench_now();
    if (tg) {
        for (long i = 0; i < n_tok; i++)
            if (cli_session_eval(s, tok + i, 1, (int32_t)i, 0, s->logits, err))
                return -1.0;
    } else if (cli_session_eval(s, tok, (int32_t)n_tok, 0, 0, s->logits, err)) {
        return -1.0;
    }
    return (double)n_tok / (bench_now() - t0);
}

static int bench_series(cli_session *s, const int32_t *tok, long n_tok, int tg, long reps,
                        bench_stat *st, kvant_err *err)
{
    double v[BENCH_MAX_REPS];
    /* warm-up: a few tokens page in every weight (each token reads them all) */
    if (bench_once(s, tok, n_tok < BENCH_WARMUP_TOKENS ? n_tok : BENCH_WARMUP_TOKENS, tg, err) < 0)
        return -1;
    wstream_stats w0, w1;
    if (s->ws)
        wstream_get_stats(s->ws, &w0);
    const double t0 = bench_now();
    for (long r = 0; r < reps; r++)
        if ((v[r] = bench_once(s, tok, n_tok, tg, err)) < 0)
            return -1;
    if (s->ws) {
        wstream_get_stats(s->ws, &w1);
        st->stream_wall_s = bench_now() - t0;
        st->stream_bytes = (double)(w1.bytes_read - w0.bytes_read);
        st->stream_read_s = w1.read_s - w0.read_s;
        st->stream_wait_s = w1.wait_s - w0.wait_s;
    }
    st->med = bench_median(v, (size_t)reps);
    st->lo = v[0];
    st->hi = v[reps - 1];
    return 0;
}

typedef struct bench_batch_res {
    double prefill_tps, decode_tps, wall_s;
    double ttft_p50, ttft_p99, itl_p50, itl_p99; /* ms */
    int32_t kv_blocks_peak;
    double kv_waste;
    uint64_t steps, generated;
    uint64_t spec_drafted, spec_accepted; /* --spec */
    uint64_t spec_cost_off;               /* decode steps the cost model declined */
    uint64_t itl_limited;                 /* steps the ITL budget held short */
} bench_batch_res;

typedef struct bench_batch_ctx {
    double *itl;             /* [batch * n] ms, owned */
    size_t n_itl;
} bench_batch_ctx;

typedef struct bench_req {
    bench_batch_ctx *b;      /* borrowed */
    double t_submit, t_first, t_last;
    long n_tok;
    int done;                /* 1 DONE, -1 ERROR */
} bench_req;

/* Engine callback (engine thread = this thread in manual mode). */
static void bench_on_event(void *ctx, const engine_event *ev)
{
    bench_req *r = ctx;
    bench_batch_ctx *b = r->b;
    double t = bench_now();
    if (ev->type == ENGINE_EV_TOKEN) {
        if (r->n_tok == 0)
            r->t_first = t;
        else
            b->itl[b->n_itl++] = (t - r->t_last) * 1e3;
        r->t_last = t;
        r->n_tok++;
    } else if (ev->type == ENGINE_EV_DONE || ev->type == ENGINE_EV_ERROR) {
        r->done = ev->type == ENGINE_EV_DONE ? 1 : -1;
    }
}

static void bench_batch_summary(bench_req *req, bench_batch_ctx *b, long batch, long p,
                                double t_end, bench_batch_res *res)
{
    double ttft[BENCH_MAX_BATCH], t_all_first = 0.0, t0 = req[0].t_submit;
    for (long i = 0; i < batch; i++) {
        ttft[i] = (req[i].t_first - req[i].t_submit) * 1e3;
        t_all_first = req[i].t_first > t_all_first ? req[i].t_first : t_all_first;
        res->generated += (uint64_t)req[i].n_tok;
    }
    qsort(ttft, (size_t)batch, sizeof ttft[0], bench_cmp);
    qsort(b->itl, b->n_itl, sizeof b->itl[0], bench_cmp);
    res->ttft_p50 = bench_pct(ttft, (size_t)batch, 0.50);
    res->ttft_p99 = bench_pct(ttft, (size_t)batch, 0.99);
    res->itl_p50 = bench_pct(b->itl, b->n_itl, 0.50);
    res->itl_p99 = bench_pct(b->itl, b->n_itl, 0.99);
    res->wall_s = t_end - t0;
    res->prefill_tps = (double)(batch * p) / (t_all_first - t0);
    /* decode: tokens after each request's first, over the time after the
     * last first token (prefill and decode overlap before that) */
    double dt = t_end - t_all_first;
    res->decode_tps = dt > 0 ? (double)(res->generated - (uint64_t)batch) / dt : 0.0;
}

/* Runs the --batch measurement once on a fresh engine. */
static int bench_batch(model *m, const cli_common *c, const bench_opts *o, par *group,
                       bench_batch_res *res, kvant_err *err)
{
    int rc0;
    engine_config cfg = engine_config_default();
    cli_engine_config(c, &cfg);
    cfg.max_num_seqs = (int32_t)(o->batch > 64 ? o->batch : 64);
    cfg.max_itl_ms = (double)o->max_itl_ms;
    cfg.spec = o->spec.spec;
    cfg.spec_draft_model = o->spec.spec_draft_model;
    cfg.spec_draft_max = o->spec.spec_draft_max;
    cfg.spec_ngram_min = o->spec.spec_ngram_min;
    cfg.spec_ngram_max = o->spec.spec_ngram_max;
    cfg.spec_max_batch = o->spec.spec_max_batch;
    cfg.max_model_len = o->p + o->n + 1;
    cfg.manual = 1;
    cfg.tp_group = group;
    cfg.tp_ranks = c->tp;
    memset(res, 0, sizeof *res);
    engine *e = engine_create(m, &cfg, err);
    if (!e)
        return -1;
    if (group && par_rank(group) != 0) { /* --tp: run rank 0's steps, then leave */
        rc0 = engine_tp_worker(e, err);
        engine_destroy(e);
        return rc0;
    }
    bench_batch_ctx b = {calloc((size_t)(o->batch * o->n), sizeof(double)), 0};
    bench_req *req = calloc((size_t)o->batch, sizeof *req);
    int32_t *prompt = malloc((size_t)o->p * sizeof *prompt);
    int rc = (!b.itl || !req || !prompt) ? kvant_err_set(err, KV_ENOMEM, "out of memory") : 0;
    long sum_p = 0;
    for (long i = 0; !rc && i < o->batch; i++) {
        /* --mixed: lengths spread over [1/8, 1] of -p / -n, a fixed pattern */
        long np = o->mixed ? o->p / 8 + (o->p - o->p / 8) * ((i * 37) % 17) / 16 : o->p;
        long nt = o->mixed ? o->n / 8 + (o->n - o->n / 8) * ((i * 53) % 13) / 12 : o->n;
        np = np < 1 ? 1 : np;
        nt = nt < 1 ? 1 : nt;
        sum_p += np;
        bench_random_tokens(prompt, np, m->hp.n_vocab, (uint64_t)i + 1000); /* no prefix hits */
        engine_request r = {.prompt = prompt, .n_prompt = np, .max_tokens = nt, .n = 1,
                            .ignore_eos = 1, .sampling = sampler_params_default()};
        req[i].b = &b;
        req[i].t_submit = bench_now();
        if (engine_submit(e, &r, bench_on_event, &req[i], err) <= 0)
            rc = -1;
    }
    double waste_sum = 0.0;
    uint64_t waste_n = 0;
    while (!rc && engine_run_step(e)) {
        engine_stats st;
        engine_get_stats(e, &st);
        res->kv_blocks_peak = st.kv_blocks_used > res->kv_blocks_peak ? st.kv_blocks_used
                                                                     : res->kv_blocks_peak;
        if (st.kv_token_capacity) {
            waste_sum += 1.0 - (double)st.kv_tokens_stored / (double)st.kv_token_capacity;
            waste_n++;
        }
        res->spec_drafted = st.spec_draft_tokens;
        res->spec_accepted = st.spec_accepted_tokens;
        res->spec_cost_off = st.spec_cost_off;
        res->itl_limited = st.itl_limited_steps;
        res->steps++;
    }
    double t_end = bench_now();
    for (long i = 0; !rc && i < o->batch; i++)
        if (req[i].done != 1 || req[i].n_tok < 1)
            rc = kvant_err_set(err, KV_EINVAL, "request %ld did not finish", i);
    if (!rc) {
        res->kv_waste = waste_n ? waste_sum / (double)waste_n : 0.0;
        bench_batch_summary(req, &b, o->batch, sum_p / o->batch, t_end, res);
    }
    free(prompt);
    free(req);
    free(b.itl);
    engine_destroy(e);
    return rc;
}

typedef struct bench_report {
    const cli_common *c;
    const bench_opts *o;
    const model *m;
    bench_weights w;
    int threads;
    bench_stat pp, tg;
    int streamed; /* --weights-memory streamed layers: the stat's stream fields are set */
    int experts;  /* --weights-memory on a mixture of experts: the cache during the tg series */
    xcache_stats xc0, xc1;
    double hot_share; /* of the run's expert uses (pp and tg), the share of each layer's most
                       * used quarter of experts (routing skew) */
    int have_rl, have_batch;
    roofline_result rl;
    bench_batch_res br;
    /* --tp: rank 0's communication during the pp and tg series */
    int tp;
    double pp_comm_bpt, pp_comm_share, tg_comm_bpt, tg_comm_share;
} bench_report;

/* tok/s as a share of the measured int8 peak (2 ops per matmul parameter). */
static double bench_int8_frac(const bench_report *r, double tps)
{
    return r->have_rl && r->rl.vnni_gops_nt > 0 ? tps * 2 * r->w.params * 1e-9 / r->rl.vnni_gops_nt
                                                : 0.0;
}

static void bench_print_json(const bench_report *r)
{
    const bench_opts *o = r->o;
    printf("{\"model\": ");
    cli_json_string(stdout, r->c->model_path, strlen(r->c->model_path));
    printf(", \"isa\": \"%s\", \"threads\": %d, \"model_bytes\": %.0f, \"params\": %.0f, "
           "\"reps\": %ld, \"p\": %ld, \"n\": %ld",
           dtype_isa(), r->threads, r->w.bytes_per_tok, r->w.params, o->reps, o->p, o->n);
    if (r->tp)
        printf(", \"tp\": %d, \"pp_comm_bytes_per_token\": %.1f, \"pp_comm_share\": %.4f, "
               "\"tg_comm_bytes_per_token\": %.1f, \"tg_comm_share\": %.4f",
               r->tp, r->pp_comm_bpt, r->pp_comm_share, r->tg_comm_bpt, r->tg_comm_share);
    if (!o->batch) {
        printf(", \"packed_bytes\": %.0f", r->w.packed_bytes);
        printf(", \"pp_tps\": %.3f, \"pp_tps_min\": %.3f, \"pp_tps_max\": %.3f, "
               "\"pp_gbps\": %.3f, \"pp_gflops\": %.3f",
               r->pp.med, r->pp.lo, r->pp.hi, r->pp.med * r->w.bytes_per_tok * 1e-9,
               r->pp.med * 2 * r->w.params * 1e-9);
        printf(", \"tg_tps\": %.3f, \"tg_tps_min\": %.3f, \"tg_tps_max\": %.3f, "
               "\"tg_gbps\": %.3f, \"tg_gflops\": %.3f",
               r->tg.med, r->tg.lo, r->tg.hi, r->tg.med * r->w.bytes_per_tok * 1e-9,
               r->tg.med * 2 * r->w.params * 1e-9);
        if (r->streamed)
            for (int k = 0; k < 2; k++) {
                const bench_stat *b = k ? &r->tg : &r->pp;
                const char *n = k ? "tg" : "pp";
                printf(", \"%s_stream_bytes\": %.0f, \"%s_stream_wall_s\": %.4f, "
                       "\"%s_stream_read_s\": %.4f, \"%s_stream_wait_s\": %.4f",
                       n, b->stream_bytes, n, b->stream_wall_s, n, b->stream_read_s, n,
                       b->stream_wait_s);
            }
    }
    if (r->experts)
        printf(", \"expert_slots\": %d, \"tg_expert_hits\": %llu, \"tg_expert_misses\": %llu, "
               "\"tg_expert_read_bytes\": %llu, \"expert_hot_share\": %.4f", r->xc1.n_slots,
               (unsigned long long)(r->xc1.hits - r->xc0.hits),
               (unsigned long long)(r->xc1.misses - r->xc0.misses),
               (unsigned long long)(r->xc1.bytes_read - r->xc0.bytes_read), r->hot_share);
    if (r->have_rl) {
        const roofline_result *l = &r->rl;
        printf(", \"roofline_read_gbps_1t\": %.3f, \"roofline_read_gbps\": %.3f, "
               "\"roofline_fma_gflops_1t\": %.3f, \"roofline_fma_gflops\": %.3f, "
               "\"roofline_vnni_gops_1t\": %.3f, \"roofline_vnni_gops\": %.3f",
               l->read_gbps_1t, l->read_gbps_nt, l->fma_gflops_1t, l->fma_gflops_nt,
               l->vnni_gops_1t, l->vnni_gops_nt);
        if (!o->batch && l->read_gbps_nt > 0)
            printf(", \"tg_tps_roofline\": %.3f, \"tg_roofline_frac\": %.4f",
                   l->read_gbps_nt * 1e9 / r->w.bytes_per_tok,
                   r->tg.med * r->w.bytes_per_tok * 1e-9 / l->read_gbps_nt);
    }
    if (r->have_batch) {
        const bench_batch_res *b = &r->br;
        printf(", \"batch\": %ld, \"prefill_tps\": %.3f, \"decode_tps\": %.3f, "
               "\"ttft_ms_p50\": %.3f, \"ttft_ms_p99\": %.3f, \"itl_ms_p50\": %.3f, "
               "\"itl_ms_p99\": %.3f, \"kv_blocks_peak\": %d, \"kv_waste\": %.4f, "
               "\"steps\": %llu, \"wall_s\": %.3f, \"mixed\": %d, \"spec\": %d, "
               "\"spec_draft_tokens\": %llu, \"spec_accepted_tokens\": %llu, "
               "\"spec_cost_off\": %llu",
               o->batch, b->prefill_tps, b->decode_tps, b->ttft_p50, b->ttft_p99, b->itl_p50,
               b->itl_p99, b->kv_blocks_peak, b->kv_waste, (unsigned long long)b->steps,
               b->wall_s, o->mixed, o->spec.spec, (unsigned long long)b->spec_drafted,
               (unsigned long long)b->spec_accepted, (unsigned long long)b->spec_cost_off);
        printf(", \"max_itl_ms\": %ld, \"itl_limited_steps\": %llu", o->max_itl_ms,
               (unsigned long long)b->itl_limited);
        if (r->have_rl)
            printf(", \"prefill_int8_frac\": %.4f, \"decode_int8_frac\": %.4f",
                   bench_int8_frac(r, b->prefill_tps), bench_int8_frac(r, b->decode_tps));
    }
    printf("}\n");
}

static void bench_print_text(const bench_report *r)
{
    const bench_opts *o = r->o;
    printf("model %s: %.1f MB matmul weights/token", r->c->model_path, r->w.bytes_per_tok / 1e6);
    if (!o->batch)
        printf(" (%.1f MB repacked)", r->w.packed_bytes / 1e6);
    printf(", %.1f M params, isa %s, %d threads\n", r->w.params / 1e6, dtype_isa(), r->threads);
    if (r->have_rl)
        printf("roofline: read %.1f GB/s (1t %.1f), fp32 FMA %.0f GFLOP/s (1t %.0f), "
               "int8 VNNI %.0f GOP/s (1t %.0f)\n",
               r->rl.read_gbps_nt, r->rl.read_gbps_1t, r->rl.fma_gflops_nt, r->rl.fma_gflops_1t,
               r->rl.vnni_gops_nt, r->rl.vnni_gops_1t);
    if (!o->batch) {
        printf("%-8s %12s %12s %10s %10s\n", "test", "tok/s", "min..max", "GB/s", "GFLOP/s");
        const bench_stat *st[2] = {&r->pp, &r->tg};
        for (int k = 0; k < 2; k++) {
            if ((k ? o->n : o->p) < 1)
                continue;
            char name[32], rng[40];
            snprintf(name, sizeof name, "%s%ld", k ? "tg" : "pp", k ? o->n : o->p);
            snprintf(rng, sizeof rng, "%.1f..%.1f", st[k]->lo, st[k]->hi);
            printf("%-8s %12.2f %12s %10.2f %10.2f\n", name, st[k]->med, rng,
                   st[k]->med * r->w.bytes_per_tok * 1e-9, st[k]->med * 2 * r->w.params * 1e-9);
        }
        for (int k = 0; r->streamed && k < 2; k++) {
            const bench_stat *b = st[k];
            if ((k ? o->n : o->p) < 1 || !(b->stream_wall_s > 0))
                continue;
            printf("%s stream: %.2f GB read, %.2f GB/s of wall time, %.2f GB/s inside reads, "
                   "%.0f%% of the time waiting for a layer\n", k ? "tg" : "pp",
                   b->stream_bytes * 1e-9, b->stream_bytes * 1e-9 / b->stream_wall_s,
                   b->stream_read_s > 0 ? b->stream_bytes * 1e-9 / b->stream_read_s : 0.0,
                   100 * b->stream_wait_s / b->stream_wall_s);
        }
        if (r->experts) {
            const double h = (double)(r->xc1.hits - r->xc0.hits);
            const double mi = (double)(r->xc1.misses - r->xc0.misses);
            printf("tg experts: %d cache slots, hit rate %.1f%% (%.0f hits, %.0f misses), %.2f GB "
                   "read; over the run, each layer's most used quarter of experts took %.1f%% of "
                   "the uses\n",
                   r->xc1.n_slots, h + mi > 0 ? 100 * h / (h + mi) : 0.0, h, mi,
                   (double)(r->xc1.bytes_read - r->xc0.bytes_read) * 1e-9, 100 * r->hot_share);
        }
        if (r->have_rl && r->rl.read_gbps_nt > 0)
            printf("tg at the read roofline: %.1f tok/s (achieved %.0f%%)\n",
                   r->rl.read_gbps_nt * 1e9 / r->w.bytes_per_tok,
                   100 * r->tg.med * r->w.bytes_per_tok * 1e-9 / r->rl.read_gbps_nt);
    }
    if (r->have_batch) {
        const bench_batch_res *b = &r->br;
        printf("batch %ld x (p %ld, n %ld): prefill %.1f tok/s, decode %.1f tok/s, "
               "TTFT p50/p99 %.1f/%.1f ms, ITL p50/p99 %.1f/%.1f ms, kv blocks peak %d, "
               "kv waste %.1f%%, %llu steps, %.2f s\n",
               o->batch, o->p, o->n, b->prefill_tps, b->decode_tps, b->ttft_p50, b->ttft_p99,
               b->itl_p50, b->itl_p99, b->kv_blocks_peak, 100 * b->kv_waste,
               (unsigned long long)b->steps, b->wall_s);
        if (r->have_rl && r->rl.vnni_gops_nt > 0) /* 2 ops per matmul parameter and token */
            printf("of the int8 roofline (%.0f GOP/s): prefill %.1f%%, decode %.1f%%\n",
                   r->rl.vnni_gops_nt, 100 * bench_int8_frac(r, b->prefill_tps),
                   100 * bench_int8_frac(r, b->decode_tps));
        if (o->spec.spec)
            printf("speculative decoding: %llu tokens drafted, %llu accepted; %llu decode steps "
                   "declined by the cost model\n", (unsigned long long)b->spec_drafted,
                   (unsigned long long)b->spec_accepted, (unsigned long long)b->spec_cost_off);
    }
}

/* pp and tg on a single-sequence session. */
/* --tp: bytes rank 0 sent per token and the share of step time spent in
 * collectives, between two snapshots. */
static void bench_comm(const tp_stats *a, const tp_stats *b, double *bpt, double *share)
{
    const double tok = (double)(b->tokens - a->tokens), st = b->step_seconds - a->step_seconds;
    *bpt = tok > 0 ? (double)(b->comm.bytes_sent - a->comm.bytes_sent) / tok : 0.0;
    *share = st > 0 ? (b->comm.seconds - a->comm.seconds) / st : 0.0;
}

static int cmp_desc(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Of all expert uses so far (hits + misses), the share of each layer's most
 * used quarter of experts, summed over layers. */
static double bench_hot_share(const xcache *xc, const xcache_stats *st)
{
    uint64_t uses[MODEL_MAX_EXPERTS], hot = 0, all = 0;
    for (int32_t il = 0; il < st->n_layers; il++) {
        for (int32_t e = 0; e < st->n_expert; e++) {
            uint64_t h, m;
            int res;
            xcache_expert(xc, il, e, &h, &m, &res);
            uses[e] = h + m;
            all += uses[e];
        }
        qsort(uses, (size_t)st->n_expert, sizeof *uses, cmp_desc);
        for (int32_t e = 0; e < (st->n_expert + 3) / 4; e++)
            hot += uses[e];
    }
    return all ? (double)hot / (double)all : 0.0;
}

static int bench_single(const cli_common *c, const bench_opts *o, bench_report *r, kvant_err *err)
{
    cli_session s;
    long ub = o->p < BENCH_MAX_UBATCH ? o->p : BENCH_MAX_UBATCH;
    long ctx = (o->p > o->n ? o->p : o->n) + 1;
    if (cli_session_open(&s, c, (int32_t)ctx, (int32_t)(ub > 0 ? ub : 1), 1, err))
        return -1;
    int rc = 0;
    long nt = o->p > o->n ? o->p : o->n;
    int32_t *tok = malloc((size_t)nt * sizeof *tok);
    if (!tok)
        rc = kvant_err_set(err, KV_ENOMEM, "out of memory");
    if (!rc) {
        bench_random_tokens(tok, nt, s.m->hp.n_vocab, 1);
        r->w = bench_weight_traffic(s.m);
        r->streamed = s.ws != NULL;
        tp_stats t0 = {0}, t1 = {0}, t2 = {0};
        if (s.tp)
            tp_get_stats(s.tp, &t0);
        if (o->p > 0)
            rc = bench_series(&s, tok, o->p, 0, o->reps, &r->pp, err);
        if (s.tp)
            tp_get_stats(s.tp, &t1);
        if ((r->experts = s.xc != NULL))
            xcache_get_stats(s.xc, &r->xc0);
        if (!rc && o->n > 0)
            rc = bench_series(&s, tok, o->n, 1, o->reps, &r->tg, err);
        if (s.xc) {
            xcache_get_stats(s.xc, &r->xc1);
            r->hot_share = bench_hot_share(s.xc, &r->xc1);
        }
        if (s.tp) {
            tp_get_stats(s.tp, &t2);
            r->tp = c->tp * c->pp;
            bench_comm(&t0, &t1, &r->pp_comm_bpt, &r->pp_comm_share);
            bench_comm(&t1, &t2, &r->tg_comm_bpt, &r->tg_comm_share);
        }
    }
    free(tok);
    cli_session_close(&s);
    return rc;
}

int cmd_bench(int argc, char **argv)
{
    cli_common c;
    bench_opts o;
    kvant_err err = {0};
    cli_common_init(&c);
    int prc = bench_parse(argc, argv, &c, &o);
    if (prc)
        return prc == 1 ? 0 : prc;
    dtype_init();
    bench_report r = {.c = &c, .o = &o};
    r.threads = c.n_threads > 0 ? c.n_threads : tpool_default_threads();
    int rc = 0;
    if (o.batch) {
        model *m = model_load(c.model_path, &err);
        rc = m ? 0 : -1;
        par *group = NULL;
        if (m && c.tp * c.pp > 1 && !(group = par_create(c.tp * c.pp, c.tp_timeout, &err)))
            rc = -1;
        if (m && !rc) {
            r.w = bench_weight_traffic(m);
            rc = bench_batch(m, &c, &o, group, &r.br, &err);
            r.have_batch = !rc;
        }
        model_free(m);
        if (group && par_rank(group) != 0) { /* a worker rank prints nothing */
            if (rc)
                fprintf(stderr, "kvant bench (rank %d): %s\n", par_rank(group), err.msg);
            par_destroy(group);
            return rc ? 1 : 0;
        }
        par_destroy(group);
    } else {
        rc = bench_single(&c, &o, &r, &err);
    }
    if (rc) {
        fprintf(stderr, "kvant bench: %s\n", err.msg[0] ? err.msg : "failed");
        return 1;
    }
    if (o.roofline)
        r.have_rl = !roofline_measure(r.threads, 0, (int)(o.reps < 5 ? 5 : o.reps), &r.rl);
    if (c.json)
        bench_print_json(&r);
    else
        bench_print_text(&r);
    return 0;
}
