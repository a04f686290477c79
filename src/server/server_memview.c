/* server_memview.c - the memory views of `kvant serve`: GET /v1/memory
 * (the memory manager's report, the process's resident memory, the
 * engine's queues and every request holding KV blocks with its own and
 * shared blocks) and GET /v1/memory/blocks (the state of every block,
 * run-length encoded so a 100k-block pool polls cheaply).
 *
 * Both are built from one engine_kv_snapshot taken by the engine thread
 * between steps (engine_kv_snapshot_take), never by reading the pool.
 * Block map encoding: runs of equal (state, request, refcount) as a flat
 * array [state, request, refcount, count, ...]; "states" names the state
 * indices (a tier module appends its states there).
 */
#include "server/server_memview.h"

#include <inttypes.h>
#include <jansson.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv/kvpool.h"
#include "server/server_stream.h"

static const char *const state_names[] = {
    [KVPOOL_BLOCK_FREE] = "free", [KVPOOL_BLOCK_USED] = "used", [KVPOOL_BLOCK_CACHED] = "cached"};
#define N_STATES ((int)(sizeof state_names / sizeof state_names[0]))

/* VmRSS, RssAnon and RssFile of this process from /proc/self/status
 * (bytes; 0 where the kernel does not report them). */
static void read_rss(uint64_t out[3])
{
    static const char *keys[3] = {"VmRSS:", "RssAnon:", "RssFile:"};
    out[0] = out[1] = out[2] = 0;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return;
    char line[256];
    while (fgets(line, sizeof line, f))
        for (int i = 0; i < 3; i++)
            if (!strncmp(line, keys[i], strlen(keys[i])))
                out[i] = strtoull(line + strlen(keys[i]), NULL, 10) * 1024;
    fclose(f);
}

static json_t *u64j(uint64_t v)
{
    return json_integer((json_int_t)v);
}

/* Resident bytes of the executable's and shared libraries' mappings (code
 * and their data), from /proc/self/smaps: mappings of a file whose name
 * contains ".so" or is this executable.  0 where smaps is unreadable. */
static uint64_t code_rss(void)
{
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = 0;
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return 0;
    char line[4352];
    int code = 0;
    uint64_t total = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (sscanf(line, "Rss: %llu kB", &kb) == 1) {
            total += code ? (uint64_t)kb * 1024 : 0;
            continue;
        }
        char *sp = strchr(line, ' ');
        if (!sp || !strchr(line, '-') || strchr(line, '-') > sp)
            continue; /* a field line, not a mapping's header */
        char *path = strchr(line, '/');
        if (!path) {
            code = 0;
            continue;
        }
        path[strcspn(path, "\n")] = 0;
        code = strstr(path, ".so") != NULL || (exe[0] && !strcmp(path, exe));
    }
    fclose(f);
    return total;
}

/* Resident memory against what kvant accounts by name: the memory
 * manager's allocations (device path; on the CPU backend host memory, of
 * which only the resident pages count), the engine's host buffers, code
 * and libraries; and the host heap (malloc) for reference. */
static json_t *process_json(mem_mgr *mem, const mem_report *rep, const engine_stats *st)
{
    uint64_t rss[3];
    read_rss(rss);
    uint64_t heap = 0;
#ifdef __GLIBC__
    struct mallinfo2 mi = mallinfo2();
    heap = (uint64_t)mi.uordblks + (uint64_t)mi.hblkhd;
#endif
    const uint64_t code = code_rss();
    const uint64_t resident = mem_resident_bytes(mem);
    const uint64_t named = resident + st->host_bytes + code;
    json_t *o = json_object();
    json_object_set_new(o, "rss_bytes", u64j(rss[0]));
    json_object_set_new(o, "rss_anon_bytes", u64j(rss[1]));
    json_object_set_new(o, "rss_file_bytes", u64j(rss[2]));
    json_object_set_new(o, "device_path_bytes", u64j(rep->used));
    json_object_set_new(o, "device_path_resident_bytes", u64j(resident));
    json_object_set_new(o, "engine_host_bytes", u64j(st->host_bytes));
    json_object_set_new(o, "code_bytes", u64j(code));
    json_object_set_new(o, "named_bytes", u64j(named));
    json_object_set_new(o, "named_share", json_real(rss[0] ? (double)named / (double)rss[0] : 0.0));
    json_object_set_new(o, "host_heap_bytes", u64j(heap));
    return o;
}

static json_t *engine_json(const engine_stats *st)
{
    return json_pack("{s:i, s:i, s:i, s:I, s:I, s:I, s:I, s:I}", "running", st->running,
                     "waiting", st->waiting, "preempted_waiting", st->preempted_waiting,
                     "prompt_tokens_total", (json_int_t)st->prompt_tokens,
                     "generation_tokens_total", (json_int_t)st->generation_tokens,
                     "preemptions_total", (json_int_t)st->preemptions, "steps_total",
                     (json_int_t)st->steps, "prefix_cache_hits_tokens_total",
                     (json_int_t)st->prefix_hits);
}

/* The window layer group's pool (present only for a model that has one). */
static json_t *kv_window_json(const engine_kv_snapshot *sn)
{
    const uint64_t bb = sn->block_bytes_w;
    return json_pack("{s:i, s:i, s:I, s:i, s:i, s:i, s:I, s:I, s:I}", "window", sn->window,
                     "blocks", sn->n_blocks_w, "block_bytes", (json_int_t)bb, "used", sn->w_used,
                     "free", sn->w_free, "cached", sn->w_cached, "bytes_reserved",
                     (json_int_t)((uint64_t)sn->n_blocks_w * bb), "bytes_used",
                     (json_int_t)((uint64_t)sn->w_used * bb), "dropped_total",
                     (json_int_t)sn->stats.kv_w_dropped);
}

/* Reserved (committed blocks, what the budget counts), resident (their
 * pages in RAM: mincore over the pool's range, so a block never written
 * costs nothing) and in use (blocks sequences hold), both groups; blocks_max
 * is the most the pool may grow to. */
static void kv_bytes_json(json_t *o, const engine_kv_snapshot *sn, const int32_t *n,
                          uint64_t resident)
{
    const uint64_t reserved = (uint64_t)sn->n_blocks * sn->block_bytes +
                              (uint64_t)sn->n_blocks_w * sn->block_bytes_w;
    const uint64_t used = (uint64_t)n[KVPOOL_BLOCK_USED] * sn->block_bytes +
                          (uint64_t)sn->w_used * sn->block_bytes_w;
    json_object_set_new(o, "bytes_reserved", u64j(reserved));
    json_object_set_new(o, "bytes_resident", u64j(resident < reserved ? resident : reserved));
    json_object_set_new(o, "bytes_used", u64j(used));
    json_object_set_new(o, "blocks_max", json_integer(sn->stats.kv_blocks_max > sn->n_blocks
                                                          ? sn->stats.kv_blocks_max
                                                          : sn->n_blocks));
    json_object_set_new(o, "grows_total", u64j(sn->stats.kv_grows));
}

/* A hybrid model's recurrent-state slots (MEM_STATE): a slot per running
 * sequence and the prefix cache's snapshots. */
static json_t *state_json(const engine_stats *st)
{
    const uint64_t b = st->state_slot_bytes;
    const int32_t n = st->state_live_slots + st->state_snap_slots;
    return json_pack("{s:I, s:i, s:i, s:i, s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "slot_bytes",
                     (json_int_t)b, "live_slots", st->state_live_slots, "live_used",
                     st->state_live_used, "snapshot_slots", st->state_snap_slots, "snapshots",
                     st->state_snapshots, "bytes_reserved", (json_int_t)(b * (uint64_t)n),
                     "snapshot_bytes_used", (json_int_t)(b * (uint64_t)st->state_snapshots),
                     "snapshots_taken_total", (json_int_t)st->state_snap_taken,
                     "snapshot_restores_total", (json_int_t)st->state_snap_restored,
                     "tier_restores_total", (json_int_t)st->state_tier_restored,
                     "tier_stores_total", (json_int_t)st->state_tier_stored,
                     "snapshots_evicted_total", (json_int_t)st->state_snap_evicted);
}

static json_t *kv_json(const engine_kv_snapshot *sn, uint64_t resident)
{
    int32_t n[N_STATES] = {0};
    for (int32_t b = 0; b < sn->n_blocks; b++)
        if (sn->state[b] < N_STATES)
            n[sn->state[b]]++;
    json_t *o = json_pack("{s:i, s:i, s:I, s:i, s:i, s:i, s:f}", "blocks", sn->n_blocks,
                     "block_size", sn->block_size, "block_bytes", (json_int_t)sn->block_bytes,
                     "used", n[KVPOOL_BLOCK_USED], "free", n[KVPOOL_BLOCK_FREE], "cached",
                     n[KVPOOL_BLOCK_CACHED],
                     "usage_ratio", sn->n_blocks ? (double)n[KVPOOL_BLOCK_USED] / sn->n_blocks
                                                 : 0.0);
    if (o)
        kv_bytes_json(o, sn, n, resident);
    if (o && sn->n_blocks_w > 0) { /* the fields above are then the global layers' */
        json_object_set_new(o, "global", json_pack("{s:i, s:I, s:I, s:I}", "blocks",
                                                   sn->n_blocks, "block_bytes",
                                                   (json_int_t)sn->block_bytes, "bytes_reserved",
                                                   (json_int_t)((uint64_t)sn->n_blocks *
                                                                sn->block_bytes),
                                                   "bytes_used",
                                                   (json_int_t)((uint64_t)n[KVPOOL_BLOCK_USED] *
                                                                sn->block_bytes)));
        json_object_set_new(o, "window", kv_window_json(sn));
    }
    if (o && sn->stats.state_live_slots > 0)
        json_object_set_new(o, "recurrent_state", state_json(&sn->stats));
    return o;
}

/* A request's distinct block ids as [first, count] ranges of consecutive ids. */
static json_t *ranges_json(const int32_t *ids, int32_t n)
{
    json_t *a = json_array();
    for (int32_t i = 0; i < n;) {
        int32_t j = i + 1;
        while (j < n && ids[j] == ids[j - 1] + 1)
            j++;
        json_array_append_new(a, json_pack("[i, i]", ids[i], j - i));
        i = j;
    }
    return a;
}

static json_t *requests_json(const engine_kv_snapshot *sn)
{
    json_t *a = json_array();
    for (int32_t i = 0; i < sn->n_reqs; i++) {
        const engine_kv_req *q = &sn->reqs[i];
        int32_t nb = q->blocks_own + q->blocks_shared;
        json_t *o = json_pack(
            "{s:I, s:i, s:i, s:I, s:I, s:I, s:i, s:i, s:I, s:f}", "id", (json_int_t)q->id,
            "priority", q->priority, "seqs", q->n_seqs, "prompt_tokens",
            (json_int_t)q->prompt_tokens, "generated_tokens", (json_int_t)q->generated_tokens,
            "kv_tokens", (json_int_t)q->kv_tokens, "blocks_own", q->blocks_own, "blocks_shared",
            q->blocks_shared, "kv_bytes", (json_int_t)((uint64_t)nb * sn->block_bytes), "age_s",
            q->age_s);
        if (o && sn->n_blocks_w > 0) { /* kv_bytes: both groups */
            const uint64_t g = (uint64_t)nb * sn->block_bytes;
            const uint64_t w = (uint64_t)q->blocks_w * sn->block_bytes_w;
            json_object_set_new(o, "kv_bytes_global", u64j(g));
            json_object_set_new(o, "kv_bytes_window", u64j(w));
            json_object_set_new(o, "blocks_window", json_integer(q->blocks_w));
            json_object_set_new(o, "kv_bytes", u64j(g + w));
        }
        if (o && q->grammar_bytes) /* structured outputs: its grammar states */
            json_object_set_new(o, "grammar_bytes", u64j(q->grammar_bytes));
        if (o)
            json_object_set_new(o, "blocks", ranges_json(sn->blk_ids + q->blk_off, q->n_blk));
        json_array_append_new(a, o);
    }
    return a;
}

char *srv_memview_json(engine *e, const engine_kv_snapshot *sn)
{
    mem_report *rep = malloc(sizeof *rep);
    if (!rep)
        return NULL;
    mem_get_report(engine_mem(e), rep);
    char *base = mem_report_json(rep);
    json_t *root = base ? json_loads(base, 0, NULL) : NULL;
    free(base);
    uint64_t res[MEM_CAT_COUNT], res_total = 0;
    mem_resident_by_cat(engine_mem(e), res);
    json_t *cats = root ? json_object_get(root, "categories") : NULL;
    for (int c = 0; c < MEM_CAT_COUNT; c++) { /* reserved (current) and resident apart */
        json_t *co = cats ? json_object_get(cats, mem_cat_name((mem_cat)c)) : NULL;
        if (co)
            json_object_set_new(co, "resident", u64j(res[c]));
        res_total += mem_cat_in_budget((mem_cat)c) ? res[c] : 0; /* pinned: not device */
    }
    if (root) {
        json_object_set_new(root, "resident", u64j(res_total));
        json_object_set_new(root, "process", process_json(engine_mem(e), rep, &sn->stats));
        json_object_set_new(root, "engine", engine_json(&sn->stats));
        json_object_set_new(root, "kv", kv_json(sn, res[MEM_KV]));
        json_object_set_new(root, "grammar", json_pack( /* host memory, in engine_host_bytes */
            "{s:I, s:i, s:I, s:f}", "state_bytes", (json_int_t)sn->stats.grammar_bytes,
            "requests", sn->stats.grammar_requests, "vocab_bytes",
            (json_int_t)sn->stats.grammar_vocab_bytes, "vocab_build_seconds",
            sn->stats.grammar_vocab_build_seconds));
        json_object_set_new(root, "requests", requests_json(sn));
        json_object_set_new(root, "truncated", json_boolean(sn->truncated));
    }
    free(rep);
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return s;
}

static int put(srv_buf *b, const char *fmt, int64_t a, int64_t c, int64_t d, int64_t n)
{
    char tmp[96];
    int k = snprintf(tmp, sizeof tmp, fmt, a, c, d, n);
    return srv_buf_append(b, tmp, (size_t)k);
}

char *srv_blockmap_json(const engine_kv_snapshot *sn)
{
    srv_buf b = {0};
    char head[256];
    int k = snprintf(head, sizeof head,
                     "{\"n_blocks\":%d,\"block_size\":%d,\"block_bytes\":%" PRIu64
                     ",\"states\":[\"free\",\"used\",\"cached\"],"
                     "\"run_fields\":[\"state\",\"request\",\"refcount\",\"count\"],\"runs\":[",
                     sn->n_blocks, sn->block_size, sn->block_bytes);
    int rc = srv_buf_append(&b, head, (size_t)k);
    int first = 1;
    for (int32_t i = 0; i < sn->n_blocks && !rc;) {
        int32_t j = i + 1;
        while (j < sn->n_blocks && sn->state[j] == sn->state[i] && sn->owner[j] == sn->owner[i] &&
               sn->refcount[j] == sn->refcount[i])
            j++;
        rc = put(&b, first ? "%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64
                           : ",%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64,
                 sn->state[i], sn->owner[i], sn->refcount[i], j - i);
        first = 0;
        i = j;
    }
    if (!rc)
        rc = srv_buf_append(&b, sn->truncated ? "],\"truncated\":true}" : "],\"truncated\":false}",
                            sn->truncated ? 19 : 20);
    if (rc) {
        srv_buf_free(&b);
        return NULL;
    }
    if (!b.s)
        return NULL;
    return b.s; /* malloc'd by srv_buf: the caller frees */
}
