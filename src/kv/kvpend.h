/* kvpend.h - the pending set of a tier's slots: records whose device copy
 * is still in flight, each with the ticket of its copy (backend.h
 * kv_export_async / copy_done), sealed once its ticket completes.
 *
 * Slots are ids [0, cap) (the host tier's slab slots); a FIFO keeps the
 * pending ones in store order, so kvpend_seal_some asks about the oldest
 * first and stops at the first still in flight (tickets complete in issue
 * order).  A slot sealed out of order (kvpend_seal) leaves a stale FIFO
 * entry, skipped later.
 *
 * Ownership: kvpend_init/kvpend_free on a caller-owned struct.
 * Threading: one thread (the tier's caller).
 */
#ifndef KVANT_KVPEND_H
#define KVANT_KVPEND_H

#include <stdint.h>

/* 1: ticket's copy completed (wait != 0: after waiting for it), 0: in
 * flight, -1: failed. */
typedef int (*kvpend_done_fn)(void *ctx, int64_t ticket, int wait);

typedef struct kvpend {
    kvpend_done_fn done;
    void *ctx;           /* borrowed */
    int64_t *tk;         /* [cap] ticket of slot i in flight; 0: sealed; -1: its copy
                          * failed (until the slot is added again or cleared) */
    int32_t *q_id;       /* [cap] FIFO of (slot, ticket) in store order */
    int64_t *q_tk;
    int32_t cap, head, n_q, n_pend;
} kvpend;

/* KV_OK or KV_ENOMEM (p zeroed first; kvpend_free is then safe). */
int kvpend_init(kvpend *p, int32_t cap, kvpend_done_fn done, void *ctx);
void kvpend_free(kvpend *p);
/* Slot id's copy is ticket (> 0); id must not be in flight.  A full FIFO
 * first waits for its oldest entry. */
void kvpend_add(kvpend *p, int32_t id, int64_t ticket);
/* 1 when id is sealed (now or before), 0 while in flight (wait 0 only),
 * -1 when its copy failed (its bytes are not valid; again on every call
 * until kvpend_clear or kvpend_add). */
int kvpend_seal(kvpend *p, int32_t id, int wait);
/* 1 while id's copy is in flight (asks nothing). */
static inline int kvpend_is_pending(const kvpend *p, int32_t id)
{
    return p->tk && p->tk[id] > 0;
}
/* Slot id was filled synchronously: forgets a failed copy (id not in flight). */
static inline void kvpend_clear(kvpend *p, int32_t id)
{
    if (p->tk && p->tk[id] < 0)
        p->tk[id] = 0;
}
/* Seals the oldest entries whose copies completed, never waiting; calls
 * failed(fctx, id) for each whose copy failed. */
void kvpend_seal_some(kvpend *p, void (*failed)(void *fctx, int32_t id), void *fctx);

#endif
