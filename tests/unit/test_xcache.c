/* test_xcache.c - the expert cache's replay (model/xcache.h xcache_replay):
 * hand-worked traces, then random traces against a plain reimplementation
 * of the documented policy (least used expert so far, least recently used
 * among equals, empty slots first, pinned slots kept until an unpin). */
#include <stdlib.h>
#include <string.h>

#include "model/xcache.h"
#include "testutil.h"

static void hand_traces(void)
{
    kvant_err err = {0};
    xcache_pred p;
    uint8_t res[4];
    /* 2 slots: 0 miss, 1 miss, 0 hit (0 used twice), 2 miss evicting 1
     * (used once), 0 hit */
    const int32_t t1[] = {0, -1, 1, -1, 0, -1, 2, -1, 0};
    CHECK(xcache_replay(t1, 9, 0, 4, 2, res, &p, &err) == KV_OK);
    CHECK(p.hits == 2 && p.misses == 3 && p.n_resident == 2);
    CHECK(res[0] == 1 && res[1] == 0 && res[2] == 1 && res[3] == 0);
    /* counting from entry 4 on: 0 hit, 2 miss, 0 hit */
    CHECK(xcache_replay(t1, 9, 4, 4, 2, NULL, &p, &err) == KV_OK);
    CHECK(p.hits == 2 && p.misses == 1);
    /* equal uses: the least recently used goes (1 then 0 then 2 each once,
     * 3 evicts 1) */
    const int32_t t2[] = {1, -1, 0, -1, 3, -1, 0};
    CHECK(xcache_replay(t2, 7, 0, 4, 2, res, &p, &err) == KV_OK);
    CHECK(p.misses == 3 && p.hits == 1 && res[0] && res[3] && !res[1]);
    /* pinned: 0 and 1 pinned together, 2 cannot evict either within the
     * same job and replays as if unpinned (the least recently used, 0, goes) */
    const int32_t t3[] = {0, 1, 2};
    CHECK(xcache_replay(t3, 3, 0, 4, 2, res, &p, &err) == KV_OK);
    CHECK(p.misses == 3 && !res[0] && res[1] && res[2]);
    /* pinned slots are skipped: 0 used twice, then 1 and 2 pinned with 0
     * unpinned in between: 2 evicts 0 though it is used most, since 1 is pinned */
    const int32_t t4[] = {0, -1, 0, -1, 1, 0, -1, 1, 2};
    CHECK(xcache_replay(t4, 9, 0, 4, 2, res, &p, &err) == KV_OK);
    CHECK(p.hits == 3 && p.misses == 3 && !res[0] && res[1] && res[2]);
    /* misses read side by side: 0 and 1 missed in one group (between unpins), 2 alone,
     * 3 and 0 again: a miss and a hit (not shared) */
    const int32_t t5[] = {0, 1, -1, 2, -1, 3, 0};
    CHECK(xcache_replay(t5, 7, 0, 4, 4, NULL, &p, &err) == KV_OK);
    CHECK(p.misses == 4 && p.hits == 1 && p.shared_misses == 2);
    /* bad input is an error, not a crash */
    const int32_t bad[] = {0, 9};
    CHECK(xcache_replay(bad, 2, 0, 4, 2, NULL, &p, &err) == KV_EINVAL);
    CHECK(xcache_replay(t1, 9, 0, 4, 0, NULL, &p, &err) == KV_EINVAL);
    CHECK(xcache_replay(t1, 9, 10, 4, 2, NULL, &p, &err) == KV_EINVAL);
}

/* The policy as documented, written plainly. */
typedef struct ref_cache {
    int n_slots;
    int owner[64], pinned[64];
    unsigned long long last[64], tick;
    unsigned long long uses[256];
} ref_cache;

static int ref_get(ref_cache *c, int id)
{
    for (int s = 0; s < c->n_slots; s++)
        if (c->owner[s] == id) {
            c->uses[id]++, c->last[s] = ++c->tick, c->pinned[s] = 1;
            return 1;
        }
    int v = -1;
    for (int pass = 0; pass < 2 && v < 0; pass++) {
        for (int s = 0; s < c->n_slots && v < 0; s++)
            if (!c->pinned[s] && c->owner[s] < 0)
                v = s;
        for (int s = 0; s < c->n_slots; s++) {
            if (v >= 0 && c->owner[v] < 0)
                break;
            if (c->pinned[s])
                continue;
            const unsigned long long u = c->uses[c->owner[s]];
            if (v < 0 || u < c->uses[c->owner[v]] ||
                (u == c->uses[c->owner[v]] && c->last[s] < c->last[v]))
                v = s;
        }
        if (v < 0)
            memset(c->pinned, 0, sizeof c->pinned);
    }
    c->owner[v] = id, c->uses[id]++, c->last[v] = ++c->tick, c->pinned[v] = 1;
    return 0;
}

static void random_traces(void)
{
    tu_rng rng = {12345};
    kvant_err err = {0};
    for (int round = 0; round < 40; round++) {
        const int n_ids = 8 + (int)(tu_rand_u64(&rng) % 200), n_slots = 1 + (int)(tu_rand_u64(&rng) % 40);
        const int n = 2000;
        int32_t *t = malloc(n * sizeof *t);
        for (int i = 0; i < n; i++) {
            const unsigned long long r = tu_rand_u64(&rng);
            /* skewed: a few hot ids most of the time; unpins now and then */
            t[i] = r % 5 == 0 ? -1 : r % 3 == 0 ? (int32_t)(r / 7 % (unsigned)n_ids)
                                                : (int32_t)(r / 7 % 6);
        }
        ref_cache c = {.n_slots = n_slots};
        memset(c.owner, 0xff, sizeof c.owner);
        unsigned long long hits = 0, misses = 0, shared = 0, group = 0;
        const int from = n / 3;
        for (int i = 0; i <= n; i++) {
            if (i == n || t[i] < 0) {
                shared += group > 1 ? group : 0;
                group = 0;
                memset(c.pinned, 0, sizeof c.pinned);
                continue;
            }
            const int h = ref_get(&c, t[i]);
            if (i >= from) {
                h ? hits++ : misses++;
                group += !h;
            }
        }
        uint8_t res[256];
        xcache_pred p;
        CHECK(xcache_replay(t, n, from, n_ids, n_slots, res, &p, &err) == KV_OK);
        CHECKF(p.hits == hits && p.misses == misses, "round %d: %llu/%llu vs %llu/%llu", round,
               (unsigned long long)p.hits, (unsigned long long)p.misses, hits, misses);
        CHECK(p.shared_misses == shared);
        int same = 1, n_res = 0;
        for (int id = 0; id < n_ids; id++) {
            int in = 0;
            for (int s = 0; s < n_slots; s++)
                in |= c.owner[s] == id;
            same &= in == res[id];
            n_res += in;
        }
        CHECK(same && p.n_resident == n_res);
        free(t);
    }
}

int main(void)
{
    hand_traces();
    random_traces();
    return tu_finish("xcache");
}
