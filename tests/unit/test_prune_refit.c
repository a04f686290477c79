/* test_prune_refit.c - the least-squares refit of pruned columns
 * (prune/prune_refit.h) on synthetic activations:
 *   - every column kept: the refit is W itself and a zero bias;
 *   - a removed column that is an exact affine function of kept ones: the
 *     refit reproduces W x exactly on the samples, where FLAP's mean bias
 *     (shrink = 1) leaves the column's fluctuation as error;
 *   - shrink = 1 is FLAP's compensation: kept columns unchanged, b = W_R mu_R;
 *   - a removed independent column: the refit's error is no larger than the
 *     mean bias's (least squares is optimal on the samples), and shrink 0.5
 *     lies between the two.
 * quant_calib's Gram accumulator is checked in test_prune (forward passes). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "prune/prune_refit.h"
#include "testutil.h"

enum { T = 400, NE0 = 24, NE1 = 8 };

static float g_x[T][NE0], g_w[NE1][NE0];
static double g_gram[NE0][NE0];
static float g_mean[NE0];

static void make_data(void)
{
    tu_rng r = {12345};
    for (int t = 0; t < T; t++) {
        for (int j = 0; j < NE0; j++)
            g_x[t][j] = tu_rand_normal(&r) * (0.5f + 0.1f * (float)j) + 0.3f * (float)(j % 5);
        g_x[t][5] = 0.5f * g_x[t][1] - 0.25f * g_x[t][2] + 1.0f; /* affine in kept columns */
    }
    for (int i = 0; i < NE1; i++)
        for (int j = 0; j < NE0; j++)
            g_w[i][j] = tu_rand_normal(&r);
    memset(g_gram, 0, sizeof g_gram);
    for (int j = 0; j < NE0; j++) {
        double s = 0;
        for (int t = 0; t < T; t++)
            s += g_x[t][j];
        g_mean[j] = (float)(s / T);
        for (int k = 0; k < NE0; k++)
            for (int t = 0; t < T; t++)
                g_gram[j][k] += (double)g_x[t][j] * g_x[t][k];
    }
}

/* Mean squared error of W' x_K + b against W x over the samples, relative
 * to the mean square of W x. */
static double rel_err(const int32_t *keep, int k, const float *wo, const float *b)
{
    double e = 0, n = 0;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < NE1; i++) {
            double y = 0, y2 = b[i];
            for (int j = 0; j < NE0; j++)
                y += (double)g_w[i][j] * g_x[t][j];
            for (int j = 0; j < k; j++)
                y2 += (double)wo[i * k + j] * g_x[t][keep[j]];
            e += (y - y2) * (y - y2);
            n += y * y;
        }
    return e / n;
}

static int fit(const int32_t *keep, int k, double damp, double shrink, float *wo, float *b)
{
    kvant_err err = {0};
    int rc = prune_refit(&g_w[0][0], NE1, NE0, &g_gram[0][0], T, g_mean, keep, k, damp, shrink,
                         wo, b, &err);
    CHECKF(rc == KV_OK, "refit: %s", err.msg);
    return rc;
}

static void test_all_kept(void)
{
    int32_t keep[NE0];
    float wo[NE1 * NE0], b[NE1];
    for (int j = 0; j < NE0; j++)
        keep[j] = j;
    if (fit(keep, NE0, 0.01, 0.0, wo, b))
        return;
    double dw = 0, db = 0;
    for (int i = 0; i < NE1; i++) {
        db = fmax(db, fabs(b[i]));
        for (int j = 0; j < NE0; j++)
            dw = fmax(dw, fabs(wo[i * NE0 + j] - g_w[i][j]));
    }
    CHECKF(dw < 1e-3 && db < 1e-3, "all kept: max |dW| %g, max |b| %g", dw, db);
}

static void test_affine_column(void)
{
    int32_t keep[NE0 - 1];
    float wo[NE1 * NE0], b[NE1], wf[NE1 * NE0], bf[NE1];
    for (int j = 0, k = 0; j < NE0; j++)
        if (j != 5)
            keep[k++] = j;
    if (fit(keep, NE0 - 1, 0.0, 0.0, wo, b) || fit(keep, NE0 - 1, 0.0, 1.0, wf, bf))
        return;
    double e = rel_err(keep, NE0 - 1, wo, b), ef = rel_err(keep, NE0 - 1, wf, bf);
    CHECKF(e < 1e-8, "affine column: refit error %g", e);
    CHECKF(ef > 1e-3, "affine column: mean-bias error %g", ef);
    /* shrink = 1: kept columns unchanged, b = W_R mu_R */
    double dw = 0, db = 0;
    for (int i = 0; i < NE1; i++) {
        for (int k = 0; k < NE0 - 1; k++)
            dw = fmax(dw, fabs(wf[i * (NE0 - 1) + k] - g_w[i][keep[k]]));
        db = fmax(db, fabs(bf[i] - g_w[i][5] * g_mean[5]));
    }
    CHECKF(dw < 1e-4 && db < 1e-4, "shrink 1: max |dW| %g, |db| %g", dw, db);
}

static void test_independent_columns(void)
{
    int32_t keep[NE0];
    float wo[NE1 * NE0], b[NE1], wf[NE1 * NE0], bf[NE1];
    int k = 0;
    for (int j = 0; j < NE0; j++)
        if (j != 9 && j != 17 && j != 20)
            keep[k++] = j;
    if (fit(keep, k, 0.0, 0.0, wo, b) || fit(keep, k, 0.0, 1.0, wf, bf))
        return;
    double e = rel_err(keep, k, wo, b), ef = rel_err(keep, k, wf, bf), eh;
    CHECKF(e <= ef && e > 0, "independent: refit %g vs mean bias %g", e, ef);
    float wh[NE1 * NE0], bh[NE1];
    if (fit(keep, k, 0.0, 0.5, wh, bh))
        return;
    eh = rel_err(keep, k, wh, bh);
    CHECKF(eh >= e && eh <= ef, "shrink 0.5: %g outside [%g, %g]", eh, e, ef);
}

int main(void)
{
    make_data();
    test_all_kept();
    test_affine_column();
    test_independent_columns();
    return tu_finish("test_prune_refit");
}
