/* cuda_runtime.h (host shim) - the CUDA runtime as far as src/backend/cuda
 * uses it, for compiling the unmodified .cu files with the host C++
 * compiler (`make cuda-host`, docs/CUDA.md).  Found before the toolkit's
 * header because the host build puts -Itests/cuda_host first and never
 * adds the toolkit's include directory.
 *
 * Model (tests/cuda_host/cuda_host.cc, cuda_host_fiber.cc and
 * cuda_host_libs.cc implement it):
 *   - device memory is host memory the host code may not touch: it is
 *     PROT_NONE except while a stream's work runs, filled with 0xFF (NaN)
 *     when allocated, the bytes past its end poisoned for ASan;
 *   - streams run lazily: work waits in its stream until something forces
 *     it (a synchronize, an event, a copy to pageable memory), so a missing
 *     dependency between streams reads stale or poisoned data; the legacy
 *     stream 0 is ordered with the blocking streams, never with
 *     cudaStreamNonBlocking ones; pageable sources are copied when the call
 *     is made, pinned (cudaHostAlloc) ones when the copy runs;
 *   - a kernel runs block after block; each CUDA thread of a block is a
 *     fiber (its own stack, a hand-rolled context switch), __syncthreads
 *     switches through every live thread of the block, warp shuffles,
 *     __syncwarp and ballots wait for exactly the lanes of their mask and
 *     fail loudly when a lane is missing, has exited, or disagrees;
 *   - a launch is checked like the device checks it (block <= 1024
 *     threads and per-dimension limits, grid limits, dynamic shared memory
 *     <= 48 KiB or the opt-in limit set by cudaFuncSetAttribute, and the
 *     kernel's launch bound where the launch names it, KV_LAUNCH_BOUNDED),
 *     and a violation is printed and returned as the launch error.
 */
#ifndef KVANT_CUDA_HOST_RUNTIME_H
#define KVANT_CUDA_HOST_RUNTIME_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __constant__ static
#define __launch_bounds__(...)

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct __attribute__((aligned(16))) float4 {
    float x, y, z, w;
};

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorLaunchFailure = 719,
    cudaErrorUnknown = 999,
} cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};

typedef struct cuhost_stream *cudaStream_t;
typedef struct cuhost_event *cudaEvent_t;

#define cudaStreamDefault 0u
#define cudaStreamNonBlocking 1u
#define cudaEventDefault 0u
#define cudaEventBlockingSync 1u
#define cudaEventDisableTiming 2u
#define cudaHostAllocDefault 0u

typedef struct cudaUUID_st {
    char bytes[16];
} cudaUUID_t;

typedef struct cudaDeviceProp {
    char name[256];
    cudaUUID_t uuid;
    size_t totalGlobalMem, sharedMemPerBlock, sharedMemPerBlockOptin;
    int maxThreadsPerBlock, maxThreadsDim[3], maxGridSize[3], warpSize;
    int multiProcessorCount, major, minor;
} cudaDeviceProp;

/* Limits the shim enforces (an H100's). */
#define CUHOST_MAX_THREADS 1024
#define CUHOST_SMEM_DEFAULT (48u << 10)
#define CUHOST_SMEM_OPTIN (227u << 10)

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d);
cudaError_t cudaDeviceGetPCIBusId(char *bus, int len, int d);
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t e);

cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s);
cudaError_t cudaMemset(void *p, int v, size_t bytes);
cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s);

cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);

cudaError_t cuhost_func_set_smem(const void *fn, int bytes);
template <class F> cudaError_t cudaFuncSetAttribute(F *fn, cudaFuncAttribute a, int v)
{
    if (a != cudaFuncAttributeMaxDynamicSharedMemorySize)
        return cudaErrorInvalidValue;
    return cuhost_func_set_smem((const void *)fn, v);
}

/* ---- the shim's own interface (tests/cuda_host/cuda_host.cc) ---- */

/* The work a stream runs: fn(ctx), then ctx released with drop(ctx). */
typedef void (*cuhost_fn)(void *ctx);
cudaError_t cuhost_enqueue(cudaStream_t s, cuhost_fn fn, cuhost_fn drop, void *ctx);
/* True when p .. p+bytes lies in one device allocation. */
int cuhost_is_device(const void *p, size_t bytes);

struct cuhost_block;
struct cuhost_thread {
    uint3 tid;
    int lane, warp;
    struct cuhost_block *blk;
};
struct cuhost_block {
    uint3 bid;
    uint3 bdim, gdim;
    void *dyn_smem;
};
extern thread_local cuhost_thread *cuhost_cur;
/* Prints "cuda-host: FATAL: ..." and aborts (cuda_host_fiber.cc). */
[[noreturn]] void cuhost_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define threadIdx (cuhost_cur->tid)
#define blockIdx (cuhost_cur->blk->bid)
#define blockDim (cuhost_cur->blk->bdim)
#define gridDim (cuhost_cur->blk->gdim)
static const int warpSize = 32;

void __syncthreads(void);
/* One warp-wide operation: kind (CUHOST_W_*), this lane's value and the
 * lane it reads; returns that lane's value (the ballot for BALLOT). */
enum { CUHOST_W_SYNC = 1, CUHOST_W_SHFL = 2, CUHOST_W_BALLOT = 3 };
uint64_t cuhost_warp_op(int kind, unsigned mask, uint64_t val, int src_lane);

static inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    cuhost_warp_op(CUHOST_W_SYNC, mask, 0, 0);
}

template <class T> static inline T cuhost_shfl(unsigned mask, T v, int src)
{
    static_assert(sizeof(T) <= 8, "shuffle of a type over 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    u = cuhost_warp_op(CUHOST_W_SHFL, mask, u, src);
    T r;
    memcpy(&r, &u, sizeof r);
    return r;
}

/* width: a power of two <= 32; lanes read within their segment of width */
template <class T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
    const int lane = cuhost_cur->lane, base = lane & ~(width - 1);
    return cuhost_shfl(mask, v, base + (src & (width - 1)));
}
template <class T> static inline T __shfl_xor_sync(unsigned mask, T v, int x, int width = 32)
{
    const int lane = cuhost_cur->lane, base = lane & ~(width - 1);
    const int s = lane ^ x;
    return cuhost_shfl(mask, v, s >= base + width ? lane : s);
}
template <class T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32)
{
    const int lane = cuhost_cur->lane, base = lane & ~(width - 1);
    const int s = lane + (int)d;
    return cuhost_shfl(mask, v, s >= base + width ? lane : s);
}
template <class T> static inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32)
{
    const int lane = cuhost_cur->lane, base = lane & ~(width - 1);
    const int s = lane - (int)d;
    return cuhost_shfl(mask, v, s < base ? lane : s);
}
static inline unsigned __ballot_sync(unsigned mask, int pred)
{
    return (unsigned)cuhost_warp_op(CUHOST_W_BALLOT, mask, pred != 0, 0);
}
static inline int __any_sync(unsigned mask, int pred)
{
    return __ballot_sync(mask, pred) != 0;
}
static inline int __all_sync(unsigned mask, int pred)
{
    return __ballot_sync(mask, pred) == mask;
}

/* ---- atomics (one block runs at a time, its threads one after another:
 * a plain read-modify-write is atomic) ---- */
template <class T> static inline T atomicAdd(T *p, T v)
{
    T o = *p;
    *p = o + v;
    return o;
}
template <class T> static inline T atomicMax(T *p, T v)
{
    T o = *p;
    *p = o > v ? o : v;
    return o;
}
template <class T> static inline T atomicMin(T *p, T v)
{
    T o = *p;
    *p = o < v ? o : v;
    return o;
}
template <class T> static inline T atomicExch(T *p, T v)
{
    T o = *p;
    *p = v;
    return o;
}
template <class T> static inline T atomicCAS(T *p, T cmp, T v)
{
    T o = *p;
    if (o == cmp)
        *p = v;
    return o;
}

/* ---- arithmetic intrinsics: IEEE single, round to nearest (the host
 * build uses -ffp-contract=off, so nothing is fused unless asked) ---- */
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline unsigned __float_as_uint(float f)
{
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float __uint_as_float(unsigned u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline int __float_as_int(float f)
{
    int u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float __int_as_float(int u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* sin(pi x), cos(pi x) with the argument reduced exactly first */
static inline void sincospi(double x, double *s, double *c)
{
    const double r = remainder(x, 2.0); /* exact, in [-1, 1] */
    *s = sin(r * M_PI);
    *c = cos(r * M_PI);
}

/* ---- the launch: KV_LAUNCH(grid, block, smem, stream, kernel)(args) ---- */

typedef struct cuhost_cfg {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    unsigned bound; /* __launch_bounds__ named at the launch, or 0 */
    const char *name;
    const void *fn;
} cuhost_cfg;

/* Checks cfg; prints and returns the launch error when it fails. */
cudaError_t cuhost_check_launch(const cuhost_cfg *c);
/* Runs every block of the launch: body(ctx) in each thread's fiber. */
void cuhost_run_grid(const cuhost_cfg *c, void (*body)(void *), void *ctx);
void cuhost_set_launch_error(cudaError_t e);

template <class... P> struct cuhost_launch_of {
    cuhost_cfg cfg;
    void (*fn)(P...);
    struct job {
        cuhost_cfg cfg;
        void (*fn)(P...);
        std::tuple<P...> args;
    };
    template <class... A> void operator()(A &&...a) const
    {
        if (cudaError_t e = cuhost_check_launch(&cfg)) {
            cuhost_set_launch_error(e);
            return;
        }
        job *j = new job{cfg, fn, std::tuple<P...>(std::forward<A>(a)...)};
        cuhost_enqueue(
            cfg.stream,
            [](void *ctx) {
                job *jb = (job *)ctx;
                cuhost_run_grid(&jb->cfg, [](void *c2) {
                    job *jj = (job *)c2;
                    std::tuple<P...> copy = jj->args; /* parameters are per thread */
                    std::apply(jj->fn, copy);
                }, jb);
            },
            [](void *ctx) { delete (job *)ctx; }, j);
    }
};

template <class... P>
static inline cuhost_launch_of<P...> cuhost_launch(void (*fn)(P...), const char *name, dim3 g,
                                                   dim3 b, size_t smem, cudaStream_t s,
                                                   unsigned bound)
{
    return cuhost_launch_of<P...>{{g, b, smem, s, bound, name, (const void *)fn}, fn};
}

#define KV_LAUNCH(grid, block, smem, stream, ...) \
    cuhost_launch(__VA_ARGS__, #__VA_ARGS__, grid, block, smem, stream, 0)
#define KV_LAUNCH_BOUNDED(bound, grid, block, smem, stream, ...) \
    cuhost_launch(__VA_ARGS__, #__VA_ARGS__, grid, block, smem, stream, bound)
#define KV_DYN_SHARED(type, name) type *name = (type *)cuhost_cur->blk->dyn_smem

#include "cuda_fp16.h"

#endif
