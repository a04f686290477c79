/* fuzz_tokenizer.c - libFuzzer target for the tokenizers (the chat
 * templates have their own target, fuzz_jinja.c).  The first input byte picks the vocabulary
 * (bits 0 and 4: SentencePiece, byte-level BPE, raw-UTF-8 BPE (gemma-4),
 * byte-level BPE with Qwen3.5's regex), parse_special (bit 1) and add_bos
 * (bit 2); the rest is text.  The last two vocabularies come from
 * build/peer (`make peer-src`, which `make fuzz-run` runs).
 * Checks: encode never fails on any bytes, ids are in range, decode of the
 * ids and the streaming decoder agree. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "text/tokenizer.h"

#define VOCAB_DIR "tests/data/vectors/tokenizer/"
#define PEER_DIR "build/peer/llama.cpp/models/"

enum { N_TOK = 4 };

/* libFuzzer harness state: loaded once per process. */
static tokenizer *g_tok[N_TOK];
static gguf_ctx *g_gguf[N_TOK];

static void load(void)
{
    const char *files[N_TOK] = {VOCAB_DIR "ggml-vocab-llama-spm.gguf", VOCAB_DIR "ggml-vocab-gpt-2.gguf",
                                PEER_DIR "ggml-vocab-gemma-4.gguf", PEER_DIR "ggml-vocab-qwen35.gguf"};
    for (int i = 0; i < N_TOK; i++) {
        kvant_err err = {0};
        g_gguf[i] = gguf_open(files[i], &err);
        g_tok[i] = g_gguf[i] ? tok_create(g_gguf[i], &err) : NULL;
        if (!g_tok[i]) {
            fprintf(stderr, "fuzz_tokenizer: %s: %s\n", files[i], err.msg);
            abort();
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_tok[0])
        load();
    if (size < 1)
        return 0;
    const tokenizer *t = g_tok[(data[0] & 1) | ((data[0] >> 3) & 2)];
    int special = (data[0] >> 1) & 1;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int32_t ids[4096];
    int64_t n = tok_encode(t, text, len, data[0] & 4, special, ids, 4096, NULL);
    if (n < 0)
        abort(); /* any bytes must tokenize */
    if (n > 4096)
        n = 4096;
    tok_stream st;
    tok_stream_init(&st);
    char out[256];
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= tok_n_vocab(t))
            abort();
        if (tok_stream_feed(t, &st, ids[i], out, sizeof out) < 0)
            abort();
    }
    tok_stream_flush(&st, out, sizeof out);
    free(tok_decode(t, ids, n, 1));
    return 0;
}
