// Portable reduction kernels (any x86-64 or other CPU).
#define GC_KERNEL_NAMESPACE kernels_scalar
#include "ops/reduce/kernels_impl.h"
