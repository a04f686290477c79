/* test_reg_plan.c - the registry's memory arithmetic (registry/registry_plan.h)
 * on hand-made numbers: the spare KV of a fixed pool, the growth of elastic
 * pools into free memory, the reclaim that makes room for a load, and the
 * start-up played out from them (a load, growth, a reclaim before the
 * second load, an eviction, a refusal next to a pinned model).  Every
 * expected value is worked out in the comment beside it. */
#include <stdio.h>
#include <string.h>

#include "registry/registry_plan.h"
#include "testutil.h"

static void test_spare(void)
{
    const reg_footprint f = {.block_bytes = 100, .kv_share = 1000, .kv_max = 4000};
    /* (10000 - 2000) / 2 = 4000, capped by the room 3000: 3000 */
    CHECK(reg_plan_spare(10000, 2000, 2, &f) == 3000);
    /* (2550 - 1000) / 3 = 516 -> whole blocks: 500 */
    CHECK(reg_plan_spare(2550, 1000, 3, &f) == 500);
    CHECK(reg_plan_spare(1000, 1000, 1, &f) == 0); /* nothing beyond the reserve */
    CHECK(reg_plan_spare(5000, 0, 0, &f) == 0);
}

static void test_grow(void)
{
    /* three pools, one already at its most: 1000 free bytes split over two */
    reg_plan_pool p[3] = {{10, 10, 20, 100, 0, 1, 0}, {8, 8, 8, 50, 0, 2, 0},
                          {5, 5, 100, 30, 0, 3, 0}};
    int32_t add[3];
    reg_plan_grow(1000, p, 3, add);
    /* part 500: pool 0 min(5, 10) = 5; pool 1 at its most: 0; pool 2 500/30 = 16 */
    CHECK(add[0] == 5 && add[1] == 0 && add[2] == 16);
    reg_plan_grow(250, p, 3, add);
    CHECK(add[0] == 1 && add[1] == 0 && add[2] == 4); /* part 125 */
    reg_plan_grow(0, p, 3, add);
    CHECK(add[0] == 0 && add[1] == 0 && add[2] == 0);
}

static void test_reclaim(void)
{
    int idx[4];
    int32_t cut[4];
    /* grown pools: 0 (busy, oldest), 1 (idle, used at 5), 2 (idle, used at 2), 3 skipped */
    reg_plan_pool p[4] = {{20, 10, 40, 100, 1, 1, 0}, {15, 10, 40, 100, 0, 5, 0},
                          {12, 10, 40, 100, 0, 2, 0}, {30, 10, 40, 100, 0, 0, 1}};
    /* 150 bytes: the oldest idle (2) gives 2 blocks */
    CHECK(reg_plan_reclaim(p, 4, 150, idx, cut) == 1 && idx[0] == 2 && cut[0] == 2);
    /* 900 bytes: 2 gives 2, 1 gives its 5, busy 0 the last 2 */
    int n = reg_plan_reclaim(p, 4, 900, idx, cut);
    CHECK(n == 3 && idx[0] == 2 && cut[0] == 2 && idx[1] == 1 && cut[1] == 5 && idx[2] == 0 &&
          cut[2] == 2);
    /* more than all growth: every grown pool back to its size at load */
    n = reg_plan_reclaim(p, 4, 1 << 20, idx, cut);
    CHECK(n == 3 && cut[0] + cut[1] + cut[2] == 2 + 5 + 10);
}

/* A footprint of w weight bytes with a KV share of s blocks of 100 bytes,
 * at most m blocks. */
static reg_plan_model model_of(uint64_t w, int s, int m)
{
    reg_plan_model x = {.ok = 1, .scratch = 40, .scratch_alloc = 30};
    x.f = (reg_footprint){.ctx = 16, .head_dim = 8, .weights = w, .activations = 200,
                          .act_q8 = 50, .block_bytes = 100, .kv_share = (uint64_t)s * 100,
                          .kv_max = (uint64_t)m * 100};
    x.f.need = w + 250 + x.f.kv_share;
    return x;
}

static void test_start(void)
{
    reg_plan_model m[2] = {model_of(1000, 4, 10), model_of(500, 4, 10)};
    reg_plan_state st[2];
    const int order[2] = {0, 1}, pin[2] = {1, 0};
    uint64_t used;
    int failed;
    kvant_err err = {0};
    /* needs 1650 and 1150; budget 3000.  a loads: 1000 + 200 + 50 + 30 + 3 blocks (one held
     * for the 40-byte scratch) = 1580; grows by min(1420/100, 10-3) = 7 -> 10 blocks, 2280.
     * b needs 1150 > 720 free: a gives back ceil(430/100) = 5 -> 5 blocks, 1780 (1220 free);
     * b loads 500 + 280 + 3 blocks = 1080 -> 2860; 140 free over two pools: 70 each, no
     * block. */
    reg_plan_start_in in = {m, 2, order, pin, 2, 3000, 1, 1};
    CHECKF(reg_plan_start(&in, st, &used, &failed, &err) == KV_OK, "%s", err.msg);
    CHECK(st[0].loaded && st[0].pinned && st[0].kv_blocks == 5 && st[0].kv_min_blocks == 3 &&
          st[0].kv_max_blocks == 10);
    CHECK(st[1].loaded && !st[1].pinned && st[1].kv_blocks == 3);
    CHECK(used == 2860 && st[0].resident[MEM_WORKSPACE] == 80 && st[0].resident[MEM_KV] == 500);
    /* budget 2000: b cannot load next to the pinned a (1650 + 1150 > 2000) */
    in.budget = 2000;
    CHECK(reg_plan_start(&in, st, &used, &failed, &err) == KV_ENOMEM && failed == 1 &&
          strstr(err.msg, "pinned"));
    /* unpinned a is evicted for b: b alone, grown by min(920/100, 7) = 7 -> 10 blocks */
    const int nopin[2] = {0, 0};
    in.pin = nopin;
    CHECKF(reg_plan_start(&in, st, &used, &failed, &err) == KV_OK, "%s", err.msg);
    CHECK(st[0].evicted && !st[0].loaded && st[1].loaded && st[1].kv_blocks == 10);
    CHECK(used == 1080 + 700);
    /* fixed pools (no resize): a takes (3000 - 2800) / 2 = 100 spare, one block, at load
     * (1680 used); b then (1320 - 1150) / 1 = 170 -> one block */
    in.budget = 3000;
    in.elastic = 0;
    CHECKF(reg_plan_start(&in, st, &used, &failed, &err) == KV_OK, "%s", err.msg);
    CHECK(st[0].kv_extra == 100 && st[0].kv_blocks == 4 && st[0].kv_max_blocks == 4);
    CHECK(st[1].kv_extra == 100 && st[1].kv_blocks == 4 && used == 2860);
}

int main(void)
{
    test_spare();
    test_grow();
    test_reclaim();
    test_start();
    return tu_finish("test_reg_plan");
}
