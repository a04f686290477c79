/* cuda_bench.c - the device measurements scripts/gpu-check runs (not a
 * unit test: scripts/run-unit.sh runs only test_*).
 *
 *   cuda_bench --write-model PATH [--shape 135m|1.1b|tiny]
 *       a random llama GGUF of that shape: 135m = SmolLM2-135M's shapes and
 *       types (Q4_1 matrices, Q8_0 token_embd, tied output, 49,152 tokens);
 *       1.1b = TinyLlama-1.1B's (22 layers, 2048 wide, 5632 FFN, 32/4
 *       heads, 32,000 tokens, Q4_0 matrices, Q6_K output); tiny = a 2-layer
 *       stand-in for dry runs on the host build;
 *   cuda_bench --bench MODEL [--gemm N] [--backend cuda|cpu] [--prefill P] [--decode D]
 *       prefill of P tokens (default 512), D decode steps (default 128), d2d
 *       copy bandwidth in the same run, the prefill's logits against the CPU
 *       backend; --backend cpu is a dry run of this code;
 *   cuda_bench --matmul-bw [--n N] [--reps R] [--tokens T]
 *       per weight type, an N x N matrix (default 8192) times T tokens
 *       (default 1), R launches (default 50) timed with events on the
 *       backend's stream: weight bytes read per second against the d2d
 *       copy rate, and the result against a double reference of 64 rows.
 * Exit 0 when every measurement ran and every comparison held.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend_select.h"
#include "format/gguf_write.h"
#include "forward/forward.h"
#include "kernels/dtype.h"
#include "mem/mem.h"
#include "testutil.h"
#ifdef KVANT_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

typedef struct bb { /* a backend and the memory manager it allocates from */
    backend *be;
    mem_mgr *mem;
} bb;

static int bb_open(bb *b, const char *name, double share, int flags)
{
    kvant_err err = {0};
    backend_device_info dev;
    memset(b, 0, sizeof *b);
    if (backend_query(name, 0, &dev, &err) == KV_OK &&
        (b->mem = mem_create((uint64_t)(dev.free_memory * share), dev.alloc, &err)))
        b->be = backend_create(name, 0, b->mem, 0, flags, &err);
    if (!b->be)
        fprintf(stderr, "cuda_bench: backend %s: %s\n", name, err.msg);
    return b->be ? 0 : -1;
}

static void bb_close(bb *b)
{
    if (b->be)
        b->be->ops->destroy(b->be);
    if (b->mem)
        mem_destroy(b->mem);
    memset(b, 0, sizeof *b);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static float *rand_vec(tu_rng *r, int64_t n, float scale)
{
    float *v = malloc((size_t)n * sizeof *v);
    KV_ASSERT(v);
    for (int64_t i = 0; i < n; i++)
        v[i] = scale * tu_rand_normal(r);
    return v;
}

static double d2d_gbps(const char *be_name)
{
    double gbps = 0.0;
#ifdef KVANT_CUDA
    kvant_err err = {0};
    if (!strcmp(be_name, "cuda") && cuda_backend_d2d_bandwidth(0, (size_t)256 << 20, 20, &gbps,
                                                               &err) != KV_OK) {
        fprintf(stderr, "cuda_bench: d2d: %s\n", err.msg);
        CHECK(0);
    }
#endif
    return gbps;
}

/* ---- --write-model ---- */

typedef struct bm_shape {
    const char *name;
    int32_t vocab, embd, ff, layers, heads, heads_kv;
    uint32_t mat_type, embd_type, out_type; /* out_type 0: tied output */
} bm_shape;

static const bm_shape k_shapes[] = {
    {"135m", 49152, 576, 1536, 30, 9, 3, DT_Q4_1, DT_Q8_0, 0},
    {"1.1b", 32000, 2048, 5632, 22, 32, 4, DT_Q4_0, DT_Q4_0, DT_Q6_K},
    {"tiny", 512, 256, 512, 2, 4, 2, DT_Q4_0, DT_Q8_0, 0},
};

static void bm_byte_token(int b, char out[8]) /* GPT-2's byte-to-unicode, as UTF-8 */
{
    int cp = b, n = 0;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
        for (int x = 0; x < b; x++)
            n += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255));
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp, out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3F)), out[2] = 0;
    }
}

/* Adds a random tensor [ne1][ne0] of `type` (f32 for vectors); the bytes are
 * kept in keep[] until the file is written.  reuse: the bytes of an earlier
 * tensor of the same shape and type (later layers repeat layer 0's: the same
 * bytes moved per token, a 1.1B file written in seconds). */
static int bm_tensor(gguf_writer *w, tu_rng *r, void **keep, int *nk, const char *name,
                     uint32_t type, int64_t ne0, int64_t ne1, float scale, float off,
                     const void *reuse)
{
    if (ne1 == 1)
        type = DT_F32;
    const void *q = reuse;
    if (!q) {
        float *f = rand_vec(r, ne0 * ne1, scale);
        for (int64_t i = 0; i < ne0 * ne1; i++)
            f[i] += off;
        void *b = malloc(dtype_row_size(type, ne0) * (size_t)ne1);
        KV_ASSERT(b);
        dtype_get(type)->from_float(f, b, ne0 * ne1);
        free(f);
        keep[(*nk)++] = b;
        q = b;
    }
    uint64_t ne[2] = {(uint64_t)ne0, (uint64_t)ne1};
    return gguf_writer_add_tensor(w, name, type, ne1 > 1 ? 2 : 1, ne, q, NULL);
}

static int bm_header(gguf_writer *w, const bm_shape *s, char (*store)[16], const char **toks,
                     int32_t *types)
{
    int rc = 0, hd = s->embd / s->heads;
    for (int i = 0; i < s->vocab; i++) {
        if (i < 256)
            bm_byte_token(i, store[i]);
        else
            snprintf(store[i], sizeof store[i], "<|t%d|>", i);
        toks[i] = store[i];
        types[i] = i < 256 ? 1 : 3;
    }
    rc |= gguf_writer_add_str(w, "general.architecture", "llama", NULL);
    rc |= gguf_writer_add_u32(w, "llama.block_count", (uint32_t)s->layers, NULL);
    rc |= gguf_writer_add_u32(w, "llama.context_length", 8192, NULL);
    rc |= gguf_writer_add_u32(w, "llama.embedding_length", (uint32_t)s->embd, NULL);
    rc |= gguf_writer_add_u32(w, "llama.feed_forward_length", (uint32_t)s->ff, NULL);
    rc |= gguf_writer_add_u32(w, "llama.attention.head_count", (uint32_t)s->heads, NULL);
    rc |= gguf_writer_add_u32(w, "llama.attention.head_count_kv", (uint32_t)s->heads_kv, NULL);
    rc |= gguf_writer_add_u32(w, "llama.rope.dimension_count", (uint32_t)hd, NULL);
    rc |= gguf_writer_add_f32(w, "llama.rope.freq_base", 100000.0f, NULL);
    rc |= gguf_writer_add_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f, NULL);
    rc |= gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2", NULL);
    rc |= gguf_writer_add_str(w, "tokenizer.ggml.pre", "default", NULL);
    rc |= gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, (uint64_t)s->vocab, NULL);
    rc |= gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types,
                              (uint64_t)s->vocab, NULL);
    rc |= gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", toks, 0, NULL);
    rc |= gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 256, NULL);
    rc |= gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 257, NULL);
    return rc;
}

static int write_model(const char *path, const bm_shape *s)
{
    gguf_writer *w = gguf_writer_create();
    char(*store)[16] = calloc((size_t)s->vocab, sizeof *store);
    const char **toks = calloc((size_t)s->vocab, sizeof *toks);
    int32_t *types = calloc((size_t)s->vocab, sizeof *types);
    void **keep = calloc((size_t)(8 + 9 * s->layers), sizeof *keep);
    int nk = 0, rc = !w || !store || !toks || !types || !keep;
    int64_t kvw = (int64_t)s->embd / s->heads * s->heads_kv;
    tu_rng r = {135};
    rc = rc || bm_header(w, s, store, toks, types);
    rc |= bm_tensor(w, &r, keep, &nk, "token_embd.weight", s->embd_type, s->embd, s->vocab,
                    0.05f, 0.0f, NULL);
    rc |= bm_tensor(w, &r, keep, &nk, "output_norm.weight", DT_F32, s->embd, 1, 0.1f, 1.0f, NULL);
    if (s->out_type)
        rc |= bm_tensor(w, &r, keep, &nk, "output.weight", s->out_type, s->embd, s->vocab, 0.05f,
                        0.0f, NULL);
    int layer0 = nk;
    for (int il = 0; !rc && il < s->layers; il++) {
        struct { const char *n; int64_t ne0, ne1; float sc, off; } ls[] = {
            {"attn_norm", s->embd, 1, 0.1f, 1}, {"attn_q", s->embd, s->embd, 0.04f, 0},
            {"attn_k", s->embd, kvw, 0.04f, 0}, {"attn_v", s->embd, kvw, 0.04f, 0},
            {"attn_output", s->embd, s->embd, 0.04f, 0}, {"ffn_norm", s->embd, 1, 0.1f, 1},
            {"ffn_gate", s->embd, s->ff, 0.04f, 0}, {"ffn_up", s->embd, s->ff, 0.04f, 0},
            {"ffn_down", s->ff, s->embd, 0.025f, 0},
        };
        for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s.weight", il, ls[i].n);
            rc |= bm_tensor(w, &r, keep, &nk, name, s->mat_type, ls[i].ne0, ls[i].ne1, ls[i].sc,
                            ls[i].off, il ? keep[layer0 + (int)i] : NULL);
        }
    }
    kvant_err err = {0};
    if (!rc && (rc = gguf_writer_write(w, path, &err)))
        fprintf(stderr, "cuda_bench: write %s: %s\n", path, err.msg);
    if (w)
        gguf_writer_destroy(w);
    for (int i = 0; i < nk; i++)
        free(keep[i]);
    free(keep), free(types), free(toks), free(store);
    return rc ? 1 : 0;
}

/* ---- --bench ---- */

#define B_REPS 3
#define B_BS 16

/* Matmul weight bytes one token reads (as cmd_bench counts them). */
static double weight_bytes(const model *m)
{
    double b = (double)(m->tied_output ? m->tok_embd.nbytes : m->output.nbytes);
    for (int32_t l = 0; l < m->hp.n_layers; l++) {
        const model_layer *L = &m->layers[l];
        b += (double)(L->wq.nbytes + L->wk.nbytes + L->wv.nbytes + L->wo.nbytes +
                      L->w_gate.nbytes + L->w_up.nbytes + L->w_down.nbytes);
    }
    return b;
}

typedef struct bench_run {
    double prefill_s, decode_s; /* best prefill; decode total over n_decode steps */
    float *last;                /* [n_vocab] logits of the prefill's last token */
} bench_run;

typedef struct bench_seq { /* one sequence's tokens and positions */
    int32_t *tok, *pos, *seq, *table, nb, n_prefill, n_decode;
} bench_seq;

static int bench_steps(fwd_ctx *f, const bench_seq *q, int timed, bench_run *out,
                       kvant_err *err)
{
    int32_t last = q->n_prefill - 1;
    fwd_seq s = {.block_table = q->table, .n_blocks = q->nb};
    fwd_batch pf = {q->n_prefill, q->tok, q->pos, q->seq, 1, &s, 1, &last, 0};
    int rc = KV_OK;
    out->prefill_s = 1e30;
    for (int rep = 0; !rc && rep < (timed ? B_REPS + 1 : 1); rep++) {
        double t0 = now_s();
        rc = fwd_run(f, &pf, out->last, err);
        if (rep > 0 && now_s() - t0 < out->prefill_s) /* rep 0 warms up */
            out->prefill_s = now_s() - t0;
    }
    double t0 = now_s();
    for (int32_t i = 0; timed && !rc && i < q->n_decode; i++) {
        int32_t p = q->n_prefill + i, zero = 0, t = q->tok[i % q->n_prefill];
        fwd_batch d = {1, &t, &p, &zero, 1, &s, 1, &zero, 0};
        rc = fwd_run(f, &d, out->last, err);
    }
    out->decode_s = now_s() - t0;
    if (timed && !rc) /* the decodes overwrote out->last: redo the prefill's logits */
        rc = fwd_run(f, &pf, out->last, err);
    return rc;
}

static int bench_backend(const char *be_name, const char *path, int32_t gemm, int timed,
                         int32_t n_prefill, int32_t n_decode, bench_run *out)
{
    kvant_err err = {0};
    bb b = {0};
    model *m = model_load(path, &err);
    int rc = m ? bb_open(&b, be_name, 0.9, BACKEND_EXACT) : KV_EIO;
    if (!rc)
        rc = b.be->ops->load_weights(b.be, m, &err);
#ifdef KVANT_CUDA
    if (!rc && gemm && !strcmp(be_name, "cuda"))
        rc = cuda_backend_set_gemm_min_tokens(b.be, gemm, &err);
#endif
    (void)gemm;
    bench_seq q = {.nb = (n_prefill + n_decode) / B_BS + 1, .n_prefill = n_prefill,
                   .n_decode = n_decode};
    q.tok = malloc((size_t)n_prefill * 3 * sizeof(int32_t));
    q.table = malloc((size_t)q.nb * sizeof(int32_t));
    KV_ASSERT(q.tok && q.table);
    q.pos = q.tok + n_prefill, q.seq = q.pos + n_prefill;
    fwd_ctx f;
    kv_layout lay = m ? fwd_kv_layout(m, q.nb, B_BS, DT_F32) : (kv_layout){0};
    int inited = !rc && (rc = fwd_init(&f, m, b.be, n_prefill, 1, &lay, &err)) == KV_OK;
    for (int32_t i = 0; i < q.nb; i++)
        q.table[i] = i;
    tu_rng r = {2024};
    for (int32_t i = 0; m && i < n_prefill; i++)
        q.tok[i] = (int32_t)(tu_rand_u64(&r) % (uint64_t)m->hp.n_vocab), q.pos[i] = i, q.seq[i] = 0;
    out->last = m ? malloc((size_t)m->hp.n_vocab * sizeof(float)) : NULL;
    if (!rc)
        rc = bench_steps(&f, &q, timed, out, &err);
    if (rc)
        fprintf(stderr, "cuda_bench %s: %s\n", be_name, err.msg[0] ? err.msg : "failed");
    if (inited)
        fwd_free(&f);
    if (b.be && m)
        b.be->ops->unload_weights(b.be, m);
    bb_close(&b);
    if (m)
        model_free(m);
    free(q.tok), free(q.table);
    return rc;
}

static void bench_print(const char *be_name, int32_t gemm, const bench_seq *q, const bench_run *g,
                        double wb, double gbps, double md, double mx, int32_t ag, int32_t ac)
{
    double tpt = g->decode_s / q->n_decode;
    char v[7][64], k0[40], k1[48];
    int32_t n_prefill = q->n_prefill;
    snprintf(k0, sizeof k0, "prefill %d tokens", n_prefill);
    snprintf(k1, sizeof k1, "decode %d steps (1 token each)", q->n_decode);
    snprintf(v[0], 64, "%.2f ms, %.0f tok/s", g->prefill_s * 1e3, n_prefill / g->prefill_s);
    snprintf(v[1], 64, "%.3f ms/tok, %.1f tok/s", tpt * 1e3, 1.0 / tpt);
    snprintf(v[2], 64, "%.1f GB/s (%.1f%% of d2d)", wb / tpt / 1e9,
             gbps > 0 ? 100.0 * wb / tpt / 1e9 / gbps : 0.0);
    snprintf(v[3], 64, "%.1f GB/s", gbps);
    snprintf(v[4], 64, "%.2e (max abs logit %.2f)", md, mx);
    snprintf(v[5], 64, "%d / %d", ag, ac);
    snprintf(v[6], 64, "%s, gemm_min_tokens %d", be_name, gemm);
    const char *k[7] = {k0, k1, "decode weight traffic",
                        "d2d cudaMemcpy (read+write)", "prefill logits vs cpu: max abs diff",
                        "prefill argmax: this / cpu", "backend"};
    printf("\n| %-35s | %-32s |\n|%s|%s|\n", "", "", "-------------------------------------",
           "----------------------------------");
    printf("| %-35s | %-32s |\n", k[6], v[6]);
    for (int i = 0; i < 6; i++)
        printf("| %-35s | %-32s |\n", k[i], v[i]);
    printf("\n");
}

static int bench_main(const char *path, int32_t gemm, const char *be_name, int32_t n_prefill,
                      int32_t n_decode)
{
    kvant_err err = {0};
    bench_run g = {0}, c = {0};
    model *m = model_load(path, &err);
    if (!m) {
        fprintf(stderr, "cuda_bench: %s\n", err.msg);
        return 1;
    }
    double wb = weight_bytes(m);
    int32_t n_vocab = m->hp.n_vocab;
    model_free(m);
    bench_seq q = {.n_prefill = n_prefill, .n_decode = n_decode};
    if (n_prefill < 1 || n_decode < 1) {
        fprintf(stderr, "cuda_bench: --prefill and --decode must be >= 1\n");
        return 2;
    }
    CHECK(bench_backend(be_name, path, gemm, 1, n_prefill, n_decode, &g) == KV_OK);
    double gbps = d2d_gbps(be_name);
    CHECK(bench_backend("cpu", path, 0, 0, n_prefill, n_decode, &c) == KV_OK); /* reference */
    double mx = 0.0, md = 0.0;
    int32_t ag = 0, ac = 0;
    for (int32_t i = 0; g.last && c.last && i < n_vocab; i++) {
        mx = fmax(mx, fabs(c.last[i]));
        md = fmax(md, fabs((double)c.last[i] - g.last[i]));
        ag = g.last[i] > g.last[ag] ? i : ag;
        ac = c.last[i] > c.last[ac] ? i : ac;
    }
    if (g.last && c.last) {
        bench_print(be_name, gemm, &q, &g, wb, gbps, md, mx, ag, ac);
        CHECKF(md <= 1e-2 * mx, "prefill logits differ from the CPU backend by %g (max %g)", md,
               mx);
        CHECKF(ag == ac || fabs(c.last[ag] - c.last[ac]) <= 1e-2 * mx, "argmax %d vs %d", ag, ac);
    }
    free(g.last), free(c.last);
    return tu_finish("cuda_bench --bench");
}

/* ---- --matmul-bw ---- */

static const uint32_t k_types[] = {DT_F32, DT_F16, DT_BF16, DT_Q4_0, DT_Q4_1, DT_Q5_0,
                                   DT_Q5_1, DT_Q8_0, DT_Q4_K, DT_Q5_K, DT_Q6_K};

/* The first `rows` outputs of W x against a double dot of the reference
 * dequantization: max |d| / sum |w x| over them. */
static double mm_check(uint32_t type, const void *q, int64_t n, int64_t rows, const float *x,
                       const float *y)
{
    float *deq = malloc((size_t)n * sizeof *deq);
    KV_ASSERT(deq);
    double worst = 0.0;
    size_t rb = dtype_row_size(type, n);
    for (int64_t r = 0; r < rows; r++) {
        dtype_get(type)->to_float_ref((const uint8_t *)q + rb * (size_t)r, deq, n);
        double e = 0.0, s = 0.0;
        for (int64_t i = 0; i < n; i++)
            e += (double)deq[i] * x[i], s += fabs((double)deq[i] * x[i]);
        worst = fmax(worst, fabs(e - y[r]) / (s + 1e-30));
    }
    free(deq);
    return worst;
}

static void bw_one(bb *b, uint32_t type, int64_t n, int32_t tokens, int reps, double gbps)
{
    tu_rng r = {(uint64_t)type * 7919 + 1};
    kvant_err err = {0};
    float *f = rand_vec(&r, n * n, 0.5f), *x = rand_vec(&r, n * tokens, 1.0f);
    float *y = malloc((size_t)n * tokens * sizeof *y);
    size_t rb = dtype_row_size(type, n), wbytes = rb * (size_t)n;
    void *q = malloc(wbytes);
    KV_ASSERT(y && q);
    dtype_get(type)->from_float(f, q, n * n);
    free(f);
    model_tensor W = {.type = type, .ne = {n, n}, .row_bytes = rb, .nbytes = wbytes, .data = q,
                      .layer = -1};
    W.dev = b->be->ops->alloc(b->be, wbytes, MEM_OTHER, MEM_NO_LAYER, &err);
    float *dx = b->be->ops->alloc(b->be, (size_t)n * tokens * 4, MEM_OTHER, MEM_NO_LAYER, &err);
    float *dy = b->be->ops->alloc(b->be, (size_t)n * tokens * 4, MEM_OTHER, MEM_NO_LAYER, &err);
    double ms = 0.0, worst = 1.0;
    int rc = W.dev && dx && dy ? KV_OK : KV_ENOMEM;
    if (!rc)
        rc = b->be->ops->upload(b->be, W.dev, q, wbytes) ||
             b->be->ops->upload(b->be, dx, x, (size_t)n * tokens * 4);
#ifdef KVANT_CUDA
    if (!rc)
        rc = cuda_backend_time_matmul(b->be, &W, dx, dy, tokens, reps, &ms, &err);
#else
    (void)reps;
    rc = KV_EUNSUP;
#endif
    if (!rc)
        rc = b->be->ops->download(b->be, y, dy, (size_t)n * 4); /* token 0's outputs */
    if (!rc)
        worst = mm_check(type, q, n, 64, x, y);
    double rate = ms > 0 ? (double)wbytes * reps / (ms * 1e-3) / 1e9 : 0.0;
    printf("| %-6s | %8.1f MiB | %9.3f ms | %8.1f GB/s | %6.1f%% | %9.2e |\n",
           dtype_get(type)->name, wbytes / 1048576.0, ms / reps, rate,
           gbps > 0 ? 100.0 * rate / gbps : 0.0, worst);
    CHECKF(rc == KV_OK, "matmul %s: %s", dtype_get(type)->name, err.msg);
    CHECKF(worst <= 5e-5, "matmul %s: relative error %g (bound 5e-5 of sum |w x|)",
           dtype_get(type)->name, worst);
    if (W.dev)
        b->be->ops->free(b->be, W.dev);
    if (dx)
        b->be->ops->free(b->be, dx);
    if (dy)
        b->be->ops->free(b->be, dy);
    free(q), free(x), free(y);
}

static int matmul_bw_main(int64_t n, int32_t tokens, int reps)
{
    bb b;
    if (bb_open(&b, "cuda", 0.9, 0))
        return 1;
    double gbps = d2d_gbps("cuda");
    printf("\nmatmul %lld x %lld, %d token(s), %d launches timed with events; d2d %.1f GB/s\n",
           (long long)n, (long long)n, tokens, reps, gbps);
    printf("| %-6s | %12s | %12s | %13s | %7s | %9s |\n", "type", "weights", "per launch",
           "weights read", "of d2d", "max err");
    for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++)
        bw_one(&b, k_types[i], n, tokens, reps, gbps);
    bb_close(&b);
    return tu_finish("cuda_bench --matmul-bw");
}

/* ---- main ---- */

static const char *opt(int argc, char **argv, const char *name, const char *dflt)
{
    for (int i = 2; i + 1 < argc; i++)
        if (!strcmp(argv[i], name))
            return argv[i + 1];
    return dflt;
}

int main(int argc, char **argv)
{
    dtype_init();
    if (argc >= 3 && !strcmp(argv[1], "--write-model")) {
        const char *shape = opt(argc, argv, "--shape", "135m");
        for (size_t i = 0; i < sizeof k_shapes / sizeof k_shapes[0]; i++)
            if (!strcmp(shape, k_shapes[i].name))
                return write_model(argv[2], &k_shapes[i]);
        fprintf(stderr, "cuda_bench: unknown --shape '%s' (135m, 1.1b or tiny)\n", shape);
        return 2;
    }
    if (argc >= 3 && !strcmp(argv[1], "--bench"))
        return bench_main(argv[2], atoi(opt(argc, argv, "--gemm", "0")),
                          opt(argc, argv, "--backend", "cuda"),
                          atoi(opt(argc, argv, "--prefill", "512")),
                          atoi(opt(argc, argv, "--decode", "128")));
    if (argc >= 2 && !strcmp(argv[1], "--matmul-bw"))
        return matmul_bw_main(atoll(opt(argc, argv, "--n", "8192")),
                              atoi(opt(argc, argv, "--tokens", "1")),
                              atoi(opt(argc, argv, "--reps", "50")));
    fprintf(stderr, "usage: cuda_bench --write-model PATH [--shape 135m|1.1b|tiny]\n"
                    "       cuda_bench --bench MODEL [--gemm N] [--backend cuda|cpu] "
                    "[--prefill P] [--decode D]\n"
                    "       cuda_bench --matmul-bw [--n N] [--tokens T] [--reps R]\n");
    return 2;
}
