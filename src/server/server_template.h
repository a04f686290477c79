/* server_template.h - POST /apply-template (llama.cpp's route): the prompt
 * the model's chat template renders for a conversation, without
 * generating.  Body {"messages": [...], "tools"?: [...],
 * "add_generation_prompt"?: bool (default true), "model"?: name}; answer
 * {"prompt": "..."}.  Messages go to the template as they are (tool_calls,
 * tool results and content parts included); unknown fields, a bad type or
 * a template error are a 400 naming the field.
 * Threading: pure; the model is borrowed for the call.
 */
#ifndef KVANT_SERVER_TEMPLATE_H
#define KVANT_SERVER_TEMPLATE_H

#include <stddef.h>

#include "model/model.h"
#include "server/server_error.h"

struct json_t;

/* 0 with *out the answer object (caller decrefs), or -status with e filled. */
int srv_template_apply(const model *m, const char *body, size_t len, struct json_t **out, srv_error *e);

#endif
