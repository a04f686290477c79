/* dtype.c - the dtype traits table, CPU feature detection, and the one
 * choice of instruction set with the kernel tables filled from it.
 *
 * Invariants:
 *  - k_base[] (the reference table) is const.  The mutable globals are
 *    the dispatch state below: g_isa (the chosen kernel_isa) and the
 *    tables filled from it, g_traits[] (a copy of k_base with to_float /
 *    vec_dot replaced by the chosen ISA's kernels) and g_multi[].
 *    They are written together by dispatch_apply(), from dtype_init()
 *    (once, under pthread_once) and from dtype_force_isa() (tests only,
 *    which must not run concurrently with kernels); read-only otherwise.
 *  - The ISA is named by a string only when KVANT_ISA is parsed
 *    (isa_from_name, once); everything else passes the kernel_isa enum
 *    (matmul.c's int8-activation tables, the CPU backend's attention
 *    rows and the roofline probes are picked by it).
 *  - from_float, to_float_ref and vec_dot_ref always point at the scalar
 *    references in quant_ref.c.
 *  - Unsupported enum values (q8_1, q2_K, q3_K, q8_K, the i-quants and
 *    other values between bf16 and mxfp4, gaps) have name NULL
 *    and dtype_get() returns NULL for them.
 */
#include "kernels/dtype.h"

#include "util/arch.h"
#if KVANT_X86
#include <cpuid.h>
#endif
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kernels/quant_ref.h"

#define REF_KERNELS(T)                                                          \
    .to_float = qref_##T##_to_float, .from_float = qref_##T##_from_float,       \
    .vec_dot = qref_##T##_vec_dot, .to_float_ref = qref_##T##_to_float,         \
    .vec_dot_ref = qref_##T##_vec_dot

static const dtype_traits k_base[DT_COUNT] = {
    [DT_F32] = {.name = "f32", .block_size = 1, .type_size = 4, .is_quantized = 0,
                REF_KERNELS(f32)},
    [DT_F16] = {.name = "f16", .block_size = 1, .type_size = 2, .is_quantized = 0,
                REF_KERNELS(f16)},
    [DT_BF16] = {.name = "bf16", .block_size = 1, .type_size = 2, .is_quantized = 0,
                 REF_KERNELS(bf16)},
    [DT_Q4_0] = {.name = "q4_0", .block_size = QK4_0, .type_size = sizeof(block_q4_0),
                 .is_quantized = 1, REF_KERNELS(q4_0)},
    [DT_Q4_1] = {.name = "q4_1", .block_size = QK4_1, .type_size = sizeof(block_q4_1),
                 .is_quantized = 1, REF_KERNELS(q4_1)},
    [DT_Q5_0] = {.name = "q5_0", .block_size = QK5_0, .type_size = sizeof(block_q5_0),
                 .is_quantized = 1, REF_KERNELS(q5_0)},
    [DT_Q5_1] = {.name = "q5_1", .block_size = QK5_1, .type_size = sizeof(block_q5_1),
                 .is_quantized = 1, REF_KERNELS(q5_1)},
    [DT_Q8_0] = {.name = "q8_0", .block_size = QK8_0, .type_size = sizeof(block_q8_0),
                 .is_quantized = 1, REF_KERNELS(q8_0)},
    [DT_Q4_K] = {.name = "q4_K", .block_size = QK_K, .type_size = sizeof(block_q4_K),
                 .is_quantized = 1, REF_KERNELS(q4_K)},
    [DT_Q5_K] = {.name = "q5_K", .block_size = QK_K, .type_size = sizeof(block_q5_K),
                 .is_quantized = 1, REF_KERNELS(q5_K)},
    [DT_Q6_K] = {.name = "q6_K", .block_size = QK_K, .type_size = sizeof(block_q6_K),
                 .is_quantized = 1, REF_KERNELS(q6_K)},
    [DT_MXFP4] = {.name = "mxfp4", .block_size = QK_MXFP4, .type_size = sizeof(block_mxfp4),
                  .is_quantized = 1, REF_KERNELS(mxfp4)},
};
#undef REF_KERNELS

static_assert(sizeof(k_base) / sizeof(k_base[0]) == DT_COUNT, "traits table length");

/* ---- dispatch state (the mutable globals; see file comment) ---- */
static kernel_isa g_isa = KERNEL_ISA_SCALAR;
static dtype_traits g_traits[DT_COUNT];
static dtype_vec_dot_multi_fn g_multi[DT_COUNT];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static char g_isa_error[160];

static const char *const k_isa_name[KERNEL_ISA_COUNT] = {
    [KERNEL_ISA_SCALAR] = "scalar",
    [KERNEL_ISA_AVX2] = "avx2",
    [KERNEL_ISA_AVX512] = "avx512",
};

#if KVANT_X86
static int cpu_has_avx2(void)
{
    __builtin_cpu_init();
    /* f16c through cpuid leaf 1 (ECX bit 29): clang's builtin lacks it */
    unsigned a, b, c, d;
    int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
}

static int cpu_has_avx512(void)
{
    __builtin_cpu_init();
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
}
#else
static int cpu_has_avx2(void)
{
    return 0;
}

static int cpu_has_avx512(void)
{
    return 0;
}
#endif

int dtype_isa_supported(kernel_isa isa)
{
    switch (isa) {
    case KERNEL_ISA_SCALAR: return 1;
    case KERNEL_ISA_AVX2: return cpu_has_avx2();
    case KERNEL_ISA_AVX512: return cpu_has_avx512();
    default: return 0;
    }
}

/* The chosen ISA's to_float / vec_dot / vec_dot_multi by dtype (NULL:
 * the scalar references). */
static const quant_simd_kernels *quant_table_for(kernel_isa isa)
{
#if KVANT_X86
    if (isa == KERNEL_ISA_AVX512)
        return quant_avx512_table();
    if (isa == KERNEL_ISA_AVX2)
        return quant_avx2_table();
#endif
    (void)isa;
    return NULL;
}

/* Makes isa the chosen ISA and rebuilds the traits from it. */
static void dispatch_apply(kernel_isa isa)
{
    const quant_simd_kernels *simd = quant_table_for(isa);
    memcpy(g_traits, k_base, sizeof(g_traits));
    memset(g_multi, 0, sizeof(g_multi));
    for (int t = 0; simd && t < DT_COUNT; t++) {
        if (!k_base[t].name)
            continue;
        if (simd[t].to_float)
            g_traits[t].to_float = simd[t].to_float;
        if (simd[t].vec_dot)
            g_traits[t].vec_dot = simd[t].vec_dot;
        g_multi[t] = simd[t].vec_dot_multi;
    }
    g_isa = isa;
}

/* The one place an ISA is named by a string: KVANT_ISA.  -1 if unknown. */
static int isa_from_name(const char *name)
{
    for (int i = 0; i < KERNEL_ISA_COUNT; i++)
        if (strcmp(name, k_isa_name[i]) == 0)
            return i;
    return -1;
}

/* The best ISA the CPU has, unless KVANT_ISA=scalar|avx2|avx512 names
 * another (tests run every ISA the CPU has this way); a name the CPU
 * lacks, or an unknown one, keeps the best and leaves a message for
 * dtype_isa_error(). */
static void dispatch_select(void)
{
    kernel_isa best = KERNEL_ISA_SCALAR;
    for (int i = KERNEL_ISA_COUNT - 1; i > KERNEL_ISA_SCALAR; i--) {
        if (dtype_isa_supported((kernel_isa)i)) {
            best = (kernel_isa)i;
            break;
        }
    }
    const char *want = getenv("KVANT_ISA");
    const int named = want && *want ? isa_from_name(want) : (int)best;
    if (named < 0)
        snprintf(g_isa_error, sizeof g_isa_error,
                 "KVANT_ISA=%.40s: unknown instruction set (scalar, avx2, avx512)", want);
    else if (!dtype_isa_supported((kernel_isa)named))
        snprintf(g_isa_error, sizeof g_isa_error, "KVANT_ISA=%s: this CPU lacks it (it has %s)",
                 want, k_isa_name[best]);
    dispatch_apply(named >= 0 && dtype_isa_supported((kernel_isa)named) ? (kernel_isa)named : best);
}

void dtype_init(void)
{
    pthread_once(&g_once, dispatch_select);
}

const char *dtype_isa_error(void)
{
    dtype_init();
    return g_isa_error[0] ? g_isa_error : NULL;
}

kernel_isa dtype_kernel_isa(void)
{
    dtype_init();
    return g_isa;
}

const char *dtype_isa_name(kernel_isa isa)
{
    return (unsigned)isa < KERNEL_ISA_COUNT ? k_isa_name[isa] : "?";
}

const char *dtype_isa(void)
{
    return dtype_isa_name(dtype_kernel_isa());
}

int dtype_force_isa(kernel_isa isa)
{
    dtype_init();
    if ((unsigned)isa >= KERNEL_ISA_COUNT || !dtype_isa_supported(isa))
        return -1;
    dispatch_apply(isa);
    return 0;
}

const dtype_traits *dtype_get(uint32_t t)
{
    if (t >= DT_COUNT || !k_base[t].name)
        return NULL;
    dtype_init();
    return &g_traits[t];
}

dtype_vec_dot_multi_fn dtype_vec_dot_multi(uint32_t t)
{
    if (t >= DT_COUNT)
        return NULL;
    dtype_init();
    return g_multi[t];
}

int dtype_from_name(const char *name)
{
    if (!name)
        return -1;
    for (int t = 0; t < DT_COUNT; t++) {
        /* GGUF spells K-quants "Q4_K"; accept any case. */
        if (k_base[t].name && strcasecmp(k_base[t].name, name) == 0)
            return t;
    }
    return -1;
}

size_t dtype_row_size(uint32_t t, int64_t n)
{
    if (t >= DT_COUNT || !k_base[t].name || n < 0)
        return 0;
    const dtype_traits *tr = &k_base[t];
    if (n % tr->block_size != 0)
        return 0;
    uint64_t blocks = (uint64_t)n / (uint64_t)tr->block_size;
    if (blocks > SIZE_MAX / tr->type_size)
        return 0;
    return (size_t)blocks * tr->type_size;
}
