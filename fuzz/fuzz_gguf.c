/* fuzz_gguf.c - libFuzzer target for the GGUF reader.
 *
 * Opens the input as a GGUF image, then walks every key, every array
 * element and every tensor's data range, so that any bound the reader
 * failed to check shows up as an ASan report here rather than in the
 * engine.  Rejected inputs must set an error message (checked: a silent
 * failure would hide which field was bad).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Reads every byte of a range; the volatile store keeps the loads. */
static void touch(const void *p, uint64_t n)
{
    const uint8_t *b = p;
    uint8_t acc = 0;
    for (uint64_t i = 0; i < n; i++) acc ^= b[i];
    volatile uint8_t sink = acc;
    (void)sink;
}

static void walk_kv(const gguf_ctx *g, int64_t i)
{
    gguf_str k = gguf_key(g, i);
    char key[GGUF_MAX_NAME + 1];
    if (k.len == 0 || k.len > GGUF_MAX_NAME) abort(); /* reader invariant */
    memcpy(key, k.ptr, k.len);
    key[k.len] = '\0';
    if (gguf_find_key(g, key) != i) abort(); /* keys are unique */
    uint32_t u;
    int64_t i64;
    float f;
    int b;
    gguf_str s;
    kvant_err err = {0};
    (void)gguf_get_u32(g, key, &u, &err);
    (void)gguf_get_i64(g, key, &i64, &err);
    (void)gguf_get_f32(g, key, &f, &err);
    (void)gguf_get_bool(g, key, &b, &err);
    if (gguf_get_str(g, key, &s, &err) == KV_OK) touch(s.ptr, s.len);
    if (gguf_kv_type(g, i) != GGUF_TYPE_ARRAY) return;
    uint64_t n = gguf_arr_n(g, i);
    gguf_type et = gguf_arr_type(g, i);
    if (et == GGUF_TYPE_STRING) {
        for (uint64_t j = 0; j < n; j++) {
            s = gguf_arr_str(g, i, j);
            touch(s.ptr, s.len);
        }
    } else {
        static const uint8_t sz[GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
        if ((unsigned)et >= GGUF_TYPE_COUNT || sz[et] == 0) abort();
        touch(gguf_arr_data(g, i), n * sz[et]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvant_err err = {0};
    gguf_ctx *g = gguf_open_buffer(data, size, &err);
    if (!g) {
        if (err.code == KV_OK || err.msg[0] == '\0') abort();
        return 0;
    }
    for (int64_t i = 0; i < gguf_n_kv(g); i++) walk_kv(g, i);
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor_info *t = gguf_tensor(g, i);
        char name[GGUF_MAX_NAME + 1];
        memcpy(name, t->name.ptr, t->name.len);
        name[t->name.len] = '\0';
        if (gguf_find_tensor(g, name) != t) abort();
        if ((const uint8_t *)t->data < data || t->nbytes > size ||
            (const uint8_t *)t->data - data > (ptrdiff_t)(size - t->nbytes))
            abort();
        touch(t->data, t->nbytes);
    }
    gguf_close(g);
    return 0;
}
