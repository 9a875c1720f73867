// Run-time CPU feature selection for the vectorized kernels.
#pragma once

namespace gradcomp {

/// Instruction sets a kernel may be compiled for; chosen once at run time.
enum class Isa { kScalar, kAvx2 };

/// Best instruction set this CPU supports among those gradcomp was compiled with
/// (AVX2 needs AVX2 and F16C). Tests call each variant explicitly to compare them.
Isa BestIsa();
/// "scalar" or "avx2".
const char* IsaName(Isa isa);

}  // namespace gradcomp
