// AVX2 + F16C codec kernels; compiled with -mavx2 -mf16c and entered only after a CPUID check.
#define GC_KERNEL_NAMESPACE avx2
#include "ops/compression/kernels_impl.h"
