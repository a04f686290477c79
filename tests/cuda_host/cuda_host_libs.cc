/* cuda_host_libs.cc - the libraries of the host shim: cuBLAS's GemmEx as a
 * reference GEMM and NCCL for one rank (cublas_v2.h, nccl.h), written on
 * the shim's runtime (cuhost_enqueue, cuhost_is_device). */
#include "cublas_v2.h"
#include "nccl.h"

#include <stdio.h>
#include <stdlib.h>

/* ---- cuBLAS: a reference GEMM (f32 operands, double accumulation) ---- */

struct cuhost_blas {
    cudaStream_t s;
};

namespace {
struct gemm_job {
    cublasOperation_t ta, tb;
    int m, n, k, lda, ldb, ldc;
    float alpha, beta;
    const float *A, *B;
    float *C;
};
void gemm_run(void *ctx)
{
    const gemm_job *g = (const gemm_job *)ctx;
    for (int j = 0; j < g->n; j++)
        for (int i = 0; i < g->m; i++) {
            double acc = 0.0;
            for (int l = 0; l < g->k; l++) {
                const float a = g->ta == CUBLAS_OP_N ? g->A[i + (int64_t)l * g->lda]
                                                     : g->A[l + (int64_t)i * g->lda];
                const float b = g->tb == CUBLAS_OP_N ? g->B[l + (int64_t)j * g->ldb]
                                                     : g->B[j + (int64_t)l * g->ldb];
                acc += (double)a * b;
            }
            float *c = &g->C[i + (int64_t)j * g->ldc];
            const double prev = g->beta != 0.0f ? (double)g->beta * *c : 0.0; /* beta 0: C unread */
            *c = (float)(g->alpha * acc + prev);
        }
}
void gemm_drop(void *ctx)
{
    delete (gemm_job *)ctx;
}
} // namespace

cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    *h = new cuhost_blas{nullptr};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h)
{
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    h->s = s;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType_t at,
                            int lda, const void *B, cudaDataType_t bt, int ldb, const void *beta,
                            void *C, cudaDataType_t ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (at != CUDA_R_32F || bt != CUDA_R_32F || ct != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F ||
        ta == CUBLAS_OP_C || tb == CUBLAS_OP_C) {
        fprintf(stderr, "cuda-host: cublasGemmEx: only f32 operands, CUBLAS_COMPUTE_32F, "
                "N or T are shimmed\n");
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    const int64_t ra = ta == CUBLAS_OP_N ? m : k, rb = tb == CUBLAS_OP_N ? k : n;
    const int64_t ca = ta == CUBLAS_OP_N ? k : m, cb = tb == CUBLAS_OP_N ? n : k;
    if (m < 0 || n < 0 || k < 0 || lda < (ra > 1 ? ra : 1) || ldb < (rb > 1 ? rb : 1) ||
        ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0)
        return CUBLAS_STATUS_SUCCESS;
    const size_t fa = (size_t)((ca - 1) * lda + ra) * 4, fb = (size_t)((cb - 1) * ldb + rb) * 4;
    const size_t fc = (size_t)(((int64_t)n - 1) * ldc + m) * 4;
    const bool ab = k == 0 || (cuhost_is_device(A, fa) && cuhost_is_device(B, fb));
    if (!ab || !cuhost_is_device(C, fc)) {
        fprintf(stderr, "cuda-host: cublasGemmEx: an operand is not inside one device "
                "allocation\n");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    gemm_job *g = new gemm_job{ta, tb, m, n, k, lda, ldb, ldc, *(const float *)alpha,
                               *(const float *)beta, (const float *)A, (const float *)B,
                               (float *)C};
    if (cuhost_enqueue(h->s, gemm_run, gemm_drop, g) != cudaSuccess)
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- NCCL, one rank ---- */

struct cuhost_nccl {
    int n;
};

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidUsage: return "invalid usage (the host shim has one rank only)";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInProgress: return "operation in progress";
    default: return "NCCL error";
    }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *u)
{
    memset(u, 0, sizeof *u);
    memcpy(u->internal, "cuda-host", 9);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *c, int n, ncclUniqueId u, int rank,
                                    ncclConfig_t *cfg)
{
    *c = nullptr;
    if (n != 1 || rank != 0) {
        fprintf(stderr, "cuda-host: NCCL: a communicator of %d ranks: the shim runs one rank "
                "only\n", n);
        return ncclInvalidUsage;
    }
    *c = new cuhost_nccl{n};
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *c, int n, ncclUniqueId u, int rank)
{
    return ncclCommInitRankConfig(c, n, u, rank, nullptr);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *r)
{
    *r = ncclSuccess;
    return c ? ncclSuccess : ncclInvalidArgument;
}

ncclResult_t ncclCommFinalize(ncclComm_t c)
{
    return c ? ncclSuccess : ncclInvalidArgument;
}

ncclResult_t ncclCommDestroy(ncclComm_t c)
{
    delete c;
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c)
{
    delete c;
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void)
{
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    return ncclSuccess;
}

ncclResult_t ncclSend(const void *, size_t, ncclDataType_t, int peer, ncclComm_t, cudaStream_t)
{
    fprintf(stderr, "cuda-host: ncclSend to rank %d: the shim has one rank\n", peer);
    return ncclInvalidUsage;
}

ncclResult_t ncclRecv(void *, size_t, ncclDataType_t, int peer, ncclComm_t, cudaStream_t)
{
    fprintf(stderr, "cuda-host: ncclRecv from rank %d: the shim has one rank\n", peer);
    return ncclInvalidUsage;
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclComm_t c, cudaStream_t s)
{
    if (!c || t != ncclFloat)
        return ncclInvalidArgument;
    return cudaMemcpyAsync(recv, send, count * 4, cudaMemcpyDeviceToDevice, s) == cudaSuccess
               ? ncclSuccess
               : ncclUnhandledCudaError;
}
