/* mem.h - the device memory manager: a budget for every device byte.
 *
 * Every allocation on the device path (weights, KV block pool, activation
 * workspace, scratch) goes through one mem_mgr per device, tagged with a
 * category and, where it applies, a layer index.  It tracks current and
 * peak bytes per category and in total, refuses any allocation that would
 * exceed the budget (KV_ENOMEM, never a crash), and has a test hook that
 * makes the Nth allocation fail.
 *
 * The bytes themselves come from a mem_allocator (host malloc for the CPU
 * backend, cudaMalloc for CUDA).  Accounting-only reservations cover memory
 * obtained elsewhere (mmap'd weights count as `weights` at mapped size,
 * pinned host memory as `pinned_host`, which the budget does not cover:
 * used, peak and mem_available leave it out; its own current/peak show it).
 *
 * Ownership: mem_create returns a heap handle freed by mem_destroy, which
 * frees nothing on the caller's behalf but reports leaks (mem_live_count).
 * Threading: all functions are thread-safe (one internal mutex); the engine
 * thread allocates, the metrics thread reads reports.
 */
#ifndef KVANT_MEM_H
#define KVANT_MEM_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

typedef enum mem_cat {
    MEM_WEIGHTS = 0,
    MEM_KV,
    MEM_ACTIVATIONS,
    MEM_WORKSPACE,
    MEM_OTHER,
    MEM_PINNED,     /* page-locked host memory a device backend copies through
                     * (cudaMallocHost: the KV host tier's slab, weight staging):
                     * accounted here, outside the device budget (not in used,
                     * never refused as over budget); reserved with mem_reserve
                     * by the backend that allocated it */
    MEM_DRAFT_WEIGHTS, /* a draft model's weights (speculative decoding): reserved
                        * by the engine for the draft's own manager */
    MEM_DRAFT_KV,      /* the draft model's KV pool, likewise */
    MEM_STATE,         /* hybrid models' recurrent state: live slots and prefix snapshots */
    MEM_CAT_COUNT
} mem_cat;

/* 1 when category c counts against the budget (every category but MEM_PINNED). */
static inline int mem_cat_in_budget(mem_cat c)
{
    return c != MEM_PINNED;
}

#define MEM_NO_LAYER (-1)
#define MEM_MAX_LAYERS 512   /* per-layer accounting slots */
#define MEM_MAX_POOLS 8      /* pools that report fragmentation */

typedef struct mem_allocator {
    /* Returns device memory of size bytes aligned to at least 64, or NULL. */
    void *(*alloc)(void *ctx, size_t size);
    void (*free)(void *ctx, void *ptr, size_t size);
    void *ctx;
} mem_allocator;

mem_allocator mem_allocator_host(void); /* aligned host malloc */

typedef struct mem_mgr mem_mgr;

/* budget: bytes kvant may use on this device (already times utilization);
 * 0 is KV_EINVAL.  The allocator is copied; its ctx is borrowed. */
mem_mgr *mem_create(uint64_t budget, mem_allocator a, kvant_err *err);
void mem_destroy(mem_mgr *m);

/* Allocates size bytes tagged (cat, layer); NULL + KV_ENOMEM in err when
 * over budget, when the allocator fails, or when the fail hook fires (the
 * message gives the bytes asked, the category and the bytes left).  NULL +
 * KV_EINVAL for size 0, a bad category, or layer outside
 * [0, MEM_MAX_LAYERS) other than MEM_NO_LAYER.  A refusal changes nothing
 * (except advancing the fail-nth countdown).  May grow the internal record
 * table (a host malloc); mem_free never allocates.
 * mem_free of a pointer not from this manager is a programmer error
 * (KV_ASSERT). */
void *mem_alloc(mem_mgr *m, size_t size, mem_cat cat, int layer, kvant_err *err);
void mem_free(mem_mgr *m, void *ptr); /* NULL is a no-op */

/* Accounting-only reservation (e.g. mmap'd weights). Returns an id > 0,
 * or a negative status (same rules as mem_alloc).  mem_unreserve of an id
 * <= 0 is a no-op; of an unknown positive id, a programmer error. */
int64_t mem_reserve(mem_mgr *m, uint64_t size, mem_cat cat, int layer, kvant_err *err);
void mem_unreserve(mem_mgr *m, int64_t id);
/* A reservation of memory the caller mapped itself at addr (e.g. the CPU
 * backend's KV pool, a range of address space it commits as it grows):
 * as mem_reserve, but mem_resident_bytes counts its resident pages
 * (mincore over [addr, addr + size)) instead of its size. */
int64_t mem_reserve_at(mem_mgr *m, const void *addr, uint64_t size, mem_cat cat, int layer,
                       kvant_err *err);
/* Changes reservation id's size in place (its address, category and layer
 * stay).  Growing is admitted like a new reservation of the difference
 * (KV_ENOMEM over budget or from the fail hook, the message naming the
 * bytes); shrinking always succeeds; size 0 is KV_EINVAL.  A refusal
 * changes nothing.  An unknown id is a programmer error. */
int mem_reserve_resize(mem_mgr *m, int64_t id, uint64_t size, kvant_err *err);

void mem_reset_peak(mem_mgr *m);
uint64_t mem_budget(const mem_mgr *m);
uint64_t mem_used(const mem_mgr *m);       /* current total */
uint64_t mem_available(const mem_mgr *m);  /* budget - used */
size_t mem_live_count(const mem_mgr *m);   /* outstanding allocations + reservations */
/* Of mem_used, the bytes resident in memory: with the host allocator, the
 * pages of each allocation that are resident (mincore: a buffer never
 * touched counts 0); reservations (mapped weights) and other allocators
 * count in full.  Takes the lock; O(allocations + pages). */
uint64_t mem_resident_bytes(const mem_mgr *m);
/* The same by category (out[c]: of category c's current bytes, those
 * resident); mem_resident_bytes is their sum.  Same cost and locking. */
void mem_resident_by_cat(const mem_mgr *m, uint64_t out[MEM_CAT_COUNT]);

/* A pool (e.g. the KV block pool) reports its free-extent shape. */
typedef struct mem_pool_stats {
    const char *name;
    uint64_t total_bytes;
    uint64_t free_bytes;
    uint64_t largest_free_extent;
} mem_pool_stats;
/* Called by mem_get_report on the reporting thread with the manager's
 * mutex held: it must not call back into this mem_mgr, and it must be safe
 * to call from that thread.  out is zeroed first; name may stay NULL. */
typedef void (*mem_pool_stats_fn)(void *ctx, mem_pool_stats *out);
/* KV_OK, KV_EINVAL (fn NULL) or KV_ERANGE (MEM_MAX_POOLS already). ctx is
 * borrowed until mem_unregister_pool with the same (fn, ctx). */
int mem_register_pool(mem_mgr *m, mem_pool_stats_fn fn, void *ctx);
void mem_unregister_pool(mem_mgr *m, mem_pool_stats_fn fn, void *ctx);

/* Test hook: the n-th allocation or reservation from now (1 = the next)
 * fails with KV_ENOMEM; 0 disables.  One-shot.  Requests rejected as
 * KV_EINVAL do not count; requests over budget do. */
void mem_fail_nth(mem_mgr *m, uint64_t n);

typedef struct mem_cat_stats {
    uint64_t current;
    uint64_t peak;
} mem_cat_stats;

typedef struct mem_report {
    uint64_t budget;
    uint64_t used;
    uint64_t peak;
    mem_cat_stats cat[MEM_CAT_COUNT];
    int n_layers;                        /* highest layer index seen + 1 */
    uint64_t layer_bytes[MEM_MAX_LAYERS][MEM_CAT_COUNT];
    int n_pools;
    mem_pool_stats pools[MEM_MAX_POOLS];
    double fragmentation[MEM_MAX_POOLS]; /* 1 - largest_free / free, 0 when nothing free */
    int has_resident;                    /* resident[] filled (mem_resident_by_cat after
                                          * mem_get_report); mem_get_report leaves it 0 */
    uint64_t resident[MEM_CAT_COUNT];    /* of cat[c].current, the bytes in RAM */
} mem_report;

/* Fills a snapshot (report is large: allocate it, do not put it on a
 * small stack). */
void mem_get_report(const mem_mgr *m, mem_report *out);
/* JSON form of a report; malloc'd string the caller frees. */
char *mem_report_json(const mem_report *r);

const char *mem_cat_name(mem_cat c);

/* Parses "123", "512M", "4G", "4Gi", "1.5GiB" (K/M/G/T = 1000^n,
 * Ki/Mi/Gi/Ti = 1024^n, optional trailing B; letters case-insensitive;
 * no spaces, no sign, no exponent; a fraction rounds down to whole bytes).
 * KV_EINVAL on garbage, negatives or overflow; *out untouched on error.
 * "0" parses as 0: callers that need a budget reject 0 themselves
 * (mem_create does). */
int mem_parse_size(const char *s, uint64_t *out, kvant_err *err);
/* Formats bytes as "1.23 GiB" into buf. */
const char *mem_format_size(uint64_t bytes, char *buf, size_t cap);
/* Host RAM available to kvant (MemAvailable from /proc/meminfo, else
 * sysconf available pages; 0 if neither is known). */
uint64_t mem_host_available(void);

#endif
