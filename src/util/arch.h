/* arch.h - which CPU family kvant is compiled for.  KVANT_X86 is 1 on
 * x86-64, where the AVX2 / AVX-512 kernel files are built and chosen at
 * run time; elsewhere (arm64, ...) only the scalar kernels exist and the
 * Makefile leaves the x86 files out. */
#ifndef KVANT_ARCH_H
#define KVANT_ARCH_H

#if defined(__x86_64__) || defined(_M_X64)
#define KVANT_X86 1
#else
#define KVANT_X86 0
#endif

#endif
