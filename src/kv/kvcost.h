/* kvcost.h - the KV offload tiers' decisions, as pure functions: load a
 * block from a tier or recompute it, swap a preempted sequence or
 * recompute it (from measured bandwidths and the engine's prefill rate),
 * and how much host RAM the host tier may take.
 *
 * Threading: none (pure functions over the caller's data).
 */
#ifndef KVANT_KVCOST_H
#define KVANT_KVCOST_H

#include <stdint.h>

#include "util/err.h"

/* The tiers, top down (kvtier.h stores into and indexes by them). */
enum { KVTIER_NONE = 0, KVTIER_HOST = 1, KVTIER_DISK = 2, KVTIER_N = 3 };

/* ---- host tier against RAM ---- */

#define KVCOST_HOST_AUTO UINT64_MAX        /* kv_host_memory "auto" */
#define KVCOST_HOST_MARGIN (512ull << 20)  /* RAM left to the OS and the rest of kvant */
#define KVCOST_HOST_AUTO_PCT 50            /* auto: this share of the RAM left */

/* The host tier's bytes for want (bytes, or KVCOST_HOST_AUTO) on a host
 * with avail bytes available (MemAvailable; 0 = unknown) and weights
 * bytes of weights that live in host RAM.  room = avail - weights -
 * KVCOST_HOST_MARGIN; want > room is refused (KV_EINVAL, the numbers in
 * the message); auto is KVCOST_HOST_AUTO_PCT % of room (KV_EINVAL when
 * that is 0 or avail is unknown).  Pure. */
int kvcost_host_fit(uint64_t want, uint64_t avail, uint64_t weights, uint64_t *out,
                    kvant_err *err);

/* ---- cost model ---- */

typedef struct kvcost {
    double prefill_tps;             /* engine's measured prompt tokens/s; 0 = unknown */
    double read_bps[KVTIER_N];      /* bytes/s into the device, per tier */
    double write_bps[KVTIER_N];     /* bytes/s out of the device, per tier */
} kvcost;

/* 1 when loading `bytes` from tier is predicted faster than recomputing
 * `tokens` (1 also when the prefill rate is not measured yet). */
int kvcost_prefer_load(const kvcost *c, int tier, uint64_t bytes, int64_t tokens);
/* 1 when swapping (write now to the host tier, read back later) `bytes`
 * is predicted faster than recomputing `tokens` (same convention). */
int kvcost_prefer_swap(const kvcost *c, uint64_t bytes, int64_t tokens);

#endif
