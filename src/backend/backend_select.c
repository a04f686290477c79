/* backend_select.c - backend selection by name (see backend_select.h).
 * The CUDA backend is compiled in only with CUDA=1 (KVANT_CUDA);
 * src/backend/cuda/cuda_backend.h is the only header it exports and it
 * includes no CUDA headers. */
#include "backend/backend_select.h"

#include <string.h>

#include "backend/cpu/cpu_backend.h"
#ifdef KVANT_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

int backend_query(const char *name, int device, backend_device_info *out, kvant_err *err)
{
    memset(out, 0, sizeof *out);
    if (!name || !strcmp(name, "cpu")) {
        if (device != 0)
            return kvant_err_set(err, KV_EINVAL, "--device %d: the cpu backend has device 0 only",
                                 device);
        strcpy(out->name, "cpu");
        out->total_memory = mem_host_available();
        out->free_memory = out->total_memory;
        out->alloc = mem_allocator_host();
        return KV_OK;
    }
    if (!strcmp(name, "cuda")) {
#ifdef KVANT_CUDA
        return cuda_backend_query(device, out, err);
#else
        return kvant_err_set(err, KV_EUNSUP, "backend 'cuda' is not built in (build with make CUDA=1)");
#endif
    }
    return kvant_err_set(err, KV_EINVAL, "unknown backend '%s' (cpu, cuda)", name);
}

int backend_rank_device(const char *name, int device, int local_rank)
{
#ifdef KVANT_CUDA
    if (name && !strcmp(name, "cuda")) {
        int n = cuda_backend_device_count();
        return n > 0 && device >= 0 && local_rank >= 0 ? (device + local_rank) % n : device;
    }
#endif
    (void)name, (void)local_rank;
    return device;
}

backend *backend_create(const char *name, int device, mem_mgr *mem, int n_threads,
                        unsigned flags, kvant_err *err)
{
    if (!name || !strcmp(name, "cpu"))
        return cpu_backend_create(mem, n_threads, flags, err);
#ifdef KVANT_CUDA
    if (!strcmp(name, "cuda"))
        return cuda_backend_create(device, mem, err);
#endif
    (void)device;
    kvant_err_set(err, KV_EUNSUP, "backend '%s' is not available in this build", name);
    return NULL;
}

/* ---- the weight stream's device hooks ---- */

static void *ws_host_alloc(void *ctx, size_t bytes, kvant_err *err)
{
    backend *be = ctx;
    return be->ops->host_alloc(be, bytes, err);
}

static void ws_host_free(void *ctx, void *p)
{
    backend *be = ctx;
    be->ops->host_free(be, p);
}

static void *ws_upload(void *ctx, int slot, const void *h_src, size_t bytes, size_t max_bytes,
                       kvant_err *err)
{
    backend *be = ctx;
    return be->ops->stream_layer(be, slot, h_src, bytes, max_bytes, err);
}

int backend_wstream_dev(backend *be, wstream_dev *out)
{
    memset(out, 0, sizeof *out);
    if (!be || !be->ops->stream_layer || !be->ops->host_alloc || !be->ops->host_free)
        return 0;
    out->ctx = be;
    out->host_alloc = ws_host_alloc;
    out->host_free = ws_host_free;
    out->upload = ws_upload;
    return 1;
}
