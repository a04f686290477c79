/* cmd_kl.c - `kvant kl -m MODEL --base BASE.gguf -f FILE [-c CTX]
 * [--chunks N] [--weights-dtype T] [--kv-dtype T] [-t N] [--json]`:
 * quality of a model (optionally quantized at load time, optionally with
 * a quantized KV cache) against a base model on the same text, by the
 * perplexity protocol of cmd_perplexity.c (chunks of CTX tokens, BOS
 * first, score positions CTX/2 .. CTX-2).  Reports ppl of both, mean and
 * p99 KL(base || model) per scored token, and top-1 agreement.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "kernels/dtype.h"
#include "text/tokenizer.h"

int cmd_kl(int argc, char **argv); /* registered in main.c (cli.h) */

typedef struct kl_opts {
    cli_common c;
    const char *base, *file;
    long ctx, chunks;
} kl_opts;

/* log-softmax of logits into lp (double). */
static void log_softmax(const float *x, int32_t n, double *lp)
{
    float mx = x[0];
    for (int32_t i = 1; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    double s = 0;
    for (int32_t i = 0; i < n; i++)
        s += exp((double)x[i] - mx);
    double ls = log(s);
    for (int32_t i = 0; i < n; i++)
        lp[i] = (double)x[i] - mx - ls;
}

static int32_t argmax(const float *x, int32_t n)
{
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        b = x[i] > x[b] ? i : b;
    return b;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Opens a session: the base as stored (f32 KV), the model under test with
 * the common options' load-time weights dtype and KV dtype. */
static int open_side(cli_session *s, const cli_common *c, const kl_opts *o, int is_base,
                     kvant_err *err)
{
    int32_t first = (int32_t)o->ctx / 2;
    cli_common cc = *c;
    if (is_base) {
        cc.model_path = o->base;
        cc.weights_dtype = -1;
        cc.kv_dtype = DT_F32;
        cc.exact = 1;
    }
    return cli_session_open(s, &cc, (int32_t)o->ctx, (int32_t)o->ctx, (int32_t)o->ctx - first,
                            err);
}

static int kl_run(cli_session *sb, cli_session *sq, const kl_opts *o, int32_t *toks, int64_t n,
                  kvant_err *err)
{
    int32_t ctx = (int32_t)o->ctx, first = ctx / 2, nv = sq->m->hp.n_vocab, per = ctx - 1 - first;
    int64_t n_chunk = n / ctx;
    if (o->chunks > 0 && o->chunks < n_chunk)
        n_chunk = o->chunks;
    double *lpb = malloc((size_t)nv * sizeof *lpb), *lpq = malloc((size_t)nv * sizeof *lpq);
    double *kls = malloc((size_t)(n_chunk * per) * sizeof *kls);
    float *lb = malloc((size_t)per * nv * sizeof *lb);
    int rc = KV_OK;
    if (!lpb || !lpq || !kls || !lb) {
        rc = kvant_err_set(err, KV_ENOMEM, "out of memory");
        goto out;
    }
    double nllb = 0, nllq = 0, klsum = 0;
    int64_t cnt = 0, agree = 0;
    int add_bos = tok_add_bos(sq->m->tok);
    for (int64_t ch = 0; ch < n_chunk && !rc; ch++) {
        int32_t *ct = toks + ch * ctx, saved = ct[0];
        if (add_bos)
            ct[0] = tok_bos(sq->m->tok);
        cli_session *ss[2] = {sb, sq};
        for (int k = 0; k < 2 && !rc; k++) {
            rc = cli_session_eval(ss[k], ct, first, 0, 0, ss[k]->logits, err);
            if (!rc)
                rc = cli_session_eval(ss[k], ct + first, ctx - first, first, 1, ss[k]->logits, err);
            if (!rc && k == 0)
                memcpy(lb, sb->logits, (size_t)per * nv * sizeof *lb);
        }
        ct[0] = saved;
        for (int32_t j = 0; j < per && !rc; j++) {
            const float *xb = lb + (int64_t)j * nv, *xq = sq->logits + (int64_t)j * nv;
            int32_t tgt = ct[first + j + 1];
            log_softmax(xb, nv, lpb);
            log_softmax(xq, nv, lpq);
            double kl = 0;
            for (int32_t i = 0; i < nv; i++)
                kl += exp(lpb[i]) * (lpb[i] - lpq[i]);
            kls[cnt++] = kl;
            klsum += kl;
            nllb -= lpb[tgt];
            nllq -= lpq[tgt];
            agree += argmax(xb, nv) == argmax(xq, nv);
        }
        if (!o->c.json && !rc)
            fprintf(stderr, "[%lld/%lld] mean KL %.5f\n", (long long)ch + 1, (long long)n_chunk,
                    klsum / cnt);
    }
    if (!rc) {
        qsort(kls, (size_t)cnt, sizeof *kls, cmp_double);
        double p99 = kls[(int64_t)(0.99 * (double)(cnt - 1))];
        double pb = exp(nllb / cnt), pq = exp(nllq / cnt);
        printf(o->c.json ? "{\"ppl_base\": %.6f, \"ppl\": %.6f, \"dppl_pct\": %.4f, \"mean_kl\": %.6f, "
                           "\"p99_kl\": %.6f, \"top1\": %.6f, \"tokens\": %lld}\n"
                         : "ppl base %.4f  ppl %.4f  dppl %+.3f%%  mean KL %.6f  p99 KL %.6f  "
                           "top-1 %.4f  (%lld tokens)\n",
               pb, pq, 100.0 * (pq / pb - 1.0), klsum / cnt, p99, (double)agree / cnt,
               (long long)cnt);
    }
out:
    free(lpb), free(lpq), free(kls), free(lb);
    return rc;
}

static void kl_help(void)
{
    static const cli_opt t[] = {
        {"--base, --kl-base", "BASE", "the reference model's GGUF, run as stored with an f32 KV "
                                      "cache and --exact (required)", NULL},
        {"-f, --file", "PATH", "text file to score (required; at least 2 x CTX tokens)", NULL},
        {"-c, --ctx-size", "CTX", "chunk length in tokens, 8..", "512"},
        {"--chunks", "N", "score the first N chunks only", "all"},
    };
    cli_help("kvant kl --base BASE.gguf -f FILE [options]",
             "Perplexity of -m MODEL (with its --weights-dtype, --kv-dtype, --exact) and of\n"
             "BASE on the same text, mean and p99 KL(base || model) and top-1 agreement.",
             t, CLI_N_OPTS(t));
}

/* 0: run; 1: help printed; CLI_EXIT_USAGE: a mistake (one line printed). */
static int parse_kl(kl_opts *o, int argc, char **argv)
{
    memset(o, 0, sizeof *o);
    cli_common_init(&o->c);
    o->ctx = 512;
    for (int i = 1; i < argc; i++) {
        int r = cli_common_step(&o->c, argc, argv, &i, kl_help);
        const char *v;
        if (r != CLI_STEP_OWN) {
            if (r == CLI_STEP_TAKEN)
                continue;
            return r == CLI_STEP_HELP ? 1 : CLI_EXIT_USAGE;
        }
        if (!strcmp(argv[i], "--base") || !strcmp(argv[i], "--kl-base")) {
            if (!(o->base = cli_value(argc, argv, &i)))
                return CLI_EXIT_USAGE;
        } else if (!strcmp(argv[i], "-f") || !strcmp(argv[i], "--file")) {
            if (!(o->file = cli_value(argc, argv, &i)))
                return CLI_EXIT_USAGE;
        } else if (!strcmp(argv[i], "-c") || !strcmp(argv[i], "--ctx-size")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int("-c", v, 8, 1 << 20, &o->ctx))
                return CLI_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--chunks")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int("--chunks", v, 1, 1 << 20, &o->chunks))
                return CLI_EXIT_USAGE;
        } else {
            return cli_err_unknown("kl", argv[i]);
        }
    }
    if (!o->base || !o->file)
        return cli_err_usage("kl", "missing %s", o->base ? "-f FILE" : "--base BASE.gguf");
    return 0;
}

int cmd_kl(int argc, char **argv)
{
    kl_opts o;
    int rc = parse_kl(&o, argc, argv);
    if (rc)
        return rc == 1 ? 0 : rc;
    kvant_err err = {0};
    size_t len;
    char *text = cli_read_file(o.file, &len, &err);
    cli_session sb = {0}, sq = {0};
    int32_t *toks = NULL;
    rc = 1;
    if (!text)
        goto out;
    if (open_side(&sb, &o.c, &o, 1, &err) || open_side(&sq, &o.c, &o, 0, &err))
        goto out;
    if (sb.m->hp.n_vocab != sq.m->hp.n_vocab) {
        kvant_err_set(&err, KV_EINVAL, "vocabularies differ (%d vs %d)", sb.m->hp.n_vocab,
                      sq.m->hp.n_vocab);
        goto out;
    }
    int add_bos = tok_add_bos(sq.m->tok);
    int64_t n = tok_encode(sq.m->tok, text, len, add_bos, 0, NULL, 0, &err);
    toks = n > 0 ? malloc((size_t)n * sizeof *toks) : NULL;
    if (!toks || tok_encode(sq.m->tok, text, len, add_bos, 0, toks, n, &err) < 0 || n < 2 * o.ctx) {
        kvant_err_set(&err, KV_EINVAL, "%s: need at least 2*ctx tokens", o.file);
        goto out;
    }
    rc = kl_run(&sb, &sq, &o, toks, n, &err) ? 1 : 0;
out:
    if (rc)
        fprintf(stderr, "kvant kl: %s\n", err.msg);
    free(toks);
    free(text);
    if (sq.m)
        cli_session_close(&sq);
    if (sb.m)
        cli_session_close(&sb);
    return rc;
}
