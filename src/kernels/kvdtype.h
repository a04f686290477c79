/* kvdtype.h - the element types a KV cache may be stored in: one list,
 * read by the command line (--kv-dtype, its help), the planner and the
 * backends' kv_init checks.  Adding a KV type is a row in kvdtype.c plus
 * the backends' store and attention rows for it. */
#ifndef KVANT_KVDTYPE_H
#define KVANT_KVDTYPE_H

#include <stddef.h>
#include <stdint.h>

/* 1 when t (a GGUF type id) is a KV cache type. */
int kvdtype_ok(uint32_t t);
/* "f32, f16, bf16, q8_0, q4_0" into buf (cap bytes, NUL-terminated,
 * cut short if small); returns buf. */
const char *kvdtype_list(char *buf, size_t cap);

#endif
