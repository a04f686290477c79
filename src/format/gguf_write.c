/* gguf_write.c - GGUF v3 writer (see gguf_write.h).
 *
 * Layout produced: header, key/value pairs in insertion order, tensor infos
 * in insertion order, zero padding to the alignment, then each tensor's
 * data at an offset (relative to the data section) that is a multiple of
 * the alignment, zero padding between tensors.  A file without tensors
 * ends right after its metadata.  The file ends right after
 * the last tensor's data, like the files llama.cpp and the Python gguf
 * package write.
 *
 * Invariants: every record's key and value lie inside `blob`; keys are
 * unique (a replaced value gets a fresh blob range; the old bytes are
 * simply abandoned, which costs memory only for repeated replacement);
 * every accepted tensor and value satisfies the reader's limits, so the
 * files written are always readable by gguf_open.
 */
#include "format/gguf_write.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/dtype.h"

typedef struct wkv {
    uint64_t key_off, key_len; /* key bytes in blob */
    uint64_t val_off, val_len; /* type u32 + payload, serialised, in blob */
} wkv;

typedef struct wtensor {
    char *name;
    uint32_t type, n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint64_t nbytes;
    const void *data; /* borrowed */
} wtensor;

struct gguf_writer {
    uint8_t *blob; /* [blob_len] serialised keys and values */
    size_t blob_len, blob_cap;
    wkv *kv;
    int64_t n_kv, kv_cap;
    wtensor *t;
    int64_t n_t, t_cap;
    uint32_t alignment;
};

static const size_t elem_size[GGUF_TYPE_COUNT] = {
    [GGUF_TYPE_UINT8] = 1,  [GGUF_TYPE_INT8] = 1,   [GGUF_TYPE_UINT16] = 2,
    [GGUF_TYPE_INT16] = 2,  [GGUF_TYPE_UINT32] = 4, [GGUF_TYPE_INT32] = 4,
    [GGUF_TYPE_FLOAT32] = 4, [GGUF_TYPE_BOOL] = 1,  [GGUF_TYPE_UINT64] = 8,
    [GGUF_TYPE_INT64] = 8,  [GGUF_TYPE_FLOAT64] = 8,
};

gguf_writer *gguf_writer_create(void)
{
    gguf_writer *w = calloc(1, sizeof *w);
    if (w) w->alignment = GGUF_DEFAULT_ALIGNMENT;
    return w;
}

void gguf_writer_destroy(gguf_writer *w)
{
    if (!w) return;
    for (int64_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->t);
    free(w->kv);
    free(w->blob);
    free(w);
}

int64_t gguf_writer_n_kv(const gguf_writer *w) { return w->n_kv; }
int64_t gguf_writer_n_tensors(const gguf_writer *w) { return w->n_t; }

/* ---- blob ---- */

static int blob_reserve(gguf_writer *w, uint64_t extra, kvant_err *err)
{
    if (extra > SIZE_MAX / 2 - w->blob_len) return kvant_err_set(err, KV_ENOMEM, "gguf writer: metadata too large");
    size_t need = w->blob_len + (size_t)extra;
    if (need <= w->blob_cap) return KV_OK;
    size_t cap = w->blob_cap ? w->blob_cap : 4096;
    while (cap < need) cap *= 2;
    uint8_t *p = realloc(w->blob, cap);
    if (!p) return kvant_err_set(err, KV_ENOMEM, "gguf writer: metadata buffer (%zu bytes)", cap);
    w->blob = p;
    w->blob_cap = cap;
    return KV_OK;
}

/* Callers reserve first; these cannot fail. */
static void blob_put(gguf_writer *w, const void *p, size_t n)
{
    if (n) memcpy(w->blob + w->blob_len, p, n);
    w->blob_len += n;
}
static void blob_u32(gguf_writer *w, uint32_t v) { blob_put(w, &v, 4); }
static void blob_u64(gguf_writer *w, uint64_t v) { blob_put(w, &v, 8); }

/* ---- key records ---- */

static int check_name(const char *what, const char *name, size_t len, kvant_err *err)
{
    if (len == 0 || len > GGUF_MAX_NAME)
        return kvant_err_set(err, KV_EINVAL, "gguf writer: %s '%.64s' length %zu not in 1..%d", what, name, len,
                             GGUF_MAX_NAME);
    if (memchr(name, '\0', len))
        return kvant_err_set(err, KV_EINVAL, "gguf writer: %s contains a NUL byte", what);
    return KV_OK;
}

static int64_t find_kv(const gguf_writer *w, const char *key, size_t len)
{
    for (int64_t i = 0; i < w->n_kv; i++)
        if (w->kv[i].key_len == len && memcmp(w->blob + w->kv[i].key_off, key, len) == 0) return i;
    return -1;
}

/* Starts a value for key: reserves room for the key (new record), the u32
 * type and payload bytes, writes key and type, and sets *idx to the record.
 * The caller appends exactly the payload and calls end_value.  Nothing
 * visible changes when this fails. */
static int begin_value(gguf_writer *w, const char *key, size_t key_len, gguf_type type, uint64_t payload,
                       int64_t *idx, kvant_err *err)
{
    int rc = check_name("key", key, key_len, err);
    if (rc) return rc;
    int64_t i = find_kv(w, key, key_len);
    if (i < 0 && w->n_kv >= GGUF_MAX_KV)
        return kvant_err_set(err, KV_EINVAL, "gguf writer: more than %d keys", GGUF_MAX_KV);
    if (i < 0 && w->n_kv == w->kv_cap) {
        int64_t cap = w->kv_cap ? w->kv_cap * 2 : 64;
        wkv *p = realloc(w->kv, (size_t)cap * sizeof *p);
        if (!p) return kvant_err_set(err, KV_ENOMEM, "gguf writer: key table");
        w->kv = p;
        w->kv_cap = cap;
    }
    if (payload > UINT64_MAX / 2 - 4 - key_len)
        return kvant_err_set(err, KV_EINVAL, "gguf writer: key '%.64s': value too large", key);
    if ((rc = blob_reserve(w, key_len + 4 + payload, err))) return rc;
    if (i < 0) {
        i = w->n_kv++;
        w->kv[i].key_off = w->blob_len;
        w->kv[i].key_len = key_len;
        blob_put(w, key, key_len);
    }
    w->kv[i].val_off = w->blob_len;
    blob_u32(w, (uint32_t)type);
    *idx = i;
    return KV_OK;
}

static void end_value(gguf_writer *w, int64_t i)
{
    w->kv[i].val_len = w->blob_len - w->kv[i].val_off;
}

static int add_scalar(gguf_writer *w, const char *key, gguf_type type, const void *v, kvant_err *err)
{
    if (type == GGUF_TYPE_BOOL && *(const uint8_t *)v > 1)
        return kvant_err_set(err, KV_EINVAL, "gguf writer: key '%.64s': bool must be 0 or 1", key);
    uint32_t align = 0;
    if (strcmp(key, "general.alignment") == 0) {
        if (type == GGUF_TYPE_UINT32) memcpy(&align, v, 4);
        if (align == 0 || (align & (align - 1)) != 0)
            return kvant_err_set(err, KV_EINVAL, "gguf writer: general.alignment must be a u32 power of two");
    }
    int64_t i;
    int rc = begin_value(w, key, strlen(key), type, elem_size[type], &i, err);
    if (rc) return rc;
    blob_put(w, v, elem_size[type]);
    end_value(w, i);
    if (align) w->alignment = align;
    return KV_OK;
}

int gguf_writer_add_u8(gguf_writer *w, const char *key, uint8_t v, kvant_err *err)
{ return add_scalar(w, key, GGUF_TYPE_UINT8, &v, err); }
int gguf_writer_add_i8(gguf_writer *w, const char *key, int8_t v, kvant_err *err)
{ return add_scalar(w, key, GGUF_TYPE_INT8, &v, err); }
int gguf_writer_add_u16(gguf_writer *w, const char *key, uint16_t v, kvant_err *err)
{ return add_scalar(w, key, GGUF_TYPE_UINT16, &v, err); }
int gguf_writer_add_i16(gguf_writer *w, const char *key, int16_t v, kvant_err *err)
{ return add_scalar(w, key, GGUF_TYPE_INT16, &v, err); }
int gguf_writer_add_u32(gguf_writer *w, const char *key, uint32_t v, kvant_err *err)
{ return add_scalar(w, key, GGUF_TYPE_UINT32, &v, err); }
int gguf_writer_add_i32(gguf_writer *w, const char *key, int32_t v, kvant_err *err)
{ return add_scalar(w, key, GGUF_TYPE_INT32, &v, err); }
int gguf_writer_add_f32(gguf_writer *w, const char *key, float v, kvant_err *err)
{ return add_scalar(w, key, GGUF_TYPE_FLOAT32, &v, err); }
int gguf_writer_add_u64(gguf_writer *w, const char *key, uint64_t v, kvant_err *err)
{ return add_scalar(w, key, GGUF_TYPE_UINT64, &v, err); }
int gguf_writer_add_i64(gguf_writer *w, const char *key, int64_t v, kvant_err *err)
{ return add_scalar(w, key, GGUF_TYPE_INT64, &v, err); }
int gguf_writer_add_f64(gguf_writer *w, const char *key, double v, kvant_err *err)
{ return add_scalar(w, key, GGUF_TYPE_FLOAT64, &v, err); }

int gguf_writer_add_bool(gguf_writer *w, const char *key, int v, kvant_err *err)
{
    uint8_t b = v != 0;
    return add_scalar(w, key, GGUF_TYPE_BOOL, &b, err);
}

static int add_strn(gguf_writer *w, const char *key, size_t key_len, const char *s, uint64_t len, kvant_err *err)
{
    if (len > GGUF_MAX_STRING)
        return kvant_err_set(err, KV_EINVAL, "gguf writer: key '%.64s': string of %llu bytes exceeds the limit",
                             key, (unsigned long long)len);
    int64_t i;
    int rc = begin_value(w, key, key_len, GGUF_TYPE_STRING, 8 + len, &i, err);
    if (rc) return rc;
    blob_u64(w, len);
    blob_put(w, s, (size_t)len);
    end_value(w, i);
    return KV_OK;
}

int gguf_writer_add_str(gguf_writer *w, const char *key, const char *s, kvant_err *err)
{
    return add_strn(w, key, strlen(key), s, strlen(s), err);
}

static int add_arr_raw(gguf_writer *w, const char *key, size_t key_len, gguf_type elem, const void *data,
                       uint64_t n, kvant_err *err)
{
    if ((unsigned)elem >= GGUF_TYPE_COUNT || elem_size[elem] == 0)
        return kvant_err_set(err, KV_EINVAL, "gguf writer: key '%.64s': array element type %d is not a scalar",
                             key, (int)elem);
    if (n > (UINT64_MAX / 2) / elem_size[elem])
        return kvant_err_set(err, KV_EINVAL, "gguf writer: key '%.64s': array too large", key);
    if (elem == GGUF_TYPE_BOOL)
        for (uint64_t j = 0; j < n; j++)
            if (((const uint8_t *)data)[j] > 1)
                return kvant_err_set(err, KV_EINVAL, "gguf writer: key '%.64s': bool element %llu not 0 or 1",
                                     key, (unsigned long long)j);
    uint64_t bytes = n * elem_size[elem];
    int64_t i;
    int rc = begin_value(w, key, key_len, GGUF_TYPE_ARRAY, 12 + bytes, &i, err);
    if (rc) return rc;
    blob_u32(w, (uint32_t)elem);
    blob_u64(w, n);
    blob_put(w, data, (size_t)bytes);
    end_value(w, i);
    return KV_OK;
}

int gguf_writer_add_arr(gguf_writer *w, const char *key, gguf_type elem, const void *data, uint64_t n,
                        kvant_err *err)
{
    return add_arr_raw(w, key, strlen(key), elem, data, n, err);
}

/* String arrays: strs[j] via get(ctx, j), so C strings, counted strings and
 * a source gguf_ctx share one implementation. */
typedef gguf_str (*str_getter)(const void *ctx, uint64_t j);

static int add_arr_str_any(gguf_writer *w, const char *key, size_t key_len, str_getter get, const void *ctx,
                           uint64_t n, kvant_err *err)
{
    uint64_t bytes = 12;
    for (uint64_t j = 0; j < n; j++) {
        gguf_str s = get(ctx, j);
        if (s.len > GGUF_MAX_STRING || bytes > UINT64_MAX / 2 - 8 - s.len)
            return kvant_err_set(err, KV_EINVAL, "gguf writer: key '%.64s': string %llu too long", key,
                                 (unsigned long long)j);
        bytes += 8 + s.len;
    }
    int64_t i;
    int rc = begin_value(w, key, key_len, GGUF_TYPE_ARRAY, bytes, &i, err);
    if (rc) return rc;
    blob_u32(w, GGUF_TYPE_STRING);
    blob_u64(w, n);
    for (uint64_t j = 0; j < n; j++) {
        gguf_str s = get(ctx, j);
        blob_u64(w, s.len);
        blob_put(w, s.ptr, (size_t)s.len);
    }
    end_value(w, i);
    return KV_OK;
}

static gguf_str get_cstr(const void *ctx, uint64_t j)
{
    const char *s = ((const char *const *)ctx)[j];
    return (gguf_str){s, strlen(s)};
}

static gguf_str get_gstr(const void *ctx, uint64_t j)
{
    return ((const gguf_str *)ctx)[j];
}

int gguf_writer_add_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n, kvant_err *err)
{
    return add_arr_str_any(w, key, strlen(key), get_cstr, strs, n, err);
}

int gguf_writer_add_arr_strn(gguf_writer *w, const char *key, const gguf_str *strs, uint64_t n, kvant_err *err)
{
    return add_arr_str_any(w, key, strlen(key), get_gstr, strs, n, err);
}

/* ---- copy from a reader ---- */

typedef struct src_arr {
    const gguf_ctx *g;
    int64_t i;
} src_arr;

static gguf_str get_src(const void *ctx, uint64_t j)
{
    const src_arr *a = ctx;
    return gguf_arr_str(a->g, a->i, j);
}

static int copy_one(gguf_writer *w, const gguf_ctx *src, int64_t i, kvant_err *err)
{
    gguf_str k = gguf_key(src, i);
    char key[GGUF_MAX_NAME + 1]; /* reader guarantees len <= GGUF_MAX_NAME, no NUL */
    memcpy(key, k.ptr, (size_t)k.len);
    key[k.len] = '\0';
    gguf_type t = gguf_kv_type(src, i);
    if (t == GGUF_TYPE_STRING) {
        gguf_str s;
        int rc = gguf_get_str(src, key, &s, err);
        return rc ? rc : add_strn(w, key, (size_t)k.len, s.ptr, s.len, err);
    }
    if (t == GGUF_TYPE_ARRAY) {
        gguf_type et = gguf_arr_type(src, i);
        if (et == GGUF_TYPE_STRING) {
            src_arr a = {src, i};
            return add_arr_str_any(w, key, (size_t)k.len, get_src, &a, gguf_arr_n(src, i), err);
        }
        return add_arr_raw(w, key, (size_t)k.len, et, gguf_arr_data(src, i), gguf_arr_n(src, i), err);
    }
    /* Scalars: gguf.h has no raw scalar accessor, but the GGUF layout fixes
     * where the value is: key bytes, u32 type, value (all inside src's
     * validated buffer).  Unaligned, hence add_scalar's memcpy. */
    const uint8_t *val = (const uint8_t *)k.ptr + k.len + 4;
    return add_scalar(w, key, t, val, err);
}

int gguf_writer_copy_kv(gguf_writer *w, const gguf_ctx *src, kvant_err *err)
{
    for (int64_t i = 0; i < gguf_n_kv(src); i++) {
        int rc = copy_one(w, src, i, err);
        if (rc) return rc;
    }
    return KV_OK;
}

/* ---- tensors ---- */

int gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims, const uint64_t *ne,
                           const void *data, kvant_err *err)
{
    size_t len = strlen(name);
    int rc = check_name("tensor name", name, len, err);
    if (rc) return rc;
    for (int64_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return kvant_err_set(err, KV_EINVAL, "gguf writer: duplicate tensor '%.64s'", name);
    if (w->n_t >= GGUF_MAX_TENSORS) return kvant_err_set(err, KV_EINVAL, "gguf writer: too many tensors");
    if (!data) return kvant_err_set(err, KV_EINVAL, "gguf writer: tensor '%.64s': NULL data", name);
    const dtype_traits *tr = dtype_get(type);
    if (!tr) return kvant_err_set(err, KV_EINVAL, "gguf writer: tensor '%.64s': unknown type %u", name, type);
    if (n_dims == 0 || n_dims > GGUF_MAX_DIMS)
        return kvant_err_set(err, KV_EINVAL, "gguf writer: tensor '%.64s': n_dims %u", name, n_dims);
    wtensor t = {.type = type, .n_dims = n_dims, .data = data, .ne = {1, 1, 1, 1}};
    uint64_t elems = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] == 0 || elems > (uint64_t)INT64_MAX / ne[d])
            return kvant_err_set(err, KV_EINVAL, "gguf writer: tensor '%.64s': bad dim ne[%u]", name, d);
        t.ne[d] = ne[d];
        elems *= ne[d];
    }
    if (t.ne[0] % (uint64_t)tr->block_size != 0)
        return kvant_err_set(err, KV_EINVAL, "gguf writer: tensor '%.64s': ne[0] not a multiple of %d", name,
                             tr->block_size);
    uint64_t blocks = elems / (uint64_t)tr->block_size;
    if (blocks > (UINT64_MAX / 4) / tr->type_size)
        return kvant_err_set(err, KV_EINVAL, "gguf writer: tensor '%.64s': too large", name);
    t.nbytes = blocks * tr->type_size;
    if (w->n_t == w->t_cap) {
        int64_t cap = w->t_cap ? w->t_cap * 2 : 64;
        wtensor *p = realloc(w->t, (size_t)cap * sizeof *p);
        if (!p) return kvant_err_set(err, KV_ENOMEM, "gguf writer: tensor table");
        w->t = p;
        w->t_cap = cap;
    }
    t.name = strdup(name);
    if (!t.name) return kvant_err_set(err, KV_ENOMEM, "gguf writer: tensor name");
    w->t[w->n_t++] = t;
    return KV_OK;
}

/* ---- output ---- */

typedef struct out {
    FILE *f;
    uint64_t pos;
    int failed;
} out;

static void out_put(out *o, const void *p, uint64_t n)
{
    if (o->failed || n == 0) return;
    if (fwrite(p, 1, (size_t)n, o->f) != (size_t)n) o->failed = errno ? errno : EIO;
    o->pos += n;
}
static void out_u32(out *o, uint32_t v) { out_put(o, &v, 4); }
static void out_u64(out *o, uint64_t v) { out_put(o, &v, 8); }

static void out_pad(out *o, uint64_t align)
{
    static const uint8_t zeros[256];
    uint64_t pad = (align - o->pos % align) % align;
    while (pad > 0) {
        uint64_t n = pad < sizeof zeros ? pad : sizeof zeros;
        out_put(o, zeros, n);
        pad -= n;
    }
}

static void write_all(gguf_writer *w, out *o)
{
    out_put(o, "GGUF", 4);
    out_u32(o, 3);
    out_u64(o, (uint64_t)w->n_t);
    out_u64(o, (uint64_t)w->n_kv);
    for (int64_t i = 0; i < w->n_kv; i++) {
        out_u64(o, w->kv[i].key_len);
        out_put(o, w->blob + w->kv[i].key_off, w->kv[i].key_len);
        out_put(o, w->blob + w->kv[i].val_off, w->kv[i].val_len);
    }
    uint64_t off = 0;
    for (int64_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        out_u64(o, strlen(t->name));
        out_put(o, t->name, strlen(t->name));
        out_u32(o, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) out_u64(o, t->ne[d]);
        out_u32(o, t->type);
        out_u64(o, off);
        off += t->nbytes;
        off += (w->alignment - off % w->alignment) % w->alignment;
    }
    /* No tensors: no data section and no padding (as llama.cpp writes
     * vocab-only files). */
    for (int64_t i = 0; i < w->n_t; i++) {
        out_pad(o, w->alignment);
        out_put(o, w->t[i].data, w->t[i].nbytes);
    }
}

/* fsyncs the folder holding path so the rename itself is durable. */
static void sync_dir(const char *path)
{
    char *copy = strdup(path);
    if (!copy) return;
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(copy);
}

int gguf_writer_write(gguf_writer *w, const char *path, kvant_err *err)
{
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) return kvant_err_set(err, KV_ENOMEM, "gguf writer: path");
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp.XXXXXX", 12);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        int rc = kvant_err_set(err, KV_EIO, "%s: cannot create temporary file: %s", path, strerror(errno));
        free(tmp);
        return rc;
    }
    out o = {.f = fdopen(fd, "wb")};
    if (!o.f) {
        o.failed = errno;
        close(fd);
    } else {
        errno = 0;
        write_all(w, &o);
        if (!o.failed && fflush(o.f) != 0) o.failed = errno;
        if (!o.failed && fsync(fileno(o.f)) != 0) o.failed = errno;
        if (fclose(o.f) != 0 && !o.failed) o.failed = errno;
    }
    if (!o.failed && rename(tmp, path) != 0) o.failed = errno;
    if (o.failed) {
        unlink(tmp);
        free(tmp);
        return kvant_err_set(err, KV_EIO, "%s: write failed: %s", path, strerror(o.failed));
    }
    free(tmp);
    sync_dir(path);
    return KV_OK;
}
