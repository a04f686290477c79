/* server_openai.h - OpenAI request parsing (JSON body -> engine request)
 * and OpenAI-shaped error bodies.
 *
 * Every field of the untrusted body is type- and range-checked here, before
 * anything is submitted or streamed; failures fill an srv_error with the
 * HTTP status, the OpenAI error type and the offending parameter.
 * Threading: pure functions over borrowed, immutable inputs (the model's
 * tokenizer is thread-safe): any HTTP thread may call them.
 */
#ifndef KVANT_SERVER_OPENAI_H
#define KVANT_SERVER_OPENAI_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "model/model.h"
#include "server/server_constraint.h"
#include "server/server_error.h"
#include "server/server_fields.h"
#include "server/server_stream.h"
#include "server/server_tools.h"


typedef enum srv_api { SRV_API_COMPLETIONS = 0, SRV_API_CHAT = 1 } srv_api;

typedef struct srv_gen_req {
    srv_api api;
    engine_request er;     /* er.prompt == tokens; er.n_prompt: the longest prompt's
                            * length (srv_gen_req_prompt gives each prompt) */
    int32_t *tokens;       /* owned: every prompt's ids, one after another */
    int64_t *prompt_off;   /* owned: [n_prompts + 1] prompt k is tokens[off[k], off[k+1]) */
    int32_t n_prompts;     /* >= 1 after a successful parse (chat: 1) */
    int stream;
    int include_usage;
    int continuous_usage;    /* stream_options.continuous_usage_stats (vLLM): usage in every chunk */
    int logprobs;          /* 1: return logprobs */
    int echo;              /* completions: the prompt leads each choice's text (and
                            * logprobs: er.prompt_logprobs) */
    int max_tokens_zero;   /* echo with max_tokens 0: er.max_tokens is 1 and the
                            * generated token is dropped */
    int32_t top_logprobs;  /* alternatives per token, 0..ENGINE_MAX_TOP_LOGPROBS */
    srv_stops stops;
    srv_constraint cons;   /* structured outputs (kind -1: none); compiled by the caller */
    srv_tools tools;       /* chat: tools and tool_choice (mode OFF: none) */
} srv_gen_req;

typedef struct srv_oai_ctx {
    const model *m;            /* borrowed */
    const char *served_name;   /* borrowed */
    int64_t max_model_len;
    int32_t max_piece_bytes;   /* longest token piece in bytes (tok_max_piece_bytes);
                                * 0 = no length pre-check */
    int allow_unknown;         /* --allow-unknown-fields (server_fields.h) */
    srv_unknown_log *unknown_log; /* borrowed; logs each accepted unknown name once */
    size_t grammar_max_bytes;  /* --grammar-max-bytes (0: no limit) */
} srv_oai_ctx;

/* Parses and validates a /v1/completions or /v1/chat/completions body;
 * request_id (borrowed, may be NULL) names the request in log lines.
 * KV_OK, or a negative status with e filled (out is then empty). */
int srv_oai_parse(const srv_oai_ctx *ctx, srv_api api, const char *body, size_t len,
                  const char *request_id, srv_gen_req *out, srv_error *e);
void srv_gen_req_free(srv_gen_req *r);
/* A prompt-like value p (param names it in errors: "prompt", "input"): a
 * string, an array of token ids, or a list of up to max_list of either,
 * appended to r's prompts (tokens, prompt_off, n_prompts; free with
 * srv_gen_req_free).  Strings are tokenized with the model's BOS rule and
 * refused before tokenizing when longer in bytes than the context could
 * hold (max_piece_bytes); ids are checked against the vocabulary.  Shared
 * by completions and embeddings.  0, or a negative status with e filled. */
struct json_t;
int srv_oai_parse_prompts(const srv_oai_ctx *ctx, struct json_t *p, const char *param,
                          int max_list, srv_gen_req *r, srv_error *e);
/* The engine request for prompt k of r (k < r->n_prompts): r->er with that
 * prompt; borrows r's tokens. */
engine_request srv_gen_req_prompt(const srv_gen_req *r, int32_t k);

/* Parses a JSON object body (for /tokenize, /detokenize); returns a new
 * reference or NULL with e filled (400). */
struct json_t;
struct json_t *srv_oai_load_object(const char *body, size_t len, srv_error *e);

#endif
