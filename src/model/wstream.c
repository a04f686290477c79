/* wstream.c - weight offload: placement, resident copies, the staging ring
 * and its reader threads (see wstream.h).
 *
 * Ring protocol: streamed layers get sequence numbers in consumption order
 * (seq s is layer order[s % n_streamed] and lives in slot s % n_slots).
 * Seqs below `opened` have been assigned their slot; the forward pass has
 * released every seq < cseq, and opened <= cseq + n_slots (a slot is
 * reassigned only after the forward pass released its previous seq).  A
 * layer is read in chunks of at most WS_CHUNK bytes; a chunk is claimed
 * (slot.claimed++) and then read outside the lock (slot.done++ after).
 * Each reader thread claims chunks of the oldest open seq first and opens
 * the next seq when there is room; the forward pass, when the layer it
 * needs is not complete, claims and reads that layer's remaining chunks
 * itself instead of waiting idle (so a stall is read by one more thread).
 * A seq is ready when done == n_chunks.  All counters are under mu.
 *
 * Chunk boundaries inside a tensor fall on WSTREAM_DIO_ALIGN file offsets,
 * so the aligned file ranges that direct reads of two chunks cover never
 * overlap: two threads never write the same bytes of a slot.
 */
#include "model/wstream.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define WS_MAX_PIECES MODEL_LAYER_TENSORS /* tensors per layer (model_layer_tensors) */
#define WS_CHUNK (4u << 20) /* bytes per pread claim, a multiple of WSTREAM_DIO_ALIGN */
#define WS_MAX_READERS 2    /* reader threads: page cache and direct (WSTREAM_IO_BOTH) */
#define WS_EDIRECT (-100)   /* read_chunk: O_DIRECT refused the read (EINVAL) */

_Static_assert(WS_CHUNK % WSTREAM_DIO_ALIGN == 0, "chunks end on direct-read boundaries");

typedef struct ws_piece {
    model_tensor *t;
    uint64_t off; /* inside the layer's buffer */
} ws_piece;

typedef struct ws_chunk {
    int piece;
    uint64_t off, len; /* within the piece's tensor */
} ws_chunk;

typedef struct ws_layer {
    ws_piece pc[WS_MAX_PIECES];
    int n;
    void *buf;         /* resident layers: manager buffer owned here */
    ws_chunk *chunks;  /* streamed layers: [n_chunks], owned */
    int n_chunks;
} ws_layer;

typedef struct ws_slot {
    uint8_t *buf;      /* [slot_bytes] in the ring, WSTREAM_DIO_ALIGN-aligned */
    uint64_t seq;      /* the seq it holds (valid below `opened`) */
    int claimed, done; /* chunks of that seq */
} ws_slot;

typedef struct ws_reader {
    struct wstream *ws; /* borrowed */
    pthread_t th;
    int direct;         /* 1: reads with O_DIRECT while the stream may */
} ws_reader;

struct wstream {
    model *m;          /* borrowed */
    mem_mgr *mem;      /* borrowed */
    wstream_plan plan;
    wstream_io io;
    wstream_dev dev;   /* dev.upload NULL: the CPU backend (host buffers) */
    int fd;            /* page-cache reads */
    int dfd;           /* O_DIRECT reads, or -1 */
    ws_layer *layers;  /* [n_layers] */
    ws_layer globals;
    int32_t *order;    /* [n_streamed] streamed layer indices, in forward order */
    ws_slot slot[WSTREAM_MAX_SLOTS];
    void *ring;        /* [ring_bytes] manager buffer holding the slots (owned) */
    ws_reader reader[WS_MAX_READERS];
    int n_readers;     /* started */
    int help_direct;   /* the forward pass's own reads are direct ones */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t opened, cseq; /* see the protocol above */
    int stop, failed;
    int direct;        /* direct reads allowed (cleared for good when refused) */
    char io_note[200];
    char error[256];
    uint64_t bytes_read, bytes_direct, layers_read;
    double read_s, wait_s;
};

static double ws_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t ws_round(uint64_t n)
{
    return (n + WSTREAM_ALIGN - 1) / WSTREAM_ALIGN * WSTREAM_ALIGN;
}

/* The tensors of layer il (il < 0: the globals) that have data. */
static void layer_pieces(model *m, int32_t il, ws_layer *out)
{
    out->n = 0;
    model_tensor *ts[WS_MAX_PIECES];
    int n = 0;
    if (il < 0) {
        ts[n++] = &m->tok_embd;
        ts[n++] = &m->output_norm;
        if (!m->tied_output)
            ts[n++] = &m->output;
        ts[n++] = &m->rope_freqs;
    } else {
        n = model_layer_tensors(&m->layers[il], ts); /* fused tensors: each view is a piece */
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        if (!ts[i]->data || !ts[i]->nbytes)
            continue;
        out->pc[out->n++] = (ws_piece){ts[i], off};
        off += ws_round(ts[i]->nbytes);
    }
}

static uint64_t pieces_bytes(const ws_layer *l)
{
    return l->n ? l->pc[l->n - 1].off + ws_round(l->pc[l->n - 1].t->nbytes) : 0;
}

static uint64_t dio_up(uint64_t n)
{
    return (n + WSTREAM_DIO_ALIGN - 1) / WSTREAM_DIO_ALIGN * WSTREAM_DIO_ALIGN;
}

/* Re-lays l for a slot: each tensor at an offset congruent to its file
 * offset modulo WSTREAM_DIO_ALIGN, its region [off - file_off % A,
 * dio_up(off + nbytes)) disjoint from its neighbours'.  Returns the bytes
 * (a multiple of WSTREAM_DIO_ALIGN) from an aligned base. */
static uint64_t layout_stream(ws_layer *l)
{
    uint64_t end = 0;
    for (int i = 0; i < l->n; i++) {
        l->pc[i].off = end + l->pc[i].t->file_off % WSTREAM_DIO_ALIGN;
        end = dio_up(l->pc[i].off + l->pc[i].t->nbytes);
    }
    return end;
}

void wstream_plan_update(wstream_plan *p)
{
    uint64_t widest = 0, widest_all = 0;
    p->resident_bytes = p->global_bytes;
    p->streamed_bytes = 0;
    p->n_streamed = 0;
    for (int32_t il = 0; il < p->n_layers; il++) {
        const uint64_t b = p->layer_bytes[il], sb = p->stream_bytes[il];
        widest_all = sb > widest_all ? sb : widest_all;
        if (p->place[il] == WPLACE_STREAMED) {
            p->streamed_bytes += b;
            p->n_streamed++;
            widest = sb > widest ? sb : widest;
        } else {
            p->resident_bytes += b;
        }
    }
    p->slot_bytes = widest;
    p->ring_bytes = widest * (uint64_t)p->n_slots + WSTREAM_DIO_ALIGN;
    p->min_bytes = p->global_bytes + widest_all * (uint64_t)p->n_slots + WSTREAM_DIO_ALIGN;
}

void wstream_plan_resident(const model *m, int n_slots, wstream_plan *p)
{
    memset(p, 0, sizeof *p);
    p->n_layers = m->hp.n_layers;
    p->n_slots = n_slots < WSTREAM_MIN_SLOTS   ? WSTREAM_MIN_SLOTS
                 : n_slots > WSTREAM_MAX_SLOTS ? WSTREAM_MAX_SLOTS
                                               : n_slots;
    ws_layer l;
    layer_pieces((model *)m, -1, &l);
    p->global_bytes = pieces_bytes(&l);
    for (int32_t il = 0; il < p->n_layers && il < MODEL_MAX_LAYERS; il++) {
        layer_pieces((model *)m, il, &l);
        p->layer_bytes[il] = pieces_bytes(&l);
        p->stream_bytes[il] = layout_stream(&l);
    }
    wstream_plan_update(p);
}

uint64_t wstream_plan_device_bytes(const wstream_plan *p)
{
    return p->resident_bytes + (p->n_streamed ? p->ring_bytes : 0);
}

/* Streams the n layers of an even spread: layer L - 1 - floor(i * L / n)
 * for i < n, so each streamed layer follows about L / n - 1 resident ones
 * whose compute hides its read; the last layer is streamed (the reader
 * then prefetches the next pass's first streamed layers while the head
 * computes) and the first stays resident unless every layer streams. */
static void place_spread(wstream_plan *p, int32_t n)
{
    const int32_t L = p->n_layers;
    for (int32_t il = 0; il < L; il++)
        p->place[il] = WPLACE_RESIDENT;
    for (int32_t i = 0; i < n; i++)
        p->place[L - 1 - (int32_t)(((int64_t)i * L) / n)] = WPLACE_STREAMED;
    wstream_plan_update(p);
}

int wstream_plan_make_order(const model *m, uint64_t weights_memory, int n_slots, int order,
                            wstream_plan *p, kvant_err *err)
{
    wstream_plan_resident(m, n_slots, p);
    if (p->resident_bytes <= weights_memory)
        return KV_OK; /* everything fits: no offload */
    if (model_has_experts(m)) /* experts are not streamed (nor placed by use) yet */
        return kvant_err_set(err, KV_EUNSUP, "--weights-memory: weight offload of mixture-of-"
                             "experts models (%s.expert_count %u) is not supported; the model "
                             "needs %llu bytes resident", m->hp.recipe->arch, m->hp.fam.n_expert,
                             (unsigned long long)p->resident_bytes);
    if (m->hp.fam.mla)
        return kvant_err_set(err, KV_EUNSUP, "--weights-memory: weight offload of latent-"
                             "attention models (%s) is not supported", m->hp.recipe->arch);
    if (weights_memory < p->min_bytes)
        return kvant_err_set(err, KV_ENOMEM,
                             "--weights-memory %llu bytes cannot hold the embedding and output "
                             "head (%llu bytes) plus a staging ring of %d buffers of %llu bytes: "
                             "the smallest weights budget that works is %lluMiB",
                             (unsigned long long)weights_memory,
                             (unsigned long long)p->global_bytes, p->n_slots,
                             (unsigned long long)(p->min_bytes - p->global_bytes) / p->n_slots,
                             (unsigned long long)((p->min_bytes + (1 << 20) - 1) >> 20));
    if (order == WSTREAM_ORDER_SPREAD) {
        /* the fewest streamed layers whose spread fits (layers may differ in size) */
        for (int32_t n = 1; n <= p->n_layers; n++) {
            place_spread(p, n);
            if (wstream_plan_device_bytes(p) <= weights_memory)
                return KV_OK;
        }
        return KV_OK; /* unreachable: all streamed fits since min_bytes <= weights_memory */
    }
    /* Stream the last layers first: the reader then prefetches the first
     * streamed layers while the resident ones compute. */
    for (int32_t k = p->n_layers - 1; k >= 0; k--) {
        p->place[k] = WPLACE_STREAMED;
        wstream_plan_update(p);
        if (wstream_plan_device_bytes(p) <= weights_memory)
            return KV_OK;
    }
    return KV_OK; /* unreachable: all streamed fits since min_bytes <= weights_memory */
}

int wstream_plan_make(const model *m, uint64_t weights_memory, int n_slots, wstream_plan *p,
                      kvant_err *err)
{
    return wstream_plan_make_order(m, weights_memory, n_slots, WSTREAM_ORDER_TAIL, p, err);
}

int wstream_order_parse(const char *s)
{
    return !strcmp(s, "tail") ? WSTREAM_ORDER_TAIL : !strcmp(s, "spread") ? WSTREAM_ORDER_SPREAD
                                                                          : -1;
}

const char *wstream_order_name(int order)
{
    return order == WSTREAM_ORDER_SPREAD ? "spread" : "tail";
}

/* Reads every piece of l into buf (pread, retried on EINTR and partial
 * reads).  A short read or an error fills msg and returns KV_EIO. */
static int read_pieces(int fd, const ws_layer *l, uint8_t *buf, int32_t il, char *msg, size_t cap)
{
    for (int i = 0; i < l->n; i++) {
        const model_tensor *t = l->pc[i].t;
        uint64_t done = 0;
        while (done < t->nbytes) {
            ssize_t r = pread(fd, buf + l->pc[i].off + done, (size_t)(t->nbytes - done),
                              (off_t)(t->file_off + done));
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                snprintf(msg, cap,
                         "model file: %s reading layer %d at byte %llu (%llu of %llu bytes "
                         "read): the file was truncated or replaced while streamed",
                         r < 0 ? strerror(errno) : "short read", (int)il,
                         (unsigned long long)(t->file_off + done), (unsigned long long)done,
                         (unsigned long long)t->nbytes);
                return KV_EIO;
            }
            done += (uint64_t)r;
        }
    }
    return KV_OK;
}

static void point_pieces(const ws_layer *l, uint8_t *buf)
{
    for (int i = 0; i < l->n; i++)
        l->pc[i].t->dev = buf + l->pc[i].off;
}

/* One chunk of a layer into its place in slot buffer buf, retried on EINTR
 * and partial reads.  direct: reads the chunk's WSTREAM_DIO_ALIGN-aligned
 * file range with ws->dfd (the slot's layout leaves room around it).
 * KV_EIO with msg on a short read or an error; WS_EDIRECT when O_DIRECT
 * refuses the read (EINVAL: the caller reads it through the page cache). */
static int read_chunk(const wstream *ws, int direct, const ws_layer *l, const ws_chunk *c,
                      uint8_t *buf, int32_t il, char *msg, size_t cap)
{
    const model_tensor *t = l->pc[c->piece].t;
    const uint64_t fo = t->file_off + c->off;
    const uint64_t head = direct ? fo % WSTREAM_DIO_ALIGN : 0;
    const uint64_t need = head + c->len, ask = direct ? dio_up(need) : need;
    uint8_t *dst = buf + l->pc[c->piece].off + c->off - head;
    uint64_t done = 0;
    while (done < need) {
        ssize_t r = pread(direct ? ws->dfd : ws->fd, dst + done, (size_t)(ask - done),
                          (off_t)(fo - head + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && direct && errno == EINVAL)
            return WS_EDIRECT;
        /* a direct read that ends off a block boundary has reached the end of the file */
        if (r <= 0 || (direct && r % WSTREAM_DIO_ALIGN && done + (uint64_t)r < need)) {
            snprintf(msg, cap,
                     "model file: %s reading layer %d at byte %llu: the file was truncated or "
                     "replaced while streamed",
                     r < 0 ? strerror(errno) : "short read", (int)il,
                     (unsigned long long)(fo - head + done + (r > 0 ? (uint64_t)r : 0)));
            return KV_EIO;
        }
        done += (uint64_t)r;
    }
    return KV_OK;
}

static int32_t seq_layer(const wstream *ws, uint64_t seq)
{
    return ws->order[seq % (uint64_t)ws->plan.n_streamed];
}

/* Assigns the next seq its slot when the slot is free (mu held). */
static int open_next_locked(wstream *ws)
{
    if (ws->opened >= ws->cseq + (uint64_t)ws->plan.n_slots)
        return 0;
    ws_slot *sl = &ws->slot[ws->opened % (uint64_t)ws->plan.n_slots];
    sl->seq = ws->opened++;
    sl->claimed = sl->done = 0;
    return 1;
}

/* Claims one chunk of seq, reads it with mu released (direct: with
 * O_DIRECT while the stream allows it), accounts it (mu held on entry and
 * exit).  Returns 0, or KV_EIO after marking failure. */
static int read_one_locked(wstream *ws, uint64_t seq, int direct)
{
    ws_slot *sl = &ws->slot[seq % (uint64_t)ws->plan.n_slots];
    const int32_t il = seq_layer(ws, seq);
    const ws_layer *l = &ws->layers[il];
    const ws_chunk *c = &l->chunks[sl->claimed++];
    char msg[256];
    direct = direct && ws->direct;
    pthread_mutex_unlock(&ws->mu);
    const double t0 = ws_now();
    int rc = read_chunk(ws, direct, l, c, sl->buf, il, msg, sizeof msg), refused = 0;
    if (rc == WS_EDIRECT) {
        refused = 1;
        direct = 0;
        rc = read_chunk(ws, 0, l, c, sl->buf, il, msg, sizeof msg);
    }
    const double dt = ws_now() - t0;
    pthread_mutex_lock(&ws->mu);
    ws->read_s += dt;
    if (refused && ws->direct) {
        ws->direct = 0;
        snprintf(ws->io_note, sizeof ws->io_note, "O_DIRECT refused a read of layer %d "
                 "(EINVAL): reading through the page cache", (int)il);
    }
    if (rc) {
        if (!ws->failed)
            snprintf(ws->error, sizeof ws->error, "%s", msg);
        ws->failed = 1;
    } else {
        ws->bytes_read += c->len;
        ws->bytes_direct += direct ? c->len : 0;
        if (++sl->done == l->n_chunks)
            ws->layers_read++;
    }
    pthread_cond_broadcast(&ws->cv);
    return rc;
}

static void *reader_main(void *arg)
{
    ws_reader *rd = arg;
    wstream *ws = rd->ws;
    pthread_mutex_lock(&ws->mu);
    while (!ws->stop && !ws->failed) {
        uint64_t s = ws->cseq;
        while (s < ws->opened) { /* the oldest open seq with unclaimed chunks */
            const ws_slot *sl = &ws->slot[s % (uint64_t)ws->plan.n_slots];
            if (sl->claimed < ws->layers[seq_layer(ws, s)].n_chunks)
                break;
            s++;
        }
        if (s < ws->opened)
            read_one_locked(ws, s, rd->direct);
        else if (!open_next_locked(ws))
            pthread_cond_wait(&ws->cv, &ws->mu);
    }
    pthread_mutex_unlock(&ws->mu);
    return NULL;
}

/* Splits each piece of a streamed layer into chunks of at most WS_CHUNK
 * whose boundaries inside the tensor are multiples of WS_CHUNK in the file
 * (so aligned for direct reads). */
static int make_chunks(ws_layer *l)
{
    int n = 0;
    for (int i = 0; i < l->n; i++) /* at most one more than nbytes / WS_CHUNK rounded up */
        n += (int)((l->pc[i].t->nbytes + WS_CHUNK - 1) / WS_CHUNK) + 1;
    l->chunks = calloc((size_t)(n ? n : 1), sizeof *l->chunks);
    if (!l->chunks)
        return KV_ENOMEM;
    for (int i = 0; i < l->n; i++) {
        const uint64_t fo = l->pc[i].t->file_off, nb = l->pc[i].t->nbytes;
        for (uint64_t off = 0; off < nb;) {
            const uint64_t end = (fo + off) / WS_CHUNK * WS_CHUNK + WS_CHUNK - fo;
            const uint64_t len = (end < nb ? end : nb) - off;
            l->chunks[l->n_chunks++] = (ws_chunk){i, off, len};
            off += len;
        }
    }
    return KV_OK;
}

/* Resident layer (or the globals, il < 0): one manager buffer, read once. */
static int load_resident(wstream *ws, ws_layer *l, int32_t il, kvant_err *err)
{
    const uint64_t bytes = pieces_bytes(l);
    if (!bytes || ws->dev.upload) /* a device backend uploads the mapping itself */
        return KV_OK;
    l->buf = mem_alloc(ws->mem, bytes, MEM_WEIGHTS, il < 0 ? MEM_NO_LAYER : il, err);
    if (!l->buf)
        return KV_ENOMEM;
    char msg[256];
    if (read_pieces(ws->fd, l, l->buf, il, msg, sizeof msg))
        return kvant_err_set(err, KV_EIO, "%s: %s", ws->m->path, msg);
    point_pieces(l, l->buf);
    return KV_OK;
}

static int open_direct_default(const char *path)
{
    return open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
}

int wstream_direct_open(const char *path, int (*open_direct)(const char *), uint64_t probe_off,
                        void *buf, char *note, size_t cap)
{
    const int fd = (open_direct ? open_direct : open_direct_default)(path);
    if (fd < 0) {
        snprintf(note, cap, "O_DIRECT refused opening the model file (%s): reading through the "
                 "page cache", strerror(errno));
        return -1;
    }
    ssize_t r;
    do
        r = pread(fd, buf, WSTREAM_DIO_ALIGN, (off_t)(probe_off - probe_off % WSTREAM_DIO_ALIGN));
    while (r < 0 && errno == EINTR);
    if (r <= 0) {
        snprintf(note, cap, "O_DIRECT refused a read of the model file (%s): reading through the "
                 "page cache", r < 0 ? strerror(errno) : "end of file");
        close(fd);
        return -1;
    }
    return fd;
}

/* The direct fd, probed with the first aligned block of the first streamed
 * tensor read into slot 0: where either is refused, direct reads are off
 * for good and io_note says why (not an error). */
static void direct_probe(wstream *ws)
{
    const ws_layer *l = &ws->layers[ws->order[0]];
    ws->dfd = wstream_direct_open(ws->m->path, ws->io.open_direct, l->pc[0].t->file_off,
                                  ws->slot[0].buf, ws->io_note, sizeof ws->io_note);
    ws->direct = ws->dfd >= 0;
}

/* The streamed layer's slot layout, its chunks; its tensors marked. */
static int setup_streamed(wstream *ws, ws_layer *l, int32_t il, kvant_err *err)
{
    if (layout_stream(l) > ws->plan.slot_bytes)
        return kvant_err_set(err, KV_EINVAL, "weight placement: layer %d needs %llu bytes, the "
                             "plan's staging buffers hold %llu", (int)il,
                             (unsigned long long)layout_stream(l),
                             (unsigned long long)ws->plan.slot_bytes);
    if (make_chunks(l))
        return kvant_err_set(err, KV_ENOMEM, "out of memory");
    for (int i = 0; i < l->n; i++) {
        l->pc[i].t->streamed = 1;
        l->pc[i].t->dev = NULL;
    }
    return KV_OK;
}

/* The ring, the direct fd (when asked for), the reader threads. */
static int start_readers(wstream *ws, kvant_err *err)
{
    const wstream_plan *p = &ws->plan;
    ws->ring = ws->dev.upload ? ws->dev.host_alloc(ws->dev.ctx, p->ring_bytes, err)
                              : mem_alloc(ws->mem, p->ring_bytes, MEM_WEIGHTS, MEM_NO_LAYER, err);
    if (!ws->ring)
        return KV_ENOMEM;
    uint8_t *base = (uint8_t *)(((uintptr_t)ws->ring + WSTREAM_DIO_ALIGN - 1) /
                                WSTREAM_DIO_ALIGN * WSTREAM_DIO_ALIGN);
    for (int s = 0; s < p->n_slots; s++)
        ws->slot[s].buf = base + (size_t)s * p->slot_bytes;
    (void)posix_fadvise(ws->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    if (ws->io.mode != WSTREAM_IO_BUFFERED)
        direct_probe(ws);
    /* direct: one direct reader (the forward pass helps with direct reads
     * too); both: a page-cache reader and a direct reader */
    const int n = ws->io.mode == WSTREAM_IO_BOTH && ws->direct ? 2 : 1;
    ws->help_direct = ws->io.mode == WSTREAM_IO_DIRECT;
    for (int i = 0; i < n; i++) {
        ws_reader *rd = &ws->reader[i];
        rd->ws = ws;
        rd->direct = ws->io.mode == WSTREAM_IO_DIRECT || i == 1;
        if (pthread_create(&rd->th, NULL, reader_main, rd))
            return kvant_err_set(err, KV_ENOMEM, "cannot start the weight reader thread");
        ws->n_readers++;
    }
    return KV_OK;
}

static int ws_setup(wstream *ws, kvant_err *err)
{
    model *m = ws->m;
    const wstream_plan *p = &ws->plan;
    ws->fd = open(m->path, O_RDONLY | O_CLOEXEC);
    if (ws->fd < 0)
        return kvant_err_set(err, KV_EIO, "%s: %s", m->path, strerror(errno));
    ws->layers = calloc((size_t)p->n_layers, sizeof *ws->layers);
    ws->order = calloc((size_t)p->n_layers, sizeof *ws->order);
    if (!ws->layers || !ws->order)
        return kvant_err_set(err, KV_ENOMEM, "out of memory");
    layer_pieces(m, -1, &ws->globals);
    int rc = load_resident(ws, &ws->globals, -1, err);
    if (rc)
        return rc;
    if (m->tied_output)
        m->output.dev = m->tok_embd.dev;
    int32_t k = 0;
    for (int32_t il = 0; il < p->n_layers; il++) {
        ws_layer *l = &ws->layers[il];
        layer_pieces(m, il, l);
        if (p->place[il] == WPLACE_STREAMED) {
            ws->order[k++] = il;
            rc = setup_streamed(ws, l, il, err);
        } else {
            rc = load_resident(ws, l, il, err);
        }
        if (rc)
            return rc;
    }
    return k ? start_readers(ws, err) : KV_OK;
}

wstream_io wstream_io_default(void)
{
    return (wstream_io){WSTREAM_IO_BUFFERED, NULL};
}

static const char *const k_io_names[WSTREAM_IO_COUNT] = {"buffered", "direct", "both"};

int wstream_io_parse(const char *s)
{
    for (int i = 0; i < WSTREAM_IO_COUNT; i++)
        if (!strcmp(s, k_io_names[i]))
            return i;
    return -1;
}

const char *wstream_io_name(int mode)
{
    return mode >= 0 && mode < WSTREAM_IO_COUNT ? k_io_names[mode] : "?";
}

wstream *wstream_create(model *m, mem_mgr *mem, const wstream_plan *p, const wstream_io *io,
                        kvant_err *err)
{
    return wstream_create_dev(m, mem, p, io, NULL, err);
}

wstream *wstream_create_dev(model *m, mem_mgr *mem, const wstream_plan *p, const wstream_io *io,
                            const wstream_dev *dev, kvant_err *err)
{
    const wstream_io iod = io ? *io : wstream_io_default();
    if (p->n_layers != m->hp.n_layers || p->n_slots < WSTREAM_MIN_SLOTS ||
        p->n_slots > WSTREAM_MAX_SLOTS) {
        kvant_err_set(err, KV_EINVAL, "weight placement: plan of %d layers, %d slots for a model "
                      "of %d layers", p->n_layers, p->n_slots, m->hp.n_layers);
        return NULL;
    }
    if (iod.mode < 0 || iod.mode >= WSTREAM_IO_COUNT) {
        kvant_err_set(err, KV_EINVAL, "weight stream: read mode %d (buffered, direct or both)",
                      iod.mode);
        return NULL;
    }
    wstream *ws = calloc(1, sizeof *ws);
    if (!ws) {
        kvant_err_set(err, KV_ENOMEM, "out of memory");
        return NULL;
    }
    ws->m = m;
    ws->mem = mem;
    ws->plan = *p;
    ws->io = iod;
    if (dev)
        ws->dev = *dev;
    wstream_plan_update(&ws->plan);
    ws->fd = ws->dfd = -1;
    pthread_mutex_init(&ws->mu, NULL);
    pthread_cond_init(&ws->cv, NULL);
    if (ws_setup(ws, err)) {
        wstream_destroy(ws);
        return NULL;
    }
    return ws;
}

static void unpoint(ws_layer *l)
{
    for (int i = 0; i < l->n; i++) {
        l->pc[i].t->dev = (void *)l->pc[i].t->data;
        l->pc[i].t->streamed = 0;
    }
}

void wstream_destroy(wstream *ws)
{
    if (!ws)
        return;
    pthread_mutex_lock(&ws->mu);
    ws->stop = 1;
    pthread_cond_broadcast(&ws->cv);
    pthread_mutex_unlock(&ws->mu);
    for (int i = 0; i < ws->n_readers; i++)
        pthread_join(ws->reader[i].th, NULL);
    if (ws->dev.upload)
        ws->dev.host_free(ws->dev.ctx, ws->ring);
    else
        mem_free(ws->mem, ws->ring);
    for (int32_t il = 0; ws->layers && il < ws->plan.n_layers; il++) {
        unpoint(&ws->layers[il]);
        mem_free(ws->mem, ws->layers[il].buf);
        free(ws->layers[il].chunks);
    }
    unpoint(&ws->globals);
    mem_free(ws->mem, ws->globals.buf);
    if (ws->m->tied_output)
        ws->m->output.dev = ws->m->tok_embd.dev;
    if (ws->fd >= 0)
        close(ws->fd);
    if (ws->dfd >= 0)
        close(ws->dfd);
    pthread_mutex_destroy(&ws->mu);
    pthread_cond_destroy(&ws->cv);
    free(ws->layers);
    free(ws->order);
    free(ws);
}

int wstream_acquire(wstream *ws, int32_t il, kvant_err *err)
{
    if (il < 0 || il >= ws->plan.n_layers || ws->plan.place[il] != WPLACE_STREAMED)
        return KV_OK;
    pthread_mutex_lock(&ws->mu);
    const uint64_t seq = ws->cseq;
    const int32_t want = seq_layer(ws, seq);
    if (want != il && !ws->failed) {
        ws->failed = 1;
        snprintf(ws->error, sizeof ws->error,
                 "weight stream out of order: layer %d asked, layer %d next", (int)il, (int)want);
        pthread_cond_broadcast(&ws->cv);
    }
    ws_slot *sl = &ws->slot[seq % (uint64_t)ws->plan.n_slots];
    const int n_chunks = ws->layers[il].n_chunks;
    const double t0 = ws_now();
    while (!ws->failed) {
        if (ws->opened == seq)
            open_next_locked(ws); /* always room: seq == cseq */
        if (sl->claimed < n_chunks)
            read_one_locked(ws, seq, ws->help_direct); /* help rather than wait */
        else if (sl->done < n_chunks)
            pthread_cond_wait(&ws->cv, &ws->mu);
        else
            break;
    }
    ws->wait_s += ws_now() - t0;
    int rc = KV_OK;
    void *base = sl->buf;
    if (ws->failed)
        rc = kvant_err_set(err, KV_EIO, "%s: %s", ws->m->path, ws->error);
    else if (ws->dev.upload && /* the device copy of the slot, ordered before the layer's ops */
             !(base = ws->dev.upload(ws->dev.ctx, (int)(seq % (uint64_t)ws->plan.n_slots),
                                     sl->buf, ws->plan.stream_bytes[il], ws->plan.slot_bytes,
                                     err)))
        rc = err && err->code ? err->code : KV_EIO;
    if (!rc)
        point_pieces(&ws->layers[il], base);
    pthread_mutex_unlock(&ws->mu);
    return rc;
}

void wstream_release(wstream *ws, int32_t il)
{
    if (il < 0 || il >= ws->plan.n_layers || ws->plan.place[il] != WPLACE_STREAMED)
        return;
    pthread_mutex_lock(&ws->mu);
    ws->cseq++;
    pthread_cond_broadcast(&ws->cv);
    pthread_mutex_unlock(&ws->mu);
}

void wstream_get_stats(wstream *ws, wstream_stats *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&ws->mu);
    out->resident_bytes = ws->plan.resident_bytes;
    out->streamed_bytes = ws->plan.streamed_bytes;
    out->ring_bytes = ws->plan.n_streamed ? ws->plan.ring_bytes : 0;
    out->n_layers = ws->plan.n_layers;
    out->n_streamed = ws->plan.n_streamed;
    out->n_slots = ws->plan.n_slots;
    out->bytes_read = ws->bytes_read;
    out->bytes_direct = ws->bytes_direct;
    out->io_mode = ws->io.mode;
    out->direct = ws->direct;
    snprintf(out->io_note, sizeof out->io_note, "%s", ws->io_note);
    out->layers_read = ws->layers_read;
    out->read_s = ws->read_s;
    out->wait_s = ws->wait_s;
    out->failed = ws->failed;
    snprintf(out->error, sizeof out->error, "%s", ws->error);
    out->plan = &ws->plan;
    pthread_mutex_unlock(&ws->mu);
}

int wstream_failed(wstream *ws)
{
    pthread_mutex_lock(&ws->mu);
    int f = ws->failed;
    pthread_mutex_unlock(&ws->mu);
    return f;
}

const wstream_plan *wstream_get_plan(const wstream *ws)
{
    return &ws->plan;
}
