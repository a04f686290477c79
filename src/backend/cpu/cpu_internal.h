/* cpu_internal.h - the CPU backend's state and its KV row addressing
 * (cpu_backend.c, and cpu_attn.c for the attention op; the other files of
 * the backend get views of it, e.g. cpu_snap.h's).  Not a public header.
 */
#ifndef KVANT_CPU_INTERNAL_H
#define KVANT_CPU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_kv.h"
#include "backend/cpu/cpu_mla.h"
#include "backend/cpu/cpu_moe.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_pack.h"
#include "backend/cpu/cpu_rope.h"
#include "backend/cpu/cpu_ssm.h"
#include "backend/cpu/tpool.h"
#include "kernels/hadamard.h"
#include "kernels/matmul.h"

typedef struct cpu_backend {
    backend base;
    kernel_isa isa;         /* the kernels' instruction set at create (dtype_kernel_isa) */
    hadamard_fn hadamard;   /* the rotated KV's transform for isa (hadamard_for) */
    cpu_glu_fn swiglu;      /* SwiGLU for isa (cpu_swiglu_for) */
    cpu_attn_rows attn;     /* valid while a KV layout is set (cpu_kv_init) */
    mem_mgr *mem;           /* borrowed */
    tpool *pool;
    int n_threads;
    const fwd_batch *batch; /* current batch (borrowed for one forward pass) */
    kv_layout kv;           /* kv.n_blocks: the blocks that exist now */
    uint8_t *kv_data;       /* [max_blocks][n_layers][2 (1: v_in_k)][block_size] rows of
                             * kv_row_bytes[il]: an address range reserved for max_blocks
                             * (PROT_NONE), of which the pages of [0, n_blocks) are
                             * read/write */
    size_t kv_map_bytes;    /* the reserved range */
    int64_t kv_mem_id;      /* the memory manager's reservation of n_blocks blocks */
    int64_t kv_block_stride; /* bytes of one block (all layers of the global group) */
    uint8_t *kv_data_w;     /* the window group's storage (kv.n_blocks_w > 0), after the
                             * global blocks in the same range:
                             * [n_blocks_w][window layers][2][block_size][row] */
    int64_t kv_block_stride_w; /* bytes of one window-group block */
    int64_t kv_layer_off[MODEL_MAX_LAYERS]; /* layer il's K rows within a block of its group */
    int64_t kv_row_bytes[MODEL_MAX_LAYERS]; /* one K or V row of layer il (its KV heads) */
    float *scratch;         /* [n_threads][scratch_per_thread] */
    int64_t scratch_per_thread;
    void *qact;             /* quantized matmul activations (MEM_WORKSPACE), qact_bytes;
                             * grown by cpu_matmul only, engine thread */
    size_t qact_bytes;
    int64_t qact_n;         /* widest matmul input of the loaded model */
    int act_q8;             /* 0 under BACKEND_EXACT: int8-activation matmul for quantized weights */
    int64_t *weight_ids;    /* mem reservations for mapped weights */
    cpu_packed *packed;     /* weights repacked at load (act_q8 only) */
    int pack;               /* 0 under BACKEND_NO_PACK */
    int n_weight_ids, cap_weight_ids;
    cpu_moe_dims moe;       /* the loaded model's widest expert layer (zero: dense) */
    cpu_mla_dims mla;       /* its latent attention's shape (zero: none) */
    const model *model;     /* the loaded model (borrowed, load_weights to unload_weights):
                             * its expert cache (model.xcache) for moe_ffn */
    cpu_state state;        /* hybrid models' recurrent-state slots (state_init), in
                             * state_mem (MEM_STATE); n_slots 0 without */
    void *state_mem;
    void *moe_ws;           /* MEM_WORKSPACE for cpu_moe_ffn and cpu_mla (one op at a
                             * time), moe_ws_bytes: layer_ws_bytes of the largest step */
    size_t moe_ws_bytes;
    cpu_rope_cache rope;
} cpu_backend;

static inline cpu_backend *cpu(backend *be)
{
    return (cpu_backend *)be;
}

/* Address of the K row (or V row when v) of a token slot in layer il.
 * The attention kernels take kv_row(il, 0, 0, v) as their base and
 * kv_block_stride as the distance between blocks. */
static inline int kv_is_window(const cpu_backend *cb, int32_t il)
{
    return cb->kv.n_blocks_w > 0 && cb->kv.layer_window[il];
}

/* Bytes between two blocks of layer il's group. */
static inline int64_t kv_stride(const cpu_backend *cb, int32_t il)
{
    return kv_is_window(cb, il) ? cb->kv_block_stride_w : cb->kv_block_stride;
}

/* The block table of s that layer il reads. */
static inline const int32_t *kv_table(const cpu_backend *cb, const fwd_seq *s, int32_t il)
{
    return kv_is_window(cb, il) ? s->block_table_w : s->block_table;
}

static inline uint8_t *kv_row(cpu_backend *cb, int32_t il, int32_t block, int32_t off, int v)
{
    uint8_t *base = kv_is_window(cb, il) ? cb->kv_data_w : cb->kv_data;
    const int64_t plane = v && !cb->kv.v_in_k; /* latent attention: V is the K row */
    return base + block * kv_stride(cb, il) + cb->kv_layer_off[il] +
           (plane * cb->kv.block_size + off) * cb->kv_row_bytes[il];
}

#endif
