/* server_tier.c - the KV offload tiers on /metrics and /v1/memory (see
 * server_tier.h). */
#include "server/server_tier.h"

#include <stdio.h>
#include <stdlib.h>

static const char *const tier_name[KVTIER_N] = {NULL, "host", "disk"};

/* One metric family with a value per tier. */
static void per_tier(FILE *f, const char *name, const char *type, const char *help,
                     const double v[KVTIER_N])
{
    fprintf(f, "# HELP kvant_%s %s\n# TYPE kvant_%s %s\n", name, help, name, type);
    for (int t = KVTIER_HOST; t < KVTIER_N; t++)
        fprintf(f, "kvant_%s{tier=\"%s\"} %.17g\n", name, tier_name[t], v[t]);
}

static void one(FILE *f, const char *name, const char *type, const char *help, double v)
{
    fprintf(f, "# HELP kvant_%s %s\n# TYPE kvant_%s %s\nkvant_%s %.17g\n", name, help, name, type,
            name, v);
}

#define TIERS(expr_host, expr_disk) ((const double[KVTIER_N]){0, (double)(expr_host), \
                                                               (double)(expr_disk)})

/* Write-through to the disk tier (--kv-disk-write through). */
static void write_through_metrics(FILE *f, const engine_tier_stats *ts)
{
    const kvtier_stats *s = &ts->t;
    one(f, "kv_tier_write_through_enabled", "gauge",
        "1 when full prompt blocks are written through to the disk tier as they complete.",
        ts->write_through);
    one(f, "kv_tier_write_through_records_total", "counter",
        "Records written through to disk (renamed into place).", (double)s->wt_written);
    one(f, "kv_tier_write_through_bytes_total", "counter",
        "Bytes of records written through to disk.", (double)s->wt_written_bytes);
    one(f, "kv_tier_write_queue_depth", "gauge",
        "Disk writes queued or in progress on the writer thread.", s->disk_pending);
    one(f, "kv_tier_write_through_waiting_blocks", "gauge",
        "Hashed blocks waiting for room in the writer queue.", ts->wt_waiting);
    fprintf(f, "# HELP kvant_kv_tier_write_through_skipped_total Write-through offers not "
               "written: dedup (already on disk or queued), queue_full (offered again at a "
               "later step), reused (the block left the device pool first).\n"
               "# TYPE kvant_kv_tier_write_through_skipped_total counter\n"
               "kvant_kv_tier_write_through_skipped_total{reason=\"dedup\"} %llu\n"
               "kvant_kv_tier_write_through_skipped_total{reason=\"queue_full\"} %llu\n"
               "kvant_kv_tier_write_through_skipped_total{reason=\"reused\"} %llu\n",
            (unsigned long long)s->wt_dedup, (unsigned long long)s->wt_full,
            (unsigned long long)ts->wt_missed);
    one(f, "kv_tier_writer_cpu_seconds_total", "counter",
        "CPU time of the disk writer thread (checksums, writes, fsync, rename).",
        ts->writer_cpu_seconds);
}

char *srv_tier_metrics(const engine_tier_stats *ts)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    const kvtier_stats *s = &ts->t;
    if (ts->enabled) {
        uint64_t rb = s->record_bytes;
        per_tier(f, "kv_tier_blocks", "gauge", "KV blocks held in the offload tier.",
                 TIERS(s->host_blocks, s->disk_blocks));
        per_tier(f, "kv_tier_capacity_blocks", "gauge", "KV blocks the offload tier can hold.",
                 TIERS(s->host_capacity_blocks, s->disk_capacity_blocks));
        per_tier(f, "kv_tier_used_bytes", "gauge", "Bytes of KV records held in the tier.",
                 TIERS(s->host_blocks * rb, s->disk_blocks * rb));
        per_tier(f, "kv_tier_capacity_bytes", "gauge", "Record bytes the tier can hold.",
                 TIERS(ts->host_capacity_bytes, ts->disk_capacity_bytes));
        per_tier(f, "kv_tier_hits_total", "counter", "Block lookups found in the tier.",
                 TIERS(s->hits[KVTIER_HOST], s->hits[KVTIER_DISK]));
        per_tier(f, "kv_tier_misses_total", "counter", "Block lookups not found in the tier.",
                 TIERS(s->misses[KVTIER_HOST], s->misses[KVTIER_DISK]));
        per_tier(f, "kv_tier_hit_tokens_total", "counter",
                 "Prompt tokens whose KV was loaded from the tier instead of computed.",
                 TIERS(ts->hit_tokens[KVTIER_HOST], ts->hit_tokens[KVTIER_DISK]));
        per_tier(f, "kv_tier_load_bytes_total", "counter", "Bytes read from the tier.",
                 TIERS(s->load_bytes[KVTIER_HOST], s->load_bytes[KVTIER_DISK]));
        per_tier(f, "kv_tier_store_bytes_total", "counter", "Bytes written to the tier.",
                 TIERS(s->store_bytes[KVTIER_HOST], s->store_bytes[KVTIER_DISK]));
        per_tier(f, "kv_tier_evictions_total", "counter",
                 "Records leaving the tier (host: demoted to disk or dropped; disk: deleted).",
                 TIERS(s->evictions[KVTIER_HOST], s->evictions[KVTIER_DISK]));
        per_tier(f, "kv_tier_read_bandwidth_bytes_per_second", "gauge",
                 "Tier read bandwidth measured at start-up (cost model input).",
                 TIERS(ts->cost.read_bps[KVTIER_HOST], ts->cost.read_bps[KVTIER_DISK]));
        fprintf(f, "# HELP kvant_kv_tier_skipped_records_total Records never served: corrupt "
                   "(torn, bad checksum, wrong tokens) or foreign (another model, not a record).\n"
                   "# TYPE kvant_kv_tier_skipped_records_total counter\n"
                   "kvant_kv_tier_skipped_records_total{reason=\"corrupt\"} %llu\n"
                   "kvant_kv_tier_skipped_records_total{reason=\"foreign\"} %llu\n",
                (unsigned long long)s->skipped_corrupt, (unsigned long long)s->skipped_foreign);
        fprintf(f, "# HELP kvant_kv_preemptions_total Preemptions by the cost model's choice.\n"
                   "# TYPE kvant_kv_preemptions_total counter\n"
                   "kvant_kv_preemptions_total{decision=\"swap\"} %llu\n"
                   "kvant_kv_preemptions_total{decision=\"recompute\"} %llu\n",
                (unsigned long long)ts->swaps, (unsigned long long)ts->recomputes);
        one(f, "kv_tier_loads_declined_total", "counter",
            "Tier hits recomputed because the cost model predicted that faster.",
            (double)ts->loads_declined);
        one(f, "kv_tier_disk_errors_total", "counter",
            "Disk tier I/O errors (each disables the disk tier).", (double)s->disk_errors);
        one(f, "kv_tier_disk_enabled", "gauge", "1 while the disk tier is in use.",
            s->disk_enabled);
        one(f, "kv_tier_disk_scanning", "gauge",
            "1 while the start-up scan of the disk tier's directory is still indexing records.",
            s->disk_scanning);
        one(f, "kv_tier_disk_write_drops_total", "counter",
            "Blocks not written to disk because the writer queue was full.",
            (double)s->disk_write_drops);
        write_through_metrics(f, ts);
        one(f, "kv_tier_engine_seconds_total", "counter",
            "Engine-thread time spent in tier work (exports on eviction, lookups, loads, swaps).",
            ts->busy_seconds);
        one(f, "kv_tier_prefill_tokens_per_second", "gauge",
            "Measured prefill rate the cost model compares moves against.", ts->cost.prefill_tps);
    }
    if (fclose(f)) {
        free(buf);
        return NULL;
    }
    return buf;
}

static json_t *tier_obj(const engine_tier_stats *ts, int t)
{
    const kvtier_stats *s = &ts->t;
    int on = t == KVTIER_HOST ? s->host_enabled : s->disk_enabled;
    int64_t blocks = t == KVTIER_HOST ? s->host_blocks : s->disk_blocks;
    int64_t cap = t == KVTIER_HOST ? s->host_capacity_blocks : s->disk_capacity_blocks;
    return json_pack("{s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f}", "enabled", on,
                     "blocks", (json_int_t)blocks, "capacity_blocks", (json_int_t)cap, "bytes",
                     (json_int_t)((uint64_t)blocks * s->record_bytes), "capacity_bytes",
                     (json_int_t)(t == KVTIER_HOST ? ts->host_capacity_bytes
                                                   : ts->disk_capacity_bytes),
                     "hits", (json_int_t)s->hits[t], "misses", (json_int_t)s->misses[t],
                     "hit_tokens", (json_int_t)ts->hit_tokens[t], "load_bytes",
                     (json_int_t)s->load_bytes[t], "store_bytes", (json_int_t)s->store_bytes[t],
                     "read_bytes_per_second", ts->cost.read_bps[t]);
}

json_t *srv_tier_json(const engine_tier_stats *ts)
{
    if (!ts->enabled)
        return json_pack("{s:b}", "enabled", 0);
    const kvtier_stats *s = &ts->t;
    json_t *j = json_pack("{s:b, s:I, s:o, s:o, s:{s:I, s:I}, s:{s:I, s:I, s:I}, s:I, s:I, s:f}",
                     "enabled", 1, "record_bytes", (json_int_t)s->record_bytes, "host",
                     tier_obj(ts, KVTIER_HOST), "disk", tier_obj(ts, KVTIER_DISK), "skipped",
                     "corrupt", (json_int_t)s->skipped_corrupt, "foreign",
                     (json_int_t)s->skipped_foreign, "decisions", "swaps", (json_int_t)ts->swaps,
                     "recomputes", (json_int_t)ts->recomputes, "loads_declined",
                     (json_int_t)ts->loads_declined, "disk_errors", (json_int_t)s->disk_errors,
                     "disk_write_drops", (json_int_t)s->disk_write_drops,
                     "prefill_tokens_per_second", ts->cost.prefill_tps);
    json_object_set_new(j, "write_through",
                        json_pack("{s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f}", "enabled",
                                  ts->write_through, "records", (json_int_t)s->wt_written,
                                  "bytes", (json_int_t)s->wt_written_bytes, "queue_depth",
                                  (json_int_t)s->disk_pending, "waiting_blocks",
                                  (json_int_t)ts->wt_waiting, "dedup", (json_int_t)s->wt_dedup,
                                  "queue_full", (json_int_t)s->wt_full, "reused",
                                  (json_int_t)ts->wt_missed, "writer_cpu_seconds",
                                  ts->writer_cpu_seconds));
    return j;
}
