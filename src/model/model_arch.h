/* model_arch.h - the layer recipe of each model family kvant runs.
 *
 * A family is data: one row of model_arch.c's table says how llama.cpp
 * builds that architecture's graph (norm placement, attention variant,
 * rope variant, FFN variant, scalings, which tensors exist), and the
 * loader (model.c) and the forward pass (forward/forward.c) walk it.
 * Adding a family is a table row plus any op it needs; values that vary
 * per layer (sliding window or global, rope base and scale, head counts)
 * live in model_layer.
 *
 * Header only for the types; model_arch.c holds the table.  Threading:
 * the table is immutable.
 */
#ifndef KVANT_MODEL_ARCH_H
#define KVANT_MODEL_ARCH_H

#include <stdint.h>

#include "format/gguf.h"
#include "util/err.h"

#define MODEL_MAX_LAYERS 512
#define MODEL_MAX_HEAD_DIM 256
#define MODEL_MAX_MLA_ROW 1024     /* latent attention's key_length (kv_lora_rank + rope) */
#define MODEL_MAX_EXPERTS 512      /* {arch}.expert_count (llama.cpp's LLAMA_MAX_EXPERTS) */
#define MODEL_MAX_EXPERT_USED 64   /* {arch}.expert_used_count: slots per token */

typedef enum rope_kind {
    ROPE_NORM = 0, /* rotate adjacent pairs (x[2i], x[2i+1]): llama */
    ROPE_NEOX = 1, /* rotate (x[i], x[i + n/2]): qwen2/3, gemma2/3, phi3 */
} rope_kind;

typedef enum ffn_act {
    FFN_SILU = 0,      /* SwiGLU: silu(gate) * up */
    FFN_GELU_TANH = 1, /* GeGLU: gelu_tanh(gate) * up (ggml_gelu) */
    FFN_SWIGLU_OAI = 2,/* gpt-oss: x = min(gate, 7): x sigmoid(1.702 x) (clamp(up, -7, 7) + 1) */
    FFN_RELU_SQR = 3,  /* ungated: down(relu(up h)^2) (nemotron_h's MLP layers) */
} ffn_act;

typedef enum swa_kind {
    SWA_NONE = 0,    /* no sliding window (a window key, if any, is not read: llama.cpp
                      * does not read one for this architecture) */
    SWA_PATTERN = 1, /* attention.sliding_window (+ _pattern): window layers attend to
                      * positions (p - W, p] (llama.cpp LLAMA_SWA_TYPE_STANDARD) */
    SWA_DISABLED = 2,/* the key is read and ignored, as llama.cpp does (phi3) */
} swa_kind;

typedef enum moe_kind {
    MOE_NONE = 0,     /* dense FFN only; an expert_count > 0 is refused */
    MOE_OPTIONAL = 1, /* experts when {arch}.expert_count > 0 (llama: Mixtral) */
    MOE_REQUIRED = 2, /* always experts (qwen2moe, qwen3moe, olmoe) */
} moe_kind;

typedef enum moe_gating {
    MOE_GATE_SOFTMAX = 1, /* {arch}.expert_gating_func values, as llama.cpp numbers them */
    MOE_GATE_SIGMOID = 2,
    MOE_GATE_SOFTMAX_WEIGHT = 3, /* top-k of the logits, softmax over the chosen (gpt-oss) */
} moe_gating;

/* Recurrent layers of a hybrid family (the layers whose
 * attention.head_count_kv is 0 in the file's per-layer array). */
typedef enum recr_kind {
    RECR_NONE = 0,
    RECR_SHORTCONV = 1, /* lfm2: in_proj -> b, c, x; y = c * conv(b * x) over shortconv.l_cache
                         * taps (no bias); out_proj */
    RECR_MAMBA2 = 2,    /* granitehybrid: ssm_in -> z | xBC | dt; silu(conv(xBC) + b); the
                         * selective scan per head; + D x; * silu(z); grouped RMS norm; ssm_out */
    RECR_GDN = 3,       /* qwen35: Gated DeltaNet: attn_qkv -> q | k | v, silu(conv), q and k
                         * L2-normed per head; per value head the delta rule on a
                         * [head_v][head_k] state decayed by exp(g), g = softplus(alpha + dt_b) a,
                         * written with sigmoid(beta); o = S q / sqrt(head_k); RMS norm per head
                         * * silu(attn_gate h); ssm_out */
} recr_kind;

typedef enum output_kind {
    OUTPUT_OPTIONAL = 0, /* output.weight, or tied to token_embd when absent */
    OUTPUT_TIED = 1,     /* always token_embd; an output.weight is refused (gemma2) */
} output_kind;

typedef struct model_recipe {
    const char *arch;      /* general.architecture */
    rope_kind rope;
    ffn_act act;
    output_kind output;
    swa_kind swa;
    uint8_t qkv_bias;      /* attn_{q,k,v}.bias required (qwen2) */
    uint8_t qk_norm;       /* attn_q_norm / attn_k_norm: per-head RMS norm before rope */
    uint8_t qk_norm_full;  /* attn_q_norm / attn_k_norm over the whole q / k row (olmoe) */
    moe_kind moe;          /* mixture-of-experts FFN (llama.cpp build_moe_ffn, softmax
                            * gating, top expert_used_count) */
    uint8_t moe_norm_w;    /* the top-k weights are divided by their sum (qwen3moe, llama) */
    uint8_t moe_ff_key;    /* {arch}.expert_feed_forward_length (default n_ff / n_used);
                            * else experts are feed_forward_length wide */
    uint8_t moe_shared;    /* shared expert ffn_*_shexp scaled by sigmoid(h . ffn_gate_inp_shexp),
                            * {arch}.expert_shared_feed_forward_length (qwen2moe) */
    uint8_t moe_ds;        /* DeepSeek experts: expert_gating_func, expert_weights_norm /
                            * _scale, expert groups, exp_probs_b selection bias,
                            * expert_shared_count ungated shared experts,
                            * leading_dense_block_count dense layers first */
    uint8_t mla;           /* multi-head latent attention (deepseek2): q (or q_a / q_b),
                            * kv_a_mqa, kv_a_norm, k_b / v_b; one latent KV row per token */
    uint8_t post_norms;    /* post_attention_norm / post_ffw_norm on each branch's output
                            * before the residual add (gemma) */
    uint8_t fused_qkv;     /* attn_qkv.weight: rows Q | K | V (phi3) */
    uint8_t fused_gate_up; /* ffn_up.weight: rows gate | up, 2 * n_ff (phi3) */
    uint8_t emb_scale;     /* embeddings * sqrt(n_embd) (gemma) */
    uint8_t attn_softcap;  /* {arch}.attn_logit_softcapping, default 50 (gemma2) */
    uint8_t rope_factors;  /* rope_freqs.weight (llama 3) or LongRoPE long/short factors */
    uint8_t rope_dim_full; /* rope.dimension_count must equal the head size (llama) */
    uint8_t yarn;          /* rope.scaling.type yarn is read (deepseek2, gpt-oss) */
    uint8_t attn_sinks;    /* attn_sinks.weight [n_head]: a logit per head in each softmax
                            * with no value (gpt-oss) */
    uint8_t ffn_norm_post; /* the FFN's input norm is named post_attention_norm (gpt-oss) */
    uint8_t moe_bias;      /* ffn_gate_inp.bias and the experts' ffn_*_exps.bias (gpt-oss) */
    uint8_t moe_gate;      /* moe_gating of the family (0: softmax; deepseek2 reads a key) */
    uint8_t swa_base_global; /* window layers' rope base defaults to rope.freq_base and use
                              * its scale (gemma2); else 10000 and unscaled (gemma3) */
    uint8_t final_softcap_key; /* {arch}.final_logit_softcapping is read (gemma) */
    float final_softcap;   /* its default (0: none; gemma2 30) */
    uint32_t swa_pattern;  /* default attention.sliding_window_pattern (SWA_PATTERN) */
    uint32_t swa_window;   /* default window when the key is absent (0: no window layers) */
    uint8_t recr;          /* recr_kind of the family's recurrent layers (0: none) */
    uint8_t granite_scales;/* {arch}.embedding_scale, residual_scale (each branch's output),
                            * attention.scale, logit_scale (logits divided) are read */
    uint8_t rope_finetuned_key; /* rope.scaling.finetuned false: no rope at all (Granite 4.0-H) */
    uint8_t out_norm_lfm2; /* the output norm is named token_embd_norm.weight (lfm2) */
    uint8_t one_sublayer;  /* each layer is one sublayer behind attn_norm: recurrent
                            * (head_count_kv and feed_forward_length 0), attention
                            * (feed_forward_length 0) or an MLP (head_count_kv 0)
                            * (nemotron_h) */
    uint8_t nope;          /* attention without rope (nemotron_h) */
    uint8_t eps_key_ln;    /* attention.layer_norm_epsilon stands in for a missing
                            * attention.layer_norm_rms_epsilon (nemotron_h) */
    uint8_t attn_gate;     /* attn_q's rows are per head [q | gate]; the attention's output
                            * is multiplied by sigmoid(gate) before attn_output (qwen35) */
    uint8_t imrope;        /* rope.dimension_sections (interleaved multi-section rope) is read:
                            * text positions are the same in every section, so it is the
                            * recipe's rope when the t/h/w sections cover every rotated pair */
    uint8_t recr_interval; /* recurrent layers from attention.recurrent_layers or
                            * full_attention_interval (every n-th layer attends; qwen35),
                            * not from head_count_kv 0 */
    int32_t q_scale_layers;/* block_count of the one size whose query scale is
                            * 1/sqrt(n_embd / n_head) (gemma 27B); 0: never */
    const char *notes;     /* what `kvant info` shows for the recipe */
} model_recipe;

/* A recipe's values as one file sets them (model_family_read). */
typedef struct model_family_hp {
    float q_scale;          /* attention score scale (1/sqrt(head_dim) unless the recipe
                             * says otherwise) */
    float attn_softcap;     /* > 0: scores = c * tanh(scores / c), after the scale */
    float final_softcap;    /* > 0: logits = c * tanh(logits / c) */
    float emb_scale;        /* 1, or sqrt(n_embd) as an f32 (gemma) */
    float rope_attn_factor; /* rope.scaling.attn_factor: scales cos and sin (LongRoPE) */
    uint32_t n_swa;         /* window of the window layers (0: none) */
    float rope_base_swa, rope_scale_swa; /* rope of the window layers */
    uint32_t n_ctx_orig;    /* rope.scaling.original_context_length (n_ctx_train if absent) */
    int yarn;               /* rope.scaling.type yarn (recipe yarn): ext factor 1, the ramp
                             * between yarn_corr dims (beta_fast 32, beta_slow 1) */
    float yarn_corr[2];
    float yarn_log_mul;     /* rope.scaling.yarn_log_multiplier / 0.1 (deepseek2's mscale) */
    int longrope;           /* rope.scaling.type longrope: factors rope_factors_long/short */
    int use_long;           /* LongRoPE: the long factors (n_ctx_train > n_ctx_orig, llama.cpp's
                             * choice at its default context) */
    uint32_t n_expert;      /* expert_count (0: dense FFN) */
    uint32_t n_expert_used; /* expert_used_count: experts per token */
    uint32_t n_ff_exp;      /* one expert's FFN width */
    uint32_t n_ff_shexp;    /* the shared expert's width (0: none) */
    uint8_t moe_norm_w;     /* the top-k weights are divided by their sum */
    uint8_t moe_gating;     /* moe_gating: the router's probabilities */
    float moe_w_scale;      /* the weights are multiplied by it (1: not) */
    uint32_t n_group, n_group_used; /* expert groups: the best n_group_used of n_group
                             * (each scored by its two best experts) hold the choice; 0: none */
    uint32_t n_dense_lead;  /* the first layers' FFN is dense (leading_dense_block_count) */
    /* Latent attention (recipe mla): the KV row is the latent (n_lora_kv) then the
     * rope part (head_dim = n_lora_kv + rope dims); q heads are n_qk_nope + rope wide */
    int mla;
    uint32_t n_lora_q;      /* 0: attn_q; else attn_q_a, attn_q_a_norm, attn_q_b */
    uint32_t n_lora_kv;
    uint32_t n_qk_nope;     /* key_length_mla - rope dims */
    uint32_t n_v_mla;       /* value_length_mla: a head's value width */
    uint8_t is_swa[MODEL_MAX_LAYERS]; /* layer il is a window layer */
    /* Hybrid families (recipe recr): which layers are recurrent, and their widths.
     * Mamba-2: conv over d_inner + 2 n_group d_state channels (d_conv taps), n_ssm_head
     * heads of d_inner / n_ssm_head, each with a [head_dim][d_state] state; short
     * convolution: d_conv = shortconv.l_cache taps over n_embd channels, no scan */
    int recr;               /* recr_kind (0: no recurrent layer) */
    uint8_t is_recr[MODEL_MAX_LAYERS];
    uint8_t is_mlp[MODEL_MAX_LAYERS]; /* recipe one_sublayer: an MLP-only layer */
    int32_t n_recr;         /* recurrent layers */
    uint32_t ssm_d_conv, ssm_d_inner, ssm_d_state, ssm_n_head, ssm_n_group;
    float residual_scale;   /* each branch's output times it before the residual add (1) */
    float logit_scale;      /* logits divided by it (1) */
    int no_rope;            /* rope.scaling.finetuned false (recipe rope_finetuned_key) */
} model_family_hp;

/* Floats of one sequence's recurrent state in a recurrent layer: the
 * convolution's d_conv - 1 previous inputs of each channel, then (Mamba-2)
 * the scan state [n_ssm_head][head_dim][d_state] or (Gated DeltaNet) the
 * delta rule's [v heads][head_v][head_k]. */
uint64_t model_recr_conv_floats(const model_family_hp *f, int32_t n_embd);
/* Channels of a recurrent layer's convolution: n_embd (short convolution),
 * else d_inner + 2 n_group d_state (Mamba-2's x | B | C, DeltaNet's q | k | v). */
int64_t model_recr_conv_channels(const model_family_hp *f, int32_t n_embd);
uint64_t model_recr_ssm_floats(const model_family_hp *f);
/* Bytes of one sequence's recurrent state over all layers (f32; 0: none). */
uint64_t model_recr_state_bytes(const model_family_hp *f, int32_t n_embd);

/* What model_family_read needs of the common hyper-parameters. */
typedef struct model_family_base {
    const char *arch;
    int32_t n_layers, n_embd, n_head, head_dim, n_ff;
    uint32_t n_ctx_train;
    float rope_base, rope_scale;
    int32_t n_head_kv, rope_dim;
    int yarn;               /* rope.scaling.type yarn */
} model_family_base;

/* Reads the recipe's keys (soft-caps, sliding window and its pattern, the
 * window layers' rope, rope.scaling.attn_factor / original_context_length,
 * the experts' counts and widths)
 * into out.  KV_EFORMAT / KV_EUNSUP naming the key on a bad value. */
int model_family_read(const gguf_ctx *g, const model_recipe *r, const model_family_base *b,
                      model_family_hp *out, kvant_err *err);

/* The recipe for general.architecture arch (len bytes), or NULL. */
const model_recipe *model_recipe_find(const char *arch, uint64_t len);
/* "llama, qwen2, ..." for messages. */
const char *model_recipe_list(void);
/* The row at index i (model_hparams.arch), or NULL; its index by pointer. */
const model_recipe *model_recipe_at(int32_t i);
int32_t model_recipe_index(const model_recipe *r);

#endif
