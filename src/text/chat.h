/* chat.h - chat templates: the model's tokenizer.chat_template, compiled
 * and rendered by kvant's Jinja interpreter (text/jinja.h).
 *
 * Every template goes through Jinja (the three native renderers kvant had
 * for ChatML, Llama-2 and Llama-3 are gone: the interpreter renders their
 * templates byte for byte as jinja2 does).  A model without a template
 * gets CHAT_DEFAULT_TEMPLATE (ChatML, what llama.cpp also falls back to).
 *
 * The variables a template sees (as transformers passes them):
 *   messages               the conversation: a list of dicts (role,
 *                          content, and whatever else the caller's JSON
 *                          has: tool_calls, tool_call_id, name, ...)
 *   tools                  the tool list, or None when none is given
 *   documents              None
 *   add_generation_prompt  bool
 *   bos_token, eos_token   the model's BOS / EOS token texts ("" if none)
 * strftime_now() formats the time KVANT_TEMPLATE_TIME (Unix seconds, so a
 * test can pin the date) or, when unset, the current time.
 *
 * Ownership: chat_template owns its compiled template and token texts
 * (chat_template_free); rendered strings are malloc'd, the caller frees.
 * A compiled template may be rendered from several threads at once.
 */
#ifndef KVANT_CHAT_H
#define KVANT_CHAT_H

#include <jansson.h>
#include <stddef.h>

#include "format/gguf.h"
#include "text/jinja.h"
#include "util/err.h"

#define CHAT_DEFAULT_TEMPLATE                                                                        \
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] " \
    "+ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"

typedef struct chat_msg {
    const char *role;    /* "system", "user", "assistant" (borrowed) */
    const char *content; /* borrowed, NUL-terminated */
} chat_msg;

typedef struct chat_template {
    jinja_tpl *jt; /* owned; NULL until compiled */
    char *bos;     /* owned BOS token text ("" none) */
    char *eos;     /* owned EOS token text ("" none) */
    int builtin;   /* 1: the model had no template, CHAT_DEFAULT_TEMPLATE is used */
} chat_template;

/* Compiles src (NULL: CHAT_DEFAULT_TEMPLATE) with the given token texts
 * (NULL: "").  A construct kvant does not implement: KV_EUNSUP naming it
 * and its line; a syntax error: KV_EINVAL.  *out is zeroed on failure. */
int chat_template_compile(const char *src, size_t len, const char *bos, const char *eos, chat_template *out,
                          kvant_err *err);
/* The GGUF's tokenizer.chat_template, or override_src when non-NULL
 * (--chat-template), with BOS/EOS texts from the GGUF's vocabulary. */
int chat_template_from_gguf(const gguf_ctx *g, const char *override_src, size_t override_len, chat_template *out,
                            kvant_err *err);
void chat_template_free(chat_template *t);

/* Renders messages (each {role, content}); add_assistant is the
 * generation prompt.  Returns a malloc'd prompt (special tokens as text,
 * to be encoded with parse_special = 1), or NULL with err filled (a
 * raise_exception in the template gives its message). */
char *chat_render(const chat_template *tpl, const chat_msg *msgs, size_t n_msgs, int add_assistant, kvant_err *err);
/* The same from JSON: messages an array of objects (borrowed), tools an
 * array or NULL. */
char *chat_render_json(const chat_template *tpl, const json_t *messages, const json_t *tools,
                       int add_generation_prompt, kvant_err *err);

#endif
