/* server_error.h - OpenAI-shaped errors: {"error": {"message", "type",
 * "param", "code"}} with the HTTP status that carries them.  Below every
 * route file and the request parsers, so each can fill one.
 * Threading: pure functions; any thread.
 */
#ifndef KVANT_SERVER_ERROR_H
#define KVANT_SERVER_ERROR_H

typedef struct srv_error {
    int status;          /* HTTP status */
    const char *type;    /* "invalid_request_error", ... (static string) */
    const char *code;    /* static string or NULL */
    char param[64];      /* offending field or "" */
    char msg[512];
} srv_error;

/* Fills e and returns -status, e.g. `return srv_error_set(e, 400, "temperature", ...)`.
 * The type follows the status (401 authentication_error, 429 rate_limit_error,
 * 501 not_implemented, 503 service_unavailable, other 5xx internal_error, else
 * invalid_request_error); set e->type / e->code after it to override. */
int srv_error_set(srv_error *e, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Sets e->param from a message that starts with "field: " (the engine's
 * refusals of a request field, e.g. "kv_budget: ..."); else leaves it. */
void srv_error_param_from_msg(srv_error *e);
/* {"error":{"message","type","param","code"}}; malloc'd (caller frees), NULL on OOM. */
char *srv_error_json(const srv_error *e);

#endif
