/* server_parallel.c - tensor parallelism on /metrics and /v1/memory (see
 * server_parallel.h). */
#include "server/server_parallel.h"

#include <stdio.h>
#include <stdlib.h>

#define TP_MAX_SHOWN 64

/* Bytes rank 0 sent per token run through the model, so far. */
static double per_token(engine *e, const engine_tp_stats *ts)
{
    engine_stats st;
    engine_get_stats(e, &st);
    const double tok = (double)(st.prompt_tokens_computed + st.generation_tokens);
    return tok > 0 ? (double)ts->bytes_sent / tok : 0.0;
}

static void rank_series(FILE *f, const engine_tp_rank *r, int n)
{
    fprintf(f, "# HELP kvant_tp_rank_memory_bytes Each rank's memory at start, by category "
            "(gathered on rank 0).\n# TYPE kvant_tp_rank_memory_bytes gauge\n");
    for (int i = 0; i < n; i++) {
        const struct { const char *cat; uint64_t v; } c[] = {
            {"budget", r[i].budget}, {"used", r[i].used}, {"weights", r[i].weights},
            {"kv", r[i].kv}, {"activations", r[i].activations}};
        for (size_t k = 0; k < sizeof c / sizeof c[0]; k++)
            fprintf(f, "kvant_tp_rank_memory_bytes{rank=\"%d\",category=\"%s\"} %llu\n", i,
                    c[k].cat, (unsigned long long)c[k].v);
    }
    fprintf(f, "# HELP kvant_tp_rank_kv_blocks KV blocks each rank holds (the same ids on "
            "every rank).\n# TYPE kvant_tp_rank_kv_blocks gauge\n");
    for (int i = 0; i < n; i++)
        fprintf(f, "kvant_tp_rank_kv_blocks{rank=\"%d\"} %lld\n", i, (long long)r[i].kv_blocks);
}

char *srv_tp_metrics(engine *e)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    engine_tp_rank r[TP_MAX_SHOWN];
    engine_tp_stats ts;
    int n = engine_tp_ranks(e, r, TP_MAX_SHOWN);
    if (n > 0 && engine_get_tp_stats(e, &ts)) {
        n = n < TP_MAX_SHOWN ? n : TP_MAX_SHOWN;
        fprintf(f, "# HELP kvant_tp_ranks Tensor-parallel ranks.\n# TYPE kvant_tp_ranks gauge\n"
                "kvant_tp_ranks %d\n", n);
        rank_series(f, r, n);
        fprintf(f, "# HELP kvant_tp_comm_bytes_total Bytes rank 0 sent to the other ranks.\n"
                "# TYPE kvant_tp_comm_bytes_total counter\nkvant_tp_comm_bytes_total %llu\n",
                (unsigned long long)ts.bytes_sent);
        fprintf(f, "# HELP kvant_tp_comm_seconds_total Seconds rank 0 spent in collectives "
                "(waiting for the other ranks included).\n"
                "# TYPE kvant_tp_comm_seconds_total counter\nkvant_tp_comm_seconds_total %.6f\n",
                ts.comm_seconds);
        fprintf(f, "# HELP kvant_tp_step_seconds_total Seconds of rank 0's forward passes.\n"
                "# TYPE kvant_tp_step_seconds_total counter\nkvant_tp_step_seconds_total %.6f\n",
                ts.step_seconds);
        fprintf(f, "# HELP kvant_tp_comm_bytes_per_token Bytes rank 0 sent per token run "
                "through the model, so far.\n# TYPE kvant_tp_comm_bytes_per_token gauge\n"
                "kvant_tp_comm_bytes_per_token %.1f\n", per_token(e, &ts));
        fprintf(f, "# HELP kvant_tp_failed 1 once a rank failed or stopped answering.\n"
                "# TYPE kvant_tp_failed gauge\nkvant_tp_failed %d\n", ts.failed);
    }
    if (fclose(f)) {
        free(buf);
        return NULL;
    }
    return buf;
}

json_t *srv_tp_json(engine *e)
{
    engine_tp_rank r[TP_MAX_SHOWN];
    engine_tp_stats ts;
    int n = engine_tp_ranks(e, r, TP_MAX_SHOWN);
    if (n <= 0 || !engine_get_tp_stats(e, &ts))
        return json_pack("{s:b}", "enabled", 0);
    n = n < TP_MAX_SHOWN ? n : TP_MAX_SHOWN;
    json_t *ranks = json_array();
    for (int i = 0; ranks && i < n; i++)
        json_array_append_new(ranks, json_pack("{s:i, s:i, s:i, s:I, s:I, s:I, s:I, s:I, s:I, "
                                               "s:i, s:i, s:i}", "rank", i, "stage", r[i].stage,
                                               "n_layers", r[i].n_layers,
                                               "budget", (json_int_t)r[i].budget,
                                               "used", (json_int_t)r[i].used, "weights",
                                               (json_int_t)r[i].weights, "kv", (json_int_t)r[i].kv,
                                               "activations", (json_int_t)r[i].activations,
                                               "kv_blocks", (json_int_t)r[i].kv_blocks, "n_head",
                                               r[i].n_head, "n_head_kv", r[i].n_head_kv, "n_ff",
                                               r[i].n_ff));
    return json_pack("{s:b, s:i, s:o, s:{s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:f}, s:b}",
                     "enabled", 1, "ranks_n", n, "ranks", ranks ? ranks : json_null(), "comm",
                     "bytes_sent", (json_int_t)ts.bytes_sent, "collectives",
                     (json_int_t)ts.calls, "steps", (json_int_t)ts.steps, "reductions",
                     (json_int_t)ts.reductions, "seconds", ts.comm_seconds, "step_seconds",
                     ts.step_seconds, "share_of_step",
                     ts.step_seconds > 0 ? ts.comm_seconds / ts.step_seconds : 0.0,
                     "bytes_per_token", per_token(e, &ts), "failed", ts.failed);
}
