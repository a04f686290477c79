/* kvtier.c - host and disk KV tiers (see kvtier.h).
 *
 * Both tiers index their records with a kvidx (kvidx.h).  Host entry i
 * owns slab slot i; a disk entry names the file <hex key>.kvb.  Records in the host slab carry the full header; the
 * payload CRC is computed when a record goes to disk (the host copy never
 * leaves this process's memory), and checked on every disk read.  The
 * record format itself is kvrec.c; host slots whose device copy is still
 * in flight (kvtier_store_async) are kvpend.c's, and every path that reads
 * a host record's bytes seals it first (host_seal).
 */
#include "kv/kvtier.h"
#include "kv/kvidx.h"
#include "kv/kvpend.h"
#include "kv/kvrec.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

_Static_assert(KVIDX_KEY_BYTES == KVTIER_KEY_BYTES, "kvidx keys are tier keys");
#define KVTIER_NAME_LEN (2 * KVTIER_KEY_BYTES + 4) /* hex + ".kvb" */

/* ---- the tier object ---- */

enum { WQ_FREE = 0, WQ_QUEUED, WQ_WRITING, WQ_DONE };

typedef struct kvwq_slot {
    uint8_t key[KVTIER_KEY_BYTES]; /* set by the engine thread before QUEUED */
    uint8_t *rec;                  /* [record_bytes] */
    int state;                     /* WQ_*, under wmu */
    int err;                       /* errno of a failed write, at WQ_DONE */
    int through;                   /* engine thread: queued by kvtier_write_through */
} kvwq_slot;

struct kvtier {
    kvtier_config cfg;
    char *dir;               /* owned copy of cfg.disk_dir, or NULL */
    uint64_t payload_off, record_bytes;
    kvrec_geom g;            /* the record format's geometry (kvrec.h) */
    kvidx host;
    uint8_t *slab;           /* [host.cap][record_bytes] (from cfg.dma.alloc when set) */
    kvpend pend;             /* host slots whose copy is in flight (with cfg.dma.done) */
    kvidx disk;
    uint8_t *dver;           /* [disk.cap] entry's header checked (0: indexed by name
                                only at the scan; checked on first read or eviction) */
    int64_t scan_seen;       /* directory entries the scan has examined */
    int disk_on;
    int lock_fd;
    uint8_t *scratch;        /* [record_bytes] disk reads, the start-up scan and probe */
    DIR *scan;               /* the directory scan still under way (lazy part), or NULL */
    time_t scan_t0;          /* wall-clock second the tier opened (temp files older
                                than this are a dead process's) */
    kvcost cost;
    kvtier_stats st;
    /* disk writer thread: the engine thread queues records into wq; the
     * writer seals, writes, fsyncs and renames them; the engine thread
     * reaps finished slots into the disk index (disk_reap) */
    pthread_t writer;
    int writer_started;
    pthread_mutex_t wmu;     /* guards wq[].state / .err and wstop */
    pthread_cond_t wcv;      /* a slot was queued, finished, or wstop set */
    int wstop;
    int wpause;              /* tests: the writer takes no new slot */
    kvwq_slot wq[KVTIER_WRITE_QUEUE_MAX];     /* the first nwq are in use */
    uint8_t wq_busy[KVTIER_WRITE_QUEUE_MAX];  /* engine thread's view: queued, not reaped */
    int nwq;                 /* writer-queue records (kvtier_config.write_queue_bytes) */
    int32_t n_pending;       /* engine thread: busy slots */
    double deadline;         /* CLOCK_MONOTONIC seconds after which waiting writes
                                drop instead (0: none; kvtier_set_deadline) */
};

kvtier_config kvtier_config_default(void)
{
    kvtier_config c;
    memset(&c, 0, sizeof c);
    c.block_size = 16;
    c.disk_fsync = 1;
    c.scan_eager = KVTIER_SCAN_EAGER;
    c.scan_verify = KVTIER_SCAN_VERIFY;
    c.write_queue_bytes = KVTIER_WRITE_QUEUE_BYTES;
    return c;
}

/* ---- clock ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- disk tier ---- */

/* path = dir/<hex>.kvb, or with tmp: dir/.tmp.<hex>.kvb */
static void disk_path(const kvtier *t, const uint8_t *key, int tmp, char *path, size_t cap)
{
    char hex[2 * KVTIER_KEY_BYTES + 1];
    kvhash_hex(key, KVTIER_KEY_BYTES, hex);
    snprintf(path, cap, "%s/%s%s.kvb", t->dir, tmp ? ".tmp." : "", hex);
}

static void disk_disable(kvtier *t, const char *what, int e)
{
    if (!t->disk_on && t->st.disk_errors)
        return;
    t->disk_on = 0;
    t->st.disk_errors++;
    if (!t->cfg.quiet)
        fprintf(stderr, "kvant: KV disk tier disabled: %s %s: %s\n", what, t->dir ? t->dir : "",
                strerror(e));
}

static void disk_unlink(kvtier *t, int32_t id)
{
    char path[4096];
    disk_path(t, t->disk.e[id].key, 0, path, sizeof path);
    unlink(path);
    kvidx_remove(&t->disk, id);
}

static int read_all(int fd, uint8_t *p, uint64_t n)
{
    while (n > 0) {
        ssize_t r = read(fd, p, n > (1u << 30) ? (1u << 30) : (size_t)n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return r < 0 ? errno : EIO;
        p += r;
        n -= (uint64_t)r;
    }
    return 0;
}

/* Classifies the file at path, named for key: KVREC_OK (this model's record
 * of the right size and key), KVREC_FOREIGN (another model's or geometry's),
 * KVREC_CORRUPT (torn, unreadable, bad header); -1 when it no longer exists.
 * Reads the header and token ids into t->scratch. */
static int disk_classify(kvtier *t, const char *path, const uint8_t *key)
{
    uint64_t hb = KVTIER_HEADER_BYTES + 4u * (uint64_t)t->cfg.block_size;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT)
        return -1;
    struct stat sb;
    int ok = fd >= 0 && !fstat(fd, &sb) && S_ISREG(sb.st_mode) &&
             (uint64_t)sb.st_size >= hb && !read_all(fd, t->scratch, hb);
    if (fd >= 0)
        close(fd);
    int cls = ok ? kvrec_check_header(&t->g, t->scratch) : KVREC_CORRUPT;
    if (cls == KVREC_OK && ((uint64_t)sb.st_size != t->record_bytes ||
                          memcmp(t->scratch + 40, key, KVTIER_KEY_BYTES)))
        cls = KVREC_CORRUPT;
    return cls;
}

/* Checks the header of disk entry id if the scan indexed it by name only:
 * returns 1 when it is this model's record (now marked checked), else 0
 * with the entry gone from the index (a foreign file left alone and
 * counted, a corrupt one unlinked and counted, a vanished one forgotten). */
static int disk_verify(kvtier *t, int32_t id)
{
    if (t->dver[id])
        return 1;
    char path[4096];
    uint8_t key[KVTIER_KEY_BYTES];
    memcpy(key, t->disk.e[id].key, sizeof key);
    disk_path(t, key, 0, path, sizeof path);
    int cls = disk_classify(t, path, key);
    if (cls == KVREC_OK) {
        t->dver[id] = 1;
        return 1;
    }
    if (cls == KVREC_CORRUPT) {
        unlink(path);
        t->st.skipped_corrupt++;
    } else if (cls == KVREC_FOREIGN) {
        t->st.skipped_foreign++;
    }
    kvidx_remove(&t->disk, id);
    return 0;
}

/* Makes room: the least recently used disk record is unlinked (one whose
 * header was never checked is checked first: another model's file is only
 * dropped from the index). */
static void disk_evict_head(kvtier *t)
{
    int32_t id = t->disk.head;
    if (!disk_verify(t, id))
        return;
    disk_unlink(t, id);
    t->st.evictions[KVTIER_DISK]++;
}

static int write_all(int fd, const uint8_t *p, uint64_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : (size_t)n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? errno : ENOSPC;
        p += w;
        n -= (uint64_t)w;
    }
    return 0;
}

/* Writes rec (sealed here) as key's file: temporary name, fsync, rename.
 * Runs on the writer thread; touches only rec and immutable fields of t.
 * Returns 0 or an errno (the temporary file is removed). */
static int disk_write_file(const kvtier *t, const uint8_t *key, uint8_t *rec)
{
    kvrec_seal_payload(&t->g, rec);
    char tmp[4096], fin[4096];
    disk_path(t, key, 1, tmp, sizeof tmp);
    disk_path(t, key, 0, fin, sizeof fin);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return errno;
    int e = write_all(fd, rec, t->record_bytes);
    if (!e && t->cfg.disk_fsync && fsync(fd))
        e = errno;
    if (close(fd) && !e)
        e = errno;
    if (!e && rename(tmp, fin))
        e = errno;
    if (e)
        unlink(tmp);
    return e;
}

static void *disk_writer(void *arg)
{
    kvtier *t = arg;
    pthread_mutex_lock(&t->wmu);
    for (;;) {
        int k = -1;
        for (int i = 0; i < t->nwq && k < 0 && !t->wpause; i++)
            if (t->wq[i].state == WQ_QUEUED)
                k = i;
        if (k < 0) {
            if (t->wstop)
                break;
            pthread_cond_wait(&t->wcv, &t->wmu);
            continue;
        }
        kvwq_slot *w = &t->wq[k];
        w->state = WQ_WRITING;
        pthread_mutex_unlock(&t->wmu);
        int e = disk_write_file(t, w->key, w->rec);
        pthread_mutex_lock(&t->wmu);
        w->err = e;
        w->state = WQ_DONE;
        pthread_cond_broadcast(&t->wcv);
    }
    pthread_mutex_unlock(&t->wmu);
    return NULL;
}

/* Engine thread: takes finished writes into the disk index; a failed one
 * disables the disk tier. */
static void disk_reap(kvtier *t)
{
    if (t->n_pending == 0)
        return;
    int done[KVTIER_WRITE_QUEUE_MAX], err[KVTIER_WRITE_QUEUE_MAX], n = 0;
    pthread_mutex_lock(&t->wmu);
    for (int i = 0; i < t->nwq; i++)
        if (t->wq_busy[i] && t->wq[i].state == WQ_DONE) {
            done[n] = i;
            err[n++] = t->wq[i].err;
            t->wq[i].state = WQ_FREE;
        }
    pthread_mutex_unlock(&t->wmu);
    for (int j = 0; j < n; j++) {
        kvwq_slot *w = &t->wq[done[j]];
        t->wq_busy[done[j]] = 0;
        t->n_pending--;
        if (err[j]) {
            disk_disable(t, "cannot write a record to", err[j]);
            continue;
        }
        if (!t->disk_on || kvidx_find(&t->disk, w->key) >= 0)
            continue;
        int32_t id = kvidx_add(&t->disk, w->key); /* room was reserved at submit */
        if (id >= 0)
            t->dver[id] = 1;
        t->st.stores[KVTIER_DISK]++;
        t->st.store_bytes[KVTIER_DISK] += t->record_bytes;
        if (w->through) {
            t->st.wt_written++;
            t->st.wt_written_bytes += t->record_bytes;
        }
    }
}

/* Engine thread: waits for one write to finish, then reaps. */
static void disk_wait_one(kvtier *t)
{
    pthread_mutex_lock(&t->wmu);
    for (;;) {
        int any = 0;
        for (int i = 0; i < t->nwq; i++)
            any |= t->wq_busy[i] && t->wq[i].state == WQ_DONE;
        if (any)
            break;
        pthread_cond_wait(&t->wcv, &t->wmu);
    }
    pthread_mutex_unlock(&t->wmu);
    disk_reap(t);
}

static int past_deadline(const kvtier *t)
{
    return t->deadline > 0.0 && now_s() > t->deadline;
}

/* Busy queue slot holding key, or -1. */
static int wq_find(const kvtier *t, const uint8_t *key)
{
    for (int i = 0; i < t->nwq; i++)
        if (t->wq_busy[i] && !memcmp(t->wq[i].key, key, KVTIER_KEY_BYTES))
            return i;
    return -1;
}

/* Engine thread: a free queue slot for key, with room reserved in the disk
 * budget (least recently used records unlinked).  When the queue is full
 * it waits (wait != 0) or returns -1 (the write is dropped and counted:
 * the engine thread never waits on the disk). */
static int disk_slot(kvtier *t, const uint8_t *key, int wait)
{
    disk_reap(t);
    for (;;) {
        if (!t->disk_on)
            return -1;
        int k = -1;
        for (int i = 0; i < t->nwq && k < 0; i++)
            if (!t->wq_busy[i])
                k = i;
        if (k >= 0 && t->disk.count + t->n_pending < t->disk.cap) {
            memcpy(t->wq[k].key, key, KVTIER_KEY_BYTES);
            t->wq[k].through = 0;
            return k;
        }
        if (k >= 0 && t->disk.count > 0) {
            disk_evict_head(t);
            continue;
        }
        if (!wait || t->n_pending == 0 || past_deadline(t)) {
            t->st.disk_write_drops++;
            return -1;
        }
        disk_wait_one(t);
    }
}

static void disk_queue(kvtier *t, int k)
{
    t->wq_busy[k] = 1;
    t->n_pending++;
    pthread_mutex_lock(&t->wmu);
    t->wq[k].state = WQ_QUEUED;
    pthread_cond_broadcast(&t->wcv);
    pthread_mutex_unlock(&t->wmu);
}

/* Queues a copy of rec (a host record leaving the host tier) for disk. */
static void disk_write(kvtier *t, const uint8_t *key, const uint8_t *rec, int wait)
{
    if (!t->disk_on || kvidx_find(&t->disk, key) >= 0 || wq_find(t, key) >= 0)
        return;
    int k = disk_slot(t, key, wait);
    if (k < 0)
        return;
    memcpy(t->wq[k].rec, rec, t->record_bytes);
    disk_queue(t, k);
}

/* Reads and validates key's record into scratch; NULL on any failure (a
 * corrupt record is unlinked and counted; an I/O error disables the tier). */
static const uint8_t *disk_read(kvtier *t, int32_t id, const int32_t *tokens)
{
    if (!disk_verify(t, id))
        return NULL;
    char path[4096];
    uint8_t key[KVTIER_KEY_BYTES];
    memcpy(key, t->disk.e[id].key, sizeof key);
    disk_path(t, key, 0, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    int e = fd < 0 ? errno : 0;
    if (!e && fstat(fd, &sb))
        e = errno;
    int torn = !e && (uint64_t)sb.st_size != t->record_bytes;
    if (!e && !torn)
        e = read_all(fd, t->scratch, t->record_bytes);
    if (fd >= 0)
        close(fd);
    if (e == ENOENT) {        /* removed behind our back: a miss */
        kvidx_remove(&t->disk, id);
        return NULL;
    }
    if (e) {
        disk_disable(t, "cannot read a record from", e);
        return NULL;
    }
    const uint8_t *r = t->scratch;
    if (torn || kvrec_check_header(&t->g, r) != KVREC_OK || !kvrec_payload_ok(&t->g, r) ||
        memcmp(r + 40, key, KVTIER_KEY_BYTES)) {
        t->st.skipped_corrupt++;
        disk_unlink(t, id);
        return NULL;
    }
    if (!kvrec_matches(&t->g, r, key, tokens))
        return NULL; /* a key collision cannot be served: leave the record */
    return r;
}

/* Classifies one directory entry during the start-up scan.  A record
 * name is indexed; among the first cfg.scan_verify entries its header is
 * checked now (torn and corrupt records unlinked, other models' left
 * alone, both counted), past them it is indexed by name only and checked
 * on first read or eviction (disk_verify), so a large directory is ready
 * in one readdir.  lazy: the scan continues while the tier is in use
 * (kvtier_poll), so this run's own files may show up: a temporary file
 * newer than the tier's start is a write in progress, a vanished file was
 * evicted, and an indexed key is a record written since (or the same
 * one): all left alone. */
static void disk_scan_one(kvtier *t, const char *name, int lazy)
{
    char path[4096];
    int verify = t->scan_seen++ < t->cfg.scan_verify;
    snprintf(path, sizeof path, "%s/%s", t->dir, name);
    if (!strncmp(name, ".tmp.", 5)) { /* a write that never reached its rename */
        struct stat ts;
        if (lazy && (stat(path, &ts) || ts.st_mtime >= t->scan_t0 - 1))
            return;
        unlink(path);
        t->st.skipped_corrupt++;
        return;
    }
    if (name[0] == '.')
        return; /* ".", "..", ".lock" */
    uint8_t key[KVTIER_KEY_BYTES];
    if (strlen(name) != KVTIER_NAME_LEN || strcmp(name + 2 * KVTIER_KEY_BYTES, ".kvb") ||
        kvhash_unhex(name, KVTIER_KEY_BYTES, key)) {
        t->st.skipped_foreign++; /* not a record's name */
        return;
    }
    if (kvidx_find(&t->disk, key) >= 0)
        return; /* lazy: written by this run since the scan began */
    if (verify || t->disk.n_free == 0) { /* over budget: check before unlinking */
        int cls = disk_classify(t, path, key);
        if (cls < 0)
            return;
        if (cls == KVREC_FOREIGN) {
            t->st.skipped_foreign++;
            return;
        }
        if (cls == KVREC_CORRUPT) {
            unlink(path);
            t->st.skipped_corrupt++;
            return;
        }
        verify = 1;
    }
    int32_t id = kvidx_add(&t->disk, key);
    if (id < 0) { /* over this run's budget (checked above: ours) */
        unlink(path);
        t->st.evictions[KVTIER_DISK]++;
        return;
    }
    t->dver[id] = (uint8_t)verify;
}

/* Examines up to max entries of the open scan (lazy: see disk_scan_one);
 * closes it at the end of the directory. */
static void disk_scan_some(kvtier *t, int64_t max, int lazy)
{
    struct dirent *de = NULL;
    for (int64_t i = 0; i < max && (de = readdir(t->scan)); i++)
        disk_scan_one(t, de->d_name, lazy);
    if (!de) {
        closedir(t->scan);
        t->scan = NULL;
    }
}

/* The start-up scan: the first cfg.scan_eager entries now, the rest a
 * slice per kvtier_poll (a record not indexed yet is a miss meanwhile). */
static int disk_scan(kvtier *t)
{
    t->scan = opendir(t->dir);
    if (!t->scan)
        return errno;
    t->scan_t0 = time(NULL);
    disk_scan_some(t, t->cfg.scan_eager > 0 ? t->cfg.scan_eager : INT64_MAX, 0);
    return 0;
}

/* Measures the disk tier's write (incl. fsync) and read bandwidth with one
 * probe record; returns an errno, 0 on success. */
static int disk_probe(kvtier *t)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/.tmp.probe", t->dir);
    memset(t->scratch, 0x5a, t->record_bytes);
    double t0 = now_s();
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int e = fd < 0 ? errno : write_all(fd, t->scratch, t->record_bytes);
    if (!e && t->cfg.disk_fsync && fsync(fd))
        e = errno;
    double t1 = now_s();
    if (!e && lseek(fd, 0, SEEK_SET) < 0)
        e = errno;
    if (!e)
        e = read_all(fd, t->scratch, t->record_bytes);
    double t2 = now_s();
    if (fd >= 0)
        close(fd);
    unlink(path);
    if (!e) {
        t->cost.write_bps[KVTIER_DISK] = (double)t->record_bytes / (t1 - t0 > 1e-9 ? t1 - t0 : 1e-9);
        t->cost.read_bps[KVTIER_DISK] = (double)t->record_bytes / (t2 - t1 > 1e-9 ? t2 - t1 : 1e-9);
    }
    return e;
}

static void disk_open(kvtier *t)
{
    mkdir(t->dir, 0755);
    char path[4096];
    snprintf(path, sizeof path, "%s/.lock", t->dir);
    t->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (t->lock_fd < 0) {
        disk_disable(t, "cannot open", errno);
        return;
    }
    if (flock(t->lock_fd, LOCK_EX | LOCK_NB)) {
        disk_disable(t, "another process holds", errno);
        return;
    }
    t->disk_on = 1;
    int e = disk_scan(t);
    if (!e)
        e = disk_probe(t);
    if (e)
        disk_disable(t, "cannot use", e);
}

/* ---- host tier ---- */

static void host_probe(kvtier *t)
{
    uint8_t *a = t->slab, *b = t->slab + t->record_bytes;
    memset(a, 1, t->record_bytes);
    double t0 = now_s();
    for (int i = 0; i < 4; i++)
        memcpy(b, a, t->record_bytes);
    double dt = now_s() - t0;
    double bw = 4.0 * (double)t->record_bytes / (dt > 1e-9 ? dt : 1e-9);
    t->cost.read_bps[KVTIER_HOST] = t->cost.write_bps[KVTIER_HOST] = bw;
}

/* Seals host record id once its copy completed (wait: waits for it).
 * Returns 1 (sealed, or was), 0 (still in flight) or -1 (the copy failed:
 * the record is dropped). */
static void host_drop_failed(void *ctx, int32_t id)
{
    kvtier *t = ctx;
    t->st.skipped_corrupt++;
    kvidx_remove(&t->host, id);
}

static int host_seal(kvtier *t, int32_t id, int wait)
{
    int r = kvpend_seal(&t->pend, id, wait);
    if (r < 0)
        host_drop_failed(t, id);
    return r;
}

/* A free host slot, demoting the least recently used record to disk. */
static int32_t host_take_slot(kvtier *t, const uint8_t *key)
{
    if (t->host.n_free == 0) {
        int32_t v = t->host.head;
        if (host_seal(t, v, 1) > 0) { /* a failed copy is dropped (sealing did), not demoted */
            disk_write(t, t->host.e[v].key, t->slab + (uint64_t)v * t->record_bytes,
                       t->cfg.disk_wait);
            kvidx_remove(&t->host, v);
        }
        t->st.evictions[KVTIER_HOST]++;
    }
    return kvidx_add(&t->host, key);
}

/* ---- API ---- */

kvtier *kvtier_create(const kvtier_config *cfg, kvant_err *err)
{
    if (cfg->block_size < 1 || cfg->payload_bytes == 0) {
        kvant_err_set(err, KV_EINVAL, "kv tiers: block size %d, payload %llu bytes",
                      (int)cfg->block_size, (unsigned long long)cfg->payload_bytes);
        return NULL;
    }
    kvtier *t = calloc(1, sizeof *t);
    if (!t) {
        kvant_err_set(err, KV_ENOMEM, "kv tiers: out of memory");
        return NULL;
    }
    t->cfg = *cfg;
    t->cfg.disk_dir = NULL;
    t->lock_fd = -1;
    pthread_mutex_init(&t->wmu, NULL);
    pthread_cond_init(&t->wcv, NULL);
    t->payload_off = KVTIER_PAYLOAD_OFF(cfg->block_size);
    t->record_bytes = t->payload_off + cfg->payload_bytes;
    kvrec_geom_init(&t->g, cfg->fingerprint, cfg->block_size, cfg->kv_dtype,
                    cfg->payload_bytes);
    int want_disk = cfg->disk_dir && cfg->disk_dir[0];
    uint64_t n_host = cfg->host_bytes / t->record_bytes;
    uint64_t n_disk = want_disk ? cfg->disk_bytes / t->record_bytes : 0;
    if ((cfg->host_bytes && n_host < 2) || (want_disk && n_disk < 1)) {
        kvant_err_set(err, KV_EINVAL, "kv tiers: a %s budget of %llu bytes holds less than %s "
                      "of %llu bytes", n_host < 2 && cfg->host_bytes ? "host" : "disk",
                      (unsigned long long)(n_host < 2 && cfg->host_bytes ? cfg->host_bytes
                                                                        : cfg->disk_bytes),
                      n_host < 2 && cfg->host_bytes ? "two records" : "one record",
                      (unsigned long long)t->record_bytes);
        kvtier_destroy(t);
        return NULL;
    }
    uint64_t nq = cfg->write_queue_bytes / t->record_bytes;
    t->nwq = nq < KVTIER_WRITE_QUEUE ? KVTIER_WRITE_QUEUE
             : nq > KVTIER_WRITE_QUEUE_MAX ? KVTIER_WRITE_QUEUE_MAX : (int)nq;
    if (n_disk > KVTIER_MAX_DISK_RECORDS)
        n_disk = KVTIER_MAX_DISK_RECORDS;
    if (n_host > INT32_MAX / 4)
        n_host = INT32_MAX / 4;
    int rc = KV_OK;
    if (n_host) {
        const kvtier_dma *d = &cfg->dma;
        t->slab = d->alloc ? d->alloc(d->ctx, n_host * t->record_bytes)
                           : malloc(n_host * t->record_bytes);
        rc = t->slab && (!d->done || !kvpend_init(&t->pend, (int32_t)n_host, d->done, d->ctx))
                 ? kvidx_init(&t->host, (int32_t)n_host) : KV_ENOMEM;
    }
    if (!rc && want_disk) {
        t->dir = strdup(cfg->disk_dir);
        t->scratch = malloc(t->record_bytes);
        t->dver = calloc(n_disk, 1);
        rc = t->dir && t->scratch && t->dver ? kvidx_init(&t->disk, (int32_t)n_disk) : KV_ENOMEM;
        for (int i = 0; !rc && i < t->nwq; i++)
            if (!(t->wq[i].rec = malloc(t->record_bytes)))
                rc = KV_ENOMEM;
    }
    if (rc) {
        kvant_err_set(err, KV_ENOMEM, "kv tiers: out of memory for %llu host records",
                      (unsigned long long)n_host);
        kvtier_destroy(t);
        return NULL;
    }
    if (n_host)
        host_probe(t);
    if (want_disk)
        disk_open(t);
    if (t->disk_on) {
        if (pthread_create(&t->writer, NULL, disk_writer, t))
            disk_disable(t, "cannot start the writer thread for", EAGAIN);
        else
            t->writer_started = 1;
    }
    return t;
}

void kvtier_flush(kvtier *t)
{
    while (t->n_pending > 0)
        disk_wait_one(t);
}

void kvtier_poll(kvtier *t)
{
    if (t->pend.n_q > 0)
        kvpend_seal_some(&t->pend, host_drop_failed, t);
    disk_reap(t);
    if (t->scan && !t->disk_on) {
        closedir(t->scan);
        t->scan = NULL;
    }
    if (t->scan)
        disk_scan_some(t, KVTIER_SCAN_PER_POLL, 1);
}

void kvtier_pause_writer(kvtier *t, int paused)
{
    pthread_mutex_lock(&t->wmu);
    t->wpause = paused;
    pthread_cond_broadcast(&t->wcv);
    pthread_mutex_unlock(&t->wmu);
}

void kvtier_set_wait(kvtier *t, int wait)
{
    t->cfg.disk_wait = wait;
}

int kvtier_wait_one(kvtier *t)
{
    if (t->n_pending == 0 || past_deadline(t))
        return 0;
    disk_wait_one(t);
    return 1;
}

double kvtier_writer_cpu_seconds(const kvtier *t)
{
    clockid_t cid;
    struct timespec ts;
    if (!t->writer_started || pthread_getcpuclockid(t->writer, &cid) || clock_gettime(cid, &ts))
        return 0.0;
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void kvtier_set_deadline(kvtier *t, double seconds)
{
    t->deadline = seconds > 0.0 ? now_s() + seconds : 0.0;
}

void kvtier_destroy(kvtier *t)
{
    if (!t)
        return;
    /* a clean shutdown keeps the host tier: oldest first, so the disk's
     * LRU order continues the host's */
    while (t->host.count > 0 && (t->disk_on || t->pend.n_pend > 0)) {
        int32_t v = t->host.head;
        if (host_seal(t, v, 1) <= 0) /* no copy may land in freed memory */
            continue;
        if (t->disk_on)
            disk_write(t, t->host.e[v].key, t->slab + (uint64_t)v * t->record_bytes, 1);
        kvidx_remove(&t->host, v);
    }
    if (t->writer_started) {
        kvtier_pause_writer(t, 0);
        kvtier_flush(t);
        pthread_mutex_lock(&t->wmu);
        t->wstop = 1;
        pthread_cond_broadcast(&t->wcv);
        pthread_mutex_unlock(&t->wmu);
        pthread_join(t->writer, NULL);
    }
    if (t->scan)
        closedir(t->scan);
    if (t->lock_fd >= 0)
        close(t->lock_fd);
    kvidx_free(&t->host);
    kvidx_free(&t->disk);
    for (int i = 0; i < t->nwq; i++)
        free(t->wq[i].rec);
    pthread_mutex_destroy(&t->wmu);
    pthread_cond_destroy(&t->wcv);
    if (t->cfg.dma.alloc && t->slab)
        t->cfg.dma.free(t->cfg.dma.ctx, t->slab);
    else
        free(t->slab);
    kvpend_free(&t->pend);
    free(t->dver);
    free(t->scratch);
    free(t->dir);
    free(t);
}

/* Fills host record id: synchronously with fill, or queued with afill
 * (the record pending on its ticket).  Returns 0, or -1 (nothing queued). */
static int host_fill(kvtier *t, int32_t id, kvtier_fill_fn fill, kvtier_fill_async_fn afill,
                     void *ctx)
{
    uint8_t *pl = t->slab + (uint64_t)id * t->record_bytes + t->payload_off;
    kvpend_clear(&t->pend, id); /* a slot whose last copy failed, reused */
    if (!afill || !t->pend.tk)
        return fill(ctx, pl) ? -1 : 0;
    const int64_t tk = afill(ctx, pl);
    if (tk <= 0)
        return -1;
    kvpend_add(&t->pend, id, tk);
    return 0;
}

int kvtier_store(kvtier *t, const uint8_t key[KVTIER_KEY_BYTES], const int32_t *tokens,
                 kvtier_fill_fn fill, void *ctx)
{
    return kvtier_store_async(t, key, tokens, fill, NULL, ctx);
}

int kvtier_store_async(kvtier *t, const uint8_t key[KVTIER_KEY_BYTES], const int32_t *tokens,
                       kvtier_fill_fn fill, kvtier_fill_async_fn afill, void *ctx)
{
    if (t->host.cap) {
        int32_t id = kvidx_find(&t->host, key);
        if (id >= 0) {
            kvidx_touch(&t->host, id);
            return KVTIER_HOST;
        }
        id = host_take_slot(t, key);
        kvrec_write_header(&t->g, t->slab + (uint64_t)id * t->record_bytes, key, tokens);
        if (host_fill(t, id, fill, afill, ctx)) {
            kvidx_remove(&t->host, id);
            return KVTIER_NONE;
        }
        t->st.stores[KVTIER_HOST]++;
        t->st.store_bytes[KVTIER_HOST] += t->cfg.payload_bytes;
        return KVTIER_HOST;
    }
    disk_reap(t);
    if (!t->disk_on)
        return KVTIER_NONE;
    int32_t id = kvidx_find(&t->disk, key);
    if (id >= 0) {
        kvidx_touch(&t->disk, id);
        return KVTIER_DISK;
    }
    if (wq_find(t, key) >= 0)
        return KVTIER_DISK;
    int k = disk_slot(t, key, t->cfg.disk_wait);
    if (k < 0)
        return KVTIER_NONE;
    kvrec_write_header(&t->g, t->wq[k].rec, key, tokens);
    if (fill(ctx, t->wq[k].rec + t->payload_off))
        return KVTIER_NONE;
    disk_queue(t, k);
    return KVTIER_DISK;
}

int kvtier_write_through(kvtier *t, const uint8_t key[KVTIER_KEY_BYTES], const int32_t *tokens,
                         kvtier_fill_fn fill, void *ctx)
{
    disk_reap(t);
    if (!t->disk_on)
        return KVTIER_WT_OFF;
    int32_t id = kvidx_find(&t->disk, key);
    if (id >= 0 || wq_find(t, key) >= 0) {
        if (id >= 0)
            kvidx_touch(&t->disk, id); /* hot again: last in the disk's LRU */
        t->st.wt_dedup++;
        return KVTIER_WT_HELD;
    }
    int32_t hid = kvidx_find(&t->host, key);
    if (hid >= 0 && host_seal(t, hid, 0) < 0)
        hid = -1; /* its copy failed: export it again */
    if (t->n_pending >= t->nwq || (hid >= 0 && kvpend_is_pending(&t->pend, hid))) {
        t->st.wt_full++; /* the queue is full, or the host copy is still in flight */
        return KVTIER_WT_FULL;
    }
    int k = disk_slot(t, key, 0);
    if (k < 0)
        return t->disk_on ? KVTIER_WT_FULL : KVTIER_WT_OFF;
    uint8_t *rec = t->wq[k].rec;
    if (hid >= 0) { /* the host tier has the bytes: no export */
        memcpy(rec, t->slab + (uint64_t)hid * t->record_bytes, t->record_bytes);
    } else {
        kvrec_write_header(&t->g, rec, key, tokens);
        if (fill(ctx, rec + t->payload_off))
            return KVTIER_WT_OFF;
    }
    t->wq[k].through = 1;
    t->st.wt_queued++;
    disk_queue(t, k);
    return KVTIER_WT_QUEUED;
}

int kvtier_where(kvtier *t, const uint8_t key[KVTIER_KEY_BYTES])
{
    if (t->host.cap) {
        if (kvidx_find(&t->host, key) >= 0) {
            t->st.hits[KVTIER_HOST]++;
            return KVTIER_HOST;
        }
        t->st.misses[KVTIER_HOST]++;
    }
    disk_reap(t);
    if (t->disk_on) {
        if (kvidx_find(&t->disk, key) >= 0 || wq_find(t, key) >= 0) {
            t->st.hits[KVTIER_DISK]++;
            return KVTIER_DISK;
        }
        t->st.misses[KVTIER_DISK]++;
    }
    return KVTIER_NONE;
}

const void *kvtier_fetch(kvtier *t, const uint8_t key[KVTIER_KEY_BYTES], const int32_t *tokens)
{
    int32_t id = kvidx_find(&t->host, key);
    if (id >= 0 && host_seal(t, id, 1) < 0) /* nothing reads a pending record */
        id = -1;
    if (id >= 0) {
        const uint8_t *rec = t->slab + (uint64_t)id * t->record_bytes;
        if (kvrec_check_header(&t->g, rec) != KVREC_OK) {
            t->st.skipped_corrupt++;
            kvidx_remove(&t->host, id);
            return NULL;
        }
        if (!kvrec_matches(&t->g, rec, key, tokens))
            return NULL;
        kvidx_touch(&t->host, id);
        t->st.loads[KVTIER_HOST]++;
        t->st.load_bytes[KVTIER_HOST] += t->cfg.payload_bytes;
        return rec + t->payload_off;
    }
    if (!t->disk_on)
        return NULL;
    int k = wq_find(t, key);
    if (k >= 0) {
        /* still being written: serve the queued copy (the writer only
         * touches its header's checksum fields, never the payload) */
        if (!kvrec_matches(&t->g, t->wq[k].rec, key, tokens))
            return NULL;
        t->st.loads[KVTIER_DISK]++;
        t->st.load_bytes[KVTIER_DISK] += t->record_bytes;
        return t->wq[k].rec + t->payload_off;
    }
    if ((id = kvidx_find(&t->disk, key)) < 0)
        return NULL;
    const uint8_t *rec = disk_read(t, id, tokens);
    if (!rec)
        return NULL;
    kvidx_touch(&t->disk, id);
    t->st.loads[KVTIER_DISK]++;
    t->st.load_bytes[KVTIER_DISK] += t->record_bytes;
    return rec + t->payload_off;
}

void kvtier_get_cost(const kvtier *t, kvcost *out)
{
    *out = t->cost;
}

void kvtier_get_stats(const kvtier *t, kvtier_stats *out)
{
    *out = t->st;
    out->host_enabled = t->host.cap > 0;
    out->disk_enabled = t->disk_on;
    out->disk_scanning = t->scan != NULL;
    out->record_bytes = t->record_bytes;
    out->host_blocks = t->host.count;
    out->host_capacity_blocks = t->host.cap;
    out->host_pending = t->pend.n_pend;
    out->disk_blocks = t->disk.count;
    out->disk_capacity_blocks = t->disk_on ? t->disk.cap : 0;
    out->disk_pending = t->n_pending;
    out->disk_queue_records = t->dir ? t->nwq : 0;
}
