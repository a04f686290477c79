/* server_error.c - OpenAI-shaped error bodies (see server_error.h). */
#include "server/server_error.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int srv_error_set(srv_error *e, int status, const char *param, const char *fmt, ...)
{
    e->status = status;
    e->code = NULL;
    switch (status) {
    case 401: e->type = "authentication_error"; e->code = "invalid_api_key"; break;
    case 404: e->type = "invalid_request_error"; break;
    case 429: e->type = "rate_limit_error"; e->code = "rate_limit_exceeded"; break;
    case 501: e->type = "not_implemented"; e->code = "not_implemented"; break;
    case 503: e->type = "service_unavailable"; break;
    default: e->type = status >= 500 ? "internal_error" : "invalid_request_error"; break;
    }
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -status;
}

char *srv_error_json(const srv_error *e)
{
    json_t *o = json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", e->msg, "type",
                          e->type ? e->type : "invalid_request_error", "param",
                          e->param[0] ? json_string(e->param) : json_null(), "code",
                          e->code ? json_string(e->code) : json_null());
    if (!o)
        return NULL;
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

void srv_error_param_from_msg(srv_error *e)
{
    size_t k = strspn(e->msg, "abcdefghijklmnopqrstuvwxyz_");
    if (k > 0 && k < sizeof e->param && e->msg[k] == ':') {
        memcpy(e->param, e->msg, k);
        e->param[k] = 0;
    }
}
