/* tinymodel.h - writes a tiny random llama GGUF (f32 weights, byte-level
 * vocabulary) for engine and backend tests that must run fast under ASan. */
#ifndef KVANT_TINYMODEL_H
#define KVANT_TINYMODEL_H

#include <stdint.h>

/* Writes the model to path: n_layers 2, n_embd 64, 4 heads (2 KV),
 * n_ff 128, vocab 300, context 1024.  Returns 0 on success. */
int tiny_model_write(const char *path, uint64_t seed);
/* The same with n_layers layers, 1..6. */
int tiny_model_write_layers(const char *path, uint64_t seed, int n_layers);
/* The same model with token `renamed` (256..299) spelled differently: a
 * vocabulary of the same size that is not the same. */
int tiny_model_write_vocab(const char *path, uint64_t seed, int renamed);

struct model;
/* Writes the model to path and loads it; a failure is a CHECK failure and
 * returns NULL.  The caller frees it with model_free.  path NULL: a
 * temporary file (testutil.h's tu_tmp_path), removed once the model is
 * mapped. */
struct model *tiny_model_load(const char *path, uint64_t seed);

#endif
