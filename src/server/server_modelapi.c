/* server_modelapi.c - /v1/models, the model life-cycle routes and the
 * per-model metrics of the registry (see server_modelapi.h).
 *
 * Label values in /metrics are model names (from the command line or the
 * models directory, never from a request), escaped as Prometheus wants.
 */
#include "server/server_modelapi.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int srv_modelapi_body_name(const char *body, size_t len, char *out, size_t cap, srv_error *e)
{
    out[0] = '\0';
    json_t *o = srv_oai_load_object(body, len, e);
    if (!o)
        return -1;
    json_t *m = json_object_get(o, "model");
    int rc = 0;
    if (m && !json_is_null(m)) {
        if (!json_is_string(m)) {
            srv_error_set(e, 400, "model", "'model' must be a string");
            rc = -1;
        } else if (json_string_length(m) >= cap || !json_string_length(m)) {
            srv_error_set(e, 404, "model", "the model '%.200s' does not exist",
                          json_string_value(m));
            e->code = "model_not_found";
            rc = -1;
        } else {
            snprintf(out, cap, "%s", json_string_value(m));
        }
    }
    json_decref(o);
    return rc;
}

int srv_modelapi_error(srv_error *e, int rc, const kvant_err *ke)
{
    const char *msg = ke && ke->msg[0] ? ke->msg : kvant_status_str(rc);
    switch (rc) {
    case KV_EINVAL:
        srv_error_set(e, 404, "model", "%s", msg);
        e->code = "model_not_found";
        break;
    case KV_ENOMEM:
        srv_error_set(e, 507, "model", "%s", msg);
        e->type = "insufficient_memory";
        e->code = "model_too_large";
        break;
    case KV_EBUSY:
        srv_error_set(e, 503, "model", "%s", msg);
        break;
    default:
        srv_error_set(e, 500, "model", "%s", msg);
        e->code = "model_failed";
        break;
    }
    return -e->status;
}

static json_t *hist_json(const reg_hist *h)
{
    json_t *o = json_object();
    json_object_set_new(o, "count", json_integer((json_int_t)h->count));
    json_object_set_new(o, "sum_seconds", json_real(h->sum));
    return o;
}

static void set_int(json_t *o, const char *k, uint64_t v)
{
    json_object_set_new(o, k, json_integer((json_int_t)v));
}

static json_t *model_json(const reg_info *x)
{
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:s, s:s}", "id", x->name, "object", "model",
                          "created", (json_int_t)x->created, "owned_by", "kvant", "state",
                          reg_state_name(x->state), "path", x->path);
    json_t *res = json_object();
    if (!o || !res) {
        json_decref(o);
        json_decref(res);
        return NULL;
    }
    for (int c = 0; c < MEM_CAT_COUNT; c++)
        set_int(res, mem_cat_name((mem_cat)c), x->resident[c]);
    set_int(o, "max_model_len", (uint64_t)x->max_model_len);
    set_int(o, "sleep_level", (uint64_t)x->sleep_level);
    json_object_set_new(o, "pinned", json_boolean(x->pinned));
    set_int(o, "in_flight", (uint64_t)x->refs);
    json_object_set_new(o, "idle_seconds", json_real(x->idle_s));
    set_int(o, "need_bytes", x->need_bytes);
    set_int(o, "kv_share_bytes", x->kv_share_bytes);
    set_int(o, "kv_extra_bytes", x->kv_extra_bytes);
    set_int(o, "resident_bytes", x->resident_bytes);
    json_object_set_new(o, "resident_by_category", res);
    set_int(o, "kv_pool_bytes", x->kv_pool_bytes);
    set_int(o, "kv_blocks_total", (uint64_t)x->kv_blocks_total);
    set_int(o, "kv_blocks_used", (uint64_t)x->kv_blocks_used);
    set_int(o, "kv_blocks_min", (uint64_t)x->kv_blocks_min);
    set_int(o, "kv_blocks_max", (uint64_t)x->kv_blocks_max);
    set_int(o, "kv_grows", x->kv_grows);
    set_int(o, "kv_shrinks", x->kv_shrinks);
    set_int(o, "loads", x->loads);
    set_int(o, "load_failures", x->load_failures);
    set_int(o, "evictions", x->evictions);
    set_int(o, "wakes", x->wakes);
    set_int(o, "sleeps", x->sleeps);
    set_int(o, "unloads", x->unloads);
    json_object_set_new(o, "load_seconds", hist_json(&x->load_h));
    json_object_set_new(o, "wake_seconds", hist_json(&x->wake_h));
    if (x->error[0])
        json_object_set_new(o, "error", json_string(x->error));
    return o;
}

char *srv_modelapi_list_json(registry *r)
{
    json_t *arr = json_array();
    reg_info *x = malloc(sizeof *x);
    int n = reg_count(r);
    for (int i = 0; x && i < n; i++)
        if (reg_describe(r, i, x) == KV_OK)
            json_array_append_new(arr, model_json(x));
    free(x);
    mem_mgr *m = reg_mem(r);
    json_t *o = json_pack("{s:s, s:o, s:{s:I, s:I, s:I}}", "object", "list", "data", arr,
                          "memory", "budget_bytes", (json_int_t)mem_budget(m), "used_bytes",
                          (json_int_t)mem_used(m), "available_bytes",
                          (json_int_t)mem_available(m));
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

int srv_modelapi_get_json(registry *r, const char *name, char **out_json)
{
    *out_json = NULL;
    int i = name[0] ? reg_find(r, name) : -1;
    reg_info *x = malloc(sizeof *x);
    json_t *o = NULL;
    int status = 200;
    if (x && i >= 0 && reg_describe(r, i, x) == KV_OK) {
        o = model_json(x);
    } else if (x) {
        srv_error e;
        srv_error_set(&e, 404, "model", "the model '%.200s' does not exist", name);
        e.code = "model_not_found";
        status = 404;
        *out_json = srv_error_json(&e);
    }
    free(x);
    if (o)
        *out_json = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return status;
}

/* {"level": 1|2} (optional, default 1) for sleep. */
static int sleep_level(const char *body, size_t len, int *level, srv_error *e)
{
    *level = 1;
    if (!len)
        return 0;
    json_t *o = srv_oai_load_object(body, len, e);
    if (!o)
        return -1;
    json_t *l = json_object_get(o, "level");
    int rc = 0;
    if (l && (!json_is_integer(l) || (json_integer_value(l) != 1 && json_integer_value(l) != 2))) {
        srv_error_set(e, 400, "level", "'level' must be 1 or 2");
        rc = -1;
    } else if (l) {
        *level = (int)json_integer_value(l);
    }
    json_decref(o);
    return rc;
}

int srv_modelapi_action(registry *r, const char *url, const char *body, size_t len,
                      char **out_json)
{
    srv_error e;
    char name[REG_NAME_MAX];
    const char *p = url + strlen(REG_PATH), *slash = strrchr(p, '/');
    *out_json = NULL;
    if (!slash || slash == p || (size_t)(slash - p) >= sizeof name) {
        srv_error_set(&e, 404, NULL, "no route POST %.200s (use %s{id}/load|unload|sleep|wake)",
                      url, REG_PATH);
        *out_json = srv_error_json(&e);
        return e.status;
    }
    snprintf(name, sizeof name, "%.*s", (int)(slash - p), p);
    const char *act = slash + 1;
    kvant_err ke = {0};
    int rc, level = 1;
    if (reg_find(r, name) < 0) {
        rc = kvant_err_set(&ke, KV_EINVAL, "the model '%s' does not exist", name);
    } else if (!strcmp(act, "load")) {
        rc = reg_load(r, name, &ke);
    } else if (!strcmp(act, "wake")) {
        rc = reg_wake(r, name, &ke);
    } else if (!strcmp(act, "unload")) {
        rc = reg_unload(r, name, &ke);
    } else if (!strcmp(act, "sleep")) {
        if (sleep_level(body, len, &level, &e)) {
            *out_json = srv_error_json(&e);
            return e.status;
        }
        rc = reg_sleep(r, name, level, &ke);
    } else {
        srv_error_set(&e, 404, NULL, "unknown action '%.64s' (load, unload, sleep, wake)", act);
        *out_json = srv_error_json(&e);
        return e.status;
    }
    if (rc) {
        srv_modelapi_error(&e, rc, &ke);
        if (rc == KV_EBUSY && (!strcmp(act, "unload") || !strcmp(act, "sleep")) &&
            strstr(ke.msg, "in flight")) {
            e.status = 409; /* busy: the model serves requests */
            e.type = "invalid_request_error";
            e.code = "model_busy";
        }
        *out_json = srv_error_json(&e);
        return e.status;
    }
    reg_info *x = malloc(sizeof *x);
    json_t *o = x && reg_describe(r, reg_find(r, name), x) == KV_OK ? model_json(x)
                                                                                : NULL;
    free(x);
    *out_json = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return 200;
}

/* ---- metrics ---------------------------------------------------------------- */

/* name with \, " and newline escaped, for a label value */
static void esc(const char *in, char *out, size_t cap)
{
    size_t j = 0;
    for (; *in && j + 3 < cap; in++) {
        if (*in == '\\' || *in == '"') {
            out[j++] = '\\';
            out[j++] = *in;
        } else if (*in == '\n') {
            out[j++] = '\\';
            out[j++] = 'n';
        } else {
            out[j++] = *in;
        }
    }
    out[j] = '\0';
}

static void hist_lines(FILE *b, const char *metric, const char *lbl, const reg_hist *h)
{
    uint64_t cum = 0;
    for (int k = 0; k < REG_HIST_N; k++) {
        cum += h->bucket[k];
        if (k < REG_HIST_N - 1)
            fprintf(b, "%s_bucket{model=\"%s\",le=\"%g\"} %llu\n", metric, lbl,
                      reg_hist_le[k], (unsigned long long)cum);
        else
            fprintf(b, "%s_bucket{model=\"%s\",le=\"+Inf\"} %llu\n", metric, lbl,
                      (unsigned long long)cum);
    }
    fprintf(b, "%s_sum{model=\"%s\"} %.6f\n%s_count{model=\"%s\"} %llu\n", metric, lbl, h->sum,
              metric, lbl, (unsigned long long)h->count);
}

enum { MX_STATE, MX_RES, MX_NEED, MX_KV, MX_KVB, MX_INFL, MX_LOADS, MX_FAIL, MX_EVICT, MX_WAKES,
       MX_SLEEPS, MX_UNLOADS, MX_KVRES, MX_LOADH, MX_WAKEH, MX_N };

static const struct { const char *name, *type, *help; } mx[MX_N] = {
    {"kvant_model_state", "gauge", "1 for the model's current state."},
    {"kvant_model_resident_bytes", "gauge", "Bytes the model holds in the budget, by category."},
    {"kvant_model_need_bytes", "gauge", "The model's footprint planned from its header."},
    {"kvant_model_kv_pool_bytes", "gauge", "The model's KV pool while loaded (its live size)."},
    {"kvant_model_kv_blocks", "gauge", "The model's KV pool in blocks while loaded."},
    {"kvant_model_requests_in_flight", "gauge", "Requests holding the model."},
    {"kvant_model_loads_total", "counter", "Loads from unloaded."},
    {"kvant_model_load_failures_total", "counter", "Loads or wakes that failed."},
    {"kvant_model_evictions_total", "counter", "Unloads to make room for another model (LRU)."},
    {"kvant_model_wakes_total", "counter", "Wakes from sleep."},
    {"kvant_model_sleeps_total", "counter", "Sleeps (level 1 or 2)."},
    {"kvant_model_unloads_total", "counter", "Explicit or keep-alive unloads."},
    {"kvant_model_kv_resizes_total", "counter",
     "KV pool resizes: grown into free memory, or shrunk to let another model load."},
    {"kvant_model_load_seconds", "histogram", "Duration of loads from unloaded."},
    {"kvant_model_wake_seconds", "histogram", "Duration of wakes from sleep."},
};

static void metric_rows(FILE *b, int k, const reg_info *x, const char *lbl)
{
    const uint64_t v[MX_N] = {
        [MX_NEED] = x->need_bytes,  [MX_KV] = x->kv_pool_bytes,   [MX_INFL] = (uint64_t)x->refs,
        [MX_KVB] = (uint64_t)x->kv_blocks_total,
        [MX_LOADS] = x->loads,      [MX_FAIL] = x->load_failures, [MX_EVICT] = x->evictions,
        [MX_WAKES] = x->wakes,      [MX_SLEEPS] = x->sleeps,      [MX_UNLOADS] = x->unloads};
    if (k == MX_STATE) {
        for (int s = 0; s < REG_STATE_COUNT; s++)
            fprintf(b, "%s{model=\"%s\",state=\"%s\"} %d\n", mx[k].name, lbl,
                      reg_state_name((reg_state)s), (int)x->state == s);
    } else if (k == MX_RES) {
        for (int c = 0; c < MEM_CAT_COUNT; c++)
            fprintf(b, "%s{model=\"%s\",category=\"%s\"} %llu\n", mx[k].name, lbl,
                      mem_cat_name((mem_cat)c), (unsigned long long)x->resident[c]);
    } else if (k == MX_KVRES) {
        fprintf(b, "%s{model=\"%s\",direction=\"grow\"} %llu\n", mx[k].name, lbl,
                (unsigned long long)x->kv_grows);
        fprintf(b, "%s{model=\"%s\",direction=\"shrink\"} %llu\n", mx[k].name, lbl,
                (unsigned long long)x->kv_shrinks);
    } else if (k == MX_LOADH || k == MX_WAKEH) {
        hist_lines(b, mx[k].name, lbl, k == MX_LOADH ? &x->load_h : &x->wake_h);
    } else {
        fprintf(b, "%s{model=\"%s\"} %llu\n", mx[k].name, lbl, (unsigned long long)v[k]);
    }
}

char *srv_modelapi_metrics(registry *r)
{
    int n = reg_count(r);
    reg_info *xs = calloc((size_t)(n ? n : 1), sizeof *xs);
    if (!xs)
        return NULL;
    for (int i = 0; i < n; i++)
        reg_describe(r, i, &xs[i]);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) {
        free(xs);
        return NULL;
    }
    mem_mgr *m = reg_mem(r);
    fprintf(f, "# HELP kvant_models_budget_bytes The budget shared by every model.\n"
                  "# TYPE kvant_models_budget_bytes gauge\nkvant_models_budget_bytes %llu\n"
                  "# HELP kvant_models_used_bytes Bytes in use by all loaded models.\n"
                  "# TYPE kvant_models_used_bytes gauge\nkvant_models_used_bytes %llu\n",
              (unsigned long long)mem_budget(m), (unsigned long long)mem_used(m));
    char lbl[2 * REG_NAME_MAX + 4];
    for (int k = 0; k < MX_N; k++) {
        fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", mx[k].name, mx[k].help, mx[k].name,
                  mx[k].type);
        for (int i = 0; i < n; i++) {
            esc(xs[i].name, lbl, sizeof lbl);
            metric_rows(f, k, &xs[i], lbl);
        }
    }
    free(xs);
    if (fclose(f)) {
        free(buf);
        return NULL;
    }
    return buf;
}
