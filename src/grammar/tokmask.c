/* tokmask.c - the vocabulary trie and the mask walk (tokmask.h).
 *
 * The trie's nodes lie in breadth-first order, so a node's children are
 * contiguous (child_first .. + n_child) and sorted by byte.  order[] holds
 * the token ids sorted by their bytes; the tokens whose bytes end at a node
 * are order[tok_first .. + n_tok).
 */
#include "grammar/tokmask.h"

#include <stdlib.h>
#include <string.h>

typedef struct trie_node {
    int32_t child_first, n_child;
    int32_t tok_first, n_tok;
    int32_t lo, hi;   /* order[lo..hi): the tokens below (build only) */
    uint8_t byte;
} trie_node;

struct tmask_vocab {
    int32_t n_vocab, n_eos, max_len;
    uint8_t *bytes;       /* every token's bytes, concatenated */
    int64_t *off;         /* [n_vocab + 1] */
    int32_t *order;       /* [n_in_trie] ids sorted by bytes */
    int32_t *eos;         /* [n_eos] */
    trie_node *nodes;
    int32_t n_nodes;
};

static int cmp_tok(const void *a, const void *b, void *ctx)
{
    const tmask_vocab *v = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    int64_t lx = v->off[x + 1] - v->off[x], ly = v->off[y + 1] - v->off[y];
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], (size_t)(lx < ly ? lx : ly));
    if (c)
        return c;
    if (lx != ly)
        return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int32_t tok_len(const tmask_vocab *v, int32_t id)
{
    return (int32_t)(v->off[id + 1] - v->off[id]);
}

/* Breadth-first: node i covers order[lo..hi) whose bytes share the first
 * depth(i) bytes; tokens of exactly that length come first. */
static int build_trie(tmask_vocab *v, int32_t n_in)
{
    int32_t cap = 1024;
    v->nodes = malloc((size_t)cap * sizeof *v->nodes);
    int32_t *depth = malloc((size_t)cap * sizeof *depth);
    if (!v->nodes || !depth) {
        free(depth);
        return -1;
    }
    v->nodes[0] = (trie_node){.lo = 0, .hi = n_in};
    depth[0] = 0;
    v->n_nodes = 1;
    for (int32_t i = 0; i < v->n_nodes; i++) {
        trie_node *nd = &v->nodes[i];
        int32_t d = depth[i], j = nd->lo;
        while (j < nd->hi && tok_len(v, v->order[j]) == d)
            j++;
        nd->tok_first = nd->lo;
        nd->n_tok = j - nd->lo;
        nd->child_first = v->n_nodes;
        nd->n_child = 0;
        int32_t hi = nd->hi;
        while (j < hi) {
            uint8_t b = v->bytes[v->off[v->order[j]] + d];
            int32_t k = j;
            while (k < hi && v->bytes[v->off[v->order[k]] + d] == b)
                k++;
            if (v->n_nodes == cap) {
                cap *= 2;
                trie_node *nn = realloc(v->nodes, (size_t)cap * sizeof *nn);
                int32_t *ndp = realloc(depth, (size_t)cap * sizeof *ndp);
                if (nn)
                    v->nodes = nn;
                if (ndp)
                    depth = ndp;
                if (!nn || !ndp) {
                    free(depth);
                    return -1;
                }
                nd = &v->nodes[i];
            }
            v->nodes[v->n_nodes] = (trie_node){.lo = j, .hi = k, .byte = b};
            depth[v->n_nodes++] = d + 1;
            nd->n_child++;
            j = k;
        }
    }
    free(depth);
    return 0;
}

tmask_vocab *tmask_vocab_create(const uint8_t *const *tok, const int32_t *len, int32_t n_vocab,
                                const int32_t *eos, int32_t n_eos, kvant_err *err)
{
    if (n_vocab <= 0 || n_eos < 0) {
        kvant_err_set(err, KV_EINVAL, "vocabulary: %d tokens, %d end ids", n_vocab, n_eos);
        return NULL;
    }
    tmask_vocab *v = calloc(1, sizeof *v);
    if (!v)
        goto oom;
    v->n_vocab = n_vocab;
    v->off = malloc(((size_t)n_vocab + 1) * sizeof *v->off);
    v->order = malloc((size_t)n_vocab * sizeof *v->order);
    v->eos = malloc((size_t)(n_eos ? n_eos : 1) * sizeof *v->eos);
    if (!v->off || !v->order || !v->eos)
        goto oom;
    v->off[0] = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        if (len[i] < 0 || len[i] > TMASK_MAX_TOKEN_BYTES) {
            kvant_err_set(err, KV_ERANGE, "vocabulary: token %d has %d bytes (limit %d)", i,
                          len[i], TMASK_MAX_TOKEN_BYTES);
            tmask_vocab_destroy(v);
            return NULL;
        }
        v->off[i + 1] = v->off[i] + len[i];
        if (len[i] > v->max_len)
            v->max_len = len[i];
    }
    v->bytes = malloc((size_t)(v->off[n_vocab] ? v->off[n_vocab] : 1));
    if (!v->bytes)
        goto oom;
    int32_t n_in = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        if (len[i])
            memcpy(v->bytes + v->off[i], tok[i], (size_t)len[i]);
        if (len[i])
            v->order[n_in++] = i;
    }
    for (int32_t i = 0; i < n_eos; i++) {
        if (eos[i] < 0 || eos[i] >= n_vocab) {
            kvant_err_set(err, KV_EINVAL, "vocabulary: end id %d out of range", eos[i]);
            tmask_vocab_destroy(v);
            return NULL;
        }
        v->eos[v->n_eos++] = eos[i];
    }
    qsort_r(v->order, (size_t)n_in, sizeof *v->order, cmp_tok, v);
    if (build_trie(v, n_in))
        goto oom;
    return v;
oom:
    tmask_vocab_destroy(v);
    kvant_err_set(err, KV_ENOMEM, "out of memory building the token trie");
    return NULL;
}

tmask_vocab *tmask_vocab_from_tok(const tokenizer *t, kvant_err *err)
{
    int32_t n = tok_n_vocab(t);
    if (n <= 0) {
        kvant_err_set(err, KV_EINVAL, "vocabulary: %d tokens", n);
        return NULL;
    }
    uint8_t **toks = calloc((size_t)n, sizeof *toks);
    int32_t *len = calloc((size_t)n, sizeof *len);
    tmask_vocab *v = NULL;
    char buf[TMASK_MAX_TOKEN_BYTES];
    if (!toks || !len) {
        kvant_err_set(err, KV_ENOMEM, "out of memory reading the vocabulary");
        goto out;
    }
    for (int32_t i = 0; i < n; i++) {
        int l = tok_piece(t, i, 0, buf, (int)sizeof buf);
        if (l < 0 || l > (int)sizeof buf) {
            kvant_err_set(err, KV_ERANGE, "vocabulary: token %d too long (limit %d bytes)", i,
                          TMASK_MAX_TOKEN_BYTES);
            goto out;
        }
        if (l > 0 && !(toks[i] = malloc((size_t)l))) {
            kvant_err_set(err, KV_ENOMEM, "out of memory reading the vocabulary");
            goto out;
        }
        if (l > 0)
            memcpy(toks[i], buf, (size_t)l);
        len[i] = l;
    }
    int32_t eos[2], n_eos = 0;
    if (tok_eos(t) >= 0)
        eos[n_eos++] = tok_eos(t);
    if (tok_eot(t) >= 0 && tok_eot(t) != tok_eos(t))
        eos[n_eos++] = tok_eot(t);
    v = tmask_vocab_create((const uint8_t *const *)toks, len, n, eos, n_eos, err);
out:
    for (int32_t i = 0; toks && i < n; i++)
        free(toks[i]);
    free(toks);
    free(len);
    return v;
}

void tmask_vocab_destroy(tmask_vocab *v)
{
    if (!v)
        return;
    free(v->bytes);
    free(v->off);
    free(v->order);
    free(v->eos);
    free(v->nodes);
    free(v);
}

int32_t tmask_n_vocab(const tmask_vocab *v)
{
    return v->n_vocab;
}

int32_t tmask_n_words(const tmask_vocab *v)
{
    return (v->n_vocab + 31) / 32;
}

int tmask_is_eos(const tmask_vocab *v, int32_t id)
{
    for (int32_t i = 0; i < v->n_eos; i++)
        if (v->eos[i] == id)
            return 1;
    return 0;
}

const uint8_t *tmask_token(const tmask_vocab *v, int32_t id, int32_t *len)
{
    if (id < 0 || id >= v->n_vocab)
        return NULL;
    *len = tok_len(v, id);
    return v->bytes + v->off[id];
}

size_t tmask_vocab_mem_bytes(const tmask_vocab *v)
{
    return sizeof *v + (size_t)v->off[v->n_vocab] + ((size_t)v->n_vocab + 1) * sizeof(int64_t) +
           (size_t)v->n_vocab * sizeof(int32_t) + (size_t)v->n_nodes * sizeof(trie_node);
}

typedef struct walk_frame {
    int32_t node, ci;
    uint32_t allowed[8];
} walk_frame;

int32_t tmask_compute(const tmask_vocab *v, earley *e, uint32_t *mask, kvant_err *err)
{
    memset(mask, 0, (size_t)tmask_n_words(v) * sizeof *mask);
    walk_frame *st = malloc(((size_t)v->max_len + 1) * sizeof *st);
    if (!st)
        return kvant_err_set(err, KV_ENOMEM, "out of memory computing a token mask");
    int32_t d0 = earley_depth(e), sp = 0, count = 0;
    st[0].node = 0;
    st[0].ci = 0;
    earley_allowed_bytes(e, st[0].allowed);
    while (sp >= 0) {
        walk_frame *f = &st[sp];
        const trie_node *nd = &v->nodes[f->node];
        if (f->ci == nd->n_child) {
            if (sp > 0)
                earley_pop(e);
            sp--;
            continue;
        }
        int32_t c = nd->child_first + f->ci++;
        uint8_t b = v->nodes[c].byte;
        if (!(f->allowed[b >> 5] >> (b & 31) & 1))
            continue;
        int r = earley_push_byte(e, b);
        if (r < 0) {
            earley_truncate(e, d0);
            free(st);
            return kvant_err_set(err, r, "grammar state above its item limit");
        }
        if (r == 0)
            continue;
        const trie_node *cn = &v->nodes[c];
        for (int32_t i = 0; i < cn->n_tok; i++) {
            int32_t id = v->order[cn->tok_first + i];
            mask[id >> 5] |= 1u << (id & 31);
            count++;
        }
        if (cn->n_child) {
            sp++;
            st[sp].node = c;
            st[sp].ci = 0;
            earley_allowed_bytes(e, st[sp].allowed);
        } else {
            earley_pop(e);
        }
    }
    free(st);
    if (earley_accepting(e))
        for (int32_t i = 0; i < v->n_eos; i++) {
            int32_t id = v->eos[i];
            if (!(mask[id >> 5] >> (id & 31) & 1))
                count++;
            mask[id >> 5] |= 1u << (id & 31);
        }
    return count;
}

int tmask_advance(const tmask_vocab *v, earley *e, int32_t id)
{
    if (id < 0 || id >= v->n_vocab)
        return KV_EINVAL;
    if (tmask_is_eos(v, id))
        return earley_accepting(e);
    int32_t n = tok_len(v, id);
    if (n == 0)
        return 0;
    return earley_push_bytes(e, v->bytes + v->off[id], (size_t)n);
}
