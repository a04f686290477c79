/* cmd_plan.c - `kvant plan`: what fits on a device, from the GGUF header
 * alone (tensor data is never read).  One row per weight type: the model as
 * stored, then each --weights-dtype candidate (matrices re-encoded in that
 * type, 1-D tensors unchanged — what load-time quantization does). */
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cli_offload.h"
#include "cli/cli_xplan.h"
#include "engine/engine.h"
#include "engine/engine_draft.h"
#include "engine/engine_state.h"
#include "kernels/dtype.h"
#include "kv/kvtier.h"
#include "mem/plan.h"
#include "quant/quant.h"

#define PLAN_MAX_CANDIDATES 8

/* Weight bytes if every weight matrix were stored as `type` (falling back
 * like load-time quantization where rows do not fit its blocks; type < 0:
 * as stored). */
static uint64_t weights_as(const gguf_ctx *g, int type)
{
    uint64_t total = 0;
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor_info *ti = gguf_tensor(g, i);
        size_t row = 0;
        char name[GGUF_MAX_NAME + 1];
        snprintf(name, sizeof name, "%.*s", (int)ti->name.len, ti->name.ptr);
        if (type >= 0 && quant_is_matrix(name, ti->n_dims)) {
            int fell;
            uint32_t t = quant_fit_type((uint32_t)type, (int64_t)ti->ne[0], &fell);
            row = dtype_row_size(t, (int64_t)ti->ne[0]);
        }
        total += row ? (uint64_t)row * ti->ne[1] : ti->nbytes;
    }
    return total;
}

typedef struct plan_row {
    const char *label;
    plan_result r;
    int rc;
    char err[KV_ERR_MSG_MAX];
} plan_row;

static void print_row_text(const plan_row *pr, int first)
{
    char a[32], b[32], c[32], d[32];
    const plan_result *r = &pr->r;
    if (first) {
        printf("budget %s (%.0f%% of %s), context %lld, KV %s at %s/token, block %d\n",
               mem_format_size(r->budget, a, 32), r->utilization * 100,
               mem_format_size(r->device_memory, b, 32), (long long)r->ctx,
               dtype_get(r->kv_dtype)->name, mem_format_size(r->kv_bytes_per_token, c, 32),
               r->block_size);
        printf("%-8s %12s %12s %12s %12s  %s\n", "weights", "weight bytes", "activations",
               "KV pool", "KV tokens", "max concurrency by context");
    }
    if (pr->rc && r->weights_bytes == 0) {
        printf("%-8s does not fit: %s\n", pr->label, pr->err);
        return;
    }
    printf("%-8s %12s %12s %12s %12" PRIu64 "  ", pr->label, mem_format_size(r->weights_bytes, a, 32),
           mem_format_size(r->activation_bytes, b, 32), mem_format_size(r->kv_pool_bytes, d, 32),
           r->kv_pool_tokens);
    for (int i = 0; i < r->n_conc; i++)
        printf("%s%lld: %.1fx", i ? ", " : "", (long long)r->conc_ctx[i], r->conc[i]);
    if (pr->rc)
        printf("\n         does not fit: %s", pr->err);
    else if (!r->fits_one_max_ctx)
        printf("\n         one request of %lld tokens does not fit (%" PRIu64
               " bytes missing); largest context that fits: %lld",
               (long long)r->ctx, r->missing_bytes, (long long)r->max_ctx_that_fits);
    printf("\n");
}

static void plan_help(void)
{
    plan_config d = plan_config_default();
    char blk[32], seqs[32], toks[32], cands[80];
    snprintf(blk, sizeof blk, "%d", d.block_size);
    snprintf(seqs, sizeof seqs, "%d", d.max_num_seqs);
    snprintf(toks, sizeof toks, "%d", d.max_num_batched_tokens);
    snprintf(cands, sizeof cands, "add a row for weight matrices stored as T (repeatable, at "
                                  "most %d)", PLAN_MAX_CANDIDATES);
    const cli_opt t[] = {
        {"-c, --ctx-size", "N", "context per request to plan for", "the model's"},
        {"--block-size", "N", "KV block size in tokens, 1..1024", blk},
        {"--max-num-seqs", "N", "sequences decoded together (activation workspace)", seqs},
        {"--max-num-batched-tokens", "N", "tokens per engine step (activation workspace)", toks},
        {"--weights-dtype", "T", cands, "the stored row only"},
        {"--kv-host-memory", "SIZE|auto", "host-memory KV tier: print the blocks it holds", "0"},
        {"--kv-disk-dir", "DIR", "disk KV tier (with --kv-disk-size): print its blocks", "none"},
        {"--kv-disk-size", "SIZE", "disk KV tier budget", "4G with --kv-disk-dir"},
        {"--kv-disk-write", "through|evict", "as serve takes it (the plan is the same)", "through"},
        {"--state-snapshot-every", "N", "hybrid models: as serve takes it", "8"},
        {"--state-snapshot-memory", "SIZE", "hybrid models: as serve takes it",
         "2 per --max-num-seqs, at most a tenth of the budget"},
        {"--pin", "NAME", "several models (-m [NAME=]PATH repeated): loaded at start, never "
                          "evicted, as serve (repeatable)", "none"},
        {"--load", "NAME", "several models: loaded at start after the pins (repeatable)", "none"},
        {"--kv-per-model", "SIZE", "several models: the KV share each always gets",
         "2 requests of the context"},
        {"--no-kv-grow", NULL, "several models: no KV beyond the shares", "pools grow (CPU)"},
        {"--remeasure", NULL, "with --weights-memory: measure the read and matmul rates again "
                              "instead of using the cached ones", "off"},
        {"--predict", NULL, "predicted tokens/s per tokens-per-pass bucket also for a model that "
                            "fits (measures the rates once, as --weights-memory does)", "off"},
        {"--calibration", "FILE", "a mixture of experts under --weights-memory: the text whose "
                                  "routing predicts the expert cache's hit rate (at most 4096 "
                                  "tokens)", "256 random tokens"},
        {"--draft-model", "PATH", "a draft model for speculative decoding: its weights, KV and "
                                  "workspace come out of the budget first, as serve plans them "
                                  "(--spec-max-batch: the sequences its KV holds)", "none"},
    };
    cli_help("kvant plan [options]",
             "What fits in the memory budget: weights, activations, KV pool, tokens and\n"
             "concurrency, from the GGUF header alone (exit 1 when nothing fits).\n"
             "With --weights-memory: each layer's placement (resident or streamed) and the\n"
             "predicted tokens/s per tokens-per-pass bucket, from measured rates; for a\n"
             "mixture of experts the expert cache's slots, its decode hit rate and resident\n"
             "experts predicted from the routing of a calibration run within the budget,\n"
             "and the decode tokens/s.\n"
             "With -m given more than once (or --pin/--load): the plan of `kvant serve` with\n"
             "those models in one budget: each model's footprint by category, and the KV pool\n"
             "each model loaded at start holds once all are loaded (exit 1 when serve's start\n"
             "would fail); serve's --keep-alive and --queue-timeout do not change it.",
             t, CLI_N_OPTS(t));
}

/* 0: plan; 1: help printed; CLI_EXIT_USAGE: a mistake (one line printed). */
static int parse_plan(int argc, char **argv, cli_common *c, plan_config *pc, engine_config *ec,
                      serve_models_opts *mo, int *cands, int *n_cands, int *remeasure,
                      int *predict, const char **calib)
{
    for (int i = 1; i < argc; i++) {
        const char *v;
        long n;
        if (cli_is_help(argv[i])) {
            plan_help();
            return 1;
        }
        if (!strcmp(argv[i], "--remeasure")) {
            *remeasure = 1;
            continue;
        }
        if (!strcmp(argv[i], "--predict")) {
            *predict = 1;
            continue;
        }
        if (!strcmp(argv[i], "--calibration")) {
            if (!(*calib = cli_value(argc, argv, &i)))
                return CLI_EXIT_USAGE;
            continue;
        }
        /* each --weights-dtype adds a candidate row (the common parser
         * keeps only the last one) */
        if (!strcmp(argv[i], "--weights-dtype") && i + 1 < argc) {
            int t = dtype_from_name(argv[i + 1]);
            if (t < 0 || !dtype_get((uint32_t)t)) {
                fprintf(stderr, "kvant plan: --weights-dtype: unknown type '%s'\n", argv[i + 1]);
                return CLI_EXIT_USAGE;
            }
            if (*n_cands == PLAN_MAX_CANDIDATES)
                return cli_err_usage("plan", "at most %d --weights-dtype rows",
                                     PLAN_MAX_CANDIDATES);
            cands[(*n_cands)++] = t;
            i++;
            continue;
        }
        int r = serve_models_parse(mo, argc, argv, &i); /* -m, --pin, --load, ... */
        if (r == 0)
            r = cli_common_parse(c, argc, argv, &i);
        if (r == 0)
            r = cli_kvtier_parse(ec, argc, argv, &i);
        if (r == 0)
            r = cli_spec_parse(ec, argc, argv, &i);
        if (r < 0)
            return CLI_EXIT_USAGE;
        if (r)
            continue;
        if (!strcmp(argv[i], "-c") || !strcmp(argv[i], "--ctx-size")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int("-c", v, 1, 1 << 24, &n))
                return CLI_EXIT_USAGE;
            pc->ctx = n;
        } else if (!strcmp(argv[i], "--block-size")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(argv[i - 1], v, 1, 1024, &n))
                return CLI_EXIT_USAGE;
            pc->block_size = (int)n;
        } else if (!strcmp(argv[i], "--max-num-seqs")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(argv[i - 1], v, 1, 65536, &n))
                return CLI_EXIT_USAGE;
            pc->max_num_seqs = (int)n;
        } else if (!strcmp(argv[i], "--max-num-batched-tokens")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(argv[i - 1], v, 1, 1 << 20, &n))
                return CLI_EXIT_USAGE;
            pc->max_num_batched_tokens = (int)n;
        } else {
            return cli_err_unknown("plan", argv[i]);
        }
    }
    mo->multi = mo->n_models > 1 || mo->models_dir || mo->n_pins || mo->n_loads ||
                mo->n_sleeps || mo->keep_alive_s > 0;
    if (!mo->multi && (mo->kv_per_model || mo->no_kv_grow))
        return cli_err_usage("plan", "--kv-per-model and --no-kv-grow need several models");
    if (!mo->multi && mo->n_models == 1)
        c->model_path = mo->model_args[0];
    if (mo->multi && !mo->n_models)
        mo->model_args[mo->n_models++] = c->model_path;
    return cli_kvtier_check(ec, "plan");
}

/* The offload tiers under the device pool of plan r: blocks and tokens
 * each budget holds (one record per block: header, token ids, payload). */
typedef struct plan_tiers {
    uint64_t record_bytes;
    uint64_t host_bytes, host_blocks, disk_bytes, disk_blocks;
} plan_tiers;

static plan_tiers tiers_of(const plan_result *r, const engine_config *ec)
{
    plan_tiers t = {0};
    t.record_bytes = KVTIER_RECORD_BYTES(r->block_size, r->kv_bytes_per_token * r->block_size);
    t.host_bytes = ec->kv_host_memory;
    if (t.host_bytes == KVCOST_HOST_AUTO && /* as serve sizes it (engine_tier.c) */
        kvcost_host_fit(t.host_bytes, mem_host_available(), r->weights_bytes, &t.host_bytes, NULL))
        t.host_bytes = 0;
    t.disk_bytes = ec->kv_disk_dir ? (ec->kv_disk_size ? ec->kv_disk_size
                                                       : ENGINE_DEFAULT_DISK_SIZE) : 0;
    t.host_blocks = t.host_bytes / t.record_bytes;
    t.disk_blocks = t.disk_bytes / t.record_bytes;
    return t;
}

static void print_tiers_text(const plan_result *r, const plan_tiers *t)
{
    char a[32], b[32];
    if (!t->host_bytes && !t->disk_bytes)
        return;
    printf("KV tiers (record %s per block of %d tokens):\n", mem_format_size(t->record_bytes, a, 32),
           r->block_size);
    printf("  device %12s %10" PRIu64 " blocks %12" PRIu64 " tokens\n",
           mem_format_size(r->kv_pool_bytes, a, 32), (uint64_t)r->kv_pool_blocks,
           r->kv_pool_tokens);
    if (t->host_bytes)
        printf("  host   %12s %10" PRIu64 " blocks %12" PRIu64 " tokens\n",
               mem_format_size(t->host_bytes, b, 32), t->host_blocks,
               t->host_blocks * (uint64_t)r->block_size);
    if (t->disk_bytes)
        printf("  disk   %12s %10" PRIu64 " blocks %12" PRIu64 " tokens\n",
               mem_format_size(t->disk_bytes, b, 32), t->disk_blocks,
               t->disk_blocks * (uint64_t)r->block_size);
}

/* --kv-budget: what a request holds at most, and the concurrency of
 * requests of the context that the pool then holds (against without). */
static void print_kv_budget(const cli_common *c, const plan_result *r, int json)
{
    const int64_t b = engine_kv_budget_tokens(c->kv_budget, r->ctx);
    if (b <= 0 || b >= r->ctx)
        return;
    const double conc = (double)r->kv_pool_tokens / (double)b;
    const double full = (double)r->kv_pool_tokens / (double)r->ctx;
    const int snap = c->kv_policy == ENGINE_KV_SNAPKV || c->kv_policy == ENGINE_KV_H2O;
    const char *pol = engine_kv_policy_name(c->kv_policy);
    if (json)
        printf(", \"kv_budget\": {\"tokens\": %lld, \"ctx\": %lld, \"policy\": \"%s\", "
               "\"concurrency\": %.4f, \"concurrency_full\": %.4f, \"max_num_seqs\": %d}",
               (long long)b, (long long)r->ctx, pol, conc, full,
               r->max_num_seqs);
    else
        printf("KV budget %lld tokens per request (--kv-budget, %s): %.1fx requests of context "
               "%lld fit the KV pool while decoding, against %.1fx with the full cache "
               "(--max-num-seqs %d)%s\n", (long long)b,
               c->kv_policy == ENGINE_KV_SNAPKV ? "snapkv: chosen prompt positions + recent window"
               : snap ? "h2o: heavy hitters + recent window" : "sinks + recent window",
               conc, (long long)r->ctx, full, r->max_num_seqs,
               snap ? "; a prompt is held whole until its compaction" : "");
}

/* The plan rows, the tiers and the offload placement as one JSON object. */
static void print_json(const cli_common *c, plan_model *pm, const plan_row *rows, int n_rows,
                       const engine_config *ec, const cli_offload *off, const cli_offload *pred,
                       const cli_xplan *xp, int auto_off, const engine_draft_plan *dp)
{
    printf("{\"model\": ");
    cli_json_string(stdout, c->model_path, strlen(c->model_path));
    printf(", \"plans\": [");
    for (int i = 0; i < n_rows; i++) {
        pm->weights_bytes = rows[i].r.weights_bytes;
        char *js = plan_result_json(&rows[i].r, pm);
        printf("%s{\"weights_dtype\": \"%s\", \"ok\": %s, \"error\": ", i ? ", " : "",
               rows[i].label, rows[i].rc ? "false" : "true");
        cli_json_string(stdout, rows[i].err, strlen(rows[i].err));
        printf(", \"plan\": %s}", js ? js : "null");
        free(js);
    }
    plan_tiers t = tiers_of(&rows[0].r, ec);
    printf("], \"kv_tiers\": {\"record_bytes\": %" PRIu64 ", \"host_bytes\": %" PRIu64
           ", \"host_blocks\": %" PRIu64 ", \"disk_bytes\": %" PRIu64
           ", \"disk_blocks\": %" PRIu64 "}", t.record_bytes, t.host_bytes,
           t.host_blocks, t.disk_bytes, t.disk_blocks);
    if (off) {
        printf(", \"weights_offload\": ");
        cli_offload_print(off, 1);
    }
    if (xp) { /* --predict on a model that fits: under "predicted", as for a dense one */
        printf(", \"%s\": ", xp->cap == UINT64_MAX ? "predicted" : "weights_offload");
        cli_xplan_print(xp, 1);
    }
    if (pred) {
        printf(", \"predicted\": ");
        cli_offload_print_predicted(pred, 1);
    }
    if (dp)
        cli_plan_draft_print(ec, dp, 1);
    print_kv_budget(c, &rows[0].r, 1);
    printf(", \"weights_auto\": %s}\n", auto_off ? "true" : "false");
}

/* The same as text: the model line, one row per weight type, the tiers. */
static void print_text(const cli_common *c, const model_hparams *hp, const plan_row *rows,
                       int n_rows, const engine_config *ec, const cli_offload *off,
                       const cli_offload *pred, const cli_xplan *xp, int auto_off,
                       const engine_draft_plan *dp)
{
    if (hp->n_kv_total == (int64_t)hp->n_layers * hp->n_head_kv)
        printf("%s: %s, %d layers, %d KV heads x %d, context %lld\n", c->model_path,
               model_arch_name(hp->arch), hp->n_layers, hp->n_head_kv, hp->head_dim,
               (long long)hp->n_ctx_train);
    else /* a model pruned per layer */
        printf("%s: %s, %d layers, %lld KV heads over them (at most %d per layer) x %d, "
               "context %lld\n", c->model_path, model_arch_name(hp->arch), hp->n_layers,
               (long long)hp->n_kv_total, hp->n_head_kv, hp->head_dim,
               (long long)hp->n_ctx_train);
    if (dp)
        cli_plan_draft_print(ec, dp, 0);
    for (int i = 0; i < n_rows; i++)
        print_row_text(&rows[i], i == 0);
    plan_tiers t = tiers_of(&rows[0].r, ec);
    print_tiers_text(&rows[0].r, &t);
    print_kv_budget(c, &rows[0].r, 0);
    const plan_result *r = &rows[0].r;
    char a[32], b[32], sl[160];
    int32_t n_live, n_snap;
    engine_config sc = *ec;
    sc.max_num_seqs = r->max_num_seqs;
    engine_state_plan(&sc, r->state_slot_bytes, r->budget, &n_live, &n_snap);
    if (plan_state_line(r, n_live, sl, sizeof sl))
        printf("%s\n", sl);
    if (r->kv_fit)
        printf("KV pool sized from demand (host memory): at most %d x %d requests of %lld tokens "
               "or the budget; %s (%lld blocks) reserved at start%s (--kv-pool budget: all)\n",
               PLAN_KV_FIT_SHARE, r->max_num_seqs, (long long)r->ctx,
               mem_format_size(r->kv_start_bytes, a, 32), (long long)r->kv_start_blocks,
               r->kv_start_blocks < r->kv_pool_blocks ? ", grows on demand" : "");
    if (r->ctx_auto)
        printf("context %lld tokens: the model's %lld does not fit one request; the largest "
               "that does (-c sets it)\n", (long long)r->ctx, (long long)hp->n_ctx_train);
    if (auto_off)
        printf("weights do not fit the budget %s: placed automatically within %s "
               "(--weights-memory SIZE sets it, --no-offload refuses)\n",
               mem_format_size(r->budget, a, 32), mem_format_size(off ? off->cap : xp->cap, b, 32));
    if (xp)
        cli_xplan_print(xp, 0);
    if (off)
        cli_offload_print(off, 0);
    else if (pred)
        cli_offload_print_predicted(pred, 0);
}

/* The sliding-window layer group as the engine sets it up
 * (engine_kvwin_use): both kinds of layer, the CPU backend, one process,
 * no KV tiers, a fixed pool. */
static void plan_window(const model_hparams *hp, const cli_common *c, const engine_config *ec,
                        plan_config *pc)
{
    int32_t n_win = 0;
    for (int32_t il = 0; hp->fam.n_swa > 0 && il < hp->n_layers && il < MODEL_MAX_LAYERS; il++)
        n_win += hp->fam.is_swa[il] != 0;
    if (n_win == 0 || n_win == hp->n_layers || (c->backend && strcmp(c->backend, "cpu") != 0) ||
        c->tp * c->pp > 1 || ec->kv_host_memory || ec->kv_disk_dir || ec->kv_max_blocks > 0 ||
        ec->kv_window_keep)
        return;
    pc->kv_window = hp->fam.n_swa;
    pc->kv_window_heads = (int64_t)n_win * hp->n_head_kv;
}

/* As the engine plans (engine.c plan_engine): the window group, on the
 * host's memory the pool from demand, the context that fits (the weights
 * are placed when they do not fit, by the caller). */
static void plan_as_engine(const model_hparams *hp, const cli_common *c, const engine_config *ec,
                           plan_config *pc)
{
    plan_window(hp, c, ec, pc);
    pc->kv_fit = (!c->backend || strcmp(c->backend, "cpu") == 0) && !c->kv_pool_budget;
    pc->kv_grow = pc->kv_fit && !pc->kv_window;
    pc->kv_start_bytes = c->kv_start;
    pc->fit_ctx = 1;
    engine_config sc = *ec; /* a hybrid's recurrent-state slots, as the engine takes them */
    sc.max_num_seqs = pc->max_num_seqs;
    int32_t n_live, n_snap;
    pc->state_slots = engine_state_plan(&sc, model_recr_state_bytes(&hp->fam, hp->n_embd),
                                        plan_budget(pc->device_memory, pc->utilization), &n_live,
                                        &n_snap);
}

/* --predict for a model that fits: every layer resident, the rates measured
 * (or cached) as for offload.  NULL with the error printed. */
static cli_offload *predict_resident(const cli_common *c, int remeasure)
{
    cli_common rc = *c;
    rc.weights_memory = UINT64_MAX;
    kvant_err err = {0};
    cli_offload *res = calloc(1, sizeof *res);
    if (!res || cli_offload_plan(&rc, UINT64_MAX, remeasure, res, &err)) {
        fprintf(stderr, "kvant plan: --predict: %s\n", res ? err.msg : "out of memory");
        free(res);
        return NULL;
    }
    return res;
}

/* The weights' placement and prediction: dense offload (off), --predict of a
 * dense model that fits (res), or a mixture of experts under a budget or
 * --predict (xp); auto_off when the budget is chosen because the weights do
 * not fit. */
typedef struct plan_weights {
    cli_offload *off, *res;
    cli_xplan *xp;
    int auto_off;
} plan_weights;

static void plan_weights_free(plan_weights *w)
{
    free(w->off);
    free(w->res);
    if (w->xp)
        cli_xplan_free(w->xp);
    free(w->xp);
}

/* 0, or the exit code with the message printed (w freed). */
static int plan_weights_make(const cli_common *c, const gguf_ctx *g, const model_hparams *hp,
                             plan_model *pm, const plan_config *pc, const engine_config *ec,
                             int remeasure, int predict, const char *calib, plan_weights *w)
{
    const int host = !c->backend || strcmp(c->backend, "cpu") == 0;
    kvant_err err = {0};
    cli_common oc = *c;
    if (host && !c->weights_memory && !(c->weights_memory_frac > 0) && !c->no_offload &&
        c->weights_dtype < 0 && !ec->spec_draft_model) {
        uint64_t cap = 0;
        pm->weights_bytes = weights_as(g, -1);
        if (plan_fit_weights(pm, pc, &cap) && cap) {
            oc.weights_memory = cap;
            w->auto_off = 1;
        }
    }
    const int experts = hp->fam.n_expert > 0;
    const int offload = oc.weights_memory || oc.weights_memory_frac > 0;
    const uint64_t budget = plan_budget(pc->device_memory, pc->utilization);
    if (calib && !(experts && offload))
        return cli_err_usage("plan", "--calibration: the routing of a mixture of experts under "
                             "--weights-memory (%s)", experts ? "no --weights-memory"
                                                              : "the model has no experts");
    if (experts && remeasure && (offload || predict))
        return cli_err_usage("plan", "--remeasure: a mixture of experts is timed by its "
                             "calibration decode each time, not from cached rates");
    int rc = 0;
    if (experts && (offload || (predict && host))) {
        const uint64_t cap = !offload ? UINT64_MAX : oc.weights_memory ? oc.weights_memory
            : (uint64_t)((double)budget * oc.weights_memory_frac);
        rc = !(w->xp = calloc(1, sizeof *w->xp)) || cli_xplan_make(&oc, cap, calib, w->xp, &err);
    } else if (offload) {
        rc = !(w->off = calloc(1, sizeof *w->off)) ||
             cli_offload_plan(&oc, budget, remeasure, w->off, &err);
    } else if (predict && host && !(w->res = predict_resident(c, remeasure))) {
        plan_weights_free(w);
        return 1;
    }
    if (rc) {
        fprintf(stderr, "kvant plan: %s\n", err.msg[0] ? err.msg : "out of memory");
        plan_weights_free(w);
        return 1;
    }
    return 0;
}

int cmd_plan(int argc, char **argv)
{
    cli_common c;
    plan_config pc = plan_config_default();
    engine_config ec = engine_config_default();
    int cands[PLAN_MAX_CANDIDATES], n_cands = 0, remeasure = 0, predict = 0;
    const char *calib = NULL;
    cli_common_init(&c);
    serve_models_opts mo;
    serve_models_opts_init(&mo);
    int prc = parse_plan(argc, argv, &c, &pc, &ec, &mo, cands, &n_cands, &remeasure, &predict,
                         &calib);
    if (prc)
        return prc == 1 ? 0 : prc;
    pc.kv_dtype = c.kv_dtype;
    if (mo.multi) /* several models in one budget, as serve's registry loads them */
        return n_cands ? cli_err_usage("plan", "--weights-dtype plans one model: not with several")
                       : cmd_plan_models(&mo, &c, &pc, &ec);
    kvant_err err = {0};
    gguf_ctx *g = gguf_open(c.model_path, &err);
    model_hparams hp;
    if (!g || model_hparams_from_gguf(g, &hp, &err)) {
        fprintf(stderr, "kvant plan: %s\n", err.msg);
        gguf_close(g);
        return 1;
    }
    pc.device_memory = c.device_memory ? c.device_memory : mem_host_available();
    pc.utilization = c.utilization;
    pc.act_q8 = (!c.backend || strcmp(c.backend, "cpu") == 0) && !c.exact;
    if (c.tp * c.pp > 1) { /* per rank, cut as the ranks would cut the model */
        gguf_close(g);
        return cli_plan_tp(&c, &pc);
    }
    plan_model pm;
    model_plan_shape(&hp, 0, &pm);
    plan_as_engine(&hp, &c, &ec, &pc);
    engine_draft_plan dp = {0};
    if (ec.spec_draft_model && cli_plan_draft(&c, &pc, &ec, &dp)) { /* its share comes first */
        gguf_close(g);
        return 1;
    }
    plan_weights w = {0};
    int wrc = plan_weights_make(&c, g, &hp, &pm, &pc, &ec, remeasure, predict, calib, &w);
    if (wrc) {
        gguf_close(g);
        return wrc;
    }
    const cli_offload *off = w.off, *pred = w.off ? w.off : w.res;
    const cli_xplan *xp = w.xp;
    plan_row rows[PLAN_MAX_CANDIDATES + 1];
    int n_rows = 0, any_ok = 0;
    for (int k = -1; k < n_cands; k++) {
        plan_row *pr = &rows[n_rows++];
        kvant_err e2 = {0};
        pr->label = k < 0 ? "stored" : dtype_get((uint32_t)cands[k])->name;
        pm.weights_bytes = weights_as(g, k < 0 ? -1 : cands[k]);
        if (k < 0 && off && off->plan.n_streamed)
            pm.weights_bytes = wstream_plan_device_bytes(&off->plan);
        if (k < 0 && xp && xp->n_slots)
            pm.weights_bytes = xp->at.weights_bytes;
        pr->rc = plan_compute(&pm, &pc, &pr->r, &e2);
        snprintf(pr->err, sizeof pr->err, "%s", e2.msg);
        any_ok |= pr->rc == KV_OK;
        if (pr->rc && pr->r.weights_bytes == 0 && pr->rc != KV_ENOMEM && k < 0) {
            fprintf(stderr, "kvant plan: %s\n", e2.msg);
            gguf_close(g);
            plan_weights_free(&w);
            return 2;
        }
    }
    if (c.json)
        print_json(&c, &pm, rows, n_rows, &ec, off, pred, xp, w.auto_off,
                   ec.spec_draft_model ? &dp : NULL);
    else
        print_text(&c, &hp, rows, n_rows, &ec, off, pred, xp, w.auto_off,
                   ec.spec_draft_model ? &dp : NULL);
    plan_weights_free(&w);
    gguf_close(g);
    return any_ok ? 0 : 1;
}
