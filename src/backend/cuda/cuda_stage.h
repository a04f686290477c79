/* cuda_stage.h - host-side logic of the CUDA backend that needs no device:
 * packing a batch description into the one int32 staging buffer that
 * begin_batch uploads, checking it against the KV pool, and choosing a
 * matmul path.  Plain C (no CUDA headers), tested on machines without a GPU.
 *
 * Staging layout (int32 elements, packed tightly in this order):
 *   tokens[n_tokens] pos[n_tokens] seq[n_tokens] out[n_out]
 *   table_off[n_seqs] table_len[n_seqs] tables[sum of seqs' n_blocks]
 * Sequence s's block table is tables[table_off[s] .. + table_len[s]).
 *
 * Threading: pure functions over caller memory; any thread.
 */
#ifndef KVANT_CUDA_STAGE_H
#define KVANT_CUDA_STAGE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

/* Fixed capacity of the staging buffer, allocated once at kv_init
 * (device MEM_WORKSPACE + the same in pinned host memory): 2 MiB, enough
 * for 65536 tokens (the engine's max_num_batched_tokens limit) with
 * 262144 block-table entries, or 2048 tokens (the default) with 64 tables
 * of 7,000 blocks.  Counts beyond the engine's own limits (tokens 65536,
 * sequences 4096) or a batch beyond the capacity are refused with
 * KV_ERANGE naming the constant. */
#define CUDA_STAGE_ELEMS (1 << 19)
#define CUDA_STAGE_MAX_TOKENS 65536
#define CUDA_STAGE_MAX_SEQS 4096

typedef struct cuda_stage_view {
    int32_t n_tokens, n_seqs, n_out;
    /* offsets in int32 elements from the start of the staging buffer */
    int64_t tokens, pos, seq, out, table_off, table_len, tables;
    int64_t n_elems; /* elements used (bytes to upload = 4 * n_elems) */
} cuda_stage_view;

/* Packs b into buf (cap int32 elements) and fills view.  Checks what a bad
 * value would turn into an out-of-bounds device access: counts within the
 * capacities, n_out <= n_tokens, seq ids in [0, n_seqs), out ids in
 * [0, n_tokens), positions >= 0 and covered by their sequence's table,
 * block ids in [0, kv_blocks).  KV_EINVAL / KV_ERANGE with a message naming
 * the field; buf contents are then unspecified, view untouched. */
int cuda_stage_pack(const fwd_batch *b, int32_t kv_blocks, int32_t block_size, int32_t *buf,
                    int64_t cap, cuda_stage_view *view, kvant_err *err);

/* Weight types the CUDA matmul and embedding kernels read. */
int cuda_stage_weight_supported(uint32_t type);
/* KV_OK when a weight of this type and row length can be used; KV_EUNSUP
 * naming the tensor otherwise.  Rows must be a multiple of 32 elements for
 * every type (the kernels work in 32-element chunks; true of every model
 * kvant loads, and checked rather than assumed). */
int cuda_stage_check_weight(const char *name, uint32_t type, int64_t ne0, kvant_err *err);
/* KV element types the CUDA kv_store/attention kernels handle: f32, f16,
 * bf16, q8_0, q4_0 (the CPU backend's set); head_dim a multiple of the
 * type's block and at most MODEL_MAX_HEAD_DIM. */
int cuda_stage_check_kv(uint32_t type, int32_t head_dim, kvant_err *err);

typedef enum cuda_mm_path {
    CUDA_MM_TILED = 0, /* dequantizing kernel, 1 or CUDA_MM_TILE tokens per weight pass */
    CUDA_MM_GEMM = 1,  /* dequantize row chunks to f32, cuBLAS GemmEx */
} cuda_mm_path;
#define CUDA_MM_TILE 8
cuda_mm_path cuda_stage_mm_path(int32_t n_tokens, int32_t gemm_min_tokens);
/* Rows per dequantized chunk for the GEMM path: as many rows of ne0 f32 as
 * fit in ws_bytes (at least 1; 0 when not even one row fits). */
int64_t cuda_stage_gemm_rows(int64_t ne0, int64_t n_rows, size_t ws_bytes);

#endif
