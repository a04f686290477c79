/* cuda_tp.h - tensor-parallel reductions between the GPUs of one process
 * group, over NCCL (in the CUDA toolkit), for par/tp.c.  Plain C: this
 * header includes no CUDA or NCCL headers (built only with CUDA=1,
 * KVANT_CUDA).
 *
 * One communicator per pipeline stage, one rank per GPU (NCCL refuses two
 * ranks on one device; tp.c then reduces through host memory and MPI).
 * Stage rank 0 makes the NCCL id (cuda_tp_make_id), the caller broadcasts
 * it over the stage's MPI group, every rank joins with cuda_tp_create.
 *
 * Deterministic like the CPU path (kernels/tp_sum.h): the partials are
 * gathered, never summed by NCCL, and a kernel adds them in rank order,
 * bitwise equal to tp_sum_ordered:
 *   - small messages: ncclAllGather into [n][count], then the ordered sum;
 *   - large ones: chunk i of every rank to rank i (ncclSend/ncclRecv in
 *     one group: an all-to-all), the ordered sum of the owned chunk, then
 *     ncclAllGather of the summed chunks.
 * Everything runs on the backend's stream.  The communicator is
 * non-blocking and every call is followed by a wait polled against
 * timeout_s (cudaEventQuery, ncclCommGetAsyncError): a rank that died or
 * hung becomes an error (the communicator is aborted), never a hang.
 *
 * Memory: the exchange buffers are the caller's (from the memory manager).
 * NCCL allocates its own device buffers at create; the device memory that
 * disappeared across creation is reserved in the backend's memory manager
 * (MEM_WORKSPACE, accounting only), so the budget sees it.
 *
 * Ownership: cuda_tp_create borrows the backend (it must outlive the
 * communicator); cuda_tp_destroy frees.  Threading: the engine thread.
 */
#ifndef KVANT_CUDA_TP_H
#define KVANT_CUDA_TP_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

#define CUDA_TP_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */
#define CUDA_TP_UUID_BYTES 16

typedef struct cuda_tp cuda_tp;

/* The UUID of the backend's device: ranks whose UUIDs all differ can use
 * NCCL (it also tells GPUs of different hosts apart). */
int cuda_tp_device_uuid(backend *be, uint8_t out[CUDA_TP_UUID_BYTES], kvant_err *err);
/* Stage rank 0: a fresh NCCL id, to broadcast to the stage's ranks. */
int cuda_tp_make_id(uint8_t id[CUDA_TP_ID_BYTES], kvant_err *err);
/* Every rank of the stage: joins communicator id as rank `rank` of n on
 * the backend's device; NULL + err when NCCL fails or timeout_s passes. */
cuda_tp *cuda_tp_create(backend *be, const uint8_t id[CUDA_TP_ID_BYTES], int rank, int n,
                        double timeout_s, kvant_err *err);
void cuda_tp_destroy(cuda_tp *c);
/* After the first collectives (NCCL connects lazily): reserves in the
 * backend's memory manager the device memory that disappeared since
 * cuda_tp_create began; KV_ENOMEM when it is over the budget. */
int cuda_tp_reserve(cuda_tp *c, kvant_err *err);
/* 1 once a call failed or timed out (the communicator is aborted). */
int cuda_tp_failed(const cuda_tp *c);
/* Bytes this rank sent and seconds it waited in collectives. */
void cuda_tp_stats(const cuda_tp *c, uint64_t *bytes_sent, uint64_t *calls, double *seconds);

/* d_x[0..count) = the rank-order sum of every rank's d_x.  Device
 * buffers: d_g [n * count], d_s [n * chunk] (the padded send buffer of
 * the reduce-scatter), d_y [chunk], where chunk = tp_chunk_of(count, n).
 * large: the reduce-scatter path (the same values).  Waits until done
 * (bounded by timeout_s). */
int cuda_tp_allreduce(cuda_tp *c, float *d_x, int64_t count, float *d_g, float *d_s,
                      float *d_y, int large, kvant_err *err);

/* The ordered-sum kernel alone, enqueued on be's stream (tests compare it
 * with tp_sum_ordered): d_dst[i] = sum over r < n of d_src[r stride + i]. */
int cuda_tp_sum_ordered(backend *be, float *d_dst, const float *d_src, int n, int64_t count,
                        int64_t stride);

#endif
