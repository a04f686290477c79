/* pages.c - see pages.h. */
#include "util/pages.h"

#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

void pages_drop_mapped(const void *p, size_t n)
{
    const long pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0)
        return;
    const uintptr_t a = ((uintptr_t)p + (uintptr_t)pg - 1) / (uintptr_t)pg * (uintptr_t)pg;
    const uintptr_t z = ((uintptr_t)p + n) / (uintptr_t)pg * (uintptr_t)pg;
    if (z <= a)
        return;
    /* a VMA of its own (the flag splits the mapping at [a, z)): the kernel
     * maps the cached pages around a fault on a neighbouring tensor (fault-
     * around, whole large folios), but never across a VMA's bounds */
    (void)madvise((void *)a, z - a, MADV_RANDOM);
    (void)madvise((void *)a, z - a, MADV_DONTNEED);
}
