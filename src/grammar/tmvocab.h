/* tmvocab.h - a model's vocabulary as the token-mask walk reads it
 * (tokmask.h): a byte trie of every token's bytes (tokens that decode to no
 * bytes, such as control tokens, are never in it), the end-of-sequence ids,
 * and run masks.
 *
 * The trie's nodes lie in breadth-first order, so a node's children are
 * contiguous (child_first .. + n_child) and sorted by byte.  order[] holds
 * the token ids sorted by their bytes; the tokens whose bytes end at a node
 * are order[tok_first .. + n_tok), those at and below it order[lo .. hi).
 * Per node, `below` is the set of bytes that follow the node's in the
 * tokens below it, and `height` the most bytes a token below adds.
 *
 * A run mask is the set of tokens whose first byte lies in a set `first`,
 * and at most max_rest further bytes all in a set `rest` (where a grammar
 * state loops, or counts, over a string's characters, tokmask.c takes all
 * such tokens at once); a vocabulary keeps the last TMASK_RUN_MASKS.
 *
 * Ownership: tmask_vocab_create* return heap handles freed by
 * tmask_vocab_destroy.  Threading: a vocabulary may be shared by any
 * threads; all but its run masks is immutable after creation, and those are
 * under a mutex.
 */
#ifndef KVANT_TMVOCAB_H
#define KVANT_TMVOCAB_H

#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"
#include "util/err.h"

#define TMASK_MAX_TOKEN_BYTES 4096   /* longer tokens are refused at creation */
#define TMASK_RUN_MASKS 8            /* run masks a vocabulary keeps */

typedef struct tmask_vocab tmask_vocab;

/* tok[i] (len[i] bytes) for i < n_vocab; len 0: never allowed.  eos: the
 * ids allowed when the grammar accepts (n_eos may be 0).  Copies. */
tmask_vocab *tmask_vocab_create(const uint8_t *const *tok, const int32_t *len, int32_t n_vocab,
                                const int32_t *eos, int32_t n_eos, kvant_err *err);
/* The tokenizer's vocabulary: each token's piece (control tokens excluded),
 * end of sequence = tok_eos and tok_eot. */
tmask_vocab *tmask_vocab_from_tok(const tokenizer *t, kvant_err *err);
void tmask_vocab_destroy(tmask_vocab *v);

int32_t tmask_n_vocab(const tmask_vocab *v);
int32_t tmask_n_words(const tmask_vocab *v);   /* (n_vocab + 31) / 32 */
int tmask_is_eos(const tmask_vocab *v, int32_t id);
/* The token's bytes (borrowed) and length; NULL for an id out of range. */
const uint8_t *tmask_token(const tmask_vocab *v, int32_t id, int32_t *len);
size_t tmask_vocab_mem_bytes(const tmask_vocab *v);


/* ---- read by the walk (tokmask.c) ---- */
typedef struct tmvocab_node {
    int32_t child_first, n_child;
    int32_t tok_first, n_tok;
    int32_t lo, hi;      /* order[lo..hi): the tokens at and below the node */
    int32_t height;      /* the most bytes a token below adds */
    uint8_t byte;
} tmvocab_node;

typedef struct tmvocab_trie {
    const tmvocab_node *nodes;   /* [n_nodes], node 0 the root */
    const uint32_t *below;       /* [n_nodes][8] */
    const int32_t *order;
    const int32_t *eos;          /* [n_eos] */
    int32_t n_nodes, n_eos, max_len;
} tmvocab_trie;
const tmvocab_trie *tmvocab_trie_of(const tmask_vocab *v);

#define TMVOCAB_UNBOUNDED INT32_MAX
/* ORs the run mask of (first, rest, max_rest) into mask (computed on the
 * first use, then kept).  The number of tokens in the run mask, or -1 out
 * of memory (mask unchanged). */
int32_t tmvocab_run_mask_or(const tmask_vocab *v, const uint32_t first[8], const uint32_t rest[8],
                            int32_t max_rest, uint32_t *mask);

#endif
