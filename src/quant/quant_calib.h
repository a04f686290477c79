/* quant_calib.h - calibration statistics for importance-weighted
 * quantization: the mean of x^2 (and of x) per input column of every weight matrix,
 * collected by intercepting the backend's matmul while calibration text
 * runs through the ordinary forward pass.
 *
 * Attach swaps the backend's ops table for a copy whose matmul first adds
 * the squares of each input row into the matrix's accumulator, then calls
 * the original; detach puts the original back.  Stats are keyed by GGUF
 * tensor name ("blk.3.ffn_down.weight"); a tied output's stats are
 * reported under "token_embd.weight" (embedding lookups are not matmuls).
 *
 * Ownership: quant_calib_create returns a heap handle freed by
 * quant_calib_destroy (detach first); m and be are borrowed.  Threading:
 * the thread driving the forward pass only; the inputs must be host
 * memory (CPU backend).
 */
#ifndef KVANT_QUANT_CALIB_H
#define KVANT_QUANT_CALIB_H

#include <stdint.h>

#include "backend/backend.h"
#include "model/model.h"
#include "util/err.h"

typedef struct quant_calib quant_calib;

quant_calib *quant_calib_create(model *m, kvant_err *err);
void quant_calib_destroy(quant_calib *c);

/* Starts/stops recording on be (must be the backend running m). */
void quant_calib_attach(quant_calib *c, backend *be);
void quant_calib_detach(quant_calib *c, backend *be);

/* Optional observer of the RMSNorm inputs while attached (structured
 * pruning reads the residual stream there: a layer's attn_norm input is
 * the layer's input, output_norm's input the last layer's output).  fn
 * sees the backend's (host) input rows d_x [n][w->ne[0]] before the norm
 * runs; ctx is borrowed.  NULL fn removes it. */
typedef void (*quant_calib_norm_fn)(void *ctx, const model_tensor *w, const float *d_x, int32_t n);
void quant_calib_set_norm_hook(quant_calib *c, quant_calib_norm_fn fn, void *ctx);

/* Mean x^2 per input column [ne0] for the tensor, or NULL when unknown,
 * never seen, or ne0 differs.  Borrowed from c. */
const float *quant_calib_imp(quant_calib *c, const char *name, int64_t ne0);
/* Mean x per input column [ne0] (as quant_calib_imp): structured pruning
 * replaces removed channels by this mean (bias compensation). */
const float *quant_calib_mean(quant_calib *c, const char *name, int64_t ne0);
/* Also accumulates the full second-moment matrix sum x x^T [ne0][ne0]
 * (doubles: ne0^2 * 8 bytes per matrix) for every matrix whose name ends
 * with suffix (e.g. "ffn_down.weight"); call before attaching.  Structured
 * pruning refits the kept columns by least squares from it. */
void quant_calib_track_gram(quant_calib *c, const char *suffix);
/* sum x x^T [ne0][ne0] (row-major, symmetric; divide by *rows for the
 * mean) for the tracked matrix, or NULL when untracked, never seen, ne0
 * differs, or its accumulator could not be allocated.  Borrowed from c. */
const double *quant_calib_gram(quant_calib *c, const char *name, int64_t ne0, int64_t *rows);

/* Input rows recorded for the busiest matrix (≈ calibration tokens). */
int64_t quant_calib_rows(const quant_calib *c);

#endif
