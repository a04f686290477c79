/* cli_xplan.c - `kvant plan --weights-memory` for a mixture of experts (see
 * cli_xplan.h).
 *
 * The calibration decode runs within the budget (the cache at the planned
 * slots), so its second half is a measurement at that budget: the hit
 * rate of its replay equals what the cache counted, and its time per token
 * less its expert reads (at the probe's read rate) is the compute time per
 * token.  Other budgets are predicted: the trace replayed at their slot
 * counts gives their reads per token, each costing one expert's bytes at
 * the one-reader rate when alone in its group, at the side-by-side rate
 * when the group has other misses (xcache_get_group reads those on the
 * pool's threads), while the matmuls wait; the compute time per token is
 * taken as the same. */
#include "cli/cli_xplan.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/cpu/tpool.h"
#include "kernels/dtype.h"
#include "model/wstream.h"
#include "text/tokenizer.h"

#define XPLAN_RANDOM_TOKENS 256
#define XPLAN_MAX_TOKENS 512
#define XPLAN_READ_PROBE (512ull << 20) /* expert bytes read per pass of the read probe */
#define XPLAN_READ_PASSES 4             /* one to warm the page cache, the median of the rest */
#define XPLAN_MAX_READERS 64

void cli_xplan_free(cli_xplan *x)
{
    free(x->resident);
    x->resident = NULL;
}

/* The calibration tokens: the file's (at most XPLAN_MAX_TOKENS), or
 * XPLAN_RANDOM_TOKENS uniform random ids.  *n their count; NULL + err. */
static int32_t *calib_tokens(const model *m, const char *path, int32_t *n, kvant_err *err)
{
    if (!path) {
        int32_t *t = malloc(XPLAN_RANDOM_TOKENS * sizeof *t);
        if (!t) {
            kvant_err_set(err, KV_ENOMEM, "out of memory");
            return NULL;
        }
        uint64_t s = 0x2545F4914F6CDD1Dull;
        for (int32_t i = 0; i < XPLAN_RANDOM_TOKENS; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            t[i] = (int32_t)(s % (uint64_t)m->hp.n_vocab);
        }
        *n = XPLAN_RANDOM_TOKENS;
        return t;
    }
    size_t len;
    char *text = cli_read_file(path, &len, err);
    if (!text)
        return NULL;
    int32_t *t = malloc(XPLAN_MAX_TOKENS * sizeof *t);
    int64_t got = t ? tok_encode(m->tok, text, len, tok_add_bos(m->tok), 0, t, XPLAN_MAX_TOKENS,
                                 err) : -1;
    free(text);
    if (got < 1) {
        free(t);
        if (got == 0 || !err->code)
            kvant_err_set(err, KV_EINVAL, "--calibration %s: %s", path,
                          got == 0 ? "no tokens" : "out of memory");
        return NULL;
    }
    *n = got < XPLAN_MAX_TOKENS ? (int32_t)got : XPLAN_MAX_TOKENS;
    return t;
}

static double xplan_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Decodes the calibration tokens one at a time through c's model with the
 * cache at the planned slots (none: every expert resident), its trace
 * recorded (*trace, *len; *half where the second half starts); the second
 * half's seconds in *secs. */
static int calibrate(const cli_common *c, const char *calib, int32_t most_used, cli_xplan *x,
                     int32_t **trace, int64_t *len, int64_t *half, double *secs,
                     kvant_err *err)
{
    cli_common cc = *c;
    cc.weights_memory = x->n_slots ? x->cap : 0, cc.weights_memory_frac = 0;
    cli_session s;
    if (cli_session_open(&s, &cc, XPLAN_MAX_TOKENS, 1, 1, err))
        return err->code ? err->code : KV_EIO;
    int rc = !x->n_slots || s.xc ? KV_OK : kvant_err_set(err, KV_EINVAL, "no expert cache at "
                                                          "%d slots", x->n_slots);
    int32_t n = 0, *tok = rc ? NULL : calib_tokens(s.m, calib, &n, err);
    if (!rc && !tok)
        rc = err->code ? err->code : KV_EINVAL;
    n = n < s.n_ctx ? n : s.n_ctx;
    /* a token's entries: its experts and at most one unpin per expert and layer */
    const int64_t cap = (int64_t)n * x->n_layers * (most_used + x->n_expert + 1);
    if (!rc && s.xc && !(*trace = malloc((size_t)cap * sizeof **trace)))
        rc = kvant_err_set(err, KV_ENOMEM, "out of memory");
    if (!rc && s.xc)
        xcache_trace(s.xc, *trace, cap);
    double t0 = xplan_now();
    for (int32_t i = 0; !rc && i < n; i++) {
        if (i == n / 2) {
            *half = s.xc ? xcache_trace_len(s.xc) : 0;
            t0 = xplan_now();
        }
        rc = cli_session_eval(&s, tok + i, 1, i, 0, s.logits, err);
    }
    *secs = xplan_now() - t0;
    if (s.xc) {
        *len = xcache_trace_len(s.xc);
        xcache_trace(s.xc, NULL, 0);
        if (!rc && *len > cap)
            rc = kvant_err_set(err, KV_EINVAL, "calibration trace of %lld entries",
                               (long long)*len);
    }
    x->calib_tokens = n;
    x->counted_tokens = n - n / 2;
    snprintf(x->calib, sizeof x->calib, "%s", calib ? calib : "");
    free(tok);
    cli_session_close(&s);
    return rc;
}

/* One reader's share of a pass over the experts as the cache reads them:
 * each expert's gate, up and down rows by one pread each (direct: the
 * aligned region around them, with O_DIRECT) into one of n_buf slot buffers
 * in turn, layer after layer, the experts k with k % nth == ith of the
 * first XPLAN_READ_PROBE bytes. */
typedef struct rd_pass {
    const model *m;
    int fd, direct, ith, nth;
    uint8_t *buf;          /* [n_buf][slot], WSTREAM_DIO_ALIGN-aligned */
    uint64_t slot;
    int32_t n_buf;
    int ok;
    uint64_t done;         /* the pass's bytes, every reader's share counted */
} rd_pass;

static void *read_pass(void *arg)
{
    rd_pass *r = arg;
    const uint64_t A = WSTREAM_DIO_ALIGN;
    uint64_t done = 0;
    int32_t k = 0;
    r->ok = 1;
    for (int32_t il = 0; il < r->m->hp.n_layers && done < XPLAN_READ_PROBE; il++) {
        const model_layer *L = &r->m->layers[il];
        for (int32_t e = 0; L->n_expert && e < L->n_expert && done < XPLAN_READ_PROBE; e++) {
            const model_tensor *t[3];
            int64_t row0[3], rows[3];
            model_expert_rows(L, e, t, row0, rows);
            const int mine = k % r->nth == r->ith;
            uint8_t *dst = r->buf + (uint64_t)(k++ / r->nth % r->n_buf) * r->slot;
            for (int i = 0; i < 3; i++) {
                const uint64_t n = (uint64_t)rows[i] * t[i]->row_bytes,
                               off = t[i]->file_off + (uint64_t)row0[i] * t[i]->row_bytes,
                               a0 = r->direct ? off - off % A : off,
                               an = r->direct ? (off + n + A - 1) / A * A - a0 : n;
                done += n;
                if (!mine)
                    continue;
                if (pread(r->fd, dst, an, (off_t)a0) < (ssize_t)(off - a0 + n))
                    r->ok = 0;
                dst += r->direct ? (n + A - 1) / A * A + A : n;
            }
        }
    }
    r->done = done;
    return NULL;
}

/* Bytes/s of one pass with nth readers side by side (as xcache_get_group
 * reads a group's misses on the pool's threads); 0 on a failed read. */
static double read_rate(const model *m, int fd, int direct, uint8_t *buf, uint64_t slot,
                        int32_t n_buf, int nth)
{
    rd_pass r[XPLAN_MAX_READERS];
    pthread_t th[XPLAN_MAX_READERS];
    int started = 0;
    const double t0 = xplan_now();
    for (int i = 0; i < nth; i++)
        r[i] = (rd_pass){m, fd, direct, i, nth, buf + (uint64_t)i * n_buf * slot, slot, n_buf,
                         0, 0};
    for (int i = 1; i < nth; i++)
        started += pthread_create(&th[i], NULL, read_pass, &r[i]) == 0;
    read_pass(&r[0]);
    for (int i = 1; i <= started; i++)
        pthread_join(th[i], NULL);
    const double dt = xplan_now() - t0;
    int ok = started == nth - 1;
    for (int i = 0; i < nth; i++)
        ok &= r[i].ok;
    return ok && dt > 0 ? (double)r[0].done / dt : 0.0;
}

static double median3(double *r, int n)
{
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (r[j] < r[i]) {
                const double t = r[i];
                r[i] = r[j], r[j] = t;
            }
    return r[n / 2];
}

/* The read rates of the expert cache's reads, one reader (*alone) and nth
 * side by side (*shared): through the page cache (the rates file's read
 * rate is of 4 MiB chunks into a buffer as large as a layer, which leaves
 * the caches; a slot is rewritten while it may still be in them), or with
 * O_DIRECT where asked for and not refused.  KV_OK, or KV_EIO. */
static int expert_read_rates(const model *m, int32_t n_buf, int direct, int nth, double *alone,
                             double *shared, kvant_err *err)
{
    nth = nth < 1 ? 1 : nth > XPLAN_MAX_READERS ? XPLAN_MAX_READERS : nth;
    const uint64_t slot = xcache_slot_bytes(m, direct), A = WSTREAM_DIO_ALIGN;
    int fd = direct ? open(m->path, O_RDONLY | O_CLOEXEC | O_DIRECT) : -1;
    if (fd < 0)
        fd = open(m->path, O_RDONLY | O_CLOEXEC), direct = 0;
    const uint64_t bytes = (slot * (uint64_t)n_buf * (uint64_t)nth + A - 1) / A * A;
    uint8_t *buf = fd >= 0 ? aligned_alloc(A, bytes) : NULL;
    double r1[XPLAN_READ_PASSES], rn[XPLAN_READ_PASSES];
    int n = 0;
    for (int pass = 0; buf && pass < XPLAN_READ_PASSES; pass++) {
        double v = read_rate(m, fd, direct, buf, slot, n_buf, 1);
        if (!(v > 0) && direct && pass == 0) { /* O_DIRECT refused the read: the page cache */
            close(fd);
            fd = open(m->path, O_RDONLY | O_CLOEXEC), direct = 0;
            v = fd >= 0 ? read_rate(m, fd, 0, buf, slot, n_buf, 1) : 0.0;
        }
        const double w = v > 0 ? read_rate(m, fd, direct, buf, slot, n_buf, nth) : 0.0;
        if (v > 0 && w > 0 && pass > 0)
            r1[n] = v, rn[n++] = w;
    }
    free(buf);
    if (fd >= 0)
        close(fd);
    if (n < XPLAN_READ_PASSES - 1)
        return kvant_err_set(err, KV_EIO, "%s: cannot time the experts' reads", m->path);
    *alone = median3(r1, n);
    *shared = median3(rn, n);
    return KV_OK;
}

/* The shape's bytes: dense, a slot, one expert (mean over layers). */
static void shape_bytes(const model *m, cli_xplan *x, int32_t *used)
{
    x->model_bytes = m->weights_bytes;
    x->dense_bytes = m->weights_bytes - xcache_expert_bytes(m);
    x->slot_bytes = xcache_slot_bytes(m, x->direct);
    double per = 0;
    int32_t n_moe = 0;
    for (int32_t il = 0; il < m->hp.n_layers; il++) {
        const model_layer *L = &m->layers[il];
        used[il] = L->n_expert ? L->n_expert_used : 0;
        if (!L->n_expert)
            continue;
        per += (double)(L->gate_exps.nbytes + L->up_exps.nbytes + L->gate_up_exps.nbytes +
                        L->down_exps.nbytes) / L->n_expert;
        n_moe++;
    }
    x->expert_bytes = n_moe ? per / n_moe : 0;
}

/* The trace's counted part replayed at n_slots into r (resident: NULL or
 * [n_ids]): hits, reads and their seconds per token (a miss alone in its
 * group at the one-reader rate, the others at the side-by-side rate); tok_s
 * from x->compute_s. */
static int replay_row(const cli_xplan *x, const int32_t *trace, int64_t len, int64_t half,
                      int32_t n_slots, uint8_t *resident, cli_xplan_row *r, kvant_err *err)
{
    xcache_pred p;
    int rc = xcache_replay(trace, len, half, x->n_ids, n_slots, resident, &p, err);
    if (rc)
        return rc;
    const double n = x->counted_tokens, b = x->expert_bytes;
    r->n_slots = n_slots;
    r->weights_bytes = x->dense_bytes + (uint64_t)n_slots * x->slot_bytes +
                       (x->direct ? WSTREAM_DIO_ALIGN : 0);
    r->hit_rate = p.hits + p.misses ? (double)p.hits / (double)(p.hits + p.misses) : 1.0;
    r->reads_per_token = (double)p.misses / n;
    r->read_s = ((double)(p.misses - p.shared_misses) * b / x->read_bps +
                 (double)p.shared_misses * b / x->read_shared_bps) / n;
    r->tok_s = 1.0 / (x->compute_s + r->read_s);
    return KV_OK;
}

/* The planned budget's row (its reads out of the calibration's time give
 * the compute time per token) and the other slot counts' (a tenth of the
 * experts to all of them, those holding a token's experts). */
static int replay_rows(cli_xplan *x, const int32_t *trace, int64_t len, int64_t half,
                       int32_t most, double per, kvant_err *err)
{
    int rc = replay_row(x, trace, len, half, x->n_slots, x->resident, &x->at, err);
    if (rc)
        return rc;
    /* at least a tenth of the time left to compute, whatever the read rates say */
    x->compute_s = per - x->at.read_s > 0.1 * per ? per - x->at.read_s : 0.1 * per;
    x->at.tok_s = 1.0 / (x->compute_s + x->at.read_s);
    for (int k = 1; !rc && k <= XPLAN_MAX_ROWS; k++) {
        const int32_t n = (int32_t)((int64_t)x->n_ids * k / XPLAN_MAX_ROWS);
        if (n >= most && n != x->n_slots)
            rc = replay_row(x, trace, len, half, n, NULL, &x->rows[x->n_rows++], err);
    }
    return rc;
}

int cli_xplan_make(const cli_common *c, uint64_t cap, const char *calib, cli_xplan *x,
                   kvant_err *err)
{
    memset(x, 0, sizeof *x);
    if (c->weights_dtype >= 0)
        return kvant_err_set(err, KV_EUNSUP, "--weights-memory with --weights-dtype: experts "
                             "are read as stored");
    x->cap = cap;
    x->n_threads = c->n_threads > 0 ? c->n_threads : tpool_default_threads();
    snprintf(x->isa, sizeof x->isa, "%s", dtype_isa());
    model *m = model_load(c->model_path, err);
    if (!m)
        return err->code ? err->code : KV_EIO;
    int32_t used[MODEL_MAX_LAYERS], most = 0;
    int rc = model_has_experts(m) ? KV_OK
                                  : kvant_err_set(err, KV_EINVAL, "not a mixture of experts");
    if (!rc)
        rc = xcache_options(c->weights_io, c->weights_place, c->weights_slots, &x->direct, err);
    if (!rc) {
        x->n_layers = m->hp.n_layers, x->n_expert = (int32_t)m->hp.fam.n_expert;
        x->n_ids = x->n_layers * x->n_expert;
        shape_bytes(m, x, used);
        uint64_t wb;
        rc = xcache_plan(m, cap, x->direct, &x->n_slots, &wb, err);
    }
    for (int32_t il = 0; !rc && il < x->n_layers; il++)
        most = used[il] > most ? used[il] : most;
    if (!rc && x->n_slots)
        rc = expert_read_rates(m, most, x->direct, x->n_threads, &x->read_bps,
                               &x->read_shared_bps, err);
    model_free(m);
    if (!rc && x->n_slots && !(x->resident = calloc((size_t)x->n_ids, 1)))
        rc = kvant_err_set(err, KV_ENOMEM, "out of memory");
    int32_t *trace = NULL;
    int64_t len = 0, half = 0;
    double secs = 0;
    if (!rc)
        rc = calibrate(c, calib, most, x, &trace, &len, &half, &secs, err);
    if (!rc && !(secs > 0))
        rc = kvant_err_set(err, KV_EINVAL, "calibration: no tokens timed");
    if (!rc) {
        const double per = secs / x->counted_tokens;
        x->calib_tok_s = 1.0 / per;
        x->compute_s = per;
        if (x->n_slots)
            rc = replay_rows(x, trace, len, half, most, per, err);
        else
            x->at = (cli_xplan_row){0, x->model_bytes, 1.0, 0.0, 0.0, x->calib_tok_s};
    }
    free(trace);
    return rc;
}

static void print_text(const cli_xplan *x)
{
    char a[32], b[32], d[32], e[32], f[32];
    printf("experts: calibration decode of %d ", x->calib_tokens);
    if (x->calib[0])
        printf("tokens of %s", x->calib);
    else
        printf("random tokens (--calibration FILE: text like the traffic to serve)");
    printf(", its last %d timed (%d threads, %s)%s\n", x->counted_tokens, x->n_threads, x->isa,
           x->n_slots ? " and their expert trace replayed at each slot count" : "");
    if (!x->n_slots) {
        printf("  every expert resident (%s of weights): decode %.2f tok/s measured\n",
               mem_format_size(x->model_bytes, a, 32), x->at.tok_s);
        return;
    }
    printf("experts placed by memory: --weights-memory %s: dense weights and routers %s "
           "resident, %d of %d experts in cache slots of %s (weights %s of %s)\n",
           mem_format_size(x->cap, a, 32), mem_format_size(x->dense_bytes, b, 32), x->n_slots,
           x->n_ids, mem_format_size(x->slot_bytes, d, 32),
           mem_format_size(x->at.weights_bytes, e, 32), mem_format_size(x->model_bytes, f, 32));
    printf("  decode: hit rate %.1f%%, %.2f expert reads per token (%s), %.2f tok/s; compute "
           "%.2f ms per token besides the reads, expert reads %s %.2f GB/s (%d side by side: "
           "%.2f)\n", 100 * x->at.hit_rate, x->at.reads_per_token,
           mem_format_size((uint64_t)(x->at.reads_per_token * x->expert_bytes), a, 32),
           x->at.tok_s, 1e3 * x->compute_s, x->direct ? "(O_DIRECT where taken)" :
           "from the page cache", x->read_bps / 1e9, x->n_threads, x->read_shared_bps / 1e9);
    printf("  experts resident per layer:");
    for (int32_t il = 0; il < x->n_layers; il++) {
        int32_t k = 0;
        for (int32_t ex = 0; ex < x->n_expert; ex++)
            k += x->resident[il * x->n_expert + ex];
        printf(" %d", k);
    }
    printf(" (of %d; --json lists them)\n", x->n_expert);
    printf("  other budgets, predicted from the trace:\n  %14s %7s %9s %12s %9s\n",
           "weights memory", "slots", "hit rate", "reads/token", "tok/s");
    for (int k = 0; k < x->n_rows; k++) {
        const cli_xplan_row *r = &x->rows[k];
        printf("  %14s %7d %8.1f%% %12.2f %9.2f\n", mem_format_size(r->weights_bytes, a, 32),
               r->n_slots, 100 * r->hit_rate, r->reads_per_token, r->tok_s);
    }
}

static void print_row_json(const cli_xplan_row *r)
{
    printf("{\"weights_memory\": %llu, \"slots\": %d, \"hit_rate\": %.6g, "
           "\"expert_reads_per_token\": %.6g, \"read_s_per_token\": %.6g, \"tok_s\": %.6g}",
           (unsigned long long)r->weights_bytes, r->n_slots, r->hit_rate, r->reads_per_token,
           r->read_s, r->tok_s);
}

static void print_json(const cli_xplan *x)
{
    printf("{\"mode\": \"experts\", \"weights_memory\": %llu, \"model_bytes\": %llu, "
           "\"dense_bytes\": %llu, \"resident_bytes\": %llu, \"slot_bytes\": %llu, "
           "\"expert_bytes\": %.0f, \"slots\": %d, \"experts\": %d, \"threads\": %d, "
           "\"isa\": \"%s\", \"calibration\": {\"tokens\": %d, \"counted_tokens\": %d, "
           "\"tok_s\": %.6g, \"source\": ", (unsigned long long)(x->cap == UINT64_MAX ? 0 : x->cap),
           (unsigned long long)x->model_bytes, (unsigned long long)x->dense_bytes,
           (unsigned long long)x->at.weights_bytes, (unsigned long long)x->slot_bytes,
           x->expert_bytes, x->n_slots, x->n_ids, x->n_threads, x->isa, x->calib_tokens,
           x->counted_tokens, x->calib_tok_s);
    if (x->calib[0])
        cli_json_string(stdout, x->calib, strlen(x->calib));
    else
        printf("\"random\"");
    printf("}, \"compute_s_per_token\": %.6g, \"expert_read_bytes_per_s\": %.6g, "
           "\"expert_read_bytes_per_s_side_by_side\": %.6g, \"decode\": ", x->compute_s,
           x->read_bps, x->read_shared_bps);
    print_row_json(&x->at);
    printf(", \"resident\": [");
    for (int32_t il = 0; x->resident && il < x->n_layers; il++) {
        printf("%s[", il ? ", " : "");
        for (int32_t ex = 0, k = 0; ex < x->n_expert; ex++)
            if (x->resident[il * x->n_expert + ex])
                printf("%s%d", k++ ? ", " : "", ex);
        printf("]");
    }
    printf("], \"predicted\": [");
    for (int k = 0; k < x->n_rows; k++) {
        printf("%s", k ? ", " : "");
        print_row_json(&x->rows[k]);
    }
    printf("]}");
}

void cli_xplan_print(const cli_xplan *x, int json)
{
    if (json)
        print_json(x);
    else
        print_text(x);
}
