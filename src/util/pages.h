/* pages.h - page-level hints on memory kvant maps or allocates.
 * Threading: any thread; the calls only advise the kernel. */
#ifndef KVANT_PAGES_H
#define KVANT_PAGES_H

#include <stddef.h>

/* Drops the resident pages wholly inside [p, p + n) of a read-only file
 * mapping (they are read again from the file if touched). */
void pages_drop_mapped(const void *p, size_t n);

#endif
