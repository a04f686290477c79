/* test_wstream.c - weight offload (model/wstream.h) on a tiny random model:
 * the placement planner (refusal naming the smallest budget, fits = no
 * offload, layers resident in order within the cap), bitwise-equal logits
 * for every placement (all streamed, alternating, first/last only) through
 * chunked prefill and decode steps with a 2- and a 3-buffer ring and with
 * each read mode (page cache, O_DIRECT, both), streamed tensors byte for
 * byte equal to the file in each mode, O_DIRECT refused (opening, first
 * read): the page cache instead with a note, bitwise-equal tokens and
 * log-probabilities through the engine (batched, chunked prefill) with
 * every layer streamed, the accounting of the memory manager, and a model
 * file truncated under the stream (each read mode): a clean KV_EIO, no
 * fault. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend_select.h"
#include "engine/engine.h"
#include "kernels/dtype.h"
#include "forward/forward.h"
#include "model/wstream.h"
#include "testutil.h"
#include "tinymodel.h"

#define N_TOK 40
#define N_REQ 8
#define MAX_GEN 24

static void test_plan(model *m)
{
    wstream_plan all, p;
    wstream_plan_resident(m, 2, &all);
    CHECK(all.n_layers == m->hp.n_layers && all.n_streamed == 0);
    CHECK(all.resident_bytes >= m->weights_bytes);
    /* a slot: the widest layer in the direct-read layout (the ring has
     * room to align its base); slot1: the same over layers 1.. */
    uint64_t slot = 0, slot1 = 0;
    for (int il = 0; il < all.n_layers; il++) {
        const uint64_t sb = all.stream_bytes[il];
        CHECK(sb % WSTREAM_DIO_ALIGN == 0 && sb >= all.layer_bytes[il] &&
              sb <= all.layer_bytes[il] + 16 * 2 * WSTREAM_DIO_ALIGN);
        slot = sb > slot ? sb : slot;
        if (il > 0)
            slot1 = sb > slot1 ? sb : slot1;
    }
    CHECK(all.min_bytes == all.global_bytes + 2 * slot + WSTREAM_DIO_ALIGN);
    kvant_err err = {0};
    CHECK(wstream_plan_make(m, all.min_bytes - 1, 2, &p, &err) == KV_ENOMEM);
    CHECKF(strstr(err.msg, "smallest weights budget") != NULL, "%s", err.msg);
    CHECK(wstream_plan_make(m, all.resident_bytes, 2, &p, &err) == KV_OK && p.n_streamed == 0);
    CHECK(wstream_plan_make(m, all.min_bytes, 2, &p, &err) == KV_OK);
    CHECK(p.n_streamed == m->hp.n_layers && wstream_plan_device_bytes(&p) <= all.min_bytes);
    /* one layer resident: the first */
    uint64_t cap = all.global_bytes + all.layer_bytes[0] + 2 * slot1 + WSTREAM_DIO_ALIGN;
    CHECK(wstream_plan_make(m, cap, 2, &p, &err) == KV_OK);
    CHECK(p.n_streamed == m->hp.n_layers - 1 && p.place[0] == WPLACE_RESIDENT);
    CHECK(wstream_plan_device_bytes(&p) <= cap);
    CHECK(wstream_plan_make(m, all.min_bytes + slot - 1, 3, &p, &err) == KV_ENOMEM);
    CHECK(wstream_plan_make(m, all.min_bytes + slot, 3, &p, &err) == KV_OK);
}

typedef struct rig {
    mem_mgr *mem;
    backend *be;
    wstream *ws;
    fwd_ctx f;
} rig;

static int rig_open_io(rig *r, model *m, const wstream_plan *p, const wstream_io *io)
{
    kvant_err err = {0};
    memset(r, 0, sizeof *r);
    r->mem = mem_create(1ull << 30, mem_allocator_host(), &err);
    r->be = r->mem ? backend_create("cpu", 0, r->mem, 2, 0, &err) : NULL;
    if (r->be && p) {
        r->ws = wstream_create(m, r->mem, p, io, &err);
        m->wstream = r->ws;
    }
    if (!r->be || (p && !r->ws) || r->be->ops->load_weights(r->be, m, &err)) {
        fprintf(stderr, "rig: %s\n", err.msg);
        return -1;
    }
    kv_layout kv = fwd_kv_layout(m, 8, 16, DT_F16);
    return fwd_init(&r->f, m, r->be, 16, 16, &kv, &err);
}

static int rig_open(rig *r, model *m, const wstream_plan *p)
{
    return rig_open_io(r, m, p, NULL);
}

static void rig_close(rig *r, model *m)
{
    fwd_free(&r->f);
    if (r->be) {
        r->be->ops->unload_weights(r->be, m);
        r->be->ops->destroy(r->be);
    }
    m->wstream = NULL;
    wstream_destroy(r->ws);
    CHECK(r->mem == NULL || mem_live_count(r->mem) == 0);
    mem_destroy(r->mem);
}

/* Prefill in chunks of 7 (all logits) then 6 single-token decode steps:
 * writes N_TOK rows of logits.  Returns the first error code. */
static int run_tokens(rig *r, model *m, float *logits, kvant_err *err)
{
    int32_t tok[N_TOK], pos[16], seq[16] = {0}, out[16], table[8];
    for (int i = 0; i < N_TOK; i++)
        tok[i] = (i * 37 + 11) % 290;
    for (int i = 0; i < 8; i++)
        table[i] = i;
    fwd_seq s = {.block_table = table, .n_blocks = 8};
    int done = 0;
    while (done < N_TOK) {
        int n = done < N_TOK - 6 ? (N_TOK - 6 - done < 7 ? N_TOK - 6 - done : 7) : 1;
        for (int i = 0; i < n; i++) {
            pos[i] = done + i;
            out[i] = i;
        }
        fwd_batch b = {.n_tokens = n, .tokens = tok + done, .pos = pos, .seq = seq, .n_seqs = 1,
                       .seqs = &s, .n_out = n, .out = out};
        int rc = fwd_run(&r->f, &b, logits + (size_t)done * m->hp.n_vocab, err);
        if (rc)
            return rc;
        done += n;
    }
    return KV_OK;
}

/* Whether this filesystem takes O_DIRECT reads of path (asked here,
 * independently of the stream, to know what the stream must do). */
static int fs_direct_ok(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECT);
    void *buf = NULL;
    int ok = fd >= 0 && posix_memalign(&buf, WSTREAM_DIO_ALIGN, WSTREAM_DIO_ALIGN) == 0 &&
             pread(fd, buf, WSTREAM_DIO_ALIGN, 0) > 0;
    free(buf);
    if (fd >= 0)
        close(fd);
    return ok;
}

/* After a run in io mode: direct reads happened exactly when asked for and
 * the filesystem takes them; otherwise the stream says why not. */
static void check_io(const wstream_stats *st, int io, int direct_ok)
{
    if (io == WSTREAM_IO_BUFFERED) {
        CHECK(!st->direct && st->bytes_direct == 0 && !st->io_note[0]);
    } else if (direct_ok) {
        CHECKF(st->direct && !st->io_note[0], "%s: %s", wstream_io_name(io), st->io_note);
        /* direct: every byte; both: whichever reader is free takes a chunk */
        CHECK(io == WSTREAM_IO_BOTH || (st->bytes_direct > 0 && st->bytes_direct == st->bytes_read));
    } else {
        CHECK(!st->direct && st->bytes_direct == 0 && strstr(st->io_note, "O_DIRECT refused"));
    }
}

static void test_placements(model *m, int direct_ok)
{
    const size_t nl = (size_t)N_TOK * m->hp.n_vocab;
    float *ref = calloc(nl, sizeof *ref), *got = calloc(nl, sizeof *got);
    rig r;
    kvant_err err = {0};
    CHECK(rig_open(&r, m, NULL) == 0 && run_tokens(&r, m, ref, &err) == KV_OK);
    rig_close(&r, m);
    const int nlay = m->hp.n_layers;
    /* ring buffers and read mode */
    const int runs[][2] = {{2, WSTREAM_IO_BUFFERED}, {3, WSTREAM_IO_BUFFERED},
                           {2, WSTREAM_IO_DIRECT}, {3, WSTREAM_IO_BOTH}};
    for (int mode = 0; mode < 4; mode++) {
        for (int k = 0; k < 4; k++) {
            const int slots = runs[k][0];
            const wstream_io io = {runs[k][1], NULL};
            wstream_plan p;
            wstream_plan_resident(m, slots, &p);
            for (int il = 0; il < nlay; il++)
                p.place[il] = mode == 0 ? WPLACE_STREAMED
                              : mode == 1 ? (il % 2 ? WPLACE_STREAMED : WPLACE_RESIDENT)
                              : mode == 2 ? (il == 0 ? WPLACE_STREAMED : WPLACE_RESIDENT)
                                          : (il == nlay - 1 ? WPLACE_STREAMED : WPLACE_RESIDENT);
            wstream_plan_update(&p);
            memset(got, 0, nl * sizeof *got);
            int ok = rig_open_io(&r, m, &p, &io) == 0;
            CHECK(ok);
            if (ok) {
                /* the ring and resident copies are weights in the manager */
                mem_report *rep = calloc(1, sizeof *rep);
                mem_get_report(r.mem, rep);
                CHECKF(rep->cat[MEM_WEIGHTS].current == wstream_plan_device_bytes(&p),
                       "weights %llu, planned %llu",
                       (unsigned long long)rep->cat[MEM_WEIGHTS].current,
                       (unsigned long long)wstream_plan_device_bytes(&p));
                free(rep);
                int rc = run_tokens(&r, m, got, &err);
                CHECKF(rc == KV_OK, "mode %d: %s", mode, err.msg);
                CHECKF(memcmp(ref, got, nl * sizeof *got) == 0,
                       "placement %d, %d buffers, %s reads: logits differ from all resident",
                       mode, slots, wstream_io_name(io.mode));
                wstream_stats st;
                wstream_get_stats(r.ws, &st);
                CHECK(st.n_streamed == p.n_streamed && !st.failed);
                /* every streamed layer read once per forward pass, at least */
                CHECK(st.layers_read >= (uint64_t)p.n_streamed * 11);
                check_io(&st, io.mode, direct_ok);
            }
            rig_close(&r, m);
        }
    }
    free(ref);
    free(got);
}

/* Every layer streamed through a ring of two buffers. */
static void plan_all_streamed(model *m, wstream_plan *p)
{
    wstream_plan_resident(m, 2, p);
    for (int il = 0; il < p->n_layers; il++)
        p->place[il] = WPLACE_STREAMED;
    wstream_plan_update(p);
}

/* Every layer streamed: each streamed tensor, once acquired, holds the
 * file's bytes (the mapping), over two passes through the ring. */
static void check_bytes(model *m, const wstream_io *io, int direct_ok)
{
    wstream_plan p;
    plan_all_streamed(m, &p);
    rig r;
    kvant_err err = {0};
    int ok = rig_open_io(&r, m, &p, io) == 0;
    CHECK(ok);
    for (int pass = 0; ok && pass < 2; pass++)
        for (int il = 0; il < p.n_layers; il++) {
            CHECKF(wstream_acquire(r.ws, il, &err) == KV_OK, "%s", err.msg);
            const model_layer *L = &m->layers[il];
            const model_tensor *ts[] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->wo,
                                        &L->ffn_norm, &L->w_gate, &L->w_up, &L->w_down};
            for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
                const model_tensor *t = ts[i];
                CHECK(t->streamed && t->dev && t->dev != t->data);
                CHECKF(t->dev && !memcmp(t->dev, t->data, t->nbytes),
                       "%s reads: layer %d tensor %zu differs from the file",
                       wstream_io_name(io->mode), il, i);
                /* the alignment the mapping gives (file offset modulo a page) */
                CHECK((uintptr_t)t->dev % WSTREAM_DIO_ALIGN == t->file_off % WSTREAM_DIO_ALIGN);
            }
            wstream_release(r.ws, il);
        }
    if (ok && io->open_direct == NULL) {
        wstream_stats st;
        wstream_get_stats(r.ws, &st);
        check_io(&st, io->mode, direct_ok);
    }
    rig_close(&r, m);
}

static int open_refused(const char *path)
{
    (void)path;
    errno = EINVAL; /* as open(2) with O_DIRECT on a filesystem without it */
    return -1;
}

static int open_unreadable(const char *path)
{
    return open(path, O_WRONLY); /* opens, but every read fails (EBADF) */
}

static void test_bytes(model *m, int direct_ok)
{
    for (int io = 0; io < WSTREAM_IO_COUNT; io++) {
        const wstream_io w = {io, NULL};
        check_bytes(m, &w, direct_ok);
    }
    /* O_DIRECT refused when opening, or at the first read: the page cache,
     * the same bytes, and a note that says so */
    int (*const hooks[])(const char *) = {open_refused, open_unreadable};
    const char *const notes[] = {"refused opening", "refused a read"};
    for (int h = 0; h < 2; h++) {
        const wstream_io w = {WSTREAM_IO_DIRECT, hooks[h]};
        check_bytes(m, &w, 0);
        wstream_plan p;
        wstream_plan_resident(m, 2, &p);
        p.place[0] = WPLACE_STREAMED;
        wstream_plan_update(&p);
        rig r;
        int ok = rig_open_io(&r, m, &p, &w) == 0;
        CHECK(ok);
        if (ok) {
            wstream_stats st;
            wstream_get_stats(r.ws, &st);
            CHECKF(!st.direct && strstr(st.io_note, notes[h]), "note: %s", st.io_note);
        }
        rig_close(&r, m);
    }
    CHECK(wstream_io_parse("direct") == WSTREAM_IO_DIRECT && wstream_io_parse("Direct") < 0);
    wstream_plan p;
    wstream_plan_resident(m, 2, &p);
    p.place[0] = WPLACE_STREAMED;
    wstream_plan_update(&p);
    const wstream_io bad = {WSTREAM_IO_COUNT, NULL};
    kvant_err err = {0};
    CHECK(wstream_create(m, NULL, &p, &bad, &err) == NULL && err.code == KV_EINVAL);
}

/* A copy of the model, streamed (io mode), then truncated to nothing. */
static void test_truncated(const char *src, int io_mode)
{
    const char *path = "build/tests/tiny-wstream-trunc.gguf";
    FILE *in = fopen(src, "rb"), *out = fopen(path, "wb");
    CHECK(in && out);
    if (!in || !out)
        return;
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        CHECK(fwrite(buf, 1, n, out) == n);
    fclose(in);
    fclose(out);
    kvant_err err = {0};
    model *m = model_load(path, &err);
    CHECK(m != NULL);
    if (!m)
        return;
    wstream_plan p;
    plan_all_streamed(m, &p);
    rig r;
    const size_t nl = (size_t)N_TOK * m->hp.n_vocab;
    float *got = calloc(nl, sizeof *got);
    const wstream_io io = {io_mode, NULL};
    CHECK(rig_open_io(&r, m, &p, &io) == 0 && run_tokens(&r, m, got, &err) == KV_OK);
    CHECK(truncate(path, 0) == 0);
    int rc = KV_OK;
    for (int i = 0; i < 4 && rc == KV_OK; i++)
        rc = run_tokens(&r, m, got, &err);
    CHECKF(rc == KV_EIO && strstr(err.msg, "truncated"), "rc %d: %s", rc, err.msg);
    CHECK(wstream_failed(r.ws));
    /* it stays failed: later passes fail at once, nothing faults */
    CHECK(run_tokens(&r, m, got, &err) == KV_EIO);
    rig_close(&r, m);
    free(got);
    model_free(m);
    unlink(path);
}

typedef struct result {
    int32_t toks[MAX_GEN];
    float lps[MAX_GEN];
    int n, done, error;
} result;

static void on_event(void *ctx, const engine_event *ev)
{
    result *r = ctx;
    if (ev->type == ENGINE_EV_TOKEN && ev->index == 0 && r->n < MAX_GEN) {
        r->toks[r->n] = ev->token;
        r->lps[r->n++] = ev->logprob;
    } else if (ev->type == ENGINE_EV_DONE) {
        r->done = 1;
    } else if (ev->type == ENGINE_EV_ERROR) {
        r->error = r->done = 1;
    }
}

static void run_engine(model *m, uint64_t weights_memory, int32_t tokens, result *res)
{
    engine_config c = engine_config_default();
    c.manual = 1;
    c.n_threads = 2;
    c.max_num_batched_tokens = tokens;
    c.max_num_seqs = N_REQ;
    c.device_memory = 1ull << 30;
    c.weights_memory = weights_memory;
    kvant_err err = {0};
    engine *e = engine_create(m, &c, &err);
    CHECKF(e != NULL, "engine_create: %s", err.msg);
    if (!e)
        return;
    wstream_stats st;
    CHECK(engine_get_offload(e, &st) == (weights_memory != 0));
    int32_t prompts[N_REQ][40];
    memset(res, 0, sizeof *res * N_REQ);
    for (int i = 0; i < N_REQ; i++) {
        int64_t np = 5 + (i * 7) % 30;
        for (int64_t j = 0; j < np; j++)
            prompts[i][j] = (int32_t)((i * 31 + j * 17 + 3) % 250);
        engine_request r = {.prompt = prompts[i], .n_prompt = np, .max_tokens = MAX_GEN, .n = 1,
                            .top_logprobs = -1, .ignore_eos = 1};
        r.sampling = sampler_params_default();
        r.sampling.temperature = i % 2 ? 0.8f : 0.0f;
        r.sampling.seed = 99;
        CHECK(engine_submit(e, &r, on_event, &res[i], NULL) > 0);
    }
    for (int step = 0; step < 5000; step++) {
        int all = 1;
        for (int i = 0; i < N_REQ; i++)
            all &= res[i].done;
        if (all)
            break;
        engine_run_step(e);
    }
    if (weights_memory) {
        CHECK(engine_get_offload(e, &st) == 1 && st.n_streamed == m->hp.n_layers);
        CHECK(st.bytes_read >= st.streamed_bytes && !st.failed);
    }
    engine_destroy(e);
}

static void test_engine(model *m)
{
    static result ref[N_REQ], got[N_REQ];
    wstream_plan all;
    wstream_plan_resident(m, 2, &all);
    run_engine(m, 0, 2048, ref);
    const int32_t budgets[] = {2048, 8};
    for (int k = 0; k < 2; k++) {
        run_engine(m, all.min_bytes, budgets[k], got);
        int same = 0;
        for (int i = 0; i < N_REQ; i++)
            same += !ref[i].error && !got[i].error && ref[i].n == MAX_GEN && got[i].n == ref[i].n &&
                    !memcmp(ref[i].toks, got[i].toks, sizeof ref[i].toks) &&
                    !memcmp(ref[i].lps, got[i].lps, sizeof ref[i].lps);
        CHECKF(same == N_REQ, "%d tokens per step: %d of %d requests equal to all resident",
               budgets[k], same, N_REQ);
    }
}

int main(void)
{
    /* under build/ (made by make), not $TMPDIR: the O_DIRECT read modes need
     * a disk filesystem, and /tmp is often tmpfs, which refuses O_DIRECT */
    const char *path = "build/tests/tiny-wstream.gguf";
    dtype_init();
    CHECK(tiny_model_write_layers(path, 7, 5) == 0);
    kvant_err err = {0};
    model *m = model_load(path, &err);
    CHECKF(m != NULL, "model_load: %s", err.msg);
    if (!m)
        return tu_finish("test_wstream");
    const int direct_ok = fs_direct_ok(path);
    if (!direct_ok)
        printf("test_wstream: this filesystem refuses O_DIRECT: the direct read modes are "
               "checked for their page-cache fallback only\n");
    test_plan(m);
    test_placements(m, direct_ok);
    test_bytes(m, direct_ok);
    test_engine(m);
    model_free(m);
    for (int io = 0; io < WSTREAM_IO_COUNT; io++)
        test_truncated(path, io);
    return tu_finish("test_wstream");
}
