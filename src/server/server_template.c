/* server_template.c - POST /apply-template (see server_template.h). */
#include "server/server_template.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_openai.h"
#include "text/chat.h"

#define SRV_TEMPLATE_MAX_MESSAGES 4096

static int check_fields(json_t *o, srv_error *e)
{
    static const char *const known[] = {"messages", "tools", "add_generation_prompt", "model", NULL};
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v)
    {
        int ok = 0;
        for (int i = 0; known[i] && !ok; i++)
            ok = !strcmp(k, known[i]);
        if (!ok)
            return srv_error_set(e, 400, k, "unknown field '%.64s' (/apply-template takes messages, tools, "
                                 "add_generation_prompt, model)", k);
    }
    return 0;
}

static int check_messages(json_t *ms, srv_error *e)
{
    if (!json_is_array(ms) || json_array_size(ms) == 0)
        return srv_error_set(e, 400, "messages", "'messages' must be a non-empty array");
    if (json_array_size(ms) > SRV_TEMPLATE_MAX_MESSAGES)
        return srv_error_set(e, 400, "messages", "too many messages (%zu, at most %d)", json_array_size(ms),
                             SRV_TEMPLATE_MAX_MESSAGES);
    for (size_t i = 0; i < json_array_size(ms); i++) {
        json_t *m = json_array_get(ms, i);
        if (!json_is_object(m) || !json_is_string(json_object_get(m, "role")))
            return srv_error_set(e, 400, "messages", "messages[%zu] must be an object with a string 'role'", i);
    }
    return 0;
}

int srv_template_apply(const model *m, const char *body, size_t len, json_t **out, srv_error *e)
{
    json_t *o = srv_oai_load_object(body, len, e);
    if (!o)
        return -e->status;
    json_t *ms = json_object_get(o, "messages"), *tools = json_object_get(o, "tools");
    json_t *agp = json_object_get(o, "add_generation_prompt"), *name = json_object_get(o, "model");
    int rc = check_fields(o, e);
    if (!rc)
        rc = check_messages(ms, e);
    if (!rc && tools && !json_is_null(tools) && !json_is_array(tools))
        rc = srv_error_set(e, 400, "tools", "'tools' must be an array");
    if (!rc && agp && !json_is_null(agp) && !json_is_boolean(agp))
        rc = srv_error_set(e, 400, "add_generation_prompt", "'add_generation_prompt' must be a boolean");
    if (!rc && name && !json_is_null(name) && !json_is_string(name))
        rc = srv_error_set(e, 400, "model", "'model' must be a string");
    if (!rc && !m->has_chat)
        rc = srv_error_set(e, 400, "messages", "the model has no usable chat template: %s", m->chat_err);
    char *prompt = NULL;
    if (!rc) {
        kvant_err ke = {0};
        int add = !agp || json_is_null(agp) || json_is_true(agp);
        prompt = chat_render_json(&m->chat, ms, json_is_array(tools) ? tools : NULL, add, &ke);
        if (!prompt)
            rc = srv_error_set(e, ke.code == KV_ENOMEM ? 500 : 400, "messages", "%s", ke.msg);
    }
    if (!rc) {
        json_t *p = json_string(prompt);
        *out = p ? json_pack("{s:o}", "prompt", p) : NULL;
        if (!*out)
            rc = srv_error_set(e, 500, NULL, "the rendered prompt is not valid UTF-8 (or out of memory)");
    }
    free(prompt);
    json_decref(o);
    return rc;
}
