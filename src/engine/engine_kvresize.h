/* engine_kvresize.h - KV memory that follows the load (engine_kvresize.c). */
#ifndef KVANT_ENGINE_KVRESIZE_H
#define KVANT_ENGINE_KVRESIZE_H

#include "engine/engine_types.h"

/* Resizes the KV pool to n_blocks between two steps (waits for the engine
 * thread's next step boundary; at once in manual mode).  Growing is all or
 * nothing: KV_ENOMEM when the memory manager refuses the bytes, KV_ERANGE
 * past config.kv_max_blocks, KV_EUNSUP when the backend cannot resize;
 * nothing changes on error.  Shrinking never fails and never touches a
 * block a sequence holds: it gives back the longest free tail of ids down
 * to max(n_blocks, the size at create) (cached prefix blocks there are
 * evicted), possibly nothing; the ids above the target that it could not
 * give back drain (are no longer handed out) until a later shrink takes
 * them or a resize to at least the current size ends the drain.  *out_blocks (may be NULL) gets the size
 * after the call.  KV_EBUSY (nothing changed) when the engine is stopping,
 * or when timeout_s > 0 passed before the engine thread took the request
 * (a step that long, a wedged engine); once taken, the resize finishes.
 * Any thread except the engine thread and event callbacks. */
int engine_kv_resize(engine *e, int32_t n_blocks, double timeout_s, int32_t *out_blocks,
                     kvant_err *err);

#endif
