/* tmvocab.c - the vocabulary trie and its run masks (tmvocab.h). */
#include "grammar/tmvocab.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>


/* The tokens whose first byte is in first and every further byte in rest. */
typedef struct run_mask {
    uint32_t first[8], rest[8];
    int32_t max_rest, count;
    uint32_t *mask;       /* [n_words] */
} run_mask;

struct tmask_vocab {
    pthread_mutex_t mu;   /* guards runs[], the one part that changes after creation */
    run_mask runs[TMASK_RUN_MASKS];
    int32_t n_runs, run_hand;
    int32_t n_vocab, n_eos, max_len;
    uint8_t *bytes;       /* every token's bytes, concatenated */
    int64_t *off;         /* [n_vocab + 1] */
    int32_t *order;       /* [n_in_trie] ids sorted by bytes */
    int32_t *eos;         /* [n_eos] */
    tmvocab_node *nodes;
    uint32_t *below;      /* [n_nodes][8] the bytes after the node's in tokens below it */
    int32_t n_nodes;
    tmvocab_trie trie;    /* the view the walk reads */
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
    v->nodes[0] = (tmvocab_node){.lo = 0, .hi = n_in};
    depth[0] = 0;
    v->n_nodes = 1;
    for (int32_t i = 0; i < v->n_nodes; i++) {
        tmvocab_node *nd = &v->nodes[i];
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
                tmvocab_node *nn = realloc(v->nodes, (size_t)cap * sizeof *nn);
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
            v->nodes[v->n_nodes] = (tmvocab_node){.lo = j, .hi = k, .byte = b};
            depth[v->n_nodes++] = d + 1;
            nd->n_child++;
            j = k;
        }
    }
    free(depth);
    v->below = calloc((size_t)v->n_nodes * 8, sizeof *v->below);
    if (!v->below)
        return -1;
    for (int32_t i = v->n_nodes - 1; i >= 0; i--) {   /* children come after parents */
        const tmvocab_node *nd = &v->nodes[i];
        uint32_t *bl = v->below + 8 * (size_t)i;
        for (int32_t c = nd->child_first; c < nd->child_first + nd->n_child; c++) {
            const uint32_t *cb = v->below + 8 * (size_t)c;
            for (int k = 0; k < 8; k++)
                bl[k] |= cb[k];
            bl[v->nodes[c].byte >> 5] |= 1u << (v->nodes[c].byte & 31);
            if (v->nodes[c].height + 1 > v->nodes[i].height)
                v->nodes[i].height = v->nodes[c].height + 1;
        }
    }
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
    pthread_mutex_init(&v->mu, NULL);
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
    v->trie = (tmvocab_trie){.nodes = v->nodes, .below = v->below, .order = v->order,
                             .eos = v->eos, .n_nodes = v->n_nodes, .n_eos = v->n_eos,
                             .max_len = v->max_len};
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
    for (int32_t i = 0; i < v->n_runs; i++)
        free(v->runs[i].mask);
    pthread_mutex_destroy(&v->mu);
    free(v->bytes);
    free(v->off);
    free(v->order);
    free(v->eos);
    free(v->nodes);
    free(v->below);
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
           (size_t)v->n_vocab * sizeof(int32_t) +
           (size_t)v->n_nodes * (sizeof(tmvocab_node) + 8 * sizeof(uint32_t)) +
           (size_t)TMASK_RUN_MASKS * (size_t)tmask_n_words(v) * sizeof(uint32_t);
}

const tmvocab_trie *tmvocab_trie_of(const tmask_vocab *v)
{
    return &v->trie;
}

static run_mask *find_run(tmask_vocab *v, const uint32_t first[8], const uint32_t rest[8],
                          int32_t max_rest)
{
    for (int32_t i = 0; i < v->n_runs; i++)
        if (v->runs[i].max_rest == max_rest && !memcmp(v->runs[i].first, first, 32) &&
            !memcmp(v->runs[i].rest, rest, 32))
            return &v->runs[i];
    return NULL;
}

static int in_set(const uint32_t set[8], int b)
{
    return (int)(set[b >> 5] >> (b & 31) & 1);
}

/* Kept TMASK_RUN_MASKS at a time, replaced round robin. */
int32_t tmvocab_run_mask_or(const tmask_vocab *cv, const uint32_t first[8], const uint32_t rest[8],
                            int32_t max_rest, uint32_t *mask)
{
    tmask_vocab *v = (tmask_vocab *)cv;   /* only runs[] changes, under v->mu */
    int32_t nw = tmask_n_words(v), count = 0;
    pthread_mutex_lock(&v->mu);
    run_mask *hit = find_run(v, first, rest, max_rest);
    for (int32_t k = 0; hit && k < nw; k++)
        mask[k] |= hit->mask[k];
    if (hit)
        count = hit->count;
    pthread_mutex_unlock(&v->mu);
    if (hit)
        return count;
    uint32_t *nm = calloc((size_t)nw, sizeof *nm);   /* computed outside the lock */
    if (!nm)
        return -1;
    for (int32_t id = 0; id < v->n_vocab; id++) {
        int32_t len = tok_len(v, id);
        const uint8_t *b = v->bytes + v->off[id];
        int ok = len > 0 && len - 1 <= max_rest && in_set(first, b[0]);
        for (int32_t j = 1; ok && j < len; j++)
            ok = in_set(rest, b[j]);
        if (ok)
            nm[id >> 5] |= 1u << (id & 31);
        count += ok;
    }
    for (int32_t k = 0; k < nw; k++)
        mask[k] |= nm[k];
    pthread_mutex_lock(&v->mu);
    if (!find_run(v, first, rest, max_rest)) {   /* a thread that raced keeps the first */
        run_mask *r = &v->runs[v->n_runs < TMASK_RUN_MASKS ? v->n_runs++ : v->run_hand];
        if (r->mask)
            v->run_hand = (v->run_hand + 1) % TMASK_RUN_MASKS;
        free(r->mask);
        *r = (run_mask){.max_rest = max_rest, .count = count, .mask = nm};
        nm = NULL;
        memcpy(r->first, first, 32);
        memcpy(r->rest, rest, 32);
    }
    pthread_mutex_unlock(&v->mu);
    free(nm);
    return count;
}
