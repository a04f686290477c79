/* test_chat.c - chat template detection and rendering.
 *
 * Every template renders through the Jinja interpreter (text/jinja.h).
 * Expected strings were produced by /tmp/ref/chat_ref.py in the session that
 * wrote this test: jinja2 3.1.6 ImmutableSandboxedEnvironment(trim_blocks,
 * lstrip_blocks) rendering (as transformers' apply_chat_template does)
 *   - SmolLM2: the tokenizer.chat_template of the default model's GGUF;
 *   - Llama-2: meta-llama/Llama-2-7b-chat-hf's template (LLAMA2_SRC below),
 *     bos_token "<s>", eos_token "</s>";
 *   - Llama-3: meta-llama/Meta-Llama-3-8B-Instruct's template (LLAMA3_SRC),
 *     bos_token "<|begin_of_text|>";
 * for the messages in FULL (system + user + assistant + user) and without
 * the system message, with add_generation_prompt true and false.
 * Runs with cwd = repository root.
 */
#include "text/chat.h"
#include "testutil.h"

#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#define MODEL_PATH "models/SmolLM2-135M-Instruct.Q4_1.gguf"

static const char LLAMA2_SRC[] =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
    "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif "
    "%}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if "
    "message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] "
    "== 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";

static const char LLAMA3_SRC[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 "
    "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

/* Contents exercise strip(): leading/trailing spaces, a newline, U+00A0. */
static const chat_msg FULL[] = {
    {"system", "You are terse."},
    {"user", "  Hi there!\n"},
    {"assistant", "Hello. \302\240"},
    {"user", "What is 2+2?"},
};

typedef struct render_case {
    int with_system, add_assistant;
    const char *want;
} render_case;

static const render_case SMOL_WANT[] = {
    {1, 1, "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n  Hi there!\n<|im_end|>\n<|im_start|>assistant\nHello. \302\240<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"},
    {1, 0, "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n  Hi there!\n<|im_end|>\n<|im_start|>assistant\nHello. \302\240<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"},
    {0, 1, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\n  Hi there!\n<|im_end|>\n<|im_start|>assistant\nHello. \302\240<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"},
    {0, 0, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\n  Hi there!\n<|im_end|>\n<|im_start|>assistant\nHello. \302\240<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"},
};

static const render_case LLAMA2_WANT[] = {
    {1, 1, "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\n  Hi there! [/INST] Hello. </s><s>[INST] What is 2+2? [/INST]"},
    {1, 0, "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\n  Hi there! [/INST] Hello. </s><s>[INST] What is 2+2? [/INST]"},
    {0, 1, "<s>[INST] Hi there! [/INST] Hello. </s><s>[INST] What is 2+2? [/INST]"},
    {0, 0, "<s>[INST] Hi there! [/INST] Hello. </s><s>[INST] What is 2+2? [/INST]"},
};

static const render_case LLAMA3_WANT[] = {
    {1, 1, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {1, 0, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"},
    {0, 1, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {0, 0, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"},
};

static void check_renders(const chat_template *tpl, const render_case *cases, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++) {
        const render_case *c = &cases[i];
        kvant_err err = {0};
        const chat_msg *msgs = c->with_system ? FULL : FULL + 1;
        size_t nm = c->with_system ? 4 : 3;
        char *got = chat_render(tpl, msgs, nm, c->add_assistant, &err);
        CHECKF(got && strcmp(got, c->want) == 0, "%s case %zu (system %d, add_assistant %d):\n got: %s\nwant: %s\n%s",
               name, i, c->with_system, c->add_assistant, got ? got : "(null)", c->want, err.msg);
        free(got);
    }
}

static void test_smollm_gguf(void)
{
    kvant_err err = {0};
    gguf_ctx *g = gguf_open(MODEL_PATH, &err);
    CHECKF(g != NULL, "open %s: %s", MODEL_PATH, err.msg);
    if (!g)
        return;
    chat_template tpl;
    CHECKF(chat_template_from_gguf(g, NULL, 0, &tpl, &err) == KV_OK, "%s", err.msg);
    CHECK(!tpl.builtin && tpl.jt != NULL);
    CHECKF(strcmp(tpl.bos, "<|im_start|>") == 0 && strcmp(tpl.eos, "<|im_end|>") == 0, "bos '%s' eos '%s'",
           tpl.bos, tpl.eos);
    check_renders(&tpl, SMOL_WANT, sizeof SMOL_WANT / sizeof SMOL_WANT[0], "smollm");
    /* no messages: only the generation prompt (the template's loop is empty) */
    char *s = chat_render(&tpl, NULL, 0, 1, &err);
    CHECK(s && strcmp(s, "<|im_start|>assistant\n") == 0);
    free(s);
    s = chat_render(&tpl, NULL, 0, 0, &err);
    CHECK(s && strcmp(s, "") == 0);
    free(s);
    chat_template_free(&tpl);
    /* --chat-template: the override replaces the GGUF's template, same BOS/EOS */
    const char *ovr = "{{ bos_token }}|{{ messages[0].content }}|{{ eos_token }}";
    CHECK(chat_template_from_gguf(g, ovr, strlen(ovr), &tpl, &err) == KV_OK);
    s = chat_render(&tpl, FULL, 1, 0, &err);
    CHECKF(s && strcmp(s, "<|im_start|>|You are terse.|<|im_end|>") == 0, "got %s", s ? s : err.msg);
    free(s);
    chat_template_free(&tpl);
    gguf_close(g);
}

static void test_families(void)
{
    kvant_err err = {0};
    chat_template tpl;
    CHECK(chat_template_compile(LLAMA2_SRC, strlen(LLAMA2_SRC), "<s>", "</s>", &tpl, &err) == KV_OK);
    check_renders(&tpl, LLAMA2_WANT, sizeof LLAMA2_WANT / sizeof LLAMA2_WANT[0], "llama2");
    /* roles must alternate (the template's raise_exception, with its message) */
    static const chat_msg bad[] = {{"user", "a"}, {"user", "b"}};
    kvant_err_clear(&err);
    char *s = chat_render(&tpl, bad, 2, 1, &err);
    CHECKF(s == NULL && err.code == KV_EINVAL &&
           strstr(err.msg, "Conversation roles must alternate user/assistant/user/assistant/..."), "%s", err.msg);
    free(s);
    chat_template_free(&tpl);

    CHECK(chat_template_compile(LLAMA3_SRC, strlen(LLAMA3_SRC), "<|begin_of_text|>", "<|end_of_text|>", &tpl,
                                &err) == KV_OK);
    check_renders(&tpl, LLAMA3_WANT, sizeof LLAMA3_WANT / sizeof LLAMA3_WANT[0], "llama3");
    s = chat_render(&tpl, NULL, 0, 1, &err);
    CHECK(s && strcmp(s, "<|start_header_id|>assistant<|end_header_id|>\n\n") == 0);
    free(s);
    chat_template_free(&tpl);
}

static void test_compile_errors(void)
{
    kvant_err err = {0};
    chat_template tpl;
    /* absent template: the built-in ChatML one */
    CHECK(chat_template_compile(NULL, 0, NULL, NULL, &tpl, &err) == KV_OK && tpl.builtin);
    static const chat_msg one[] = {{"user", "hi"}};
    char *s = chat_render(&tpl, one, 1, 1, &err);
    CHECK(s && strcmp(s, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n") == 0);
    free(s);
    /* a message without a role */
    static const chat_msg norole[] = {{NULL, "x"}};
    CHECK(chat_render(&tpl, norole, 1, 1, &err) == NULL && err.code == KV_EINVAL);
    chat_template_free(&tpl);
    /* an unsupported construct is refused, naming it and its line */
    const char *call = "hello\n{% call foo() %}x{% endcall %}";
    kvant_err_clear(&err);
    CHECK(chat_template_compile(call, strlen(call), NULL, NULL, &tpl, &err) == KV_EUNSUP);
    CHECKF(strstr(err.msg, "'call'") && strstr(err.msg, "line 2"), "%s", err.msg);
    CHECK(tpl.jt == NULL);
    const char *filt = "{{ x | wordwrap(5) }}";
    CHECK(chat_template_compile(filt, strlen(filt), NULL, NULL, &tpl, &err) == KV_EUNSUP &&
          strstr(err.msg, "wordwrap"));
    const char *pct = "{{ '%s!' % x }}", *spec = "{{ '{:>5}'.format(x) }}";
    CHECK(chat_template_compile(pct, strlen(pct), NULL, NULL, &tpl, &err) == KV_EUNSUP && strstr(err.msg, "printf"));
    CHECK(chat_template_compile(spec, strlen(spec), NULL, NULL, &tpl, &err) == KV_EUNSUP && strstr(err.msg, "{:>5}"));
    /* a syntax error names its line */
    const char *syn = "{% if x %}\n\n{{ 1 + }}{% endif %}";
    CHECK(chat_template_compile(syn, strlen(syn), NULL, NULL, &tpl, &err) == KV_EINVAL && strstr(err.msg, "line 3"));
    const char *open_if = "{% if x %}never closed";
    CHECK(chat_template_compile(open_if, strlen(open_if), NULL, NULL, &tpl, &err) == KV_EINVAL &&
          strstr(err.msg, "never closed"));
}

int main(void)
{
    test_smollm_gguf();
    test_families();
    test_compile_errors();
    return tu_finish("test_chat");
}
