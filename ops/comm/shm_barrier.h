// A barrier of the processes (or threads) that share one block of memory: a participant that
// waits for a late one spins a few microseconds, then sleeps on a futex until the last arrives.
// MPI_Barrier polls instead (Open MPI's shared-memory transport spins at full speed unless it
// knows the node is oversubscribed): a node's ranks waiting for a peer then burn the cores that
// peer, or its GPU's host threads, or the framework's threads, need to catch up
// (docs/benchmarks.md, "The node's barrier: a futex in the window").
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace gradcomp {

class ShmBarrier {
 public:
  /// The bytes of shared memory a barrier keeps its state in (one cache line).
  static constexpr size_t kBytes = 64;
  /// How long a waiter spins before it sleeps: a barrier whose last participant is this close
  /// behind costs no system call; a longer wait leaves the core to others.
  static constexpr double kSpinSeconds = 20e-6;

  /// `state`: kBytes of memory (64-byte aligned) that every participant maps, zeroed by one of
  /// them (Reset) before any participant waits; `participants` >= 1 call Wait each round.
  ShmBarrier(void* state, int participants);
  /// Zeroes a barrier's state; the caller orders this before the first Wait of every participant.
  static void Reset(void* state);

  /// Returns once all participants have called Wait this round; the writes each made before
  /// its call are visible to every participant after it.
  void Wait();

 private:
  struct State {
    std::atomic<uint32_t> arrived;     // participants in this round so far
    std::atomic<uint32_t> generation;  // rounds completed: the futex word
    std::atomic<uint32_t> sleepers;    // participants asleep (or about to be) on `generation`
  };
  static_assert(sizeof(State) <= kBytes, "the barrier's state must fit its bytes");
  static_assert(std::atomic<uint32_t>::is_always_lock_free, "a barrier across processes needs lock-free atomics");

  /// Spins, then sleeps, until `generation` is no longer `round`.
  void AwaitRound(uint32_t round);

  State* state_;
  uint32_t participants_;
};

}  // namespace gradcomp
