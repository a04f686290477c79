/* wstream.h - weight offload: each layer's weights are either resident in
 * device memory or streamed from the GGUF file through a staging ring.
 *
 * Placement (wstream_plan_make_order): the globals (token embedding,
 * output norm and head, rope factors) are always resident; the fewest
 * layers stream that keep the resident bytes plus the staging ring within
 * --weights-memory, the last ones (tail) or spread over the depth.  A streamed layer is read from
 * the model file into one of n_slots buffers (the ring) by reader threads
 * that run ahead of the forward pass: while layer j computes, layer j+1
 * (and more with more slots) is being read; a forward pass that reaches a
 * layer not yet read reads its remaining chunks too.  Resident tensors are
 * read once, at create, into buffers from the memory manager, so with
 * offload the mapping is never touched for tensor data: the process's
 * resident memory is the budget.  A file that shrinks or changes under a
 * streamed layer gives a short read: the stream fails (for good), the
 * forward pass gets the error, and nothing faults (no SIGBUS).
 *
 * Reads (wstream_io.mode): through the page cache (pread(2): a CPU copy
 * out of the cache, the host tier), with O_DIRECT (the device writes into
 * the ring, no copy on the CPU and no page cache), or both at once (a
 * page-cache reader and a direct reader take chunks from the same queue).
 * A slot lays each tensor at an offset congruent to its file offset modulo
 * WSTREAM_DIO_ALIGN, in a region rounded out to that alignment, so that a
 * direct read of the aligned file range around a chunk lands in place;
 * the bytes around a tensor in its region are the file's neighbouring
 * bytes (unused).  Where O_DIRECT is refused (opening, or the first read)
 * the stream reads through the page cache instead and says why
 * (wstream_stats.io_note).
 *
 * Streamed layers are consumed in a fixed cyclic order (every forward pass
 * runs every layer in order), so the readers know what comes next.
 *
 * Where the weights live: with the CPU backend the buffers are host memory
 * from the manager (the ops read them in place).  A device backend passes
 * a wstream_dev (wstream_create_dev): resident tensors stay on the mapping
 * (the backend's load_weights uploads them), the ring is page-locked host
 * memory from dev->host_alloc, and wstream_acquire uploads the slot with
 * dev->upload (on the backend's copy stream) and points the layer's
 * tensors at the device copy.
 *
 * Ownership: wstream_create returns a heap handle freed by wstream_destroy
 * (joins the readers, frees the buffers, points tensors back at the
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
#define WSTREAM_ALIGN 64 /* each tensor's offset inside a resident layer's buffer */
#define WSTREAM_DIO_ALIGN 4096 /* O_DIRECT file offset, length and buffer alignment */

enum { WPLACE_RESIDENT = 0, WPLACE_STREAMED = 1 };

typedef struct wstream_plan {
    int32_t n_layers;
    uint8_t place[MODEL_MAX_LAYERS];        /* WPLACE_* per layer */
    uint64_t layer_bytes[MODEL_MAX_LAYERS]; /* a layer's tensors, each rounded to WSTREAM_ALIGN */
    uint64_t stream_bytes[MODEL_MAX_LAYERS]; /* the same in a slot's layout (each tensor's
                                              * region rounded out to WSTREAM_DIO_ALIGN) */
    uint64_t global_bytes;                  /* embedding, output norm/head, rope factors */
    uint64_t resident_bytes;                /* globals + resident layers */
    uint64_t streamed_bytes;                /* streamed layers: bytes read per forward pass */
    int32_t n_streamed;
    int32_t n_slots;
    uint64_t slot_bytes;                    /* the largest streamed layer's stream_bytes */
    uint64_t ring_bytes;                    /* n_slots * slot_bytes + WSTREAM_DIO_ALIGN (one
                                             * allocation, its base aligned inside) */
    uint64_t min_bytes;                     /* smallest weights budget that works: globals +
                                             * a ring for the largest stream_bytes */
} wstream_plan;

/* Layer sizes of m, everything resident (no stream). */
void wstream_plan_resident(const model *m, int n_slots, wstream_plan *p);
/* Places m's layers within weights_memory bytes (globals, resident layers
 * and the ring together).  KV_ENOMEM naming the smallest budget when even
 * all-streamed does not fit; when everything fits, every layer is resident
 * (n_streamed 0: no offload). */
int wstream_plan_make(const model *m, uint64_t weights_memory, int n_slots, wstream_plan *p,
                      kvant_err *err);
/* Which layers stream when only some fit (wstream_plan_make is TAIL):
 * TAIL streams the last layers (the fewest that make it fit), SPREAD
 * streams the same number spread evenly over the depth, each after
 * resident layers whose compute hides its read.  Which is faster depends
 * on the read and compute rates (engine/offload_cost.h ocost_place). */
enum { WSTREAM_ORDER_TAIL = 0, WSTREAM_ORDER_SPREAD = 1, WSTREAM_ORDER_COUNT };
int wstream_plan_make_order(const model *m, uint64_t weights_memory, int n_slots, int order,
                            wstream_plan *p, kvant_err *err);
/* "tail" / "spread" -> WSTREAM_ORDER_*, or -1. */
int wstream_order_parse(const char *s);
const char *wstream_order_name(int order);
/* Recomputes the totals after a caller changed p->place (tests: alternating). */
void wstream_plan_update(wstream_plan *p);
/* Device bytes the plan needs for weights: resident_bytes + ring_bytes. */
uint64_t wstream_plan_device_bytes(const wstream_plan *p);

typedef struct wstream wstream;

enum {
    WSTREAM_IO_BUFFERED = 0, /* pread through the page cache */
    WSTREAM_IO_DIRECT = 1,   /* O_DIRECT (page cache where refused) */
    WSTREAM_IO_BOTH = 2,     /* a page-cache reader and a direct reader side by side */
    WSTREAM_IO_COUNT
};

typedef struct wstream_io {
    int mode; /* WSTREAM_IO_* */
    /* Opens the model file for direct reads (returns an fd or -1 with
     * errno); NULL: open(2) with O_DIRECT.  Tests inject a refusal. */
    int (*open_direct)(const char *path);
} wstream_io;

wstream_io wstream_io_default(void); /* WSTREAM_IO_BUFFERED, open(2) */
/* Opens path for O_DIRECT reads (open_direct: a test's stand-in, or NULL
 * for open(2)) and reads the aligned block around probe_off into buf
 * (WSTREAM_DIO_ALIGN bytes, aligned): the fd, or -1 with note saying why
 * (refused: the caller reads through the page cache; not an error). */
int wstream_direct_open(const char *path, int (*open_direct)(const char *), uint64_t probe_off,
                        void *buf, char *note, size_t cap);
/* "buffered" / "direct" / "both" -> WSTREAM_IO_*, or -1. */
int wstream_io_parse(const char *s);
const char *wstream_io_name(int mode);

/* A device backend's side of the stream (backend_wstream_dev fills it from
 * backend_ops host_alloc / host_free / stream_layer; see backend.h). */
typedef struct wstream_dev {
    void *ctx; /* the backend, borrowed: it must outlive the stream */
    void *(*host_alloc)(void *ctx, size_t bytes, kvant_err *err);
    void (*host_free)(void *ctx, void *p);
    /* Uploads bytes of h_src into device slot `slot` (largest size
     * max_bytes); returns the device base, or NULL + err. */
    void *(*upload)(void *ctx, int slot, const void *h_src, size_t bytes, size_t max_bytes,
                    kvant_err *err);
} wstream_dev;

/* Reads resident tensors into manager buffers (MEM_WEIGHTS per layer),
 * allocates the ring (MEM_WEIGHTS, no layer), marks streamed tensors
 * (model_tensor.streamed, dev NULL until acquired) and starts the readers.
 * Call before the backend's load_weights.  m->path must name the file m
 * was loaded from.  io: NULL for wstream_io_default(); copied. */
wstream *wstream_create(model *m, mem_mgr *mem, const wstream_plan *p, const wstream_io *io,
                        kvant_err *err);
/* The same for a device backend (dev copied; NULL: wstream_create): no
 * resident buffers (the mapping is uploaded by load_weights), the ring
 * from dev->host_alloc (accounted by the backend as pinned host memory),
 * each streamed layer uploaded by wstream_acquire.  Destroy the stream
 * before the backend. */
wstream *wstream_create_dev(model *m, mem_mgr *mem, const wstream_plan *p, const wstream_io *io,
                            const wstream_dev *dev, kvant_err *err);
void wstream_destroy(wstream *ws);

/* Before layer il runs: for a streamed layer, waits until its buffer is
 * read (and, with a wstream_dev, uploaded into the device slot) and points
 * its tensors' dev at it.  KV_EIO (the stream failed: short
 * read, I/O error) with the reason; no-op KV_OK for a resident layer. */
int wstream_acquire(wstream *ws, int32_t il, kvant_err *err);
/* After layer il ran (the backend synchronised): its buffer may be refilled. */
void wstream_release(wstream *ws, int32_t il);

typedef struct wstream_stats {
    uint64_t resident_bytes, streamed_bytes, ring_bytes; /* as planned */
    int32_t n_layers, n_streamed, n_slots;
    uint64_t bytes_read;     /* streamed so far */
    uint64_t layers_read;
    uint64_t bytes_direct;   /* of bytes_read, read with O_DIRECT */
    double read_s;           /* reader time inside pread (all readers summed) */
    double wait_s;           /* forward pass time on layers not ready: waiting for the
                              * reader or reading their remaining chunks itself */
    int io_mode;             /* WSTREAM_IO_* asked for */
    int direct;              /* 1: direct reads in use (0: refused, or not asked) */
    char io_note[200];       /* why O_DIRECT is not in use when it was asked for, else "" */
    int failed;              /* 1: the stream failed; reason in `error` */
    char error[256];
    const wstream_plan *plan; /* the placement; borrowed, immutable, valid while the stream is */
} wstream_stats;

void wstream_get_stats(wstream *ws, wstream_stats *out);
int wstream_failed(wstream *ws);
const wstream_plan *wstream_get_plan(const wstream *ws);

#endif
