/* cpu_rope.c - the step's RoPE tables (see cpu_rope.h). */
#include "backend/cpu/cpu_rope.h"

#include "backend/cpu/cpu_ops.h"

size_t cpu_rope_big_bytes(int32_t max_tokens, int32_t max_rot)
{
    if (max_tokens <= CPU_ROPE_TOKENS || max_rot <= 0)
        return 0;
    return (size_t)CPU_ROPE_SLOTS * (size_t)max_tokens * (size_t)max_rot * sizeof(float);
}

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

const float *cpu_rope_cache_get(cpu_rope_cache *rc, const fwd_batch *bt, const rope_params *rp)
{
    const int32_t n = bt->n_tokens;
    if (rp->n_rot > MODEL_MAX_HEAD_DIM)
        return NULL;
    for (int i = 0; i < rc->n; i++)
        if (same_table(&rc->key[i], rp))
            return rc->tab[i];
    if (rc->n == CPU_ROPE_SLOTS)
        return NULL;
    float *tab;
    if (n <= CPU_ROPE_TOKENS)
        tab = rc->cs[rc->n];
    else if (rc->big && n <= rc->big_tokens && rp->n_rot <= rc->big_rot)
        tab = rc->big + (size_t)rc->n * (size_t)rc->big_tokens * (size_t)rc->big_rot;
    else
        return NULL;
    const int i = rc->n++;
    rc->key[i] = *rp;
    rc->tab[i] = tab;
    cpu_rope_tables(bt->pos, n, rp, rp->d_freq_factors, tab);
    return tab;
}
