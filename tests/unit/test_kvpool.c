/* test_kvpool.c - block pool, block tables, copy-on-write, prefix cache.
 *
 * Block contents are simulated by a fake storage (one int per token slot)
 * that the test writes through the block tables and that copy_block copies,
 * so a missing copy-on-write or a wrong share shows up as a sequence reading
 * back tokens that are not its own.
 */
#include <stdlib.h>
#include <string.h>

#include "kv/kvpool.h"
#include "testutil.h"

#define MAX_BLOCKS 256
#define MAX_BS 128

typedef struct store {
    int32_t bs;
    int32_t tok[MAX_BLOCKS][MAX_BS]; /* [n_blocks][block_size] token held */
    uint64_t salt[MAX_BLOCKS];       /* salt of the sequence that wrote it */
    int n_copies;
    int32_t last_dst, last_src;
} store;

static void store_copy(void *ctx, int32_t dst, int32_t src)
{
    store *st = ctx;
    memcpy(st->tok[dst], st->tok[src], sizeof st->tok[dst]);
    st->salt[dst] = st->salt[src];
    st->n_copies++;
    st->last_dst = dst;
    st->last_src = src;
}

static int n_evicted; /* evict hook calls */

static void count_evict(void *ctx, int32_t b)
{
    (void)ctx;
    (void)b;
    n_evicted++;
}

static kvpool *make_pool_max(store *st, int32_t n_blocks, int32_t max_blocks, int32_t bs,
                             int prefix);

static kvpool *make_pool(store *st, int32_t n_blocks, int32_t bs, int prefix)
{
    return make_pool_max(st, n_blocks, 0, bs, prefix);
}

static kvpool *make_pool_max(store *st, int32_t n_blocks, int32_t max_blocks, int32_t bs,
                             int prefix)
{
    memset(st, 0, sizeof *st);
    st->bs = bs;
    st->last_dst = st->last_src = -1;
    kvpool_config c = kvpool_config_default();
    c.n_blocks = n_blocks;
    c.max_blocks = max_blocks;
    c.block_size = bs;
    c.prefix_cache = prefix;
    c.model_hash = 0x1234abcdULL;
    c.evict_block = count_evict;
    c.copy_block = store_copy;
    c.copy_ctx = st;
    kvant_err err = {0};
    kvpool *p = kvpool_create(&c, &err);
    CHECKF(p != NULL, "%s", err.msg);
    return p;
}

/* Writes tokens[from..to) through s's table; each written block must be
 * exclusively owned at that moment. */
static int store_write(store *st, const kvpool *p, const kv_seq *s, const int32_t *tokens,
                       int64_t from, int64_t to)
{
    int ok = 1;
    for (int64_t i = from; i < to; i++) {
        int32_t b = s->blocks[i / st->bs];
        if (kvpool_refcount(p, b) != 1)
            ok = 0;
        st->tok[b][i % st->bs] = tokens[i];
        st->salt[b] = s->salt;
    }
    return ok;
}

/* 1 when s reads back exactly tokens[0..s->n_tokens). */
static int store_readback(const store *st, const kv_seq *s, const int32_t *tokens)
{
    for (int64_t i = 0; i < s->n_tokens; i++)
        if (st->tok[s->blocks[i / st->bs]][i % st->bs] != tokens[i])
            return 0;
    return 1;
}

static void rand_tokens(tu_rng *r, int32_t *t, int n)
{
    for (int i = 0; i < n; i++)
        t[i] = (int32_t)(tu_rand_u64(r) % 50000);
}

static int check_pool(const kvpool *p, const kv_seq *const *seqs, int n)
{
    kvant_err err = {0};
    int rc = kvpool_check(p, seqs, n, &err);
    CHECKF(rc == 0, "kvpool_check: %s", err.msg);
    return rc == 0;
}

static void test_create_errors(void)
{
    kvant_err err = {0};
    kvpool_config c = kvpool_config_default();
    c.block_size = 12;
    CHECK(kvpool_create(&c, &err) == NULL && err.code == KV_EINVAL);
    c.block_size = 256;
    CHECK(kvpool_create(&c, &err) == NULL && err.code == KV_EINVAL);
    c = kvpool_config_default();
    c.n_blocks = 0;
    CHECK(kvpool_create(&c, &err) == NULL && err.code == KV_EINVAL);
    CHECK(kvpool_create(NULL, &err) == NULL);
}

static void test_alloc_until_empty(void)
{
    static store st;
    kvpool *p = make_pool(&st, 8, 16, 1);
    kv_seq s;
    kvseq_init(&s, 7);
    for (int i = 1; i <= 8; i++) {
        CHECK(kvseq_blocks_needed(p, &s, 0, (int64_t)i * 16) == 1);
        CHECK(kvseq_reserve(p, &s, 0, (int64_t)i * 16) == KV_OK);
        CHECK(s.n_blocks == i && kvpool_n_available(p) == 8 - i);
    }
    int32_t copy[8];
    memcpy(copy, s.blocks, sizeof copy);
    kvpool_stats a, b;
    memset(&a, 0, sizeof a); /* memcmp below also compares padding */
    memset(&b, 0, sizeof b);
    kvpool_get_stats(p, &a);
    CHECK(kvseq_reserve(p, &s, 0, 8 * 16 + 1) == KV_ENOMEM);
    kvpool_get_stats(p, &b);
    CHECK(memcmp(&a, &b, sizeof a) == 0);
    CHECK(s.n_blocks == 8 && memcmp(copy, s.blocks, sizeof copy) == 0);
    CHECK(a.n_used == 8 && a.n_free == 0);
    const kv_seq *seqs[1] = {&s};
    check_pool(p, seqs, 1);
    kvseq_release(p, &s);
    /* a reserve needing 3 with 2 available changes nothing */
    kv_seq t, u;
    kvseq_init(&t, 7);
    kvseq_init(&u, 7);
    CHECK(kvseq_reserve(p, &t, 0, 6 * 16) == KV_OK);
    CHECK(kvseq_reserve(p, &u, 0, 3 * 16) == KV_ENOMEM);
    CHECK(u.n_blocks == 0 && kvpool_n_available(p) == 2);
    CHECK(kvseq_reserve(p, &u, 0, 2 * 16) == KV_OK && kvpool_n_available(p) == 0);
    CHECK(kvseq_reserve(p, &u, 5, 4) == KV_EINVAL && kvseq_reserve(p, &u, -1, 4) == KV_EINVAL);
    const kv_seq *two[2] = {&t, &u};
    check_pool(p, two, 2);
    kvseq_release(p, &t);
    kvseq_release(p, &u);
    CHECK(kvpool_n_available(p) == 8);
    check_pool(p, NULL, 0);
    kvpool_destroy(p);
}

static void test_reserve_growth(void)
{
    static store st;
    kvpool *p = make_pool(&st, 64, 16, 1);
    kv_seq s;
    kvseq_init(&s, 1);
    int ok = 1;
    for (int64_t n = 1; n <= 64 * 16; n++) {
        int32_t need = kvseq_blocks_needed(p, &s, n - 1, n);
        if (kvseq_reserve(p, &s, n - 1, n) != KV_OK)
            ok = 0;
        int64_t want = (n + 15) / 16;
        if (s.n_blocks != want || need != (n % 16 == 1 ? 1 : 0))
            ok = 0;
        if (s.n_tokens != 0) /* reserve never changes n_tokens */
            ok = 0;
    }
    CHECK(ok);
    CHECK(kvseq_reserve(p, &s, 64 * 16, 64 * 16 + 1) == KV_ENOMEM && s.n_blocks == 64);
    kvseq_release(p, &s);
    CHECK(s.n_blocks == 0 && s.blocks == NULL && s.salt == 1);
    kvpool_destroy(p);
}

static void test_fork_cow(void)
{
    static store st;
    kvpool *p = make_pool(&st, 16, 16, 1);
    tu_rng r = {42};
    int32_t tok[64];
    rand_tokens(&r, tok, 64);
    kv_seq a, c;
    kvseq_init(&a, 3);
    kvseq_init(&c, 99);
    CHECK(kvseq_reserve(p, &a, 0, 20) == KV_OK);
    CHECK(store_write(&st, p, &a, tok, 0, 20));
    kvseq_commit(p, &a, tok, 20);
    CHECK(a.n_hashed == 1);
    kvant_err err = {0};
    CHECK(kvseq_fork(p, &a, &c, &err) == KV_OK);
    CHECK(c.salt == 3 && c.n_tokens == 20 && c.n_blocks == 2);
    CHECK(kvpool_refcount(p, a.blocks[0]) == 2 && kvpool_refcount(p, a.blocks[1]) == 2);
    CHECK(kvseq_fork(p, &a, &c, &err) == KV_EINVAL); /* child not empty */
    const kv_seq *seqs[2] = {&a, &c};
    check_pool(p, seqs, 2);
    /* child writes token 20: exactly one copy of block 1 */
    int32_t ctok[64];
    memcpy(ctok, tok, sizeof ctok);
    ctok[20] = 77777;
    int32_t shared = a.blocks[1];
    CHECK(kvseq_blocks_needed(p, &c, 20, 21) == 1);
    CHECK(kvseq_reserve(p, &c, 20, 21) == KV_OK);
    CHECK(st.n_copies == 1 && st.last_src == shared && st.last_dst == c.blocks[1]);
    CHECK(c.blocks[1] != shared && c.blocks[0] == a.blocks[0]);
    CHECK(kvpool_refcount(p, shared) == 1 && kvpool_refcount(p, c.blocks[1]) == 1);
    CHECK(store_write(&st, p, &c, ctok, 20, 21));
    kvseq_commit(p, &c, ctok, 21);
    CHECK(store_readback(&st, &a, tok) && store_readback(&st, &c, ctok));
    CHECK(st.tok[shared][3] == tok[19] && st.tok[shared][4] != 77777); /* parent untouched */
    /* the parent's own write needs no copy now */
    CHECK(kvseq_reserve(p, &a, 20, 21) == KV_OK && st.n_copies == 1);
    CHECK(store_write(&st, p, &a, tok, 20, 21));
    kvseq_commit(p, &a, tok, 21);
    CHECK(store_readback(&st, &a, tok) && store_readback(&st, &c, ctok));
    /* rewriting the registered full block 0 copies it even at refcount 1 */
    kvseq_release(p, &c);
    CHECK(kvpool_refcount(p, a.blocks[0]) == 1);
    int32_t b0 = a.blocks[0];
    CHECK(kvseq_reserve(p, &a, 3, 21) == KV_OK);
    CHECK(st.n_copies == 2 && st.last_src == b0 && a.blocks[0] != b0);
    CHECK(a.n_hashed == 0 && a.last_hash == 0 && store_readback(&st, &a, tok));
    kvpool_stats sts;
    kvpool_get_stats(p, &sts);
    CHECK(sts.cow_copies == 2 && sts.n_cached == 1); /* b0 stays cached */
    const kv_seq *one[1] = {&a};
    check_pool(p, one, 1);
    kvseq_release(p, &a);
    kvpool_destroy(p);
}

static int64_t match_tokens(kvpool *p, const int32_t *tok, int64_t n, uint64_t salt)
{
    kv_seq s;
    kvseq_init(&s, salt);
    int64_t m = kvseq_match_prefix(p, &s, tok, n);
    CHECK(s.n_tokens == m && s.n_blocks * kvpool_block_size(p) == m);
    const kv_seq *one[1] = {&s};
    check_pool(p, one, 1);
    kvseq_release(p, &s);
    return m;
}

static void commit_seq(store *st, kvpool *p, kv_seq *s, const int32_t *tok, int64_t n)
{
    int64_t m = kvseq_match_prefix(p, s, tok, n);
    CHECK(kvseq_reserve(p, s, m, n) == KV_OK);
    CHECK(store_write(st, p, s, tok, m, n));
    kvseq_commit(p, s, tok, n);
}

static void test_prefix(void)
{
    static store st;
    kvpool *p = make_pool(&st, 64, 16, 1);
    tu_rng r = {7};
    int32_t tok[100], other[100];
    rand_tokens(&r, tok, 100);
    kv_seq s;
    kvseq_init(&s, 5);
    commit_seq(&st, p, &s, tok, 100);
    CHECK(s.n_hashed == 6 && s.n_blocks == 7);
    kvseq_release(p, &s);
    kvpool_stats a;
    kvpool_get_stats(p, &a);
    CHECK(a.n_cached == 6 && a.n_free == 58 && a.n_used == 0);
    CHECK(match_tokens(p, tok, 70, 5) == 64);
    CHECK(match_tokens(p, tok, 70, 6) == 0);
    memcpy(other, tok, sizeof other);
    other[0] ^= 1;
    CHECK(match_tokens(p, other, 70, 5) == 0);
    CHECK(match_tokens(p, tok, 64, 5) == 48);
    CHECK(match_tokens(p, tok, 65, 5) == 64);
    CHECK(match_tokens(p, tok, 16, 5) == 0 && match_tokens(p, tok, 17, 5) == 16);
    other[0] = tok[0];
    other[40] ^= 1; /* differs in block 2 */
    CHECK(match_tokens(p, other, 100, 5) == 32);
    kvpool_get_stats(p, &a);
    CHECK(a.prefix_queries == 70 * 3 + 64 + 65 + 16 + 17 + 100 + 100);
    CHECK(a.prefix_hits == 64 + 48 + 64 + 16 + 32);
    CHECK(a.n_cached == 6 && a.evictions == 0);
    /* a second sequence whose matched blocks are reused and data is right */
    kvseq_init(&s, 5);
    commit_seq(&st, p, &s, other, 100);
    CHECK(s.n_hashed == 6 && store_readback(&st, &s, other));
    kvseq_release(p, &s);
    kvpool_get_stats(p, &a);
    CHECK(a.n_cached == 10);
    /* an identical block computed without matching stays unregistered */
    kv_seq d;
    kvseq_init(&d, 5);
    CHECK(kvseq_reserve(p, &d, 0, 40) == KV_OK);
    CHECK(store_write(&st, p, &d, tok, 0, 40));
    kvseq_commit(p, &d, tok, 40);
    CHECK(d.n_hashed == 2);
    kvseq_release(p, &d);
    kvpool_get_stats(p, &a);
    CHECK(a.n_cached == 10 && a.n_used == 0);
    check_pool(p, NULL, 0);
    kvpool_clear_cache(p);
    kvpool_get_stats(p, &a);
    CHECK(a.n_cached == 0 && a.n_free == 64);
    CHECK(match_tokens(p, tok, 70, 5) == 0);
    check_pool(p, NULL, 0);
    kvpool_destroy(p);

    /* prefix caching off: nothing hashed, cached or matched */
    p = make_pool(&st, 64, 16, 0);
    kvseq_init(&s, 5);
    commit_seq(&st, p, &s, tok, 100);
    CHECK(s.n_hashed == 0);
    kvseq_release(p, &s);
    kvpool_get_stats(p, &a);
    CHECK(a.n_cached == 0 && a.n_free == 64);
    CHECK(match_tokens(p, tok, 70, 5) == 0);
    check_pool(p, NULL, 0);
    kvpool_destroy(p);
}

static void test_lru(void)
{
    static store st;
    kvpool *p = make_pool(&st, 8, 8, 1);
    tu_rng r = {11};
    int32_t ta[24], tb[24];
    rand_tokens(&r, ta, 24);
    rand_tokens(&r, tb, 24);
    kv_seq a, b, c;
    kvseq_init(&a, 1);
    kvseq_init(&b, 1);
    kvseq_init(&c, 1);
    commit_seq(&st, p, &a, ta, 24);
    commit_seq(&st, p, &b, tb, 24);
    int32_t ab[3], bb[3];
    memcpy(ab, a.blocks, sizeof ab);
    memcpy(bb, b.blocks, sizeof bb);
    kvseq_release(p, &a); /* older */
    kvseq_release(p, &b); /* newer */
    kvpool_stats s0;
    kvpool_get_stats(p, &s0);
    CHECK(s0.n_cached == 6 && s0.n_free == 2);
    /* 2 free blocks first, then the tail of a, then its middle */
    CHECK(kvseq_reserve(p, &c, 0, 8 * 3) == KV_OK);
    CHECK(c.blocks[2] == ab[2]);
    CHECK(kvseq_reserve(p, &c, 0, 8 * 4) == KV_OK && c.blocks[3] == ab[1]);
    CHECK(kvseq_reserve(p, &c, 0, 8 * 5) == KV_OK && c.blocks[4] == ab[0]);
    CHECK(kvseq_reserve(p, &c, 0, 8 * 6) == KV_OK && c.blocks[5] == bb[2]);
    kvpool_stats s1;
    kvpool_get_stats(p, &s1);
    CHECK(s1.evictions == 4 && s1.n_cached == 2 && s1.n_used == 6);
    const kv_seq *one[1] = {&c};
    check_pool(p, one, 1);
    kvseq_release(p, &c);
    CHECK(match_tokens(p, ta, 24, 1) == 0);
    CHECK(match_tokens(p, tb, 24, 1) == 16);
    /* reuse moves a cached block out of the LRU list: b's head survives */
    kvseq_init(&a, 1);
    CHECK(kvseq_match_prefix(p, &a, tb, 9) == 8 && a.blocks[0] == bb[0]);
    CHECK(kvseq_reserve(p, &c, 0, 8 * 7) == KV_OK);
    CHECK(kvpool_n_available(p) == 0);
    for (int i = 0; i < 7; i++)
        CHECK(c.blocks[i] != bb[0]);
    kvseq_release(p, &c);
    kvseq_release(p, &a);
    kvpool_destroy(p);
}

/* ---- property test ---- */

#define PT_SEQS 16
#define PT_MAX_TOK 512
#define PT_PREFIXES 4
#define PT_PREFIX_LEN 48

typedef struct pt_seq {
    int live;
    kv_seq s;
    int32_t tok[PT_MAX_TOK + 64]; /* shadow of committed tokens */
} pt_seq;

typedef struct pt_state {
    kvpool *p;
    store *st;
    tu_rng r;
    pt_seq seq[PT_SEQS];
    int32_t prefix[PT_PREFIXES][PT_PREFIX_LEN];
    int fails;
    int resize;         /* grow and shrink the pool between operations */
    int grows, shrinks; /* resizes that changed the size */
} pt_state;

static int pt_rand(pt_state *t, int n) { return (int)(tu_rand_u64(&t->r) % (unsigned)n); }

static void pt_fail(pt_state *t, int line)
{
    if (t->fails++ == 0)
        fprintf(stderr, "property: first failure at %s:%d\n", __FILE__, line);
}

static int pt_free_slot(pt_state *t)
{
    for (int i = 0; i < PT_SEQS; i++)
        if (!t->seq[i].live)
            return i;
    return -1;
}

static int pt_live_slot(pt_state *t)
{
    int k = pt_rand(t, PT_SEQS);
    for (int i = 0; i < PT_SEQS; i++)
        if (t->seq[(k + i) % PT_SEQS].live)
            return (k + i) % PT_SEQS;
    return -1;
}

/* Reserve then write tok[from..n) and commit; on KV_ENOMEM checks that
 * nothing changed.  Returns the reserve status. */
static int pt_write(pt_state *t, pt_seq *q, int64_t from, int64_t n)
{
    kv_seq before = q->s;
    int32_t blocks[PT_MAX_TOK];
    if (q->s.n_blocks > 0)
        memcpy(blocks, q->s.blocks, (size_t)q->s.n_blocks * sizeof *blocks);
    kvpool_stats a, b;
    memset(&a, 0, sizeof a); /* memcmp below also compares padding */
    memset(&b, 0, sizeof b);
    kvpool_get_stats(t->p, &a);
    int32_t need = kvseq_blocks_needed(t->p, &q->s, from, n);
    int32_t avail = kvpool_n_available(t->p);
    int rc = kvseq_reserve(t->p, &q->s, from, n);
    if ((rc == KV_OK) != (need <= avail))
        pt_fail(t, __LINE__);
    if (rc != KV_OK) {
        kvpool_get_stats(t->p, &b);
        if (rc != KV_ENOMEM || memcmp(&a, &b, sizeof a) != 0 ||
            before.n_blocks != q->s.n_blocks || before.n_hashed != q->s.n_hashed ||
            before.last_hash != q->s.last_hash ||
            (before.n_blocks > 0 &&
             memcmp(blocks, q->s.blocks, (size_t)before.n_blocks * sizeof *blocks) != 0))
            pt_fail(t, __LINE__);
        return rc;
    }
    if (!store_write(t->st, t->p, &q->s, q->tok, from, n))
        pt_fail(t, __LINE__);
    kvseq_commit(t->p, &q->s, q->tok, n);
    return rc;
}

static void pt_new_seq(pt_state *t)
{
    int i = pt_free_slot(t);
    if (i < 0)
        return;
    pt_seq *q = &t->seq[i];
    kvseq_init(&q->s, 1 + (uint64_t)pt_rand(t, 3));
    int pre = pt_rand(t, PT_PREFIX_LEN + 1), suf = 1 + pt_rand(t, 40);
    memcpy(q->tok, t->prefix[pt_rand(t, PT_PREFIXES)], (size_t)pre * sizeof *q->tok);
    rand_tokens(&t->r, q->tok + pre, suf);
    if (pre < PT_PREFIX_LEN) /* the prompt leaves the shared prefix at pre */
        q->tok[pre] = (int32_t)(50000 + pt_rand(t, 1000));
    int64_t n = pre + suf;
    q->live = 1;
    int64_t m = kvseq_match_prefix(t->p, &q->s, q->tok, n);
    if (m % t->st->bs != 0 || m > n - 1 || m > pre)
        pt_fail(t, __LINE__);
    for (int32_t k = 0; k < q->s.n_blocks; k++)
        if (t->st->salt[q->s.blocks[k]] != q->s.salt)
            pt_fail(t, __LINE__);
    if (pt_write(t, q, m, n) != KV_OK) { /* cancelled: not admitted */
        kvseq_release(t->p, &q->s);
        q->live = 0;
    }
}

static void pt_append(pt_state *t, int max_k)
{
    int i = pt_live_slot(t);
    if (i < 0)
        return;
    pt_seq *q = &t->seq[i];
    int64_t n0 = q->s.n_tokens, k = 1 + pt_rand(t, max_k);
    if (n0 + k > PT_MAX_TOK)
        return;
    rand_tokens(&t->r, q->tok + n0, (int)k);
    pt_write(t, q, n0, n0 + k);
}

/* Rewrites from a random position (roll-back then new tokens). */
static void pt_rewrite(pt_state *t)
{
    int i = pt_live_slot(t);
    if (i < 0)
        return;
    pt_seq *q = &t->seq[i];
    int64_t from = pt_rand(t, (int)q->s.n_tokens + 1), k = 1 + pt_rand(t, 20);
    if (from + k > PT_MAX_TOK)
        return;
    int64_t n0 = q->s.n_tokens;
    int32_t saved[PT_MAX_TOK];
    memcpy(saved, q->tok, (size_t)n0 * sizeof *saved);
    rand_tokens(&t->r, q->tok + from, (int)k);
    if (pt_write(t, q, from, from + k) != KV_OK)
        memcpy(q->tok, saved, (size_t)n0 * sizeof *saved);
}

static void pt_fork(pt_state *t)
{
    int i = pt_live_slot(t), j = pt_free_slot(t);
    if (i < 0 || j < 0)
        return;
    kvseq_init(&t->seq[j].s, 1000);
    kvant_err err = {0};
    if (kvseq_fork(t->p, &t->seq[i].s, &t->seq[j].s, &err) != KV_OK) {
        pt_fail(t, __LINE__);
        return;
    }
    memcpy(t->seq[j].tok, t->seq[i].tok, sizeof t->seq[j].tok);
    t->seq[j].live = 1;
}

/* Grows or shrinks to a random size; a shrink must stop exactly at the
 * highest held block (or the target) and keep every id below. */
static void pt_resize(pt_state *t)
{
    kvpool_stats a;
    kvpool_get_stats(t->p, &a);
    const int32_t max = kvpool_max_blocks(t->p);
    if (pt_rand(t, 2)) {
        int32_t n = a.n_blocks + pt_rand(t, max - a.n_blocks + 1);
        if (kvpool_grow(t->p, n) != KV_OK)
            pt_fail(t, __LINE__);
        t->grows += n > a.n_blocks;
        return;
    }
    int32_t target = 1 + pt_rand(t, a.n_blocks);
    int32_t got = kvpool_shrink(t->p, target);
    if (got < target || got > a.n_blocks)
        pt_fail(t, __LINE__);
    if (got > target && kvpool_refcount(t->p, got - 1) <= 0)
        pt_fail(t, __LINE__); /* stopped before a block nobody holds */
    for (int i = 0; i < PT_SEQS; i++)
        for (int32_t k = 0; t->seq[i].live && k < t->seq[i].s.n_blocks; k++)
            if (t->seq[i].s.blocks[k] >= got)
                pt_fail(t, __LINE__); /* a held block was cut */
    t->shrinks += got < a.n_blocks;
}

static void pt_step(pt_state *t)
{
    if (t->resize && pt_rand(t, 100) < 3) {
        pt_resize(t);
        return;
    }
    int op = pt_rand(t, 100);
    if (op < 20) {
        pt_new_seq(t);
    } else if (op < 55) {
        pt_append(t, op < 45 ? 3 : 24);
    } else if (op < 62) {
        pt_fork(t);
    } else if (op < 80) {
        int i = pt_live_slot(t);
        if (i >= 0) {
            kvseq_release(t->p, &t->seq[i].s);
            t->seq[i].live = 0;
        }
    } else if (op < 88) {
        pt_rewrite(t);
    } else if (op < 94) { /* reserve ahead, sometimes beyond the pool */
        int i = pt_live_slot(t);
        if (i >= 0) {
            pt_seq *q = &t->seq[i];
            int64_t n = q->s.n_tokens + pt_rand(t, 700);
            if (n <= PT_MAX_TOK || pt_rand(t, 2)) {
                int32_t need = kvseq_blocks_needed(t->p, &q->s, q->s.n_tokens, n);
                int32_t avail = kvpool_n_available(t->p);
                int rc = kvseq_reserve(t->p, &q->s, q->s.n_tokens, n);
                if ((rc == KV_OK) != (need <= avail))
                    pt_fail(t, __LINE__);
            }
        }
    } else if (op < 99) { /* roll back without rewriting */
        int i = pt_live_slot(t);
        if (i >= 0) {
            pt_seq *q = &t->seq[i];
            kvseq_commit(t->p, &q->s, q->tok, pt_rand(t, (int)q->s.n_tokens + 1));
        }
    } else if (pt_rand(t, 10) == 0) {
        kvpool_clear_cache(t->p);
    }
}

static int pt_verify(pt_state *t)
{
    const kv_seq *live[PT_SEQS];
    int n = 0, ok = 1;
    for (int i = 0; i < PT_SEQS; i++) {
        if (!t->seq[i].live)
            continue;
        live[n++] = &t->seq[i].s;
        if (!store_readback(t->st, &t->seq[i].s, t->seq[i].tok))
            ok = 0;
    }
    kvant_err err = {0};
    if (kvpool_check(t->p, live, n, &err) != 0) {
        fprintf(stderr, "kvpool_check: %s\n", err.msg);
        ok = 0;
    }
    return ok && t->fails == 0;
}

static void test_property(int prefix_cache, uint64_t seed, int n_ops, int resize)
{
    static store st;
    static pt_state t;
    memset(&t, 0, sizeof t);
    t.st = &st;
    t.resize = resize;
    t.p = resize ? make_pool_max(&st, 64, 160, 8, prefix_cache) : make_pool(&st, 64, 8, prefix_cache);
    t.r.s = seed;
    for (int k = 0; k < PT_PREFIXES; k++)
        rand_tokens(&t.r, t.prefix[k], PT_PREFIX_LEN);
    int step = 0;
    for (; step < n_ops; step++) {
        pt_step(&t);
        if (!pt_verify(&t))
            break;
    }
    CHECKF(step == n_ops, "property (cache %d) failed at step %d (fails %d)", prefix_cache,
           step, t.fails);
    kvpool_stats a;
    kvpool_get_stats(t.p, &a);
    fprintf(stderr, "property cache=%d: queries %llu hits %llu evictions %llu copies %llu\n",
            prefix_cache, (unsigned long long)a.prefix_queries,
            (unsigned long long)a.prefix_hits, (unsigned long long)a.evictions,
            (unsigned long long)a.cow_copies);
    CHECK(a.cow_copies > 100 && a.prefix_queries > 0);
    if (prefix_cache)
        CHECK(a.prefix_hits > 1000 && a.evictions > 100);
    for (int i = 0; i < PT_SEQS; i++)
        if (t.seq[i].live) {
            kvseq_release(t.p, &t.seq[i].s);
            t.seq[i].live = 0;
        }
    check_pool(t.p, NULL, 0);
    if (resize) {
        fprintf(stderr, "property resize: %d grows, %d shrinks\n", t.grows, t.shrinks);
        CHECK(t.grows > 100 && t.shrinks > 100);
        CHECK(kvpool_shrink(t.p, 64) == 64 || kvpool_grow(t.p, 64) == KV_OK);
    }
    kvpool_get_stats(t.p, &a);
    CHECK(a.n_blocks == 64 && a.n_used == 0 && a.n_free + a.n_cached == 64);
    kvpool_clear_cache(t.p);
    kvpool_get_stats(t.p, &a);
    CHECK(a.n_free == 64 && a.n_cached == 0);
    check_pool(t.p, NULL, 0);
    kvpool_destroy(t.p);
}

static const kv_seq *const *one_of(const kv_seq *s)
{
    static const kv_seq *one[1];
    one[0] = s;
    return one;
}

/* A drain ended by a grow: the unreferenced draining blocks are free
 * again, the held ones stay with their holder. */
static void test_drain_grow(void)
{
    static store st;
    kvpool *p = make_pool_max(&st, 16, 16, 16, 0);
    kv_seq a, b;
    kvseq_init(&a, 1);
    kvseq_init(&b, 1);
    CHECK(kvseq_reserve(p, &a, 0, 10 * 16) == KV_OK); /* 0..9 */
    CHECK(kvseq_reserve(p, &b, 0, 2 * 16) == KV_OK);  /* 10, 11 */
    kvseq_release(p, &a);
    CHECK(kvpool_shrink(p, 4) == 12); /* 11 held: 4..11 drain */
    kvpool_stats s;
    kvpool_get_stats(p, &s);
    CHECK(s.n_free == 4 && s.n_draining == 6 && s.n_used == 2 && kvpool_n_available(p) == 4);
    check_pool(p, one_of(&b), 1);
    kv_seq c;
    kvseq_init(&c, 1);
    CHECK(kvseq_reserve(p, &c, 0, 5 * 16) == KV_ENOMEM); /* only 0..3 are handed out */
    CHECK(kvseq_reserve(p, &c, 0, 4 * 16) == KV_OK);
    for (int i = 0; i < 4; i++)
        CHECK(c.blocks[i] < 4);
    kvseq_release(p, &c);
    CHECK(kvpool_grow(p, 11) == KV_EINVAL);
    CHECK(kvpool_grow(p, 12) == KV_OK); /* same size: ends the drain */
    kvpool_get_stats(p, &s);
    CHECK(s.n_blocks == 12 && s.n_free == 10 && s.n_draining == 0 && kvpool_n_available(p) == 10);
    check_pool(p, one_of(&b), 1);
    kvseq_release(p, &b);
    check_pool(p, NULL, 0);
    CHECK(kvpool_shrink(p, 1) == 1);
    kvpool_destroy(p);
}

/* Grow adds ids at the end, handed out after the older free blocks;
 * shrink gives back only a tail nobody holds (cached blocks there are
 * evicted through the hook), and ids below never move. */
static void test_resize(void)
{
    static store st;
    kvant_err err = {0};
    kvpool_config c = kvpool_config_default();
    c.n_blocks = 8;
    c.max_blocks = 4;
    CHECK(kvpool_create(&c, &err) == NULL && err.code == KV_EINVAL);
    c.max_blocks = KVPOOL_MAX_BLOCKS + 1;
    CHECK(kvpool_create(&c, &err) == NULL && err.code == KV_EINVAL);
    kvpool *p = make_pool_max(&st, 8, 32, 16, 1);
    CHECK(kvpool_max_blocks(p) == 32);
    int32_t tok[32 * 16];
    for (int i = 0; i < 32 * 16; i++)
        tok[i] = 100 + i;
    kv_seq a, b;
    kvseq_init(&a, 1);
    kvseq_init(&b, 1);
    CHECK(kvseq_reserve(p, &a, 0, 6 * 16) == KV_OK);
    store_write(&st, p, &a, tok, 0, 6 * 16);
    kvseq_commit(p, &a, tok, 6 * 16);
    int32_t a_ids[6];
    memcpy(a_ids, a.blocks, sizeof a_ids);
    CHECK(kvpool_grow(p, 7) == KV_EINVAL && kvpool_grow(p, 33) == KV_EINVAL);
    CHECK(kvpool_grow(p, 16) == KV_OK);
    kvpool_stats s;
    kvpool_get_stats(p, &s);
    CHECK(s.n_blocks == 16 && s.n_used == 6 && s.n_free == 10);
    CHECK(memcmp(a_ids, a.blocks, sizeof a_ids) == 0 && store_readback(&st, &a, tok));
    /* the two old free blocks first, then the new ids in order */
    CHECK(kvseq_reserve(p, &b, 0, 6 * 16) == KV_OK);
    CHECK(b.blocks[0] == 6 && b.blocks[1] == 7 && b.blocks[2] == 8 && b.blocks[5] == 11);
    const kv_seq *two[2] = {&a, &b};
    check_pool(p, two, 2);
    /* b holds block 11: the cut stops above it, and 8..11 drain */
    CHECK(kvpool_shrink(p, 8) == 12);
    kvpool_get_stats(p, &s);
    CHECK(s.n_blocks == 12 && s.n_free == 0 && s.n_draining == 0 && kvpool_refcount(p, 12) == -1);
    check_pool(p, two, 2);
    CHECK(kvpool_shrink(p, 20) == 12); /* not smaller */
    /* b's blocks are registered prefix blocks: 6, 7 become cached, the
     * draining 8..11 are evicted and go to no list */
    store_write(&st, p, &b, tok + 6 * 16, 0, 6 * 16);
    kvseq_commit(p, &b, tok + 6 * 16, 6 * 16);
    n_evicted = 0;
    kvseq_release(p, &b);
    kvpool_get_stats(p, &s);
    CHECK(s.n_cached == 2 && s.n_draining == 4 && s.n_free == 0 && s.evictions == 4);
    CHECK(n_evicted == 4 && kvpool_n_available(p) == 2);
    check_pool(p, one_of(&a), 1);
    /* the next shrink reaches its target; then the cached 6, 7 go too */
    CHECK(kvpool_shrink(p, 8) == 8);
    kvpool_get_stats(p, &s);
    CHECK(s.n_blocks == 8 && s.n_draining == 0 && s.n_cached == 2);
    CHECK(kvpool_shrink(p, 6) == 6);
    kvpool_get_stats(p, &s);
    CHECK(s.n_blocks == 6 && s.n_cached == 0 && s.n_free == 0 && s.evictions == 6);
    CHECK(n_evicted == 6);
    const kv_seq *one[1] = {&a};
    check_pool(p, one, 1);
    CHECK(memcmp(a_ids, a.blocks, sizeof a_ids) == 0 && store_readback(&st, &a, tok));
    kv_seq m;
    kvseq_init(&m, 1);
    CHECK(kvseq_match_prefix(p, &m, tok + 6 * 16, 6 * 16) == 0); /* gone with the tail */
    /* a's own prefix is still served; a full pool refuses until it grows */
    CHECK(kvseq_reserve(p, &b, 0, 1) == KV_ENOMEM);
    CHECK(kvpool_grow(p, 32) == KV_OK && kvseq_reserve(p, &b, 0, 1) == KV_OK);
    CHECK(b.blocks[0] == 6);
    kvseq_release(p, &b);
    kvseq_release(p, &a);
    CHECK(kvpool_shrink(p, 0) == 1);
    kvpool_get_stats(p, &s);
    CHECK(s.n_blocks == 1 && s.n_used == 0 && s.n_free + s.n_cached == 1);
    check_pool(p, NULL, 0);
    kvpool_destroy(p);
}

/* Caller-owned tables (kvseq_init_fixed): reserve, match, fork and release
 * use the caller's array and never replace it; past its capacity they fail
 * as an allocation failure would, changing nothing. */
static void test_fixed_tables(void)
{
    static store st;
    kvpool *p = make_pool(&st, 32, 16, 1);
    tu_rng r = {11};
    int32_t tok[128];
    rand_tokens(&r, tok, 128);
    int32_t ta[4], tc[4], td[2];
    kv_seq a, c, d;
    kvseq_init_fixed(&a, 5, ta, 4);
    kvseq_init_fixed(&c, 5, tc, 4);
    kvseq_init_fixed(&d, 5, td, 2);
    CHECK(a.fixed && a.blocks == ta && a.cap == 4 && a.n_blocks == 0);
    CHECK(kvseq_reserve(p, &a, 0, 50) == KV_OK && a.blocks == ta && a.n_blocks == 4);
    CHECK(store_write(&st, p, &a, tok, 0, 50));
    kvseq_commit(p, &a, tok, 50);
    int avail = kvpool_n_available(p);
    CHECK(kvseq_reserve(p, &a, 50, 65) == KV_ENOMEM); /* a fifth block: past the table */
    CHECK(a.n_blocks == 4 && a.blocks == ta && kvpool_n_available(p) == avail);
    kvant_err err = {0};
    CHECK(kvseq_fork(p, &a, &d, &err) == KV_ENOMEM && d.n_blocks == 0 && d.blocks == td);
    CHECK(kvseq_fork(p, &a, &c, &err) == KV_OK && c.blocks == tc && c.cap == 4);
    CHECK(c.n_blocks == 4 && memcmp(ta, tc, sizeof ta) == 0 && c.n_tokens == 50);
    CHECK(kvpool_refcount(p, ta[0]) == 2 && store_readback(&st, &c, tok));
    const kv_seq *two[2] = {&a, &c};
    check_pool(p, two, 2);
    kvseq_release(p, &c);
    CHECK(c.fixed && c.blocks == tc && c.cap == 4 && c.n_blocks == 0 && c.salt == 5);
    kvseq_release(p, &a);
    CHECK(a.fixed && a.blocks == ta && a.n_blocks == 0 && a.n_tokens == 0);
    /* a match stops at the table's end: 3 cached full blocks, a table of 2 */
    CHECK(kvseq_match_prefix(p, &d, tok, 50) == 32 && d.n_blocks == 2 && d.blocks == td);
    const kv_seq *one[1] = {&d};
    check_pool(p, one, 1);
    kvseq_release(p, &d);
    /* the table is reused after a release */
    CHECK(kvseq_match_prefix(p, &a, tok, 50) == 48 && a.blocks == ta);
    kvseq_release(p, &a);
    check_pool(p, NULL, 0);
    kvpool_destroy(p);
}

/* Sliding-window groups: kvseq_drop_before gives blocks back (registered
 * ones to the cached LRU, others free), leaves KVSEQ_DROPPED entries that
 * release, fork and the checker skip, and a later prefix match still finds
 * the dropped, registered blocks; kvseq_unmatch cuts a match back. */
static void test_drop_window(int prefix)
{
    static store st;
    kvpool *p = make_pool(&st, 16, 16, prefix);
    tu_rng r = {7};
    int32_t tok[128];
    rand_tokens(&r, tok, 128);
    kv_seq a, c, m;
    kvseq_init(&a, 5);
    kvseq_init(&c, 0);
    kvseq_init(&m, 5);
    CHECK(kvseq_reserve(p, &a, 0, 100) == KV_OK && a.n_blocks == 7);
    CHECK(store_write(&st, p, &a, tok, 0, 100));
    kvseq_commit(p, &a, tok, 100);
    int32_t b0 = a.blocks[0], b3 = a.blocks[3];
    kvpool_stats s0, s1;
    kvpool_get_stats(p, &s0);
    CHECK(kvseq_drop_before(p, &a, 4) == 4);
    kvpool_get_stats(p, &s1);
    CHECK(s1.n_used == s0.n_used - 4);
    CHECK(prefix ? s1.n_cached == s0.n_cached + 4 : s1.n_free == s0.n_free + 4);
    CHECK(a.blocks[0] == KVSEQ_DROPPED && a.blocks[3] == KVSEQ_DROPPED && a.blocks[4] >= 0);
    CHECK(kvpool_refcount(p, b0) == 0 && kvpool_refcount(p, b3) == 0);
    CHECK(kvseq_drop_before(p, &a, 4) == 0); /* nothing left below */
    CHECK(kvseq_drop_before(p, &a, 5) == 1);
    const kv_seq *one[1] = {&a};
    check_pool(p, one, 1);
    kvant_err err = {0};
    CHECK(kvseq_fork(p, &a, &c, &err) == KV_OK && c.blocks[0] == KVSEQ_DROPPED);
    CHECK(kvpool_refcount(p, a.blocks[5]) == 2);
    const kv_seq *two[2] = {&a, &c};
    check_pool(p, two, 2);
    /* the sequence goes on writing after its dropped blocks */
    CHECK(kvseq_reserve(p, &a, 100, 120) == KV_OK);
    CHECK(store_write(&st, p, &a, tok, 100, 120));
    kvseq_commit(p, &a, tok, 120);
    check_pool(p, two, 2);
    kvseq_release(p, &c);
    /* a new sequence with the same prompt: the dropped blocks, cached, still match */
    int64_t hit = kvseq_match_prefix(p, &m, tok, 128);
    CHECK(prefix ? hit == 112 : hit == 0);
    if (prefix) {
        CHECK(m.blocks[0] == b0 && m.blocks[3] == b3);
        kvpool_get_stats(p, &s0);
        kvseq_unmatch(p, &m, 48);
        kvpool_get_stats(p, &s1);
        CHECK(m.n_blocks == 3 && m.n_tokens == 48 && m.n_hashed == 3);
        CHECK(s1.prefix_hits == s0.prefix_hits - 64 && kvpool_refcount(p, b3) == 0);
    }
    const kv_seq *am[2] = {&a, &m};
    check_pool(p, am, 2);
    kvseq_release(p, &a);
    kvseq_release(p, &m);
    kvpool_get_stats(p, &s1);
    CHECK(s1.n_used == 0 && s1.n_free + s1.n_cached == 16);
    check_pool(p, NULL, 0);
    kvpool_destroy(p);
}

/* kvseq_match_window: only the blocks the hit's window reads must be
 * cached; an evicted block below the window does not stop the match, one
 * inside it does. */
static void test_match_window(void)
{
    static store st;
    kvpool *p = make_pool(&st, 16, 16, 1);
    tu_rng r = {11};
    int32_t tok[128];
    rand_tokens(&r, tok, 128);
    kv_seq a, b, m;
    kvseq_init(&a, 1);
    kvseq_init(&b, 2);
    kvseq_init(&m, 1);
    CHECK(kvseq_reserve(p, &a, 0, 112) == KV_OK);
    CHECK(store_write(&st, p, &a, tok, 0, 112));
    kvseq_commit(p, &a, tok, 112);
    int32_t blk[7];
    memcpy(blk, a.blocks, sizeof blk);
    CHECK(kvseq_drop_before(p, &a, 5) == 5); /* 0..4 cached, 0 least recently used */
    CHECK(kvseq_reserve(p, &b, 0, 10 * 16) == KV_OK); /* 9 free + evicts block 0 */
    CHECK(kvpool_refcount(p, blk[0]) == 1 && b.blocks[9] == blk[0]); /* b took it */
    CHECK(kvpool_block_state(p, blk[1]) == KVPOOL_BLOCK_CACHED);
    CHECK(kvseq_match_prefix(p, &m, tok, 128) == 0); /* the chain from block 0 is broken */
    kvseq_release(p, &m);
    /* window 20: blocks 5, 6 (in use by a) */
    CHECK(kvseq_match_window(p, &m, tok, 128, 20, 0) == 112);
    CHECK(m.blocks[4] == KVSEQ_DROPPED && m.blocks[5] == blk[5] && m.blocks[6] == blk[6]);
    CHECK(kvpool_refcount(p, blk[5]) == 2 && m.n_hashed == 7);
    const kv_seq *three[3] = {&a, &b, &m};
    check_pool(p, three, 3);
    kvseq_release(p, &m);
    /* window 40: block 4 (cached) too */
    CHECK(kvseq_match_window(p, &m, tok, 128, 40, 0) == 112 && m.blocks[4] == blk[4]);
    CHECK(kvpool_refcount(p, blk[4]) == 1);
    kvseq_release(p, &m);
    /* window 100 reads block 0 for every k: evicted, no hit */
    CHECK(kvseq_match_window(p, &m, tok, 128, 100, 0) == 0 && m.n_blocks == 0);
    /* window 0: the whole chain, as kvseq_match_prefix */
    CHECK(kvseq_match_window(p, &m, tok, 128, 0, 0) == 0);
    kvseq_release(p, &a);
    kvseq_release(p, &b);
    check_pool(p, NULL, 0);
    kvpool_destroy(p);
}

/* A KV budget's sinks: kvseq_drop_range keeps blocks [0, keep) and gives
 * back the run after them; kvseq_match_window with sink blocks needs the
 * sinks and the window cached, never the blocks between. */
static void test_drop_sinks(void)
{
    static store st;
    kvpool *p = make_pool(&st, 16, 16, 1);
    tu_rng r = {13};
    int32_t tok[128];
    rand_tokens(&r, tok, 128);
    kv_seq a, b, m;
    kvseq_init(&a, 3);
    kvseq_init(&b, 4);
    kvseq_init(&m, 3);
    CHECK(kvseq_reserve(p, &a, 0, 112) == KV_OK);
    CHECK(store_write(&st, p, &a, tok, 0, 112));
    kvseq_commit(p, &a, tok, 112);
    int32_t blk[7];
    memcpy(blk, a.blocks, sizeof blk);
    CHECK(kvseq_drop_range(p, &a, 1, 3) == 2);      /* blocks 1, 2 */
    CHECK(a.blocks[0] == blk[0] && a.blocks[1] == KVSEQ_DROPPED && a.blocks[2] == KVSEQ_DROPPED);
    CHECK(kvseq_drop_range(p, &a, 1, 3) == 0);      /* nothing new */
    CHECK(kvseq_drop_range(p, &a, 1, 5) == 2);      /* the run grows: 3, 4 */
    CHECK(a.blocks[0] == blk[0] && a.blocks[4] == KVSEQ_DROPPED && a.blocks[5] == blk[5]);
    CHECK(kvpool_refcount(p, blk[0]) == 1 && kvpool_refcount(p, blk[3]) == 0);
    const kv_seq *one[1] = {&a};
    check_pool(p, one, 1);
    /* the sink and the window (blocks 5, 6 for window 20) held: a hit */
    CHECK(kvseq_match_window(p, &m, tok, 128, 20, 1) == 112);
    CHECK(m.blocks[0] == blk[0] && m.blocks[1] == KVSEQ_DROPPED && m.blocks[4] == KVSEQ_DROPPED &&
          m.blocks[6] == blk[6] && m.n_hashed == 7);
    const kv_seq *two[2] = {&a, &m};
    check_pool(p, two, 2);
    kvseq_release(p, &m);
    kvseq_release(p, &a); /* every block cached now */
    /* evict the sink block (least recently used after release: tail first) */
    CHECK(kvseq_reserve(p, &b, 0, 16 * 16) == KV_OK);
    kvseq_release(p, &b);
    CHECK(kvseq_match_window(p, &m, tok, 128, 20, 1) == 0 && m.n_blocks == 0);
    check_pool(p, NULL, 0);
    kvpool_destroy(p);
}

int main(void)
{
    test_drop_sinks();
    test_match_window();
    test_drop_window(1);
    test_drop_window(0);
    test_create_errors();
    test_alloc_until_empty();
    test_reserve_growth();
    test_fork_cow();
    test_fixed_tables();
    test_prefix();
    test_lru();
    test_resize();
    test_drain_grow();
    test_property(1, 0x5eed1234ULL, 200000, 0);
    test_property(0, 0x0badcafeULL, 20000, 0);
    test_property(1, 0x7e512e00ULL, 100000, 1);
    test_property(0, 0x7e512e01ULL, 20000, 1);
    return tu_finish("test_kvpool");
}
