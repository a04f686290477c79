/* cli_plan_draft.c - `kvant plan --draft-model PATH`: the draft model's
 * share of the budget, planned as the engine plans it (engine_draft.h),
 * and printed beside the target's plan. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "engine/engine_draft.h"
#include "engine/engine_spec.h"
#include "mem/plan.h"
#include "model/model.h"

int cli_plan_draft(const cli_common *c, plan_config *pc, const engine_config *ec,
                   engine_draft_plan *out)
{
    kvant_err err = {0};
    engine_config dc = *ec;
    dc.max_model_len = pc->ctx;
    dc.block_size = pc->block_size;
    dc.kv_dtype = c->kv_dtype;
    dc.backend = c->backend;
    dc.exact = c->exact;
    model *t = model_load(c->model_path, &err);
    model *d = t ? model_load(ec->spec_draft_model, &err) : NULL;
    int rc = !d ? KV_EINVAL : engine_draft_check_vocab(d, t, &err);
    if (!rc)
        rc = engine_draft_plan_of(d, t, &dc, engine_spec_resolve(&dc).max_batch, out, &err);
    if (!rc) /* the engine takes it out of the budget first, and places no weights by itself */
        pc->reserved_bytes = engine_draft_plan_bytes(out);
    if (rc)
        fprintf(stderr, "kvant plan: %s%s\n", t && !d ? "draft model: " : "", err.msg);
    model_free(d);
    model_free(t);
    return rc ? 1 : 0;
}

void cli_plan_draft_print(const engine_config *ec, const engine_draft_plan *p, int json)
{
    if (json) {
        printf(", \"draft\": {\"model\": ");
        cli_json_string(stdout, ec->spec_draft_model, strlen(ec->spec_draft_model));
        printf(", \"weights_bytes\": %" PRIu64 ", \"kv_bytes\": %" PRIu64
               ", \"activation_bytes\": %" PRIu64 ", \"kv_tokens\": %" PRId64
               ", \"kv_sequences\": %d, \"ctx\": %" PRId64 ", \"bytes\": %" PRIu64 "}",
               p->weights_bytes, p->kv_bytes, p->activation_bytes, p->kv_tokens, p->max_seqs,
               p->ctx, engine_draft_plan_bytes(p));
        return;
    }
    char w[32], k[32], a[32], t[32];
    printf("draft model %s (taken from the budget first): weights %s, KV %s (%" PRId64
           " tokens: %d sequences of %" PRId64 "), activations %s; %s in all\n",
           ec->spec_draft_model, mem_format_size(p->weights_bytes, w, sizeof w),
           mem_format_size(p->kv_bytes, k, sizeof k), p->kv_tokens, p->max_seqs, p->ctx,
           mem_format_size(p->activation_bytes, a, sizeof a),
           mem_format_size(engine_draft_plan_bytes(p), t, sizeof t));
}
