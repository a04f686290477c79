/* gguf.h - GGUF (v2, v3) reader: memory-mapped, zero-copy tensor data.
 *
 * The whole header (metadata and tensor infos) is validated at open time
 * against the file size with overflow-safe arithmetic before anything is
 * allocated.  Any violation returns KV_EFORMAT with a message naming the
 * field and its byte offset; the reader never asserts on file content.
 *
 * Ownership: gguf_open returns a heap handle owned by the caller and freed
 * with gguf_close.  Every pointer returned by accessors (strings, arrays,
 * tensor data) is borrowed and valid until gguf_close.
 * Threading: a handle is immutable after open; concurrent reads are safe.
 */
#ifndef KVANT_GGUF_H
#define KVANT_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

/* Metadata value types, values equal to the GGUF specification. */
typedef enum gguf_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT
} gguf_type;

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32

/* Limits on untrusted header content (named, checked, listed in one place). */
#define GGUF_MAX_KV 65536            /* metadata entries */
#define GGUF_MAX_TENSORS 1048576     /* tensor infos */
#define GGUF_MAX_STRING (1u << 30)   /* one string's length in bytes */
#define GGUF_MAX_NAME 256            /* key and tensor name length */

/* A borrowed, not NUL-terminated string inside the mapping. */
typedef struct gguf_str {
    const char *ptr;
    uint64_t len;
} gguf_str;

typedef struct gguf_tensor_info {
    gguf_str name;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the contiguous (row) dimension; unused dims are 1 */
    uint32_t type;              /* dtype enum value (kernels/dtype.h), validated as known */
    uint64_t offset;            /* relative to the start of the data section */
    uint64_t nbytes;            /* computed from type and ne */
    const void *data;           /* borrowed pointer into the mapping */
} gguf_tensor_info;

typedef struct gguf_ctx gguf_ctx;

/* Opens and validates path (mmap).  Returns NULL and fills err on failure. */
gguf_ctx *gguf_open(const char *path, kvant_err *err);
/* Same validation over a caller-owned buffer (used by the fuzzer and tests);
 * buf must outlive the handle. */
gguf_ctx *gguf_open_buffer(const void *buf, size_t size, kvant_err *err);
void gguf_close(gguf_ctx *g);

uint32_t gguf_version(const gguf_ctx *g);
uint64_t gguf_file_size(const gguf_ctx *g);
uint64_t gguf_alignment(const gguf_ctx *g);
uint64_t gguf_data_offset(const gguf_ctx *g); /* byte offset of the data section */

/* ---- metadata ---- */
int64_t gguf_n_kv(const gguf_ctx *g);
int64_t gguf_find_key(const gguf_ctx *g, const char *key); /* index or -1 */
gguf_str gguf_key(const gguf_ctx *g, int64_t i);
gguf_type gguf_kv_type(const gguf_ctx *g, int64_t i);
/* For arrays: element type and count. */
gguf_type gguf_arr_type(const gguf_ctx *g, int64_t i);
uint64_t gguf_arr_n(const gguf_ctx *g, int64_t i);
/* Raw element pointer for arrays of fixed-size scalars (NULL for strings).
 * Points into the file, so it is usually NOT aligned: read elements with
 * memcpy (a cast to float * is undefined behaviour and UBSan reports it). */
const void *gguf_arr_data(const gguf_ctx *g, int64_t i);
/* j-th string of an array of strings. */
gguf_str gguf_arr_str(const gguf_ctx *g, int64_t i, uint64_t j);

/* Typed getters by key.  They return KV_OK, or an error (with err filled
 * naming the key) when the key is missing or has an incompatible type.
 * Integer getters accept any integer type whose value fits. */
int gguf_get_u32(const gguf_ctx *g, const char *key, uint32_t *out, kvant_err *err);
int gguf_get_i64(const gguf_ctx *g, const char *key, int64_t *out, kvant_err *err);
int gguf_get_f32(const gguf_ctx *g, const char *key, float *out, kvant_err *err);
int gguf_get_bool(const gguf_ctx *g, const char *key, int *out, kvant_err *err);
int gguf_get_str(const gguf_ctx *g, const char *key, gguf_str *out, kvant_err *err);
/* Convenience: value or default when the key is absent (still an error if
 * present with a wrong type). */
int gguf_get_u32_or(const gguf_ctx *g, const char *key, uint32_t def, uint32_t *out, kvant_err *err);
int gguf_get_f32_or(const gguf_ctx *g, const char *key, float def, float *out, kvant_err *err);
int gguf_get_bool_or(const gguf_ctx *g, const char *key, int def, int *out, kvant_err *err);

/* ---- tensors ---- */
int64_t gguf_n_tensors(const gguf_ctx *g);
const gguf_tensor_info *gguf_tensor(const gguf_ctx *g, int64_t i);
const gguf_tensor_info *gguf_find_tensor(const gguf_ctx *g, const char *name); /* NULL if absent */

/* Compares a gguf_str with a C string. */
int gguf_str_eq(gguf_str s, const char *c);
const char *gguf_type_name(gguf_type t);

#endif
