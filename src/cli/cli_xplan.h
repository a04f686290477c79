/* cli_xplan.h - `kvant plan --weights-memory` for a mixture of experts
 * (cli_xplan.c): the expert cache's slots; a calibration decode within the
 * budget, its expert trace and time; the decode hit rate, resident experts
 * and tokens/s at the budget and, from the trace replayed at other slot
 * counts (model/xcache.h xcache_replay), at other budgets. */
#ifndef KVANT_CLI_XPLAN_H
#define KVANT_CLI_XPLAN_H

#include "cli/cli.h"
#include "model/xcache.h"

#define XPLAN_MAX_ROWS 10

/* The decode at one slot count. */
typedef struct cli_xplan_row {
    int32_t n_slots;
    uint64_t weights_bytes;  /* dense weights and routers + the slots */
    double hit_rate, reads_per_token;
    double read_s;           /* seconds of expert reads per token */
    double tok_s;
} cli_xplan_row;

typedef struct cli_xplan {
    uint64_t cap;           /* the weights budget (UINT64_MAX: every expert resident) */
    uint64_t model_bytes, dense_bytes, slot_bytes;
    int32_t n_layers, n_expert, n_slots, n_ids; /* n_ids: layers x experts */
    int direct;             /* --stream-io direct: slots laid out and experts read for O_DIRECT */
    int32_t calib_tokens;   /* tokens the calibration decoded */
    int32_t counted_tokens; /* the last of them, measured and replayed */
    char calib[512];        /* the calibration file, or "" for random tokens */
    double expert_bytes;    /* one expert's gate, up and down bytes (mean over layers) */
    double read_bps;        /* reads of experts as the cache reads them, one reader */
    double read_shared_bps; /* n_threads readers side by side (a group's misses) */
    double compute_s;       /* seconds per decoded token besides expert reads (measured) */
    double calib_tok_s;     /* the calibration's counted tokens per second (measured) */
    cli_xplan_row at;       /* the planned budget (n_slots 0: every expert resident) */
    cli_xplan_row rows[XPLAN_MAX_ROWS]; /* other slot counts, predicted */
    int n_rows;
    uint8_t *resident;      /* [n_ids] resident after the replay (NULL when n_slots is 0) */
    int n_threads;
    char isa[32];
} cli_xplan;

/* Plans c->model_path (a mixture of experts) within cap (UINT64_MAX: every
 * expert resident): the slots; a calibration decode (calib: a text file's
 * first 512 tokens, or NULL for 256 random tokens) with the cache at those
 * slots, its expert trace recorded and its second half timed; the trace
 * replayed (model/xcache.h xcache_replay) at the planned and at other slot
 * counts, the second half counted: hit rates, reads per token, resident
 * experts and tokens/s.  KV_ENOMEM naming the smallest budget when one
 * token's experts do not fit; x is freed by cli_xplan_free either way. */
int cli_xplan_make(const cli_common *c, uint64_t cap, const char *calib, cli_xplan *x,
                   kvant_err *err);
void cli_xplan_free(cli_xplan *x);
/* Text section, or (json) one JSON object without a newline. */
void cli_xplan_print(const cli_xplan *x, int json);

#endif
