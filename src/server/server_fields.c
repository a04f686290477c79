/* server_fields.c - the field tables of the generation routes and their
 * check (see server_fields.h).
 *
 * Invariant: every name a client can send is in one of the tables below
 * or is unknown; an implemented field is only listed here, its value is
 * read and range-checked by server_openai.c.  Adding a field means a row
 * here and a row in docs/SERVER.md's table.
 */
#include "server/server_fields.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FIELDS_LOG_MAX 64          /* distinct unknown names logged; later ones are not */

enum { API_COMP = 1, API_CHAT = 2, API_BOTH = 3 };

typedef enum field_kind {
    F_IMPL = 0,   /* implemented: read and checked by server_openai.c */
    F_NOEFFECT,   /* accepted without effect (the allow-list); the value is checked */
    F_NOTYET,     /* refused: not supported yet */
    F_REFUSED,    /* refused: not supported (no plan to) */
} field_kind;

/* 0 when v is an accepted value of field k, else a negative status (e filled). */
typedef int (*field_value_fn)(json_t *v, const char *k, srv_error *e);

typedef struct field_row {
    const char *name;
    int apis;
    field_kind kind;
    field_value_fn ok;   /* F_NOEFFECT / F_NOTYET: values accepted (NULL: none) */
    const char *why;     /* refused: the reason, after "'name' is not supported" */
} field_row;

/* ---- values accepted without effect ---------------------------------------- */

static int v_string(json_t *v, const char *k, srv_error *e)
{
    return json_is_string(v) ? 0 : srv_error_set(e, 400, k, "'%s' must be a string", k);
}

static int v_metadata(json_t *v, const char *k, srv_error *e)
{
    const char *key;
    json_t *x;
    if (!json_is_object(v))
        return srv_error_set(e, 400, k, "'%s' must be an object of strings", k);
    json_object_foreach(v, key, x) {
        if (!json_is_string(x))
            return srv_error_set(e, 400, k, "'%s.%.64s' must be a string", k, key);
    }
    return 0;
}

static int v_store(json_t *v, const char *k, srv_error *e)
{
    return json_is_false(v) ? 0 : srv_error_set(e, 400, k, "'store': kvant stores no "
                                                "completions; only false is accepted");
}

static int v_service_tier(json_t *v, const char *k, srv_error *e)
{
    const char *s = json_is_string(v) ? json_string_value(v) : "";
    if (!strcmp(s, "auto") || !strcmp(s, "default"))
        return 0;
    return srv_error_set(e, 400, k, "'service_tier': only \"auto\" and \"default\" are "
                         "accepted (kvant has one tier)");
}

static int v_modalities(json_t *v, const char *k, srv_error *e)
{
    json_t *m = json_is_array(v) && json_array_size(v) == 1 ? json_array_get(v, 0) : NULL;
    if (json_is_string(m) && !strcmp(json_string_value(m), "text"))
        return 0;
    return srv_error_set(e, 400, k, "'modalities': only [\"text\"] is supported");
}

/* ---- the tables -------------------------------------------------------------- */

static const char NOTOOLS[] = ": the legacy function-calling fields; send 'tools' and "
                              "'tool_choice'";
static const char NOLEGACY[] = ": the legacy function-calling field; send 'tool_calls'";

static const field_row top_fields[] = {
    {"model", API_BOTH, F_IMPL, NULL, NULL},
    {"prompt", API_COMP, F_IMPL, NULL, NULL},
    {"messages", API_CHAT, F_IMPL, NULL, NULL},
    {"max_tokens", API_BOTH, F_IMPL, NULL, NULL},
    {"max_completion_tokens", API_BOTH, F_IMPL, NULL, NULL},
    {"temperature", API_BOTH, F_IMPL, NULL, NULL},
    {"top_p", API_BOTH, F_IMPL, NULL, NULL},
    {"n", API_BOTH, F_IMPL, NULL, NULL},
    {"stream", API_BOTH, F_IMPL, NULL, NULL},
    {"stream_options", API_BOTH, F_IMPL, NULL, NULL},
    {"stop", API_BOTH, F_IMPL, NULL, NULL},
    {"presence_penalty", API_BOTH, F_IMPL, NULL, NULL},
    {"frequency_penalty", API_BOTH, F_IMPL, NULL, NULL},
    {"logit_bias", API_BOTH, F_IMPL, NULL, NULL},
    {"logprobs", API_BOTH, F_IMPL, NULL, NULL},
    {"top_logprobs", API_CHAT, F_IMPL, NULL, NULL},
    {"seed", API_BOTH, F_IMPL, NULL, NULL},
    {"echo", API_COMP, F_IMPL, NULL, NULL},      /* false only */
    {"suffix", API_COMP, F_IMPL, NULL, NULL},    /* "" only */
    {"best_of", API_COMP, F_IMPL, NULL, NULL},   /* 1 only */
    /* vLLM's extensions that kvant implements */
    {"top_k", API_BOTH, F_IMPL, NULL, NULL},
    {"min_p", API_BOTH, F_IMPL, NULL, NULL},
    {"repetition_penalty", API_BOTH, F_IMPL, NULL, NULL},
    {"priority", API_BOTH, F_IMPL, NULL, NULL},
    {"ignore_eos", API_BOTH, F_IMPL, NULL, NULL},
    {"cache_salt", API_BOTH, F_IMPL, NULL, NULL},
    /* kvant's: false opts the request out of speculative decoding (--spec) */
    {"speculative", API_BOTH, F_IMPL, NULL, NULL},
    /* kvant's: a per-request KV budget (engine_kvbudget.c) */
    {"kv_budget", API_BOTH, F_IMPL, NULL, NULL},
    {"kv_policy", API_BOTH, F_IMPL, NULL, NULL},
    {"kv_sinks", API_BOTH, F_IMPL, NULL, NULL},
    /* tool calling (read and checked by server_tools.c) */
    {"tools", API_CHAT, F_IMPL, NULL, NULL},
    {"tool_choice", API_CHAT, F_IMPL, NULL, NULL},
    {"parallel_tool_calls", API_CHAT, F_IMPL, NULL, NULL},
    /* structured outputs (read and checked by server_constraint.c) */
    {"response_format", API_BOTH, F_IMPL, NULL, NULL},
    {"structured_outputs", API_BOTH, F_IMPL, NULL, NULL},  /* vLLM */
    {"guided_json", API_BOTH, F_IMPL, NULL, NULL},         /* vLLM (older) */
    {"guided_regex", API_BOTH, F_IMPL, NULL, NULL},
    {"guided_choice", API_BOTH, F_IMPL, NULL, NULL},
    {"guided_grammar", API_BOTH, F_IMPL, NULL, NULL},
    {"grammar", API_BOTH, F_IMPL, NULL, NULL},             /* llama.cpp (GBNF) */
    {"json_schema", API_BOTH, F_IMPL, NULL, NULL},         /* llama.cpp */
    /* the allow-list: accepted, no effect on the output */
    {"user", API_BOTH, F_NOEFFECT, v_string, NULL},
    {"safety_identifier", API_BOTH, F_NOEFFECT, v_string, NULL},
    {"prompt_cache_key", API_BOTH, F_NOEFFECT, v_string, NULL},
    {"metadata", API_BOTH, F_NOEFFECT, v_metadata, NULL},
    {"store", API_BOTH, F_NOEFFECT, v_store, NULL},
    {"service_tier", API_BOTH, F_NOEFFECT, v_service_tier, NULL},
    {"modalities", API_CHAT, F_NOEFFECT, v_modalities, NULL},
    /* refused */
    {"functions", API_CHAT, F_REFUSED, NULL, NOTOOLS},
    {"function_call", API_CHAT, F_REFUSED, NULL, NOTOOLS},
    {"audio", API_CHAT, F_NOTYET, NULL, " yet: text output only"},
    {"prediction", API_CHAT, F_NOTYET, NULL, " yet (predicted outputs)"},
    {"web_search_options", API_CHAT, F_REFUSED, NULL, ": kvant does not search the web"},
    {"reasoning_effort", API_CHAT, F_REFUSED, NULL, " by this model"},
    {"verbosity", API_CHAT, F_REFUSED, NULL, " by this model"},
};

static const field_row message_fields[] = {
    {"role", API_CHAT, F_IMPL, NULL, NULL},
    {"content", API_CHAT, F_IMPL, NULL, NULL},
    {"name", API_CHAT, F_REFUSED, NULL, ": the chat template has no participant names"},
    {"tool_calls", API_CHAT, F_IMPL, NULL, NULL},
    {"tool_call_id", API_CHAT, F_IMPL, NULL, NULL},
    {"function_call", API_CHAT, F_REFUSED, NULL, NOLEGACY},
    {"audio", API_CHAT, F_NOTYET, NULL, " yet: text only"},
    {"refusal", API_CHAT, F_NOTYET, NULL, " yet"},
};

static const field_row part_fields[] = {
    {"type", API_CHAT, F_IMPL, NULL, NULL},
    {"text", API_CHAT, F_IMPL, NULL, NULL},
};

#define N_ROWS(t) (sizeof t / sizeof t[0])

/* ---- the unknown-field log ----------------------------------------------------- */

struct srv_unknown_log {
    pthread_mutex_t mu;
    int n;
    char names[FIELDS_LOG_MAX][64];
};

srv_unknown_log *srv_unknown_log_create(void)
{
    srv_unknown_log *l = calloc(1, sizeof *l);
    if (l)
        pthread_mutex_init(&l->mu, NULL);
    return l;
}

void srv_unknown_log_destroy(srv_unknown_log *l)
{
    if (!l)
        return;
    pthread_mutex_destroy(&l->mu);
    free(l);
}

/* One stderr line the first time name is accepted (up to FIELDS_LOG_MAX names). */
static void log_once(const srv_fields_policy *pol, const char *name)
{
    srv_unknown_log *l = pol->log;
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    int seen = 0;
    for (int i = 0; i < l->n && !seen; i++)
        seen = !strcmp(l->names[i], name);
    if (!seen && l->n < FIELDS_LOG_MAX) {
        snprintf(l->names[l->n++], sizeof l->names[0], "%s", name);
        fprintf(stderr, "kvant serve: request %s: unknown field '%s' accepted without effect "
                "(--allow-unknown-fields; logged once per field)\n",
                pol->request_id ? pol->request_id : "-", name);
    }
    pthread_mutex_unlock(&l->mu);
}

/* ---- the check --------------------------------------------------------------------- */

static int unknown(const srv_fields_policy *pol, const char *param, const char *lname,
                   srv_error *e)
{
    if (pol && pol->allow_unknown) {
        log_once(pol, lname);
        return 0;
    }
    return srv_error_set(e, 400, param, "unknown field '%s': kvant refuses fields it does not "
                         "implement (the server's --allow-unknown-fields accepts them)", param);
}

int srv_fields_unknown(const srv_fields_policy *pol, const char *param, srv_error *e)
{
    return unknown(pol, param, param, e);
}

/* Checks one key k (shown as param; logged as lname) with value v against rows. */
static int check_key(const field_row *rows, size_t n, int api, const char *k, const char *param,
                     const char *lname, json_t *v, const srv_fields_policy *pol, srv_error *e)
{
    if (json_is_null(v))
        return 0;
    const field_row *r = NULL;
    for (size_t i = 0; i < n && !r; i++)
        if (!strcmp(rows[i].name, k) && (rows[i].apis & api))
            r = &rows[i];
    if (!r)
        return unknown(pol, param, lname, e);
    switch (r->kind) {
    case F_IMPL: return 0;
    case F_NOEFFECT: return r->ok(v, param, e);
    case F_NOTYET:
        if (r->ok)
            return r->ok(v, param, e);
        return srv_error_set(e, 400, param, "'%s' is not supported%s", param, r->why);
    default: return srv_error_set(e, 400, param, "'%s' is not supported%s", param, r->why);
    }
}

int srv_fields_check(json_t *o, int chat, const srv_fields_policy *pol, srv_error *e)
{
    const char *k;
    json_t *v;
    int api = chat ? API_CHAT : API_COMP, rc;
    json_object_foreach(o, k, v) {
        if ((rc = check_key(top_fields, N_ROWS(top_fields), api, k, k, k, v, pol, e)))
            return rc;
    }
    return 0;
}

int srv_fields_check_message(json_t *msg, size_t i, const srv_fields_policy *pol, srv_error *e)
{
    const char *k;
    json_t *v;
    int rc;
    json_object_foreach(msg, k, v) {
        char param[64], lname[64];
        snprintf(param, sizeof param, "messages[%zu].%.40s", i, k);
        snprintf(lname, sizeof lname, "messages[].%.40s", k);
        if ((rc = check_key(message_fields, N_ROWS(message_fields), API_CHAT, k, param, lname, v,
                            pol, e)))
            return rc;
    }
    return 0;
}

int srv_fields_check_part(json_t *part, size_t i, size_t k, const srv_fields_policy *pol,
                          srv_error *e)
{
    const char *key;
    json_t *v;
    int rc;
    json_object_foreach(part, key, v) {
        char param[64], lname[64];
        snprintf(param, sizeof param, "messages[%zu].content[%zu].%.32s", i, k, key);
        snprintf(lname, sizeof lname, "messages[].content[].%.32s", key);
        if ((rc = check_key(part_fields, N_ROWS(part_fields), API_CHAT, key, param, lname, v, pol,
                            e)))
            return rc;
    }
    return 0;
}
