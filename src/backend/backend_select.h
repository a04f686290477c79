/* backend_select.h - choosing a compute backend by name ("cpu", "cuda"),
 * querying its device, and creating it.
 *
 * Above backend/cpu/ and backend/cuda/ (it calls their constructors);
 * they include only the interface, backend/backend.h.  The CUDA backend
 * exists only in builds with CUDA=1; elsewhere "cuda" is refused with a
 * message.
 * Ownership: backend_create returns a backend the caller destroys with
 * be->ops->destroy; the mem_mgr is borrowed and must outlive it.
 * Threading: any thread; the backend created is then used by one.
 */
#ifndef KVANT_BACKEND_SELECT_H
#define KVANT_BACKEND_SELECT_H

#include "backend/backend.h"
#include "model/wstream.h"

/* name: "cpu" or "cuda" (only in builds with CUDA=1).  KV_EUNSUP with a
 * message when the backend is not built in or no device is present. */
int backend_query(const char *name, int device, backend_device_info *out, kvant_err *err);
/* flags: BACKEND_EXACT, BACKEND_NO_PACK (backend.h) or 0.  NULL with a
 * message in err when the backend is not available. */
backend *backend_create(const char *name, int device, mem_mgr *mem, int n_threads,
                        unsigned flags, kvant_err *err);
/* The device of a process that is the local_rank-th of its group on its
 * host (--tp/--pp): device + local_rank, modulo the devices present (ranks
 * share a device when there are fewer); the cpu backend: device. */
int backend_rank_device(const char *name, int device, int local_rank);

/* The weight stream's device hooks (model/wstream.h) for be: 1 with *out
 * filled when be uploads streamed layers itself (backend_ops.stream_layer:
 * pass out to wstream_create_dev), 0 when its ops read host memory (the
 * CPU backend: wstream_create).  be must outlive the stream. */
int backend_wstream_dev(backend *be, wstream_dev *out);

#endif
