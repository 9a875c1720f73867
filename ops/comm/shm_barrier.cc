#include "ops/comm/shm_barrier.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <new>

#include "ops/common/enforce.h"

namespace gradcomp {

namespace {

// The futex word is shared between processes: no FUTEX_PRIVATE_FLAG.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected) {
  // A timeout only as a safety net: the waiter looks at the word again at least this often.
  const timespec timeout{1, 0};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &timeout, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace

ShmBarrier::ShmBarrier(void* state, int participants)
    : state_(static_cast<State*>(state)), participants_(static_cast<uint32_t>(participants)) {
  GC_ENFORCE(state != nullptr, "a shared-memory barrier needs its state's memory");
  GC_ENFORCE(reinterpret_cast<uintptr_t>(state) % kBytes == 0, "a shared-memory barrier's state at ", state,
             " is not aligned to ", kBytes, " bytes (a cache line of its own)");
  GC_ENFORCE(participants >= 1, "a shared-memory barrier needs at least one participant, got ", participants);
}

void ShmBarrier::Reset(void* state) { new (state) State{{0}, {0}, {0}}; }

void ShmBarrier::Wait() {
  State& s = *state_;
  // Read before arriving: the round cannot end (generation cannot move) until this rank arrives.
  const uint32_t round = s.generation.load(std::memory_order_acquire);
  if (s.arrived.fetch_add(1, std::memory_order_acq_rel) + 1 < participants_) {
    AwaitRound(round);
    return;
  }
  // The last to arrive: reset the count for the next round before releasing this one (nobody
  // arrives for the next round before seeing generation move), then wake the sleepers. The
  // generation's store and the sleepers' load are sequentially consistent against a waiter's
  // increment of sleepers and its load of generation: either it sees the new round or this
  // rank sees it asleep (and a wake that comes before its futex call makes that call return).
  s.arrived.store(0, std::memory_order_relaxed);
  s.generation.store(round + 1, std::memory_order_seq_cst);
  if (s.sleepers.load(std::memory_order_seq_cst) > 0) FutexWakeAll(&s.generation);
}

void ShmBarrier::AwaitRound(uint32_t round) {
  State& s = *state_;
  const auto spin_until = std::chrono::steady_clock::now() + std::chrono::duration<double>(kSpinSeconds);
  for (unsigned i = 1;; ++i) {
    if (s.generation.load(std::memory_order_acquire) != round) return;
    CpuRelax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() >= spin_until) break;
  }
  s.sleepers.fetch_add(1, std::memory_order_seq_cst);
  while (s.generation.load(std::memory_order_seq_cst) == round) FutexWait(&s.generation, round);
  s.sleepers.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace gradcomp
