/* engine_kvsnap.h - the memory views (engine_kvsnap.c): a consistent copy of the
 * KV pool's block states and of the requests holding blocks, made by the
 * engine thread between two steps, so HTTP threads never read the pool. */
#ifndef KVANT_ENGINE_KVSNAP_H
#define KVANT_ENGINE_KVSNAP_H

#include "engine/engine_types.h"

/* Allocates a snapshot sized for this engine's pool (caller frees with
 * engine_kv_snapshot_free); NULL when out of memory.  Any thread. */
engine_kv_snapshot *engine_kv_snapshot_new(const engine *e);
void engine_kv_snapshot_free(engine_kv_snapshot *s);
/* Fills s (waits for the engine thread's next step boundary, or fills it
 * at once in manual mode).  One waiter at a time is served; others queue.
 * Returns KV_OK, or KV_EBUSY when the engine is stopping.  Any thread
 * except the engine thread and event callbacks. */
int engine_kv_snapshot_take(engine *e, engine_kv_snapshot *s, kvant_err *err);

#endif
