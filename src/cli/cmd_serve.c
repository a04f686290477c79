/* cmd_serve.c - `kvant serve`: parse options, start the HTTP server (it
 * answers /health 503 while the model loads), load the model, start the
 * engine, then wait for SIGTERM/SIGINT and drain.
 *
 * Signals: SIGINT and SIGTERM are blocked in every thread (the mask is set
 * before any thread starts and inherited) and taken synchronously by the
 * main thread with sigtimedwait, so no handler and no global state exist.
 * The first signal drains (up to --drain-timeout, then cancels) and exits
 * 0; a second signal during the drain exits 1 at once.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "engine/engine.h"
#include "par/par.h"
#include "server/server.h"
#include "registry/registry.h"

#define SERVE_DRAIN_TIMEOUT_S 30 /* --drain-timeout default, seconds */
#define SNAPE "hybrid models: keep the recurrent state for the prefix cache every N blocks " \
              "and at each step's last block boundary (0: none, no hits)"
#define SNAPD "2 per --max-num-seqs, at most a tenth of the budget"

/* --max-waiting default: this many requests per --max-num-seqs, at least
 * SERVE_MIN_WAITING (docs/SERVER.md "Limits"). */
#define SERVE_WAITING_PER_SEQ 8
#define SERVE_MIN_WAITING 64

typedef struct serve_opts {
    cli_common c;
    srv_config sc;
    engine_config ec;
    double drain_timeout;
    serve_models_opts mo;   /* several models (cmd_serve_models.c) */
    const char *cors[SRV_MAX_CORS_ORIGINS]; /* --cors-origin values (argv) */
    const char *chat_template;              /* --chat-template FILE or NULL */
} serve_opts;

static const char *fmt_long(char *buf, size_t cap, long v)
{
    snprintf(buf, cap, "%ld", v);
    return buf;
}

/* Defaults come from srv_config_default and engine_config_default. */
static void serve_help(void)
{
    srv_config sc = srv_config_default();
    engine_config ec = engine_config_default();
    char port[16], seqs[16], toks[16], blk[16], body[24], tmo[16], conns[16], drain[16], hdr[16],
        bdy[16], backlog[16], stall[16], sndbuf[16], gmax[16], gcache_n[16], itl[16];
    const cli_opt t[] = {
        {"--host", "ADDR", "IPv4 address to listen on", sc.host},
        {"--port", "N", "TCP port, 0: any free one", fmt_long(port, 16, sc.port)},
        {"--api-key", "KEY", "require 'Authorization: Bearer KEY'", "none"},
        {"--chat-template", "FILE", "a Jinja chat template used instead of the model's", "the model's"},
        {"--served-model-name", "NAME", "the model's name in the API",
         "the file name without .gguf"},
        {"-c, --ctx-size", "N", "context per request in tokens", "the model's"},
        {"--max-num-seqs", "N", "sequences decoded together", fmt_long(seqs, 16, ec.max_num_seqs)},
        {"--max-num-batched-tokens", "N", "tokens per engine step",
         fmt_long(toks, 16, ec.max_num_batched_tokens)},
        {"--max-itl-ms", "MS", "a step with decodes costs about MS at most (measured cost "
                               "model; prefill chunks fill it), 0: off",
         fmt_long(itl, 16, (long)ec.max_itl_ms)},
        {"--block-size", "N", "KV block size in tokens", fmt_long(blk, 16, ec.block_size)},
        {"--no-prefix-cache", NULL,
         "turn off the sharing of KV blocks between prompts with a common prefix",
         ec.prefix_cache ? "sharing on" : "sharing off"},
        {"--max-waiting", "N", "requests waiting for a sequence slot before new ones get 503 "
                               "with Retry-After, 0: no limit",
         "8 per --max-num-seqs, at least 64"},
        {"--kv-blocks", "N", "use exactly N KV blocks instead of the budget's (tests)",
         "from the budget"},
        {"--kv-window-blocks", "N", "use exactly N blocks for the sliding-window layers' KV "
                                    "group (tests)", "from the budget, or --kv-blocks"},
        {"--kv-window-keep", NULL, "sliding-window layers keep every block (as many as the "
                                   "global layers) instead of giving back those out of the "
                                   "window: the reference their outputs equal", "give back"},
        {"--state-snapshot-every", "N", SNAPE, "8"},
        {"--state-snapshot-memory", "SIZE", "hybrid models: memory for those snapshots", SNAPD},
        {"--max-body", "BYTES", "largest request body", fmt_long(body, 24, (long)sc.max_body)},
        {"--timeout", "SECONDS", "close a connection whose socket made no progress this long "
                                 "(a stream nobody reads)", fmt_long(tmo, 16, sc.conn_timeout_s)},
        {"--header-timeout", "SECONDS", "from connect (or the end of the last response) to "
                                        "complete request headers",
         fmt_long(hdr, 16, (long)sc.header_timeout_s)},
        {"--body-timeout", "SECONDS", "from the headers to the complete body",
         fmt_long(bdy, 16, (long)sc.body_timeout_s)},
        {"--max-connections", "N", "connections served at once; at the limit one idle for "
                                   "1 s or more is closed, else a new one gets 503",
         fmt_long(conns, 16, sc.max_connections)},
        {"--stream-backlog", "N", "events a stream may fall behind its client before the "
                                  "request is cancelled", fmt_long(backlog, 16, sc.stream_backlog)},
        {"--send-buffer", "BYTES", "kernel send buffer per connection (what a client that "
                                   "does not read can hold), 0: the kernel's autotuning",
         fmt_long(sndbuf, 16, sc.send_buffer)},
        {"--grammar-max-bytes", "BYTES", "structured outputs: the largest schema, grammar or "
                                         "regex a request may send (400 past it)",
         fmt_long(gmax, 16, (long)sc.grammar_max_bytes)},
        {"--grammar-cache", "N", "compiled grammars kept for reuse (LRU)",
         fmt_long(gcache_n, 16, sc.grammar_cache)},
        {"--embedding-pooling", "mean|last", "/v1/embeddings: the mean of the prompt's final "
                                             "hidden states, or the last token's", "mean"},
        {"--allow-unknown-fields", NULL, "accept request fields kvant does not know (logged "
                                         "once each) instead of answering 400 naming them",
         "refused"},
        {"--cors-origin", "ORIGIN", "answer CORS preflights and allow this browser origin "
                                    "(repeatable, up to 16; * allows any)", "no CORS"},
        {"--health-stall-timeout", "SECONDS", "/health answers 503 when requests are in flight "
                                              "and no engine step completed this long",
         fmt_long(stall, 16, (long)sc.health_stall_s)},
        {"--drain-timeout", "SECONDS", "on SIGTERM/SIGINT, wait this long for requests, then "
                                       "cancel them", fmt_long(drain, 16, SERVE_DRAIN_TIMEOUT_S)},
        {"-m, --model", "[NAME=]PATH", "a model to serve (repeatable: several models share one "
                                       "budget; NAME defaults to the file name without .gguf)",
         CLI_DEFAULT_MODEL},
        {"--models-dir", "DIR", "serve every *.gguf in DIR too (by file name)", "none"},
        {"--pin", "NAME", "load NAME at start and never evict it (repeatable)", "none"},
        {"--keep-alive", "DURATION", "unload a model idle this long (e.g. 300, 30s, 5m, 1h)",
         "forever"},
        {"--kv-per-model", "SIZE", "KV cache each model always gets when several are served",
         "2 requests of the maximum context"},
        {"--no-kv-grow", NULL, "several models: no KV beyond --kv-per-model (by default the "
                               "loaded models' pools grow into free memory, up to "
                               "--max-num-seqs requests of the context, and shrink back "
                               "before a model is evicted for another)",
         "grow"},
        {"--queue-timeout", "SECONDS", "how long a request waits for its model to be loaded",
         "60"},
        {"--load", "NAME", "load NAME at start (may be evicted later; repeatable)", "none"},
        {"--sleep", "NAME[:LEVEL]", "load NAME at start, then put it to sleep (level 1: weights "
                                   "kept mapped, 2: dropped; repeatable)", "none"},
    };
    cli_help("kvant serve [options]",
             "OpenAI-compatible HTTP server (docs/SERVER.md): /v1/completions,\n"
             "/v1/chat/completions, /v1/models, /health, /metrics.",
             t, CLI_N_OPTS(t));
    cli_kvtier_help(stdout);
    cli_spec_help(stdout);
}

/* Engine and limit options with an integer value; 1 consumed, 0 not ours, -1 bad. */
static int parse_int_opt(serve_opts *o, int argc, char **argv, int *i)
{
    static const struct { const char *name, *alt; long lo, hi; } t[] = {
        {"--port", NULL, 0, 65535},
        {"--max-num-seqs", NULL, 1, 1 << 16},
        {"--max-num-batched-tokens", NULL, 1, 1 << 24},
        {"--block-size", NULL, 1, 1024},
        {"--ctx-size", "-c", 16, 1 << 24},
        {"--max-waiting", NULL, 0, 1 << 24},
        {"--max-body", NULL, 1024, 1L << 30},
        {"--timeout", NULL, 1, 3600},
        {"--max-connections", NULL, 4, 65536},
        {"--kv-blocks", NULL, 1, 1 << 24},
        {"--stream-backlog", NULL, 16, 1 << 24},
        {"--send-buffer", NULL, 0, 1 << 30},
        {"--kv-window-blocks", NULL, 1, 1 << 24},
        {"--grammar-max-bytes", NULL, 16, 1L << 30},
        {"--grammar-cache", NULL, 1, 1 << 16},
        {"--max-itl-ms", NULL, 0, 3600000},
    };
    const char *a = argv[*i];
    for (size_t k = 0; k < sizeof t / sizeof t[0]; k++) {
        if (strcmp(a, t[k].name) && !(t[k].alt && !strcmp(a, t[k].alt)))
            continue;
        const char *v = cli_value(argc, argv, i);
        long x;
        if (!v || cli_parse_int(t[k].name, v, t[k].lo, t[k].hi, &x))
            return -1;
        switch (k) {
        case 0: o->sc.port = (int)x; break;
        case 1: o->ec.max_num_seqs = (int32_t)x; break;
        case 2: o->ec.max_num_batched_tokens = (int32_t)x; break;
        case 3: o->ec.block_size = (int32_t)x; break;
        case 4: o->ec.max_model_len = x; break;
        case 5: o->ec.max_waiting = (int32_t)x; break;
        case 6: o->sc.max_body = (size_t)x; break;
        case 7: o->sc.conn_timeout_s = (int)x; break;
        case 8: o->sc.max_connections = (int)x; break;
        case 10: o->sc.stream_backlog = (int)x; break;
        case 11: o->sc.send_buffer = (int)x; break;
        case 12: o->ec.kv_window_blocks_override = (int32_t)x; break;
        case 13: o->sc.grammar_max_bytes = (size_t)x; break;
        case 14: o->sc.grammar_cache = (int)x; break;
        case 15: o->ec.max_itl_ms = (double)x; break;
        default: o->ec.kv_blocks_override = (int32_t)x; break;
        }
        return 1;
    }
    return 0;
}

/* One --cors-origin: "*" or scheme://host[:port], no path; 0 or -1. */
static int parse_cors(serve_opts *o, const char *v)
{
    if (o->sc.n_cors_origins >= SRV_MAX_CORS_ORIGINS)
        return cli_err_usage("serve", "--cors-origin: at most 16 origins");
    const char *sep = strstr(v, "://");
    size_t n = strlen(v);
    if (strcmp(v, "*") && (!sep || sep == v || !sep[3] || strchr(sep + 3, '/') || n > 255 ||
                           strpbrk(v, " \t\r\n,")))
        return cli_err_usage("serve", "--cors-origin wants * or an origin such as "
                             "https://app.example.com (scheme://host[:port], no path)");
    o->cors[o->sc.n_cors_origins++] = v;
    o->sc.cors_origins = o->cors;
    return 0;
}

static int parse_serve(int argc, char **argv, serve_opts *o)
{
    cli_common_init(&o->c);
    o->sc = srv_config_default();
    o->ec = engine_config_default();
    o->ec.max_waiting = -1; /* not given: derived from --max-num-seqs below */
    o->drain_timeout = SERVE_DRAIN_TIMEOUT_S;
    o->chat_template = NULL;
    serve_models_opts_init(&o->mo);
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            serve_help();
            return 1;
        }
        int r = serve_models_parse(&o->mo, argc, argv, &i);
        if (r == 0)
            r = cli_common_parse(&o->c, argc, argv, &i);
        if (r == 0)
            r = parse_int_opt(o, argc, argv, &i);
        if (r == 0)
            r = cli_kvtier_parse(&o->ec, argc, argv, &i);
        if (r == 0)
            r = cli_spec_parse(&o->ec, argc, argv, &i);
        if (r < 0)
            return CLI_EXIT_USAGE;
        if (r)
            continue;
        const char *a = argv[i];
        if (!strcmp(a, "--host")) {
            if (!(o->sc.host = cli_value(argc, argv, &i)))
                return CLI_EXIT_USAGE;
        } else if (!strcmp(a, "--chat-template")) {
            if (!(o->chat_template = cli_value(argc, argv, &i)))
                return CLI_EXIT_USAGE;
        } else if (!strcmp(a, "--api-key")) {
            if (!(o->sc.api_key = cli_value(argc, argv, &i)))
                return CLI_EXIT_USAGE;
        } else if (!strcmp(a, "--served-model-name")) {
            if (!(o->sc.served_name = cli_value(argc, argv, &i)))
                return CLI_EXIT_USAGE;
        } else if (!strcmp(a, "--embedding-pooling")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || (strcmp(v, "mean") && strcmp(v, "last"))) {
                fprintf(stderr, "kvant serve: --embedding-pooling: expected mean or last\n");
                return CLI_EXIT_USAGE;
            }
            o->sc.embedding_pooling = !strcmp(v, "mean") ? 1 : 2;
        } else if (!strcmp(a, "--no-prefix-cache")) {
            o->ec.prefix_cache = 0;
        } else if (!strcmp(a, "--kv-window-keep")) {
            o->ec.kv_window_keep = 1;
        } else if (!strcmp(a, "--allow-unknown-fields")) {
            o->sc.allow_unknown_fields = 1;
        } else if (!strcmp(a, "--cors-origin")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || parse_cors(o, v))
                return CLI_EXIT_USAGE;
        } else if (!strcmp(a, "--drain-timeout")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || cli_parse_float(a, v, 0, 86400, &o->drain_timeout))
                return CLI_EXIT_USAGE;
        } else if (!strcmp(a, "--header-timeout") || !strcmp(a, "--body-timeout") ||
                   !strcmp(a, "--health-stall-timeout")) {
            const char *v = cli_value(argc, argv, &i);
            double *dst = !strcmp(a, "--header-timeout") ? &o->sc.header_timeout_s
                          : !strcmp(a, "--body-timeout") ? &o->sc.body_timeout_s
                                                         : &o->sc.health_stall_s;
            if (!v || cli_parse_float(a, v, 0.1, 86400, dst))
                return CLI_EXIT_USAGE;
        } else {
            return cli_err_unknown("serve", a);
        }
    }
    if (cli_spec_check(&o->ec, "serve"))
        return CLI_EXIT_USAGE;
    if (cli_kvtier_check(&o->ec, "serve"))
        return CLI_EXIT_USAGE;
    o->ec.kv_flush_timeout = o->drain_timeout; /* the shutdown's disk writes, after the drain */
    cli_engine_config(&o->c, &o->ec);
    if (o->ec.max_waiting < 0) {
        long w = (long)SERVE_WAITING_PER_SEQ * o->ec.max_num_seqs;
        o->ec.max_waiting = (int32_t)(w < SERVE_MIN_WAITING ? SERVE_MIN_WAITING : w);
    }
    o->ec.print_plan = 1;
    if (serve_models_check(&o->mo, &o->c, &o->sc, &o->ec))
        return CLI_EXIT_USAGE;
    if (o->c.tp * o->c.pp > 1 && o->mo.multi)
        return cli_err_usage("serve", "--tp and --pp serve one model (not several)");
    if (o->chat_template && o->mo.multi)
        return cli_err_usage("serve", "--chat-template applies to one model (not several)");
    if (!o->c.model_path)
        o->c.model_path = CLI_DEFAULT_MODEL;
    return 0;
}

/* Writes s as the inside of a JSON string that itself sits inside a
 * single-quoted shell word (so a ' becomes '\'' ). */
static void put_shell_json(FILE *f, const char *s)
{
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch == '\'')
            fputs("'\\''", f);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
}

/* The lines a newcomer needs once the model is loaded: where to send
 * requests and a curl to paste.  The API key itself stays out of the log. */
static void print_ready(const serve_opts *o, const srv *s, const engine *e)
{
    const char *host = strcmp(o->sc.host, "0.0.0.0") ? o->sc.host : "127.0.0.1";
    int port = srv_port(s);
    fprintf(stderr, "kvant serve: ready on http://%s:%d, model \"%s\", context %lld tokens; try:\n",
            host, port, srv_served_name(s), (long long)engine_max_model_len(e));
    fprintf(stderr, "  curl -s http://%s:%d/v1/chat/completions", host, port);
    fputs(" -H 'Content-Type: application/json'", stderr);
    if (o->sc.api_key)
        fputs(" -H \"Authorization: Bearer $KVANT_API_KEY\"", stderr);
    fputs(" -d '{\"model\": \"", stderr);
    put_shell_json(stderr, srv_served_name(s));
    fputs("\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello!\"}]}'\n", stderr);
    if (o->sc.api_key)
        fputs("  (export KVANT_API_KEY=<the --api-key value> first)\n", stderr);
}

/* Waits for a signal in set for up to timeout_s (<0: forever); returns the
 * signal number or 0 on timeout. */
static int wait_signal(const sigset_t *set, double timeout_s)
{
    for (;;) {
        int sig;
        if (timeout_s < 0) {
            if (sigwait(set, &sig) == 0)
                return sig;
            continue;
        }
        struct timespec ts = {(time_t)timeout_s, (long)((timeout_s - (time_t)timeout_s) * 1e9)};
        sig = sigtimedwait(set, NULL, &ts);
        if (sig > 0)
            return sig;
        if (errno == EAGAIN)
            return 0;
    }
}

typedef struct drain_ctx {
    srv *s;
    double timeout;
    int cancelled;
    _Atomic int done;
} drain_ctx;

static void *drain_main(void *arg)
{
    drain_ctx *d = arg;
    d->cancelled = srv_drain(d->s, d->timeout);
    atomic_store(&d->done, 1);
    return NULL;
}

/* --tp: a rank other than 0 holds its share and runs rank 0's steps; it
 * opens no port.  Exits when rank 0 stops (0) or the group fails (1). */
static int serve_worker(serve_opts *o, par *p)
{
    kvant_err err = {0};
    o->ec.manual = 1;
    o->ec.print_plan = 0;
    model *m = model_load(o->c.model_path, &err);
    engine *e = m ? engine_create(m, &o->ec, &err) : NULL;
    int rc = e ? engine_tp_worker(e, &err) : err.code;
    if (rc)
        fprintf(stderr, "kvant serve (rank %d): %s\n", par_rank(p), err.msg);
    if (rc && e) { /* the group is broken: do not wait for it in MPI_Finalize */
        par_abort(p, 1);
    }
    engine_destroy(e);
    model_free(m);
    par_destroy(p);
    return rc ? 1 : 0;
}

/* Waits for a signal; with --tp also ends when the group fails, after a
 * moment for the failed requests' answers to leave.  Returns 0 on a signal,
 * 1 on a failed group. */
static int serve_wait(const sigset_t *set, engine *e)
{
    for (;;) {
        if (wait_signal(set, e ? 0.2 : -1) > 0)
            return 0;
        engine_tp_stats ts;
        if (e && engine_get_tp_stats(e, &ts) && ts.failed) {
            fprintf(stderr, "kvant serve: the tensor-parallel group failed; exiting\n");
            wait_signal(set, 1.0);
            return 1;
        }
    }
}

int cmd_serve(int argc, char **argv)
{
    serve_opts o;
    int pr = parse_serve(argc, argv, &o);
    if (pr)
        return pr == 1 ? 0 : pr;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* before any thread starts */
    signal(SIGPIPE, SIG_IGN);

    kvant_err err = {0};
    par *group = NULL;
    if (o.c.tp * o.c.pp > 1) {
        if (!(group = par_create(o.c.tp * o.c.pp, o.c.tp_timeout, &err))) {
            fprintf(stderr, "kvant serve: %s\n", err.msg);
            return 1;
        }
        o.ec.tp_group = group;
        o.ec.tp_ranks = o.c.tp;
        if (par_rank(group) != 0)
            return serve_worker(&o, group);
    }
    srv *s = srv_create(&o.sc, o.c.model_path, &err);
    if (!s) {
        fprintf(stderr, "kvant serve: %s\n", err.msg);
        if (group)
            par_abort(group, 1);
        return 1;
    }
    fprintf(stderr, "kvant serve: listening on http://%s:%d (loading %s)\n", o.sc.host,
            srv_port(s), o.mo.multi ? "several models" : o.c.model_path);
    model *m = NULL;
    engine *e = NULL;
    registry *reg = NULL;
    if (o.mo.multi) {
        reg = serve_models_start(&o.mo, &o.ec, &o.sc, s, &err);
        if (!reg) {
            fprintf(stderr, "kvant serve: %s\n", err.msg);
            srv_destroy(s);
            return 1;
        }
    } else {
        m = model_load(o.c.model_path, &err);
        if (m && cli_chat_template(m, o.chat_template, "serve", &err)) {
            model_free(m);
            m = NULL;
        } else if (m && !m->has_chat && !o.chat_template) {
            fprintf(stderr, "kvant serve: chat requests will be refused: %s\n", m->chat_err);
        }
        e = m ? engine_create(m, &o.ec, &err) : NULL;
        if (!e) {
            fprintf(stderr, "kvant serve: %s\n", err.msg);
            srv_destroy(s);
            model_free(m);
            par_destroy(group); /* every rank failed the start together */
            return 1;
        }
        srv_attach(s, m, e);
        print_ready(&o, s, e);
    }
    if (serve_wait(&set, group ? e : NULL)) {
        srv_stop(s);
        par_abort(group, 1); /* a rank is gone or hung: end the whole job */
        return 1;
    }
    fprintf(stderr, "kvant serve: draining (up to %.0f s; a second signal exits now)\n",
            o.drain_timeout);
    /* The drain runs on a helper thread so that the main thread stays in
     * sigtimedwait and a second signal exits at once. */
    drain_ctx dc = {.s = s, .timeout = o.drain_timeout};
    pthread_t th;
    if (pthread_create(&th, NULL, drain_main, &dc)) {
        drain_main(&dc);
    } else {
        while (!atomic_load(&dc.done)) {
            if (wait_signal(&set, 0.05) > 0) {
                fprintf(stderr, "kvant serve: second signal, exiting now\n");
                return 1;
            }
        }
        pthread_join(th, NULL);
    }
    if (dc.cancelled)
        fprintf(stderr, "kvant serve: cancelled %d request(s) at the drain timeout\n",
                dc.cancelled);
    /* HTTP threads first; then the engine, whose last events (requests
     * cancelled after their clients left) still use the server's channels
     * and metrics; then those. */
    srv_stop(s);
    engine_destroy(e);
    reg_destroy(reg);
    srv_destroy(s);
    model_free(m);
    par_destroy(group);
    fprintf(stderr, "kvant serve: stopped\n");
    return 0;
}
