/* cpu_pack.h - the CPU backend's weights repacked at load into the int8
 * kernels' layout (kernels/qpack.h).
 *
 * cpu_pack_weights packs every matmul weight the selected ISA has a packed
 * kernel for (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4: qpack_supported
 * and dtype_matmul_packs; an untied output head too (it takes the split
 * int8 path); an embedding table the head is tied to (rows of at most
 * CPU_PACK_ROW_MAX bytes): the lookup unpacks the rows it reads, so the
 * table is held once; not an untied embedding table):
 *   mapped tensors (dev == data): into a new MEM_WEIGHTS buffer from the
 *     memory manager; the mapped pages are released to the page cache
 *     (madvise), so the bytes are counted once; a buffer the budget cannot
 *     give leaves that tensor mapped and unpacked (same results, slower);
 *   tensors already converted into manager memory at load (dev != data):
 *     in place.
 * Each packed tensor gets packed = 1 (matmuls pass type | DT_PACKED).
 * Ownership: the returned list is the caller's; cpu_pack_release restores
 * every tensor (buffers freed, in-place ones unpacked) and frees it.
 * Threading: the engine thread, at load/unload; rows are split over pool.
 */
#ifndef KVANT_CPU_PACK_H
#define KVANT_CPU_PACK_H

#include "backend/cpu/tpool.h"
#include "mem/mem.h"
#include "model/model.h"
#include "util/err.h"

typedef struct cpu_packed cpu_packed;

/* The largest row of a packed embedding table (cpu_pack_row's buffer). */
#define CPU_PACK_ROW_MAX (64 * 1024)

/* y[ne[0]] = row r of t as floats, through buf (CPU_PACK_ROW_MAX bytes)
 * when t is packed. */
void cpu_pack_row(const model_tensor *t, int64_t r, void *buf, float *y);

/* NULL with err set only when out of host memory for the list itself. */
cpu_packed *cpu_pack_weights(model *m, mem_mgr *mem, tpool *pool, kvant_err *err);
/* Number of tensors packed, and their bytes. */
int cpu_pack_count(const cpu_packed *p, uint64_t *bytes);
void cpu_pack_release(cpu_packed *p, mem_mgr *mem, tpool *pool);
/* Frees the buffers and the list without touching the tensors (backend
 * destroyed while weights were still loaded, model possibly gone). */
void cpu_pack_drop(cpu_packed *p, mem_mgr *mem);

#endif
