/* engine_offload.c - the engine's side of weight offload (model/wstream.h):
 * turns --weights-memory into a per-layer placement before the memory plan,
 * starts the stream before the backend loads weights (with a device
 * backend's hooks, backend_wstream_dev: a pinned ring, each streamed layer
 * uploaded on the copy stream), reports it.  The stream is stopped before
 * the backend is destroyed (its ring may be the backend's pinned memory).
 */
#include <stdio.h>
#include <string.h>

#include "backend/backend_select.h"
#include "engine/engine_offload.h"
#include "engine/engine_internal.h"
#include "engine/offload_cost.h"
#include "model/wstream.h"
#include "model/xcache.h"

/* A mixture of experts: the dense weights resident, the experts in the
 * slots cap holds beside them (model/xcache.h); *weights_bytes their sum. */
static int plan_experts(engine *e, uint64_t cap, uint64_t *weights_bytes, kvant_err *err)
{
    int rc = xcache_options(e->cfg.weights_io, e->cfg.weights_place, e->cfg.weights_slots,
                            &e->xc_direct, err);
    if (!rc)
        rc = xcache_plan(e->m, cap, e->xc_direct, &e->xc_slots, weights_bytes, err);
    if (rc)
        return rc;
    char line[256];
    xcache_plan_describe(e->m, cap, e->xc_slots, *weights_bytes, line, sizeof line);
    fprintf(stderr, "kvant: %s\n", line);
    return KV_OK;
}

int engine_offload_plan(engine *e, uint64_t budget, uint64_t auto_cap, wstream_plan *p,
                        uint64_t *weights_bytes, kvant_err *err)
{
    const engine_config *c = &e->cfg;
    memset(p, 0, sizeof *p);
    e->xc_slots = 0;
    if (c->weights_memory_frac < 0 || c->weights_memory_frac >= 1)
        return kvant_err_set(err, KV_EINVAL, "--weights-memory: fraction %g outside (0, 1)",
                             c->weights_memory_frac);
    const uint64_t cap = auto_cap           ? auto_cap
                         : c->weights_memory ? c->weights_memory
                                             : (uint64_t)((double)budget * c->weights_memory_frac);
    if (cap > 0 && !auto_cap && c->weights_dtype >= 0)
        return kvant_err_set(err, KV_EUNSUP,
                             "--weights-memory with --weights-dtype: streamed weights are read "
                             "as stored; quantize the file with 'kvant quantize' instead");
    if (model_has_experts(e->m) && cap > 0)
        return plan_experts(e, cap, weights_bytes, err);
    if (auto_cap > 0) { /* --weights-memory auto: the planner's cap */
        char a[32], b[32], d[32];
        kvant_err why = {0};
        ocost_choice ch;
        int rc = ocost_place_cached(e->m, c->n_threads, auto_cap, c->weights_slots,
                                    c->weights_place, c->weights_io, p, &ch, &why);
        if (rc)
            return kvant_err_set(err, rc, "model does not fit: weights %s exceed the budget %s, "
                                 "and the %s left for them beside the workspace and one "
                                 "request's KV cannot stream them (%s)",
                                 mem_format_size(e->m->weights_bytes, a, 32),
                                 mem_format_size(budget, b, 32),
                                 mem_format_size(auto_cap, d, 32), why.msg);
        fprintf(stderr, "kvant: weights %s do not fit the budget %s: %d of %d layers resident, "
                "%d streamed (%s for weights; --weights-memory SIZE sets it, --no-offload "
                "refuses)\n", mem_format_size(e->m->weights_bytes, a, 32),
                mem_format_size(budget, b, 32), p->n_layers - p->n_streamed, p->n_layers,
                p->n_streamed, mem_format_size(wstream_plan_device_bytes(p), d, 32));
        ocost_choice_print(&ch, c->weights_place, p);
        if (p->n_streamed)
            *weights_bytes = wstream_plan_device_bytes(p);
        return KV_OK;
    }
    if (cap == 0)
        return KV_OK;
    ocost_choice ch;
    int rc = ocost_place_cached(e->m, c->n_threads, cap, c->weights_slots, c->weights_place,
                                c->weights_io, p, &ch, err);
    if (rc)
        return rc;
    ocost_choice_print(&ch, c->weights_place, p);
    char a[32], b[32];
    if (p->n_streamed == 0)
        fprintf(stderr, "kvant: warning: --weights-memory %s holds every weight (%s): the model "
                "fits, no layer is streamed\n", mem_format_size(cap, a, 32),
                mem_format_size(p->resident_bytes, b, 32));
    else
        *weights_bytes = wstream_plan_device_bytes(p);
    return KV_OK;
}

/* The planner's prediction from cached rates (measuring here would
 * allocate outside the budget while the process is meant to stay in it). */
static void print_prediction(engine *e, const wstream_plan *p)
{
    ocost_rates r;
    kvant_err err = {0};
    if (ocost_rates_get(e->m, e->cfg.n_threads, OCOST_CACHE_ONLY, &r, &err)) {
        fprintf(stderr, "kvant: weight offload: no measured rates cached for a prediction; run "
                "'kvant plan --weights-memory ...' with the same model and -t once\n");
        return;
    }
    ocost_pred d, pf;
    const int32_t n_seqs = e->cfg.max_num_seqs, n_pp = e->cfg.max_num_batched_tokens;
    const int io = e->cfg.weights_io;
    ocost_predict(p, e->m, &r, io, 1, 1, &d);
    fprintf(stderr, "kvant: weight offload: predicted decode %.2f tok/s at 1 sequence", d.tok_s);
    ocost_predict(p, e->m, &r, io, n_seqs, n_seqs, &d);
    ocost_predict(p, e->m, &r, io, n_pp, 1, &pf);
    fprintf(stderr, ", %.2f tok/s at %d; prefill %.2f tok/s at %d tokens per step (rates from "
            "%s)\n", d.tok_s, (int)n_seqs, pf.tok_s, (int)n_pp, r.cache_path);
}

int engine_offload_start(engine *e, const wstream_plan *p, kvant_err *err)
{
    if (e->xc_slots > 0) {
        if (!(e->xc = xcache_create(e->m, e->mem, e->xc_slots, e->xc_direct, err)))
            return err && err->code ? err->code : KV_ENOMEM;
        e->m->xcache = e->xc;
        char line[256];
        xcache_io_describe(e->xc, line, sizeof line);
        if (line[0])
            fprintf(stderr, "kvant: %s\n", line);
        return KV_OK;
    }
    if (p->n_streamed == 0)
        return KV_OK;
    const wstream_io io = {e->cfg.weights_io, NULL};
    wstream_dev dev; /* a device backend: pinned ring, layers uploaded as they stream */
    e->ws = wstream_create_dev(e->m, e->mem, p, &io,
                               backend_wstream_dev(e->be, &dev) ? &dev : NULL, err);
    if (!e->ws)
        return err && err->code ? err->code : KV_ENOMEM;
    e->m->wstream = e->ws;
    if (e->cfg.print_plan) {
        engine_offload_print(e->ws);
        print_prediction(e, p);
    } else {
        wstream_stats st;
        wstream_get_stats(e->ws, &st);
        if (st.io_note[0])
            fprintf(stderr, "kvant: weight offload: %s\n", st.io_note);
    }
    return KV_OK;
}

void engine_offload_stop(engine *e)
{
    if (e->xc) {
        e->m->xcache = NULL;
        xcache_destroy(e->xc);
        e->xc = NULL;
    }
    if (!e->ws)
        return;
    e->m->wstream = NULL;
    wstream_destroy(e->ws);
    e->ws = NULL;
}

void engine_offload_print(wstream *ws)
{
    const wstream_plan *p = wstream_get_plan(ws);
    char a[32], b[32], c[32];
    fprintf(stderr, "kvant: weight offload: %s resident (%d of %d layers + embedding/head), %s "
            "streamed per forward pass (%d layers) through %d x %s staging buffers\n",
            mem_format_size(p->resident_bytes, a, 32), p->n_layers - p->n_streamed, p->n_layers,
            mem_format_size(p->streamed_bytes, b, 32), p->n_streamed, p->n_slots,
            mem_format_size(p->slot_bytes, c, 32));
    fprintf(stderr, "kvant: layer placement: ");
    for (int32_t il = 0; il < p->n_layers; il++)
        fputc(p->place[il] == WPLACE_STREAMED ? 'S' : 'R', stderr);
    fprintf(stderr, " (R resident, S streamed)\n");
    wstream_stats st;
    wstream_get_stats(ws, &st);
    fprintf(stderr, "kvant: weight reads: %s%s%s\n", wstream_io_name(st.io_mode),
            st.io_note[0] ? "; " : "", st.io_note);
}

struct xcache *engine_get_xcache(engine *e)
{
    return e ? e->xc : NULL;
}

int engine_get_offload(engine *e, wstream_stats *out)
{
    if (!e || !e->ws)
        return 0;
    wstream_get_stats(e->ws, out);
    return 1;
}
