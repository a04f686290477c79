/* cuda_backend.h - the CUDA implementation of the backend interface.
 *
 * Plain C declarations: this header includes no CUDA headers, so
 * backend_select.c, the tests and the CLI can include it in builds with
 * CUDA=1 (KVANT_CUDA).
 * Design, kernels and what is verified: docs/CUDA.md.
 *
 * One backend instance owns one compute cudaStream_t, one copy stream (KV
 * tier exports and weight-stream uploads through pinned host memory,
 * host_alloc / kv_export_async / copy_done / stream_layer in backend.h) and
 * one cuBLAS handle on one device; every op is enqueued and returns at
 * once.
 * download() and sync() are the only points where the host waits; a kernel
 * or copy failure is remembered and reported by the next begin_batch,
 * download or sync (KV_EIO naming the CUDA error).  All device memory comes
 * from the borrowed mem_mgr (whose allocator is cuda_backend_query's
 * cudaMalloc hook), allocated at load_weights / kv_init / fwd_init time,
 * never per step.
 *
 * Ownership: cuda_backend_create returns a backend destroyed with
 * be->ops->destroy; the mem_mgr must outlive it.
 * Threading: one thread at a time per instance (the engine thread); the
 * instance makes its device current on that thread at begin_batch and on
 * every allocation, so create and use may happen on different threads.
 */
#ifndef KVANT_CUDA_BACKEND_H
#define KVANT_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

/* Name, total and free memory (cudaMemGetInfo) of CUDA device `device`, and
 * an allocator whose alloc/free are cudaMalloc/cudaFree on that device.
 * KV_EUNSUP "no CUDA device" when the driver reports none (or no driver);
 * KV_EINVAL when device is out of range. */
int cuda_backend_query(int device, backend_device_info *out, kvant_err *err);

/* CUDA devices present (0 when there is no driver or device). */
int cuda_backend_device_count(void);

/* NULL + err on failure (bad device, stream/cuBLAS creation failed). */
backend *cuda_backend_create(int device, mem_mgr *mem, kvant_err *err);

/* Device bytes kv_init allocates beyond the KV pool itself (the batch
 * staging buffer, MEM_WORKSPACE).  The engine's plan must leave this much
 * of the budget free, or kv_init fails with KV_ENOMEM. */
uint64_t cuda_backend_kv_extra_bytes(void);

/* Large-batch matmul through cuBLAS (weights dequantized to f32 in row
 * chunks into a fixed workspace, then GemmEx with f32 compute) for calls
 * with n_tokens >= min_tokens; 0 disables it (the default).
 * The default path (a tiled dequantizing kernel) gives every output a
 * reduction order that does not depend on the batch, as backend.h
 * promises; cuBLAS picks kernels by shape, so enabling it trades that
 * bitwise batch invariance for prefill speed.  Allocates the workspace
 * (MEM_WORKSPACE, CUDA_GEMM_WS_BYTES) on first enable: call at set-up,
 * not in the serving loop.  KV_ENOMEM when the workspace does not fit. */
int cuda_backend_set_gemm_min_tokens(backend *be, int32_t min_tokens, kvant_err *err);

/* Device memory this process uses on `device` according to NVML
 * (libnvidia-ml.so.1 is dlopen'ed on first use; nothing links it).
 * Returns 0 with the per-process figure; 1 when NVML does not list this
 * process (e.g. a container whose pids NVML cannot see): *bytes is then
 * the device-wide used memory; a negative status when NVML is absent or
 * fails (KV_EUNSUP) or device is out of range (KV_EINVAL). */
int cuda_backend_nvml_used(int device, uint64_t *bytes);

/* Device-to-device cudaMemcpy bandwidth on `device`: copies `bytes` bytes
 * reps times between two buffers (cudaMalloc'ed here and freed before
 * returning: a measurement, not for the serving loop).  *gbps counts read
 * plus write traffic (2 * bytes * reps / seconds / 1e9), the figure a
 * bandwidth-bound kernel is compared against. */
int cuda_backend_d2d_bandwidth(int device, size_t bytes, int reps, double *gbps, kvant_err *err);

/* Device time of `reps` launches of be's matmul d_y = W d_x (n tokens, no
 * bias) after one warm-up launch, measured by two events recorded on be's
 * stream around them: *ms is the total.  KV_EIO names the CUDA error (the
 * instance's sticky fault included); KV_EINVAL for reps < 1. */
int cuda_backend_time_matmul(backend *be, const model_tensor *W, const float *d_x, float *d_y,
                             int32_t n, int reps, double *ms, kvant_err *err);

#endif
