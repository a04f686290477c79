/* cli_plan_tp.c - `kvant plan --tp N`: each rank's weights, KV and
 * activations, from the model's shapes cut as model/shard.h cuts them
 * (nothing copied, no MPI needed), and the KV pool the group gets (the
 * smallest rank's, as the engine agrees at start). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "mem/plan.h"
#include "model/shard.h"
#include "par/tp.h"

#define PLAN_TP_MAX 64

typedef struct tp_row {
    int rc;
    char err[KV_ERR_MSG_MAX];
    model_hparams hp;
    plan_result r;
    uint64_t tp_bytes;   /* the exchange buffers (par/tp.h) */
    shard_spec sp;
    int64_t blocks;      /* KV blocks left after them */
} tp_row;

static void plan_rank(model *m, const plan_config *pc, int rank, int tp, int n, tp_row *row)
{
    kvant_err err = {0};
    shard_spec sp;
    tp_spec_of(rank, tp, n, &sp);
    row->sp = sp;
    model_shard *s = model_shard_apply(m, &sp, NULL, &err);
    if (!s) {
        row->rc = err.code ? err.code : KV_EINVAL;
        snprintf(row->err, sizeof row->err, "%s", err.msg);
        return;
    }
    const model_hparams *hp = &m->hp;
    row->hp = *hp;
    plan_model pm;
    model_plan_shape(hp, m->weights_bytes, &pm);
    row->rc = plan_compute(&pm, pc, &row->r, &err);
    snprintf(row->err, sizeof row->err, "%s", err.msg);
    row->tp_bytes = tp_scratch_bytes(tp, n / tp, pc->max_num_batched_tokens, pc->max_num_seqs,
                                     hp->n_embd, hp->n_vocab);
    const uint64_t block = row->r.kv_bytes_per_token * (uint64_t)row->r.block_size;
    const int64_t held = block ? (int64_t)((row->tp_bytes + block - 1) / block) : 0;
    row->blocks = row->r.kv_pool_blocks > held ? row->r.kv_pool_blocks - held : 0;
    if (!row->rc && row->blocks * row->r.block_size < row->r.ctx) {
        row->rc = KV_ENOMEM;
        snprintf(row->err, sizeof row->err, "a request of the maximum context (%lld tokens) "
                 "does not fit beside the tensor-parallel buffers", (long long)row->r.ctx);
    }
    model_shard_free(s);
}

static void print_json(const cli_common *c, const tp_row *rows, int n, uint64_t full_bytes,
                       int64_t blocks, int ok)
{
    printf("{\"model\": ");
    cli_json_string(stdout, c->model_path, strlen(c->model_path));
    printf(", \"tp\": %d, \"pp\": %d, \"ranks_n\": %d, \"ok\": %s, \"one_process_weights_bytes\": %" PRIu64
           ", \"kv_pool_blocks\": %" PRId64 ", \"ranks\": [", c->tp, c->pp, n, ok ? "true" : "false",
           full_bytes, blocks);
    for (int i = 0; i < n; i++) {
        const tp_row *w = &rows[i];
        printf("%s{\"rank\": %d, \"ok\": %s, \"error\": ", i ? ", " : "", i,
               w->rc ? "false" : "true");
        cli_json_string(stdout, w->err, strlen(w->err));
        printf(", \"stage\": %d, \"n_layers\": %d, \"n_head\": %d, \"n_head_kv\": %d, \"n_ff\": %d, "
               "\"budget\": %" PRIu64
               ", \"weights_bytes\": %" PRIu64 ", \"weights_share\": %.4f"
               ", \"activation_bytes\": %" PRIu64 ", \"tp_buffer_bytes\": %" PRIu64
               ", \"kv_bytes_per_token\": %" PRIu64 ", \"kv_pool_blocks\": %" PRId64 "}",
               w->sp.pp_stage, w->hp.n_layers, w->hp.n_head, w->hp.n_head_kv, w->hp.n_ff,
               w->r.budget, w->r.weights_bytes,
               full_bytes ? (double)w->r.weights_bytes / (double)full_bytes : 0.0,
               w->r.activation_bytes, w->tp_bytes, w->r.kv_bytes_per_token, w->blocks);
    }
    printf("]}\n");
}

static void print_text(const cli_common *c, const tp_row *rows, int n, uint64_t full_bytes,
                       int64_t blocks, int block_size)
{
    char a[32], b[32], d[32], e[32];
    printf("%s over %d ranks: --tp %d x --pp %d (one process: weights %s)\n", c->model_path, n,
           c->tp, c->pp, mem_format_size(full_bytes, a, 32));
    printf("rank  stage  layers  heads  kv  ffn      weights   share  activations  tp buffers  "
           "KV/token  KV blocks\n");
    for (int i = 0; i < n; i++) {
        const tp_row *w = &rows[i];
        if (w->rc && !w->r.weights_bytes) {
            printf("%4d  %s\n", i, w->err);
            continue;
        }
        printf("%4d  %5d  %6d  %5d  %2d  %5d  %10s  %5.1f%%  %11s  %10s  %8s  %9" PRId64 "%s%s\n",
               i, w->sp.pp_stage, w->hp.n_layers, w->hp.n_head, w->hp.n_head_kv, w->hp.n_ff, mem_format_size(w->r.weights_bytes, a, 32),
               100.0 * (double)w->r.weights_bytes / (double)(full_bytes ? full_bytes : 1),
               mem_format_size(w->r.activation_bytes, b, 32), mem_format_size(w->tp_bytes, d, 32),
               mem_format_size(w->r.kv_bytes_per_token, e, 32), w->blocks, w->rc ? "  " : "",
               w->rc ? w->err : "");
    }
    printf("KV pool of the group: %" PRId64 " blocks of %d tokens = %" PRId64
           " tokens (the smallest rank's)\n", blocks, block_size, blocks * block_size);
}

int cli_plan_tp(const cli_common *c, const plan_config *pc)
{
    kvant_err err = {0};
    const int n = c->tp * c->pp;
    if (n > PLAN_TP_MAX)
        return cli_err_usage("plan", "--tp x --pp = %d ranks: at most %d", n, PLAN_TP_MAX);
    model *m = model_load(c->model_path, &err);
    if (!m) {
        fprintf(stderr, "kvant plan: %s\n", err.msg);
        return 1;
    }
    const uint64_t full = m->weights_bytes;
    tp_row *rows = calloc((size_t)n, sizeof *rows);
    if (!rows) {
        model_free(m);
        fprintf(stderr, "kvant plan: out of memory\n");
        return 1;
    }
    int ok = 1;
    int64_t blocks = INT64_MAX;
    for (int r = 0; r < n; r++) {
        plan_rank(m, pc, r, c->tp, n, &rows[r]);
        ok &= rows[r].rc == KV_OK;
        blocks = rows[r].blocks < blocks ? rows[r].blocks : blocks;
    }
    if (rows[0].rc && !rows[0].r.weights_bytes && rows[0].rc != KV_ENOMEM) {
        fprintf(stderr, "kvant plan: --tp %d --pp %d: %s\n", c->tp, c->pp, rows[0].err);
        free(rows);
        model_free(m);
        return 2;
    }
    if (c->json)
        print_json(c, rows, n, full, blocks, ok);
    else
        print_text(c, rows, n, full, blocks, rows[0].r.block_size);
    free(rows);
    model_free(m);
    return ok ? 0 : 1;
}
