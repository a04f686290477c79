/* test_tokenizer.c - tokenizer tests.
 *
 *  1. llama.cpp's vocabulary test vectors (tests/data/vectors/tokenizer, see
 *     its README) for llama-spm, gpt-2, phi-3, llama-bpe (Llama 3), qwen2,
 *     qwen35, gemma-4, deepseek-llm and deepseek-coder: every line must match
 *     exactly (add_bos = 0, parse_special = 0).  The six large vocabularies are
 *     read from build/peer (`make peer-src`) and checked by sha256; a missing or
 *     different file is a FAILURE, not a skip.
 *  2. The default model (SmolLM2, gpt2 + "smollm" pre-tokenizer) against
 *     an independent reference table (see SMOL_CASES).
 *  3. parse_special, round trips (incl. invalid UTF-8), streaming decode,
 *     a 10 KB encode speed bound and corrupt-vocabulary images.
 * Runs with cwd = repository root.
 */
#include "kv/kvhash.h"
#include "text/tokenizer.h"
#include "testutil.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define VEC_DIR "tests/data/vectors/tokenizer"
#define PEER_DIR "build/peer/llama.cpp/models" /* llama.cpp 0c1e570, `make peer-src` */
#define MODEL_PATH "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define SEP "\n__ggml_vocab_test__\n"

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        *len = (size_t)n;
    }
    return buf;
}

static void print_ids(const char *what, const int32_t *ids, int64_t n)
{
    fprintf(stderr, "  %s (%lld):", what, (long long)n);
    for (int64_t i = 0; i < n; i++)
        fprintf(stderr, " %d", ids[i]);
    fputc('\n', stderr);
}

/* Encodes into a malloc'd array; *n gets the count (negative on error). */
static int32_t *encode(const tokenizer *t, const char *s, size_t len, int bos, int special, int64_t *n)
{
    kvant_err err = {0};
    int64_t k = tok_encode(t, s, len, bos, special, NULL, 0, &err);
    if (k < 0) {
        fprintf(stderr, "  encode error: %s\n", err.msg);
        *n = k;
        return NULL;
    }
    int32_t *ids = malloc((size_t)(k ? k : 1) * sizeof *ids);
    *n = tok_encode(t, s, len, bos, special, ids, k, &err);
    return ids;
}

static int ids_equal(const int32_t *a, int64_t na, const int32_t *b, int64_t nb)
{
    return a && na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof *a) == 0);
}

static tokenizer *load(const char *path)
{
    kvant_err err = {0};
    gguf_ctx *g = gguf_open(path, &err);
    CHECKF(g != NULL, "open %s: %s", path, err.msg);
    if (!g)
        return NULL;
    tokenizer *t = tok_create(g, &err);
    CHECKF(t != NULL, "tok_create %s: %s", path, err.msg);
    gguf_close(g); /* the tokenizer copies what it needs */
    return t;
}

/* The vocabularies whose vectors are checked.  .inp/.out are vendored in
 * VEC_DIR; a vocabulary with a sha256 is too large to vendor and is read
 * from PEER_DIR, where scripts/fetch-peer-src.sh unpacks it. */
typedef struct vec_vocab {
    const char *name;
    const char *sha256; /* of PEER_DIR/name; NULL: vendored in VEC_DIR */
} vec_vocab;

static const vec_vocab VOCABS[] = {
    {"ggml-vocab-llama-spm.gguf", NULL},
    {"ggml-vocab-gpt-2.gguf", NULL},
    {"ggml-vocab-phi-3.gguf", NULL},
    {"ggml-vocab-llama-bpe.gguf", "97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e"},
    {"ggml-vocab-qwen2.gguf", "44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c"},
    {"ggml-vocab-qwen35.gguf", "63ed952ff338996cf0bdf24a7b10015124273f75c6dc9bb427356aa3f67ec62c"},
    {"ggml-vocab-gemma-4.gguf", "58b1ba0b57f3b4d7c468ba4ffd91ad85190346a3d7ad7e71d1cabaae8a14bb65"},
    {"ggml-vocab-deepseek-llm.gguf",
     "867f77537b54565f0d81d508c04edc41aa1d4ffc1a92745f225b4c1b02755f76"},
    {"ggml-vocab-deepseek-coder.gguf",
     "91cb1379f2e33af1c4866b194622b7a0e12e8f0c9dba7ba2f10d55978730bec1"},
};
enum { N_VOCABS = sizeof VOCABS / sizeof VOCABS[0] };

/* Path of a vocabulary's GGUF; for a peer file, fails the test (and
 * returns 0) unless the file is there with the recorded sha256. */
static int vocab_path(const vec_vocab *v, char *path, size_t cap)
{
    if (!v->sha256) {
        snprintf(path, cap, "%s/%s", VEC_DIR, v->name);
        return 1;
    }
    snprintf(path, cap, "%s/%s", PEER_DIR, v->name);
    size_t len;
    char *data = read_file(path, &len);
    CHECKF(data != NULL, "missing %s: run make peer-src", path);
    if (!data)
        return 0;
    uint8_t h[KVHASH_SHA256_BYTES];
    kvhash_sha256(data, len, h);
    free(data);
    char hex[2 * KVHASH_SHA256_BYTES + 1];
    for (int i = 0; i < KVHASH_SHA256_BYTES; i++)
        snprintf(hex + 2 * i, 3, "%02x", h[i]);
    int same = strcmp(hex, v->sha256) == 0;
    CHECKF(same, "%s: sha256 %s, expected %s: run make peer-src", path, hex, v->sha256);
    return same;
}

static tokenizer *load_vocab(const char *name)
{
    for (int i = 0; i < N_VOCABS; i++) {
        char path[512];
        if (strcmp(VOCABS[i].name, name) == 0)
            return vocab_path(&VOCABS[i], path, sizeof path) ? load(path) : NULL;
    }
    CHECKF(0, "no vocabulary %s", name);
    return NULL;
}

/* Next input of a .inp file: the text up to the separator, or (as
 * llama.cpp's test reads them) the rest of the file when no separator
 * follows the last one.  NULL at the end. */
static const char *next_input(const char **ip, size_t *len)
{
    const char *s = *ip;
    if (!*s)
        return NULL;
    const char *sep = strstr(s, SEP);
    *len = sep ? (size_t)(sep - s) : strlen(s);
    *ip = sep ? sep + strlen(SEP) : s + *len;
    return s;
}

/* Checks one vocabulary's .inp/.out pair; returns the number of cases. */
static int check_vectors(const vec_vocab *v)
{
    char path[512];
    size_t inp_len, out_len;
    snprintf(path, sizeof path, "%s/%s.inp", VEC_DIR, v->name);
    char *inp = read_file(path, &inp_len);
    CHECKF(inp != NULL, "missing test vector file %s", path);
    snprintf(path, sizeof path, "%s/%s.out", VEC_DIR, v->name);
    char *out = read_file(path, &out_len);
    CHECKF(out != NULL, "missing test vector file %s", path);
    tokenizer *t = inp && out && vocab_path(v, path, sizeof path) ? load(path) : NULL;
    int n_cases = 0, n_bad = 0;
    const char *ip = inp, *text;
    char *op = out;
    size_t tl;
    while (t && (text = next_input(&ip, &tl))) {
        char *eol = strchr(op, '\n');
        CHECKF(eol != NULL, "%s: fewer output lines than inputs (case %d)", v->name, n_cases);
        if (!eol)
            break;
        *eol = '\0';
        int32_t want[4096];
        int64_t nw = 0;
        for (char *p = op, *e; nw < 4096; p = e) {
            long x = strtol(p, &e, 10);
            if (e == p)
                break;
            want[nw++] = (int32_t)x;
        }
        int64_t ng;
        int32_t *got = encode(t, text, tl, 0, 0, &ng);
        int same = ids_equal(got, ng, want, nw);
        if (!same && n_bad++ == 0) {
            fprintf(stderr, "%s case %d mismatch, input (%zu bytes): \"%.*s\"\n", v->name, n_cases, tl,
                    (int)tl, text);
            print_ids("want", want, nw);
            print_ids("got ", got, ng);
        }
        free(got);
        n_cases++;
        op = eol + 1;
    }
    CHECKF(!t || *op == '\0', "%s: more output lines than inputs (%d inputs)", v->name, n_cases);
    CHECKF(t && n_bad == 0, "%s: %d of %d cases differ", v->name, n_bad, n_cases);
    CHECKF(!t || n_cases > 20, "%s: only %d cases parsed", v->name, n_cases);
    fprintf(stderr, "%s: %d cases, %d mismatches\n", v->name, n_cases, n_bad);
    tok_destroy(t);
    free(inp);
    free(out);
    return n_cases;
}

/* ---- the default model vs an independent reference ---- */

/* Produced by /tmp/ref/smol_ref.py (kept in the test-writing session):
 * HF `tokenizers` 0.23.3, models.BPE built from this GGUF's
 * tokenizer.ggml.tokens + tokenizer.ggml.merges, pre-tokenizer
 * Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False,
 * use_regex=True)] (SmolLM2's tokenizer.json pipeline), no added tokens,
 * encode(s, add_special_tokens=False).ids.  The script asserted that
 * decode(ids) == s for every case. */
typedef struct smol_case {
    const char *text;
    int n;
    int32_t ids[32];
} smol_case;

static const smol_case SMOL_CASES[] = {
    {"Hello world", 2, {19556, 905}},
    {"Hello, world! How's it going?", 9, {19556, 28, 905, 17, 1073, 506, 357, 2045, 47}},
    {"The year 2024 had 365 days; pi=3.14159.", 24, {504, 713, 216, 34, 32, 34, 36, 761, 216, 35, 38, 37, 2009, 43, 16916, 45, 35, 30, 33, 36, 33, 37, 41, 30}},
    {"  multiple   spaces\011and\011tabs  ", 10, {216, 2701, 256, 5600, 197, 397, 197, 100, 7366, 256}},
    {"line one\012line two\012\012\012line five\015\012", 10, {1311, 582, 198, 1311, 827, 1116, 198, 1311, 2531, 2738}},
    {"Caf\303\251 na\303\257ve r\303\251sum\303\251 fa\303\247ade", 10, {51, 1939, 2756, 15486, 46494, 412, 2756, 5422, 2756, 40852}},
    {"\346\227\245\346\234\254\350\252\236\343\201\256\343\203\206\343\202\255\343\202\271\343\203\210\343\200\201\344\270\255\346\226\207\345\255\227\347\254\246\343\200\202", 22, {23274, 115, 40993, 179, 120, 248, 26453, 11100, 224, 10391, 251, 10391, 134, 11100, 226, 29917, 28589, 29184, 36518, 40562, 116, 19076}},
    {"Emoji: \360\237\230\200\360\237\221\215\360\237\217\275 \360\237\207\253\360\237\207\267 \342\235\244\357\270\217", 21, {10809, 33777, 42, 40303, 218, 10813, 235, 231, 10813, 233, 138, 15107, 225, 121, 10813, 225, 132, 4636, 247, 114, 31752}},
    {"<|im_start|>user\012hi<|im_end|>", 17, {44, 108, 306, 79, 3738, 108, 46, 4093, 198, 6004, 44, 108, 306, 79, 486, 108, 46}},
    {"I'm sure they'll've done it, didn't they? WE'RE", 16, {57, 5248, 2090, 502, 3060, 3543, 2294, 357, 28, 3683, 982, 502, 47, 26587, 23, 3256}},
    {"def f(x):\012    return x**2  # square\012", 14, {1604, 275, 24, 104, 727, 472, 1003, 1792, 828, 34, 216, 907, 5222, 198}},
    {"\303\234n\303\257c\303\266d\303\251 \316\221\316\222\316\223 \320\260\320\261\320\262 \331\241\331\242\331\243 \302\275", 26, {142, 246, 94, 25972, 83, 7466, 84, 2756, 5664, 235, 153, 236, 153, 237, 47060, 27714, 16464, 216, 164, 111, 164, 112, 164, 113, 216, 16738}},
    {"   leading and trailing   \012\012", 6, {256, 2899, 284, 35079, 333, 1116}},
    {"!!!???...,,,;;; @#$%^&*()", 16, {29646, 16693, 47, 27040, 12002, 43, 43, 43, 3394, 19, 20, 21, 78, 22, 26, 1000}},
};

static void test_smollm(const tokenizer *t)
{
    for (size_t c = 0; c < sizeof SMOL_CASES / sizeof SMOL_CASES[0]; c++) {
        const smol_case *sc = &SMOL_CASES[c];
        int64_t n;
        int32_t *ids = encode(t, sc->text, strlen(sc->text), 0, 0, &n);
        int ok = ids_equal(ids, n, sc->ids, sc->n);
        CHECKF(ok, "SmolLM2 case %zu \"%s\" differs from the reference", c, sc->text);
        if (!ok) {
            print_ids("want", sc->ids, sc->n);
            print_ids("got ", ids, n);
        }
        free(ids);
    }
    /* metadata */
    CHECK(tok_n_vocab(t) == 49152);
    CHECK(tok_bos(t) == 1 && tok_eos(t) == 2 && tok_eot(t) == 2);
    CHECK(tok_add_bos(t) == 0);
    CHECK(tok_is_eog(t, 2) && tok_is_eog(t, 0) && !tok_is_eog(t, 1) && !tok_is_eog(t, 19556));
    CHECK(tok_attr_of(t, 1) == TOK_CONTROL && tok_attr_of(t, 19556) == TOK_NORMAL);
    CHECK(tok_attr_of(t, -1) < 0 && tok_attr_of(t, 49152) < 0);

    /* parse_special: the markers become their ids; otherwise plain text */
    const char *chat = "<|im_start|>user\nhi<|im_end|>";
    static const int32_t want_sp[] = {1, 4093, 198, 6004, 2};
    int64_t n;
    int32_t *ids = encode(t, chat, strlen(chat), 0, 1, &n);
    CHECK(ids_equal(ids, n, want_sp, 5));
    free(ids);
    ids = encode(t, chat, strlen(chat), 0, 0, &n);
    CHECK(ids_equal(ids, n, SMOL_CASES[8].ids, SMOL_CASES[8].n));
    free(ids);
    ids = encode(t, chat, strlen(chat), 1, 1, &n); /* add_bos prepends id 1 */
    CHECK(n == 6 && ids && ids[0] == 1 && ids[1] == 1);
    free(ids);

    /* a short buffer: total count returned, only cap ids written */
    int32_t small[3] = {-7, -7, -7};
    CHECK(tok_encode(t, "Hello, world! How's", 19, 0, 0, small, 2, NULL) == 6);
    CHECK(small[0] == 19556 && small[1] == 28 && small[2] == -7);

    /* pieces */
    char buf[64];
    CHECK(tok_piece(t, 905, 0, buf, sizeof buf) == 6 && memcmp(buf, " world", 6) == 0);
    CHECK(tok_piece(t, 1, 0, buf, sizeof buf) == 0);
    CHECK(tok_piece(t, 1, 1, buf, sizeof buf) == 12 && memcmp(buf, "<|im_start|>", 12) == 0);
    CHECK(tok_piece(t, 905, 0, buf, 3) == 6); /* needed length */
    CHECK(tok_piece(t, 49152, 0, buf, sizeof buf) < 0 && tok_piece(t, -1, 0, buf, sizeof buf) < 0);
}

/* ---- round trips and streaming ---- */

/* Strict UTF-8 validity (independent of the tokenizer's own helper). */
static int valid_utf8(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3
                                                          : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        if (!k || i + k > n)
            return 0;
        uint32_t cp = k == 1 ? c : c & (0xFF >> (k + 1));
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xC0) != 0x80)
                return 0;
            cp = cp << 6 | (s[i + j] & 0x3F);
        }
        static const uint32_t minv[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < minv[k] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += k;
    }
    return 1;
}

static const char *const ROUND_TRIP[] = {
    "Hello world",
    " leading space and trailing ",
    "emoji \360\237\230\200\360\237\221\215\360\237\217\275 and flags \360\237\207\253\360\237\207\267",
    "\346\227\245\346\234\254\350\252\236 \344\270\255\346\226\207 \355\225\234\352\265\255\354\226\264",
    "invalid \200\277 bytes \342 here \360\237\230",
    "truncated \342\202",
    "\340\200\257 overlong and \355\240\200 surrogate",
    "mixed\n\n\ttabs\r\n  and <|im_start|> text </s> <s>",
    "",
    "1234567890 3.14 \331\241\331\242",
};

/* Streams ids; checks every step emits valid UTF-8; returns the text. */
static char *stream_all(const tokenizer *t, const int32_t *ids, int64_t n, int *partial_seen)
{
    size_t cap = 64, len = 0;
    char *acc = malloc(cap);
    tok_stream st;
    tok_stream_init(&st);
    *partial_seen = 0;
    for (int64_t i = 0; i <= n; i++) {
        char buf[256];
        int w = i < n ? tok_stream_feed(t, &st, ids[i], buf, sizeof buf) : tok_stream_flush(&st, buf, sizeof buf);
        CHECKF(w >= 0, "stream step %lld failed: %d", (long long)i, w);
        if (w < 0)
            break;
        CHECKF(valid_utf8((unsigned char *)buf, (size_t)w), "stream step %lld emitted invalid UTF-8", (long long)i);
        if (i < n && st.n_pending > 0)
            *partial_seen = 1;
        while (len + (size_t)w + 1 > cap)
            acc = realloc(acc, cap *= 2);
        memcpy(acc + len, buf, (size_t)w);
        len += (size_t)w;
    }
    acc[len] = '\0';
    return acc;
}

static void test_round_trip(const tokenizer *t, const char *name, int space_prefix)
{
    for (size_t c = 0; c < sizeof ROUND_TRIP / sizeof ROUND_TRIP[0]; c++) {
        const char *s = ROUND_TRIP[c];
        int64_t n;
        int32_t *ids = encode(t, s, strlen(s), 0, 0, &n);
        char *d = ids ? tok_decode(t, ids, n, 0) : NULL;
        CHECKF(d && strcmp(d, s) == 0, "%s round trip %zu: \"%s\" -> \"%s\"", name, c, s, d ? d : "(null)");
        free(d);
        int partial = 0;
        char *st = ids ? stream_all(t, ids, n, &partial) : NULL;
        int valid = valid_utf8((const unsigned char *)s, strlen(s));
        if (valid && st) /* the stream has no prefix stripping */
            CHECKF(strcmp(st + (space_prefix && *s ? 1 : 0), s) == 0, "%s stream %zu: \"%s\"", name, c, st);
        free(st);
        free(ids);
    }
}

static void test_stream_details(const tokenizer *t)
{
    /* an emoji split over byte tokens is held back, then emitted whole */
    const char *s = "Emoji: \360\237\230\200!";
    int64_t n;
    int32_t *ids = encode(t, s, strlen(s), 0, 0, &n);
    int partial = 0;
    char *st = ids ? stream_all(t, ids, n, &partial) : NULL;
    CHECK(st && strcmp(st, s) == 0);
    CHECK(partial);
    free(st);
    free(ids);
    /* invalid bytes: one U+FFFD per maximal invalid subpart */
    const char *bad = "a\200b\342\202c\342\202";
    ids = encode(t, bad, strlen(bad), 0, 0, &n);
    st = ids ? stream_all(t, ids, n, &partial) : NULL;
    CHECKF(st && strcmp(st, "a\357\277\275b\357\277\275c\357\277\275") == 0, "got \"%s\"", st ? st : "");
    free(st);
    free(ids);
    /* control tokens produce nothing; too-small output fails without losing state */
    tok_stream ss;
    tok_stream_init(&ss);
    char buf[8];
    CHECK(tok_stream_feed(t, &ss, 1, buf, sizeof buf) == 0);
    CHECK(tok_stream_feed(t, &ss, 905, buf, 2) < 0);
    CHECK(tok_stream_feed(t, &ss, 905, buf, sizeof buf) == 6 && memcmp(buf, " world", 6) == 0);
    CHECK(tok_stream_feed(t, &ss, -1, buf, sizeof buf) < 0);
}

/* Random texts built from a palette of fragments (ASCII words, spaces,
 * digits, newlines, multi-byte characters, special-token text and, when
 * raw_bytes, stray bytes 0x80..0xBF): decode(encode(s)) == s, also with
 * parse_special + render_special, and the stream reproduces valid text.
 * SentencePiece cannot round-trip a literal U+2581 (it decodes to ' ', as
 * in sentencepiece itself), so spm leaves that fragment out. */
static void test_random_round_trip(const tokenizer *t, const char *name, int raw_bytes, int specials_round_trip,
                                   int spm)
{
    static const char *const frag[] = {"a", "the", " ", "  ", "\n", "\t", "7", "42", ".", "'s", "!?",
                                       "\303\251", "\344\270\255", "\360\237\230\200", "<|im_start|>",
                                       "<s>", "</s>", "<|endoftext|>", "Hello", "\342\226\201"};
    enum { N_FRAG = sizeof frag / sizeof frag[0] };
    tu_rng rng = {0x1234567ULL};
    char s[512];
    int bad = 0;
    for (int iter = 0; iter < 300 && bad < 3; iter++) {
        size_t len = 0;
        int k = (int)(tu_rand_u64(&rng) % 40);
        for (int j = 0; j < k; j++) {
            if (raw_bytes && tu_rand_u64(&rng) % 8 == 0) {
                s[len++] = (char)(0x80 + tu_rand_u64(&rng) % 64);
                continue;
            }
            const char *f = frag[tu_rand_u64(&rng) % (N_FRAG - (spm ? 1 : 0))];
            memcpy(s + len, f, strlen(f));
            len += strlen(f);
        }
        s[len] = '\0';
        for (int sp = 0; sp <= specials_round_trip; sp++) {
            int64_t n;
            int32_t *ids = encode(t, s, len, 0, sp, &n);
            char *d = ids ? tok_decode(t, ids, n, sp) : NULL;
            int ok = d && strcmp(d, s) == 0;
            CHECKF(ok, "%s random round trip (parse_special %d): \"%s\" -> \"%s\"", name, sp, s, d ? d : "(null)");
            bad += !ok;
            if (!raw_bytes && !sp && ids) {
                int partial;
                char *st = stream_all(t, ids, n, &partial);
                CHECKF(strcmp(st, s) == 0, "%s random stream: \"%s\" -> \"%s\"", name, s, st);
                free(st);
            }
            free(d);
            free(ids);
        }
    }
}

/* Bytes absent from the vocabulary (SmolLM2 has no token for 0xFF) are
 * encoded as U+FFFD; a vocabulary with all 256 bytes round-trips them. */
static void test_missing_bytes(const tokenizer *smol, const tokenizer *gpt2)
{
    int64_t n1, n2;
    int32_t *a = encode(smol, "x\377y", 3, 0, 0, &n1);
    int32_t *b = encode(smol, "x\357\277\275y", 5, 0, 0, &n2);
    CHECK(a && b && ids_equal(a, n1, b, n2));
    free(a);
    free(b);
    if (!gpt2)
        return;
    a = encode(gpt2, "x\377\376\300y", 5, 0, 0, &n1);
    char *d = a ? tok_decode(gpt2, a, n1, 0) : NULL;
    CHECK(d && strcmp(d, "x\377\376\300y") == 0);
    free(d);
    free(a);
}

/* ---- speed: 10 KB must take milliseconds, not seconds ---- */

static void test_speed(const tokenizer *t, const char *name)
{
    enum { SIZE = 10240 };
    char *text = malloc(SIZE + 1);
    char *same = malloc(SIZE + 1);
    size_t len = 0;
    for (size_t c = 0; len < SIZE; c++) {
        const char *s = SMOL_CASES[c % (sizeof SMOL_CASES / sizeof SMOL_CASES[0])].text;
        size_t k = strlen(s);
        if (len + k > SIZE)
            k = SIZE - len;
        memcpy(text + len, s, k);
        len += k;
    }
    memset(same, 'a', SIZE); /* one 10 KB word: the merge loop's worst case */
    clock_t t0 = clock();
    int64_t n1 = tok_encode(t, text, len, 0, 0, NULL, 0, NULL);
    int64_t n2 = tok_encode(t, same, SIZE, 0, 0, NULL, 0, NULL);
    double sec = (double)(clock() - t0) / CLOCKS_PER_SEC;
    CHECK(n1 > 1000 && n2 > 0);
    /* generous bound (sanitizers, shared machine); quadratic code takes seconds */
    CHECKF(sec < 1.0, "%s: encoding 2 x 10 KB took %.3f s", name, sec);
    fprintf(stderr, "%s: 2 x 10 KB encoded in %.1f ms (%lld + %lld tokens)\n", name, sec * 1e3, (long long)n1,
            (long long)n2);
    free(text);
    free(same);
}

static void test_spm_details(const tokenizer *t)
{
    char buf[16];
    CHECK(tok_bos(t) == 1 && tok_eos(t) == 2 && tok_add_bos(t) == 1);
    CHECK(tok_piece(t, 13, 0, buf, sizeof buf) == 1 && buf[0] == '\n'); /* <0x0A> */
    CHECK(tok_piece(t, 29871, 0, buf, sizeof buf) == 1 && buf[0] == ' '); /* U+2581 */
    CHECK(tok_piece(t, 1, 0, buf, sizeof buf) == 0);
    CHECK(tok_piece(t, 1, 1, buf, sizeof buf) == 3 && memcmp(buf, "<s>", 3) == 0);
    int64_t n;
    int32_t *ids = encode(t, "Hello", 5, 1, 0, &n);
    CHECK(n == 2 && ids && ids[0] == 1 && ids[1] == 15043);
    free(ids);
    /* "<s>" with parse_special is BOS; a following fragment gets the space prefix */
    ids = encode(t, "<s>Hello", 8, 0, 1, &n);
    CHECK(n == 2 && ids && ids[0] == 1 && ids[1] == 15043);
    free(ids);
    ids = encode(t, "<s>", 3, 0, 0, &n);
    CHECK(n > 1 && ids && ids[0] != 1);
    free(ids);
}

/* ---- corrupt vocabularies: small GGUF images built in memory ---- */

typedef struct gbuf {
    unsigned char *p;
    size_t n, cap;
    uint64_t n_kv;
} gbuf;

static void gb_put(gbuf *b, const void *src, size_t n)
{
    while (b->n + n > b->cap)
        b->p = realloc(b->p, b->cap = b->cap ? b->cap * 2 : 4096);
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void gb_u32(gbuf *b, uint32_t v) { gb_put(b, &v, 4); }
static void gb_u64(gbuf *b, uint64_t v) { gb_put(b, &v, 8); }
static void gb_str(gbuf *b, const char *s)
{
    gb_u64(b, strlen(s));
    gb_put(b, s, strlen(s));
}
static void gb_key(gbuf *b, const char *key, uint32_t type)
{
    b->n_kv++;
    gb_str(b, key);
    gb_u32(b, type);
}
static void gb_kv_str(gbuf *b, const char *key, const char *v)
{
    gb_key(b, key, GGUF_TYPE_STRING);
    gb_str(b, v);
}
static void gb_kv_u32(gbuf *b, const char *key, uint32_t v)
{
    gb_key(b, key, GGUF_TYPE_UINT32);
    gb_u32(b, v);
}
static void gb_kv_strs(gbuf *b, const char *key, const char *const *v, size_t n)
{
    gb_key(b, key, GGUF_TYPE_ARRAY);
    gb_u32(b, GGUF_TYPE_STRING);
    gb_u64(b, n);
    for (size_t i = 0; i < n; i++)
        gb_str(b, v[i]);
}
static void gb_kv_i32s(gbuf *b, const char *key, const int32_t *v, size_t n)
{
    gb_key(b, key, GGUF_TYPE_ARRAY);
    gb_u32(b, GGUF_TYPE_INT32);
    gb_u64(b, n);
    gb_put(b, v, n * 4);
}
static void gb_kv_f32s(gbuf *b, const char *key, const float *v, size_t n)
{
    gb_key(b, key, GGUF_TYPE_ARRAY);
    gb_u32(b, GGUF_TYPE_FLOAT32);
    gb_u64(b, n);
    gb_put(b, v, n * 4);
}

/* Wraps the key/value body into a GGUF v3 image with no tensors. */
static unsigned char *gb_image(const gbuf *b, size_t *size)
{
    gbuf img = {0};
    gb_put(&img, "GGUF", 4);
    gb_u32(&img, 3);
    gb_u64(&img, 0);
    gb_u64(&img, b->n_kv);
    gb_put(&img, b->p, b->n);
    while (img.n % 32)
        gb_put(&img, "", 1);
    *size = img.n;
    return img.p;
}

/* Tiny byte-level vocabulary: the 256 byte characters, "he", "ll", "hell",
 * "hello", a CONTROL "<|c|>" and a USER_DEFINED "<u>". */
enum { TINY_N = 262 };
static char TINY_TEXT[TINY_N][8];
static const char *TINY_TOK[TINY_N];
static int32_t TINY_TYPE[TINY_N];

static void tiny_vocab(void)
{
    /* GPT-2 byte -> code point mapping, tabulated independently here */
    int k = 0;
    for (int bt = 0; bt < 256; bt++) {
        int direct = (bt >= 0x21 && bt <= 0x7E) || (bt >= 0xA1 && bt <= 0xAC) || bt >= 0xAE;
        unsigned cp = direct ? (unsigned)bt : 0x100u + (unsigned)k++;
        char *o = TINY_TEXT[bt];
        if (cp < 0x80) {
            o[0] = (char)cp;
        } else {
            o[0] = (char)(0xC0 | (cp >> 6));
            o[1] = (char)(0x80 | (cp & 0x3F));
        }
    }
    strcpy(TINY_TEXT[256], "he");
    strcpy(TINY_TEXT[257], "ll");
    strcpy(TINY_TEXT[258], "hell");
    strcpy(TINY_TEXT[259], "hello");
    strcpy(TINY_TEXT[260], "<|c|>");
    strcpy(TINY_TEXT[261], "<u>");
    for (int i = 0; i < TINY_N; i++) {
        TINY_TOK[i] = TINY_TEXT[i];
        TINY_TYPE[i] = i == 260 ? TOK_CONTROL : i == 261 ? TOK_USER_DEFINED : TOK_NORMAL;
    }
}

typedef enum corrupt_kind {
    CK_VALID,
    CK_NO_TOKENS,
    CK_BAD_MODEL,
    CK_MODEL_NOT_STRING,
    CK_TOKENS_NOT_STRINGS,
    CK_EMPTY_TOKENS,
    CK_SHORT_SCORES,
    CK_SHORT_TYPES,
    CK_BAD_TYPE_VALUE,
    CK_BOS_OUT_OF_RANGE,
    CK_MERGE_NO_SPACE,
    CK_NO_MERGES,
    CK_BAD_PRE,
    CK_MERGE_MISSING_TOKEN, /* skipped by design: still loads */
    CK_PRE_SMOLLM,          /* valid: the other pre-tokenizers compile and work */
    CK_PRE_LLAMA3,
    CK_PRE_QWEN2,
    CK_COUNT
} corrupt_kind;

static gguf_ctx *tiny_open(corrupt_kind ck, unsigned char **img)
{
    static const char *const merges[] = {"h e", "l l", "he ll", "hell o", "x yz"};
    static const char *const bad_merges[] = {"h e", "ll"};
    gbuf b = {0};
    gb_kv_str(&b, "general.architecture", "llama");
    if (ck == CK_MODEL_NOT_STRING)
        gb_kv_u32(&b, "tokenizer.ggml.model", 7);
    else
        gb_kv_str(&b, "tokenizer.ggml.model", ck == CK_BAD_MODEL ? "wordpiece" : "gpt2");
    gb_kv_str(&b, "tokenizer.ggml.pre", ck == CK_BAD_PRE ? "martian" : ck == CK_PRE_SMOLLM ? "smollm"
                                        : ck == CK_PRE_LLAMA3 ? "llama-bpe" : ck == CK_PRE_QWEN2 ? "qwen2" : "gpt-2");
    if (ck == CK_TOKENS_NOT_STRINGS)
        gb_kv_i32s(&b, "tokenizer.ggml.tokens", TINY_TYPE, TINY_N);
    else if (ck == CK_EMPTY_TOKENS)
        gb_kv_strs(&b, "tokenizer.ggml.tokens", TINY_TOK, 0);
    else if (ck != CK_NO_TOKENS)
        gb_kv_strs(&b, "tokenizer.ggml.tokens", TINY_TOK, TINY_N);
    int32_t types[TINY_N];
    memcpy(types, TINY_TYPE, sizeof types);
    if (ck == CK_BAD_TYPE_VALUE)
        types[100] = 99;
    gb_kv_i32s(&b, "tokenizer.ggml.token_type", types, ck == CK_SHORT_TYPES ? TINY_N - 1 : TINY_N);
    if (ck == CK_SHORT_SCORES) {
        float sc[4] = {0.5f, 0.25f, 0.125f, 1.0f};
        gb_kv_f32s(&b, "tokenizer.ggml.scores", sc, 4);
    }
    if (ck == CK_MERGE_NO_SPACE)
        gb_kv_strs(&b, "tokenizer.ggml.merges", bad_merges, 2);
    else if (ck != CK_NO_MERGES)
        gb_kv_strs(&b, "tokenizer.ggml.merges", merges, ck == CK_MERGE_MISSING_TOKEN ? 5 : 4);
    gb_kv_u32(&b, "tokenizer.ggml.bos_token_id", ck == CK_BOS_OUT_OF_RANGE ? TINY_N : 260);
    size_t size;
    *img = gb_image(&b, &size);
    free(b.p);
    kvant_err err = {0};
    gguf_ctx *g = gguf_open_buffer(*img, size, &err);
    CHECKF(g != NULL, "tiny image %d rejected by the GGUF reader: %s", (int)ck, err.msg);
    return g;
}

/* Gemma 4's raw BPE on a vocabulary made here: <pad> <eos> <bos>, the 256
 * <0xXX> byte tokens (ids 3..258), then h e l o U+2581 he ll hell hello
 * "\n" "\n\n" (259..269); merges he, ll, hell, hello.  Expected ids follow
 * llama.cpp's rules: spaces spelt U+2581, no word split but at newline
 * runs, a newline run that is a token taken whole, <0xXX> for a character
 * without a token. */
enum { RAW_N = 270, RAW_H = 259, RAW_SP = 263, RAW_HELLO = 267, RAW_NL = 268, RAW_NL2 = 269 };

static gguf_ctx *raw_open(const char *pre, int merges, unsigned char **img)
{
    static char text[RAW_N][8];
    static const char *tok[RAW_N];
    static const char *const tail[] = {"h", "e", "l", "o", "\342\226\201", "he", "ll", "hell", "hello", "\n", "\n\n"};
    static const char *const mg[] = {"h e", "l l", "he ll", "hell o"};
    int32_t type[RAW_N];
    for (int i = 0; i < RAW_N; i++) {
        if (i < 3)
            snprintf(text[i], sizeof text[i], "%s", i == 0 ? "<pad>" : i == 1 ? "<eos>" : "<bos>");
        else if (i < 259)
            snprintf(text[i], sizeof text[i], "<0x%02X>", i - 3);
        else
            snprintf(text[i], sizeof text[i], "%s", tail[i - 259]);
        tok[i] = text[i];
        type[i] = i < 3 ? TOK_CONTROL : i < 259 ? TOK_BYTE : TOK_NORMAL;
    }
    gbuf b = {0};
    gb_kv_str(&b, "general.architecture", "gemma4");
    gb_kv_str(&b, "tokenizer.ggml.model", "gemma4");
    if (pre)
        gb_kv_str(&b, "tokenizer.ggml.pre", pre);
    gb_kv_strs(&b, "tokenizer.ggml.tokens", tok, RAW_N);
    gb_kv_i32s(&b, "tokenizer.ggml.token_type", type, RAW_N);
    if (merges)
        gb_kv_strs(&b, "tokenizer.ggml.merges", mg, 4);
    gb_kv_u32(&b, "tokenizer.ggml.bos_token_id", 2);
    gb_kv_u32(&b, "tokenizer.ggml.eos_token_id", 1);
    gb_key(&b, "tokenizer.ggml.add_bos_token", GGUF_TYPE_BOOL);
    gb_put(&b, "", 1); /* false: llama.cpp turns it on for gemma4 */
    size_t size;
    *img = gb_image(&b, &size);
    free(b.p);
    kvant_err err = {0};
    gguf_ctx *g = gguf_open_buffer(*img, size, &err);
    CHECKF(g != NULL, "raw image rejected by the GGUF reader: %s", err.msg);
    return g;
}

static void expect_ids(const tokenizer *t, const char *what, const char *s, size_t len, const int32_t *want,
                       int64_t nw)
{
    int64_t n;
    int32_t *ids = encode(t, s, len, 0, 0, &n);
    int ok = ids_equal(ids, n, want, nw);
    CHECKF(ok, "%s: \"%.*s\"", what, (int)len, s);
    if (!ok) {
        print_ids("want", want, nw);
        print_ids("got ", ids, n);
    }
    free(ids);
}

static void test_raw_bpe(void)
{
    unsigned char *img;
    /* tokenizer.ggml.pre is ignored for gemma4, as llama.cpp does */
    gguf_ctx *g = raw_open("martian", 1, &img);
    kvant_err err = {0};
    tokenizer *t = g ? tok_create(g, &err) : NULL;
    CHECKF(t != NULL, "raw vocab: %s", err.msg);
    if (t) {
        static const int32_t w1[] = {RAW_HELLO, RAW_SP, RAW_HELLO};
        static const int32_t w2[] = {RAW_H, 3 + 0xFF, RAW_NL2, RAW_HELLO};
        static const int32_t w3[] = {RAW_NL, RAW_NL, RAW_NL};
        static const int32_t w4[] = {3 + 0xC3, 3 + 0xA9, RAW_SP, 262 /* o */};
        expect_ids(t, "raw spaces", "hello hello", 11, w1, 3);
        expect_ids(t, "raw byte + newline run", "h\377\n\nhello", 9, w2, 4);
        expect_ids(t, "raw long newline run", "\n\n\n", 3, w3, 3);
        expect_ids(t, "raw byte fallback", "\303\251 o", 4, w4, 4);
        CHECK(tok_add_bos(t) == 1 && tok_bos(t) == 2 && tok_is_eog(t, 1));
        char *d = tok_decode(t, w1, 3, 0);
        CHECK(d && strcmp(d, "hello hello") == 0);
        free(d);
        d = tok_decode(t, w4, 4, 0);
        CHECK(d && strcmp(d, "\303\251 o") == 0);
        free(d);
    }
    tok_destroy(t);
    gguf_close(g);
    free(img);
    g = raw_open(NULL, 0, &img); /* gemma4 needs merges */
    t = g ? tok_create(g, &err) : NULL;
    CHECK(t == NULL && err.code == KV_EFORMAT && strstr(err.msg, "merges"));
    tok_destroy(t);
    gguf_close(g);
    free(img);
}

/* Qwen3.5 keeps combining marks (\p{M}) in letter runs, Qwen2 does not:
 * with a merge e + U+0301, "e\314\201" is one token only under qwen35.
 * Built on the tiny byte-level vocabulary plus "Ìģ" (U+0301's bytes) and
 * "eÌģ". */
static void test_qwen35_marks(void)
{
    tiny_vocab();
    static char acute[16], e_acute[24];
    snprintf(acute, sizeof acute, "%s%s", TINY_TEXT[0xCC], TINY_TEXT[0x81]);
    snprintf(e_acute, sizeof e_acute, "e%s", acute);
    const char *tok[258];
    for (int i = 0; i < 256; i++)
        tok[i] = TINY_TEXT[i];
    tok[256] = acute;
    tok[257] = e_acute;
    char m1[24], m2[32];
    snprintf(m1, sizeof m1, "%s %s", TINY_TEXT[0xCC], TINY_TEXT[0x81]);
    snprintf(m2, sizeof m2, "e %s", acute);
    const char *mg[2] = {m1, m2};
    for (int q35 = 0; q35 <= 1; q35++) {
        gbuf b = {0};
        gb_kv_str(&b, "tokenizer.ggml.model", "gpt2");
        gb_kv_str(&b, "tokenizer.ggml.pre", q35 ? "qwen35" : "qwen2");
        gb_kv_strs(&b, "tokenizer.ggml.tokens", tok, 258);
        gb_kv_strs(&b, "tokenizer.ggml.merges", mg, 2);
        size_t size;
        unsigned char *img = gb_image(&b, &size);
        free(b.p);
        kvant_err err = {0};
        gguf_ctx *g = gguf_open_buffer(img, size, &err);
        tokenizer *t = g ? tok_create(g, &err) : NULL;
        CHECKF(t != NULL, "qwen35 marks vocab: %s", err.msg);
        if (t) {
            static const int32_t merged[] = {257}, split[] = {'e', 256};
            expect_ids(t, q35 ? "qwen35 e + U+0301" : "qwen2 e + U+0301", "e\314\201", 3, q35 ? merged : split,
                       q35 ? 1 : 2);
        }
        tok_destroy(t);
        gguf_close(g);
        free(img);
    }
}

static void test_corrupt(void)
{
    tiny_vocab();
    for (int ck = 0; ck < CK_COUNT; ck++) {
        unsigned char *img;
        gguf_ctx *g = tiny_open((corrupt_kind)ck, &img);
        kvant_err err = {0};
        tokenizer *t = g ? tok_create(g, &err) : NULL;
        if (ck == CK_VALID || ck >= CK_MERGE_MISSING_TOKEN) {
            CHECKF(t != NULL, "tiny vocab %d should load: %s", ck, err.msg);
        } else {
            CHECKF(t == NULL && err.code < 0 && err.msg[0], "corrupt vocab %d accepted", ck);
            if (g)
                fprintf(stderr, "  corrupt vocab %d -> %s: %s\n", ck, kvant_status_str(err.code), err.msg);
        }
        if (ck == CK_BAD_PRE)
            CHECK(err.code == KV_EUNSUP && strstr(err.msg, "martian"));
        if (ck == CK_BAD_MODEL)
            CHECK(err.code == KV_EUNSUP && strstr(err.msg, "wordpiece"));
        if (t) {
            /* merges he, ll, hell, hello; "<u>" is always special, "<|c|>" only with parse_special */
            static const int32_t w1[] = {259, 261, 258};
            int64_t n;
            int32_t *ids = encode(t, "hello<u>hell", 12, 0, 0, &n);
            CHECK(ids_equal(ids, n, w1, 3));
            free(ids);
            ids = encode(t, "<|c|>he", 7, 0, 1, &n);
            static const int32_t w2[] = {260, 256};
            CHECK(ids_equal(ids, n, w2, 2));
            free(ids);
            ids = encode(t, "<|c|>", 5, 0, 0, &n);
            CHECK(n == 5 && ids && ids[0] == '<');
            free(ids);
            /* llama-bpe's add_bos is true unless the file says otherwise (it does not here) */
            CHECK(tok_bos(t) == 260 && tok_add_bos(t) == (ck == CK_PRE_LLAMA3) && tok_eos(t) == -1);
        }
        tok_destroy(t);
        gguf_close(g);
        free(img);
    }
}

/* Metadata rules that the vectors (add_bos = 0, parse_special = 0) do not
 * reach, each as llama.cpp 0c1e570 applies it. */
static void test_family_details(void)
{
    tokenizer *l3 = load_vocab("ggml-vocab-llama-bpe.gguf");
    if (l3) /* llama-bpe: add_bos defaults to true when the key is absent (it is here) */
        CHECK(tok_add_bos(l3) == 1 && tok_bos(l3) == 128000 && tok_is_eog(l3, 128001));
    tok_destroy(l3);
    tokenizer *q = load_vocab("ggml-vocab-qwen35.gguf");
    if (q) {
        CHECK(tok_add_bos(q) == 0 && tok_eot(q) == 151645 && tok_is_eog(q, 151643));
        int64_t n;
        int32_t *ids = encode(q, "<|im_start|>user", 16, 0, 1, &n);
        CHECK(n == 2 && ids && ids[0] == 151644);
        free(ids);
    }
    tok_destroy(q);
    tokenizer *g = load_vocab("ggml-vocab-gemma-4.gguf");
    if (!g)
        return;
    /* gemma4: BOS forced on, <turn|> ends a turn, <|tool_response> ends
     * generation and (USER_DEFINED in the file, CONTROL in llama.cpp) is
     * read as one token only with parse_special */
    CHECK(tok_add_bos(g) == 1 && tok_bos(g) == 2 && tok_eos(g) == 1);
    CHECK(tok_eot(g) == 106 && tok_is_eog(g, 106) && tok_is_eog(g, 1) && tok_is_eog(g, 50));
    int64_t n;
    int32_t *ids = encode(g, "<|tool_response>", 16, 0, 0, &n);
    CHECK(ids && n > 1);
    free(ids);
    ids = encode(g, "<|tool_response>", 16, 0, 1, &n);
    CHECK(ids && n == 1 && ids[0] == 50);
    free(ids);
    ids = encode(g, "<|tool_call>x", 13, 0, 0, &n); /* USER_DEFINED: always one token */
    CHECK(ids && n == 2 && ids[0] == 48);
    free(ids);
    /* spaces are U+2581 in the vocabulary and decode back; a byte without
     * a character token falls back to <0xXX> */
    static const int32_t hw[] = {9259, 1902};
    ids = encode(g, "Hello world", 11, 0, 0, &n);
    CHECK(ids_equal(ids, n, hw, 2));
    free(ids);
    char buf[16];
    CHECK(tok_piece(g, 1902, 0, buf, sizeof buf) == 6 && memcmp(buf, " world", 6) == 0);
    ids = encode(g, "\377", 1, 0, 0, &n);
    CHECK(n == 1 && ids && ids[0] == 238 + 0xFF);
    free(ids);
    CHECK(tok_piece(g, 238 + 0x0A, 0, buf, sizeof buf) == 1 && buf[0] == '\n');
    tok_destroy(g);
}

int main(void)
{
    for (int i = 0; i < N_VOCABS; i++)
        check_vectors(&VOCABS[i]);

    tokenizer *smol = load(MODEL_PATH);
    if (smol) {
        test_smollm(smol);
        test_round_trip(smol, "smollm", 0);
        test_stream_details(smol);
        test_speed(smol, "smollm");
        test_random_round_trip(smol, "smollm", 0, 1, 0);
    }

    tokenizer *spm = load(VEC_DIR "/ggml-vocab-llama-spm.gguf");
    if (spm) {
        test_spm_details(spm);
        test_round_trip(spm, "llama-spm", 1);
        test_speed(spm, "llama-spm");
        test_random_round_trip(spm, "llama-spm", 1, 0, 1);
    }
    tok_destroy(spm);
    tokenizer *gpt2 = load(VEC_DIR "/ggml-vocab-gpt-2.gguf");
    if (gpt2)
    {
        test_round_trip(gpt2, "gpt-2", 0);
        test_random_round_trip(gpt2, "gpt-2", 1, 1, 0);
    }
    if (smol)
        test_missing_bytes(smol, gpt2);
    tok_destroy(gpt2);
    tok_destroy(smol);

    /* the families' own vocabularies: round trips (any bytes) and speed */
    static const struct {
        const char *file, *name;
        int spm, specials;
    } fam[] = {
        {"ggml-vocab-phi-3.gguf", "phi-3", 1, 0},
        {"ggml-vocab-llama-bpe.gguf", "llama-bpe", 0, 1},
        {"ggml-vocab-qwen35.gguf", "qwen35", 0, 1},
        {"ggml-vocab-gemma-4.gguf", "gemma-4", 0, 1},
    };
    for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++) {
        tokenizer *t = load_vocab(fam[i].file);
        if (!t)
            continue;
        test_round_trip(t, fam[i].name, fam[i].spm);
        /* U+2581 decodes to ' ' wherever it spells a space (SPM, gemma4) */
        int u2581_is_space = fam[i].spm || strcmp(fam[i].name, "gemma-4") == 0;
        test_random_round_trip(t, fam[i].name, 1, fam[i].specials, u2581_is_space);
        test_speed(t, fam[i].name);
        tok_destroy(t);
    }
    test_family_details();

    test_corrupt();
    test_raw_bpe();
    test_qwen35_marks();
    return tu_finish("test_tokenizer");
}
