#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <unistd.h>

int tu_failures;
int tu_checks;

int tu_finish(const char *name)
{
    if (tu_checks == 0) {
        fprintf(stderr, "%s: FAIL (no checks ran)\n", name);
        return 1;
    }
    fprintf(stderr, "%s: %s (%d checks, %d failed)\n", name, tu_failures ? "FAIL" : "ok",
            tu_checks, tu_failures);
    return tu_failures ? 1 : 0;
}

unsigned long long tu_rand_u64(tu_rng *r)
{
    unsigned long long x = r->s ? r->s : 0x9e3779b97f4a7c15ULL;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    r->s = x;
    return x;
}

float tu_rand_uniform(tu_rng *r, float lo, float hi)
{
    double u = (double)(tu_rand_u64(r) >> 11) / (double)(1ULL << 53);
    return lo + (float)(u * (hi - lo));
}

float tu_rand_normal(tu_rng *r)
{
    double u1 = ((double)(tu_rand_u64(r) >> 11) + 1.0) / ((double)(1ULL << 53) + 1.0);
    double u2 = (double)(tu_rand_u64(r) >> 11) / (double)(1ULL << 53);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static int tmp_name(char *buf, size_t n, const char *stem)
{
    const char *dir = getenv("TMPDIR");
    int w = snprintf(buf, n, "%s/kvant-%s-XXXXXX", dir && *dir ? dir : "/tmp", stem);
    return w > 0 && (size_t)w < n ? 0 : -1;
}

int tu_tmp_path(char *buf, size_t n, const char *stem)
{
    if (tmp_name(buf, n, stem))
        return -1;
    int fd = mkstemp(buf);
    if (fd < 0)
        return -1;
    close(fd);
    return 0;
}

int tu_tmp_dir(char *buf, size_t n, const char *stem)
{
    return tmp_name(buf, n, stem) || !mkdtemp(buf) ? -1 : 0;
}
