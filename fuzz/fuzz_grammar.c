/* fuzz_grammar.c - libFuzzer target for the grammar front ends (GBNF,
 * JSON Schema, regex and choice lists arrive in request bodies: untrusted).
 * The first byte picks the kind, the rest is the source; a grammar that
 * compiles is then run by the Earley recognizer over the source's own bytes
 * (pushes, pops, truncation), under tight limits, and its token masks over
 * a small vocabulary (every byte, and pairs of the source's bytes) are
 * computed memoized (with a shared cache) and plainly.  Checks: compile and
 * parse return a result or an error, never crash, hang or leak; the two
 * masks are equal. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/earley.h"
#include "grammar/gcache.h"
#include "grammar/tokmask.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Masks of e's state over 256 one-byte tokens and up to 64 two-byte ones
 * taken from data: memoized (shared cache) and plain must agree. */
static void check_masks(const gram *g, earley *e, const uint8_t *data, size_t size)
{
    uint8_t toks[320][2];
    const uint8_t *tp[320];
    int32_t len[320], n = 0, eos = 0;
    len[n] = 0, tp[n] = toks[n], n++;   /* id 0: end of sequence */
    for (int b = 0; b < 256; b++)
        toks[n][0] = (uint8_t)b, len[n] = 1, tp[n] = toks[n], n++;
    for (size_t i = 1; i + 1 < size && n < 320; i += 2)
        toks[n][0] = data[i], toks[n][1] = data[i + 1], len[n] = 2, tp[n] = toks[n], n++;
    kvant_err err = {0};
    tmask_vocab *v = tmask_vocab_create(tp, len, n, &eos, 1, &err);
    tmask_work *w = v ? tmask_work_create(v, &err) : NULL;
    tmshare *sh = v ? tmshare_create(g, tmask_n_words(v), 4, &err) : NULL;
    uint32_t m1[10], m2[10];
    if (w && sh && tmask_work_share(w, sh) == KV_OK)
        for (int k = 0; k < 2; k++) {   /* twice: the second from the caches */
            int32_t c1 = tmask_compute(v, e, w, m1, &err), c2 = tmask_compute(v, e, NULL, m2, &err);
            if (c1 >= 0 && c2 >= 0 && (c1 != c2 || memcmp(m1, m2, (size_t)tmask_n_words(v) * 4)))
                abort();
            tmask_work_reset(w);
        }
    tmask_work_destroy(w);
    tmshare_destroy(sh);
    tmask_vocab_destroy(v);
}

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
    if (e)
        check_masks(g, e, data, size);
    earley_destroy(e);
    gram_destroy(g);
    return 0;
}
