/* offload_cost.c - measured rates and predicted pass times for weight
 * offload (see offload_cost.h). */
#include "engine/offload_cost.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "kernels/dtype.h"

static const int32_t k_batch[OCOST_N_BUCKETS] = {1, 8, 32, 128, 512};

#define OCOST_READ_PROBE (256ull << 20) /* bytes read to time the page cache */
#define OCOST_READ_CHUNK (8u << 20)

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
    int k = snprintf(key, cap, "%s|%lld|%lld|t%d|%s", m->path, (long long)st.st_size,
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
    char line[2048], k[1024];
    int found = -1;
    while (fgets(line, sizeof line, f)) {
        ocost_rates t = *r;
        if (sscanf(line, "%1023s %lf %lf %lf %lf %lf %lf", k, &t.read_bps, &t.compute_bps[0],
                   &t.compute_bps[1], &t.compute_bps[2], &t.compute_bps[3],
                   &t.compute_bps[4]) == 7 &&
            !strcmp(k, key) && t.read_bps > 0) {
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
    fprintf(f, "%s %.6g %.6g %.6g %.6g %.6g %.6g\n", key, r->read_bps, r->compute_bps[0],
            r->compute_bps[1], r->compute_bps[2], r->compute_bps[3], r->compute_bps[4]);
    fclose(f);
}

/* ---- measuring ---- */

/* pread of up to OCOST_READ_PROBE bytes of the tensor data, twice; the
 * second (page cache) pass is timed. */
static int measure_read(const model *m, double *bps, kvant_err *err)
{
    int fd = open(m->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kvant_err_set(err, KV_EIO, "%s: %s", m->path, strerror(errno));
    const uint64_t start = m->tok_embd.file_off, size = gguf_file_size(m->gguf);
    uint64_t n = size > start ? size - start : 0;
    n = n < OCOST_READ_PROBE ? n : OCOST_READ_PROBE;
    char *buf = malloc(OCOST_READ_CHUNK);
    double best = 0;
    for (int pass = 0; buf && pass < 3; pass++) {
        const double t0 = oc_now();
        uint64_t done = 0;
        while (done < n) {
            size_t want = n - done < OCOST_READ_CHUNK ? (size_t)(n - done) : OCOST_READ_CHUNK;
            ssize_t r = pread(fd, buf, want, (off_t)(start + done));
            if (r <= 0)
                break;
            done += (uint64_t)r;
        }
        const double dt = oc_now() - t0;
        if (pass > 0 && dt > 0 && (double)done / dt > best)
            best = (double)done / dt;
    }
    free(buf);
    close(fd);
    if (!(best > 0))
        return kvant_err_set(err, KV_EIO, "%s: cannot time reads", m->path);
    *bps = best;
    return KV_OK;
}

typedef struct mm_rig {
    mem_mgr *mem;
    backend *be;
    void *w, *x, *y;
    model_tensor t;
} mm_rig;

static void rig_free(mm_rig *g)
{
    if (g->be) {
        g->be->ops->free(g->be, g->w);
        g->be->ops->free(g->be, g->x);
        g->be->ops->free(g->be, g->y);
        g->be->ops->destroy(g->be);
    }
    mem_destroy(g->mem);
}

/* Layer 0's FFN gate as stored, timed per bucket (best of 3 after a warm-up). */
static int measure_compute(const model *m, int n_threads, ocost_rates *r, kvant_err *err)
{
    mm_rig g = {0};
    g.t = m->layers[0].w_gate;
    const int32_t nmax = k_batch[OCOST_N_BUCKETS - 1];
    const uint64_t xb = (uint64_t)nmax * (uint64_t)g.t.ne[0] * sizeof(float),
                   yb = (uint64_t)nmax * (uint64_t)g.t.ne[1] * sizeof(float);
    int rc = KV_ENOMEM;
    g.mem = mem_create(g.t.nbytes + xb + yb + (256ull << 20), mem_allocator_host(), err);
    if (g.mem)
        g.be = backend_create("cpu", 0, g.mem, n_threads, 0, err);
    if (!g.be)
        goto out;
    g.w = g.be->ops->alloc(g.be, g.t.nbytes, MEM_WEIGHTS, 0, err);
    g.x = g.be->ops->alloc(g.be, xb, MEM_ACTIVATIONS, MEM_NO_LAYER, err);
    g.y = g.be->ops->alloc(g.be, yb, MEM_ACTIVATIONS, MEM_NO_LAYER, err);
    if (!g.w || !g.x || !g.y)
        goto out;
    int fd = open(m->path, O_RDONLY | O_CLOEXEC);
    ssize_t got = fd >= 0 ? pread(fd, g.w, g.t.nbytes, (off_t)g.t.file_off) : -1;
    if (fd >= 0)
        close(fd);
    if (got != (ssize_t)g.t.nbytes) {
        rc = kvant_err_set(err, KV_EIO, "%s: cannot read layer 0", m->path);
        goto out;
    }
    float *x = g.x;
    for (uint64_t i = 0; i < xb / sizeof(float); i++)
        x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    g.t.dev = g.w;
    g.t.packed = 0;
    g.t.streamed = 0;
    for (int k = 0; k < OCOST_N_BUCKETS; k++) {
        double best = 1e30;
        for (int rep = 0; rep < 4; rep++) {
            const double t0 = oc_now();
            g.be->ops->matmul(g.be, &g.t, NULL, g.x, g.y, k_batch[k]);
            g.be->ops->sync(g.be);
            const double dt = oc_now() - t0;
            if (rep > 0 && dt < best)
                best = dt;
        }
        r->compute_bps[k] = (double)g.t.nbytes / (best > 1e-9 ? best : 1e-9);
    }
    rc = KV_OK;
out:
    rig_free(&g);
    return rc;
}

int ocost_rates_get(model *m, int n_threads, int remeasure, ocost_rates *out, kvant_err *err)
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
    if (keyed && !remeasure && cache_read(out->cache_path, key, out) == 0) {
        out->from_cache = 1;
        return KV_OK;
    }
    int rc = measure_read(m, &out->read_bps, err);
    if (!rc)
        rc = measure_compute(m, n_threads, out, err);
    if (!rc && keyed)
        cache_write(out->cache_path, key, out);
    return rc;
}

/* ---- prediction ---- */

/* Seconds to run bytes of weights over n tokens: between buckets the time
 * is interpolated linearly in n; past the last it grows with n. */
static double compute_s(const ocost_rates *r, uint64_t bytes, int32_t n)
{
    if (n <= r->batch[0])
        return (double)bytes / r->compute_bps[0];
    for (int k = 0; k + 1 < OCOST_N_BUCKETS; k++) {
        if (n <= r->batch[k + 1]) {
            const double a = (double)bytes / r->compute_bps[k],
                         b = (double)bytes / r->compute_bps[k + 1];
            const double f = (double)(n - r->batch[k]) / (double)(r->batch[k + 1] - r->batch[k]);
            return a + (b - a) * f;
        }
    }
    const int32_t last = r->batch[OCOST_N_BUCKETS - 1];
    return (double)bytes / r->compute_bps[OCOST_N_BUCKETS - 1] * (double)n / (double)last;
}

void ocost_predict(const wstream_plan *p, const model *m, const ocost_rates *r, int32_t n_tokens,
                   int32_t n_out, ocost_pred *out)
{
    memset(out, 0, sizeof *out);
    out->n_tokens = n_tokens;
    const model_tensor *head = m->tied_output ? &m->tok_embd : &m->output;
    double slot_free[WSTREAM_MAX_SLOTS] = {0};
    double reader = 0, t = 0, pass_start = 0, stall = 0, read_busy = 0;
    uint64_t seq = 0;
    for (int pass = 0; pass < 3; pass++) {
        pass_start = t;
        stall = read_busy = 0;
        for (int32_t il = 0; il < p->n_layers; il++) {
            const double c = compute_s(r, p->layer_bytes[il], n_tokens);
            if (p->place[il] == WPLACE_STREAMED) {
                const int s = (int)(seq++ % (uint64_t)p->n_slots);
                const double rd = (double)p->layer_bytes[il] / r->read_bps;
                const double start = reader > slot_free[s] ? reader : slot_free[s];
                reader = start + rd;
                read_busy += rd;
                if (reader > t) {
                    stall += reader - t;
                    t = reader;
                }
                t += c;
                slot_free[s] = t;
            } else {
                t += c;
            }
        }
        t += compute_s(r, head->nbytes, n_out > 0 ? n_out : 1);
    }
    out->pass_s = t - pass_start;
    out->tok_s = out->pass_s > 0 ? (double)n_tokens / out->pass_s : 0;
    out->read_s = read_busy;
    out->stall_s = stall;
}
