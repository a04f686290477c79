/* prune_refit.h - least-squares refit of a matrix whose input columns were
 * pruned (structured pruning's error compensation without retraining).
 *
 * For y = W x with only the columns K of x kept, chooses W'_K and a bias b
 * minimizing E || W x - (W'_K x_K + b) ||^2 over the calibration
 * activations: the normal equations with the second-moment matrix
 * G = E[x x^T] and the mean mu = E[x] (the constant input 1 gives the
 * bias),
 *     [G_KK + d I   mu_K] [w'_r]   [G_K: w_r + d w_rK]
 *     [mu_K^T        1  ] [b_r ] = [mu . w_r          ]    for every row r,
 solved by Cholesky.  d = damp * mean(diag G_KK) (ridge towards the
 * original weights, which keeps the solution stable where calibration does
 * not determine it).  G's covariance part C = G - mu mu^T is first shrunk
 * towards its diagonal, C' = (1 - shrink) C + shrink diag(C), trusting the
 * correlations measured on a short calibration text less (it overfits:
 * 1,000+ unknowns per row from a few thousand tokens).  With every column
 * kept the solution is W itself and b = 0; with shrink = 1 (no
 * correlations) it is FLAP's bias compensation (kept columns unchanged,
 * b = W_R mu_R).
 *
 * Ownership: all arrays borrowed; outputs caller-owned.  Stateless,
 * thread-safe.
 */
#ifndef KVANT_PRUNE_REFIT_H
#define KVANT_PRUNE_REFIT_H

#include <stdint.h>

#include "util/err.h"

/* w [ne1][ne0]; gram [ne0][ne0] sum of x x^T over rows samples; mean
 * [ne0] E[x]; keep [k] kept columns (ascending, distinct, in [0, ne0));
 * w_out [ne1][k]; b_out [ne1].  damp >= 0, shrink in [0, 1].  KV_ENOMEM, or KV_EINVAL when
 * the system is not positive definite even with 1000x the damping. */
int prune_refit(const float *w, int64_t ne1, int64_t ne0, const double *gram, int64_t rows,
                const float *mean, const int32_t *keep, int64_t k, double damp, double shrink,
                float *w_out, float *b_out, kvant_err *err);

#endif
