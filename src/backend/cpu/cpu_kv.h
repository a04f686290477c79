/* cpu_kv.h - quantized paged KV rows for the CPU backend: the row format,
 * storing a row, and one attention row read straight from stored rows.
 *
 * A stored K or V row is kv_dim elements in dtype (f16, bf16, q8_0, q4_0;
 * f32 stays on cpu_attention_row_* in cpu_ops.c, unchanged).  Each head's
 * slice starts on a block boundary because head_dim is a multiple of the
 * type's block size (cpu_kv_check), so a head is addressed by byte offset
 * dtype_row_size(dtype, h * head_dim).
 *
 * Threading: pure functions over caller memory; any thread.
 */
#ifndef KVANT_CPU_KV_H
#define KVANT_CPU_KV_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/cpu_attn_rows.h"
#include "kernels/dtype.h"
#include "util/err.h"

/* KV_OK when dtype can store K/V rows with this head_dim; else KV_EUNSUP
 * naming the type and head_dim. */
int cpu_kv_check(uint32_t type, int32_t head_dim, kvant_err *err);

/* The K/V row store for `type` on `isa`: dst (dtype_row_size(type, n)
 * bytes) = the type's from_float of src[0..n), bitwise; F16C for DT_F16 on
 * AVX2 and AVX-512 CPUs, else the reference.  The backend picks once per
 * KV layout. */
cpu_kv_store_fn cpu_kv_store_for(kernel_isa isa, uint32_t type);

/* Scratch floats a cpu_kvq_row_fn, a cpu_kvq_group_fn of up to
 * CPU_ATTN_GROUP_MAX heads or a cpu_kvq_tile_fn needs. */
int64_t cpu_kvq_scratch(int32_t block_size, int32_t head_dim);

/* The table a token at pos reads under a KV budget (fwd_seq.kv_sink_blocks,
 * kv_recent): table itself while no block between the sink blocks and the
 * window (from block (pos - recent + 1) / block_size on) is skipped, else
 * the sink blocks' entries then the window's gathered into vt (at most
 * sink_blocks + recent / block_size + 2 entries).  *n_pos: the positions of
 * the table returned that the token reads. */
const int32_t *cpu_kv_budget_table(const int32_t *table, int32_t block_size, int32_t sink_blocks,
                                   int32_t recent, int32_t pos, int32_t *vt, int32_t *n_pos);

/* The row for stored rows of `type` with heads of head_dim on `isa`
 * (dtype_kernel_isa()): the AVX2 + FMA + F16C twin on AVX2 and AVX-512
 * for DT_F16 and DT_BF16 (head_dim % 8 == 0), DT_Q8_0 and DT_Q4_0
 * (head_dim % 32 == 0); else the reference.  The backend picks once per KV layout and calls through it. */
cpu_kvq_row_fn cpu_kvq_attention_row_for(kernel_isa isa, uint32_t type, int32_t head_dim);
/* The group function whose every head is bitwise the row function's
 * above for the same arguments, or NULL (the caller then loops the row):
 * the AVX2 twin exactly where cpu_kvq_attention_row_for picks the AVX2 row. */
cpu_kvq_group_fn cpu_kvq_attention_group_for(kernel_isa isa, uint32_t type, int32_t head_dim);
/* The tile function whose every token is bitwise the group function's
 * above, or NULL: the AVX2 one exactly where that group is the AVX2 one. */
cpu_kvq_tile_fn cpu_kvq_attention_tile_for(kernel_isa isa, uint32_t type, int32_t head_dim);
/* The scalar specification (the type's traits); its f16 twins are in
 * cpu_attn_rows.h. */
void cpu_kvq_attention_row_ref(const float *q, const cpu_kvq_seq *s, int32_t n_pos,
                               int32_t head_dim, float scale, float *scratch, float *out);

#endif
