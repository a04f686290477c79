/* shim_test.cc - the host shim's own checks (`make cuda-host` runs it before
 * test_cuda): warp operations give CUDA's values, a missing __syncthreads
 * and a missing stream dependency show, launch limits are refused, and
 * the faults a device would hang or crash on stop the process (run in a
 * child, which must die of the expected signal). */
#include "cuda_runtime.h"

#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static int fails, checks;
#define EXPECT(c, ...) do { checks++; if (!(c)) { fails++; fprintf(stderr, "FAIL %s:%d: ", \
    __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

__global__ void k_warp(float *y, unsigned *b)
{
    const int t = (int)threadIdx.x;
    float v = (float)t;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    const float dn = __shfl_down_sync(0xffffffffu, (float)t, 1);
    const float up = __shfl_up_sync(0xffffffffu, (float)t, 2, 8);
    const float bc = __shfl_sync(0xffffffffu, (float)t, 3);
    const unsigned bal = __ballot_sync(0xffffffffu, t % 3 == 0);
    y[4 * t] = v, y[4 * t + 1] = dn, y[4 * t + 2] = up, y[4 * t + 3] = bc;
    b[t] = bal;
}

/* with_sync 0: the race a missing barrier leaves */
__global__ void k_neigh(float *y, int with_sync)
{
    KV_DYN_SHARED(float, s);
    const unsigned t = threadIdx.x;
    s[t] = (float)t;
    if (with_sync)
        __syncthreads();
    y[blockIdx.x * blockDim.x + t] = s[(t + 1) % blockDim.x];
}

__global__ void k_copy(float *dst, const float *src, int n)
{
    for (int i = (int)threadIdx.x; i < n; i += (int)blockDim.x)
        dst[i] = src[i];
}

__global__ void k_exited(float *y)
{
    if (threadIdx.x == 5)
        return;
    y[threadIdx.x] = __shfl_sync(0xffffffffu, 1.0f, 0);
}

/* thread 32 waits at a warp barrier for lanes that wait at the block's */
__global__ void k_half_bar(float *y)
{
    if (threadIdx.x == 32)
        __syncwarp();
    else
        __syncthreads();
}

/* Runs f in a child; true when it died of sig (or, under ASan, which
 * reports a SEGV and exits, with a failure status). */
template <class F> static bool dies_of(int sig, F f)
{
    fflush(stdout), fflush(stderr);
    pid_t p = fork();
    if (p == 0) {
        f();
        _exit(0);
    }
    int st = 0;
    waitpid(p, &st, 0);
    return (WIFSIGNALED(st) && WTERMSIG(st) == sig) || (WIFEXITED(st) && WEXITSTATUS(st) != 0);
}

int main()
{
    float *d, *d2, h[256];
    unsigned *db, hb[64];
    cudaMalloc((void **)&d, 4096 * 4);
    cudaMalloc((void **)&d2, 4096 * 4);
    cudaMalloc((void **)&db, 64 * 4);

    KV_LAUNCH(1, 64, 0, nullptr, k_warp)(d, db);
    cudaMemcpy(h, d, 256 * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(hb, db, 64 * 4, cudaMemcpyDeviceToHost);
    for (int t = 0; t < 64; t++) {
        const int lane = t % 32, seg = lane & ~7;
        EXPECT(h[4 * t] == (t < 32 ? 496.0f : 1520.0f), "xor sum lane %d: %g", t, h[4 * t]);
        EXPECT(h[4 * t + 1] == (float)(lane == 31 ? t : t + 1), "shfl_down lane %d", t);
        EXPECT(h[4 * t + 2] == (float)(lane - 2 < seg ? t : t - 2), "shfl_up width 8 lane %d", t);
        EXPECT(h[4 * t + 3] == (float)(t - lane + 3), "shfl lane %d: %g", t, h[4 * t + 3]);
        unsigned want = 0;
        for (int l = 0; l < 32; l++)
            want |= (unsigned)((t - lane + l) % 3 == 0) << l;
        EXPECT(hb[t] == want, "ballot lane %d: %#x want %#x", t, hb[t], want);
    }

    for (int with_sync = 1; with_sync >= 0; with_sync--) {
        KV_LAUNCH(2, 128, 128 * 4, nullptr, k_neigh)(d, with_sync);
        cudaMemcpy(h, d, 256 * 4, cudaMemcpyDeviceToHost);
        int bad = 0;
        for (int i = 0; i < 256; i++)
            bad += h[i] != (float)((i % 128 + 1) % 128);
        EXPECT(with_sync ? bad == 0 : bad > 0, "__syncthreads %s: %d wrong",
               with_sync ? "present" : "missing", bad);
    }

    /* a pageable upload on the legacy stream, a kernel on a non-blocking
     * stream: without a dependency the kernel reads what was there before */
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    for (int i = 0; i < 256; i++)
        h[i] = (float)i;
    for (int dep = 0; dep < 2; dep++) {
        cudaMemset(d2, 0, 256 * 4);
        cudaDeviceSynchronize();
        cudaMemcpy(d2, h, 256 * 4, cudaMemcpyHostToDevice);
        if (dep)
            cudaStreamSynchronize(nullptr);
        KV_LAUNCH(1, 128, 0, s, k_copy)(d, d2, 256);
        float got[256];
        cudaMemcpyAsync(got, d, 256 * 4, cudaMemcpyDeviceToHost, s);
        EXPECT(dep ? got[255] == 255.0f : got[255] == 0.0f, "legacy upload %s a dependency: %g",
               dep ? "with" : "without", got[255]);
    }
    cudaStreamDestroy(s);

    KV_LAUNCH(1, 2048, 0, nullptr, k_copy)(d, d2, 1);
    EXPECT(cudaGetLastError() == cudaErrorInvalidConfiguration, "2048 threads accepted");
    KV_LAUNCH(70000, 1, 0, nullptr, k_copy)(d, d2, 1);
    EXPECT(cudaGetLastError() == cudaSuccess, "a grid of 70000 refused");
    KV_LAUNCH(dim3(1, 70000), 1, 0, nullptr, k_copy)(d, d2, 1);
    EXPECT(cudaGetLastError() == cudaErrorInvalidConfiguration, "grid.y 70000 accepted");
    KV_LAUNCH(1, 128, 64 << 10, nullptr, k_neigh)(d, 1);
    EXPECT(cudaGetLastError() == cudaErrorInvalidConfiguration, "64 KiB without opt-in accepted");
    cudaFuncSetAttribute(k_neigh, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10);
    KV_LAUNCH(1, 128, 64 << 10, nullptr, k_neigh)(d, 1);
    EXPECT(cudaGetLastError() == cudaSuccess, "64 KiB after opt-in refused");
    EXPECT(cudaFuncSetAttribute(k_neigh, cudaFuncAttributeMaxDynamicSharedMemorySize, 256 << 10) ==
           cudaErrorInvalidValue, "256 KiB opt-in accepted");
    KV_LAUNCH_BOUNDED(128, 1, 256, 0, nullptr, k_copy)(d, d2, 1);
    EXPECT(cudaGetLastError() == cudaErrorLaunchOutOfResources, "launch bound ignored");
    EXPECT(cudaMemcpy(h, h + 1, 4, cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
           "a host pointer taken as device memory");
    cudaDeviceSynchronize();

    EXPECT(dies_of(SIGSEGV, [&] { *(volatile float *)d = 1.0f; }),
           "the host wrote device memory");
    EXPECT(dies_of(SIGABRT, [&] {
               KV_LAUNCH(1, 32, 0, nullptr, k_exited)(d);
               cudaDeviceSynchronize();
           }), "a shuffle waited on an exited lane");
    EXPECT(dies_of(SIGABRT, [&] {
               KV_LAUNCH(1, 48, 0, nullptr, k_warp)(d, db);
               cudaDeviceSynchronize();
           }), "a full-mask shuffle in a 48-thread block");
    EXPECT(dies_of(SIGABRT, [&] {
               KV_LAUNCH(1, 64, 0, nullptr, k_half_bar)(d);
               cudaDeviceSynchronize();
           }), "a deadlock between a warp barrier and the block's");

    cudaFree(d), cudaFree(d2), cudaFree(db);
    printf("cuda-host shim: %s (%d checks, %d failed)\n", fails ? "FAIL" : "ok", checks, fails);
    return fails ? 1 : 0;
}
