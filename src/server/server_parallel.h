/* server_parallel.h - tensor parallelism (--tp) on /metrics and /v1/memory:
 * every rank's memory as gathered at start (budget, weights, KV,
 * activations, KV blocks, heads and FFN width held), and rank 0's
 * communication (bytes sent, time in collectives, share of step time,
 * bytes per token).
 *
 * Ownership: returned strings / objects belong to the caller.
 * Threading: any thread (reads the engine's thread-safe snapshots).
 */
#ifndef KVANT_SERVER_PARALLEL_H
#define KVANT_SERVER_PARALLEL_H

#include <jansson.h>

#include "engine/engine.h"

/* Prometheus text ("" without --tp); malloc'd, or NULL when out of memory. */
char *srv_tp_metrics(engine *e);
/* {"enabled": false} or the ranks and counters; NULL on OOM. */
json_t *srv_tp_json(engine *e);

#endif
