/* tok_bpe.c - BPE with merges: byte-level (tokenizer.ggml.model = "gpt2")
 * and over raw UTF-8 (model "gemma4").
 *
 * Encoding a text segment:
 *   1. pre-tokenize with the regexes named by tokenizer.ggml.pre (PCRE2,
 *      UTF + Unicode properties); each regex splits every piece produced by
 *      the previous one into its matches and the gaps between them, as
 *      llama.cpp's unicode_regex_split does.  Invalid UTF-8 never matches
 *      (PCRE2_MATCH_INVALID_UTF), so stray bytes land in gaps and survive
 *      to the byte-level step: encode/decode round-trips any bytes.
 *   2. byte-level: every byte of a word becomes the token of its GPT-2
 *      byte-level character.  Raw (gemma4): the word's spaces become U+2581
 *      and every UTF-8 character its own token (-1 if the vocabulary lacks
 *      it; an invalid byte is a character of its own).  Adjacent pairs are
 *      then merged lowest merge rank first (ties: leftmost) with a min-heap
 *      over a linked list, O(n log n) per word.
 *   3. a symbol without a token becomes its bytes: <0xXX> tokens (raw), or
 *      the unknown token where those are missing too.
 *
 * Merges are stored by token ids: (left, right) -> (rank, merged id).  A
 * merge whose left, right or concatenation is not in the vocabulary is
 * skipped (it could never fire); a merge string without the separating
 * space is a format error.  Duplicate pairs keep the lowest rank.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "text/tok_internal.h"

#include <stdlib.h>
#include <string.h>

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define RE_DIGIT "\\p{N}"
/* Llama-3 / Qwen2 use (?i:'s|...); spelt with explicit classes as llama.cpp
 * does, so Unicode case folding cannot widen it. */
#define RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|"
#define RE_LLAMA3_HEAD RE_CONTRACTIONS "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
#define RE_LLAMA3_TAIL "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3 RE_LLAMA3_HEAD "\\p{N}{1,3}" RE_LLAMA3_TAIL
#define RE_QWEN2 RE_LLAMA3_HEAD "\\p{N}" RE_LLAMA3_TAIL
/* Qwen3.5: letter runs also take combining marks (\p{M}) */
#define RE_QWEN35                                                                                             \
    RE_CONTRACTIONS "[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|"       \
                    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* DeepSeek (llama.cpp's deepseek-llm, deepseek-coder, deepseek-v3 expressions, applied in
 * sequence: each splits the pieces the previous one left) */
#define RE_DSL_0 \
    "[\r\n]"
#define RE_DSL_1 \
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿ" \
    "ΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-" \
    "ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅ" \
    "ὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-" \
    "ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩ" \
    "ℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ" \
    "-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆ" \
    "ﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲" \
    "𐳀-𐳲𑢠-𑣟𞤀-𞥃]+"
#define RE_DSL_2 \
    "\\s?[!-/:-~！-／：-～‘-‟　-。]+"
#define RE_DSL_3 \
    "\\s+$"
#define RE_DSL_4 \
    "[一-龥ࠀ-一가-퟿]+"
#define RE_DSL_5 \
    "\\p{N}+"
#define RE_DSC_0 \
    "[\r\n]"
#define RE_DSC_1 \
    "\\s?\\p{L}+"
#define RE_DSC_2 \
    "\\s?\\p{P}+"
#define RE_DSC_3 \
    "[一-龥ࠀ-一가-퟿]+"
#define RE_DSC_4 \
    "\\p{N}"
#define RE_DS3_0 \
    "\\p{N}{1,3}"
#define RE_DS3_1 \
    "[一-龥぀-ゟ゠-ヿ]+"
#define RE_DS3_2 \
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n" \
    "\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*" \
    "|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
/* gpt-4o (o200k: gpt-oss, Llama 4): llama.cpp's rewrite of the tokenizer.json
 * expression, case classes as lookaheads */
#define RE_GPT4O \
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?" \
    ":'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L" \
    "}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|" \
    "'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}" \
    "\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Gemma 4: no word splitting, only runs of newlines apart from the rest */
#define RE_NEWLINES "[^\\n]+|\\n+"

enum pre_bos { PRE_BOS_FILE = 0, PRE_BOS_DEFAULT_ON, PRE_BOS_FORCED };

typedef struct pre_spec {
    const char *name;
    const char *re[TOK_MAX_REGEX]; /* NULL-terminated */
    int ignore_merges;             /* a word that is a token is emitted whole */
    int raw;                       /* merges over raw UTF-8, ' ' as U+2581, <0xXX> bytes */
    enum pre_bos bos;              /* llama.cpp's add_bos: the key alone, true unless
                                    * the key says otherwise, or true whatever the key */
} pre_spec;

/* tokenizer.ggml.pre values kvant knows.  "default" follows the GPT-2 regex
 * (kvant's choice; llama.cpp uses a different multi-regex default). */
static const pre_spec PRE_SPECS[] = {
    {"default", {RE_GPT2, NULL}, 0, 0, PRE_BOS_FILE},
    {"gpt-2", {RE_GPT2, NULL}, 0, 0, PRE_BOS_FILE},
    {"gpt2", {RE_GPT2, NULL}, 0, 0, PRE_BOS_FILE},
    {"smollm", {RE_DIGIT, RE_GPT2, NULL}, 0, 0, PRE_BOS_FILE}, /* llama.cpp: \p{N} split first */
    {"llama-bpe", {RE_LLAMA3, NULL}, 1, 0, PRE_BOS_DEFAULT_ON},
    {"llama3", {RE_LLAMA3, NULL}, 1, 0, PRE_BOS_DEFAULT_ON},
    {"qwen2", {RE_QWEN2, NULL}, 0, 0, PRE_BOS_FILE},
    {"qwen35", {RE_QWEN35, NULL}, 0, 0, PRE_BOS_FILE},
    {"gemma4", {RE_NEWLINES, NULL}, 0, 1, PRE_BOS_FORCED}, /* llama.cpp PR 21500 forces BOS */
    {"deepseek-llm", {RE_DSL_0, RE_DSL_1, RE_DSL_2, RE_DSL_3, RE_DSL_4, RE_DSL_5, NULL}, 0, 0,
     PRE_BOS_FILE},
    {"deepseek-coder", {RE_DSC_0, RE_DSC_1, RE_DSC_2, RE_DSC_3, RE_DSC_4, NULL}, 0, 0,
     PRE_BOS_FILE},
    {"deepseek-v3", {RE_DS3_0, RE_DS3_1, RE_DS3_2, NULL}, 0, 0, PRE_BOS_FILE},
    {"gpt-4o", {RE_GPT4O, NULL}, 0, 0, PRE_BOS_FILE},
    {"llama4", {RE_GPT4O, NULL}, 0, 0, PRE_BOS_FILE},
};

static int compile_pre(tokenizer *t, const gguf_ctx *g, const char *forced, const pre_spec **out,
                       kvant_err *err)
{
    gguf_str pre = {"default", 7};
    if (forced) {
        pre = (gguf_str){forced, strlen(forced)};
    } else if (gguf_find_key(g, "tokenizer.ggml.pre") >= 0) {
        int rc = gguf_get_str(g, "tokenizer.ggml.pre", &pre, err);
        if (rc)
            return rc;
    }
    const pre_spec *spec = NULL;
    for (size_t i = 0; i < sizeof PRE_SPECS / sizeof PRE_SPECS[0]; i++)
        if (gguf_str_eq(pre, PRE_SPECS[i].name))
            spec = &PRE_SPECS[i];
    if (!spec)
        return kvant_err_set(err, KV_EUNSUP, "tokenizer.ggml.pre: unsupported pre-tokenizer '%.*s'",
                             (int)(pre.len > 64 ? 64 : pre.len), pre.ptr);
    for (int i = 0; i < TOK_MAX_REGEX && spec->re[i]; i++) {
        int ec;
        PCRE2_SIZE eo;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)spec->re[i], PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &ec, &eo, NULL);
        if (!re)
            return kvant_err_set(err, KV_EUNSUP, "tokenizer: PCRE2 cannot compile the '%s' regex (error %d)",
                                 spec->name, ec);
        (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional speed-up */
        t->re[t->n_re++] = re;
    }
    t->ignore_merges = spec->ignore_merges;
    t->byte_level = !spec->raw;
    t->escape_ws = spec->raw;
    t->newline_whole = spec->raw;
    *out = spec;
    return KV_OK;
}

static int load_merges(tokenizer *t, const gguf_ctx *g, kvant_err *err)
{
    int64_t ki = gguf_find_key(g, "tokenizer.ggml.merges");
    if (ki < 0)
        return kvant_err_set(err, KV_EFORMAT, "tokenizer.ggml.merges: missing (required for gpt2 and gemma4)");
    if (gguf_kv_type(g, ki) != GGUF_TYPE_ARRAY || gguf_arr_type(g, ki) != GGUF_TYPE_STRING)
        return kvant_err_set(err, KV_EFORMAT, "tokenizer.ggml.merges: not an array of strings");
    uint64_t n = gguf_arr_n(g, ki);
    if (n > TOK_MAX_MERGES)
        return kvant_err_set(err, KV_EFORMAT, "tokenizer.ggml.merges: %llu entries (limit %d)",
                             (unsigned long long)n, TOK_MAX_MERGES);
    if (tok_pairmap_init(&t->merges, (size_t)n))
        return kvant_err_set(err, KV_ENOMEM, "tokenizer.ggml.merges: out of memory");
    char *cat = NULL;
    size_t cat_cap = 0;
    for (uint64_t j = 0; j < n; j++) {
        gguf_str s = gguf_arr_str(g, ki, j);
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
        if (!sp) {
            free(cat);
            return kvant_err_set(err, KV_EFORMAT, "tokenizer.ggml.merges[%llu]: no space separating the pair",
                                 (unsigned long long)j);
        }
        size_t ln = (size_t)(sp - s.ptr), rn = s.len - ln - 1;
        if (ln + rn > cat_cap) {
            char *nc = realloc(cat, ln + rn);
            if (!nc) {
                free(cat);
                return kvant_err_set(err, KV_ENOMEM, "tokenizer.ggml.merges: out of memory");
            }
            cat = nc;
            cat_cap = ln + rn;
        }
        memcpy(cat, s.ptr, ln);
        memcpy(cat + ln, sp + 1, rn);
        int32_t l = tok_strmap_find(&t->vocab, t, s.ptr, ln);
        int32_t r = tok_strmap_find(&t->vocab, t, sp + 1, rn);
        int32_t m = tok_strmap_find(&t->vocab, t, cat, ln + rn);
        if (l >= 0 && r >= 0 && m >= 0)
            tok_pairmap_put(&t->merges, l, r, (int32_t)j, m);
    }
    free(cat);
    return KV_OK;
}

int tok_bpe_init(tokenizer *t, const gguf_ctx *g, const char *pre, kvant_err *err)
{
    const pre_spec *spec = NULL;
    int rc = compile_pre(t, g, pre, &spec, err);
    if (rc)
        return rc;
    if (spec->bos == PRE_BOS_FORCED ||
        (spec->bos == PRE_BOS_DEFAULT_ON && gguf_find_key(g, "tokenizer.ggml.add_bos_token") < 0))
        t->add_bos = 1;
    if (t->byte_level) {
        for (int b = 0; b < 256; b++) {
            char u[4];
            int n = tok_utf8_put(tok_byte_to_cp((uint8_t)b), u);
            t->byte_tok[b] = tok_strmap_find(&t->vocab, t, u, (size_t)n);
        }
    } else {
        tok_map_hex_bytes(t);
    }
    return load_merges(t, g, err);
}

void tok_bpe_free(tokenizer *t)
{
    for (int i = 0; i < t->n_re; i++)
        pcre2_code_free(t->re[i]);
    t->n_re = 0;
    tok_pairmap_free(&t->merges);
}

/* ---- encoding ---- */

typedef struct bpe_sym {
    int32_t id;         /* current token, -1 if the byte / character has no token */
    int32_t start;      /* first byte in the word */
    int32_t prev, next; /* live list; -1 at the ends */
} bpe_sym;

typedef struct bpe_pair {
    int32_t rank, left, right, lid, rid, result;
} bpe_pair;

typedef struct bpe_ctx {
    const tokenizer *t;
    pcre2_match_data *md;
    tok_out *out;
    bpe_sym *sym;
    bpe_pair *heap;
    size_t cap_sym, cap_heap, n_heap;
    char *tmp;          /* byte-level spelling of a word (ignore_merges) */
    unsigned char *sub; /* the word with unrepresentable bytes replaced, or
                         * (raw) with its spaces spelt U+2581 */
} bpe_ctx;

static int pair_before(const bpe_pair *a, const bpe_pair *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(bpe_ctx *c, bpe_pair v)
{
    size_t i = c->n_heap++; /* capacity ensured by the caller */
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!pair_before(&v, &c->heap[p]))
            break;
        c->heap[i] = c->heap[p];
        i = p;
    }
    c->heap[i] = v;
}

static bpe_pair heap_pop(bpe_ctx *c)
{
    bpe_pair top = c->heap[0], last = c->heap[--c->n_heap];
    size_t i = 0;
    for (;;) {
        size_t k = 2 * i + 1;
        if (k >= c->n_heap)
            break;
        if (k + 1 < c->n_heap && pair_before(&c->heap[k + 1], &c->heap[k]))
            k++;
        if (!pair_before(&c->heap[k], &last))
            break;
        c->heap[i] = c->heap[k];
        i = k;
    }
    if (c->n_heap)
        c->heap[i] = last;
    return top;
}

static void try_pair(bpe_ctx *c, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return;
    bpe_pair p = {0, l, r, c->sym[l].id, c->sym[r].id, 0};
    if (tok_pairmap_get(&c->t->merges, p.lid, p.rid, &p.rank, &p.result))
        heap_push(c, p);
}

static int ensure_cap(bpe_ctx *c, size_t n)
{
    if (n > c->cap_sym) {
        bpe_sym *s = realloc(c->sym, n * sizeof *s);
        if (s)
            c->sym = s;
        char *tmp = s ? realloc(c->tmp, 2 * n) : NULL;
        if (tmp)
            c->tmp = tmp;
        unsigned char *sub = tmp ? realloc(c->sub, n) : NULL;
        if (sub)
            c->sub = sub;
        if (!s || !tmp || !sub)
            return KV_ENOMEM;
        c->cap_sym = n;
    }
    /* each merge pushes at most two pairs; n - 1 initial pairs */
    size_t need = 3 * n + 1;
    if (need > c->cap_heap) {
        bpe_pair *h = realloc(c->heap, need * sizeof *h);
        if (!h)
            return KV_ENOMEM;
        c->heap = h;
        c->cap_heap = need;
    }
    return KV_OK;
}

/* Bytes the vocabulary has no token for (SmolLM2 lacks 0xC0, 0xC1 and
 * 0xF5..0xFF, which never occur in valid UTF-8) are encoded as U+FFFD, as
 * llama.cpp does for invalid UTF-8.  Returns the word to merge (w itself or
 * c->sub) and its length. */
static const unsigned char *substitute_missing(bpe_ctx *c, const unsigned char *w, size_t *n)
{
    static const unsigned char repl[3] = {0xEF, 0xBF, 0xBD};
    size_t missing = 0;
    for (size_t i = 0; i < *n; i++)
        missing += c->t->byte_tok[w[i]] < 0;
    if (!missing)
        return w;
    size_t m = 0;
    for (size_t i = 0; i < *n; i++) {
        if (c->t->byte_tok[w[i]] >= 0) {
            c->sub[m++] = w[i];
        } else {
            memcpy(c->sub + m, repl, 3);
            m += 3;
        }
    }
    *n = m;
    return c->sub;
}

/* Raw BPE (gemma4): the word with ' ' spelt U+2581, as llama.cpp's
 * escape_whitespaces does to the whole fragment before splitting (the
 * newline split cannot tell the difference). */
static const unsigned char *escape_spaces(bpe_ctx *c, const unsigned char *w, size_t *n)
{
    if (!memchr(w, ' ', *n))
        return w;
    size_t m = 0;
    for (size_t i = 0; i < *n; i++) {
        if (w[i] == ' ') {
            memcpy(c->sub + m, "\xE2\x96\x81", 3);
            m += 3;
        } else {
            c->sub[m++] = w[i];
        }
    }
    *n = m;
    return c->sub;
}

/* The word's whole token when it is emitted without merging: llama-bpe's
 * ignore_merges (any word that is a token) and gemma4's newline runs.
 * -1 when the merges must run. */
static int32_t whole_word(bpe_ctx *c, const unsigned char *w, size_t n)
{
    const tokenizer *t = c->t;
    if (t->ignore_merges && t->byte_level) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            m += (size_t)tok_utf8_put(tok_byte_to_cp(w[i]), c->tmp + m);
        return tok_strmap_find(&t->vocab, t, c->tmp, m);
    }
    size_t nl = 0;
    while (nl < n && w[nl] == '\n')
        nl++;
    if (t->ignore_merges || (t->newline_whole && nl == n))
        return tok_strmap_find(&t->vocab, t, (const char *)w, n);
    return -1;
}

/* One symbol per byte (byte-level) or per UTF-8 character (raw; an
 * invalid byte is a character of its own and has no token).  Returns the
 * number of symbols. */
static int32_t init_symbols(bpe_ctx *c, const unsigned char *w, size_t n)
{
    const tokenizer *t = c->t;
    int32_t k = 0;
    for (size_t i = 0; i < n;) {
        size_t l = 1;
        int32_t id;
        if (t->byte_level) {
            id = t->byte_tok[w[i]];
        } else {
            int cl = tok_utf8_check(w + i, n - i);
            l = cl > 0 ? (size_t)cl : 1;
            id = cl > 0 ? tok_strmap_find(&t->vocab, t, (const char *)w + i, l) : -1;
        }
        c->sym[k] = (bpe_sym){id, (int32_t)i, k - 1, i + l == n ? -1 : k + 1};
        k++;
        i += l;
    }
    return k;
}

static void merge_symbols(bpe_ctx *c, int32_t n_sym)
{
    c->n_heap = 0;
    for (int32_t i = 1; i < n_sym; i++)
        try_pair(c, i - 1, i);
    while (c->n_heap) {
        bpe_pair p = heap_pop(c);
        bpe_sym *l = &c->sym[p.left], *r = &c->sym[p.right];
        if (l->id != p.lid || r->id != p.rid || l->next != p.right)
            continue; /* stale */
        l->id = p.result;
        l->next = r->next;
        if (r->next >= 0)
            c->sym[r->next].prev = p.left;
        r->id = -2; /* dead */
        r->prev = r->next = -1;
        try_pair(c, l->prev, p.left);
        try_pair(c, p.left, l->next);
    }
}

/* A symbol without a token: raw BPE spells its bytes as <0xXX> tokens
 * (an unmerged symbol is one character); the unknown token stands in for
 * whatever has no token at all. */
static void emit_missing(bpe_ctx *c, const unsigned char *w, size_t n, const bpe_sym *s)
{
    const tokenizer *t = c->t;
    if (t->byte_level) {
        if (t->unk >= 0)
            tok_out_push(c->out, t->unk);
        return;
    }
    int cl = tok_utf8_check(w + s->start, n - (size_t)s->start);
    for (int j = 0; j < (cl > 0 ? cl : 1); j++) {
        int32_t b = t->byte_tok[w[s->start + j]];
        if (b < 0)
            b = t->unk;
        if (b >= 0)
            tok_out_push(c->out, b);
    }
}

static int bpe_word(bpe_ctx *c, const unsigned char *w, size_t n)
{
    if (ensure_cap(c, 3 * n))
        return KV_ENOMEM;
    if (c->t->byte_level)
        w = substitute_missing(c, w, &n);
    else if (c->t->escape_ws)
        w = escape_spaces(c, w, &n);
    int32_t id = whole_word(c, w, n);
    if (id >= 0) {
        tok_out_push(c->out, id);
        return KV_OK;
    }
    merge_symbols(c, init_symbols(c, w, n));
    for (int32_t i = 0; i != -1; i = c->sym[i].next) {
        if (c->sym[i].id >= 0)
            tok_out_push(c->out, c->sym[i].id);
        else
            emit_missing(c, w, n, &c->sym[i]);
    }
    return KV_OK;
}

static int pre_split(bpe_ctx *c, const char *s, size_t len, int level, kvant_err *err)
{
    if (len == 0)
        return KV_OK;
    if (level == c->t->n_re)
        return bpe_word(c, (const unsigned char *)s, len) ? kvant_err_set(err, KV_ENOMEM, "tokenizer: out of memory")
                                                          : KV_OK;
    const pcre2_code *re = c->t->re[level];
    size_t pos = 0, gap = 0;
    while (pos < len) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, len, pos, 0, c->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0)
            return kvant_err_set(err, KV_EINVAL, "tokenizer: pre-tokenizer regex failed (PCRE2 error %d)", rc);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) { /* empty match (kvant's patterns have none): step one character */
            int cl = tok_utf8_check((const unsigned char *)s + ms, len - ms);
            pos = ms + (cl > 0 ? (size_t)cl : 1);
            continue;
        }
        if (ms > gap && (rc = pre_split(c, s + gap, ms - gap, level + 1, err)) != KV_OK)
            return rc;
        if ((rc = pre_split(c, s + ms, me - ms, level + 1, err)) != KV_OK)
            return rc;
        gap = pos = me;
    }
    if (gap < len)
        return pre_split(c, s + gap, len - gap, level + 1, err);
    return KV_OK;
}

int tok_bpe_encode(const tokenizer *t, const char *text, size_t len, tok_out *out, kvant_err *err)
{
    bpe_ctx c = {.t = t, .out = out};
    c.md = pcre2_match_data_create(4, NULL);
    if (!c.md)
        return kvant_err_set(err, KV_ENOMEM, "tokenizer: out of memory");
    kvant_err local;
    kvant_err_clear(&local);
    int rc = pre_split(&c, text, len, 0, &local);
    if (rc && err)
        *err = local;
    pcre2_match_data_free(c.md);
    free(c.sym);
    free(c.heap);
    free(c.tmp);
    free(c.sub);
    return rc;
}
