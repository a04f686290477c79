/* model.c - load a Llama-family GGUF: hyper-parameters, tensor views,
 * tokenizer, chat template.
 *
 * Tensor shapes are checked against the hyper-parameters so that the
 * forward pass can trust them: a file whose tensors disagree with its
 * metadata is refused here, naming the tensor and the expected shape.
 */
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype.h"
#include "mem/plan.h"

const char *model_arch_name(model_arch a)
{
    const model_recipe *r = model_recipe_at(a);
    return r ? r->arch : "?";
}

static int get_u32_key(const gguf_ctx *g, const char *arch, const char *suffix, uint32_t *out,
                       int required, uint32_t def, kvant_err *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (required)
        return gguf_get_u32(g, key, out, err);
    return gguf_get_u32_or(g, key, def, out, err);
}

static int get_f32_key(const gguf_ctx *g, const char *arch, const char *suffix, float def,
                       float *out, kvant_err *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return gguf_get_f32_or(g, key, def, out, err);
}

/* rope.scaling.*: as llama.cpp reads them for every architecture (an absent
 * type is "linear"; the factor scales unless the type is "none").  Types
 * whose maths kvant does not implement (yarn, anything unknown) are refused. */
static int read_rope_scaling(const gguf_ctx *g, const char *arch, model_hparams *hp, int *longrope,
                             int *yarn, kvant_err *err)
{
    char key[128];
    gguf_str type = {0};
    hp->rope_freq_scale = 1.0f;
    *longrope = *yarn = 0;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    int rc = gguf_find_key(g, key) < 0 ? KV_OK : gguf_get_str(g, key, &type, err);
    if (rc)
        return rc;
    if (type.ptr && gguf_str_eq(type, "none"))
        return KV_OK;
    /* Llama-3 style scaling is carried by the rope_freqs.weight tensor
     * (freq factors computed at conversion) */
    *longrope = type.ptr && gguf_str_eq(type, "longrope");
    *yarn = type.ptr && gguf_str_eq(type, "yarn") && hp->recipe->yarn;
    if (type.ptr && !gguf_str_eq(type, "linear") && !gguf_str_eq(type, "llama3") && !*longrope &&
        !*yarn)
        return kvant_err_set(err, KV_EUNSUP, "%s '%.*s' is not supported for %s (kvant runs "
                             "none, linear, longrope; yarn for deepseek2 and gpt-oss)", key,
                             (int)(type.len > 64 ? 64 : type.len), type.ptr, arch);
    if (*longrope && !hp->recipe->rope_factors)
        return kvant_err_set(err, KV_EUNSUP, "%s longrope: not for architecture %s", key, arch);
    float factor = 0.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
    if (gguf_find_key(g, key) < 0)
        snprintf(key, sizeof key, "%s.rope.scale_linear", arch); /* the old name */
    if ((rc = gguf_get_f32_or(g, key, 0.0f, &factor, err)))
        return rc;
    if (factor == 0.0f)
        return KV_OK;
    if (!(factor > 0.0f && factor < 1e6f))
        return kvant_err_set(err, KV_EFORMAT, "%s: %g is not positive", key, (double)factor);
    hp->rope_freq_scale = 1.0f / factor;
    return KV_OK;
}

/* model_layer_u32; allow_zero: array entries may be 0 (a hybrid family's
 * head_count_kv: 0 marks a recurrent layer). */
static int layer_u32(const gguf_ctx *g, const char *suffix, int n_layers, int il, uint32_t def,
                     int allow_zero, uint32_t *out, kvant_err *err);

int model_layer_u32(const gguf_ctx *g, const char *suffix, int n_layers, int il, uint32_t def,
                    uint32_t *out, kvant_err *err)
{
    return layer_u32(g, suffix, n_layers, il, def, 0, out, err);
}

static int layer_u32(const gguf_ctx *g, const char *suffix, int n_layers, int il, uint32_t def,
                     int allow_zero, uint32_t *out, kvant_err *err)
{
    gguf_str arch_s;
    int rc = gguf_get_str(g, "general.architecture", &arch_s, err);
    if (rc)
        return rc;
    char key[128];
    snprintf(key, sizeof key, "%.*s.%s", (int)(arch_s.len > 32 ? 32 : arch_s.len), arch_s.ptr,
             suffix);
    int64_t ki = gguf_find_key(g, key);
    if (ki < 0 || gguf_kv_type(g, ki) != GGUF_TYPE_ARRAY)
        return def ? gguf_get_u32_or(g, key, def, out, err) : gguf_get_u32(g, key, out, err);
    /* per-layer values (a pruned model): int32 or uint32 [n_layers];
     * il < 0 asks for the largest */
    gguf_type et = gguf_arr_type(g, ki);
    if ((et != GGUF_TYPE_INT32 && et != GGUF_TYPE_UINT32) || gguf_arr_n(g, ki) != (uint64_t)n_layers)
        return kvant_err_set(err, KV_EFORMAT,
                             "%s: array must hold %d int32/uint32 values (one per layer)", key,
                             n_layers);
    const uint8_t *d = gguf_arr_data(g, ki);
    uint32_t best = 0;
    for (int i = 0; i < n_layers; i++) {
        int32_t v;
        memcpy(&v, d + 4 * (size_t)i, 4);
        if (v < (allow_zero ? 0 : 1))
            return kvant_err_set(err, KV_EFORMAT, "%s[%d] = %d is not positive", key, i, (int)v);
        if (il < 0 ? (uint32_t)v > best : i == il)
            best = (uint32_t)v;
    }
    *out = best;
    return KV_OK;
}

/* The recipe of g's general.architecture, or NULL. */
static const model_recipe *recipe_of(const gguf_ctx *g)
{
    gguf_str arch_s = {0};
    if (gguf_get_str(g, "general.architecture", &arch_s, NULL))
        return NULL;
    return model_recipe_find(arch_s.ptr, arch_s.len);
}

int model_ff_length(const gguf_ctx *g, int n_layers, int il, uint32_t *n_ff, kvant_err *err)
{
    const model_recipe *r = recipe_of(g);
    const int zero = r && r->one_sublayer; /* 0: a layer without an MLP */
    int rc = layer_u32(g, "feed_forward_length", n_layers, il, 0, zero, n_ff, err);
    if (rc)
        return rc;
    if ((*n_ff < 1 && !(zero && il >= 0)) || *n_ff > (1u << 20))
        return kvant_err_set(err, KV_EFORMAT, "feed_forward_length = %u out of range", *n_ff);
    return KV_OK;
}

int model_layer_heads(const gguf_ctx *g, int n_layers, int il, uint32_t *n_head,
                      uint32_t *n_head_kv, kvant_err *err)
{
    int rc = model_layer_u32(g, "attention.head_count", n_layers, il, 0, n_head, err);
    if (rc)
        return rc;
    const model_recipe *r = recipe_of(g);
    const int hybrid = r && r->recr; /* head_count_kv 0: a recurrent or MLP layer */
    if ((rc = layer_u32(g, "attention.head_count_kv", n_layers, il, *n_head, hybrid, n_head_kv,
                        err)))
        return rc;
    if (hybrid && il >= 0 && *n_head_kv == 0 && *n_head >= 1 && *n_head <= PLAN_MAX_HEADS)
        return KV_OK;
    if (*n_head < 1 || *n_head > PLAN_MAX_HEADS || *n_head_kv < 1 || *n_head % *n_head_kv)
        return kvant_err_set(err, KV_EFORMAT,
                             "layer %d: attention.head_count_kv %u does not divide head_count %u",
                             il, *n_head_kv, *n_head);
    return KV_OK;
}

/* The widest layer's heads, each layer checked, and the sum of KV heads
 * over layers (the KV cache's row elements per token / head_dim / 2). */
static int read_heads(const gguf_ctx *g, int n_layers, uint32_t *n_head, uint32_t *n_head_kv,
                      int64_t *kv_total, int32_t *kv_layers, kvant_err *err)
{
    *n_head = *n_head_kv = 0;
    *kv_total = 0;
    *kv_layers = 0;
    for (int il = 0; il < n_layers; il++) {
        uint32_t h, kv;
        int rc = model_layer_heads(g, n_layers, il, &h, &kv, err);
        if (rc)
            return rc;
        *n_head = h > *n_head ? h : *n_head;
        *n_head_kv = kv > *n_head_kv ? kv : *n_head_kv;
        *kv_total += kv;
        *kv_layers += kv > 0;
    }
    return KV_OK;
}

/* hp->n_ff becomes the widest row the FFN's buffers stage: an expert's or
 * the shared expert's input, latent attention's q_a output, a recurrent
 * layer's in-projection. */
static void widen_ff(model_hparams *hp)
{
    const model_family_hp *f = &hp->fam;
    const int64_t conv = model_recr_conv_channels(f, hp->n_embd);
    const int64_t d_proj = f->recr == RECR_MAMBA2 ? conv + f->ssm_d_inner + f->ssm_n_head
                           : f->recr == RECR_GDN  ? conv
                           : f->recr              ? 3ll * hp->n_embd
                                                  : 0;
    /* a gated attention's q projection: [q | gate] per head */
    const int64_t qg = hp->recipe->attn_gate ? 2ll * hp->n_head * hp->head_dim : 0;
    const int64_t w[] = {f->n_ff_exp, f->n_ff_shexp, f->n_lora_q, d_proj, f->ssm_d_inner, qg};
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
        if (w[i] > hp->n_ff)
            hp->n_ff = (int32_t)w[i];
}

/* A hybrid's KV heads over its attention layers alone (a recipe whose
 * recurrent layers are not marked by head_count_kv 0 still counts them). */
static int count_kv(const gguf_ctx *g, model_hparams *hp, kvant_err *err)
{
    hp->n_kv_total = 0;
    hp->n_kv_layers = 0;
    for (int32_t il = 0; il < hp->n_layers; il++) {
        uint32_t h, kv;
        int rc = model_layer_heads(g, hp->n_layers, il, &h, &kv, err);
        if (rc)
            return rc;
        if (hp->fam.is_recr[il] || hp->fam.is_mlp[il])
            continue;
        hp->n_kv_total += kv;
        hp->n_kv_layers += kv > 0;
    }
    return KV_OK;
}

int model_hparams_from_gguf(const gguf_ctx *g, model_hparams *hp, kvant_err *err)
{
    gguf_str arch_s;
    memset(hp, 0, sizeof *hp);
    int rc = gguf_get_str(g, "general.architecture", &arch_s, err);
    if (rc)
        return rc;
    hp->recipe = model_recipe_find(arch_s.ptr, arch_s.len);
    if (!hp->recipe)
        return kvant_err_set(err, KV_EUNSUP,
                             "general.architecture '%.*s' is not supported (kvant runs %s)",
                             (int)(arch_s.len > 64 ? 64 : arch_s.len), arch_s.ptr,
                             model_recipe_list());
    hp->arch = model_recipe_index(hp->recipe);
    hp->rope = hp->recipe->rope;
    const char *arch = hp->recipe->arch;
    uint32_t n_layers, n_embd, n_head, n_head_kv, n_ff, ctx, key_len, rope_dim;
    if ((rc = get_u32_key(g, arch, "block_count", &n_layers, 1, 0, err)) ||
        (rc = get_u32_key(g, arch, "embedding_length", &n_embd, 1, 0, err)) ||
        (rc = get_u32_key(g, arch, "context_length", &ctx, 0, 2048, err)))
        return rc;
    if (n_layers < 1 || n_layers > MODEL_MAX_LAYERS)
        return kvant_err_set(err, KV_EFORMAT, "%s.block_count: %u outside [1, %d]", arch,
                             n_layers, MODEL_MAX_LAYERS);
    int64_t kv_total;
    if ((rc = read_heads(g, (int)n_layers, &n_head, &n_head_kv, &kv_total, &hp->n_kv_layers,
                         err)) ||
        (rc = model_ff_length(g, (int)n_layers, -1, &n_ff, err)))
        return rc;
    if (n_head < 1 || n_embd < 1)
        return kvant_err_set(err, KV_EFORMAT, "%s: embedding_length %u, head_count %u", arch,
                             n_embd, n_head);
    /* key_length defaults to n_embd / n_head; a file that sets it (e.g. a
     * model with pruned heads) may have n_head * key_length != n_embd */
    char kl_key[64];
    snprintf(kl_key, sizeof kl_key, "%s.attention.key_length", arch);
    int has_key_len = gguf_find_key(g, kl_key) >= 0;
    if (!has_key_len && n_embd % n_head)
        return kvant_err_set(err, KV_EFORMAT,
                             "%s.embedding_length %u is not a multiple of head_count %u", arch,
                             n_embd, n_head);
    if (n_head_kv < 1 || n_head % n_head_kv)
        return kvant_err_set(err, KV_EFORMAT,
                             "%s.attention.head_count_kv %u does not divide head_count %u", arch,
                             n_head_kv, n_head);
    if ((rc = get_u32_key(g, arch, "attention.key_length", &key_len, 0, n_embd / n_head, err)))
        return rc;
    const uint32_t max_key = hp->recipe->mla ? MODEL_MAX_MLA_ROW : MODEL_MAX_HEAD_DIM;
    if (key_len < 2 || key_len > max_key || key_len % 2)
        return kvant_err_set(err, KV_EUNSUP, "%s.attention.key_length %u unsupported", arch,
                             key_len);
    if ((rc = get_u32_key(g, arch, "rope.dimension_count", &rope_dim, 0, key_len, err)))
        return rc;
    if (rope_dim > key_len || rope_dim > MODEL_MAX_HEAD_DIM || rope_dim % 2)
        return kvant_err_set(err, KV_EFORMAT, "%s.rope.dimension_count %u invalid for head %u",
                             arch, rope_dim, key_len);
    hp->n_layers = (int32_t)n_layers;
    hp->n_embd = (int32_t)n_embd;
    hp->n_head = (int32_t)n_head;
    hp->n_head_kv = (int32_t)n_head_kv;
    hp->n_kv_total = kv_total;
    hp->head_dim = (int32_t)key_len;
    hp->n_ff = (int32_t)n_ff;
    hp->n_ctx_train = ctx;
    hp->rope_dim = (int32_t)rope_dim;
    float eps0 = 1e-5f; /* nemotron_h: its layer_norm_epsilon when the rms key is absent */
    if (hp->recipe->eps_key_ln &&
        (rc = get_f32_key(g, arch, "attention.layer_norm_epsilon", eps0, &eps0, err)))
        return rc;
    if ((rc = get_f32_key(g, arch, "rope.freq_base", 10000.0f, &hp->rope_base, err)) ||
        (rc = get_f32_key(g, arch, "attention.layer_norm_rms_epsilon", eps0, &hp->rms_eps, err)))
        return rc;
    if (!(hp->rope_base > 0.0f) || !(hp->rms_eps > 0.0f && hp->rms_eps < 1.0f))
        return kvant_err_set(err, KV_EFORMAT, "%s: rope.freq_base or rms epsilon out of range",
                             arch);
    if (hp->recipe->rope_dim_full && rope_dim != key_len)
        return kvant_err_set(err, KV_EFORMAT, "%s.rope.dimension_count %u: must equal the head "
                             "size %u", arch, rope_dim, key_len);
    int longrope, yarn;
    if ((rc = read_rope_scaling(g, arch, hp, &longrope, &yarn, err)))
        return rc;
    model_family_base fb = {arch, hp->n_layers, hp->n_embd, hp->n_head, hp->head_dim, hp->n_ff,
                            (uint32_t)ctx, hp->rope_base, hp->rope_freq_scale, hp->n_head_kv,
                            hp->rope_dim, yarn};
    if ((rc = model_family_read(g, hp->recipe, &fb, &hp->fam, err)))
        return rc;
    hp->fam.longrope = longrope;
    widen_ff(hp);
    if (hp->fam.n_recr && (rc = count_kv(g, hp, err))) /* only the attention layers keep KV */
        return rc;
    const gguf_tensor_info *emb = gguf_find_tensor(g, "token_embd.weight");
    if (!emb)
        return kvant_err_set(err, KV_EFORMAT, "tensor 'token_embd.weight' is missing");
    if (emb->ne[1] < 1 || emb->ne[1] > (1 << 24))
        return kvant_err_set(err, KV_EFORMAT, "token_embd.weight: vocabulary %llu out of range",
                             (unsigned long long)emb->ne[1]);
    hp->n_vocab = (int32_t)emb->ne[1];
    return KV_OK;
}

/* t = the file's tensor ti seen as n_rows rows of ne0 values (shape checked
 * by the caller), if kvant has kernels for its type. */
static int bind_rows(const gguf_ctx *g, const gguf_tensor_info *ti, model_tensor *t,
                     const char *name, int64_t ne0, int64_t n_rows, kvant_err *err)
{
    const dtype_traits *tr = dtype_get(ti->type);
    if (!tr || !tr->vec_dot)
        return kvant_err_set(err, KV_EUNSUP, "tensor '%s': type %u has no kernels in kvant", name,
                             ti->type);
    t->type = ti->type;
    t->ne[0] = ne0;
    t->ne[1] = n_rows;
    t->nbytes = ti->nbytes;
    t->row_bytes = dtype_row_size(ti->type, ne0);
    t->data = ti->data;
    t->dev = (void *)ti->data;
    t->file_off = gguf_data_offset(g) + ti->offset;
    return KV_OK;
}

/* Binds a tensor by name and checks its shape; optional tensors may be
 * absent (t->data stays NULL). */
static int bind(const gguf_ctx *g, model_tensor *t, const char *name, int layer, int64_t ne0,
                int64_t ne1, int optional, kvant_err *err)
{
    const gguf_tensor_info *ti = gguf_find_tensor(g, name);
    memset(t, 0, sizeof *t);
    t->layer = layer;
    if (!ti) {
        if (optional)
            return KV_OK;
        return kvant_err_set(err, KV_EFORMAT, "tensor '%s' is missing", name);
    }
    int64_t got1 = ti->n_dims >= 2 ? (int64_t)ti->ne[1] : 1;
    if ((int64_t)ti->ne[0] != ne0 || got1 != ne1 || ti->ne[2] != 1 || ti->ne[3] != 1)
        return kvant_err_set(err, KV_EFORMAT,
                             "tensor '%s' has shape [%llu, %llu], expected [%lld, %lld]", name,
                             (unsigned long long)ti->ne[0], (unsigned long long)ti->ne[1],
                             (long long)ne0, (long long)ne1);
    return bind_rows(g, ti, t, name, ne0, ne1, err);
}

/* 1-D tensors (norms, biases) must be F32: the kernels read them as floats. */
static int bind_vec(const gguf_ctx *g, model_tensor *t, const char *name, int layer, int64_t n,
                    int optional, kvant_err *err)
{
    int rc = bind(g, t, name, layer, n, 1, optional, err);
    if (rc == KV_OK && t->data && t->type != DT_F32)
        return kvant_err_set(err, KV_EUNSUP, "tensor '%s' must be f32 (is type %u)", name,
                             t->type);
    return rc;
}

/* Row views [row0, row0 + rows) of a fused tensor (attn_qkv, ffn_up): same
 * type and width, the data and file offset of its first row. */
static model_tensor row_view(const model_tensor *t, int64_t row0, int64_t rows)
{
    model_tensor v = *t;
    v.ne[1] = rows;
    v.nbytes = (uint64_t)rows * t->row_bytes;
    v.data = (const char *)t->data + row0 * (int64_t)t->row_bytes;
    v.dev = (void *)v.data;
    v.file_off = t->file_off + (uint64_t)row0 * t->row_bytes;
    return v;
}

#define NAME(s) (snprintf(name, sizeof name, "blk.%d." s, il), name)

/* A stacked tensor: GGUF [n][rows][ne0] bound as one matrix of n * rows rows. */
static int bind_exps(const gguf_ctx *g, model_tensor *t, const char *name, int layer, int64_t ne0,
                     int64_t rows, int64_t n_expert, kvant_err *err);

/* Latent attention (deepseek2) of layer il. */
static int bind_attn_mla(model *m, int il, model_layer *L, kvant_err *err)
{
    const model_hparams *hp = &m->hp;
    const model_family_hp *f = &hp->fam;
    const gguf_ctx *g = m->gguf;
    char name[96];
    const int64_t E = hp->n_embd, H = L->n_head, R = hp->rope_dim, C = f->n_lora_kv;
    const int64_t QK = f->n_qk_nope + R, QL = f->n_lora_q;
    int rc;
    if (QL ? ((rc = bind(g, &L->wq_a, NAME("attn_q_a.weight"), il, E, QL, 0, err)) ||
              (rc = bind_vec(g, &L->q_a_norm, NAME("attn_q_a_norm.weight"), il, QL, 0, err)) ||
              (rc = bind(g, &L->wq_b, NAME("attn_q_b.weight"), il, QL, H * QK, 0, err)))
           : (rc = bind(g, &L->wq, NAME("attn_q.weight"), il, E, H * QK, 0, err)))
        return rc;
    if ((rc = bind(g, &L->wkv_a, NAME("attn_kv_a_mqa.weight"), il, E, C + R, 0, err)) ||
        (rc = bind_vec(g, &L->kv_a_norm, NAME("attn_kv_a_norm.weight"), il, C, 0, err)) ||
        (rc = bind_exps(g, &L->wk_b, NAME("attn_k_b.weight"), il, f->n_qk_nope, C, H, err)) ||
        (rc = bind_exps(g, &L->wv_b, NAME("attn_v_b.weight"), il, C, f->n_v_mla, H, err)) ||
        (rc = bind(g, &L->wo, NAME("attn_output.weight"), il, H * f->n_v_mla, E, 0, err)))
        return rc;
    return KV_OK;
}

static int bind_attn(model *m, int il, model_layer *L, kvant_err *err)
{
    const model_hparams *hp = &m->hp;
    const model_recipe *r = hp->recipe;
    const gguf_ctx *g = m->gguf;
    char name[96];
    int64_t q_dim = (int64_t)L->n_head * hp->head_dim, kv_dim = (int64_t)L->n_head_kv * hp->head_dim;
    int rc, nb = !r->qkv_bias;
    if ((rc = bind_vec(g, &L->attn_norm, NAME("attn_norm.weight"), il, hp->n_embd, 0, err)))
        return rc;
    if (r->mla)
        return bind_attn_mla(m, il, L, err);
    if (r->fused_qkv) {
        model_tensor qkv;
        if ((rc = bind(g, &qkv, NAME("attn_qkv.weight"), il, hp->n_embd, q_dim + 2 * kv_dim, 0,
                       err)))
            return rc;
        L->wq = row_view(&qkv, 0, q_dim);
        L->wk = row_view(&qkv, q_dim, kv_dim);
        L->wv = row_view(&qkv, q_dim + kv_dim, kv_dim);
    } else if ((rc = bind(g, &L->wq, NAME("attn_q.weight"), il, hp->n_embd,
                          r->attn_gate ? 2 * q_dim : q_dim, 0, err)) ||
               (rc = bind(g, &L->wk, NAME("attn_k.weight"), il, hp->n_embd, kv_dim, 0, err)) ||
               (rc = bind(g, &L->wv, NAME("attn_v.weight"), il, hp->n_embd, kv_dim, 0, err))) {
        return rc;
    }
    if ((rc = bind(g, &L->wo, NAME("attn_output.weight"), il, q_dim, hp->n_embd, 0, err)) ||
        (rc = bind_vec(g, &L->bq, NAME("attn_q.bias"), il, q_dim, nb, err)) ||
        (rc = bind_vec(g, &L->bk, NAME("attn_k.bias"), il, kv_dim, nb, err)) ||
        (rc = bind_vec(g, &L->bv, NAME("attn_v.bias"), il, kv_dim, nb, err)) ||
        (rc = bind_vec(g, &L->bo, NAME("attn_output.bias"), il, hp->n_embd, 1, err)))
        return rc;
    if (r->qk_norm &&
        ((rc = bind_vec(g, &L->q_norm, NAME("attn_q_norm.weight"), il, hp->head_dim, 0, err)) ||
         (rc = bind_vec(g, &L->k_norm, NAME("attn_k_norm.weight"), il, hp->head_dim, 0, err))))
        return rc;
    if (r->qk_norm_full && /* the whole row (olmoe): rmsnorm over q_dim / kv_dim values */
        ((rc = bind_vec(g, &L->q_norm, NAME("attn_q_norm.weight"), il, q_dim, 0, err)) ||
         (rc = bind_vec(g, &L->k_norm, NAME("attn_k_norm.weight"), il, kv_dim, 0, err))))
        return rc;
    if (r->post_norms &&
        (rc = bind_vec(g, &L->post_attn_norm, NAME("post_attention_norm.weight"), il,
                       hp->n_embd, 0, err)))
        return rc;
    if (r->attn_sinks &&
        (rc = bind_vec(g, &L->attn_sinks, NAME("attn_sinks.weight"), il, L->n_head, 0, err)))
        return rc;
    return KV_OK;
}

static int bind_exps(const gguf_ctx *g, model_tensor *t, const char *name, int layer, int64_t ne0,
                     int64_t rows, int64_t n_expert, kvant_err *err)
{
    const gguf_tensor_info *ti = gguf_find_tensor(g, name);
    memset(t, 0, sizeof *t);
    t->layer = layer;
    if (!ti)
        return kvant_err_set(err, KV_EFORMAT, "tensor '%s' is missing", name);
    if (ti->n_dims != 3 || (int64_t)ti->ne[0] != ne0 || (int64_t)ti->ne[1] != rows ||
        (int64_t)ti->ne[2] != n_expert || ti->ne[3] != 1)
        return kvant_err_set(err, KV_EFORMAT,
                             "tensor '%s' has shape [%llu, %llu, %llu], expected [%lld, %lld, %lld]",
                             name, (unsigned long long)ti->ne[0], (unsigned long long)ti->ne[1],
                             (unsigned long long)ti->ne[2], (long long)ne0, (long long)rows,
                             (long long)n_expert);
    return bind_rows(g, ti, t, name, ne0, rows * n_expert, err);
}


/* A 2-D f32 tensor [n][ne0] (per-expert biases). */
static int bind_f32_rows(const gguf_ctx *g, model_tensor *t, const char *name, int layer,
                         int64_t ne0, int64_t n, kvant_err *err)
{
    int rc = bind(g, t, name, layer, ne0, n, 0, err);
    if (rc == KV_OK && t->type != DT_F32)
        return kvant_err_set(err, KV_EUNSUP, "tensor '%s' must be f32 (is type %u)", name,
                             t->type);
    return rc;
}

/* The router's and the experts' biases (recipe moe_bias). */
static int bind_moe_bias(model *m, int il, model_layer *L, kvant_err *err)
{
    const gguf_ctx *g = m->gguf;
    char name[96];
    const int64_t E = m->hp.n_embd, X = m->hp.fam.n_expert, F = m->hp.fam.n_ff_exp;
    int rc;
    if ((rc = bind_vec(g, &L->gate_inp_b, NAME("ffn_gate_inp.bias"), il, X, 0, err)) ||
        (rc = bind_f32_rows(g, &L->gate_exps_b, NAME("ffn_gate_exps.bias"), il, F, X, err)) ||
        (rc = bind_f32_rows(g, &L->up_exps_b, NAME("ffn_up_exps.bias"), il, F, X, err)) ||
        (rc = bind_f32_rows(g, &L->down_exps_b, NAME("ffn_down_exps.bias"), il, E, X, err)))
        return rc;
    return KV_OK;
}

/* The experts' gate and up rows: ffn_gate_up_exps where the file fuses them
 * (taken before the two apart, as llama.cpp does), else the two tensors. */
static int bind_gate_up(const gguf_ctx *g, int il, model_layer *L, int64_t E, int64_t F,
                        int64_t X, kvant_err *err)
{
    char name[96];
    if (gguf_find_tensor(g, NAME("ffn_gate_up_exps.weight"))) {
        memset(&L->gate_exps, 0, sizeof L->gate_exps);
        memset(&L->up_exps, 0, sizeof L->up_exps);
        L->gate_exps.layer = L->up_exps.layer = il;
        return bind_exps(g, &L->gate_up_exps, name, il, E, 2 * F, X, err);
    }
    int rc = bind_exps(g, &L->gate_exps, NAME("ffn_gate_exps.weight"), il, E, F, X, err);
    return rc ? rc : bind_exps(g, &L->up_exps, NAME("ffn_up_exps.weight"), il, E, F, X, err);
}

/* The experts of layer il (recipe moe, the file's expert_count > 0). */
static int bind_moe(model *m, int il, model_layer *L, kvant_err *err)
{
    const model_hparams *hp = &m->hp;
    const gguf_ctx *g = m->gguf;
    char name[96];
    const int64_t E = hp->n_embd, X = hp->fam.n_expert, F = hp->fam.n_ff_exp;
    const int64_t S = hp->fam.n_ff_shexp;
    L->n_expert = (int32_t)X;
    L->n_expert_used = (int32_t)hp->fam.n_expert_used;
    L->n_ff_exp = (int32_t)F;
    L->n_ff_shexp = (int32_t)S;
    int rc;
    if ((rc = bind(g, &L->ffn_gate_inp, NAME("ffn_gate_inp.weight"), il, E, X, 0, err)) ||
        (rc = bind_gate_up(g, il, L, E, F, X, err)) ||
        (rc = bind_exps(g, &L->down_exps, NAME("ffn_down_exps.weight"), il, F, E, X, err)) ||
        (hp->recipe->moe_ds &&
         (rc = bind_vec(g, &L->exp_probs_b, NAME("exp_probs_b.bias"), il, X, 1, err))) ||
        (hp->recipe->moe_bias && (rc = bind_moe_bias(m, il, L, err))))
        return rc;
    if (!S)
        return KV_OK;
    if ((rc = bind(g, &L->gate_shexp, NAME("ffn_gate_shexp.weight"), il, E, S, 0, err)) ||
        (rc = bind(g, &L->up_shexp, NAME("ffn_up_shexp.weight"), il, E, S, 0, err)) ||
        (rc = bind(g, &L->down_shexp, NAME("ffn_down_shexp.weight"), il, S, E, 0, err)))
        return rc;
    if (hp->recipe->moe_ds) /* DeepSeek's shared experts are not gated */
        return KV_OK;
    return bind(g, &L->gate_inp_shexp, NAME("ffn_gate_inp_shexp.weight"), il, E, 1, 0, err);
}


static int bind_ffn(model *m, int il, model_layer *L, kvant_err *err)
{
    const model_hparams *hp = &m->hp;
    const model_recipe *r = hp->recipe;
    const gguf_ctx *g = m->gguf;
    char name[96];
    int rc;
    if (hp->fam.n_expert && (uint32_t)il >= hp->fam.n_dense_lead) {
        if ((rc = bind_vec(g, &L->ffn_norm, r->ffn_norm_post ? NAME("post_attention_norm.weight")
                                                             : NAME("ffn_norm.weight"),
                           il, hp->n_embd, 0, err)))
            return rc;
        return bind_moe(m, il, L, err);
    }
    if ((rc = bind_vec(g, &L->ffn_norm, r->ffn_norm_post ? NAME("post_attention_norm.weight")
                                                         : NAME("ffn_norm.weight"),
                       il, hp->n_embd, 0, err)) ||
        (rc = bind_vec(g, &L->b_down, NAME("ffn_down.bias"), il, hp->n_embd, 1, err)) ||
        (rc = bind(g, &L->w_down, NAME("ffn_down.weight"), il, L->n_ff, hp->n_embd, 0, err)))
        return rc;
    if (r->fused_gate_up) {
        model_tensor up;
        if ((rc = bind(g, &up, NAME("ffn_up.weight"), il, hp->n_embd, 2 * (int64_t)L->n_ff, 0,
                       err)))
            return rc;
        L->w_gate = row_view(&up, 0, L->n_ff); /* llama.cpp's swiglu: silu(first half) */
        L->w_up = row_view(&up, L->n_ff, L->n_ff);
    } else if ((rc = bind(g, &L->w_gate, NAME("ffn_gate.weight"), il, hp->n_embd, L->n_ff, 0,
                          err)) ||
               (rc = bind(g, &L->w_up, NAME("ffn_up.weight"), il, hp->n_embd, L->n_ff, 0, err))) {
        return rc;
    }
    if (r->post_norms && (rc = bind_vec(g, &L->post_ffn_norm, NAME("post_ffw_norm.weight"), il,
                                        hp->n_embd, 0, err)))
        return rc;
    return KV_OK;
}

/* A Gated DeltaNet layer's tensors (qwen35), attn_norm bound by the caller. */
static int bind_gdn(model *m, int il, model_layer *L, kvant_err *err)
{
    const model_hparams *hp = &m->hp;
    const model_family_hp *f = &hp->fam;
    const gguf_ctx *g = m->gguf;
    char name[96];
    const int64_t E = hp->n_embd, D = f->ssm_d_inner, H = f->ssm_n_head;
    const int64_t CH = model_recr_conv_channels(f, hp->n_embd);
    int rc;
    if ((rc = bind(g, &L->ssm_in, NAME("attn_qkv.weight"), il, E, CH, 0, err)) ||
        (rc = bind(g, &L->ssm_z, NAME("attn_gate.weight"), il, E, D, 0, err)) ||
        (rc = bind_f32_rows(g, &L->ssm_conv1d, NAME("ssm_conv1d.weight"), il, f->ssm_d_conv, CH,
                            err)) ||
        (rc = bind_vec(g, &L->ssm_dt_b, NAME("ssm_dt.bias"), il, H, 0, err)) ||
        (rc = bind_vec(g, &L->ssm_a, NAME("ssm_a"), il, H, 0, err)) ||
        (rc = bind(g, &L->ssm_beta, NAME("ssm_beta.weight"), il, E, H, 0, err)) ||
        (rc = bind(g, &L->ssm_alpha, NAME("ssm_alpha.weight"), il, E, H, 0, err)) ||
        (rc = bind_vec(g, &L->ssm_norm, NAME("ssm_norm.weight"), il, D / H, 0, err)) ||
        (rc = bind(g, &L->ssm_out, NAME("ssm_out.weight"), il, D, E, 0, err)))
        return rc;
    if (gguf_find_tensor(g, NAME("ssm_conv1d.bias")))
        return kvant_err_set(err, KV_EUNSUP, "tensor '%s': not read by llama.cpp's qwen35", name);
    return KV_OK;
}

/* A recurrent layer's tensors (hp.fam.is_recr[il]): Mamba-2 or a short
 * convolution, as llama.cpp's granitehybrid / lfm2 loaders name them. */
static int bind_recr(model *m, int il, model_layer *L, kvant_err *err)
{
    const model_hparams *hp = &m->hp;
    const model_family_hp *f = &hp->fam;
    const gguf_ctx *g = m->gguf;
    char name[96];
    const int64_t E = hp->n_embd, K = f->ssm_d_conv;
    int rc;
    L->recr = f->recr;
    if ((rc = bind_vec(g, &L->attn_norm, NAME("attn_norm.weight"), il, E, 0, err)))
        return rc;
    if (f->recr == RECR_SHORTCONV) {
        if ((rc = bind(g, &L->ssm_in, NAME("shortconv.in_proj.weight"), il, E, 3 * E, 0, err)) ||
            (rc = bind_f32_rows(g, &L->ssm_conv1d, NAME("shortconv.conv.weight"), il, K, E,
                                err)) ||
            (rc = bind(g, &L->ssm_out, NAME("shortconv.out_proj.weight"), il, E, E, 0, err)))
            return rc;
        return KV_OK;
    }
    const int64_t D = f->ssm_d_inner, H = f->ssm_n_head, G = f->ssm_n_group;
    const int64_t CH = model_recr_conv_channels(f, hp->n_embd), P = D + CH + H; /* z | xBC | dt */
    if (f->recr == RECR_GDN)
        return bind_gdn(m, il, L, err);
    if ((rc = bind(g, &L->ssm_in, NAME("ssm_in.weight"), il, E, P, 0, err)) ||
        (rc = bind_f32_rows(g, &L->ssm_conv1d, NAME("ssm_conv1d.weight"), il, K, CH, err)) ||
        (rc = bind_vec(g, &L->ssm_conv1d_b, NAME("ssm_conv1d.bias"), il, CH, 1, err)) ||
        (rc = bind_vec(g, &L->ssm_dt_b, NAME("ssm_dt.bias"), il, H, 0, err)) ||
        (rc = bind_f32_rows(g, &L->ssm_a, NAME("ssm_a"), il, 1, H, err)) ||
        (rc = bind_f32_rows(g, &L->ssm_d, NAME("ssm_d"), il, 1, H, err)) ||
        (rc = bind_f32_rows(g, &L->ssm_norm, NAME("ssm_norm.weight"), il, D / G, G, err)) ||
        (rc = bind(g, &L->ssm_out, NAME("ssm_out.weight"), il, D, E, 0, err)))
        return rc;
    return KV_OK;
}

/* An MLP-only layer (recipe one_sublayer): attn_norm before ffn_up, the
 * activation (relu^2, ungated), ffn_down; no attention, no KV. */
static int bind_mlp(model *m, int il, model_layer *L, kvant_err *err)
{
    const model_hparams *hp = &m->hp;
    const gguf_ctx *g = m->gguf;
    char name[96];
    int rc;
    L->mlp_only = 1;
    L->n_head_kv = 0;
    if (gguf_find_tensor(g, NAME("ffn_up.bias")))
        return kvant_err_set(err, KV_EUNSUP, "tensor '%s': MLP biases before the activation are "
                             "not implemented", name);
    if ((rc = bind_vec(g, &L->ffn_norm, NAME("attn_norm.weight"), il, hp->n_embd, 0, err)) ||
        (rc = bind(g, &L->w_up, NAME("ffn_up.weight"), il, hp->n_embd, L->n_ff, 0, err)) ||
        (rc = bind(g, &L->w_down, NAME("ffn_down.weight"), il, L->n_ff, hp->n_embd, 0, err)) ||
        (rc = bind_vec(g, &L->b_down, NAME("ffn_down.bias"), il, hp->n_embd, 1, err)))
        return rc;
    return KV_OK;
}

#undef NAME

static int bind_layer(model *m, int il, kvant_err *err)
{
    const model_hparams *hp = &m->hp;
    model_layer *L = &m->layers[il];
    uint32_t n_ff, n_head, n_head_kv;
    int rc = model_ff_length(m->gguf, hp->n_layers, il, &n_ff, err);
    if (rc || (rc = model_layer_heads(m->gguf, hp->n_layers, il, &n_head, &n_head_kv, err)))
        return rc;
    L->n_ff = (int32_t)n_ff;
    L->n_head = (int32_t)n_head;
    L->n_head_kv = (int32_t)n_head_kv;
    const int swa = hp->fam.n_swa && hp->fam.is_swa[il];
    L->window = swa ? (int32_t)hp->fam.n_swa : 0;
    L->rope_base = swa ? hp->fam.rope_base_swa : hp->rope_base;
    L->rope_scale = swa ? hp->fam.rope_scale_swa : hp->rope_freq_scale;
    if (hp->fam.is_mlp[il])
        return bind_mlp(m, il, L, err);
    if (hp->fam.is_recr[il])
        L->n_head_kv = 0; /* no KV: head_count_kv may be one value for every layer */
    if ((rc = hp->fam.is_recr[il] ? bind_recr(m, il, L, err) : bind_attn(m, il, L, err)))
        return rc;
    /* recipe one_sublayer: a mixer layer has no FFN */
    return hp->recipe->one_sublayer ? KV_OK : bind_ffn(m, il, L, err);
}

/* rope_freqs.weight, or the LongRoPE factor set llama.cpp picks at its
 * default context; a set the recipe does not read is refused. */
static int bind_rope_factors(model *m, kvant_err *err)
{
    const gguf_ctx *g = m->gguf;
    const model_hparams *hp = &m->hp;
    const char *names[] = {"rope_freqs.weight", "rope_factors_long.weight",
                           "rope_factors_short.weight"};
    for (int i = 0; i < 3; i++)
        if (gguf_find_tensor(g, names[i]) && !hp->recipe->rope_factors)
            return kvant_err_set(err, KV_EUNSUP, "tensor '%s': architecture %s does not read it",
                                 names[i], hp->recipe->arch);
    if (!hp->fam.longrope)
        return bind_vec(g, &m->rope_freqs, names[0], -1, hp->rope_dim / 2, 1, err);
    if (gguf_find_tensor(g, names[0]))
        return kvant_err_set(err, KV_EUNSUP, "tensor 'rope_freqs.weight' with rope.scaling.type "
                             "longrope");
    /* both sets are optional in llama.cpp; without the one in use, no factors */
    return bind_vec(g, &m->rope_freqs, names[hp->fam.use_long ? 1 : 2], -1, hp->rope_dim / 2, 1,
                    err);
}

static void add_bytes(void *ctx, model_tensor *t)
{
    *(uint64_t *)ctx += t->data ? t->nbytes : 0;
}

static int bind_all(model *m, kvant_err *err)
{
    const model_hparams *hp = &m->hp;
    int rc;
    if ((rc = bind(m->gguf, &m->tok_embd, "token_embd.weight", -1, hp->n_embd, hp->n_vocab, 0, err)) ||
        (rc = bind_vec(m->gguf, &m->output_norm, hp->recipe->out_norm_lfm2
                       ? "token_embd_norm.weight" : "output_norm.weight", -1, hp->n_embd, 0,
                       err)) ||
        (rc = bind(m->gguf, &m->output, "output.weight", -1, hp->n_embd, hp->n_vocab, 1, err)) ||
        (rc = bind_rope_factors(m, err)))
        return rc;
    if (m->output.data && hp->recipe->output == OUTPUT_TIED)
        return kvant_err_set(err, KV_EUNSUP, "tensor 'output.weight': architecture %s always "
                             "uses token_embd for the output", hp->recipe->arch);
    m->tied_output = m->output.data == NULL;
    if (m->tied_output)
        m->output = m->tok_embd;
    /* The output head keeps about f32 accuracy (the CPU's split int8 path):
     * one int8 term there costs the most top-1 agreement per byte saved
     * (docs/QUANTIZATION.md). */
    m->output.exact = 1;
    m->layers = calloc((size_t)hp->n_layers, sizeof *m->layers);
    if (!m->layers)
        return kvant_err_set(err, KV_ENOMEM, "out of memory for %d layers", hp->n_layers);
    for (int il = 0; il < hp->n_layers; il++)
        if ((rc = bind_layer(m, il, err)))
            return rc;
    uint64_t total = 0;
    model_tensor out = m->output;
    if (m->tied_output)
        m->output.data = NULL; /* counted once, as tok_embd */
    model_for_each_tensor(m, add_bytes, &total);
    m->output = out;
    m->weights_bytes = total;
    return KV_OK;
}

model *model_load(const char *path, kvant_err *err)
{
    model *m = calloc(1, sizeof *m);
    if (!m) {
        kvant_err_set(err, KV_ENOMEM, "out of memory");
        return NULL;
    }
    snprintf(m->path, sizeof m->path, "%s", path);
    m->gguf = gguf_open(path, err);
    if (!m->gguf)
        goto fail;
    if (model_hparams_from_gguf(m->gguf, &m->hp, err) || bind_all(m, err))
        goto fail;
    m->tok = tok_create(m->gguf, err);
    if (!m->tok)
        goto fail;
    if (tok_n_vocab(m->tok) > m->hp.n_vocab) {
        kvant_err_set(err, KV_EFORMAT, "tokenizer has %d tokens but token_embd has %d rows",
                      tok_n_vocab(m->tok), m->hp.n_vocab);
        goto fail;
    }
    model_set_chat_template(m, NULL, 0);
    return m;
fail:
    model_free(m);
    return NULL;
}

void model_free(model *m)
{
    if (!m)
        return;
    tok_destroy(m->tok);
    chat_template_free(&m->chat);
    free(m->layers);
    gguf_close(m->gguf);
    free(m);
}

int model_set_chat_template(model *m, const char *src, size_t len)
{
    kvant_err cerr = {0};
    chat_template_free(&m->chat);
    m->chat_err[0] = '\0';
    m->has_chat = chat_template_from_gguf(m->gguf, src, len, &m->chat, &cerr) == KV_OK;
    if (!m->has_chat)
        snprintf(m->chat_err, sizeof m->chat_err, "%s", cerr.msg);
    return m->has_chat ? KV_OK : cerr.code;
}

int model_layer_tensors(model_layer *L, model_tensor **out)
{
    model_tensor *ts[] = {&L->attn_norm, &L->wq,     &L->wk,     &L->wv,
                          &L->wo,        &L->bq,     &L->bk,     &L->bv,
                          &L->bo,        &L->q_norm, &L->k_norm, &L->post_attn_norm,
                          &L->ffn_norm,  &L->w_gate, &L->w_up,   &L->w_down,
                          &L->b_down,    &L->post_ffn_norm, &L->ffn_gate_inp, &L->gate_exps,
                          &L->up_exps,   &L->down_exps, &L->gate_shexp, &L->up_shexp,
                          &L->down_shexp, &L->gate_inp_shexp, &L->exp_probs_b, &L->wq_a,
                          &L->q_a_norm,  &L->wq_b,   &L->wkv_a,  &L->kv_a_norm,
                          &L->wk_b,      &L->wv_b,   &L->gate_inp_b, &L->gate_exps_b,
                          &L->up_exps_b, &L->down_exps_b, &L->attn_sinks, &L->gate_up_exps,
                          &L->ssm_in,
                          &L->ssm_conv1d, &L->ssm_conv1d_b, &L->ssm_dt_b, &L->ssm_a,
                          &L->ssm_d, &L->ssm_norm, &L->ssm_out, &L->ssm_z,
                          &L->ssm_beta, &L->ssm_alpha};
    _Static_assert(sizeof ts / sizeof ts[0] <= MODEL_LAYER_TENSORS, "MODEL_LAYER_TENSORS");
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        out[i] = ts[i];
    return (int)(sizeof ts / sizeof ts[0]);
}

void model_plan_shape(const model_hparams *hp, uint64_t weights_bytes, plan_model *out)
{
    int32_t kv_layers = hp->n_kv_layers;
    *out = (plan_model){
        .n_layers = hp->n_layers, .n_embd = hp->n_embd, .n_head = hp->n_head,
        .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim, .n_ff = hp->n_ff,
        .n_vocab = hp->n_vocab, .n_ctx_train = hp->n_ctx_train, .weights_bytes = weights_bytes,
        .n_kv_total = hp->n_kv_total, .v_in_k = hp->fam.mla,
        .n_kv_layers = kv_layers == hp->n_layers ? 0 : kv_layers,
        .state_bytes = model_recr_state_bytes(&hp->fam, hp->n_embd),
    };
}

void model_expert_rows(const model_layer *L, int32_t e, const model_tensor *t[3], int64_t row0[3],
                       int64_t rows[3])
{
    const int64_t F = L->n_ff_exp, D = L->down_exps.ne[1] / L->n_expert;
    const int fused = L->gate_up_exps.nbytes > 0;
    t[0] = fused ? &L->gate_up_exps : &L->gate_exps;
    t[1] = fused ? &L->gate_up_exps : &L->up_exps;
    t[2] = &L->down_exps;
    row0[0] = fused ? e * 2 * F : e * F;
    row0[1] = fused ? e * 2 * F + F : e * F;
    row0[2] = e * D;
    rows[0] = rows[1] = F, rows[2] = D;
}

int model_has_experts(const model *m)
{
    return m->hp.fam.n_expert > 0;
}

int model_is_hybrid(const model *m)
{
    return m->hp.fam.recr != RECR_NONE;
}

void model_for_each_tensor(model *m, model_tensor_fn fn, void *ctx)
{
    fn(ctx, &m->tok_embd);
    fn(ctx, &m->output_norm);
    if (!m->tied_output)
        fn(ctx, &m->output);
    if (m->rope_freqs.data)
        fn(ctx, &m->rope_freqs);
    for (int il = 0; m->layers && il < m->hp.n_layers; il++) {
        model_tensor *ts[MODEL_LAYER_TENSORS];
        int n = model_layer_tensors(&m->layers[il], ts);
        for (int i = 0; i < n; i++)
            if (ts[i]->data)
                fn(ctx, ts[i]);
    }
}
