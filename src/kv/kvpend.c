/* kvpend.c - pending tier slots and their copy tickets (see kvpend.h). */
#include "kv/kvpend.h"

#include <stdlib.h>
#include <string.h>

#include "util/err.h"

int kvpend_init(kvpend *p, int32_t cap, kvpend_done_fn done, void *ctx)
{
    memset(p, 0, sizeof *p);
    p->done = done;
    p->ctx = ctx;
    p->cap = cap;
    p->tk = calloc((size_t)cap, sizeof *p->tk);
    p->q_id = malloc((size_t)cap * sizeof *p->q_id);
    p->q_tk = malloc((size_t)cap * sizeof *p->q_tk);
    return p->tk && p->q_id && p->q_tk ? KV_OK : KV_ENOMEM;
}

void kvpend_free(kvpend *p)
{
    free(p->tk);
    free(p->q_id);
    free(p->q_tk);
    memset(p, 0, sizeof *p);
}

int kvpend_seal(kvpend *p, int32_t id, int wait)
{
    if (!p->tk || p->tk[id] <= 0)
        return p->tk && p->tk[id] < 0 ? -1 : 1;
    int r = p->done(p->ctx, p->tk[id], wait);
    if (r == 0 && !wait)
        return 0;
    p->n_pend--;
    p->tk[id] = r > 0 ? 0 : -1; /* a wait that did not complete is a failure */
    return r > 0 ? 1 : -1;
}

/* Pops the FIFO's head after trying to seal it: 0 when it is still in
 * flight (left in place), else the seal's result (1, or -1 failed; 1 for a
 * stale entry). */
static int seal_head(kvpend *p, int wait)
{
    const int32_t id = p->q_id[p->head];
    int r = p->tk[id] == p->q_tk[p->head] ? kvpend_seal(p, id, wait) : 1;
    if (r == 0)
        return 0;
    p->head = (p->head + 1) % p->cap;
    p->n_q--;
    return r;
}

void kvpend_add(kvpend *p, int32_t id, int64_t ticket)
{
    KV_ASSERT(ticket > 0 && p->tk[id] <= 0);
    if (p->n_q == p->cap) /* only stale entries or this cap's oldest: make room */
        seal_head(p, 1);
    p->tk[id] = ticket;
    p->n_pend++;
    p->q_id[(p->head + p->n_q) % p->cap] = id;
    p->q_tk[(p->head + p->n_q++) % p->cap] = ticket;
}

void kvpend_seal_some(kvpend *p, void (*failed)(void *fctx, int32_t id), void *fctx)
{
    while (p->n_q > 0) {
        const int32_t id = p->q_id[p->head];
        int r = seal_head(p, 0);
        if (r == 0)
            return; /* in order: the later ones are in flight too */
        if (r < 0 && failed)
            failed(fctx, id);
    }
}
