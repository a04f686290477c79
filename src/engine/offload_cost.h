/* offload_cost.h - the cost model of weight offload (model/wstream.h):
 * measured rates and predicted forward-pass times per placement.
 *
 * Rates: read_bps is pread(2) from the model file once its pages are in
 * the page cache (the host tier: a first pass warms, the median of four
 * more counts);
 * compute_bps[k] is weight bytes per second the backend's matmul processes
 * with batch[k] tokens, timed on copies of layer 0's widest matrix (the FFN
 * gate) as stored, unpacked - the form a streamed layer takes - that
 * together exceed the caches, on the threads the server will use; each
 * rate is the median of OCOST_SAMPLES timings taken alternately alone and
 * side by side.  Both
 * are measured again side by side (a reader thread preads while the
 * matmuls run): on a machine whose cores or memory bandwidth are shared,
 * reading and computing slow each other down, and the prediction uses the
 * side-by-side rates while both run.  A layer's compute time at n tokens is
 * its bytes / compute_bps(n) plus other_s(n): the layer's other work (two
 * RMS norms, SwiGLU, two residual adds, each a backend job), timed on the
 * same backend at the model's widths.  Attention, RoPE and the KV store are
 * not counted, so the prediction is a lower bound on time that is close
 * while the context is short.
 *
 * Read modes (wstream_io): buffered reads copy out of the page cache on a
 * CPU (read_bps alone, read_conc_bps beside the matmuls, which slow down
 * to compute_conc_bps); direct reads are the device's DMA (direct_bps,
 * measured with O_DIRECT by two threads, as the stream's reader and the
 * forward pass read; taken as the same beside the matmuls, which then
 * keep their alone rate: no core is copying); both: the two readers side
 * by side (rates added, the matmuls at compute_conc_bps).
 *
 * Prediction: the ring is simulated as two fluid tasks - the reader reads
 * streamed layers in order into n_slots buffers, a buffer is refilled only
 * when the layer it held has computed, a layer computes when the previous
 * one has and (streamed) its buffer is read; each progresses at its alone
 * rate, or at its side-by-side rate while the other runs - over three
 * forward passes; the third pass's duration is the steady-state time.
 *
 * Cache: rates are measured once per (model file path, size, mtime,
 * threads, ISA; format version) and kept one line per key in $KVANT_CACHE_DIR/offload-rates,
 * or $XDG_CACHE_HOME/kvant/offload-rates, or ~/.cache/kvant/offload-rates.
 * A cache that cannot be read or written is ignored (measured again).
 *
 * Threading: any thread; ocost_measure creates its own backend.
 */
#ifndef KVANT_OFFLOAD_COST_H
#define KVANT_OFFLOAD_COST_H

#include <stdint.h>

#include "model/model.h"
#include "model/wstream.h"
#include "util/err.h"

#define OCOST_N_BUCKETS 5 /* batch sizes 1, 8, 32, 128, 512 tokens per forward pass */

typedef struct ocost_rates {
    double read_bps;                          /* reading alone (page cache) */
    double direct_bps;                        /* O_DIRECT reads alone, two threads (0: refused) */
    int32_t batch[OCOST_N_BUCKETS];
    double compute_bps[OCOST_N_BUCKETS];      /* computing alone */
    double compute_conc_bps[OCOST_N_BUCKETS]; /* computing while a reader reads */
    double read_conc_bps[OCOST_N_BUCKETS];    /* reading while that computes */
    double other_s[OCOST_N_BUCKETS];          /* a layer's non-matmul work, seconds */
    int from_cache;        /* 1: read from the cache file, not measured now */
    char cache_path[512];  /* where the rates are cached ("" when no place) */
} ocost_rates;

enum {
    OCOST_CACHED = 0,      /* from the cache, else measured and stored */
    OCOST_REMEASURE = 1,   /* measured and stored */
    OCOST_CACHE_ONLY = 2,  /* from the cache, else KV_EBUSY (nothing measured) */
};
/* Rates for m on the CPU backend with n_threads (0: all cores).  Measuring
 * takes from a second (small models) to about ten (a 1B F16 model on two
 * cores) and allocates about 150 MiB outside any budget. */
int ocost_rates_get(model *m, int n_threads, int mode, ocost_rates *out, kvant_err *err);

typedef struct ocost_pred {
    int32_t n_tokens;   /* tokens per forward pass */
    double pass_s;      /* steady-state seconds per forward pass */
    double tok_s;       /* n_tokens / pass_s */
    double read_s;      /* reader busy seconds per pass */
    double stall_s;     /* seconds per pass the compute waits for a buffer */
} ocost_pred;

/* Time per forward pass of n_tokens tokens (n_out logit rows) under p,
 * its streamed layers read in io_mode (WSTREAM_IO_*). */
void ocost_predict(const wstream_plan *p, const model *m, const ocost_rates *r, int io_mode,
                   int32_t n_tokens, int32_t n_out, ocost_pred *out);

/* Which layers stream (wstream.h WSTREAM_ORDER_*) when the weights need
 * offload within cap.  place: 0 auto, 1 + WSTREAM_ORDER_* as asked
 * (--weights-place).  Auto with rates (measured or cached): the order
 * with the shorter predicted decode pass (one token), the default order
 * unless another is over 1% faster; without rates: the default order.
 * ch gets the choice and, when predicted, each order's decode tok/s. */
#define OCOST_DEFAULT_ORDER WSTREAM_ORDER_SPREAD
typedef struct ocost_choice {
    int order;                         /* WSTREAM_ORDER_* placed */
    int by_cost;                       /* 1: chosen by predicted decode time */
    double tok_s[WSTREAM_ORDER_COUNT]; /* predicted decode tok/s per order (by_cost) */
} ocost_choice;
int ocost_place(const model *m, uint64_t cap, int n_slots, int place, const ocost_rates *r,
                int io_mode, wstream_plan *p, ocost_choice *ch, kvant_err *err);
/* --weights-place: "auto" -> 0, "tail"/"spread" -> 1 + WSTREAM_ORDER_*, else -1. */
int ocost_place_parse(const char *s);
const char *ocost_place_name(int place);

/* ocost_place with the rates cached for (m, n_threads), if any (never measures:
 * measuring allocates outside the budget). */
int ocost_place_cached(model *m, int n_threads, uint64_t cap, int n_slots, int place,
                       int io_mode, wstream_plan *p, ocost_choice *ch, kvant_err *err);
/* One start-up line on stderr: the order placed and why (nothing when all or
 * no layers stream). */
void ocost_choice_print(const ocost_choice *ch, int place, const wstream_plan *p);

#endif
