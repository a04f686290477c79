/* cmd_quantize.c - `kvant quantize IN.gguf OUT.gguf --type T [--recipe
 * q4_k_m] [--calib FILE] [--keep PATTERN]... [-t N] [--json]`.
 *
 * Copies all metadata (general.file_type updated), converts every weight
 * matrix (quant_is_matrix, not matched by a --keep substring) to the
 * target type (or the recipe's pick), and passes other tensors through.
 * With --calib the text runs through IN's forward pass first (chunks of
 * 512 tokens) to collect per-column mean x^2 (quant_calib), which the
 * importance-weighted quantizer uses.  The output is written atomically
 * (gguf_writer): on any error nothing is left at OUT.
 */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "format/gguf_write.h"
#include "kernels/dtype.h"
#include "text/tokenizer.h"
#include "quant/quant.h"
#include "quant/quant_calib.h"

int cmd_quantize(int argc, char **argv); /* registered in main.c (cli.h) */

#define QZ_MAX_KEEP 16
#define QZ_CALIB_CTX 512

typedef struct qz_opts {
    const char *in, *out, *calib, *recipe;
    const char *keep[QZ_MAX_KEEP];
    int n_keep;
    int type;
    cli_common c;
} qz_opts;

enum { KIND_EMB, KIND_ATTN, KIND_FFN, KIND_OTHER, KIND_COUNT };
static const char *const kind_names[KIND_COUNT] = {"embd_output", "attn", "ffn", "other"};

static int kind_of(const char *name)
{
    if (strstr(name, "token_embd") || !strncmp(name, "output.", 7))
        return KIND_EMB;
    if (strstr(name, "norm"))
        return KIND_OTHER;
    if (strstr(name, ".attn_"))
        return KIND_ATTN;
    if (strstr(name, ".ffn_"))
        return KIND_FFN;
    return KIND_OTHER;
}

/* llama.cpp's LLAMA_FTYPE for a uniform type (or the recipe). */
static uint32_t ftype_of(int type, const char *recipe)
{
    if (recipe)
        return 15; /* MOSTLY_Q4_K_M */
    switch (type) {
    case DT_F32: return 0;
    case DT_F16: return 1;
    case DT_Q4_0: return 2;
    case DT_Q4_1: return 3;
    case DT_Q8_0: return 7;
    case DT_Q5_0: return 8;
    case DT_Q5_1: return 9;
    case DT_Q4_K: return 14;
    case DT_Q5_K: return 16;
    case DT_Q6_K: return 18;
    case DT_BF16: return 32;
    case DT_MXFP4: return 38; /* MOSTLY_MXFP4_MOE: llama.cpp's only mxfp4 ftype */
    default: return 0;
    }
}

/* Runs the calibration text through IN; returns stats or NULL (err set). */
static quant_calib *run_calib(qz_opts *o, cli_session *s, kvant_err *err)
{
    size_t len;
    char *text = cli_read_file(o->calib, &len, err);
    if (!text)
        return NULL;
    quant_calib *qc = NULL;
    int32_t *toks = NULL;
    cli_common c = o->c;
    c.model_path = o->in;
    if (cli_session_open(s, &c, QZ_CALIB_CTX, QZ_CALIB_CTX, 1, err))
        goto done;
    int add_bos = tok_add_bos(s->m->tok);
    int64_t n = len ? tok_encode(s->m->tok, text, len, add_bos, 0, NULL, 0, err) : 0;
    if (n < 2 + add_bos) {
        kvant_err_set(err, KV_EINVAL, "calibration file '%s' has no text to run", o->calib);
        goto done;
    }
    toks = malloc((size_t)n * sizeof *toks);
    if (!toks || tok_encode(s->m->tok, text, len, add_bos, 0, toks, n, err) < 0) {
        kvant_err_set(err, KV_ENOMEM, "calibration tokenization failed");
        goto done;
    }
    if (!(qc = quant_calib_create(s->m, err)))
        goto done;
    quant_calib_attach(qc, s->be);
    for (int64_t p = 0; p < n; p += QZ_CALIB_CTX) {
        int32_t cnt = (int32_t)(n - p < QZ_CALIB_CTX ? n - p : QZ_CALIB_CTX);
        if (cli_session_eval(s, toks + p, cnt, 0, 0, s->logits, err)) {
            quant_calib_detach(qc, s->be);
            quant_calib_destroy(qc);
            qc = NULL;
            goto done;
        }
    }
    quant_calib_detach(qc, s->be);
    if (!o->c.json)
        fprintf(stderr, "calibration: %lld tokens from %s\n", (long long)n, o->calib);
done:
    free(toks);
    free(text);
    return qc;
}

static void quantize_help(void)
{
    static const cli_opt t[] = {
        {"--type", "T", "target type of the weight matrices: f32 f16 bf16 q8_0 q5_0 q5_1 q4_0 "
                        "q4_1 q4_K q5_K q6_K mxfp4 (this or --recipe is required)", NULL},
        {"--recipe", "NAME", "per-tensor types by llama.cpp's mix: q4_k_m (this or --type is "
                                "required)", NULL},
        {"--calib", "FILE", "text run through IN first for importance-weighted rounding",
         "none: plain rounding"},
        {"--keep", "PATTERN", "leave tensors whose name contains PATTERN as stored (repeatable, "
                              "at most 16)", "none"},
    };
    cli_help("kvant quantize IN.gguf OUT.gguf (--type T | --recipe NAME) [options]",
             "Writes a quantized copy of IN.gguf (metadata kept; OUT is written atomically).", t,
             CLI_N_OPTS(t));
}

/* 0: run; 1: help printed; CLI_EXIT_USAGE: a mistake (one line printed). */
static int parse_args(qz_opts *o, int argc, char **argv)
{
    memset(o, 0, sizeof *o);
    cli_common_init(&o->c);
    o->type = -1;
    kvant_err err = {0};
    for (int i = 1; i < argc; i++) {
        int r = cli_common_step(&o->c, argc, argv, &i, quantize_help);
        const char *v;
        if (r != CLI_STEP_OWN) {
            if (r == CLI_STEP_TAKEN)
                continue;
            return r == CLI_STEP_HELP ? 1 : CLI_EXIT_USAGE;
        }
        if (!strcmp(argv[i], "--type")) {
            if (!(v = cli_value(argc, argv, &i)))
                return CLI_EXIT_USAGE;
            if ((o->type = quant_parse_type(v, &err)) < 0) {
                fprintf(stderr, "kvant quantize: %s\n", err.msg);
                return CLI_EXIT_USAGE;
            }
        } else if (!strcmp(argv[i], "--recipe")) {
            if (!(o->recipe = cli_value(argc, argv, &i)))
                return CLI_EXIT_USAGE;
            if (quant_recipe_type(o->recipe, "x", 256, 1) < 0) {
                fprintf(stderr, "kvant quantize: unknown recipe '%s' (known: q4_k_m)\n", o->recipe);
                return CLI_EXIT_USAGE;
            }
        } else if (!strcmp(argv[i], "--calib")) {
            if (!(o->calib = cli_value(argc, argv, &i)))
                return CLI_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--keep")) {
            if (!(v = cli_value(argc, argv, &i)))
                return CLI_EXIT_USAGE;
            if (o->n_keep == QZ_MAX_KEEP) {
                fprintf(stderr, "kvant quantize: at most %d --keep patterns\n", QZ_MAX_KEEP);
                return CLI_EXIT_USAGE;
            }
            o->keep[o->n_keep++] = v;
        } else if (argv[i][0] == '-') {
            return cli_err_unknown("quantize", argv[i]);
        } else if (!o->in) {
            o->in = argv[i];
        } else if (!o->out) {
            o->out = argv[i];
        } else {
            return cli_err_usage("quantize", "unexpected argument '%s'", argv[i]);
        }
    }
    if (!o->in || !o->out)
        return cli_err_usage("quantize", "missing %s", o->in ? "OUT.gguf" : "IN.gguf");
    if (o->type < 0 && !o->recipe)
        return cli_err_usage("quantize", "missing --type T or --recipe NAME");
    return 0;
}

typedef struct qz_sum {
    uint64_t before[KIND_COUNT], after[KIND_COUNT];
    uint64_t mat_elems, mat_bytes, elems, bytes_after;
} qz_sum;

static int pick_type(const qz_opts *o, const gguf_tensor_info *ti, const char *name, int n_layers)
{
    if (!quant_is_matrix(name, ti->n_dims))
        return (int)ti->type;
    for (int k = 0; k < o->n_keep; k++)
        if (strstr(name, o->keep[k]))
            return (int)ti->type;
    int fell = 0, t;
    if (o->recipe)
        t = quant_recipe_type(o->recipe, name, (int64_t)ti->ne[0], n_layers);
    else
        t = (int)quant_fit_type((uint32_t)o->type, (int64_t)ti->ne[0], &fell);
    if (fell)
        fprintf(stderr, "kvant quantize: %s: rows of %llu do not fit %s; using %s\n", name,
                (unsigned long long)ti->ne[0], dtype_get((uint32_t)o->type)->name,
                dtype_get((uint32_t)t)->name);
    return t;
}

/* Adds every tensor of g to w (converted or passed through); buffers of
 * converted tensors go into bufs[] (freed by the caller after writing). */
static int add_tensors(const qz_opts *o, gguf_ctx *g, gguf_writer *w, quant_calib *qc,
                       void **bufs, qz_sum *sm, kvant_err *err)
{
    uint32_t n_layers = 0;
    gguf_get_u32_or(g, "llama.block_count", 0, &n_layers, NULL);
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor_info *ti = gguf_tensor(g, i);
        char name[GGUF_MAX_NAME + 1];
        snprintf(name, sizeof name, "%.*s", (int)ti->name.len, ti->name.ptr);
        int t = pick_type(o, ti, name, (int)n_layers);
        uint64_t nrows = 1;
        for (uint32_t d = 1; d < ti->n_dims; d++)
            nrows *= ti->ne[d];
        const void *data = ti->data;
        uint64_t nbytes = ti->nbytes;
        if ((uint32_t)t != ti->type) {
            nbytes = dtype_row_size((uint32_t)t, (int64_t)ti->ne[0]) * nrows;
            float *tmp = malloc(ti->ne[0] * sizeof *tmp);
            bufs[i] = malloc(nbytes);
            if (!tmp || !bufs[i]) {
                free(tmp);
                return kvant_err_set(err, KV_ENOMEM, "out of memory converting %s", name);
            }
            const float *imp = qc ? quant_calib_imp(qc, name, (int64_t)ti->ne[0]) : NULL;
            quant_convert(ti->type, ti->data, (uint32_t)t, bufs[i], (int64_t)ti->ne[0],
                          (int64_t)nrows, imp, tmp);
            free(tmp);
            data = bufs[i];
        }
        int rc = gguf_writer_add_tensor(w, name, (uint32_t)t, ti->n_dims, ti->ne, data, err);
        if (rc)
            return rc;
        int k = kind_of(name);
        sm->before[k] += ti->nbytes;
        sm->after[k] += nbytes;
        sm->elems += ti->ne[0] * nrows;
        sm->bytes_after += nbytes;
        if (quant_is_matrix(name, ti->n_dims))
            sm->mat_elems += ti->ne[0] * nrows, sm->mat_bytes += nbytes;
    }
    return KV_OK;
}

static void print_summary(const qz_opts *o, const qz_sum *sm)
{
    double bpw = sm->elems ? 8.0 * (double)sm->bytes_after / (double)sm->elems : 0;
    double mbpw = sm->mat_elems ? 8.0 * (double)sm->mat_bytes / (double)sm->mat_elems : 0;
    if (o->c.json) {
        printf("{\"out\": \"%s\", \"kinds\": {", o->out);
        for (int k = 0; k < KIND_COUNT; k++)
            printf("%s\"%s\": {\"before\": %llu, \"after\": %llu}", k ? ", " : "", kind_names[k],
                   (unsigned long long)sm->before[k], (unsigned long long)sm->after[k]);
        printf("}, \"bytes\": %llu, \"bits_per_weight\": %.4f, \"matrix_bits_per_weight\": %.4f}\n",
               (unsigned long long)sm->bytes_after, bpw, mbpw);
        return;
    }
    printf("%-12s %14s %14s\n", "kind", "bytes before", "bytes after");
    for (int k = 0; k < KIND_COUNT; k++)
        printf("%-12s %14llu %14llu\n", kind_names[k], (unsigned long long)sm->before[k],
               (unsigned long long)sm->after[k]);
    printf("wrote %s: %llu bytes of tensors, %.3f bits/weight overall, %.3f in matrices\n", o->out,
           (unsigned long long)sm->bytes_after, bpw, mbpw);
}

/* Stacked (3-D) tensors, experts or latent attention's per-head attn_k_b /
 * attn_v_b, would pass through unquantized (the experts most of a mixture's
 * bytes): such files are refused rather than half done. */
static int refuse_experts(const gguf_ctx *g, kvant_err *err)
{
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor_info *ti = gguf_tensor(g, i);
        if (ti->n_dims > 2)
            return kvant_err_set(err, KV_EUNSUP, "tensor '%.*s': stacked 3-D tensors (mixture-"
                                 "of-experts experts, per-head attn_k_b / attn_v_b) are not "
                                 "quantized by kvant quantize",
                                 (int)ti->name.len, ti->name.ptr);
    }
    return KV_OK;
}

int cmd_quantize(int argc, char **argv)
{
    qz_opts o;
    int rc = parse_args(&o, argc, argv);
    if (rc)
        return rc == 1 ? 0 : rc;
    kvant_err err = {0};
    dtype_init();
    cli_session s = {0};
    quant_calib *qc = NULL;
    gguf_writer *w = NULL;
    void **bufs = NULL;
    gguf_ctx *g = gguf_open(o.in, &err);
    rc = 1;
    if (!g || refuse_experts(g, &err))
        goto out;
    if (o.calib && !(qc = run_calib(&o, &s, &err)))
        goto out;
    bufs = calloc((size_t)gguf_n_tensors(g) + 1, sizeof *bufs);
    w = gguf_writer_create();
    if (!bufs || !w) {
        kvant_err_set(&err, KV_ENOMEM, "out of memory");
        goto out;
    }
    qz_sum sm = {0};
    if (gguf_writer_copy_kv(w, g, &err) ||
        gguf_writer_add_u32(w, "general.file_type", ftype_of(o.type, o.recipe), &err) ||
        add_tensors(&o, g, w, qc, bufs, &sm, &err) || gguf_writer_write(w, o.out, &err))
        goto out;
    print_summary(&o, &sm);
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "kvant quantize: %s\n", err.msg);
    for (int64_t i = 0; bufs && g && i < gguf_n_tensors(g); i++)
        free(bufs[i]);
    free(bufs);
    gguf_writer_destroy(w);
    quant_calib_destroy(qc);
    if (s.m)
        cli_session_close(&s);
    gguf_close(g);
    return rc;
}
