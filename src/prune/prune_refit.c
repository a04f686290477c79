/* prune_refit.c - the least-squares refit of prune_refit.h.
 *
 * The system of size k + 1 (kept columns and the constant) is factored
 * once (Cholesky, doubles); the ne1 right-hand sides are solved together
 * as rows [k + 1][ne1] so the substitutions are contiguous axpys.  The
 * right-hand sides G_K: W^T go through the f32 matmul kernel.
 */
#include "prune/prune_refit.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype.h"
#include "kernels/matmul.h"

/* In place: the lower triangle of a [n][n] becomes L with L L^T = a.
 * Returns -1 when a is not positive definite. */
static int cholesky(double *a, int64_t n)
{
    for (int64_t j = 0; j < n; j++) {
        double *rj = a + j * n;
        double s = rj[j];
        for (int64_t p = 0; p < j; p++)
            s -= rj[p] * rj[p];
        if (!(s > 0))
            return -1;
        double ljj = sqrt(s);
        rj[j] = ljj;
        for (int64_t i = j + 1; i < n; i++) {
            double *ri = a + i * n;
            double t = ri[j];
            for (int64_t p = 0; p < j; p++)
                t -= ri[p] * rj[p];
            ri[j] = t / ljj;
        }
    }
    return 0;
}

/* Solves L L^T X = Y for Y [n][m] in place. */
static void chol_solve(const double *l, int64_t n, double *restrict y, int64_t m)
{
    for (int64_t i = 0; i < n; i++) {
        double *restrict yi = y + i * m;
        for (int64_t j = 0; j < i; j++) {
            const double lij = l[i * n + j], *restrict yj = y + j * m;
            for (int64_t c = 0; c < m; c++)
                yi[c] -= lij * yj[c];
        }
        for (int64_t c = 0; c < m; c++)
            yi[c] /= l[i * n + i];
    }
    for (int64_t i = n - 1; i >= 0; i--) {
        double *restrict yi = y + i * m;
        for (int64_t j = i + 1; j < n; j++) {
            const double lji = l[j * n + i], *restrict yj = y + j * m;
            for (int64_t c = 0; c < m; c++)
                yi[c] -= lji * yj[c];
        }
        for (int64_t c = 0; c < m; c++)
            yi[c] /= l[i * n + i];
    }
}

/* a [(k+1)^2]: the damped system matrix with the covariance shrunk by s. */
static void build_system(const double *gram, double inv_rows, int64_t ne0, const float *mean,
                         const int32_t *keep, int64_t k, double d, double s, double *a)
{
    int64_t n = k + 1;
    for (int64_t i = 0; i < k; i++) {
        const double *gi = gram + (int64_t)keep[i] * ne0;
        double mi = mean[keep[i]];
        for (int64_t j = 0; j < k; j++)
            a[i * n + j] = (1 - s) * gi[keep[j]] * inv_rows + s * mi * mean[keep[j]];
        a[i * n + i] = gi[keep[i]] * inv_rows + d;
        a[i * n + k] = a[k * n + i] = mean[keep[i]];
    }
    a[k * n + k] = 1.0;
}

int prune_refit(const float *w, int64_t ne1, int64_t ne0, const double *gram, int64_t rows,
                const float *mean, const int32_t *keep, int64_t k, double damp, double shrink,
                float *w_out, float *b_out, kvant_err *err)
{
    int64_t n = k + 1;
    double inv = rows > 0 ? 1.0 / (double)rows : 0.0, diag = 0;
    for (int64_t i = 0; i < k; i++)
        diag += gram[(int64_t)keep[i] * ne0 + keep[i]] * inv / (double)k;
    double *a = malloc((size_t)(n * n) * sizeof *a), *y = malloc((size_t)(n * ne1) * sizeof *y);
    float *gk = malloc((size_t)(k * ne0) * sizeof *gk), *rhs = malloc((size_t)(ne1 * k) * sizeof *rhs);
    int rc = KV_OK;
    if (!a || !y || !gk || !rhs) {
        rc = kvant_err_set(err, KV_ENOMEM, "out of memory for the least-squares refit");
        goto done;
    }
    /* rhs[r][i] = sum_j w[r][j] G[keep_i][j] */
    for (int64_t i = 0; i < k; i++)
        for (int64_t j = 0; j < ne0; j++)
            gk[i * ne0 + j] = (float)(gram[(int64_t)keep[i] * ne0 + j] * inv);
    dtype_matmul_rows(DT_F32, gk, (size_t)ne0 * sizeof(float), 0, k, ne0, w, ne1, rhs, k);
    double d = damp * (diag > 0 ? diag : 1.0);
    for (int attempt = 0;; attempt++) {
        build_system(gram, inv, ne0, mean, keep, k, d, shrink, a);
        if (!cholesky(a, n))
            break;
        if (attempt == 3) {
            rc = kvant_err_set(err, KV_EINVAL, "least-squares refit: calibration statistics "
                                               "are not positive definite");
            goto done;
        }
        d = d > 0 ? d * 10 : 1e-6 * (diag > 0 ? diag : 1.0);
    }
    for (int64_t r = 0; r < ne1; r++) {
        const float *wr = w + r * ne0;
        double mw = 0;
        for (int64_t j = 0; j < ne0; j++)
            mw += (double)mean[j] * wr[j];
        for (int64_t i = 0; i < k; i++) {
            int64_t c = keep[i];
            double var = gram[c * ne0 + c] * inv - (double)mean[c] * mean[c];
            y[i * ne1 + r] = (1 - shrink) * rhs[r * k + i] + shrink * mean[c] * mw +
                             (shrink * var + d) * wr[c];
        }
        y[k * ne1 + r] = mw;
    }
    chol_solve(a, n, y, ne1);
    for (int64_t r = 0; r < ne1; r++) {
        for (int64_t i = 0; i < k; i++)
            w_out[r * k + i] = (float)y[i * ne1 + r];
        b_out[r] = (float)y[k * ne1 + r];
    }
done:
    free(a);
    free(y);
    free(gk);
    free(rhs);
    return rc;
}
