/* server.h - `kvant serve`: an OpenAI-compatible HTTP server over the
 * engine (libmicrohttpd, one thread per connection).
 *
 * Routes: POST /v1/completions, /v1/chat/completions, /tokenize,
 * /detokenize, /v1/models/{id}/{load,unload,sleep,wake} (several models);
 * GET /v1/models, /v1/memory, /health, /metrics.  See
 * docs/SERVER.md for the API, errors and metrics.
 *
 * Life cycle: srv_create starts listening at once (state "loading": /health
 * answers 503) so a supervisor can watch start-up; srv_attach hands it the
 * loaded model and engine (state "ready"); srv_drain stops accepting and
 * finishes or cancels in-flight requests; srv_stop stops the daemon;
 * srv_destroy frees the rest.
 * Ownership: the server borrows the model and engine.  The engine is
 * destroyed between srv_stop and srv_destroy (its last events still reach
 * the server's channels and metrics); the model outlives both.
 * Threading: srv_attach/srv_drain/srv_stop/srv_destroy are called
 * from the controlling (main) thread; everything else runs on MHD threads.
 */
#ifndef KVANT_SERVER_H
#define KVANT_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "model/model.h"
#include "server/server_config.h"
#include "util/err.h"

srv_config srv_config_default(void);

srv *srv_create(const srv_config *cfg, const char *model_path, kvant_err *err);
/* Serves this model through this engine from now on (/health -> 200). */
void srv_attach(srv *s, model *m, engine *e);
/* Serves several models from a registry (registry/registry.h, borrowed; the
 * caller destroys it between srv_stop and srv_destroy): requests route by
 * their "model" field, /v1/models lists every model, POST
 * /v1/models/{id}/{load,unload,sleep,wake} drive their life cycle. */
typedef struct registry registry;
void srv_attach_models(srv *s, registry *r);
/* Stops accepting connections, /health -> 503 "draining", stops engine
 * admission, waits up to timeout_s for in-flight requests to finish, then
 * cancels the rest (they end with an error event) and waits briefly for
 * their streams to close.  Returns the number of requests cancelled. */
int srv_drain(srv *s, double timeout_s);
/* Stops the HTTP daemon and joins its threads: after it no HTTP thread
 * uses the engine.  Call before engine_destroy, whose final events still
 * reach the server's channels and metrics; srv_destroy frees those after. */
void srv_stop(srv *s);
void srv_destroy(srv *s);
int srv_port(const srv *s);
/* The model's name in the API (--served-model-name or the file stem);
 * owned by s. */
const char *srv_served_name(const srv *s);

#endif
