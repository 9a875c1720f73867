#include "ops/common/cpu.h"

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <vector>

#include "ops/common/enforce.h"

namespace gradcomp {

namespace {
Isa DetectIsa() {
#if defined(__x86_64__) || defined(__i386__)
  // AVX2 through the compiler (it also checks that the OS saves the AVX registers); F16C from
  // CPUID leaf 1, ECX bit 29, since not every compiler's __builtin_cpu_supports knows it.
  __builtin_cpu_init();
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
  if (__builtin_cpu_supports("avx2") && f16c) return Isa::kAvx2;
#endif
  return Isa::kScalar;
}
}  // namespace

Isa BestIsa() {
  static const Isa isa = DetectIsa();  // a CPU constant, not runtime state
  return isa;
}

const char* IsaName(Isa isa) { return isa == Isa::kAvx2 ? "avx2" : "scalar"; }

std::string AllowedCpus(int* count) {
  *count = 0;
  std::string out;
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return out;
  *count = CPU_COUNT(&set);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  out = NumberRanges(cpus, ",");
#endif
  return out;
}

void NameThisThread(const char* name) {
#if defined(__linux__)
  char truncated[16] = {};
  for (size_t i = 0; i + 1 < sizeof(truncated) && name[i] != '\0'; ++i) truncated[i] = name[i];
  pthread_setname_np(pthread_self(), truncated);
#else
  (void)name;
#endif
}

}  // namespace gradcomp
