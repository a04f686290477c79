/* jinja.h - chat templates rendered by a Jinja interpreter.
 *
 * Renders a Hugging Face tokenizer.chat_template as transformers'
 * apply_chat_template renders it with jinja2 3.1:
 * ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
 * extensions=[loopcontrols]) plus {% generation %} (renders its body),
 * raise_exception(msg), strftime_now(fmt) and tojson as
 * json.dumps(ensure_ascii=False).  jinja_lex, jinja_parse, jinja_expr,
 * jinja_filt, jinja_meth, jinja_json and jinja_value are its pieces.
 *
 * Untrusted templates: a construct kvant does not implement is refused by
 * jinja_compile with a message naming it and its line; a render is bounded
 * in output bytes, loop iterations, macro nesting and memory.
 * Ownership: jinja_compile's template is the caller's (jinja_free);
 * jinja_render returns a malloc'd string the caller frees.  A compiled
 * template is read-only: any number of threads may render it at once.
 */
#ifndef KVANT_JINJA_H
#define KVANT_JINJA_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

typedef struct jinja_tpl jinja_tpl;

typedef struct jinja_limits {
    size_t max_output;   /* bytes of rendered text */
    size_t max_iters;    /* loop iterations, all loops together */
    size_t arena_budget; /* bytes of memory one render may use */
    int max_depth;       /* macro calls nested */
} jinja_limits;

jinja_limits jinja_limits_default(void);

int jinja_compile(const char *src, size_t len, jinja_tpl **out, kvant_err *err);
void jinja_free(jinja_tpl *t);

/* Renders with the members of the JSON object vars as the template's
 * variables (messages, tools, add_generation_prompt, bos_token, ...);
 * now is what strftime_now formats (Unix seconds, local time zone).
 * Returns the text, or NULL with err set: a template error (the message
 * of raise_exception, an undefined value used, a type error) names the
 * line. */
char *jinja_render(const jinja_tpl *t, const json_t *vars, int64_t now, const jinja_limits *lim, kvant_err *err);

#endif
