/* tokmask.c - the mask walk over the vocabulary trie (tokmask.h; the
 * trie: tmvocab.h). */
#include "grammar/tokmask.h"

#include <stdlib.h>
#include <string.h>

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
#define COVER_MAX_RUN 64     /* the longest counted run followed */
#define SHARE_MIN_BYTES 16   /* states allowing fewer bytes are not looked up in a tmshare */

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
        int32_t max_len = tmvocab_trie_of(v)->max_len;
        w->st = malloc(((size_t)max_len + 1) * sizeof *w->st);
        w->states = malloc(TMASK_MEMO_STATES * sizeof *w->states);
        w->trans = malloc((size_t)TMASK_MEMO_STATES * 256 * sizeof *w->trans);
        w->htab = malloc(MEMO_HCAP * sizeof *w->htab);
        w->scratch = malloc(TMASK_MEMO_ITEMS * sizeof *w->scratch);
        w->chart_cap = 4 * (max_len + 2);
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
    return sizeof *w + ((size_t)tmvocab_trie_of(w->v)->max_len + 1) * sizeof(walk_frame) +
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
static int subtree_loops(const tmvocab_trie *v, earley *e, walk_frame *st, int32_t sp,
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

/* Sets the mask bits of the tokens strictly below trie node c; the number
 * of bits it set (some may be set already: the run mask). */
static int32_t allow_below(const tmvocab_trie *v, int32_t c, uint32_t *mask)
{
    const tmvocab_node *cn = &v->nodes[c];
    int32_t n = 0;
    for (int32_t i = cn->tok_first + cn->n_tok; i < cn->hi; i++) {
        int32_t id = v->order[i];
        n += !(mask[id >> 5] >> (id & 31) & 1);
        mask[id >> 5] |= 1u << (id & 31);
    }
    return n;
}

static int in_set(const uint32_t set[8], int b)
{
    return (int)(set[b >> 5] >> (b & 31) & 1);
}

/* Whether every byte below trie node c lies in set. */
static int below_in(const tmvocab_trie *v, int32_t c, const uint32_t set[8])
{
    const uint32_t *bl = v->below + 8 * (size_t)c;
    uint32_t out = 0;
    for (int k = 0; k < 8; k++)
        out |= bl[k] & ~set[k];
    return out == 0;
}

/* The run the walk's root state leads into (see root_cover). */
typedef struct cover {
    int on;
    uint32_t first[8], rest[8];
    int32_t max_rest, n;   /* n: tokens in the run mask */
    int end_refuses;   /* after max_rest bytes of rest, each byte of rest is refused */
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

/* The target most of a state's allowed bytes lead to (>= 0, or -1). */
static int32_t main_target(const int32_t *tr, int32_t *n_best)
{
    int32_t tgt[256], tn[256], n_tgt = 0, best = -1;
    *n_best = 0;
    for (int b = 0; b < 256; b++) {
        int32_t i = 0;
        if (tr[b] < 0)
            continue;
        while (i < n_tgt && tgt[i] != tr[b])
            i++;
        if (i == n_tgt)
            tgt[n_tgt] = tr[b], tn[n_tgt++] = 0;
        if (++tn[i] > *n_best)
            best = tgt[i], *n_best = tn[i];
    }
    return best;
}

/* Follows the run from t0 = the root's main target: rest is the set of
 * bytes leading t0 to its main target t1, and the run goes on while all of
 * rest leads t_i to one state t_i+1 (unbounded once t_i+1 = t_i, as in a
 * string; counted as with maxLength).  Sets cov->rest, cov->max_rest and
 * cov->end_refuses; 0, or negative. */
static int follow_run(earley *e, walk_frame *st, tmask_work *w, int32_t d0, int32_t t0, cover *cov)
{
    int32_t t = t0;
    cov->max_rest = 0;
    cov->end_refuses = 0;
    for (int32_t i = 0; i < COVER_MAX_RUN; i++) {
        st[1] = (walk_frame){.node = 0, .state = t, .cd = 0};
        int r = all_trans(e, st, 1, w, d0);
        if (r < 0)
            return r;
        const int32_t *tr = &w->trans[(size_t)t * 256];
        int32_t next = -1, n = 0;
        if (i == 0) {
            next = main_target(tr, &n);
            memset(cov->rest, 0, sizeof cov->rest);
            for (int b = 0; next >= 0 && b < 256; b++)
                if (tr[b] == next)
                    cov->rest[b >> 5] |= 1u << (b & 31);
            if (n < COVER_MIN_BYTES / 4)
                return 0;
        } else {
            for (int b = 0; b < 256; b++) {
                if (!in_set(cov->rest, b))
                    continue;
                if (next == -1)
                    next = tr[b];
                if (tr[b] != next || tr[b] < 0) {
                    next = -2;
                    break;
                }
            }
            if (next < 0) {
                cov->end_refuses = 1;
                for (int b = 0; b < 256; b++)
                    if (in_set(cov->rest, b) && in_set(w->states[t].allowed, b) &&
                        tr[b] != TR_REJECT)
                        cov->end_refuses = 0;
                return 0;
            }
        }
        cov->max_rest = i + 1;
        if (next == t) {
            cov->max_rest = TMVOCAB_UNBOUNDED;
            return 0;
        }
        t = next;
    }
    return 0;
}

/* Where the root state allows many bytes (a string, free text), most of
 * them lead to one state, from which a run of bytes goes on (follow_run):
 * every token whose first byte leads the root there and whose other bytes
 * (at most max_rest) lie in the run's bytes is allowed.  Those tokens come
 * at once from the vocabulary's run mask; the walk skips the subtrees they
 * fill (frames on such a path are `covered`).  0 (cov->on says whether it
 * applies), or negative. */
static int root_cover(const tmask_vocab *voc, const tmvocab_trie *v, earley *e, walk_frame *st,
                      tmask_work *w, int32_t d0, uint32_t *mask, cover *cov)
{
    int32_t s0 = st[0].state, n_al = 0, best_n = 0;
    cov->on = 0;
    for (int k = 0; s0 >= 0 && k < 8; k++)
        n_al += __builtin_popcount(w->states[s0].allowed[k]);
    if (s0 < 0 || n_al < COVER_MIN_BYTES || v->max_len < 2)
        return 0;
    int r = all_trans(e, st, 0, w, d0);
    const int32_t *tr = &w->trans[(size_t)s0 * 256];
    int32_t best = r < 0 ? -1 : main_target(tr, &best_n);
    if (r < 0 || best_n < COVER_MIN_BYTES / 4)
        return r;
    memset(cov->first, 0, sizeof cov->first);
    for (int b = 0; b < 256; b++)
        if (tr[b] == best)
            cov->first[b >> 5] |= 1u << (b & 31);
    if ((r = follow_run(e, st, w, d0, best, cov)) < 0 || cov->max_rest == 0)
        return r;
    cov->n = tmvocab_run_mask_or(voc, cov->first, cov->rest, cov->max_rest, mask);
    cov->on = cov->n >= 0;
    return 0;
}

/* The depth-first trie walk; w NULL: every byte parsed, no memo. */
static int32_t walk(const tmask_vocab *voc, earley *e, tmask_work *w, walk_frame *st,
                    uint32_t *mask, kvant_err *err)
{
    const tmvocab_trie *v = tmvocab_trie_of(voc);
    int32_t d0 = earley_depth(e), sp = 0, count = 0;
    if (w)
        w->d0 = d0;
    st[0] = (walk_frame){.node = 0, .state = w ? memo_of_top(w, e, d0) : -1, .cd = d0,
                         .serial = earley_set_serial(e, d0 - 1)};
    earley_allowed_bytes(e, st[0].allowed);
    cover cov = {0};
    int rc = w ? root_cover(voc, v, e, st, w, d0, mask, &cov) : 0;
    if (rc < 0) {
        earley_truncate(e, d0);
        return kvant_err_set(err, rc, "grammar state above its item limit");
    }
    count = cov.on ? cov.n : 0;
    while (sp >= 0) {
        walk_frame *f = &st[sp];
        const tmvocab_node *nd = &v->nodes[f->node];
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
        child.covered = !cov.on                  ? 0
                        : sp == 0                ? in_set(cov.first, b)
                        : f->covered && f->covered <= cov.max_rest && in_set(cov.rest, b)
                            ? f->covered + 1
                            : 0;
        const tmvocab_node *cn = &v->nodes[c];
        for (int32_t i = 0; !child.covered && i < cn->n_tok; i++) {   /* covered: in the run */
            int32_t id = v->order[cn->tok_first + i];
            mask[id >> 5] |= 1u << (id & 31);
        }
        count += child.covered ? 0 : cn->n_tok;
        if (cn->n_child && child.covered && below_in(v, c, cov.rest) &&
            (cov.max_rest == TMVOCAB_UNBOUNDED || cov.end_refuses ||
             child.covered - 1 + cn->height <= cov.max_rest))
            continue;   /* every token below is in the run mask, or refused (too long) */
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
    if (s && (tmshare_n_words(s) != tmask_n_words(w->v) || tmshare_claim(s, w->v)))
        return KV_EINVAL;
    w->shared = s;
    return KV_OK;
}

/* The shared cache's key for e's state into w->dkey (its length, or -1:
 * not shared: no cache, another grammar, a state allowing few bytes or too
 * large to describe). */
static int32_t shared_key(tmask_work *w, const earley *e, int acc, uint64_t *h)
{
    if (!w || !w->shared || gram_get_tables(tmshare_gram(w->shared)) != earley_tables(e))
        return -1;
    uint32_t al[8];
    int32_t n_al = 0;
    earley_allowed_bytes(e, al);
    for (int k = 0; k < 8; k++)
        n_al += __builtin_popcount(al[k]);
    if (n_al < SHARE_MIN_BYTES)   /* a short walk: cheaper than describing the state */
        return -1;
    int32_t n = earley_describe(e, w->dkey, TMSHARE_MAX_KEY - 1, w->dsets, TMASK_DESC_SETS);
    if (n < 0)
        return -1;
    w->dkey[n++] = (uint64_t)acc;   /* the end ids depend on it: part of the key */
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
    const tmvocab_trie *tr = tmvocab_trie_of(v);
    walk_frame *st = w ? w->st : malloc(((size_t)tr->max_len + 1) * sizeof *st);
    if (!st)
        return kvant_err_set(err, KV_ENOMEM, "out of memory computing a token mask");
    int32_t count = walk(v, e, w, st, mask, err);
    if (!w)
        free(st);
    if (count < 0)
        return count;
    for (int32_t i = 0; acc && i < tr->n_eos; i++) {
        int32_t id = tr->eos[i];
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
    int32_t n;
    const uint8_t *b = tmask_token(v, id, &n);
    if (!b)
        return KV_EINVAL;
    if (tmask_is_eos(v, id))
        return earley_accepting(e);
    if (n == 0)
        return 0;
    return earley_push_bytes(e, b, (size_t)n);
}
