/* fuzz_jinja.c - libFuzzer target for the Jinja interpreter (chat
 * templates are untrusted input).  The input is a template's source; it
 * is compiled and, when that succeeds, rendered over a small conversation
 * with tools, under tight limits (iterations, output, memory, nesting).
 * Checks: compile and render return a result or an error, never crash,
 * hang or leak (ASan/UBSan and libFuzzer's leak checker watch). */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>

#include "text/jinja.h"

static const char VARS[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi \\u00e9\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\","
    " \"function\": {\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5, null, true]}}}]},"
    " {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"42\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static json_t *vars;
    if (!vars && !(vars = json_loads(VARS, 0, NULL)))
        abort();
    jinja_tpl *t = NULL;
    kvant_err err = {0};
    if (jinja_compile((const char *)data, size, &t, &err) != KV_OK) {
        if (t || !err.msg[0])
            abort(); /* a failure must say why and leave nothing behind */
        return 0;
    }
    jinja_limits lim = jinja_limits_default();
    lim.max_iters = 20000;
    lim.max_output = 1 << 20;
    lim.arena_budget = 64u << 20;
    lim.max_depth = 32;
    char *out = jinja_render(t, vars, 1764547200, &lim, &err);
    if (!out && !err.msg[0])
        abort();
    free(out);
    jinja_free(t);
    return 0;
}
