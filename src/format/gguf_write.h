/* gguf_write.h - GGUF v3 writer: collects metadata and tensor infos, then
 * writes the file atomically (temporary file in the destination's folder,
 * fsync, rename), so a failed write never leaves a partial file behind.
 *
 * Metadata values are serialised into one growing buffer as they are added
 * (copied: the caller may free its strings and arrays right away).  Tensor
 * data is NOT copied: the pointer given to gguf_writer_add_tensor is
 * borrowed and must stay valid until gguf_writer_write returns.
 *
 * Keys: adding a key that is already present replaces its value in place
 * (its position in the file is kept), so a quantizer can copy all metadata
 * from a source file and then override e.g. general.file_type.  Setting
 * "general.alignment" (a u32 power of two) also sets the data alignment.
 *
 * Errors: invalid arguments (bad names, unknown tensor types, limits of
 * gguf.h exceeded) return KV_EINVAL; I/O failures return KV_EIO; memory
 * KV_ENOMEM.  After an error the writer is unchanged and still usable.
 * Ownership: gguf_writer_create returns a heap handle freed with
 * gguf_writer_destroy.  Threading: one thread at a time per writer.
 */
#ifndef KVANT_GGUF_WRITE_H
#define KVANT_GGUF_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"
#include "util/err.h"

typedef struct gguf_writer gguf_writer;

/* NULL on out-of-memory. */
gguf_writer *gguf_writer_create(void);
void gguf_writer_destroy(gguf_writer *w);

/* ---- metadata (values copied; key is a NUL-terminated name) ---- */
int gguf_writer_add_u8(gguf_writer *w, const char *key, uint8_t v, kvant_err *err);
int gguf_writer_add_i8(gguf_writer *w, const char *key, int8_t v, kvant_err *err);
int gguf_writer_add_u16(gguf_writer *w, const char *key, uint16_t v, kvant_err *err);
int gguf_writer_add_i16(gguf_writer *w, const char *key, int16_t v, kvant_err *err);
int gguf_writer_add_u32(gguf_writer *w, const char *key, uint32_t v, kvant_err *err);
int gguf_writer_add_i32(gguf_writer *w, const char *key, int32_t v, kvant_err *err);
int gguf_writer_add_f32(gguf_writer *w, const char *key, float v, kvant_err *err);
int gguf_writer_add_bool(gguf_writer *w, const char *key, int v, kvant_err *err);
int gguf_writer_add_u64(gguf_writer *w, const char *key, uint64_t v, kvant_err *err);
int gguf_writer_add_i64(gguf_writer *w, const char *key, int64_t v, kvant_err *err);
int gguf_writer_add_f64(gguf_writer *w, const char *key, double v, kvant_err *err);
/* s is NUL-terminated. */
int gguf_writer_add_str(gguf_writer *w, const char *key, const char *s, kvant_err *err);
/* n elements of fixed-size scalar type elem (not STRING/ARRAY), in host
 * (little-endian) layout; bool elements must be 0 or 1. */
int gguf_writer_add_arr(gguf_writer *w, const char *key, gguf_type elem, const void *data, uint64_t n,
                        kvant_err *err);
/* Array of n NUL-terminated strings. */
int gguf_writer_add_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n,
                            kvant_err *err);
/* Array of n counted strings (may contain any bytes). */
int gguf_writer_add_arr_strn(gguf_writer *w, const char *key, const gguf_str *strs, uint64_t n,
                             kvant_err *err);
/* Copies every key/value of src (in src's order), replacing keys already
 * present.  src may be closed afterwards. */
int gguf_writer_copy_kv(gguf_writer *w, const gguf_ctx *src, kvant_err *err);
int64_t gguf_writer_n_kv(const gguf_writer *w);

/* ---- tensors ---- */
/* Adds a tensor of dtype type with n_dims (1..4) dims ne (each >= 1, ne[0]
 * a multiple of the block size).  data (exactly the computed byte size) is
 * borrowed until gguf_writer_write returns.  Tensors are laid out in the
 * order added, each at the next aligned offset. */
int gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                           const uint64_t *ne, const void *data, kvant_err *err);
int64_t gguf_writer_n_tensors(const gguf_writer *w);

/* Writes the file to path atomically: a temporary file next to it, fsync,
 * rename over path.  On failure path is untouched and no temporary file is
 * left.  The writer may be written again (e.g. to another path). */
int gguf_writer_write(gguf_writer *w, const char *path, kvant_err *err);

#endif
