/* cmd_prune.c - `kvant prune IN.gguf OUT.gguf --calib FILE
 * [--target-params F | --drop-layers N | --ffn-keep F] [--heads-keep F]
 * [--method depth|width|both] [--ffn-uniform] [--no-bias] [--refit] [--depth-bias]
 * [-t N] [--json]`.
 *
 * Runs the calibration text through IN (chunks of 512 tokens, logits for
 * every token so the last layer's output is seen), chooses what to remove
 * (prune/prune.h) and writes OUT atomically: on any error, including a
 * refused request, nothing is left at OUT.  Prints what was removed, the
 * parameters and weight bytes before/after, and the KV cache per token.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "kernels/dtype.h"
#include "mem/plan.h"
#include "text/tokenizer.h"
#include "prune/prune.h"

#define PR_CALIB_CTX 512

typedef struct pr_opts {
    const char *in, *out, *calib;
    prune_request rq;
    cli_common c;
} pr_opts;

static void prune_help(void)
{
    static const cli_opt t[] = {
        {"--calib", "FILE", "calibration text, at least 256 tokens (required)", NULL},
        {"--target-params", "F", "keep fraction F of all parameters, 0 < F < 1", "unset"},
        {"--method", "M", "what --target-params removes: depth, width or both", "depth"},
        {"--drop-layers", "N", "remove the N layers of lowest Block Influence", "0"},
        {"--ffn-keep", "F", "keep fraction F of the FFN channels", "unset"},
        {"--ffn-uniform", NULL, "the same FFN width in every layer", "off: global ranking"},
        {"--heads-keep", "F", "keep fraction F of the KV-head groups (at least one per layer)",
         "unset"},
        {"--heads-uniform", NULL, "remove the same number of KV-head groups from every layer",
         "off: global ranking"},
        {"--no-bias", NULL, "no bias compensation (removed channels and heads are otherwise "
                            "replaced by their calibration mean in a bias)", "off"},
        {"--refit", NULL, "refit the kept ffn_down / attn_output columns and the bias by least "
                          "squares on the calibration activations (memory: n_ff^2 doubles per "
                          "layer while calibrating)", "off"},
        {"--depth-bias", NULL, "a removed layer's mean change of the residual stream becomes "
                               "a bias of the kept layer before it", "off"},
        {"--refit-damp", "D", "ridge of the refit towards the original weights, relative to the "
                              "mean activation energy", "0.3"},
        {"--refit-shrink", "S", "shrink the measured channel correlations towards none, 0..1 "
                                "(1: the refit is the mean bias alone)", "0"},
    };
    cli_help("kvant prune IN.gguf OUT.gguf --calib FILE [options]",
             "Writes a structurally pruned copy of IN.gguf (OUT is written atomically).", t,
             CLI_N_OPTS(t));
}

static int parse_fraction(const char *opt, const char *v, double *out)
{
    double d;
    if (cli_parse_float(opt, v, -1e9, 1e9, &d))
        return 2;
    if (!(d > 0 && d < 1)) {
        return cli_err_usage("prune", "%s %s: must be in (0, 1) (1 or more keeps everything)",
                             opt, v);
    }
    *out = d;
    return 0;
}

static int parse_opt(pr_opts *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v;
    long n;
    if (!strcmp(a, "--refit") || !strcmp(a, "--depth-bias")) {
        *(a[2] == 'r' ? &o->rq.refit : &o->rq.depth_bias) = 1;
        return 0;
    }
    if (!strcmp(a, "--heads-uniform")) {
        o->rq.heads_uniform = 1;
        return 0;
    }
    if (!strcmp(a, "--ffn-uniform") || !strcmp(a, "--no-bias")) {
        *(a[2] == 'f' ? &o->rq.ffn_uniform : &o->rq.no_bias) = 1;
        return 0;
    }
    if (strcmp(a, "--calib") && strcmp(a, "--target-params") && strcmp(a, "--ffn-keep") &&
        strcmp(a, "--heads-keep") && strcmp(a, "--drop-layers") && strcmp(a, "--method") &&
        strcmp(a, "--refit-damp") && strcmp(a, "--refit-shrink"))
        return cli_err_unknown("prune", a);
    if (!(v = cli_value(argc, argv, i)))
        return CLI_EXIT_USAGE;
    if (!strcmp(a, "--calib")) {
        o->calib = v;
    } else if (!strcmp(a, "--target-params")) {
        return parse_fraction(a, v, &o->rq.target_params);
    } else if (!strcmp(a, "--ffn-keep")) {
        return parse_fraction(a, v, &o->rq.ffn_keep);
    } else if (!strcmp(a, "--heads-keep")) {
        return parse_fraction(a, v, &o->rq.heads_keep);
    } else if (!strcmp(a, "--refit-damp")) {
        return cli_parse_float(a, v, 0, 1e6, &o->rq.refit_damp) ? 2 : 0;
    } else if (!strcmp(a, "--refit-shrink")) {
        return cli_parse_float(a, v, 0, 1, &o->rq.refit_shrink) ? 2 : 0;
    } else if (!strcmp(a, "--drop-layers")) {
        if (cli_parse_int(a, v, 1, MODEL_MAX_LAYERS, &n))
            return 2;
        o->rq.drop_layers = (int)n;
    } else if (!strcmp(a, "--method")) {
        if (!strcmp(v, "depth"))
            o->rq.method = PRUNE_DEPTH;
        else if (!strcmp(v, "width"))
            o->rq.method = PRUNE_WIDTH;
        else if (!strcmp(v, "both"))
            o->rq.method = PRUNE_BOTH;
        else
            return cli_err_usage("prune", "--method %s: expected depth, width or both", v);
    }
    return 0;
}

static int parse_args(pr_opts *o, int argc, char **argv)
{
    memset(o, 0, sizeof *o);
    cli_common_init(&o->c);
    o->rq = prune_request_default();
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            prune_help();
            return 1;
        }
        int r = cli_common_parse(&o->c, argc, argv, &i), rc;
        if (r < 0)
            return 2;
        if (r)
            continue;
        if (argv[i][0] == '-') {
            if ((rc = parse_opt(o, argc, argv, &i)))
                return rc;
        } else if (!o->in) {
            o->in = argv[i];
        } else if (!o->out) {
            o->out = argv[i];
        } else {
            return cli_err_usage("prune", "unexpected argument '%s'", argv[i]);
        }
    }
    if (!o->in || !o->out)
        return cli_err_usage("prune", "IN.gguf and OUT.gguf are required");
    if (!o->calib)
        return cli_err_usage("prune", "--calib FILE is required");
    return 0;
}

/* Runs the calibration text through s with stats attached. */
static int run_calib(const pr_opts *o, cli_session *s, prune_stats *st, kvant_err *err)
{
    size_t len;
    char *text = cli_read_file(o->calib, &len, err);
    if (!text)
        return KV_EIO;
    int rc = KV_OK;
    int add_bos = tok_add_bos(s->m->tok);
    int64_t n = len ? tok_encode(s->m->tok, text, len, add_bos, 0, NULL, 0, err) : 0;
    int32_t *toks = n > 0 ? malloc((size_t)n * sizeof *toks) : NULL;
    if (n > 0 && (!toks || tok_encode(s->m->tok, text, len, add_bos, 0, toks, n, err) < 0))
        rc = kvant_err_set(err, KV_ENOMEM, "calibration tokenization failed");
    prune_stats_attach(st, s->be);
    int32_t ctx = s->n_ctx; /* PR_CALIB_CTX or the model's context when shorter */
    for (int64_t p = 0; !rc && p < n; p += ctx) {
        int32_t cnt = (int32_t)(n - p < ctx ? n - p : ctx);
        rc = cli_session_eval(s, toks + p, cnt, 0, 1, s->logits, err);
    }
    prune_stats_detach(st, s->be);
    if (!rc && !o->c.json)
        fprintf(stderr, "calibration: %lld tokens from %s\n", (long long)n, o->calib);
    free(toks);
    free(text);
    return rc;
}

/* KV cache bytes per token of the input (out = 0) or the output: every
 * layer's K and V rows, each of its KV heads. */
static uint64_t kv_per_token(const model *m, const prune_plan *p, int out, uint32_t kv_dtype)
{
    uint64_t heads = 0;
    for (int l = 0; l < p->n_layers; l++)
        heads += !out ? (uint64_t)m->layers[l].n_head_kv : p->keep[l] ? (uint64_t)p->kv_n[l] : 0;
    return 2u * heads * dtype_row_size(kv_dtype, m->hp.head_dim);
}

static int32_t kv_max_out(const prune_plan *p)
{
    int32_t mx = 0;
    for (int l = 0; l < p->n_layers; l++)
        mx = p->keep[l] && p->kv_n[l] > mx ? p->kv_n[l] : mx;
    return mx;
}

static void print_json(const pr_opts *o, const model *m, const prune_plan *p,
                       const prune_result *r)
{
    uint64_t kv0 = kv_per_token(m, p, 0, o->c.kv_dtype), kv1 = kv_per_token(m, p, 1, o->c.kv_dtype);
    printf("{\"out\": ");
    cli_json_string(stdout, o->out, strlen(o->out));
    printf(", \"layers_in\": %d, \"layers_out\": %d, \"removed_layers\": [", p->n_layers,
           p->n_kept);
    for (int l = 0, k = 0; l < p->n_layers; l++)
        if (!p->keep[l])
            printf("%s%d", k++ ? ", " : "", l);
    printf("], \"block_influence\": [");
    for (int l = 0; l < p->n_layers; l++)
        printf("%s%.6f", l ? ", " : "", p->bi[l]);
    printf("], \"ffn_widths\": [");
    for (int l = 0, k = 0; l < p->n_layers; l++)
        if (p->keep[l])
            printf("%s%d", k++ ? ", " : "", p->ffn_n[l]);
    printf("], \"kv_heads\": [");
    for (int l = 0, k = 0; l < p->n_layers; l++)
        if (p->keep[l])
            printf("%s%d", k++ ? ", " : "", p->kv_n[l]);
    printf("], \"n_head_kv_in\": %d, \"n_head_kv_out\": %d, \"params_in\": %llu, "
           "\"params_out\": %llu, \"params_kept\": %.4f, \"weight_bytes_in\": %llu, "
           "\"weight_bytes_out\": %llu, \"weight_bytes_kept\": %.4f, \"requantized_tensors\": %d, "
           "\"bias_compensation\": %s, \"refit\": %s, \"depth_bias\": %s, "
           "\"kv_dtype\": \"%s\", \"kv_bytes_per_token_in\": %llu, \"kv_bytes_per_token_out\": "
           "%llu, \"kv_tokens_per_gib_in\": %llu, \"kv_tokens_per_gib_out\": %llu}\n",
           p->n_head_kv, kv_max_out(p), (unsigned long long)p->params_in,
           (unsigned long long)r->params_out, (double)r->params_out / (double)p->params_in,
           (unsigned long long)r->bytes_in, (unsigned long long)r->bytes_out,
           (double)r->bytes_out / (double)r->bytes_in, r->requantized,
           p->bias_comp ? "true" : "false", p->refit ? "true" : "false",
           p->depth_bias ? "true" : "false", dtype_get(o->c.kv_dtype)->name, (unsigned long long)kv0, (unsigned long long)kv1,
           (unsigned long long)((1ull << 30) / kv0), (unsigned long long)((1ull << 30) / kv1));
}

static void print_text(const pr_opts *o, const model *m, const prune_plan *p,
                       const prune_result *r)
{
    uint64_t kv0 = kv_per_token(m, p, 0, o->c.kv_dtype), kv1 = kv_per_token(m, p, 1, o->c.kv_dtype);
    printf("%5s %10s %8s %8s %s\n", "layer", "influence", "ffn", "kv_heads", "");
    for (int l = 0; l < p->n_layers; l++)
        printf("%5d %10.5f %8d %8d %s\n", l, p->bi[l], p->keep[l] ? p->ffn_n[l] : 0,
               p->keep[l] ? p->kv_n[l] : 0, p->keep[l] ? "" : "removed");
    printf("layers %d -> %d, KV-head groups at most %d -> %d per layer\n", p->n_layers,
           p->n_kept, p->n_head_kv, kv_max_out(p));
    printf("parameters %llu -> %llu (%.1f%% kept)\n", (unsigned long long)p->params_in,
           (unsigned long long)r->params_out, 100.0 * (double)r->params_out / (double)p->params_in);
    printf("weight bytes %llu -> %llu (%.1f%% kept), %d tensors requantized\n",
           (unsigned long long)r->bytes_in, (unsigned long long)r->bytes_out,
           100.0 * (double)r->bytes_out / (double)r->bytes_in, r->requantized);
    printf("KV cache (%s) per token %llu -> %llu bytes; tokens per GiB %llu -> %llu\n",
           dtype_get(o->c.kv_dtype)->name, (unsigned long long)kv0, (unsigned long long)kv1,
           (unsigned long long)((1ull << 30) / kv0), (unsigned long long)((1ull << 30) / kv1));
    printf("wrote %s\n", o->out);
}

int cmd_prune(int argc, char **argv)
{
    pr_opts o;
    int rc = parse_args(&o, argc, argv);
    if (rc)
        return rc == 1 ? 0 : rc;
    kvant_err err = {0};
    cli_session s = {0};
    prune_stats *st = NULL;
    prune_plan plan = {0};
    prune_result res;
    o.c.model_path = o.in;
    rc = 1;
    if (cli_session_open(&s, &o.c, PR_CALIB_CTX, PR_CALIB_CTX, PR_CALIB_CTX, &err) ||
        !(st = prune_stats_create(s.m, &err)) ||
        (o.rq.refit && (prune_stats_track_refit(st), 0)) || run_calib(&o, &s, st, &err) ||
        prune_plan_make(s.m, st, &o.rq, &plan, &err) ||
        prune_write(s.m, &plan, st, o.out, &res, &err))
        goto out;
    if (o.c.json)
        print_json(&o, s.m, &plan, &res);
    else
        print_text(&o, s.m, &plan, &res);
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "kvant prune: %s\n", err.msg);
    prune_plan_free(&plan);
    prune_stats_destroy(st);
    if (s.m)
        cli_session_close(&s);
    return rc;
}
