/* tokenizer.c - tokenizer construction from GGUF metadata, the encode
 * driver (special-token partition), token pieces and streaming decode.
 * The algorithms live in tok_spm.c (SentencePiece, model "llama") and
 * tok_bpe.c (BPE with merges, models "gpt2" and "gemma4").  Any other
 * tokenizer.ggml.model, or a tokenizer.ggml.pre tok_bpe.c does not know,
 * is refused at creation with the value named.
 *
 * Validation (every failure is an error naming the key, never an abort):
 *   tokens: a non-empty array of strings (<= TOK_MAX_VOCAB, each
 *   <= TOK_MAX_TOKEN_LEN bytes); scores / token_type, when present, arrays
 *   of float32 / int32 of the same length, types in 0..6 (0 = normal);
 *   bos/eos/eot/eom/unknown/padding ids, when present, in [0, n_vocab);
 *   merges as described in tok_bpe.c.
 *
 * Special tokens: CONTROL and UNKNOWN tokens are recognised in text only
 * with parse_special; USER_DEFINED tokens (added vocabulary) always, as
 * llama.cpp and HF tokenizers do.  At each position the longest special
 * token wins.  For "llama" vocabularies a text fragment at the start or
 * right after a special token gets the U+2581 space prefix (llama.cpp).
 *
 * Decoding: pieces are precomputed at creation (byte tokens -> the byte,
 * gpt2 byte-level characters -> bytes, U+2581 -> ' ' for SentencePiece and
 * gemma4, control/user tokens -> their text).  The stream decoder emits only valid UTF-8: it holds an
 * incomplete sequence back and replaces invalid bytes with U+FFFD (one per
 * maximal invalid subpart).
 */
#include "text/tokenizer.h"
#include "text/tok_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* tokenizer.ggml.model -> kind.  "gemma4" is BPE with merges over raw
 * UTF-8 and always the "gemma4" pre-tokenizer (llama.cpp ignores
 * tokenizer.ggml.pre for it); *pre gets that name, else NULL. */
static int load_kind(tokenizer *t, const gguf_ctx *g, const char **pre, kvant_err *err)
{
    gguf_str model;
    int rc = gguf_get_str(g, "tokenizer.ggml.model", &model, err);
    if (rc)
        return rc;
    *pre = NULL;
    if (gguf_str_eq(model, "llama")) {
        t->kind = TOK_KIND_SPM;
    } else if (gguf_str_eq(model, "gpt2")) {
        t->kind = TOK_KIND_BPE;
    } else if (gguf_str_eq(model, "gemma4")) {
        t->kind = TOK_KIND_BPE;
        *pre = "gemma4";
    } else {
        return kvant_err_set(err, KV_EUNSUP, "tokenizer.ggml.model: unsupported tokenizer '%.*s'",
                             (int)(model.len > 64 ? 64 : model.len), model.ptr);
    }
    return KV_OK;
}

/* Finds an optional array key of the given element type and length n. */
static int opt_array(const gguf_ctx *g, const char *key, gguf_type et, uint64_t n, const void **data,
                     kvant_err *err)
{
    *data = NULL;
    int64_t ki = gguf_find_key(g, key);
    if (ki < 0)
        return KV_OK;
    if (gguf_kv_type(g, ki) != GGUF_TYPE_ARRAY || gguf_arr_type(g, ki) != et)
        return kvant_err_set(err, KV_EFORMAT, "%s: expected an array of %s", key, gguf_type_name(et));
    if (gguf_arr_n(g, ki) != n)
        return kvant_err_set(err, KV_EFORMAT, "%s: %llu entries but %llu tokens", key,
                             (unsigned long long)gguf_arr_n(g, ki), (unsigned long long)n);
    *data = gguf_arr_data(g, ki);
    if (!*data && n)
        return kvant_err_set(err, KV_EFORMAT, "%s: no data", key);
    return KV_OK;
}

static int load_attrs(tokenizer *t, const gguf_ctx *g, kvant_err *err)
{
    uint64_t n = (uint64_t)t->n_vocab;
    const void *sc, *ty;
    int rc = opt_array(g, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, n, &sc, err);
    if (rc || (rc = opt_array(g, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, n, &ty, err)))
        return rc;
    if (sc)
        memcpy(t->scores, sc, n * sizeof(float)); /* the mapping may be unaligned */
    for (uint64_t i = 0; i < n; i++) {
        int32_t v = TOK_NORMAL;
        if (ty)
            memcpy(&v, (const char *)ty + i * 4, 4);
        if (v == 0)
            v = TOK_NORMAL; /* "undefined" in older converters */
        if (v < TOK_NORMAL || v > TOK_BYTE)
            return kvant_err_set(err, KV_EFORMAT, "tokenizer.ggml.token_type[%llu]: invalid type %d",
                                 (unsigned long long)i, (int)v);
        t->attr[i] = (uint8_t)v;
    }
    return KV_OK;
}

static int load_tokens(tokenizer *t, const gguf_ctx *g, kvant_err *err)
{
    int64_t ki = gguf_find_key(g, "tokenizer.ggml.tokens");
    if (ki < 0)
        return kvant_err_set(err, KV_EFORMAT, "tokenizer.ggml.tokens: missing");
    if (gguf_kv_type(g, ki) != GGUF_TYPE_ARRAY || gguf_arr_type(g, ki) != GGUF_TYPE_STRING)
        return kvant_err_set(err, KV_EFORMAT, "tokenizer.ggml.tokens: not an array of strings");
    uint64_t n = gguf_arr_n(g, ki);
    if (n == 0 || n > TOK_MAX_VOCAB)
        return kvant_err_set(err, KV_EFORMAT, "tokenizer.ggml.tokens: %llu tokens (allowed 1..%d)",
                             (unsigned long long)n, TOK_MAX_VOCAB);
    uint64_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        gguf_str s = gguf_arr_str(g, ki, i);
        if (s.len > TOK_MAX_TOKEN_LEN || (!s.ptr && s.len))
            return kvant_err_set(err, KV_EFORMAT, "tokenizer.ggml.tokens[%llu]: %llu bytes (limit %d)",
                                 (unsigned long long)i, (unsigned long long)s.len, TOK_MAX_TOKEN_LEN);
        total += s.len;
    }
    if (total >= UINT32_MAX)
        return kvant_err_set(err, KV_EFORMAT, "tokenizer.ggml.tokens: %llu bytes in total",
                             (unsigned long long)total);
    t->n_vocab = (int32_t)n;
    t->text = malloc(total + 1);
    t->piece = malloc(total + 1);
    t->text_off = malloc(n * sizeof *t->text_off);
    t->text_len = malloc(n * sizeof *t->text_len);
    t->piece_off = malloc(n * sizeof *t->piece_off);
    t->piece_len = malloc(n * sizeof *t->piece_len);
    t->scores = calloc(n, sizeof *t->scores);
    t->attr = malloc(n);
    if (!t->text || !t->piece || !t->text_off || !t->text_len || !t->piece_off || !t->piece_len ||
        !t->scores || !t->attr)
        return kvant_err_set(err, KV_ENOMEM, "tokenizer: out of memory for %llu tokens",
                             (unsigned long long)n);
    uint32_t off = 0;
    for (uint64_t i = 0; i < n; i++) {
        gguf_str s = gguf_arr_str(g, ki, i);
        if (s.len)
            memcpy(t->text + off, s.ptr, s.len);
        t->text_off[i] = off;
        t->text_len[i] = (uint32_t)s.len;
        off += (uint32_t)s.len;
    }
    return load_attrs(t, g, err);
}

/* Optional token id key: def when absent, error when out of range. */
static int get_id(const tokenizer *t, const gguf_ctx *g, const char *key, int32_t def, int32_t *out,
                  kvant_err *err)
{
    *out = def;
    if (gguf_find_key(g, key) < 0)
        return KV_OK;
    int64_t v;
    int rc = gguf_get_i64(g, key, &v, err);
    if (rc)
        return rc;
    if (v < 0 || v >= t->n_vocab)
        return kvant_err_set(err, KV_EFORMAT, "%s: token id %lld out of range [0, %d)", key, (long long)v,
                             t->n_vocab);
    *out = (int32_t)v;
    return KV_OK;
}

static int32_t find_special_text(const tokenizer *t, const char *s)
{
    int32_t id = tok_strmap_find(&t->vocab, t, s, strlen(s));
    if (id >= 0 && (t->attr[id] == TOK_CONTROL || t->attr[id] == TOK_USER_DEFINED))
        return id;
    return -1;
}

static void add_eog(tokenizer *t, int32_t id)
{
    if (id < 0)
        return;
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id)
            return;
    if (t->n_eog < TOK_MAX_EOG)
        t->eog[t->n_eog++] = id;
}

/* An end-of-generation token found by its text is made CONTROL, as
 * llama.cpp does (Gemma 4's "<|tool_response>" is USER_DEFINED in the
 * file): it is then read from text only with parse_special. */
static void add_eog_text(tokenizer *t, const char *text)
{
    int32_t id = find_special_text(t, text);
    if (id >= 0) {
        t->attr[id] = TOK_CONTROL;
        add_eog(t, id);
    }
}

static int load_special_ids(tokenizer *t, const gguf_ctx *g, kvant_err *err)
{
    /* a subset of llama.cpp's end-of-generation texts: Llama 3, Qwen, Phi-3
     * ("</s>" is USER_DEFINED in its file), Gemma 2/3 and Gemma 4 ("<turn|>",
     * "<|tool_response>") */
    static const char *const eot_texts[] = {"<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<turn|>"};
    static const char *const eog_texts[] = {"<|eom_id|>", "<|endoftext|>", "<|end_of_text|>",
                                            "<|tool_response>", "</s>"};
    int spm = t->kind == TOK_KIND_SPM;
    int32_t eom;
    int rc;
    /* llama.cpp's SentencePiece defaults: <unk> = 0, <s> = 1, </s> = 2 */
    if ((rc = get_id(t, g, "tokenizer.ggml.bos_token_id", spm && t->n_vocab > 2 ? 1 : -1, &t->bos, err)) ||
        (rc = get_id(t, g, "tokenizer.ggml.eos_token_id", spm && t->n_vocab > 2 ? 2 : -1, &t->eos, err)) ||
        (rc = get_id(t, g, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, &t->unk, err)) ||
        (rc = get_id(t, g, "tokenizer.ggml.padding_token_id", -1, &t->pad, err)) ||
        (rc = get_id(t, g, "tokenizer.ggml.eot_token_id", -1, &t->eot, err)) ||
        (rc = get_id(t, g, "tokenizer.ggml.eom_token_id", -1, &eom, err)))
        return rc;
    if ((rc = gguf_get_bool_or(g, "tokenizer.ggml.add_bos_token", spm, &t->add_bos, err)) ||
        (rc = gguf_get_bool_or(g, "tokenizer.ggml.add_space_prefix", spm, &t->add_space_prefix, err)))
        return rc;
    for (size_t i = 0; t->eot < 0 && i < sizeof eot_texts / sizeof eot_texts[0]; i++)
        t->eot = find_special_text(t, eot_texts[i]);
    add_eog(t, t->eos);
    add_eog(t, t->eot);
    add_eog(t, eom);
    for (size_t i = 0; i < sizeof eot_texts / sizeof eot_texts[0]; i++)
        add_eog_text(t, eot_texts[i]);
    /* llama.cpp: where "<|tool_response>" ends generation (Gemma 4), "</s>" is an ordinary token */
    int s_is_text = find_special_text(t, "<|tool_response>") >= 0;
    for (size_t i = 0; i < sizeof eog_texts / sizeof eog_texts[0]; i++)
        if (!(s_is_text && strcmp(eog_texts[i], "</s>") == 0))
            add_eog_text(t, eog_texts[i]);
    return KV_OK;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* "<0xXX>" -> byte value, or -1. */
static int byte_token_value(const char *s, uint32_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    int hi = hexval(s[3]), lo = hexval(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* Decoded bytes of token id into dst (never longer than its text). */
static uint32_t decode_text(const tokenizer *t, int32_t id, const int16_t *inv, char *dst)
{
    uint32_t n;
    const char *s = tok_text(t, id, &n);
    int a = t->attr[id];
    if (a == TOK_BYTE && byte_token_value(s, n) >= 0) {
        dst[0] = (char)byte_token_value(s, n);
        return 1;
    }
    if (a == TOK_CONTROL || a == TOK_USER_DEFINED || a == TOK_UNKNOWN) {
        memcpy(dst, s, n);
        return n;
    }
    uint32_t m = 0;
    for (uint32_t i = 0; i < n;) {
        int cl = tok_utf8_check((const unsigned char *)s + i, n - i);
        uint32_t cp = 0;
        if (cl > 0)
            tok_utf8_get((const unsigned char *)s + i, &cp);
        else
            cl = 1;
        if (t->escape_ws && cp == 0x2581)
            dst[m++] = ' ';
        else if (t->byte_level && cp < 0x144 && inv[cp] >= 0)
            dst[m++] = (char)inv[cp];
        else {
            memcpy(dst + m, s + i, (size_t)cl);
            m += (uint32_t)cl;
        }
        i += (uint32_t)cl;
    }
    return m;
}

static void build_pieces(tokenizer *t)
{
    int16_t inv[0x144];
    for (int i = 0; i < 0x144; i++)
        inv[i] = -1;
    for (int b = 0; b < 256; b++)
        inv[tok_byte_to_cp((uint8_t)b)] = (int16_t)b;
    uint32_t off = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        t->piece_off[id] = off;
        t->piece_len[id] = decode_text(t, id, inv, t->piece + off);
        off += t->piece_len[id];
    }
}

typedef struct special_key {
    unsigned char first;
    uint32_t len;
    int32_t id;
} special_key;

static int special_cmp(const void *a, const void *b)
{
    const special_key *x = a, *y = b;
    if (x->first != y->first)
        return x->first < y->first ? -1 : 1;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int build_specials(tokenizer *t, kvant_err *err)
{
    int32_t n = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        int a = t->attr[id];
        n += (a == TOK_CONTROL || a == TOK_USER_DEFINED || a == TOK_UNKNOWN) && t->text_len[id] > 0;
    }
    special_key *keys = malloc((size_t)(n ? n : 1) * sizeof *keys);
    t->special = malloc((size_t)(n ? n : 1) * sizeof *t->special);
    if (!keys || !t->special) {
        free(keys);
        return kvant_err_set(err, KV_ENOMEM, "tokenizer: out of memory");
    }
    int32_t k = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        int a = t->attr[id];
        if ((a == TOK_CONTROL || a == TOK_USER_DEFINED || a == TOK_UNKNOWN) && t->text_len[id] > 0)
            keys[k++] = (special_key){(unsigned char)t->text[t->text_off[id]], t->text_len[id], id};
    }
    qsort(keys, (size_t)n, sizeof *keys, special_cmp);
    memset(t->special_start, 0, sizeof t->special_start);
    for (int32_t i = 0; i < n; i++) {
        t->special[i] = keys[i].id;
        t->special_start[keys[i].first + 1]++;
    }
    for (int b = 0; b < 256; b++)
        t->special_start[b + 1] += t->special_start[b];
    free(keys);
    return KV_OK;
}

tokenizer *tok_create(const gguf_ctx *g, kvant_err *err)
{
    if (!g) {
        kvant_err_set(err, KV_EINVAL, "tok_create: no model");
        return NULL;
    }
    tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        kvant_err_set(err, KV_ENOMEM, "tokenizer: out of memory");
        return NULL;
    }
    t->bos = t->eos = t->eot = t->unk = t->pad = -1;
    const char *pre;
    int rc = load_kind(t, g, &pre, err);
    if (!rc)
        rc = load_tokens(t, g, err);
    if (!rc && tok_strmap_build(&t->vocab, t))
        rc = kvant_err_set(err, KV_ENOMEM, "tokenizer: out of memory");
    if (!rc)
        rc = load_special_ids(t, g, err);
    if (!rc) {
        if (t->kind == TOK_KIND_BPE) {
            rc = tok_bpe_init(t, g, pre, err);
        } else {
            t->escape_ws = 1;
            tok_map_hex_bytes(t);
        }
    }
    if (!rc)
        rc = build_specials(t, err);
    if (rc) {
        tok_destroy(t);
        return NULL;
    }
    build_pieces(t);
    return t;
}

void tok_destroy(tokenizer *t)
{
    if (!t)
        return;
    tok_bpe_free(t);
    tok_strmap_free(&t->vocab);
    free(t->text);
    free(t->text_off);
    free(t->text_len);
    free(t->piece);
    free(t->piece_off);
    free(t->piece_len);
    free(t->scores);
    free(t->attr);
    free(t->special);
    free(t);
}

int32_t tok_n_vocab(const tokenizer *t) { return t->n_vocab; }
int32_t tok_bos(const tokenizer *t) { return t->bos; }
int32_t tok_eos(const tokenizer *t) { return t->eos; }
int32_t tok_eot(const tokenizer *t) { return t->eot; }
int tok_add_bos(const tokenizer *t) { return t->add_bos; }

int tok_is_eog(const tokenizer *t, int32_t id)
{
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id)
            return 1;
    return 0;
}

int tok_attr_of(const tokenizer *t, int32_t id)
{
    if (id < 0 || id >= t->n_vocab)
        return KV_ERANGE;
    return t->attr[id];
}

/* ---- encoding ---- */

/* Longest special token starting at s; 1 and fills id/len if any. */
static int match_special(const tokenizer *t, const char *s, size_t n, int parse_special, int32_t *id,
                         size_t *len)
{
    unsigned char b = (unsigned char)s[0];
    for (int32_t i = t->special_start[b]; i < t->special_start[b + 1]; i++) {
        int32_t sid = t->special[i];
        if (!parse_special && t->attr[sid] != TOK_USER_DEFINED)
            continue;
        uint32_t sl = t->text_len[sid];
        if (sl <= n && memcmp(s, t->text + t->text_off[sid], sl) == 0) {
            *id = sid;
            *len = sl;
            return 1;
        }
    }
    return 0;
}

static int encode_fragment(const tokenizer *t, const char *s, size_t n, int after_special, tok_out *o,
                           kvant_err *err)
{
    if (t->kind == TOK_KIND_SPM)
        return tok_spm_encode(t, s, n, t->add_space_prefix && after_special, o, err);
    return tok_bpe_encode(t, s, n, o, err);
}

int64_t tok_encode(const tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
                   int32_t *out, int64_t cap, kvant_err *err)
{
    if (!t || (!text && len) || cap < 0 || (cap > 0 && !out))
        return kvant_err_set(err, KV_EINVAL, "tok_encode: invalid arguments");
    tok_out o = {out, cap, 0};
    if (add_bos && t->bos >= 0)
        tok_out_push(&o, t->bos);
    int after_special = 1, rc;
    size_t seg = 0;
    for (size_t i = 0; i < len;) {
        int32_t id;
        size_t ml;
        if (!match_special(t, text + i, len - i, parse_special, &id, &ml)) {
            i++;
            continue;
        }
        if (i > seg) {
            if ((rc = encode_fragment(t, text + seg, i - seg, after_special, &o, err)))
                return rc;
        }
        tok_out_push(&o, id);
        after_special = 1;
        i += ml;
        seg = i;
    }
    if (seg < len && (rc = encode_fragment(t, text + seg, len - seg, after_special, &o, err)))
        return rc;
    return o.n;
}

/* ---- decoding ---- */

int tok_piece(const tokenizer *t, int32_t id, int render_special, char *buf, int cap)
{
    if (!t || id < 0 || id >= t->n_vocab)
        return KV_ERANGE;
    int a = t->attr[id];
    if (!render_special && (a == TOK_CONTROL || a == TOK_UNKNOWN))
        return 0;
    int n = (int)t->piece_len[id];
    if (n <= cap && n > 0)
        memcpy(buf, t->piece + t->piece_off[id], (size_t)n);
    return n;
}

void tok_stream_init(tok_stream *s)
{
    memset(s, 0, sizeof *s);
}

static const char REPLACEMENT[3] = {'\xEF', '\xBF', '\xBD'}; /* U+FFFD */

/* Appends src to the stream state; writes complete sequences to out.
 * Returns bytes written or KV_ERANGE if out is too small. */
static int stream_push(tok_stream *s, const char *src, size_t n, char *out, int cap)
{
    int w = 0;
    for (size_t i = 0; i < n; i++) {
        s->pending[s->n_pending++] = src[i];
        for (;;) {
            int r = tok_utf8_check((const unsigned char *)s->pending, (size_t)s->n_pending);
            if (r == 0)
                break; /* incomplete: wait for more bytes */
            int drop = r > 0 ? r : (s->n_pending > 1 ? s->n_pending - 1 : 1);
            const char *emit = r > 0 ? s->pending : REPLACEMENT;
            int elen = r > 0 ? r : 3;
            if (w + elen > cap)
                return KV_ERANGE;
            memcpy(out + w, emit, (size_t)elen);
            w += elen;
            memmove(s->pending, s->pending + drop, (size_t)(s->n_pending - drop));
            s->n_pending -= drop;
            if (s->n_pending == 0)
                break;
        }
    }
    return w;
}

int tok_stream_feed(const tokenizer *t, tok_stream *s, int32_t id, char *out, int cap)
{
    if (!t || !s || id < 0 || id >= t->n_vocab || cap < 0 || s->n_pending < 0 || s->n_pending > 3)
        return KV_EINVAL;
    int a = t->attr[id];
    if (a == TOK_CONTROL || a == TOK_UNKNOWN)
        return 0;
    tok_stream tmp = *s; /* commit only on success */
    int w = stream_push(&tmp, t->piece + t->piece_off[id], t->piece_len[id], out, cap);
    if (w >= 0)
        *s = tmp;
    return w;
}

int tok_stream_flush(tok_stream *s, char *out, int cap)
{
    if (!s || s->n_pending < 0 || s->n_pending > 3)
        return KV_EINVAL;
    if (s->n_pending == 0)
        return 0;
    if (cap < 3)
        return KV_ERANGE;
    memcpy(out, REPLACEMENT, 3); /* a held sequence is a valid but incomplete prefix */
    s->n_pending = 0;
    return 3;
}

char *tok_decode(const tokenizer *t, const int32_t *ids, int64_t n, int render_special)
{
    if (!t || n < 0 || (n > 0 && !ids))
        return NULL;
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        int k = tok_piece(t, ids[i], render_special, NULL, 0);
        if (k < 0)
            return NULL;
        total += (size_t)k;
    }
    char *s = malloc(total + 1);
    if (!s)
        return NULL;
    size_t w = 0;
    int strip = t->kind == TOK_KIND_SPM && t->add_space_prefix; /* undo tok_encode's prefix */
    for (int64_t i = 0; i < n; i++) {
        int k = tok_piece(t, ids[i], render_special, s + w, (int)(total - w));
        if (strip && k > 0) {
            strip = 0;
            if (s[w] == ' ') {
                memmove(s + w, s + w + 1, (size_t)k - 1);
                k--;
            }
        }
        w += (size_t)k;
    }
    s[w] = '\0';
    return s;
}

int32_t tok_max_piece_bytes(const tokenizer *t)
{
    char buf[512];
    int32_t best = 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        int L = tok_piece(t, id, 1, buf, sizeof buf);
        if (L > best)
            best = L; /* a piece over the buffer returns its whole length */
    }
    return best;
}
