/* sampler.c - token sampling (see sampler.h for the pipeline and contract).
 *
 * Invariants:
 *  - s->w.counts is all zero between calls: the penalty stage counts the
 *    window, marks applied tokens by negating their count (the logit-bias
 *    stage marks the biased tokens it saved), and the last step of every
 *    call zeroes exactly the window's and the bias list's entries again.
 *  - s->w.probs is indexed by token id and holds exp((logit - max) / T), so the
 *    most likely candidate has the value 1 exactly; min-p is then "drop
 *    tokens with probs < min_p", independent of normalisation.
 *  - Candidate order is a total order: higher logit (or probability) first,
 *    lower token id first on ties, NaN as -inf.  Every selection is therefore
 *    deterministic whatever the algorithm, and top_k = 1 is the argmax.
 *  - No allocation after sampler_init (none at all with sampler_init_shared).
 *  - The scratch carries nothing from one call to the next: counts is back
 *    to zero, and every probs / idx / saved entry a call reads was written
 *    earlier in the same call.  So samplers that take turns may share one
 *    sampler_scratch, bit for bit as if each had its own.
 *
 * Selection without a full sort: top-k keeps a K-element min-heap while
 * scanning the vocabulary (O(n log K), typically O(n)), then heap-sorts the
 * K survivors only when top-p needs them in order.  Top-p without top-k
 * buckets the weights (16 per octave) while computing them, finds the
 * bucket where the cumulative mass crosses top_p, and sorts only that
 * bucket: two passes over the vocabulary plus a small sort.
 */
#include "text/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The bounds OpenAI documents for presence / frequency penalties. */
#define SAMPLER_PENALTY_ABS_MAX 2.0f
/* Top-p without top-k buckets weights by float bits: 16 buckets per octave
 * (4 mantissa bits), 32 octaves; lighter weights share the last bucket. */
#define SAMPLER_TOPP_BUCKET_SHIFT 19
#define SAMPLER_TOPP_BUCKETS 512

sampler_params sampler_params_default(void)
{
    sampler_params p = {
        .temperature = 0.0f,
        .top_k = 0,
        .top_p = 1.0f,
        .min_p = 0.0f,
        .repetition_penalty = 1.0f,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .penalty_last_n = 64,
        .seed = 0,
    };
    return p;
}

int sampler_params_check(const sampler_params *p, kvant_err *err)
{
    if (!p)
        return kvant_err_set(err, KV_EINVAL, "sampler params: NULL");
    /* Written as !(in range) so NaN fails every check. */
    if (!(isfinite(p->temperature) && p->temperature >= 0.0f))
        return kvant_err_set(err, KV_EINVAL, "temperature: %g is not a finite value >= 0",
                             (double)p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return kvant_err_set(err, KV_EINVAL, "top_p: %g is outside (0, 1]", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return kvant_err_set(err, KV_EINVAL, "min_p: %g is outside [0, 1]", (double)p->min_p);
    if (!(isfinite(p->repetition_penalty) && p->repetition_penalty > 0.0f))
        return kvant_err_set(err, KV_EINVAL, "repetition_penalty: %g is not a finite value > 0",
                             (double)p->repetition_penalty);
    if (!(p->presence_penalty >= -SAMPLER_PENALTY_ABS_MAX &&
          p->presence_penalty <= SAMPLER_PENALTY_ABS_MAX))
        return kvant_err_set(err, KV_EINVAL, "presence_penalty: %g is outside [-2, 2]",
                             (double)p->presence_penalty);
    if (!(p->frequency_penalty >= -SAMPLER_PENALTY_ABS_MAX &&
          p->frequency_penalty <= SAMPLER_PENALTY_ABS_MAX))
        return kvant_err_set(err, KV_EINVAL, "frequency_penalty: %g is outside [-2, 2]",
                             (double)p->frequency_penalty);
    if (p->penalty_last_n < -1)
        return kvant_err_set(err, KV_EINVAL, "penalty_last_n: %d is below -1",
                             (int)p->penalty_last_n);
    if (p->n_logit_bias < 0 || p->n_logit_bias > SAMPLER_MAX_LOGIT_BIAS)
        return kvant_err_set(err, KV_EINVAL, "logit_bias: %d entries (at most %d)",
                             (int)p->n_logit_bias, SAMPLER_MAX_LOGIT_BIAS);
    for (int32_t i = 0; i < p->n_logit_bias; i++)
        if (!(p->logit_bias[i].bias >= -100.0f && p->logit_bias[i].bias <= 100.0f))
            return kvant_err_set(err, KV_EINVAL, "logit_bias: %g for token %d is outside "
                                 "[-100, 100]", (double)p->logit_bias[i].bias,
                                 (int)p->logit_bias[i].token);
    return KV_OK;
}

/* ---- RNG: splitmix64 seeding, xoroshiro128++ stream ---------------------- */

static uint64_t sk_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t sk_rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t sk_next(uint64_t s[2])
{
    uint64_t s0 = s[0], s1 = s[1];
    uint64_t r = sk_rotl(s0 + s1, 17) + s0;
    s1 ^= s0;
    s[0] = sk_rotl(s0, 49) ^ s1 ^ (s1 << 21);
    s[1] = sk_rotl(s1, 28);
    return r;
}

/* Uniform in [0, 1) from the top 53 bits. */
static double sk_uniform(uint64_t s[2])
{
    return (double)(sk_next(s) >> 11) * 0x1.0p-53;
}

void sampler_reseed(sampler *s, uint64_t seed)
{
    KV_ASSERT(s);
    uint64_t x = seed;
    s->rng[0] = sk_splitmix64(&x);
    s->rng[1] = sk_splitmix64(&x);
    if (s->rng[0] == 0 && s->rng[1] == 0) /* the one forbidden state */
        s->rng[1] = 1;
}

/* ---- lifetime ------------------------------------------------------------ */

int sampler_scratch_init(sampler_scratch *w, int32_t n_vocab, kvant_err *err)
{
    KV_ASSERT(w);
    memset(w, 0, sizeof *w);
    if (n_vocab < 1)
        return kvant_err_set(err, KV_EINVAL, "n_vocab: %d is below 1", (int)n_vocab);
    size_t n = (size_t)n_vocab;
    w->probs = malloc(n * sizeof *w->probs);
    w->idx = malloc(n * sizeof *w->idx);
    w->counts = calloc(n, sizeof *w->counts);
    w->saved = malloc(n * sizeof *w->saved);
    if (!w->probs || !w->idx || !w->counts || !w->saved) {
        sampler_scratch_free(w);
        return kvant_err_set(err, KV_ENOMEM, "sampler scratch: %zu bytes for n_vocab %d",
                             n * 16, (int)n_vocab);
    }
    w->n_vocab = n_vocab;
    return KV_OK;
}

void sampler_scratch_free(sampler_scratch *w)
{
    if (!w)
        return;
    free(w->probs);
    free(w->idx);
    free(w->counts);
    free(w->saved);
    memset(w, 0, sizeof *w);
}

int sampler_init(sampler *s, const sampler_params *p, int32_t n_vocab, kvant_err *err)
{
    KV_ASSERT(s);
    memset(s, 0, sizeof *s);
    int rc = sampler_params_check(p, err);
    if (rc != KV_OK)
        return rc;
    if ((rc = sampler_scratch_init(&s->w, n_vocab, err)) != KV_OK)
        return rc;
    s->owns_scratch = 1;
    s->p = *p;
    s->n_vocab = n_vocab;
    sampler_reseed(s, p->seed);
    return KV_OK;
}

int sampler_init_shared(sampler *s, const sampler_params *p, const sampler_scratch *w,
                        kvant_err *err)
{
    KV_ASSERT(s && w);
    memset(s, 0, sizeof *s);
    int rc = sampler_params_check(p, err);
    if (rc != KV_OK)
        return rc;
    if (w->n_vocab < 1 || !w->probs)
        return kvant_err_set(err, KV_EINVAL, "sampler scratch: not initialised");
    s->w = *w;
    s->p = *p;
    s->n_vocab = w->n_vocab;
    sampler_reseed(s, p->seed);
    return KV_OK;
}

void sampler_free(sampler *s)
{
    if (!s)
        return;
    if (s->owns_scratch)
        sampler_scratch_free(&s->w);
    memset(s, 0, sizeof *s);
}

/* ---- stateless helpers --------------------------------------------------- */

int32_t sampler_argmax(const float *logits, int32_t n)
{
    KV_ASSERT(logits && n >= 1);
    int32_t best = 0;
    float bv = -INFINITY;
    for (int32_t i = 0; i < n; i++) {
        if (logits[i] > bv) { /* strict: lowest index wins ties; NaN never */
            bv = logits[i];
            best = i;
        }
    }
    return best;
}

/* log(sum(exp(x))) over n logits, max-shifted, double accumulation. */
static double sk_logsumexp(const float *x, int32_t n)
{
    float mx = x[sampler_argmax(x, n)];
    if (!isfinite(mx))
        return (double)mx; /* all -inf / NaN: -inf; any +inf: +inf */
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++)
        if (x[i] == x[i])
            sum += exp((double)x[i] - (double)mx);
    return (double)mx + log(sum);
}

double sampler_logsumexp(const float *logits, int32_t n)
{
    KV_ASSERT(logits && n >= 1);
    return sk_logsumexp(logits, n);
}

void sampler_top_k_ids(const float *x, int32_t n, int32_t k, int32_t *ids)
{
    if (k <= 0)
        return;
    int32_t m = 0; /* ids[0..m) sorted by value, descending; ties by id */
    for (int32_t v = 0; v < n; v++) {
        if (x[v] != x[v] || (m == k && !(x[v] > x[ids[m - 1]])))
            continue;
        int32_t at = m < k ? m : k - 1;
        while (at > 0 && x[v] > x[ids[at - 1]]) {
            ids[at] = ids[at - 1];
            at--;
        }
        ids[at] = v;
        m += m < k;
    }
    for (int32_t v = 0; m < k && v < n; v++) { /* fewer than k non-NaN values */
        int taken = 0;
        for (int32_t q = 0; q < m; q++)
            taken |= ids[q] == v;
        if (!taken)
            ids[m++] = v;
    }
}

float sampler_logprob(const float *logits, int32_t n, int32_t id)
{
    KV_ASSERT(logits && n >= 1 && id >= 0 && id < n);
    return (float)((double)logits[id] - sk_logsumexp(logits, n));
}

/* ---- penalties ----------------------------------------------------------- */

static int sk_penalties_active(const sampler_params *p)
{
    return p->penalty_last_n != 0 && (p->repetition_penalty != 1.0f ||
                                      p->presence_penalty != 0.0f ||
                                      p->frequency_penalty != 0.0f);
}

/* The last *n_win history tokens, the ones the penalties look at (none when
 * the penalties are disabled). */
static const int32_t *sk_window(const sampler *s, const int32_t *history, int64_t n_history,
                                int64_t *n_win)
{
    int64_t w = n_history;
    if (!sk_penalties_active(&s->p) || !history)
        w = 0;
    else if (s->p.penalty_last_n > 0 && s->p.penalty_last_n < n_history)
        w = s->p.penalty_last_n;
    *n_win = w;
    return history ? history + (n_history - w) : NULL;
}

/* Applies repetition (once per distinct token), presence and frequency
 * penalties in place.  Leaves counts[t] = -count for every penalised t (the
 * "applied" mark); sk_counts_clear must follow.  If save, keeps the raw
 * logit of each penalised token in s->w.saved. */
static void sk_penalties_apply(sampler *s, float *logits, const int32_t *win, int64_t n_win,
                               int save)
{
    const float rep = s->p.repetition_penalty;
    const float pres = s->p.presence_penalty;
    const float freq = s->p.frequency_penalty;
    for (int64_t i = 0; i < n_win; i++) {
        int32_t t = win[i];
        if (t >= 0 && t < s->n_vocab)
            s->w.counts[t]++;
    }
    for (int64_t i = 0; i < n_win; i++) {
        int32_t t = win[i];
        if (t < 0 || t >= s->n_vocab || s->w.counts[t] <= 0)
            continue; /* out of range, or already applied */
        int32_t c = s->w.counts[t];
        float x = logits[t];
        if (save)
            s->w.saved[t] = x;
        x = x > 0.0f ? x / rep : x * rep;
        x -= (float)c * freq + pres; /* c > 0 here, so presence always applies */
        logits[t] = x;
        s->w.counts[t] = -c;
    }
}

/* Adds the logit bias after the penalties (-100 bans: -inf).  If save, a
 * biased token that no penalty marked keeps its raw logit in s->w.saved and
 * gets the "applied" mark (counts -1) too; sk_counts_clear must follow. */
static void sk_bias_apply(sampler *s, float *logits, int save)
{
    for (int32_t i = 0; i < s->p.n_logit_bias; i++) {
        int32_t t = s->p.logit_bias[i].token;
        float b = s->p.logit_bias[i].bias;
        if (t < 0 || t >= s->n_vocab)
            continue;
        if (save && s->w.counts[t] == 0) {
            s->w.saved[t] = logits[t];
            s->w.counts[t] = -1;
        }
        logits[t] = b <= SAMPLER_BIAS_BAN ? -INFINITY : logits[t] + b;
    }
}

static void sk_counts_clear(sampler *s, const int32_t *win, int64_t n_win)
{
    for (int64_t i = 0; i < n_win; i++) {
        int32_t t = win[i];
        if (t >= 0 && t < s->n_vocab)
            s->w.counts[t] = 0;
    }
    for (int32_t i = 0; i < s->p.n_logit_bias; i++) { /* sk_bias_apply's marks */
        int32_t t = s->p.logit_bias[i].token;
        if (t >= 0 && t < s->n_vocab)
            s->w.counts[t] = 0;
    }
}

/* ---- heaps over token ids keyed by a float array ------------------------- */

static inline float sk_key(const float *key, int32_t t)
{
    float k = key[t];
    return k == k ? k : -INFINITY;
}

/* Total order: a ranks before b. */
static inline int sk_better(const float *key, int32_t a, int32_t b)
{
    float ka = sk_key(key, a), kb = sk_key(key, b);
    return ka > kb || (ka == kb && a < b);
}

/* Sift h[i] down a heap of n ids whose root is the worst-ranked id (a
 * bounded "keep the best K" heap; heap-sorting it puts the best first). */
static void sk_sift(int32_t *h, int64_t n, int64_t i, const float *key)
{
    int32_t t = h[i];
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && sk_better(key, h[c], h[c + 1]))
            c++; /* the worse child */
        if (!sk_better(key, t, h[c]))
            break;
        h[i] = h[c];
        i = c;
    }
    h[i] = t;
}

static void sk_heapify(int32_t *h, int64_t n, const float *key)
{
    for (int64_t i = n / 2 - 1; i >= 0; i--)
        sk_sift(h, n, i, key);
}

/* ---- selection ----------------------------------------------------------- */

/* exp((x - max) / T) with the edge cases pinned: the max itself is exactly
 * 1 (also when it is +inf), NaN gives 0. */
static inline float sk_weight(float x, float mx, float inv_t)
{
    if (x == mx)
        return 1.0f;
    float d = (x - mx) * inv_t;
    return d == d ? expf(d) : 0.0f;
}

/* Leaves the k best ids of [0, n) (ranked by key) in h[0..k), in heap
 * order: a bounded heap whose root is the worst kept id, so most ids cost
 * one comparison. */
static void sk_keep_best(int32_t *h, int32_t n, int32_t k, const float *key)
{
    for (int32_t i = 0; i < k; i++)
        h[i] = i;
    sk_heapify(h, k, key);
    for (int32_t t = k; t < n; t++) {
        if (sk_better(key, t, h[0])) {
            h[0] = t;
            sk_sift(h, k, 0, key);
        }
    }
}

/* Sorts the ids h[0..k) best first (heap-sort, worst to the end each time). */
static void sk_sort_best(int32_t *h, int32_t k, const float *key)
{
    sk_heapify(h, k, key);
    for (int32_t end = k - 1; end > 0; end--) {
        int32_t tmp = h[0];
        h[0] = h[end];
        h[end] = tmp;
        sk_sift(h, end, 0, key);
    }
}

/* Length of the shortest prefix of the sorted ids h[0..k) whose weight sum
 * reaches target (all k if rounding never gets there); the sum in *cum. */
static int32_t sk_nucleus(const sampler *s, const int32_t *h, int32_t k, double target,
                          double *cum)
{
    double c = 0.0;
    int32_t m = 0;
    while (m < k) {
        c += s->w.probs[h[m++]];
        if (c >= target)
            break;
    }
    *cum = c;
    return m;
}

/* top-k path: the K best ids go to s->w.idx[0..K), their weights to s->w.probs;
 * returns the candidate count after top-p and their weight sum in *total,
 * or 0 when every logit is -inf or NaN. */
static int32_t sk_select_topk(sampler *s, const float *logits, int32_t k, double *total)
{
    const int top_p = s->p.top_p < 1.0f;
    int32_t *h = s->w.idx;
    sk_keep_best(h, s->n_vocab, k, logits);
    if (top_p)
        sk_sort_best(h, k, logits);
    int32_t best = h[0];
    for (int32_t i = 1; i < k; i++)
        if (sk_better(logits, h[i], best))
            best = h[i];
    const float mx = logits[best], inv_t = 1.0f / s->p.temperature;
    if (!(mx > -INFINITY))
        return 0;
    double sum = 0.0;
    for (int32_t i = 0; i < k; i++) {
        float w = sk_weight(logits[h[i]], mx, inv_t);
        s->w.probs[h[i]] = w;
        sum += w;
    }
    if (!top_p) {
        *total = sum;
        return k;
    }
    return sk_nucleus(s, h, k, (double)s->p.top_p * sum, total);
}

/* Bucket of a weight w in [0, 1]: float bits of positive floats are
 * monotone, so distance from 1.0f's bits, shifted, gives 2^(23 - SHIFT)
 * buckets per octave, bucket 0 holding the largest weights.  Weights below
 * 2^-(SAMPLER_TOPP_BUCKETS >> 4) (and 0) share the last bucket. */
static inline int32_t sk_bucket(float w)
{
    uint32_t bits, one;
    const float f1 = 1.0f;
    memcpy(&bits, &w, sizeof bits);
    memcpy(&one, &f1, sizeof one);
    uint32_t b = (one - bits) >> SAMPLER_TOPP_BUCKET_SHIFT;
    return b < SAMPLER_TOPP_BUCKETS ? (int32_t)b : SAMPLER_TOPP_BUCKETS - 1;
}

/* Top-p over the whole vocabulary without sorting it: the bucket masses
 * (mass[SAMPLER_TOPP_BUCKETS], filled by the caller) locate the bucket where
 * the cumulative mass crosses target; every token of a heavier bucket is in
 * the nucleus, and only the boundary bucket is sorted to place the cut.
 * Leaves the nucleus in s->w.idx[0..m) (unordered) and returns m. */
static int32_t sk_nucleus_bucketed(sampler *s, const double *mass, double target, double *total)
{
    const int32_t n = s->n_vocab;
    double cum = 0.0;
    int32_t bb = 0; /* boundary bucket */
    for (; bb < SAMPLER_TOPP_BUCKETS - 1; bb++) {
        if (cum + mass[bb] >= target)
            break;
        cum += mass[bb];
    }
    int32_t *h = s->w.idx;
    int32_t m = 0, nb = 0; /* heavier ids fill h from the front, boundary ids from the back */
    for (int32_t t = 0; t < n; t++) {
        int32_t b = sk_bucket(s->w.probs[t]);
        if (b < bb)
            h[m++] = t;
        else if (b == bb)
            h[n - 1 - nb++] = t;
    }
    int32_t *bnd = h + n - nb;
    sk_sort_best(bnd, nb, s->w.probs);
    double bcum;
    int32_t j = sk_nucleus(s, bnd, nb, target - cum, &bcum);
    memmove(h + m, bnd, (size_t)j * sizeof *h); /* disjoint: m + nb <= n */
    *total = cum + bcum;
    return m + j;
}

/* no-top-k path: weights for the whole vocabulary.  Returns the candidate
 * count (0 when every logit is -inf or NaN); *cand is the first candidate
 * id in s->w.idx, or NULL for "every token, in id order". */
static int32_t sk_select_full(sampler *s, const float *logits, const int32_t **cand,
                              double *total)
{
    const int32_t n = s->n_vocab;
    const float mx = logits[sampler_argmax(logits, n)];
    if (!(mx > -INFINITY))
        return 0;
    const float inv_t = 1.0f / s->p.temperature;
    const int top_p = s->p.top_p < 1.0f;
    double mass[SAMPLER_TOPP_BUCKETS] = {0}; /* weight per bucket, top-p only */
    double sum = 0.0;
    for (int32_t t = 0; t < n; t++) {
        float w = sk_weight(logits[t], mx, inv_t);
        s->w.probs[t] = w;
        sum += w;
        if (top_p)
            mass[sk_bucket(w)] += w;
    }
    *cand = NULL;
    *total = sum;
    if (!top_p)
        return n;
    *cand = s->w.idx;
    return sk_nucleus_bucketed(s, mass, (double)s->p.top_p * sum, total);
}

/* The weight sum over the m candidates that min-p keeps (total, the sum
 * before min-p, when it is off). */
static double sk_minp_total(const sampler *s, const int32_t *cand, int32_t m, double total)
{
    const float thr = s->p.min_p; /* the best candidate has weight 1 */
    if (thr > 0.0f) {
        total = 0.0;
        for (int32_t i = 0; i < m; i++) {
            float w = s->w.probs[cand ? cand[i] : i];
            if (w >= thr)
                total += w;
        }
    }
    return total;
}

/* min-p filter, renormalise and draw one of m candidates (cand NULL: ids
 * 0..m-1).  total is the weight sum over the candidates before min-p. */
static int32_t sk_draw(sampler *s, const int32_t *cand, int32_t m, double total)
{
    const float thr = s->p.min_p;
    total = sk_minp_total(s, cand, m, total);
    const double target = sk_uniform(s->rng) * total;
    double cum = 0.0;
    int32_t last = -1;
    for (int32_t i = 0; i < m; i++) {
        int32_t t = cand ? cand[i] : i;
        float w = s->w.probs[t];
        if (w < thr || !(w > 0.0f))
            continue;
        cum += w;
        last = t;
        if (cum > target)
            return t;
    }
    KV_ASSERT(last >= 0); /* the best candidate always has weight 1 */
    return last;          /* rounding left target just above the sum */
}

/* Speculative sampling against the point-mass draft `draft`: accepts it
 * with its probability among the candidates (after min-p), else draws from
 * the candidates without it, renormalised; either way the result follows
 * sk_draw's distribution. */
static int32_t sk_draw_draft(sampler *s, const int32_t *cand, int32_t m, double total,
                             int32_t draft)
{
    const float thr = s->p.min_p;
    int in = 0;
    for (int32_t i = 0; i < m && !in; i++)
        in = (cand ? cand[i] : i) == draft;
    const float wd = in ? s->w.probs[draft] : 0.0f;
    if (!(wd > 0.0f) || wd < thr)
        return sk_draw(s, cand, m, total); /* the draft cannot be drawn */
    total = sk_minp_total(s, cand, m, total);
    if (sk_uniform(s->rng) * total < (double)wd)
        return draft;
    s->w.probs[draft] = 0.0f; /* the residual: the candidates without the draft */
    return sk_draw(s, cand, m, total - (double)wd);
}

static int32_t sk_sample(sampler *s, float *logits, const int32_t *history, int64_t n_history,
                         float *logprob, int32_t draft)
{
    KV_ASSERT(s && s->w.probs && logits && n_history >= 0 && (history || n_history == 0));
    KV_ASSERT(sampler_params_check(&s->p, NULL) == KV_OK);
    const int32_t n = s->n_vocab;
    double lse = 0.0;
    if (logprob)
        lse = sk_logsumexp(logits, n);

    int64_t n_win;
    const int32_t *win = sk_window(s, history, n_history, &n_win);
    sk_penalties_apply(s, logits, win, n_win, logprob != NULL);
    sk_bias_apply(s, logits, logprob != NULL);

    int32_t id;
    if (s->p.temperature == 0.0f) {
        id = sampler_argmax(logits, n);
    } else {
        const int32_t *cand = s->w.idx;
        double total = 0.0;
        int32_t m;
        if (s->p.top_k > 0 && s->p.top_k < n)
            m = sk_select_topk(s, logits, s->p.top_k, &total);
        else
            m = sk_select_full(s, logits, &cand, &total);
        if (m < 1)
            id = 0; /* nothing to sample from */
        else if (draft >= 0 && draft < n)
            id = sk_draw_draft(s, cand, m, total, draft);
        else
            id = sk_draw(s, cand, m, total);
    }

    if (logprob) {
        float raw = s->w.counts[id] < 0 ? s->w.saved[id] : logits[id];
        *logprob = (float)((double)raw - lse);
    }
    sk_counts_clear(s, win, n_win);
    return id;
}

int32_t sampler_sample_lp(sampler *s, float *logits, const int32_t *history, int64_t n_history,
                          float *logprob)
{
    return sk_sample(s, logits, history, n_history, logprob, -1);
}

int32_t sampler_sample(sampler *s, float *logits, const int32_t *history, int64_t n_history)
{
    return sk_sample(s, logits, history, n_history, NULL, -1);
}

int32_t sampler_sample_draft(sampler *s, float *logits, const int32_t *history,
                             int64_t n_history, int32_t draft)
{
    return sk_sample(s, logits, history, n_history, NULL, draft);
}
