/* test_offload_cost.c - the weight-offload cost model (engine/offload_cost.h)
 * on hand-set rates, so every expectation is exact: a fully resident pass
 * is the sum of its layers' matmul bytes / rate plus their non-matmul time
 * plus the head; non-matmul time adds exactly once per layer; a read-bound
 * pass takes at least the streamed bytes / the read rate of its mode
 * (page cache, O_DIRECT, or both added); direct reads leave the matmuls at
 * their alone rate, page-cache reads slow them to the side-by-side rate;
 * both is never slower than the page cache alone; O_DIRECT refused (rate 0)
 * predicts as the page cache.  Placement (ocost_place) on a 6-layer model:
 * the spread order streams as many layers as the tail order, evenly (the
 * last one included), within the cap; auto picks the order with the
 * shorter predicted pass (the default, spread, on a tie within 1%), an
 * order asked for is kept, and without rates the default is placed. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine/offload_cost.h"
#include "kernels/dtype.h"
#include "model/wstream.h"
#include "testutil.h"
#include "tinymodel.h"

static ocost_rates rates(double compute, double compute_conc, double read, double read_conc,
                         double direct, double other)
{
    ocost_rates r;
    memset(&r, 0, sizeof r);
    const int32_t b[OCOST_N_BUCKETS] = {1, 8, 32, 128, 512};
    for (int k = 0; k < OCOST_N_BUCKETS; k++) {
        r.batch[k] = b[k];
        r.compute_bps[k] = compute;
        r.compute_conc_bps[k] = compute_conc;
        r.read_conc_bps[k] = read_conc;
        r.other_s[k] = other;
    }
    r.read_bps = read;
    r.direct_bps = direct;
    return r;
}

static double pass(const wstream_plan *p, const model *m, const ocost_rates *r, int io)
{
    ocost_pred o;
    ocost_predict(p, m, r, io, 1, 1, &o);
    CHECK(o.pass_s > 0 && o.tok_s > 0 && fabs(o.tok_s * o.pass_s - 1) < 1e-9);
    return o.pass_s;
}

static int near(double a, double b)
{
    return fabs(a - b) <= 1e-6 * fabs(b);
}

static void test_place(void)
{
    char path[512];
    kvant_err err = {0};
    CHECK(tu_tmp_path(path, sizeof path, "offload-place.gguf") == 0);
    CHECK(tiny_model_write_layers(path, 5, 6) == 0);
    model *m = model_load(path, &err);
    unlink(path);
    CHECKF(m != NULL, "%s", err.msg);
    if (!m)
        return;
    wstream_plan all, tail, spread;
    wstream_plan_resident(m, 2, &all);
    const int L = all.n_layers;
    CHECK(L == 6);
    uint64_t slot = 0;
    for (int il = 0; il < L; il++)
        slot = all.stream_bytes[il] > slot ? all.stream_bytes[il] : slot;
    /* room for the globals, the ring and 3 of the 6 layers */
    uint64_t cap = all.global_bytes + 2 * slot + WSTREAM_DIO_ALIGN;
    for (int il = 0; il < 3; il++)
        cap += all.layer_bytes[il];
    CHECK(wstream_plan_make_order(m, cap, 2, WSTREAM_ORDER_TAIL, &tail, &err) == KV_OK);
    CHECK(wstream_plan_make_order(m, cap, 2, WSTREAM_ORDER_SPREAD, &spread, &err) == KV_OK);
    CHECK(tail.n_streamed == 3 && spread.n_streamed == 3);
    CHECK(wstream_plan_device_bytes(&spread) <= cap && wstream_plan_device_bytes(&tail) <= cap);
    for (int il = 0; il < L; il++) {
        CHECKF(tail.place[il] == (il >= 3 ? WPLACE_STREAMED : WPLACE_RESIDENT), "tail %d", il);
        /* 5 - floor(i * 6 / 3) = 5, 3, 1 */
        CHECKF(spread.place[il] == (il % 2 ? WPLACE_STREAMED : WPLACE_RESIDENT), "spread %d", il);
    }
    /* a layer reads in twice its compute time, direct (the matmuls keep
     * their rate): the ring of a tail pass runs dry while its reader waits
     * for a slot, a spread pass keeps the reader busy */
    const double c = 1e9;
    ocost_rates r = rates(c, c, c / 2, c / 2, c / 2, 0);
    wstream_plan p;
    ocost_choice ch;
    CHECK(ocost_place(m, cap, 2, 0, &r, WSTREAM_IO_DIRECT, &p, &ch, &err) == KV_OK);
    const double t_tail = pass(&tail, m, &r, WSTREAM_IO_DIRECT);
    const double t_spread = pass(&spread, m, &r, WSTREAM_IO_DIRECT);
    CHECKF(t_spread < 0.99 * t_tail, "spread %g, tail %g", t_spread, t_tail);
    CHECK(ch.by_cost && ch.order == WSTREAM_ORDER_SPREAD && !memcmp(p.place, spread.place, L));
    CHECK(near(ch.tok_s[WSTREAM_ORDER_TAIL], 1 / t_tail) &&
          near(ch.tok_s[WSTREAM_ORDER_SPREAD], 1 / t_spread));
    /* reads free: a tie, the default (spread) */
    ocost_rates rf = rates(c, c, 1e15, 1e15, 1e15, 0);
    CHECK(ocost_place(m, cap, 2, 0, &rf, WSTREAM_IO_DIRECT, &p, &ch, &err) == KV_OK);
    CHECK(ch.by_cost && ch.order == OCOST_DEFAULT_ORDER);
    /* asked for: kept, not predicted */
    CHECK(ocost_place(m, cap, 2, 1 + WSTREAM_ORDER_TAIL, &r, WSTREAM_IO_DIRECT, &p, &ch,
                      &err) == KV_OK);
    CHECK(!ch.by_cost && ch.order == WSTREAM_ORDER_TAIL && !memcmp(p.place, tail.place, L));
    /* no rates: the default */
    CHECK(ocost_place(m, cap, 2, 0, NULL, WSTREAM_IO_DIRECT, &p, &ch, &err) == KV_OK);
    CHECK(!ch.by_cost && ch.order == OCOST_DEFAULT_ORDER && !memcmp(p.place, spread.place, L));
    /* everything fits: nothing streamed, whatever the order */
    CHECK(ocost_place(m, all.resident_bytes, 2, 0, &r, WSTREAM_IO_DIRECT, &p, &ch, &err) ==
              KV_OK && p.n_streamed == 0);
    CHECK(ocost_place_parse("auto") == 0 && ocost_place_parse("tail") == 1 + WSTREAM_ORDER_TAIL &&
          ocost_place_parse("spread") == 1 + WSTREAM_ORDER_SPREAD && ocost_place_parse("x") < 0);
    model_free(m);
}

int main(void)
{
    dtype_init();
    model *m = tiny_model_load(NULL, 11);
    if (!m)
        return tu_finish("test_offload_cost");
    const model_tensor *head = m->tied_output ? &m->tok_embd : &m->output;
    wstream_plan res, all;
    wstream_plan_resident(m, 2, &res);
    all = res;
    for (int il = 0; il < all.n_layers; il++)
        all.place[il] = WPLACE_STREAMED;
    wstream_plan_update(&all);
    double layers = 0;
    for (int il = 0; il < res.n_layers; il++)
        layers += (double)res.layer_bytes[il];
    const double c = 1e9, other = 1e-4;

    /* resident: matmul bytes / rate + non-matmul per layer + the head */
    ocost_rates r = rates(c, c / 2, 1e9, 1e9, 1e9, other);
    const double want = layers / c + res.n_layers * other + (double)head->nbytes / c;
    CHECKF(near(pass(&res, m, &r, WSTREAM_IO_BUFFERED), want), "%g vs %g",
           pass(&res, m, &r, WSTREAM_IO_BUFFERED), want);
    ocost_rates r0 = rates(c, c / 2, 1e9, 1e9, 1e9, 0);
    CHECK(near(pass(&res, m, &r, WSTREAM_IO_BUFFERED) - pass(&res, m, &r0, WSTREAM_IO_BUFFERED),
               res.n_layers * other));

    /* read-bound (reads 1000x slower than compute): at least the bytes at
     * the mode's read rate, and not much more */
    const double slow = c / 1000, streamed = (double)all.streamed_bytes;
    for (int io = 0; io < WSTREAM_IO_COUNT; io++) {
        ocost_rates rb = rates(c, c, slow, slow, slow, 0);
        const double rate = io == WSTREAM_IO_BOTH ? 2 * slow : slow;
        const double t = pass(&all, m, &rb, io);
        CHECKF(t >= streamed / rate * (1 - 1e-9) && t <= streamed / rate + want,
               "%s: %g s for %g bytes at %g B/s", wstream_io_name(io), t, streamed, rate);
    }

    /* reads as fast as the matmuls: the ring keeps up, so with direct
     * reads (the matmuls at their alone rate) the pass is about the
     * resident one; page-cache reads slow the matmuls to half while both
     * run (and read at half), so that pass is longer */
    ocost_rates rf = rates(c, c / 2, c, c / 2, c, 0);
    const double t_res = pass(&res, m, &rf, WSTREAM_IO_BUFFERED);
    const double t_dir = pass(&all, m, &rf, WSTREAM_IO_DIRECT);
    const double t_buf = pass(&all, m, &rf, WSTREAM_IO_BUFFERED);
    CHECKF(t_dir <= t_res * 1.5 && t_dir >= t_res * (1 - 1e-9), "direct %g, resident %g", t_dir,
           t_res);
    CHECKF(t_buf > t_dir * 1.1, "buffered %g, direct %g", t_buf, t_dir);

    /* both: the readers' rates add, so never slower than the page cache alone */
    ocost_rates rm = rates(c, c / 2, c / 4, c / 8, c / 8, other);
    CHECK(pass(&all, m, &rm, WSTREAM_IO_BOTH) <= pass(&all, m, &rm, WSTREAM_IO_BUFFERED));
    /* O_DIRECT refused here (rate 0): predicted as the page cache */
    ocost_rates rn = rates(c, c / 2, c / 4, c / 8, 0, other);
    CHECK(pass(&all, m, &rn, WSTREAM_IO_DIRECT) == pass(&all, m, &rn, WSTREAM_IO_BUFFERED));
    CHECK(pass(&all, m, &rn, WSTREAM_IO_BOTH) == pass(&all, m, &rn, WSTREAM_IO_BUFFERED));
    model_free(m);
    test_place();
    return tu_finish("test_offload_cost");
}
