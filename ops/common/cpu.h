// Run-time CPU feature selection for the vectorized kernels, the cores a process may use, and
// the names gradcomp's threads show in top -H, ps -L and debuggers.
#pragma once

#include <string>

namespace gradcomp {

/// Instruction sets a kernel may be compiled for; chosen once at run time.
enum class Isa { kScalar, kAvx2 };

/// Best instruction set this CPU supports among those gradcomp was compiled with
/// (AVX2 needs AVX2 and F16C). Tests call each variant explicitly to compare them.
Isa BestIsa();
/// "scalar" or "avx2".
const char* IsaName(Isa isa);

/// The CPUs this process may run on (its affinity mask), as "0" or "0-3,8"; empty where the
/// system does not say. `count` receives how many (0 if unknown).
std::string AllowedCpus(int* count);

/// Names the calling thread ("gc-background", "gc-pipeline", ...; at most 15 characters, as
/// Linux keeps) so that users can see which of gradcomp's threads uses a core. No-op elsewhere.
void NameThisThread(const char* name);

}  // namespace gradcomp
