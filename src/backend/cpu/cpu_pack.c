/* cpu_pack.c - matmul weights packed at load (see cpu_pack.h). */
#include "backend/cpu/cpu_pack.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels/dtype.h"
#include "kernels/matmul.h"
#include "kernels/qpack.h"
#include "util/pages.h"

typedef struct pack_entry {
    model_tensor *t;
    void *buf; /* manager buffer owned here, or NULL: packed in place */
} pack_entry;

struct cpu_packed {
    pack_entry *e;
    int n;
    uint64_t bytes;
};

typedef struct pack_job {
    const model_tensor *t;
    const void *src;
    void *dst;
    int unpack;
} pack_job;

static void pack_worker(int ith, int nth, void *arg)
{
    const pack_job *j = arg;
    long b, e;
    tpool_range((long)j->t->ne[1], ith, nth, &b, &e);
    if (b >= e)
        return;
    const size_t off = (size_t)b * j->t->row_bytes;
    void (*fn)(uint32_t, const void *, void *, int64_t, int64_t, size_t) =
        j->unpack ? qpack_unpack_rows : qpack_rows;
    fn(j->t->type, (const uint8_t *)j->src + off, (uint8_t *)j->dst + off, j->t->ne[0], e - b,
       j->t->row_bytes);
}

/* Asks for transparent huge pages on the 2 MiB-aligned interior of a
 * fresh buffer (fewer TLB misses when a decode step streams every weight);
 * a kernel that says no changes nothing. */
static void advise_huge(void *p, size_t n)
{
#ifdef MADV_HUGEPAGE
    const uintptr_t hp = (uintptr_t)2 << 20;
    const uintptr_t a = ((uintptr_t)p + hp - 1) / hp * hp, z = ((uintptr_t)p + n) / hp * hp;
    if (z > a)
        (void)madvise((void *)a, z - a, MADV_HUGEPAGE);
#else
    (void)p, (void)n;
#endif
}

static void pack_one(cpu_packed *p, model_tensor *t, mem_mgr *mem, tpool *pool)
{
    if (t->packed || t->streamed || !t->nbytes || !dtype_matmul_packs(t->type, t->ne[0]))
        return;
    pack_entry *e = &p->e[p->n];
    e->t = t;
    e->buf = NULL;
    if (t->dev == t->data) {
        e->buf = mem_alloc(mem, t->nbytes, MEM_WEIGHTS, t->layer < 0 ? MEM_NO_LAYER : t->layer,
                           NULL);
        if (!e->buf)
            return; /* no room for a copy: stays mapped, unpacked */
        advise_huge(e->buf, t->nbytes);
    }
    pack_job j = {t, t->dev, e->buf ? e->buf : t->dev, 0};
    tpool_run(pool, pack_worker, &j);
    if (e->buf) {
        pages_drop_mapped(t->data, t->nbytes);
        t->dev = e->buf;
    }
    t->packed = 1;
    p->bytes += t->nbytes;
    p->n++;
}

cpu_packed *cpu_pack_weights(model *m, mem_mgr *mem, tpool *pool, kvant_err *err)
{
    cpu_packed *p = calloc(1, sizeof *p);
    const int cap = 16 * m->hp.n_layers + 1;
    if (p)
        p->e = calloc((size_t)cap, sizeof *p->e);
    if (!p || !p->e) {
        free(p);
        kvant_err_set(err, KV_ENOMEM, "out of memory");
        return NULL;
    }
    for (int il = 0; m->layers && il < m->hp.n_layers; il++) {
        model_layer *L = &m->layers[il];
        /* stacked experts pack row by row like any matrix: an expert's rows
         * stay a contiguous slice */
        model_tensor *ts[] = {&L->wq,        &L->wk,         &L->wv,      &L->wo,
                              &L->w_gate,    &L->w_up,       &L->w_down,  &L->gate_exps,
                              &L->up_exps,   &L->gate_up_exps, &L->down_exps, &L->gate_shexp,
                              &L->up_shexp,  &L->down_shexp, &L->ssm_in,  &L->ssm_out,
                              &L->ssm_z};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
            pack_one(p, ts[i], mem, pool);
    }
    /* a head tied to the embedding: the table itself is packed (one copy),
     * and the lookup unpacks the rows it reads (cpu_pack_row) */
    if (!m->tied_output)
        pack_one(p, &m->output, mem, pool);
    else if (m->tok_embd.row_bytes <= CPU_PACK_ROW_MAX)
        pack_one(p, &m->tok_embd, mem, pool);
    return p;
}

void cpu_pack_row(const model_tensor *t, int64_t r, void *buf, float *y)
{
    const char *row = (const char *)t->dev + (size_t)r * t->row_bytes;
    if (t->packed) {
        qpack_unpack_rows(t->type, row, buf, t->ne[0], 1, t->row_bytes);
        row = buf;
    }
    dtype_get(t->type)->to_float(row, y, t->ne[0]);
}

int cpu_pack_count(const cpu_packed *p, uint64_t *bytes)
{
    if (bytes)
        *bytes = p ? p->bytes : 0;
    return p ? p->n : 0;
}

void cpu_pack_release(cpu_packed *p, mem_mgr *mem, tpool *pool)
{
    if (!p)
        return;
    for (int i = p->n - 1; i >= 0; i--) {
        model_tensor *t = p->e[i].t;
        if (p->e[i].buf) {
            mem_free(mem, p->e[i].buf);
            t->dev = (void *)t->data;
        } else {
            pack_job j = {t, t->dev, t->dev, 1};
            tpool_run(pool, pack_worker, &j);
        }
        t->packed = 0;
    }
    free(p->e);
    free(p);
}

void cpu_pack_drop(cpu_packed *p, mem_mgr *mem)
{
    if (!p)
        return;
    for (int i = 0; i < p->n; i++)
        mem_free(mem, p->e[i].buf);
    free(p->e);
    free(p);
}
