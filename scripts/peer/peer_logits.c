/* peer_logits.c - teacher-forced logits from llama.cpp's library, for
 * kvant's agreement tests (scripts/peer-logits builds and runs it).
 *
 *   peer_logits MODEL TOKENS OUT [THREADS] [KV]
 *
 * TOKENS: one sequence per line, token ids separated by spaces.  Each
 * sequence is decoded from an empty cache, all its positions scored.
 * OUT: float32 [total tokens][n_vocab], sequences in file order.
 * KV: f16 (default, as llama.cpp runs) or f32.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

#define MAX_SEQ 65536

static int read_line_ids(FILE *f, llama_token *ids, int max)
{
    int n = 0, c;
    long v = 0;
    int in = 0;
    while ((c = fgetc(f)) != EOF && c != '\n') {
        if (c >= '0' && c <= '9') {
            v = v * 10 + (c - '0');
            in = 1;
        } else if (in) {
            if (n < max)
                ids[n++] = (llama_token)v;
            v = 0;
            in = 0;
        }
    }
    if (in && n < max)
        ids[n++] = (llama_token)v;
    return (n == 0 && c == EOF) ? -1 : n;
}

static void quiet(enum ggml_log_level level, const char *text, void *data)
{
    (void)data;
    if (level >= GGML_LOG_LEVEL_WARN)
        fputs(text, stderr);
}

static int score(struct llama_context *ctx, const llama_token *ids, int n, int n_vocab,
                 FILE *out)
{
    llama_memory_clear(llama_get_memory(ctx), 1);
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = ids[i];
        b.pos[i] = i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = 1;
    }
    b.n_tokens = n;
    int rc = llama_decode(ctx, b);
    if (rc == 0)
        for (int i = 0; i < n && rc == 0; i++) {
            const float *l = llama_get_logits_ith(ctx, i);
            if (!l || fwrite(l, sizeof(float), (size_t)n_vocab, out) != (size_t)n_vocab)
                rc = -1;
        }
    llama_batch_free(b);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL TOKENS OUT [THREADS] [f16|f32]\n", argv[0]);
        return 2;
    }
    int threads = argc > 4 ? atoi(argv[4]) : 2;
    int f32kv = argc > 5 && strcmp(argv[5], "f32") == 0;
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "peer_logits: cannot load %s\n", argv[1]);
        return 1;
    }
    FILE *tf = fopen(argv[2], "r");
    FILE *out = fopen(argv[3], "wb");
    llama_token *ids = malloc(sizeof *ids * MAX_SEQ);
    if (!tf || !out || !ids) {
        fprintf(stderr, "peer_logits: cannot open files\n");
        return 1;
    }
    int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    int rc = 0, n, n_seq = 0;
    while (rc == 0 && (n = read_line_ids(tf, ids, MAX_SEQ)) >= 0) {
        if (n == 0)
            continue;
        struct llama_context_params cp = llama_context_default_params();
        cp.n_ctx = (uint32_t)((n + 255) / 256 * 256);
        cp.n_batch = cp.n_ubatch = (uint32_t)n;
        cp.n_threads = cp.n_threads_batch = threads;
        cp.n_seq_max = 1;
        if (f32kv)
            cp.type_k = cp.type_v = GGML_TYPE_F32;
        struct llama_context *ctx = llama_init_from_model(model, cp);
        if (!ctx) {
            fprintf(stderr, "peer_logits: no context for %d tokens\n", n);
            return 1;
        }
        rc = score(ctx, ids, n, n_vocab, out);
        llama_free(ctx);
        n_seq++;
    }
    fclose(tf);
    if (fclose(out) != 0)
        rc = -1;
    free(ids);
    llama_model_free(model);
    if (rc)
        fprintf(stderr, "peer_logits: decode failed (%d)\n", rc);
    else
        fprintf(stderr, "peer_logits: %d sequences, vocab %d\n", n_seq, n_vocab);
    return rc ? 1 : 0;
}
