/* earley.c - the byte-level Earley recognizer (earley.h).
 *
 * Items are (dotted position, origin set).  Sets lie one after the other
 * in `items`; set k is items[set_start[k] .. set_start[k + 1]) (the newest
 * ends at n_items).  While a set is built, a hash of (pos, origin) stamped
 * with the build's generation deduplicates its items and pred_gen marks the
 * nonterminals already predicted in it.
 */
#include "grammar/earley.h"

#include <stdlib.h>
#include <string.h>

typedef struct eitem {
    int32_t pos, origin;
} eitem;

struct earley {
    const gram_tables *t;
    eitem *items;
    int64_t n_items, cap_items;
    int32_t *set_start;
    uint64_t *set_serial;  /* [cap_sets] never reused: a rebuilt set gets a new one */
    uint64_t next_serial;
    int32_t n_sets, cap_sets;
    uint64_t *hkey;       /* [hcap] (pos << 32 | origin) */
    uint32_t *hgen;       /* [hcap] generation that wrote the slot */
    uint32_t hcap, hused, gen;
    uint32_t *pred_gen;   /* [n_nt] */
};

static int hash_resize(earley *e, uint32_t cap)
{
    uint64_t *k = malloc((size_t)cap * sizeof *k);
    uint32_t *g = calloc((size_t)cap, sizeof *g);
    if (!k || !g) {
        free(k);
        free(g);
        return -1;
    }
    free(e->hkey);
    free(e->hgen);
    e->hkey = k;
    e->hgen = g;
    e->hcap = cap;
    e->hused = 0;
    /* re-insert the set being built (its generation is current) */
    int64_t s = e->n_sets ? e->set_start[e->n_sets - 1] : 0;
    for (int64_t i = s; i < e->n_items; i++) {
        uint64_t key = (uint64_t)(uint32_t)e->items[i].pos << 32 | (uint32_t)e->items[i].origin;
        uint32_t h = (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & (cap - 1);
        while (e->hgen[h] == e->gen)
            h = (h + 1) & (cap - 1);
        e->hgen[h] = e->gen;
        e->hkey[h] = key;
        e->hused++;
    }
    return 0;
}

/* Adds (pos, origin) to the set being built unless present: 0, or -1 out
 * of memory / over the item limit. */
static int add_item(earley *e, int32_t pos, int32_t origin)
{
    if ((e->hused + 1) * 2 > e->hcap && hash_resize(e, e->hcap * 2))
        return -1;
    uint64_t key = (uint64_t)(uint32_t)pos << 32 | (uint32_t)origin;
    uint32_t m = e->hcap - 1, h = (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & m;
    for (; e->hgen[h] == e->gen; h = (h + 1) & m)
        if (e->hkey[h] == key)
            return 0;
    if (e->n_items >= e->t->lim.max_state_items)
        return -1;
    if (e->n_items == e->cap_items) {
        int64_t nc = e->cap_items * 2;
        eitem *ni = realloc(e->items, (size_t)nc * sizeof *ni);
        if (!ni)
            return -1;
        e->items = ni;
        e->cap_items = nc;
    }
    e->hgen[h] = e->gen;
    e->hkey[h] = key;
    e->hused++;
    e->items[e->n_items++] = (eitem){pos, origin};
    return 0;
}

static void begin_set(earley *e)
{
    if (++e->gen == 0) {   /* wrapped: clear the stamps */
        memset(e->hgen, 0, (size_t)e->hcap * sizeof *e->hgen);
        memset(e->pred_gen, 0, (size_t)e->t->n_nt * sizeof *e->pred_gen);
        e->gen = 1;
    }
    e->hused = 0;
}

static int predict(earley *e, int32_t nt, int32_t k)
{
    const gram_tables *t = e->t;
    if (e->pred_gen[nt] == e->gen)
        return 0;
    for (int32_t i = t->clon_off[nt]; i < t->clon_off[nt + 1]; i++)
        e->pred_gen[t->clo_nt[i]] = e->gen;
    for (int32_t i = t->clo_off[nt]; i < t->clo_off[nt + 1]; i++)
        if (add_item(e, t->clo_pos[i], k))
            return -1;
    return 0;
}

/* Completes and predicts over the items of set k (the newest) until no
 * item is added. */
static int close_set(earley *e, int32_t k)
{
    const gram_tables *t = e->t;
    for (int64_t i = e->set_start[k]; i < e->n_items; i++) {
        eitem it = e->items[i];
        int32_t el = t->pos_elem[it.pos];
        if (el == GRAM_END) {
            if (it.origin == k)   /* empty completions: stepped over at prediction */
                continue;
            int32_t lhs = t->pos_lhs[it.pos];
            int64_t a = e->set_start[it.origin], b = e->set_start[it.origin + 1];
            for (int64_t j = a; j < b; j++)
                if (t->pos_elem[e->items[j].pos] == lhs &&
                    add_item(e, e->items[j].pos + 1, e->items[j].origin))
                    return -1;
        } else if (el >= 0) {
            if (predict(e, el, k))
                return -1;
            if (t->nullable[el] && add_item(e, it.pos + 1, it.origin))
                return -1;
        }
    }
    return 0;
}

static int push_set(earley *e)
{
    if (e->n_sets + 1 >= e->cap_sets) {
        int32_t nc = e->cap_sets * 2;
        int32_t *ns = realloc(e->set_start, (size_t)nc * sizeof *ns);
        if (ns)
            e->set_start = ns;
        uint64_t *nr = ns ? realloc(e->set_serial, (size_t)nc * sizeof *nr) : NULL;
        if (!nr)
            return -1;
        e->set_serial = nr;
        e->cap_sets = nc;
    }
    e->set_serial[e->n_sets] = ++e->next_serial;
    e->set_start[e->n_sets++] = (int32_t)e->n_items;
    e->set_start[e->n_sets] = (int32_t)e->n_items;
    return 0;
}

void earley_reset(earley *e)
{
    e->n_items = 0;
    e->n_sets = 0;
    begin_set(e);
    push_set(e);   /* capacity for set 0 exists from create */
    if (predict(e, e->t->start_nt, 0) == 0)
        close_set(e, 0);
}

earley *earley_create(const gram *g, kvant_err *err)
{
    const gram_tables *t = gram_get_tables(g);
    if (!t) {
        kvant_err_set(err, KV_EINVAL, "grammar not finished");
        return NULL;
    }
    earley *e = calloc(1, sizeof *e);
    if (e) {
        e->t = t;
        e->cap_items = 256;
        e->cap_sets = 64;
        e->items = malloc((size_t)e->cap_items * sizeof *e->items);
        e->set_start = malloc((size_t)e->cap_sets * sizeof *e->set_start);
        e->set_serial = malloc((size_t)e->cap_sets * sizeof *e->set_serial);
        e->pred_gen = calloc((size_t)t->n_nt + 1, sizeof *e->pred_gen);
    }
    if (!e || !e->items || !e->set_start || !e->set_serial || !e->pred_gen ||
        hash_resize(e, 256)) {
        earley_destroy(e);
        kvant_err_set(err, KV_ENOMEM, "out of memory creating a grammar state");
        return NULL;
    }
    earley_reset(e);
    if (e->n_items == 0 || e->n_items >= t->lim.max_state_items) {
        earley_destroy(e);
        kvant_err_set(err, KV_ERANGE, "grammar state above the limit of %lld items",
                      (long long)t->lim.max_state_items);
        return NULL;
    }
    return e;
}

void earley_destroy(earley *e)
{
    if (!e)
        return;
    free(e->items);
    free(e->set_start);
    free(e->set_serial);
    free(e->hkey);
    free(e->hgen);
    free(e->pred_gen);
    free(e);
}

int earley_push_byte(earley *e, uint8_t b)
{
    const gram_tables *t = e->t;
    int32_t prev = e->n_sets - 1;
    int64_t a = e->set_start[prev], z = e->n_items;
    int64_t n0 = e->n_items;
    if (push_set(e))
        return KV_ENOMEM;
    int32_t k = e->n_sets - 1;
    begin_set(e);
    for (int64_t i = a; i < z; i++) {
        int32_t el = t->pos_elem[e->items[i].pos];
        if (el < 0 && el != GRAM_END) {
            const uint32_t *s = t->terms + 8 * GRAM_TERM_ID(el);
            if ((s[b >> 5] >> (b & 31) & 1) && add_item(e, e->items[i].pos + 1, e->items[i].origin))
                goto fail;
        }
    }
    if (e->n_items == n0) {
        e->n_sets--;
        return 0;
    }
    if (close_set(e, k))
        goto fail;
    e->set_start[e->n_sets] = (int32_t)e->n_items;
    return 1;
fail:
    e->n_items = n0;
    e->n_sets--;
    return KV_ERANGE;
}

int earley_push_bytes(earley *e, const uint8_t *s, size_t n)
{
    int32_t d = e->n_sets;
    for (size_t i = 0; i < n; i++) {
        int r = earley_push_byte(e, s[i]);
        if (r != 1) {
            earley_truncate(e, d);
            return r;
        }
    }
    return 1;
}

void earley_pop(earley *e)
{
    if (e->n_sets > 1)
        earley_truncate(e, e->n_sets - 1);
}

int32_t earley_depth(const earley *e)
{
    return e->n_sets;
}

void earley_truncate(earley *e, int32_t n_sets)
{
    if (n_sets < 1 || n_sets >= e->n_sets)
        return;
    e->n_items = e->set_start[n_sets];
    e->n_sets = n_sets;
    e->set_start[n_sets] = (int32_t)e->n_items;
}

int earley_accepting(const earley *e)
{
    const gram_tables *t = e->t;
    for (int64_t i = e->set_start[e->n_sets - 1]; i < e->n_items; i++)
        if (e->items[i].pos == t->start_pos + 1 && e->items[i].origin == 0)
            return 1;
    return 0;
}

void earley_allowed_bytes(const earley *e, uint32_t out[8])
{
    const gram_tables *t = e->t;
    memset(out, 0, 8 * sizeof *out);
    for (int64_t i = e->set_start[e->n_sets - 1]; i < e->n_items; i++) {
        int32_t el = t->pos_elem[e->items[i].pos];
        if (el < 0 && el != GRAM_END) {
            const uint32_t *s = t->terms + 8 * GRAM_TERM_ID(el);
            for (int w = 0; w < 8; w++)
                out[w] |= s[w];
        }
    }
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int32_t earley_top_items(const earley *e, int32_t origin_limit, uint64_t *out, int32_t cap)
{
    const gram_tables *t = e->t;
    int32_t k = e->n_sets - 1, n = 0;
    for (int64_t i = e->set_start[k]; i < e->n_items; i++) {
        eitem it = e->items[i];
        if (t->pos_elem[it.pos] == GRAM_END)
            continue;
        if (it.origin != k && it.origin >= origin_limit)
            return -1;
        if (n == cap)
            return -1;
        uint32_t code = it.origin == k ? EARLEY_SELF : (uint32_t)it.origin;
        out[n++] = (uint64_t)(uint32_t)it.pos << 32 | code;
    }
    qsort(out, (size_t)n, sizeof *out, cmp_u64);
    return n;
}

int32_t earley_top_raw(const earley *e, uint64_t *out, int32_t cap)
{
    const gram_tables *t = e->t;
    int32_t n = 0;
    for (int64_t i = e->set_start[e->n_sets - 1]; i < e->n_items; i++) {
        eitem it = e->items[i];
        if (t->pos_elem[it.pos] == GRAM_END)
            continue;
        if (n == cap)
            return -1;
        out[n++] = (uint64_t)(uint32_t)it.pos << 32 | (uint32_t)it.origin;
    }
    return n;
}

uint64_t earley_set_serial(const earley *e, int32_t idx)
{
    return idx >= 0 && idx < e->n_sets ? e->set_serial[idx] : 0;
}

int earley_push_items(earley *e, const uint64_t *items, int32_t n)
{
    if (e->n_items + n > e->t->lim.max_state_items)
        return KV_ERANGE;
    while (e->n_items + n > e->cap_items) {
        eitem *ni = realloc(e->items, (size_t)e->cap_items * 2 * sizeof *ni);
        if (!ni)
            return KV_ENOMEM;
        e->items = ni;
        e->cap_items *= 2;
    }
    int64_t n0 = e->n_items;
    if (push_set(e))
        return KV_ENOMEM;
    int32_t k = e->n_sets - 1;
    for (int32_t i = 0; i < n; i++) {
        uint32_t code = (uint32_t)items[i];
        int32_t o = code == EARLEY_SELF ? k : (int32_t)code;
        if (code != EARLEY_SELF && o >= k) {
            e->n_items = n0;
            e->n_sets--;
            return KV_EINVAL;
        }
        e->items[e->n_items++] = (eitem){(int32_t)(items[i] >> 32), o};
    }
    e->set_start[e->n_sets] = (int32_t)e->n_items;
    return 1;
}

const gram_tables *earley_tables(const earley *e)
{
    return e->t;
}

/* Where set k's items end (the newest set's end is n_items). */
static int64_t set_end(const earley *e, int32_t k)
{
    return k == e->n_sets - 1 ? e->n_items : e->set_start[k + 1];
}

void earley_byte_peers(const earley *e, int32_t idx, uint8_t b, uint32_t out[8])
{
    const gram_tables *t = e->t;
    memset(out, 0xff, 8 * sizeof *out);
    if (idx < 0 || idx >= e->n_sets)
        return;
    for (int64_t i = e->set_start[idx]; i < set_end(e, idx); i++) {
        int32_t el = t->pos_elem[e->items[i].pos];
        if (el >= 0 || el == GRAM_END)
            continue;
        const uint32_t *s = t->terms + 8 * GRAM_TERM_ID(el);
        uint32_t flip = (s[b >> 5] >> (b & 31) & 1) ? 0 : 0xFFFFFFFFu;
        for (int k = 0; k < 8; k++)
            out[k] &= s[k] ^ flip;
    }
}

/* Whether item it of set `set` enters the description (top: the set
 * described). */
static int desc_keeps(const gram_tables *t, eitem it, int top)
{
    int32_t el = t->pos_elem[it.pos];
    return top ? el != GRAM_END : el >= 0 && el != GRAM_END;
}

/* The rank of set index x in sets[0..n) (sorted descending), or -1. */
static int32_t desc_rank(const int32_t *sets, int32_t n, int32_t x)
{
    int32_t lo = 0, hi = n;
    while (lo < hi) {
        int32_t mid = (lo + hi) / 2;
        if (sets[mid] == x)
            return mid;
        if (sets[mid] > x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

int32_t earley_describe(const earley *e, uint64_t *out, int32_t cap, int32_t *sets,
                        int32_t max_sets)
{
    const gram_tables *t = e->t;
    int32_t ns = 1, n = 0;
    if (max_sets < 1)
        return -1;
    sets[0] = e->n_sets - 1;
    for (int32_t si = 0; si < ns; si++) {   /* the sets reached, breadth first */
        int32_t k = sets[si];
        for (int64_t i = e->set_start[k]; i < set_end(e, k); i++) {
            eitem it = e->items[i];
            if (it.origin == k || !desc_keeps(t, it, si == 0))
                continue;
            int32_t j = 0;
            while (j < ns && sets[j] != it.origin)
                j++;
            if (j == ns) {
                if (ns == max_sets)
                    return -1;
                sets[ns++] = it.origin;
            }
        }
    }
    for (int32_t i = 1; i < ns; i++)   /* newest first (insertion sort: few sets) */
        for (int32_t j = i; j > 0 && sets[j] > sets[j - 1]; j--) {
            int32_t x = sets[j];
            sets[j] = sets[j - 1];
            sets[j - 1] = x;
        }
    for (int32_t r = 0; r < ns; r++) {
        int32_t k = sets[r];
        if (n == cap)
            return -1;
        out[n++] = (uint64_t)EARLEY_DESC_SET << 32 | (uint32_t)r;
        int32_t first = n;
        for (int64_t i = e->set_start[k]; i < set_end(e, k); i++) {
            eitem it = e->items[i];
            if (!desc_keeps(t, it, r == 0))
                continue;
            if (n == cap)
                return -1;
            out[n++] = (uint64_t)(uint32_t)it.pos << 32 | (uint32_t)desc_rank(sets, ns, it.origin);
        }
        qsort(out + first, (size_t)(n - first), sizeof *out, cmp_u64);
    }
    return n;
}

size_t earley_mem_bytes(const earley *e)
{
    return sizeof *e + (size_t)e->cap_items * sizeof(eitem) +
           (size_t)e->cap_sets * (sizeof(int32_t) + sizeof(uint64_t)) +
           (size_t)e->hcap * (sizeof(uint64_t) + sizeof(uint32_t)) +
           (size_t)e->t->n_nt * sizeof(uint32_t);
}

int64_t earley_n_items(const earley *e)
{
    return e->n_items;
}
