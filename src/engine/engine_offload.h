/* engine_offload.h - weight offload seen from the engine (engine_offload.c). */
#ifndef KVANT_ENGINE_OFFLOAD_H
#define KVANT_ENGINE_OFFLOAD_H

#include "engine/engine_types.h"

/* Weight offload counters (model/wstream.h); returns 0 and leaves out
 * untouched when the engine streams no layer.  Thread-safe. */
int engine_get_offload(engine *e, struct wstream_stats *out);
/* The expert cache (model/xcache.h) when the engine places experts by
 * memory, else NULL; valid while the engine is.  Thread-safe. */
struct xcache *engine_get_xcache(engine *e);

#endif
