/* hadamard.h - the normalized Walsh-Hadamard transform of rows, for the
 * rotated KV cache (--kv-rotate): H = H_d / sqrt(d) over each row of d
 * values (d a power of two, Sylvester order), orthogonal and its own
 * inverse, so q.k = (Hq).(Hk) and a value row stored as Hv comes back as
 * H(sum a_i H v_i) = sum a_i v_i.  Spreading each row's outliers over all
 * of its values makes 4-bit quantization of K and V lose less.
 *
 * The SIMD rows are bitwise equal to the reference: every element goes
 * through the same additions and subtractions in the same order (stage h
 * pairs x[i] with x[i + h], h = 1, 2, 4, ..., d/2; then one multiply by
 * 1/sqrt(d)), and none is contracted into an FMA. */
#ifndef KVANT_HADAMARD_H
#define KVANT_HADAMARD_H

#include <stdint.h>

#include "kernels/dtype.h"

/* 1 when rows of d values can be transformed: d a power of two, 2..4096. */
int hadamard_ok(int32_t d);

/* In place over n_rows rows of d values (hadamard_ok(d)). */
typedef void (*hadamard_fn)(float *x, int64_t n_rows, int32_t d);
void hadamard_rows_ref(float *x, int64_t n_rows, int32_t d);
/* The rows for isa (the reference when isa has none, or off x86). */
hadamard_fn hadamard_for(kernel_isa isa);

#endif
