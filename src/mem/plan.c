/* plan.c - the what-fits planner (see plan.h).
 *
 * Everything here is integer arithmetic on validated shapes, except the
 * budget (device_memory * utilization, floored) and the concurrency ratios.
 * Invariants of a successful plan:
 *   weights + activations + kv_pool_bytes <= budget,
 *   budget - weights - activations - kv_pool_bytes < one block's bytes,
 *   kv_pool_blocks >= 1.
 */
#include "mem/plan.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kernels/dtype.h"
#include "kernels/matmul.h"
#include "mem/mem.h"

#define PLAN_ALIGN 64u

plan_config plan_config_default(void)
{
    plan_config c = {
        .device_memory = 0,
        .utilization = 0.90,
        .ctx = 0,
        .block_size = 16,
        .max_num_seqs = 64,
        .max_num_batched_tokens = 2048,
        .n_threads = 1,
        .kv_dtype = DT_F16,
    };
    return c;
}

static int in_range(int64_t v, int64_t lo, int64_t hi)
{
    return v >= lo && v <= hi;
}

int plan_model_check(const plan_model *m, kvant_err *err)
{
    static const char *fmt = "model %s = %lld out of range [%lld, %lld]";
    const struct { const char *name; int64_t v, lo, hi; } f[] = {
        { "n_layers", m->n_layers, 1, PLAN_MAX_LAYERS },
        { "n_embd", m->n_embd, 1, PLAN_MAX_DIM },
        { "n_head", m->n_head, 1, PLAN_MAX_HEADS },
        { "n_head_kv", m->n_head_kv, 1, PLAN_MAX_HEADS },
        { "head_dim", m->head_dim, 1, PLAN_MAX_HEADS },
        { "n_ff", m->n_ff, 1, PLAN_MAX_DIM },
        { "n_vocab", m->n_vocab, 1, PLAN_MAX_VOCAB },
        { "n_ctx_train", m->n_ctx_train, 1, PLAN_MAX_CTX },
        { "n_head * head_dim", (int64_t)m->n_head * m->head_dim, 1, PLAN_MAX_DIM },
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (!in_range(f[i].v, f[i].lo, f[i].hi))
            return kvant_err_set(err, KV_EINVAL, fmt, f[i].name, (long long)f[i].v,
                                 (long long)f[i].lo, (long long)f[i].hi);
    if (m->n_head % m->n_head_kv != 0)
        return kvant_err_set(err, KV_EINVAL, "model n_head %d is not a multiple of n_head_kv %d",
                             m->n_head, m->n_head_kv);
    const int kv_layers = m->n_kv_layers ? m->n_kv_layers : m->n_layers;
    if (kv_layers < 1 || kv_layers > m->n_layers ||
        (m->n_kv_total && (m->n_kv_total < kv_layers ||
                           m->n_kv_total > (int64_t)kv_layers * m->n_head_kv)))
        return kvant_err_set(err, KV_EINVAL, "model KV heads over layers %lld out of range "
                             "[%d, %lld]", (long long)m->n_kv_total, kv_layers,
                             (long long)kv_layers * m->n_head_kv);
    if (m->state_bytes > PLAN_MAX_WEIGHTS)
        return kvant_err_set(err, KV_EINVAL, "model state_bytes %llu out of range",
                             (unsigned long long)m->state_bytes);
    if (m->weights_bytes == 0 || m->weights_bytes > PLAN_MAX_WEIGHTS)
        return kvant_err_set(err, KV_EINVAL, "model weights_bytes %llu out of range [1, %llu]",
                             (unsigned long long)m->weights_bytes, PLAN_MAX_WEIGHTS);
    return KV_OK;
}

static uint64_t round_up64(uint64_t v)
{
    return (v + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN;
}

/* The workspace formula: see plan.h for the buffer list and shapes. */
uint64_t plan_activation_layout(const plan_model *m, int max_tokens, int max_seqs,
                                int n_threads, plan_act_layout *out)
{
    if (!in_range(max_tokens, 1, PLAN_MAX_BATCH_TOKENS) || !in_range(max_seqs, 1, PLAN_MAX_SEQS) ||
        !in_range(n_threads, 1, PLAN_MAX_THREADS) || plan_model_check(m, NULL) != KV_OK)
        return 0;
    const uint64_t f = sizeof(float), t = (uint64_t)max_tokens;
    const uint64_t q_dim = (uint64_t)m->n_head * (uint64_t)m->head_dim;
    const uint64_t kv_dim = (uint64_t)m->n_head_kv * (uint64_t)m->head_dim;
    plan_act_layout l;
    uint64_t off = 0;
    l.x = off;       off += round_up64(t * (uint64_t)m->n_embd * f);
    l.xn = off;      off += round_up64(t * (uint64_t)m->n_embd * f);
    l.q = off;       off += round_up64(t * q_dim * f);
    l.k = off;       off += round_up64(t * kv_dim * f);
    l.v = off;       off += round_up64(t * kv_dim * f);
    l.att = off;     off += round_up64(t * q_dim * f);
    l.gate = off;    off += round_up64(t * (uint64_t)m->n_ff * f);
    l.up = off;      off += round_up64(t * (uint64_t)m->n_ff * f);
    l.logits = off;  off += round_up64((uint64_t)max_seqs * (uint64_t)m->n_vocab * f);
    l.scratch_stride = round_up64(((uint64_t)m->n_ctx_train + (uint64_t)m->head_dim) * f);
    l.scratch = off; off += (uint64_t)n_threads * l.scratch_stride;
    l.total = off;
    if (out)
        *out = l;
    return l.total;
}

uint64_t plan_activation_bytes(const plan_model *m, int max_tokens, int max_seqs, int n_threads)
{
    return plan_activation_layout(m, max_tokens, max_seqs, n_threads, NULL);
}

uint64_t plan_act_q8_bytes(const plan_model *m, int max_tokens)
{
    int64_t w = m->n_embd > m->n_ff ? m->n_embd : m->n_ff;
    if ((int64_t)m->n_head * m->head_dim > w)
        w = (int64_t)m->n_head * m->head_dim;
    return dtype_matmul_scratch_bytes(DT_Q4_0, w, max_tokens);
}

/* Activations plus, with act_q8, the int8 copy: the fixed workspace. */
static uint64_t work_bytes(const plan_model *m, const plan_config *c, int max_tokens, int max_seqs)
{
    return plan_activation_bytes(m, max_tokens, max_seqs, c->n_threads) +
           (c->act_q8 ? plan_act_q8_bytes(m, max_tokens) : 0);
}

uint64_t plan_kv_bytes_per_token(const plan_model *m, uint32_t kv_dtype)
{
    const int64_t uniform = (int64_t)m->n_layers * m->n_head_kv;
    const uint64_t planes = m->v_in_k ? 1u : 2u;
    if (m->n_kv_total == 0 || m->n_kv_total == uniform) {
        size_t row = dtype_row_size(kv_dtype, (int64_t)m->n_head_kv * m->head_dim);
        return (uint64_t)m->n_layers * planes * (uint64_t)row;
    }
    /* per-layer heads: each layer's rows hold whole heads */
    size_t head = dtype_row_size(kv_dtype, m->head_dim);
    return (uint64_t)m->n_kv_total * planes * (uint64_t)head;
}

static int check_config(const plan_model *m, const plan_config *c, kvant_err *err)
{
    if (!(c->utilization > 0.0 && c->utilization <= 1.0)) /* also rejects NaN */
        return kvant_err_set(err, KV_EINVAL, "utilization %g must be in (0, 1]", c->utilization);
    int bs = c->block_size;
    if (bs < 8 || bs > 128 || (bs & (bs - 1)) != 0)
        return kvant_err_set(err, KV_EINVAL, "block_size %d must be a power of two in [8, 128]", bs);
    if (c->ctx < 0)
        return kvant_err_set(err, KV_EINVAL, "ctx %lld must be >= 0 (0 = the model's %lld)",
                             (long long)c->ctx, (long long)m->n_ctx_train);
    if (c->ctx > m->n_ctx_train)
        return kvant_err_set(err, KV_ERANGE, "ctx %lld exceeds the model's training context %lld",
                             (long long)c->ctx, (long long)m->n_ctx_train);
    if (!in_range(c->max_num_seqs, 1, PLAN_MAX_SEQS))
        return kvant_err_set(err, KV_EINVAL, "max_num_seqs %d out of range [1, %d]",
                             c->max_num_seqs, PLAN_MAX_SEQS);
    if (!in_range(c->max_num_batched_tokens, 1, PLAN_MAX_BATCH_TOKENS))
        return kvant_err_set(err, KV_EINVAL, "max_num_batched_tokens %d out of range [1, %d]",
                             c->max_num_batched_tokens, PLAN_MAX_BATCH_TOKENS);
    if (!in_range(c->n_threads, 1, PLAN_MAX_THREADS))
        return kvant_err_set(err, KV_EINVAL, "n_threads %d out of range [1, %d]", c->n_threads,
                             PLAN_MAX_THREADS);
    return KV_OK;
}

/* Device bytes needed so that floor(dev * u) >= need (u in (0, 1]). */
static uint64_t device_for(uint64_t need, double u)
{
    long double d = ceill((long double)need / (long double)u);
    while ((uint64_t)floorl(d * (long double)u) < need) /* guard the rounding */
        d += 1.0L;
    return d >= 18446744073709551615.0L ? UINT64_MAX : (uint64_t)d;
}

/* Refusal when weights + activations + one block exceed the budget: says
 * what device would suffice, and what batch size fits this budget. */
static int refuse_nofit(const plan_model *m, const plan_config *c, const plan_result *r,
                        uint64_t block_bytes, kvant_err *err)
{
    char b[32], w[32], a[32], dev1[32], devc[32], rs[32], rsv[96] = "";
    if (r->reserved_bytes)
        snprintf(rsv, sizeof rsv, " + a draft model's %s",
                 mem_format_size(r->reserved_bytes, rs, sizeof rs));
    uint64_t one = r->weights_bytes + r->reserved_bytes + r->activation_bytes + r->act_q8_bytes +
                   block_bytes;
    uint64_t blocks_ctx = ((uint64_t)r->ctx + (uint64_t)c->block_size - 1) / (uint64_t)c->block_size;
    uint64_t full = r->weights_bytes + r->reserved_bytes + r->activation_bytes +
                    r->act_q8_bytes + blocks_ctx * block_bytes;
    mem_format_size(r->budget, b, sizeof b);
    mem_format_size(r->weights_bytes, w, sizeof w);
    mem_format_size(r->activation_bytes, a, sizeof a);
    mem_format_size(device_for(one, c->utilization), dev1, sizeof dev1);
    mem_format_size(device_for(full, c->utilization), devc, sizeof devc);
    if (r->weights_bytes + r->reserved_bytes >= r->budget)
        return kvant_err_set(err, KV_ENOMEM,
            "model does not fit: weights %s%s exceed the budget %s (%.0f%% of device memory); "
            "a device of at least %s is needed to run at all, %s for one %lld-token sequence",
            w, rsv, b, c->utilization * 100.0, dev1, devc, (long long)r->ctx);
    /* weights fit: find the largest batch (tokens, with seqs <= tokens) that leaves a block */
    int lo = 0, hi = c->max_num_batched_tokens;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        int seqs = mid < c->max_num_seqs ? mid : c->max_num_seqs;
        uint64_t act = work_bytes(m, c, mid, seqs);
        if (r->weights_bytes + r->reserved_bytes + act + block_bytes <= r->budget)
            lo = mid;
        else
            hi = mid - 1;
    }
    char fitmsg[96] = "nothing: even one token's activations do not fit";
    if (lo > 0)
        snprintf(fitmsg, sizeof fitmsg, "max_num_batched_tokens %d (max_num_seqs <= %d)",
                 lo, lo < c->max_num_seqs ? lo : c->max_num_seqs);
    return kvant_err_set(err, KV_ENOMEM,
        "model does not fit: weights %s%s + activations %s (%d batched tokens, %d seqs) + one "
        "KV block exceed the budget %s; this budget fits %s; a device of at least %s is needed "
        "as configured, %s for one %lld-token sequence",
        w, rsv, a, c->max_num_batched_tokens, c->max_num_seqs, b, fitmsg, dev1, devc,
        (long long)r->ctx);
}

static void fill_concurrency(const plan_model *m, plan_result *r)
{
    const int64_t cand[] = { 512, 2048, 8192, r->ctx, m->n_ctx_train };
    r->n_conc = 0;
    for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++) {
        int64_t v = cand[i];
        if (v > m->n_ctx_train || v < 1)
            continue;
        int pos = 0, dup = 0;
        while (pos < r->n_conc && r->conc_ctx[pos] <= v) {
            dup |= r->conc_ctx[pos] == v;
            pos++;
        }
        if (dup || r->n_conc == PLAN_MAX_CONC)
            continue;
        memmove(&r->conc_ctx[pos + 1], &r->conc_ctx[pos], (size_t)(r->n_conc - pos) * sizeof(int64_t));
        r->conc_ctx[pos] = v;
        r->n_conc++;
    }
    for (int i = 0; i < r->n_conc; i++) {
        r->conc[i] = (double)r->kv_pool_tokens / (double)r->conc_ctx[i];
        if (r->window > 0) { /* the window group bounds it too */
            double w = (double)(r->kv_window_blocks - r->kv_window_margin) /
                       (double)plan_window_blocks(r->window, r->conc_ctx[i], r->block_size);
            r->conc[i] = w < r->conc[i] ? (w > 0 ? w : 0) : r->conc[i];
        }
    }
}

int64_t plan_window_blocks(int64_t window, int64_t ctx, int block_size)
{
    const int64_t full = (ctx + block_size - 1) / block_size;
    const int64_t w = (window + block_size - 1) / block_size + 1;
    return w < full ? w : full;
}

/* The split of the KV bytes between the global and the window group
 * (c->kv_window > 0): the window group gets every sequence's bounded
 * share at the concurrency the budget allows at ctx, plus a margin for
 * one step's new tokens; the global group the rest. */
static void plan_window_split(const plan_config *c, plan_result *r, uint64_t avail)
{
    const uint64_t gbb = r->kv_bytes_per_token * (uint64_t)c->block_size;
    const uint64_t wbb = r->kv_window_bytes_per_token * (uint64_t)c->block_size;
    const int64_t gps = (r->ctx + c->block_size - 1) / c->block_size;
    const int64_t wps = plan_window_blocks(c->kv_window, r->ctx, c->block_size);
    r->kv_window_margin = (c->max_num_batched_tokens + c->block_size - 1) / c->block_size +
                          c->max_num_seqs;
    const uint64_t margin = (uint64_t)r->kv_window_margin * wbb;
    const uint64_t per_seq = (uint64_t)gps * gbb + (uint64_t)wps * wbb;
    int64_t conc = avail > margin ? (int64_t)((avail - margin) / per_seq) : 0;
    r->kv_window_blocks = (conc > 0 ? conc : 1) * wps + r->kv_window_margin;
    if ((uint64_t)r->kv_window_blocks * wbb + gbb > avail) /* leave one global block */
        r->kv_window_blocks = (int64_t)((avail - gbb) / wbb); /* >= 1: checked by the caller */
    r->kv_pool_blocks = (int64_t)((avail - (uint64_t)r->kv_window_blocks * wbb) / gbb);
    r->kv_window_bytes = (uint64_t)r->kv_window_blocks * wbb;
    r->kv_seq_bytes = per_seq;
    r->fits_one_max_ctx = r->kv_pool_blocks >= gps &&
                          r->kv_window_blocks >= wps + r->kv_window_margin;
}

uint64_t plan_budget(uint64_t device_memory, double utilization)
{
    long double bud = floorl((long double)device_memory * (long double)utilization);
    return bud >= 18446744073709551615.0L ? UINT64_MAX : (uint64_t)bud;
}

/* The KV bytes a host-memory pool may use (kv_fit): PLAN_KV_FIT_SHARE times
 * max_num_seqs requests of ctx, plus the window group's step margin. */
static uint64_t fit_demand(const plan_config *c, const plan_result *r, uint64_t gbb,
                           uint64_t wbb, int64_t need_blocks)
{
    uint64_t per_seq = (uint64_t)need_blocks * gbb, margin = 0;
    if (r->window > 0) {
        per_seq += (uint64_t)plan_window_blocks(c->kv_window, r->ctx, c->block_size) * wbb;
        margin = (uint64_t)((c->max_num_batched_tokens + c->block_size - 1) / c->block_size +
                            c->max_num_seqs) * wbb;
    }
    return (uint64_t)PLAN_KV_FIT_SHARE * (uint64_t)c->max_num_seqs * per_seq + margin;
}

/* The plan at the context c->ctx (plan_compute without the search). */
static int plan_one(const plan_model *m, const plan_config *c, plan_result *out, kvant_err *err)
{
    plan_result *r = out;
    memset(r, 0, sizeof *r);
    int rc = plan_model_check(m, err);
    if (rc != KV_OK)
        return rc;
    if ((rc = check_config(m, c, err)) != KV_OK)
        return rc;
    r->device_memory = c->device_memory;
    r->utilization = c->utilization;
    r->ctx = c->ctx ? c->ctx : m->n_ctx_train;
    r->block_size = c->block_size;
    r->max_num_seqs = c->max_num_seqs;
    r->kv_dtype = c->kv_dtype;
    r->budget = plan_budget(c->device_memory, c->utilization);
    r->weights_bytes = m->weights_bytes;
    r->kv_bytes_per_token = plan_kv_bytes_per_token(m, c->kv_dtype);
    const int64_t heads = m->n_kv_total ? m->n_kv_total : (int64_t)m->n_layers * m->n_head_kv;
    if (c->kv_window < 0 || c->kv_window > PLAN_MAX_CTX ||
        (c->kv_window > 0 && (c->kv_window_heads < 1 || c->kv_window_heads >= heads)))
        return kvant_err_set(err, KV_EINVAL, "kv_window %lld over %lld of %lld KV heads: the "
                             "window group needs some but not all layers",
                             (long long)c->kv_window, (long long)c->kv_window_heads,
                             (long long)heads);
    if (c->kv_window > 0 && r->kv_bytes_per_token) {
        r->window = c->kv_window;
        r->kv_window_bytes_per_token = (uint64_t)c->kv_window_heads * 2u *
                                       (uint64_t)dtype_row_size(c->kv_dtype, m->head_dim);
        r->kv_bytes_per_token -= r->kv_window_bytes_per_token;
    }
    if (r->kv_bytes_per_token == 0) {
        const dtype_traits *tr = dtype_get(c->kv_dtype);
        return kvant_err_set(err, KV_EUNSUP, "kv_dtype %s cannot store K/V rows of %d elements "
                             "(n_head_kv %d * head_dim %d)", tr ? tr->name : "(unknown)",
                             m->n_head_kv * m->head_dim, m->n_head_kv, m->head_dim);
    }
    r->activation_bytes = plan_activation_bytes(m, c->max_num_batched_tokens, c->max_num_seqs,
                                                c->n_threads);
    uint64_t block_bytes = r->kv_bytes_per_token * (uint64_t)c->block_size;
    r->act_q8_bytes = c->act_q8 ? plan_act_q8_bytes(m, c->max_num_batched_tokens) : 0;
    r->reserved_bytes = c->reserved_bytes;
    r->state_slots = c->state_slots > 0 ? c->state_slots : 0;
    r->state_slot_bytes = r->state_slots ? m->state_bytes : 0;
    r->state_bytes = m->state_bytes * (uint64_t)r->state_slots;
    uint64_t fixed = r->weights_bytes + r->activation_bytes + r->act_q8_bytes + r->reserved_bytes +
                     r->state_bytes;
    const uint64_t wbb = r->kv_window_bytes_per_token * (uint64_t)c->block_size;
    if (fixed >= r->budget || r->budget - fixed < block_bytes + wbb)
        return refuse_nofit(m, c, r, block_bytes + wbb, err);

    int64_t need_blocks = (r->ctx + c->block_size - 1) / c->block_size;
    uint64_t avail = r->budget - fixed;
    if (c->kv_fit) { /* what the sequences and the prefix cache can use, not all RAM */
        const uint64_t demand = fit_demand(c, r, block_bytes, wbb, need_blocks);
        r->kv_fit = 1;
        avail = demand < avail ? demand : avail;
    }
    if (r->window > 0) {
        plan_window_split(c, r, avail);
    } else {
        r->kv_pool_blocks = (int64_t)(avail / block_bytes);
        r->kv_seq_bytes = (uint64_t)need_blocks * block_bytes;
        r->fits_one_max_ctx = r->kv_pool_blocks >= need_blocks;
    }
    r->kv_start_blocks = r->kv_pool_blocks;
    if (c->kv_fit && c->kv_grow && r->window == 0) {
        int64_t start = (int64_t)((c->kv_start_bytes ? c->kv_start_bytes : PLAN_KV_FIT_START) /
                                  block_bytes);
        start = start > need_blocks ? start : need_blocks;
        r->kv_start_blocks = start < r->kv_pool_blocks ? start : r->kv_pool_blocks;
    }
    r->kv_start_bytes = (uint64_t)r->kv_start_blocks * block_bytes + r->kv_window_bytes;
    r->kv_pool_tokens = (uint64_t)r->kv_pool_blocks * (uint64_t)c->block_size;
    r->kv_pool_bytes = (uint64_t)r->kv_pool_blocks * block_bytes + r->kv_window_bytes;
    r->max_ctx_that_fits = (int64_t)r->kv_pool_tokens < m->n_ctx_train ? (int64_t)r->kv_pool_tokens
                                                                        : m->n_ctx_train;
    const uint64_t need = fixed + r->kv_seq_bytes + (r->window ? (uint64_t)r->kv_window_margin * wbb : 0);
    r->missing_bytes = r->fits_one_max_ctx || need <= r->budget ? 0 : need - r->budget;
    fill_concurrency(m, r);
    return KV_OK;
}

/* The largest context in [0, hi) one request of which fits with a block to
 * spare (0: none); fitting is monotone in the context. */
static int64_t largest_ctx(const plan_model *m, const plan_config *c, int64_t hi)
{
    plan_config c2 = *c;
    plan_result t;
    int64_t lo = 0;
    while (lo + 1 < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        c2.ctx = mid;
        /* one block to spare: the backend's scratch beside the blocks (kv_extra_bytes) */
        if (plan_one(m, &c2, &t, NULL) == KV_OK && t.fits_one_max_ctx &&
            t.kv_pool_blocks >= (mid + c->block_size - 1) / c->block_size + 1)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

int plan_compute(const plan_model *m, const plan_config *c, plan_result *out, kvant_err *err)
{
    int rc = plan_one(m, c, out, err);
    if (rc || out->fits_one_max_ctx)
        return rc;
    const int64_t best = largest_ctx(m, c, out->ctx);
    if (c->fit_ctx && c->ctx == 0 && best > 0) { /* vLLM's --max-model-len auto */
        plan_config c2 = *c;
        c2.ctx = best;
        rc = plan_one(m, &c2, out, err);
        out->ctx_auto = 1;
    }
    out->max_ctx_that_fits = best;
    return rc;
}

/* The bytes besides the weights of one request of ctx tokens: workspace,
 * its KV (with a window group's step margin) and 1/64 of the budget for
 * the backend's scratch beside the blocks; *budget gets the budget. */
static uint64_t fit_need(const plan_model *m, const plan_config *c, int64_t ctx, uint64_t *budget)
{
    plan_model m1 = *m;
    plan_config c2 = *c;
    plan_result r;
    m1.weights_bytes = 1;
    c2.fit_ctx = 0;
    c2.ctx = ctx;
    if (plan_one(&m1, &c2, &r, NULL) != KV_OK)
        return UINT64_MAX;
    *budget = r.budget;
    const uint64_t wbb = r.kv_window_bytes_per_token * (uint64_t)c->block_size;
    return r.activation_bytes + r.act_q8_bytes + r.kv_seq_bytes +
           (uint64_t)r.kv_window_margin * wbb + r.budget / 64;
}

int plan_fit_weights(const plan_model *m, const plan_config *c, uint64_t *cap)
{
    *cap = 0;
    const int64_t train = m->n_ctx_train;
    const int64_t small = c->ctx ? c->ctx : (train < PLAN_FIT_MIN_CTX ? train : PLAN_FIT_MIN_CTX);
    const int64_t room = c->ctx ? c->ctx : (train < PLAN_FIT_KV_CTX ? train : PLAN_FIT_KV_CTX);
    uint64_t budget = 0;
    if (plan_model_check(m, NULL) != KV_OK)
        return 0;
    const uint64_t need_small = fit_need(m, c, small, &budget);
    if (need_small == UINT64_MAX) /* not even the workspace fits (or a bad config) */
        return 1;
    if (m->weights_bytes <= budget && need_small <= budget - m->weights_bytes)
        return 0; /* fits with a short request: the context, not the weights, gives way */
    uint64_t need = fit_need(m, c, room, &budget);
    if (need > budget / 4 && need_small < need) /* room for a long context costs too much */
        need = need_small;
    if (need < budget)
        *cap = budget - need;
    return 1;
}

static json_t *u64j(uint64_t v)
{
    return json_integer(v > (uint64_t)INT64_MAX ? INT64_MAX : (json_int_t)v);
}

const char *plan_state_line(const plan_result *r, int n_live, char *buf, size_t n)
{
    char a[32], b[32];
    if (!r->state_slots)
        return NULL;
    snprintf(buf, n, "recurrent state %s: %d slots of %s (%d for running sequences, %d for "
             "the prefix cache's snapshots)", mem_format_size(r->state_bytes, a, sizeof a),
             r->state_slots, mem_format_size(r->state_slot_bytes, b, sizeof b), n_live,
             r->state_slots - n_live);
    return buf;
}

char *plan_result_json(const plan_result *r, const plan_model *m)
{
    json_t *o = json_object();
    const dtype_traits *tr = dtype_get(r->kv_dtype);
    json_object_set_new(o, "budget", u64j(r->budget));
    json_object_set_new(o, "device_memory", u64j(r->device_memory));
    json_object_set_new(o, "utilization", json_real(r->utilization));
    json_object_set_new(o, "weights_bytes", u64j(r->weights_bytes));
    json_object_set_new(o, "reserved_bytes", u64j(r->reserved_bytes));
    json_object_set_new(o, "activation_bytes", u64j(r->activation_bytes));
    json_object_set_new(o, "act_q8_bytes", u64j(r->act_q8_bytes));
    json_object_set_new(o, "kv_dtype", json_string(tr && tr->name ? tr->name : "unknown"));
    json_object_set_new(o, "kv_bytes_per_token", u64j(r->kv_bytes_per_token));
    json_object_set_new(o, "kv_seq_bytes", u64j(r->kv_seq_bytes));
    if (r->window > 0) {
        json_object_set_new(o, "kv_window", json_pack("{s:I, s:I, s:I, s:I, s:I}", "window",
                                                      (json_int_t)r->window, "bytes_per_token",
                                                      (json_int_t)r->kv_window_bytes_per_token,
                                                      "blocks", (json_int_t)r->kv_window_blocks,
                                                      "margin_blocks",
                                                      (json_int_t)r->kv_window_margin, "bytes",
                                                      (json_int_t)r->kv_window_bytes));
    }
    json_object_set_new(o, "block_size", json_integer(r->block_size));
    json_object_set_new(o, "max_num_seqs", json_integer(r->max_num_seqs));
    json_object_set_new(o, "kv_pool_blocks", json_integer(r->kv_pool_blocks));
    json_object_set_new(o, "kv_pool_tokens", u64j(r->kv_pool_tokens));
    json_object_set_new(o, "kv_pool_bytes", u64j(r->kv_pool_bytes));
    json_object_set_new(o, "state_bytes", u64j(r->state_bytes));
    json_object_set_new(o, "state_slot_bytes", u64j(r->state_slot_bytes));
    json_object_set_new(o, "state_slots", json_integer(r->state_slots));
    json_object_set_new(o, "kv_start_blocks", json_integer(r->kv_start_blocks));
    json_object_set_new(o, "kv_start_bytes", u64j(r->kv_start_bytes));
    json_object_set_new(o, "kv_fit", json_boolean(r->kv_fit));
    json_object_set_new(o, "ctx", json_integer(r->ctx));
    json_object_set_new(o, "ctx_auto", json_boolean(r->ctx_auto));
    json_object_set_new(o, "fits", json_boolean(r->fits_one_max_ctx));
    json_object_set_new(o, "max_ctx_that_fits", json_integer(r->max_ctx_that_fits));
    json_object_set_new(o, "missing_bytes", u64j(r->missing_bytes));
    json_t *conc = json_object();
    for (int i = 0; i < r->n_conc && i < PLAN_MAX_CONC; i++) {
        char key[24];
        snprintf(key, sizeof key, "%lld", (long long)r->conc_ctx[i]);
        json_object_set_new(conc, key, json_real(r->conc[i]));
    }
    json_object_set_new(o, "max_concurrency", conc);
    if (m) {
        json_t *mo = json_object();
        json_object_set_new(mo, "n_layers", json_integer(m->n_layers));
        json_object_set_new(mo, "n_embd", json_integer(m->n_embd));
        json_object_set_new(mo, "n_head", json_integer(m->n_head));
        json_object_set_new(mo, "n_head_kv", json_integer(m->n_head_kv));
        json_object_set_new(mo, "kv_heads_total",
                            json_integer(m->n_kv_total ? m->n_kv_total
                                                       : (int64_t)m->n_layers * m->n_head_kv));
        json_object_set_new(mo, "head_dim", json_integer(m->head_dim));
        json_object_set_new(mo, "n_ff", json_integer(m->n_ff));
        json_object_set_new(mo, "n_vocab", json_integer(m->n_vocab));
        json_object_set_new(mo, "n_ctx_train", json_integer(m->n_ctx_train));
        json_object_set_new(mo, "weights_bytes", u64j(m->weights_bytes));
        json_object_set_new(o, "model", mo);
    }
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
    json_decref(o);
    return s;
}
