/* server_metrics.c - histograms, counters and the Prometheus text format.
 *
 * Invariants: bucket bounds are strictly increasing and end with +Inf
 * implicitly; counts[i] holds observations <= le[i] that are > le[i-1]
 * (cumulated only when rendering).  Names follow Prometheus conventions:
 * prefix kvant_, base units in the name, counters end in _total, ratios
 * in [0, 1] end in _ratio (docs/SERVER.md lists them).  Label values are fixed strings from
 * this file or the build info (escaped), never request data.
 */
#include "server/server_metrics.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SRV_HIST_MAX_BUCKETS 24

typedef struct srv_hist_def {
    const char *name, *help;
    const double *le;
    int n_le;
} srv_hist_def;

static const double le_ttft[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
static const double le_itl[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0};
static const double le_e2e[] = {0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0,
                                15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 300.0};
static const double le_compile[] = {0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05,
                                    0.1, 0.25, 0.5, 1.0, 2.5};
static const double le_mask[] = {0.00001, 0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001,
                                 0.002, 0.005, 0.01, 0.02, 0.05, 0.1};
static const double le_tok[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000,
                                10000, 20000, 50000, 100000};

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const srv_hist_def hist_defs[SRV_H_COUNT] = {
    [SRV_H_TTFT] = {"time_to_first_token_seconds", "Time from request arrival to first token.",
                    le_ttft, N_OF(le_ttft)},
    [SRV_H_ITL] = {"inter_token_latency_seconds", "Time between consecutive tokens of a sequence.",
                   le_itl, N_OF(le_itl)},
    [SRV_H_E2E] = {"e2e_request_latency_seconds", "Time from request arrival to its final event.",
                   le_e2e, N_OF(le_e2e)},
    [SRV_H_QUEUE] = {"request_queue_time_seconds",
                     "Time from submission to the first engine event (includes prefill).",
                     le_e2e, N_OF(le_e2e)},
    [SRV_H_PROMPT] = {"request_prompt_tokens", "Prompt tokens per finished request.", le_tok,
                      N_OF(le_tok)},
    [SRV_H_GEN] = {"request_generation_tokens", "Generated tokens per finished request.", le_tok,
                   N_OF(le_tok)},
    [SRV_H_GRAMMAR_COMPILE] = {"grammar_compile_seconds",
                               "Time to get a constrained request's compiled grammar on its HTTP "
                               "thread (compile on a cache miss; cache hits included).",
                               le_compile, N_OF(le_compile)},
    [SRV_H_GRAMMAR_MASK] = {"grammar_mask_seconds",
                            "Engine-thread time per constrained token (the end token included): "
                            "its mask, applied to the logits, and the state advance.",
                            le_mask, N_OF(le_mask)},
};

typedef struct srv_hist {
    uint64_t counts[SRV_HIST_MAX_BUCKETS + 1]; /* last slot: > every bound */
    double sum;
    uint64_t count;
} srv_hist;

struct srv_metrics {
    pthread_mutex_t mu;
    srv_hist h[SRV_H_COUNT];
    uint64_t finished[4]; /* by engine_finish; [NONE] unused */
};

srv_metrics *srv_metrics_create(void)
{
    srv_metrics *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    pthread_mutex_init(&m->mu, NULL);
    return m;
}

void srv_metrics_destroy(srv_metrics *m)
{
    if (!m)
        return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void srv_metrics_observe(srv_metrics *m, srv_hist_id id, double v)
{
    if (!m || id < 0 || id >= SRV_H_COUNT || v != v)
        return;
    const srv_hist_def *d = &hist_defs[id];
    int b = 0;
    while (b < d->n_le && v > d->le[b])
        b++;
    pthread_mutex_lock(&m->mu);
    m->h[id].counts[b]++;
    m->h[id].sum += v;
    m->h[id].count++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_count_finish(srv_metrics *m, engine_finish reason)
{
    if (!m || reason <= ENGINE_FINISH_NONE || reason > ENGINE_FINISH_ABORT)
        return;
    pthread_mutex_lock(&m->mu);
    m->finished[reason]++;
    pthread_mutex_unlock(&m->mu);
}

/* Growable text buffer; on allocation failure it sets oom and stops. */
typedef struct sbuf {
    char *s;
    size_t len, cap;
    int oom;
} sbuf;

__attribute__((format(printf, 2, 3))) static void sb_printf(sbuf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->s && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = (b->cap + (size_t)n + 1) * 2;
        char *ns = realloc(b->s, cap);
        if (!ns) {
            b->oom = 1;
            return;
        }
        b->s = ns;
        b->cap = cap;
    }
}

static void head(sbuf *b, const char *name, const char *type, const char *help)
{
    sb_printf(b, "# HELP kvant_%s %s\n# TYPE kvant_%s %s\n", name, help, name, type);
}

static void gauge(sbuf *b, const char *name, const char *help, double v)
{
    head(b, name, "gauge", help);
    sb_printf(b, "kvant_%s %.17g\n", name, v);
}

static void counter(sbuf *b, const char *name, const char *help, double v)
{
    head(b, name, "counter", help);
    sb_printf(b, "kvant_%s %.17g\n", name, v);
}

/* Writes a label value with \, " and newline escaped. */
static void label_value(sbuf *b, const char *s)
{
    for (; s && *s; s++) {
        if (*s == '\\' || *s == '"')
            sb_printf(b, "\\%c", *s);
        else if (*s == '\n')
            sb_printf(b, "\\n");
        else
            sb_printf(b, "%c", *s);
    }
}

static void render_hists(sbuf *b, const srv_hist *h)
{
    for (int i = 0; i < SRV_H_COUNT; i++) {
        const srv_hist_def *d = &hist_defs[i];
        head(b, d->name, "histogram", d->help);
        uint64_t cum = 0;
        for (int k = 0; k < d->n_le; k++) {
            cum += h[i].counts[k];
            sb_printf(b, "kvant_%s_bucket{le=\"%g\"} %llu\n", d->name, d->le[k],
                      (unsigned long long)cum);
        }
        cum += h[i].counts[d->n_le];
        sb_printf(b, "kvant_%s_bucket{le=\"+Inf\"} %llu\n", d->name, (unsigned long long)cum);
        sb_printf(b, "kvant_%s_sum %.17g\nkvant_%s_count %llu\n", d->name, h[i].sum, d->name,
                  (unsigned long long)h[i].count);
    }
}

static double ratio(double a, double b)
{
    return b > 0 ? a / b : 0.0;
}

/* Speculative decoding (--spec): counters, and verification passes by the
 * fraction of their drafts accepted as a histogram (buckets .25 .. 1). */
static void render_spec(sbuf *b, const engine_stats *st)
{
    counter(b, "spec_draft_tokens_total", "Tokens drafted by speculative decoding.",
            (double)st->spec_draft_tokens);
    counter(b, "spec_accepted_tokens_total", "Drafted tokens the model accepted.",
            (double)st->spec_accepted_tokens);
    counter(b, "spec_skipped_total", "Decode steps of a speculating request that drafted "
            "nothing (no n-gram match, paused for low acceptance, or a large batch).",
            (double)st->spec_skipped);
    static const char *const le[ENGINE_SPEC_HIST - 1] = {"0.25", "0.5", "0.75", "0.9999"};
    head(b, "spec_acceptance_ratio", "histogram",
         "Verification passes by accepted / drafted tokens.");
    uint64_t cum = 0;
    for (int k = 0; k < ENGINE_SPEC_HIST; k++) {
        cum += st->spec_verify_hist[k];
        if (k < ENGINE_SPEC_HIST - 1)
            sb_printf(b, "kvant_spec_acceptance_ratio_bucket{le=\"%s\"} %llu\n", le[k],
                      (unsigned long long)cum);
    }
    sb_printf(b, "kvant_spec_acceptance_ratio_bucket{le=\"+Inf\"} %llu\n"
                 "kvant_spec_acceptance_ratio_sum %.17g\nkvant_spec_acceptance_ratio_count %llu\n",
              (unsigned long long)cum, st->spec_ratio_sum, (unsigned long long)cum);
    counter(b, "spec_cost_off_total", "Decode steps of a speculating request the cost model "
            "declined to draft for (also in kvant_spec_skipped_total).",
            (double)st->spec_cost_off);
    gauge(b, "spec_step_base_seconds", "The cost model's decode step time at zero tokens "
          "(fitted over recent decode steps; 0 until measured).", st->spec_step_base_s);
    gauge(b, "spec_step_token_seconds", "The cost model's decode step time per token.",
          st->spec_step_token_s);
    gauge(b, "spec_draft_pass_seconds", "The draft model's time per one-token pass (0 "
          "without one).", st->spec_draft_pass_s);
}

/* A hybrid model's recurrent state (engine_state.c). */
static void render_state(sbuf *b, const engine_stats *st)
{
    gauge(b, "state_slot_bytes", "Bytes of one sequence's recurrent state (hybrid models).",
          (double)st->state_slot_bytes);
    gauge(b, "state_live_slots", "Recurrent-state slots for running sequences.",
          st->state_live_slots);
    gauge(b, "state_live_slots_used", "Recurrent-state slots held by running sequences.",
          st->state_live_used);
    gauge(b, "state_snapshot_slots", "Recurrent-state slots for the prefix cache's snapshots.",
          st->state_snap_slots);
    gauge(b, "state_snapshots", "Recurrent-state snapshots held by the prefix cache.",
          st->state_snapshots);
    counter(b, "state_snapshots_taken_total", "Recurrent-state snapshots taken at block "
            "boundaries.", (double)st->state_snap_taken);
    counter(b, "state_snapshot_restores_total", "Prefix hits that restored a snapshot from "
            "the device.", (double)st->state_snap_restored);
    counter(b, "state_snapshot_tier_restores_total", "Prefix hits that restored a snapshot "
            "from the host or disk tier.", (double)st->state_tier_restored);
    counter(b, "state_snapshot_tier_stores_total", "Snapshots moved down to the host or disk "
            "tier.", (double)st->state_tier_stored);
    counter(b, "state_snapshots_evicted_total", "Snapshots evicted from the device to make "
            "room.", (double)st->state_snap_evicted);
}

static void render_engine(sbuf *b, const engine_stats *st, uint64_t block_bytes)
{
    gauge(b, "num_requests_running", "Sequences being generated (a request with n > 1 counts n).",
          st->running);
    gauge(b, "num_requests_waiting", "Requests waiting to be scheduled.", st->waiting);
    gauge(b, "num_requests_preempted_waiting", "Preempted requests waiting to be recomputed.",
          st->preempted_waiting);
    counter(b, "prompt_tokens_total", "Prompt tokens of admitted requests.",
            (double)st->prompt_tokens);
    counter(b, "prompt_tokens_computed_total",
            "Prompt tokens run through the model (prefix-cache hits excluded, recomputation "
            "after preemption included).",
            (double)st->prompt_tokens_computed);
    counter(b, "generation_tokens_total", "Generated tokens.", (double)st->generation_tokens);
    counter(b, "num_preemptions_total", "Preemptions of running requests.",
            (double)st->preemptions);
    gauge(b, "kv_blocks_capacity", "KV cache blocks in the pool.", st->kv_blocks_total);
    gauge(b, "kv_blocks_max", "KV cache blocks the pool may grow to.",
          st->kv_blocks_max > st->kv_blocks_total ? st->kv_blocks_max : st->kv_blocks_total);
    counter(b, "kv_pool_grows_total", "Times the KV pool grew.", (double)st->kv_grows);
    gauge(b, "kv_used_bytes", "Bytes of the KV blocks referenced by requests (all layers; "
          "with a window group, the global layers').", (double)st->kv_blocks_used * block_bytes);
    gauge(b, "kv_blocks_used", "KV cache blocks referenced by requests.", st->kv_blocks_used);
    gauge(b, "kv_blocks_free", "KV cache blocks free.", st->kv_blocks_free);
    gauge(b, "kv_blocks_cached", "Free KV blocks holding reusable prefix-cache content.",
          st->kv_blocks_cached);
    gauge(b, "kv_block_size_tokens", "Tokens per KV block.", st->block_size);
    gauge(b, "kv_block_size_bytes", "Bytes of one KV block (all layers).", (double)block_bytes);
    gauge(b, "kv_usage_ratio", "Used KV blocks / total KV blocks.",
          ratio(st->kv_blocks_used, st->kv_blocks_total));
    gauge(b, "kv_token_occupancy_ratio", "Tokens stored / token capacity of the used KV blocks.",
          ratio((double)st->kv_tokens_stored, (double)st->kv_token_capacity));
    counter(b, "prefix_cache_queries_tokens_total", "Prompt tokens looked up in the prefix cache.",
            (double)st->prefix_queries);
    counter(b, "prefix_cache_hits_tokens_total", "Prompt tokens found in the prefix cache.",
            (double)st->prefix_hits);
    counter(b, "engine_steps_total", "Engine steps run.", (double)st->steps);
    gauge(b, "sched_step_token_budget", "The last step's token budget: --max-num-batched-tokens, "
          "or what --max-itl-ms allows while requests decode.", st->itl_budget);
    counter(b, "sched_itl_limited_steps_total", "Steps that filled a token budget "
            "--max-itl-ms held under --max-num-batched-tokens.", (double)st->itl_limited_steps);
    gauge(b, "sched_step_base_seconds", "The step-cost model: a step's seconds at zero tokens "
          "(fitted over recent steps; 0 until two steps ran).", st->step_base_s);
    gauge(b, "sched_step_token_seconds", "The step-cost model: a step's seconds per token.",
          st->step_token_s);
    counter(b, "kv_budget_blocks_dropped_total",
            "KV blocks given back under requests' KV budgets (kv_budget).",
            (double)st->kv_budget_dropped);
    render_spec(b, st);
    if (st->state_live_slots > 0)
        render_state(b, st);
    if (st->kv_window > 0) { /* a sliding-window layer group: the kv_blocks_* above are global */
        gauge(b, "kv_window_blocks_capacity", "KV blocks of the sliding-window layers' pool.",
              st->kv_w_blocks_total);
        gauge(b, "kv_window_blocks_used", "Window-layer KV blocks referenced by requests.",
              st->kv_w_blocks_used);
        gauge(b, "kv_window_blocks_free", "Window-layer KV blocks free.", st->kv_w_blocks_free);
        gauge(b, "kv_window_blocks_cached",
              "Free window-layer KV blocks holding reusable prefix-cache content.",
              st->kv_w_blocks_cached);
        counter(b, "kv_window_blocks_dropped_total",
                "Window-layer KV blocks given back as sequences moved past them.",
                (double)st->kv_w_dropped);
    }
}

static void render_mem(sbuf *b, const mem_report *r)
{
    head(b, "device_memory_bytes", "gauge", "Device bytes in use by category.");
    for (int c = 0; c < MEM_CAT_COUNT; c++)
        sb_printf(b, "kvant_device_memory_bytes{category=\"%s\"} %llu\n",
                  mem_cat_name((mem_cat)c), (unsigned long long)r->cat[c].current);
    head(b, "device_memory_peak_bytes", "gauge", "Peak device bytes by category.");
    for (int c = 0; c < MEM_CAT_COUNT; c++)
        sb_printf(b, "kvant_device_memory_peak_bytes{category=\"%s\"} %llu\n",
                  mem_cat_name((mem_cat)c), (unsigned long long)r->cat[c].peak);
    gauge(b, "device_memory_budget_bytes", "Device memory budget.", (double)r->budget);
    if (r->has_resident) { /* reserved (above) is not resident: untouched pages cost nothing */
        head(b, "device_memory_resident_bytes", "gauge",
             "Of the device bytes by category, those resident in RAM (host memory: mincore).");
        for (int c = 0; c < MEM_CAT_COUNT; c++)
            sb_printf(b, "kvant_device_memory_resident_bytes{category=\"%s\"} %llu\n",
                      mem_cat_name((mem_cat)c), (unsigned long long)r->resident[c]);
        gauge(b, "kv_reserved_bytes", "Bytes reserved for the KV pool (committed blocks).",
              (double)r->cat[MEM_KV].current);
        gauge(b, "kv_resident_bytes", "Of the KV pool's reserved bytes, those resident in RAM.",
              (double)r->resident[MEM_KV]);
    }
    gauge(b, "kv_fragmentation_ratio", "1 - largest free extent / free bytes of the KV pool.",
          r->n_pools > 0 ? r->fragmentation[0] : 0.0);
}

char *srv_metrics_render(srv_metrics *m, const srv_build_info *bi, const engine_stats *st,
                         const mem_report *rep)
{
    srv_hist h[SRV_H_COUNT];
    uint64_t fin[4];
    pthread_mutex_lock(&m->mu);
    memcpy(h, m->h, sizeof h);
    memcpy(fin, m->finished, sizeof fin);
    pthread_mutex_unlock(&m->mu);

    sbuf b = {0};
    render_engine(&b, st, bi->kv_block_bytes);
    head(&b, "request_success_total", "counter", "Finished requests by finish reason.");
    static const char *reasons[4] = {NULL, "stop", "length", "abort"};
    for (int i = 1; i < 4; i++)
        sb_printf(&b, "kvant_request_success_total{finished_reason=\"%s\"} %llu\n", reasons[i],
                  (unsigned long long)fin[i]);
    render_hists(&b, h);
    counter(&b, "grammar_cache_hits_total", "Constrained requests whose grammar was compiled "
            "already.", (double)bi->grammar_cache_hits);
    counter(&b, "grammar_cache_misses_total", "Constrained requests whose grammar was compiled "
            "for them.", (double)bi->grammar_cache_misses);
    gauge(&b, "grammar_state_bytes", "Host bytes of the admitted requests' grammar states.",
          (double)st->grammar_bytes);
    gauge(&b, "grammar_vocab_bytes", "Host bytes of the vocabulary's token trie for constrained "
          "decoding (0 until the first constrained request builds it).",
          (double)st->grammar_vocab_bytes);
    if (rep)
        render_mem(&b, rep);
    head(&b, "build_info", "gauge", "Build and model information.");
    sb_printf(&b, "kvant_build_info{version=\"");
    label_value(&b, bi->version);
    sb_printf(&b, "\",backend=\"");
    label_value(&b, bi->backend);
    sb_printf(&b, "\",model=\"");
    label_value(&b, bi->model);
    sb_printf(&b, "\"} 1\n");
    gauge(&b, "ready", "1 when /ready answers 200 (not loading, not draining).", bi->ready);
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}
