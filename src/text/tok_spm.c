/* tok_spm.c - SentencePiece-style BPE with scores (tokenizer.ggml.model =
 * "llama"), following llama.cpp's llm_tokenizer_spm:
 *   1. spaces become U+2581 and, with space_prefix, one U+2581 is prepended;
 *   2. the text is split into UTF-8 characters (an invalid byte is a
 *      symbol of its own);
 *   3. repeatedly merge the adjacent pair whose concatenation is a token
 *      with the highest score (ties: leftmost), using a max-heap whose
 *      stale entries are skipped when popped;
 *   4. each final symbol is its token, or else byte fallback: one <0xXX>
 *      token per byte (the unknown token if the vocabulary lacks it).
 * Work per segment is O(n log n); scratch memory is per call.
 */
#include "text/tok_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct spm_sym {
    int32_t start, n;   /* byte span in the normalised text; n == 0: merged away */
    int32_t prev, next; /* neighbours in the live list, -1 at the ends */
} spm_sym;

typedef struct spm_bigram {
    float score;
    int32_t left, right;
    int32_t size; /* bytes of left + right when queued (stale check) */
} spm_bigram;

typedef struct spm_heap {
    spm_bigram *a;
    size_t n, cap;
} spm_heap;

/* a outranks b: higher score, then smaller left position. */
static int bigram_before(const spm_bigram *a, const spm_bigram *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static int heap_push(spm_heap *h, spm_bigram v)
{
    if (h->n == h->cap) {
        size_t nc = h->cap ? h->cap * 2 : 64;
        spm_bigram *na = realloc(h->a, nc * sizeof *na);
        if (!na)
            return KV_ENOMEM;
        h->a = na;
        h->cap = nc;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bigram_before(&v, &h->a[p]))
            break;
        h->a[i] = h->a[p];
        i = p;
    }
    h->a[i] = v;
    return KV_OK;
}

static spm_bigram heap_pop(spm_heap *h)
{
    spm_bigram top = h->a[0], last = h->a[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && bigram_before(&h->a[c + 1], &h->a[c]))
            c++;
        if (!bigram_before(&h->a[c], &last))
            break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (h->n)
        h->a[i] = last;
    return top;
}

typedef struct spm_session {
    const tokenizer *t;
    const char *s; /* normalised text */
    spm_sym *sym;
    spm_heap heap;
} spm_session;

static int try_add_bigram(spm_session *ss, int32_t left, int32_t right)
{
    if (left < 0 || right < 0)
        return KV_OK;
    const spm_sym *l = &ss->sym[left], *r = &ss->sym[right];
    int32_t size = l->n + r->n;
    int32_t id = tok_strmap_find(&ss->t->vocab, ss->t, ss->s + l->start, (size_t)size);
    if (id < 0)
        return KV_OK;
    spm_bigram b = {ss->t->scores[id], left, right, size};
    return heap_push(&ss->heap, b);
}

static void resegment(const spm_session *ss, const spm_sym *sym, tok_out *out)
{
    const tokenizer *t = ss->t;
    int32_t id = tok_strmap_find(&t->vocab, t, ss->s + sym->start, (size_t)sym->n);
    if (id >= 0) {
        tok_out_push(out, id);
        return;
    }
    for (int32_t j = 0; j < sym->n; j++) {
        int32_t b = t->byte_tok[(unsigned char)ss->s[sym->start + j]];
        if (b < 0)
            b = t->unk;
        if (b >= 0)
            tok_out_push(out, b);
    }
}

/* Replaces ' ' by U+2581 and optionally prepends one.  Returns the new
 * length; dst holds at least 3 * len + 3 bytes. */
static size_t spm_normalise(const char *text, size_t len, int space_prefix, char *dst)
{
    static const char sp[3] = {'\xE2', '\x96', '\x81'};
    size_t n = 0;
    if (space_prefix) {
        memcpy(dst, sp, 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(dst + n, sp, 3);
            n += 3;
        } else {
            dst[n++] = text[i];
        }
    }
    return n;
}

static int spm_merge_loop(spm_session *ss, int32_t n_sym)
{
    for (int32_t i = 1; i < n_sym; i++)
        if (try_add_bigram(ss, i - 1, i))
            return KV_ENOMEM;
    while (ss->heap.n) {
        spm_bigram b = heap_pop(&ss->heap);
        spm_sym *l = &ss->sym[b.left], *r = &ss->sym[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size)
            continue; /* stale: one side already merged differently */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            ss->sym[r->next].prev = b.left;
        if (try_add_bigram(ss, l->prev, b.left) || try_add_bigram(ss, b.left, l->next))
            return KV_ENOMEM;
    }
    return KV_OK;
}

int tok_spm_encode(const tokenizer *t, const char *text, size_t len, int space_prefix,
                   tok_out *out, kvant_err *err)
{
    if (len > (size_t)INT32_MAX / 4)
        return kvant_err_set(err, KV_ERANGE, "tokenizer: text of %zu bytes is too long", len);
    char *norm = malloc(3 * len + 3);
    spm_sym *sym = malloc((3 * len + 3) * sizeof *sym);
    if (!norm || !sym) {
        free(norm);
        free(sym);
        return kvant_err_set(err, KV_ENOMEM, "tokenizer: out of memory");
    }
    size_t n = spm_normalise(text, len, space_prefix, norm);
    int32_t n_sym = 0;
    for (size_t off = 0; off < n;) {
        /* llama.cpp trusts the lead byte; kvant makes an invalid byte a
         * symbol of its own (same result on valid UTF-8, and invalid input
         * still round-trips through byte fallback) */
        int cl = tok_utf8_check((const unsigned char *)norm + off, n - off);
        size_t l = cl > 0 ? (size_t)cl : 1;
        sym[n_sym] = (spm_sym){(int32_t)off, (int32_t)l, n_sym - 1, off + l == n ? -1 : n_sym + 1};
        n_sym++;
        off += l;
    }
    spm_session ss = {t, norm, sym, {NULL, 0, 0}};
    int rc = spm_merge_loop(&ss, n_sym);
    if (rc == KV_OK && n_sym > 0)
        for (int32_t i = 0; i != -1; i = sym[i].next)
            resegment(&ss, &sym[i], out);
    free(ss.heap.a);
    free(sym);
    free(norm);
    if (rc)
        return kvant_err_set(err, rc, "tokenizer: out of memory");
    return KV_OK;
}
