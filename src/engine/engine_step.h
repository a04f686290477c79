/* engine_step.h - one engine step as named phases (engine_step.c).  Called
 * by engine.c only (the engine thread, or a test in manual mode). */
#ifndef KVANT_ENGINE_STEP_H
#define KVANT_ENGINE_STEP_H

#include "engine/engine_internal.h"

/* One engine step (admit .. retire); allocates and frees nothing.  Returns
 * 1 if the model ran. */
int engine_step(engine *e);

#endif
