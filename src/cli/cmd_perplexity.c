/* cmd_perplexity.c - `kvant perplexity`, by llama-perplexity's convention:
 * tokenize the whole file (BOS when the model adds one), split into
 * floor(n / CTX) chunks of CTX tokens, set each chunk's first token to BOS
 * when the model adds one, evaluate each chunk from an empty cache, and
 * score the predictions made at positions CTX/2 .. CTX-2 (CTX-1-CTX/2
 * tokens per chunk). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "text/tokenizer.h"

/* -log softmax(logits)[target], in double. */
static double nll_of(const float *logits, int32_t n_vocab, int32_t target)
{
    float mx = logits[0];
    for (int32_t i = 1; i < n_vocab; i++)
        mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0.0;
    for (int32_t i = 0; i < n_vocab; i++)
        sum += exp((double)logits[i] - mx);
    return -((double)logits[target] - mx - log(sum));
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int run_chunks(cli_session *s, int32_t *toks, int64_t n_tok, int32_t ctx, const cli_common *c,
                      kvant_err *err)
{
    int64_t n_chunk = n_tok / ctx;
    int32_t first = ctx / 2, n_vocab = s->m->hp.n_vocab;
    int add_bos = tok_add_bos(s->m->tok);
    double nll = 0.0;
    int64_t scored = 0;
    double t0 = now_s();
    for (int64_t ch = 0; ch < n_chunk; ch++) {
        int32_t *ct = toks + ch * ctx;
        int32_t saved = ct[0];
        if (add_bos)
            ct[0] = tok_bos(s->m->tok);
        int rc = cli_session_eval(s, ct, first, 0, 0, s->logits, err);
        if (!rc)
            rc = cli_session_eval(s, ct + first, ctx - first, first, 1, s->logits, err);
        ct[0] = saved;
        if (rc)
            return rc;
        for (int32_t j = 0; j < ctx - 1 - first; j++) {
            nll += nll_of(s->logits + (int64_t)j * n_vocab, n_vocab, ct[first + j + 1]);
            scored++;
        }
        if (!c->json)
            fprintf(stderr, "[%lld/%lld] ppl %.4f (%.1f s)\n", (long long)ch + 1,
                    (long long)n_chunk, exp(nll / scored), now_s() - t0);
    }
    double mean = nll / (double)scored;
    if (c->json)
        printf("{\"ppl\": %.6f, \"nll\": %.8f, \"tokens_scored\": %lld, \"chunks\": %lld, "
               "\"ctx\": %d, \"seconds\": %.3f}\n",
               exp(mean), mean, (long long)scored, (long long)n_chunk, ctx, now_s() - t0);
    else
        printf("perplexity: %.4f over %lld chunks of %d tokens (%lld scored)\n", exp(mean),
               (long long)n_chunk, ctx, (long long)scored);
    return KV_OK;
}

static void perplexity_help(void)
{
    static const cli_opt t[] = {
        {"-f, --file", "PATH", "text file to score (required; at least 2 x CTX tokens)", NULL},
        {"-c, --ctx-size", "CTX", "chunk length in tokens, 8..", "512"},
        {"--kl-base", "BASE", "also compare with BASE.gguf: runs 'kvant kl' (see its --help)",
         "none"},
        {"--chunks", "N", "with --kl-base: score the first N chunks only", "all"},
    };
    cli_help("kvant perplexity -f FILE [options]",
             "Perplexity of a text by llama-perplexity's convention: chunks of CTX tokens,\n"
             "each from an empty cache, scoring positions CTX/2 .. CTX-2.",
             t, CLI_N_OPTS(t));
}

int cmd_perplexity(int argc, char **argv)
{
    cli_common c;
    cli_common_init(&c);
    const char *file = NULL;
    long ctx = 512;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            perplexity_help();
            return 0;
        }
        if (!strcmp(argv[i], "--kl-base"))
            return cmd_kl(argc, argv); /* perplexity plus KL against a base model */
    }
    for (int i = 1; i < argc; i++) {
        int r = cli_common_parse(&c, argc, argv, &i);
        const char *v;
        if (r < 0)
            return CLI_EXIT_USAGE;
        if (r)
            continue;
        if (!strcmp(argv[i], "-f") || !strcmp(argv[i], "--file")) {
            if (!(file = cli_value(argc, argv, &i)))
                return CLI_EXIT_USAGE;
        } else if (!strcmp(argv[i], "-c") || !strcmp(argv[i], "--ctx-size")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int("-c", v, 8, 1 << 20, &ctx))
                return CLI_EXIT_USAGE;
        } else {
            return cli_err_unknown("perplexity", argv[i]);
        }
    }
    if (!file)
        return cli_err_usage("perplexity", "missing -f FILE");
    kvant_err err = {0};
    size_t len;
    char *text = cli_read_file(file, &len, &err);
    if (!text) {
        fprintf(stderr, "kvant perplexity: %s\n", err.msg);
        return 1;
    }
    cli_session s;
    int32_t first = (int32_t)ctx / 2;
    if (cli_session_open(&s, &c, (int32_t)ctx, (int32_t)ctx, (int32_t)ctx - first, &err)) {
        fprintf(stderr, "kvant perplexity: %s\n", err.msg);
        free(text);
        return 1;
    }
    int rc = 1;
    int add_bos = tok_add_bos(s.m->tok);
    int64_t n = tok_encode(s.m->tok, text, len, add_bos, 0, NULL, 0, &err);
    int32_t *toks = n > 0 ? malloc((size_t)n * sizeof *toks) : NULL;
    if (toks)
        n = tok_encode(s.m->tok, text, len, add_bos, 0, toks, n, &err);
    if (!toks || n < 0) {
        fprintf(stderr, "kvant perplexity: %s\n", err.msg[0] ? err.msg : "tokenization failed");
    } else if (n < 2 * ctx) {
        fprintf(stderr, "kvant perplexity: %lld tokens; need at least 2*ctx = %ld\n",
                (long long)n, 2 * ctx);
    } else if (s.n_ctx != ctx) {
        fprintf(stderr, "kvant perplexity: ctx %ld exceeds the model's %lld\n", ctx,
                (long long)s.m->hp.n_ctx_train);
    } else if (run_chunks(&s, toks, n, (int32_t)ctx, &c, &err)) {
        fprintf(stderr, "kvant perplexity: %s\n", err.msg);
    } else {
        rc = 0;
    }
    free(toks);
    free(text);
    cli_session_close(&s);
    return rc;
}
