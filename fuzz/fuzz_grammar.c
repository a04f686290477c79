/* fuzz_grammar.c - libFuzzer target for the grammar front ends (GBNF,
 * JSON Schema, regex and choice lists arrive in request bodies: untrusted).
 * The first byte picks the kind, the rest is the source; a grammar that
 * compiles is then run by the Earley recognizer over the source's own bytes
 * (pushes, pops, truncation), under tight limits.  Checks: compile and
 * parse return a result or an error, never crash, hang or leak. */
#include <stdint.h>
#include <stdlib.h>

#include "grammar/earley.h"
#include "grammar/gcache.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    gram_limits lim = gram_limits_default();
    lim.max_rules = 20000;
    lim.max_elems = 50000;
    lim.max_closure = 200000;
    lim.max_state_items = 200000;
    lim.max_repeat = 200;
    kvant_err err = {0};
    int kind = data[0] % GRAM_KIND_COUNT;
    gram *g = gcache_compile(kind, (const char *)data + 1, size - 1, lim, &err);
    if (!g) {
        if (err.code >= 0 || !err.msg[0])
            abort();   /* a refusal must carry a code and a message */
        return 0;
    }
    earley *e = earley_create(g, &err);
    for (size_t i = 1; e && i < size && i < 512; i++) {
        int r = earley_push_byte(e, data[i]);
        if (r < 0)
            break;
        if (r == 0)   /* refused: try the byte's neighbour, then go back a little */
            earley_push_byte(e, (uint8_t)(data[i] + 1));
        if ((data[i] & 15) == 0)
            earley_truncate(e, earley_depth(e) / 2 + 1);
        uint32_t allowed[8];
        earley_allowed_bytes(e, allowed);
        (void)earley_accepting(e);
    }
    earley_destroy(e);
    gram_destroy(g);
    return 0;
}
