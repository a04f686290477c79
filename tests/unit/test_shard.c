/* test_shard.c - a rank's share of a model (model/shard.h): head, FFN and
 * vocabulary ranges cover the model exactly once (or replicate KV heads
 * evenly), every slice holds the original bytes, the column copies are
 * accounted by the memory manager and freed (or, for a device backend,
 * made in host memory), and the model is restored. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/dtype.h"
#include "mem/mem.h"
#include "model/model.h"
#include "model/shard.h"
#include "testutil.h"
#include "tinymodel.h"

static void test_ranges(void)
{
    model_hparams hp = {.n_head = 9, .n_head_kv = 3, .n_vocab = 49152};
    shard_range r0, r1, r2;
    CHECK(shard_range_of(&hp, 0, 2, &r0, NULL) == KV_OK);
    CHECK(shard_range_of(&hp, 1, 2, &r1, NULL) == KV_OK);
    CHECK(r0.kv0 == 0 && r0.n_kv == 1 && r0.head0 == 0 && r0.n_head == 3);
    CHECK(r1.kv0 == 1 && r1.n_kv == 2 && r1.head0 == 3 && r1.n_head == 6);
    CHECK(r0.vocab0 == 0 && r0.n_vocab + r1.n_vocab == 49152 && r1.vocab0 == r0.n_vocab);
    CHECK(shard_range_of(&hp, 2, 3, &r2, NULL) == KV_OK && r2.kv0 == 2 && r2.n_head == 3);
    /* more ranks than KV heads: each KV head on n / n_kv ranks, its query heads split */
    model_hparams big = {.n_head = 32, .n_head_kv = 4, .n_vocab = 32000};
    shard_range r5;
    CHECK(shard_range_of(&big, 5, 8, &r5, NULL) == KV_OK);
    CHECK(r5.kv0 == 2 && r5.n_kv == 1 && r5.head0 == 2 * 8 + 4 && r5.n_head == 4);
    int covered[32] = {0};
    for (int r = 0; r < 8; r++) {
        shard_range x;
        CHECK(shard_range_of(&big, r, 8, &x, NULL) == KV_OK);
        for (int h = x.head0; h < x.head0 + x.n_head; h++)
            covered[h]++;
    }
    for (int h = 0; h < 32; h++)
        CHECKF(covered[h] == 1, "query head %d held by %d ranks", h, covered[h]);
    kvant_err err = {0};
    CHECK(shard_range_of(&big, 0, 6, &r5, &err) == KV_EUNSUP && strstr(err.msg, "6 ranks"));
    CHECK(shard_range_of(&big, 2, 2, &r5, NULL) == KV_EINVAL);
    /* FFN channels: contiguous, aligned cuts, every channel once */
    for (int n = 1; n <= 5; n++) {
        int32_t next = 0;
        for (int r = 0; r < n; r++) {
            int32_t f0, nf;
            shard_ff_range(1536, 32, r, n, &f0, &nf);
            CHECK(f0 == next && f0 % 32 == 0);
            next = f0 + nf;
        }
        CHECK(next == 1536);
    }
}

typedef struct sum_ctx {
    uint64_t bytes;
} sum_ctx;

static void add_bytes(void *ctx, model_tensor *t)
{
    ((sum_ctx *)ctx)->bytes += t->nbytes;
}

/* Every slice of rank r's share against the unsplit tensors of full. */
static void check_slices(const model *full, const model *m, int rank, int n)
{
    shard_range r;
    CHECK(shard_range_of(&full->hp, rank, n, &r, NULL) == KV_OK);
    const int64_t hd = full->hp.head_dim;
    CHECK(m->hp.n_head == r.n_head && m->hp.n_head_kv == r.n_kv);
    for (int il = 0; il < full->hp.n_layers; il++) {
        const model_layer *F = &full->layers[il], *L = &m->layers[il];
        CHECK(L->wq.ne[1] == r.n_head * hd && L->wk.ne[1] == r.n_kv * hd);
        CHECK(!memcmp(L->wq.data, (const char *)F->wq.data + r.head0 * hd * F->wq.row_bytes,
                      L->wq.nbytes));
        CHECK(!memcmp(L->wv.data, (const char *)F->wv.data + r.kv0 * hd * F->wv.row_bytes,
                      L->wv.nbytes));
        int32_t f0, nf;
        shard_ff_range(F->n_ff, 32, rank, n, &f0, &nf);
        CHECK(L->n_ff == nf && L->w_up.ne[1] == nf && L->w_down.ne[0] == nf);
        CHECK(!memcmp(L->w_gate.data, (const char *)F->w_gate.data + f0 * F->w_gate.row_bytes,
                      L->w_gate.nbytes));
        /* column copies: each row's slice of the original row */
        CHECK(L->wo.dev != L->wo.data && L->w_down.dev != L->w_down.data);
        for (int64_t row = 0; row < F->wo.ne[1]; row++) {
            CHECK(!memcmp((const char *)L->wo.dev + row * L->wo.row_bytes,
                          (const float *)((const char *)F->wo.data + row * F->wo.row_bytes) +
                              r.head0 * hd,
                          L->wo.row_bytes));
            CHECK(!memcmp((const char *)L->w_down.dev + row * L->w_down.row_bytes,
                          (const float *)((const char *)F->w_down.data +
                                          row * F->w_down.row_bytes) + f0,
                          L->w_down.row_bytes));
        }
    }
    CHECK(m->tok_embd.row0 == r.vocab0 && m->tok_embd.ne[1] == r.n_vocab);
    CHECK(!memcmp(m->tok_embd.data,
                  (const char *)full->tok_embd.data + r.vocab0 * full->tok_embd.row_bytes,
                  m->tok_embd.nbytes));
}

static void test_apply(void)
{
    char path[256];
    CHECK(tu_tmp_path(path, sizeof path, "shard") == 0);
    CHECK(tiny_model_write(path, 11) == 0);
    kvant_err err = {0};
    model *full = model_load(path, &err), *m = model_load(path, &err);
    unlink(path); /* mapped */
    CHECKF(full && m, "%s", err.msg);
    if (!full || !m)
        return;
    const uint64_t full_bytes = m->weights_bytes;
    const model_hparams hp0 = m->hp;
    uint64_t sum = 0;
    for (int n = 2; n <= 4; n += 2) {
        sum = 0;
        for (int rank = 0; rank < n; rank++) {
            mem_mgr *mem = mem_create(64u << 20, mem_allocator_host(), &err);
            shard_spec sp = {.tp_rank = rank, .tp_n = n, .pp_stage = 0, .pp_n = 1};
            model_shard *s = model_shard_apply(m, &sp, mem, &err);
            CHECKF(s, "rank %d of %d: %s", rank, n, err.msg);
            if (!s) {
                mem_destroy(mem);
                continue;
            }
            check_slices(full, m, rank, n);
            sum_ctx c = {0};
            model_for_each_tensor(m, add_bytes, &c);
            CHECK(c.bytes == m->weights_bytes);
            sum += m->weights_bytes;
            /* the column copies (wo, w_down of every layer) are the manager's */
            uint64_t copies = 0;
            for (int il = 0; il < m->hp.n_layers; il++)
                copies += m->layers[il].wo.nbytes + m->layers[il].w_down.nbytes;
            CHECK(mem_used(mem) == copies);
            model_shard_free(s);
            CHECK(mem_used(mem) == 0 && mem_live_count(mem) == 0);
            CHECK(m->weights_bytes == full_bytes && m->hp.n_head == hp0.n_head &&
                  m->hp.n_ff == hp0.n_ff && m->tok_embd.row0 == 0);
            mem_destroy(mem);
        }
        /* split tensors add up; norms are replicated on every rank (n - 1 extra);
         * at 4 ranks the 2 KV heads are each held twice */
        uint64_t norms = (uint64_t)(2 * hp0.n_layers + 1) * (uint64_t)hp0.n_embd * 4;
        uint64_t kv_rep = n > hp0.n_head_kv
                              ? (uint64_t)(n / hp0.n_head_kv - 1) * 2 * hp0.n_layers *
                                    (uint64_t)hp0.n_head_kv * hp0.head_dim * hp0.n_embd * 4
                              : 0;
        CHECKF(sum == full_bytes + (uint64_t)(n - 1) * norms + kv_rep,
               "%d ranks: %llu bytes in all, full model %llu", n, (unsigned long long)sum,
               (unsigned long long)full_bytes);
    }
    /* a budget too small for the column copies: refused, model unchanged */
    mem_mgr *tiny = mem_create(1024, mem_allocator_host(), &err);
    shard_spec half = {.tp_rank = 0, .tp_n = 2, .pp_stage = 0, .pp_n = 1};
    CHECK(!model_shard_apply(m, &half, tiny, &err) && err.code == KV_ENOMEM);
    CHECK(m->weights_bytes == full_bytes && m->hp.n_head == hp0.n_head && mem_used(tiny) == 0);
    mem_destroy(tiny);
    model_free(full);
    model_free(m);
}

/* A device backend's shard (host_copies): the column copies are host
 * memory, not the manager's (the backend uploads and accounts them), hold
 * the same bytes, and are freed with the shard (ASan: no leak). */
static void test_host_copies(void)
{
    char path[256];
    CHECK(tu_tmp_path(path, sizeof path, "shard-host") == 0);
    CHECK(tiny_model_write(path, 13) == 0);
    kvant_err err = {0};
    model *full = model_load(path, &err), *m = model_load(path, &err);
    unlink(path); /* mapped */
    CHECKF(full && m, "%s", err.msg);
    if (!full || !m) {
        model_free(full);
        model_free(m);
        return;
    }
    const uint64_t full_bytes = m->weights_bytes;
    mem_mgr *mem = mem_create(64u << 20, mem_allocator_host(), &err);
    for (int rank = 0; rank < 2; rank++) {
        shard_spec sp = {.tp_rank = rank, .tp_n = 2, .pp_stage = 0, .pp_n = 1,
                         .host_copies = 1};
        model_shard *s = model_shard_apply(m, &sp, mem, &err);
        CHECKF(s, "rank %d: %s", rank, err.msg);
        if (!s)
            continue;
        check_slices(full, m, rank, 2);
        CHECK(mem_used(mem) == 0 && mem_live_count(mem) == 0);
        CHECK(m->weights_bytes < full_bytes);
        model_shard_free(s);
        CHECK(m->weights_bytes == full_bytes && m->tok_embd.row0 == 0);
        CHECK(m->layers[0].wo.dev == m->layers[0].wo.data);
    }
    mem_destroy(mem);
    model_free(full);
    model_free(m);
}

/* Pipeline stages: each keeps its layers (the array moves), the embedding
 * on the first, the head on the last; every layer on exactly one stage. */
static void test_stages(void)
{
    char path[256];
    CHECK(tu_tmp_path(path, sizeof path, "shard-pp") == 0);
    CHECK(tiny_model_write_layers(path, 12, 5) == 0);
    kvant_err err = {0};
    model *m = model_load(path, &err);
    unlink(path); /* mapped */
    CHECKF(m, "%s", err.msg);
    if (!m)
        return;
    const uint64_t full = m->weights_bytes;
    model_layer *layers0 = m->layers;
    int seen[5] = {0};
    for (int st = 0; st < 3; st++) {
        shard_spec sp = {.tp_rank = 0, .tp_n = 1, .pp_stage = st, .pp_n = 3};
        model_shard *s = model_shard_apply(m, &sp, NULL, &err);
        CHECKF(s, "stage %d: %s", st, err.msg);
        if (!s)
            continue;
        int32_t l0, nl;
        shard_layer_range(5, st, 3, &l0, &nl);
        CHECK(m->hp.n_layers == nl && m->layers == layers0 + l0);
        for (int il = 0; il < nl; il++)
            seen[m->layers[il].wq.layer]++;
        CHECK((m->tok_embd.nbytes > 0) == (st == 0 || (st == 2 && m->tied_output)));
        CHECK((m->output_norm.nbytes > 0) == (st == 2));
        CHECK(m->weights_bytes < full);
        model_shard_free(s);
        CHECK(m->layers == layers0 && m->hp.n_layers == 5 && m->weights_bytes == full);
    }
    for (int il = 0; il < 5; il++)
        CHECKF(seen[il] == 1, "layer %d on %d stages", il, seen[il]);
    shard_spec too_many = {.tp_rank = 0, .tp_n = 1, .pp_stage = 0, .pp_n = 6};
    CHECK(!model_shard_apply(m, &too_many, NULL, &err) && err.code == KV_EUNSUP);
    model_free(m);
}

int main(void)
{
    dtype_init();
    test_ranges();
    test_apply();
    test_host_copies();
    test_stages();
    return tu_finish("test_shard");
}
