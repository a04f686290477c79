/* engine_tier.h - the KV offload tiers seen from the engine (engine_tier.c). */
#ifndef KVANT_ENGINE_TIER_H
#define KVANT_ENGINE_TIER_H

#include "engine/engine_types.h"

/* The tiers' counters as of the end of the last step (enabled 0: none). */
void engine_get_tier_stats(engine *e, engine_tier_stats *out);

#endif
