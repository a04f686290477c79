/* cli_offload.c - `kvant plan --weights-memory`: the per-layer placement of
 * weight offload and the predicted tokens/s per tokens-per-pass bucket, from
 * measured (or cached) rates (engine/offload_cost.h). */
#include "cli/cli_offload.h"

#include <stdlib.h>
#include <string.h>

#include "engine/offload_cost.h"
#include "model/wstream.h"

static void place_string(const wstream_plan *p, char *s, size_t cap)
{
    size_t k = 0;
    for (int32_t il = 0; il < p->n_layers && k + 1 < cap; il++)
        s[k++] = p->place[il] == WPLACE_STREAMED ? 'S' : 'R';
    s[k] = 0;
}

static uint64_t widest_layer(const wstream_plan *p)
{
    uint64_t w = 0;
    for (int32_t il = 0; il < p->n_layers; il++)
        w = p->layer_bytes[il] > w ? p->layer_bytes[il] : w;
    return w;
}

static void print_text(const cli_offload *o)
{
    const wstream_plan *p = &o->plan;
    char a[32], b[32], c[32], d[32], e[32], places[MODEL_MAX_LAYERS + 1];
    place_string(p, places, sizeof places);
    if (p->n_streamed == 0) {
        printf("weight offload: warning: --weights-memory %s holds every weight (%s): the model "
               "fits, no layer is streamed\n", mem_format_size(o->cap, a, 32),
               mem_format_size(p->resident_bytes, b, 32));
        return;
    }
    printf("weight offload: --weights-memory %s: %s resident (embedding/head %s + %d of %d "
           "layers), %d layers streamed, %s per forward pass, through %d x %s buffers\n",
           mem_format_size(o->cap, a, 32), mem_format_size(p->resident_bytes, b, 32),
           mem_format_size(p->global_bytes, c, 32), p->n_layers - p->n_streamed, p->n_layers,
           p->n_streamed, mem_format_size(p->streamed_bytes, d, 32), p->n_slots,
           mem_format_size(p->slot_bytes, e, 32));
    printf("  layer placement: %s (R resident, S streamed; largest layer %s)\n", places,
           mem_format_size(widest_layer(p), a, 32));
    const ocost_choice *ch = &o->choice;
    if (ch->by_cost)
        printf("  streamed layers %s (--weights-place auto: predicted decode %.2f tok/s, "
               "against %.2f with the %s)\n", ch->order == WSTREAM_ORDER_SPREAD
               ? "spread over the depth" : "last", ch->tok_s[ch->order], ch->tok_s[!ch->order],
               ch->order == WSTREAM_ORDER_SPREAD ? "last layers streamed" : "streamed spread");
    else if (p->n_streamed < p->n_layers)
        printf("  streamed layers %s (--weights-place %s)\n",
               ch->order == WSTREAM_ORDER_SPREAD ? "spread over the depth" : "last",
               ocost_place_name(o->place));
    const ocost_rates *r = &o->rates;
    printf("  rates (%s %s, %d threads, %s): page-cache read %.2f GB/s, O_DIRECT read ",
           r->from_cache ? "cached in" : "measured now, cached in",
           r->cache_path[0] ? r->cache_path : "(no cache)", o->n_threads, o->isa,
           r->read_bps / 1e9);
    if (r->direct_bps > 0)
        printf("%.2f GB/s", r->direct_bps / 1e9);
    else
        printf("refused here");
    printf("; matmul weight bytes/s");
    for (int k = 0; k < OCOST_N_BUCKETS; k++)
        printf("%s %d tok %.3f GB/s", k ? "," : "", r->batch[k], r->compute_bps[k] / 1e9);
    printf("\n  side by side (matmul GB/s | read GB/s):");
    for (int k = 0; k < OCOST_N_BUCKETS; k++)
        printf("%s %d tok %.3f | %.2f", k ? "," : "", r->batch[k], r->compute_conc_bps[k] / 1e9,
               r->read_conc_bps[k] / 1e9);
    printf("\n  other work per layer (norms, SwiGLU, adds):");
    for (int k = 0; k < OCOST_N_BUCKETS; k++)
        printf("%s %d tok %.3f ms", k ? "," : "", r->batch[k], r->other_s[k] * 1e3);
    printf("\n  streamed layers read: %s%s\n", wstream_io_name(o->io),
           o->io != WSTREAM_IO_BUFFERED && !(r->direct_bps > 0)
               ? " (O_DIRECT refused here: predicted as buffered)" : "");
    printf("  tokens/pass  offload tok/s  resident tok/s  stall s/pass  read s/pass\n");
    for (int k = 0; k < OCOST_N_BUCKETS; k++)
        printf("  %11d  %13.2f  %14.2f  %12.4f  %11.4f\n", o->pred[k].n_tokens,
               o->pred[k].tok_s, o->resident[k].tok_s, o->pred[k].stall_s, o->pred[k].read_s);
    printf("  (decode of B sequences: B tokens/pass; prefill: up to --max-num-batched-tokens "
           "per pass; the CPU computes streamed layers itself, so streaming is the only "
           "non-resident placement there)\n");
}

static void print_json(const cli_offload *o)
{
    const wstream_plan *p = &o->plan;
    const ocost_rates *r = &o->rates;
    printf("{\"weights_memory\": %llu, \"offload\": %s, \"resident_bytes\": %llu, "
           "\"global_bytes\": %llu, \"streamed_bytes_per_forward\": %llu, \"staging_buffers\": "
           "%d, \"staging_bytes\": %llu, \"min_weights_memory\": %llu, \"layers\": [",
           (unsigned long long)o->cap, p->n_streamed ? "true" : "false",
           (unsigned long long)p->resident_bytes, (unsigned long long)p->global_bytes,
           (unsigned long long)p->streamed_bytes, p->n_slots,
           (unsigned long long)(p->n_streamed ? p->ring_bytes : 0),
           (unsigned long long)p->min_bytes);
    for (int32_t il = 0; il < p->n_layers; il++)
        printf("%s{\"layer\": %d, \"placement\": \"%s\", \"bytes\": %llu}", il ? ", " : "", il,
               p->place[il] == WPLACE_STREAMED ? "streamed" : "resident",
               (unsigned long long)p->layer_bytes[il]);
    printf("], \"placement\": {\"order\": \"%s\", \"asked\": \"%s\", \"by_cost\": %s, "
           "\"predicted_decode_tok_s\": {\"tail\": %.6g, \"spread\": %.6g}}",
           wstream_order_name(o->choice.order), ocost_place_name(o->place),
           o->choice.by_cost ? "true" : "false", o->choice.tok_s[WSTREAM_ORDER_TAIL],
           o->choice.tok_s[WSTREAM_ORDER_SPREAD]);
    printf(", \"rates\": {\"cached\": %s, \"cache_path\": ", r->from_cache ? "true" : "false");
    cli_json_string(stdout, r->cache_path, strlen(r->cache_path));
    printf(", \"threads\": %d, \"isa\": \"%s\", \"read_bytes_per_s\": %.6g, "
           "\"direct_read_bytes_per_s\": %.6g, \"stream_io\": \"%s\", \"matmul\": [",
           o->n_threads, o->isa, r->read_bps, r->direct_bps, wstream_io_name(o->io));
    for (int k = 0; k < OCOST_N_BUCKETS; k++)
        printf("%s{\"tokens\": %d, \"weight_bytes_per_s\": %.6g, \"side_by_side_weight_bytes_"
               "per_s\": %.6g, \"side_by_side_read_bytes_per_s\": %.6g, \"other_s_per_layer\": "
               "%.6g}", k ? ", " : "", r->batch[k], r->compute_bps[k], r->compute_conc_bps[k],
               r->read_conc_bps[k], r->other_s[k]);
    printf("]}, \"predicted\": [");
    for (int k = 0; k < OCOST_N_BUCKETS; k++)
        printf("%s{\"tokens_per_pass\": %d, \"tok_s\": %.6g, \"resident_tok_s\": %.6g, "
               "\"pass_s\": %.6g, \"stall_s\": %.6g, \"read_s\": %.6g}", k ? ", " : "",
               o->pred[k].n_tokens, o->pred[k].tok_s, o->resident[k].tok_s, o->pred[k].pass_s,
               o->pred[k].stall_s, o->pred[k].read_s);
    printf("]}");
}

int cli_offload_plan(const cli_common *c, uint64_t budget, int remeasure, cli_offload *o,
                     kvant_err *err)
{
    memset(o, 0, sizeof *o);
    if (c->weights_dtype >= 0)
        return kvant_err_set(err, KV_EUNSUP, "--weights-memory with --weights-dtype: streamed "
                             "layers are read as stored");
    model *m = model_load(c->model_path, err);
    if (!m)
        return err->code ? err->code : KV_EIO;
    if (model_has_experts(m)) { /* the rates are measured on a dense FFN's tensors */
        kvant_err_set(err, KV_EUNSUP, "--weights-memory: weight offload of mixture-of-experts "
                      "models (%s.expert_count %u) is not supported", m->hp.recipe->arch,
                      m->hp.fam.n_expert);
        model_free(m);
        return KV_EUNSUP;
    }
    o->cap = c->weights_memory ? c->weights_memory
                               : (uint64_t)((double)budget * c->weights_memory_frac);
    int rc = wstream_plan_make(m, o->cap, c->weights_slots, &o->plan, err);
    o->n_threads = c->n_threads;
    o->io = c->weights_io;
    if (o->n_threads <= 0) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        o->n_threads = nc > 0 ? (int)nc : 1;
    }
    snprintf(o->isa, sizeof o->isa, "%s", dtype_isa());
    o->place = c->weights_place;
    if (!rc)
        rc = ocost_rates_get(m, o->n_threads, remeasure ? OCOST_REMEASURE : OCOST_CACHED,
                             &o->rates, err);
    if (!rc) /* as serve places it, with the same (now cached) rates */
        rc = ocost_place(m, o->cap, c->weights_slots, o->place, &o->rates, o->io, &o->plan,
                         &o->choice, err);
    if (!rc) {
        wstream_plan all;
        wstream_plan_resident(m, o->plan.n_slots, &all);
        for (int k = 0; k < OCOST_N_BUCKETS; k++) {
            const int32_t n = o->rates.batch[k];
            /* decode (n sequences, n logit rows) up to 32, prefill (one row) above */
            const int32_t n_out = n <= 32 ? n : 1;
            ocost_predict(&o->plan, m, &o->rates, o->io, n, n_out, &o->pred[k]);
            ocost_predict(&all, m, &o->rates, o->io, n, n_out, &o->resident[k]);
        }
    }
    model_free(m);
    return rc;
}

void cli_offload_print(const cli_offload *o, int json)
{
    if (json)
        print_json(o);
    else
        print_text(o);
}

void cli_offload_print_predicted(const cli_offload *o, int json)
{
    const char *place = o->plan.n_streamed ? "offload" : "resident";
    if (!json) {
        printf("predicted (%s, rates %s, %d threads, %s):", place,
               o->rates.from_cache ? "cached" : "measured now", o->n_threads, o->isa);
        for (int k = 0; k < OCOST_N_BUCKETS; k++)
            printf("%s %d tok/pass %.2f tok/s", k ? "," : "", o->pred[k].n_tokens,
                   o->pred[k].tok_s);
        printf(" (attention is not counted: an upper bound on tok/s)\n");
        return;
    }
    printf("{\"placement\": \"%s\", \"rates_cached\": %s, \"isa\": \"%s\", \"threads\": %d, "
           "\"buckets\": [", place, o->rates.from_cache ? "true" : "false", o->isa, o->n_threads);
    for (int k = 0; k < OCOST_N_BUCKETS; k++)
        printf("%s{\"tokens_per_pass\": %d, \"tok_s\": %.6g, \"pass_s\": %.6g}", k ? ", " : "",
               o->pred[k].n_tokens, o->pred[k].tok_s, o->pred[k].pass_s);
    printf("]}");
}
