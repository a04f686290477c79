/* quant_load.h - load-time weight quantization (`--weights-dtype T`).
 *
 * quant_weights_apply converts every weight matrix of a loaded model
 * (2-D tensors: token_embd, output, wq/wk/wv/wo, w_gate/w_up/w_down; norms
 * and biases stay as they are) into type, one tensor at a time, into
 * memory from the memory manager (MEM_WEIGHTS, tagged with the tensor's
 * layer).  Each converted tensor's dev/type/row_bytes/nbytes then describe
 * the new copy; its data still points at the file's bytes (original type,
 * kept in the handle) and must not be read by kernels.  Backends treat a
 * tensor whose dev != data as already resident and do not reserve its
 * mapped bytes, so peak weight accounting ≈ final size + nothing else; the
 * transient read of the mapping is page cache, not counted.
 *
 * Call it after model_load and BEFORE backend load_weights (CPU backend).
 * Rows whose length does not fit type's blocks fall back (quant_fit_type)
 * with a note on stderr.  Tensors already in type are left zero-copy.
 *
 * Ownership: the handle owns the copies; quant_weights_free restores the
 * model's tensors and frees them (call after unload_weights, before
 * mem_destroy).  Threading: the loading thread only.
 */
#ifndef KVANT_QUANT_LOAD_H
#define KVANT_QUANT_LOAD_H

#include <stdint.h>

#include "mem/mem.h"
#include "model/model.h"
#include "util/err.h"

typedef struct quant_weights quant_weights;

/* imp: optional per-tensor importance lookup (NULL for RTN). Returns the
 * handle, or NULL with err (KV_ENOMEM over budget, KV_EINVAL bad type);
 * on failure the model is unchanged. */
quant_weights *quant_weights_apply(model *m, uint32_t type, mem_mgr *mem, kvant_err *err);
/* The same, converting into host memory the handle owns (a host mem_mgr of
 * its own) rather than into mem: for a backend whose memory manager hands
 * out device memory (CUDA), which the host cannot write; that backend's
 * load_weights uploads the converted copies (dev != data). */
quant_weights *quant_weights_apply_host(model *m, uint32_t type, kvant_err *err);
void quant_weights_free(quant_weights *qw);

/* Bytes of converted copies now held. */
uint64_t quant_weights_bytes(const quant_weights *qw);

#endif
