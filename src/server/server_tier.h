/* server_tier.h - the KV offload tiers on /metrics and /v1/memory.
 *
 * Metric names already follow the Prometheus conventions the rest of
 * /metrics is moving to (kvant_ prefix, _total counters, _bytes units),
 * labelled by tier ("host", "disk").
 *
 * Ownership: returned strings / objects belong to the caller.
 * Threading: pure functions of the snapshot passed in; any thread.
 */
#ifndef KVANT_SERVER_TIER_H
#define KVANT_SERVER_TIER_H

#include <jansson.h>

#include "engine/engine.h"

/* Prometheus text for the tiers ("" when ts->enabled is 0); malloc'd, or
 * NULL when out of memory. */
char *srv_tier_metrics(const engine_tier_stats *ts);
/* {"enabled": false} or the per-tier view for /v1/memory; NULL on OOM. */
json_t *srv_tier_json(const engine_tier_stats *ts);

#endif
