/* tok_internal.h - shared internals of the tokenizer module (tokenizer.c,
 * tok_map.c, tok_utf8.c, tok_bpe.c, tok_spm.c).  Not for other modules.
 *
 * Invariants of a built tokenizer (established by tok_create, never
 * changed afterwards, so every function here may run on many threads):
 *   - token i's text is text[text_off[i] .. +text_len[i]) and its decoded
 *     bytes are piece[piece_off[i] .. +piece_len[i]);
 *   - every id stored anywhere (bos, eos, byte_tok, merges, specials) is
 *     in [0, n_vocab) or -1;
 *   - vocab maps a text to the LAST id carrying it (as llama.cpp does).
 */
#ifndef KVANT_TOK_INTERNAL_H
#define KVANT_TOK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"
#include "text/tok_types.h"
#include "util/err.h"

/* Limits on untrusted vocabulary metadata (named, checked, in one place). */
#define TOK_MAX_VOCAB (1 << 24)      /* tokens */
#define TOK_MAX_TOKEN_LEN 65536      /* bytes in one token's text */
#define TOK_MAX_MERGES (1 << 24)     /* merge rules */
#define TOK_MAX_EOG 16               /* end-of-generation ids */
#define TOK_MAX_REGEX 7              /* pre-tokenizer regexes applied in sequence */

/* ---- hash maps (tok_map.c) ---- */

/* text -> token id, open addressing over the tokenizer's own text table. */
typedef struct tok_strmap {
    int32_t *slots;      /* [cap] token id or -1 */
    uint32_t *hashes;    /* [cap] hash of the slot's text (fast reject) */
    size_t cap;          /* power of two */
} tok_strmap;

/* (left id, right id) -> merge rank and merged token id. */
typedef struct tok_pairmap {
    uint64_t *keys;      /* [cap] (left << 32 | right) + 1; 0 = empty */
    int32_t *rank;       /* [cap] */
    int32_t *result;     /* [cap] */
    size_t cap;          /* power of two */
} tok_pairmap;

typedef enum tok_kind { TOK_KIND_SPM = 1, TOK_KIND_BPE = 2 } tok_kind;

struct tokenizer {
    tok_kind kind;
    int32_t n_vocab;
    char *text;          /* all token texts, concatenated */
    uint32_t *text_off;  /* [n_vocab] */
    uint32_t *text_len;  /* [n_vocab] */
    char *piece;         /* decoded bytes of every token, concatenated */
    uint32_t *piece_off; /* [n_vocab] */
    uint32_t *piece_len; /* [n_vocab] */
    float *scores;       /* [n_vocab] (zeros when the file has none) */
    uint8_t *attr;       /* [n_vocab] enum tok_attr */
    tok_strmap vocab;
    tok_pairmap merges;  /* BPE only */
    int32_t byte_tok[256]; /* <0xXX> tokens (SPM, raw BPE); byte-level BPE: the byte's char token; -1 */
    int byte_level;      /* BPE on GPT-2 byte-level characters (gpt2); 0: on raw UTF-8 (gemma4) */
    int escape_ws;       /* ' ' is spelt U+2581 in token texts (SPM, gemma4) */

    int32_t bos, eos, eot, unk, pad;
    int add_bos, add_space_prefix;
    int32_t eog[TOK_MAX_EOG];
    int n_eog;

    /* Special tokens (CONTROL, USER_DEFINED, UNKNOWN) sorted by first byte,
     * then by length descending; special_start[b] .. special_start[b+1]
     * are the ones starting with byte b. */
    int32_t *special;
    int32_t special_start[257];

    /* Pre-tokenizer (BPE): regexes applied in sequence, each splitting the
     * pieces of the previous into matches and the gaps between them. */
    void *re[TOK_MAX_REGEX];  /* pcre2_code_8 * (kept opaque here) */
    int n_re;
    int ignore_merges;        /* llama-bpe: a word that is a token is emitted whole */
    int newline_whole;        /* gemma4: a word of only '\n' that is a token is emitted whole */
};

/* Growable output of an encode call: counts every token, stores up to cap. */
typedef struct tok_out {
    int32_t *ids;
    int64_t cap;
    int64_t n;
} tok_out;

static inline void tok_out_push(tok_out *o, int32_t id)
{
    if (o->n < o->cap)
        o->ids[o->n] = id;
    o->n++;
}

static inline const char *tok_text(const tokenizer *t, int32_t id, uint32_t *len)
{
    *len = t->text_len[id];
    return t->text + t->text_off[id];
}

/* tok_map.c */
/* Fills t->byte_tok from the vocabulary's "<0xXX>" tokens (-1 if absent). */
void tok_map_hex_bytes(tokenizer *t);
uint32_t tok_map_hash(const char *s, size_t n);
int tok_strmap_build(tok_strmap *m, const tokenizer *t);
void tok_strmap_free(tok_strmap *m);
int32_t tok_strmap_find(const tok_strmap *m, const tokenizer *t, const char *s, size_t n);
int tok_pairmap_init(tok_pairmap *m, size_t n_expected);
void tok_pairmap_free(tok_pairmap *m);
/* Inserts unless the pair is already present (first = lowest rank wins). */
void tok_pairmap_put(tok_pairmap *m, int32_t l, int32_t r, int32_t rank, int32_t result);
/* Returns 1 and fills rank/result if (l, r) is a merge. */
int tok_pairmap_get(const tok_pairmap *m, int32_t l, int32_t r, int32_t *rank, int32_t *result);

/* tok_utf8.c */
/* Length of the UTF-8 sequence starting at s (n bytes available):
 * > 0 valid sequence length; 0 a valid but incomplete prefix; -1 invalid
 * first byte or continuation (consume one byte). */
int tok_utf8_check(const unsigned char *s, size_t n);
/* Encodes cp as UTF-8 into out (>= 4 bytes); returns its length. */
int tok_utf8_put(uint32_t cp, char *out);
/* Decodes one code point (assumes tok_utf8_check > 0); returns length. */
int tok_utf8_get(const unsigned char *s, uint32_t *cp);
/* GPT-2's byte -> printable code point mapping (invert it by tabulating). */
uint32_t tok_byte_to_cp(uint8_t b);

/* tok_bpe.c */
/* pre: the pre-tokenizer to use, or NULL to read tokenizer.ggml.pre
 * ("default" when absent).  Also settles add_bos where the pre-tokenizer
 * implies it (llama.cpp's rules), so it runs after the special ids. */
int tok_bpe_init(tokenizer *t, const gguf_ctx *g, const char *pre, kvant_err *err);
void tok_bpe_free(tokenizer *t);
int tok_bpe_encode(const tokenizer *t, const char *text, size_t len, tok_out *out, kvant_err *err);

/* tok_spm.c */
int tok_spm_encode(const tokenizer *t, const char *text, size_t len, int space_prefix,
                   tok_out *out, kvant_err *err);

#endif
