/* server_fields.h - the status of every request field of /v1/completions
 * and /v1/chat/completions (and of every message and content-part field):
 * implemented (read by server_openai.c), accepted without effect (a short
 * allow-list, each value still checked), not supported yet, or unknown.
 * The product rule: a field kvant does not implement is refused with a 400
 * naming it, never accepted and ignored; --allow-unknown-fields accepts
 * unknown names (logged once each), never the refused ones.
 * docs/SERVER.md "Request fields" is this table in prose.
 *
 * A JSON null is the field's absence, for every field (clients that send
 * a previous response's message back send its null fields).
 * Threading: the checks are pure; the unknown-field log is thread-safe.
 */
#ifndef KVANT_SERVER_FIELDS_H
#define KVANT_SERVER_FIELDS_H

#include <stddef.h>

#include "server/server_error.h"

struct json_t;

/* Remembers which unknown field names were logged (heap handle). */
typedef struct srv_unknown_log srv_unknown_log;
srv_unknown_log *srv_unknown_log_create(void);
void srv_unknown_log_destroy(srv_unknown_log *l);

typedef struct srv_fields_policy {
    int allow_unknown;          /* --allow-unknown-fields: accept unknown names */
    srv_unknown_log *log;       /* borrowed; NULL: accepted names are not logged */
    const char *request_id;     /* for the log line (borrowed), or NULL */
} srv_fields_policy;

/* Every top-level key of a body (chat: 1 for /v1/chat/completions, 0 for
 * /v1/completions).  0, or a negative status with e filled (400 naming the
 * field). */
int srv_fields_check(struct json_t *o, int chat, const srv_fields_policy *pol, srv_error *e);
/* The keys of messages[i] other than role and content. */
int srv_fields_check_message(struct json_t *msg, size_t i, const srv_fields_policy *pol,
                             srv_error *e);
/* An unknown name met by a parser (e.g. a key of stream_options): 0 and
 * logged once when pol allows unknown fields, else a 400 naming param. */
int srv_fields_unknown(const srv_fields_policy *pol, const char *param, srv_error *e);
/* The keys of messages[i].content[k] other than type and text. */
int srv_fields_check_part(struct json_t *part, size_t i, size_t k, const srv_fields_policy *pol,
                          srv_error *e);

#endif
