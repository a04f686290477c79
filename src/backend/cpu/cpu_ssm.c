/* cpu_ssm.c - the recurrent layers of hybrid models on the CPU (see
 * cpu_ssm.h).
 *
 * Mamba-2, per token t of a sequence (proj = z | xBC | dt, from ssm_in):
 *   xBC = silu(conv(state, xBC) + conv1d_b)      (d_conv taps, oldest first)
 *   per head h (group g = h / (H / G)):
 *     dt = softplus(dt_raw[h] + dt_b[h]), dA = exp(dt * A[h])
 *     S[h][p][n] = S[h][p][n] dA + B[g][n] x[h][p] dt;  y[h][p] = S[h][p] . C[g] + D[h] x[h][p]
 *   y = rmsnorm_groups(y * silu(z)) * ssm_norm
 * Short convolution (lfm2), proj = b | c | x:
 *   y = c * conv(state, b * x)                   (l_cache taps, no bias)
 * Gated DeltaNet (qwen35), proj = q | k | v (attn_qkv), z (attn_gate), beta and alpha
 * logits per value head:
 *   qkv = silu(conv(state, qkv)); q, k /= sqrt(|.|^2 + eps) per key head
 *   per value head h (key head h % Hk), state M [head_v][head_k]:
 *     M *= exp(softplus(alpha + dt_b) a); d = (v - M k) sigmoid(beta); M += d k^T
 *     o = M q / sqrt(head_k);  y = rmsnorm(o) * ssm_norm * silu(z)
 */
#include "backend/cpu/cpu_ssm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"

cpu_state cpu_state_layout(const model *m, kernel_isa isa)
{
    cpu_state st;
    memset(&st, 0, sizeof st);
    st.scan = ssm_scan_for(isa);
    st.gdn = gdn_step_for(isa);
    const model_family_hp *f = &m->hp.fam;
    if (!f->recr)
        return st;
    st.conv_floats = model_recr_conv_floats(f, m->hp.n_embd);
    st.ssm_floats = model_recr_ssm_floats(f);
    uint64_t off = 0;
    for (int32_t il = 0; il < m->hp.n_layers; il++) {
        if (!f->is_recr[il])
            continue;
        st.conv_off[il] = off;
        st.ssm_off[il] = off + st.conv_floats;
        off += st.conv_floats + st.ssm_floats;
    }
    st.slot_floats = off;
    return st;
}

int cpu_state_alloc(cpu_state *st, mem_mgr *mem, int32_t n_slots, void **block, kvant_err *err)
{
    cpu_state_release(st, mem, block);
    if (n_slots < 1 || !st->slot_floats)
        return kvant_err_set(err, KV_EINVAL, "recurrent state: %d slots of %llu floats", n_slots,
                             (unsigned long long)st->slot_floats);
    const size_t bytes = (size_t)n_slots * st->slot_floats * sizeof(float);
    st->pos = calloc((size_t)n_slots, sizeof(int32_t)); /* host bookkeeping, as kvpool's */
    if (!st->pos)
        return kvant_err_set(err, KV_ENOMEM, "out of memory");
    *block = mem_alloc(mem, bytes, MEM_STATE, MEM_NO_LAYER, err);
    if (!*block) {
        free(st->pos);
        st->pos = NULL;
        return KV_ENOMEM;
    }
    memset(*block, 0, bytes);
    st->data = *block;
    st->n_slots = n_slots;
    return KV_OK;
}

void cpu_state_release(cpu_state *st, mem_mgr *mem, void **block)
{
    if (*block)
        mem_free(mem, *block);
    free(st->pos);
    *block = NULL;
    st->data = NULL;
    st->pos = NULL;
    st->n_slots = 0;
}

void cpu_state_copy(cpu_state *st, int32_t dst, int32_t src)
{
    if (dst < 0 || src < 0 || dst >= st->n_slots || src >= st->n_slots || dst == src)
        return;
    memcpy(st->data + (uint64_t)dst * st->slot_floats, st->data + (uint64_t)src * st->slot_floats,
           st->slot_floats * sizeof(float));
    st->pos[dst] = st->pos[src];
}

int cpu_state_export(const cpu_state *st, int32_t slot, void *dst)
{
    if (slot < 0 || slot >= st->n_slots)
        return -1;
    memcpy(dst, st->data + (uint64_t)slot * st->slot_floats, st->slot_floats * sizeof(float));
    return 0;
}

int cpu_state_import(cpu_state *st, int32_t slot, const void *src, int32_t pos)
{
    if (slot < 0 || slot >= st->n_slots || pos < 0)
        return -1;
    memcpy(st->data + (uint64_t)slot * st->slot_floats, src, st->slot_floats * sizeof(float));
    st->pos[slot] = pos;
    return 0;
}

/* The first and last token of sequence i in the batch (-1: none), checking
 * that its positions are consecutive. */
static int seq_span(const fwd_batch *b, int32_t i, int32_t *first, int32_t *last)
{
    *first = *last = -1;
    for (int32_t t = 0; t < b->n_tokens; t++) {
        if (b->seq[t] != i)
            continue;
        if (*last >= 0 && b->pos[t] != b->pos[*last] + 1)
            return -1;
        if (*first < 0)
            *first = t;
        *last = t;
    }
    return 0;
}

int cpu_state_begin(cpu_state *st, const fwd_batch *b, kvant_err *err)
{
    for (int32_t i = 0; i < b->n_seqs; i++) {
        const fwd_seq *s = &b->seqs[i];
        int32_t first, last; /* slot ranges: checked by the forward pass (check_state) */
        if (seq_span(b, i, &first, &last))
            return kvant_err_set(err, KV_EINVAL, "sequence %d: a recurrent layer needs its "
                                 "tokens at consecutive positions", i);
        if (first >= 0 && b->pos[first] != 0 && b->pos[first] != st->pos[s->state_slot])
            return kvant_err_set(err, KV_EINVAL, "sequence %d starts at position %d but its "
                                 "recurrent state (slot %d) is at %d", i, b->pos[first],
                                 s->state_slot, st->pos[s->state_slot]);
    }
    for (int32_t i = 0; i < b->n_seqs; i++) {
        const fwd_seq *s = &b->seqs[i];
        int32_t first, last;
        seq_span(b, i, &first, &last);
        if (last >= 0)
            st->pos[s->state_slot] = b->pos[last] + 1;
        for (int32_t j = 0; j < s->n_state_snap; j++)
            st->pos[s->state_snap[2 * j + 1]] = s->state_snap[2 * j];
    }
    return KV_OK;
}

/* The snapshot slot of s to fill after the token at position p, or -1. */
static int32_t snap_slot(const fwd_seq *s, int32_t p)
{
    for (int32_t j = 0; j < s->n_state_snap; j++)
        if (s->state_snap[2 * j] == p + 1)
            return s->state_snap[2 * j + 1];
    return -1;
}

typedef struct recr_job {
    const cpu_recr_env *env;
    int32_t il;
    const model_layer *L;
    float eps;
    float *proj, *y;        /* in[0], the output */
    const float *beta, *alpha; /* Gated DeltaNet: in[1], in[2] */
    int32_t n;
} recr_job;

/* The largest head the Gated DeltaNet worker takes (its delta row on the stack). */
#define GDN_MAX_HEAD 1024

static float *slot_base(const cpu_state *st, int32_t slot)
{
    return st->data + (uint64_t)slot * st->slot_floats;
}

static float silu(float v)
{
    return v / (1.0f + expf(-v));
}

/* Channels [c0, c1) of one token's convolution: in[c] is the new input,
 * out[c] the tap sum (plus bias), the state shifted by one row. */
static void conv_token(float *st, int64_t CH, int32_t K, const float *w, const float *bias,
                       const float *in, float *out, long c0, long c1)
{
    for (long c = c0; c < c1; c++) {
        const float *wc = w + (int64_t)c * K;
        float acc = 0.0f;
        for (int32_t k = 0; k < K - 1; k++)
            acc += st[k * CH + c] * wc[k];
        acc += in[c] * wc[K - 1];
        if (bias)
            acc += bias[c];
        for (int32_t k = 0; k < K - 2; k++)
            st[k * CH + c] = st[(k + 1) * CH + c];
        st[(int64_t)(K - 2) * CH + c] = in[c];
        out[c] = acc;
    }
}

/* Copies channels [c0, c1) of the conv state rows (K - 1 of CH) to dst. */
static void copy_conv(float *dst, const float *src, int64_t CH, int32_t K, long c0, long c1)
{
    for (int32_t k = 0; k < K - 1; k++)
        memcpy(dst + k * CH + c0, src + k * CH + c0, (size_t)(c1 - c0) * sizeof(float));
}

static void zero_conv(float *st, int64_t CH, int32_t K, long c0, long c1)
{
    for (int32_t k = 0; k < K - 1; k++)
        memset(st + k * CH + c0, 0, (size_t)(c1 - c0) * sizeof(float));
}

/* The convolution over channels, each thread its range for every token in
 * batch order.  Mamba-2: in place on xBC, then silu; lfm2: on b * x, times c
 * into y. */
static void conv_worker(int ith, int nth, void *arg)
{
    const recr_job *j = arg;
    const cpu_recr_env *env = j->env;
    const cpu_state *st = env->st;
    const model_family_hp *f = env->f;
    const model_layer *L = j->L;
    const int32_t K = (int32_t)f->ssm_d_conv;
    const int mamba = L->recr == RECR_MAMBA2, gdn = L->recr == RECR_GDN;
    const int64_t D = f->ssm_d_inner, E = env->n_embd;
    const int64_t CH = model_recr_conv_channels(f, (int32_t)E);
    const int64_t P = L->ssm_in.ne[1];
    const float *w = L->ssm_conv1d.dev, *bias = L->ssm_conv1d_b.dev;
    long c0, c1;
    tpool_range((long)CH, ith, nth, &c0, &c1);
    if (c0 >= c1)
        return;
    for (int32_t t = 0; t < j->n; t++) {
        const fwd_seq *s = &env->batch->seqs[env->batch->seq[t]];
        const int32_t p = env->batch->pos[t];
        float *cs = slot_base(st, s->state_slot) + st->conv_off[j->il];
        if (p == 0)
            zero_conv(cs, CH, K, c0, c1);
        float *row = j->proj + (int64_t)t * P;
        if (mamba || gdn) {
            float *xbc = mamba ? row + D : row; /* Gated DeltaNet: all of q | k | v */
            conv_token(cs, CH, K, w, bias, xbc, xbc, c0, c1);
            for (long c = c0; c < c1; c++)
                xbc[c] = silu(xbc[c]);
        } else {
            float *b = row, *c = row + E, *x = row + 2 * E, *y = j->y + (int64_t)t * E;
            for (long ch = c0; ch < c1; ch++)
                x[ch] = b[ch] * x[ch];
            conv_token(cs, CH, K, w, NULL, x, y, c0, c1);
            for (long ch = c0; ch < c1; ch++)
                y[ch] = c[ch] * y[ch];
        }
        const int32_t snap = snap_slot(s, p);
        if (snap >= 0)
            copy_conv(slot_base(st, snap) + st->conv_off[j->il], cs, CH, K, c0, c1);
    }
}

/* The selective scan over heads, each thread its range for every token. */
static void scan_worker(int ith, int nth, void *arg)
{
    const recr_job *j = arg;
    const cpu_recr_env *env = j->env;
    const cpu_state *st = env->st;
    const model_family_hp *f = env->f;
    const model_layer *L = j->L;
    const int64_t D = f->ssm_d_inner, N = f->ssm_d_state, G = f->ssm_n_group;
    const int32_t H = (int32_t)f->ssm_n_head, HD = (int32_t)(D / H);
    const int64_t P = L->ssm_in.ne[1], per_g = H / G, head_floats = (int64_t)HD * N;
    const float *A = L->ssm_a.dev, *Dk = L->ssm_d.dev, *dtb = L->ssm_dt_b.dev;
    long h0, h1;
    tpool_range(H, ith, nth, &h0, &h1);
    if (h0 >= h1)
        return;
    for (int32_t t = 0; t < j->n; t++) {
        const fwd_seq *s = &env->batch->seqs[env->batch->seq[t]];
        const int32_t p = env->batch->pos[t];
        float *S = slot_base(st, s->state_slot) + st->ssm_off[j->il];
        if (p == 0)
            memset(S + h0 * head_floats, 0, (size_t)((h1 - h0) * head_floats) * sizeof(float));
        const float *row = j->proj + (int64_t)t * P;
        const float *x = row + D, *B = x + D, *C = B + G * N, *dt_raw = row + 2 * D + 2 * G * N;
        float *y = j->y + (int64_t)t * D;
        for (long h = h0; h < h1; h++) {
            const float dt = ssm_softplus(dt_raw[h] + dtb[h]);
            const float dA = expf(dt * A[h]);
            const int64_t g = h / per_g;
            const float *xh = x + h * HD;
            float *yh = y + h * HD;
            st->scan(S + h * head_floats, xh, B + g * N, C + g * N, dA, dt, HD, (int32_t)N, yh);
            for (int32_t i = 0; i < HD; i++)
                yh[i] += xh[i] * Dk[h];
        }
        const int32_t snap = snap_slot(s, p);
        if (snap >= 0)
            memcpy(slot_base(st, snap) + st->ssm_off[j->il] + h0 * head_floats,
                   S + h0 * head_floats, (size_t)((h1 - h0) * head_floats) * sizeof(float));
    }
}

/* y = rmsnorm_groups(y * silu(z)) * ssm_norm, token by token. */
static void gate_worker(int ith, int nth, void *arg)
{
    const recr_job *j = arg;
    const model_family_hp *f = j->env->f;
    const int64_t D = f->ssm_d_inner, G = f->ssm_n_group, DG = D / G;
    const int64_t P = j->L->ssm_in.ne[1];
    const float *w = j->L->ssm_norm.dev;
    long t0, t1;
    tpool_range(j->n, ith, nth, &t0, &t1);
    for (long t = t0; t < t1; t++) {
        const float *z = j->proj + t * P;
        float *y = j->y + t * D;
        cpu_swiglu(z, y, y, D);
        for (int64_t g = 0; g < G; g++)
            cpu_rmsnorm_row(y + g * DG, w + g * DG, j->eps, y + g * DG, (int32_t)DG);
    }
}

/* q and k of every key head of every token divided by sqrt(|.|^2 + eps)
 * (llama.cpp's build_gdn_l2_norm), token by token. */
static void l2_worker(int ith, int nth, void *arg)
{
    const recr_job *j = arg;
    const model_family_hp *f = j->env->f;
    const int64_t dk = f->ssm_d_state, nk = 2ll * f->ssm_n_group; /* q and k heads */
    const int64_t P = j->L->ssm_in.ne[1];
    long t0, t1;
    tpool_range(j->n, ith, nth, &t0, &t1);
    for (long t = t0; t < t1; t++)
        for (int64_t h = 0; h < nk; h++) {
            float *x = j->proj + t * P + h * dk;
            float ss = 0.0f;
            for (int64_t i = 0; i < dk; i++)
                ss += x[i] * x[i];
            const float s = 1.0f / sqrtf(ss + j->eps);
            for (int64_t i = 0; i < dk; i++)
                x[i] *= s;
        }
}

/* Gated DeltaNet over value heads, each thread its range for every token:
 * the delta rule, then the head's RMS norm times silu(z) into y (z's place). */
static void gdn_worker(int ith, int nth, void *arg)
{
    const recr_job *j = arg;
    const cpu_recr_env *env = j->env;
    const cpu_state *st = env->st;
    const model_family_hp *f = env->f;
    const model_layer *L = j->L;
    const int64_t H = f->ssm_n_head, Hk = f->ssm_n_group, dk = f->ssm_d_state;
    const int64_t dv = f->ssm_d_inner / H, P = L->ssm_in.ne[1], D = f->ssm_d_inner;
    const float *A = L->ssm_a.dev, *dtb = L->ssm_dt_b.dev, *w = L->ssm_norm.dev;
    const float scale = 1.0f / sqrtf((float)dk);
    float delta[GDN_MAX_HEAD], o[GDN_MAX_HEAD];
    long h0, h1;
    tpool_range((long)H, ith, nth, &h0, &h1);
    if (h0 >= h1)
        return;
    for (int32_t t = 0; t < j->n; t++) {
        const fwd_seq *s = &env->batch->seqs[env->batch->seq[t]];
        const int32_t p = env->batch->pos[t];
        float *S = slot_base(st, s->state_slot) + st->ssm_off[j->il];
        if (p == 0)
            memset(S + h0 * dv * dk, 0, (size_t)((h1 - h0) * dv * dk) * sizeof(float));
        const float *row = j->proj + (int64_t)t * P;
        for (long h = h0; h < h1; h++) {
            const int64_t kh = h % Hk;
            const float g = ssm_softplus(j->alpha[(int64_t)t * H + h] + dtb[h]) * A[h];
            const float beta = 1.0f / (1.0f + expf(-j->beta[(int64_t)t * H + h]));
            st->gdn(S + h * dv * dk, (int32_t)dv, (int32_t)dk, row + kh * dk,
                    row + (Hk + kh) * dk, row + 2 * Hk * dk + h * dv, expf(g), beta, scale, delta,
                    o);
            float *y = j->y + (int64_t)t * D + h * dv; /* holds z */
            cpu_rmsnorm_row(o, w, j->eps, o, (int32_t)dv);
            for (int64_t i = 0; i < dv; i++)
                y[i] = o[i] * (y[i] / (1.0f + expf(-y[i])));
        }
        const int32_t snap = snap_slot(s, p);
        if (snap >= 0)
            memcpy(slot_base(st, snap) + st->ssm_off[j->il] + h0 * dv * dk, S + h0 * dv * dk,
                   (size_t)((h1 - h0) * dv * dk) * sizeof(float));
    }
}

void cpu_recr_mix(const cpu_recr_env *env, int32_t il, const model_layer *L, float eps,
                  float *const *in, float *y, int32_t n)
{
    recr_job j = {env, il, L, eps, in[0], y, in[1], in[2], n};
    tpool_run(env->pool, conv_worker, &j);
    if (L->recr == RECR_GDN) {
        tpool_run(env->pool, l2_worker, &j);
        tpool_run(env->pool, gdn_worker, &j);
        return;
    }
    if (L->recr != RECR_MAMBA2)
        return;
    tpool_run(env->pool, scan_worker, &j);
    tpool_run(env->pool, gate_worker, &j);
}
