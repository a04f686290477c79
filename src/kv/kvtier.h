/* kvtier.h - KV offload tiers under the device pool: a host-memory tier
 * and a disk tier, one record format for both, and the cost model that
 * decides between loading a block and recomputing it.
 *
 * A record is one KV block: a 128-byte header, the block's token ids, and
 * the payload (every layer's K and V rows in the KV dtype, exactly as the
 * backend's kv_export_block writes them), so a move is one copy:
 *
 *   off  size  field (little-endian)
 *     0     4  magic "KVTB"
 *     4     2  version (1)            6  2  header bytes (128)
 *     8    32  model fingerprint (SHA-256, see engine_tier.c)
 *    40    32  block key: SHA-256(parent key | salt | token ids); the first
 *              block's parent is the fingerprint (kvhash_chain_key)
 *    72     4  tokens per block       76  4  KV dtype
 *    80     8  payload bytes
 *    88     4  payload CRC32C         92  4  flags (1: payload CRC valid)
 *    96    28  zero
 *   124     4  header CRC32C over bytes [0, 124) and the token ids
 *   128  4*bs  token ids (int32)
 *   KVTIER_PAYLOAD_OFF(bs): payload (64-byte aligned)
 *
 * A hit is served only if the fingerprint, key, geometry and stored token
 * ids all equal the request's, and (disk) both CRCs check.  Anything else
 * is a miss, counted, never served.
 *
 * Tiers: the host tier is a fixed slab of records (allocated once, LRU);
 * the disk tier is one file per record, <hex key>.kvb in the directory,
 * written to a temporary name, fsync'd and renamed (a record being written
 * is never visible under its final name), indexed at create by scanning
 * headers, LRU-evicted (unlinked) under its byte budget.  A store that
 * needs a host slot demotes the least recently used host record to disk.
 * Disk writes run on a writer thread owned by the tier: the caller copies
 * the record into one of the writer queue's buffers and goes on (a full
 * queue drops the write and counts it; a record still queued is served
 * from its buffer); finished writes enter the index at the next call.
 * Write-through (kvtier_write_through): the engine offers each block as
 * soon as it is hashed; a key already on disk or queued is not written
 * again (counted), a full queue answers KVTIER_WT_FULL at once (counted;
 * the engine keeps the block and offers it again at a later step), so a
 * record reaches disk while its block is still hot and survives a kill.
 * Start-up indexes the directory by file name: the first cfg.scan_verify
 * entries have their header checked at once, the rest on first read or
 * eviction (a large directory is ready after one readdir).
 * A disk write or read error (disk full, read-only, I/O error) disables the
 * disk tier for the rest of the run with one log line; nothing fails.
 * One process per directory (an flock on <dir>/.lock; a second process
 * runs without a disk tier).
 *
 * Pinned slab and asynchronous stores (kvtier_config.dma, a device
 * backend): the slab comes from dma.alloc (page-locked memory the device
 * copies into directly) and kvtier_store_async queues the block's copy
 * into its slot instead of waiting for it.  Such a record is pending: it
 * is indexed (kvtier_where finds it) but nothing reads it until it is
 * sealed, which happens once dma.done reports its ticket complete: at
 * kvtier_poll (without waiting, oldest first), or, waiting, when it is
 * fetched, demoted to disk, written through or the tier is destroyed.  A
 * write-through offer of a pending record answers KVTIER_WT_FULL (offer it
 * again later).  A failed copy drops the record (counted as corrupt).
 *
 * Ownership: kvtier_create returns a heap handle (kvtier_destroy).
 * Threading: not thread-safe; one thread (the engine's) makes every call;
 * the writer thread is internal.  Stats are copied out by the engine under
 * its own lock.
 */
#ifndef KVANT_KVTIER_H
#define KVANT_KVTIER_H

#include <stddef.h>
#include <stdint.h>

#include "kv/kvcost.h"
#include "kv/kvhash.h"
#include "kv/kvrec.h"
#include "util/err.h"

#define KVTIER_KEY_BYTES KVREC_KEY_BYTES       /* 32 */
#define KVTIER_HEADER_BYTES KVREC_HEADER_BYTES /* 128 */
#define KVTIER_VERSION KVREC_VERSION           /* 1 */
/* Largest number of records a disk tier indexes (bounds its index). */
#define KVTIER_MAX_DISK_RECORDS (1 << 22)
/* Records queued for the disk writer thread: each a record-sized buffer
 * allocated at create, outside the host budget; write_queue_bytes of them,
 * at least KVTIER_WRITE_QUEUE and at most KVTIER_WRITE_QUEUE_MAX records. */
#define KVTIER_WRITE_QUEUE 16
#define KVTIER_WRITE_QUEUE_MAX 256
#define KVTIER_WRITE_QUEUE_BYTES (64ull << 20)
#define KVTIER_PAYLOAD_OFF(bs) KVREC_PAYLOAD_OFF(bs)

/* Bytes of one record holding a block of bs tokens and payload bytes. */
#define KVTIER_RECORD_BYTES(bs, payload) (KVTIER_PAYLOAD_OFF(bs) + (uint64_t)(payload))

typedef struct kvtier kvtier;

/* Directory entries indexed at create (names: about 1 us each); the rest
 * KVTIER_SCAN_PER_POLL per kvtier_poll. */
#define KVTIER_SCAN_EAGER (1 << 20)
#define KVTIER_SCAN_PER_POLL 64 /* per engine step while the scan lasts */
/* Entries whose header the scan checks (about 50 ms of header reads from
 * the page cache); later records are checked on first read or eviction. */
#define KVTIER_SCAN_VERIFY 4096

/* A device backend's pinned memory and copy tickets (all NULL: a malloc'd
 * slab, stores copy synchronously).  ctx is borrowed: it must outlive the
 * tier. */
typedef struct kvtier_dma {
    void *ctx;
    void *(*alloc)(void *ctx, size_t bytes); /* the host slab, or NULL */
    void (*free)(void *ctx, void *p);
    /* 1 when ticket's copy completed (wait != 0: after waiting for it), 0
     * while in flight, -1 when it failed.  Tickets complete in issue order. */
    int (*done)(void *ctx, int64_t ticket, int wait);
} kvtier_dma;

typedef struct kvtier_config {
    uint8_t fingerprint[KVTIER_KEY_BYTES];
    int32_t block_size;       /* tokens per block */
    uint32_t kv_dtype;
    uint64_t payload_bytes;   /* one block: every layer's K and V */
    uint64_t host_bytes;      /* host tier budget; 0 = no host tier */
    const char *disk_dir;     /* NULL or "" = no disk tier (copied) */
    uint64_t disk_bytes;      /* disk tier budget */
    int disk_fsync;           /* fsync each record before rename (default 1) */
    int disk_wait;            /* a full writer queue waits instead of dropping
                                 the write (tests, shutdown; default 0) */
    int quiet;                /* no log lines on stderr (tests) */
    int64_t scan_eager;       /* directory entries scanned at create; the rest
                                 KVTIER_SCAN_PER_POLL per kvtier_poll (default
                                 KVTIER_SCAN_EAGER; <= 0: all at create) */
    int64_t scan_verify;      /* entries whose header the scan checks (default
                                 KVTIER_SCAN_VERIFY; later ones by name only) */
    uint64_t write_queue_bytes; /* writer queue buffers (default
                                 KVTIER_WRITE_QUEUE_BYTES; see KVTIER_WRITE_QUEUE) */
    kvtier_dma dma;           /* pinned slab and async stores (default: none) */
} kvtier_config;

kvtier_config kvtier_config_default(void);

/* Allocates the host slab and, with a disk directory, creates it if needed,
 * takes its lock, scans it and measures tier bandwidth.  A disk directory
 * that cannot be used is not an error: the disk tier starts disabled (log
 * line, kvtier_stats.disk_errors).  Returns NULL with err filled for bad
 * configuration (KV_EINVAL: a budget smaller than one record) or KV_ENOMEM. */
kvtier *kvtier_create(const kvtier_config *cfg, kvant_err *err);
/* Writes the host tier's records to the disk tier (when it has one), then
 * frees everything.  NULL is a no-op. */
void kvtier_destroy(kvtier *t);

/* Block keys: kvhash_chain_key (kvhash.h). */

/* Writes one block's payload (payload_bytes) to dst; returns 0 on success. */
typedef int (*kvtier_fill_fn)(void *ctx, void *dst);

/* Stores a block leaving the device into the highest tier that has one
 * (host, else disk).  A key already held is refreshed, not rewritten.
 * Returns the tier stored to, or KVTIER_NONE (no tier, fill failed, disk
 * disabled). */
int kvtier_store(kvtier *t, const uint8_t key[KVTIER_KEY_BYTES], const int32_t *tokens,
                 kvtier_fill_fn fill, void *ctx);

/* Queues the copy of one block's payload (payload_bytes) into dst and
 * returns its ticket (> 0, asked about with dma.done), or -1. */
typedef int64_t (*kvtier_fill_async_fn)(void *ctx, void *dst);

/* kvtier_store, but into the host tier the copy is queued with afill and
 * the record stays pending until its ticket completes (see above).
 * Without a host tier or without dma.done it is kvtier_store with fill. */
int kvtier_store_async(kvtier *t, const uint8_t key[KVTIER_KEY_BYTES], const int32_t *tokens,
                       kvtier_fill_fn fill, kvtier_fill_async_fn afill, void *ctx);

enum { KVTIER_WT_QUEUED = 0, KVTIER_WT_HELD = 1, KVTIER_WT_FULL = 2, KVTIER_WT_OFF = 3 };

/* Write-through of a block still on the device: queues its record for the
 * disk (the payload copied by fill, or from the host tier when it holds
 * the key) and returns KVTIER_WT_QUEUED; KVTIER_WT_HELD when the disk holds
 * key or it is queued (nothing written, the disk record refreshed);
 * KVTIER_WT_FULL when the writer queue is full (offer it again later);
 * KVTIER_WT_OFF with no disk tier (or fill failed).  Never waits. */
int kvtier_write_through(kvtier *t, const uint8_t key[KVTIER_KEY_BYTES], const int32_t *tokens,
                         kvtier_fill_fn fill, void *ctx);

/* The highest tier holding key (index lookup only: no I/O), or KVTIER_NONE.
 * Counts a hit in that tier and a miss in each tier above it. */
int kvtier_where(kvtier *t, const uint8_t key[KVTIER_KEY_BYTES]);

/* Returns the validated payload of key (payload_bytes, valid until the
 * next call on t), or NULL if it is absent or fails validation (then the
 * record is dropped and counted as corrupt).  tokens: the request's token
 * ids for this block, compared with the stored ones. */
const void *kvtier_fetch(kvtier *t, const uint8_t key[KVTIER_KEY_BYTES], const int32_t *tokens);

/* Takes finished disk writes into the index and seals the host records
 * whose copies have completed (cheap, never waits; once per engine step). */
void kvtier_poll(kvtier *t);
/* Waits until every queued disk write has finished (tests, shutdown). */
void kvtier_flush(kvtier *t);
/* Waits for one queued disk write to finish; 0 (no wait) when none is
 * queued or the deadline (kvtier_set_deadline) has passed. */
int kvtier_wait_one(kvtier *t);
/* CPU time the disk writer thread has used (0 without one). */
double kvtier_writer_cpu_seconds(const kvtier *t);
/* Tests: while paused the writer starts no write (queued records stay
 * queued, so the queue-full and served-from-queue paths are testable). */
void kvtier_pause_writer(kvtier *t, int paused);
/* Sets kvtier_config.disk_wait (the engine sets it before shutting down). */
void kvtier_set_wait(kvtier *t, int wait);
/* From seconds from now on, a write that would wait for the queue is
 * dropped (counted) instead: bounds the shutdown flush (0: no limit). */
void kvtier_set_deadline(kvtier *t, double seconds);

/* The tier bandwidths measured at create (prefill_tps left 0). */
void kvtier_get_cost(const kvtier *t, kvcost *out);

/* ---- stats ---- */

typedef struct kvtier_stats {
    int host_enabled, disk_enabled;
    uint64_t record_bytes;
    int64_t host_blocks, host_capacity_blocks;
    int64_t host_pending;          /* of host_blocks, records whose copy is in flight */
    int64_t disk_blocks, disk_capacity_blocks;
    uint64_t hits[KVTIER_N], misses[KVTIER_N];           /* by tier ([0] unused) */
    uint64_t store_bytes[KVTIER_N], load_bytes[KVTIER_N];
    uint64_t stores[KVTIER_N], loads[KVTIER_N];
    uint64_t evictions[KVTIER_N];  /* host: demoted or dropped; disk: unlinked */
    uint64_t skipped_foreign;      /* another model's records, foreign files */
    uint64_t skipped_corrupt;      /* torn, bad magic/CRC, token mismatch */
    uint64_t disk_errors;          /* I/O errors (each disables the disk tier) */
    uint64_t disk_write_drops;     /* writes dropped: the writer queue was full */
    uint64_t wt_queued;            /* write-through records queued */
    uint64_t wt_written, wt_written_bytes; /* of them, on disk (renamed) */
    uint64_t wt_dedup;             /* write-through offers already on disk or queued */
    uint64_t wt_full;              /* write-through offers that found the queue full */
    int32_t disk_pending;          /* writes queued or in progress */
    int32_t disk_queue_records;    /* the writer queue's size in records */
    int disk_scanning;             /* the start-up scan is still under way */
} kvtier_stats;

void kvtier_get_stats(const kvtier *t, kvtier_stats *out);

#endif
