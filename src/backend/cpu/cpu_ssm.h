/* cpu_ssm.h - the recurrent layers of hybrid models on the CPU (backend.h
 * state_* and recr_mix): Mamba-2 (granitehybrid) and the short convolution
 * (lfm2).
 *
 * State: n_slots slots of slot_floats floats; in a slot, each recurrent
 * layer il has its convolution state at conv_off[il], [d_conv - 1][channels]
 * (the previous inputs, oldest row first), then (Mamba-2) its scan state at
 * ssm_off[il], [n_head][head_dim][d_state].  A slot's position is the number
 * of tokens it has consumed.
 *
 * Every token goes through its own sequence's slot in batch order, so a
 * sequence's results do not depend on what else is batched with it, nor on
 * how its prompt is cut into steps (the recurrence is the same whatever the
 * chunking: bitwise).  The work is split over channels (convolution) and
 * heads (scan), each thread walking all tokens in order for its share.
 *
 * Memory: the slots are the caller's (cpu_backend.c allocates them from the
 * memory manager, MEM_STATE); nothing is allocated here.
 * Threading: the engine thread, with the backend's pool inside recr_mix.
 */
#ifndef KVANT_CPU_SSM_H
#define KVANT_CPU_SSM_H

#include <stdint.h>

#include "backend/backend.h"
#include "backend/cpu/tpool.h"
#include "kernels/gdn.h"
#include "kernels/ssm.h"
#include "model/model.h"

typedef struct cpu_state {
    float *data;            /* [n_slots][slot_floats] (borrowed from the backend) */
    int32_t *pos;           /* [n_slots] tokens each slot has consumed */
    int32_t n_slots;
    uint64_t slot_floats;
    uint64_t conv_off[MODEL_MAX_LAYERS], ssm_off[MODEL_MAX_LAYERS];
    uint64_t conv_floats, ssm_floats; /* one layer's */
    ssm_scan_fn scan;       /* the scan kernel of the backend's ISA */
    gdn_step_fn gdn;        /* the Gated DeltaNet step of the backend's ISA */
} cpu_state;

/* The layout of m's state (n_slots 0, data NULL) and the kernels of isa;
 * slot_floats 0 when m has no recurrent layer. */
cpu_state cpu_state_layout(const model *m, kernel_isa isa);
/* Allocates n_slots zeroed slots from mem as one MEM_STATE block (*block;
 * st->data points into it) and their positions (host memory).  KV_ENOMEM. */
int cpu_state_alloc(cpu_state *st, mem_mgr *mem, int32_t n_slots, void **block, kvant_err *err);
void cpu_state_release(cpu_state *st, mem_mgr *mem, void **block);
void cpu_state_copy(cpu_state *st, int32_t dst, int32_t src);
int cpu_state_export(const cpu_state *st, int32_t slot, void *dst);
int cpu_state_import(cpu_state *st, int32_t slot, const void *src, int32_t pos);

/* Checks the batch (its slot ids already range-checked by the forward
 * pass) against the slots' positions (backend.h state_init) and
 * advances them as the pass will: each sequence's first token at 0 or at its
 * slot's position, its tokens consecutive; snapshot slots set to their
 * positions.  KV_EINVAL naming the sequence, nothing changed. */
int cpu_state_begin(cpu_state *st, const fwd_batch *b, kvant_err *err);

typedef struct cpu_recr_env {
    tpool *pool;
    cpu_state *st;
    const fwd_batch *batch;
    const model_family_hp *f;
    int32_t n_embd;
} cpu_recr_env;

/* backend.h recr_mix over the batch's n tokens. */
void cpu_recr_mix(const cpu_recr_env *env, int32_t il, const model_layer *L, float eps,
                  float *const *in, float *y, int32_t n);

#endif
