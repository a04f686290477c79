/* gnames.h - a small map from byte-string names to int32 ids, for the
 * front ends (GBNF rule names, JSON Schema $ref targets).
 *
 * Ownership: gnames_create returns a heap handle freed by gnames_destroy;
 * names are copied.  Threading: one thread.
 */
#ifndef KVANT_GNAMES_H
#define KVANT_GNAMES_H

#include <stddef.h>
#include <stdint.h>

typedef struct gnames gnames;

gnames *gnames_create(void);
void gnames_destroy(gnames *m);
/* The id stored for name, or -1. */
int32_t gnames_get(const gnames *m, const char *name, size_t n);
/* Stores name -> id (replacing); 0, or -1 out of memory. */
int gnames_put(gnames *m, const char *name, size_t n, int32_t id);
/* The i-th name put (i < gnames_count), for messages; NUL-terminated. */
int32_t gnames_count(const gnames *m);
const char *gnames_name(const gnames *m, int32_t i, int32_t *id);

#endif
