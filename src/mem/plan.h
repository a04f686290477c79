/* plan.h - the what-fits planner: pure arithmetic from a model's shape.
 *
 * Given the hyper-parameters and total weight bytes (from a GGUF header
 * alone: no tensor data is read) and a serving configuration, computes the
 * memory budget, the activation workspace, the KV bytes per token, how many
 * KV blocks remain for the paged pool, and how many sequences of a given
 * context length fit at once.
 *
 * plan_activation_layout / plan_activation_bytes is THE workspace formula:
 * the CPU backend carves its activation workspace from the same layout, so
 * the plan and the real allocation agree by construction.
 *
 * Ownership: all structs are plain caller-owned data; plan_result_json
 * returns a malloc'd string the caller frees.  Threading: pure functions,
 * callable from any thread.
 */
#ifndef KVANT_PLAN_H
#define KVANT_PLAN_H

#include <stdint.h>

#include "util/err.h"

/* Limits on untrusted shapes (a model header may claim anything); chosen
 * so that every product below fits easily in 64 bits. */
#define PLAN_MAX_LAYERS 1024
#define PLAN_MAX_DIM (1 << 20)      /* n_embd, n_ff, n_head * head_dim */
#define PLAN_MAX_HEADS 4096         /* n_head, n_head_kv, head_dim */
#define PLAN_MAX_VOCAB (1 << 24)
#define PLAN_MAX_CTX (1 << 24)
#define PLAN_MAX_BATCH_TOKENS (1 << 20)
#define PLAN_MAX_SEQS (1 << 16)
#define PLAN_MAX_THREADS 1024
#define PLAN_MAX_WEIGHTS (1ull << 60)
#define PLAN_MAX_CONC 8

/* KV that fits itself (plan_config.kv_fit: a backend whose memory is the
 * host's).  The pool may grow to PLAN_KV_FIT_SHARE times what max_num_seqs
 * requests of the context need (one share for the live sequences, the rest
 * for the prefix cache), never past the budget; it starts at
 * PLAN_KV_FIT_START bytes (at least one request of the context) and grows
 * on demand (engine_kvresize.c).  A pool that cannot grow (a window group)
 * is the ceiling from the start. */
#define PLAN_KV_FIT_SHARE 2
#define PLAN_KV_FIT_START (256ull << 20)
/* Weights are placed automatically (plan_fit_weights) when they do not fit
 * beside the workspace and one request of PLAN_FIT_MIN_CTX tokens (or of the
 * context asked for); then they keep room for the KV of one request of
 * PLAN_FIT_KV_CTX tokens (or the context asked for), or of PLAN_FIT_MIN_CTX
 * when that room would take more than a quarter of the budget; the context
 * then becomes what the rest holds. */
#define PLAN_FIT_MIN_CTX 512
#define PLAN_FIT_KV_CTX 4096

typedef struct plan_model {
    int n_layers, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab;
    int64_t n_ctx_train;
    uint64_t weights_bytes; /* all tensors at stored size (what mmap maps) */
    int64_t n_kv_total;     /* KV heads summed over layers when they differ per layer
                             * (a pruned model); 0 = n_layers * n_head_kv */
    int v_in_k;             /* 1: one row per token and layer (latent attention: V is
                             * the K row); 0: K and V rows */
    int n_kv_layers;        /* layers with a KV cache (a hybrid's attention layers);
                             * 0 = n_layers */
    uint64_t state_bytes;   /* a hybrid's recurrent state per sequence (0: none) */
} plan_model;

typedef struct plan_config {
    uint64_t device_memory;     /* bytes on the device (host RAM for CPU) */
    double utilization;         /* fraction of device_memory kvant may use, (0, 1] */
    int64_t ctx;                /* max context per sequence; 0 = model's n_ctx_train */
    int block_size;             /* KV tokens per block: power of two in [8, 128] */
    int max_num_seqs;           /* sequences in one batch (logits rows) */
    int max_num_batched_tokens; /* tokens in one forward pass */
    int n_threads;              /* backend threads (attention scratch each) */
    uint32_t kv_dtype;          /* dtype enum (src/kernels/dtype.h) of stored K/V */
    int64_t kv_window;          /* > 0: the window layers keep their own KV group of
                                 * bounded size (their widest window); 0: one group */
    int64_t kv_window_heads;    /* KV heads summed over the window layers */
    int act_q8;                 /* 1: the CPU backend's int8 matmul activations (a
                                 * quantized copy of the widest matmul input for
                                 * max_num_batched_tokens) come out of the budget too */
    int kv_fit;                 /* 1: size the pool from demand (PLAN_KV_FIT_*), not from
                                 * all of the budget: the memory is the host's */
    int kv_grow;                /* with kv_fit: the pool can grow (start below the
                                 * ceiling); 0: fixed at the ceiling */
    uint64_t kv_start_bytes;    /* with kv_grow: the size at start (0: PLAN_KV_FIT_START;
                                 * at least one request of ctx either way) */
    int fit_ctx;                /* 1 with ctx 0: the model's context when one request of
                                 * it fits, else the largest that does (ctx_auto) */
    uint64_t reserved_bytes;    /* budget bytes taken before this model's weights (a
                                 * draft model's footprint, engine_draft.h); 0: none */
    int state_slots;            /* a hybrid model's recurrent-state slots (each
                                 * plan_model.state_bytes): one per sequence plus the
                                 * prefix cache's snapshots; 0: none */
} plan_config;

/* utilization 0.90, ctx 0, block 16, 64 seqs, 2048 tokens, 1 thread,
 * kv f16 (half the bytes of f32 at no measurable quality cost). */
plan_config plan_config_default(void);

typedef struct plan_result {
    uint64_t budget;             /* floor(device_memory * utilization) */
    uint64_t weights_bytes;
    uint64_t reserved_bytes;     /* plan_config.reserved_bytes */
    uint64_t state_bytes;        /* state_slots x plan_model.state_bytes (MEM_STATE) */
    uint64_t state_slot_bytes;   /* plan_model.state_bytes */
    int state_slots;             /* plan_config.state_slots */
    uint64_t activation_bytes;   /* plan_activation_bytes(...) */
    uint64_t act_q8_bytes;       /* plan_act_q8_bytes(...) when act_q8, else 0 */
    uint64_t kv_bytes_per_token; /* all layers (with kv_window: the global layers), K and V */
    uint64_t kv_pool_bytes;      /* kv_pool_blocks * block_size * kv_bytes_per_token
                                  * + kv_window_bytes */
    uint64_t kv_pool_tokens;     /* kv_pool_blocks * block_size */
    int64_t kv_pool_blocks;      /* whole blocks in budget - weights - activations
                                  * (with kv_window: the global group's); with kv_fit
                                  * the most the pool may grow to */
    int64_t kv_start_blocks;     /* blocks committed at start: kv_pool_blocks, or with
                                  * kv_fit and kv_grow PLAN_KV_FIT_START's worth */
    uint64_t kv_start_bytes;     /* kv_start_blocks' bytes + kv_window_bytes */
    int kv_fit;                  /* the pool was sized from demand */
    int ctx_auto;                /* ctx was lowered to the largest that fits (fit_ctx) */
    uint64_t kv_seq_bytes;       /* KV bytes of one sequence of ctx tokens: global rows x
                                  * ctx + window rows x plan_window_blocks, in whole blocks */
    /* the window group (plan_config.kv_window > 0), else all 0 */
    int64_t window;
    uint64_t kv_window_bytes_per_token; /* the window layers', K and V */
    int64_t kv_window_blocks;    /* its pool: conc x plan_window_blocks + margin */
    int64_t kv_window_margin;    /* blocks for one step's new tokens beyond the windows
                                  * (max_num_batched_tokens / block_size + max_num_seqs) */
    uint64_t kv_window_bytes;
    int fits_one_max_ctx;        /* one sequence of ctx tokens fits the pool */
    int64_t max_ctx_that_fits;   /* the largest context one request of which fits, at most
                                  * n_ctx_train; when ctx does not fit: searched, with one
                                  * block to spare for the backend's scratch */
    uint64_t missing_bytes;      /* budget bytes short of one ctx sequence; 0 if it fits */
    int n_conc;
    int64_t conc_ctx[PLAN_MAX_CONC]; /* ascending: 512, 2048, 8192, ctx, n_ctx_train
                                      * (deduped, none above n_ctx_train) */
    double conc[PLAN_MAX_CONC];      /* kv_pool_tokens / conc_ctx[i] (not capped
                                      * by max_num_seqs) */
    /* the effective configuration, echoed for reports */
    uint64_t device_memory;
    double utilization;
    int64_t ctx;                 /* after resolving 0 */
    int block_size;
    int max_num_seqs;
    uint32_t kv_dtype;
} plan_result;

/* Checks a model shape against the PLAN_MAX_* limits and the head
 * structure (n_head % n_head_kv == 0); KV_EINVAL naming the field. */
int plan_model_check(const plan_model *m, kvant_err *err);

/* Computes the plan.  Errors: KV_EINVAL (bad shape or config, naming the
 * field), KV_ERANGE (ctx above n_ctx_train), KV_EUNSUP (kv_dtype cannot
 * store rows of n_head_kv * head_dim elements), KV_ENOMEM (weights plus
 * activations plus one KV block exceed the budget; the message says what
 * would fit).  On error *out holds the fields computed so far, the rest 0. */
int plan_compute(const plan_model *m, const plan_config *c, plan_result *out, kvant_err *err);
/* Weight placement by default (--weights-memory auto): when weights of
 * m->weights_bytes do not fit (PLAN_FIT_*), *cap gets the bytes left for
 * weights (resident layers + staging ring) and 1 is returned (*cap 0 when
 * nothing is left for them: the plan then refuses with its own message);
 * 0 when the weights fit. */
int plan_fit_weights(const plan_model *m, const plan_config *c, uint64_t *cap);
/* The budget plan_compute uses: floor(device_memory * utilization). */
uint64_t plan_budget(uint64_t device_memory, double utilization);

/* Byte offsets (from a 64-aligned base) of every buffer of one forward
 * pass over max_tokens tokens; all f32, each buffer rounded up to 64 bytes.
 *   x       [max_tokens][n_embd]             residual stream
 *   xn      [max_tokens][n_embd]             normed copy; also the output of
 *                                            the o-proj and ffn-down matmuls
 *                                            before they are added to x
 *   q       [max_tokens][n_head * head_dim]
 *   k, v    [max_tokens][n_head_kv * head_dim]  (before they enter the cache)
 *   att     [max_tokens][n_head * head_dim]  attention output
 *   gate,up [max_tokens][n_ff]
 *   logits  [max_seqs][n_vocab]              last token of each sequence only
 *   scratch [n_threads][scratch_stride]      per thread: scores[n_ctx_train]
 *                                            then acc[head_dim], padded to 64 */
typedef struct plan_act_layout {
    uint64_t x, xn, q, k, v, att, gate, up, logits, scratch;
    uint64_t scratch_stride; /* bytes per thread */
    uint64_t total;          /* bytes of the whole workspace */
} plan_act_layout;

/* Fills *out (may be NULL) and returns total bytes; 0 if any count is
 * < 1.  The model must pass plan_model_check and the counts must be within
 * PLAN_MAX_BATCH_TOKENS / PLAN_MAX_SEQS / PLAN_MAX_THREADS (else 0). */
uint64_t plan_activation_layout(const plan_model *m, int max_tokens, int max_seqs,
                                int n_threads, plan_act_layout *out);
uint64_t plan_activation_bytes(const plan_model *m, int max_tokens, int max_seqs, int n_threads);
/* Bytes of int8 matmul activations for max_tokens rows of the widest
 * matmul input (max of n_embd, n_ff, n_head * head_dim), as the CPU
 * backend allocates them (kernels/matmul.h). */
uint64_t plan_act_q8_bytes(const plan_model *m, int max_tokens);

/* Window-group blocks one sequence of ctx tokens holds at most between
 * steps: ceil(window / block_size) + 1 (an unaligned window straddles one
 * more), never more than ctx needs. */
int64_t plan_window_blocks(int64_t window, int64_t ctx, int block_size);

/* KV bytes per token for all layers, K and V, stored as kv_dtype; 0 when
 * the dtype cannot store a row of n_head_kv * head_dim elements. */
uint64_t plan_kv_bytes_per_token(const plan_model *m, uint32_t kv_dtype);

/* JSON form (keys: budget, device_memory, utilization, weights_bytes,
 * activation_bytes, kv_dtype, kv_bytes_per_token, block_size, kv_pool_blocks,
 * kv_pool_tokens, kv_pool_bytes, kv_start_blocks, kv_start_bytes, kv_fit, ctx,
 * ctx_auto, fits, max_ctx_that_fits,
 * missing_bytes, max_concurrency {"<ctx>": count}, model {...}).
 * malloc'd string the caller frees; NULL only when out of memory. */
char *plan_result_json(const plan_result *r, const plan_model *m);
/* "recurrent state S: N slots of B (...)" into buf (a hybrid model's state
 * line for the start-up and `kvant plan`); NULL when r has no state slots. */
const char *plan_state_line(const plan_result *r, int n_live, char *buf, size_t n);

#endif
