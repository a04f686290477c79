/* model.h - a loaded Llama-family model: hyper-parameters, weight tensors
 * (zero-copy views into the mmap'd GGUF), tokenizer and chat template.
 *
 * Architectures: the rows of model_arch.c's recipe table ("llama" for
 * Llama 2/3, TinyLlama, SmolLM, Mistral, and Mixtral with experts; "qwen2",
 * "qwen3", "gemma2", "gemma3", "phi3", and the mixtures of experts
 * "qwen2moe", "qwen3moe", "olmoe").  Every hyper-parameter comes from GGUF metadata;
 * anything missing, inconsistent or asking for maths kvant does not
 * implement is a KV_EFORMAT / KV_EUNSUP error naming the key or tensor.
 *
 * Ownership: model_load returns a heap handle freed by model_free; it owns
 * the gguf_ctx (the mapping), the tokenizer and the layer array.  Weight
 * `data` pointers borrow the mapping; `dev` pointers belong to the backend
 * that uploaded them.  Threading: immutable after load.
 */
#ifndef KVANT_MODEL_H
#define KVANT_MODEL_H

#include <stdint.h>

#include "format/gguf.h"
#include "model/model_arch.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "util/err.h"

typedef int32_t model_arch; /* index of the family's row in model_arch.c's table */

typedef struct model_hparams {
    model_arch arch;
    int32_t n_layers;
    int32_t n_embd;
    int32_t n_head;       /* the widest layer's (model_layer.n_head per layer) */
    int32_t n_head_kv;    /* the widest layer's (model_layer.n_head_kv per layer) */
    int64_t n_kv_total;   /* KV heads summed over layers (n_layers * n_head_kv unless
                           * a pruned model's layers differ) */
    int32_t n_kv_layers;  /* layers with KV heads (a hybrid's attention layers) */
    int32_t head_dim;     /* n_embd / n_head unless key_length says otherwise */
    int32_t n_ff;         /* the widest layer's FFN (model_layer.n_ff per layer) */
    int32_t n_vocab;
    int64_t n_ctx_train;
    int32_t rope_dim;     /* rotated dimensions per head (<= head_dim) */
    rope_kind rope;
    float rope_base;
    float rope_freq_scale; /* 1 / linear scaling factor */
    float rms_eps;
    const model_recipe *recipe; /* the family's layer recipe (model_arch.h) */
    model_family_hp fam;   /* the recipe's values read from this file */
} model_hparams;

/* A weight tensor: ne[0] elements per row, ne[1] rows. */
typedef struct model_tensor {
    uint32_t type;        /* dtype */
    int64_t ne[2];
    uint64_t nbytes;
    size_t row_bytes;
    const void *data;     /* host data in the mapping (borrowed) */
    void *dev;            /* backend-resident copy (CPU: == data) */
    int layer;            /* -1 for global tensors */
    int exact;            /* 1: near-f32 accuracy: the CPU int8 path takes two
                           * terms per activation (the output head) */
    int packed;           /* 1: dev holds rows packed by the backend (kernels/qpack.h) */
    int streamed;         /* 1: read into a staging buffer before use (model/wstream.h);
                           * dev is valid only between wstream_acquire and release */
    uint64_t file_off;    /* byte offset of the data in the GGUF file */
    int64_t row0;         /* first row of the file's tensor this one holds (a
                           * tensor-parallel vocabulary slice, model/shard.h);
                           * the embedding lookup writes zeros for tokens
                           * outside [row0, row0 + ne[1]) */
} model_tensor;

typedef struct model_layer {
    model_tensor attn_norm, wq, wk, wv, wo; /* a fused attn_qkv (phi3): wq, wk, wv are
                              * row views of it */
    model_tensor bq, bk, bv; /* qwen2 only; type == DT_F32 and data NULL when absent */
    model_tensor q_norm, k_norm; /* [head_dim] per-head RMS norm (recipe qk_norm), else NULL */
    model_tensor post_attn_norm, post_ffn_norm; /* recipe post_norms, else data NULL */
    model_tensor bo;         /* optional (a pruned model's compensation); data NULL when absent */
    model_tensor ffn_norm, w_gate, w_up, w_down; /* a fused ffn_up (phi3): w_gate, w_up
                              * are its two row halves */
    model_tensor b_down;     /* optional, as bo */
    /* Mixture of experts (n_expert > 0; w_gate, w_up, w_down then have data NULL).
     * The stacked tensors are GGUF's [n_expert][rows][cols] seen as one matrix of
     * n_expert * rows rows: expert e's rows are [e * rows, (e + 1) * rows). */
    model_tensor ffn_gate_inp;  /* router: [n_expert][n_embd] */
    model_tensor gate_exps, up_exps; /* [n_expert * n_ff_exp][n_embd] (data NULL when fused) */
    model_tensor gate_up_exps;  /* ffn_gate_up_exps, when the file fuses them: [n_expert *
                              * 2 n_ff_exp][n_embd], expert e's gate rows then its up rows;
                              * else data NULL.  model_expert_rows finds either layout. */
    model_tensor down_exps;     /* [n_expert * n_embd][n_ff_exp] */
    model_tensor gate_shexp, up_shexp, down_shexp; /* shared expert (n_ff_shexp > 0) */
    model_tensor gate_inp_shexp; /* [1][n_embd]: its gate sigmoid(h . w); data NULL: ungated
                              * (DeepSeek's shared experts) */
    model_tensor exp_probs_b;   /* [n_expert] f32 selection bias (DeepSeek-V3), or data NULL */
    model_tensor gate_inp_b;    /* [n_expert] f32 router bias (gpt-oss), or data NULL */
    model_tensor gate_exps_b, up_exps_b, down_exps_b; /* f32 [n_expert][rows] per-expert
                              * biases (gpt-oss; one row per expert), or data NULL */
    model_tensor attn_sinks;    /* [n_head] f32 sink logits (gpt-oss), or data NULL */
    /* Latent attention (hp.fam.mla; wk, wv, bq.. then have data NULL): q from wq
     * (n_lora_q 0) or wq_b(rmsnorm(wq_a h) * q_a_norm), [n_head][n_qk_nope + rope];
     * wkv_a h = [latent n_lora_kv | k rope part]; kv_a_norm the latent's norm; wk_b
     * stacked [n_head][n_lora_kv][n_qk_nope] (q_nope into the latent space), wv_b
     * stacked [n_head][n_v_mla][n_lora_kv] (the latent output into a head's values) */
    model_tensor wq_a, q_a_norm, wq_b, wkv_a, kv_a_norm, wk_b, wv_b;
    /* A recurrent layer (recr != RECR_NONE; no attention tensors, n_head_kv 0): Mamba-2's
     * ssm_in [d_in_proj][n_embd] (rows z | xBC | dt), ssm_conv1d [channels][d_conv] and
     * its bias, ssm_dt_b, ssm_a (-exp(A_log)), ssm_d [n_ssm_head], ssm_norm
     * [n_group][d_inner / n_group], ssm_out [n_embd][d_inner]; a short convolution's
     * in_proj, conv and out_proj are ssm_in [3 n_embd][n_embd], ssm_conv1d
     * [n_embd][l_cache] and ssm_out; all 1-D and conv tensors f32 */
    model_tensor ssm_in, ssm_conv1d, ssm_conv1d_b, ssm_dt_b, ssm_a, ssm_d, ssm_norm, ssm_out;
    /* Gated DeltaNet (qwen35): ssm_in is attn_qkv [conv channels][n_embd], ssm_z attn_gate
     * [d_inner][n_embd], ssm_beta / ssm_alpha [v heads][n_embd], ssm_a [v heads], ssm_norm
     * [head_v] (one norm for every head) */
    model_tensor ssm_z, ssm_beta, ssm_alpha;
    int32_t recr;            /* recr_kind of this layer (0: attention) */
    int32_t mlp_only;        /* 1: no attention or recurrent half, only the FFN behind its
                              * ffn_norm (recipe one_sublayer's MLP layers); n_ff 0: no FFN */
    int32_t n_expert, n_expert_used, n_ff_exp, n_ff_shexp; /* 0 for a dense FFN */
    int32_t n_ff;            /* this layer's FFN width (<= hp.n_ff; per-layer after pruning) */
    int32_t n_head, n_head_kv; /* this layer's heads (<= hp's; per-layer after pruning) */
    int32_t window;          /* sliding window W: attends to (p - W, p]; 0 = all of [0, p] */
    float rope_base, rope_scale; /* this layer's rope base and frequency scale */
} model_layer;

typedef struct model {
    model_hparams hp;
    gguf_ctx *gguf;
    tokenizer *tok;
    chat_template chat;
    int has_chat;            /* chat template compiled */
    char chat_err[KV_ERR_MSG_MAX];      /* why not, when has_chat == 0 */
    model_tensor tok_embd, output_norm, output, rope_freqs; /* rope_freqs: rope_freqs.weight,
                              * or the LongRoPE factor set in use (see model_family_hp) */
    int tied_output;         /* output == tok_embd */
    model_layer *layers;     /* [n_layers] */
    uint64_t weights_bytes;  /* sum of all tensors used */
    struct wstream *wstream; /* weight offload (model/wstream.h) or NULL; borrowed, set by
                              * whoever created it, used by the forward pass */
    struct xcache *xcache;   /* experts placed by memory (model/xcache.h) or NULL; borrowed,
                              * set by whoever created it, used by the backend's moe_ffn */
    char path[1024];
} model;

/* {arch}.{suffix} of layer il (il < 0: the largest over layers): a u32,
 * or an int32/uint32 array of n_layers (per-layer values, as llama.cpp
 * reads them and `kvant prune` writes).  Absent: def, an error when 0. */
int model_layer_u32(const gguf_ctx *g, const char *suffix, int n_layers, int il, uint32_t def,
                    uint32_t *out, kvant_err *err);
/* FFN width of layer il (il < 0: the widest) from {arch}.feed_forward_length. */
int model_ff_length(const gguf_ctx *g, int n_layers, int il, uint32_t *n_ff, kvant_err *err);
/* Query and KV heads of layer il (il < 0: the largest) from
 * attention.head_count / head_count_kv (u32 or per-layer arrays; KV
 * heads default to the query heads); KV_EFORMAT unless KV divides Q. */
int model_layer_heads(const gguf_ctx *g, int n_layers, int il, uint32_t *n_head,
                      uint32_t *n_head_kv, kvant_err *err);
/* The planner's view of a model of these hyper-parameters whose weights are
 * weights_bytes (mem/plan.h plan_model). */
struct plan_model;
void model_plan_shape(const model_hparams *hp, uint64_t weights_bytes, struct plan_model *out);
/* Reads hyper-parameters only (no tensors): used by `kvant plan`. */
int model_hparams_from_gguf(const gguf_ctx *g, model_hparams *hp, kvant_err *err);
const char *model_arch_name(model_arch a);
/* Tensors of layer L (the pointers into L), data NULL ones included: n returned, <= 56. */
#define MODEL_LAYER_TENSORS 56
int model_layer_tensors(model_layer *L, model_tensor **out);

/* 1 when some layer's FFN is a mixture of experts. */
int model_has_experts(const model *m);
/* Expert e of layer L (n_expert > 0): for its gate, up and down rows, t[i] the stacked tensor
 * holding them, row0[i] the first and rows[i] how many. */
void model_expert_rows(const model_layer *L, int32_t e, const model_tensor *t[3], int64_t row0[3],
                       int64_t rows[3]);
/* 1 when some layer is recurrent (a hybrid family: per-sequence state). */
int model_is_hybrid(const model *m);

model *model_load(const char *path, kvant_err *err);
void model_free(model *m);
/* Compiles the chat template: src (--chat-template's file contents), or
 * the GGUF's own when src is NULL.  A template kvant cannot compile leaves
 * has_chat = 0 and the reason (naming the construct) in chat_err; the
 * model stays usable for plain completions.  Returns KV_OK or that code. */
int model_set_chat_template(model *m, const char *src, size_t len);

/* Calls fn for every weight tensor of the model (global then per layer). */
typedef void (*model_tensor_fn)(void *ctx, model_tensor *t);
void model_for_each_tensor(model *m, model_tensor_fn fn, void *ctx);

#endif
