// AVX2 + F16C reduction kernels; compiled with -mavx2 -mf16c and entered only after a CPUID check.
#define GC_KERNEL_NAMESPACE kernels_avx2
#include "ops/reduce/kernels_impl.h"
