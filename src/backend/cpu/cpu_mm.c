/* cpu_mm.c - the CPU backend's matmul jobs (see cpu_mm.h). */
#include "backend/cpu/cpu_mm.h"

#include <stdatomic.h>
#include <stddef.h>

#include "backend/cpu/tpool.h"
#include "kernels/dtype.h"
#include "kernels/matmul.h"

#define CPU_MM_CLAIM_MAX (128 * 1024)

/* Rows per claim: about 8 claims per thread, in multiples of 4 rows, at
 * least 16 KiB and at most CPU_MM_CLAIM_MAX of weights, so that both
 * threads of a step finish together when one is slowed down (a busy
 * sibling, an interrupt) while a claim stays long enough to stream
 * (run_job splits the job's last chunks further). */
static long matmul_chunk(const model_tensor *w, int nth)
{
    const long n_rows = (long)w->ne[1];
    long c = n_rows / ((long)nth * 8);
    const long min_rows = (long)((16 * 1024 + w->row_bytes - 1) / (w->row_bytes ? w->row_bytes : 1));
    const long max_rows = (long)(CPU_MM_CLAIM_MAX / (w->row_bytes ? w->row_bytes : 1));
    if (c > max_rows)
        c = max_rows;
    if (c < min_rows)
        c = min_rows;
    c = (c + 3) / 4 * 4;
    return c < 1 ? 1 : c;
}

/* One of the matmuls of a job: rows [first_claim * chunk ...) of w over n rows of x. */
typedef struct mm_part {
    const model_tensor *w, *bias;
    const float *x;
    const void *xq;    /* x quantized, or NULL (the kernel quantizes per claim) */
    int32_t n;
    float *y;
    uint32_t type;     /* w->type, | DT_PACKED for packed rows */
    long chunk;        /* rows per claim */
    long n_big;        /* claims of chunk rows; the rest (the job's tail) of tail rows */
    long tail;
    long first_claim;  /* claims before this part's */
} mm_part;

/* Matmuls claimed in row chunks from one counter. */
typedef struct mm_job {
    mm_part *p;
    int count;
    long n_claims;
    int qact;          /* int8-activation path */
    int split;         /* the split int8 path (tensors marked exact) */
    cpu_mm_glu_fn glu; /* cpu_mm_glu: parts {gate, up}, claims over the gate's rows */
    atomic_long next;  /* first claim not yet taken */
} mm_job;

static void mm_rows(const mm_job *j, const mm_part *p, long b, long e)
{
    const model_tensor *w = p->w;
    const int64_t n_rows = w->ne[1];
    if (j->split)
        dtype_matmul_rows_split(p->type, w->dev, w->row_bytes, b, e, w->ne[0], p->x, p->xq, p->n,
                                p->y, n_rows);
    else if (j->qact)
        dtype_matmul_rows_q(p->type, w->dev, w->row_bytes, b, e, w->ne[0], p->x, p->xq, p->n,
                            p->y, n_rows);
    else
        dtype_matmul_rows(w->type, w->dev, w->row_bytes, b, e, w->ne[0], p->x, p->n, p->y,
                          n_rows);
    if (p->bias && p->bias->dev) {
        const float *bias = p->bias->dev;
        for (int32_t t = 0; t < p->n; t++)
            for (long r = b; r < e; r++)
                p->y[(int64_t)t * n_rows + r] += bias[r];
    }
}

/* Which thread computes a row does not change its result (the
 * kernels/matmul.h contract), so claims may go to any thread. */
static void matmul_worker(int ith, int nth, void *arg)
{
    mm_job *j = arg;
    (void)ith, (void)nth;
    const int n_parts = j->glu ? 1 : j->count; /* glu: claims are the gate's */
    int i = 0;
    for (;;) {
        const long k = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (k >= j->n_claims)
            break;
        while (i + 1 < n_parts && k >= j->p[i + 1].first_claim) /* claims only grow */
            i++;
        const mm_part *p = &j->p[i];
        const long rows = (long)p->w->ne[1], kk = k - p->first_claim;
        const long b = kk < p->n_big ? kk * p->chunk : p->n_big * p->chunk + (kk - p->n_big) * p->tail;
        const long len = kk < p->n_big ? p->chunk : p->tail;
        const long e = b + len < rows ? b + len : rows;
        mm_rows(j, p, b, e);
        if (j->glu) { /* the same rows of up, then gate = act(gate) * up on them */
            mm_rows(j, &j->p[1], b, e);
            for (int32_t t = 0; t < p->n; t++)
                j->glu(p->y + (int64_t)t * rows + b, j->p[1].y + (int64_t)t * rows + b,
                       p->y + (int64_t)t * rows + b, e - b);
        }
    }
}

/* The int8 path a tensor takes: 0 exact (f32 activations), 1 int8, 2 split
 * int8 (two terms: tensors marked exact, e.g. the output head, keep about
 * f32 accuracy at the int8 kernels' speed). */
static int mm_path(const cpu_mm_env *cb, const model_tensor *w)
{
    if (!cb->act_q8 || !dtype_matmul_uses_qact(w->type))
        return 0;
    return w->exact ? 2 : 1;
}

/* Whether W[i] can share a job with W[0] (same width, same path, same
 * activation layout). */
static int mm_same_input(const cpu_mm_env *cb, const model_tensor *a, const model_tensor *b)
{
    const int qa = mm_path(cb, a), qb = mm_path(cb, b);
    return a->ne[0] == b->ne[0] && qa == qb && (!qa || a->packed == b->packed);
}

/* cb->qact holds at least need bytes (1 when it does). */
static int qact_room(const cpu_mm_env *cb, size_t need)
{
    if (need > *cb->qact_bytes) {
        size_t cap = (size_t)1 << 20;
        while (cap < need)
            cap *= 2;
        mem_free(cb->mem, *cb->qact);
        *cb->qact = mem_alloc(cb->mem, cap, MEM_WORKSPACE, MEM_NO_LAYER, NULL);
        *cb->qact_bytes = *cb->qact ? cap : 0;
    }
    return need <= *cb->qact_bytes;
}

static size_t round64(size_t v)
{
    return (v + 63) / 64 * 64;
}

/* Activations of at least this many values are quantized on the pool's
 * threads (tokens split between them); fewer, as at decode, on the
 * calling thread, where waking the pool would cost more than the work.
 * A token's bytes do not depend on the split. */
#define MM_QUANT_SERIAL_VALUES 16384

/* A part shares the previous part's input (and its quantized copy). */
static int shares_input(const mm_job *j, int i)
{
    return i > 0 && j->p[i].x == j->p[i - 1].x;
}

/* The inputs a job quantizes: every part's x into its xq but those that
 * share the previous part's. */
typedef struct mm_quant_job {
    const mm_job *j;
    uint32_t type;
    int64_t n;
    size_t token_bytes;
    long tokens; /* of the quantized parts */
} mm_quant_job;

/* Tokens [b, e) of all quantized parts' tokens in order (a grouped
 * job's parts may hold one token each). */
static void quant_worker(int ith, int nth, void *arg)
{
    const mm_quant_job *q = arg;
    long b, e, t0 = 0;
    tpool_range(q->tokens, ith, nth, &b, &e);
    for (int i = 0; i < q->j->count && t0 < e; i++) {
        const mm_part *p = &q->j->p[i];
        if (shares_input(q->j, i))
            continue;
        const long lo = b > t0 ? b - t0 : 0, hi = e - t0 < p->n ? e - t0 : p->n;
        t0 += p->n;
        if (lo >= hi)
            continue;
        const float *x = p->x + (int64_t)lo * q->n;
        void *xq = (char *)p->xq + (size_t)lo * q->token_bytes;
        if (q->j->split)
            dtype_matmul_quantize_split(q->type, x, q->n, hi - lo, xq);
        else
            dtype_matmul_quantize(q->type, x, q->n, hi - lo, xq);
    }
}

/* Quantizes each part's input once (consecutive parts with the same x share
 * it) into cb->qact, or leaves xq NULL when it cannot be had. */
static void quantize_inputs(const cpu_mm_env *cb, mm_job *j, int path)
{
    const model_tensor *w0 = j->p[0].w;
    mm_quant_job q = {.j = j, .type = w0->type | (w0->packed ? DT_PACKED : 0), .n = w0->ne[0],
                      .token_bytes = dtype_matmul_token_bytes(w0->type, j->split, w0->ne[0])};
    size_t need = 0;
    for (int i = 0; i < j->count; i++)
        if (!shares_input(j, i))
            need += round64(dtype_matmul_scratch_bytes(w0->type, w0->ne[0],
                                                        (int64_t)j->p[i].n * path));
    if (!qact_room(cb, need))
        return;
    size_t off = 0;
    for (int i = 0; i < j->count; i++) {
        mm_part *p = &j->p[i];
        if (shares_input(j, i)) {
            p->xq = j->p[i - 1].xq;
            continue;
        }
        p->xq = (char *)*cb->qact + off;
        q.tokens += p->n;
        off += round64(dtype_matmul_scratch_bytes(w0->type, w0->ne[0], (int64_t)p->n * path));
    }
    if (q.tokens * q.n < MM_QUANT_SERIAL_VALUES)
        quant_worker(0, 1, &q);
    else
        tpool_run(cb->pool, quant_worker, &q);
}

/* Runs the job's parts (w, bias, x, n, y set) as one pool job. */
static void run_job(const cpu_mm_env *cb, mm_job *j)
{
    const int path = mm_path(cb, j->p[0].w);
    j->split = path == 2;
    j->qact = path > 0;
    if (j->qact)
        quantize_inputs(cb, j, path);
    atomic_init(&j->next, 0);
    j->n_claims = 0;
    for (int i = 0; i < j->count; i++) {
        mm_part *p = &j->p[i];
        const long rows = (long)p->w->ne[1];
        p->type = p->w->type | (p->w->packed ? DT_PACKED : 0);
        p->chunk = j->qact && !p->xq ? (rows + cb->n_threads - 1) / cb->n_threads
                                     : matmul_chunk(p->w, cb->n_threads);
        p->n_big = (rows + p->chunk - 1) / p->chunk;
        p->tail = p->chunk;
        p->first_claim = j->n_claims;
        j->n_claims += p->n_big;
    }
    /* The job's last nth chunks of rows go in quarter claims, so that the
     * threads end closer together (the glu job's claims are the gate's). */
    mm_part *last = &j->p[j->glu ? 0 : j->count - 1];
    const long last_rows = (long)last->w->ne[1];
    if (last->chunk >= 16 && !(j->qact && !last->xq)) {
        const long full = last_rows / last->chunk;
        last->n_big = full > cb->n_threads ? full - cb->n_threads : 0;
        last->tail = last->chunk / 4 / 4 * 4;
    }
    j->n_claims = last->first_claim + last->n_big +
                  (last_rows - last->n_big * last->chunk + last->tail - 1) / last->tail;
    tpool_run(cb->pool, matmul_worker, j);
}

void cpu_mm_n(const cpu_mm_env *cb, int count, const model_tensor *const *W,
              const model_tensor *const *bias, const float *d_x, float *const *d_y, int32_t n)
{
    KV_ASSERT(count >= 1 && count <= CPU_MM_MAX_PARTS);
    for (int i = 1; i < count; i++) {
        if (!mm_same_input(cb, W[0], W[i])) { /* run them one by one */
            for (int k = 0; k < count; k++)
                cpu_mm_n(cb, 1, &W[k], &bias[k], d_x, &d_y[k], n);
            return;
        }
    }
    mm_part parts[CPU_MM_MAX_PARTS];
    mm_job j = {.p = parts, .count = count};
    for (int i = 0; i < count; i++)
        parts[i] = (mm_part){.w = W[i], .bias = bias[i], .x = d_x, .n = n, .y = d_y[i]};
    run_job(cb, &j);
}

void cpu_mm_group(const cpu_mm_env *cb, int count, const model_tensor *const *W,
                  const model_tensor *const *bias, const float *const *x, float *const *y,
                  const int32_t *n)
{
    KV_ASSERT(count >= 1 && count <= CPU_MM_GROUP_MAX);
    mm_part parts[CPU_MM_GROUP_MAX];
    mm_job j = {.p = parts, .count = 0};
    for (int i = 0; i < count; i++) {
        const model_tensor *b = bias ? bias[i] : NULL;
        if (!mm_same_input(cb, W[0], W[i])) {
            cpu_mm_n(cb, 1, &W[i], &b, x[i], &y[i], n[i]);
            continue;
        }
        parts[j.count++] = (mm_part){.w = W[i], .bias = b, .x = x[i], .n = n[i], .y = y[i]};
    }
    if (j.count)
        run_job(cb, &j);
}

int cpu_mm_glu(const cpu_mm_env *cb, const model_tensor *wg, const model_tensor *wu,
               const float *d_x, float *d_gate, float *d_up, int32_t n, cpu_mm_glu_fn glu)
{
    if (!mm_same_input(cb, wg, wu) || wg->ne[1] != wu->ne[1] || wg->packed != wu->packed)
        return 0;
    mm_part parts[2] = {
        {.w = wg, .x = d_x, .n = n, .y = d_gate},
        {.w = wu, .x = d_x, .n = n, .y = d_up},
    };
    mm_job j = {.p = parts, .count = 2, .glu = glu};
    run_job(cb, &j);
    return 1;
}
