/* server_modelapi.h - the HTTP face of the model registry (several models
 * in one budget, registry/registry.h): /v1/models with every model's state and
 * memory, POST /v1/models/{id}/{load,unload,sleep,wake}, the per-model
 * /metrics series, and the mapping of registry errors to HTTP statuses.
 * Not part of the public API.  Threading: MHD threads.
 */
#ifndef KVANT_SERVER_MODELAPI_H
#define KVANT_SERVER_MODELAPI_H

#include <microhttpd.h>
#include <stddef.h>

#include "registry/registry.h"
#include "server/server_openai.h"

#define REG_PATH "/v1/models/"   /* prefix of the life-cycle routes */

/* The body's "model" (absent or null: "", the first model) into out.
 * 0, or -1 with e filled (bad JSON, not a string, too long: 400/404). */
int srv_modelapi_body_name(const char *body, size_t len, char *out, size_t cap, srv_error *e);
/* Fills e from a registry status: KV_EINVAL 404 (model_not_found),
 * KV_ENOMEM 507 (model_too_large), KV_EBUSY 503, KV_EFORMAT/KV_EIO 500
 * (model_failed); returns -status. */
int srv_modelapi_error(srv_error *e, int rc, const kvant_err *ke);
/* The JSON list for GET /v1/models (malloc'd; NULL on OOM). */
char *srv_modelapi_list_json(registry *r);
/* GET /v1/models/{id}: 200 and the model's object, or 404 and an error
 * body (model_not_found); *out_json malloc'd, NULL on OOM. */
int srv_modelapi_get_json(registry *r, const char *name, char **out_json);
/* POST /v1/models/{id}/{action}: status and a malloc'd JSON body (the
 * model's object, or an error body). */
int srv_modelapi_action(registry *r, const char *url, const char *body, size_t len,
                      char **out_json);
/* Per-model Prometheus series (malloc'd; NULL on OOM). */
char *srv_modelapi_metrics(registry *r);

#endif
