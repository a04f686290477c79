/* wstream.h - weight offload: each layer's weights are either resident in
 * device memory or streamed from the GGUF file through a staging ring.
 *
 * Placement (wstream_plan_make): the globals (token embedding, output
 * norm and head, rope factors) are always resident; layers are resident in
 * order while the resident bytes plus the staging ring stay within
 * --weights-memory; the rest are streamed.  A streamed layer is read with
 * pread(2) from the model file into one of n_slots buffers (the ring) by a
 * reader thread that runs ahead of the forward pass: while layer j
 * computes, layer j+1 (and more with more slots) is being read; a forward
 * pass that reaches a layer not yet read reads its remaining chunks too.  Resident
 * tensors are read the same way once, at create, into buffers from the
 * memory manager, so with offload the mapping is never touched for tensor
 * data: the process's resident memory is the budget, and the page cache is
 * the host tier.  A file that shrinks or changes under a streamed layer
 * gives a short read: the stream fails (for good), the forward pass gets
 * the error, and nothing faults (no SIGBUS).
 *
 * Streamed layers are consumed in a fixed cyclic order (every forward pass
 * runs every layer in order), so the reader knows what comes next.
 *
 * CPU backend only (the buffers are host memory from the manager).
 *
 * Ownership: wstream_create returns a heap handle freed by wstream_destroy
 * (joins the reader, frees the buffers, points tensors back at the
 * mapping).  Threading: acquire/release on the engine thread only;
 * wstream_get_stats and wstream_failed from any thread.
 */
#ifndef KVANT_WSTREAM_H
#define KVANT_WSTREAM_H

#include <stdint.h>

#include "mem/mem.h"
#include "model/model.h"
#include "util/err.h"

#define WSTREAM_MIN_SLOTS 2
#define WSTREAM_MAX_SLOTS 8
#define WSTREAM_ALIGN 64 /* each tensor's offset inside a layer buffer */

enum { WPLACE_RESIDENT = 0, WPLACE_STREAMED = 1 };

typedef struct wstream_plan {
    int32_t n_layers;
    uint8_t place[MODEL_MAX_LAYERS];        /* WPLACE_* per layer */
    uint64_t layer_bytes[MODEL_MAX_LAYERS]; /* a layer's tensors, each rounded to WSTREAM_ALIGN */
    uint64_t global_bytes;                  /* embedding, output norm/head, rope factors */
    uint64_t resident_bytes;                /* globals + resident layers */
    uint64_t streamed_bytes;                /* streamed layers: bytes read per forward pass */
    int32_t n_streamed;
    int32_t n_slots;
    uint64_t slot_bytes;                    /* the largest streamed layer */
    uint64_t ring_bytes;                    /* n_slots * slot_bytes */
    uint64_t min_bytes;                     /* smallest weights budget that works: globals +
                                             * n_slots * the largest layer */
} wstream_plan;

/* Layer sizes of m, everything resident (no stream). */
void wstream_plan_resident(const model *m, int n_slots, wstream_plan *p);
/* Places m's layers within weights_memory bytes (globals, resident layers
 * and the ring together).  KV_ENOMEM naming the smallest budget when even
 * all-streamed does not fit; when everything fits, every layer is resident
 * (n_streamed 0: no offload). */
int wstream_plan_make(const model *m, uint64_t weights_memory, int n_slots, wstream_plan *p,
                      kvant_err *err);
/* Recomputes the totals after a caller changed p->place (tests: alternating). */
void wstream_plan_update(wstream_plan *p);
/* Device bytes the plan needs for weights: resident_bytes + ring_bytes. */
uint64_t wstream_plan_device_bytes(const wstream_plan *p);

typedef struct wstream wstream;

/* Reads resident tensors into manager buffers (MEM_WEIGHTS per layer),
 * allocates the ring (MEM_WEIGHTS, no layer), marks streamed tensors
 * (model_tensor.streamed, dev NULL until acquired) and starts the reader.
 * Call before the backend's load_weights.  m->path must name the file m
 * was loaded from. */
wstream *wstream_create(model *m, mem_mgr *mem, const wstream_plan *p, kvant_err *err);
void wstream_destroy(wstream *ws);

/* Before layer il runs: for a streamed layer, waits until its buffer is
 * read and points its tensors' dev at it.  KV_EIO (the stream failed: short
 * read, I/O error) with the reason; no-op KV_OK for a resident layer. */
int wstream_acquire(wstream *ws, int32_t il, kvant_err *err);
/* After layer il ran (the backend synchronised): its buffer may be refilled. */
void wstream_release(wstream *ws, int32_t il);

typedef struct wstream_stats {
    uint64_t resident_bytes, streamed_bytes, ring_bytes; /* as planned */
    int32_t n_layers, n_streamed, n_slots;
    uint64_t bytes_read;     /* streamed so far */
    uint64_t layers_read;
    double read_s;           /* reader time inside pread */
    double wait_s;           /* forward pass time on layers not ready: waiting for the
                              * reader or reading their remaining chunks itself */
    int failed;              /* 1: the stream failed; reason in `error` */
    char error[256];
    const wstream_plan *plan; /* the placement; borrowed, immutable, valid while the stream is */
} wstream_stats;

void wstream_get_stats(wstream *ws, wstream_stats *out);
int wstream_failed(wstream *ws);
const wstream_plan *wstream_get_plan(const wstream *ws);

#endif
