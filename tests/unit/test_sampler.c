/* test_sampler.c - sampler semantics: greedy, ties, seeding, top-k/top-p/
 * min-p truncation, penalties against hand-computed values, softmax
 * frequencies, logprob against double precision, parameter validation,
 * samplers sharing one scratch bit for bit equal to samplers owning theirs. */
#include "text/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "testutil.h"

static sampler_params params_t(float temperature, uint64_t seed)
{
    sampler_params p = sampler_params_default();
    p.temperature = temperature;
    p.seed = seed;
    return p;
}

/* Draws n tokens with fresh copies of base each time (so penalties and
 * in-place edits never accumulate), counting them into hist[n_vocab]. */
static void draw_hist(sampler *s, const float *base, int32_t nv, int n, long *hist)
{
    float *l = malloc((size_t)nv * sizeof *l);
    memset(hist, 0, (size_t)nv * sizeof *hist);
    for (int i = 0; i < n; i++) {
        memcpy(l, base, (size_t)nv * sizeof *l);
        int32_t t = sampler_sample(s, l, NULL, 0);
        CHECK(t >= 0 && t < nv);
        if (t >= 0 && t < nv)
            hist[t]++;
    }
    free(l);
}

static void test_greedy_and_ties(void)
{
    float l[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f, NAN};
    CHECK(sampler_argmax(l, 6) == 1); /* tie between 1 and 3: lowest index */
    float nan_first[3] = {NAN, -3.0f, -2.0f};
    CHECK(sampler_argmax(nan_first, 3) == 2);
    float all_ninf[3] = {-INFINITY, -INFINITY, -INFINITY};
    CHECK(sampler_argmax(all_ninf, 3) == 0);

    sampler s;
    sampler_params p = params_t(0.0f, 1);
    p.top_k = 3; /* ignored at temperature 0 */
    CHECK(sampler_init(&s, &p, 6, NULL) == KV_OK);
    for (int i = 0; i < 10; i++) {
        float c[6];
        memcpy(c, l, sizeof c);
        CHECK(sampler_sample(&s, c, NULL, 0) == 1);
    }
    sampler_free(&s);
    sampler_free(&s); /* idempotent */

    /* random logits: sampler greedy equals a naive argmax */
    tu_rng r = {42};
    enum { NV = 1000 };
    static float big[NV];
    CHECK(sampler_init(&s, &p, NV, NULL) == KV_OK);
    for (int rep = 0; rep < 20; rep++) {
        int want = 0;
        for (int i = 0; i < NV; i++) {
            big[i] = tu_rand_normal(&r) * 3.0f;
            if (big[i] > big[want])
                want = i;
        }
        CHECK(sampler_sample(&s, big, NULL, 0) == want);
    }
    sampler_free(&s);
}

static void test_seeding(void)
{
    enum { NV = 50, N = 200 };
    float base[NV], l[NV];
    tu_rng r = {7};
    for (int i = 0; i < NV; i++)
        base[i] = tu_rand_normal(&r);
    sampler a, b, c;
    sampler_params pa = params_t(1.0f, 1234), pc = params_t(1.0f, 1235);
    CHECK(sampler_init(&a, &pa, NV, NULL) == KV_OK);
    CHECK(sampler_init(&b, &pa, NV, NULL) == KV_OK);
    CHECK(sampler_init(&c, &pc, NV, NULL) == KV_OK);
    int32_t seq_a[N];
    int same_ab = 1, same_ac = 1;
    for (int i = 0; i < N; i++) {
        memcpy(l, base, sizeof l);
        seq_a[i] = sampler_sample(&a, l, NULL, 0);
        memcpy(l, base, sizeof l);
        same_ab &= sampler_sample(&b, l, NULL, 0) == seq_a[i];
        memcpy(l, base, sizeof l);
        same_ac &= sampler_sample(&c, l, NULL, 0) == seq_a[i];
    }
    CHECK(same_ab);
    CHECK(!same_ac);
    /* reseed replays the same sequence */
    sampler_reseed(&a, 1234);
    int replay = 1;
    for (int i = 0; i < N; i++) {
        memcpy(l, base, sizeof l);
        replay &= sampler_sample(&a, l, NULL, 0) == seq_a[i];
    }
    CHECK(replay);
    sampler_free(&a);
    sampler_free(&b);
    sampler_free(&c);
}

static void test_topk1_is_greedy(void)
{
    enum { NV = 300 };
    float base[NV], l[NV];
    tu_rng r = {99};
    const float temps[] = {0.1f, 1.0f, 5.0f, 100.0f};
    for (size_t ti = 0; ti < sizeof temps / sizeof temps[0]; ti++) {
        sampler s;
        sampler_params p = params_t(temps[ti], ti);
        p.top_k = 1;
        CHECK(sampler_init(&s, &p, NV, NULL) == KV_OK);
        for (int rep = 0; rep < 50; rep++) {
            for (int i = 0; i < NV; i++)
                base[i] = tu_rand_normal(&r);
            base[rep] = base[rep + 100] = 10.0f; /* a tie for the top */
            memcpy(l, base, sizeof l);
            CHECK(sampler_sample(&s, l, NULL, 0) == rep);
        }
        sampler_free(&s);
    }
}

/* Empirical frequencies vs exact softmax (T and top-k applied by hand). */
static void check_freqs(const char *what, const sampler_params *p, const float *base, int32_t nv,
                        const double *want)
{
    enum { N = 20000 };
    long hist[16];
    sampler s;
    CHECK(sampler_init(&s, p, nv, NULL) == KV_OK);
    draw_hist(&s, base, nv, N, hist);
    double maxdiff = 0.0, chi2 = 0.0;
    for (int i = 0; i < nv; i++) {
        double f = (double)hist[i] / N;
        maxdiff = fmax(maxdiff, fabs(f - want[i]));
        if (want[i] > 0)
            chi2 += (hist[i] - N * want[i]) * (hist[i] - N * want[i]) / (N * want[i]);
        else
            CHECKF(hist[i] == 0, "%s: token %d has p=0 but was drawn %ld times", what, i, hist[i]);
    }
    /* 7 degrees of freedom at most: chi2 > 30 has p < 1e-4. */
    CHECKF(maxdiff < 0.01 && chi2 < 30.0, "%s: max |f - p| = %.4f, chi2 = %.2f", what, maxdiff,
           chi2);
    sampler_free(&s);
}

static void softmax_ref(const float *l, int n, double t, double *out)
{
    double mx = -INFINITY, sum = 0.0;
    for (int i = 0; i < n; i++)
        mx = fmax(mx, l[i]);
    for (int i = 0; i < n; i++)
        sum += out[i] = exp(((double)l[i] - mx) / t);
    for (int i = 0; i < n; i++)
        out[i] /= sum;
}

static void test_distribution(void)
{
    const float base[8] = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, 1.5f, -1.0f, 0.7f};
    double want[8];
    softmax_ref(base, 8, 1.0, want);
    sampler_params p = params_t(1.0f, 2024);
    check_freqs("T=1", &p, base, 8, want);

    softmax_ref(base, 8, 0.5, want);
    p = params_t(0.5f, 77);
    check_freqs("T=0.5", &p, base, 8, want);

    /* top-k 3 at T=2: only tokens 3, 5, 0 survive, renormalised */
    const float kept[3] = {2.0f, 1.5f, 1.0f};
    double kw[3];
    softmax_ref(kept, 3, 2.0, kw);
    memset(want, 0, sizeof want);
    want[3] = kw[0];
    want[5] = kw[1];
    want[0] = kw[2];
    p = params_t(2.0f, 5);
    p.top_k = 3;
    check_freqs("top_k=3 T=2", &p, base, 8, want);
}

/* Speculative sampling (sampler_sample_draft): with any draft (likely,
 * unlikely, outside the candidates) the tokens follow the distribution
 * sampler_sample draws from, by the same chi-square check; a wrong
 * acceptance rule (accepting more or less often than p(draft), or drawing
 * the residual with the draft left in) moves the draft's frequency. */
static void check_draft_freqs(const char *what, const sampler_params *p, const float *base,
                              const double *want)
{
    enum { N = 40000, NV = 8 };
    for (int32_t d = 0; d < NV; d++) {
        long hist[NV] = {0};
        sampler s;
        CHECK(sampler_init(&s, p, NV, NULL) == KV_OK);
        float l[NV];
        for (int i = 0; i < N; i++) {
            memcpy(l, base, sizeof l);
            int32_t t = sampler_sample_draft(&s, l, NULL, 0, d);
            CHECK(t >= 0 && t < NV);
            if (t >= 0 && t < NV)
                hist[t]++;
        }
        sampler_free(&s);
        double chi2 = 0.0, maxdiff = 0.0;
        for (int i = 0; i < NV; i++) {
            maxdiff = fmax(maxdiff, fabs((double)hist[i] / N - want[i]));
            if (want[i] > 0)
                chi2 += (hist[i] - N * want[i]) * (hist[i] - N * want[i]) / (N * want[i]);
            else
                CHECKF(hist[i] == 0, "%s draft %d: token %d has p=0, drawn %ld times", what, d,
                       i, hist[i]);
        }
        /* 7 degrees of freedom at most: chi2 > 30 has p < 1e-4 */
        CHECKF(maxdiff < 0.01 && chi2 < 30.0, "%s draft %d: max |f - p| = %.4f, chi2 = %.2f",
               what, d, maxdiff, chi2);
    }
}

static void test_draft_distribution(void)
{
    const float base[8] = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, 1.5f, -1.0f, 0.7f};
    double want[8];
    softmax_ref(base, 8, 1.0, want);
    sampler_params p = params_t(1.0f, 31);
    check_draft_freqs("draft T=1", &p, base, want);
    softmax_ref(base, 8, 0.5, want);
    p = params_t(0.5f, 32);
    check_draft_freqs("draft T=0.5", &p, base, want);

    /* top-k 3 at T=2 (drafts outside the three are never drawn) */
    const float kept[3] = {2.0f, 1.5f, 1.0f};
    double kw[3];
    softmax_ref(kept, 3, 2.0, kw);
    memset(want, 0, sizeof want);
    want[3] = kw[0];
    want[5] = kw[1];
    want[0] = kw[2];
    p = params_t(2.0f, 33);
    p.top_k = 3;
    check_draft_freqs("draft top_k=3 T=2", &p, base, want);

    /* min-p 0.3 at T=1: weights exp(l - 2) >= 0.3 kept (tokens 3, 5, 0), renormalised */
    double sum = 0;
    for (int i = 0; i < 8; i++) {
        double w = exp((double)base[i] - 2.0);
        want[i] = w >= 0.3 ? w : 0.0;
        sum += want[i];
    }
    for (int i = 0; i < 8; i++)
        want[i] /= sum;
    p = params_t(1.0f, 34);
    p.min_p = 0.3f;
    check_draft_freqs("draft min_p=0.3", &p, base, want);

    /* greedy: the argmax whatever the draft */
    p = params_t(0.0f, 35);
    sampler s;
    CHECK(sampler_init(&s, &p, 8, NULL) == KV_OK);
    float l[8];
    for (int32_t d = -1; d < 9; d++) {
        memcpy(l, base, sizeof l);
        CHECK(sampler_sample_draft(&s, l, NULL, 0, d) == 3);
    }
    sampler_free(&s);
}

static void test_top_p(void)
{
    /* probs 0.5, 0.25, 0.125, 0.0625, 0.0625 (log-probs as logits) */
    const float l[5] = {logf(0.25f), logf(0.5f), logf(0.0625f), logf(0.125f), logf(0.0625f)};
    double want[5] = {0};
    /* top_p 0.7: 0.5 < 0.7, 0.75 >= 0.7 -> nucleus {1, 0} */
    want[1] = 2.0 / 3.0;
    want[0] = 1.0 / 3.0;
    sampler_params p = params_t(1.0f, 11);
    p.top_p = 0.7f;
    check_freqs("top_p=0.7", &p, l, 5, want);
    /* same with top-k 4 in front (sorted path) */
    p.top_k = 4;
    check_freqs("top_p=0.7 top_k=4", &p, l, 5, want);

    /* tiny top_p keeps exactly the best token */
    p = params_t(3.0f, 12);
    p.top_p = 1e-6f;
    long hist[5];
    sampler s;
    CHECK(sampler_init(&s, &p, 5, NULL) == KV_OK);
    draw_hist(&s, l, 5, 2000, hist);
    CHECK(hist[1] == 2000);
    sampler_free(&s);

    /* large random vocabulary: every draw lies in the nucleus computed by a
     * full sort in double precision */
    enum { NV = 5000 };
    static float big[NV], tmp[NV];
    static double pr[NV];
    static int order[NV];
    tu_rng r = {3};
    for (int i = 0; i < NV; i++)
        big[i] = tu_rand_normal(&r) * 2.0f;
    softmax_ref(big, NV, 1.0, pr);
    for (int i = 0; i < NV; i++)
        order[i] = i;
    for (int i = 1; i < NV; i++) { /* insertion sort by prob desc */
        int v = order[i], j = i;
        while (j > 0 && pr[order[j - 1]] < pr[v]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = v;
    }
    static char in_nucleus[NV];
    double cum = 0.0;
    int m = 0;
    while (m < NV && cum < 0.9) {
        cum += pr[order[m]];
        in_nucleus[order[m++]] = 1;
    }
    p = params_t(1.0f, 13);
    p.top_p = 0.9f;
    CHECK(sampler_init(&s, &p, NV, NULL) == KV_OK);
    int outside = 0;
    for (int i = 0; i < 3000; i++) {
        memcpy(tmp, big, sizeof tmp);
        outside += !in_nucleus[sampler_sample(&s, tmp, NULL, 0)];
    }
    CHECKF(outside == 0, "%d draws outside the %d-token nucleus", outside, m);
    sampler_free(&s);

    /* 100 equal logits, top_p 0.5: the nucleus is exactly ids 0..49 (ties
     * go to the lower id), all of them reachable; after top_k 60 it is half
     * of the 60 survivors, ids 0..29 */
    enum { NE = 100 };
    static float eq[NE];
    static long eh[NE];
    for (int i = 0; i < NE; i++)
        eq[i] = -1.25f;
    for (int k = 0; k <= 60; k += 60) { /* bucketed path, then sorted top-k path */
        p = params_t(1.0f, 14);
        p.top_p = 0.5f;
        p.top_k = k;
        CHECK(sampler_init(&s, &p, NE, NULL) == KV_OK);
        draw_hist(&s, eq, NE, 5000, eh);
        const int want_m = k ? 30 : 50;
        int inside = 1, covered = 1;
        for (int i = 0; i < NE; i++) {
            inside &= i < want_m || eh[i] == 0;
            covered &= i >= want_m || eh[i] > 50;
        }
        CHECKF(inside && covered, "equal-logit nucleus (top_k %d)", k);
        sampler_free(&s);
    }
}

static void test_min_p(void)
{
    /* probs relative to max: 1, 0.5, 0.25, 0.125 -> min_p 0.3 keeps {0, 1} */
    const float l[4] = {0.0f, logf(0.5f), logf(0.25f), logf(0.125f)};
    double want[4] = {2.0 / 3.0, 1.0 / 3.0, 0.0, 0.0};
    sampler_params p = params_t(1.0f, 21);
    p.min_p = 0.3f;
    check_freqs("min_p=0.3", &p, l, 4, want);
    p.top_k = 3;
    check_freqs("min_p=0.3 top_k=3", &p, l, 4, want);
    /* min_p = 1 keeps only the max (and always keeps it) */
    p = params_t(1.0f, 22);
    p.min_p = 1.0f;
    want[0] = 1.0;
    want[1] = 0.0;
    check_freqs("min_p=1", &p, l, 4, want);
}

static void test_penalties(void)
{
    sampler s;
    sampler_params p = params_t(0.0f, 0);
    p.repetition_penalty = 1.5f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.penalty_last_n = 5;
    CHECK(sampler_init(&s, &p, 6, NULL) == KV_OK);
    float l[6] = {3.0f, -2.0f, 1.2f, 0.9f, 4.0f, -0.3f};
    /* history: 9 and -1 out of range (ignored); token 4 is outside the last 5 */
    const int32_t hist[] = {4, 4, 0, 1, 1, 1, 9, -1};
    sampler_sample(&s, l, hist, 8);
    /* window = last 5 of 8 = {1, 1, 1, 9, -1} */
    /* token 1: count 3: -2 * 1.5 = -3; -3 - 3*0.25 - 0.5 = -4.25 */
    CHECK(l[1] == -4.25f);
    CHECK(l[0] == 3.0f && l[4] == 4.0f && l[2] == 1.2f);
    for (int i = 0; i < 6; i++) /* counts scratch is clean again */
        CHECK(s.w.counts[i] == 0);
    sampler_free(&s);

    p.penalty_last_n = -1; /* whole history */
    CHECK(sampler_init(&s, &p, 6, NULL) == KV_OK);
    float m[6] = {3.0f, -2.0f, 1.2f, 0.9f, 4.0f, -0.3f};
    int32_t id = sampler_sample(&s, m, hist, 8);
    /* token 4: count 2: 4 / 1.5 = 2.6667; - 2*0.25 - 0.5 = 1.6667 */
    CHECK(fabsf(m[4] - (4.0f / 1.5f - 1.0f)) < 1e-6f);
    /* token 0: count 1: 3 / 1.5 = 2; - 0.25 - 0.5 = 1.25 */
    CHECK(m[0] == 1.25f);
    CHECK(m[1] == -4.25f);
    CHECK(m[2] == 1.2f && m[3] == 0.9f && m[5] == -0.3f);
    CHECK(id == 4); /* 1.6667 is still the largest */
    sampler_free(&s);

    /* penalty_last_n = 0 disables; default params leave logits untouched */
    p.penalty_last_n = 0;
    CHECK(sampler_init(&s, &p, 6, NULL) == KV_OK);
    float q[6] = {3.0f, -2.0f, 1.2f, 0.9f, 4.0f, -0.3f};
    sampler_sample(&s, q, hist, 8);
    CHECK(q[0] == 3.0f && q[1] == -2.0f && q[4] == 4.0f);
    sampler_free(&s);

    /* penalties steer greedy decoding away from a repeated token */
    p = params_t(0.0f, 0);
    p.repetition_penalty = 2.0f;
    CHECK(sampler_init(&s, &p, 3, NULL) == KV_OK);
    float g[3] = {1.0f, 1.5f, 0.9f};
    const int32_t h1[] = {1};
    CHECK(sampler_sample(&s, g, h1, 1) == 0); /* 1.5 / 2 = 0.75 < 1.0 */
    sampler_free(&s);
}

static void test_logprob(void)
{
    enum { NV = 2000 };
    static float l[NV], c[NV];
    tu_rng r = {5};
    for (int i = 0; i < NV; i++)
        l[i] = tu_rand_normal(&r) * 4.0f + 30.0f; /* large offset: needs the max shift */
    double mx = -INFINITY, sum = 0.0;
    for (int i = 0; i < NV; i++)
        mx = fmax(mx, l[i]);
    for (int i = 0; i < NV; i++)
        sum += exp((double)l[i] - mx);
    double maxerr = 0.0;
    for (int id = 0; id < NV; id += 37) {
        double want = (double)l[id] - mx - log(sum);
        maxerr = fmax(maxerr, fabs(sampler_logprob(l, NV, id) - want));
    }
    CHECKF(maxerr < 1e-5, "logprob max abs error %.3g", maxerr);

    /* sampler_sample_lp reports the logprob under the raw logits, even when
     * the chosen token was penalised */
    sampler s;
    sampler_params p = params_t(0.7f, 9);
    p.top_k = 20;
    p.repetition_penalty = 1.3f;
    p.frequency_penalty = 0.4f;
    const int32_t hist[] = {3, 3, 17, 5};
    CHECK(sampler_init(&s, &p, NV, NULL) == KV_OK);
    for (int rep = 0; rep < 50; rep++) {
        memcpy(c, l, sizeof c);
        c[3] = c[17] = 60.0f; /* penalised yet still the likely picks */
        float raw3 = c[3];
        double want_lse = log(exp(60.0 - mx) * 2 + sum - exp(l[3] - mx) - exp(l[17] - mx)) + mx;
        float lp = 0.0f;
        int32_t id = sampler_sample_lp(&s, c, hist, 4, &lp);
        double want = (id == 3 || id == 17 ? raw3 : l[id]) - want_lse;
        CHECKF(fabs(lp - want) < 1e-4, "id %d lp %g want %g", id, lp, want);
    }
    sampler_free(&s);
}

static void test_params_check(void)
{
    struct {
        const char *field;
        sampler_params p;
    } bad[16];
    int nb = 0;
    sampler_params d = sampler_params_default();
#define BAD(f, v) do { bad[nb].field = #f; bad[nb].p = d; bad[nb].p.f = (v); nb++; } while (0)
    BAD(temperature, -0.1f);
    BAD(temperature, NAN);
    BAD(temperature, INFINITY);
    BAD(top_p, 0.0f);
    BAD(top_p, 1.01f);
    BAD(top_p, NAN);
    BAD(min_p, -0.01f);
    BAD(min_p, 1.5f);
    BAD(repetition_penalty, 0.0f);
    BAD(repetition_penalty, -1.0f);
    BAD(repetition_penalty, INFINITY);
    BAD(presence_penalty, 2.5f);
    BAD(presence_penalty, NAN);
    BAD(frequency_penalty, -2.01f);
    BAD(penalty_last_n, -2);
#undef BAD
    for (int i = 0; i < nb; i++) {
        kvant_err e = {0};
        CHECKF(sampler_params_check(&bad[i].p, &e) == KV_EINVAL && e.code == KV_EINVAL,
               "case %d (%s) accepted", i, bad[i].field);
        CHECKF(strstr(e.msg, bad[i].field) != NULL, "message '%s' does not name %s", e.msg,
               bad[i].field);
        sampler s;
        CHECK(sampler_init(&s, &bad[i].p, 10, NULL) == KV_EINVAL);
        sampler_free(&s);
    }
    sampler_params ok = d;
    ok.temperature = 1.0f;
    ok.top_p = 1.0f;
    ok.min_p = 1.0f;
    ok.presence_penalty = -2.0f;
    ok.frequency_penalty = 2.0f;
    ok.top_k = -5;
    ok.penalty_last_n = -1;
    CHECK(sampler_params_check(&ok, NULL) == KV_OK);
    kvant_err e = {0};
    sampler s;
    CHECK(sampler_init(&s, &ok, 0, &e) == KV_EINVAL && strstr(e.msg, "n_vocab"));
    CHECK(sampler_params_check(NULL, NULL) == KV_EINVAL);
}

static void test_edge_cases(void)
{
    /* n_vocab = 1 through every path */
    sampler_params ps[4];
    for (int i = 0; i < 4; i++)
        ps[i] = params_t(1.0f, (uint64_t)i);
    ps[0].temperature = 0.0f;
    ps[1].top_k = 1;
    ps[2].top_p = 0.5f;
    ps[3].min_p = 0.5f;
    ps[3].repetition_penalty = 1.2f;
    for (int i = 0; i < 4; i++) {
        sampler s;
        CHECK(sampler_init(&s, &ps[i], 1, NULL) == KV_OK);
        float l = -3.0f;
        int32_t h = 0;
        float lp = 1.0f;
        CHECK(sampler_sample_lp(&s, &l, &h, 1, &lp) == 0);
        CHECK(lp == 0.0f);
        sampler_free(&s);
    }

    /* -inf / NaN / +inf logits never break sampling */
    sampler s;
    sampler_params p = params_t(1.0f, 3);
    CHECK(sampler_init(&s, &p, 4, NULL) == KV_OK);
    for (int i = 0; i < 200; i++) {
        float a[4] = {-INFINITY, NAN, 0.5f, -INFINITY};
        int32_t t = sampler_sample(&s, a, NULL, 0);
        CHECK(t == 2);
        float b[4] = {NAN, NAN, -INFINITY, -INFINITY};
        CHECK(sampler_sample(&s, b, NULL, 0) == 0);
        float c[4] = {1.0f, INFINITY, 3.0f, INFINITY};
        t = sampler_sample(&s, c, NULL, 0);
        CHECK(t == 1 || t == 3);
    }
    sampler_free(&s);
    p.top_k = 2;
    CHECK(sampler_init(&s, &p, 4, NULL) == KV_OK);
    for (int i = 0; i < 200; i++) {
        float a[4] = {NAN, -INFINITY, -INFINITY, 0.5f};
        CHECK(sampler_sample(&s, a, NULL, 0) == 3);
    }
    sampler_free(&s);
}

/* Prints the cost of one step on a 151,936-token vocabulary (not asserted).
 * "peaked": 20 tokens 12 logits above the rest, like a confident LM;
 * "flat": plain normal logits, a nucleus of thousands of tokens. */
static void bench_large_vocab(void)
{
    enum { NV = 151936, REPS = 20 };
    float *flat = malloc(NV * sizeof *flat), *peaked = malloc(NV * sizeof *peaked);
    float *l = malloc(NV * sizeof *l);
    tu_rng r = {1};
    for (int i = 0; i < NV; i++)
        peaked[i] = flat[i] = tu_rand_normal(&r) * 2.0f;
    for (int i = 0; i < 20; i++)
        peaked[(i * 7919) % NV] += 12.0f + (float)i * 0.1f;
    struct { const char *name; float t; int k; float top_p; const float *base; } cfg[] = {
        {"greedy", 0.0f, 0, 1.0f, peaked},
        {"top_k=40 top_p=0.95", 0.8f, 40, 0.95f, peaked},
        {"top_p=0.95 peaked", 0.8f, 0, 0.95f, peaked},
        {"top_p=0.95 flat", 0.8f, 0, 0.95f, flat},
        {"temperature only", 0.8f, 0, 1.0f, peaked},
    };
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        sampler s;
        sampler_params p = params_t(cfg[c].t, 1);
        p.top_k = cfg[c].k;
        p.top_p = cfg[c].top_p;
        CHECK(sampler_init(&s, &p, NV, NULL) == KV_OK);
        double best = 1e30;
        for (int i = 0; i < REPS; i++) {
            memcpy(l, cfg[c].base, NV * sizeof *l);
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            CHECK(sampler_sample(&s, l, NULL, 0) >= 0);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            best = fmin(best, (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec));
        }
        fprintf(stderr, "sampler n_vocab=%d %-22s %8.1f us/token (best of %d)\n", NV,
                cfg[c].name, best / 1e3, REPS);
        sampler_free(&s);
    }
    free(flat);
    free(peaked);
    free(l);
}

/* Samplers that take turns on one sampler_scratch (the engine's sequences)
 * pick the same tokens and logprobs, bit for bit, as samplers that own
 * their scratch: every stage (penalties with history, top-k, top-p with
 * and without top-k, min-p, greedy) interleaved. */
static void test_shared_scratch(void)
{
    enum { NV = 3000, NS = 5, STEPS = 60 };
    sampler_scratch w;
    CHECK(sampler_scratch_init(&w, NV, NULL) == KV_OK);
    sampler own[NS], shared[NS];
    for (int k = 0; k < NS; k++) {
        sampler_params p = params_t(k == 0 ? 0.0f : 0.7f + 0.1f * (float)k, 100 + (uint64_t)k);
        p.top_k = k == 1 || k == 3 ? 40 : 0;
        p.top_p = k >= 2 ? 0.85f : 1.0f;
        p.min_p = k == 4 ? 0.02f : 0.0f;
        p.repetition_penalty = 1.2f;
        p.presence_penalty = 0.3f;
        p.frequency_penalty = 0.2f;
        p.penalty_last_n = k == 2 ? -1 : 16;
        CHECK(sampler_init(&own[k], &p, NV, NULL) == KV_OK);
        CHECK(sampler_init_shared(&shared[k], &p, &w, NULL) == KV_OK);
    }
    float *base = malloc(NV * sizeof *base), *a = malloc(NV * sizeof *a),
          *b = malloc(NV * sizeof *b);
    int32_t hist[NS][STEPS];
    tu_rng r = {7};
    int same = 1;
    for (int t = 0; t < STEPS; t++) {
        for (int k = 0; k < NS; k++) {
            for (int i = 0; i < NV; i++)
                base[i] = 3.0f * tu_rand_normal(&r);
            memcpy(a, base, NV * sizeof *a);
            memcpy(b, base, NV * sizeof *b);
            float la, lb;
            int32_t ta = sampler_sample_lp(&own[k], a, hist[k], t, &la);
            int32_t tb = sampler_sample_lp(&shared[k], b, hist[k], t, &lb);
            same &= ta == tb && memcmp(&la, &lb, sizeof la) == 0 &&
                    memcmp(a, b, NV * sizeof *a) == 0;
            hist[k][t] = ta;
        }
    }
    CHECKF(same, "samplers sharing a scratch differ from samplers owning theirs");
    for (int k = 0; k < NS; k++) {
        sampler_free(&own[k]);
        sampler_free(&shared[k]);
    }
    /* sampler_free left the shared scratch alone: still usable */
    CHECK(w.probs && w.counts);
    for (int i = 0; i < NV; i++)
        CHECK(w.counts[i] == 0);
    sampler_scratch empty;
    memset(&empty, 0, sizeof empty);
    sampler s;
    sampler_params p = params_t(1.0f, 1);
    CHECK(sampler_init_shared(&s, &p, &empty, NULL) == KV_EINVAL);
    CHECK(sampler_scratch_init(&empty, 0, NULL) == KV_EINVAL);
    sampler_scratch_free(&empty);
    sampler_scratch_free(&w);
    sampler_scratch_free(&w); /* idempotent */
    free(base);
    free(a);
    free(b);
}

/* logit_bias: -100 bans (also the argmax), a positive bias wins, ids out of
 * range are ignored, logprobs stay those of the raw logits, and the scratch
 * marks are cleared (a later call without bias is unaffected). */
static void test_logit_bias(void)
{
    float l[8] = {1.0f, 5.0f, 2.0f, 4.5f, 0.0f, -1.0f, 3.0f, 0.5f};
    sampler_params p = params_t(0.0f, 1);
    p.n_logit_bias = 3;
    p.logit_bias[0] = (sampler_bias){1, -100.0f};
    p.logit_bias[1] = (sampler_bias){99, 50.0f};  /* out of range: ignored */
    p.logit_bias[2] = (sampler_bias){7, 2.0f};
    sampler s;
    CHECK(sampler_init(&s, &p, 8, NULL) == KV_OK);
    float c[8], lp = 0.0f;
    memcpy(c, l, sizeof c);
    CHECK(sampler_sample(&s, c, NULL, 0) == 3); /* 1 banned: next best is 3 */
    memcpy(c, l, sizeof c);
    CHECK(sampler_sample_lp(&s, c, NULL, 0, &lp) == 3);
    CHECKF(fabsf(lp - sampler_logprob(l, 8, 3)) < 1e-5f, "lp %g", (double)lp);
    sampler_free(&s);
    p.logit_bias[2] = (sampler_bias){7, 4.9f}; /* 0.5 + 4.9 > 4.5: 7 wins */
    CHECK(sampler_init(&s, &p, 8, NULL) == KV_OK);
    memcpy(c, l, sizeof c);
    CHECK(sampler_sample_lp(&s, c, NULL, 0, &lp) == 7);
    CHECKF(fabsf(lp - sampler_logprob(l, 8, 7)) < 1e-5f, "raw lp of a biased token %g",
           (double)lp);
    for (int i = 0; i < 8; i++)
        CHECKF(s.w.counts[i] == 0, "counts[%d] = %d left marked", i, (int)s.w.counts[i]);
    sampler_free(&s);
    /* sampling at temperature 1 never draws a banned token */
    p = params_t(1.0f, 5);
    p.n_logit_bias = 1;
    p.logit_bias[0] = (sampler_bias){1, -100.0f};
    CHECK(sampler_init(&s, &p, 8, NULL) == KV_OK);
    long hist[8];
    draw_hist(&s, l, 8, 2000, hist);
    CHECKF(hist[1] == 0, "banned token drawn %ld times", hist[1]);
    sampler_free(&s);
    /* validation */
    sampler_params bad = sampler_params_default();
    bad.n_logit_bias = 1;
    bad.logit_bias[0] = (sampler_bias){0, 100.5f};
    kvant_err e = {0};
    CHECK(sampler_params_check(&bad, &e) == KV_EINVAL && strstr(e.msg, "logit_bias"));
    bad.logit_bias[0].bias = NAN;
    CHECK(sampler_params_check(&bad, NULL) == KV_EINVAL);
    bad.n_logit_bias = SAMPLER_MAX_LOGIT_BIAS + 1;
    CHECK(sampler_params_check(&bad, NULL) == KV_EINVAL);
}

/* sampler_top_k_ids against repeated selection of the best id not taken
 * (lowest id among equals; the engine's earlier loop, the specification):
 * random rows with many ties and some NaN and -inf; sampler_logsumexp gives
 * sampler_logprob bit for bit. */
static void test_top_k_ids(void)
{
    uint64_t st = 12345;
    float row[300];
    for (int trial = 0; trial < 200; trial++) {
        int32_t n = 1 + trial % 300;
        for (int32_t v = 0; v < n; v++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            int r = (int)(st >> 33) % 40;
            row[v] = r == 0 ? NAN : r == 1 ? -INFINITY : (float)(r % 13) * 0.5f - 2.0f;
        }
        int32_t k = trial % 21 < n ? trial % 21 : n;
        int32_t got[20], want[20];
        int n_real = 0;
        for (int32_t v = 0; v < n; v++)
            n_real += row[v] == row[v];
        for (int32_t j = 0; j < k && j < n_real; j++) { /* the best not taken, lowest id */
            int32_t best = -1;
            for (int32_t v = 0; v < n; v++) {
                int taken = row[v] != row[v];
                for (int32_t q = 0; q < j; q++)
                    taken |= want[q] == v;
                if (!taken && (best < 0 || row[v] > row[best]))
                    best = v;
            }
            want[j] = best;
        }
        sampler_top_k_ids(row, n, k, got);
        int ok = 1;
        for (int32_t j = 0; j < k && j < n_real; j++)
            ok &= got[j] == want[j];
        CHECKF(ok, "top_k_ids trial %d (n %d, k %d) differs from repeated argmax", trial, n, k);
        double lse = sampler_logsumexp(row, n);
        for (int32_t j = 0; j < k && j < n_real; j++)
            CHECK((float)((double)row[got[j]] - lse) == sampler_logprob(row, n, got[j]));
    }
}

int main(void)
{
    test_top_k_ids();
    test_greedy_and_ties();
    test_seeding();
    test_topk1_is_greedy();
    test_distribution();
    test_draft_distribution();
    test_top_p();
    test_min_p();
    test_penalties();
    test_logprob();
    test_params_check();
    test_edge_cases();
    test_shared_scratch();
    test_logit_bias();
    bench_large_vocab();
    return tu_finish("test_sampler");
}
