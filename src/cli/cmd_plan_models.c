/* cmd_plan_models.c - `kvant plan -m a.gguf -m b.gguf [--pin a] [--load b]`:
 * the plan of serving several models in one budget, as `kvant serve` with
 * the same options allocates it (registry/registry_plan.h does the
 * arithmetic for both): the budget, each model's footprint by category and
 * context, whether it can ever fit, and the models loaded at start (pins,
 * then loads, in serve's order) with the KV pool each holds once they are
 * all loaded, and what is left free.  Exit 0, or 1 when serve's start
 * would fail (a model that does not fit, or a bad file). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_select.h"
#include "cli/cli.h"
#include "mem/plan.h"
#include "registry/registry.h"
#include "registry/registry_plan.h"

typedef struct mplan {
    char name[REG_MAX][REG_NAME_MAX];
    const char *path[REG_MAX];
    char error[REG_MAX][KV_ERR_MSG_MAX];
    reg_plan_model m[REG_MAX];
    reg_plan_state st[REG_MAX];
    int order[REG_MAX * 2], pin[REG_MAX * 2], n_order;
    reg_plan_start_in in;
    uint64_t used;
    int start_rc, failed;
    char start_error[REG_NAME_MAX + KV_ERR_MSG_MAX + 4];
} mplan;

static int find_name(const mplan *p, const char *name)
{
    for (int i = 0; i < p->in.n; i++)
        if (!strcmp(p->name[i], name))
            return i;
    return -1;
}

/* Names, footprints and the start order; CLI_EXIT_USAGE on a bad name. */
static int mplan_models(mplan *p, const serve_models_opts *o, const engine_config *ec)
{
    p->in.n = o->n_models;
    for (int i = 0; i < o->n_models; i++) {
        serve_models_split(o->model_args[i], p->name[i], sizeof p->name[i], &p->path[i]);
        if (find_name(p, p->name[i]) != i)
            return cli_err_usage("plan", "two models are named '%s' (use -m NAME=PATH)",
                                 p->name[i]);
        kvant_err e = {0};
        reg_plan_model *m = &p->m[i];
        m->ok = reg_plan_footprint(p->path[i], ec, o->kv_per_model, &m->f, &e) == KV_OK;
        if (m->ok && reg_plan_scratch(ec, m->f.head_dim, &m->scratch, &m->scratch_alloc, &e))
            m->ok = 0;
        snprintf(p->error[i], sizeof p->error[i], "%s", m->ok ? "" : e.msg);
    }
    for (int k = 0; k < o->n_pins + o->n_loads; k++) {
        const int is_pin = k < o->n_pins;
        const char *nm = is_pin ? o->pins[k] : o->loads[k - o->n_pins];
        const int i = find_name(p, nm);
        if (i < 0)
            return cli_err_usage("plan", "%s %s: no such model", is_pin ? "--pin" : "--load", nm);
        p->order[p->n_order] = i;
        p->pin[p->n_order++] = is_pin;
    }
    return 0;
}

static const char *yes(int v)
{
    return v ? "true" : "false";
}

static void print_cats(const uint64_t *cat)
{
    printf("{");
    for (int c = 0; c < MEM_CAT_COUNT; c++)
        printf("%s\"%s\": %" PRIu64, c ? ", " : "", mem_cat_name((mem_cat)c), cat[c]);
    printf("}");
}

static uint64_t cats_sum(const uint64_t *cat)
{
    uint64_t t = 0;
    for (int c = 0; c < MEM_CAT_COUNT; c++) /* the budget's: pinned host memory is not */
        t += mem_cat_in_budget((mem_cat)c) ? cat[c] : 0;
    return t;
}

static void print_json(const mplan *p)
{
    printf("{\"budget\": %" PRIu64 ", \"kv_grow\": %s, \"elastic\": %s, \"models\": [",
           p->in.budget, yes(p->in.kv_grow), yes(p->in.elastic));
    for (int i = 0; i < p->in.n; i++) {
        const reg_plan_model *m = &p->m[i];
        const reg_footprint *f = &m->f;
        const reg_plan_state *s = &p->st[i];
        printf("%s{\"name\": ", i ? ", " : "");
        cli_json_string(stdout, p->name[i], strlen(p->name[i]));
        printf(", \"path\": ");
        cli_json_string(stdout, p->path[i], strlen(p->path[i]));
        printf(", \"ok\": %s, \"error\": ", yes(m->ok));
        cli_json_string(stdout, p->error[i], strlen(p->error[i]));
        printf(", \"ctx\": %lld, \"weights_bytes\": %" PRIu64 ", \"activation_bytes\": %" PRIu64
               ", \"act_q8_bytes\": %" PRIu64 ", \"kv_block_bytes\": %" PRIu64
               ", \"kv_share_bytes\": %" PRIu64 ", \"kv_share_blocks\": %" PRIu64
               ", \"kv_max_bytes\": %" PRIu64 ", \"scratch_bytes\": %" PRIu64 ", \"scratch_alloc_bytes\": %" PRIu64
               ", \"need_bytes\": %" PRIu64 ", \"fits\": %s",
               (long long)f->ctx, f->weights, f->activations, f->act_q8, f->block_bytes,
               f->kv_share, f->block_bytes ? f->kv_share / f->block_bytes : 0, f->kv_max,
               m->scratch, m->scratch_alloc, f->need, yes(m->ok && f->need <= p->in.budget));
        printf(", \"at_start\": {\"loaded\": %s, \"pinned\": %s, \"evicted\": %s, \"kv_blocks\": %d"
               ", \"kv_blocks_min\": %d, \"kv_blocks_max\": %d, \"kv_bytes\": %" PRIu64
               ", \"kv_extra_bytes\": %" PRIu64 ", \"resident_bytes\": %" PRIu64
               ", \"resident_by_category\": ",
               yes(s->loaded), yes(s->pinned), yes(s->evicted), s->kv_blocks, s->kv_min_blocks,
               s->kv_max_blocks, s->resident[MEM_KV], s->kv_extra, cats_sum(s->resident));
        print_cats(s->resident);
        printf("}}");
    }
    printf("], \"start\": {\"ok\": %s, \"error\": ", yes(p->start_rc == KV_OK));
    cli_json_string(stdout, p->start_error, strlen(p->start_error));
    printf(", \"order\": [");
    for (int k = 0; k < p->n_order; k++) {
        printf("%s", k ? ", " : "");
        cli_json_string(stdout, p->name[p->order[k]], strlen(p->name[p->order[k]]));
    }
    printf("], \"used_bytes\": %" PRIu64 ", \"free_bytes\": %" PRIu64 "}}\n", p->used,
           p->used < p->in.budget ? p->in.budget - p->used : 0);
}

static void print_text(const mplan *p)
{
    char a[32], b[32], c[32], d[32], e[32], g[32];
    printf("%d models share a budget of %s; KV pools %s\n", p->in.n,
           mem_format_size(p->in.budget, a, 32),
           p->in.elastic   ? "grow into free memory (up to --max-num-seqs requests each)"
           : p->in.kv_grow ? "take a part of spare memory at load, fixed until unload"
                           : "are exactly their shares (--no-kv-grow)");
    printf("%-16s %8s %11s %11s %11s %16s %11s  %s\n", "model", "context", "weights",
           "activations", "int8 act", "KV share", "needs", "fits");
    for (int i = 0; i < p->in.n; i++) {
        const reg_footprint *f = &p->m[i].f;
        if (!p->m[i].ok) {
            printf("%-16s failed: %s\n", p->name[i], p->error[i]);
            continue;
        }
        char share[48];
        snprintf(share, sizeof share, "%s (%" PRIu64 ")", mem_format_size(f->kv_share, e, 32),
                 f->kv_share / f->block_bytes);
        printf("%-16s %8lld %11s %11s %11s %16s %11s  %s\n", p->name[i], (long long)f->ctx,
               mem_format_size(f->weights, a, 32), mem_format_size(f->activations, b, 32),
               mem_format_size(f->act_q8, c, 32), share, mem_format_size(f->need, d, 32),
               f->need <= p->in.budget ? "yes" : "never (over the budget)");
    }
    if (!p->n_order) {
        printf("at start: none loaded (--pin NAME or --load NAME; each loads on its first "
               "request)\n");
        return;
    }
    printf("at start (pins, then loads):\n");
    printf("  %-16s %-8s %16s %11s %11s\n", "model", "state", "KV blocks", "KV pool", "resident");
    for (int k = 0; k < p->n_order; k++) {
        const int i = p->order[k];
        const reg_plan_state *s = &p->st[i];
        int seen = 0; /* a model both pinned and loaded: one row */
        for (int j = 0; j < k; j++)
            seen |= p->order[j] == i;
        if (seen)
            continue;
        char blocks[48];
        snprintf(blocks, sizeof blocks, "%d (%d..%d)", s->kv_blocks, s->kv_min_blocks,
                 s->kv_max_blocks);
        printf("  %-16s %-8s %16s %11s %11s\n", p->name[i],
               s->evicted ? "evicted" : !s->loaded ? "-" : s->pinned ? "pinned" : "loaded",
               blocks, mem_format_size(s->resident[MEM_KV], a, 32),
               mem_format_size(cats_sum(s->resident), b, 32));
    }
    printf("used %s of %s, %s free\n", mem_format_size(p->used, c, 32),
           mem_format_size(p->in.budget, d, 32),
           mem_format_size(p->used < p->in.budget ? p->in.budget - p->used : 0, g, 32));
    if (p->start_rc)
        printf("serve's start fails: %s\n", p->start_error);
}

/* The registry's engine settings, as cmd_serve.c builds them. */
static engine_config mplan_engine_config(const cli_common *c, const plan_config *pc)
{
    engine_config ec = engine_config_default();
    cli_engine_config(c, &ec);
    ec.max_model_len = pc->ctx;
    ec.block_size = pc->block_size;
    ec.max_num_seqs = pc->max_num_seqs;
    ec.max_num_batched_tokens = pc->max_num_batched_tokens;
    return ec;
}

int cmd_plan_models(const serve_models_opts *o, const cli_common *c, const plan_config *pc,
                    const engine_config *tiers)
{
    if (o->models_dir || o->n_sleeps)
        return cli_err_usage("plan", "--models-dir and --sleep are not planned: list the models "
                                     "with -m and the ones loaded at start with --pin/--load");
    if (tiers->kv_host_memory || tiers->kv_disk_dir || c->weights_dtype >= 0 ||
        c->weights_memory || c->weights_memory_frac > 0 || c->tp * c->pp > 1)
        return cli_err_usage("plan", "KV tiers, --weights-dtype, --weights-memory, --tp and --pp "
                                     "serve one model: not with several");
    mplan *p = calloc(1, sizeof *p);
    if (!p) {
        fprintf(stderr, "kvant plan: out of memory\n");
        return 1;
    }
    const engine_config ec = mplan_engine_config(c, pc);
    int rc = mplan_models(p, o, &ec);
    if (rc) {
        free(p);
        return rc;
    }
    backend_device_info dev;
    kvant_err err = {0};
    if (backend_query(ec.backend, ec.device, &dev, &err)) {
        fprintf(stderr, "kvant plan: %s\n", err.msg);
        free(p);
        return 1;
    }
    p->in = (reg_plan_start_in){
        .m = p->m, .n = p->in.n, .order = p->order, .pin = p->pin, .n_order = p->n_order,
        .budget = reg_plan_budget(0, ec.device_memory, dev.total_memory, ec.memory_utilization),
        .kv_grow = !o->no_kv_grow,
        .elastic = !o->no_kv_grow && (!ec.backend || !strcmp(ec.backend, "cpu")),
    };
    p->start_rc = reg_plan_start(&p->in, p->st, &p->used, &p->failed, &err);
    if (p->start_rc && p->failed >= 0) /* the message names the model by its index */
        snprintf(p->start_error, sizeof p->start_error, "%s: %s", p->name[p->failed], err.msg);
    else if (p->start_rc)
        snprintf(p->start_error, sizeof p->start_error, "%s", err.msg);
    if (c->json)
        print_json(p);
    else
        print_text(p);
    rc = p->start_rc ? 1 : 0;
    free(p);
    return rc;
}
