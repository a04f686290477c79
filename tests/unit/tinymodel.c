/* tinymodel.c - see tinymodel.h. */
#include "tinymodel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/gguf_write.h"
#include "kernels/dtype.h"
#include "model/model.h"
#include "testutil.h"

#define TM_EMBD 64
#define TM_FF 128
#define TM_VOCAB 300
#define TM_LAYERS 2
#define TM_MAX_LAYERS 6 /* bufs[64] holds 3 + 9 per layer */

/* GPT-2's byte-to-unicode mapping, as UTF-8. */
static void byte_token(int b, char out[8])
{
    int cp;
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
        cp = b;
    } else {
        int n = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255)))
                n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

static int add_vocab(gguf_writer *w, int renamed)
{
    static char store[TM_VOCAB][16];
    const char *toks[TM_VOCAB];
    int32_t types[TM_VOCAB];
    for (int i = 0; i < TM_VOCAB; i++) {
        if (i < 256) {
            byte_token(i, store[i]);
            types[i] = 1;
        } else {
            snprintf(store[i], sizeof store[i], i == renamed ? "<|x%d|>" : "<|t%d|>", i);
            types[i] = 3;
        }
        toks[i] = store[i];
    }
    int rc = 0;
    rc |= gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2", NULL);
    rc |= gguf_writer_add_str(w, "tokenizer.ggml.pre", "default", NULL);
    rc |= gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, TM_VOCAB, NULL);
    rc |= gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, TM_VOCAB, NULL);
    rc |= gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", toks, 0, NULL);
    rc |= gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 256, NULL);
    rc |= gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 257, NULL);
    rc |= gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", 0, NULL);
    return rc;
}

static float *rand_tensor(tu_rng *r, int64_t n, float scale, float offset)
{
    float *t = malloc((size_t)n * sizeof *t);
    for (int64_t i = 0; t && i < n; i++)
        t[i] = offset + scale * tu_rand_normal(r);
    return t;
}

int tiny_model_write(const char *path, uint64_t seed)
{
    return tiny_model_write_layers(path, seed, TM_LAYERS);
}

static int write_model(const char *path, uint64_t seed, int n_layers, int renamed)
{
    if (n_layers < 1 || n_layers > TM_MAX_LAYERS)
        return -1;
    tu_rng r = {seed};
    gguf_writer *w = gguf_writer_create();
    float *bufs[64];
    int nb = 0, rc = 0;
    if (!w)
        return -1;
    rc |= gguf_writer_add_str(w, "general.architecture", "llama", NULL);
    rc |= gguf_writer_add_u32(w, "llama.block_count", (uint32_t)n_layers, NULL);
    rc |= gguf_writer_add_u32(w, "llama.context_length", 1024, NULL);
    rc |= gguf_writer_add_u32(w, "llama.embedding_length", TM_EMBD, NULL);
    rc |= gguf_writer_add_u32(w, "llama.feed_forward_length", TM_FF, NULL);
    rc |= gguf_writer_add_u32(w, "llama.attention.head_count", 4, NULL);
    rc |= gguf_writer_add_u32(w, "llama.attention.head_count_kv", 2, NULL);
    rc |= gguf_writer_add_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f, NULL);
    rc |= add_vocab(w, renamed);
    struct { const char *name; int64_t ne0, ne1; float scale, off; } spec[] = {
        {"token_embd.weight", TM_EMBD, TM_VOCAB, 0.5f, 0},
        {"output_norm.weight", TM_EMBD, 1, 0.1f, 1},
        {"output.weight", TM_EMBD, TM_VOCAB, 0.2f, 0},
    };
    for (size_t i = 0; i < 3; i++) {
        uint64_t ne[2] = {(uint64_t)spec[i].ne0, (uint64_t)spec[i].ne1};
        bufs[nb] = rand_tensor(&r, spec[i].ne0 * spec[i].ne1, spec[i].scale, spec[i].off);
        rc |= gguf_writer_add_tensor(w, spec[i].name, DT_F32, spec[i].ne1 > 1 ? 2 : 1, ne,
                                     bufs[nb++], NULL);
    }
    for (int il = 0; il < n_layers; il++) {
        struct { const char *n; int64_t ne0, ne1; float scale, off; } ls[] = {
            {"attn_norm", TM_EMBD, 1, 0.1f, 1}, {"attn_q", TM_EMBD, 64, 0.15f, 0},
            {"attn_k", TM_EMBD, 32, 0.15f, 0},  {"attn_v", TM_EMBD, 32, 0.15f, 0},
            {"attn_output", 64, TM_EMBD, 0.1f, 0}, {"ffn_norm", TM_EMBD, 1, 0.1f, 1},
            {"ffn_gate", TM_EMBD, TM_FF, 0.15f, 0}, {"ffn_up", TM_EMBD, TM_FF, 0.15f, 0},
            {"ffn_down", TM_FF, TM_EMBD, 0.1f, 0},
        };
        for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s.weight", il, ls[i].n);
            uint64_t ne[2] = {(uint64_t)ls[i].ne0, (uint64_t)ls[i].ne1};
            bufs[nb] = rand_tensor(&r, ls[i].ne0 * ls[i].ne1, ls[i].scale, ls[i].off);
            rc |= gguf_writer_add_tensor(w, name, DT_F32, ls[i].ne1 > 1 ? 2 : 1, ne, bufs[nb++],
                                         NULL);
        }
    }
    kvant_err err = {0};
    if (!rc)
        rc = gguf_writer_write(w, path, &err);
    if (rc)
        fprintf(stderr, "tiny_model_write: %s\n", err.msg);
    for (int i = 0; i < nb; i++)
        free(bufs[i]);
    gguf_writer_destroy(w);
    return rc;
}

int tiny_model_write_layers(const char *path, uint64_t seed, int n_layers)
{
    return write_model(path, seed, n_layers, -1);
}

int tiny_model_write_vocab(const char *path, uint64_t seed, int renamed)
{
    return write_model(path, seed, TM_LAYERS, renamed);
}

model *tiny_model_load(const char *path, uint64_t seed)
{
    char tmp[256];
    if (!path) {
        CHECK(tu_tmp_path(tmp, sizeof tmp, "tiny") == 0);
        path = tmp;
    }
    CHECK(tiny_model_write(path, seed) == 0);
    kvant_err err = {0};
    model *m = model_load(path, &err);
    CHECKF(m != NULL, "model_load %s: %s", path, err.msg);
    if (path == tmp)
        unlink(tmp);
    return m;
}
