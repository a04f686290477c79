/* engine_gram.h - constrained decoding inside the engine (engine_gram.c).
 *
 * A request may carry a finished grammar (engine_request.grammar, compiled
 * by the caller off the engine thread: the engine never compiles).  Each
 * of its sequences then owns a recognizer state (earley) and a mask memo
 * (tmask_work), made at submit on the submitting thread and freed with the
 * request off the step.  In the sample phase the engine thread computes the
 * sequence's token mask, sets every refused logit to -inf (so greedy,
 * temperature, top-k, top-p and min-p all draw from allowed tokens only),
 * samples, and advances the state by the token.  End-of-sequence ids are
 * allowed only where the grammar accepts.
 *
 * The vocabulary's token trie (tmask_vocab) and the engine's mask buffer
 * are built once per engine, on its first constrained request (at submit,
 * on the submitting thread, or earlier by engine_grammar_prepare), never
 * at create: an engine that sees no constrained request never pays for
 * them (about 25 ms and 7.4 MB for 49,152 tokens).  gvocab_mu serialises
 * the build, so concurrent first requests build it once; the trie is
 * published by a release store and read with acquire loads.  Out of memory
 * fails that request and leaves the trie unbuilt (a later request tries
 * again); a vocabulary that cannot have one (no tokenizer, a token over
 * TMASK_MAX_TOKEN_BYTES) refuses every constrained request with its
 * message.  Once built its bytes count in stats.grammar_vocab_bytes and
 * stats.host_bytes.
 *
 * Memory: a recognizer's chart grows with the bytes the output has (a
 * step may grow it; bounded by the grammar's max_state_items), the memo is
 * bounded; engine_gram_req_bytes counts both.  Threading: init/destroy on
 * the engine's creating thread, vocab and req_init on any submitting
 * thread, req_free wherever the request is freed (engine_req_reap), the
 * rest on the engine thread (which never builds nor allocates).  Calls
 * nothing else of the engine (takes e->mu to update the stats).
 */
#ifndef KVANT_ENGINE_GRAM_H
#define KVANT_ENGINE_GRAM_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine_internal.h"

/* At create (allocates nothing: no trie yet) and at destroy. */
void engine_gram_init(engine *e);
void engine_gram_destroy(engine *e);
/* Builds the trie if no call built it yet.  Any thread; once built, one
 * atomic load.  KV_OK, or KV_ENOMEM (not kept) / KV_EINVAL / KV_ERANGE
 * (kept) with err filled. */
int engine_gram_vocab(engine *e, kvant_err *err);

/* At submit (r->p.grammar set): builds the trie if needed
 * (engine_gram_vocab), then the states of r's p.n sequences.  KV_OK, or
 * KV_EINVAL / KV_ERANGE / KV_ENOMEM with err filled (r's states are then
 * freed). */
int engine_gram_req_init(engine *e, eng_req *r, kvant_err *err);
/* Frees r's states; release: also hand the grammar back (the engine's
 * reference: not when submit failed, the caller keeps it then). */
void engine_gram_req_free(eng_req *r, int release);
/* Bytes r's states hold now (0 without a grammar). */
uint64_t engine_gram_req_bytes(const eng_req *r);

/* Engine thread.  Masks row[n_vocab of the model] for sequence s: returns
 * the allowed count (> 0), or -1 with r->gram_err set (no token can
 * continue the output, or the state's limit). */
int32_t engine_gram_mask(engine *e, eng_seq *s, float *row);
/* Advances s's state by tok (sampled from a masked row): 0, or -1 with
 * r->gram_err set. */
int engine_gram_advance(engine *e, eng_seq *s, int32_t tok);
/* Whether tok ends a constrained output (an end-of-sequence id). */
int engine_gram_is_end(const engine *e, int32_t tok);

#endif
