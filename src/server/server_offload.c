/* server_offload.c - weight offload on /metrics and /v1/memory (see
 * server_offload.h). */
#include "server/server_offload.h"

#include <stdio.h>
#include <stdlib.h>

#include "model/wstream.h"
#include "model/xcache.h"

static void one(FILE *f, const char *name, const char *type, const char *help, double v)
{
    fprintf(f, "# HELP kvant_%s %s\n# TYPE kvant_%s %s\nkvant_%s %.17g\n", name, help, name, type,
            name, v);
}

/* Bytes streamed per token run through the model so far (0 before any). */
static double per_token(engine *e, const wstream_stats *ws)
{
    engine_stats st;
    engine_get_stats(e, &st);
    const double tok = (double)(st.prompt_tokens_computed + st.generation_tokens);
    return tok > 0 ? (double)ws->bytes_read / tok : 0.0;
}

/* The expert cache's counters, in all and per (layer, expert). */
static void expert_metrics(FILE *f, const xcache *xc)
{
    xcache_stats st;
    xcache_get_stats(xc, &st);
    one(f, "moe_expert_cache_slots", "gauge", "Slots of the expert cache (one expert each).",
        (double)st.n_slots);
    one(f, "moe_experts_resident", "gauge", "Experts in the expert cache now.", (double)st.n_used);
    one(f, "moe_expert_read_bytes_total", "counter",
        "Expert weight bytes read from the model file into the cache.", (double)st.bytes_read);
    one(f, "moe_expert_cache_failed", "gauge",
        "1 after an expert read came back short or failed (the file changed).",
        (double)st.failed);
    const char *name[2] = {"hits", "misses"};
    const char *help[2] = {"Expert cache hits (a routed expert already resident).",
                           "Expert cache misses (the expert read from the model file)."};
    for (int k = 0; k < 2; k++) {
        fprintf(f, "# HELP kvant_moe_expert_%s_total %s\n# TYPE kvant_moe_expert_%s_total "
                "counter\n", name[k], help[k], name[k]);
        for (int32_t il = 0; il < st.n_layers; il++)
            for (int32_t x = 0; x < st.n_expert; x++) {
                uint64_t h, m;
                int res;
                xcache_expert(xc, il, x, &h, &m, &res);
                if (h || m)
                    fprintf(f, "kvant_moe_expert_%s_total{layer=\"%d\",expert=\"%d\"} %llu\n",
                            name[k], il, x, (unsigned long long)(k ? m : h));
            }
    }
}

char *srv_offload_metrics(engine *e)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    wstream_stats ws;
    if (engine_get_offload(e, &ws)) {
        const wstream_plan *p = ws.plan;
        fprintf(f, "# HELP kvant_weights_layer_bytes Weight bytes of each layer by placement "
                "(resident in device memory or streamed from the model file).\n"
                "# TYPE kvant_weights_layer_bytes gauge\n");
        for (int32_t il = 0; il < p->n_layers; il++)
            fprintf(f, "kvant_weights_layer_bytes{layer=\"%d\",placement=\"%s\"} %llu\n", il,
                    p->place[il] == WPLACE_STREAMED ? "streamed" : "resident",
                    (unsigned long long)p->layer_bytes[il]);
        one(f, "weights_resident_bytes", "gauge",
            "Weight bytes resident in device memory (embedding, head, resident layers).",
            (double)ws.resident_bytes);
        one(f, "weights_staging_bytes", "gauge", "Bytes of the staging ring for streamed layers.",
            (double)ws.ring_bytes);
        one(f, "weights_streamed_bytes_per_forward", "gauge",
            "Weight bytes read from the model file per forward pass.", (double)ws.streamed_bytes);
        one(f, "weights_streamed_bytes_total", "counter", "Weight bytes streamed so far.",
            (double)ws.bytes_read);
        one(f, "weights_streamed_direct_bytes_total", "counter",
            "Of the weight bytes streamed, those read with O_DIRECT (not through the page cache).",
            (double)ws.bytes_direct);
        one(f, "weights_streamed_bytes_per_token", "gauge",
            "Weight bytes streamed per token run through the model, so far.", per_token(e, &ws));
        one(f, "weights_stream_read_seconds_total", "counter",
            "Seconds the weight reader spent in pread.", ws.read_s);
        one(f, "weights_stream_wait_seconds_total", "counter",
            "Seconds the forward pass waited for a streamed layer.", ws.wait_s);
        one(f, "weights_stream_failed", "gauge",
            "1 when the weight stream failed (model file truncated or unreadable).",
            (double)ws.failed);
    }
    const xcache *xc = engine_get_xcache(e);
    if (xc)
        expert_metrics(f, xc);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* The expert cache: slots, counters and which experts are resident, per layer. */
static json_t *experts_json(const xcache *xc)
{
    xcache_stats st;
    xcache_get_stats(xc, &st);
    json_t *layers = json_array();
    for (int32_t il = 0; layers && il < st.n_layers; il++) {
        json_t *res = json_array();
        for (int32_t x = 0; res && x < st.n_expert; x++) {
            uint64_t h, m;
            int r;
            xcache_expert(xc, il, x, &h, &m, &r);
            if (r)
                json_array_append_new(res, json_integer(x));
        }
        json_array_append_new(layers, json_pack("{s:i, s:o}", "layer", (int)il, "resident",
                                                res ? res : json_array()));
    }
    return json_pack("{s:b, s:s, s:{s:i, s:I, s:i, s:I, s:I, s:I, s:b, s:s, s:b, s:s, s:o}}",
                     "enabled", 1, "mode", "experts", "experts", "slots", st.n_slots,
                     "slot_bytes", (json_int_t)st.slot_bytes, "resident", st.n_used, "hits",
                     (json_int_t)st.hits, "misses", (json_int_t)st.misses, "read_bytes",
                     (json_int_t)st.bytes_read, "direct", st.direct, "io_note", st.io_note,
                     "failed", st.failed, "error", st.error, "layers",
                     layers ? layers : json_array());
}

json_t *srv_offload_json(engine *e)
{
    wstream_stats ws;
    const xcache *xc = engine_get_xcache(e);
    if (xc)
        return experts_json(xc);
    if (!engine_get_offload(e, &ws))
        return json_pack("{s:b}", "enabled", 0);
    const wstream_plan *p = ws.plan;
    json_t *layers = json_array();
    for (int32_t il = 0; layers && il < p->n_layers; il++)
        json_array_append_new(layers, json_pack("{s:i, s:s, s:I}", "layer", (int)il, "placement",
                                                p->place[il] == WPLACE_STREAMED ? "streamed"
                                                                                : "resident",
                                                "bytes", (json_int_t)p->layer_bytes[il]));
    json_t *o = json_pack("{s:b, s:I, s:I, s:I, s:I, s:i, s:i, s:I, s:f, s:f, s:f, s:b, s:s, s:o}",
                     "enabled", 1, "resident_bytes", (json_int_t)ws.resident_bytes,
                     "global_bytes", (json_int_t)p->global_bytes,
                     "streamed_bytes_per_forward", (json_int_t)ws.streamed_bytes,
                     "staging_bytes", (json_int_t)ws.ring_bytes, "streamed_layers", ws.n_streamed,
                     "staging_buffers", ws.n_slots, "streamed_bytes_total",
                     (json_int_t)ws.bytes_read, "streamed_bytes_per_token", per_token(e, &ws),
                     "read_seconds", ws.read_s, "wait_seconds", ws.wait_s, "failed", ws.failed,
                     "error", ws.error, "layers", layers ? layers : json_array());
    if (o)
        json_object_update_new(o, json_pack("{s:s, s:b, s:s, s:I}", "stream_io",
                                            wstream_io_name(ws.io_mode), "direct", ws.direct,
                                            "io_note", ws.io_note, "streamed_direct_bytes_total",
                                            (json_int_t)ws.bytes_direct));
    return o;
}
