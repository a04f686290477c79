/* cpu_rope.c - the step's RoPE tables (see cpu_rope.h). */
#include "backend/cpu/cpu_rope.h"

#include "backend/cpu/cpu_ops.h"

void cpu_rope_cache_reset(cpu_rope_cache *rc)
{
    rc->n = 0;
}

/* Every field but kind (the table does not depend on which dims pair up). */
static int same_table(const rope_params *a, const rope_params *b)
{
    return a->n_rot == b->n_rot && a->base == b->base && a->freq_scale == b->freq_scale &&
           a->d_freq_factors == b->d_freq_factors && a->mscale == b->mscale &&
           a->ext_factor == b->ext_factor && a->corr_lo == b->corr_lo && a->corr_hi == b->corr_hi;
}

const float (*cpu_rope_cache_get(cpu_rope_cache *rc, const fwd_batch *bt,
                                 const rope_params *rp))[MODEL_MAX_HEAD_DIM]
{
    if (bt->n_tokens > CPU_ROPE_TOKENS || rp->n_rot > MODEL_MAX_HEAD_DIM)
        return NULL;
    for (int i = 0; i < rc->n; i++)
        if (same_table(&rc->key[i], rp))
            return (const float (*)[MODEL_MAX_HEAD_DIM])rc->cs[i];
    if (rc->n == CPU_ROPE_SLOTS)
        return NULL;
    const int i = rc->n++;
    rc->key[i] = *rp;
    cpu_rope_tables(bt->pos, bt->n_tokens, rp, rp->d_freq_factors, &rc->cs[i][0][0],
                    MODEL_MAX_HEAD_DIM);
    return (const float (*)[MODEL_MAX_HEAD_DIM])rc->cs[i];
}
