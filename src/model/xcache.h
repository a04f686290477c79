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
 * with KV_EIO.  The dense weights stay mapped: a file cut short under them
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
 * expert layer (0 for a dense model). */
uint64_t xcache_slot_bytes(const model *m);
/* Bytes of m's stacked expert tensors (what the cache keeps out of memory). */
uint64_t xcache_expert_bytes(const model *m);

/* The slots weights_memory holds beside m's other weights (which stay
 * resident): *n_slots, and *weights_bytes the resident bytes plus the slots.
 * *n_slots 0 when every weight fits (no cache); KV_ENOMEM naming the
 * smallest budget when not even one token's experts fit. */
int xcache_plan(const model *m, uint64_t weights_memory, int32_t *n_slots,
                uint64_t *weights_bytes, kvant_err *err);
/* The start-up line for xcache_plan's result (no "kvant: " prefix). */
void xcache_plan_describe(const model *m, uint64_t weights_memory, int32_t n_slots,
                          uint64_t weights_bytes, char *buf, size_t cap);

/* A cache of n_slots slots (MEM_WEIGHTS) for m's experts; n_slots must be
 * at least the most experts one token uses.  Marks the expert tensors
 * streamed.  NULL + err (KV_EINVAL, KV_ENOMEM, KV_EIO). */
xcache *xcache_create(model *m, mem_mgr *mem, int32_t n_slots, kvant_err *err);
void xcache_destroy(xcache *xc);

/* Expert e of layer il resident: views[0..3) its gate, up and down rows
 * (dev in the slot), pinned until xcache_unpin.  KV_EIO on a short read,
 * KV_ENOMEM when every slot is pinned. */
int xcache_get(xcache *xc, int32_t il, int32_t e, model_tensor views[3], kvant_err *err);
/* Unpins every slot (the experts of the previous job may go). */
void xcache_unpin(xcache *xc);
int32_t xcache_slots(const xcache *xc);

typedef struct xcache_stats {
    int32_t n_layers, n_expert; /* the model's layers and experts per layer */
    int32_t n_slots, n_used;   /* slots, and slots holding an expert */
    uint64_t slot_bytes;
    uint64_t hits, misses;     /* xcache_get calls that found / read their expert */
    uint64_t bytes_read;
} xcache_stats;

void xcache_get_stats(const xcache *xc, xcache_stats *out);
/* Layer il's counters for expert e: hits and misses so far; 1 when resident now. */
void xcache_expert(const xcache *xc, int32_t il, int32_t e, uint64_t *hits, uint64_t *misses,
                   int *resident);

#endif
