/* server_tools.h - tool calling on /v1/chat/completions: `tools`,
 * `tool_choice`, `parallel_tool_calls`, the assistant `tool_calls` and
 * `tool` messages of a conversation, and the reply's `message.tool_calls`.
 *
 * The tools go to the model's chat template (`tools`), which renders them
 * as the model was trained to see them.  tool_choice:
 *   "none"      the tools are rendered, the reply is text;
 *   "auto"      (default with tools) the reply is parsed for calls of the
 *               given tools in the syntax of each family: Hermes / Qwen
 *               `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
 *               blocks (the text outside them is the content); Mistral
 *               `[TOOL_CALLS][{"name": ..., "arguments": {...}}]` (v3) or
 *               `[TOOL_CALLS]name[ARGS]{...}` (v11+; `[CALL_ID]id` allowed)
 *               (the text before is the content); a reply that is exactly
 *               Llama 3.x JSON calls `{"name": ..., "parameters": {...}}`
 *               (`;`-separated, after an optional `<|python_tag|>`).  The
 *               control tokens of these syntaxes are kept in the text of a
 *               parsed reply (srv_tools_marker).  Found: tool_calls, and
 *               the content is null when only space is left;
 *   "required"  the output is constrained (structured outputs) to a JSON
 *               array of {"name", "arguments"} objects, each a given tool
 *               with arguments valid for its parameters schema (one item
 *               with parallel_tool_calls false);
 *   {"type": "function", "function": {"name": N}}
 *               the output is constrained to N's parameters schema: the
 *               arguments of one call to N.
 * A reply with tool calls has finish_reason "tool_calls" (when the model
 * finished; "length" stays "length").  Threading: pure; any HTTP thread.
 */
#ifndef KVANT_SERVER_TOOLS_H
#define KVANT_SERVER_TOOLS_H

#include <stddef.h>

#include "server/server_constraint.h"
#include "server/server_error.h"

struct json_t;

enum { SRV_TOOLS_OFF = 0, SRV_TOOLS_NONE, SRV_TOOLS_AUTO, SRV_TOOLS_REQUIRED, SRV_TOOLS_NAMED };

typedef struct srv_tools {
    int mode;               /* SRV_TOOLS_* (OFF: no tools in the request) */
    struct json_t *tools;   /* owned reference: the validated tools for the template */
    char named[128];        /* SRV_TOOLS_NAMED: the function */
} srv_tools;

/* Reads tools / tool_choice / parallel_tool_calls of body o.  REQUIRED and
 * NAMED fill *cons (a 400 if another field constrains the output already).
 * 0, or a negative status with e filled. */
int srv_tools_parse(struct json_t *o, size_t max_bytes, srv_tools *t, srv_constraint *cons,
                    srv_error *e);
void srv_tools_free(srv_tools *t);

/* The assistant message for a finished output text[0..n): {"role",
 * "content", "tool_calls"?}; *n_calls: how many calls it holds.  id: the
 * completion's id, for the calls' ids.  NULL when out of memory. */
struct json_t *srv_tools_message(const srv_tools *t, const char *text, size_t n, const char *id,
                                 int choice, int *n_calls);

/* Streaming: how many bytes of the reply so far, text[0..n), are content
 * that no call can start in (sent as they come): up to the first call
 * marker, less a tail that may begin one, nothing while only space came
 * and nothing for a reply that may be Llama 3 JSON (it starts with `{` or
 * `<|python_tag|>`).  *hold becomes 1 once a call may have begun: nothing
 * more of the reply is content before it ends. */
size_t srv_tools_stream_safe(const char *text, size_t n, int *hold);

/* 1 when a control token's piece[0..n) is a marker of a tool-call syntax
 * (kept in a reply parsed for calls). */
int srv_tools_marker(const char *piece, size_t n);

/* messages[i].tool_calls as the template wants them: arguments (a JSON
 * string in the API) parsed into objects.  A new reference, or NULL with e
 * filled. */
struct json_t *srv_tools_msg_calls(struct json_t *calls, size_t i, srv_error *e);

#endif
