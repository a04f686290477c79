/* offload_cost.c - measured rates and predicted pass times for weight
 * offload (see offload_cost.h). */
#include "engine/offload_cost.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend_select.h"
#include "kernels/dtype.h"

static const int32_t k_batch[OCOST_N_BUCKETS] = {1, 8, 32, 128, 512};

#define OCOST_READ_PROBE (256ull << 20) /* bytes read to time the page cache */
#define OCOST_READ_CHUNK (4u << 20)      /* as the stream's chunks (model/wstream.c) */
#define OCOST_CACHE_BUST (128ull << 20)  /* matrix copies cycled per timing */
#define OCOST_MAX_COPIES 64
#define OCOST_MIN_TIME 0.2               /* seconds per timing, at least */
#define OCOST_SAMPLES 3                  /* timings per rate, alternating; the median counts */
#define OCOST_READ_PASSES 5              /* page-cache passes: one to warm, the median of the rest */

static int oc_cmp(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n), n >= 1 (sorts v). */
static double oc_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, oc_cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double oc_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the cache file ---- */

static void cache_path(char *out, size_t cap)
{
    const char *d = getenv("KVANT_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"),
               *h = getenv("HOME");
    out[0] = 0;
    if (d && d[0])
        snprintf(out, cap, "%s/offload-rates", d);
    else if (x && x[0])
        snprintf(out, cap, "%s/kvant/offload-rates", x);
    else if (h && h[0])
        snprintf(out, cap, "%s/.cache/kvant/offload-rates", h);
}

static void mkdir_parents(const char *path)
{
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        (void)mkdir(tmp, 0755);
        *p = '/';
    }
}

/* The key of m's rates: no spaces (the path's are replaced). */
static int cache_key(const model *m, int n_threads, char *key, size_t cap)
{
    struct stat st;
    if (stat(m->path, &st) != 0)
        return -1;
    int k = snprintf(key, cap, "%s|%lld|%lld|t%d|%s|v2", m->path, (long long)st.st_size,
                     (long long)st.st_mtime, n_threads, dtype_isa());
    for (int i = 0; i < k && key[i]; i++)
        if (key[i] == ' ' || key[i] == '\n')
            key[i] = '_';
    return 0;
}

static int cache_read(const char *path, const char *key, ocost_rates *r)
{
    FILE *f = path[0] ? fopen(path, "r") : NULL;
    if (!f)
        return -1;
    char line[4096], k[1024];
    int found = -1;
    while (fgets(line, sizeof line, f)) {
        ocost_rates t = *r;
        int pos = 0, ok = sscanf(line, "%1023s %lf %lf%n", k, &t.read_bps, &t.direct_bps,
                                 &pos) == 3 && t.direct_bps >= 0;
        for (int i = 0; ok && i < OCOST_N_BUCKETS; i++) {
            int adv = 0;
            ok = sscanf(line + pos, " %lf %lf %lf %lf%n", &t.compute_bps[i],
                        &t.compute_conc_bps[i], &t.read_conc_bps[i], &t.other_s[i], &adv) == 4 &&
                 t.compute_bps[i] > 0 && t.compute_conc_bps[i] > 0 && t.read_conc_bps[i] > 0 &&
                 t.other_s[i] >= 0;
            pos += adv;
        }
        if (ok && !strcmp(k, key) && t.read_bps > 0) {
            *r = t;
            found = 0;
        }
    }
    fclose(f);
    return found;
}

static void cache_write(const char *path, const char *key, const ocost_rates *r)
{
    if (!path[0])
        return;
    mkdir_parents(path);
    FILE *f = fopen(path, "a");
    if (!f)
        return;
    fprintf(f, "%s %.6g %.6g", key, r->read_bps, r->direct_bps);
    for (int i = 0; i < OCOST_N_BUCKETS; i++)
        fprintf(f, " %.6g %.6g %.6g %.6g", r->compute_bps[i], r->compute_conc_bps[i],
                r->read_conc_bps[i], r->other_s[i]);
    fputc('\n', f);
    fclose(f);
}

/* ---- measuring ---- */

/* pread of up to OCOST_READ_PROBE bytes of the tensor data,
 * OCOST_READ_PASSES times; the first warms the page cache, the median of
 * the others counts (on a shared machine a single timing may fall in a
 * busy or an idle moment). */
static int measure_read(const model *m, double *bps, kvant_err *err)
{
    int fd = open(m->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kvant_err_set(err, KV_EIO, "%s: %s", m->path, strerror(errno));
    const uint64_t start = m->tok_embd.file_off, size = gguf_file_size(m->gguf);
    uint64_t n = size > start ? size - start : 0;
    n = n < OCOST_READ_PROBE ? n : OCOST_READ_PROBE;
    /* into a buffer as large as what is read, as the stream writes a
     * layer-sized slot: a small buffer would stay in the caches */
    char *buf = malloc(n ? n : 1);
    double rate[OCOST_READ_PASSES];
    int n_rate = 0;
    for (int pass = 0; buf && pass < OCOST_READ_PASSES; pass++) {
        const double t0 = oc_now();
        uint64_t done = 0;
        while (done < n) {
            size_t want = n - done < OCOST_READ_CHUNK ? (size_t)(n - done) : OCOST_READ_CHUNK;
            ssize_t r = pread(fd, buf + done, want, (off_t)(start + done));
            if (r <= 0)
                break;
            done += (uint64_t)r;
        }
        const double dt = oc_now() - t0;
        if (pass > 0 && done == n && n > 0 && dt > 0)
            rate[n_rate++] = (double)done / dt;
    }
    free(buf);
    close(fd);
    if (n_rate == 0)
        return kvant_err_set(err, KV_EIO, "%s: cannot time reads", m->path);
    *bps = oc_median(rate, n_rate);
    return KV_OK;
}

/* Two threads claiming OCOST_READ_CHUNK chunks of one range in turn, as
 * the stream's reader and the forward pass do with O_DIRECT. */
typedef struct dio_probe {
    int fd;
    char *buf;         /* [n], WSTREAM_DIO_ALIGN-aligned */
    uint64_t start, n; /* aligned */
    atomic_ullong next, done;
} dio_probe;

static void *dio_main(void *arg)
{
    dio_probe *d = arg;
    for (;;) {
        const uint64_t off = atomic_fetch_add(&d->next, OCOST_READ_CHUNK);
        if (off >= d->n)
            return NULL;
        const size_t want = d->n - off < OCOST_READ_CHUNK ? (size_t)(d->n - off)
                                                          : OCOST_READ_CHUNK;
        ssize_t r = pread(d->fd, d->buf + off, want, (off_t)(d->start + off));
        if (r != (ssize_t)want)
            return NULL; /* done stays short: the pass does not count */
        atomic_fetch_add(&d->done, (uint64_t)r);
    }
}

/* The end of the last layer's data in the file. */
static uint64_t layers_end(const model *m)
{
    model_tensor *ts[MODEL_LAYER_TENSORS];
    const int n = model_layer_tensors(&m->layers[m->hp.n_layers - 1], ts);
    uint64_t end = 0;
    for (int i = 0; i < n; i++)
        if (ts[i]->data && ts[i]->file_off + ts[i]->nbytes > end)
            end = ts[i]->file_off + ts[i]->nbytes;
    return end;
}

/* O_DIRECT reads of up to OCOST_READ_PROBE bytes ending with the last
 * layer (the layers streamed first: what a stream reads, which on a
 * virtual disk may be cached below the guest) into an aligned buffer by
 * two threads (dio_probe), OCOST_SAMPLES times; the median counts (the
 * page cache plays no part).  0 where the filesystem refuses O_DIRECT. */
static double measure_direct(const model *m)
{
    const uint64_t a = WSTREAM_DIO_ALIGN;
    const uint64_t first = m->tok_embd.file_off / a * a, last = layers_end(m) / a * a;
    dio_probe d = {.fd = -1};
    d.n = last > first ? last - first : 0;
    d.n = d.n < OCOST_READ_PROBE ? d.n : OCOST_READ_PROBE;
    d.start = last - d.n;
    d.fd = open(m->path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    void *buf = NULL;
    double rate[OCOST_SAMPLES];
    int n_rate = 0;
    if (d.fd < 0 || d.n == 0 || posix_memalign(&buf, a, d.n) != 0) {
        if (d.fd >= 0)
            close(d.fd);
        return 0;
    }
    d.buf = buf;
    for (int pass = 0; pass < OCOST_SAMPLES; pass++) {
        atomic_store(&d.next, 0);
        atomic_store(&d.done, 0);
        const double t0 = oc_now();
        pthread_t th;
        const int two = pthread_create(&th, NULL, dio_main, &d) == 0;
        dio_main(&d);
        if (two)
            pthread_join(th, NULL);
        const double dt = oc_now() - t0;
        if (atomic_load(&d.done) == d.n && dt > 0)
            rate[n_rate++] = (double)d.n / dt;
    }
    free(buf);
    close(d.fd);
    return n_rate ? oc_median(rate, n_rate) : 0;
}

typedef struct mm_rig {
    mem_mgr *mem;
    backend *be;
    void *w, *x, *y;
    float *z;          /* [nmax][n_ff] SwiGLU output */
    float *norm;       /* [n_embd] RMS norm weights (ones) */
    int n_copies;      /* copies of the matrix, back to back in w */
    model_tensor t, tn;
    int64_t n_embd, n_ff;
} mm_rig;

static void rig_free(mm_rig *g)
{
    if (g->be) {
        g->be->ops->free(g->be, g->w);
        g->be->ops->free(g->be, g->x);
        g->be->ops->free(g->be, g->y);
        g->be->ops->free(g->be, g->z);
        g->be->ops->free(g->be, g->norm);
        g->be->ops->destroy(g->be);
    }
    mem_destroy(g->mem);
}

/* Seconds of a layer's work besides its matmuls at n tokens, as the
 * forward pass runs it (forward/forward.c run_layer): two RMS norms, SwiGLU
 * and two residual adds, each a backend job (median of 5 after a warm-up). */
static double time_other(mm_rig *g, int32_t n)
{
    const backend_ops *op = g->be->ops;
    backend *be = g->be;
    float *x = g->x, *h = g->y, *gate = g->y, *up = g->y;
    const int64_t ne = (int64_t)n * g->n_embd, nf = (int64_t)n * g->n_ff;
    double v[6];
    for (int i = 0; i < 6; i++) {
        const double t0 = oc_now();
        op->rmsnorm(be, x, &g->tn, 1e-5f, h, n);
        op->add(be, h, x, ne);
        op->rmsnorm(be, x, &g->tn, 1e-5f, h, n);
        op->swiglu(be, gate, up, g->z, nf);
        op->add(be, h, x, ne);
        op->sync(be);
        v[i] = oc_now() - t0;
    }
    /* v[0] is the warm-up: the median of v[1..5] */
    for (int i = 1; i < 6; i++)
        for (int j = i + 1; j < 6; j++)
            if (v[j] < v[i]) {
                const double s = v[i];
                v[i] = v[j];
                v[j] = s;
            }
    return v[3];
}

/* Weight bytes per second of matmuls with n tokens, cycling through the
 * copies (one warm-up call, then at least OCOST_MIN_TIME and, below 32
 * tokens, where the weights' trip from memory is the cost, every copy). */
static double time_matmuls(mm_rig *g, int32_t n)
{
    model_tensor t = g->t;
    t.dev = g->w;
    g->be->ops->matmul(g->be, &t, NULL, g->x, g->y, n);
    uint64_t bytes = 0;
    const double t0 = oc_now();
    double dt = 0;
    const int min_calls = n < 32 ? g->n_copies : 1;
    for (int i = 0; i < min_calls || dt < OCOST_MIN_TIME; i++) {
        t.dev = (uint8_t *)g->w + (size_t)(i % g->n_copies) * g->t.nbytes;
        g->be->ops->matmul(g->be, &t, NULL, g->x, g->y, n);
        g->be->ops->sync(g->be);
        bytes += g->t.nbytes;
        dt = oc_now() - t0;
    }
    return (double)bytes / (dt > 1e-9 ? dt : 1e-9);
}

#define OCOST_SIDE_BUF (64u << 20) /* the side reader's destination, cycled */

typedef struct side_reader {
    int fd;
    uint64_t start, len;
    char *buf; /* [OCOST_SIDE_BUF] */
    atomic_int stop;
    uint64_t bytes;
    double secs;
} side_reader;

/* The stream's access pattern: chunks of OCOST_READ_CHUNK, cycling. */
static void *side_main(void *arg)
{
    side_reader *r = arg;
    const double t0 = oc_now();
    uint64_t off = 0;
    while (!atomic_load(&r->stop)) {
        size_t want = r->len - off < OCOST_READ_CHUNK ? (size_t)(r->len - off) : OCOST_READ_CHUNK;
        ssize_t got = pread(r->fd, r->buf + off % (OCOST_SIDE_BUF - OCOST_READ_CHUNK), want,
                            (off_t)(r->start + off));
        if (got <= 0)
            break;
        r->bytes += (uint64_t)got;
        off = off + (uint64_t)got >= r->len ? 0 : off + (uint64_t)got;
    }
    r->secs = oc_now() - t0;
    return NULL;
}

static int rig_open(mm_rig *g, const model *m, int n_threads, kvant_err *err)
{
    g->t = m->layers[0].w_gate;
    g->n_embd = m->hp.n_embd;
    g->n_ff = m->layers[0].n_ff;
    const int32_t nmax = k_batch[OCOST_N_BUCKETS - 1];
    const int64_t wide = g->n_ff > g->n_embd ? g->n_ff : g->n_embd;
    const uint64_t xb = (uint64_t)nmax * (uint64_t)g->t.ne[0] * sizeof(float),
                   yb = (uint64_t)nmax * (uint64_t)(g->t.ne[1] > wide ? g->t.ne[1] : wide) *
                        sizeof(float),
                   zb = (uint64_t)nmax * (uint64_t)g->n_ff * sizeof(float),
                   nb = (uint64_t)g->n_embd * sizeof(float);
    g->n_copies = (int)((OCOST_CACHE_BUST + g->t.nbytes - 1) / g->t.nbytes);
    g->n_copies = g->n_copies < 1 ? 1 : g->n_copies > OCOST_MAX_COPIES ? OCOST_MAX_COPIES
                                                                      : g->n_copies;
    const uint64_t wb = g->t.nbytes * (uint64_t)g->n_copies;
    g->mem = mem_create(wb + xb + yb + zb + nb + (256ull << 20), mem_allocator_host(), err);
    if (g->mem)
        g->be = backend_create("cpu", 0, g->mem, n_threads, 0, err);
    if (!g->be)
        return KV_ENOMEM;
    g->w = g->be->ops->alloc(g->be, wb, MEM_WEIGHTS, 0, err);
    g->x = g->be->ops->alloc(g->be, xb, MEM_ACTIVATIONS, MEM_NO_LAYER, err);
    g->y = g->be->ops->alloc(g->be, yb, MEM_ACTIVATIONS, MEM_NO_LAYER, err);
    g->z = g->be->ops->alloc(g->be, zb, MEM_ACTIVATIONS, MEM_NO_LAYER, err);
    g->norm = g->be->ops->alloc(g->be, nb, MEM_WEIGHTS, MEM_NO_LAYER, err);
    if (!g->w || !g->x || !g->y || !g->z || !g->norm)
        return KV_ENOMEM;
    for (int64_t i = 0; i < g->n_embd; i++)
        g->norm[i] = 1.0f;
    g->tn = (model_tensor){.type = DT_F32, .ne = {g->n_embd, 1}, .nbytes = nb,
                           .row_bytes = (size_t)nb, .data = g->norm, .dev = g->norm, .layer = 0};
    int fd = open(m->path, O_RDONLY | O_CLOEXEC);
    ssize_t got = fd >= 0 ? pread(fd, g->w, g->t.nbytes, (off_t)g->t.file_off) : -1;
    if (fd >= 0)
        close(fd);
    if (got != (ssize_t)g->t.nbytes)
        return kvant_err_set(err, KV_EIO, "%s: cannot read layer 0", m->path);
    for (int i = 1; i < g->n_copies; i++)
        memcpy((uint8_t *)g->w + (size_t)i * g->t.nbytes, g->w, g->t.nbytes);
    float *x = g->x, *y = g->y;
    for (uint64_t i = 0; i < xb / sizeof(float); i++)
        x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    for (uint64_t i = 0; i < yb / sizeof(float); i++)
        y[i] = (float)((i * 40503u) % 1000) / 1000.0f - 0.5f;
    g->t.packed = 0;
    g->t.streamed = 0;
    return KV_OK;
}

/* Each bucket alone, then with a reader thread side by side. */
static int measure_compute(const model *m, int n_threads, ocost_rates *r, kvant_err *err)
{
    mm_rig g = {0};
    side_reader sr = {.fd = -1};
    int rc = rig_open(&g, m, n_threads, err);
    if (!rc) {
        sr.fd = open(m->path, O_RDONLY | O_CLOEXEC);
        sr.buf = malloc(OCOST_SIDE_BUF);
        sr.start = m->tok_embd.file_off;
        const uint64_t size = gguf_file_size(m->gguf);
        sr.len = size > sr.start ? size - sr.start : 0;
        sr.len = sr.len < OCOST_READ_PROBE ? sr.len : OCOST_READ_PROBE;
        if (sr.fd < 0 || !sr.buf || sr.len == 0)
            rc = kvant_err_set(err, KV_EIO, "%s: cannot read", m->path);
    }
    /* per bucket, OCOST_SAMPLES rounds of alone then side by side: the
     * medians count, so that a burst of other work on a shared machine
     * moves one sample, not the rate */
    for (int k = 0; !rc && k < OCOST_N_BUCKETS; k++) {
        double alone[OCOST_SAMPLES], conc[OCOST_SAMPLES], rd[OCOST_SAMPLES];
        r->other_s[k] = time_other(&g, k_batch[k]);
        for (int s = 0; !rc && s < OCOST_SAMPLES; s++) {
            alone[s] = time_matmuls(&g, k_batch[k]);
            pthread_t th;
            atomic_store(&sr.stop, 0);
            sr.bytes = 0;
            if (pthread_create(&th, NULL, side_main, &sr)) {
                rc = kvant_err_set(err, KV_ENOMEM, "cannot start a thread");
                break;
            }
            conc[s] = time_matmuls(&g, k_batch[k]);
            atomic_store(&sr.stop, 1);
            pthread_join(th, NULL);
            rd[s] = sr.secs > 0 ? (double)sr.bytes / sr.secs : 0;
            if (!(rd[s] > 0))
                rc = kvant_err_set(err, KV_EIO, "%s: cannot time reads", m->path);
        }
        if (!rc) {
            r->compute_bps[k] = oc_median(alone, OCOST_SAMPLES);
            r->compute_conc_bps[k] = oc_median(conc, OCOST_SAMPLES);
            r->read_conc_bps[k] = oc_median(rd, OCOST_SAMPLES);
        }
    }
    if (sr.fd >= 0)
        close(sr.fd);
    free(sr.buf);
    rig_free(&g);
    return rc;
}

int ocost_rates_get(model *m, int n_threads, int mode, ocost_rates *out, kvant_err *err)
{
    memset(out, 0, sizeof *out);
    memcpy(out->batch, k_batch, sizeof k_batch);
    if (m->hp.n_layers < 1)
        return kvant_err_set(err, KV_EINVAL, "model has no layers");
    if (n_threads <= 0) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = nc > 0 ? (int)nc : 1;
    }
    char key[1200];
    cache_path(out->cache_path, sizeof out->cache_path);
    const int keyed = cache_key(m, n_threads, key, sizeof key) == 0;
    if (keyed && mode != OCOST_REMEASURE && cache_read(out->cache_path, key, out) == 0) {
        out->from_cache = 1;
        return KV_OK;
    }
    if (mode == OCOST_CACHE_ONLY)
        return kvant_err_set(err, KV_EBUSY, "no cached rates for this model, threads and ISA");
    int rc = measure_read(m, &out->read_bps, err);
    out->direct_bps = rc ? 0 : measure_direct(m);
    if (!rc)
        rc = measure_compute(m, n_threads, out, err);
    if (!rc && keyed)
        cache_write(out->cache_path, key, out);
    return rc;
}

/* ---- prediction ---- */

/* Alone and side-by-side rates at n tokens: interpolated linearly in n
 * between buckets (in seconds per byte), growing with n past the last. */
typedef struct oc_at {
    double c_alone, c_conc; /* seconds per weight byte */
    double r_conc;          /* bytes per second */
    double other;           /* seconds of a layer's non-matmul work */
} oc_at;

static oc_at rates_at(const ocost_rates *r, int32_t n)
{
    oc_at a;
    int k = 0;
    double f = 0, scale = 1;
    if (n > r->batch[OCOST_N_BUCKETS - 1]) {
        k = OCOST_N_BUCKETS - 2;
        f = 1;
        scale = (double)n / (double)r->batch[OCOST_N_BUCKETS - 1];
    } else if (n > r->batch[0]) {
        while (k + 2 < OCOST_N_BUCKETS && n > r->batch[k + 1])
            k++;
        f = (double)(n - r->batch[k]) / (double)(r->batch[k + 1] - r->batch[k]);
    }
    const int k1 = k + 1 < OCOST_N_BUCKETS ? k + 1 : k;
    a.c_alone = scale * ((1 - f) / r->compute_bps[k] + f / r->compute_bps[k1]);
    a.c_conc = scale * ((1 - f) / r->compute_conc_bps[k] + f / r->compute_conc_bps[k1]);
    a.r_conc = (1 - f) * r->read_conc_bps[k] + f * r->read_conc_bps[k1];
    a.other = scale * ((1 - f) * r->other_s[k] + f * r->other_s[k1]);
    return a;
}

#define OC_PASSES 3

/* The read and compute rates of a read mode (see offload_cost.h). */
typedef struct oc_mode {
    double r_alone, r_conc; /* bytes per second: reading alone, beside compute */
    double c_slow;          /* compute speed beside reads, as a share of alone */
} oc_mode;

static oc_mode mode_rates(const ocost_rates *r, const oc_at *a, int io_mode)
{
    const double d = r->direct_bps;
    /* compute beside reads is never faster than alone: a side-by-side rate
     * measured above the alone one is noise, and would predict a streamed
     * pass faster than the resident one */
    const double slow = a->c_conc > a->c_alone ? a->c_alone / a->c_conc : 1.0;
    if (io_mode == WSTREAM_IO_DIRECT && d > 0)
        return (oc_mode){d, d, 1.0};
    if (io_mode == WSTREAM_IO_BOTH && d > 0)
        return (oc_mode){r->read_bps + d, a->r_conc + d, slow};
    return (oc_mode){r->read_bps, a->r_conc, slow};
}

/* The ri-th streamed layer in forward order. */
static int32_t nth_streamed(const wstream_plan *p, uint64_t ri)
{
    int32_t k = (int32_t)(ri % (uint64_t)p->n_streamed);
    for (int32_t j = 0; j < p->n_layers; j++)
        if (p->place[j] == WPLACE_STREAMED && k-- == 0)
            return j;
    return 0;
}

void ocost_predict(const wstream_plan *p, const model *m, const ocost_rates *r, int io_mode,
                   int32_t n_tokens, int32_t n_out, ocost_pred *out)
{
    memset(out, 0, sizeof *out);
    out->n_tokens = n_tokens;
    const model_tensor *head = m->tied_output ? &m->tok_embd : &m->output;
    const oc_at at = rates_at(r, n_tokens), at_head = rates_at(r, n_out > 0 ? n_out : 1);
    const oc_mode md = mode_rates(r, &at, io_mode), md_head = mode_rates(r, &at_head, io_mode);
    const int32_t L = p->n_layers, per_pass = L + 1; /* + the output head */
    const uint64_t n_reads = (uint64_t)p->n_streamed * OC_PASSES;
    /* compute side: task ci (layer ci % per_pass of pass ci / per_pass),
     * work left in seconds at the alone speed */
    int64_t ci = 0;
    uint64_t computed_streamed = 0; /* streamed layers done = slots released */
    double c_left = -1;
    /* read side: seq ri, bytes left */
    uint64_t ri = 0, read_done = 0;
    double r_left = -1;
    double t = 0, pass_start = 0, stall = 0, read_busy = 0;
    int32_t streamed_seen = 0; /* streamed layers before task ci in its pass */
    while (ci < (int64_t)per_pass * OC_PASSES) {
        const int32_t il = (int32_t)(ci % per_pass);
        const int streamed = il < L && p->place[il] == WPLACE_STREAMED;
        const double c_work = il < L ? (double)p->layer_bytes[il] * at.c_alone + at.other
                                     : (double)head->nbytes * at_head.c_alone;
        if (c_left < 0)
            c_left = c_work;
        const uint64_t my_seq = (uint64_t)(ci / per_pass) * (uint64_t)p->n_streamed +
                                (uint64_t)streamed_seen;
        const int c_run = !streamed || read_done > my_seq;
        const int r_run = ri < n_reads && ri < computed_streamed + (uint64_t)p->n_slots;
        if (r_run && r_left < 0)
            r_left = (double)p->layer_bytes[nth_streamed(p, ri)];
        const oc_mode *a = il < L ? &md : &md_head;
        const double c_speed = c_run && r_run ? a->c_slow : 1.0; /* alone-seconds per second */
        const double r_rate = c_run && r_run ? a->r_conc : a->r_alone;
        double dt = 1e300;
        if (c_run)
            dt = c_left / c_speed;
        if (r_run && r_left / r_rate < dt)
            dt = r_left / r_rate;
        if (!c_run && !r_run)
            break; /* cannot happen: a blocked compute waits on a runnable read */
        t += dt;
        if (!c_run)
            stall += dt;
        if (r_run) {
            read_busy += dt;
            r_left -= r_rate * dt;
            if (r_left <= 1e-6 * (double)p->slot_bytes + 1e-9) {
                read_done++;
                ri++;
                r_left = -1;
            }
        }
        if (c_run) {
            c_left -= c_speed * dt;
            if (c_left <= 1e-6 * c_work + 1e-12) {
                c_left = -1;
                if (streamed) {
                    computed_streamed++;
                    streamed_seen++;
                }
                ci++;
                if (ci % per_pass == 0) {
                    streamed_seen = 0;
                    if (ci < (int64_t)per_pass * OC_PASSES) {
                        pass_start = t;
                        stall = read_busy = 0;
                    }
                }
            }
        }
    }
    out->pass_s = t - pass_start;
    out->tok_s = out->pass_s > 0 ? (double)n_tokens / out->pass_s : 0;
    out->read_s = read_busy;
    out->stall_s = stall;
}

int ocost_place(const model *m, uint64_t cap, int n_slots, int place, const ocost_rates *r,
                int io_mode, wstream_plan *p, ocost_choice *ch, kvant_err *err)
{
    memset(ch, 0, sizeof *ch);
    if (place > 0) { /* asked for: no prediction needed */
        ch->order = place - 1;
        return wstream_plan_make_order(m, cap, n_slots, ch->order, p, err);
    }
    int rc = wstream_plan_make_order(m, cap, n_slots, WSTREAM_ORDER_TAIL, p, err);
    if (rc || p->n_streamed == 0 || p->n_streamed == p->n_layers)
        return rc; /* nothing to choose: an error, all resident, or all streamed */
    ch->order = OCOST_DEFAULT_ORDER;
    if (!r) {
        if (ch->order != WSTREAM_ORDER_TAIL)
            rc = wstream_plan_make_order(m, cap, n_slots, ch->order, p, err);
        return rc;
    }
    ch->by_cost = 1;
    wstream_plan cand[WSTREAM_ORDER_COUNT];
    double pass[WSTREAM_ORDER_COUNT] = {0};
    for (int o = 0; o < WSTREAM_ORDER_COUNT; o++) {
        if (o == WSTREAM_ORDER_TAIL) /* placed above */
            cand[o] = *p;
        else if ((rc = wstream_plan_make_order(m, cap, n_slots, o, &cand[o], err)))
            return rc;
        ocost_pred d;
        ocost_predict(&cand[o], m, r, io_mode, 1, 1, &d);
        ch->tok_s[o] = d.tok_s;
        pass[o] = d.pass_s;
    }
    /* off the default only when over 1% faster (predictions within that are ties) */
    for (int o = 0; o < WSTREAM_ORDER_COUNT; o++)
        if (pass[o] < 0.99 * pass[ch->order])
            ch->order = o;
    *p = cand[ch->order];
    return KV_OK;
}

const char *ocost_place_name(int place)
{
    return place <= 0 ? "auto" : wstream_order_name(place - 1);
}

int ocost_place_parse(const char *s)
{
    if (!strcmp(s, "auto"))
        return 0;
    const int o = wstream_order_parse(s);
    return o < 0 ? -1 : o + 1;
}

int ocost_place_cached(model *m, int n_threads, uint64_t cap, int n_slots, int place,
                       int io_mode, wstream_plan *p, ocost_choice *ch, kvant_err *err)
{
    ocost_rates r;
    kvant_err e2 = {0};
    const int have = place <= 0 && !ocost_rates_get(m, n_threads, OCOST_CACHE_ONLY, &r, &e2);
    return ocost_place(m, cap, n_slots, place, have ? &r : NULL, io_mode, p, ch, err);
}

void ocost_choice_print(const ocost_choice *ch, int place, const wstream_plan *p)
{
    static const char *const how[WSTREAM_ORDER_COUNT] = {"the last layers", "layers spread "
                                                         "over the depth"};
    if (!p->n_streamed || p->n_streamed == p->n_layers)
        return;
    if (ch->by_cost)
        fprintf(stderr, "kvant: weight offload streams %s: predicted decode %.2f tok/s (%s: "
                "%.2f tok/s; --weights-place sets it)\n", how[ch->order], ch->tok_s[ch->order],
                how[!ch->order], ch->tok_s[!ch->order]);
    else if (place > 0)
        fprintf(stderr, "kvant: weight offload streams %s (--weights-place %s)\n", how[ch->order],
                ocost_place_name(place));
    else
        fprintf(stderr, "kvant: weight offload streams %s (no measured rates cached to compare the "
                "orders; 'kvant plan --weights-memory ...' measures them)\n", how[ch->order]);
}
