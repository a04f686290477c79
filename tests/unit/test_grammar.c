/* test_grammar.c - the grammar engine (src/grammar/): the recognizer on
 * hand-checked strings (GBNF, regex, JSON Schema front ends; empty rules,
 * left and right recursion, UTF-8 classes, repetition), integer ranges
 * against arithmetic, bad input refused with a message, the state limit,
 * token masks (memoized walk and plain walk) against a brute-force check of
 * every token on a synthetic vocabulary along random walks, and the
 * compiled-grammar cache.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/earley.h"
#include "grammar/gbnf.h"
#include "grammar/gcache.h"
#include "grammar/jschema.h"
#include "grammar/regex.h"
#include "grammar/tokmask.h"
#include "testutil.h"

/* 1 accepted as a whole, 0 a viable prefix only, -1 refused. */
static int run(const gram *g, const char *s, size_t n)
{
    kvant_err err = {0};
    earley *e = earley_create(g, &err);
    if (!e)
        return -2;
    int r = earley_push_bytes(e, (const uint8_t *)s, n);
    int res = r != 1 ? -1 : earley_accepting(e) ? 1 : 0;
    earley_destroy(e);
    return res;
}

typedef struct scase {
    const char *s;
    int want;   /* 1 accept, 0 prefix, -1 refuse */
} scase;

static void check_cases(const char *what, const gram *g, const scase *c, int n)
{
    CHECKF(g != NULL, "%s: did not compile", what);
    for (int i = 0; g && i < n; i++) {
        int got = run(g, c[i].s, strlen(c[i].s));
        CHECKF(got == c[i].want, "%s: '%s': got %d want %d", what, c[i].s, got, c[i].want);
    }
}

static gram *gb(const char *src)
{
    kvant_err err = {0};
    gram *g = gbnf_compile(src, strlen(src), gram_limits_default(), &err);
    if (!g)
        fprintf(stderr, "gbnf: %s\n", err.msg);
    return g;
}

static void test_gbnf_recognizer(void)
{
    static const struct {
        const char *src;
        scase c[6];
    } T[] = {
        {"root ::= \"a\" [b-d]* \"e\"", {{"abce", 1}, {"ae", 1}, {"a", 0}, {"abx", -1}, {"abcee", -1}, {"", 0}}},
        {"root ::= root \"+\" root | [0-9]", {{"1+2+3", 1}, {"1+", 0}, {"1++", -1}, {"7", 1}, {"+", -1}, {"12", -1}}},
        {"root ::= a a \"x\"\na ::= \"\" | \"y\"", {{"x", 1}, {"yx", 1}, {"yyx", 1}, {"yyyx", -1}, {"yy", 0}, {"z", -1}}},
        {"root ::= \"a\" root | \"b\"  # right recursion", {{"aaab", 1}, {"b", 1}, {"aaa", 0}, {"ba", -1}, {"c", -1}, {"ab", 1}}},
        {"root ::= [^a] \"\\u00e9\"", {{"\xc3\xa9\xc3\xa9", 1}, {"z\xc3\xa9", 1}, {"a", -1}, {"\xc0\x80", -1}, {"\xc3", 0}, {"\xed\xa0\x80", -1}}},
        {"root ::= (\"a\" | \"bc\"){2,3}", {{"aa", 1}, {"abc", 1}, {"bcbcbc", 1}, {"aaaa", -1}, {"a", 0}, {"b", 0}}},
        {"root ::= x? y+\nx ::= [xX]\ny ::=\n  \"y\" |\n  \"Y\"", {{"xyY", 1}, {"Y", 1}, {"x", 0}, {"xx", -1}, {"", 0}, {"yyyyyyy", 1}}},
        {"root ::= . .", {{"ab", 1}, {"\xe2\x82\xac!", 1}, {"\xf0\x9f\x98\x80x", 1}, {"\xff", -1}, {"abc", -1}, {"\n\n", 1}}},
    };
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++) {
        gram *g = gb(T[i].src);
        check_cases(T[i].src, g, T[i].c, 6);
        gram_destroy(g);
    }
}

static void test_regex_recognizer(void)
{
    static const struct {
        const char *re;
        scase c[5];
    } T[] = {
        {"(ab|c)+d?", {{"abcd", 1}, {"c", 1}, {"abd", 1}, {"d", -1}, {"a", 0}}},
        {"^\\d{2}-[a-fA-F]{1,2}$", {{"12-a", 1}, {"12-aF", 1}, {"12-aFa", -1}, {"1a", -1}, {"99-", 0}}},
        {"[^\"\\\\]*\\.x", {{"ab.x", 1}, {".x", 1}, {"a\"", -1}, {"a\\", -1}, {"\xc3\xa9.", 0}}},
        {"a.c", {{"abc", 1}, {"a\nc", -1}, {"a\xe2\x82\xac" "c", 1}, {"ac", 0}, {"abbc", -1}}},
        {"(?:x|y){0,2}z*", {{"", 1}, {"xyzz", 1}, {"xyx", -1}, {"zx", -1}, {"yz", 1}}},
        {"\\s\\w\\W", {{" a!", 1}, {"\ta-", 1}, {"aa!", -1}, {" !", -1}, {" _", 0}}},
    };
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++) {
        kvant_err err = {0};
        gram *g = rx_compile(T[i].re, strlen(T[i].re), gram_limits_default(), &err);
        check_cases(T[i].re, g, T[i].c, 5);
        gram_destroy(g);
    }
}

static gram *js(const char *schema, kvant_err *err)
{
    return jschema_compile(schema, strlen(schema), gram_limits_default(), err);
}

static void test_json_schema(void)
{
    kvant_err err = {0};
    gram *g = js("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"},"
                 "\"c\":{\"type\":\"array\",\"items\":{\"enum\":[1,\"x\"]},\"maxItems\":2}},"
                 "\"required\":[\"b\"],\"additionalProperties\":false}", &err);
    static const scase c1[] = {
        {"{\"b\":\"\"}", 1}, {"{\"a\":-3,\"b\":\"q\\\"\\u00e9\"}", 1}, {"{\"a\":1}", -1},
        {"{\"b\":\"x\",\"c\":[1,\"x\"]}", 1}, {"{\"b\":\"x\",\"c\":[1,1,1]}", -1}, {"{\"a\":01", -1},
        {"{\"b\":\"x\",\"a\":1}", -1}, {"{\"b\":\"\x01\"}", -1}, {"{\"b\":\"x\"", 0},
    };
    check_cases("object schema", g, c1, 9);
    gram_destroy(g);
    g = js("{\"$defs\":{\"n\":{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"}}]}},"
           "\"$ref\":\"#/$defs/n\"}", &err);
    static const scase c2[] = {{"null", 1}, {"[[],[null,[]]]", 1}, {"[nul", 0}, {"[1]", -1}};
    check_cases("recursive $ref", g, c2, 4);
    gram_destroy(g);
    g = jschema_any_object(gram_limits_default(), &err);
    static const scase c3[] = {{"{}", 1}, {"{\"k\":[1.5e3,true,{\"z\":null}]}", 1}, {"[]", -1}, {"{\"k\"}", -1}};
    check_cases("json_object", g, c3, 4);
    gram_destroy(g);
    g = js("{\"type\":\"string\",\"format\":\"date\"}", &err);
    static const scase c4[] = {{"\"2024-02-29\"", 1}, {"\"2024-13-01\"", -1}, {"\"2024-1", 0}};
    check_cases("format date", g, c4, 3);
    gram_destroy(g);
}

/* Integer bounds: every integer in a window, membership against arithmetic. */
static void test_integer_ranges(void)
{
    static const long long B[][2] = {{-12, 305}, {0, 9}, {7, 7}, {-100, -3}, {10, 1000}, {-5, 12345}};
    for (size_t i = 0; i < sizeof B / sizeof B[0]; i++) {
        char s[128];
        snprintf(s, sizeof s, "{\"type\":\"integer\",\"minimum\":%lld,\"maximum\":%lld}", B[i][0], B[i][1]);
        kvant_err err = {0};
        gram *g = js(s, &err);
        CHECKF(g != NULL, "%s: %s", s, err.msg);
        for (long long x = -150; g && x <= 13000; x += (x > 400 ? 37 : 1)) {
            char num[32];
            snprintf(num, sizeof num, "%lld", x);
            int want = x >= B[i][0] && x <= B[i][1];
            CHECKF((run(g, num, strlen(num)) == 1) == want, "%s: %lld", s, x);
        }
        CHECK(!g || run(g, "01", 2) == -1);
        gram_destroy(g);
    }
    kvant_err err = {0};
    gram *g = js("{\"type\":\"integer\",\"exclusiveMinimum\":0}", &err);
    static const scase c[] = {{"1", 1}, {"0", -1}, {"-1", -1}, {"1234567890123", 1}};
    check_cases("exclusiveMinimum 0", g, c, 4);
    gram_destroy(g);
}

static void test_bad_input(void)
{
    static const struct {
        int kind;
        const char *src, *msg;
    } B[] = {
        {GRAM_KIND_GBNF, "root ::= \"a", "unexpected end"},
        {GRAM_KIND_GBNF, "root ::= [a-", "unexpected end"},
        {GRAM_KIND_GBNF, "root ::= (\"a\"", "expecting ')'"},
        {GRAM_KIND_GBNF, "root ::= <[5]>", "token references"},
        {GRAM_KIND_GBNF, "root ::= \"a\"\nroot ::= \"b\"", "defined twice"},
        {GRAM_KIND_GBNF, "root ::= x\nx ::= x \"a\"", "can accept nothing"},
        {GRAM_KIND_GBNF, "root ::= \"a\"{99999}", "limit"},
        {GRAM_KIND_GBNF, "root = \"a\"", "expecting ::="},
        {GRAM_KIND_GBNF, "root ::= \"\\xZZ\"", "hex"},
        {GRAM_KIND_GBNF, "", "no rule named root"},
        {GRAM_KIND_REGEX, "a)", "unbalanced"},
        {GRAM_KIND_REGEX, "[z-a]", "out of order"},
        {GRAM_KIND_REGEX, "\\bx", "word boundaries"},
        {GRAM_KIND_REGEX, "*a", "nothing before"},
        {GRAM_KIND_REGEX, "a$b", "anchors"},
        {GRAM_KIND_REGEX, "a++", "possessive"},
        {GRAM_KIND_REGEX, "a**", "multiple repeat"},
        {GRAM_KIND_REGEX, "a{2}{3}", "multiple repeat"},
        {GRAM_KIND_REGEX, "ab.*********x", "multiple repeat"},
        {GRAM_KIND_REGEX, "a*??", "multiple repeat"},
        {GRAM_KIND_JSON_SCHEMA, "{\"type\":\"object\",\"properties\":{\"x\":{\"not\":{}}}}", "/properties/x/not: unsupported"},
        {GRAM_KIND_JSON_SCHEMA, "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"format\":\"ipv9\"}}", "/items/format: unsupported format 'ipv9'"},
        {GRAM_KIND_JSON_SCHEMA, "{\"anyOf\":[{\"type\":\"number\",\"maximum\":3}]}", "/anyOf/0/maximum"},
        {GRAM_KIND_JSON_SCHEMA, "{\"$ref\":\"http://x/y\"}", "/$ref: only local"},
        {GRAM_KIND_JSON_SCHEMA, "{\"required\":[\"q\"]}", "/required: required 'q'"},
        {GRAM_KIND_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"(?<n>a)\"}", "/pattern"},
        {GRAM_KIND_JSON_SCHEMA, "[1,", "invalid JSON"},
        {GRAM_KIND_JSON_SCHEMA, "false", "can accept nothing"},
        {GRAM_KIND_CHOICE, "[]", "non-empty"},
        {GRAM_KIND_CHOICE, "{\"a\":1}", "non-empty"},
    };
    for (size_t i = 0; i < sizeof B / sizeof B[0]; i++) {
        kvant_err err = {0};
        gram *g = gcache_compile(B[i].kind, B[i].src, strlen(B[i].src), gram_limits_default(), &err);
        CHECKF(!g && err.code < 0 && strstr(err.msg, B[i].msg), "'%s': got '%s', want '%s'", B[i].src,
               err.msg, B[i].msg);
        gram_destroy(g);
    }
    /* a grammar over the size limit */
    gram_limits lim = gram_limits_default();
    lim.max_elems = 50;
    kvant_err err = {0};
    const char *big = "root ::= \"abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz\"";
    gram *g = gbnf_compile(big, strlen(big), lim, &err);
    CHECKF(!g && strstr(err.msg, "grammar too large"), "%s", err.msg);
    /* the state limit: a deep nesting runs into max_state_items */
    lim = gram_limits_default();
    lim.max_state_items = 400;
    const char *deep = "root ::= \"(\" root \")\" | \"x\"";
    g = gbnf_compile(deep, strlen(deep), lim, &err);
    CHECK(g != NULL);
    earley *e = g ? earley_create(g, &err) : NULL;
    int r = 1, n = 0;
    while (e && r == 1 && n < 10000)
        r = earley_push_byte(e, '('), n++;
    CHECKF(r == KV_ERANGE && n < 10000, "state limit: r=%d after %d bytes", r, n);
    CHECK(!e || earley_n_items(e) <= 400);
    CHECK(!e || earley_mem_bytes(e) > 0);
    earley_destroy(e);
    gram_destroy(g);
}

/* Brute force: each token pushed on its own (no trie, no memo). */
static int32_t brute_mask(const tmask_vocab *v, earley *e, uint32_t *mask)
{
    int32_t count = 0;
    memset(mask, 0, (size_t)tmask_n_words(v) * sizeof *mask);
    for (int32_t i = 0; i < tmask_n_vocab(v); i++) {
        int32_t len;
        const uint8_t *b = tmask_token(v, i, &len);
        int32_t d = earley_depth(e);
        int ok = tmask_is_eos(v, i) ? earley_accepting(e) : len > 0 && earley_push_bytes(e, b, (size_t)len) == 1;
        earley_truncate(e, d);
        if (ok) {
            mask[i >> 5] |= 1u << (i & 31);
            count++;
        }
    }
    return count;
}

static tmask_vocab *synthetic_vocab(tu_rng *rng, int32_t n)
{
    static const char alpha[] = "ab\"{}[],:01 \\x\xc3\xa9";
    uint8_t **tok = calloc((size_t)n, sizeof *tok);
    int32_t *len = calloc((size_t)n, sizeof *len);
    for (int32_t i = 0; i < n; i++) {
        tok[i] = malloc(8);
        if (i == 0)
            len[i] = 0;   /* a control token */
        else if (i < 257)
            len[i] = 1, tok[i][0] = (uint8_t)(i - 1);
        else
            len[i] = 1 + (int32_t)(tu_rand_u64(rng) % 6);
        for (int32_t k = 0; i >= 257 && k < len[i]; k++)
            tok[i][k] = (uint8_t)alpha[tu_rand_u64(rng) % (sizeof alpha - 1)];
    }
    int32_t eos = 0;
    kvant_err err = {0};
    tmask_vocab *v = tmask_vocab_create((const uint8_t *const *)tok, len, n, &eos, 1, &err);
    for (int32_t i = 0; i < n; i++)
        free(tok[i]);
    free(tok);
    free(len);
    return v;
}

/* One walk of n steps from a fresh state of g: the memoized masks (w, its
 * shared cache if bound) and the plain walk's against pushing every token
 * alone, then a random allowed token. */
static void check_walk(const tmask_vocab *v, const gram *g, tmask_work *w, tu_rng *rng,
                       const char *what, int n)
{
    kvant_err err = {0};
    int32_t nw = tmask_n_words(v);
    uint32_t *m1 = calloc((size_t)nw, 4), *m2 = calloc((size_t)nw, 4), *m3 = calloc((size_t)nw, 4);
    earley *e = earley_create(g, &err);
    tmask_work_reset(w);
    for (int step = 0; e && m1 && m2 && m3 && step < n; step++) {
        int32_t c1 = tmask_compute(v, e, w, m1, &err);
        int32_t c2 = tmask_compute(v, e, NULL, m2, &err);
        int32_t c3 = brute_mask(v, e, m3);
        CHECKF(c1 == c3 && c2 == c3, "%s step %d: %d %d %d", what, step, c1, c2, c3);
        CHECKF(!memcmp(m1, m3, (size_t)nw * 4) && !memcmp(m2, m3, (size_t)nw * 4), "%s step %d",
               what, step);
        if (c3 <= 0)
            break;
        int32_t k = (int32_t)(tu_rand_u64(rng) % (uint64_t)c3), tok = -1;
        for (int32_t i = 0; i < tmask_n_vocab(v) && tok < 0; i++)
            if (m3[i >> 5] >> (i & 31) & 1 && k-- == 0)
                tok = i;
        if (tmask_is_eos(v, tok))
            break;
        CHECK(tmask_advance(v, e, tok) == 1);
    }
    earley_destroy(e);
    free(m1);
    free(m2);
    free(m3);
}

static void test_masks(void)
{
    tu_rng rng = {0x9E3779B97F4A7C15ull};
    tmask_vocab *v = synthetic_vocab(&rng, 3000);
    CHECK(v != NULL);
    static const char *const schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}},\"additionalProperties\":false}",
        "{\"anyOf\":[{\"type\":\"string\",\"pattern\":\"a(b|x)*\"},{\"enum\":[\"ab\",10,[]]}]}",
        "{\"type\":\"object\"}",
        "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\"},\"t\":{\"type\":\"string\",\"maxLength\":3},\"n\":{\"type\":\"number\"}},\"required\":[\"t\"],\"additionalProperties\":false}",
    };
    kvant_err err = {0};
    tmask_work *w = v ? tmask_work_create(v, &err) : NULL;
    CHECK(w != NULL);
    for (size_t s = 0; v && w && s < sizeof schemas / sizeof schemas[0]; s++) {
        gram *g = js(schemas[s], &err);
        CHECKF(g != NULL, "%s", err.msg);
        char what[64];
        /* on its own, then with a cache shared by the walks (small: evictions) */
        tmshare *sh = g ? tmshare_create(g, tmask_n_words(v), 16, &err) : NULL;
        CHECK(!g || sh);
        for (int walk = 0; g && sh && walk < 8; walk++) {
            CHECK(tmask_work_share(w, walk < 2 ? NULL : sh) == KV_OK);
            snprintf(what, sizeof what, "schema %zu walk %d", s, walk);
            check_walk(v, g, w, &rng, what, 30);
        }
        int64_t hits = 0, misses = 0;
        int32_t n_masks = 0;
        if (sh)
            tmshare_stats(sh, &hits, &misses, &n_masks);
        CHECKF(hits > 0 && misses > 0 && n_masks <= 16, "schema %zu: %lld hits %lld misses %d masks",
               s, (long long)hits, (long long)misses, n_masks);
        tmask_work_share(w, NULL);
        tmshare_destroy(sh);
        gram_destroy(g);
    }
    /* runs counted (the end refusing, or not) and looping, for the run masks */
    static const char *const regexes[] = {"[ -~]{3}([ -~]x)?", "[ -~]{0,4}", "[ -~]{2}[ -z]*b?",
                                          "[ -~]{1,3}(x[ -~]|[ -~]{3})"};
    for (size_t r = 0; v && w && r < sizeof regexes / sizeof regexes[0]; r++) {
        gram *g = rx_compile(regexes[r], strlen(regexes[r]), gram_limits_default(), &err);
        CHECKF(g != NULL, "%s", err.msg);
        char what[64];
        snprintf(what, sizeof what, "regex %zu", r);
        for (int walk = 0; g && walk < 3; walk++)
            check_walk(v, g, w, &rng, what, 8);
        gram_destroy(g);
    }
    /* a cache of another grammar is not used */
    gram *g1 = js(schemas[0], &err), *g2 = js(schemas[2], &err);
    tmshare *sh = g1 ? tmshare_create(g1, tmask_n_words(v), 16, &err) : NULL;
    CHECK(w && sh && tmask_work_share(w, sh) == KV_OK);
    if (w && sh && g2)
        check_walk(v, g2, w, &rng, "other grammar", 20);
    int64_t hits = 0, misses = 0;
    int32_t n_masks = -1;
    if (sh)
        tmshare_stats(sh, &hits, &misses, &n_masks);
    CHECK(n_masks == 0 && hits == 0);
    tmshare *bad = g1 ? tmshare_create(g1, tmask_n_words(v) + 1, 4, &err) : NULL;
    CHECK(w && bad && tmask_work_share(w, bad) == KV_EINVAL);
    tu_rng r2 = {7};
    tmask_vocab *v2 = synthetic_vocab(&r2, 3000);   /* same size, another vocabulary */
    tmask_work *w2 = v2 ? tmask_work_create(v2, &err) : NULL;
    CHECK(w2 && sh && tmask_work_share(w2, sh) == KV_EINVAL);
    tmask_work_destroy(w2);
    tmask_vocab_destroy(v2);
    if (w)
        tmask_work_share(w, NULL);
    tmshare_destroy(bad);
    tmshare_destroy(sh);
    gram_destroy(g1);
    gram_destroy(g2);
    tmask_work_destroy(w);
    tmask_vocab_destroy(v);
}

static void test_cache(void)
{
    gcache *c = gcache_create(2, gram_limits_default());
    kvant_err err = {0};
    gcache_entry *a = gcache_get(c, GRAM_KIND_REGEX, "ab+", 3, &err);
    gcache_entry *b = gcache_get(c, GRAM_KIND_REGEX, "ab+", 3, &err);
    gcache_entry *d = gcache_get(c, GRAM_KIND_GBNF, "ab+", 3, &err);   /* other kind: bad GBNF */
    CHECK(a && a == b && !d && err.code < 0);
    int64_t hits, misses;
    gcache_stats(c, &hits, &misses);
    CHECK(hits == 1 && misses == 2);
    gcache_release(c, b);
    /* fill past capacity while a is held: a stays usable */
    gcache_entry *x = gcache_get(c, GRAM_KIND_REGEX, "x", 1, &err);
    gcache_entry *y = gcache_get(c, GRAM_KIND_REGEX, "y", 1, &err);
    gcache_entry *z = gcache_get(c, GRAM_KIND_CHOICE, "[\"z\"]", 5, &err);
    CHECK(x && y && z && run(gcache_gram(a), "abbb", 4) == 1 && run(gcache_gram(z), "z", 1) == 1);
    tmshare *m1 = gcache_masks(c, a, 10, &err), *m2 = gcache_masks(c, a, 10, &err);
    CHECK(m1 && m1 == m2 && tmshare_gram(m1) == gcache_gram(a) && tmshare_n_words(m1) == 10);
    CHECK(!gcache_masks(c, a, 11, &err) && err.code == KV_EINVAL);
    gcache_release(c, a);   /* evicted while held: its masks go with it */
    gcache_release(c, x);
    gcache_release(c, y);
    gcache_release(c, z);
    gcache_destroy(c);
    CHECK(gram_kind_parse("json_schema") == GRAM_KIND_JSON_SCHEMA && gram_kind_parse("nope") == -1);
}

int main(void)
{
    test_gbnf_recognizer();
    test_regex_recognizer();
    test_json_schema();
    test_integer_ranges();
    test_bad_input();
    test_masks();
    test_cache();
    return tu_finish("test_grammar");
}
