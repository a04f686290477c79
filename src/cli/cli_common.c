/* cli_common.c - argument helpers, --help tables, one-line usage errors
 * and the single-sequence session. */
#include "cli/cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_select.h"
#include "quant/quant.h"
#include "model/wstream.h"
#include "model/xcache.h"
#include "engine/offload_cost.h"
#include "quant/quant_load.h"
#include "kernels/dtype.h"
#include "kernels/kvdtype.h"
#include "mem/plan.h"
#include "model/shard.h"
#include "par/par.h"
#include "par/tp.h"
#include "forward/fwd_worker.h"

void cli_common_init(cli_common *c)
{
    memset(c, 0, sizeof *c);
    c->model_path = CLI_DEFAULT_MODEL;
    c->utilization = 0.90;
    c->weights_dtype = -1;
    c->kv_dtype = DT_F16;
    c->backend = "cpu";
    c->tp = 1;
    c->pp = 1;
    c->tp_timeout = 30.0;
}

int cli_is_help(const char *arg)
{
    return !strcmp(arg, "-h") || !strcmp(arg, "--help");
}

#define CLI_HELP_COL 30   /* column where the help text starts */
#define CLI_HELP_WIDTH 80 /* help lines wrap before this column */

/* Writes text from column col, wrapping at spaces before CLI_HELP_WIDTH
 * (a word longer than a line stays whole); returns the length of the last
 * line written, which is left open. */
static size_t help_wrap(FILE *f, const char *text, int col)
{
    size_t width = CLI_HELP_WIDTH - col;
    const char *p = text;
    while (strlen(p) > width) {
        size_t cut = width;
        while (cut > 0 && p[cut] != ' ')
            cut--;
        if (cut == 0)
            cut = strcspn(p, " ");
        if (!p[cut])
            break;
        fprintf(f, "%.*s\n%*s", (int)cut, p, col, "");
        p += cut;
        while (*p == ' ')
            p++;
    }
    fputs(p, f);
    return strlen(p);
}

void cli_help_table(FILE *f, const char *title, const cli_opt *t, size_t n)
{
    if (title)
        fprintf(f, "\n%s:\n", title);
    for (size_t k = 0; k < n; k++) {
        char left[96], def[160];
        snprintf(left, sizeof left, "%s%s%s", t[k].names, t[k].arg ? " " : "",
                 t[k].arg ? t[k].arg : "");
        if (strlen(left) + 4 > CLI_HELP_COL) /* keep two spaces before the text */
            fprintf(f, "  %s\n%*s", left, CLI_HELP_COL, "");
        else
            fprintf(f, "  %-*s", CLI_HELP_COL - 2, left);
        size_t last = help_wrap(f, t[k].help, CLI_HELP_COL);
        if (t[k].def) { /* "(default: X)" stays on one line */
            snprintf(def, sizeof def, "(default: %s)", t[k].def);
            if (last + 1 + strlen(def) <= (size_t)(CLI_HELP_WIDTH - CLI_HELP_COL))
                fprintf(f, " %s", def);
            else
                fprintf(f, "\n%*s%s", CLI_HELP_COL, "", def);
        }
        fputc('\n', f);
    }
}

/* The options of cli_common_parse: add a row here with every new one.  The
 * defaults shown come from cli_common_init. */
void cli_common_help(FILE *f)
{
    cli_common c;
    cli_common_init(&c);
    const dtype_traits *kv = dtype_get(c.kv_dtype);
    char util[32], dev[32], kvs[64], kvhelp[96];
    snprintf(util, sizeof util, "%.2f", c.utilization);
    snprintf(kvhelp, sizeof kvhelp, "KV cache type (%s)", kvdtype_list(kvs, sizeof kvs));
    snprintf(dev, sizeof dev, "%d", c.device);
    const cli_opt t[] = {
        {"-m, --model", "PATH", "GGUF model file", c.model_path},
        {"-t, --threads", "N", "worker threads, 1..1024", "all cores"},
        {"--weights-dtype", "T", "quantize the weight matrices to T while loading (f32 f16 bf16 "
                                 "q8_0 q5_0 q5_1 q4_0 q4_1 q4_K q5_K q6_K mxfp4)", "as stored"},
        {"--kv-dtype", "T", kvhelp, kv ? kv->name : "?"},
        {"--kv-rotate", NULL, "store K and V rotated by a Walsh-Hadamard transform per head "
                              "(spreads outliers before 4-bit KV quantization; same "
                              "attention in exact arithmetic)", "off"},
        {"--kv-budget", "N|F", "KV budget of each request that names none: N tokens, or a "
                               "fraction F in (0, 1) of the context; sink tokens and a recent "
                               "window are kept, older blocks given back", "none"},
        {"--kv-sinks", "N", "sink tokens a KV budget keeps (whole blocks)", "4"},
        {"--kv-policy", "P", "what a KV budget keeps for requests that name none: sinks (sink "
                             "tokens + recent window), snapkv (the prompt's most attended "
                             "positions per KV head + recent window) or h2o (the most attended "
                             "so far, updated while decoding + recent window)", "sinks"},
        {"--backend", "NAME", "cpu or cuda", c.backend},
        {"--device", "N", "device index for the backend (--tp/--pp: the i-th rank on a host "
                          "takes device N + i, modulo the devices present)", dev},
        {"--exact", NULL, "f32 activations in every matmul: the reference path, slower",
         c.exact ? "on" : "off"},
        {"--act-q8", NULL, "int8 activations in quantized matmuls (undoes --exact)",
         c.exact ? "off" : "on"},
        {"--no-pack", NULL, "keep weights in the file's layout instead of repacking "
                            "quantized weights at load for the int8 kernels (slower)",
         c.no_pack ? "on" : "off"},
        {"--json", NULL, "print the results as JSON", c.json ? "on" : "off"},
        {"--device-memory", "SIZE", "memory budget base, bytes or with K/M/G/T, Ki/Mi/Gi/Ti",
         "device total; CPU: available RAM"},
        {"--memory-utilization", "F", "fraction of --device-memory to use, (0, 1]", util},
        {"--weights-memory", "SIZE|F|auto", "cap on weights in device memory (resident layers + "
                                       "staging ring; F in (0, 1): a fraction of the budget); "
                                       "layers that do not fit are streamed from the file (CPU); "
                                       "auto: only when the weights do not fit the budget, the "
                                       "planner chooses the cap",
         "auto"},
        {"--no-offload", NULL, "refuse a model whose weights do not fit the budget instead of "
                               "streaming layers", "off"},
        {"--kv-pool", "fit|budget", "fit: on the CPU the KV pool is sized from --max-num-seqs "
                                    "requests of the context (twice, for the prefix cache), "
                                    "starts at 256 MiB and grows on demand; budget: the pool "
                                    "takes all the budget leaves at start", "fit"},
        {"--kv-start", "SIZE", "with --kv-pool fit: the pool's size at start (at least one "
                               "request of the context)", "256MiB"},
        {"--stream-buffers", "N", "staging buffers for streamed layers, 2..8", "2"},
        {"--weights-place", "auto|tail|spread", "which layers stream: the last ones (tail), "
                                                "spread over the depth, or auto: the one "
                                                "predicted faster from measured rates", "auto"},
        {"--stream-io", "MODE", "how streamed layers (or cached experts) are read: buffered "
                                "(page cache), direct (O_DIRECT; page cache where refused) or "
                                "both side by side (layers only)", "buffered"},
        {"--tp", "N", "tensor parallelism over N MPI ranks, 1..64: launch as mpirun -np N "
                      "kvant CMD ... --tp N (docs/PARALLEL.md)", "1"},
        {"--pp", "N", "pipeline parallelism over N stages of --tp ranks each, 1..64: launch "
                      "as mpirun -np TPxPP", "1"},
        {"--tp-timeout", "S", "seconds a rank waits for another before failing (longer than "
                              "one step), 1..3600", "30"},
    };
    cli_help_table(f, "common options (every command)", t, CLI_N_OPTS(t));
}

void cli_help(const char *usage, const char *about, const cli_opt *t, size_t n)
{
    printf("usage: %s\n", usage);
    if (about)
        printf("\n%s\n", about);
    static const cli_opt help = {"-h, --help", NULL, "print this help and exit", NULL};
    cli_help_table(stdout, "options", t, n);
    cli_help_table(stdout, NULL, &help, 1);
    cli_common_help(stdout);
}

int cli_err_unknown(const char *cmd, const char *opt)
{
    fprintf(stderr, "kvant %s: unknown option '%s' (see 'kvant %s --help')\n", cmd, opt, cmd);
    return CLI_EXIT_USAGE;
}

int cli_err_usage(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kvant %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see 'kvant %s --help')\n", cmd);
    va_end(ap);
    return CLI_EXIT_USAGE;
}

const char *cli_value(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "kvant %s: option %s needs a value (see 'kvant %s --help')\n", argv[0],
                argv[*i], argv[0]);
        return NULL;
    }
    *i += 1;
    return argv[*i];
}

int cli_parse_int(const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "kvant: %s: '%s' is not an integer in [%ld, %ld]\n", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_float(const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "kvant: %s: '%s' is not a number in [%g, %g]\n", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* --kv-budget, --kv-sinks, --kv-policy. */
static int parse_kv_budget_opt(cli_common *c, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v;
    long n = 0;
    if (!strcmp(a, "--kv-budget")) {
        char *end = NULL;
        if (!(v = cli_value(argc, argv, i)))
            return -1;
        double d = strtod(v, &end);
        if (end == v || *end || !(d > 0.0) || !isfinite(d) || (d >= 1.0 && d != floor(d))) {
            fprintf(stderr, "kvant: --kv-budget: '%s' is not a token count (>= 1) or a "
                            "fraction in (0, 1)\n", v);
            return -1;
        }
        c->kv_budget = d;
        return 1;
    }
    if (!strcmp(a, "--kv-sinks")) {
        if (!(v = cli_value(argc, argv, i)) || cli_parse_int(a, v, 1, 1 << 20, &n))
            return -1;
        c->kv_sinks = (int)n;
        return 1;
    }
    if (!strcmp(a, "--kv-policy")) {
        if (!(v = cli_value(argc, argv, i)))
            return -1;
        const int32_t pol = engine_kv_policy_parse(v);
        if (pol < 0 || pol == ENGINE_KV_FULL) {
            fprintf(stderr, "kvant: --kv-policy: '%s' is not sinks, snapkv or h2o\n", v);
            return -1;
        }
        c->kv_policy = pol;
        return 1;
    }
    return 0;
}

/* -m, -t, the dtypes, backend and device, and the on/off flags. */
static int parse_model_opt(cli_common *c, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v;
    long n = 0;
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
        if (!(v = cli_value(argc, argv, i)))
            return -1;
        c->model_path = v;
        return 1;
    }
    if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
        if (!(v = cli_value(argc, argv, i)) || cli_parse_int(a, v, 1, 1024, &n))
            return -1;
        c->n_threads = (int)n;
        return 1;
    }
    if (!strcmp(a, "--weights-dtype") || !strcmp(a, "--kv-dtype")) {
        kvant_err err = {0};
        if (!(v = cli_value(argc, argv, i)))
            return -1;
        int t = quant_parse_type(v, &err);
        if (t < 0) {
            fprintf(stderr, "kvant: %s: %s\n", a, err.msg);
            return -1;
        }
        if (!strcmp(a, "--kv-dtype") && !kvdtype_ok((uint32_t)t)) {
            char list[64];
            fprintf(stderr, "kvant: --kv-dtype: %s is not a KV type (%s)\n", v,
                    kvdtype_list(list, sizeof list));
            return -1;
        }
        if (!strcmp(a, "--kv-dtype"))
            c->kv_dtype = (uint32_t)t;
        else
            c->weights_dtype = t;
        return 1;
    }
    if (!strcmp(a, "--kv-rotate")) {
        c->kv_rotate = 1;
        return 1;
    }
    if (!strcmp(a, "--backend")) {
        if (!(v = cli_value(argc, argv, i)))
            return -1;
        c->backend = v;
        return 1;
    }
    if (!strcmp(a, "--device")) {
        if (!(v = cli_value(argc, argv, i)) || cli_parse_int(a, v, 0, 1024, &n))
            return -1;
        c->device = (int)n;
        return 1;
    }
    if (!strcmp(a, "--exact")) {
        c->exact = 1;
        return 1;
    }
    if (!strcmp(a, "--no-pack")) {
        c->no_pack = 1;
        return 1;
    }
    if (!strcmp(a, "--act-q8")) { /* the default since int8 activations run on every ISA */
        c->exact = 0;
        return 1;
    }
    if (!strcmp(a, "--json")) {
        c->json = 1;
        return 1;
    }
    return 0;
}

/* The budget and weight offload: --device-memory, --memory-utilization,
 * --weights-memory, --stream-buffers, --stream-io. */
static int parse_memory_opt(cli_common *c, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v;
    if (!strcmp(a, "--device-memory")) {
        kvant_err err = {0};
        if (!(v = cli_value(argc, argv, i)))
            return -1;
        if (mem_parse_size(v, &c->device_memory, &err) || c->device_memory == 0) {
            fprintf(stderr, "kvant: --device-memory: %s\n", err.msg[0] ? err.msg : "must be > 0");
            return -1;
        }
        return 1;
    }
    if (!strcmp(a, "--no-offload")) {
        c->no_offload = 1;
        return 1;
    }
    if (!strcmp(a, "--kv-pool")) {
        if (!(v = cli_value(argc, argv, i)))
            return -1;
        if (strcmp(v, "fit") && strcmp(v, "budget")) {
            fprintf(stderr, "kvant: --kv-pool: '%s' is not fit or budget\n", v);
            return -1;
        }
        c->kv_pool_budget = !strcmp(v, "budget");
        return 1;
    }
    if (!strcmp(a, "--kv-start")) {
        kvant_err err = {0};
        if (!(v = cli_value(argc, argv, i)))
            return -1;
        if (mem_parse_size(v, &c->kv_start, &err) || c->kv_start == 0) {
            fprintf(stderr, "kvant: --kv-start: %s\n", err.msg[0] ? err.msg : "must be > 0");
            return -1;
        }
        return 1;
    }
    if (!strcmp(a, "--weights-memory")) {
        kvant_err err = {0};
        if (!(v = cli_value(argc, argv, i)))
            return -1;
        c->weights_memory = 0;
        c->weights_memory_frac = 0;
        if (!strcmp(v, "auto"))
            return 1;
        if (strchr(v, '.') && !strpbrk(v, "KMGTkmgtiB")) {
            if (cli_parse_float(a, v, 0.0, 1.0, &c->weights_memory_frac))
                return -1;
            if (c->weights_memory_frac <= 0.0 || c->weights_memory_frac >= 1.0) {
                fprintf(stderr, "kvant: --weights-memory: a fraction must be in (0, 1)\n");
                return -1;
            }
        } else if (mem_parse_size(v, &c->weights_memory, &err) || c->weights_memory == 0) {
            fprintf(stderr, "kvant: --weights-memory: %s\n", err.msg[0] ? err.msg : "must be > 0");
            return -1;
        }
        return 1;
    }
    if (!strcmp(a, "--stream-buffers")) {
        long nb;
        if (!(v = cli_value(argc, argv, i)) || cli_parse_int(a, v, 2, 8, &nb))
            return -1;
        c->weights_slots = (int)nb;
        return 1;
    }
    if (!strcmp(a, "--weights-place")) {
        if (!(v = cli_value(argc, argv, i)))
            return -1;
        if ((c->weights_place = ocost_place_parse(v)) < 0) {
            fprintf(stderr, "kvant: --weights-place: '%s' is not auto, tail or spread\n", v);
            return -1;
        }
        return 1;
    }
    if (!strcmp(a, "--stream-io")) {
        if (!(v = cli_value(argc, argv, i)))
            return -1;
        if ((c->weights_io = wstream_io_parse(v)) < 0) {
            fprintf(stderr, "kvant: --stream-io: '%s' is not buffered, direct or both\n", v);
            return -1;
        }
        return 1;
    }
    if (!strcmp(a, "--memory-utilization")) {
        double f;
        if (!(v = cli_value(argc, argv, i)) || cli_parse_float(a, v, 0.0, 1.0, &f))
            return -1;
        if (f <= 0.0) {
            fprintf(stderr, "kvant: --memory-utilization must be in (0, 1]\n");
            return -1;
        }
        c->utilization = f;
        return 1;
    }
    return 0;
}

/* --tp, --pp, --tp-timeout. */
static int parse_parallel_opt(cli_common *c, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v;
    long n = 0;
    if (!strcmp(a, "--tp") || !strcmp(a, "--pp")) {
        if (!(v = cli_value(argc, argv, i)) || cli_parse_int(a, v, 1, 64, &n))
            return -1;
        *(!strcmp(a, "--tp") ? &c->tp : &c->pp) = (int)n;
        return 1;
    }
    if (!strcmp(a, "--tp-timeout")) {
        if (!(v = cli_value(argc, argv, i)) || cli_parse_float(a, v, 1.0, 3600.0, &c->tp_timeout))
            return -1;
        return 1;
    }
    return 0;
}

int cli_common_parse(cli_common *c, int argc, char **argv, int *i)
{
    int rc = parse_model_opt(c, argc, argv, i);
    if (rc == 0)
        rc = parse_kv_budget_opt(c, argc, argv, i);
    if (rc == 0)
        rc = parse_memory_opt(c, argc, argv, i);
    if (rc == 0)
        rc = parse_parallel_opt(c, argc, argv, i);
    return rc;
}

int cli_common_step(cli_common *c, int argc, char **argv, int *i, void (*help)(void))
{
    if (cli_is_help(argv[*i])) {
        help();
        return CLI_STEP_HELP;
    }
    return cli_common_parse(c, argc, argv, i);
}

void cli_engine_config(const cli_common *c, engine_config *ec)
{
    ec->n_threads = c->n_threads;
    ec->device_memory = c->device_memory;
    ec->memory_utilization = c->utilization;
    ec->backend = c->backend;
    ec->device = c->device;
    ec->kv_dtype = c->kv_dtype;
    ec->kv_rotate = c->kv_rotate;
    ec->kv_budget = c->kv_budget;
    ec->kv_sinks = c->kv_sinks;
    ec->kv_policy = c->kv_policy;
    ec->weights_dtype = c->weights_dtype;
    ec->exact = c->exact;
    ec->no_pack = c->no_pack;
    ec->weights_memory = c->weights_memory;
    ec->weights_memory_frac = c->weights_memory_frac;
    ec->weights_slots = c->weights_slots;
    ec->weights_io = c->weights_io;
    ec->weights_place = c->weights_place;
    ec->no_offload = c->no_offload;
    ec->kv_fit = !c->kv_pool_budget;
    ec->kv_start_bytes = c->kv_start;
}

/* --weights-memory auto for a session: the cap the planner chooses when the
 * weights, the workspace and the KV of the session's context do not fit
 * the budget (mem/plan.h plan_fit_weights); 0 when they fit. */
static uint64_t session_auto_cap(const cli_session *s, const cli_common *c, int32_t max_out)
{
    const model_hparams *hp = &s->m->hp;
    if (c->no_offload || c->weights_dtype >= 0 || strcmp(c->backend, "cpu") != 0 || s->par)
        return 0;
    plan_model pm;
    model_plan_shape(hp, s->m->weights_bytes, &pm);
    plan_config pc = plan_config_default();
    pc.device_memory = mem_budget(s->mem);
    pc.utilization = 1.0;
    pc.ctx = s->n_ctx;
    pc.block_size = CLI_DEFAULT_BLOCK;
    pc.max_num_batched_tokens = s->max_batch;
    pc.max_num_seqs = max_out < s->max_batch ? max_out : s->max_batch;
    pc.kv_dtype = c->kv_dtype;
    pc.act_q8 = !c->exact;
    uint64_t cap = 0;
    if (!plan_fit_weights(&pm, &pc, &cap) || !cap)
        return 0; /* fits, or nothing is left for weights: the load refuses as before */
    char a[32], b[32], d[32];
    fprintf(stderr, "kvant: weights %s do not fit the budget %s: streaming layers within %s "
            "(--weights-memory SIZE sets it, --no-offload refuses)\n",
            mem_format_size(s->m->weights_bytes, a, 32), mem_format_size(mem_budget(s->mem), b, 32),
            mem_format_size(cap, d, 32));
    return cap;
}

/* A mixture of experts under --weights-memory: the dense weights resident,
 * the experts in a cache of the slots cap holds beside them. */
static int session_experts(cli_session *s, const cli_common *c, uint64_t cap, kvant_err *err)
{
    int32_t n_slots;
    uint64_t wb;
    int direct;
    int rc = xcache_options(c->weights_io, c->weights_place, c->weights_slots, &direct, err);
    if (!rc)
        rc = xcache_plan(s->m, cap, direct, &n_slots, &wb, err);
    if (rc)
        return rc;
    char line[256];
    xcache_plan_describe(s->m, cap, n_slots, wb, line, sizeof line);
    fprintf(stderr, "kvant: %s\n", line);
    if (n_slots == 0)
        return KV_OK;
    if (!(s->xc = xcache_create(s->m, s->mem, n_slots, direct, err)))
        return err->code ? err->code : KV_ENOMEM;
    s->m->xcache = s->xc;
    xcache_io_describe(s->xc, line, sizeof line);
    if (line[0])
        fprintf(stderr, "kvant: %s\n", line);
    return KV_OK;
}

/* --weights-memory for a session: the placement and the stream, before
 * the backend loads weights. */
static int session_offload(cli_session *s, const cli_common *c, int32_t max_out, kvant_err *err)
{
    const uint64_t auto_cap = c->weights_memory || c->weights_memory_frac > 0
                                  ? 0 : session_auto_cap(s, c, max_out);
    if (!c->weights_memory && !(c->weights_memory_frac > 0) && !auto_cap)
        return KV_OK;
    if (c->weights_dtype >= 0)
        return kvant_err_set(err, KV_EUNSUP, "--weights-memory with --weights-dtype: streamed "
                             "layers are read as stored");
    const uint64_t cap = auto_cap         ? auto_cap
                         : c->weights_memory ? c->weights_memory
                             : (uint64_t)((double)mem_budget(s->mem) * c->weights_memory_frac);
    if (model_has_experts(s->m))
        return session_experts(s, c, cap, err);
    wstream_plan p;
    kvant_err why = {0};
    ocost_choice ch;
    int rc = ocost_place_cached(s->m, c->n_threads, cap, c->weights_slots, c->weights_place,
                                c->weights_io, &p, &ch, &why);
    if (rc && auto_cap) {
        char a[32], b[32], d[32];
        return kvant_err_set(err, rc, "model does not fit: weights %s exceed the budget %s, and "
                             "the %s left for them beside the workspace and the context's KV "
                             "cannot stream them (%s)", mem_format_size(s->m->weights_bytes, a, 32),
                             mem_format_size(mem_budget(s->mem), b, 32),
                             mem_format_size(cap, d, 32), why.msg);
    }
    if (rc) {
        *err = why;
        return rc;
    }
    if (p.n_streamed == 0) {
        fprintf(stderr, "kvant: warning: --weights-memory holds every weight: the model fits, "
                "no layer is streamed\n");
        return KV_OK;
    }
    ocost_choice_print(&ch, c->weights_place, &p);
    const wstream_io io = {c->weights_io, NULL};
    wstream_dev dev; /* a device backend: pinned ring, layers uploaded as they stream */
    s->ws = wstream_create_dev(s->m, s->mem, &p, &io,
                               backend_wstream_dev(s->be, &dev) ? &dev : NULL, err);
    if (!s->ws)
        return err->code ? err->code : KV_ENOMEM;
    wstream_stats st;
    wstream_get_stats(s->ws, &st);
    if (st.io_note[0])
        fprintf(stderr, "kvant: weight offload: %s\n", st.io_note);
    s->m->wstream = s->ws;
    return KV_OK;
}

char *cli_read_file(const char *path, size_t *len, kvant_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        kvant_err_set(err, KV_EIO, "%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap)
            break;
        cap *= 2;
        char *nb = realloc(buf, cap + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
        }
        buf = nb;
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        free(buf);
        kvant_err_set(err, KV_EIO, "%s: read failed", path);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

void cli_json_string(FILE *f, const char *s, size_t len)
{
    fputc('"', f);
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch == '\n')
            fputs("\\n", f);
        else if (ch == '\t')
            fputs("\\t", f);
        else if (ch == '\r')
            fputs("\\r", f);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

/* --tp: what every rank must agree on besides the model */
static void session_fingerprint(cli_session *s, const cli_common *c, int32_t max_out,
                                uint8_t fp[TP_FP_BYTES])
{
    const int64_t opts[] = {s->n_ctx, s->max_batch, max_out, c->kv_dtype, c->exact, c->no_pack,
                            c->tp, c->pp, CLI_DEFAULT_BLOCK, strcmp(c->backend, "cpu") != 0};
    tp_fingerprint(s->m, opts, (int)(sizeof opts / sizeof opts[0]), fp);
}

/* --tp, after the model is loaded: this rank's share, before the backend
 * loads (and packs) weights. */
static int session_shard(cli_session *s, const cli_common *c, kvant_err *err)
{
    if (strcmp(c->backend, "cpu") != 0 && strcmp(c->backend, "cuda") != 0)
        return kvant_err_set(err, KV_EUNSUP, "--tp runs on the cpu and cuda backends only");
    if (c->weights_dtype >= 0 || c->weights_memory || c->weights_memory_frac > 0)
        return kvant_err_set(err, KV_EUNSUP, "--tp with --weights-dtype or --weights-memory is "
                             "not supported");
    shard_spec sp;
    tp_spec_of(par_rank(s->par), c->tp, par_size(s->par), &sp);
    sp.host_copies = strcmp(c->backend, "cpu") != 0; /* the backend uploads them */
    s->shard = model_shard_apply(s->m, &sp, s->mem, err);
    return s->shard ? KV_OK : (err->code ? err->code : KV_ENOMEM);
}

/* Everything up to the forward context; under --tp every rank then agrees
 * (cli_session_open). */
static int session_load(cli_session *s, const cli_common *c, int32_t n_ctx, int32_t max_batch,
                        int32_t max_out, uint8_t fp[TP_FP_BYTES], kvant_err *err)
{
    backend_device_info info;
    /* --tp/--pp: one device per rank on its host */
    const int device = s->par ? backend_rank_device(c->backend, c->device, par_local_rank(s->par))
                              : c->device;
    if (backend_query(c->backend, device, &info, err))
        return err->code;
    uint64_t dev = c->device_memory ? c->device_memory : info.total_memory;
    s->mem = mem_create((uint64_t)((double)dev * c->utilization), info.alloc, err);
    if (!s->mem)
        return KV_ENOMEM;
    s->be = backend_create(c->backend, device, s->mem, c->n_threads,
                           (c->exact ? BACKEND_EXACT : 0) | (c->no_pack ? BACKEND_NO_PACK : 0), err);
    if (!s->be)
        return err->code ? err->code : KV_ENOMEM;
    s->m = model_load(c->model_path, err);
    if (!s->m)
        return err->code ? err->code : KV_EIO;
    if (n_ctx <= 0 || n_ctx > s->m->hp.n_ctx_train)
        n_ctx = n_ctx <= 0 ? (int32_t)(s->m->hp.n_ctx_train < 4096 ? s->m->hp.n_ctx_train : 4096)
                           : n_ctx;
    s->n_ctx = n_ctx;
    s->max_batch = max_batch;
    if (s->par) {
        session_fingerprint(s, c, max_out, fp);
        if (session_shard(s, c, err))
            return err->code;
    }
    if (c->weights_dtype >= 0) {
        /* a device backend's memory is not the host's: convert on the host,
         * load_weights uploads the copies */
        s->qw = strcmp(c->backend, "cpu")
                    ? quant_weights_apply_host(s->m, (uint32_t)c->weights_dtype, err)
                    : quant_weights_apply(s->m, (uint32_t)c->weights_dtype, s->mem, err);
        if (!s->qw)
            return err->code ? err->code : KV_ENOMEM;
    }
    if (session_offload(s, c, max_out, err) || s->be->ops->load_weights(s->be, s->m, err))
        return err->code ? err->code : KV_ENOMEM;
    s->n_blocks = (n_ctx + CLI_DEFAULT_BLOCK - 1) / CLI_DEFAULT_BLOCK;
    s->table = malloc((size_t)s->n_blocks * sizeof *s->table);
    s->logits = malloc((size_t)max_out * s->m->hp.n_vocab * sizeof(float));
    if (!s->table || !s->logits)
        return kvant_err_set(err, KV_ENOMEM, "out of memory");
    for (int32_t i = 0; i < s->n_blocks; i++)
        s->table[i] = i;
    if (s->par) {
        s->tp = tp_create(s->par, c->tp, s->be, max_batch, max_out, s->m->hp.n_embd, s->m->hp.n_vocab,
                          err);
        if (!s->tp)
            return err->code ? err->code : KV_ENOMEM;
    }
    kv_layout kv = fwd_kv_layout(s->m, s->n_blocks, CLI_DEFAULT_BLOCK, c->kv_dtype);
    kv.rotate = c->kv_rotate;
    if (kv.rotate && s->par)
        return kvant_err_set(err, KV_EUNSUP, "--kv-rotate: not with --tp/--pp");
    return fwd_init(&s->fwd, s->m, s->be, max_batch, max_out, &kv, err);
}

int cli_session_open(cli_session *s, const cli_common *c, int32_t n_ctx, int32_t max_batch,
                     int32_t max_out, kvant_err *err)
{
    memset(s, 0, sizeof *s);
    dtype_init();
    if (c->kv_budget > 0.0 || c->kv_policy) /* a session has no engine to give blocks back */
        return kvant_err_set(err, KV_EINVAL, "%s: taken by serve, plan and bench --batch (the "
                             "engine), not by this command",
                             c->kv_budget > 0.0 ? "--kv-budget" : "--kv-policy");
    if (c->tp * c->pp > 1 && !(s->par = par_create(c->tp * c->pp, c->tp_timeout, err)))
        return err->code;
    uint8_t fp[TP_FP_BYTES] = {0};
    int rc = session_load(s, c, n_ctx, max_batch, max_out, fp, err);
    if (s->par) {
        /* every rank, failed or not: one agreement, so none waits alone */
        int32_t nb = s->n_blocks;
        kvant_err local = *err;
        rc = tp_agree(s->par, rc, &local, fp, &nb, err);
        if (!rc)
            rc = tp_attach(s->tp, s->fwd.max_tokens, s->fwd.max_out, err);
        if (!rc)
            fwd_set_tp(&s->fwd, s->tp);
        if (!rc && par_rank(s->par) != 0) {
            rc = fwd_worker_run(&s->fwd, s->tp, err);
            if (rc)
                fprintf(stderr, "kvant: %s\n", err->msg);
            cli_session_close(s);
            exit(rc ? 1 : 0);
        }
    }
    if (rc)
        cli_session_close(s);
    return rc;
}

void cli_session_close(cli_session *s)
{
    if (s->tp && s->par && par_rank(s->par) == 0 && s->fwd.tp) {
        kvant_err e = {0};
        (void)tp_send_quit(s->tp, &e);
    }
    if (s->fwd.be)
        fwd_free(&s->fwd);
    fwd_set_tp(&s->fwd, NULL);
    tp_destroy(s->tp);
    if (s->be && s->m)
        s->be->ops->unload_weights(s->be, s->m);
    quant_weights_free(s->qw);
    model_shard_free(s->shard);
    if (s->m)
        s->m->wstream = NULL, s->m->xcache = NULL;
    wstream_destroy(s->ws); /* before the backend: its ring may be the backend's pinned memory */
    xcache_destroy(s->xc);
    if (s->be)
        s->be->ops->destroy(s->be);
    model_free(s->m);
    free(s->table);
    free(s->logits);
    mem_destroy(s->mem);
    par_destroy(s->par);
    memset(s, 0, sizeof *s);
}

int cli_session_eval(cli_session *s, const int32_t *tokens, int32_t n, int32_t pos0,
                     int all_logits, float *out, kvant_err *err)
{
    int32_t pos[4096], seq[4096], outi[4096];
    fwd_seq fs = {.block_table = s->table, .n_blocks = s->n_blocks};
    int32_t step = s->max_batch < 4096 ? s->max_batch : 4096;
    if (all_logits && s->fwd.max_out < step)
        step = s->fwd.max_out;
    if (pos0 < 0 || pos0 + n > s->n_ctx)
        return kvant_err_set(err, KV_ERANGE, "%d tokens at position %d exceed the context of %d",
                             n, pos0, s->n_ctx);
    for (int32_t done = 0; done < n; done += step) {
        int32_t cnt = n - done < step ? n - done : step;
        int last = done + cnt == n;
        for (int32_t i = 0; i < cnt; i++) {
            pos[i] = pos0 + done + i;
            seq[i] = 0;
            outi[i] = i;
        }
        fwd_batch b = {.n_tokens = cnt, .tokens = tokens + done, .pos = pos, .seq = seq,
                       .n_seqs = 1, .seqs = &fs};
        if (all_logits) {
            b.n_out = cnt;
            b.out = outi;
        } else if (last) {
            outi[0] = cnt - 1;
            b.n_out = 1;
            b.out = outi;
        }
        float *dst = all_logits ? out + (int64_t)done * s->m->hp.n_vocab : out;
        int rc = fwd_run(&s->fwd, &b, dst, err);
        if (rc)
            return rc;
    }
    return KV_OK;
}

int cli_chat_template(model *m, const char *path, const char *cmd, kvant_err *err)
{
    if (!path)
        return KV_OK;
    size_t len = 0;
    char *src = cli_read_file(path, &len, err);
    if (!src)
        return err->code ? err->code : KV_EIO;
    if (model_set_chat_template(m, src, len))
        fprintf(stderr, "kvant %s: --chat-template %s refused: %s\n", cmd, path, m->chat_err);
    free(src);
    return KV_OK;
}
