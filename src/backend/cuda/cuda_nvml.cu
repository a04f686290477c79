/* cuda_nvml.cu - cuda_backend_nvml_used: this process's device memory as
 * NVML sees it, for cross-checking the memory manager's accounting.
 *
 * libnvidia-ml.so.1 is dlopen'ed on each call (and closed again), so the
 * binary neither links NVML nor needs it installed.  The few NVML types
 * used are declared here with NVML's stable C ABI (nvml.h is not part of
 * the toolkit install).  The device is matched by PCI bus id, because
 * CUDA and NVML may number devices differently (CUDA_VISIBLE_DEVICES).
 */
extern "C" {
#include "backend/cuda/cuda_backend.h"
}

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

typedef int nvml_ret; /* nvmlReturn_t: 0 = success, 7 = insufficient size */
typedef struct nvml_dev_st *nvml_dev;
typedef struct nvml_proc_info { /* nvmlProcessInfo_t (v2 layout, _v3 calls) */
    unsigned int pid;
    unsigned long long used;
    unsigned int gpu_instance_id, compute_instance_id;
} nvml_proc_info;
typedef struct nvml_memory { /* nvmlMemory_t */
    unsigned long long total, free, used;
} nvml_memory;

#define NVML_MAX_PROCS 256

typedef struct nvml_api {
    void *lib;
    nvml_ret (*init)(void);
    nvml_ret (*shutdown)(void);
    nvml_ret (*by_pci)(const char *, nvml_dev *);
    nvml_ret (*procs)(nvml_dev, unsigned int *, nvml_proc_info *);
    nvml_ret (*mem)(nvml_dev, nvml_memory *);
} nvml_api;

static int nvml_open(nvml_api *a)
{
    a->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!a->lib)
        return KV_EUNSUP;
    a->init = (nvml_ret(*)(void))dlsym(a->lib, "nvmlInit_v2");
    a->shutdown = (nvml_ret(*)(void))dlsym(a->lib, "nvmlShutdown");
    a->by_pci = (nvml_ret(*)(const char *, nvml_dev *))dlsym(a->lib,
                                                             "nvmlDeviceGetHandleByPciBusId_v2");
    a->procs = (nvml_ret(*)(nvml_dev, unsigned int *, nvml_proc_info *))dlsym(
        a->lib, "nvmlDeviceGetComputeRunningProcesses_v3");
    a->mem = (nvml_ret(*)(nvml_dev, nvml_memory *))dlsym(a->lib, "nvmlDeviceGetMemoryInfo");
    if (!a->init || !a->shutdown || !a->by_pci || !a->procs || !a->mem || a->init() != 0) {
        dlclose(a->lib);
        return KV_EUNSUP;
    }
    return KV_OK;
}

int cuda_backend_nvml_used(int device, uint64_t *bytes)
{
    char bus[32];
    int n = 0;
    *bytes = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || device < 0 || device >= n) {
        cudaGetLastError();
        return KV_EINVAL;
    }
    if (cudaDeviceGetPCIBusId(bus, (int)sizeof bus, device) != cudaSuccess)
        return KV_EINVAL;
    nvml_api a;
    if (nvml_open(&a))
        return KV_EUNSUP;
    int rc = KV_EUNSUP;
    nvml_dev dev;
    nvml_proc_info *p = (nvml_proc_info *)calloc(NVML_MAX_PROCS, sizeof *p);
    unsigned int cnt = NVML_MAX_PROCS;
    if (p && a.by_pci(bus, &dev) == 0 && a.procs(dev, &cnt, p) == 0) {
        unsigned int me = (unsigned int)getpid();
        for (unsigned int i = 0; i < cnt && rc != KV_OK; i++)
            if (p[i].pid == me) {
                *bytes = p[i].used;
                rc = KV_OK;
            }
        nvml_memory m;
        if (rc != KV_OK && a.mem(dev, &m) == 0) {
            *bytes = m.used;
            rc = 1; /* this pid is not visible to NVML: device-wide figure */
        }
    }
    free(p);
    a.shutdown();
    dlclose(a.lib);
    return rc;
}
