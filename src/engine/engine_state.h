/* engine_state.h - hybrid models' recurrent-state slots as the engine
 * plans them (engine_state.c), for `kvant plan` and the engine's start-up. */
#ifndef KVANT_ENGINE_STATE_H
#define KVANT_ENGINE_STATE_H

#include <stdint.h>

#include "engine/engine_types.h"

/* A hybrid model's recurrent-state slots under c (slot_bytes each; budget: the
 * plan's, for the snapshots' automatic share): *n_live, one per sequence (and
 * the forks a request adds), *n_snap for the prefix cache; returns their sum
 * (0: slot_bytes 0, no recurrent layers). */
int32_t engine_state_plan(const engine_config *c, uint64_t slot_bytes, uint64_t budget,
                          int32_t *n_live, int32_t *n_snap);

#endif
