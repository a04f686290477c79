/* server_offload.h - weight offload (model/wstream.h) on /metrics and
 * /v1/memory: resident vs streamed bytes per layer, bytes streamed per
 * forward pass and per token, the reader's bandwidth and the forward
 * pass's wait, and whether the stream failed.
 *
 * Ownership: returned strings / objects belong to the caller.
 * Threading: any thread (reads the engine's thread-safe counters).
 */
#ifndef KVANT_SERVER_OFFLOAD_H
#define KVANT_SERVER_OFFLOAD_H

#include <jansson.h>

#include "engine/engine.h"

/* Prometheus text ("" without offload); malloc'd, or NULL when out of memory. */
char *srv_offload_metrics(engine *e);
/* {"enabled": false} or the placement and counters; NULL on OOM. */
json_t *srv_offload_json(engine *e);

#endif
