/* test_models.c - the model registry (registry/registry.h): the LRU
 * eviction policy as a pure function, then a registry of tiny models in a
 * budget that holds two of three: loads on demand, LRU eviction, busy
 * models never evicted or unloaded, pins, a model that can never fit, a
 * corrupt file, sleep and wake, keep-alive, and every byte given back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/dtype.h"
#include "registry/registry.h"
#include "testutil.h"
#include "tinymodel.h"

static void test_pick(void)
{
    int v[8], nv;
    /* three loaded idle models of 10 bytes, last used at 3, 1, 2 */
    reg_cand c[4] = {{10, 3, 1, 0, 0}, {10, 1, 1, 0, 0}, {10, 2, 1, 0, 0}, {0, 0, 0, 0, 0}};
    CHECK(reg_pick(c, 4, 5, 40, 30, 8, v, &nv) == SRV_FIT_OK && nv == 0);
    CHECK(reg_pick(c, 4, 15, 40, 30, 8, v, &nv) == SRV_FIT_OK && nv == 1 && v[0] == 1);
    CHECK(reg_pick(c, 4, 25, 40, 30, 8, v, &nv) == SRV_FIT_OK && nv == 2 && v[0] == 1 &&
          v[1] == 2);
    /* the oldest is busy: the next oldest goes instead */
    c[1].busy = 1;
    CHECK(reg_pick(c, 4, 15, 40, 30, 8, v, &nv) == SRV_FIT_OK && nv == 1 && v[0] == 2);
    /* everything idle is not enough while a busy model holds memory: wait */
    CHECK(reg_pick(c, 4, 35, 40, 30, 8, v, &nv) == SRV_FIT_WAIT && nv == 0);
    /* pinned bytes leave too little: never (no evict/reload loop) */
    c[1].busy = 0;
    c[0].pinned = 1;
    CHECK(reg_pick(c, 4, 35, 40, 30, 8, v, &nv) == SRV_FIT_NEVER);
    CHECK(reg_pick(c, 4, 30, 40, 30, 8, v, &nv) == SRV_FIT_OK && nv == 2 && v[0] == 1 &&
          v[1] == 2);
    /* more than the budget: never */
    CHECK(reg_pick(c, 4, 41, 40, 30, 8, v, &nv) == SRV_FIT_NEVER);
    /* the resident slots are full: the LRU idle model goes though bytes fit */
    c[0].pinned = 0;
    CHECK(reg_pick(c, 4, 1, 1000, 30, 3, v, &nv) == SRV_FIT_OK && nv == 1 && v[0] == 1);
}

/* in a temporary directory (tu_tmp_dir), made by main */
static char paths[3][256], bad_path[256];

static registry *make_reg(uint64_t budget, double keep_alive, kvant_err *err)
{
    reg_config mc = reg_config_default();
    mc.ec.n_threads = 1;
    mc.ec.max_num_seqs = 4;
    mc.ec.max_num_batched_tokens = 64;
    mc.ec.max_model_len = 256;
    mc.budget = budget;
    mc.keep_alive_s = keep_alive;
    mc.queue_timeout_s = 0.3;
    mc.log = 0;
    registry *r = reg_create(&mc, err);
    if (!r)
        return NULL;
    const char *names[3] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++)
        CHECK(reg_add(r, names[i], paths[i], err) == KV_OK);
    CHECK(reg_add(r, "a", paths[0], err) == KV_EINVAL); /* duplicate */
    CHECK(reg_start(r, err) == KV_OK);
    return r;
}

static reg_state state_of(registry *r, const char *name, reg_info *x)
{
    CHECK(reg_describe(r, reg_find(r, name), x) == KV_OK);
    return x->state;
}

/* Every loaded model's KV bytes are exactly its live pool, and the models'
 * bytes are exactly the manager's. */
static void check_exact(registry *r)
{
    reg_info *x = malloc(sizeof *x);
    uint64_t sum = 0;
    for (int i = 0; i < reg_count(r); i++) {
        CHECK(reg_describe(r, i, x) == KV_OK);
        sum += x->resident_bytes;
        if (x->state == REG_LOADED)
            CHECKF(x->resident[MEM_KV] == x->kv_pool_bytes &&
                       x->kv_blocks_total >= x->kv_blocks_min &&
                       x->kv_blocks_total <= x->kv_blocks_max,
                   "%s: KV %llu bytes, pool %llu, %d blocks in [%d, %d]", x->name,
                   (unsigned long long)x->resident[MEM_KV], (unsigned long long)x->kv_pool_bytes,
                   x->kv_blocks_total, x->kv_blocks_min, x->kv_blocks_max);
    }
    CHECKF(sum == mem_used(reg_mem(r)), "models %llu bytes, manager %llu",
           (unsigned long long)sum, (unsigned long long)mem_used(reg_mem(r)));
    CHECK(mem_used(reg_mem(r)) <= mem_budget(reg_mem(r)));
    free(x);
}

static void test_lru(uint64_t need)
{
    kvant_err err = {0};
    registry *r = make_reg(2 * need + need / 2, 0, &err); /* two fit, not three */
    CHECKF(r != NULL, "%s", err.msg);
    if (!r)
        return;
    reg_info *x = malloc(sizeof *x);
    reg_ref ra = {0}, rb = {0}, rc = {0};
    CHECKF(reg_acquire(r, "a", &ra, &err) == KV_OK, "%s", err.msg);
    CHECKF(reg_acquire(r, "b", &rb, &err) == KV_OK, "%s", err.msg);
    CHECK(ra.e && rb.e && ra.m && rb.m && strcmp(ra.name, "a") == 0);
    /* the pools grew into what is left of the budget */
    CHECK(state_of(r, "b", x) == REG_LOADED && x->kv_extra_bytes > 0);
    CHECK(state_of(r, "a", x) == REG_LOADED && x->resident_bytes > 0 &&
          x->resident_bytes <= x->need_bytes + x->kv_extra_bytes && x->kv_pool_bytes > 0);
    check_exact(r);
    /* both busy: c waits for them and times out; nothing is evicted */
    CHECK(reg_acquire(r, "c", &rc, &err) == KV_EBUSY);
    CHECK(state_of(r, "a", x) == REG_LOADED && x->evictions == 0);
    /* a busy model cannot be unloaded or slept */
    CHECK(reg_unload(r, "a", &err) == KV_EBUSY);
    CHECK(reg_sleep(r, "a", 1, &err) == KV_EBUSY);
    reg_release(r, &ra); /* a goes idle first: the LRU victim */
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
    reg_release(r, &rb);
    CHECKF(reg_acquire(r, "c", &rc, &err) == KV_OK, "%s", err.msg);
    CHECK(state_of(r, "a", x) == REG_UNLOADED && x->evictions == 1 && x->resident_bytes == 0);
    CHECK(state_of(r, "b", x) == REG_LOADED && x->evictions == 0 && x->kv_shrinks > 0);
    check_exact(r);
    reg_release(r, &rc);
    /* pin b: loading a must evict c, never b */
    CHECK(reg_pin(r, "b", &err) == KV_OK);
    CHECKF(reg_acquire(r, "a", &ra, &err) == KV_OK, "%s", err.msg);
    reg_release(r, &ra);
    CHECK(state_of(r, "b", x) == REG_LOADED && x->pinned);
    CHECK(state_of(r, "c", x) == REG_UNLOADED && x->evictions == 1);
    /* sleep level 1 keeps the model mapped, gives the bytes back; a
     * request wakes it */
    uint64_t used = mem_used(reg_mem(r));
    CHECK(reg_sleep(r, "a", 1, &err) == KV_OK);
    CHECK(state_of(r, "a", x) == REG_SLEEPING && x->sleep_level == 1 && x->resident_bytes == 0);
    CHECK(mem_used(reg_mem(r)) < used);
    CHECKF(reg_acquire(r, "a", &ra, &err) == KV_OK, "%s", err.msg);
    CHECK(state_of(r, "a", x) == REG_LOADED && x->wakes == 1 && x->wake_h.count == 1);
    reg_release(r, &ra);
    CHECK(reg_sleep(r, "a", 2, &err) == KV_OK);
    CHECK(reg_sleep(r, "a", 3, &err) == KV_EINVAL);
    CHECK(reg_wake(r, "a", &err) == KV_OK);
    CHECK(state_of(r, "a", x) == REG_LOADED && x->wakes == 2);
    /* unknown names */
    CHECK(reg_acquire(r, "nope", &ra, &err) == KV_EINVAL);
    CHECK(reg_unload(r, "nope", &err) == KV_EINVAL);
    /* everything unloaded: every byte is back */
    for (int i = 0; i < 3; i++)
        CHECK(reg_unload(r, (const char *[]){"a", "b", "c"}[i], &err) == KV_OK);
    CHECK(mem_used(reg_mem(r)) == 0 && mem_live_count(reg_mem(r)) == 0);
    free(x);
    reg_destroy(r);
}

static void test_never_fits_and_corrupt(uint64_t need)
{
    kvant_err err = {0};
    registry *r = make_reg(need - 1, 0, &err);
    CHECKF(r != NULL, "%s", err.msg);
    if (!r)
        return;
    reg_ref ref = {0};
    CHECK(reg_acquire(r, "a", &ref, &err) == KV_ENOMEM);
    char want[64];
    snprintf(want, sizeof want, "%llu bytes", (unsigned long long)need);
    CHECKF(strstr(err.msg, want) != NULL, "%s", err.msg);
    /* a corrupt file is registered as failed with its error */
    FILE *f = fopen(bad_path, "wb");
    if (f) {
        fputs("GGUF this is not a model", f);
        fclose(f);
    }
    kvant_err e2 = {0};
    CHECK(reg_add(r, NULL, bad_path, &e2) == KV_OK && e2.code != 0);
    reg_info *x = malloc(sizeof *x);
    CHECK(state_of(r, "tiny-reg-bad", x) == REG_FAILED && x->error[0]);
    CHECK(reg_acquire(r, "tiny-reg-bad", &ref, &err) == KV_EFORMAT);
    CHECK(reg_load(r, "tiny-reg-bad", &err) != KV_OK);
    free(x);
    reg_destroy(r);
}

/* KV follows the load: a pool grows into free memory, gives it back (in
 * whole blocks nobody holds) before another model must be evicted, and
 * grows again when a model sleeps. */
static void test_kv_grow(uint64_t need, uint64_t bb)
{
    kvant_err err = {0};
    registry *r = make_reg(3 * need + 30 * bb, 0, &err);
    CHECKF(r != NULL, "%s", err.msg);
    if (!r)
        return;
    reg_info *x = malloc(sizeof *x);
    reg_ref ref[3] = {{0}};
    const char *names[3] = {"a", "b", "c"};
    /* a alone takes all it may use: max_num_seqs (4) requests of the context */
    CHECKF(reg_acquire(r, "a", &ref[0], &err) == KV_OK, "%s", err.msg);
    CHECK(state_of(r, "a", x) == REG_LOADED && x->kv_grows == 1 &&
          x->kv_blocks_total == x->kv_blocks_max && x->kv_blocks_max == 4 * 256 / 16);
    CHECK(x->kv_extra_bytes == (uint64_t)(x->kv_blocks_max - x->kv_blocks_min) * bb);
    check_exact(r);
    for (int i = 1; i < 3; i++)
        CHECKF(reg_acquire(r, names[i], &ref[i], &err) == KV_OK, "%s", err.msg);
    /* c did not fit next to the grown pools: they shrank, nobody was evicted */
    uint64_t extra = 0, shrinks = 0;
    for (int i = 0; i < 3; i++) {
        CHECK(state_of(r, names[i], x) == REG_LOADED && x->evictions == 0);
        extra += x->kv_extra_bytes;
        shrinks += x->kv_shrinks;
        reg_release(r, &ref[i]);
    }
    CHECK(shrinks >= 1 && extra <= 30 * bb + 3 * bb);
    check_exact(r);
    /* sleeping gives b's pool back and the others grow into it */
    uint64_t before = 0, after = 0;
    CHECK(state_of(r, "a", x) == REG_LOADED);
    before += x->kv_pool_bytes;
    CHECK(state_of(r, "c", x) == REG_LOADED);
    before += x->kv_pool_bytes;
    CHECK(reg_sleep(r, "b", 1, &err) == KV_OK);
    CHECK(state_of(r, "b", x) == REG_SLEEPING && x->kv_extra_bytes == 0 && !x->resident_bytes);
    CHECK(state_of(r, "a", x) == REG_LOADED);
    after += x->kv_pool_bytes;
    CHECK(state_of(r, "c", x) == REG_LOADED);
    after += x->kv_pool_bytes;
    CHECKF(after > before, "pools %llu -> %llu bytes", (unsigned long long)before,
           (unsigned long long)after);
    check_exact(r);
    /* the wake takes it back from them; still nobody evicted */
    CHECK(reg_wake(r, "b", &err) == KV_OK);
    for (int i = 0; i < 3; i++)
        CHECK(state_of(r, names[i], x) == REG_LOADED && x->evictions == 0);
    check_exact(r);
    /* unloading everything gives every byte back */
    for (int i = 0; i < 3; i++)
        CHECK(reg_unload(r, names[i], &err) == KV_OK);
    CHECK(mem_used(reg_mem(r)) == 0 && mem_live_count(reg_mem(r)) == 0);
    free(x);
    reg_destroy(r);
}

static void test_keep_alive(void)
{
    kvant_err err = {0};
    registry *r = make_reg(0, 0.2, &err);
    CHECKF(r != NULL, "%s", err.msg);
    if (!r)
        return;
    reg_ref ref = {0};
    CHECKF(reg_acquire(r, "a", &ref, &err) == KV_OK, "%s", err.msg);
    reg_release(r, &ref);
    reg_info *x = malloc(sizeof *x);
    int unloaded = 0;
    for (int i = 0; i < 200 && !unloaded; i++) { /* up to 20 s on a loaded machine */
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
        unloaded = state_of(r, "a", x) == REG_UNLOADED;
    }
    CHECK(unloaded && x->unloads == 1);
    free(x);
    reg_destroy(r);
}

int main(void)
{
    dtype_init();
    test_pick();
    char dir[200];
    CHECK(tu_tmp_dir(dir, sizeof dir, "models") == 0); /* the file names name the models */
    snprintf(bad_path, sizeof bad_path, "%s/tiny-reg-bad.gguf", dir);
    for (int i = 0; i < 3; i++) {
        snprintf(paths[i], sizeof paths[i], "%s/tiny-reg-%c.gguf", dir, 'a' + i);
        CHECK(tiny_model_write(paths[i], 100 + (uint64_t)i) == 0);
    }
    kvant_err err = {0};
    registry *r = make_reg(0, 0, &err);
    CHECKF(r != NULL, "%s", err.msg);
    if (!r)
        return tu_finish("test_models");
    reg_info *x = malloc(sizeof *x);
    CHECK(reg_describe(r, 0, x) == KV_OK && x->state == REG_UNLOADED);
    uint64_t need = x->need_bytes;
    CHECK(need > 0 && x->kv_share_bytes > 0 && x->max_model_len == 256);
    /* the default share: 2 requests of the context, in 16-token blocks */
    uint64_t bb = x->kv_share_bytes / (2 * 256 / 16);
    CHECK(bb * (2 * 256 / 16) == x->kv_share_bytes);
    free(x);
    reg_destroy(r);
    test_lru(need);
    test_never_fits_and_corrupt(need);
    test_kv_grow(need, bb);
    test_keep_alive();
    remove(bad_path);
    for (int i = 0; i < 3; i++)
        remove(paths[i]);
    rmdir(dir);
    return tu_finish("test_models");
}
