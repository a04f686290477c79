/* tokmask.c - the vocabulary trie and the mask walk (tokmask.h).
 *
 * The trie's nodes lie in breadth-first order, so a node's children are
 * contiguous (child_first .. + n_child) and sorted by byte.  order[] holds
 * the token ids sorted by their bytes; the tokens whose bytes end at a node
 * are order[tok_first .. + n_tok).
 */
#include "grammar/tokmask.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct trie_node {
    int32_t child_first, n_child;
    int32_t tok_first, n_tok;
    int32_t lo, hi;   /* order[lo..hi): the tokens at and below the node */
    uint8_t byte;
} trie_node;

/* The tokens whose first byte is in first and every further byte in rest. */
typedef struct run_mask {
    uint32_t first[8], rest[8];
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
    trie_node *nodes;
    uint32_t *below;      /* [n_nodes][8] the bytes after the node's in tokens below it */
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
    v->below = calloc((size_t)v->n_nodes * 8, sizeof *v->below);
    if (!v->below)
        return -1;
    for (int32_t i = v->n_nodes - 1; i >= 0; i--) {   /* children come after parents */
        const trie_node *nd = &v->nodes[i];
        uint32_t *bl = v->below + 8 * (size_t)i;
        for (int32_t c = nd->child_first; c < nd->child_first + nd->n_child; c++) {
            const uint32_t *cb = v->below + 8 * (size_t)c;
            for (int k = 0; k < 8; k++)
                bl[k] |= cb[k];
            bl[v->nodes[c].byte >> 5] |= 1u << (v->nodes[c].byte & 31);
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
           (size_t)v->n_nodes * (sizeof(trie_node) + 8 * sizeof(uint32_t)) +
           (size_t)TMASK_RUN_MASKS * (size_t)tmask_n_words(v) * sizeof(uint32_t);
}

/* One trie node on the walk's path.  state: its memo state (-1: none).
 * Its Earley set is materialized at chart depth cd (serial `serial`) or not
 * at all (cd 0): a memoized transition moves down the trie without touching
 * the chart; the set is rebuilt from its description only when a byte
 * must really be parsed from it.  A frame without a memo state always has
 * its set in the chart, and nothing below it is truncated while it is on
 * the path. */
typedef struct walk_frame {
    int32_t node, ci, state, cd;
    int32_t covered;   /* the path's tokens are in the root's run mask (see root_cover) */
    uint64_t serial;
    uint32_t allowed[8];
} walk_frame;

#define TR_UNKNOWN (-2)
#define TR_REJECT (-1)
#define MEMO_HCAP (2 * TMASK_MEMO_STATES)
#define COVER_MIN_BYTES 32   /* a root state allowing fewer bytes is walked plainly */

typedef struct memo_state {
    uint64_t hash;
    uint32_t off;          /* into item_pool */
    int32_t n;
    uint32_t allowed[8];
    uint32_t loop[8], notloop[8];   /* bytes known to lead back to this state, or not */
} memo_state;

typedef struct mask_entry {
    uint64_t hash, serial, last_use;
    int32_t n, max_origin, count, acc;
    uint64_t *items;       /* [TMASK_MEMO_ITEMS] */
    uint32_t *mask;        /* [n_words] */
} mask_entry;

struct tmask_work {
    const tmask_vocab *v;
    walk_frame *st;                 /* [max_len + 1] */
    memo_state *states;             /* [TMASK_MEMO_STATES] */
    int32_t *trans;                 /* [TMASK_MEMO_STATES][256] */
    int32_t n_states;
    uint64_t *pool;
    size_t n_pool, cap_pool;
    int32_t *htab;                  /* [MEMO_HCAP] */
    uint64_t *scratch;              /* [TMASK_MEMO_ITEMS] */
    mask_entry cache[TMASK_CACHE_MASKS];
    uint64_t tick;
    /* the walk's chart: the memo state of the set at index d0 + i (-1 none) */
    int32_t *chart_state;           /* [chart_cap] */
    int32_t chart_cap, d0;
    int32_t *mat_idx;               /* [TMASK_MEMO_STATES] chart index while materializing */
    int32_t *mat_touched;           /* [TMASK_MEMO_STATES] */
    uint64_t *tmp;                  /* [TMASK_MEMO_ITEMS] */
    tmshare *shared;                /* borrowed, or NULL */
    uint64_t *dkey;                 /* [TMSHARE_MAX_KEY] earley_describe's output */
    int32_t *dsets;                 /* [TMASK_DESC_SETS] its scratch */
};

tmask_work *tmask_work_create(const tmask_vocab *v, kvant_err *err)
{
    tmask_work *w = calloc(1, sizeof *w);
    int ok = w != NULL;
    if (ok) {
        w->v = v;
        w->st = malloc(((size_t)v->max_len + 1) * sizeof *w->st);
        w->states = malloc(TMASK_MEMO_STATES * sizeof *w->states);
        w->trans = malloc((size_t)TMASK_MEMO_STATES * 256 * sizeof *w->trans);
        w->htab = malloc(MEMO_HCAP * sizeof *w->htab);
        w->scratch = malloc(TMASK_MEMO_ITEMS * sizeof *w->scratch);
        w->chart_cap = 4 * (v->max_len + 2);
        w->chart_state = malloc((size_t)w->chart_cap * sizeof *w->chart_state);
        w->mat_idx = malloc(TMASK_MEMO_STATES * sizeof *w->mat_idx);
        w->mat_touched = malloc(TMASK_MEMO_STATES * sizeof *w->mat_touched);
        w->tmp = malloc(TMASK_MEMO_ITEMS * sizeof *w->tmp);
        w->dkey = malloc(TMSHARE_MAX_KEY * sizeof *w->dkey);
        w->dsets = malloc(TMASK_DESC_SETS * sizeof *w->dsets);
        w->cap_pool = 4096;
        w->pool = malloc(w->cap_pool * sizeof *w->pool);
        ok = w->st && w->states && w->trans && w->htab && w->scratch && w->pool &&
             w->chart_state && w->mat_idx && w->mat_touched && w->tmp && w->dkey && w->dsets;
        for (int i = 0; ok && i < TMASK_MEMO_STATES; i++)
            w->mat_idx[i] = -1;
        for (int i = 0; ok && i < TMASK_CACHE_MASKS; i++) {
            w->cache[i].items = malloc(TMASK_MEMO_ITEMS * sizeof *w->cache[i].items);
            w->cache[i].mask = malloc((size_t)tmask_n_words(v) * sizeof *w->cache[i].mask);
            ok = w->cache[i].items && w->cache[i].mask;
        }
    }
    if (!ok) {
        tmask_work_destroy(w);
        kvant_err_set(err, KV_ENOMEM, "out of memory for the token-mask memo");
        return NULL;
    }
    tmask_work_reset(w);
    return w;
}

void tmask_work_destroy(tmask_work *w)
{
    if (!w)
        return;
    for (int i = 0; i < TMASK_CACHE_MASKS; i++) {
        free(w->cache[i].items);
        free(w->cache[i].mask);
    }
    free(w->st);
    free(w->states);
    free(w->trans);
    free(w->htab);
    free(w->scratch);
    free(w->pool);
    free(w->chart_state);
    free(w->mat_idx);
    free(w->mat_touched);
    free(w->tmp);
    free(w->dkey);
    free(w->dsets);
    free(w);
}

void tmask_work_reset(tmask_work *w)
{
    for (int i = 0; i < TMASK_CACHE_MASKS; i++)
        w->cache[i].n = -1;
}

size_t tmask_work_mem_bytes(const tmask_work *w)
{
    return sizeof *w + ((size_t)w->v->max_len + 1) * sizeof(walk_frame) +
           TMASK_MEMO_STATES * (sizeof(memo_state) + 256 * sizeof(int32_t)) +
           MEMO_HCAP * sizeof(int32_t) + TMASK_MEMO_ITEMS * sizeof(uint64_t) * (1 + TMASK_CACHE_MASKS) +
           w->cap_pool * sizeof(uint64_t) + (size_t)w->chart_cap * sizeof(int32_t) +
           TMASK_MEMO_STATES * 2 * sizeof(int32_t) + TMASK_MEMO_ITEMS * sizeof(uint64_t) +
           (size_t)TMASK_CACHE_MASKS * (size_t)tmask_n_words(w->v) * sizeof(uint32_t) +
           TMSHARE_MAX_KEY * sizeof(uint64_t) + TMASK_DESC_SETS * sizeof(int32_t);
}

static uint64_t items_hash(const uint64_t *it, int32_t n, int acc)
{
    uint64_t h = 1469598103934665603ull ^ (uint64_t)acc;
    for (int32_t i = 0; i < n; i++)
        h = (h ^ it[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

/* The memo state for the newest set of e (described in w->scratch[0..n)),
 * added if new; -1 when the memo is full. */
static int32_t memo_intern(tmask_work *w, const earley *e, int32_t n, uint64_t h)
{
    uint32_t k = (uint32_t)h & (MEMO_HCAP - 1);
    for (; w->htab[k] >= 0; k = (k + 1) & (MEMO_HCAP - 1)) {
        const memo_state *s = &w->states[w->htab[k]];
        if (s->hash == h && s->n == n && !memcmp(w->pool + s->off, w->scratch, (size_t)n * 8))
            return w->htab[k];
    }
    if (w->n_states == TMASK_MEMO_STATES)
        return -1;
    if (w->n_pool + (size_t)n > w->cap_pool) {
        size_t nc = w->cap_pool * 2 + (size_t)n;
        uint64_t *np = realloc(w->pool, nc * sizeof *np);
        if (!np)
            return -1;
        w->pool = np;
        w->cap_pool = nc;
    }
    int32_t id = w->n_states++;
    memo_state *s = &w->states[id];
    s->hash = h;
    s->off = (uint32_t)w->n_pool;
    s->n = n;
    memcpy(w->pool + w->n_pool, w->scratch, (size_t)n * 8);
    w->n_pool += (size_t)n;
    earley_allowed_bytes(e, s->allowed);
    memset(s->loop, 0, sizeof s->loop);
    memset(s->notloop, 0, sizeof s->notloop);
    for (int b = 0; b < 256; b++)
        w->trans[(size_t)id * 256 + b] = TR_UNKNOWN;
    w->htab[k] = id;
    return id;
}

#define WALK_REF 0x80000000u   /* origin code: a set of the walk, by memo state */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Describes the newest set into w->scratch: an origin is EARLEY_SELF, a
 * committed set's index (< d0), or WALK_REF | the memo state of a walk set
 * (a set's future depends only on its items and, through completions, on
 * the sets its origins name - so equal descriptions behave alike).  -1 if
 * some walk set it points at has no memo state. */
static int32_t describe_top(tmask_work *w, const earley *e, int32_t d0)
{
    int32_t n = earley_top_raw(e, w->scratch, TMASK_MEMO_ITEMS), k = earley_depth(e) - 1;
    for (int32_t i = 0; i < n; i++) {
        int32_t o = (int32_t)(uint32_t)w->scratch[i];
        uint32_t code;
        if (o == k) {
            code = EARLEY_SELF;
        } else if (o < d0) {
            code = (uint32_t)o;
        } else {
            int32_t st = o - d0 < w->chart_cap ? w->chart_state[o - d0] : -1;
            if (st < 0)
                return -1;
            code = WALK_REF | (uint32_t)st;
        }
        w->scratch[i] = (w->scratch[i] & ~0xFFFFFFFFull) | code;
    }
    if (n > 0)
        qsort(w->scratch, (size_t)n, sizeof *w->scratch, cmp_u64);
    return n;
}

/* Records the memo state of the chart's newest set (-1: none). */
static void note_chart(tmask_work *w, const earley *e, int32_t state)
{
    int32_t i = earley_depth(e) - 1 - w->d0;
    if (i >= 0 && i < w->chart_cap)
        w->chart_state[i] = state;
}

static int32_t memo_of_top(tmask_work *w, const earley *e, int32_t d0)
{
    int32_t n = describe_top(w, e, d0);
    int32_t id = n < 0 ? -1 : memo_intern(w, e, n, items_hash(w->scratch, n, 0));
    note_chart(w, e, id);
    return id;
}

/* Pushes memo state x's set, after the walk sets it points at (post-order;
 * descriptions only point at older sets, so this ends).  Returns its chart
 * index, or a negative kvant_status. */
static int32_t mat_state(tmask_work *w, earley *e, int32_t x, int32_t *n_touched, int guard)
{
    const memo_state *ms = &w->states[x];
    if (guard > 4 * TMASK_MAX_TOKEN_BYTES)
        return KV_EINVAL;
    for (int32_t i = 0; i < ms->n; i++) {
        uint32_t code = (uint32_t)w->pool[ms->off + i];
        if (code != EARLEY_SELF && (code & WALK_REF) && w->mat_idx[code & ~WALK_REF] < 0) {
            int32_t r = mat_state(w, e, (int32_t)(code & ~WALK_REF), n_touched, guard + 1);
            if (r < 0)
                return r;
        }
    }
    for (int32_t i = 0; i < ms->n; i++) {
        uint64_t it = w->pool[ms->off + i];
        uint32_t code = (uint32_t)it;
        if (code != EARLEY_SELF && (code & WALK_REF))
            it = (it & ~0xFFFFFFFFull) | (uint32_t)w->mat_idx[code & ~WALK_REF];
        w->tmp[i] = it;
    }
    int r = earley_push_items(e, w->tmp, ms->n);
    if (r != 1)
        return r < 0 ? r : KV_EINVAL;
    int32_t idx = earley_depth(e) - 1;
    note_chart(w, e, x);
    w->mat_idx[x] = idx;
    w->mat_touched[(*n_touched)++] = x;
    return idx;
}

/* Makes frame sp's set the chart's top (rebuilding a memo state's set
 * above the deepest frame that has no memo state): 1, or negative. */
static int materialize(earley *e, walk_frame *st, int32_t sp, tmask_work *w, int32_t d0)
{
    walk_frame *f = &st[sp];
    if (f->cd > 0 && earley_depth(e) >= f->cd && earley_set_serial(e, f->cd - 1) == f->serial) {
        earley_truncate(e, f->cd);
        return 1;
    }
    if (f->state < 0)   /* cannot happen: such sets are never truncated away */
        return KV_EINVAL;
    int32_t keep = d0;
    for (int32_t k = sp - 1; k >= 0; k--)
        if (st[k].state < 0) {
            keep = st[k].cd;
            break;
        }
    earley_truncate(e, keep);
    int32_t n_touched = 0;
    int32_t r = mat_state(w, e, f->state, &n_touched, 0);
    for (int32_t i = 0; i < n_touched; i++)
        w->mat_idx[w->mat_touched[i]] = -1;
    if (r >= 0) {
        f->cd = earley_depth(e);
        f->serial = earley_set_serial(e, f->cd - 1);
        r = 1;
    }
    return r;
}

/* Records state's transition on byte b, and on every byte the state's set
 * (chart index idx) cannot tell from b (earley_byte_peers). */
static void fill_class(tmask_work *w, const earley *e, int32_t idx, int32_t state, uint8_t b,
                       int32_t to)
{
    uint32_t peers[8];
    earley_byte_peers(e, idx, b, peers);
    int32_t *tr = &w->trans[(size_t)state * 256];
    for (int k = 0; k < 8; k++)
        for (uint32_t m = peers[k]; m; m &= m - 1)
            tr[k * 32 + __builtin_ctz(m)] = to;
}

/* Steps from frame sp by byte b: 1 (child frame fields in *c), 0 refused,
 * negative on error. */
static int step(earley *e, walk_frame *st, int32_t sp, tmask_work *w, int32_t d0, uint8_t b,
                walk_frame *c)
{
    walk_frame *f = &st[sp];
    int32_t *tr = w && f->state >= 0 ? &w->trans[(size_t)f->state * 256 + b] : NULL;
    if (tr && *tr == TR_REJECT)
        return 0;
    if (tr && *tr >= 0) {   /* known: no parsing, no chart */
        c->state = *tr;
        c->cd = 0;
        memcpy(c->allowed, w->states[*tr].allowed, sizeof c->allowed);
        return 1;
    }
    int r = materialize(e, st, sp, w, d0);
    if (r == 1)
        r = earley_push_byte(e, b);
    if (r <= 0) {
        if (r == 0 && tr)
            fill_class(w, e, earley_depth(e) - 1, f->state, b, TR_REJECT);
        return r;
    }
    c->state = w ? memo_of_top(w, e, d0) : -1;
    c->cd = earley_depth(e);
    c->serial = earley_set_serial(e, c->cd - 1);
    if (tr && c->state >= 0)
        fill_class(w, e, c->cd - 2, f->state, b, c->state);
    if (c->state >= 0)
        memcpy(c->allowed, w->states[c->state].allowed, sizeof c->allowed);
    else
        earley_allowed_bytes(e, c->allowed);
    return 1;
}

/* Whether every byte below frame sp's node leads from its memo state back
 * to that state (then every token below is allowed, and none need be
 * walked): 1, 0, or negative.  Transitions still unknown for the bytes
 * below are parsed (once per state and byte in a walk). */
static int subtree_loops(const tmask_vocab *v, earley *e, walk_frame *st, int32_t sp,
                         tmask_work *w, int32_t d0)
{
    const uint32_t *bl = v->below + 8 * (size_t)st[sp].node;
    memo_state *ms = &w->states[st[sp].state];
    for (int k = 0; k < 8; k++)
        if ((bl[k] & ~ms->allowed[k]) | (bl[k] & ms->notloop[k]))
            return 0;
    for (int k = 0; k < 8; k++) {
        for (uint32_t unk = bl[k] & ~ms->loop[k]; unk; unk &= unk - 1) {
            int b = k * 32 + __builtin_ctz(unk);
            walk_frame c;
            int r = step(e, st, sp, w, d0, (uint8_t)b, &c);
            if (r < 0)
                return r;
            if (r == 0 || c.state != st[sp].state) {
                ms->notloop[k] |= 1u << (b & 31);
                return 0;
            }
            ms->loop[k] |= 1u << (b & 31);
        }
    }
    return 1;
}

/* Sets the mask bits of the tokens strictly below trie node c; their count. */
static int32_t allow_below(const tmask_vocab *v, int32_t c, uint32_t *mask)
{
    const trie_node *cn = &v->nodes[c];
    for (int32_t i = cn->tok_first + cn->n_tok; i < cn->hi; i++) {
        int32_t id = v->order[i];
        mask[id >> 5] |= 1u << (id & 31);
    }
    return cn->hi - cn->tok_first - cn->n_tok;
}

static int in_set(const uint32_t set[8], int b)
{
    return (int)(set[b >> 5] >> (b & 31) & 1);
}

/* Whether every byte below trie node c lies in set. */
static int below_in(const tmask_vocab *v, int32_t c, const uint32_t set[8])
{
    const uint32_t *bl = v->below + 8 * (size_t)c;
    uint32_t out = 0;
    for (int k = 0; k < 8; k++)
        out |= bl[k] & ~set[k];
    return out == 0;
}

static run_mask *find_run(tmask_vocab *v, const uint32_t first[8], const uint32_t rest[8])
{
    for (int32_t i = 0; i < v->n_runs; i++)
        if (!memcmp(v->runs[i].first, first, 32) && !memcmp(v->runs[i].rest, rest, 32))
            return &v->runs[i];
    return NULL;
}

/* ORs into mask the run mask of (first, rest), computed on the first use
 * and kept by the vocabulary (TMASK_RUN_MASKS, replaced round robin).  0,
 * or -1 out of memory (mask unchanged). */
static int run_mask_or(const tmask_vocab *cv, const uint32_t first[8], const uint32_t rest[8],
                       uint32_t *mask)
{
    tmask_vocab *v = (tmask_vocab *)cv;   /* only runs[] changes, under v->mu */
    int32_t nw = tmask_n_words(v);
    pthread_mutex_lock(&v->mu);
    run_mask *hit = find_run(v, first, rest);
    for (int32_t k = 0; hit && k < nw; k++)
        mask[k] |= hit->mask[k];
    pthread_mutex_unlock(&v->mu);
    if (hit)
        return 0;
    uint32_t *nm = calloc((size_t)nw, sizeof *nm);   /* computed outside the lock */
    if (!nm)
        return -1;
    for (int32_t id = 0; id < v->n_vocab; id++) {
        int32_t len = tok_len(v, id);
        const uint8_t *b = v->bytes + v->off[id];
        int ok = len > 0 && in_set(first, b[0]);
        for (int32_t j = 1; ok && j < len; j++)
            ok = in_set(rest, b[j]);
        if (ok)
            nm[id >> 5] |= 1u << (id & 31);
    }
    for (int32_t k = 0; k < nw; k++)
        mask[k] |= nm[k];
    pthread_mutex_lock(&v->mu);
    if (!find_run(v, first, rest)) {   /* a thread that raced keeps the first */
        run_mask *r = v->n_runs < TMASK_RUN_MASKS ? &v->runs[v->n_runs++]
                                                  : &v->runs[v->run_hand++ % TMASK_RUN_MASKS];
        free(r->mask);
        r->mask = nm;
        nm = NULL;
        memcpy(r->first, first, 32);
        memcpy(r->rest, rest, 32);
    }
    pthread_mutex_unlock(&v->mu);
    free(nm);
    return 0;
}

/* The run the walk's root state leads into (see root_cover). */
typedef struct cover {
    int on;
    uint32_t first[8], loop[8];
} cover;

/* Parses frame sp's transitions on every byte its state allows (one parse
 * per byte class).  0, or negative. */
static int all_trans(earley *e, walk_frame *st, int32_t sp, tmask_work *w, int32_t d0)
{
    const memo_state *ms = &w->states[st[sp].state];
    const int32_t *tr = &w->trans[(size_t)st[sp].state * 256];
    for (int k = 0; k < 8; k++)
        for (uint32_t m = ms->allowed[k]; m; m &= m - 1) {
            int b = k * 32 + __builtin_ctz(m);
            walk_frame c;
            int r = tr[b] == TR_UNKNOWN ? step(e, st, sp, w, d0, (uint8_t)b, &c) : 0;
            if (r < 0)
                return r;
        }
    return 0;
}

/* Where the root state allows many bytes (a string, free text), most of
 * them lead to one state s1 that loops on most bytes: every token whose
 * first byte leads the root to s1 and whose other bytes loop on s1 is
 * allowed.  Those tokens come at once from the vocabulary's run mask; the
 * walk skips the subtrees they fill (frames on such a path are `covered`).
 * 0 (cov->on says whether it applies), or negative. */
static int root_cover(const tmask_vocab *v, earley *e, walk_frame *st, tmask_work *w,
                      int32_t d0, uint32_t *mask, cover *cov)
{
    int32_t s0 = st[0].state, n_al = 0, best = -1, best_n = 0;
    cov->on = 0;
    for (int k = 0; s0 >= 0 && k < 8; k++)
        n_al += __builtin_popcount(w->states[s0].allowed[k]);
    if (s0 < 0 || n_al < COVER_MIN_BYTES || v->max_len < 2)
        return 0;
    int r = all_trans(e, st, 0, w, d0);
    const int32_t *tr = &w->trans[(size_t)s0 * 256];
    int32_t tgt[256], tn[256], n_tgt = 0;
    for (int b = 0; r == 0 && b < 256; b++) {   /* the most frequent target (few distinct) */
        int32_t i = 0;
        while (tr[b] >= 0 && i < n_tgt && tgt[i] != tr[b])
            i++;
        if (tr[b] < 0)
            continue;
        if (i == n_tgt)
            tgt[n_tgt] = tr[b], tn[n_tgt++] = 0;
        if (++tn[i] > best_n)
            best = tgt[i], best_n = tn[i];
    }
    if (r < 0 || best_n < COVER_MIN_BYTES / 4)
        return r;
    st[1] = (walk_frame){.node = 0, .state = best, .cd = 0};
    if ((r = all_trans(e, st, 1, w, d0)) < 0)
        return r;
    int32_t n_loop = 0;
    memset(cov->first, 0, sizeof cov->first);
    memset(cov->loop, 0, sizeof cov->loop);
    for (int b = 0; b < 256; b++) {
        if (tr[b] == best)
            cov->first[b >> 5] |= 1u << (b & 31);
        if (w->trans[(size_t)best * 256 + b] == best) {
            cov->loop[b >> 5] |= 1u << (b & 31);
            n_loop++;
        }
    }
    if (n_loop < COVER_MIN_BYTES / 4)
        return 0;
    cov->on = run_mask_or(v, cov->first, cov->loop, mask) == 0;
    return 0;
}

/* The depth-first trie walk; w NULL: every byte parsed, no memo. */
static int32_t walk(const tmask_vocab *v, earley *e, tmask_work *w, walk_frame *st,
                    uint32_t *mask, kvant_err *err)
{
    int32_t d0 = earley_depth(e), sp = 0, count = 0;
    if (w)
        w->d0 = d0;
    st[0] = (walk_frame){.node = 0, .state = w ? memo_of_top(w, e, d0) : -1, .cd = d0,
                         .serial = earley_set_serial(e, d0 - 1)};
    earley_allowed_bytes(e, st[0].allowed);
    cover cov = {0};
    int rc = w ? root_cover(v, e, st, w, d0, mask, &cov) : 0;
    if (rc < 0) {
        earley_truncate(e, d0);
        return kvant_err_set(err, rc, "grammar state above its item limit");
    }
    while (sp >= 0) {
        walk_frame *f = &st[sp];
        const trie_node *nd = &v->nodes[f->node];
        if (f->ci == nd->n_child) {
            sp--;
            continue;
        }
        int32_t c = nd->child_first + f->ci++;
        uint8_t b = v->nodes[c].byte;
        if (!(f->allowed[b >> 5] >> (b & 31) & 1))
            continue;
        walk_frame child;
        int r = step(e, st, sp, w, d0, b, &child);
        if (r < 0) {
            earley_truncate(e, d0);
            return kvant_err_set(err, r, "grammar state above its item limit");
        }
        if (r == 0)
            continue;
        child.covered = cov.on && in_set(sp == 0 ? cov.first : cov.loop, b) && (sp == 0 || f->covered);
        const trie_node *cn = &v->nodes[c];
        for (int32_t i = 0; i < cn->n_tok; i++) {
            int32_t id = v->order[cn->tok_first + i];
            mask[id >> 5] |= 1u << (id & 31);
        }
        count += cn->n_tok;
        if (cn->n_child && child.covered && below_in(v, c, cov.loop))
            continue;   /* every token below is in the run mask */
        if (cn->n_child) {
            child.node = c;
            child.ci = 0;
            st[sp + 1] = child;
            int sl = w && child.state >= 0 ? subtree_loops(v, e, st, sp + 1, w, d0) : 0;
            if (sl < 0) {
                earley_truncate(e, d0);
                return kvant_err_set(err, sl, "grammar state above its item limit");
            }
            if (sl)
                count += allow_below(v, c, mask);
            else
                sp++;
        }
    }
    earley_truncate(e, d0);
    return count;
}

/* The cross-call cache: the entry for e's top set, or NULL. */
static mask_entry *cache_find(tmask_work *w, const earley *e, int32_t n, uint64_t h, int acc)
{
    for (int i = 0; i < TMASK_CACHE_MASKS; i++) {
        mask_entry *c = &w->cache[i];
        if (c->n == n && c->hash == h && c->acc == acc && !memcmp(c->items, w->scratch, (size_t)n * 8) &&
            (c->max_origin < 0 || earley_set_serial(e, c->max_origin) == c->serial))
            return c;
    }
    return NULL;
}

static void cache_store(tmask_work *w, const earley *e, int32_t n, uint64_t h, int acc,
                        const uint32_t *mask, int32_t count)
{
    mask_entry *c = &w->cache[0];
    for (int i = 1; i < TMASK_CACHE_MASKS; i++)
        if (w->cache[i].last_use < c->last_use)
            c = &w->cache[i];
    int32_t mo = -1;
    for (int32_t i = 0; i < n; i++)
        if ((uint32_t)w->scratch[i] != EARLEY_SELF && (int32_t)(uint32_t)w->scratch[i] > mo)
            mo = (int32_t)(uint32_t)w->scratch[i];
    memcpy(c->items, w->scratch, (size_t)n * 8);
    memcpy(c->mask, mask, (size_t)tmask_n_words(w->v) * sizeof *mask);
    *c = (mask_entry){.hash = h, .serial = earley_set_serial(e, mo), .last_use = ++w->tick, .n = n,
                      .max_origin = mo, .count = count, .acc = acc, .items = c->items, .mask = c->mask};
}

int tmask_work_share(tmask_work *w, tmshare *s)
{
    if (s && tmshare_n_words(s) != tmask_n_words(w->v))
        return KV_EINVAL;
    w->shared = s;
    return KV_OK;
}

/* The shared cache's key for e's state into w->dkey (its length, or -1:
 * not shared: no cache, another grammar, a state too large to describe). */
static int32_t shared_key(tmask_work *w, const earley *e, int acc, uint64_t *h)
{
    if (!w || !w->shared || gram_get_tables(tmshare_gram(w->shared)) != earley_tables(e))
        return -1;
    int32_t n = earley_describe(e, w->dkey, TMSHARE_MAX_KEY, w->dsets, TMASK_DESC_SETS);
    if (n >= 0)
        *h = items_hash(w->dkey, n, acc);
    return n;
}

int32_t tmask_compute(const tmask_vocab *v, earley *e, tmask_work *w, uint32_t *mask,
                      kvant_err *err)
{
    int acc = earley_accepting(e);
    int32_t n = -1, nk = -1;
    uint64_t h = 0, hk = 0;
    if (w) {
        n = earley_top_items(e, earley_depth(e), w->scratch, TMASK_MEMO_ITEMS);
        h = n >= 0 ? items_hash(w->scratch, n, acc) : 0;
        mask_entry *c = n >= 0 ? cache_find(w, e, n, h, acc) : NULL;
        if (c) {
            c->last_use = ++w->tick;
            memcpy(mask, c->mask, (size_t)tmask_n_words(v) * sizeof *mask);
            return c->count;
        }
        nk = shared_key(w, e, acc, &hk);
        int32_t count = nk >= 0 ? tmshare_get(w->shared, w->dkey, nk, hk, mask) : -1;
        if (count >= 0) {
            if (n >= 0)
                cache_store(w, e, n, h, acc, mask, count);
            return count;
        }
        w->n_states = 0;
        w->n_pool = 0;
        memset(w->htab, 0xff, MEMO_HCAP * sizeof *w->htab);
    }
    memset(mask, 0, (size_t)tmask_n_words(v) * sizeof *mask);
    walk_frame *st = w ? w->st : malloc(((size_t)v->max_len + 1) * sizeof *st);
    if (!st)
        return kvant_err_set(err, KV_ENOMEM, "out of memory computing a token mask");
    int32_t count = walk(v, e, w, st, mask, err);
    if (!w)
        free(st);
    if (count < 0)
        return count;
    count = 0;   /* the walk may set a bit twice (run masks): count the bits */
    for (int32_t k = 0; k < tmask_n_words(v); k++)
        count += __builtin_popcount(mask[k]);
    for (int32_t i = 0; acc && i < v->n_eos; i++) {
        int32_t id = v->eos[i];
        count += !(mask[id >> 5] >> (id & 31) & 1);
        mask[id >> 5] |= 1u << (id & 31);
    }
    if (w && n >= 0) {   /* scratch was overwritten by the walk: describe the root again */
        n = earley_top_items(e, earley_depth(e), w->scratch, TMASK_MEMO_ITEMS);
        if (n >= 0)
            cache_store(w, e, n, h, acc, mask, count);
    }
    if (nk >= 0)   /* the walk leaves dkey alone */
        tmshare_put(w->shared, w->dkey, nk, hk, mask, count);
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
