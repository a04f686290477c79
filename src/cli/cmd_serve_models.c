/* cmd_serve_models.c - the options and start-up of `kvant serve` with
 * several models in one memory budget (registry/registry.h).
 *
 * Several models are served when -m is given more than once, or with
 * --models-dir, --pin, --keep-alive, --load or --sleep; a single -m without
 * them runs the one-model server exactly as before.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "server/server.h"
#include "registry/registry.h"

void serve_models_opts_init(serve_models_opts *o)
{
    memset(o, 0, sizeof *o);
    o->queue_timeout_s = REG_QUEUE_TIMEOUT_S;
}

/* "300", "30s", "5m", "1h", "1.5m": seconds into *out; -1 on garbage. */
static int parse_duration(const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v >= 0) || v > 1e9)
        return -1;
    double mul = !strcmp(end, "") || !strcmp(end, "s") ? 1 : !strcmp(end, "m") ? 60
                 : !strcmp(end, "h")                    ? 3600
                                                        : -1;
    if (mul < 0)
        return -1;
    *out = v * mul;
    return 0;
}

static int push(const char **arr, int *n, const char *v, const char *opt)
{
    if (*n == SERVE_MAX_MODEL_ARGS) {
        fprintf(stderr, "kvant serve: %s: at most %d\n", opt, SERVE_MAX_MODEL_ARGS);
        return -1;
    }
    arr[(*n)++] = v;
    return 1;
}

int serve_models_parse(serve_models_opts *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v;
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
        if (!(v = cli_value(argc, argv, i)))
            return -1;
        return push(o->model_args, &o->n_models, v, a);
    }
    if (!strcmp(a, "--pin") || !strcmp(a, "--load") || !strcmp(a, "--sleep")) {
        if (!(v = cli_value(argc, argv, i)))
            return -1;
        return !strcmp(a, "--pin")    ? push(o->pins, &o->n_pins, v, a)
               : !strcmp(a, "--load") ? push(o->loads, &o->n_loads, v, a)
                                      : push(o->sleeps, &o->n_sleeps, v, a);
    }
    if (!strcmp(a, "--models-dir")) {
        return (o->models_dir = cli_value(argc, argv, i)) ? 1 : -1;
    }
    if (!strcmp(a, "--keep-alive")) {
        if (!(v = cli_value(argc, argv, i)))
            return -1;
        if (parse_duration(v, &o->keep_alive_s) || o->keep_alive_s <= 0) {
            fprintf(stderr, "kvant serve: --keep-alive: '%s' is not a duration > 0 (300, 30s, "
                            "5m, 1h)\n", v);
            return -1;
        }
        return 1;
    }
    if (!strcmp(a, "--no-kv-grow")) {
        o->no_kv_grow = 1;
        return 1;
    }
    if (!strcmp(a, "--queue-timeout")) {
        v = cli_value(argc, argv, i);
        return !v || cli_parse_float(a, v, 0.1, 86400, &o->queue_timeout_s) ? -1 : 1;
    }
    if (!strcmp(a, "--kv-per-model")) {
        kvant_err err = {0};
        if (!(v = cli_value(argc, argv, i)))
            return -1;
        if (mem_parse_size(v, &o->kv_per_model, &err) || !o->kv_per_model) {
            fprintf(stderr, "kvant serve: --kv-per-model: %s\n",
                    err.msg[0] ? err.msg : "must be > 0");
            return -1;
        }
        return 1;
    }
    return 0;
}

/* Splits "NAME=PATH" (NAME without '/'); name NULL when there is none. */
static void split_alias(const char *arg, char *name, size_t cap, const char **path)
{
    const char *eq = strchr(arg, '=');
    name[0] = '\0';
    *path = arg;
    if (eq && eq > arg && eq[1] && (size_t)(eq - arg) < cap && !memchr(arg, '/', (size_t)(eq - arg))) {
        snprintf(name, cap, "%.*s", (int)(eq - arg), arg);
        *path = eq + 1;
    }
}

void serve_models_split(const char *arg, char *name, size_t cap, const char **path)
{
    split_alias(arg, name, cap, path);
    if (!name[0])
        reg_name_from_path(*path, name, cap);
}

int serve_models_check(serve_models_opts *o, cli_common *c, struct srv_config *sc,
                       const engine_config *ec)
{
    o->multi = o->n_models > 1 || o->models_dir || o->n_pins || o->n_loads || o->n_sleeps ||
               o->keep_alive_s > 0;
    if (!o->multi) {
        if (o->kv_per_model || o->no_kv_grow)
            return cli_err_usage("serve", "--kv-per-model and --no-kv-grow need several models");
        if (o->n_models == 1) {
            static char name[REG_NAME_MAX];
            split_alias(o->model_args[0], name, sizeof name, &c->model_path);
            if (name[0] && !sc->served_name)
                sc->served_name = name;
        }
        return 0;
    }
    if (ec->kv_host_memory || ec->kv_disk_dir)
        return cli_err_usage("serve", "KV offload tiers (--kv-host-memory, --kv-disk-dir) serve "
                                      "one model: not with several");
    if (ec->weights_dtype >= 0)
        return cli_err_usage("serve", "--weights-dtype serves one model: not with several");
    if (ec->kv_blocks_override > 0)
        return cli_err_usage("serve", "--kv-blocks serves one model: use --kv-per-model");
    if (ec->weights_memory || ec->weights_memory_frac > 0)
        return cli_err_usage("serve", "--weights-memory (weight offload) serves one model: not "
                                      "with several");
    if (sc->served_name)
        return cli_err_usage("serve", "--served-model-name serves one model: use -m NAME=PATH");
    if (!o->n_models && !o->models_dir)
        o->model_args[o->n_models++] = CLI_DEFAULT_MODEL;
    return 0;
}

static void print_model(const reg_info *x)
{
    char a[32], b[32];
    if (x->state == REG_FAILED) {
        fprintf(stderr, "kvant serve: model %s (%s): failed: %s\n", x->name, x->path, x->error);
        return;
    }
    fprintf(stderr, "kvant serve: model %s (%s): needs %s (KV share %s), context %lld%s\n",
            x->name, x->path, mem_format_size(x->need_bytes, a, 32),
            mem_format_size(x->kv_share_bytes, b, 32), (long long)x->max_model_len,
            x->pinned ? ", pinned" : "");
}

/* --pin, --load and --sleep at start. */
static int start_models(const serve_models_opts *o, registry *r, kvant_err *err)
{
    for (int i = 0; i < o->n_pins; i++)
        if (reg_pin(r, o->pins[i], err))
            return -1;
    for (int i = 0; i < o->n_loads; i++)
        if (reg_load(r, o->loads[i], err))
            return -1;
    for (int i = 0; i < o->n_sleeps; i++) {
        char name[REG_NAME_MAX];
        snprintf(name, sizeof name, "%s", o->sleeps[i]);
        char *colon = strrchr(name, ':');
        int level = 1;
        if (colon && (!strcmp(colon, ":1") || !strcmp(colon, ":2"))) {
            level = colon[1] - '0';
            *colon = '\0';
        }
        if (reg_load(r, name, err) || reg_sleep(r, name, level, err))
            return -1;
    }
    return 0;
}

registry *serve_models_start(const serve_models_opts *o, const engine_config *ec,
                               const struct srv_config *sc, struct srv *s, kvant_err *err)
{
    reg_config mc = reg_config_default();
    mc.ec = *ec;
    mc.kv_per_model = o->kv_per_model;
    mc.kv_grow = !o->no_kv_grow;
    mc.keep_alive_s = o->keep_alive_s;
    mc.queue_timeout_s = o->queue_timeout_s;
    registry *r = reg_create(&mc, err);
    if (!r)
        return NULL;
    for (int i = 0; i < o->n_models; i++) {
        char name[REG_NAME_MAX];
        const char *path;
        split_alias(o->model_args[i], name, sizeof name, &path);
        kvant_err e2 = {0};
        if (reg_add(r, name[0] ? name : NULL, path, &e2)) {
            *err = e2;
            goto fail;
        }
    }
    if (o->models_dir && reg_add_dir(r, o->models_dir, err))
        goto fail;
    char a[32];
    fprintf(stderr, "kvant serve: %d model(s) share a budget of %s\n", reg_count(r),
            mem_format_size(mem_budget(reg_mem(r)), a, 32));
    if (start_models(o, r, err) || reg_start(r, err))
        goto fail;
    reg_info *x = malloc(sizeof *x);
    for (int i = 0; x && i < reg_count(r); i++)
        if (reg_describe(r, i, x) == KV_OK)
            print_model(x);
    free(x);
    srv_attach_models(s, r);
    const char *host = strcmp(sc->host, "0.0.0.0") ? sc->host : "127.0.0.1";
    fprintf(stderr, "kvant serve: ready on http://%s:%d with %d models (GET /v1/models; the "
                    "request's \"model\" picks one, loaded on demand)\n",
            host, srv_port(s), reg_count(r));
    return r;
fail:
    reg_destroy(r);
    return NULL;
}
