/* chat.c - chat templates through the Jinja interpreter (see chat.h). */
#include "text/chat.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static char *dup_or_empty(const char *s)
{
    return strdup(s ? s : "");
}

void chat_template_free(chat_template *t)
{
    if (!t)
        return;
    jinja_free(t->jt);
    free(t->bos);
    free(t->eos);
    memset(t, 0, sizeof *t);
}

int chat_template_compile(const char *src, size_t len, const char *bos, const char *eos, chat_template *out,
                          kvant_err *err)
{
    if (!out)
        return kvant_err_set(err, KV_EINVAL, "chat_template_compile: no output");
    memset(out, 0, sizeof *out);
    out->builtin = src == NULL;
    if (!src) {
        src = CHAT_DEFAULT_TEMPLATE;
        len = strlen(src);
    }
    out->bos = dup_or_empty(bos);
    out->eos = dup_or_empty(eos);
    if (!out->bos || !out->eos) {
        chat_template_free(out);
        return kvant_err_set(err, KV_ENOMEM, "chat template: out of memory");
    }
    int rc = jinja_compile(src, len, &out->jt, err);
    if (rc)
        chat_template_free(out);
    return rc;
}

/* The text of special token key (tokenizer.ggml.bos_token_id ...), or NULL. */
static char *token_text(const gguf_ctx *g, const char *key)
{
    uint32_t id;
    kvant_err e = {0};
    int64_t ti = gguf_find_key(g, "tokenizer.ggml.tokens");
    if (ti < 0 || gguf_find_key(g, key) < 0 || gguf_get_u32(g, key, &id, &e) || gguf_arr_type(g, ti) != GGUF_TYPE_STRING ||
        id >= gguf_arr_n(g, ti))
        return NULL;
    gguf_str s = gguf_arr_str(g, ti, id);
    char *r = malloc((size_t)s.len + 1);
    if (r) {
        memcpy(r, s.ptr, (size_t)s.len);
        r[s.len] = '\0';
    }
    return r;
}

int chat_template_from_gguf(const gguf_ctx *g, const char *override_src, size_t override_len, chat_template *out,
                            kvant_err *err)
{
    const char *src = override_src;
    size_t len = override_len;
    if (!src && g && gguf_find_key(g, "tokenizer.chat_template") >= 0) {
        gguf_str s;
        int rc = gguf_get_str(g, "tokenizer.chat_template", &s, err);
        if (rc)
            return rc;
        src = s.ptr ? s.ptr : "";
        len = (size_t)s.len;
    }
    char *bos = g ? token_text(g, "tokenizer.ggml.bos_token_id") : NULL;
    char *eos = g ? token_text(g, "tokenizer.ggml.eos_token_id") : NULL;
    int rc = chat_template_compile(src, len, bos, eos, out, err);
    free(bos);
    free(eos);
    return rc;
}

static int64_t template_time(void)
{
    const char *s = getenv("KVANT_TEMPLATE_TIME");
    if (s && *s) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (*end == '\0')
            return (int64_t)v;
    }
    return (int64_t)time(NULL);
}

char *chat_render_json(const chat_template *tpl, const json_t *messages, const json_t *tools,
                       int add_generation_prompt, kvant_err *err)
{
    if (!tpl || !tpl->jt || !json_is_array(messages)) {
        kvant_err_set(err, KV_EINVAL, "chat_render: no template, or messages is not an array");
        return NULL;
    }
    json_t *vars = json_object();
    int bad = !vars || json_object_set(vars, "messages", (json_t *)messages) ||
              json_object_set_new(vars, "tools", tools ? json_incref((json_t *)tools) : json_null()) ||
              json_object_set_new(vars, "documents", json_null()) ||
              json_object_set_new(vars, "add_generation_prompt", json_boolean(add_generation_prompt)) ||
              json_object_set_new(vars, "bos_token", json_string(tpl->bos)) ||
              json_object_set_new(vars, "eos_token", json_string(tpl->eos));
    char *r = NULL;
    if (bad)
        kvant_err_set(err, KV_ENOMEM, "chat template: out of memory (or a token text is not UTF-8)");
    else
        r = jinja_render(tpl->jt, vars, template_time(), NULL, err);
    json_decref(vars);
    return r;
}

char *chat_render(const chat_template *tpl, const chat_msg *msgs, size_t n_msgs, int add_assistant, kvant_err *err)
{
    if (!tpl || (n_msgs && !msgs)) {
        kvant_err_set(err, KV_EINVAL, "chat_render: invalid arguments");
        return NULL;
    }
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n_msgs; i++) {
        if (!msgs[i].role) {
            kvant_err_set(err, KV_EINVAL, "chat: message %zu has no role", i);
            json_decref(arr);
            return NULL;
        }
        json_t *m = json_pack("{s:s, s:s}", "role", msgs[i].role, "content", msgs[i].content ? msgs[i].content : "");
        if (!m || json_array_append_new(arr, m)) {
            kvant_err_set(err, KV_EINVAL, "chat: message %zu is not valid UTF-8 (or out of memory)", i);
            json_decref(arr);
            return NULL;
        }
    }
    if (!arr) {
        kvant_err_set(err, KV_ENOMEM, "chat: out of memory");
        return NULL;
    }
    char *r = chat_render_json(tpl, arr, NULL, add_assistant, err);
    json_decref(arr);
    return r;
}
