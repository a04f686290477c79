/* model_hash.h - a model's identity for checks across runs and processes
 * (the KV tiers' fingerprint, tensor-parallel ranks agreeing on one model):
 * SHA-256 over every tensor's type and shape and a sample of its bytes
 * (all of a small tensor, 16 evenly spaced 4 KiB chunks of a large one), so
 * it costs a few pages per tensor, not a read of the file.
 * Threading: reads the mapping only. */
#ifndef KVANT_MODEL_HASH_H
#define KVANT_MODEL_HASH_H

#include <stdint.h>

#include "kv/kvhash.h"
#include "model/model.h"

void model_hash_u64(kvhash_sha256_ctx *s, uint64_t v);
void model_hash_tensors(model *m, kvhash_sha256_ctx *s);

#endif
