/* test_mem.c - the device memory manager: accounting, peaks, refusals,
 * the fail-nth hook, a 100k-step random property test, pool fragmentation,
 * the JSON report and mem_parse_size. */
#include "mem/mem.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "testutil.h"

/* ---- a mock allocator: fake 64-aligned addresses, optional failure ---- */

typedef struct mock {
    uint64_t next;        /* next fake address */
    int fail_next;        /* 1: the next alloc returns NULL */
    size_t live;          /* outstanding allocations */
    uint64_t live_bytes;
    int bad_free;         /* free with a size that did not match */
} mock;

static void *mock_alloc(void *ctx, size_t size)
{
    mock *mk = ctx;
    if (mk->fail_next) {
        mk->fail_next = 0;
        return NULL;
    }
    mk->next += 64 * (1 + (size / 4096)); /* distinct, aligned */
    mk->live++;
    mk->live_bytes += size;
    return (void *)(uintptr_t)mk->next;
}

static void mock_free(void *ctx, void *ptr, size_t size)
{
    mock *mk = ctx;
    if (!ptr || mk->live == 0 || mk->live_bytes < size)
        mk->bad_free = 1;
    mk->live--;
    mk->live_bytes -= size;
}

static mem_allocator mock_allocator(mock *mk)
{
    mem_allocator a = { mock_alloc, mock_free, mk };
    return a;
}

/* ---- basic accounting ---- */

static void test_accounting(void)
{
    kvant_err err = {0};
    mem_mgr *m = mem_create(1 << 20, mem_allocator_host(), &err);
    CHECK(m != NULL);
    void *w0 = mem_alloc(m, 1000, MEM_WEIGHTS, 0, &err);
    void *w1 = mem_alloc(m, 2000, MEM_WEIGHTS, 1, &err);
    void *k1 = mem_alloc(m, 300, MEM_KV, 1, &err);
    void *a = mem_alloc(m, 4096, MEM_ACTIVATIONS, MEM_NO_LAYER, &err);
    CHECK(w0 && w1 && k1 && a);
    CHECK(((uintptr_t)w0 % 64) == 0 && ((uintptr_t)a % 64) == 0);
    memset(a, 0x5a, 4096); /* really usable host memory */
    int64_t r = mem_reserve(m, 50000, MEM_WEIGHTS, 2, &err);
    CHECK(r > 0);
    CHECK(mem_used(m) == 1000 + 2000 + 300 + 4096 + 50000);
    CHECK(mem_available(m) == (1u << 20) - mem_used(m));
    CHECK(mem_live_count(m) == 5);

    mem_report *rep = calloc(1, sizeof *rep);
    mem_get_report(m, rep);
    CHECK(rep->cat[MEM_WEIGHTS].current == 53000);
    CHECK(rep->cat[MEM_KV].current == 300);
    CHECK(rep->cat[MEM_ACTIVATIONS].current == 4096);
    CHECK(rep->n_layers == 3);
    CHECK(rep->layer_bytes[0][MEM_WEIGHTS] == 1000);
    CHECK(rep->layer_bytes[1][MEM_WEIGHTS] == 2000);
    CHECK(rep->layer_bytes[1][MEM_KV] == 300);
    CHECK(rep->layer_bytes[2][MEM_WEIGHTS] == 50000);

    mem_free(m, w1);
    mem_unreserve(m, r);
    mem_free(m, NULL);  /* no-op */
    mem_unreserve(m, -2); /* no-op */
    mem_get_report(m, rep);
    CHECK(rep->used == 1000 + 300 + 4096);
    CHECK(rep->layer_bytes[1][MEM_WEIGHTS] == 0 && rep->layer_bytes[2][MEM_WEIGHTS] == 0);
    CHECK(rep->cat[MEM_WEIGHTS].peak == 53000);
    CHECK(rep->peak == 1000 + 2000 + 300 + 4096 + 50000);

    /* peaks and reset */
    mem_reset_peak(m);
    mem_get_report(m, rep);
    CHECK(rep->peak == rep->used);
    CHECK(rep->cat[MEM_WEIGHTS].peak == 1000);
    void *t = mem_alloc(m, 10000, MEM_WORKSPACE, MEM_NO_LAYER, &err);
    mem_free(m, t);
    mem_get_report(m, rep);
    CHECK(rep->peak == rep->used + 10000);
    CHECK(rep->cat[MEM_WORKSPACE].peak == 10000 && rep->cat[MEM_WORKSPACE].current == 0);

    /* bad arguments are KV_EINVAL and change nothing */
    uint64_t before = mem_used(m);
    kvant_err_clear(&err);
    CHECK(mem_alloc(m, 0, MEM_KV, 0, &err) == NULL && err.code == KV_EINVAL);
    CHECK(mem_alloc(m, 8, MEM_KV, MEM_MAX_LAYERS, &err) == NULL && err.code == KV_EINVAL);
    CHECK(mem_alloc(m, 8, MEM_KV, -7, &err) == NULL && err.code == KV_EINVAL);
    CHECK(mem_alloc(m, 8, MEM_CAT_COUNT, 0, &err) == NULL && err.code == KV_EINVAL);
    CHECK(mem_reserve(m, 0, MEM_KV, 0, &err) == KV_EINVAL);
    CHECK(mem_used(m) == before && mem_live_count(m) == 3);

    mem_free(m, w0);
    mem_free(m, k1);
    mem_free(m, a);
    CHECK(mem_used(m) == 0 && mem_live_count(m) == 0);
    free(rep);
    mem_destroy(m);

    CHECK(mem_create(0, mem_allocator_host(), &err) == NULL && err.code == KV_EINVAL);
    mem_allocator bad = { NULL, NULL, NULL };
    CHECK(mem_create(100, bad, &err) == NULL && err.code == KV_EINVAL);
}

/* ---- refusals and failure injection ---- */

static void test_refusals(void)
{
    mock mk = {0};
    kvant_err err = {0};
    mem_mgr *m = mem_create(10000, mock_allocator(&mk), &err);
    void *a = mem_alloc(m, 6000, MEM_KV, 3, &err);
    CHECK(a != NULL);
    mem_report *r0 = calloc(1, sizeof *r0), *r1 = calloc(1, sizeof *r1);
    mem_get_report(m, r0);

    /* over budget: NULL, KV_ENOMEM, message names bytes, category, what is left */
    kvant_err_clear(&err);
    CHECK(mem_alloc(m, 4001, MEM_ACTIVATIONS, MEM_NO_LAYER, &err) == NULL);
    CHECK(err.code == KV_ENOMEM);
    CHECKF(strstr(err.msg, "4001 bytes") && strstr(err.msg, "activations") &&
           strstr(err.msg, "4000 bytes") && strstr(err.msg, "left"), "msg: %s", err.msg);
    kvant_err_clear(&err);
    CHECK(mem_reserve(m, 4001, MEM_WEIGHTS, 1, &err) == KV_ENOMEM && err.code == KV_ENOMEM);
    CHECKF(strstr(err.msg, "weights") && strstr(err.msg, "layer 1"), "msg: %s", err.msg);
    mem_get_report(m, r1);
    CHECK(memcmp(r0, r1, sizeof *r0) == 0); /* state unchanged */
    CHECK(mem_live_count(m) == 1 && mk.live == 1);

    /* exactly filling the budget is allowed */
    void *b = mem_alloc(m, 4000, MEM_OTHER, MEM_NO_LAYER, &err);
    CHECK(b != NULL && mem_available(m) == 0);
    mem_free(m, b);

    /* allocator failure */
    mk.fail_next = 1;
    kvant_err_clear(&err);
    CHECK(mem_alloc(m, 100, MEM_KV, 0, &err) == NULL && err.code == KV_ENOMEM);
    CHECKF(strstr(err.msg, "allocator") && strstr(err.msg, "100 bytes"), "msg: %s", err.msg);
    mem_get_report(m, r1);
    CHECK(r1->used == r0->used && r1->cat[MEM_KV].current == r0->cat[MEM_KV].current);

    /* fail-nth: the 3rd request from now fails (allocs and reserves both count) */
    mem_fail_nth(m, 3);
    void *p1 = mem_alloc(m, 10, MEM_KV, 0, &err);
    int64_t id2 = mem_reserve(m, 20, MEM_WEIGHTS, 0, &err);
    kvant_err_clear(&err);
    void *p3 = mem_alloc(m, 30, MEM_KV, 0, &err);
    CHECK(p1 && id2 > 0 && p3 == NULL && err.code == KV_ENOMEM);
    CHECKF(strstr(err.msg, "injected") && strstr(err.msg, "30 bytes"), "msg: %s", err.msg);
    void *p4 = mem_alloc(m, 40, MEM_KV, 0, &err); /* one-shot */
    CHECK(p4 != NULL);
    mem_fail_nth(m, 1);
    kvant_err_clear(&err);
    CHECK(mem_reserve(m, 5, MEM_OTHER, MEM_NO_LAYER, &err) == KV_ENOMEM);
    CHECK(err.code == KV_ENOMEM && strstr(err.msg, "injected"));
    int64_t id5 = mem_reserve(m, 5, MEM_OTHER, MEM_NO_LAYER, &err);
    CHECK(id5 > 0);
    mem_fail_nth(m, 2);
    mem_fail_nth(m, 0); /* disabled */
    void *p5 = mem_alloc(m, 1, MEM_KV, 0, &err), *p6 = mem_alloc(m, 1, MEM_KV, 0, &err);
    CHECK(p5 && p6);
    mem_free(m, p1);
    mem_free(m, p4);
    mem_free(m, p5);
    mem_free(m, p6);
    mem_free(m, a);
    mem_unreserve(m, id2);
    CHECK(mem_live_count(m) == 1); /* the reservation of 5 bytes above */
    CHECK(mem_used(m) == 5);
    mem_unreserve(m, id5);
    CHECK(mem_used(m) == 0 && mem_live_count(m) == 0 && mk.live == 0 && !mk.bad_free);
    free(r0);
    free(r1);
    mem_destroy(m);
}

/* ---- property test ---- */

#define PT_STEPS 100000
#define PT_MAX_LIVE 4096
#define PT_LAYERS 6

typedef struct pt_item {
    void *ptr;     /* NULL for a reservation */
    int64_t id;
    uint64_t size;
    int cat, layer;
} pt_item;

typedef struct pt_model {
    pt_item items[PT_MAX_LIVE];
    int n;
    uint64_t used, peak;
    uint64_t cat_cur[MEM_CAT_COUNT], cat_peak[MEM_CAT_COUNT];
    uint64_t layer[PT_LAYERS][MEM_CAT_COUNT];
} pt_model;

static void pt_add(pt_model *s, pt_item it)
{
    s->items[s->n++] = it;
    s->used += mem_cat_in_budget((mem_cat)it.cat) ? it.size : 0;
    s->cat_cur[it.cat] += it.size;
    if (s->used > s->peak)
        s->peak = s->used;
    if (s->cat_cur[it.cat] > s->cat_peak[it.cat])
        s->cat_peak[it.cat] = s->cat_cur[it.cat];
    if (it.layer >= 0)
        s->layer[it.layer][it.cat] += it.size;
}

static void pt_remove(pt_model *s, mem_mgr *m, int i)
{
    pt_item it = s->items[i];
    if (it.ptr)
        mem_free(m, it.ptr);
    else
        mem_unreserve(m, it.id);
    s->used -= mem_cat_in_budget((mem_cat)it.cat) ? it.size : 0;
    s->cat_cur[it.cat] -= it.size;
    if (it.layer >= 0)
        s->layer[it.layer][it.cat] -= it.size;
    s->items[i] = s->items[--s->n];
}

/* Checks every invariant; returns 0 on the first failure (to stop spam). */
static int pt_check(const pt_model *s, const mem_mgr *m, mem_report *rep, int step)
{
    mem_get_report(m, rep);
    uint64_t cat_sum = 0;
    int ok = rep->used <= rep->budget && rep->used == s->used && rep->peak >= rep->used &&
             rep->peak == s->peak && mem_live_count(m) == (size_t)s->n;
    for (int c = 0; c < MEM_CAT_COUNT; c++) {
        cat_sum += mem_cat_in_budget((mem_cat)c) ? rep->cat[c].current : 0;
        ok = ok && rep->cat[c].current == s->cat_cur[c] && rep->cat[c].peak == s->cat_peak[c] &&
             rep->cat[c].peak >= rep->cat[c].current;
        for (int l = 0; l < PT_LAYERS; l++)
            ok = ok && (l < rep->n_layers ? rep->layer_bytes[l][c] : 0) == s->layer[l][c];
    }
    ok = ok && cat_sum == rep->used;
    CHECKF(ok, "property step %d: used %llu (model %llu) peak %llu (model %llu) live %zu (model %d)",
           step, (unsigned long long)rep->used, (unsigned long long)s->used,
           (unsigned long long)rep->peak, (unsigned long long)s->peak, mem_live_count(m), s->n);
    return ok;
}

static void test_property(void)
{
    const uint64_t budget = 64ull << 20;
    mock mk = {0};
    kvant_err err = {0};
    mem_mgr *m = mem_create(budget, mock_allocator(&mk), &err);
    pt_model *s = calloc(1, sizeof *s);
    mem_report *rep = calloc(1, sizeof *rep);
    tu_rng rng = { 0x1234567ull };
    int refused = 0, injected = 0;
    for (int step = 0; step < PT_STEPS; step++) {
        unsigned op = (unsigned)(tu_rand_u64(&rng) % 100);
        /* sizes: mostly small, sometimes large enough to hit the budget */
        uint64_t size = 1 + tu_rand_u64(&rng) % ((tu_rand_u64(&rng) % 8 == 0) ? (32u << 20) : 65536u);
        int cat = (int)(tu_rand_u64(&rng) % MEM_CAT_COUNT);
        int layer = (int)(tu_rand_u64(&rng) % (PT_LAYERS + 1)) - 1; /* -1 = MEM_NO_LAYER */
        if (tu_rand_u64(&rng) % 50 == 0)
            mem_fail_nth(m, 1 + tu_rand_u64(&rng) % 4);
        if (tu_rand_u64(&rng) % 97 == 0)
            mk.fail_next = 1;
        if (op < 35 && s->n < PT_MAX_LIVE) {
            void *p = mem_alloc(m, (size_t)size, (mem_cat)cat, layer, &err);
            if (p) {
                pt_item it = { p, 0, size, cat, layer };
                pt_add(s, it);
            } else {
                refused++;
                injected += strstr(err.msg, "injected") != NULL;
                CHECK(err.code == KV_ENOMEM);
            }
        } else if (op < 55 && s->n < PT_MAX_LIVE) {
            int64_t id = mem_reserve(m, size, (mem_cat)cat, layer, &err);
            if (id > 0) {
                pt_item it = { NULL, id, size, cat, layer };
                pt_add(s, it);
            } else {
                refused++;
                CHECK(id == KV_ENOMEM);
            }
        } else if (op < 95 && s->n > 0) {
            pt_remove(s, m, (int)(tu_rand_u64(&rng) % (uint64_t)s->n));
        } else if (op >= 95) {
            mem_reset_peak(m);
            s->peak = s->used;
            memcpy(s->cat_peak, s->cat_cur, sizeof s->cat_peak);
        }
        if (!pt_check(s, m, rep, step))
            break;
    }
    CHECKF(refused > 100 && injected > 10, "refused %d injected %d", refused, injected);
    while (s->n > 0)
        pt_remove(s, m, s->n - 1);
    mem_get_report(m, rep);
    CHECK(rep->used == 0 && mem_live_count(m) == 0 && mem_available(m) == budget);
    for (int c = 0; c < MEM_CAT_COUNT; c++)
        CHECK(rep->cat[c].current == 0);
    for (int l = 0; l < rep->n_layers; l++)
        for (int c = 0; c < MEM_CAT_COUNT; c++)
            CHECK(rep->layer_bytes[l][c] == 0);
    CHECK(mk.live == 0 && mk.live_bytes == 0 && !mk.bad_free);
    free(s);
    free(rep);
    mem_destroy(m);
}

/* ---- pools and JSON ---- */

typedef struct fake_pool { const char *name; uint64_t total, free_b, largest; } fake_pool;

static void fake_pool_stats(void *ctx, mem_pool_stats *out)
{
    const fake_pool *p = ctx;
    out->name = p->name;
    out->total_bytes = p->total;
    out->free_bytes = p->free_b;
    out->largest_free_extent = p->largest;
}

static void test_pools_and_json(void)
{
    kvant_err err = {0};
    mem_mgr *m = mem_create(1000000, mem_allocator_host(), &err);
    fake_pool kv = { "kv", 8192, 4096, 1024 };     /* 1 - 1024/4096 = 0.75 */
    fake_pool full = { "full", 8192, 0, 0 };       /* nothing free -> 0 */
    fake_pool one = { NULL, 8192, 2048, 2048 };    /* one extent -> 0 */
    CHECK(mem_register_pool(m, fake_pool_stats, &kv) == KV_OK);
    CHECK(mem_register_pool(m, fake_pool_stats, &full) == KV_OK);
    CHECK(mem_register_pool(m, fake_pool_stats, &one) == KV_OK);
    CHECK(mem_register_pool(m, NULL, &one) == KV_EINVAL);
    void *w = mem_alloc(m, 1234, MEM_WEIGHTS, 0, &err);
    void *k = mem_alloc(m, 4321, MEM_KV, 1, &err);
    int64_t res = mem_reserve(m, 100, MEM_WEIGHTS, 1, &err);
    mem_free(m, mem_alloc(m, 500, MEM_ACTIVATIONS, MEM_NO_LAYER, &err));

    mem_report *rep = calloc(1, sizeof *rep);
    mem_get_report(m, rep);
    CHECK(rep->n_pools == 3);
    CHECK(fabs(rep->fragmentation[0] - 0.75) < 1e-12);
    CHECK(rep->fragmentation[1] == 0.0 && rep->fragmentation[2] == 0.0);
    CHECK(strcmp(rep->pools[2].name, "pool") == 0);

    char *js = mem_report_json(rep);
    CHECK(js != NULL);
    json_error_t jerr;
    json_t *root = json_loads(js, 0, &jerr);
    CHECKF(root != NULL, "json: %s", jerr.text);
    CHECK(json_integer_value(json_object_get(root, "budget")) == 1000000);
    CHECK(json_integer_value(json_object_get(root, "used")) == 1234 + 4321 + 100);
    CHECK(json_integer_value(json_object_get(root, "peak")) == 1234 + 4321 + 100 + 500);
    json_t *cats = json_object_get(root, "categories");
    CHECK(json_integer_value(json_object_get(json_object_get(cats, "weights"), "current")) == 1334);
    CHECK(json_integer_value(json_object_get(json_object_get(cats, "kv"), "current")) == 4321);
    CHECK(json_integer_value(json_object_get(json_object_get(cats, "activations"), "peak")) == 500);
    CHECK(json_object_get(cats, "workspace") && json_object_get(cats, "other"));
    json_t *layers = json_object_get(root, "layers");
    CHECK(json_array_size(layers) == 2);
    json_t *l1 = json_array_get(layers, 1);
    CHECK(json_integer_value(json_object_get(l1, "layer")) == 1);
    CHECK(json_integer_value(json_object_get(l1, "weights")) == 100);
    CHECK(json_integer_value(json_object_get(l1, "kv")) == 4321);
    json_t *pools = json_object_get(root, "pools");
    CHECK(json_array_size(pools) == 3);
    json_t *p0 = json_array_get(pools, 0);
    CHECK(strcmp(json_string_value(json_object_get(p0, "name")), "kv") == 0);
    CHECK(json_integer_value(json_object_get(p0, "largest_free_extent")) == 1024);
    CHECK(fabs(json_real_value(json_object_get(p0, "fragmentation")) - 0.75) < 1e-12);
    json_decref(root);
    free(js);

    mem_unregister_pool(m, fake_pool_stats, &full);
    mem_get_report(m, rep);
    CHECK(rep->n_pools == 2 && strcmp(rep->pools[1].name, "pool") == 0);
    for (int i = 0; i < MEM_MAX_POOLS - 2; i++)
        CHECK(mem_register_pool(m, fake_pool_stats, &full) == KV_OK);
    CHECK(mem_register_pool(m, fake_pool_stats, &full) == KV_ERANGE);

    mem_free(m, w);
    mem_free(m, k);
    mem_unreserve(m, res);
    CHECK(mem_live_count(m) == 0);
    free(rep);
    mem_destroy(m);
}

/* ---- record table growth: many live allocations ---- */

static void test_many(void)
{
    mock mk = {0};
    kvant_err err = {0};
    mem_mgr *m = mem_create(1ull << 40, mock_allocator(&mk), &err);
    enum { N = 20000 };
    void **ps = malloc(N * sizeof *ps);
    int ok = 1;
    for (int i = 0; i < N; i++)
        ok = ok && (ps[i] = mem_alloc(m, (size_t)(i + 1), MEM_KV, i % 7, &err)) != NULL;
    CHECK(ok && mem_live_count(m) == N);
    CHECK(mem_used(m) == (uint64_t)N * (N + 1) / 2);
    for (int i = 0; i < N; i += 2)
        mem_free(m, ps[i]);
    for (int i = 1; i < N; i += 2)
        mem_free(m, ps[i]);
    CHECK(mem_used(m) == 0 && mem_live_count(m) == 0 && mk.live == 0 && !mk.bad_free);
    free(ps);
    mem_destroy(m);
}

/* ---- sizes ---- */

static void test_parse_size(void)
{
    static const struct { const char *s; int ok; uint64_t v; } cases[] = {
        { "0", 1, 0 },
        { "123", 1, 123 },
        { "100B", 1, 100 },
        { "512M", 1, 512000000ull },
        { "512MB", 1, 512000000ull },
        { "4G", 1, 4000000000ull },
        { "4g", 1, 4000000000ull },
        { "4Gi", 1, 4ull << 30 },
        { "4GiB", 1, 4ull << 30 },
        { "1.5GiB", 1, 3ull << 29 },
        { "0.5Ki", 1, 512 },
        { "2K", 1, 2000 },
        { "3Ti", 1, 3ull << 40 },
        { "1T", 1, 1000000000000ull },
        { "18446744073709551615", 1, UINT64_MAX },
        { "16Ei", 0, 0 },
        { "", 0, 0 },
        { "-1", 0, 0 },
        { "+1", 0, 0 },
        { "1X", 0, 0 },
        { "1e400", 0, 0 },
        { "1e3", 0, 0 },
        { "18446744073709551616", 0, 0 },
        { "99999999999999999999999", 0, 0 },
        { "17179869184Gi", 0, 0 }, /* 2^34 * 2^30 = 2^64 */
        { "1.", 0, 0 },
        { ".5G", 0, 0 },
        { "G", 0, 0 },
        { " 1G", 0, 0 },
        { "1G ", 0, 0 },
        { "1 G", 0, 0 },
        { "1GiBB", 0, 0 },
        { "1iB", 0, 0 },
        { "nan", 0, 0 },
        { "inf", 0, 0 },
        { "0x10", 0, 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvant_err err = {0};
        uint64_t v = 777;
        int rc = mem_parse_size(cases[i].s, &v, &err);
        if (cases[i].ok) {
            CHECKF(rc == KV_OK && v == cases[i].v, "'%s' -> rc %d v %llu", cases[i].s, rc,
                   (unsigned long long)v);
        } else {
            CHECKF(rc == KV_EINVAL && err.code == KV_EINVAL && v == 777 && err.msg[0],
                   "'%s' should be rejected (rc %d v %llu)", cases[i].s, rc, (unsigned long long)v);
        }
    }
    CHECK(mem_parse_size(NULL, &(uint64_t){0}, NULL) == KV_EINVAL);

    char buf[32];
    CHECK(strcmp(mem_format_size(0, buf, sizeof buf), "0 B") == 0);
    CHECK(strcmp(mem_format_size(1023, buf, sizeof buf), "1023 B") == 0);
    CHECK(strcmp(mem_format_size(1536, buf, sizeof buf), "1.50 KiB") == 0);
    CHECK(strcmp(mem_format_size(3ull << 29, buf, sizeof buf), "1.50 GiB") == 0);
    CHECK(mem_host_available() > 0);
    CHECK(strcmp(mem_cat_name(MEM_KV), "kv") == 0);
}

/* A reservation resized in place (the CPU KV pool growing and shrinking):
 * exact accounting, refusals change nothing, resident pages by mincore. */
static void test_reserve_resize(void)
{
    kvant_err err = {0};
    mem_mgr *m = mem_create(1 << 20, mem_allocator_host(), &err);
    const long pg = sysconf(_SC_PAGESIZE);
    const size_t span = (size_t)pg * 8;
    uint8_t *map = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(m && map != MAP_FAILED);
    int64_t id = mem_reserve_at(m, map, (uint64_t)pg * 2, MEM_KV, MEM_NO_LAYER, &err);
    CHECK(id > 0 && mem_used(m) == (uint64_t)pg * 2);
    CHECK(mem_resident_bytes(m) == 0); /* nothing touched yet */
    memset(map, 1, (size_t)pg);
    CHECK(mem_resident_bytes(m) == (uint64_t)pg);
    CHECK(mem_reserve_resize(m, id, (uint64_t)pg * 6, &err) == KV_OK);
    mem_report *rep = malloc(sizeof *rep);
    mem_get_report(m, rep);
    CHECK(rep->cat[MEM_KV].current == (uint64_t)pg * 6 && rep->used == (uint64_t)pg * 6);
    CHECK(mem_live_count(m) == 1);
    /* over budget: refused, nothing changed */
    CHECK(mem_reserve_resize(m, id, (2 << 20), &err) == KV_ENOMEM);
    CHECK(strstr(err.msg, "over budget") != NULL);
    CHECK(mem_used(m) == (uint64_t)pg * 6);
    mem_fail_nth(m, 1);
    CHECK(mem_reserve_resize(m, id, (uint64_t)pg * 7, &err) == KV_ENOMEM);
    CHECK(mem_used(m) == (uint64_t)pg * 6);
    CHECK(mem_reserve_resize(m, id, 0, &err) == KV_EINVAL && mem_used(m) == (uint64_t)pg * 6);
    /* shrinking never fails and gives the bytes back; the peak stays */
    CHECK(mem_reserve_resize(m, id, (uint64_t)pg, &err) == KV_OK);
    mem_get_report(m, rep);
    CHECK(rep->cat[MEM_KV].current == (uint64_t)pg && rep->used == (uint64_t)pg);
    CHECK(rep->cat[MEM_KV].peak == (uint64_t)pg * 6 && rep->peak == (uint64_t)pg * 6);
    CHECK(mem_resident_bytes(m) == (uint64_t)pg);
    mem_unreserve(m, id);
    CHECK(mem_used(m) == 0 && mem_live_count(m) == 0);
    free(rep);
    munmap(map, span);
    mem_destroy(m);
}

/* Pinned host memory is accounted but outside the budget: a reservation
 * larger than the budget is admitted, used and available do not move, the
 * category's current/peak and the JSON's "pinned_host" show it. */
static void test_pinned(void)
{
    mock mk = {0};
    kvant_err err = {0};
    mem_mgr *m = mem_create(10000, mock_allocator(&mk), &err);
    void *p = mem_alloc(m, 4000, MEM_KV, MEM_NO_LAYER, &err);
    int64_t id = mem_reserve(m, 50000, MEM_PINNED, MEM_NO_LAYER, &err);
    CHECKF(p && id > 0, "pinned reservation over the budget refused: %s", err.msg);
    CHECK(mem_used(m) == 4000 && mem_available(m) == 6000 && mem_live_count(m) == 2);
    CHECK(mem_reserve_resize(m, id, 80000, &err) == KV_OK && mem_used(m) == 4000);
    CHECK(mem_resident_bytes(m) == 4000); /* of mem_used: the pinned bytes are not */
    mem_report *rep = calloc(1, sizeof *rep);
    mem_get_report(m, rep);
    CHECK(rep->used == 4000 && rep->peak == 4000 && rep->cat[MEM_PINNED].current == 80000 &&
          rep->cat[MEM_PINNED].peak == 80000);
    char *js = mem_report_json(rep);
    CHECKF(js && strstr(js, "\"pinned_host\":{\"current\":80000"), "report json: %s", js);
    CHECK(!strcmp(mem_cat_name(MEM_PINNED), "pinned_host") && !mem_cat_in_budget(MEM_PINNED) &&
          mem_cat_in_budget(MEM_KV));
    free(js);
    mem_unreserve(m, id);
    mem_get_report(m, rep);
    CHECK(rep->cat[MEM_PINNED].current == 0 && rep->used == 4000);
    mem_free(m, p);
    free(rep);
    mem_destroy(m);
}

int main(void)
{
    test_pinned();
    test_reserve_resize();
    test_accounting();
    test_refusals();
    test_property();
    test_pools_and_json();
    test_many();
    test_parse_size();
    return tu_finish("test_mem");
}
