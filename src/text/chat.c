/* chat.c - chat template detection and native rendering.
 *
 * Each family renders exactly what its reference Jinja template renders
 * (the templates are quoted at the renderers); the tests compare with
 * jinja2's output for the real templates.  Python's str.strip() / Jinja's
 * trim is reproduced for the Unicode White_Space characters Python strips.
 *
 * ChatML default system prompt: templates like SmolLM2's and Qwen2's
 * contain a literal '<|im_start|>system\n...<|im_end|>' injected when the
 * first message is not a system message; the text between the markers is
 * extracted (Jinja string escapes undone) if it looks like plain text (no
 * quotes, braces or '+' that would mean it is an expression).
 */
#include "text/chat.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

const char *chat_kind_name(chat_kind k)
{
    switch (k) {
    case CHAT_CHATML: return "chatml";
    case CHAT_LLAMA2: return "llama2";
    case CHAT_LLAMA3: return "llama3";
    default: return "none";
    }
}

int chat_prompt_has_bos(const chat_template *tpl)
{
    return tpl && (tpl->kind == CHAT_LLAMA2 || tpl->kind == CHAT_LLAMA3);
}

static const char *find(const char *s, size_t n, const char *needle)
{
    return memmem(s, n, needle, strlen(needle));
}

/* Extracts the injected default system prompt of a ChatML template, if
 * any.  Returns KV_OK (possibly with an empty result) or KV_ERANGE. */
static int extract_default_system(const char *src, size_t len, chat_template *out, kvant_err *err)
{
    static const char marker[] = "<|im_start|>system";
    const char *p = src, *end = src + len;
    while ((p = find(p, (size_t)(end - p), marker)) != NULL) {
        p += sizeof marker - 1;
        size_t nl = (end - p >= 1 && *p == '\n') ? 1 : (end - p >= 2 && p[0] == '\\' && p[1] == 'n') ? 2 : 0;
        if (!nl)
            continue;
        const char *s = p + nl, *e = find(s, (size_t)(end - s), "<|im_end|>");
        if (!e)
            return KV_OK;
        char buf[sizeof out->default_system];
        size_t n = 0;
        int plain = 1;
        for (const char *q = s; q < e && plain; q++) {
            char c = *q;
            if (c == '\\' && q + 1 < e) {
                char x = *++q;
                c = x == 'n' ? '\n' : x == 't' ? '\t' : x;
            } else if (c == '\'' || c == '"' || c == '{' || c == '}' || c == '+') {
                plain = 0;
                break;
            }
            if (n + 1 >= sizeof buf)
                return kvant_err_set(err, KV_ERANGE, "chat template: default system prompt longer than %zu bytes",
                                     sizeof buf - 1);
            buf[n++] = c;
        }
        if (!plain)
            continue;
        buf[n] = '\0';
        memcpy(out->default_system, buf, n + 1);
        return KV_OK;
    }
    return KV_OK;
}

int chat_template_detect(const char *src, size_t len, chat_template *out, kvant_err *err)
{
    if (!out)
        return kvant_err_set(err, KV_EINVAL, "chat_template_detect: no output");
    memset(out, 0, sizeof *out);
    if (!src) {
        out->kind = CHAT_CHATML;
        return KV_OK;
    }
    if (find(src, len, "<|im_start|>")) {
        out->kind = CHAT_CHATML;
        return extract_default_system(src, len, out, err);
    }
    if (find(src, len, "<|start_header_id|>")) {
        out->kind = CHAT_LLAMA3;
        return KV_OK;
    }
    if (find(src, len, "[INST]")) {
        out->kind = CHAT_LLAMA2;
        return KV_OK;
    }
    return kvant_err_set(err, KV_EUNSUP,
                         "chat template not supported (known: ChatML <|im_start|>, Llama-2 [INST], "
                         "Llama-3 <|start_header_id|>); template begins \"%.80s\"",
                         src);
}

int chat_template_from_gguf(const gguf_ctx *g, chat_template *out, kvant_err *err)
{
    if (!g || gguf_find_key(g, "tokenizer.chat_template") < 0)
        return chat_template_detect(NULL, 0, out, err);
    gguf_str s;
    int rc = gguf_get_str(g, "tokenizer.chat_template", &s, err);
    if (rc)
        return rc;
    return chat_template_detect(s.ptr ? s.ptr : "", (size_t)s.len, out, err);
}

/* ---- rendering ---- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1)
            nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void sb_cat(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

/* Python's str.isspace() code points (what str.strip() removes). */
static int py_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

/* Decodes the (valid) UTF-8 character at s; invalid bytes decode to
 * 0xFFFFFFFF (never a space) with length 1. */
static uint32_t utf8_at(const unsigned char *s, size_t n, size_t *len)
{
    unsigned c = s[0];
    size_t k = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (k == 0 || k > n) {
        *len = 1;
        return 0xFFFFFFFFu;
    }
    uint32_t cp = k == 1 ? c : c & (0x7Fu >> k);
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *len = 1;
            return 0xFFFFFFFFu;
        }
        cp = cp << 6 | (s[i] & 0x3Fu);
    }
    *len = k;
    return cp;
}

/* Appends s with leading and trailing whitespace removed (Python strip). */
static void sb_strip(sbuf *b, const char *str)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t n = strlen(str), lo = 0, hi = n, k;
    while (lo < n && py_space(utf8_at(s + lo, n - lo, &k)))
        lo += k;
    while (hi > lo) {
        size_t st = hi - 1;
        while (st > lo && (s[st] & 0xC0) == 0x80 && hi - st < 4)
            st--;
        uint32_t cp = utf8_at(s + st, hi - st, &k);
        if (st + k != hi || !py_space(cp))
            break;
        hi = st;
    }
    sb_add(b, str + lo, hi - lo);
}

static const char *content_of(const chat_msg *m) { return m->content ? m->content : ""; }

/* SmolLM2 / ChatML:
 * {% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}
 * {{ '<|im_start|>system\n<default><|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role']
 * + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}
 * {% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %} */
static void render_chatml(const chat_template *tpl, const chat_msg *msgs, size_t n, int add_assistant, sbuf *b)
{
    for (size_t i = 0; i < n; i++) {
        if (i == 0 && strcmp(msgs[0].role, "system") != 0 && tpl->default_system[0]) {
            sb_cat(b, "<|im_start|>system\n");
            sb_cat(b, tpl->default_system);
            sb_cat(b, "<|im_end|>\n");
        }
        sb_cat(b, "<|im_start|>");
        sb_cat(b, msgs[i].role);
        sb_cat(b, "\n");
        sb_cat(b, content_of(&msgs[i]));
        sb_cat(b, "<|im_end|>\n");
    }
    if (add_assistant)
        sb_cat(b, "<|im_start|>assistant\n");
}

/* Llama-2-chat (meta-llama/Llama-2-7b-chat-hf): the system message is folded
 * into the first user turn as <<SYS>>\n...\n<</SYS>>\n\n; user turns render
 * as bos + '[INST] ' + content.strip() + ' [/INST]', assistant turns as
 * ' ' + content.strip() + ' ' + eos; roles must alternate user/assistant
 * (the template raises otherwise).  It has no generation prompt. */
static int render_llama2(const chat_msg *msgs, size_t n, sbuf *b, kvant_err *err)
{
    const char *sys = NULL;
    size_t first = 0;
    if (n > 0 && strcmp(msgs[0].role, "system") == 0) {
        sys = content_of(&msgs[0]);
        first = 1;
    }
    for (size_t i = first; i < n; i++) {
        size_t idx = i - first;
        int is_user = strcmp(msgs[i].role, "user") == 0;
        if (is_user != (idx % 2 == 0))
            return kvant_err_set(err, KV_EINVAL,
                                 "chat: Llama-2 template needs alternating user/assistant roles (message %zu is '%s')",
                                 i, msgs[i].role);
        sbuf content = {0};
        if (idx == 0 && sys) {
            sb_cat(&content, "<<SYS>>\n");
            sb_cat(&content, sys);
            sb_cat(&content, "\n<</SYS>>\n\n");
        }
        sb_cat(&content, content_of(&msgs[i]));
        if (content.oom)
            b->oom = 1;
        if (is_user) {
            sb_cat(b, "<s>[INST] ");
            sb_strip(b, content.p ? content.p : "");
            sb_cat(b, " [/INST]");
        } else if (strcmp(msgs[i].role, "assistant") == 0) {
            sb_cat(b, " ");
            sb_strip(b, content.p ? content.p : "");
            sb_cat(b, " </s>");
        }
        free(content.p);
    }
    return KV_OK;
}

/* Llama-3-Instruct (meta-llama/Meta-Llama-3-8B-Instruct):
 * {% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] +
 * '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}
 * {% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}
 * {{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %} */
static void render_llama3(const chat_msg *msgs, size_t n, int add_assistant, sbuf *b)
{
    for (size_t i = 0; i < n; i++) {
        if (i == 0)
            sb_cat(b, "<|begin_of_text|>");
        sb_cat(b, "<|start_header_id|>");
        sb_cat(b, msgs[i].role);
        sb_cat(b, "<|end_header_id|>\n\n");
        sb_strip(b, content_of(&msgs[i]));
        sb_cat(b, "<|eot_id|>");
    }
    if (add_assistant)
        sb_cat(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

char *chat_render(const chat_template *tpl, const chat_msg *msgs, size_t n_msgs, int add_assistant, kvant_err *err)
{
    if (!tpl || (n_msgs && !msgs)) {
        kvant_err_set(err, KV_EINVAL, "chat_render: invalid arguments");
        return NULL;
    }
    for (size_t i = 0; i < n_msgs; i++) {
        if (!msgs[i].role) {
            kvant_err_set(err, KV_EINVAL, "chat: message %zu has no role", i);
            return NULL;
        }
    }
    sbuf b = {0};
    sb_add(&b, "", 0);
    int rc = KV_OK;
    switch (tpl->kind) {
    case CHAT_CHATML: render_chatml(tpl, msgs, n_msgs, add_assistant, &b); break;
    case CHAT_LLAMA2: rc = render_llama2(msgs, n_msgs, &b, err); break;
    case CHAT_LLAMA3: render_llama3(msgs, n_msgs, add_assistant, &b); break;
    default: rc = kvant_err_set(err, KV_EINVAL, "chat_render: template kind %d", (int)tpl->kind); break;
    }
    if (rc == KV_OK && b.oom)
        rc = kvant_err_set(err, KV_ENOMEM, "chat: out of memory");
    if (rc) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
