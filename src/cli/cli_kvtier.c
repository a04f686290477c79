/* cli_kvtier.c - the KV offload tier options shared by `kvant serve` and
 * `kvant plan`: --kv-host-memory SIZE|auto, --kv-disk-dir DIR,
 * --kv-disk-size SIZE (sizes as mem_parse_size reads them: 512M, 4G, ...),
 * --kv-disk-write through|evict; and the prefix cache's recurrent-state
 * snapshots of hybrid models: --state-snapshot-every N (blocks; -1 none),
 * --state-snapshot-memory SIZE. */
#include <inttypes.h>
#include <string.h>

#include "cli/cli.h"
#include "kv/kvtier.h"

void cli_kvtier_help(FILE *f)
{
    const cli_opt t[] = {
        {"--kv-host-memory", "SIZE|auto", "host-memory KV tier under the device pool, 0: none; "
                                          "auto: half the free RAM after the weights", "0"},
        {"--kv-disk-dir", "DIR", "disk KV tier (kept across restarts), one server per DIR",
         "none"},
        {"--kv-disk-size", "SIZE", "disk KV tier budget", "4G with --kv-disk-dir"},
        {"--kv-disk-write", "through|evict", "through: every full prompt block goes to disk as it "
                                             "completes; evict: only blocks evicted from device "
                                             "and host", "through"},
    };
    cli_help_table(f, "KV offload tiers", t, CLI_N_OPTS(t));
}

static int parse_state(engine_config *ec, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v;
    if (!strcmp(a, "--state-snapshot-every")) {
        long n;
        if (!(v = cli_value(argc, argv, i)) || cli_parse_int(a, v, -1, 1 << 20, &n))
            return -1;
        ec->state_snap_every = n == 0 ? -1 : (int32_t)n; /* 0 given: none */
        return 1;
    }
    if (strcmp(a, "--state-snapshot-memory"))
        return 0;
    kvant_err err = {0};
    if (!(v = cli_value(argc, argv, i)))
        return -1;
    if (mem_parse_size(v, &ec->state_snap_bytes, &err) || !ec->state_snap_bytes) {
        fprintf(stderr, "kvant: %s: %s\n", a, err.code ? err.msg : "must be positive");
        return -1;
    }
    return 1;
}

int cli_kvtier_parse(engine_config *ec, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v;
    int rs = parse_state(ec, argc, argv, i);
    if (rs)
        return rs;
    int host = !strcmp(a, "--kv-host-memory"), dsize = !strcmp(a, "--kv-disk-size");
    if (!strcmp(a, "--kv-disk-dir")) {
        if (!(v = cli_value(argc, argv, i)))
            return -1;
        if (!v[0]) {
            fprintf(stderr, "kvant: --kv-disk-dir: empty path\n");
            return -1;
        }
        ec->kv_disk_dir = v;
        return 1;
    }
    if (!strcmp(a, "--kv-disk-write")) {
        if (!(v = cli_value(argc, argv, i)))
            return -1;
        if (strcmp(v, "through") && strcmp(v, "evict")) {
            fprintf(stderr, "kvant: --kv-disk-write: expected through or evict, got '%s'\n", v);
            return -1;
        }
        ec->kv_disk_evict_only = !strcmp(v, "evict");
        return 1;
    }
    if (!host && !dsize)
        return 0;
    kvant_err err = {0};
    uint64_t n = 0;
    if (!(v = cli_value(argc, argv, i)))
        return -1;
    if (host && !strcmp(v, "auto")) {
        ec->kv_host_memory = KVCOST_HOST_AUTO;
        return 1;
    }
    if (mem_parse_size(v, &n, &err)) {
        fprintf(stderr, "kvant: %s: %s\n", a, err.msg);
        return -1;
    }
    if (host)
        ec->kv_host_memory = n;
    else
        ec->kv_disk_size = n;
    return 1;
}

int cli_kvtier_check(const engine_config *ec, const char *cmd)
{
    if (ec->kv_disk_size && !ec->kv_disk_dir)
        return cli_err_usage(cmd, "--kv-disk-size needs --kv-disk-dir");
    return 0;
}
