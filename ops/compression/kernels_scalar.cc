// Portable codec kernels.
#define GC_KERNEL_NAMESPACE scalar
#include "ops/compression/kernels_impl.h"
