/* server_constraint.h - structured outputs: the request fields that
 * constrain a completion (response_format json_object / json_schema, vLLM's
 * structured_outputs and guided_json / guided_regex / guided_choice /
 * guided_grammar, llama.cpp's grammar and json_schema), read into one
 * (grammar kind, source) and compiled through the server's grammar cache
 * on the request's HTTP thread, never the engine thread.
 *
 * At most one constraint per request: two fields that each constrain the
 * output are a 400 naming both.  Bad input is a 400 naming the field before
 * anything reaches the engine: a wrong type, a source over the server's
 * --grammar-max-bytes, a schema, regex or grammar the front ends refuse
 * (the JSON Schema front end names the JSON pointer), or a grammar whose
 * language is empty.  docs/SERVER.md "Structured outputs" is this in prose.
 *
 * Threading: parse and get are pure except for the cache (thread-safe);
 * any HTTP thread.  Ownership: srv_constraint owns its source
 * (srv_constraint_free); each srv_gref holds one cache reference, handed to
 * the engine with its request and released by the engine's call of
 * srv_gref_release (or by the caller when the submit failed).
 */
#ifndef KVANT_SERVER_CONSTRAINT_H
#define KVANT_SERVER_CONSTRAINT_H

#include <stddef.h>

#include "grammar/gcache.h"
#include "server/server_error.h"

#define SRV_GRAMMAR_MAX_BYTES_DEFAULT (256u << 10) /* --grammar-max-bytes */
#define SRV_GRAMMAR_CACHE_DEFAULT 128             /* compiled grammars kept */

struct json_t;

typedef struct srv_constraint {
    int kind;            /* a gram_kind, or -1: the output is not constrained */
    char *src;           /* owned: the source (a compact JSON schema, a regex, GBNF, a
                          * JSON array of choices; "" for json_object) */
    size_t n;
    char field[64];      /* the field it came from, for errors ("response_format") */
} srv_constraint;

/* Reads the constraint fields of body o into *out (kind -1 when none).
 * max_bytes: the largest source accepted (0: no limit).  0, or a negative
 * status with e filled (400 naming the field); out owns nothing then. */
int srv_constraint_parse(struct json_t *o, size_t max_bytes, srv_constraint *out, srv_error *e);
void srv_constraint_free(srv_constraint *c);

/* The compiled grammar for c (compiled on a cache miss, on this thread),
 * or NULL with e filled (400 naming c->field; 500 out of memory). */
gcache_entry *srv_constraint_get(gcache *cache, const srv_constraint *c, srv_error *e);

/* One cache reference handed to the engine (engine_request.grammar_ctx);
 * srv_gref_release (engine_request.grammar_release) gives it back and
 * frees the handle.  NULL when out of memory (the entry is then released). */
typedef struct srv_gref srv_gref;
srv_gref *srv_gref_create(gcache *cache, gcache_entry *entry);
void srv_gref_release(void *gref);

#endif
