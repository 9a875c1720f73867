#include "ops/common/cpu.h"

namespace gradcomp {

namespace {
Isa DetectIsa() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) return Isa::kAvx2;
#endif
  return Isa::kScalar;
}
}  // namespace

Isa BestIsa() {
  static const Isa isa = DetectIsa();  // a CPU constant, not runtime state
  return isa;
}

const char* IsaName(Isa isa) { return isa == Isa::kAvx2 ? "avx2" : "scalar"; }

}  // namespace gradcomp
