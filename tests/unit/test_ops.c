/* test_ops.c - the AVX-512 attention row against its scalar reference on
 * random data (shuffled block tables, partial last blocks, head dims 64
 * and 128), bound 2e-5 absolute (outputs are averages of V in [-1, 1]). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "testutil.h"
#include "util/arch.h"

#define T_BLOCK 16
#define T_MAX_POS 300
#define T_MAX_HD 128
#define T_BOUND 2e-5f

#if KVANT_X86
static void check_case(tu_rng *r, int32_t n_pos, int32_t hd, float qscale)
{
    const int32_t n_blocks = (T_MAX_POS + T_BLOCK - 1) / T_BLOCK;
    const int64_t row = hd + 8; /* padding: a row stride wider than head_dim */
    float *k = malloc(sizeof(float) * (size_t)(n_blocks * T_BLOCK * row));
    float *v = malloc(sizeof(float) * (size_t)(n_blocks * T_BLOCK * row));
    int32_t table[(T_MAX_POS + T_BLOCK - 1) / T_BLOCK];
    float q[T_MAX_HD], o_ref[T_MAX_HD], o_simd[T_MAX_HD], scratch[T_BLOCK];
    for (int64_t i = 0; i < n_blocks * T_BLOCK * row; i++) {
        k[i] = tu_rand_uniform(r, -1, 1);
        v[i] = tu_rand_uniform(r, -1, 1);
    }
    for (int32_t i = 0; i < n_blocks; i++)
        table[i] = i;
    for (int32_t i = n_blocks - 1; i > 0; i--) { /* shuffle */
        int32_t j = (int32_t)(tu_rand_u64(r) % (unsigned long long)(i + 1)), t = table[i];
        table[i] = table[j];
        table[j] = t;
    }
    for (int32_t d = 0; d < hd; d++)
        q[d] = tu_rand_normal(r) * qscale;
    cpu_attn_seq s = {k, v, table, T_BLOCK * row, row, T_BLOCK};
    const float scale = 1.0f / sqrtf((float)hd);
    cpu_attention_row_ref(q, &s, n_pos, hd, scale, scratch, o_ref);
    cpu_attention_row_avx512(q, &s, n_pos, hd, scale, scratch, o_simd);
    float err = 0.0f;
    for (int32_t d = 0; d < hd; d++)
        err = fmaxf(err, fabsf(o_ref[d] - o_simd[d]));
    CHECKF(err <= T_BOUND, "n_pos %d hd %d qscale %g: max err %g", n_pos, hd, qscale, err);
    free(k);
    free(v);
}
#endif

int main(void)
{
#if KVANT_X86
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f")) {
        printf("SKIPPED: test_ops: the CPU lacks AVX-512, whose attention row this checks\n");
        return 77;
    }
    tu_rng r = {0x5eed1234ull};
    const int32_t n_pos[] = {1, 2, 15, 16, 17, 31, 64, 100, 257, T_MAX_POS};
    const float qs[] = {0.5f, 4.0f, 20.0f}; /* soft to very peaked softmax */
    for (size_t i = 0; i < sizeof n_pos / sizeof n_pos[0]; i++)
        for (size_t j = 0; j < sizeof qs / sizeof qs[0]; j++) {
            check_case(&r, n_pos[i], 64, qs[j]);
            check_case(&r, n_pos[i], 128, qs[j]);
        }
    return tu_finish("test_ops");
#else
    printf("SKIPPED: test_ops: the AVX-512 attention row exists on x86-64 only\n");
    return 77;
#endif
}
