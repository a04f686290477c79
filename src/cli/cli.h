/* cli.h - shared pieces of the kvant subcommands: argument helpers, the
 * --help tables and one-line usage errors, the default model path, and a
 * single-sequence session (model + backend + forward context + identity
 * block table) used by run, perplexity, logits.
 *
 * Conventions every subcommand follows: `-h`/`--help` prints its options
 * (each with its default) and the common options to stdout and exits 0;
 * an unknown option, a bad value or a missing required argument prints
 * one line on stderr and exits 2 (CLI_EXIT_USAGE).
 */
#ifndef KVANT_CLI_H
#define KVANT_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "backend/backend.h"
#include "engine/engine.h"
#include "mem/mem.h"
#include "forward/forward.h"
#include "model/model.h"

#define CLI_DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define CLI_DEFAULT_BLOCK 16
#define CLI_EXIT_USAGE 2 /* exit code of a command-line mistake */

typedef struct cli_common {
    const char *model_path;
    int n_threads;       /* 0 = all cores */
    int json;
    uint64_t device_memory; /* 0 = host available */
    double utilization;
    int weights_dtype;   /* -1 = as stored; else load-time quantization target */
    uint32_t kv_dtype;   /* KV cache element type (DT_F16 default) */
    int kv_rotate;       /* --kv-rotate: K/V stored Hadamard-rotated */
    double kv_budget;    /* --kv-budget N|F: requests' default KV budget (0: none) */
    int kv_sinks;        /* --kv-sinks N: its sink tokens (0: the engine's default) */
    int kv_policy;       /* --kv-policy: ENGINE_KV_SINKS, _SNAPKV or _H2O (0: sinks) */
    const char *backend; /* "cpu" (default) or "cuda" */
    int exact;           /* --exact: f32 activations in every matmul (reference path) */
    int no_pack;         /* --no-pack: weights stay in the file's layout */
    int device;
    uint64_t weights_memory;    /* --weights-memory SIZE (0: auto: a cap only when the
                                 * weights do not fit, chosen by the planner) */
    int no_offload;             /* --no-offload: refuse weights that do not fit */
    int kv_pool_budget;         /* --kv-pool budget: the pool takes all the budget leaves
                                 * (default fit: sized from demand on the CPU) */
    uint64_t kv_start;          /* --kv-start SIZE: a fitted pool's size at start (0:
                                 * PLAN_KV_FIT_START) */
    double weights_memory_frac; /* --weights-memory F, a fraction of the budget (0: none) */
    int weights_slots;          /* --stream-buffers N (0: 2) */
    int weights_io;             /* --stream-io MODE: WSTREAM_IO_* (0: buffered) */
    int weights_place;          /* --weights-place auto|tail|spread: 0 auto, 1 + WSTREAM_ORDER_* */
    int tp;                     /* --tp N: tensor-parallel ranks per stage; 1: none */
    int pp;                     /* --pp N: pipeline stages; mpirun -np tp*pp */
    double tp_timeout;          /* --tp-timeout S: longest wait for another rank */
} cli_common;

void cli_common_init(cli_common *c);
/* Consumes a common option at argv[*i] (advancing *i past its value).
 * Returns 1 if consumed, 0 if not a common option, -1 on a bad value. */
int cli_common_parse(cli_common *c, int argc, char **argv, int *i);
/* One turn of a subcommand's option loop at argv[*i]: -h/--help prints
 * help() and returns CLI_STEP_HELP; a common option is consumed
 * (CLI_STEP_TAKEN); a bad value prints one line (CLI_STEP_BAD); anything
 * else is the subcommand's own (CLI_STEP_OWN). */
enum { CLI_STEP_BAD = -1, CLI_STEP_OWN = 0, CLI_STEP_TAKEN = 1, CLI_STEP_HELP = 2 };
int cli_common_step(cli_common *c, int argc, char **argv, int *i, void (*help)(void));
/* Value of the option at argv[*i] (advances); prints a one-line error and
 * returns NULL when missing.  argv[0] is the subcommand's name. */
const char *cli_value(int argc, char **argv, int *i);
int cli_parse_int(const char *opt, const char *s, long lo, long hi, long *out);
int cli_parse_float(const char *opt, const char *s, double lo, double hi, double *out);

/* One row of a --help table.  def is the default as text ("off" for a flag
 * that is off) or NULL when the option has none, e.g. a required value
 * (say so in help). */
typedef struct cli_opt {
    const char *names; /* "-m, --model": every spelling the parser accepts */
    const char *arg;   /* value placeholder ("PATH"), NULL for a flag */
    const char *help;  /* one line */
    const char *def;
} cli_opt;

#define CLI_N_OPTS(t) (sizeof(t) / sizeof((t)[0]))

int cli_is_help(const char *arg); /* "-h" or "--help" */
/* Prints rows as an aligned table, under title unless it is NULL. */
void cli_help_table(FILE *f, const char *title, const cli_opt *t, size_t n);
/* Prints the options cli_common_parse accepts, with their defaults. */
void cli_common_help(FILE *f);
/* A subcommand's --help on stdout: usage line, about text (may be NULL),
 * its own options, then the common options. */
void cli_help(const char *usage, const char *about, const cli_opt *t, size_t n);
/* One line on stderr, "kvant CMD: unknown option 'OPT' (see 'kvant CMD
 * --help')"; returns CLI_EXIT_USAGE. */
int cli_err_unknown(const char *cmd, const char *opt);
/* One line on stderr, "kvant CMD: MSG (see 'kvant CMD --help')"; returns
 * CLI_EXIT_USAGE. */
int cli_err_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* `kvant plan --tp N` (cli_plan_tp.c): each rank's weights, KV and
 * activations; returns the exit code. */
struct plan_config;
int cli_plan_tp(const cli_common *c, const struct plan_config *pc);

/* Reads a whole file into a malloc'd NUL-terminated buffer. */
char *cli_read_file(const char *path, size_t *len, kvant_err *err);
/* --chat-template FILE: compiles the file's Jinja template for m in place
 * of the GGUF's.  An unreadable file is an error; a template kvant refuses
 * leaves m->has_chat = 0 with the reason in m->chat_err, and a line on
 * stderr prefixed with cmd (chat requests then get that error). */
int cli_chat_template(model *m, const char *path, const char *cmd, kvant_err *err);
void cli_json_string(FILE *f, const char *s, size_t len);

/* Copies the common options that configure an engine (threads, memory
 * budget, backend, device, weight and KV types, --act-q8) into ec. */
void cli_engine_config(const cli_common *c, engine_config *ec);

/* KV offload tier options (cli_kvtier.c): --kv-host-memory SIZE,
 * --kv-disk-dir DIR (borrowed from argv), --kv-disk-size SIZE (default
 * ENGINE_DEFAULT_DISK_SIZE).  Returns 1 consumed, 0 not ours, -1 bad value
 * (message printed).  _check: CLI_EXIT_USAGE (one line) for a size
 * without a dir, else 0. */
int cli_kvtier_parse(engine_config *ec, int argc, char **argv, int *i);
/* Prints the tier options' help table (kvant serve --help). */
void cli_kvtier_help(FILE *f);
int cli_kvtier_check(const engine_config *ec, const char *cmd);

/* Speculative decoding options (cli_spec.c): --spec ngram|draft|off,
 * --draft-model PATH (implies --spec draft), --spec-draft N, --spec-ngram-min N, --spec-ngram-max N, --spec-max-batch
 * N into ec.  _parse: 1 consumed, 0 not ours, -1 bad value (message
 * printed); _check: CLI_EXIT_USAGE (one line) for min > max, else 0;
 * _help: their --help table. */
int cli_spec_parse(engine_config *ec, int argc, char **argv, int *i);
/* kvant plan --draft-model (cli_plan_draft.c): plans the draft as the
 * engine does and sets pc->reserved_bytes to it (1 with the error
 * printed); prints it (text or JSON member). */
struct engine_draft_plan;
struct plan_config;
int cli_plan_draft(const cli_common *c, struct plan_config *pc, const engine_config *ec,
                   struct engine_draft_plan *out);
void cli_plan_draft_print(const engine_config *ec, const struct engine_draft_plan *p, int json);
int cli_spec_check(const engine_config *ec, const char *cmd);
void cli_spec_help(FILE *f);

/* `kvant serve` with several models (cmd_serve_models.c): -m [NAME=]PATH
 * (repeatable), --models-dir, --pin, --keep-alive, --kv-per-model,
 * --queue-timeout, --load, --sleep.  Strings are borrowed from argv. */
#define SERVE_MAX_MODEL_ARGS 64
typedef struct serve_models_opts {
    const char *model_args[SERVE_MAX_MODEL_ARGS]; /* -m values as given */
    int n_models;
    const char *models_dir;
    const char *pins[SERVE_MAX_MODEL_ARGS];
    int n_pins;
    const char *loads[SERVE_MAX_MODEL_ARGS];    /* --load NAME */
    int n_loads;
    const char *sleeps[SERVE_MAX_MODEL_ARGS];   /* --sleep NAME[:LEVEL] */
    int n_sleeps;
    double keep_alive_s;     /* <= 0: forever */
    uint64_t kv_per_model;   /* 0: the registry's default */
    int no_kv_grow;          /* --no-kv-grow: every pool exactly its share */
    double queue_timeout_s;
    int multi;               /* set by _check: serve through the model registry */
} serve_models_opts;

struct srv;
struct srv_config;
struct registry;
void serve_models_opts_init(serve_models_opts *o);
/* 1 consumed, 0 not ours, -1 bad value (message printed). */
int serve_models_parse(serve_models_opts *o, int argc, char **argv, int *i);
/* Decides single or several models; a single -m NAME=PATH sets the served
 * name.  Refuses options several models do not support.  0 or
 * CLI_EXIT_USAGE (one line printed). */
int serve_models_check(serve_models_opts *o, cli_common *c, struct srv_config *sc,
                       const engine_config *ec);
/* The name and file of one -m [NAME=]PATH, as the registry names it. */
void serve_models_split(const char *arg, char *name, size_t cap, const char **path);
/* Builds the registry, registers and pins the models, attaches it to the
 * server, prints the ready lines.  NULL + err on failure. */
struct registry *serve_models_start(const serve_models_opts *o, const engine_config *ec,
                                      const struct srv_config *sc, struct srv *s,
                                      kvant_err *err);

/* One sequence, positions [0, n_ctx), blocks 0..n-1 in order. */
typedef struct cli_session {
    mem_mgr *mem;
    backend *be;
    model *m;
    fwd_ctx fwd;
    int32_t n_ctx;
    int32_t *table;
    int32_t n_blocks;
    int32_t max_batch;
    float *logits;        /* host [max_out][n_vocab] */
    struct quant_weights *qw; /* load-time quantized copies (or NULL) */
    struct wstream *ws;   /* weight offload (--weights-memory), or NULL */
    struct xcache *xc;    /* experts placed by memory (--weights-memory, experts), or NULL */
    struct par *par;      /* --tp: the process group, or NULL */
    struct model_shard *shard; /* --tp: this rank's share of the weights */
    struct tp_ctx *tp;    /* --tp: the forward pass's reductions */
} cli_session;

/* With --tp N under mpirun, every rank opens the session on its share of
 * the model; ranks other than 0 then serve rank 0's forward passes inside
 * this call and exit the process when rank 0 closes its session (status
 * 0) or the group fails (status 1): only rank 0 returns. */
int cli_session_open(cli_session *s, const cli_common *c, int32_t n_ctx, int32_t max_batch,
                     int32_t max_out, kvant_err *err);
void cli_session_close(cli_session *s);
/* Evaluates tokens at positions [pos0, pos0+n) in ubatches; when all_logits
 * is set writes [n][n_vocab] into out, else only the last row. */
int cli_session_eval(cli_session *s, const int32_t *tokens, int32_t n, int32_t pos0,
                     int all_logits, float *out, kvant_err *err);

/* Subcommands. */
int cmd_run(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_grammar(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_plan(int argc, char **argv);
/* `kvant plan` with several models (cmd_plan_models.c): o parsed as serve
 * parses it, c and pc as plan parses them, tiers: the KV tier options
 * (refused with several models).  0, 1 (serve's start would fail) or
 * CLI_EXIT_USAGE. */
int cmd_plan_models(const serve_models_opts *o, const cli_common *c, const struct plan_config *pc,
                    const engine_config *tiers);
int cmd_serve(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_kl(int argc, char **argv);
int cmd_prune(int argc, char **argv);
int cmd_top(int argc, char **argv);
/* `kvant info --memory` (cmd_info_mem.c). */
int info_memory(const gguf_ctx *g, const model_hparams *hp, int json);

#endif
