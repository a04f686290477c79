/* xcache.h - experts placed by memory: a mixture of experts whose weights do
 * not fit keeps its dense weights and routers resident and its experts in a
 * cache of slots in manager memory, each slot one expert of one layer (its
 * gate, up and down rows), filled from the model file when a step routes a
 * token to an expert that is not there, the unpinned slot of the least used
 * expert so far giving way (the least recently used among equals).
 *
 * The experts' stacked tensors are marked streamed (never mapped, never
 * packed: the backend reads a slot's rows in the file's layout, which the
 * int8 kernels compute bitwise as the packed rows, kernels/matmul.h), so
 * the process's memory for weights is the resident tensors plus the slots.
 * An expert read that comes back short (the file changed) fails the call
 * with KV_EIO and marks the cache failed for good (xcache_stats.failed: the
 * server's health says so).  The dense weights stay mapped: a file cut short under them
 * faults as it does without the cache.
 *
 * Counters: hits, misses and bytes read in all and per (layer, expert), for
 * /metrics and /v1/memory.
 *
 * Ownership: xcache_create returns a heap handle freed by xcache_destroy
 * (which points the expert tensors back at the mapping); the model is
 * borrowed and must outlive it.  Threading: xcache_get / xcache_unpin on
 * the engine thread; xcache_get_stats and the counters from any thread
 * (relaxed reads of counters the engine thread writes).
 */
#ifndef KVANT_XCACHE_H
#define KVANT_XCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "mem/mem.h"
#include "model/model.h"
#include "util/err.h"

typedef struct xcache xcache;

/* Bytes of one slot of m: one expert's gate, up and down rows of its widest
 * expert layer (0 for a dense model); direct: each part with room for the
 * WSTREAM_DIO_ALIGN-aligned file region around it (O_DIRECT reads). */
uint64_t xcache_slot_bytes(const model *m, int direct);
/* Bytes of m's stacked expert tensors (what the cache keeps out of memory). */
uint64_t xcache_expert_bytes(const model *m);

/* The slots weights_memory holds beside m's other weights (which stay
 * resident): *n_slots, and *weights_bytes the resident bytes plus the slots
 * (direct: slots laid out for O_DIRECT, and one alignment's slack).
 * *n_slots 0 when every weight fits (no cache); KV_ENOMEM naming the
 * smallest budget when not even one token's experts fit. */
int xcache_plan(const model *m, uint64_t weights_memory, int direct, int32_t *n_slots,
                uint64_t *weights_bytes, kvant_err *err);
/* The weight-offload options that apply to the expert cache: --stream-io
 * buffered or direct (*direct), nothing asked of layer streaming
 * (weights_place, stream_buffers: 0 when not given).  KV_EUNSUP naming the
 * option otherwise. */
int xcache_options(int stream_io, int weights_place, int stream_buffers, int *direct,
                   kvant_err *err);
/* The start-up line for xcache_plan's result (no "kvant: " prefix). */
void xcache_plan_describe(const model *m, uint64_t weights_memory, int32_t n_slots,
                          uint64_t weights_bytes, char *buf, size_t cap);

/* A cache of n_slots slots (MEM_WEIGHTS) for m's experts; n_slots must be
 * at least the most experts one token uses.  direct: experts read with
 * O_DIRECT (--stream-io direct), past the page cache; where the file system
 * refuses it, through the page cache with xcache_stats.io_note saying so.
 * Marks the expert tensors streamed.  NULL + err (KV_EINVAL, KV_ENOMEM,
 * KV_EIO). */
xcache *xcache_create(model *m, mem_mgr *mem, int32_t n_slots, int direct, kvant_err *err);
void xcache_destroy(xcache *xc);

/* Expert e of layer il resident: views[0..3) its gate, up and down rows
 * (dev in the slot), pinned until xcache_unpin.  KV_EIO on a short read,
 * KV_ENOMEM when every slot is pinned. */
int xcache_get(xcache *xc, int32_t il, int32_t e, model_tensor views[3], kvant_err *err);
/* A parallel for the caller lends xcache_get_group: fn(arg, i) once for
 * every i in [0, n), on any threads, returning when all have run. */
typedef void (*xcache_each_fn)(void *arg, int32_t i);
typedef struct xcache_par {
    void (*run)(void *ctx, int32_t n, xcache_each_fn fn, void *arg);
    void *ctx;
} xcache_par;

/* Experts es[0..n) of layer il resident and pinned, as xcache_get of each
 * in turn (the same hits, misses, evictions and trace), but the misses read
 * side by side through par (NULL: one after another): the router has named
 * them all before any is used.  views[i] expert es[i]'s rows.  n at most
 * XCACHE_GROUP_MAX.  On a failed read the experts that did not arrive are
 * left out of the cache and the first failure is returned (KV_EIO). */
#define XCACHE_GROUP_MAX 64
int xcache_get_group(xcache *xc, int32_t il, const int32_t *es, int32_t n, model_tensor (*views)[3],
                     const xcache_par *par, kvant_err *err);
/* Unpins every slot (the experts of the previous job may go). */
void xcache_unpin(xcache *xc);
int32_t xcache_slots(const xcache *xc);
/* The start-up line on how experts are read, when O_DIRECT was asked for
 * ("" otherwise; no "kvant: " prefix). */
void xcache_io_describe(const xcache *xc, char *buf, size_t cap);

typedef struct xcache_stats {
    int32_t n_layers, n_expert; /* the model's layers and experts per layer */
    int32_t n_slots, n_used;   /* slots, and slots holding an expert */
    uint64_t slot_bytes;
    uint64_t hits, misses;     /* xcache_get calls that found / read their expert */
    uint64_t bytes_read;
    int direct;                /* experts read with O_DIRECT */
    char io_note[200];         /* why not, when asked for ("" otherwise) */
    int failed;                /* a read failed (the file was truncated or replaced) */
    char error[KV_ERR_MSG_MAX]; /* the first such read's message */
} xcache_stats;

void xcache_get_stats(const xcache *xc, xcache_stats *out);
/* Layer il's counters for expert e: hits and misses so far; 1 when resident now. */
void xcache_expert(const xcache *xc, int32_t il, int32_t e, uint64_t *hits, uint64_t *misses,
                   int *resident);

/* ---- trace and replay (kvant plan's prediction) ----
 * xcache_trace records, from now on, every xcache_get's expert (layer *
 * n_expert + expert) and every xcache_unpin (-1) in order into buf: cap
 * entries, those beyond counted by xcache_trace_len and dropped (NULL:
 * stops recording).  Engine thread.  xcache_replay runs trace[0..n) through
 * an n_slots cache of this policy (nothing read: the counts alone) and
 * counts the hits and misses of the entries from count_from on; resident
 * (NULL, or [n_ids]) gets 1 for the experts resident at the end.  The
 * routing of a run does not depend on the cache, so one run's trace
 * replays it at any slot count (a run that pinned more experts together
 * than n_slots replays as if unpinned between them). */
void xcache_trace(xcache *xc, int32_t *buf, int64_t cap);
int64_t xcache_trace_len(const xcache *xc);

typedef struct xcache_pred {
    uint64_t hits, misses;   /* over the counted entries */
    uint64_t shared_misses;  /* of the misses, those in a group (entries between unpins) with
                              * another: xcache_get_group reads them side by side */
    int32_t n_resident;      /* experts resident at the end */
} xcache_pred;

int xcache_replay(const int32_t *trace, int64_t n, int64_t count_from, int64_t n_ids,
                  int32_t n_slots, uint8_t *resident, xcache_pred *out, kvant_err *err);

#endif
