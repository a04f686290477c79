/* engine.h - the serving engine: one engine thread owns the scheduler, the
 * paged KV pool and the backend; other threads submit requests, receive
 * streamed tokens through a callback, and cancel.
 *
 * Each engine step runs named phases: admit -> schedule -> build batch ->
 * run -> sample -> emit -> retire.  A step schedules running decodes first,
 * then prefill chunks, under max_num_batched_tokens and max_num_seqs.  When
 * the KV pool runs out the lowest-priority, latest-arrived running request
 * is preempted (its blocks freed) and re-queued to be recomputed.
 *
 * Ownership: engine_create borrows the model (it must outlive the engine)
 * and owns everything else (memory manager unless config.shared_mem,
 * backend, pool, thread).
 * Threading: engine_submit, engine_cancel, engine_get_stats, engine_drain
 * are thread-safe.  Event callbacks run on the engine thread: they must be
 * quick and must not call back into the engine except engine_cancel.
 */
#ifndef KVANT_ENGINE_H
#define KVANT_ENGINE_H

#include "engine/engine_types.h"
/* the parts of the API the other engine files implement */
#include "engine/engine_kvresize.h"
#include "engine/engine_kvsnap.h"
#include "engine/engine_offload.h"
#include "engine/engine_tier.h"
#include "engine/engine_tp.h"

engine_config engine_config_default(void);

engine *engine_create(model *m, const engine_config *cfg, kvant_err *err);
/* Stops the engine thread (in-flight requests get a final error event). */
void engine_destroy(engine *e);

/* Validates and queues a request.  Returns a request id > 0, or a negative
 * status with err filled (KV_EINVAL bad params, KV_ERANGE prompt does not
 * fit, KV_EBUSY queue full or draining, KV_ENOMEM).  After a successful
 * submit the callback receives events until exactly one final event (DONE
 * or ERROR).  Memory: the request's storage (n sequences of n_prompt +
 * max_tokens + 1 tokens and their KV block tables) is allocated here, on
 * the caller's thread, so that engine steps allocate nothing; requests
 * finished since are freed here too (else when the engine thread has no
 * admitted request left, or at destroy). */
int64_t engine_submit(engine *e, const engine_request *r, engine_event_fn fn, void *ctx,
                      kvant_err *err);
/* Cancels a request; takes effect within one engine step (final ERROR
 * event with "cancelled").  Unknown or finished ids are ignored.  No
 * allocation; O(requests in flight). */
void engine_cancel(engine *e, int64_t request_id);

void engine_get_stats(engine *e, engine_stats *out);

mem_mgr *engine_mem(engine *e);   /* for memory reports (thread-safe reads) */
int64_t engine_max_model_len(const engine *e);
int engine_spec_mode(const engine *e);   /* engine_config.spec: ENGINE_SPEC_* */

/* Constrained decoding needs the vocabulary's token trie, which the
 * engine builds on its first constrained request (in engine_submit), not
 * at create.  This builds it now if it is not built yet, so a caller can
 * pay for it (about 25 ms for 49,152 tokens) outside its own locks: the
 * server calls it on the HTTP thread before submitting.  Any thread;
 * concurrent callers build it once; once built, one atomic load.  KV_OK;
 * KV_EINVAL / KV_ERANGE (the model's vocabulary cannot have one: every
 * later call says so too) or KV_ENOMEM (not kept: the next call tries
 * again), with err filled. */
int engine_grammar_prepare(engine *e, kvant_err *err);
/* The 32-bit words of one token mask of this engine's vocabulary
 * (engine_request.grammar_masks); 0 until the trie is built
 * (engine_grammar_prepare) and when constrained decoding is unavailable
 * for the model.  Any thread. */
int32_t engine_mask_words(const engine *e);
uint64_t engine_kv_block_bytes(const engine *e); /* one KV block, all layers */
/* Stops admitting new requests (submit returns KV_EBUSY); returns the
 * number of requests still in flight. */
int engine_drain(engine *e);
int engine_in_flight(engine *e);

void engine_get_health(engine *e, engine_health *out);

/* Tests (config.manual): runs one step on the calling thread; returns 1 if
 * any work was done. */
int engine_run_step(engine *e);
/* The start-up plan (filled at create). */
const plan_result *engine_plan(const engine *e);

#endif
