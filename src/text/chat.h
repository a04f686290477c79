/* chat.h - chat templates.
 *
 * kvant does not run Jinja.  It recognises the families of templates it
 * knows from tokenizer.chat_template (ChatML-style as used by SmolLM2 and
 * Qwen2, Llama-2 [INST], Llama-3 header ids) and renders them natively.
 * An unknown template is a clear error naming it.
 * Ownership: plain data; rendered strings are malloc'd, the caller frees.
 */
#ifndef KVANT_CHAT_H
#define KVANT_CHAT_H

#include <stddef.h>

#include "format/gguf.h"
#include "util/err.h"

typedef enum chat_kind {
    CHAT_NONE = 0,
    CHAT_CHATML,      /* <|im_start|>role\ncontent<|im_end|>\n */
    CHAT_LLAMA2,      /* [INST] ... [/INST] */
    CHAT_LLAMA3,      /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
} chat_kind;

typedef struct chat_msg {
    const char *role;    /* "system", "user", "assistant" (borrowed) */
    const char *content; /* borrowed, NUL-terminated */
} chat_msg;

typedef struct chat_template {
    chat_kind kind;
    /* ChatML-style templates may inject a default system prompt when the
     * first message is not a system message (SmolLM2 does). */
    char default_system[512];
} chat_template;

/* Detects the template from tokenizer.chat_template (or CHAT_CHATML when
 * absent).  Unknown templates: KV_EUNSUP with a message. */
int chat_template_from_gguf(const gguf_ctx *g, chat_template *out, kvant_err *err);
/* Detects from template source text; NULL src means "model has none". */
int chat_template_detect(const char *src, size_t len, chat_template *out, kvant_err *err);
/* Renders messages; add_assistant appends the assistant turn opener.
 * Returns a malloc'd NUL-terminated prompt (special tokens as text, to be
 * encoded with parse_special = 1), or NULL with err filled. */
char *chat_render(const chat_template *tpl, const chat_msg *msgs, size_t n_msgs,
                  int add_assistant, kvant_err *err);
const char *chat_kind_name(chat_kind k);
/* 1 when the rendered prompt already starts with the BOS text (Llama-2's
 * "<s>", Llama-3's "<|begin_of_text|>", as their Jinja templates emit it):
 * encode such prompts with add_bos = 0 and parse_special = 1. */
int chat_prompt_has_bos(const chat_template *tpl);

#endif
