/* cli_offload.h - `kvant plan --weights-memory` (cli_offload.c). */
#ifndef KVANT_CLI_OFFLOAD_H
#define KVANT_CLI_OFFLOAD_H

#include <unistd.h>

#include "cli/cli.h"
#include "engine/offload_cost.h"
#include "kernels/dtype.h"

typedef struct cli_offload {
    uint64_t cap;                       /* the weights budget */
    wstream_plan plan;
    ocost_rates rates;
    ocost_pred pred[OCOST_N_BUCKETS];     /* with the plan's placement */
    ocost_pred resident[OCOST_N_BUCKETS]; /* every layer resident */
    int n_threads;
    int io;              /* WSTREAM_IO_*: how streamed layers are read (--stream-io) */
    int place;           /* --weights-place: 0 auto, 1 + WSTREAM_ORDER_* */
    ocost_choice choice; /* the order placed (auto: by predicted decode time) */
    char isa[32];
} cli_offload;

/* Places the layers of c->model_path within --weights-memory (budget: the
 * planner's, for the fraction form), gets the rates (measured or cached;
 * remeasure: measure again) and predicts each bucket.  KV_ENOMEM naming the
 * smallest weights budget when even streaming every layer does not fit. */
int cli_offload_plan(const cli_common *c, uint64_t budget, int remeasure, cli_offload *o,
                     kvant_err *err);
/* Text section, or (json) one JSON object without a newline. */
void cli_offload_print(const cli_offload *o, int json);
/* The predicted tokens/s per bucket of o's placement (every layer resident
 * when nothing streams): a text line, or (json) one JSON object
 * {"placement", "rates_cached", "isa", "threads", "buckets": [{"tokens_per_pass",
 * "tok_s", "pass_s"}]} without a newline. */
void cli_offload_print_predicted(const cli_offload *o, int json);

#endif
