/* cuda_stage.c - see cuda_stage.h. */
#include "backend/cuda/cuda_stage.h"

#include "kernels/dtype.h"

static int check_counts(const fwd_batch *b, kvant_err *err)
{
    if (b->n_tokens < 1 || b->n_tokens > CUDA_STAGE_MAX_TOKENS)
        return kvant_err_set(err, KV_ERANGE, "batch n_tokens %d outside [1, %d]", b->n_tokens,
                             CUDA_STAGE_MAX_TOKENS);
    if (b->n_seqs < 1 || b->n_seqs > CUDA_STAGE_MAX_SEQS)
        return kvant_err_set(err, KV_ERANGE, "batch n_seqs %d outside [1, %d]", b->n_seqs,
                             CUDA_STAGE_MAX_SEQS);
    if (b->n_out < 0 || b->n_out > b->n_tokens)
        return kvant_err_set(err, KV_EINVAL, "batch n_out %d outside [0, n_tokens %d]", b->n_out,
                             b->n_tokens);
    return KV_OK;
}

/* Copies the block tables after the per-token arrays; checks block ids. */
static int pack_tables(const fwd_batch *b, int32_t kv_blocks, int32_t *buf, int64_t cap,
                       cuda_stage_view *v, kvant_err *err)
{
    int64_t at = v->tables;
    for (int32_t s = 0; s < b->n_seqs; s++) {
        const fwd_seq *sq = &b->seqs[s];
        if (sq->n_blocks < 0 || (sq->n_blocks > 0 && !sq->block_table))
            return kvant_err_set(err, KV_EINVAL, "sequence %d: block table of %d blocks", s,
                                 sq->n_blocks);
        if (sq->n_blocks > cap - at)
            return kvant_err_set(err, KV_ERANGE, "batch block tables exceed the staging "
                                 "capacity (%lld int32 entries, CUDA_STAGE_ELEMS)", (long long)cap);
        buf[v->table_off + s] = (int32_t)(at - v->tables);
        buf[v->table_len + s] = sq->n_blocks;
        for (int32_t i = 0; i < sq->n_blocks; i++) {
            int32_t blk = sq->block_table[i];
            if (blk < 0 || blk >= kv_blocks)
                return kvant_err_set(err, KV_EINVAL, "sequence %d: block_table[%d] = %d outside "
                                     "the pool of %d blocks", s, i, blk, kv_blocks);
            buf[at++] = blk;
        }
    }
    v->n_elems = at;
    return KV_OK;
}

int cuda_stage_pack(const fwd_batch *b, int32_t kv_blocks, int32_t block_size, int32_t *buf,
                    int64_t cap, cuda_stage_view *view, kvant_err *err)
{
    int rc = check_counts(b, err);
    if (rc)
        return rc;
    if (block_size < 1)
        return kvant_err_set(err, KV_EINVAL, "block_size %d", block_size);
    cuda_stage_view v = {.n_tokens = b->n_tokens, .n_seqs = b->n_seqs, .n_out = b->n_out};
    int64_t n = b->n_tokens;
    v.tokens = 0;
    v.pos = n;
    v.seq = 2 * n;
    v.out = 3 * n;
    v.table_off = v.out + b->n_out;
    v.table_len = v.table_off + b->n_seqs;
    v.tables = v.table_len + b->n_seqs;
    if (v.tables > cap)
        return kvant_err_set(err, KV_ERANGE, "batch of %d tokens does not fit the staging "
                             "capacity (%lld int32 entries, CUDA_STAGE_ELEMS)", b->n_tokens,
                             (long long)cap);
    if ((rc = pack_tables(b, kv_blocks, buf, cap, &v, err)))
        return rc;
    for (int32_t t = 0; t < b->n_tokens; t++) {
        int32_t s = b->seq[t], p = b->pos[t];
        if (s < 0 || s >= b->n_seqs)
            return kvant_err_set(err, KV_EINVAL, "token %d: sequence %d out of range", t, s);
        if (p < 0 || p / block_size >= b->seqs[s].n_blocks)
            return kvant_err_set(err, KV_EINVAL, "token %d: position %d not covered by %d blocks",
                                 t, p, b->seqs[s].n_blocks);
        buf[v.tokens + t] = b->tokens[t];
        buf[v.pos + t] = p;
        buf[v.seq + t] = s;
    }
    for (int32_t j = 0; j < b->n_out; j++) {
        if (b->out[j] < 0 || b->out[j] >= b->n_tokens)
            return kvant_err_set(err, KV_EINVAL, "output row %d refers to token %d", j, b->out[j]);
        buf[v.out + j] = b->out[j];
    }
    *view = v;
    return KV_OK;
}

int cuda_stage_weight_supported(uint32_t type)
{
    switch (type) {
    case DT_F32: case DT_F16: case DT_BF16: case DT_Q4_0: case DT_Q4_1: case DT_Q5_0:
    case DT_Q5_1: case DT_Q8_0: case DT_Q4_K: case DT_Q5_K: case DT_Q6_K:
        return 1;
    default:
        return 0;
    }
}

int cuda_stage_check_weight(const char *name, uint32_t type, int64_t ne0, kvant_err *err)
{
    const dtype_traits *tr = dtype_get(type);
    if (!tr || !cuda_stage_weight_supported(type))
        return kvant_err_set(err, KV_EUNSUP, "tensor %s: type %s has no CUDA kernel", name,
                             tr ? tr->name : "unknown");
    if (ne0 < 32 || ne0 % tr->block_size || ne0 % 32)
        return kvant_err_set(err, KV_EUNSUP, "tensor %s: row of %lld %s elements", name,
                             (long long)ne0, tr->name);
    return KV_OK;
}

int cuda_stage_check_kv(uint32_t type, int32_t head_dim, kvant_err *err)
{
    const dtype_traits *tr = dtype_get(type);
    int ok = type == DT_F32 || type == DT_F16 || type == DT_BF16 || type == DT_Q8_0 ||
             type == DT_Q4_0;
    if (!tr || !ok)
        return kvant_err_set(err, KV_EUNSUP,
                             "kv dtype %u: CUDA supports f32, f16, bf16, q8_0, q4_0", type);
    if (head_dim < 1 || head_dim > MODEL_MAX_HEAD_DIM || head_dim % tr->block_size)
        return kvant_err_set(err, KV_EUNSUP, "kv dtype %s: head_dim %d must be a multiple of %d "
                             "and at most %d", tr->name, head_dim, tr->block_size,
                             MODEL_MAX_HEAD_DIM);
    return KV_OK;
}

cuda_mm_path cuda_stage_mm_path(int32_t n_tokens, int32_t gemm_min_tokens)
{
    return gemm_min_tokens > 0 && n_tokens >= gemm_min_tokens ? CUDA_MM_GEMM : CUDA_MM_TILED;
}

int64_t cuda_stage_gemm_rows(int64_t ne0, int64_t n_rows, size_t ws_bytes)
{
    if (ne0 < 1)
        return 0;
    int64_t r = (int64_t)(ws_bytes / ((size_t)ne0 * sizeof(float)));
    return r < n_rows ? r : n_rows;
}
