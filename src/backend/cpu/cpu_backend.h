/* cpu_backend.h - the CPU implementation of the backend interface.
 *
 * "Device" memory is host RAM under the memory manager's budget; weights
 * stay in the GGUF mapping (zero-copy) and are accounted as MEM_WEIGHTS at
 * their mapped size.  Ops run synchronously on a thread pool of n_threads
 * (the calling thread is worker 0).
 * Ownership: cpu_backend_create returns a backend the caller destroys with
 * be->ops->destroy; the mem_mgr is borrowed and must outlive it.
 */
#ifndef KVANT_CPU_BACKEND_H
#define KVANT_CPU_BACKEND_H

#include "backend/backend.h"

/* flags: BACKEND_EXACT (backend.h) or 0. */
backend *cpu_backend_create(mem_mgr *mem, int n_threads, unsigned flags, kvant_err *err);

#endif
