/* test_gguf.c - GGUF reader: valid images built in memory, a table of
 * hand-made corrupt inputs (each must fail with KV_EFORMAT and a message
 * naming the field), truncation at every byte, and facts about the real
 * default model and the tokenizer vocab files (skipped, with a notice, when
 * those files are absent). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include "format/gguf.h"
#include "kernels/dtype.h"
#include "testutil.h"

#define MODEL_PATH "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define VOCAB_DIR "tests/data/vectors/tokenizer"

/* ---- a tiny GGUF image builder ---- */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void b_bytes(buf *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void b_u8(buf *b, uint8_t v) { b_bytes(b, &v, 1); }
static void b_u16(buf *b, uint16_t v) { b_bytes(b, &v, 2); }
static void b_u32(buf *b, uint32_t v) { b_bytes(b, &v, 4); }
static void b_u64(buf *b, uint64_t v) { b_bytes(b, &v, 8); }
static void b_f32(buf *b, float v) { b_bytes(b, &v, 4); }
static void b_f64(buf *b, double v) { b_bytes(b, &v, 8); }
static void b_str(buf *b, const char *s)
{
    b_u64(b, strlen(s));
    b_bytes(b, s, strlen(s));
}
static void b_hdr(buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    b_bytes(b, "GGUF", 4);
    b_u32(b, version);
    b_u64(b, n_tensors);
    b_u64(b, n_kv);
}
static void b_kv_u32(buf *b, const char *key, uint32_t v)
{
    b_str(b, key);
    b_u32(b, GGUF_TYPE_UINT32);
    b_u32(b, v);
}
static void b_kv_str(buf *b, const char *key, const char *v)
{
    b_str(b, key);
    b_u32(b, GGUF_TYPE_STRING);
    b_str(b, v);
}
static void b_tinfo(buf *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off)
{
    b_str(b, name);
    b_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) b_u64(b, ne[d]);
    b_u32(b, type);
    b_u64(b, off);
}
/* Pads to align, then appends n bytes of a non-zero pattern. */
static void b_data(buf *b, size_t align, size_t n)
{
    while (b->n % align) b_u8(b, 0);
    for (size_t i = 0; i < n; i++) b_u8(b, (uint8_t)(i * 7 + 1));
}

/* A file with one 4x2 f32 tensor at offset 0 and a single key; the corrupt
 * cases below start from variations of it. */
static void b_simple(buf *b, uint32_t type, const uint64_t *ne, uint32_t n_dims, uint64_t off)
{
    b_hdr(b, 3, 1, 1);
    b_kv_str(b, "general.architecture", "llama");
    b_tinfo(b, "w", n_dims, ne, type, off);
    b_data(b, 32, 64);
}

/* ---- the valid image ---- */

static const uint64_t NE_A[2] = {4, 3};   /* f32: 48 bytes */
static const uint64_t NE_B[2] = {64, 2};  /* q8_0: 2 rows x 2 blocks x 34 = 136 bytes */
static const uint64_t NE_C[1] = {8};      /* f16: 16 bytes */

static void build_valid(buf *b, uint32_t version)
{
    b_hdr(b, version, 3, 15);
    b_kv_str(b, "general.architecture", "llama");
    b_str(b, "k.u8"); b_u32(b, GGUF_TYPE_UINT8); b_u8(b, 200);
    b_str(b, "k.i8"); b_u32(b, GGUF_TYPE_INT8); b_u8(b, (uint8_t)-5);
    b_str(b, "k.u16"); b_u32(b, GGUF_TYPE_UINT16); b_u16(b, 60000);
    b_str(b, "k.i16"); b_u32(b, GGUF_TYPE_INT16); b_u16(b, (uint16_t)-300);
    b_kv_u32(b, "llama.block_count", 30);
    b_str(b, "k.i32"); b_u32(b, GGUF_TYPE_INT32); b_u32(b, (uint32_t)-70000);
    b_str(b, "k.f32"); b_u32(b, GGUF_TYPE_FLOAT32); b_f32(b, 1.5f);
    b_str(b, "k.bool"); b_u32(b, GGUF_TYPE_BOOL); b_u8(b, 1);
    b_str(b, "k.u64"); b_u32(b, GGUF_TYPE_UINT64); b_u64(b, 1ull << 40);
    b_str(b, "k.i64"); b_u32(b, GGUF_TYPE_INT64); b_u64(b, (uint64_t)-3);
    b_str(b, "k.f64"); b_u32(b, GGUF_TYPE_FLOAT64); b_f64(b, 0.25);
    b_str(b, "k.arr_i32"); b_u32(b, GGUF_TYPE_ARRAY); b_u32(b, GGUF_TYPE_INT32); b_u64(b, 3);
    b_u32(b, 10); b_u32(b, 20); b_u32(b, 30);
    b_str(b, "k.arr_str"); b_u32(b, GGUF_TYPE_ARRAY); b_u32(b, GGUF_TYPE_STRING); b_u64(b, 3);
    b_str(b, "hello"); b_str(b, ""); b_str(b, "wor\xc3\xb6ld");
    b_str(b, "k.arr_empty"); b_u32(b, GGUF_TYPE_ARRAY); b_u32(b, GGUF_TYPE_FLOAT32); b_u64(b, 0);
    /* Tensors out of offset order, with a gap, the last ending at EOF. */
    b_tinfo(b, "a", 2, NE_A, DT_F32, 0);
    b_tinfo(b, "c", 1, NE_C, DT_F16, 224);
    b_tinfo(b, "b", 2, NE_B, DT_Q8_0, 64);
    b_data(b, 32, 240);
}

static void test_valid(void)
{
    buf b = {0};
    build_valid(&b, 3);
    kvant_err e = {0};
    gguf_ctx *g = gguf_open_buffer(b.p, b.n, &e);
    CHECKF(g != NULL, "valid image rejected: %s", e.msg);
    if (!g) return;
    CHECK(gguf_version(g) == 3);
    CHECK(gguf_file_size(g) == b.n);
    CHECK(gguf_alignment(g) == 32);
    CHECK(gguf_data_offset(g) % 32 == 0 && gguf_data_offset(g) + 240 == b.n);
    CHECK(gguf_n_kv(g) == 15);
    CHECK(gguf_find_key(g, "nope") == -1);
    CHECK(gguf_find_key(g, "k.u") == -1);

    gguf_str s;
    CHECK(gguf_get_str(g, "general.architecture", &s, &e) == KV_OK && gguf_str_eq(s, "llama"));
    uint32_t u;
    int64_t i64;
    float f;
    int bo;
    CHECK(gguf_get_u32(g, "llama.block_count", &u, &e) == KV_OK && u == 30);
    CHECK(gguf_get_u32(g, "k.u8", &u, &e) == KV_OK && u == 200);
    CHECK(gguf_get_u32(g, "k.u16", &u, &e) == KV_OK && u == 60000);
    CHECK(gguf_get_i64(g, "k.i8", &i64, &e) == KV_OK && i64 == -5);
    CHECK(gguf_get_i64(g, "k.i16", &i64, &e) == KV_OK && i64 == -300);
    CHECK(gguf_get_i64(g, "k.i32", &i64, &e) == KV_OK && i64 == -70000);
    CHECK(gguf_get_i64(g, "k.i64", &i64, &e) == KV_OK && i64 == -3);
    CHECK(gguf_get_i64(g, "k.u64", &i64, &e) == KV_OK && i64 == (1ll << 40));
    /* Integer getters reject values that do not fit, naming the key. */
    CHECK(gguf_get_u32(g, "k.u64", &u, &e) == KV_EFORMAT && strstr(e.msg, "k.u64"));
    CHECK(gguf_get_u32(g, "k.i8", &u, &e) == KV_EFORMAT && strstr(e.msg, "k.i8"));
    CHECK(gguf_get_u32(g, "k.f32", &u, &e) == KV_EFORMAT && strstr(e.msg, "k.f32"));
    CHECK(gguf_get_u32(g, "missing.key", &u, &e) == KV_EFORMAT && strstr(e.msg, "missing.key"));
    CHECK(gguf_get_f32(g, "k.f32", &f, &e) == KV_OK && f == 1.5f);
    CHECK(gguf_get_f32(g, "k.f64", &f, &e) == KV_OK && f == 0.25f);
    CHECK(gguf_get_f32(g, "k.u8", &f, &e) == KV_EFORMAT);
    CHECK(gguf_get_bool(g, "k.bool", &bo, &e) == KV_OK && bo == 1);
    CHECK(gguf_get_bool(g, "k.u8", &bo, &e) == KV_EFORMAT);
    CHECK(gguf_get_str(g, "k.u8", &s, &e) == KV_EFORMAT);
    CHECK(gguf_get_u32_or(g, "absent", 7, &u, &e) == KV_OK && u == 7);
    CHECK(gguf_get_u32_or(g, "k.f32", 7, &u, &e) == KV_EFORMAT);
    CHECK(gguf_get_f32_or(g, "absent", 2.5f, &f, &e) == KV_OK && f == 2.5f);
    CHECK(gguf_get_bool_or(g, "absent", 1, &bo, &e) == KV_OK && bo == 1);
    CHECK(gguf_get_bool_or(g, "k.bool", 0, &bo, &e) == KV_OK && bo == 1);

    int64_t ia = gguf_find_key(g, "k.arr_i32");
    CHECK(ia >= 0 && gguf_kv_type(g, ia) == GGUF_TYPE_ARRAY && gguf_arr_type(g, ia) == GGUF_TYPE_INT32);
    CHECK(ia >= 0 && gguf_arr_n(g, ia) == 3);
    if (ia >= 0) {
        int32_t v[3];
        memcpy(v, gguf_arr_data(g, ia), sizeof v);
        CHECK(v[0] == 10 && v[1] == 20 && v[2] == 30);
    }
    int64_t is = gguf_find_key(g, "k.arr_str");
    CHECK(is >= 0 && gguf_arr_type(g, is) == GGUF_TYPE_STRING && gguf_arr_n(g, is) == 3);
    if (is >= 0) {
        CHECK(gguf_arr_data(g, is) == NULL);
        CHECK(gguf_str_eq(gguf_arr_str(g, is, 0), "hello"));
        CHECK(gguf_arr_str(g, is, 1).len == 0);
        CHECK(gguf_str_eq(gguf_arr_str(g, is, 2), "wor\xc3\xb6ld"));
        /* Backwards access is O(1) too: no walking involved. */
        CHECK(gguf_str_eq(gguf_arr_str(g, is, 0), "hello"));
    }
    int64_t ie = gguf_find_key(g, "k.arr_empty");
    CHECK(ie >= 0 && gguf_arr_n(g, ie) == 0 && gguf_arr_type(g, ie) == GGUF_TYPE_FLOAT32);
    CHECK(gguf_str_eq(gguf_key(g, 0), "general.architecture"));
    CHECK(gguf_kv_type(g, 1) == GGUF_TYPE_UINT8);
    CHECK(gguf_arr_n(g, 1) == 0 && gguf_arr_type(g, 1) == GGUF_TYPE_COUNT);

    CHECK(gguf_n_tensors(g) == 3);
    const uint8_t *data = b.p + gguf_data_offset(g);
    const gguf_tensor_info *ta = gguf_find_tensor(g, "a");
    const gguf_tensor_info *tb = gguf_find_tensor(g, "b");
    const gguf_tensor_info *tc = gguf_find_tensor(g, "c");
    CHECK(gguf_find_tensor(g, "d") == NULL);
    CHECK(ta && ta->n_dims == 2 && ta->ne[0] == 4 && ta->ne[1] == 3 && ta->ne[2] == 1 && ta->ne[3] == 1);
    CHECK(ta && ta->type == DT_F32 && ta->nbytes == 48 && ta->data == data + 0);
    CHECK(tb && tb->type == DT_Q8_0 && tb->nbytes == 136 && tb->offset == 64 && tb->data == data + 64);
    CHECK(tc && tc->type == DT_F16 && tc->nbytes == 16 && tc->data == data + 224 && tc->n_dims == 1);
    CHECK(gguf_tensor(g, 0) == ta && gguf_tensor(g, 1) == tc && gguf_tensor(g, 2) == tb);
    CHECK(ta && gguf_str_eq(ta->name, "a"));
    gguf_close(g);

    /* v2 has the same layout for our purposes. */
    buf b2 = {0};
    build_valid(&b2, 2);
    g = gguf_open_buffer(b2.p, b2.n, &e);
    CHECKF(g && gguf_version(g) == 2, "v2: %s", e.msg);
    gguf_close(g);

    /* Truncation at every byte must fail cleanly with a format error. */
    int bad = 0;
    for (size_t n = 0; n < b.n; n++) {
        uint8_t *copy = malloc(n ? n : 1); /* exact size so ASan sees over-reads */
        memcpy(copy, b.p, n);
        kvant_err te = {0};
        gguf_ctx *t = gguf_open_buffer(copy, n, &te);
        int ok = !t && te.code == KV_EFORMAT && strstr(te.msg, "byte") &&
                 (strstr(te.msg, "truncated") || strstr(te.msg, "left") || strstr(te.msg, "past the end"));
        if (!ok) {
            if (bad++ < 5) fprintf(stderr, "truncated at %zu: %s\n", n, t ? "accepted" : te.msg);
            gguf_close(t);
        }
        free(copy);
    }
    CHECKF(bad == 0, "%d truncated prefixes not rejected properly", bad);
    free(b.p);
    free(b2.p);
}

/* A vocab-only file (no tensors) may end right after the metadata; custom
 * alignment is honoured for the data section. */
static void test_no_tensors_and_alignment(void)
{
    buf b = {0};
    kvant_err e = {0};
    b_hdr(&b, 3, 0, 1);
    b_kv_str(&b, "tokenizer.ggml.model", "gpt2");
    gguf_ctx *g = gguf_open_buffer(b.p, b.n, &e);
    CHECKF(g && gguf_n_tensors(g) == 0 && gguf_data_offset(g) <= b.n, "%s", e.msg);
    gguf_close(g);
    free(b.p);

    buf c = {0};
    uint64_t ne[1] = {16};
    b_hdr(&c, 3, 2, 1);
    b_kv_u32(&c, "general.alignment", 64);
    b_tinfo(&c, "x", 1, ne, DT_F32, 0);
    b_tinfo(&c, "y", 1, ne, DT_F32, 64);
    b_data(&c, 64, 128);
    g = gguf_open_buffer(c.p, c.n, &e);
    CHECKF(g != NULL, "%s", e.msg);
    if (g) {
        CHECK(gguf_alignment(g) == 64 && gguf_data_offset(g) % 64 == 0);
        CHECK(gguf_find_tensor(g, "y")->data == c.p + gguf_data_offset(g) + 64);
    }
    gguf_close(g);
    free(c.p);
}

/* ---- corrupt inputs ---- */

static const uint64_t NE_42[2] = {4, 2};

static void c_bad_magic(buf *b) { b_simple(b, DT_F32, NE_42, 2, 0); b->p[0] = 'G'; b->p[3] = 'X'; }
static void c_version1(buf *b) { b_simple(b, DT_F32, NE_42, 2, 0); b->p[4] = 1; }
static void c_version99(buf *b) { b_simple(b, DT_F32, NE_42, 2, 0); b->p[4] = 99; }
static void c_big_endian(buf *b) { b_simple(b, DT_F32, NE_42, 2, 0); b->p[4] = 0; b->p[7] = 3; }
static void c_huge_tensor_count(buf *b) { b_hdr(b, 3, 1ull << 40, 0); b_data(b, 1, 64); }
static void c_huge_kv_count(buf *b) { b_hdr(b, 3, 0, 1ull << 40); b_data(b, 1, 64); }
static void c_counts_exceed_bytes(buf *b) { b_hdr(b, 3, 0, 60000); b_kv_u32(b, "a", 1); }
static void c_tensor_count_exceeds_bytes(buf *b) { b_hdr(b, 3, 1000, 0); b_data(b, 1, 200); }
static void c_huge_key_len(buf *b)
{
    b_hdr(b, 3, 0, 1);
    b_u64(b, 1ull << 63);
    b_data(b, 1, 40);
}
static void c_key_too_long(buf *b)
{
    char k[GGUF_MAX_NAME + 2];
    memset(k, 'k', sizeof k - 1);
    k[sizeof k - 1] = 0;
    b_hdr(b, 3, 0, 1);
    b_kv_u32(b, k, 1);
}
static void c_empty_key(buf *b) { b_hdr(b, 3, 0, 1); b_kv_u32(b, "", 1); b_data(b, 1, 8); }
static void c_key_nul(buf *b)
{
    b_hdr(b, 3, 0, 1);
    b_u64(b, 3);
    b_bytes(b, "a\0b", 3);
    b_u32(b, GGUF_TYPE_UINT32);
    b_u32(b, 1);
}
static void c_huge_string_len(buf *b)
{
    b_hdr(b, 3, 0, 1);
    b_str(b, "s");
    b_u32(b, GGUF_TYPE_STRING);
    b_u64(b, UINT64_MAX);
    b_data(b, 1, 40);
}
static void c_string_past_end(buf *b)
{
    b_hdr(b, 3, 0, 1);
    b_str(b, "s");
    b_u32(b, GGUF_TYPE_STRING);
    b_u64(b, 100);
    b_data(b, 1, 40);
}
static void c_huge_array_count(buf *b)
{
    b_hdr(b, 3, 0, 1);
    b_str(b, "arr");
    b_u32(b, GGUF_TYPE_ARRAY);
    b_u32(b, GGUF_TYPE_UINT32);
    b_u64(b, 1ull << 60);
    b_data(b, 1, 64);
}
static void c_huge_string_array(buf *b)
{
    b_hdr(b, 3, 0, 1);
    b_str(b, "arr");
    b_u32(b, GGUF_TYPE_ARRAY);
    b_u32(b, GGUF_TYPE_STRING);
    b_u64(b, UINT64_MAX / 2);
    b_data(b, 1, 64);
}
static void c_string_array_elem(buf *b)
{
    b_hdr(b, 3, 0, 1);
    b_str(b, "arr");
    b_u32(b, GGUF_TYPE_ARRAY);
    b_u32(b, GGUF_TYPE_STRING);
    b_u64(b, 3);
    b_str(b, "ok");
    b_u64(b, 1000); /* second string claims more than is left */
    b_data(b, 1, 16);
}
static void c_nested_array(buf *b)
{
    b_hdr(b, 3, 0, 1);
    b_str(b, "arr");
    b_u32(b, GGUF_TYPE_ARRAY);
    b_u32(b, GGUF_TYPE_ARRAY);
    b_u64(b, 1);
    b_u32(b, GGUF_TYPE_UINT8);
    b_u64(b, 1);
    b_u8(b, 1);
}
static void c_unknown_kv_type(buf *b) { b_hdr(b, 3, 0, 1); b_str(b, "x"); b_u32(b, 13); b_u64(b, 0); }
static void c_unknown_elem_type(buf *b)
{
    b_hdr(b, 3, 0, 1);
    b_str(b, "x");
    b_u32(b, GGUF_TYPE_ARRAY);
    b_u32(b, 0x10000);
    b_u64(b, 0);
}
static void c_duplicate_key(buf *b) { b_hdr(b, 3, 0, 2); b_kv_u32(b, "dup", 1); b_kv_u32(b, "dup", 2); }
static void c_bool_value(buf *b) { b_hdr(b, 3, 0, 1); b_str(b, "flag"); b_u32(b, GGUF_TYPE_BOOL); b_u8(b, 2); }
static void c_bool_array(buf *b)
{
    b_hdr(b, 3, 0, 1);
    b_str(b, "flags");
    b_u32(b, GGUF_TYPE_ARRAY);
    b_u32(b, GGUF_TYPE_BOOL);
    b_u64(b, 3);
    b_u8(b, 0); b_u8(b, 1); b_u8(b, 5);
}
static void c_align(buf *b, uint32_t type, uint64_t v)
{
    uint64_t ne[1] = {8};
    b_hdr(b, 3, 1, 1);
    b_str(b, "general.alignment");
    b_u32(b, type);
    if (type == GGUF_TYPE_UINT64) b_u64(b, v); else b_u32(b, (uint32_t)v);
    b_tinfo(b, "w", 1, ne, DT_F32, 0);
    b_data(b, 64, 64);
}
static void c_align_npot(buf *b) { c_align(b, GGUF_TYPE_UINT32, 48); }
static void c_align_zero(buf *b) { c_align(b, GGUF_TYPE_UINT32, 0); }
static void c_align_type(buf *b) { c_align(b, GGUF_TYPE_UINT64, 32); }
static void c_align_i32(buf *b) { c_align(b, GGUF_TYPE_INT32, 32); }
static void c_align_64_misaligned(buf *b)
{
    uint64_t ne[1] = {8};
    b_hdr(b, 3, 1, 1);
    b_kv_u32(b, "general.alignment", 64);
    b_tinfo(b, "w", 1, ne, DT_F32, 32);
    b_data(b, 64, 128);
}
static void c_tname_too_long(buf *b)
{
    char n[GGUF_MAX_NAME + 2];
    memset(n, 't', sizeof n - 1);
    n[sizeof n - 1] = 0;
    b_hdr(b, 3, 1, 0);
    b_tinfo(b, n, 2, NE_42, DT_F32, 0);
    b_data(b, 32, 32);
}
static void c_tname_empty(buf *b) { b_hdr(b, 3, 1, 0); b_tinfo(b, "", 2, NE_42, DT_F32, 0); b_data(b, 32, 32); }
static void c_dup_tensor(buf *b)
{
    b_hdr(b, 3, 2, 0);
    b_tinfo(b, "w", 2, NE_42, DT_F32, 0);
    b_tinfo(b, "w", 2, NE_42, DT_F32, 32);
    b_data(b, 32, 64);
}
static void c_ndims0(buf *b) { b_simple(b, DT_F32, NE_42, 0, 0); }
static void c_ndims5(buf *b)
{
    uint64_t ne[5] = {4, 1, 1, 1, 1};
    b_simple(b, DT_F32, ne, 5, 0);
}
static void c_dim0(buf *b)
{
    uint64_t ne[2] = {4, 0};
    b_simple(b, DT_F32, ne, 2, 0);
}
static void c_dim_negative(buf *b)
{
    uint64_t ne[2] = {UINT64_MAX - 3, 1};
    b_simple(b, DT_F32, ne, 2, 0);
}
static void c_dims_overflow(buf *b)
{
    uint64_t ne[3] = {1ull << 32, 1ull << 32, 4};
    b_simple(b, DT_F32, ne, 3, 0);
}
static void c_bytes_overflow(buf *b)
{
    uint64_t ne[2] = {1ull << 31, 1ull << 31}; /* 2^62 f32 elements = 2^64 bytes */
    b_simple(b, DT_F32, ne, 2, 0);
}
static void c_unknown_ttype(buf *b) { b_simple(b, 99, NE_42, 2, 0); }
static void c_removed_ttype(buf *b) { b_simple(b, 4, NE_42, 2, 0); } /* old Q4_2: in range, no traits */
static void c_block_multiple(buf *b)
{
    uint64_t ne[1] = {33};
    b_simple(b, DT_Q8_0, ne, 1, 0);
}
static void c_misaligned(buf *b) { b_simple(b, DT_F32, NE_42, 2, 4); }
static void c_past_end(buf *b) { b_simple(b, DT_F32, NE_42, 2, 64); }
static void c_offset_wrap(buf *b) { b_simple(b, DT_F32, NE_42, 2, 0xFFFFFFFFFFFFFFE0ull); }
static void c_too_big(buf *b)
{
    uint64_t ne[2] = {4, 3}; /* 48 bytes, only 32 after offset 32 */
    b_simple(b, DT_F32, ne, 2, 32);
}
static void c_overlap(buf *b)
{
    uint64_t ne[1] = {16}; /* 64 bytes each; second starts inside the first */
    b_hdr(b, 3, 2, 0);
    b_tinfo(b, "first", 1, ne, DT_F32, 0);
    b_tinfo(b, "second", 1, ne, DT_F32, 32);
    b_data(b, 32, 128);
}
static void c_same_offset(buf *b)
{
    b_hdr(b, 3, 2, 0);
    b_tinfo(b, "p", 2, NE_42, DT_F32, 0);
    b_tinfo(b, "q", 2, NE_42, DT_F32, 0);
    b_data(b, 32, 64);
}
static void c_no_padding(buf *b)
{
    b_hdr(b, 3, 1, 0);
    b_tinfo(b, "w", 2, NE_42, DT_F32, 0);
    /* ends right after the infos: the data section is missing */
}
static void c_tensor_info_trunc(buf *b)
{
    b_hdr(b, 3, 2, 0);
    b_tinfo(b, "w", 2, NE_42, DT_F32, 0);
    b_str(b, "v");
    b_u32(b, 2);
    b_data(b, 1, 24); /* dims + type + offset need 28 */
}
static void c_empty(buf *b) { b_bytes(b, "GG", 2); }

typedef struct corrupt_case {
    const char *name;
    void (*build)(buf *b);
    const char *want; /* substring the message must contain */
} corrupt_case;

static const corrupt_case CASES[] = {
    {"bad magic", c_bad_magic, "magic"},
    {"short file", c_empty, "magic"},
    {"version 1", c_version1, "v1"},
    {"version 99", c_version99, "version 99"},
    {"big-endian version", c_big_endian, "big-endian"},
    {"huge tensor_count", c_huge_tensor_count, "tensor_count"},
    {"huge kv_count", c_huge_kv_count, "kv_count"},
    {"kv_count beyond bytes", c_counts_exceed_bytes, "cannot fit"},
    {"tensor_count beyond bytes", c_tensor_count_exceeds_bytes, "cannot fit"},
    {"huge key length", c_huge_key_len, "key name"},
    {"key too long", c_key_too_long, "key name"},
    {"empty key", c_empty_key, "empty name"},
    {"key with NUL", c_key_nul, "NUL"},
    {"huge string value length", c_huge_string_len, "string value"},
    {"string past end", c_string_past_end, "string value"},
    {"huge array count", c_huge_array_count, "array count"},
    {"huge string array count", c_huge_string_array, "array count"},
    {"string array element truncated", c_string_array_elem, "element 1"},
    {"array of arrays", c_nested_array, "nested"},
    {"unknown kv type", c_unknown_kv_type, "unknown value type 13"},
    {"unknown array element type", c_unknown_elem_type, "unknown array element type"},
    {"duplicate key", c_duplicate_key, "duplicate key"},
    {"bool value 2", c_bool_value, "bool value"},
    {"bool array element 5", c_bool_array, "bool array element 2"},
    {"alignment not power of two", c_align_npot, "general.alignment"},
    {"alignment 0", c_align_zero, "general.alignment"},
    {"alignment u64", c_align_type, "expected u32"},
    {"alignment i32", c_align_i32, "expected u32"},
    {"offset misaligned to 64", c_align_64_misaligned, "not aligned to 64"},
    {"tensor name too long", c_tname_too_long, "tensor name"},
    {"tensor name empty", c_tname_empty, "tensor name"},
    {"duplicate tensor name", c_dup_tensor, "duplicate tensor name"},
    {"n_dims 0", c_ndims0, "n_dims 0"},
    {"n_dims 5", c_ndims5, "n_dims 5"},
    {"dim 0", c_dim0, "ne[1]"},
    {"dim above INT64_MAX", c_dim_negative, "ne[0]"},
    {"dims product overflow", c_dims_overflow, "element count overflows"},
    {"byte size overflow", c_bytes_overflow, "byte size overflows"},
    {"unknown tensor type", c_unknown_ttype, "type 99"},
    {"removed tensor type 4", c_removed_ttype, "type 4"},
    {"ne[0] not multiple of block", c_block_multiple, "block size"},
    {"misaligned offset", c_misaligned, "offset 4 is not aligned to 32"},
    {"offset past end", c_past_end, "past the end"},
    {"offset near 2^64", c_offset_wrap, "past the end"},
    {"data past end", c_too_big, "past the end"},
    {"overlapping data", c_overlap, "overlaps"},
    {"same offset", c_same_offset, "overlaps"},
    {"missing data section", c_no_padding, "padding"},
    {"tensor info truncated", c_tensor_info_trunc, "truncated"},
};

static void test_corrupt(void)
{
    size_t n = sizeof CASES / sizeof CASES[0];
    CHECK(n >= 30);
    for (size_t i = 0; i < n; i++) {
        buf b = {0};
        CASES[i].build(&b);
        /* Exact-size copy so ASan catches any read past the end. */
        uint8_t *copy = malloc(b.n ? b.n : 1);
        memcpy(copy, b.p, b.n);
        kvant_err e = {0};
        gguf_ctx *g = gguf_open_buffer(copy, b.n, &e);
        CHECKF(g == NULL, "case '%s': accepted", CASES[i].name);
        CHECKF(e.code == KV_EFORMAT, "case '%s': code %d (%s)", CASES[i].name, e.code, e.msg);
        CHECKF(strstr(e.msg, CASES[i].want) != NULL, "case '%s': message '%s' lacks '%s'", CASES[i].name,
               e.msg, CASES[i].want);
        CHECKF(strstr(e.msg, "byte") != NULL, "case '%s': message '%s' lacks a byte offset", CASES[i].name,
               e.msg);
        if (getenv("KVANT_TEST_VERBOSE")) fprintf(stderr, "  %-32s %s\n", CASES[i].name, e.msg);
        gguf_close(g);
        free(copy);
        free(b.p);
    }
}

/* gguf_open over a real file (mmap path) and its error paths. */
static void test_open_path(void)
{
    char path[] = "/tmp/test_gguf_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    buf b = {0};
    build_valid(&b, 3);
    CHECK(write(fd, b.p, b.n) == (ssize_t)b.n);
    close(fd);
    kvant_err e = {0};
    gguf_ctx *g = gguf_open(path, &e);
    CHECKF(g != NULL, "%s", e.msg);
    if (g) {
        const gguf_tensor_info *t = gguf_find_tensor(g, "b");
        CHECK(t && memcmp(t->data, b.p + gguf_data_offset(g) + 64, t->nbytes) == 0);
    }
    gguf_close(g);
    /* A corrupt file reports the path too. */
    fd = open(path, O_WRONLY | O_TRUNC);
    CHECK(write(fd, b.p, 100) == 100);
    close(fd);
    g = gguf_open(path, &e);
    CHECK(g == NULL && e.code == KV_EFORMAT && strstr(e.msg, path));
    unlink(path);
    g = gguf_open(path, &e);
    CHECK(g == NULL && e.code == KV_EIO);
    free(b.p);
}

static int file_exists(const char *p)
{
    return access(p, R_OK) == 0;
}

static void test_real_model(void)
{
    CHECKF(file_exists(MODEL_PATH), "%s absent (run `make model`)", MODEL_PATH);
    if (!file_exists(MODEL_PATH))
        return;
    kvant_err e = {0};
    gguf_ctx *g = gguf_open(MODEL_PATH, &e);
    CHECKF(g != NULL, "%s", e.msg);
    if (!g) return;
    uint32_t u = 0, vocab = 0;
    CHECK(gguf_get_u32(g, "llama.block_count", &u, &e) == KV_OK && u == 30);
    CHECK(gguf_get_u32(g, "llama.embedding_length", &u, &e) == KV_OK && u == 576);
    CHECK(gguf_get_u32(g, "llama.vocab_size", &vocab, &e) == KV_OK && vocab == 49152);
    CHECK(gguf_n_tensors(g) == 272);
    gguf_str s;
    CHECK(gguf_get_str(g, "general.architecture", &s, &e) == KV_OK && gguf_str_eq(s, "llama"));
    const gguf_tensor_info *t = gguf_find_tensor(g, "token_embd.weight");
    CHECK(t && t->type == 8 && t->n_dims == 2 && t->ne[0] == 576 && t->ne[1] == 49152);
    CHECK(t && t->nbytes == 576 / 32 * 34 * 49152ull);
    t = gguf_find_tensor(g, "blk.29.attn_q.weight");
    CHECK(t != NULL && t->type == DT_Q4_1);
    int64_t it = gguf_find_key(g, "tokenizer.ggml.tokens");
    int64_t ity = gguf_find_key(g, "tokenizer.ggml.token_type");
    CHECK(it >= 0 && gguf_arr_n(g, it) == vocab);
    CHECK(ity >= 0 && gguf_arr_n(g, ity) == vocab && gguf_arr_type(g, ity) == GGUF_TYPE_INT32);
    uint64_t end = 0;
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor_info *ti = gguf_tensor(g, i);
        if (ti->offset + ti->nbytes > end) end = ti->offset + ti->nbytes;
    }
    CHECK(gguf_data_offset(g) + end <= gguf_file_size(g));
    gguf_close(g);
}

static void test_vocab(const char *file, uint64_t n_tokens, const char *other_arr, uint64_t n_other)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", VOCAB_DIR, file);
    CHECKF(file_exists(path), "%s absent", path);
    if (!file_exists(path))
        return;
    kvant_err e = {0};
    gguf_ctx *g = gguf_open(path, &e);
    CHECKF(g != NULL, "%s: %s", path, e.msg);
    if (!g) return;
    CHECK(gguf_n_tensors(g) == 0);
    int64_t it = gguf_find_key(g, "tokenizer.ggml.tokens");
    int64_t ity = gguf_find_key(g, "tokenizer.ggml.token_type");
    int64_t io = gguf_find_key(g, other_arr);
    CHECKF(it >= 0 && gguf_arr_n(g, it) == n_tokens, "%s tokens", file);
    CHECKF(ity >= 0 && gguf_arr_n(g, ity) == n_tokens, "%s token_type", file);
    CHECKF(io >= 0 && gguf_arr_n(g, io) == n_other, "%s %s", file, other_arr);
    gguf_close(g);
}

int main(void)
{
    test_valid();
    test_no_tensors_and_alignment();
    test_corrupt();
    test_open_path();
    test_real_model();
    test_vocab("ggml-vocab-gpt-2.gguf", 50257, "tokenizer.ggml.merges", 50000);
    test_vocab("ggml-vocab-llama-spm.gguf", 32000, "tokenizer.ggml.scores", 32000);
    return tu_finish("test_gguf");
}
