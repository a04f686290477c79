/* nccl.h (host shim) - NCCL for one rank: a communicator of one process,
 * whose all-gather is a device copy on the stream.  More than one rank is
 * refused (ncclInvalidUsage, printed): the tensor-parallel exchanges need
 * a device and NCCL (scripts/gpu-check). */
#ifndef KVANT_CUDA_HOST_NCCL_H
#define KVANT_CUDA_HOST_NCCL_H

#include "cuda_runtime.h"

typedef enum ncclResult_t {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
} ncclResult_t;
typedef enum ncclDataType_t { ncclFloat = 7, ncclFloat32 = 7 } ncclDataType_t;
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;
typedef struct cuhost_nccl *ncclComm_t;
typedef struct ncclConfig_t {
    int blocking;
} ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER {1}

const char *ncclGetErrorString(ncclResult_t r);
ncclResult_t ncclGetUniqueId(ncclUniqueId *u);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *c, int n, ncclUniqueId u, int rank,
                                    ncclConfig_t *cfg);
ncclResult_t ncclCommInitRank(ncclComm_t *c, int n, ncclUniqueId u, int rank);
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *r);
ncclResult_t ncclCommFinalize(ncclComm_t c);
ncclResult_t ncclCommDestroy(ncclComm_t c);
ncclResult_t ncclCommAbort(ncclComm_t c);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c,
                      cudaStream_t s);
ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c,
                      cudaStream_t s);
ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclComm_t c, cudaStream_t s);

#endif
