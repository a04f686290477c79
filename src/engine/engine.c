/* engine.c - engine lifecycle, the engine thread, and the thread-safe API
 * (submit, cancel, stats, drain).  The step itself is in engine_step.c.
 *
 * Start-up: the planner (mem/plan.h) turns the budget into a KV pool size
 * from the model's shape; the memory manager then accounts every byte the
 * backend allocates (mapped weights, the activation workspace carved by the
 * same formula the planner used, the KV pool), so the printed plan and the
 * real allocation agree.
 */
#include "engine/engine.h"
#include "engine/engine_draft.h"
#include "engine/engine_spec.h"
#include "engine/engine_gram.h"
#include "engine/engine_req.h"
#include "engine/engine_state.h"
#include "engine/engine_step.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef KVANT_TEST_HOOKS
#include <unistd.h>
#endif

#include "backend/backend_select.h"
#include "grammar/tokmask.h"
#include "kernels/dtype.h"
#include "mem/plan.h"
#include "model/wstream.h"
#include "model/xcache.h"
#include "par/par.h"
#include "quant/quant.h"
#include "quant/quant_load.h"

static int test_spec_unjudged(void); /* test builds: see below */

typedef struct engine_ext {
    engine e;
    plan_result plan;
    mem_allocator alloc;  /* the backend's device allocator */
    quant_weights *qw;    /* load-time quantized weights, or NULL */
    int32_t held_blocks;  /* planned blocks held back for backend scratch */
    int pool_registered;  /* kv_pool_report registered with the memory manager */
    int tp_agreed;        /* --tp: this rank took part in the start-up agreement */
    wstream_plan wplan;   /* weight placement (n_streamed 0: all resident) */
} engine_ext;

/* Weight bytes after load-time quantization to type (what
 * quant_weights_apply will allocate), for the plan. */
static void add_quantized(void *ctx, model_tensor *t)
{
    uint64_t *acc = ctx;
    uint32_t type = (uint32_t)acc[1];
    if (t->ne[1] > 1) {
        int fell;
        uint32_t tt = quant_fit_type(type, t->ne[0], &fell);
        acc[0] += (uint64_t)dtype_row_size(tt, t->ne[0]) * (uint64_t)t->ne[1];
    } else {
        acc[0] += t->nbytes;
    }
}

static uint64_t planned_weights(const engine *e)
{
    if (e->cfg.weights_dtype < 0)
        return e->m->weights_bytes;
    uint64_t acc[2] = {0, (uint64_t)e->cfg.weights_dtype};
    model_for_each_tensor(e->m, add_quantized, acc);
    return acc[0];
}

engine_config engine_config_default(void)
{
    return (engine_config){
        .memory_utilization = 0.90,
        .max_num_seqs = 64,
        .max_num_batched_tokens = 2048,
        .max_itl_ms = 200,
        .block_size = 16,
        .prefix_cache = 1,
        .kv_dtype = DT_F16,
        .weights_dtype = -1,
    };
}

int engine_spec_mode(const engine *e)
{
    return e->cfg.spec;
}

const plan_result *engine_plan(const engine *e)
{
    return &((const engine_ext *)e)->plan;
}

static void add_type_bytes(void *ctx, model_tensor *t)
{
    uint64_t *by_type = ctx;
    if (t->type < DT_COUNT)
        by_type[t->type] += t->nbytes;
}

static void print_plan(const engine *e, const plan_result *p)
{
    char a[32], b[32], c[32];
    uint64_t by_type[DT_COUNT] = {0};
    model_for_each_tensor(e->m, add_type_bytes, by_type);
    fprintf(stderr, "kvant: weights by type:");
    for (int t = 0; t < DT_COUNT; t++)
        if (by_type[t] && dtype_get((uint32_t)t))
            fprintf(stderr, " %s %s", dtype_get((uint32_t)t)->name,
                    mem_format_size(by_type[t], a, 32));
    fprintf(stderr, "%s\n", e->cfg.weights_dtype >= 0 ? " (before load-time quantization)" : "");
    fprintf(stderr, "kvant: memory budget %s (%.0f%% of %s)\n", mem_format_size(p->budget, a, 32),
            p->utilization * 100, mem_format_size(p->device_memory, b, 32));
    fprintf(stderr, "kvant: weights %s, activations %s (%d tokens x %d seqs)\n",
            mem_format_size(p->weights_bytes, a, 32), mem_format_size(p->activation_bytes, b, 32),
            e->cfg.max_num_batched_tokens, e->cfg.max_num_seqs);
    fprintf(stderr, "kvant: KV pool %s%s: %lld blocks of %d tokens = %llu tokens, %s per token\n",
            p->kv_start_blocks < p->kv_pool_blocks ? "up to " : "",
            mem_format_size(p->kv_pool_bytes, a, 32), (long long)p->kv_pool_blocks, p->block_size,
            (unsigned long long)p->kv_pool_tokens, mem_format_size(p->kv_bytes_per_token, c, 32));
    char sl[160];
    int32_t n_live, n_snap;
    engine_state_plan(&e->cfg, p->state_slot_bytes, p->budget, &n_live, &n_snap);
    if (plan_state_line(p, n_live, sl, sizeof sl))
        fprintf(stderr, "kvant: %s\n", sl);
    if (p->kv_fit)
        fprintf(stderr, "kvant: KV pool sized from demand (host memory): at most %d x %d "
                "requests of %lld tokens or the budget; %s (%lld blocks) reserved at start%s\n",
                PLAN_KV_FIT_SHARE, e->cfg.max_num_seqs, (long long)p->ctx,
                mem_format_size(p->kv_start_bytes, b, 32), (long long)p->kv_start_blocks,
                p->kv_start_blocks < p->kv_pool_blocks ? ", grows on demand" : "");
    const int64_t kvb = engine_kv_budget_tokens(e->cfg.kv_budget, p->ctx);
    if (kvb > 0 && kvb < p->ctx)
        fprintf(stderr, "kvant: KV budget %lld tokens per request (--kv-budget; %s + recent "
                "window): %.2fx requests of context %lld fit the pool, against %.2fx without\n",
                (long long)kvb, engine_kv_policy_name(e->cfg.kv_policy),
                (double)p->kv_pool_tokens / (double)kvb, (long long)p->ctx,
                (double)p->kv_pool_tokens / (double)p->ctx);
    if (p->ctx_auto)
        fprintf(stderr, "kvant: context %lld tokens: the model's %lld does not fit one request "
                "in the budget; the largest that does (-c sets it)\n", (long long)p->ctx,
                (long long)e->m->hp.n_ctx_train);
    if (p->window > 0)
        fprintf(stderr, "kvant: window layers' KV pool %s: %lld blocks (window %lld, %s per "
                "token); %s per sequence of %lld tokens\n",
                mem_format_size(p->kv_window_bytes, a, 32), (long long)p->kv_window_blocks,
                (long long)p->window, mem_format_size(p->kv_window_bytes_per_token, b, 32),
                mem_format_size(p->kv_seq_bytes, c, 32), (long long)p->ctx);
    double conc = p->ctx ? (double)p->kv_pool_tokens / (double)p->ctx : 0.0;
    for (int i = 0; i < p->n_conc; i++) /* the plan's, bounded by both pools */
        conc = p->conc_ctx[i] == p->ctx ? p->conc[i] : conc;
    fprintf(stderr, "kvant: maximum concurrency at context %lld: %.2fx\n", (long long)p->ctx,
            conc);
}

/* --tp: the budget's memory manager and this rank's share of the model,
 * before the plan sizes everything from the model's shapes. */
static int start_tp(engine_ext *x, kvant_err *err)
{
    engine *e = &x->e;
    if (!e->cfg.tp_group)
        return KV_OK;
    /* one device per rank on its host (this copy of the config is the engine's) */
    e->cfg.device = backend_rank_device(e->cfg.backend, e->cfg.device,
                                        par_local_rank(e->cfg.tp_group));
    backend_device_info dev;
    int rc = backend_query(e->cfg.backend, e->cfg.device, &dev, err);
    if (rc)
        return rc;
    uint64_t total = e->cfg.device_memory ? e->cfg.device_memory : dev.total_memory;
    return engine_tp_begin(e, dev.alloc, plan_budget(total, e->cfg.memory_utilization), err);
}

/* Weights that do not fit and no --weights-memory: the cap the planner
 * chooses (0: none: the weights fit, offload is off or cannot run). */
static uint64_t auto_weights_cap(const engine *e, const plan_model *pm, const plan_config *pc)
{
    const engine_config *c = &e->cfg;
    uint64_t cap = 0;
    if (c->weights_memory || c->weights_memory_frac > 0 || c->no_offload || c->weights_dtype >= 0 ||
        (c->backend && strcmp(c->backend, "cpu") != 0) || c->tp_group || c->shared_mem ||
        e->draft)
        return 0;
    return plan_fit_weights(pm, pc, &cap) ? cap : 0;
}

static int plan_engine(engine_ext *x, kvant_err *err)
{
    engine *e = &x->e;
    const model_hparams *hp = &e->m->hp;
    plan_model pm;
    model_plan_shape(hp, planned_weights(e), &pm);
    plan_config pc = plan_config_default();
    backend_device_info dev;
    int rc0 = backend_query(e->cfg.backend, e->cfg.device, &dev, err);
    if (rc0)
        return rc0;
    x->alloc = dev.alloc;
    const int host = !e->cfg.backend || strcmp(e->cfg.backend, "cpu") == 0;
    pc.device_memory = e->cfg.device_memory ? e->cfg.device_memory : dev.total_memory;
    pc.utilization = e->cfg.memory_utilization;
    pc.ctx = e->cfg.max_model_len;
    pc.fit_ctx = 1; /* ctx 0: the model's, or the largest that fits one request */
    pc.block_size = e->cfg.block_size;
    pc.max_num_seqs = e->cfg.max_num_seqs;
    pc.max_num_batched_tokens = e->cfg.max_num_batched_tokens;
    pc.kv_dtype = e->cfg.kv_dtype;
    pc.act_q8 = host && !e->cfg.exact;
    e->kv_window = engine_kvwin_use(e);
    if (e->kv_window && !e->cfg.kv_window_keep) { /* keep: sized as one group, split below */
        pc.kv_window = e->kv_window;
        for (int32_t il = 0; il < hp->n_layers; il++)
            pc.kv_window_heads += e->m->layers[il].window > 0 ? e->m->layers[il].n_head_kv : 0;
    }
    /* the host's memory: the pool from demand, growing unless a window group fixes it */
    pc.kv_fit = e->cfg.kv_fit && host && !e->cfg.shared_mem && !e->cfg.tp_group &&
                e->cfg.kv_blocks_override <= 0 && e->cfg.kv_max_blocks <= 0;
    pc.kv_grow = pc.kv_fit && !e->kv_window;
    pc.kv_start_bytes = e->cfg.kv_start_bytes;
    pc.reserved_bytes = engine_draft_reserved(e); /* the draft model's share comes first */
    e->st_budget = plan_budget(pc.device_memory, pc.utilization);
    int32_t n_live, n_snap;
    pc.state_slots = engine_state_slots(e, &n_live, &n_snap);
    const uint64_t cap = auto_weights_cap(e, &pm, &pc);
    int rc = engine_offload_plan(e, plan_budget(pc.device_memory, pc.utilization), cap,
                                 &x->wplan, &pm.weights_bytes, err);
    if (rc)
        return rc;
    rc = plan_compute(&pm, &pc, &x->plan, err);
    if (rc)
        return rc;
    if (e->cfg.print_plan)
        print_plan(e, &x->plan);
    if (!x->plan.fits_one_max_ctx) {
        /* the device size whose budget covers the missing bytes, in MiB up */
        const double util = pc.utilization > 0 ? pc.utilization : 1.0;
        const unsigned long long need_mib =
            (unsigned long long)(((double)(x->plan.budget + x->plan.missing_bytes) / util +
                                  (1 << 20) - 1) / (1 << 20));
        return kvant_err_set(err, KV_ENOMEM,
                             "a request of the maximum context (%lld tokens) does not fit: %llu "
                             "bytes missing; add -c %lld (the largest context that fits), or "
                             "--device-memory %lluMiB, or a smaller --kv-dtype (q8_0)",
                             (long long)x->plan.ctx, (unsigned long long)x->plan.missing_bytes,
                             (long long)x->plan.max_ctx_that_fits, need_mib);
    }
    e->max_model_len = x->plan.ctx;
    return KV_OK;
}

/* What a hybrid model (recurrent layers) cannot run: speculation would need
 * the state rolled back past rejected drafts. */
static int check_hybrid(const engine *e, kvant_err *err)
{
    if (!model_is_hybrid(e->m))
        return KV_OK;
    if (e->cfg.spec)
        return kvant_err_set(err, KV_EUNSUP, "--spec: speculative decoding is not for hybrid "
                             "models (%s: a rejected draft would need the recurrent state "
                             "rolled back)", e->m->hp.recipe->arch);
    if (e->cfg.state_snap_every < -1)
        return kvant_err_set(err, KV_EINVAL, "state_snap_every %d: -1 (none), 0 (default) or a "
                             "block count", e->cfg.state_snap_every);
    return KV_OK;
}

static int check_config(const engine_config *c, kvant_err *err)
{
    if (c->max_num_seqs < 1 || c->max_num_seqs > 4096)
        return kvant_err_set(err, KV_EINVAL, "max_num_seqs %d outside [1, 4096]", c->max_num_seqs);
    if (c->max_num_batched_tokens < c->max_num_seqs || c->max_num_batched_tokens > 65536)
        return kvant_err_set(err, KV_EINVAL,
                             "max_num_batched_tokens %d must be in [max_num_seqs, 65536]",
                             c->max_num_batched_tokens);
    if (!(c->max_itl_ms >= 0 && c->max_itl_ms <= 3.6e6))
        return kvant_err_set(err, KV_EINVAL, "max_itl_ms %g outside [0, 3600000] (0: off)",
                             c->max_itl_ms);
    int bs = c->block_size;
    if (bs < 8 || bs > 128 || (bs & (bs - 1)))
        return kvant_err_set(err, KV_EINVAL, "block_size %d: a power of two in [8, 128]", bs);
    if (!(c->memory_utilization > 0.0 && c->memory_utilization <= 1.0))
        return kvant_err_set(err, KV_EINVAL, "memory_utilization %g outside (0, 1]",
                             c->memory_utilization);
    return KV_OK;
}

static void *engine_main(void *arg);

static void kv_copy(void *ctx, int32_t dst, int32_t src)
{
    engine_tp_kv_copy(ctx, dst, src); /* every rank's copy of the block (one without --tp) */
}

static int alloc_step_buffers(engine *e, kvant_err *err)
{
    int32_t nt = e->cfg.max_num_batched_tokens, ns = e->cfg.max_num_seqs;
    e->b_tokens = malloc((size_t)nt * sizeof(int32_t));
    e->b_pos = malloc((size_t)nt * sizeof(int32_t));
    e->b_seq = malloc((size_t)nt * sizeof(int32_t));
    e->b_out = malloc((size_t)ns * sizeof(int32_t));
    e->b_seqs = malloc((size_t)ns * sizeof(fwd_seq));
    e->b_seqp = malloc((size_t)ns * sizeof(eng_seq *));
    e->logits = malloc((size_t)(ns + 1) * e->m->hp.n_vocab * sizeof(float)); /* + scratch row */
    e->hidden = malloc((size_t)ns * e->m->hp.n_embd * sizeof(float));
    e->fwd.h_hidden = e->hidden; /* where embed requests' rows go (fwd_init ran) */
    /* one sampler scratch for all sequences: they sample one at a time on
     * this engine's thread (16 bytes per vocabulary entry, not per sequence) */
    int rc = sampler_scratch_init(&e->smp_scratch, e->m->hp.n_vocab, err);
    e->step_buf_bytes = (uint64_t)nt * 3 * sizeof(int32_t) +
                        (uint64_t)ns * (sizeof(int32_t) + sizeof(fwd_seq) + sizeof(eng_seq *)) +
                        (uint64_t)(ns + 1) * (uint64_t)e->m->hp.n_vocab * sizeof(float) +
                        (uint64_t)ns * (uint64_t)e->m->hp.n_embd * sizeof(float) +
                        (uint64_t)e->m->hp.n_vocab * 16;
    e->stats.host_bytes = e->step_buf_bytes;
    if (rc)
        return rc;
    if (!e->b_tokens || !e->b_pos || !e->b_seq || !e->b_out || !e->b_seqs || !e->b_seqp ||
        !e->logits || !e->hidden)
        return kvant_err_set(err, KV_ENOMEM, "out of memory for step buffers");
    return KV_OK;
}

/* Memory-report callback (runs on the reporting thread, under the memory
 * manager's lock): the engine thread's last snapshot of the pool. */
static void kv_pool_report(void *ctx, mem_pool_stats *out)
{
    engine *e = ctx;
    pthread_mutex_lock(&e->mu);
    *out = e->kv_pool_stats;
    pthread_mutex_unlock(&e->mu);
}

/* Blocks of the window group: the plan's split, or with kv_window_keep as
 * many as the global group (every layer's whole context, no block given
 * back); tests may set them. */
static int32_t window_blocks(const engine *e, const engine_ext *x, int32_t n_blocks)
{
    if (e->cfg.kv_window_blocks_override > 0)
        return e->cfg.kv_window_blocks_override;
    if (e->cfg.kv_blocks_override > 0 || e->cfg.kv_window_keep)
        return n_blocks;
    return (int32_t)x->plan.kv_window_blocks;
}

/* Bytes of one block of each group. */
static void set_block_bytes(engine *e, const engine_ext *x)
{
    const uint64_t bs = (uint64_t)e->cfg.block_size;
    uint64_t w = 0;
    for (int32_t il = 0; e->kv_window && il < e->m->hp.n_layers; il++)
        if (e->m->layers[il].window > 0)
            w += (uint64_t)e->m->layers[il].n_head_kv * 2u *
                 (uint64_t)dtype_row_size(e->cfg.kv_dtype, e->m->hp.head_dim);
    /* the plan's bytes per token are the global layers' when it split them */
    uint64_t g = x->plan.kv_bytes_per_token - (x->plan.window > 0 ? 0 : w);
    e->kv_block_bytes = g * bs;
    e->kv_block_bytes_w = w * bs;
}

static int setup_backend(engine_ext *x, kvant_err *err)
{
    engine *e = &x->e;
    int rc;
    if (!e->mem) /* --tp made it before the plan (engine_tp_begin) */
        e->mem = e->cfg.shared_mem ? e->cfg.shared_mem : mem_create(x->plan.budget, x->alloc, err);
    if (!e->mem)
        return KV_ENOMEM;
    if (e->cfg.test_fail_nth)
        mem_fail_nth(e->mem, e->cfg.test_fail_nth);
    e->be = backend_create(e->cfg.backend, e->cfg.device, e->mem, e->cfg.n_threads,
                           (e->cfg.exact ? BACKEND_EXACT : 0) | (e->cfg.no_pack ? BACKEND_NO_PACK : 0),
                           err);
    if (!e->be)
        return KV_ENOMEM;
    if (e->cfg.weights_dtype >= 0) {
        /* a device backend's memory is not the host's: convert on the host,
         * load_weights uploads the copies (as the CLI session does) */
        x->qw = e->cfg.backend && strcmp(e->cfg.backend, "cpu")
                    ? quant_weights_apply_host(e->m, (uint32_t)e->cfg.weights_dtype, err)
                    : quant_weights_apply(e->m, (uint32_t)e->cfg.weights_dtype, e->mem, err);
        if (!x->qw)
            return err && err->code ? err->code : KV_ENOMEM;
    }
    if ((rc = engine_offload_start(e, &x->wplan, err)))
        return rc;
    if ((rc = e->be->ops->load_weights(e->be, e->m, err)))
        return rc;
    /* The backend's kv_init needs a little more than the blocks (attention
     * scratch, staging buffers), which the plan does not size: hold back
     * enough whole blocks for it. */
    kv_layout lay = fwd_kv_layout(e->m, 1, e->cfg.block_size, e->cfg.kv_dtype);
    lay.max_tokens = e->cfg.max_num_batched_tokens;
    lay.rotate = e->cfg.kv_rotate;
    if (lay.rotate && e->cfg.tp_group)
        return kvant_err_set(err, KV_EUNSUP, "--kv-rotate: not with --tp/--pp");
    uint64_t extra = e->be->ops->kv_extra_bytes ? e->be->ops->kv_extra_bytes(e->be, &lay) : 0;
    extra += engine_tp_extra_bytes(e);
    uint64_t block_bytes = x->plan.kv_bytes_per_token * (uint64_t)e->cfg.block_size;
    int64_t held = block_bytes ? (int64_t)((extra + block_bytes - 1) / block_bytes) : 0;
    x->held_blocks = (int32_t)held;
    const int32_t ceiling = (int32_t)(x->plan.kv_pool_blocks - held);
    int32_t n_blocks = e->cfg.kv_blocks_override > 0 ? e->cfg.kv_blocks_override : ceiling;
    if (e->cfg.kv_blocks_override <= 0 && x->plan.kv_start_blocks < n_blocks) {
        n_blocks = (int32_t)x->plan.kv_start_blocks; /* fits itself: grows on demand */
        e->kv_grow_max = ceiling;
    }
    rc = n_blocks < 1 ? kvant_err_set(err, KV_ENOMEM, "no memory left for the KV pool") : KV_OK;
    if (e->cfg.tp_group) {
        kvant_err local = *err;
        x->tp_agreed = 1;
        rc = engine_tp_agree(e, rc, &local, &n_blocks, err);
    }
    if (rc)
        return rc;
    lay.n_blocks = n_blocks;
    lay.max_blocks = e->cfg.kv_max_blocks > n_blocks ? e->cfg.kv_max_blocks : n_blocks;
    lay.max_blocks = e->kv_grow_max > lay.max_blocks ? e->kv_grow_max : lay.max_blocks;
    if (lay.max_blocks > KVPOOL_MAX_BLOCKS)
        lay.max_blocks = KVPOOL_MAX_BLOCKS > n_blocks ? KVPOOL_MAX_BLOCKS : n_blocks;
    e->kv_min_blocks = n_blocks;
    if (e->kv_window)
        lay.n_blocks_w = window_blocks(e, x, n_blocks);
    int32_t n_live, n_snap;
    lay.n_state_slots = engine_state_slots(e, &n_live, &n_snap);
    if ((rc = fwd_init(&e->fwd, e->m, e->be, e->cfg.max_num_batched_tokens, e->cfg.max_num_seqs,
                       &lay, err)) ||
        (rc = engine_tp_attach(e, err)))
        return rc;
    set_block_bytes(e, x);
    if ((rc = engine_tier_create(e, lay.max_blocks, err)) || (rc = engine_state_create(e, err)))
        return rc;
    kvpool_config pc = kvpool_config_default();
    pc.n_blocks = n_blocks;
    pc.max_blocks = lay.max_blocks;
    pc.block_size = e->cfg.block_size;
    pc.prefix_cache = e->cfg.prefix_cache;
    pc.model_hash = e->m->weights_bytes * 0x9e3779b97f4a7c15ULL ^ (uint64_t)e->m->hp.n_vocab;
    pc.copy_block = kv_copy;
    pc.copy_ctx = e;
    engine_tier_hook(e, &pc);
    e->pool = kvpool_create(&pc, err);
    if (!e->pool)
        return KV_ENOMEM;
    e->kv_pool_stats = (mem_pool_stats){"kv", (uint64_t)n_blocks * e->kv_block_bytes,
                                        (uint64_t)n_blocks * e->kv_block_bytes,
                                        (uint64_t)n_blocks * e->kv_block_bytes};
    if ((rc = mem_register_pool(e->mem, kv_pool_report, e)))
        return kvant_err_set(err, rc, "cannot register the KV pool with the memory manager");
    x->pool_registered = 1;
    /* the window group's pool after the global one (first in the memory report) */
    return e->kv_window ? engine_kvwin_create(e, lay.n_blocks_w, err) : KV_OK;
}

engine *engine_create(model *m, const engine_config *cfg, kvant_err *err)
{
    if (check_config(cfg, err))
        return NULL;
    engine_ext *x = calloc(1, sizeof *x);
    if (!x) {
        kvant_err_set(err, KV_ENOMEM, "out of memory");
        return NULL;
    }
    engine *e = &x->e;
    e->m = m;
    e->cfg = *cfg;
    e->spec_unjudged = test_spec_unjudged();
    e->next_id = 1;
    e->itl_budget = e->stats.itl_budget = cfg->max_num_batched_tokens; /* until a step runs */
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_cond_init(&e->snap_cv, NULL);
    engine_gram_init(e); /* the token trie waits for the first constrained request */
    e->progress_t = engine_now();
    if (check_hybrid(e, err) || start_tp(x, err) ||
        engine_draft_open(e, engine_spec_resolve(cfg).max_batch, err) ||
        plan_engine(x, err) ||
        setup_backend(x, err) || engine_draft_start(e, err) || alloc_step_buffers(e, err)) {
        if (cfg->tp_group && !x->tp_agreed) { /* tell the other ranks why */
            kvant_err local = *err;
            int32_t nb = 0;
            (void)engine_tp_agree(e, err->code ? err->code : KV_ENOMEM, &local, &nb, err);
            *err = local;
        }
        goto fail;
    }
    kvpool_stats ks; /* the pool's shape is reported before the first step */
    kvpool_get_stats(e->pool, &ks);
    e->stats.kv_blocks_total = ks.n_blocks;
    e->stats.kv_blocks_free = ks.n_free;
    e->stats.block_size = ks.block_size;
    e->stats.kv_blocks_min = ks.n_blocks;
    e->stats.kv_blocks_max = kvpool_max_blocks(e->pool);
    if (x->plan.ctx_auto && e->max_model_len > (int64_t)e->stats.kv_blocks_max * cfg->block_size)
        e->max_model_len = (int64_t)e->stats.kv_blocks_max * cfg->block_size; /* scratch held more */
    if (cfg->kv_blocks_override > 0)
        e->max_model_len = e->max_model_len < (int64_t)cfg->kv_blocks_override * cfg->block_size
                               ? e->max_model_len
                               : (int64_t)cfg->kv_blocks_override * cfg->block_size;
    if (!cfg->manual) {
        if (pthread_create(&e->thread, NULL, engine_main, e)) {
            kvant_err_set(err, KV_ENOMEM, "cannot start the engine thread");
            goto fail;
        }
        e->thread_started = 1;
    }
    return e;
fail:
    engine_destroy(e);
    return NULL;
}

void engine_destroy(engine *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (e->thread_started)
        pthread_join(e->thread, NULL);
    /* Requests still queued or running get a final error event. */
    while (e->incoming) {
        eng_req *r = e->incoming;
        e->incoming = r->next;
        r->next = e->reqs;
        e->reqs = r;
    }
    while (e->reqs) {
        eng_req *r = e->reqs;
        engine_emit_error(e, r, "server shutting down");
        engine_free_req(e, r);
    }
    engine_req_reap(e);
    engine_state_destroy(e); /* the requests gave their slots back */
    if (((engine_ext *)e)->pool_registered)
        mem_unregister_pool(e->mem, kv_pool_report, e);
    engine_tier_shutdown(e);
    engine_kvwin_destroy(e);
    kvpool_destroy(e->pool);
    engine_tier_destroy(e); /* writes the host tier to disk: KV storage still alive */
    engine_draft_destroy(e); /* its reservations before the manager goes */
    engine_tp_stop(e);
    fwd_free(&e->fwd);
    if (e->be)
        e->be->ops->unload_weights(e->be, e->m);
    engine_offload_stop(e); /* before the backend: the ring may be its pinned memory */
    if (e->be)
        e->be->ops->destroy(e->be);
    engine_tp_free(e);
    quant_weights_free(((engine_ext *)e)->qw);
    if (e->mem && !e->cfg.shared_mem)
        mem_destroy(e->mem);
    free(e->b_tokens);
    free(e->b_pos);
    free(e->b_seq);
    free(e->b_out);
    free(e->b_seqs);
    free(e->b_seqp);
    free(e->logits);
    free(e->hidden);
    engine_gram_destroy(e);
    sampler_scratch_free(&e->smp_scratch);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    pthread_cond_destroy(&e->snap_cv);
    free(e);
}

#ifdef KVANT_TEST_HOOKS
/* Test builds only (build/kvant-testhooks, never build/kvant): while the
 * file named by $KVANT_TEST_FREEZE_FILE exists, the engine thread stops
 * before its next step, as a wedged kernel or a deadlock would.  Used by
 * tests/py/test_health.py to show that /health sees it. */
static void test_freeze_point(void)
{
    const char *f = getenv("KVANT_TEST_FREEZE_FILE");
    while (f && f[0] && access(f, F_OK) == 0)
        usleep(20000);
}

/* While $KVANT_TEST_SPEC_UNJUDGED is set at start, the speculative cost
 * model never declines a draft, so a test's drafting does not depend on
 * how fast this machine's verify passes are against its draft passes
 * (tests/py/test_spec_draft.py). */
static int test_spec_unjudged(void)
{
    const char *v = getenv("KVANT_TEST_SPEC_UNJUDGED");
    return v && v[0];
}
#else
static inline void test_freeze_point(void) {}
static inline int test_spec_unjudged(void)
{
    return 0;
}
#endif

/* After a step: it ran the model, or nothing is left to do, is progress. */
static void note_progress(engine *e, int did_work)
{
    pthread_mutex_lock(&e->mu);
    if (did_work || e->n_in_flight == 0)
        e->progress_t = engine_now();
    pthread_mutex_unlock(&e->mu);
}

/* Waits on e->cv (e->mu held); while the tiers have idle work (engine_tier_busy),
 * for at most 10 ms: returns 1 when that time ran out (idle work due). */
static int engine_idle_wait(engine *e)
{
    if (!engine_tier_busy(e)) {
        pthread_cond_wait(&e->cv, &e->mu);
        return 0;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 10 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return pthread_cond_timedwait(&e->cv, &e->mu, &ts) == ETIMEDOUT;
}

static void *engine_main(void *arg)
{
    engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        int idle_tick = 0;
        while (!e->stop && !e->incoming && !e->n_cancel && !e->reqs && !e->snap_req &&
               !e->resize_req && !idle_tick)
            idle_tick = engine_idle_wait(e);
        int stop = e->stop, work = e->incoming || e->n_cancel || e->reqs;
        pthread_mutex_unlock(&e->mu);
        if (stop)
            break;
        if (idle_tick && !work)
            engine_tier_idle(e); /* write-through offers, the disk scan's next slice */
        engine_serve_snapshot(e); /* between steps: the pool is consistent */
        engine_serve_resize(e);
        if (work) {
            test_freeze_point();
            note_progress(e, engine_step(e));
        }
        if (!e->reqs) /* nothing admitted: free finished requests (outside a step) */
            engine_req_reap(e);
    }
    pthread_mutex_lock(&e->mu);
    e->thread_exited = 1; /* a snapshot waiter gives up */
    pthread_cond_broadcast(&e->snap_cv);
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

int engine_run_step(engine *e)
{
    return engine_step(e);
}

/* kvb: the request's KV budget, resolved (engine_kvb_resolve) */
static int check_request(const engine *e, const engine_request *r, eng_kvb *kvb, kvant_err *err)
{
    if (!r->prompt || r->n_prompt < 1)
        return kvant_err_set(err, KV_EINVAL, "prompt: must contain at least one token");
    for (int64_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= e->m->hp.n_vocab)
            return kvant_err_set(err, KV_EINVAL, "prompt: token id %d out of range [0, %d)",
                                 r->prompt[i], e->m->hp.n_vocab);
    if (r->max_tokens < 1)
        return kvant_err_set(err, KV_EINVAL, "max_tokens: must be at least 1");
    if (r->embed && (r->n != 1 || r->embed > ENGINE_EMBED_LAST || r->prompt_logprobs))
        return kvant_err_set(err, KV_EINVAL, "embed: needs n = 1 and no prompt logprobs");
    if (r->embed && r->grammar)
        return kvant_err_set(err, KV_EINVAL, "embed: no grammar");
    if (r->embed && e->cfg.tp_group)
        return kvant_err_set(err, KV_EINVAL, "embeddings are not served under --tp/--pp");
    if (r->n < 1 || r->n > ENGINE_MAX_N)
        return kvant_err_set(err, KV_EINVAL, "n: must be in [1, %d]", ENGINE_MAX_N);
    if (r->top_logprobs < -1 || r->top_logprobs > ENGINE_MAX_TOP_LOGPROBS)
        return kvant_err_set(err, KV_EINVAL, "top_logprobs: must be in [0, %d]",
                             ENGINE_MAX_TOP_LOGPROBS);
    if (r->n_stop_ids < 0 || r->n_stop_ids > ENGINE_MAX_STOP_IDS)
        return kvant_err_set(err, KV_EINVAL, "stop ids: at most %d", ENGINE_MAX_STOP_IDS);
    if (sampler_params_check(&r->sampling, err))
        return KV_EINVAL;
    if (r->n_prompt + r->max_tokens > e->max_model_len)
        return kvant_err_set(err, KV_ERANGE,
                             "prompt (%lld tokens) plus max_tokens (%lld) exceeds the context "
                             "of %lld tokens",
                             (long long)r->n_prompt, (long long)r->max_tokens,
                             (long long)e->max_model_len);
    if (engine_kvb_resolve(e, r, kvb, err))
        return KV_EINVAL;
    int64_t pool_tokens = (int64_t)e->kv_min_blocks * e->cfg.block_size; /* never less */
    const int sinks = kvb->recent > 0 && kvb->policy == ENGINE_KV_SINKS;
    /* what it holds at most; SnapKV: the whole prompt, and the kept rows copied */
    const int64_t peak = sinks ? kvb->budget
                         : kvb->recent > 0
                             ? r->n_prompt + 1 + (int64_t)kvb->sink_blocks * e->cfg.block_size
                             : r->n_prompt + 1;
    if (peak > pool_tokens)
        return kvant_err_set(err, KV_ERANGE, "%s of %lld tokens cannot fit the KV pool of "
                             "%lld tokens", sinks ? "kv_budget" : "prompt",
                             (long long)(sinks ? kvb->budget : peak), (long long)pool_tokens);
    return KV_OK;
}

/* The request's storage is allocated here, on the caller's thread, so the
 * engine thread's steps allocate nothing; requests finished since the last
 * call are freed here too. */
int64_t engine_submit(engine *e, const engine_request *r, engine_event_fn fn, void *ctx,
                      kvant_err *err)
{
    eng_kvb kvb;
    int rc = check_request(e, r, &kvb, err);
    if (rc)
        return rc;
    engine_req_reap(e);
    eng_req *q;
    if ((rc = engine_req_create(e, r, &kvb, fn, ctx, &q, err)))
        return rc;
    pthread_mutex_lock(&e->mu);
    if (e->draining || e->stop ||
        (e->cfg.max_waiting > 0 && e->stats.waiting + e->stats.running >= e->cfg.max_waiting +
                                                                           e->cfg.max_num_seqs)) {
        pthread_mutex_unlock(&e->mu);
        engine_req_destroy(q);
        return kvant_err_set(err, KV_EBUSY, e->draining ? "server is draining"
                                                        : "too many requests waiting");
    }
    q->id = e->next_id++;
    if (e->incoming_tail)
        e->incoming_tail->next = q;
    else
        e->incoming = q;
    e->incoming_tail = q;
    q->live_next = e->live;
    if (e->live)
        e->live->live_prev = q;
    e->live = q;
    if (e->n_in_flight++ == 0)
        e->progress_t = engine_now(); /* an idle engine: the stall clock starts now */
    e->stats.waiting++;
    int64_t id = q->id;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return id;
}

/* Marks the request; the next step's admit phase fails it.  No allocation
 * (an event callback on the engine thread may call this inside a step). */
void engine_cancel(engine *e, int64_t request_id)
{
    pthread_mutex_lock(&e->mu);
    for (eng_req *r = e->live; r; r = r->live_next) {
        if (r->id == request_id) {
            if (!r->cancel_asked) {
                r->cancel_asked = 1;
                e->n_cancel++;
            }
            break;
        }
    }
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void engine_get_stats(engine *e, engine_stats *out)
{
    engine_stats_read(e, out);
}

mem_mgr *engine_mem(engine *e)
{
    return e->mem;
}

int engine_grammar_prepare(engine *e, kvant_err *err)
{
    return engine_gram_vocab(e, err);
}

int32_t engine_mask_words(const engine *e)
{
    const tmask_vocab *v = atomic_load_explicit(&((engine *)e)->gvocab, memory_order_acquire);
    return v ? tmask_n_words(v) : 0;
}

int64_t engine_max_model_len(const engine *e)
{
    return e->max_model_len;
}

uint64_t engine_kv_block_bytes(const engine *e)
{
    return e->kv_block_bytes;
}

int engine_drain(engine *e)
{
    pthread_mutex_lock(&e->mu);
    e->draining = 1;
    int n = e->n_in_flight;
    pthread_mutex_unlock(&e->mu);
    return n;
}

void engine_get_health(engine *e, engine_health *out)
{
    double now = engine_now();
    pthread_mutex_lock(&e->mu);
    out->thread_alive = e->cfg.manual || (e->thread_started && !e->thread_exited);
    out->in_flight = e->n_in_flight;
    out->busy = e->n_in_flight > 0;
    out->stalled_s = out->busy && now > e->progress_t ? now - e->progress_t : 0.0;
    out->steps = e->stats.steps;
    pthread_mutex_unlock(&e->mu);
    out->weights_failed = 0;
    out->weights_error[0] = 0;
    wstream_stats ws;
    if (engine_get_offload(e, &ws) && ws.failed) {
        out->weights_failed = 1;
        snprintf(out->weights_error, sizeof out->weights_error, "%s", ws.error);
    }
    xcache_stats xs;
    if (e->xc && (xcache_get_stats(e->xc, &xs), xs.failed)) {
        out->weights_failed = 1;
        snprintf(out->weights_error, sizeof out->weights_error, "%.250s", xs.error);
    }
    out->group_failed = 0;
    out->group_error[0] = 0;
    engine_tp_health(e, out);
}

int engine_in_flight(engine *e)
{
    pthread_mutex_lock(&e->mu);
    int n = e->n_in_flight;
    pthread_mutex_unlock(&e->mu);
    return n;
}
