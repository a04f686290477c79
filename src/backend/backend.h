/* backend.h - the compute backend interface: a struct of function pointers.
 *
 * The forward pass (forward/forward.c) is written once against these ops; a
 * backend (cpu/, cuda/) implements them over its own memory.  Pointers
 * named `d_*` are device memory: the host never dereferences them, it only
 * passes them back to ops or copies through upload/download.  Ops may run
 * asynchronously; download and sync are the only points where the host
 * waits.  All device memory is obtained from the backend's mem_mgr, so the
 * memory manager sees every byte.
 *
 * Batch shape: one forward pass evaluates n_tokens tokens belonging to
 * n_seqs sequences.  Each token has a position and a sequence; each
 * sequence has a block table into the paged KV pool.  Attention for a token
 * at position p reads positions 0..p of its sequence through the table
 * (the batch's own K/V are stored first).  Every op computes each output
 * element with a reduction order that depends only on that element's
 * inputs, never on the batch: a sequence's results are bitwise identical
 * whatever else is batched with it.
 *
 * Threading: a backend instance is used by one thread (the engine thread).
 *
 * The interface only: implementations (cpu/, cuda/) include it and nothing
 * above it; choosing one by name is backend_select.h, above them.
 */
#ifndef KVANT_BACKEND_H
#define KVANT_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "batch/batch.h"
#include "mem/mem.h"
#include "model/model.h"
#include "util/err.h"

typedef struct backend backend;

typedef struct rope_params {
    rope_kind kind;
    int32_t n_rot;        /* rotated dims per head */
    float base;
    float freq_scale;
    const float *d_freq_factors; /* [n_rot/2] or NULL: theta_i /= factor_i (Llama-3
                                  * rope_freqs, LongRoPE long/short factors) */
    float mscale;         /* cos and sin are multiplied by it (LongRoPE attn_factor; 1) */
    float ext_factor;     /* YaRN (0: none): dims below corr_lo keep the unscaled angle,
                           * above corr_hi the scaled one, a linear ramp between */
    float corr_lo, corr_hi;
} rope_params;

/* How one layer attends (the recipe's attention variant). */
typedef struct attn_params {
    float scale;          /* score = q.k * scale */
    float softcap;        /* > 0: score = softcap * tanh(score / softcap), before the mask */
    int32_t window;       /* > 0: a token at p attends to positions (p - window, p] only */
    const float *d_sinks; /* [n_heads] or NULL: head h's softmax also holds exp(sinks[h]),
                           * a logit with no value (gpt-oss) */
} attn_params;

/* How one layer's experts are combined (the recipe's MoE variant). */
typedef struct moe_params {
    int norm_w;           /* the top-k weights divided by their sum */
    int gating;           /* moe_gating: softmax or sigmoid of the router's logits */
    float w_scale;        /* the weights multiplied by it (1: not) */
    int32_t n_group, n_group_used; /* expert groups (0: none), model_family_hp */
    int act;              /* ffn_act of the experts: FFN_SILU or FFN_SWIGLU_OAI */
} moe_params;

typedef struct kv_layout {
    int32_t n_layers;
    int32_t n_blocks;
    int32_t block_size;
    int32_t n_kv_heads;   /* the widest layer's KV heads */
    int32_t head_dim;
    uint32_t dtype;       /* element type of the stored K/V (DT_F32, DT_F16, ...) */
    int32_t max_tokens;   /* most tokens one step carries, for the backend's per-step
                           * workspace (0: unknown, sized on first use) */
    int32_t max_blocks;   /* most blocks kv_resize may grow to (0 = n_blocks: fixed) */
    int32_t layer_kv_heads[MODEL_MAX_LAYERS]; /* KV heads of layer il (a pruned model's
                           * differ); 0 = n_kv_heads; KV_LAYOUT_NO_KV: none (a hybrid
                           * model's recurrent layer).  Layer il's rows hold
                           * kv_layout_heads(lay, il) * head_dim elements. */
    /* Sliding-window layer group (docs/ARCHITECTURE.md, memory model): the
     * K/V of layers with layer_window[il] = 1 live in a second storage of
     * n_blocks_w blocks, [n_blocks_w][window layers][2][block_size][row],
     * addressed through fwd_seq.block_table_w; the other (global) layers
     * keep [n_blocks][global layers][2][block_size][row].  n_blocks_w 0: one
     * group, every layer global (as without windows).  A backend without
     * kv_copy_block_w refuses n_blocks_w > 0 at kv_init. */
    int32_t n_blocks_w;
    uint8_t layer_window[MODEL_MAX_LAYERS];
    /* 1: K and V are stored rotated by the normalized Walsh-Hadamard
     * transform of each head (kernels/hadamard.h; --kv-rotate): the forward
     * pass rotates q, k and v after rope and the attention output back;
     * needs the backend's hadamard op and a power-of-two head_dim */
    int rotate;
    /* 1: latent attention's cache: one row per token and layer (K), V rows are not
     * stored: V is the K row itself (its latent prefix is what the output uses) */
    int v_in_k;
    /* Hybrid models: slots of recurrent state (model_recr_state_bytes each) that
     * fwd_init asks the backend for (state_init); a sequence computes in the slot
     * its fwd_seq names.  0 for a model without recurrent layers. */
    int32_t n_state_slots;
} kv_layout;

#define KV_LAYOUT_NO_KV (-1)

/* The most block-table entries a token under a KV budget reads (its sink
 * blocks and its window's, fwd_seq.kv_sink_blocks and kv_recent): the
 * backends gather them into a table of this many; the engine refuses a
 * budget that would need more. */
#define BACKEND_KV_BUDGET_BLOCKS 8192

/* KV heads of layer il under lay. */
static inline int32_t kv_layout_heads(const kv_layout *lay, int32_t il)
{
    if (lay->layer_kv_heads[il] == KV_LAYOUT_NO_KV)
        return 0;
    return lay->layer_kv_heads[il] ? lay->layer_kv_heads[il] : lay->n_kv_heads;
}

typedef struct backend_ops {
    const char *name;
    void (*destroy)(backend *be);

    /* ---- memory ---- */
    mem_mgr *(*mem)(backend *be);
    /* Makes every weight of m resident (sets model_tensor.dev). */
    int (*load_weights)(backend *be, model *m, kvant_err *err);
    void (*unload_weights)(backend *be, model *m);
    void *(*alloc)(backend *be, size_t bytes, mem_cat cat, int layer, kvant_err *err);
    void (*free)(backend *be, void *d_ptr);
    int (*upload)(backend *be, void *d_dst, const void *src, size_t bytes);
    int (*download)(backend *be, void *dst, const void *d_src, size_t bytes);
    int (*sync)(backend *be);
    /* Optional (NULL: callers use plain host memory, malloc).  Page-locked
     * host memory the device copies from and to asynchronously
     * (cudaMallocHost), accounted by the memory manager as MEM_PINNED
     * (outside the device budget); NULL + err when it cannot be had.
     * host_free takes a pointer from host_alloc (NULL: no-op), after
     * waiting for every copy that may still use it.  The backend must
     * outlive its pinned buffers. */
    void *(*host_alloc)(backend *be, size_t bytes, kvant_err *err);
    void (*host_free)(backend *be, void *p);
    /* Optional (NULL: weight streaming needs weights the backend reads from
     * host memory, the CPU backend).  Uploads a streamed layer's bytes
     * (h_src, bytes, host memory from host_alloc) into device staging
     * buffer `slot` (0 <= slot < n_slots; allocated on first use at the
     * largest bytes the stream will ask for, `max_bytes`, MEM_WEIGHTS) on
     * the copy stream; the ops enqueued after it wait for the upload on the
     * device.  Returns the device base (a tensor at offset o of h_src is at
     * base + o), or NULL + err.  h_src may be refilled once the ops that
     * read the slot have been synchronised (sync). */
    void *(*stream_layer)(backend *be, int slot, const void *h_src, size_t bytes,
                          size_t max_bytes, kvant_err *err);

    /* ---- KV pool storage ---- */
    int (*kv_init)(backend *be, const kv_layout *lay, kvant_err *err);
    void (*kv_free)(backend *be);
    void (*kv_copy_block)(backend *be, int32_t dst, int32_t src);
    /* Optional (NULL: kv_init refuses a window group): the same for a block
     * of the window group (kv_layout.n_blocks_w). */
    void (*kv_copy_block_w)(backend *be, int32_t dst, int32_t src);
    /* Optional (NULL: the KV offload tiers are refused).  Copy one block's
     * K and V of every layer to / from one contiguous record of
     * n_layers * 2 * block_size * row bytes, laid out [n_layers][2 (K,V)]
     * [block_size][row] (one plane, K, under v_in_k; a row in the KV dtype,
     * as in the pool), so a tier
     * move is one copy.  Both complete before returning (src/dst are host
     * memory the caller reuses).  Return 0, or -1 on a bad block id or a
     * device error. */
    int (*kv_export_block)(backend *be, int32_t block, void *dst);
    int (*kv_import_block)(backend *be, int32_t block, const void *src);
    /* Optional (NULL: the tier copies synchronously with kv_export_block).
     * Queues the copy of block's record into dst (host memory from
     * host_alloc) on the backend's copy stream and returns its ticket
     * (> 0), or -1 (bad block id, device error).  The copy is ordered after
     * every op enqueued before it, and every op enqueued after it (a kernel
     * rewriting the block) waits for it on the device; dst must not be read
     * until copy_done says the ticket completed. */
    int64_t (*kv_export_async)(backend *be, int32_t block, void *dst);
    /* Optional (with kv_export_async): 1 when ticket's copy has completed
     * (wait != 0: blocks until it has), 0 while it is in flight, -1 after a
     * device error (dst's bytes are not valid).  Tickets complete in the
     * order they were issued; any ticket may be asked about any number of
     * times. */
    int (*copy_done)(backend *be, int64_t ticket, int wait);
    /* Bytes kv_init allocates beyond the blocks themselves (scratch,
     * staging), so the engine can hold them back from the pool. */
    uint64_t (*kv_extra_bytes)(backend *be, const kv_layout *lay);
    /* Optional (NULL: the pool's size is fixed at kv_init).  Makes the
     * storage hold n_blocks blocks, 1 <= n_blocks <= the layout's
     * max_blocks: growing makes ids [old, n_blocks) exist (contents
     * undefined), shrinking releases ids [n_blocks, old), which the caller
     * guarantees nothing reads again.  Ids below both sizes keep their
     * contents and addresses.  Every byte is accounted as MEM_KV by the
     * memory manager.  Returns KV_OK, or KV_ENOMEM / KV_EINVAL with nothing
     * changed (the manager refused the bytes, a size out of range). */
    int (*kv_resize)(backend *be, int32_t n_blocks, kvant_err *err);

    /* ---- ops over the current batch ---- */
    /* Uploads the batch description; following ops refer to it. */
    int (*begin_batch)(backend *be, const fwd_batch *b, kvant_err *err);
    /* d_x[t][n_embd] = dequantized row tokens[t] of emb. */
    void (*embed)(backend *be, const model_tensor *emb, float *d_x);
    /* d_y[t] = d_x[t] / rms(d_x[t]) * w   for t < n */
    void (*rmsnorm)(backend *be, const float *d_x, const model_tensor *w, float eps, float *d_y,
                    int32_t n);
    /* d_y[t][r] = sum_c W[r][c] d_x[t][c] (+ bias[r] when bias != NULL) */
    void (*matmul)(backend *be, const model_tensor *W, const model_tensor *bias, const float *d_x,
                   float *d_y, int32_t n);
    /* Optional: count (1..3) matmuls over the same d_x as one job (one
     * quantization of d_x, one synchronisation), W[i] into d_y[i]; bias[i]
     * may be NULL.  Same results as count matmul calls.  NULL: the forward
     * pass calls matmul for each. */
    void (*matmul_n)(backend *be, int count, const model_tensor *const *W,
                     const model_tensor *const *bias, const float *d_x, float *const *d_y,
                     int32_t n);
    /* Optional: d_gate = act(d_x Wg) * (d_x Wu) over n tokens, act silu
     * (gelu 0) or GELU's tanh form (gelu 1); d_up is scratch.  Same results
     * as matmul_n of {Wg, Wu} then swiglu or geglu.  NULL: the forward pass
     * calls those. */
    void (*matmul_glu)(backend *be, const model_tensor *Wg, const model_tensor *Wu,
                       const float *d_x, float *d_gate, float *d_up, int32_t n, int gelu);
    /* RoPE in place on d_x[t][n_heads][head_dim] at the batch positions. */
    void (*rope)(backend *be, float *d_x, int32_t n_heads, int32_t head_dim,
                 const rope_params *rp);
    /* Stores the batch's K and V ([t][n_kv_heads*head_dim]) into layer il (K only
     * under kv_layout.v_in_k; d_v is not read). */
    void (*kv_store)(backend *be, int32_t il, const float *d_k, const float *d_v);
    /* d_out[t][n_heads*head_dim] = causal softmax(cap(q k^T * ap->scale)) v for
     * every batch token over positions (pos - window, pos] (all of [0, pos]
     * when window is 0), reading layer il's K/V through block tables. */
    void (*attention)(backend *be, int32_t il, const float *d_q, int32_t n_heads,
                      const attn_params *ap, float *d_out);
    /* Optional (NULL: a KV budget's snapkv and h2o policies are refused).
     * For the batch's tokens at positions >= snap_from whose sequence has
     * snap_score (batch.h), after attention of layer il: adds softmax(q k^T
     * * ap->scale) over the rows the token reads, indexed in the order it
     * reads them (the positions; under a KV budget's mask the sink blocks'
     * rows, then the window's), at indexes < snap_n, summed over each KV
     * head's query heads.  The tokens of a sequence are added in batch
     * order, so a chunked prompt sums as a whole one does. */
    void (*kv_score)(backend *be, int32_t il, const float *d_q, int32_t n_heads,
                     const attn_params *ap);
    /* Optional (with kv_score).  For every layer and KV head h, rows
     * j < n of blocks dst[j / block_size] (slot j % block_size) become the
     * K and V rows (head h) at position sel[(il * n_kv_heads + h) * n + j]
     * of the sequence whose table is src (bitwise copies). */
    void (*kv_compact)(backend *be, const int32_t *src, const int32_t *dst, const int32_t *sel,
                       int32_t n);
    /* d_out[i] = silu(d_gate[i]) * d_up[i] */
    void (*swiglu)(backend *be, const float *d_gate, const float *d_up, float *d_out, int64_t n);
    /* d_out[i] = gelu(d_gate[i]) * d_up[i], GELU's tanh form (ggml_gelu) */
    void (*geglu)(backend *be, const float *d_gate, const float *d_up, float *d_out, int64_t n);
    /* Optional (NULL: FFN_RELU_SQR models are refused, fwd_init).  d_y[i] =
     * max(d_x[i], 0)^2 (an ungated MLP's activation, Nemotron-H) */
    void (*relu_sqr)(backend *be, const float *d_x, float *d_y, int64_t n);
    /* d_x[i] *= s */
    void (*scale)(backend *be, float *d_x, float s, int64_t n);
    /* Optional (NULL: kv_layout.rotate is refused): the normalized
     * Walsh-Hadamard transform in place of each head_dim row of the batch's
     * n_tokens x n_heads rows (kernels/hadamard.h). */
    void (*hadamard)(backend *be, float *d_x, int32_t n_heads, int32_t head_dim);
    /* d_x[i] = cap * tanh(d_x[i] / cap) */
    void (*softcap)(backend *be, float *d_x, float cap, int64_t n);
    /* d_x[i] += d_y[i] */
    void (*add)(backend *be, float *d_x, const float *d_y, int64_t n);
    /* Optional (NULL: models with experts are refused, fwd_init).  The
     * mixture-of-experts FFN of layer L (L->n_expert > 0) over the batch:
     * per token t, p = softmax (or sigmoid: mp->gating) of d_h[t] ffn_gate_inp
     * (+ gate_inp_b; softmax_weight: the logits themselves, the weights then the
     * softmax over the chosen ones),
     * selection s = p + exp_probs_b (when L has it), under expert groups only
     * the mp->n_group_used groups with the largest sums of their two best s,
     * the n_expert_used largest s (ties: lower expert first) in slot order,
     * weights p_k (divided by their sum when mp->norm_w, times mp->w_scale), then
     *   d_x[t] += sum_k w_k down_e(act(gate_e h) * up_e h) (mp->act; each matmul
     *             plus the expert's bias row when L has them)
     *             (+ sigmoid(h . gate_inp_shexp) * shared(h) when L has one;
     *              + shared(h) when it has no gate).
     * Each expert's rows are read once per call, for all its tokens; a
     * token's result does not depend on the rest of the batch.  KV_ENOMEM
     * when its workspace cannot be had. */
    int (*moe_ffn)(backend *be, const model_layer *L, const moe_params *mp, const float *d_h,
                   float *d_x, int32_t n, kvant_err *err);
    /* Optional (NULL: latent-attention models are refused, fwd_init).  The
     * absorbed form of layer L's latent attention, before the attention op:
     * d_q [t][n_head][n_qk_nope + R] (the q projection), d_kv [t][C + R] (kv_a's,
     * C = n_lora_kv, R = rope dims).  In place on d_kv: the latent part
     * RMS-normed with L->kv_a_norm (eps), the rope part roped (rp, n_rot R) at
     * the batch positions: the K row.  Into d_qa [t][n_head][C + R]:
     * [wk_b[h] q_nope[t][h] | rope(q_pe[t][h])].  KV_ENOMEM without workspace. */
    int (*mla_qk)(backend *be, const model_layer *L, const rope_params *rp, float eps,
                  const float *d_q, float *d_kv, float *d_qa, int32_t n, kvant_err *err);
    /* Optional (with mla_qk).  d_y[t][h][n_v_mla] = wv_b[h] d_att[t][h][0:C] (the
     * attention's output rows are C + R wide per head). */
    int (*mla_v)(backend *be, const model_layer *L, const float *d_att, float *d_y, int32_t n,
                 kvant_err *err);
    /* ---- recurrent state (hybrid models; optional: NULL refuses them at fwd_init) ----
     * n_slots slots of model_recr_state_bytes, from the memory manager (MEM_STATE), for
     * the loaded model.  A batch's sequence computes in slot fwd_seq.state_slot: its
     * first token of the batch must be at position 0 (the state starts from zeros) or
     * at the slot's position (the tokens it has consumed); begin_batch refuses
     * anything else (KV_EINVAL).  After the token at position p - 1, for each pair
     * (p, slot) of fwd_seq.state_snap, the state is copied to that slot too. */
    int (*state_init)(backend *be, int32_t n_slots, kvant_err *err);
    void (*state_free)(backend *be);
    /* Slot dst becomes a copy of slot src (its position too). */
    void (*state_copy)(backend *be, int32_t dst, int32_t src);
    /* A slot's bytes to / from host memory (model_recr_state_bytes); import sets
     * its position to pos.  0, or -1 on a bad slot. */
    int (*state_export)(backend *be, int32_t slot, void *dst);
    int (*state_import)(backend *be, int32_t slot, const void *src, int32_t pos);
    /* The recurrent mix of layer L (L->recr) over the batch, between its in- and
     * out-projections: d_in[0] [t][rows of L->ssm_in] (used as scratch), d_y
     * [t][d_inner] (Mamba-2: the gated, group-normed scan output, eps its norm's;
     * short convolution: c * conv(b * x); Gated DeltaNet: each value head's output
     * RMS-normed * silu(z), where d_y holds z = ssm_z h on entry and d_in[1], d_in[2]
     * the [t][v heads] beta and alpha logits), each sequence's state in its slot. */
    int (*recr_mix)(backend *be, int32_t il, const model_layer *L, float eps,
                    float *const *d_in, float *d_y, int32_t n, kvant_err *err);
    /* Optional (NULL: recipe attn_gate models are refused, fwd_init).  d_qg
     * [t][n_heads][2 head_dim] per head [q | gate]: mode 0 copies the queries into
     * d_x [t][n_heads][head_dim]; mode 1 multiplies d_x (the attention output, same
     * shape) by sigmoid(gate). */
    void (*attn_gate)(backend *be, int mode, const float *d_qg, float *d_x, int32_t n_heads,
                      int32_t head_dim);
    /* d_dst[j] = d_src[out[j]] rows of row_len floats, j < n_out */
    void (*gather_out)(backend *be, const float *d_src, int32_t row_len, float *d_dst);
} backend_ops;

struct backend {
    const backend_ops *ops;
};

/* ---- what implementations share with the selection (backend_select.h) ---- */

/* What a device offers before anything is loaded: the planner's budget
 * starts from total_memory, and the memory manager allocates through
 * alloc (host malloc for "cpu", cudaMalloc for "cuda"). */
typedef struct backend_device_info {
    char name[128];
    uint64_t total_memory;
    uint64_t free_memory;
    mem_allocator alloc;
} backend_device_info;

/* Flags for backend_create (backend_select.h). */
#define BACKEND_EXACT 1u /* CPU: f32 activations in every matmul (the reference
                           * path); without it quantized weights take the int8-
                           * activation path (~0.3% error per dot, kernels/matmul.h);
                           * tensors marked exact (the output head) the split
                           * int8 path (two terms, ~2.5e-6) */
#define BACKEND_NO_PACK 2u /* CPU: weights stay in the file's layout (no load-time
                            * repacking for the int8 kernels, backend/cpu/cpu_pack.h) */

#endif
