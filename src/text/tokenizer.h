/* tokenizer.h - tokenizers built from GGUF metadata.
 *
 * Supports tokenizer.ggml.model = "llama" (SentencePiece-style, scores),
 * "gpt2" (byte-level BPE with merges; pre-tokenizers default/gpt-2,
 * smollm, llama-bpe, qwen2, qwen35 via PCRE2) and "gemma4" (BPE with
 * merges over raw UTF-8, spaces as U+2581, <0xXX> byte fallback).  Other
 * models and pre-tokenizers are refused by tok_create, the value named.
 * Special/control tokens, BOS/EOS per metadata, and streaming decode
 * across partial UTF-8 sequences.
 *
 * Ownership: tok_create returns a heap handle freed by tok_destroy; it
 * copies what it needs, so the gguf_ctx may be closed afterwards.
 * Threading: a tokenizer is immutable after creation; tok_encode and
 * tok_piece may be called from several threads at once.
 */
#ifndef KVANT_TOKENIZER_H
#define KVANT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"
#include "text/tok_types.h"
#include "util/err.h"

tokenizer *tok_create(const gguf_ctx *g, kvant_err *err);
void tok_destroy(tokenizer *t);

int32_t tok_n_vocab(const tokenizer *t);
int32_t tok_bos(const tokenizer *t);     /* -1 if none */
int32_t tok_eos(const tokenizer *t);     /* -1 if none */
int32_t tok_eot(const tokenizer *t);     /* end-of-turn (e.g. <|im_end|>), -1 if none */
int tok_add_bos(const tokenizer *t);     /* tokenizer.ggml.add_bos_token (or model default) */
/* True for tokens that end generation (EOS, EOT and other end markers). */
int tok_is_eog(const tokenizer *t, int32_t id);
int tok_attr_of(const tokenizer *t, int32_t id);

/* Encodes text (len bytes, need not be NUL-terminated).
 * add_bos: prepend BOS (callers pass tok_add_bos(t) for the model default).
 * parse_special: when non-zero, special-token text (e.g. "<|im_start|>")
 * becomes the special token; otherwise it is tokenized as plain text.
 * USER_DEFINED tokens (added vocabulary) are matched either way, as in
 * llama.cpp / HF.  Bytes a byte-level vocabulary lacks become U+FFFD.
 * Writes up to cap ids to out and returns the total number of tokens
 * (which may exceed cap: call again with a larger buffer), or a negative
 * kvant_status on error (e.g. invalid UTF-8 is handled, not an error). */
int64_t tok_encode(const tokenizer *t, const char *text, size_t len, int add_bos,
                   int parse_special, int32_t *out, int64_t cap, kvant_err *err);

/* The bytes a token decodes to (byte tokens and byte-level BPE mapped
 * back to raw bytes; SentencePiece's U+2581 mapped to a space).  Control
 * tokens decode to "" unless render_special is set.  Returns length
 * written (<= cap) or the needed length if larger than cap; negative if id
 * is out of range. */
int tok_piece(const tokenizer *t, int32_t id, int render_special, char *buf, int cap);

/* Streaming detokenizer: feeds tokens and emits only complete UTF-8
 * sequences, holding back a partial sequence until the next token.
 * Output is always valid UTF-8: invalid bytes become U+FFFD.  Control
 * tokens emit nothing.  Plain struct owned by the caller. */
typedef struct tok_stream {
    char pending[8];
    int n_pending;
} tok_stream;
void tok_stream_init(tok_stream *s);
/* Appends the complete text for id to out (cap bytes); returns bytes
 * written, or negative on error / insufficient cap (state then unchanged;
 * 3 * piece length + 12 bytes always suffice). */
int tok_stream_feed(const tokenizer *t, tok_stream *s, int32_t id, char *out, int cap);
/* Flushes held bytes (invalid trailing bytes become U+FFFD). */
int tok_stream_flush(tok_stream *s, char *out, int cap);

/* Convenience: decode a token array into a malloc'd NUL-terminated string
 * (caller frees).  NULL on error.  For SentencePiece vocabularies with
 * add_space_prefix, one leading space of the first piece is removed (the
 * prefix tok_encode added), so decode(encode(s)) == s. */
char *tok_decode(const tokenizer *t, const int32_t *ids, int64_t n, int render_special);

/* The longest piece any token decodes to, control tokens rendered (at
 * least 1): a prompt of L bytes has at least L / this many tokens. */
int32_t tok_max_piece_bytes(const tokenizer *t);

#endif
