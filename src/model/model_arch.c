/* model_arch.c - the recipe table: one row per family, each read off
 * llama.cpp 0c1e570's graph builder for that architecture
 * (src/models/<arch>.cpp) and its load_arch_hparams defaults.
 */
#include "model/model_arch.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const model_recipe RECIPES[] = {
    {.arch = "llama", .rope = ROPE_NORM, .act = FFN_SILU, .rope_factors = 1,
     .rope_dim_full = 1, .moe = MOE_OPTIONAL, .moe_norm_w = 1,
     .notes = "pre-norm, SwiGLU, NORM rope; rope_freqs (Llama 3) or LongRoPE factors; "
              "no sliding window (Mistral runs as full attention, as in llama.cpp); "
              "experts when expert_count > 0 (Mixtral: softmax top-k, weights normalised)"},
    {.arch = "qwen2", .rope = ROPE_NEOX, .act = FFN_SILU, .qkv_bias = 1,
     .notes = "pre-norm, SwiGLU, NEOX rope, q/k/v biases"},
    {.arch = "qwen3", .rope = ROPE_NEOX, .act = FFN_SILU, .qk_norm = 1,
     .notes = "pre-norm, SwiGLU, NEOX rope, per-head q/k RMS norm before rope"},
    {.arch = "gemma2", .rope = ROPE_NEOX, .act = FFN_GELU_TANH, .output = OUTPUT_TIED,
     .swa = SWA_PATTERN, .post_norms = 1, .emb_scale = 1, .attn_softcap = 1,
     .swa_base_global = 1, .final_softcap_key = 1, .final_softcap = 30.0f, .swa_pattern = 2,
     .swa_window = 4096,
     .q_scale_layers = 46,
     .notes = "embeddings * sqrt(n_embd), pre- and post-norms, GeGLU (tanh GELU), NEOX rope, "
              "attention and final logit soft-capping, sliding window on layers il % 2 == 0"},
    {.arch = "gemma3", .rope = ROPE_NEOX, .act = FFN_GELU_TANH, .swa = SWA_PATTERN,
     .qk_norm = 1, .post_norms = 1, .emb_scale = 1, .final_softcap_key = 1, .swa_pattern = 6,
     .q_scale_layers = 62,
     .notes = "embeddings * sqrt(n_embd), pre- and post-norms, q/k RMS norm, GeGLU (tanh GELU), "
              "NEOX rope, sliding window on layers il % 6 < 5 with rope.freq_base_swa "
              "(default 10000, unscaled), optional final soft-capping"},
    {.arch = "phi3", .rope = ROPE_NEOX, .act = FFN_SILU, .swa = SWA_DISABLED, .fused_qkv = 1,
     .fused_gate_up = 1, .rope_factors = 1,
     .notes = "pre-norm, fused attn_qkv, fused gate|up SwiGLU, NEOX rope, LongRoPE "
              "factors and attn_factor; sliding window disabled as in llama.cpp"},
    {.arch = "qwen2moe", .rope = ROPE_NEOX, .act = FFN_SILU, .moe = MOE_REQUIRED,
     .moe_ff_key = 1, .moe_shared = 1,
     .notes = "pre-norm, NEOX rope, optional q/k/v biases; experts (softmax top-k, weights "
              "not normalised) plus a shared expert scaled by sigmoid(ffn_gate_inp_shexp)"},
    {.arch = "qwen3moe", .rope = ROPE_NEOX, .act = FFN_SILU, .qk_norm = 1, .moe = MOE_REQUIRED,
     .moe_norm_w = 1, .moe_ff_key = 1,
     .notes = "pre-norm, NEOX rope, per-head q/k RMS norm; experts (softmax top-k, weights "
              "normalised)"},
    {.arch = "olmoe", .rope = ROPE_NEOX, .act = FFN_SILU, .qk_norm_full = 1,
     .moe = MOE_REQUIRED,
     .notes = "pre-norm, NEOX rope, q/k RMS norm over the whole row; experts (softmax top-k, "
              "weights not normalised)"},
    {.arch = "deepseek2", .rope = ROPE_NORM, .act = FFN_SILU, .moe = MOE_OPTIONAL,
     .moe_ff_key = 1, .moe_ds = 1, .mla = 1, .yarn = 1,
     .notes = "pre-norm, NORM rope on a part of each head; multi-head latent attention (one "
              "latent + rope row per token in the KV cache, queries absorbed through attn_k_b, "
              "outputs through attn_v_b); dense leading layers, then experts (softmax or "
              "sigmoid routing, selection bias, expert groups, weight norm and scale) plus "
              "ungated shared experts"},
    {.arch = "gpt-oss", .rope = ROPE_NEOX, .act = FFN_SWIGLU_OAI, .swa = SWA_PATTERN,
     .qkv_bias = 1, .moe = MOE_REQUIRED, .moe_ff_key = 1, .yarn = 1, .attn_sinks = 1,
     .ffn_norm_post = 1, .moe_bias = 1, .moe_gate = MOE_GATE_SOFTMAX_WEIGHT,
     .swa_base_global = 1, .swa_pattern = 2,
     .notes = "pre-norm (the FFN's named post_attention_norm), NEOX rope with YaRN, q/k/v/o "
              "biases, a sink logit per head in every softmax, sliding window on layers "
              "il % 2 == 0; experts with biases (router top-k of the logits, softmax over the "
              "chosen; clamped SwiGLU x sigmoid(1.702 x) (up + 1))"},
    {.arch = "lfm2", .rope = ROPE_NEOX, .act = FFN_SILU, .qk_norm = 1, .recr = RECR_SHORTCONV,
     .out_norm_lfm2 = 1,
     .notes = "hybrid: short-convolution layers (head_count_kv 0: in_proj -> b, c, x; "
              "c * conv(b * x) over shortconv.l_cache taps; out_proj) and attention layers "
              "(per-head q/k RMS norm, NEOX rope); pre-norm SwiGLU FFN on every layer; output "
              "norm token_embd_norm"},
    {.arch = "granitehybrid", .rope = ROPE_NORM, .act = FFN_SILU, .recr = RECR_MAMBA2,
     .granite_scales = 1, .rope_finetuned_key = 1,
     .notes = "hybrid (Granite 4.0-H): Mamba-2 layers (head_count_kv 0: conv1d + SiLU, "
              "selective scan per head, D skip, SiLU(z) gate, grouped RMS norm) and attention "
              "layers (no rope when rope.scaling.finetuned is false); embedding, residual, "
              "attention and logit scales; dense SwiGLU FFN on every layer"},
    {.arch = "qwen35", .rope = ROPE_NEOX, .act = FFN_SILU, .qk_norm = 1, .ffn_norm_post = 1,
     .recr = RECR_GDN, .attn_gate = 1, .recr_interval = 1, .imrope = 1,
     .notes = "hybrid (Qwen3.5, dense): Gated DeltaNet layers (delta rule per value head on a "
              "[head_v][head_k] state, L2-normed q/k, gated RMS norm) and, every "
              "full_attention_interval-th layer, gated attention (q rows [q | gate] per head, "
              "per-head q/k RMS norm, NEOX rope over rope.dimension_count, output * "
              "sigmoid(gate)); the FFN's input norm is post_attention_norm"},
    {.arch = "nemotron_h", .rope = ROPE_NORM, .act = FFN_RELU_SQR, .recr = RECR_MAMBA2,
     .one_sublayer = 1, .nope = 1, .eps_key_ln = 1,
     .notes = "hybrid (Nemotron-H): each layer one sublayer behind its attn_norm: a Mamba-2 "
              "mixer (head_count_kv and feed_forward_length 0), attention without rope "
              "(feed_forward_length 0) or an ungated MLP down(relu(up h)^2)"},
};

#define N_RECIPES (sizeof RECIPES / sizeof RECIPES[0])

const model_recipe *model_recipe_find(const char *arch, uint64_t len)
{
    for (size_t i = 0; i < N_RECIPES; i++)
        if (strlen(RECIPES[i].arch) == len && memcmp(RECIPES[i].arch, arch, len) == 0)
            return &RECIPES[i];
    return NULL;
}

const char *model_recipe_list(void)
{
    return "llama, qwen2, qwen3, gemma2, gemma3, phi3, qwen2moe, qwen3moe, olmoe, deepseek2, "
           "gpt-oss, lfm2, granitehybrid, nemotron_h, qwen35";
}

const model_recipe *model_recipe_at(int32_t i)
{
    return i >= 0 && (size_t)i < N_RECIPES ? &RECIPES[i] : NULL;
}

int32_t model_recipe_index(const model_recipe *r)
{
    return r ? (int32_t)(r - RECIPES) : -1;
}

static int key_f32(const gguf_ctx *g, const char *arch, const char *suffix, float def, float *out,
                   kvant_err *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return gguf_get_f32_or(g, key, def, out, err);
}

static int key_u32(const gguf_ctx *g, const char *arch, const char *suffix, uint32_t def,
                   uint32_t *out, kvant_err *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return gguf_get_u32_or(g, key, def, out, err);
}

/* The per-layer flag array at key (bools or integers, one per layer) into
 * out; 1 when read, 0 when the key is absent or not an array, or an error
 * (KV_EFORMAT naming the key). */
static int layer_flags(const gguf_ctx *g, const char *key, int32_t n_layers, uint8_t *out,
                       kvant_err *err)
{
    int64_t ki = gguf_find_key(g, key);
    if (ki < 0 || gguf_kv_type(g, ki) != GGUF_TYPE_ARRAY)
        return 0;
    gguf_type et = gguf_arr_type(g, ki);
    size_t es = et == GGUF_TYPE_BOOL || et == GGUF_TYPE_UINT8 || et == GGUF_TYPE_INT8 ? 1
                : et == GGUF_TYPE_INT32 || et == GGUF_TYPE_UINT32                 ? 4
                                                                                  : 0;
    if (!es || gguf_arr_n(g, ki) != (uint64_t)n_layers)
        return kvant_err_set(err, KV_EFORMAT, "%s: must hold %d bools (one per layer)", key,
                             n_layers);
    const uint8_t *d = gguf_arr_data(g, ki);
    for (int32_t il = 0; il < n_layers; il++) {
        uint32_t v = 0;
        memcpy(&v, d + es * (size_t)il, es);
        out[il] = v != 0;
    }
    return 1;
}

/* attention.sliding_window_pattern: a bool (or integer) array, one per
 * layer, or a period n (layer il slides when il % n < n - 1; 0: all). */
static int read_swa_pattern(const gguf_ctx *g, const model_recipe *r, const model_family_base *b,
                            model_family_hp *o, kvant_err *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", b->arch);
    int rc = layer_flags(g, key, b->n_layers, o->is_swa, err);
    if (rc)
        return rc < 0 ? rc : KV_OK;
    uint32_t n = r->swa_pattern;
    rc = gguf_get_u32_or(g, key, n, &n, err);
    if (rc)
        return rc;
    for (int32_t il = 0; il < b->n_layers; il++)
        o->is_swa[il] = n == 0 || il % (int32_t)n < (int32_t)n - 1;
    return KV_OK;
}

static int read_swa(const gguf_ctx *g, const model_recipe *r, const model_family_base *b,
                    model_family_hp *o, kvant_err *err)
{
    uint32_t w = 0;
    int rc = key_u32(g, b->arch, "attention.sliding_window", r->swa_window, &w, err);
    if (rc || r->swa != SWA_PATTERN || w == 0) {
        if (!rc && r->swa == SWA_PATTERN && r->swa_window) /* llama.cpp would mask all */
            return kvant_err_set(err, KV_EFORMAT, "%s.attention.sliding_window: 0", b->arch);
        return rc;
    }
    o->n_swa = w;
    if ((rc = read_swa_pattern(g, r, b, o, err)))
        return rc;
    o->rope_base_swa = r->swa_base_global ? b->rope_base : 10000.0f;
    o->rope_scale_swa = r->swa_base_global ? b->rope_scale : 1.0f;
    if ((rc = key_f32(g, b->arch, "rope.freq_base_swa", o->rope_base_swa, &o->rope_base_swa,
                      err)))
        return rc;
    if (!(o->rope_base_swa > 0.0f))
        return kvant_err_set(err, KV_EFORMAT, "%s.rope.freq_base_swa: %g is not positive",
                             b->arch, (double)o->rope_base_swa);
    return KV_OK;
}

/* DeepSeek's routing keys (recipe moe_ds): gating function, weight norm and
 * scale, expert groups, shared experts, leading dense layers. */
static int read_moe_ds(const gguf_ctx *g, const model_family_base *b, model_family_hp *o,
                       kvant_err *err)
{
    int rc, norm = 0;
    uint32_t gating = 0, shared = 0;
    float scale = 0.0f;
    char key[128];
    snprintf(key, sizeof key, "%s.expert_weights_norm", b->arch);
    if ((rc = gguf_get_bool_or(g, key, 0, &norm, err)) ||
        (rc = key_u32(g, b->arch, "expert_gating_func", 0, &gating, err)) ||
        (rc = key_f32(g, b->arch, "expert_weights_scale", 0.0f, &scale, err)) ||
        (rc = key_u32(g, b->arch, "expert_shared_count", 0, &shared, err)))
        return rc;
    if (gating > MOE_GATE_SIGMOID)
        return kvant_err_set(err, KV_EUNSUP, "%s.expert_gating_func %u: kvant routes with "
                             "softmax (1) or sigmoid (2)", b->arch, gating);
    if (!isfinite(scale) || scale < 0.0f || scale > 1e4f)
        return kvant_err_set(err, KV_EFORMAT, "%s.expert_weights_scale %g out of range",
                             b->arch, (double)scale);
    if (shared > 64)
        return kvant_err_set(err, KV_EFORMAT, "%s.expert_shared_count %u out of range", b->arch,
                             shared);
    o->moe_norm_w = (uint8_t)(norm != 0);
    o->moe_gating = gating == MOE_GATE_SIGMOID ? MOE_GATE_SIGMOID : MOE_GATE_SOFTMAX;
    o->moe_w_scale = scale == 0.0f ? 1.0f : scale; /* llama.cpp: 0 and 1 both mean none */
    o->n_ff_shexp = o->n_ff_exp * shared;
    return KV_OK;
}

/* The experts' keys as llama.cpp reads them for the recipe's family; what
 * it would read and kvant does not implement is refused, naming the key. */
static int read_moe(const gguf_ctx *g, const model_recipe *r, const model_family_base *b,
                    model_family_hp *o, kvant_err *err)
{
    int rc;
    o->moe_norm_w = r->moe_norm_w;
    o->moe_gating = r->moe_gate ? r->moe_gate : MOE_GATE_SOFTMAX;
    o->moe_w_scale = 1.0f;
    if ((rc = key_u32(g, b->arch, "expert_count", 0, &o->n_expert, err)) ||
        (rc = key_u32(g, b->arch, "expert_used_count", 0, &o->n_expert_used, err)) ||
        (rc = key_u32(g, b->arch, "expert_group_count", 0, &o->n_group, err)) ||
        (rc = key_u32(g, b->arch, "expert_group_used_count", 0, &o->n_group_used, err)) ||
        (r->moe_ds && (rc = key_u32(g, b->arch, "leading_dense_block_count", 0,
                                    &o->n_dense_lead, err))))
        return rc;
    if (o->n_dense_lead > (uint32_t)b->n_layers)
        return kvant_err_set(err, KV_EFORMAT, "%s.leading_dense_block_count %u exceeds %d "
                             "layers", b->arch, o->n_dense_lead, b->n_layers);
    if (o->n_expert == 0 && r->moe_ds && o->n_dense_lead < (uint32_t)b->n_layers)
        return kvant_err_set(err, KV_EFORMAT, "%s.expert_count 0: layers from "
                             "leading_dense_block_count %u on use experts", b->arch,
                             o->n_dense_lead);
    if (o->n_expert == 0 && r->moe != MOE_REQUIRED)
        return KV_OK;
    if (r->moe == MOE_NONE)
        return kvant_err_set(err, KV_EUNSUP, "%s.expert_count %u: architecture %s has no "
                             "experts in kvant", b->arch, o->n_expert, b->arch);
    if (o->n_expert < 1 || o->n_expert > MODEL_MAX_EXPERTS)
        return kvant_err_set(err, KV_EFORMAT, "%s.expert_count %u outside [1, %d]", b->arch,
                             o->n_expert, MODEL_MAX_EXPERTS);
    if (o->n_expert_used < 1 || o->n_expert_used > o->n_expert ||
        o->n_expert_used > MODEL_MAX_EXPERT_USED)
        return kvant_err_set(err, KV_EFORMAT, "%s.expert_used_count %u outside [1, %u] (limit %d)",
                             b->arch, o->n_expert_used, o->n_expert, MODEL_MAX_EXPERT_USED);
    /* llama.cpp reads expert groups for every family (DeepSeek-V3 has them) */
    if (o->n_group > 1 && (o->n_expert % o->n_group || o->n_group_used < 1 ||
                           o->n_group_used >= o->n_group || o->n_group >= o->n_expert))
        return kvant_err_set(err, KV_EFORMAT, "%s.expert_group_count %u / _used_count %u: "
                             "groups must divide %u experts and keep some but not all",
                             b->arch, o->n_group, o->n_group_used, o->n_expert);
    if (o->n_group <= 1)
        o->n_group = o->n_group_used = 0;
    o->n_ff_exp = (uint32_t)b->n_ff;
    if (r->moe_ff_key &&
        (rc = key_u32(g, b->arch, "expert_feed_forward_length",
                      (uint32_t)b->n_ff / o->n_expert_used, &o->n_ff_exp, err)))
        return rc;
    char key[128];
    snprintf(key, sizeof key, "%s.expert_shared_feed_forward_length", b->arch);
    if (!r->moe_shared && gguf_find_key(g, key) >= 0)
        return kvant_err_set(err, KV_EUNSUP, "%s: shared experts are not supported for %s", key,
                             b->arch);
    if (r->moe_shared && (rc = gguf_get_u32_or(g, key, (uint32_t)b->n_ff, &o->n_ff_shexp, err)))
        return rc;
    if (o->n_ff_exp < 1 || o->n_ff_exp > (1u << 20))
        return kvant_err_set(err, KV_EFORMAT, "%s: expert width %u out of range", b->arch,
                             o->n_ff_exp);
    if (r->moe_ds && (rc = read_moe_ds(g, b, o, err)))
        return rc;
    if (o->n_ff_shexp > (1u << 20))
        return kvant_err_set(err, KV_EFORMAT, "%s: shared expert width %u out of range",
                             b->arch, o->n_ff_shexp);
    return KV_OK;
}

/* YaRN (rope.scaling.type yarn): the ramp's dims and the factors llama.cpp
 * derives (llama_context's yarn_attn_factor, ggml's rope_yarn mscale); a
 * deepseek2 file's yarn_log_multiplier is stored as 0.1 * mscale_all_dim. */
static int read_yarn(const gguf_ctx *g, const model_family_base *b, model_family_hp *o,
                     kvant_err *err)
{
    const float F = 1.0f / b->rope_scale, lnF = logf(F);
    float *log_mul = &o->yarn_log_mul;
    int rc = key_f32(g, b->arch, "rope.scaling.yarn_log_multiplier", 0.0f, log_mul, err);
    if (rc)
        return rc;
    *log_mul /= 0.1f;
    if (!b->yarn) /* linear or none: only deepseek2's attention scale reads the factor */
        return KV_OK;
    if (!isfinite(*log_mul) || !(F >= 1.0f))
        return kvant_err_set(err, KV_EFORMAT, "%s: yarn factor %g / log multiplier out of range",
                             b->arch, (double)F);
    float af = 1.0f; /* get_mscale(F, m) / get_mscale(F, m) with m the log multiplier */
    if (*log_mul == 0.0f)
        af = F <= 1.0f ? 1.0f : 0.1f * lnF + 1.0f;
    af *= 1.0f / (1.0f + 0.1f * lnF);
    o->rope_attn_factor *= af;                 /* the graph's attn_factor */
    o->yarn = 1;
    const float n = (float)b->rope_dim, ctx = (float)o->n_ctx_orig, lb = 2.0f * logf(b->rope_base);
    const float lo = floorf(n * logf(ctx / (32.0f * 2.0f * (float)M_PI)) / lb);
    const float hi = ceilf(n * logf(ctx / (1.0f * 2.0f * (float)M_PI)) / lb);
    o->yarn_corr[0] = lo > 0.0f ? lo : 0.0f;
    o->yarn_corr[1] = hi < n - 1.0f ? hi : n - 1.0f;
    o->rope_attn_factor *= 1.0f + 0.1f * lnF; /* ggml's rope_yarn scales cos and sin too */
    return KV_OK;
}

/* Latent attention's widths (recipe mla).  A file without key_length_mla is
 * an older conversion (attn_kv_b, no latent cache in llama.cpp either). */
static int read_mla(const gguf_ctx *g, const model_family_base *b, model_family_hp *o,
                    kvant_err *err)
{
    uint32_t k_mla = 0, v_len = 0;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.key_length_mla", b->arch);
    if (gguf_find_key(g, key) < 0)
        return kvant_err_set(err, KV_EUNSUP, "%s is missing: a conversion without the split "
                             "attn_k_b / attn_v_b (latent KV cache); convert the model again",
                             key);
    int rc;
    if ((rc = gguf_get_u32_or(g, key, 0, &k_mla, err)) ||
        (rc = key_u32(g, b->arch, "attention.value_length_mla", 0, &o->n_v_mla, err)) ||
        (rc = key_u32(g, b->arch, "attention.kv_lora_rank", 0, &o->n_lora_kv, err)) ||
        (rc = key_u32(g, b->arch, "attention.q_lora_rank", 0, &o->n_lora_q, err)) ||
        (rc = key_u32(g, b->arch, "attention.value_length", o->n_lora_kv, &v_len, err)))
        return rc;
    if (b->n_head_kv != 1)
        return kvant_err_set(err, KV_EFORMAT, "%s.attention.head_count_kv %d: latent attention "
                             "keeps one KV row per token (1)", b->arch, b->n_head_kv);
    if (o->n_lora_kv < 1 || (int64_t)o->n_lora_kv + b->rope_dim != b->head_dim ||
        v_len != o->n_lora_kv)
        return kvant_err_set(err, KV_EFORMAT, "%s: attention.key_length %d must be "
                             "kv_lora_rank %u + rope.dimension_count %d, value_length %u "
                             "kv_lora_rank", b->arch, b->head_dim, o->n_lora_kv, b->rope_dim,
                             v_len);
    if (k_mla <= (uint32_t)b->rope_dim || k_mla > MODEL_MAX_MLA_ROW || o->n_v_mla < 1 ||
        o->n_v_mla > MODEL_MAX_MLA_ROW || o->n_lora_q > (1u << 16))
        return kvant_err_set(err, KV_EFORMAT, "%s: key_length_mla %u (rope %d), "
                             "value_length_mla %u or q_lora_rank %u out of range", b->arch,
                             k_mla, b->rope_dim, o->n_v_mla, o->n_lora_q);
    o->mla = 1;
    o->n_qk_nope = k_mla - (uint32_t)b->rope_dim;
    /* the decompressed head's width, and llama.cpp's deepseek2 pre-scaling for YaRN:
     * mscale = attn_factor (1 + 0.1 ln F) (1 + 0.1 log_mul ln F), scale mscale^2, where
     * attn_factor is the graph's (read_yarn multiplied the rope's by 1 + 0.1 ln F) */
    const float lnF = logf(1.0f / b->rope_scale);
    const float af = o->yarn ? o->rope_attn_factor / (1.0f + 0.1f * lnF) : o->rope_attn_factor;
    const float ms = af * (1.0f + 0.1f * lnF) * (1.0f + 0.1f * o->yarn_log_mul * lnF);
    o->q_scale = ms * ms / sqrtf((float)k_mla);
    return KV_OK;
}

/* Granite's scales (recipe granite_scales); 0 in the file means none, as
 * llama.cpp reads them. */
static int read_granite(const gguf_ctx *g, const model_recipe *r, const model_family_base *b,
                        model_family_hp *o, kvant_err *err)
{
    float emb = 0.0f, res = 0.0f, att = 0.0f, logit = 0.0f;
    int rc;
    if (!r->granite_scales)
        return KV_OK;
    if ((rc = key_f32(g, b->arch, "embedding_scale", 0.0f, &emb, err)) ||
        (rc = key_f32(g, b->arch, "residual_scale", 0.0f, &res, err)) ||
        (rc = key_f32(g, b->arch, "attention.scale", 0.0f, &att, err)) ||
        (rc = key_f32(g, b->arch, "logit_scale", 0.0f, &logit, err)))
        return rc;
    const float v[4] = {emb, res, att, logit};
    for (int i = 0; i < 4; i++)
        if (!isfinite(v[i]) || v[i] < 0.0f || v[i] > 1e6f)
            return kvant_err_set(err, KV_EFORMAT, "%s: embedding/residual/attention/logit scale "
                                 "%g out of range", b->arch, (double)v[i]);
    if (emb != 0.0f)
        o->emb_scale = emb;
    if (res != 0.0f)
        o->residual_scale = res;
    if (att != 0.0f)
        o->q_scale = att;
    if (logit != 0.0f)
        o->logit_scale = logit;
    return KV_OK;
}

/* Which layers are recurrent: head_count_kv 0 in the per-layer array. */
/* {arch}.{suffix} as one value per layer (a u32 repeated, or the per-layer
 * int array); 0 fills a missing key. */
static int layer_values(const gguf_ctx *g, const char *arch, const char *suffix, int32_t n_layers,
                        uint32_t *out, kvant_err *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t ki = gguf_find_key(g, key);
    if (ki < 0 || gguf_kv_type(g, ki) != GGUF_TYPE_ARRAY) {
        uint32_t v = 0;
        int rc = gguf_get_u32_or(g, key, 0, &v, err);
        for (int32_t il = 0; il < n_layers; il++)
            out[il] = v;
        return rc;
    }
    gguf_type et = gguf_arr_type(g, ki);
    if ((et != GGUF_TYPE_INT32 && et != GGUF_TYPE_UINT32) ||
        gguf_arr_n(g, ki) != (uint64_t)n_layers)
        return kvant_err_set(err, KV_EFORMAT, "%s: array must hold %d int32/uint32 values (one "
                             "per layer)", key, n_layers);
    memcpy(out, gguf_arr_data(g, ki), 4 * (size_t)n_layers);
    return KV_OK;
}

/* Recipe recr_interval (qwen35): attention.recurrent_layers (a bool or int
 * per layer), else every full_attention_interval-th layer attends (default
 * 4, as llama.cpp). */
static int read_recr_interval(const gguf_ctx *g, const model_family_base *b, model_family_hp *o,
                              kvant_err *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.attention.recurrent_layers", b->arch);
    int rc = layer_flags(g, key, b->n_layers, o->is_recr, err);
    if (rc < 0)
        return rc;
    if (rc == 0 && gguf_find_key(g, key) >= 0)
        return kvant_err_set(err, KV_EFORMAT, "%s: must hold %d bools (one per layer)", key,
                             b->n_layers);
    for (int32_t il = 0; rc && il < b->n_layers; il++)
        o->n_recr += o->is_recr[il];
    if (rc)
        return KV_OK;
    uint32_t n = 4;
    rc = key_u32(g, b->arch, "full_attention_interval", 4, &n, err);
    if (rc)
        return rc;
    if (n < 1 || n > (uint32_t)MODEL_MAX_LAYERS)
        return kvant_err_set(err, KV_EFORMAT, "%s.full_attention_interval %u out of range",
                             b->arch, n);
    for (int32_t il = 0; il < b->n_layers; il++) {
        o->is_recr[il] = (uint32_t)(il + 1) % n != 0;
        o->n_recr += o->is_recr[il];
    }
    return KV_OK;
}

/* Which layers are recurrent: head_count_kv 0 in the per-layer array (and,
 * recipe one_sublayer, feed_forward_length 0: the others with
 * feed_forward_length > 0 are MLP layers). */
static int read_recr_layers(const gguf_ctx *g, const model_recipe *r,
                            const model_family_base *b, model_family_hp *o, kvant_err *err)
{
    uint32_t kv[MODEL_MAX_LAYERS], ff[MODEL_MAX_LAYERS];
    if (r->recr_interval)
        return read_recr_interval(g, b, o, err);
    int rc = layer_values(g, b->arch, "attention.head_count_kv", b->n_layers, kv, err);
    if (rc || (rc = layer_values(g, b->arch, "feed_forward_length", b->n_layers, ff, err)))
        return rc;
    for (int32_t il = 0; il < b->n_layers; il++) {
        o->is_mlp[il] = r->one_sublayer && ff[il] > 0;
        o->is_recr[il] = kv[il] == 0 && !o->is_mlp[il];
        o->n_recr += o->is_recr[il];
    }
    return KV_OK;
}

/* The recurrent layers' widths (recipe recr), checked against what the
 * kernels and llama.cpp's graph take. */
static int read_recr(const gguf_ctx *g, const model_recipe *r, const model_family_base *b,
                     model_family_hp *o, kvant_err *err)
{
    int rc;
    if (!r->recr || (rc = read_recr_layers(g, r, b, o, err)))
        return r->recr ? rc : KV_OK;
    if (o->n_recr == 0)
        return KV_OK;
    o->recr = r->recr;
    if (r->recr == RECR_SHORTCONV) {
        uint32_t swa = 0;
        if ((rc = key_u32(g, b->arch, "shortconv.l_cache", 0, &o->ssm_d_conv, err)) ||
            (rc = key_u32(g, b->arch, "attention.sliding_window", 0, &swa, err)))
            return rc;
        if (swa > 0)
            return kvant_err_set(err, KV_EUNSUP, "%s.attention.sliding_window %u: windowed "
                                 "attention layers of %s are not implemented", b->arch, swa,
                                 b->arch);
        o->ssm_d_inner = (uint32_t)b->n_embd;
        if (o->ssm_d_conv < 2 || o->ssm_d_conv > 64)
            return kvant_err_set(err, KV_EFORMAT, "%s.shortconv.l_cache %u outside [2, 64]",
                                 b->arch, o->ssm_d_conv);
        return KV_OK;
    }
    if ((rc = key_u32(g, b->arch, "ssm.conv_kernel", 0, &o->ssm_d_conv, err)) ||
        (rc = key_u32(g, b->arch, "ssm.inner_size", 0, &o->ssm_d_inner, err)) ||
        (rc = key_u32(g, b->arch, "ssm.state_size", 0, &o->ssm_d_state, err)) ||
        (rc = key_u32(g, b->arch, "ssm.time_step_rank", 0, &o->ssm_n_head, err)) ||
        (rc = key_u32(g, b->arch, "ssm.group_count", 1, &o->ssm_n_group, err)))
        return rc;
    const uint32_t H = o->ssm_n_head, G = o->ssm_n_group, D = o->ssm_d_inner;
    if (o->ssm_d_conv < 2 || o->ssm_d_conv > 64 || o->ssm_d_state < 1 ||
        o->ssm_d_state > 1024 || H < 1 || G < 1 || D < 1 || D > (1u << 16) || D % H ||
        H % G || D % G)
        return kvant_err_set(err, KV_EFORMAT, "%s.ssm: conv_kernel %u, inner_size %u, "
                             "state_size %u, time_step_rank %u, group_count %u are not a "
                             "Mamba-2 shape (heads divide inner_size, groups divide heads)",
                             b->arch, o->ssm_d_conv, D, o->ssm_d_state, H, G);
    if (r->recr == RECR_GDN && D / H != o->ssm_d_state) /* llama.cpp asserts S_k == S_v */
        return kvant_err_set(err, KV_EUNSUP, "%s: Gated DeltaNet with value heads of %u and key "
                             "heads of %u (ssm.state_size): kvant, as llama.cpp, needs them equal",
                             b->arch, D / H, o->ssm_d_state);
    if (r->granite_scales && D != 2u * (uint32_t)b->n_embd) /* llama.cpp asserts it */
        return kvant_err_set(err, KV_EFORMAT, "%s.ssm.inner_size %u: must be 2 x "
                             "embedding_length %d", b->arch, D, b->n_embd);
    char key[128];
    snprintf(key, sizeof key, "%s.ssm.dt_b_c_rms", b->arch);
    if (gguf_find_key(g, key) >= 0)
        return kvant_err_set(err, KV_EUNSUP, "%s: RMS norms of dt, B and C are not implemented",
                             key);
    return KV_OK;
}

/* rope.dimension_sections (recipe imrope), as ggml's interleaved multi-rope
 * assigns pairs: pair s takes section s % 3 (t, h, w) while s < 3 x that
 * section's size, else the fourth (e), whose position is 0 for text (the
 * pair would not rotate).  Text tokens have t = h = w = their position, so
 * a file whose t/h/w sections cover every rotated pair ropes as NEOX. */
static int read_imrope(const gguf_ctx *g, const model_recipe *r, const model_family_base *b,
                       kvant_err *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.rope.dimension_sections", b->arch);
    int64_t ki = gguf_find_key(g, key);
    if (!r->imrope || ki < 0)
        return KV_OK;
    if (gguf_kv_type(g, ki) != GGUF_TYPE_ARRAY || gguf_arr_n(g, ki) < 3 ||
        (gguf_arr_type(g, ki) != GGUF_TYPE_INT32 && gguf_arr_type(g, ki) != GGUF_TYPE_UINT32))
        return kvant_err_set(err, KV_EFORMAT, "%s: must hold 4 int32 sections", key);
    int32_t sec[3];
    memcpy(sec, gguf_arr_data(g, ki), sizeof sec);
    for (int32_t s = 0; s < b->rope_dim / 2; s++)
        if (!(s % 3 == 0 && s < 3 * sec[0]) && !(s % 3 == 1 && s < 3 * sec[1]) &&
            !(s % 3 == 2 && s < 3 * sec[2]))
            return kvant_err_set(err, KV_EUNSUP, "%s [%d, %d, %d]: rotated pair %d falls in the "
                                 "fourth section (not rotated for text); not implemented",
                                 key, sec[0], sec[1], sec[2], s);
    return KV_OK;
}

/* rope.scaling.finetuned (recipe rope_finetuned_key): false means no rope. */
static int read_rope_finetuned(const gguf_ctx *g, const model_recipe *r,
                               const model_family_base *b, model_family_hp *o, kvant_err *err)
{
    o->no_rope = r->nope;
    if (!r->rope_finetuned_key)
        return KV_OK;
    char key[128];
    int tuned = 1;
    snprintf(key, sizeof key, "%s.rope.scaling.finetuned", b->arch);
    int rc = gguf_get_bool_or(g, key, 1, &tuned, err);
    o->no_rope = !tuned;
    return rc;
}

uint64_t model_recr_conv_floats(const model_family_hp *f, int32_t n_embd)
{
    if (!f->recr)
        return 0;
    return (uint64_t)(f->ssm_d_conv - 1) * (uint64_t)model_recr_conv_channels(f, n_embd);
}

int64_t model_recr_conv_channels(const model_family_hp *f, int32_t n_embd)
{
    return f->recr == RECR_SHORTCONV ? (int64_t)n_embd
                                     : (int64_t)f->ssm_d_inner + 2ll * f->ssm_n_group * f->ssm_d_state;
}

uint64_t model_recr_ssm_floats(const model_family_hp *f)
{
    /* Mamba-2 [heads][head_dim][d_state], Gated DeltaNet [v heads][head_v][head_k] */
    return f->recr == RECR_MAMBA2 || f->recr == RECR_GDN
               ? (uint64_t)f->ssm_d_inner * f->ssm_d_state
               : 0;
}

uint64_t model_recr_state_bytes(const model_family_hp *f, int32_t n_embd)
{
    return (uint64_t)f->n_recr * (model_recr_conv_floats(f, n_embd) + model_recr_ssm_floats(f)) *
           sizeof(float);
}

int model_family_read(const gguf_ctx *g, const model_recipe *r, const model_family_base *b,
                      model_family_hp *o, kvant_err *err)
{
    memset(o, 0, sizeof *o);
    o->q_scale = 1.0f / sqrtf((float)b->head_dim);
    if (r->q_scale_layers && b->n_layers == r->q_scale_layers)
        o->q_scale = 1.0f / sqrtf((float)(b->n_embd / b->n_head));
    o->emb_scale = r->emb_scale ? sqrtf((float)b->n_embd) : 1.0f;
    o->residual_scale = o->logit_scale = 1.0f;
    int rc;
    if ((rc = read_granite(g, r, b, o, err)) || (rc = read_recr(g, r, b, o, err)) ||
        (rc = read_rope_finetuned(g, r, b, o, err)) || (rc = read_imrope(g, r, b, err)))
        return rc;
    if (r->attn_softcap &&
        (rc = key_f32(g, b->arch, "attn_logit_softcapping", 50.0f, &o->attn_softcap, err)))
        return rc;
    if (r->final_softcap_key && /* others, like llama.cpp, do not read it */
        (rc = key_f32(g, b->arch, "final_logit_softcapping", r->final_softcap,
                      &o->final_softcap, err)))
        return rc;
    if (o->attn_softcap < 0.0f || o->final_softcap < 0.0f || !isfinite(o->attn_softcap) ||
        !isfinite(o->final_softcap))
        return kvant_err_set(err, KV_EFORMAT, "%s: negative logit soft-capping", b->arch);
    if ((rc = key_f32(g, b->arch, "rope.scaling.attn_factor", 1.0f, &o->rope_attn_factor, err)))
        return rc;
    if (!(o->rope_attn_factor > 0.0f && o->rope_attn_factor < 100.0f))
        return kvant_err_set(err, KV_EFORMAT, "%s.rope.scaling.attn_factor: %g out of range",
                             b->arch, (double)o->rope_attn_factor);
    if ((rc = key_u32(g, b->arch, "rope.scaling.original_context_length", b->n_ctx_train,
                      &o->n_ctx_orig, err)))
        return rc;
    o->use_long = b->n_ctx_train > o->n_ctx_orig;
    uint32_t nextn = 0; /* llama.cpp runs block_count - N trunk layers and skips these */
    if ((rc = key_u32(g, b->arch, "nextn_predict_layers", 0, &nextn, err)))
        return rc;
    if (nextn > 0)
        return kvant_err_set(err, KV_EUNSUP, "%s.nextn_predict_layers %u: multi-token-prediction "
                             "layers are not read (they would run as decoder layers)", b->arch,
                             nextn);
    if ((rc = read_moe(g, r, b, o, err)))
        return rc;
    if (r->yarn && (rc = read_yarn(g, b, o, err)))
        return rc;
    if (r->mla && (rc = read_mla(g, b, o, err)))
        return rc;
    return read_swa(g, r, b, o, err);
}
