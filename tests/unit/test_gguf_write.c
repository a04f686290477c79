/* test_gguf_write.c - GGUF writer: round trip through the reader (every
 * value type, string arrays, tensors of several dtypes with random data,
 * custom alignment), key replacement, copy of all metadata from a file,
 * argument errors that leave the writer usable, and atomic-write failure
 * paths that must leave nothing behind. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/gguf.h"
#include "format/gguf_write.h"
#include "kernels/dtype.h"
#include "testutil.h"

#define VOCAB_PATH "tests/data/vectors/tokenizer/ggml-vocab-gpt-2.gguf"

static char g_dir[] = "/tmp/test_gguf_write_XXXXXX";

static void fill_random(tu_rng *r, uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(tu_rand_u64(r) >> 24);
}

/* Number of entries in g_dir (to prove no temporary file is left). */
static int dir_entries(void)
{
    DIR *d = opendir(g_dir);
    int n = 0;
    struct dirent *e;
    if (!d) return -1;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* Byte-compares every key/value of two readers (same order expected). */
static int same_kv(const gguf_ctx *a, const gguf_ctx *b)
{
    if (gguf_n_kv(a) != gguf_n_kv(b)) return 0;
    for (int64_t i = 0; i < gguf_n_kv(a); i++) {
        gguf_str ka = gguf_key(a, i), kb = gguf_key(b, i);
        if (ka.len != kb.len || memcmp(ka.ptr, kb.ptr, ka.len) != 0) return 0;
        if (gguf_kv_type(a, i) != gguf_kv_type(b, i)) return 0;
        if (gguf_kv_type(a, i) != GGUF_TYPE_ARRAY) continue;
        if (gguf_arr_type(a, i) != gguf_arr_type(b, i) || gguf_arr_n(a, i) != gguf_arr_n(b, i)) return 0;
        for (uint64_t j = 0; gguf_arr_type(a, i) == GGUF_TYPE_STRING && j < gguf_arr_n(a, i); j++) {
            gguf_str sa = gguf_arr_str(a, i, j), sb = gguf_arr_str(b, i, j);
            if (sa.len != sb.len || memcmp(sa.ptr, sb.ptr, sa.len) != 0) return 0;
        }
    }
    return 1;
}

static void test_round_trip(void)
{
    tu_rng r = {12345};
    kvant_err e = {0};
    gguf_writer *w = gguf_writer_create();
    CHECK(w != NULL);
    if (!w) return;
    /* Tensor data: f32 5x3, q8_0 64x3, f16 7, q4_K 256x2. */
    static uint8_t d0[60], d1[3 * 2 * 34], d2[14], d3[2 * 144];
    fill_random(&r, d0, sizeof d0);
    fill_random(&r, d1, sizeof d1);
    fill_random(&r, d2, sizeof d2);
    fill_random(&r, d3, sizeof d3);
    const uint64_t ne0[2] = {5, 3}, ne1[2] = {64, 3}, ne2[1] = {7}, ne3[3] = {256, 1, 2};
    CHECK(gguf_writer_add_str(w, "general.architecture", "llama", &e) == KV_OK);
    CHECK(gguf_writer_add_u8(w, "t.u8", 250, &e) == KV_OK);
    CHECK(gguf_writer_add_i8(w, "t.i8", -100, &e) == KV_OK);
    CHECK(gguf_writer_add_u16(w, "t.u16", 65000, &e) == KV_OK);
    CHECK(gguf_writer_add_i16(w, "t.i16", -32000, &e) == KV_OK);
    CHECK(gguf_writer_add_u32(w, "t.u32", 4000000000u, &e) == KV_OK);
    CHECK(gguf_writer_add_i32(w, "t.i32", -2000000000, &e) == KV_OK);
    CHECK(gguf_writer_add_f32(w, "t.f32", 3.25f, &e) == KV_OK);
    CHECK(gguf_writer_add_bool(w, "t.bool", 7, &e) == KV_OK); /* any non-zero is true */
    CHECK(gguf_writer_add_u64(w, "t.u64", 1ull << 50, &e) == KV_OK);
    CHECK(gguf_writer_add_i64(w, "t.i64", -(1ll << 50), &e) == KV_OK);
    CHECK(gguf_writer_add_f64(w, "t.f64", -0.125, &e) == KV_OK);
    const int32_t ai[4] = {1, -2, 3, -4};
    const float af[2] = {0.5f, -1.5f};
    const uint8_t ab[3] = {1, 0, 1};
    const char *as[4] = {"a", "", "hello world", "\xe2\x96\x81tok"};
    CHECK(gguf_writer_add_arr(w, "t.arr_i32", GGUF_TYPE_INT32, ai, 4, &e) == KV_OK);
    CHECK(gguf_writer_add_arr(w, "t.arr_f32", GGUF_TYPE_FLOAT32, af, 2, &e) == KV_OK);
    CHECK(gguf_writer_add_arr(w, "t.arr_bool", GGUF_TYPE_BOOL, ab, 3, &e) == KV_OK);
    CHECK(gguf_writer_add_arr(w, "t.arr_empty", GGUF_TYPE_UINT64, NULL, 0, &e) == KV_OK);
    CHECK(gguf_writer_add_arr_str(w, "t.arr_str", as, 4, &e) == KV_OK);
    const gguf_str gs[2] = {{"x\0y", 3}, {"zz", 2}};
    CHECK(gguf_writer_add_arr_strn(w, "t.arr_strn", gs, 2, &e) == KV_OK);
    CHECK(gguf_writer_add_tensor(w, "t0", DT_F32, 2, ne0, d0, &e) == KV_OK);
    CHECK(gguf_writer_add_tensor(w, "t1", DT_Q8_0, 2, ne1, d1, &e) == KV_OK);
    CHECK(gguf_writer_add_tensor(w, "t2", DT_F16, 1, ne2, d2, &e) == KV_OK);
    CHECK(gguf_writer_add_tensor(w, "t3", DT_Q4_K, 3, ne3, d3, &e) == KV_OK);
    /* Replacing keeps one record with the new value. */
    CHECK(gguf_writer_add_u32(w, "t.u32", 7, &e) == KV_OK);
    CHECK(gguf_writer_add_str(w, "t.u32", "now a string", &e) == KV_OK);
    CHECK(gguf_writer_n_kv(w) == 18 && gguf_writer_n_tensors(w) == 4);

    char path[256];
    snprintf(path, sizeof path, "%s/rt.gguf", g_dir);
    CHECKF(gguf_writer_write(w, path, &e) == KV_OK, "%s", e.msg);
    CHECK(dir_entries() == 1);
    gguf_ctx *g = gguf_open(path, &e);
    CHECKF(g != NULL, "%s", e.msg);
    if (g) {
        uint32_t u;
        int64_t i64;
        float f;
        int b;
        gguf_str s;
        CHECK(gguf_version(g) == 3 && gguf_n_kv(g) == 18 && gguf_n_tensors(g) == 4);
        CHECK(gguf_get_str(g, "general.architecture", &s, &e) == KV_OK && gguf_str_eq(s, "llama"));
        CHECK(gguf_get_u32(g, "t.u8", &u, &e) == KV_OK && u == 250);
        CHECK(gguf_get_i64(g, "t.i8", &i64, &e) == KV_OK && i64 == -100);
        CHECK(gguf_get_u32(g, "t.u16", &u, &e) == KV_OK && u == 65000);
        CHECK(gguf_get_i64(g, "t.i16", &i64, &e) == KV_OK && i64 == -32000);
        CHECK(gguf_get_str(g, "t.u32", &s, &e) == KV_OK && gguf_str_eq(s, "now a string"));
        CHECK(gguf_get_i64(g, "t.i32", &i64, &e) == KV_OK && i64 == -2000000000);
        CHECK(gguf_get_f32(g, "t.f32", &f, &e) == KV_OK && f == 3.25f);
        CHECK(gguf_get_bool(g, "t.bool", &b, &e) == KV_OK && b == 1);
        CHECK(gguf_get_i64(g, "t.u64", &i64, &e) == KV_OK && i64 == (1ll << 50));
        CHECK(gguf_get_i64(g, "t.i64", &i64, &e) == KV_OK && i64 == -(1ll << 50));
        CHECK(gguf_get_f32(g, "t.f64", &f, &e) == KV_OK && f == -0.125f);
        CHECK(gguf_find_key(g, "t.u32") == 5); /* replaced in place */
        int64_t k = gguf_find_key(g, "t.arr_i32");
        CHECK(k >= 0 && gguf_arr_n(g, k) == 4 && memcmp(gguf_arr_data(g, k), ai, sizeof ai) == 0);
        k = gguf_find_key(g, "t.arr_f32");
        CHECK(k >= 0 && gguf_arr_type(g, k) == GGUF_TYPE_FLOAT32 && memcmp(gguf_arr_data(g, k), af, 8) == 0);
        k = gguf_find_key(g, "t.arr_bool");
        CHECK(k >= 0 && gguf_arr_n(g, k) == 3 && memcmp(gguf_arr_data(g, k), ab, 3) == 0);
        k = gguf_find_key(g, "t.arr_empty");
        CHECK(k >= 0 && gguf_arr_n(g, k) == 0 && gguf_arr_type(g, k) == GGUF_TYPE_UINT64);
        k = gguf_find_key(g, "t.arr_str");
        CHECK(k >= 0 && gguf_arr_n(g, k) == 4);
        for (uint64_t j = 0; k >= 0 && j < 4; j++) CHECK(gguf_str_eq(gguf_arr_str(g, k, j), as[j]));
        k = gguf_find_key(g, "t.arr_strn");
        CHECK(k >= 0 && gguf_arr_str(g, k, 0).len == 3 && memcmp(gguf_arr_str(g, k, 0).ptr, "x\0y", 3) == 0);
        const void *datas[4] = {d0, d1, d2, d3};
        const size_t sizes[4] = {sizeof d0, sizeof d1, sizeof d2, sizeof d3};
        for (int t = 0; t < 4; t++) {
            const gguf_tensor_info *ti = gguf_tensor(g, t);
            CHECK(ti->nbytes == sizes[t] && memcmp(ti->data, datas[t], sizes[t]) == 0);
            CHECK(ti->offset % 32 == 0);
        }
        const gguf_tensor_info *t3 = gguf_find_tensor(g, "t3");
        CHECK(t3 && t3->n_dims == 3 && t3->ne[0] == 256 && t3->ne[1] == 1 && t3->ne[2] == 2 && t3->type == DT_Q4_K);
        /* The file ends right after the last tensor. */
        CHECK(t3 && gguf_data_offset(g) + t3->offset + t3->nbytes == gguf_file_size(g));

        /* Copy everything into a second writer with alignment 64. */
        gguf_writer *w2 = gguf_writer_create();
        CHECK(gguf_writer_add_u32(w2, "general.alignment", 64, &e) == KV_OK);
        CHECKF(gguf_writer_copy_kv(w2, g, &e) == KV_OK, "%s", e.msg);
        for (int64_t t = 0; t < gguf_n_tensors(g); t++) {
            const gguf_tensor_info *ti = gguf_tensor(g, t);
            char name[GGUF_MAX_NAME + 1];
            snprintf(name, sizeof name, "%.*s", (int)ti->name.len, ti->name.ptr);
            CHECK(gguf_writer_add_tensor(w2, name, ti->type, ti->n_dims, ti->ne, ti->data, &e) == KV_OK);
        }
        char path2[256];
        snprintf(path2, sizeof path2, "%s/copy.gguf", g_dir);
        CHECKF(gguf_writer_write(w2, path2, &e) == KV_OK, "%s", e.msg);
        gguf_ctx *g2 = gguf_open(path2, &e);
        CHECKF(g2 != NULL, "%s", e.msg);
        if (g2) {
            CHECK(gguf_alignment(g2) == 64 && gguf_data_offset(g2) % 64 == 0);
            CHECK(gguf_n_kv(g2) == gguf_n_kv(g) + 1);
            CHECK(gguf_find_key(g2, "general.alignment") == 0);
            for (int64_t t = 0; t < gguf_n_tensors(g2); t++) {
                const gguf_tensor_info *a = gguf_tensor(g, t), *b2 = gguf_tensor(g2, t);
                CHECK(b2->offset % 64 == 0 && memcmp(a->data, b2->data, a->nbytes) == 0);
            }
            float f2;
            CHECK(gguf_get_f32(g2, "t.f64", &f2, &e) == KV_OK && f2 == -0.125f);
            CHECK(gguf_get_i64(g2, "t.i16", &i64, &e) == KV_OK && i64 == -32000);
            gguf_close(g2);
        }
        gguf_writer_destroy(w2);
        unlink(path2);
        gguf_close(g);
    }
    unlink(path);
    gguf_writer_destroy(w);
}

static void test_errors(void)
{
    kvant_err e = {0};
    gguf_writer *w = gguf_writer_create();
    const uint64_t ne[2] = {32, 2}, bad0[2] = {33, 2}, zero[2] = {32, 0};
    static uint8_t d[256];
    char longname[GGUF_MAX_NAME + 2];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    const uint8_t badbool[2] = {0, 2};
    CHECK(gguf_writer_add_u32(w, "", 1, &e) == KV_EINVAL);
    CHECK(gguf_writer_add_u32(w, longname, 1, &e) == KV_EINVAL);
    CHECK(gguf_writer_add_u64(w, "general.alignment", 32, &e) == KV_EINVAL);
    CHECK(gguf_writer_add_u32(w, "general.alignment", 48, &e) == KV_EINVAL);
    CHECK(gguf_writer_add_u8(w, "general.alignment", 32, &e) == KV_EINVAL);
    CHECK(gguf_writer_add_arr(w, "b", GGUF_TYPE_BOOL, badbool, 2, &e) == KV_EINVAL);
    CHECK(gguf_writer_add_arr(w, "s", GGUF_TYPE_STRING, d, 1, &e) == KV_EINVAL);
    CHECK(gguf_writer_add_arr(w, "s", GGUF_TYPE_ARRAY, d, 1, &e) == KV_EINVAL);
    CHECK(gguf_writer_add_tensor(w, "q", DT_Q8_0, 2, bad0, d, &e) == KV_EINVAL && strstr(e.msg, "'q'"));
    CHECK(gguf_writer_add_tensor(w, "z", DT_F32, 2, zero, d, &e) == KV_EINVAL);
    CHECK(gguf_writer_add_tensor(w, "u", 99, 2, ne, d, &e) == KV_EINVAL);
    CHECK(gguf_writer_add_tensor(w, "n", DT_F32, 5, ne, d, &e) == KV_EINVAL);
    CHECK(gguf_writer_add_tensor(w, "", DT_F32, 2, ne, d, &e) == KV_EINVAL);
    CHECK(gguf_writer_add_tensor(w, "x", DT_F16, 2, ne, NULL, &e) == KV_EINVAL);
    CHECK(gguf_writer_add_tensor(w, "ok", DT_F16, 2, ne, d, &e) == KV_OK);
    CHECK(gguf_writer_add_tensor(w, "ok", DT_F16, 2, ne, d, &e) == KV_EINVAL && strstr(e.msg, "duplicate"));
    CHECK(gguf_writer_n_kv(w) == 0 && gguf_writer_n_tensors(w) == 1);

    /* Failed writes leave nothing: missing folder, and a rename onto a
     * non-empty directory. */
    char path[256];
    snprintf(path, sizeof path, "%s/no/such/dir/x.gguf", g_dir);
    CHECK(gguf_writer_write(w, path, &e) == KV_EIO);
    snprintf(path, sizeof path, "%s/adir", g_dir);
    char inner[300];
    snprintf(inner, sizeof inner, "%s/keep", path);
    CHECK(mkdir(path, 0700) == 0);
    CHECK(mkdir(inner, 0700) == 0);
    int before = dir_entries();
    CHECK(gguf_writer_write(w, path, &e) == KV_EIO);
    CHECK(dir_entries() == before);
    rmdir(inner);
    rmdir(path);
    /* Still usable after errors. */
    snprintf(path, sizeof path, "%s/after.gguf", g_dir);
    CHECKF(gguf_writer_write(w, path, &e) == KV_OK, "%s", e.msg);
    gguf_ctx *g = gguf_open(path, &e);
    CHECKF(g && gguf_n_tensors(g) == 1 && gguf_n_kv(g) == 0, "%s", e.msg);
    gguf_close(g);
    unlink(path);
    gguf_writer_destroy(w);
}

/* A real vocabulary round-trips through copy_kv unchanged. */
static void test_copy_vocab(void)
{
    CHECKF(access(VOCAB_PATH, R_OK) == 0, "%s absent", VOCAB_PATH);
    if (access(VOCAB_PATH, R_OK) != 0)
        return;
    kvant_err e = {0};
    gguf_ctx *src = gguf_open(VOCAB_PATH, &e);
    CHECKF(src != NULL, "%s", e.msg);
    if (!src) return;
    gguf_writer *w = gguf_writer_create();
    CHECKF(gguf_writer_copy_kv(w, src, &e) == KV_OK, "%s", e.msg);
    char path[256];
    snprintf(path, sizeof path, "%s/vocab.gguf", g_dir);
    CHECKF(gguf_writer_write(w, path, &e) == KV_OK, "%s", e.msg);
    gguf_ctx *g = gguf_open(path, &e);
    CHECKF(g != NULL, "%s", e.msg);
    if (g) {
        CHECK(same_kv(src, g));
        /* Same metadata encoding and no trailing padding: same size. */
        CHECK(gguf_file_size(g) == gguf_file_size(src));
        gguf_close(g);
    }
    unlink(path);
    gguf_writer_destroy(w);
    gguf_close(src);
}

int main(void)
{
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_round_trip();
    test_errors();
    test_copy_vocab();
    rmdir(g_dir);
    return tu_finish("test_gguf_write");
}
