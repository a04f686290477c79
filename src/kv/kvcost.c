/* kvcost.c - the tiers' cost model and the host tier's RAM check (see
 * kvcost.h). */
#include "kv/kvcost.h"

/* ---- host tier against RAM ---- */

int kvcost_host_fit(uint64_t want, uint64_t avail, uint64_t weights, uint64_t *out,
                    kvant_err *err)
{
    const double mib = 1024.0 * 1024.0;
    uint64_t keep = weights + KVCOST_HOST_MARGIN;
    uint64_t room = avail > keep ? avail - keep : 0;
    if (want == KVCOST_HOST_AUTO && avail == 0)
        return kvant_err_set(err, KV_EINVAL, "--kv-host-memory auto: the available RAM is not "
                             "known here (no MemAvailable); give a size");
    int is_auto = want == KVCOST_HOST_AUTO;
    if (is_auto)
        want = room / 100 * KVCOST_HOST_AUTO_PCT;
    else if (!avail || want <= room)
        room = want;
    if (is_auto && want == 0)
        return kvant_err_set(err, KV_EINVAL, "--kv-host-memory auto: no RAM left for a host tier: "
                             "%.0f MiB available (MemAvailable) - %.0f MiB of weights - %.0f MiB "
                             "margin", (double)avail / mib, (double)weights / mib,
                             (double)KVCOST_HOST_MARGIN / mib);
    if (want == 0 || want > room)
        return kvant_err_set(err, KV_EINVAL, "--kv-host-memory %.0f MiB does not fit in RAM: "
                             "%.0f MiB available (MemAvailable) - %.0f MiB of weights - %.0f MiB "
                             "margin leaves %.0f MiB", (double)want / mib, (double)avail / mib,
                             (double)weights / mib, (double)KVCOST_HOST_MARGIN / mib,
                             (double)room / mib);
    *out = want;
    return KV_OK;
}

/* ---- cost model ---- */

static int cheaper(double move_s, const kvcost *c, int64_t tokens)
{
    if (c->prefill_tps <= 0.0)
        return 1;
    return move_s < (double)tokens / c->prefill_tps;
}

int kvcost_prefer_load(const kvcost *c, int tier, uint64_t bytes, int64_t tokens)
{
    if (tier <= KVTIER_NONE || tier >= KVTIER_N || c->read_bps[tier] <= 0.0)
        return 0;
    return cheaper((double)bytes / c->read_bps[tier], c, tokens);
}

int kvcost_prefer_swap(const kvcost *c, uint64_t bytes, int64_t tokens)
{
    if (c->read_bps[KVTIER_HOST] <= 0.0 || c->write_bps[KVTIER_HOST] <= 0.0)
        return 0;
    double s = (double)bytes / c->write_bps[KVTIER_HOST] + (double)bytes / c->read_bps[KVTIER_HOST];
    return cheaper(s, c, tokens);
}

