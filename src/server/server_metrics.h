/* server_metrics.h - Prometheus metrics of `kvant serve`: latency and size
 * histograms fed from engine events, finish-reason counters, and the text
 * exposition (format 0.0.4, names prefixed "kvant_" by Prometheus conventions, no per-request labels).
 *
 * Ownership: srv_metrics_create returns a heap handle freed by
 * srv_metrics_destroy.  Threading: every function is thread-safe (one
 * internal mutex): observations come from the engine thread (event
 * callbacks) and HTTP threads, rendering from an HTTP thread.
 */
#ifndef KVANT_SERVER_METRICS_H
#define KVANT_SERVER_METRICS_H

#include "engine/engine.h"
#include "mem/mem.h"

typedef enum srv_hist_id {
    SRV_H_TTFT = 0,      /* time_to_first_token_seconds */
    SRV_H_ITL,           /* inter_token_latency_seconds */
    SRV_H_E2E,           /* e2e_request_latency_seconds */
    SRV_H_QUEUE,         /* request_queue_time_seconds */
    SRV_H_PROMPT,        /* request_prompt_tokens */
    SRV_H_GEN,           /* request_generation_tokens */
    SRV_H_GRAMMAR_COMPILE, /* grammar_compile_seconds (HTTP thread, cache hits included) */
    SRV_H_GRAMMAR_MASK,  /* grammar_mask_seconds (engine thread, per constrained token) */
    SRV_H_COUNT
} srv_hist_id;

typedef struct srv_metrics srv_metrics;

srv_metrics *srv_metrics_create(void);
void srv_metrics_destroy(srv_metrics *m);

void srv_metrics_observe(srv_metrics *m, srv_hist_id h, double v);
/* Counts one finished request by the reason the client saw. */
void srv_metrics_count_finish(srv_metrics *m, engine_finish reason);

/* Facts for kvant_build_info and gauges the engine stats lack (copied). */
typedef struct srv_build_info {
    const char *version, *backend, *model;
    uint64_t kv_block_bytes; /* bytes of one KV block, all layers */
    int ready;               /* server state is ready */
    int64_t grammar_cache_hits, grammar_cache_misses; /* the compiled-grammar cache */
} srv_build_info;

/* Renders the exposition text from the current histograms plus an engine
 * stats snapshot and a memory report (both borrowed; rep may be NULL).
 * Returns a malloc'd NUL-terminated string (caller frees) or NULL. */
char *srv_metrics_render(srv_metrics *m, const srv_build_info *bi, const engine_stats *st,
                         const mem_report *rep);

#endif
