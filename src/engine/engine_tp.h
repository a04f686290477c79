/* engine_tp.h - the engine as one rank of a --tp/--pp group (engine_tp.c): the
 * worker ranks' loop, every rank's memory, rank 0's traffic. */
#ifndef KVANT_ENGINE_TP_H
#define KVANT_ENGINE_TP_H

#include "engine/engine_types.h"

/* A rank other than 0: executes rank 0's steps until rank 0's engine is
 * destroyed (KV_OK) or the group fails (its error). */
int engine_tp_worker(engine *e, kvant_err *err);
/* Fills out[0..n) with every rank's memory; returns the rank count (0:
 * not tensor-parallel).  Thread-safe (immutable after create). */
int engine_tp_ranks(const engine *e, engine_tp_rank *out, int max);
int engine_get_tp_stats(engine *e, engine_tp_stats *out);

#endif
