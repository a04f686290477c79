/* engine_req.h - requests and their sequences inside the engine: storage,
 * the scheduler's lists, events (engine_req.c).  Called by engine.c and
 * engine_step.c; calls only the files below it (engine_internal.h). */
#ifndef KVANT_ENGINE_REQ_H
#define KVANT_ENGINE_REQ_H

#include "engine/engine_internal.h"

/* Allocates a request and everything its sequences will need (one block:
 * the eng_req, p.n sequences, their token arrays and block tables) and sets
 * up sequence 0.  Runs on the submitting thread (engine_submit), never on
 * the engine thread's step.  rq was validated (check_request), kvb is its
 * resolved KV budget (engine_kvb_resolve).  Returns
 * KV_OK with *out set, or KV_ENOMEM / KV_ERANGE / KV_EINVAL with err
 * filled.  *out is not linked anywhere yet: engine_req_destroy frees it
 * until it is queued. */
int engine_req_create(engine *e, const engine_request *rq, const eng_kvb *kvb,
                      engine_event_fn fn, void *ctx, eng_req **out, kvant_err *err);
void engine_req_destroy(eng_req *r);

/* Sets up sequence index of r in its storage (sampler on the shared
 * scratch, empty fixed block table, the prompt copied after index 0);
 * makes r->seqs[index] point at it.  Allocates nothing.  KV_EINVAL only if
 * the sampling params are invalid (they were checked at submit). */
int engine_seq_setup(engine *e, eng_req *r, int32_t index);

/* The scheduler's lists (priority, then arrival, then index).  remove
 * leaves a sequence on another list untouched.  Engine thread. */
void engine_list_insert(eng_seq **head, eng_seq *s);
void engine_list_remove(eng_seq **head, eng_seq *s);

/* Fills the request-wide fields of ev and calls r's callback.  Engine thread. */
void engine_emit(eng_req *r, engine_event *ev);
/* Final ERROR event (footprint recorded first); counts an abort. */
void engine_emit_error(engine *e, eng_req *r, const char *msg);
/* Engine thread: takes r off every list, releases its KV blocks and puts it
 * on e->dead; nothing is freed here (a step allocates and frees nothing). */
void engine_free_req(engine *e, eng_req *r);
/* Frees the requests on e->dead.  Any thread, outside a step: engine_submit,
 * the engine thread when it has no admitted request left, engine_destroy. */
void engine_req_reap(engine *e);

#endif
