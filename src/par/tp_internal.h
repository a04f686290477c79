/* tp_internal.h - par/ internal: the tensor/pipeline-parallel context
 * shared by tp.c (set-up, reductions, logit gather), tp_host.c (the
 * reduction in host memory), tp_dev.c (device backends), tp_cmd.c (rank
 * 0's commands, a worker receiving them) and tp_pipe.c (pipeline stages).
 * Calls run down only: tp.c calls tp_dev.c and tp_host.c, tp_dev.c calls
 * tp_host.c. */
#ifndef KVANT_TP_INTERNAL_H
#define KVANT_TP_INTERNAL_H

#include "backend/backend.h"
#include "batch/batch.h"
#include "par/par.h"
#include "par/tp_types.h"

#define TP_MSG_INTS 1024            /* a command with a small batch inline */
#define TP_HDR_INTS 8
#define TP_SMALL_BYTES (256u << 10) /* all-gather below, reduce-scatter above (bytes of
                                     * the gathered partials) */

struct tp_ctx {
    par *world;         /* borrowed: every rank, rank 0 schedules */
    par *stage;         /* this stage's tensor-parallel ranks: owned when pp_n > 1,
                         * else == world */
    backend *be;        /* borrowed */
    int32_t cmd_max_tokens, cmd_max_out; /* set by tp_attach: the largest batch
                                          * command a worker accepts */
    int rank, n;        /* in world */
    int tp_rank, tp_n, pp_stage, pp_n;
    int32_t max_tokens;
    int64_t max_count;  /* floats of the largest reduction */
    int32_t max_out, n_embd, n_vocab, nv_max;
    int32_t *vocab0, *nvocab; /* [tp_n] each tensor-parallel rank's vocabulary rows */
    void *d_base;       /* the exchange buffers (MEM_ACTIVATIONS) */
    float *gbuf;        /* [tp_n][max_count]: gathered partials */
    float *sbuf;        /* [tp_n][chunk]: padded send buffer of the reduce-scatter */
    float *ybuf;        /* [chunk]: this rank's summed chunk */
    float *lbuf;        /* stage rank 0 of the last stage: [tp_n][max_out * nv_max] */
    float *rbuf;        /* stages > 0: [max_tokens][n_embd] posted receives */
    float *plog;        /* the last stage's tp rank 0 when it is not rank 0:
                         * [max_out][n_vocab] logits before they go to rank 0 */
    int32_t *mb_out;    /* [max_out] a micro-batch's output rows */
    /* device backends (CUDA; tp_dev.c): what MPI reads and writes lives in
     * host memory, the reductions' buffers on the device when NCCL
     * carries them */
    int host_mem;       /* 1: the backend's memory is host memory (CPU) */
    void *h_base;       /* device backends: the host exchange buffers (malloc) */
    float *hx;          /* device backends: [max_count] activations staged on the host */
    float *hl;          /* device backends: [max_out * nv_max] this rank's logit slice */
    struct cuda_tp *nccl; /* the stage's NCCL communicator, or NULL (through MPI) */
    int32_t msg[TP_MSG_INTS];
    int32_t *rx;        /* worker: a large batch's payload */
    size_t rx_cap;
    fwd_seq *seqs;
    int32_t seqs_cap;
    tp_stats st;
};

/* tp_host.c: the reduction of x[0..count) in host memory over MPI (the
 * CPU path; device backends without NCCL after staging x on the host). */
int tp_host_allreduce(tp_ctx *t, float *x, int64_t count, kvant_err *err);
/* 1: a reduction of count values takes the reduce-scatter path. */
int tp_is_large(const tp_ctx *t, int64_t count);

/* tp_dev.c: device backends.  tp_dev_setup (every rank of the world, in
 * tp_attach) chooses the stage's transport (NCCL when each rank of the
 * stage has its own GPU and the build has CUDA, else host memory and MPI),
 * allocates the exchange buffers and joins the communicator. */
int tp_dev_setup(tp_ctx *t, kvant_err *err);
void tp_dev_free(tp_ctx *t);
int tp_dev_allreduce(tp_ctx *t, float *d_x, int64_t count, kvant_err *err);
/* Adds the NCCL traffic to out; 1 in *failed when the communicator broke. */
void tp_dev_stats(const tp_ctx *t, par_stats *out, int *failed);

#endif
