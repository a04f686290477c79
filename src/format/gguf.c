/* gguf.c - GGUF (v2, v3) reader: validates the whole header at open time,
 * then serves metadata and tensor infos from immutable index arrays.
 *
 * Invariants after a successful open:
 *   - every byte range recorded (keys, strings, arrays, tensor data) lies
 *     inside [0, size) of the buffer; accessors never re-check bounds;
 *   - keys and tensor names are non-empty, <= GGUF_MAX_NAME bytes, contain
 *     no NUL byte and are unique (hash indexes give O(1) lookups);
 *   - arrays hold scalars or strings, never arrays (nested arrays are
 *     rejected: no known model uses them and they make validation recursive);
 *   - string arrays have an offset index so gguf_arr_str is O(1);
 *   - tensors have 1..4 dims, each >= 1 (zero-sized tensors are rejected:
 *     llama.cpp tolerates ne == 0 but no real model file uses it, and a
 *     zero-byte tensor makes "not overlapping" ambiguous), a known dtype,
 *     ne[0] a multiple of the block size, an aligned offset, data inside the
 *     file and no two tensors overlapping;
 *   - bool values are 0 or 1 (anything else is rejected as corruption).
 *
 * Validation order matters: every count is checked against the bytes left
 * (using the smallest possible encoding of one element) before anything is
 * allocated, so a header claiming 2^60 elements fails with a message, not
 * a malloc attempt.  All size arithmetic is in uint64_t with explicit
 * overflow checks.  Multi-byte values are read with memcpy (the file has
 * no alignment guarantees); the host must be little-endian like the file.
 */
#include "format/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/dtype.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c reads little-endian files with native loads; port before use on big-endian hosts"
#endif

/* Smallest encodings, used to bound counts by the bytes left. */
#define MIN_KV_BYTES 14      /* key len 8 + key 1 + type 4 + u8 value 1 */
#define MIN_TENSOR_BYTES 33  /* name len 8 + name 1 + n_dims 4 + 1 dim 8 + type 4 + offset 8 */

typedef struct gguf_kv {
    gguf_str key;
    gguf_type type;
    gguf_type arr_type;     /* element type when type == ARRAY */
    uint64_t arr_n;         /* element count when type == ARRAY */
    const uint8_t *val;     /* scalar value, string length prefix, or first array element */
    uint64_t *str_off;      /* [arr_n] file offsets of each string's length prefix (string arrays) */
} gguf_kv;

struct gguf_ctx {
    const uint8_t *base;    /* start of the file / buffer */
    uint64_t size;
    int mapped;             /* base is our mmap (unmapped at close) */
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;
    int64_t n_kv;
    int64_t n_tensors;
    gguf_kv *kv;               /* [n_kv] */
    gguf_tensor_info *tensors; /* [n_tensors] */
    uint32_t *kv_hash;         /* [kv_hash_cap] index + 1, 0 = empty */
    uint32_t *t_hash;          /* [t_hash_cap] */
    uint64_t kv_hash_cap, t_hash_cap;
};

/* Cursor over untrusted bytes; every read checks the bytes left. */
typedef struct cursor {
    const uint8_t *base;
    uint64_t size;
    uint64_t pos;
    kvant_err *err;
} cursor;

static const size_t type_size[GGUF_TYPE_COUNT] = {
    [GGUF_TYPE_UINT8] = 1,  [GGUF_TYPE_INT8] = 1,   [GGUF_TYPE_UINT16] = 2,
    [GGUF_TYPE_INT16] = 2,  [GGUF_TYPE_UINT32] = 4, [GGUF_TYPE_INT32] = 4,
    [GGUF_TYPE_FLOAT32] = 4, [GGUF_TYPE_BOOL] = 1,  [GGUF_TYPE_STRING] = 0,
    [GGUF_TYPE_ARRAY] = 0,  [GGUF_TYPE_UINT64] = 8, [GGUF_TYPE_INT64] = 8,
    [GGUF_TYPE_FLOAT64] = 8,
};

static const char *const type_names[GGUF_TYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

const char *gguf_type_name(gguf_type t)
{
    return (unsigned)t < GGUF_TYPE_COUNT ? type_names[t] : "unknown";
}

int gguf_str_eq(gguf_str s, const char *c)
{
    size_t n = strlen(c);
    return s.len == n && memcmp(s.ptr, c, n) == 0;
}

/* Copies an untrusted name into buf for messages: at most 64 bytes,
 * non-printable bytes shown as '?', so a corrupt name cannot garble logs. */
static const char *printable(const char *p, uint64_t len, char *buf, size_t cap)
{
    size_t n = len < cap - 4 ? (size_t)len : cap - 4, i;
    for (i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        buf[i] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
    }
    if (n < len) {
        memcpy(buf + n, "...", 3);
        n += 3;
    }
    buf[n] = '\0';
    return buf;
}

/* ---- cursor reads ---- */

static uint64_t cur_left(const cursor *c)
{
    return c->size - c->pos;
}

static int cur_need(cursor *c, uint64_t n, const char *what)
{
    if (n > cur_left(c))
        return kvant_err_set(c->err, KV_EFORMAT,
                             "%s (at byte %llu): needs %llu bytes, %llu left (truncated file)", what,
                             (unsigned long long)c->pos, (unsigned long long)n,
                             (unsigned long long)cur_left(c));
    return KV_OK;
}

static int cur_u32(cursor *c, uint32_t *out, const char *what)
{
    int rc = cur_need(c, 4, what);
    if (rc) return rc;
    memcpy(out, c->base + c->pos, 4);
    c->pos += 4;
    return KV_OK;
}

static int cur_u64(cursor *c, uint64_t *out, const char *what)
{
    int rc = cur_need(c, 8, what);
    if (rc) return rc;
    memcpy(out, c->base + c->pos, 8);
    c->pos += 8;
    return KV_OK;
}

/* Reads a u64-length-prefixed string; what names the field in errors. */
static int cur_str(cursor *c, gguf_str *out, uint64_t max_len, const char *what)
{
    uint64_t at = c->pos, len;
    int rc = cur_u64(c, &len, what);
    if (rc) return rc;
    if (len > max_len)
        return kvant_err_set(c->err, KV_EFORMAT, "%s (at byte %llu): length %llu exceeds the limit %llu",
                             what, (unsigned long long)at, (unsigned long long)len,
                             (unsigned long long)max_len);
    if (len > cur_left(c))
        return kvant_err_set(c->err, KV_EFORMAT,
                             "%s (at byte %llu): length %llu exceeds the %llu bytes left (truncated file)",
                             what, (unsigned long long)at, (unsigned long long)len,
                             (unsigned long long)cur_left(c));
    out->ptr = (const char *)(c->base + c->pos);
    out->len = len;
    c->pos += len;
    return KV_OK;
}

/* Keys and tensor names: 1..GGUF_MAX_NAME bytes, no NUL (lookups take C strings). */
static int cur_name(cursor *c, gguf_str *out, const char *what)
{
    uint64_t at = c->pos;
    int rc = cur_str(c, out, GGUF_MAX_NAME, what);
    if (rc) return rc;
    if (out->len == 0)
        return kvant_err_set(c->err, KV_EFORMAT, "%s (at byte %llu): empty name", what,
                             (unsigned long long)at);
    if (memchr(out->ptr, '\0', out->len))
        return kvant_err_set(c->err, KV_EFORMAT, "%s (at byte %llu): name contains a NUL byte", what,
                             (unsigned long long)at);
    return KV_OK;
}

/* ---- hash index (FNV-1a, open addressing, load <= 1/2) ---- */

static uint64_t hash_bytes(const char *p, uint64_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (uint64_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 0x100000001b3ULL;
    return h;
}

static uint64_t hash_cap_for(int64_t n)
{
    uint64_t cap = 16;
    while (cap < (uint64_t)n * 2) cap <<= 1;
    return cap;
}

/* Looks name up; returns the index or -1.  get_name maps index -> name. */
static int64_t hash_find(const uint32_t *tab, uint64_t cap, const char *p, uint64_t n,
                         gguf_str (*get_name)(const gguf_ctx *, int64_t), const gguf_ctx *g)
{
    if (!tab) return -1;
    for (uint64_t h = hash_bytes(p, n) & (cap - 1);; h = (h + 1) & (cap - 1)) {
        if (tab[h] == 0) return -1;
        gguf_str s = get_name(g, (int64_t)tab[h] - 1);
        if (s.len == n && memcmp(s.ptr, p, n) == 0) return (int64_t)tab[h] - 1;
    }
}

/* Inserts index i under name; returns the existing index on a duplicate, else -1. */
static int64_t hash_insert(uint32_t *tab, uint64_t cap, gguf_str name, int64_t i,
                           gguf_str (*get_name)(const gguf_ctx *, int64_t), const gguf_ctx *g)
{
    for (uint64_t h = hash_bytes(name.ptr, name.len) & (cap - 1);; h = (h + 1) & (cap - 1)) {
        if (tab[h] == 0) {
            tab[h] = (uint32_t)(i + 1);
            return -1;
        }
        gguf_str s = get_name(g, (int64_t)tab[h] - 1);
        if (s.len == name.len && memcmp(s.ptr, name.ptr, name.len) == 0) return (int64_t)tab[h] - 1;
    }
}

static gguf_str kv_name(const gguf_ctx *g, int64_t i)
{
    return g->kv[i].key;
}

static gguf_str tensor_name(const gguf_ctx *g, int64_t i)
{
    return g->tensors[i].name;
}

/* ---- metadata parsing ---- */

static int parse_array(cursor *c, gguf_kv *kv, const char *kname, uint64_t kat)
{
    uint32_t et;
    uint64_t n, at = c->pos;
    int rc = cur_u32(c, &et, "array element type");
    if (rc) return rc;
    if (et == GGUF_TYPE_ARRAY)
        return kvant_err_set(c->err, KV_EFORMAT,
                             "key '%s' (at byte %llu): array element type at byte %llu is array "
                             "(nested arrays are not supported)",
                             kname, (unsigned long long)kat, (unsigned long long)at);
    if (et >= GGUF_TYPE_COUNT)
        return kvant_err_set(c->err, KV_EFORMAT,
                             "key '%s' (at byte %llu): unknown array element type %u at byte %llu",
                             kname, (unsigned long long)kat, et, (unsigned long long)at);
    at = c->pos;
    if ((rc = cur_u64(c, &n, "array count"))) return rc;
    kv->arr_type = (gguf_type)et;
    kv->arr_n = n;
    kv->val = c->base + c->pos;
    /* Bound the count by the smallest element encoding before allocating. */
    uint64_t min_elem = et == GGUF_TYPE_STRING ? 8 : type_size[et];
    if (n > cur_left(c) / min_elem)
        return kvant_err_set(c->err, KV_EFORMAT,
                             "key '%s' (at byte %llu): array count %llu at byte %llu needs at least "
                             "%llu bytes each, only %llu bytes left",
                             kname, (unsigned long long)kat, (unsigned long long)n,
                             (unsigned long long)at, (unsigned long long)min_elem,
                             (unsigned long long)cur_left(c));
    if (et != GGUF_TYPE_STRING) {
        if (et == GGUF_TYPE_BOOL) {
            for (uint64_t j = 0; j < n; j++)
                if (kv->val[j] > 1)
                    return kvant_err_set(c->err, KV_EFORMAT,
                                         "key '%s' (at byte %llu): bool array element %llu is %u, not 0 or 1",
                                         kname, (unsigned long long)kat, (unsigned long long)j,
                                         kv->val[j]);
        }
        c->pos += n * min_elem;
        return KV_OK;
    }
    kv->str_off = malloc(n ? n * sizeof *kv->str_off : 1);
    if (!kv->str_off) return kvant_err_set(c->err, KV_ENOMEM, "key '%s': string array index", kname);
    for (uint64_t j = 0; j < n; j++) {
        gguf_str s;
        kv->str_off[j] = c->pos;
        if ((rc = cur_str(c, &s, GGUF_MAX_STRING, "array string"))) {
            char msg[KV_ERR_MSG_MAX];
            snprintf(msg, sizeof msg, "%s", c->err ? c->err->msg : "");
            return kvant_err_set(c->err, KV_EFORMAT, "key '%s' (at byte %llu): element %llu: %s", kname,
                                 (unsigned long long)kat, (unsigned long long)j, msg);
        }
    }
    return KV_OK;
}

static int parse_value(cursor *c, gguf_kv *kv, const char *kname, uint64_t kat)
{
    uint32_t t;
    uint64_t at = c->pos;
    int rc = cur_u32(c, &t, "value type");
    if (rc) return rc;
    if (t >= GGUF_TYPE_COUNT)
        return kvant_err_set(c->err, KV_EFORMAT, "key '%s' (at byte %llu): unknown value type %u at byte %llu",
                             kname, (unsigned long long)kat, t, (unsigned long long)at);
    kv->type = (gguf_type)t;
    kv->val = c->base + c->pos;
    if (t == GGUF_TYPE_ARRAY) return parse_array(c, kv, kname, kat);
    if (t == GGUF_TYPE_STRING) {
        gguf_str s;
        return cur_str(c, &s, GGUF_MAX_STRING, "string value");
    }
    if ((rc = cur_need(c, type_size[t], "value"))) return rc;
    if (t == GGUF_TYPE_BOOL && kv->val[0] > 1)
        return kvant_err_set(c->err, KV_EFORMAT, "key '%s' (at byte %llu): bool value is %u, not 0 or 1",
                             kname, (unsigned long long)kat, kv->val[0]);
    c->pos += type_size[t];
    return KV_OK;
}

static int parse_kvs(gguf_ctx *g, cursor *c)
{
    char nb[80];
    for (int64_t i = 0; i < g->n_kv; i++) {
        gguf_kv *kv = &g->kv[i];
        uint64_t at = c->pos;
        int rc = cur_name(c, &kv->key, "key name");
        if (rc) return rc;
        const char *kname = printable(kv->key.ptr, kv->key.len, nb, sizeof nb);
        int64_t dup = hash_insert(g->kv_hash, g->kv_hash_cap, kv->key, i, kv_name, g);
        if (dup >= 0)
            return kvant_err_set(c->err, KV_EFORMAT, "key '%s' (at byte %llu): duplicate key (also entry %lld)",
                                 kname, (unsigned long long)at, (long long)dup);
        if ((rc = parse_value(c, kv, kname, at))) return rc;
    }
    return KV_OK;
}

/* general.alignment: u32, non-zero power of two (default 32 when absent). */
static int read_alignment(gguf_ctx *g, kvant_err *err)
{
    int64_t i = gguf_find_key(g, "general.alignment");
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (i < 0) return KV_OK;
    const gguf_kv *kv = &g->kv[i];
    uint64_t at = (uint64_t)(kv->key.ptr - (const char *)g->base) - 8;
    if (kv->type != GGUF_TYPE_UINT32)
        return kvant_err_set(err, KV_EFORMAT, "key 'general.alignment' (at byte %llu): type %s, expected u32",
                             (unsigned long long)at, gguf_type_name(kv->type));
    uint32_t a;
    memcpy(&a, kv->val, 4);
    if (a == 0 || (a & (a - 1)) != 0)
        return kvant_err_set(err, KV_EFORMAT,
                             "key 'general.alignment' (at byte %llu): %u is not a non-zero power of two",
                             (unsigned long long)at, a);
    g->alignment = a;
    return KV_OK;
}

/* ---- tensor infos ---- */

/* Computes nbytes from type and ne; fails on overflow or a bad row length. */
static int tensor_size(gguf_tensor_info *t, const char *tname, uint64_t at, kvant_err *err)
{
    const dtype_traits *tr = dtype_get(t->type);
    if (!tr || !tr->name || tr->block_size <= 0 || tr->type_size == 0)
        return kvant_err_set(err, KV_EFORMAT, "tensor '%s' (info at byte %llu): unknown or unsupported type %u",
                             tname, (unsigned long long)at, t->type);
    uint64_t bs = (uint64_t)tr->block_size, elems = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        if (elems > (uint64_t)INT64_MAX / t->ne[d])
            return kvant_err_set(err, KV_EFORMAT,
                                 "tensor '%s' (info at byte %llu): element count overflows at dim %u",
                                 tname, (unsigned long long)at, d);
        elems *= t->ne[d];
    }
    if (t->ne[0] % bs != 0)
        return kvant_err_set(err, KV_EFORMAT,
                             "tensor '%s' (info at byte %llu): ne[0] = %llu is not a multiple of the "
                             "%s block size %llu",
                             tname, (unsigned long long)at, (unsigned long long)t->ne[0], tr->name,
                             (unsigned long long)bs);
    uint64_t blocks = elems / bs; /* exact: ne[0] divides by bs */
    if (blocks > UINT64_MAX / tr->type_size)
        return kvant_err_set(err, KV_EFORMAT, "tensor '%s' (info at byte %llu): byte size overflows",
                             tname, (unsigned long long)at);
    t->nbytes = blocks * tr->type_size;
    return KV_OK;
}

static int parse_tensor_info(gguf_ctx *g, cursor *c, int64_t i)
{
    gguf_tensor_info *t = &g->tensors[i];
    char nb[80];
    uint64_t at = c->pos;
    int rc = cur_name(c, &t->name, "tensor name");
    if (rc) return rc;
    const char *tname = printable(t->name.ptr, t->name.len, nb, sizeof nb);
    int64_t dup = hash_insert(g->t_hash, g->t_hash_cap, t->name, i, tensor_name, g);
    if (dup >= 0)
        return kvant_err_set(c->err, KV_EFORMAT,
                             "tensor '%s' (info at byte %llu): duplicate tensor name (also tensor %lld)",
                             tname, (unsigned long long)at, (long long)dup);
    if ((rc = cur_u32(c, &t->n_dims, "tensor n_dims"))) return rc;
    if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
        return kvant_err_set(c->err, KV_EFORMAT, "tensor '%s' (info at byte %llu): n_dims %u not in 1..%d",
                             tname, (unsigned long long)at, t->n_dims, GGUF_MAX_DIMS);
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if (d >= t->n_dims) continue;
        if ((rc = cur_u64(c, &t->ne[d], "tensor dim"))) return rc;
        if (t->ne[d] == 0 || t->ne[d] > (uint64_t)INT64_MAX)
            return kvant_err_set(c->err, KV_EFORMAT, "tensor '%s' (info at byte %llu): dim ne[%u] = %llu out of range",
                                 tname, (unsigned long long)at, d, (unsigned long long)t->ne[d]);
    }
    if ((rc = cur_u32(c, &t->type, "tensor type"))) return rc;
    if ((rc = cur_u64(c, &t->offset, "tensor offset"))) return rc;
    return tensor_size(t, tname, at, c->err);
}

static int cmp_u64_pair(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Checks alignment, bounds and overlap of every tensor's data range. */
static int check_tensor_data(gguf_ctx *g, const uint64_t *info_at, kvant_err *err)
{
    uint64_t avail = g->size - g->data_offset;
    char nb[80];
    for (int64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor_info *t = &g->tensors[i];
        const char *tname = printable(t->name.ptr, t->name.len, nb, sizeof nb);
        if (t->offset % g->alignment != 0)
            return kvant_err_set(err, KV_EFORMAT,
                                 "tensor '%s' (info at byte %llu): offset %llu is not aligned to %llu", tname,
                                 (unsigned long long)info_at[i], (unsigned long long)t->offset,
                                 (unsigned long long)g->alignment);
        if (t->offset > avail || t->nbytes > avail - t->offset)
            return kvant_err_set(err, KV_EFORMAT,
                                 "tensor '%s' (info at byte %llu): data offset %llu + %llu bytes runs past "
                                 "the end of the file (data section holds %llu bytes)",
                                 tname, (unsigned long long)info_at[i], (unsigned long long)t->offset,
                                 (unsigned long long)t->nbytes, (unsigned long long)avail);
        t->data = g->base + g->data_offset + t->offset;
    }
    if (g->n_tensors < 2) return KV_OK;
    uint64_t *ord = malloc((size_t)g->n_tensors * 2 * sizeof *ord); /* [n][offset, index] */
    if (!ord) return kvant_err_set(err, KV_ENOMEM, "tensor overlap check");
    for (int64_t i = 0; i < g->n_tensors; i++) {
        ord[2 * i] = g->tensors[i].offset;
        ord[2 * i + 1] = (uint64_t)i;
    }
    qsort(ord, (size_t)g->n_tensors, 2 * sizeof *ord, cmp_u64_pair);
    int rc = KV_OK;
    for (int64_t k = 1; k < g->n_tensors && rc == KV_OK; k++) {
        const gguf_tensor_info *p = &g->tensors[ord[2 * k - 1]], *q = &g->tensors[ord[2 * k + 1]];
        if (p->offset + p->nbytes > q->offset) {
            char pb[80];
            rc = kvant_err_set(err, KV_EFORMAT,
                               "tensor '%s' (info at byte %llu): data at offset %llu overlaps tensor '%s' "
                               "(offset %llu, %llu bytes)",
                               printable(q->name.ptr, q->name.len, nb, sizeof nb),
                               (unsigned long long)info_at[ord[2 * k + 1]], (unsigned long long)q->offset,
                               printable(p->name.ptr, p->name.len, pb, sizeof pb),
                               (unsigned long long)p->offset, (unsigned long long)p->nbytes);
        }
    }
    free(ord);
    return rc;
}

static int parse_tensors(gguf_ctx *g, cursor *c)
{
    uint64_t *info_at = malloc((size_t)(g->n_tensors ? g->n_tensors : 1) * sizeof *info_at);
    if (!info_at) return kvant_err_set(c->err, KV_ENOMEM, "tensor info index");
    int rc = KV_OK;
    for (int64_t i = 0; i < g->n_tensors && rc == KV_OK; i++) {
        info_at[i] = c->pos;
        rc = parse_tensor_info(g, c, i);
    }
    if (rc == KV_OK) {
        /* The data section starts at the next multiple of alignment. */
        uint64_t pad = (g->alignment - c->pos % g->alignment) % g->alignment;
        if (pad > cur_left(c)) {
            if (g->n_tensors > 0)
                rc = kvant_err_set(c->err, KV_EFORMAT,
                                   "data section padding (at byte %llu): needs %llu bytes, %llu left "
                                   "(truncated file)",
                                   (unsigned long long)c->pos, (unsigned long long)pad,
                                   (unsigned long long)cur_left(c));
            /* A file without tensors may end right after its metadata. */
            g->data_offset = c->size;
        } else {
            g->data_offset = c->pos + pad;
        }
    }
    if (rc == KV_OK) rc = check_tensor_data(g, info_at, c->err);
    free(info_at);
    return rc;
}

/* ---- open / close ---- */

static int parse_header(gguf_ctx *g, cursor *c)
{
    uint32_t magic;
    uint64_t nt, nkv;
    int rc = cur_u32(c, &magic, "magic");
    if (rc) return rc;
    if (memcmp(c->base, "GGUF", 4) != 0)
        return kvant_err_set(c->err, KV_EFORMAT, "magic (at byte 0): not a GGUF file (expected \"GGUF\")");
    if ((rc = cur_u32(c, &g->version, "version"))) return rc;
    if (g->version == 1)
        return kvant_err_set(c->err, KV_EFORMAT,
                             "version (at byte 4): GGUF v1 is not supported (re-convert the model to v3)");
    if (g->version == 0x02000000u || g->version == 0x03000000u)
        return kvant_err_set(c->err, KV_EFORMAT, "version (at byte 4): big-endian GGUF is not supported");
    if (g->version != 2 && g->version != 3)
        return kvant_err_set(c->err, KV_EFORMAT, "version (at byte 4): unsupported GGUF version %u",
                             g->version);
    if ((rc = cur_u64(c, &nt, "tensor_count")) || (rc = cur_u64(c, &nkv, "kv_count"))) return rc;
    if (nt > GGUF_MAX_TENSORS)
        return kvant_err_set(c->err, KV_EFORMAT, "tensor_count (at byte 8): %llu exceeds the limit %d",
                             (unsigned long long)nt, GGUF_MAX_TENSORS);
    if (nkv > GGUF_MAX_KV)
        return kvant_err_set(c->err, KV_EFORMAT, "kv_count (at byte 16): %llu exceeds the limit %d",
                             (unsigned long long)nkv, GGUF_MAX_KV);
    /* Both counts are small now, so this sum cannot overflow. */
    if (nkv * MIN_KV_BYTES + nt * MIN_TENSOR_BYTES > cur_left(c))
        return kvant_err_set(c->err, KV_EFORMAT,
                             "tensor_count/kv_count (at byte 8): %llu tensors and %llu keys cannot fit "
                             "in the %llu bytes left",
                             (unsigned long long)nt, (unsigned long long)nkv,
                             (unsigned long long)cur_left(c));
    g->n_tensors = (int64_t)nt;
    g->n_kv = (int64_t)nkv;
    return KV_OK;
}

static int alloc_indexes(gguf_ctx *g, kvant_err *err)
{
    g->kv_hash_cap = hash_cap_for(g->n_kv);
    g->t_hash_cap = hash_cap_for(g->n_tensors);
    g->kv = calloc((size_t)g->n_kv + 1, sizeof *g->kv);
    g->tensors = calloc((size_t)g->n_tensors + 1, sizeof *g->tensors);
    g->kv_hash = calloc(g->kv_hash_cap, sizeof *g->kv_hash);
    g->t_hash = calloc(g->t_hash_cap, sizeof *g->t_hash);
    if (!g->kv || !g->tensors || !g->kv_hash || !g->t_hash)
        return kvant_err_set(err, KV_ENOMEM, "gguf index arrays (%lld keys, %lld tensors)",
                             (long long)g->n_kv, (long long)g->n_tensors);
    return KV_OK;
}

gguf_ctx *gguf_open_buffer(const void *buf, size_t size, kvant_err *err)
{
    kvant_err local;
    if (!err) err = &local; /* string-array errors re-read the message */
    kvant_err_clear(err);
    if (!buf && size)
        return kvant_err_set(err, KV_EINVAL, "gguf_open_buffer: NULL buffer"), NULL;
    gguf_ctx *g = calloc(1, sizeof *g);
    if (!g) return kvant_err_set(err, KV_ENOMEM, "gguf context"), NULL;
    g->base = buf;
    g->size = size;
    cursor c = {.base = buf, .size = size, .pos = 0, .err = err};
    int rc = parse_header(g, &c);
    if (rc == KV_OK) rc = alloc_indexes(g, err);
    if (rc == KV_OK) rc = parse_kvs(g, &c);
    if (rc == KV_OK) rc = read_alignment(g, err);
    if (rc == KV_OK) rc = parse_tensors(g, &c);
    if (rc != KV_OK) {
        gguf_close(g);
        return NULL;
    }
    return g;
}

gguf_ctx *gguf_open(const char *path, kvant_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kvant_err_set(err, KV_EIO, "%s: cannot open: %s", path, strerror(errno)), NULL;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        kvant_err_set(err, KV_EIO, "%s: fstat: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode) || st.st_size < 24) {
        kvant_err_set(err, KV_EFORMAT, "%s: not a GGUF file (%s, %lld bytes)", path,
                      S_ISREG(st.st_mode) ? "too short" : "not a regular file", (long long)st.st_size);
        close(fd);
        return NULL;
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd); /* the mapping keeps the file alive */
    if (m == MAP_FAILED) return kvant_err_set(err, KV_EIO, "%s: mmap: %s", path, strerror(errno)), NULL;
    gguf_ctx *g = gguf_open_buffer(m, (size_t)st.st_size, err);
    if (!g) {
        char msg[KV_ERR_MSG_MAX];
        if (err) {
            snprintf(msg, sizeof msg, "%s", err->msg);
            kvant_err_set(err, err->code, "%s: %s", path, msg);
        }
        munmap(m, (size_t)st.st_size);
        return NULL;
    }
    g->mapped = 1;
    return g;
}

void gguf_close(gguf_ctx *g)
{
    if (!g) return;
    if (g->kv)
        for (int64_t i = 0; i < g->n_kv; i++) free(g->kv[i].str_off);
    free(g->kv);
    free(g->tensors);
    free(g->kv_hash);
    free(g->t_hash);
    if (g->mapped) munmap((void *)g->base, (size_t)g->size);
    free(g);
}

uint32_t gguf_version(const gguf_ctx *g) { return g->version; }
uint64_t gguf_file_size(const gguf_ctx *g) { return g->size; }
uint64_t gguf_alignment(const gguf_ctx *g) { return g->alignment; }
uint64_t gguf_data_offset(const gguf_ctx *g) { return g->data_offset; }

/* ---- metadata accessors ---- */

int64_t gguf_n_kv(const gguf_ctx *g) { return g->n_kv; }

int64_t gguf_find_key(const gguf_ctx *g, const char *key)
{
    return hash_find(g->kv_hash, g->kv_hash_cap, key, strlen(key), kv_name, g);
}

static const gguf_kv *kv_at(const gguf_ctx *g, int64_t i)
{
    KV_ASSERT(i >= 0 && i < g->n_kv);
    return &g->kv[i];
}

gguf_str gguf_key(const gguf_ctx *g, int64_t i) { return kv_at(g, i)->key; }
gguf_type gguf_kv_type(const gguf_ctx *g, int64_t i) { return kv_at(g, i)->type; }

gguf_type gguf_arr_type(const gguf_ctx *g, int64_t i)
{
    const gguf_kv *kv = kv_at(g, i);
    return kv->type == GGUF_TYPE_ARRAY ? kv->arr_type : GGUF_TYPE_COUNT;
}

uint64_t gguf_arr_n(const gguf_ctx *g, int64_t i)
{
    const gguf_kv *kv = kv_at(g, i);
    return kv->type == GGUF_TYPE_ARRAY ? kv->arr_n : 0;
}

const void *gguf_arr_data(const gguf_ctx *g, int64_t i)
{
    const gguf_kv *kv = kv_at(g, i);
    if (kv->type != GGUF_TYPE_ARRAY || kv->arr_type == GGUF_TYPE_STRING) return NULL;
    return kv->val;
}

gguf_str gguf_arr_str(const gguf_ctx *g, int64_t i, uint64_t j)
{
    const gguf_kv *kv = kv_at(g, i);
    KV_ASSERT(kv->type == GGUF_TYPE_ARRAY && kv->arr_type == GGUF_TYPE_STRING && j < kv->arr_n);
    gguf_str s;
    memcpy(&s.len, g->base + kv->str_off[j], 8);
    s.ptr = (const char *)(g->base + kv->str_off[j] + 8);
    return s;
}

/* ---- typed getters ---- */

/* Finds key and reports a missing key as KV_EFORMAT naming it. */
static const gguf_kv *get_kv(const gguf_ctx *g, const char *key, kvant_err *err)
{
    int64_t i = gguf_find_key(g, key);
    if (i < 0) {
        kvant_err_set(err, KV_EFORMAT, "key '%s': missing", key);
        return NULL;
    }
    return &g->kv[i];
}

static int wrong_type(const gguf_kv *kv, const char *key, const char *want, kvant_err *err)
{
    return kvant_err_set(err, KV_EFORMAT, "key '%s': type %s, expected %s", key, gguf_type_name(kv->type), want);
}

/* Reads any integer value as a sign flag + magnitude pair (exact). */
static int kv_int(const gguf_kv *kv, int *neg, uint64_t *mag)
{
    int64_t s = 0;
    uint64_t u = 0;
    int is_signed = 1;
    switch (kv->type) {
    case GGUF_TYPE_UINT8: { uint8_t v; memcpy(&v, kv->val, 1); u = v; is_signed = 0; break; }
    case GGUF_TYPE_UINT16: { uint16_t v; memcpy(&v, kv->val, 2); u = v; is_signed = 0; break; }
    case GGUF_TYPE_UINT32: { uint32_t v; memcpy(&v, kv->val, 4); u = v; is_signed = 0; break; }
    case GGUF_TYPE_UINT64: { memcpy(&u, kv->val, 8); is_signed = 0; break; }
    case GGUF_TYPE_INT8: { int8_t v; memcpy(&v, kv->val, 1); s = v; break; }
    case GGUF_TYPE_INT16: { int16_t v; memcpy(&v, kv->val, 2); s = v; break; }
    case GGUF_TYPE_INT32: { int32_t v; memcpy(&v, kv->val, 4); s = v; break; }
    case GGUF_TYPE_INT64: { memcpy(&s, kv->val, 8); break; }
    default: return -1;
    }
    if (is_signed) {
        *neg = s < 0;
        *mag = s < 0 ? (uint64_t)0 - (uint64_t)s : (uint64_t)s;
    } else {
        *neg = 0;
        *mag = u;
    }
    return 0;
}

int gguf_get_u32(const gguf_ctx *g, const char *key, uint32_t *out, kvant_err *err)
{
    const gguf_kv *kv = get_kv(g, key, err);
    int neg;
    uint64_t mag;
    if (!kv) return KV_EFORMAT;
    if (kv_int(kv, &neg, &mag) != 0) return wrong_type(kv, key, "an integer", err);
    if (neg || mag > UINT32_MAX)
        return kvant_err_set(err, KV_EFORMAT, "key '%s': value %s%llu does not fit in u32", key,
                             neg ? "-" : "", (unsigned long long)mag);
    *out = (uint32_t)mag;
    return KV_OK;
}

int gguf_get_i64(const gguf_ctx *g, const char *key, int64_t *out, kvant_err *err)
{
    const gguf_kv *kv = get_kv(g, key, err);
    int neg;
    uint64_t mag;
    if (!kv) return KV_EFORMAT;
    if (kv_int(kv, &neg, &mag) != 0) return wrong_type(kv, key, "an integer", err);
    if ((!neg && mag > (uint64_t)INT64_MAX) || (neg && mag > (uint64_t)INT64_MAX + 1))
        return kvant_err_set(err, KV_EFORMAT, "key '%s': value does not fit in i64", key);
    *out = neg ? (int64_t)(0 - mag) : (int64_t)mag;
    return KV_OK;
}

int gguf_get_f32(const gguf_ctx *g, const char *key, float *out, kvant_err *err)
{
    const gguf_kv *kv = get_kv(g, key, err);
    if (!kv) return KV_EFORMAT;
    if (kv->type == GGUF_TYPE_FLOAT32) {
        memcpy(out, kv->val, 4);
    } else if (kv->type == GGUF_TYPE_FLOAT64) {
        double d;
        memcpy(&d, kv->val, 8);
        *out = (float)d;
    } else {
        return wrong_type(kv, key, "f32 or f64", err);
    }
    return KV_OK;
}

int gguf_get_bool(const gguf_ctx *g, const char *key, int *out, kvant_err *err)
{
    const gguf_kv *kv = get_kv(g, key, err);
    if (!kv) return KV_EFORMAT;
    if (kv->type != GGUF_TYPE_BOOL) return wrong_type(kv, key, "bool", err);
    *out = kv->val[0] != 0;
    return KV_OK;
}

int gguf_get_str(const gguf_ctx *g, const char *key, gguf_str *out, kvant_err *err)
{
    const gguf_kv *kv = get_kv(g, key, err);
    if (!kv) return KV_EFORMAT;
    if (kv->type != GGUF_TYPE_STRING) return wrong_type(kv, key, "string", err);
    memcpy(&out->len, kv->val, 8);
    out->ptr = (const char *)(kv->val + 8);
    return KV_OK;
}

int gguf_get_u32_or(const gguf_ctx *g, const char *key, uint32_t def, uint32_t *out, kvant_err *err)
{
    if (gguf_find_key(g, key) < 0) {
        *out = def;
        return KV_OK;
    }
    return gguf_get_u32(g, key, out, err);
}

int gguf_get_f32_or(const gguf_ctx *g, const char *key, float def, float *out, kvant_err *err)
{
    if (gguf_find_key(g, key) < 0) {
        *out = def;
        return KV_OK;
    }
    return gguf_get_f32(g, key, out, err);
}

int gguf_get_bool_or(const gguf_ctx *g, const char *key, int def, int *out, kvant_err *err)
{
    if (gguf_find_key(g, key) < 0) {
        *out = def;
        return KV_OK;
    }
    return gguf_get_bool(g, key, out, err);
}

/* ---- tensors ---- */

int64_t gguf_n_tensors(const gguf_ctx *g) { return g->n_tensors; }

const gguf_tensor_info *gguf_tensor(const gguf_ctx *g, int64_t i)
{
    KV_ASSERT(i >= 0 && i < g->n_tensors);
    return &g->tensors[i];
}

const gguf_tensor_info *gguf_find_tensor(const gguf_ctx *g, const char *name)
{
    int64_t i = hash_find(g->t_hash, g->t_hash_cap, name, strlen(name), tensor_name, g);
    return i < 0 ? NULL : &g->tensors[i];
}
