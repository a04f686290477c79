/* forward.c - one forward pass of a decoder over a batch, composed from the
 * model's layer recipe (model/model_arch.h).
 *
 *   x = embed(tokens) (* sqrt(n_embd): recipe emb_scale)
 *   per layer:  h = rmsnorm(x) ; q,k,v = h W{q,k,v} (+b)
 *               (q,k = per-head rmsnorm: qk_norm) ; rope(q,k) with the layer's base/scale
 *               store k,v in the paged cache ; a = attention(q) (scale, soft-cap, window)
 *               a = a Wo (+bo) (; a = rmsnorm(a): post_norms) ; x += a
 *               h = rmsnorm(x) ; f = (act(h Wg) * h Wu) Wd (+bd), act silu or gelu_tanh
 *               (or experts: f = sum over the router's top k of w_k expert_k(h), backend moe_ffn)
 *               (; f = rmsnorm(f): post_norms) ; x += f
 *   logits = rmsnorm(x[out]) Wout (; soft-capped: final_softcap)
 */
#include "forward/forward.h"

#include <string.h>
#include <time.h>

#include "kernels/dtype.h"
#include "kernels/hadamard.h"
#include "mem/plan.h"
#include "model/wstream.h"
#include "par/tp.h"

static plan_model plan_shape(const model_hparams *hp)
{
    plan_model pm;
    model_plan_shape(hp, 1, &pm); /* the workspace does not depend on the weights' bytes */
    return pm;
}

uint64_t fwd_workspace_bytes(const model_hparams *hp, int64_t max_tokens, int64_t max_out)
{
    plan_model pm = plan_shape(hp);
    return plan_activation_bytes(&pm, (int)max_tokens, (int)max_out, 1);
}

void fwd_free(fwd_ctx *f)
{
    if (!f || !f->be)
        return;
    f->be->ops->free(f->be, f->d_base);
    f->d_base = NULL;
    if (f->kv.n_blocks)
        f->be->ops->kv_free(f->be);
    if (f->kv.n_state_slots)
        f->be->ops->state_free(f->be);
    f->kv.n_blocks = 0;
    f->kv.n_state_slots = 0;
}

void fwd_set_tp(fwd_ctx *f, tp_ctx *t)
{
    f->tp = t;
}

kv_layout fwd_kv_layout(const model *m, int32_t n_blocks, int32_t block_size, uint32_t kv_dtype)
{
    kv_layout lay = {
        .n_layers = m->hp.n_layers,
        .n_blocks = n_blocks,
        .block_size = block_size,
        .n_kv_heads = m->hp.n_head_kv,
        .head_dim = m->hp.head_dim,
        .dtype = kv_dtype,
        .v_in_k = m->hp.fam.mla,
        .n_state_slots = model_is_hybrid(m) ? 1 : 0,
    };
    for (int32_t il = 0; il < m->hp.n_layers && il < MODEL_MAX_LAYERS; il++) {
        lay.layer_kv_heads[il] = m->layers[il].n_head_kv ? m->layers[il].n_head_kv
                                                         : KV_LAYOUT_NO_KV; /* recurrent, MLP */
        lay.layer_window[il] = m->layers[il].window > 0;
    }
    return lay;
}

int fwd_init(fwd_ctx *f, model *m, backend *be, int32_t max_tokens, int32_t max_out,
             const kv_layout *kv, kvant_err *err)
{
    memset(f, 0, sizeof *f);
    if (max_tokens < 1 || max_out < 1 || max_out > max_tokens)
        return kvant_err_set(err, KV_EINVAL, "batch shape: %d tokens, %d outputs", max_tokens,
                             max_out);
    if (model_has_experts(m) && !be->ops->moe_ffn)
        return kvant_err_set(err, KV_EUNSUP, "backend %s: mixture-of-experts models (%s."
                             "expert_count %u) are not supported", be->ops->name,
                             m->hp.recipe->arch, m->hp.fam.n_expert);
    if (m->hp.fam.mla && (!be->ops->mla_qk || !be->ops->mla_v))
        return kvant_err_set(err, KV_EUNSUP, "backend %s: latent-attention models (%s) are not "
                             "supported", be->ops->name, m->hp.recipe->arch);
    if (m->hp.fam.mla && kv->rotate) /* run_attn_mla stores the latent row as it is */
        return kvant_err_set(err, KV_EUNSUP, "--kv-rotate: not for latent-attention models (%s)",
                             m->hp.recipe->arch);
    if (model_is_hybrid(m) && (!be->ops->state_init || !be->ops->recr_mix))
        return kvant_err_set(err, KV_EUNSUP, "backend %s: hybrid models with recurrent layers "
                             "(%s) are not supported", be->ops->name, m->hp.recipe->arch);
    if (m->hp.recipe->attn_gate && !be->ops->attn_gate)
        return kvant_err_set(err, KV_EUNSUP, "backend %s: gated attention (%s) is not supported",
                             be->ops->name, m->hp.recipe->arch);
    if (m->hp.fam.recr == RECR_GDN &&
        (int64_t)m->hp.fam.ssm_n_head > (int64_t)m->hp.n_head * m->hp.head_dim)
        return kvant_err_set(err, KV_EUNSUP, "%s: %u value heads do not fit the query buffer",
                             m->hp.recipe->arch, m->hp.fam.ssm_n_head);
    if (m->hp.recipe->act == FFN_RELU_SQR && !be->ops->relu_sqr)
        return kvant_err_set(err, KV_EUNSUP, "backend %s: relu^2 MLPs (%s) are not supported",
                             be->ops->name, m->hp.recipe->arch);
    if (model_is_hybrid(m) && kv->n_state_slots < 1)
        return kvant_err_set(err, KV_EINVAL, "%s: a hybrid model needs recurrent-state slots",
                             m->hp.recipe->arch);
    if (kv->rotate && (!be->ops->hadamard || !hadamard_ok(m->hp.head_dim)))
        return kvant_err_set(err, KV_EUNSUP, "--kv-rotate: %s", !be->ops->hadamard
                             ? "not implemented on this backend"
                             : "needs a power-of-two head_dim");
    f->m = m;
    f->be = be;
    f->max_tokens = max_tokens;
    f->max_out = max_out;
    plan_model pm = plan_shape(&m->hp);
    plan_act_layout lay;
    uint64_t total = plan_activation_layout(&pm, max_tokens, max_out, 1, &lay);
    if (total == 0)
        return kvant_err_set(err, KV_EINVAL, "batch shape %d x %d outside the planner's limits",
                             max_tokens, max_out);
    f->d_base = be->ops->alloc(be, total, MEM_ACTIVATIONS, MEM_NO_LAYER, err);
    if (!f->d_base)
        return KV_ENOMEM;
    char *base = f->d_base;
    f->d_x = (float *)(base + lay.x);
    f->d_h = (float *)(base + lay.xn);
    f->d_q = (float *)(base + lay.q);
    f->d_k = (float *)(base + lay.k);
    f->d_v = (float *)(base + lay.v);
    f->d_att = (float *)(base + lay.att);
    f->d_gate = (float *)(base + lay.gate);
    f->d_up = (float *)(base + lay.up);
    f->d_logits = (float *)(base + lay.logits);
    kv_layout kl = *kv;
    kl.max_tokens = max_tokens;
    int rc = be->ops->kv_init(be, &kl, err);
    if (rc) {
        fwd_free(f);
        return rc;
    }
    f->kv = *kv;
    f->kv.n_state_slots = 0;
    if (model_is_hybrid(m) && (rc = be->ops->state_init(be, kv->n_state_slots, err))) {
        fwd_free(f);
        return rc;
    }
    f->kv.n_state_slots = model_is_hybrid(m) ? kv->n_state_slots : 0;
    for (int32_t il = 0; il < m->hp.n_layers; il++)
        f->max_window = m->layers[il].window > f->max_window ? m->layers[il].window : f->max_window;
    f->rope = (rope_params){
        .kind = m->hp.rope,
        .n_rot = m->hp.rope_dim,
        .base = m->hp.rope_base,
        .freq_scale = m->hp.rope_freq_scale,
        .d_freq_factors = m->rope_freqs.dev,
        .mscale = m->hp.fam.rope_attn_factor,
        .ext_factor = m->hp.fam.yarn ? 1.0f : 0.0f,
        .corr_lo = m->hp.fam.yarn_corr[0],
        .corr_hi = m->hp.fam.yarn_corr[1],
    };
    return KV_OK;
}

/* The window group's table covers position p and every block of its
 * window (a dropped block there would be read: refused, never served).
 * Dropped entries are a leading run, so the window's first block is
 * enough. */
static int check_window(const fwd_ctx *f, const fwd_seq *s, int32_t p, int32_t block_size,
                        kvant_err *err)
{
    const int32_t w = f->max_window;
    const int32_t p0 = w > 0 && p >= w ? p - w + 1 : 0;
    if (!s->block_table_w || p / block_size >= s->n_blocks_w)
        return kvant_err_set(err, KV_EINVAL, "position %d not covered by %d window-group blocks",
                             p, s->n_blocks_w);
    if (s->block_table_w[p0 / block_size] < 0 || s->block_table_w[p / block_size] < 0)
        return kvant_err_set(err, KV_EINVAL, "position %d: a window-group block of its window "
                             "was dropped", p);
    return KV_OK;
}

/* Hybrid models: each sequence's state slot and snapshot slots exist, and
 * no two sequences of the batch share a slot. */
static int check_state(const fwd_ctx *f, const fwd_batch *b, kvant_err *err)
{
    const int32_t n = f->kv.n_state_slots;
    for (int32_t i = 0; i < b->n_seqs; i++) {
        const fwd_seq *s = &b->seqs[i];
        if (s->state_slot < 0 || s->state_slot >= n)
            return kvant_err_set(err, KV_EINVAL, "sequence %d: state slot %d out of range [0, %d)",
                                 i, s->state_slot, n);
        for (int32_t j = 0; j < i; j++)
            if (b->seqs[j].state_slot == s->state_slot)
                return kvant_err_set(err, KV_EINVAL, "sequences %d and %d share state slot %d",
                                     j, i, s->state_slot);
        for (int32_t j = 0; j < s->n_state_snap; j++) {
            const int32_t p = s->state_snap[2 * j], slot = s->state_snap[2 * j + 1];
            if (slot < 0 || slot >= n || slot == s->state_slot || p < 1)
                return kvant_err_set(err, KV_EINVAL, "sequence %d: state snapshot (%d, %d) "
                                     "invalid", i, p, slot);
        }
    }
    return KV_OK;
}

static int check_batch(const fwd_ctx *f, const fwd_batch *b, int32_t block_size, kvant_err *err)
{
    int rc;
    if (b->n_tokens < 1 || b->n_tokens > f->max_tokens)
        return kvant_err_set(err, KV_EINVAL, "batch of %d tokens (limit %d)", b->n_tokens,
                             f->max_tokens);
    if (b->n_out < 0 || b->n_out > f->max_out)
        return kvant_err_set(err, KV_EINVAL, "batch wants %d logit rows (limit %d)", b->n_out,
                             f->max_out);
    for (int32_t t = 0; t < b->n_tokens; t++) {
        if (b->tokens[t] < 0 || b->tokens[t] >= f->m->hp.n_vocab)
            return kvant_err_set(err, KV_ERANGE, "token id %d out of range [0, %d)",
                                 b->tokens[t], f->m->hp.n_vocab);
        if (b->seq[t] < 0 || b->seq[t] >= b->n_seqs)
            return kvant_err_set(err, KV_EINVAL, "token %d: sequence %d out of range", t,
                                 b->seq[t]);
        const fwd_seq *s = &b->seqs[b->seq[t]];
        if (b->pos[t] < 0 || b->pos[t] / block_size >= s->n_blocks)
            return kvant_err_set(err, KV_EINVAL, "token %d: position %d not covered by %d blocks",
                                 t, b->pos[t], s->n_blocks);
        if (f->kv.n_blocks_w > 0 && (rc = check_window(f, s, b->pos[t], block_size, err)))
            return rc;
    }
    for (int32_t j = 0; j < b->n_out; j++)
        if (b->out[j] < 0 || b->out[j] >= b->n_tokens)
            return kvant_err_set(err, KV_EINVAL, "output row %d refers to token %d", j, b->out[j]);
    return f->kv.n_state_slots ? check_state(f, b, err) : KV_OK;
}

/* W[i] d_x into d_y[i], i < count, as one backend job where it has one. */
static void matmuls(fwd_ctx *f, int count, const model_tensor *const *W,
                    const model_tensor *const *bias, const float *d_x, float *const *d_y,
                    int32_t n)
{
    const backend_ops *op = f->be->ops;
    if (op->matmul_n) {
        op->matmul_n(f->be, count, W, bias, d_x, d_y, n);
        return;
    }
    for (int i = 0; i < count; i++)
        op->matmul(f->be, W[i], bias[i], d_x, d_y[i], n);
}

/* Tensor parallelism: this rank's partial sums of d_y, added over ranks. */
static int reduce(fwd_ctx *f, float *d_y, int64_t count, kvant_err *err)
{
    return f->tp ? tp_allreduce(f->tp, d_y, count, err) : KV_OK;
}

/* Latent attention (deepseek2), absorbed: the cache row is the normed latent
 * and the roped key part; each query head is absorbed into the latent space
 * (mla_qk), attends as one of n_head heads over one KV head of C + R values
 * whose V is the K row itself, and its latent output goes through wv_b
 * (mla_v).  Buffers: q in d_q, kv_a in d_k, queries in d_att, the attention
 * output in d_q, the heads' values in d_att (q_a in d_gate). */
static int run_attn_mla(fwd_ctx *f, int32_t il, int32_t n, kvant_err *err)
{
    const backend_ops *op = f->be->ops;
    backend *be = f->be;
    const model_hparams *hp = &f->m->hp;
    const model_layer *L = &f->m->layers[il];
    const model_tensor *none[2] = {NULL, NULL};
    const model_tensor *qkv[2] = {L->wq_a.dev ? &L->wq_a : &L->wq, &L->wkv_a};
    float *qkv_y[2] = {L->wq_a.dev ? f->d_gate : f->d_q, f->d_k};
    matmuls(f, 2, qkv, none, f->d_h, qkv_y, n);
    if (L->wq_a.dev) {
        op->rmsnorm(be, f->d_gate, &L->q_a_norm, hp->rms_eps, f->d_gate, n);
        op->matmul(be, &L->wq_b, NULL, f->d_gate, f->d_q, n);
    }
    rope_params rp = f->rope;
    rp.base = L->rope_base;
    rp.freq_scale = L->rope_scale;
    int rc = op->mla_qk(be, L, &rp, hp->rms_eps, f->d_q, f->d_k, f->d_att, n, err);
    if (rc)
        return rc;
    op->kv_store(be, il, f->d_k, f->d_k);
    const attn_params ap = {hp->fam.q_scale, hp->fam.attn_softcap, L->window, NULL};
    op->attention(be, il, f->d_att, L->n_head, &ap, f->d_q);
    if ((rc = op->mla_v(be, L, f->d_q, f->d_att, n, err)))
        return rc;
    op->matmul(be, &L->wo, NULL, f->d_att, f->d_h, n);
    op->add(be, f->d_x, f->d_h, (int64_t)n * hp->n_embd);
    return KV_OK;
}

/* d_x += residual_scale * d_h (granite's scale on each branch). */
static void residual(fwd_ctx *f, int32_t n)
{
    const model_hparams *hp = &f->m->hp;
    if (hp->fam.residual_scale != 1.0f)
        f->be->ops->scale(f->be, f->d_h, hp->fam.residual_scale, (int64_t)n * hp->n_embd);
    f->be->ops->add(f->be, f->d_x, f->d_h, (int64_t)n * hp->n_embd);
}

/* A recurrent layer's mixing half (hybrid models): in-projection into d_gate,
 * the backend's recurrent mix into d_up, out-projection; d_x += it. */
static int run_recr(fwd_ctx *f, int32_t il, int32_t n, kvant_err *err)
{
    const backend_ops *op = f->be->ops;
    backend *be = f->be;
    const model_layer *L = &f->m->layers[il];
    float *in[3] = {f->d_gate, f->d_q, f->d_att};
    if (L->recr == RECR_GDN) { /* q | k | v and z; the beta and alpha logits */
        const model_tensor *w[2] = {&L->ssm_in, &L->ssm_z}, *w2[2] = {&L->ssm_beta, &L->ssm_alpha};
        const model_tensor *nb[2] = {NULL, NULL};
        float *y[2] = {f->d_gate, f->d_up}, *y2[2] = {f->d_q, f->d_att};
        matmuls(f, 2, w, nb, f->d_h, y, n);
        matmuls(f, 2, w2, nb, f->d_h, y2, n);
    } else {
        op->matmul(be, &L->ssm_in, NULL, f->d_h, f->d_gate, n);
    }
    int rc = op->recr_mix(be, il, L, f->m->hp.rms_eps, in, f->d_up, n, err);
    if (rc)
        return rc;
    op->matmul(be, &L->ssm_out, NULL, f->d_up, f->d_h, n);
    residual(f, n);
    return KV_OK;
}

/* Attention half of layer il: d_x += post_norm(attention(...) Wo). */
static int run_attn(fwd_ctx *f, int32_t il, int32_t n, kvant_err *err)
{
    const backend_ops *op = f->be->ops;
    backend *be = f->be;
    const model_hparams *hp = &f->m->hp;
    const model_layer *L = &f->m->layers[il];
    op->rmsnorm(be, f->d_x, &L->attn_norm, hp->rms_eps, f->d_h, n);
    if (L->recr)
        return run_recr(f, il, n, err);
    if (hp->fam.mla)
        return run_attn_mla(f, il, n, err);
    const model_tensor *qkv[3] = {&L->wq, &L->wk, &L->wv};
    const model_tensor *qkv_b[3] = {L->bq.dev ? &L->bq : NULL, L->bk.dev ? &L->bk : NULL,
                                    L->bv.dev ? &L->bv : NULL};
    const int gated = hp->recipe->attn_gate; /* q rows [q | gate] per head, into d_gate */
    float *qkv_y[3] = {gated ? f->d_gate : f->d_q, f->d_k, f->d_v};
    matmuls(f, 3, qkv, qkv_b, f->d_h, qkv_y, n);
    if (gated)
        op->attn_gate(be, 0, f->d_gate, f->d_q, L->n_head, hp->head_dim);
    if (L->q_norm.dev) { /* per head (rows of head_dim) or per token (qk_norm_full) */
        op->rmsnorm(be, f->d_q, &L->q_norm, hp->rms_eps, f->d_q,
                    (int32_t)((int64_t)n * L->n_head * hp->head_dim / L->q_norm.ne[0]));
        op->rmsnorm(be, f->d_k, &L->k_norm, hp->rms_eps, f->d_k,
                    (int32_t)((int64_t)n * L->n_head_kv * hp->head_dim / L->k_norm.ne[0]));
    }
    rope_params rp = f->rope;
    rp.base = L->rope_base;
    rp.freq_scale = L->rope_scale;
    if (!hp->fam.no_rope) {
        op->rope(be, f->d_q, L->n_head, hp->head_dim, &rp);
        op->rope(be, f->d_k, L->n_head_kv, hp->head_dim, &rp);
    }
    if (f->kv.rotate) { /* q.k unchanged; attention then sums rotated values */
        op->hadamard(be, f->d_q, L->n_head, hp->head_dim);
        op->hadamard(be, f->d_k, L->n_head_kv, hp->head_dim);
        op->hadamard(be, f->d_v, L->n_head_kv, hp->head_dim);
    }
    op->kv_store(be, il, f->d_k, f->d_v);
    const attn_params ap = {hp->fam.q_scale, hp->fam.attn_softcap, L->window, L->attn_sinks.dev};
    op->attention(be, il, f->d_q, L->n_head, &ap, f->d_att);
    if (op->kv_score) /* a KV budget's scores, snapkv/h2o (no-op without) */
        op->kv_score(be, il, f->d_q, L->n_head, &ap);
    if (f->kv.rotate) /* H is its own inverse */
        op->hadamard(be, f->d_att, L->n_head, hp->head_dim);
    if (gated)
        op->attn_gate(be, 1, f->d_gate, f->d_att, L->n_head, hp->head_dim);
    op->matmul(be, &L->wo, L->bo.dev ? &L->bo : NULL, f->d_att, f->d_h, n);
    int rc = reduce(f, f->d_h, (int64_t)n * hp->n_embd, err);
    if (rc)
        return rc;
    if (L->post_attn_norm.dev)
        op->rmsnorm(be, f->d_h, &L->post_attn_norm, hp->rms_eps, f->d_h, n);
    residual(f, n);
    return KV_OK;
}

/* The FFN's down-projection of d_gate, reduced, post-normed, added to d_x. */
static int ffn_down(fwd_ctx *f, const model_layer *L, int32_t n, kvant_err *err)
{
    const backend_ops *op = f->be->ops;
    const model_hparams *hp = &f->m->hp;
    op->matmul(f->be, &L->w_down, L->b_down.dev ? &L->b_down : NULL, f->d_gate, f->d_h, n);
    int rc = reduce(f, f->d_h, (int64_t)n * hp->n_embd, err);
    if (rc)
        return rc;
    if (L->post_ffn_norm.dev)
        op->rmsnorm(f->be, f->d_h, &L->post_ffn_norm, hp->rms_eps, f->d_h, n);
    residual(f, n);
    return KV_OK;
}

/* FFN half of layer il: d_x += post_norm((act(h Wg) * h Wu) Wd). */
static int run_ffn(fwd_ctx *f, int32_t il, int32_t n, kvant_err *err)
{
    const backend_ops *op = f->be->ops;
    backend *be = f->be;
    const model_hparams *hp = &f->m->hp;
    const model_layer *L = &f->m->layers[il];
    op->rmsnorm(be, f->d_x, &L->ffn_norm, hp->rms_eps, f->d_h, n);
    if (L->n_expert) { /* experts (tensor parallelism refuses these models) */
        const moe_params mp = {.norm_w = hp->fam.moe_norm_w, .gating = hp->fam.moe_gating,
                               .w_scale = hp->fam.moe_w_scale, .n_group = (int32_t)hp->fam.n_group,
                               .n_group_used = (int32_t)hp->fam.n_group_used,
                               .act = hp->recipe->act};
        return op->moe_ffn(be, L, &mp, f->d_h, f->d_x, n, err);
    }
    if (hp->recipe->act == FFN_RELU_SQR) { /* ungated: relu(up h)^2 */
        op->matmul(be, &L->w_up, NULL, f->d_h, f->d_up, n);
        op->relu_sqr(be, f->d_up, f->d_gate, (int64_t)n * L->n_ff);
        return ffn_down(f, L, n, err);
    }
    if (op->matmul_glu) {
        op->matmul_glu(be, &L->w_gate, &L->w_up, f->d_h, f->d_gate, f->d_up, n,
                       hp->recipe->act == FFN_GELU_TANH);
        return ffn_down(f, L, n, err);
    }
    const model_tensor *gu[2] = {&L->w_gate, &L->w_up}, *gu_b[2] = {NULL, NULL};
    float *gu_y[2] = {f->d_gate, f->d_up};
    matmuls(f, 2, gu, gu_b, f->d_h, gu_y, n);
    if (hp->recipe->act == FFN_GELU_TANH)
        op->geglu(be, f->d_gate, f->d_up, f->d_gate, (int64_t)n * L->n_ff);
    else
        op->swiglu(be, f->d_gate, f->d_up, f->d_gate, (int64_t)n * L->n_ff);
    return ffn_down(f, L, n, err);
}

static int run_layer(fwd_ctx *f, int32_t il, int32_t n, kvant_err *err)
{
    const model_layer *L = &f->m->layers[il];
    int rc = L->mlp_only ? KV_OK : run_attn(f, il, n, err);
    if (rc || (L->n_ff == 0 && L->n_expert == 0)) /* a mixer-only layer (nemotron_h) */
        return rc;
    return run_ffn(f, il, n, err);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The head over the n_out gathered rows: logits to dst (host); under
 * tensor parallelism this rank's vocabulary rows, gathered on its stage's
 * first rank into dst. */
static int run_head(fwd_ctx *f, int32_t n_out, float *dst, int hidden, kvant_err *err)
{
    const backend_ops *op = f->be->ops;
    backend *be = f->be;
    const model *m = f->m;
    op->gather_out(be, f->d_x, m->hp.n_embd, f->d_h);
    op->rmsnorm(be, f->d_h, &m->output_norm, m->hp.rms_eps, f->d_h, n_out);
    op->matmul(be, &m->output, NULL, f->d_h, f->d_logits, n_out);
    if (m->hp.fam.final_softcap > 0.0f) /* elementwise: a vocabulary slice caps its own rows */
        op->softcap(be, f->d_logits, m->hp.fam.final_softcap, (int64_t)n_out * m->output.ne[1]);
    if (m->hp.fam.logit_scale != 1.0f) /* granite: logits / logit_scale */
        op->scale(be, f->d_logits, 1.0f / m->hp.fam.logit_scale,
                  (int64_t)n_out * m->output.ne[1]);
    if (f->tp)
        return tp_gather_logits(f->tp, f->d_logits, n_out, dst, err);
    int rc = op->download(be, dst, f->d_logits, (size_t)n_out * m->hp.n_vocab * sizeof(float));
    if (!rc && hidden && f->h_hidden) /* embeddings: the rows the head read */
        rc = op->download(be, f->h_hidden, f->d_h, (size_t)n_out * m->hp.n_embd * sizeof(float));
    return rc;
}

/* Layers of this rank (all of them, or its pipeline stage's). */
static int run_layers(fwd_ctx *f, int32_t n, kvant_err *err)
{
    const model *m = f->m;
    int rc;
    for (int32_t il = 0; il < m->hp.n_layers; il++) {
        /* offload: a streamed layer's buffer is read before it runs and
         * handed back once the backend is done with it */
        if (m->wstream && (rc = wstream_acquire(m->wstream, il, err)))
            return rc;
        if ((rc = run_layer(f, il, n, err)))
            return rc;
        if (m->wstream) {
            f->be->ops->sync(f->be);
            wstream_release(m->wstream, il);
        }
    }
    return KV_OK;
}

/* The embedding of the batch's tokens into d_x (a vocabulary slice embeds
 * its own tokens and zeros: the sum over ranks is each token's row,
 * exactly). */
static int embed(fwd_ctx *f, int32_t n, kvant_err *err)
{
    f->be->ops->embed(f->be, &f->m->tok_embd, f->d_x);
    if (f->m->hp.fam.emb_scale != 1.0f) /* linear: before the sum over ranks is the same */
        f->be->ops->scale(f->be, f->d_x, f->m->hp.fam.emb_scale, (int64_t)n * f->m->hp.n_embd);
    return reduce(f, f->d_x, (int64_t)n * f->m->hp.n_embd, err);
}

/* Pipeline: the step's tokens in up to pp_n contiguous micro-batches,
 * each handed to the next stage as soon as this stage is done with it. */
#define FWD_MAX_MICRO 16

static int run_micro(fwd_ctx *f, const fwd_batch *b, int k, int32_t off, int32_t cnt,
                     int32_t *row, float *logits, kvant_err *err)
{
    tp_ctx *t = f->tp;
    int32_t *outs = tp_pp_out_scratch(t), n_out = 0, row0 = *row;
    while (*row < b->n_out && b->out[*row] < off + cnt)
        outs[n_out++] = b->out[(*row)++] - off;
    fwd_batch mb = {.n_tokens = cnt, .tokens = b->tokens + off, .pos = b->pos + off,
                    .seq = b->seq + off, .n_seqs = b->n_seqs, .seqs = b->seqs, .n_out = n_out,
                    .out = outs};
    int rc;
    if ((rc = f->be->ops->begin_batch(f->be, &mb, err)))
        return rc;
    rc = tp_pp_first(t) ? embed(f, cnt, err) : tp_pp_take(t, k, f->d_x, off, cnt, err);
    if (rc || (rc = run_layers(f, cnt, err)))
        return rc;
    if (!tp_pp_last(t))
        return tp_pp_give(t, k, f->d_x, cnt, err);
    if (n_out == 0)
        return f->be->ops->sync(f->be);
    return run_head(f, n_out, tp_pp_rows(t, logits, row0), 0, err);
}

static int run_pipeline(fwd_ctx *f, const fwd_batch *b, float *logits, kvant_err *err)
{
    tp_ctx *t = f->tp;
    int32_t off[FWD_MAX_MICRO], cnt[FWD_MAX_MICRO];
    int n_mb = tp_pp_n(t) < FWD_MAX_MICRO ? tp_pp_n(t) : FWD_MAX_MICRO;
    if (n_mb > b->n_tokens)
        n_mb = b->n_tokens;
    for (int k = 0; k < n_mb; k++) {
        off[k] = (int32_t)((int64_t)k * b->n_tokens / n_mb);
        cnt[k] = (int32_t)((int64_t)(k + 1) * b->n_tokens / n_mb) - off[k];
    }
    for (int32_t j = 1; j < b->n_out; j++)
        if (b->out[j] <= b->out[j - 1])
            return kvant_err_set(err, KV_EINVAL, "output rows must be in token order");
    int rc = tp_pp_first(t) ? KV_OK : tp_pp_post(t, n_mb, off, cnt, err);
    int32_t row = 0;
    for (int k = 0; !rc && k < n_mb; k++)
        rc = run_micro(f, b, k, off[k], cnt[k], &row, logits, err);
    return rc ? rc : tp_pp_finish(t, logits, b->n_out, err);
}

/* One step on this rank, the batch already checked. */
static int run_checked(fwd_ctx *f, const fwd_batch *b, float *logits, kvant_err *err)
{
    const backend_ops *op = f->be->ops;
    backend *be = f->be;
    const double t0 = f->tp ? now_s() : 0;
    int rc;
    if (f->tp && tp_pp_n(f->tp) > 1) {
        rc = run_pipeline(f, b, logits, err);
    } else if (!(rc = op->begin_batch(be, b, err)) && !(rc = embed(f, b->n_tokens, err)) &&
               !(rc = run_layers(f, b->n_tokens, err))) {
        rc = b->n_out == 0 ? op->sync(be) : run_head(f, b->n_out, logits, b->want_hidden, err);
    }
    if (f->tp)
        tp_note_step(f->tp, b->n_tokens, now_s() - t0);
    return rc;
}

int fwd_run(fwd_ctx *f, const fwd_batch *b, float *logits, kvant_err *err)
{
    int rc;
    if ((rc = check_batch(f, b, f->kv.block_size, err)))
        return rc; /* refused here, before the other ranks see it */
    if (f->tp && (rc = tp_send_batch(f->tp, b, err)))
        return rc;
    return run_checked(f, b, logits, err);
}

int fwd_run_shard(fwd_ctx *f, const fwd_batch *b, float *logits, kvant_err *err)
{
    int rc = check_batch(f, b, f->kv.block_size, err);
    return rc ? rc : run_checked(f, b, logits, err);
}
