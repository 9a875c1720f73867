// ShmBarrier: every round's writes seen by all after it, between threads and between processes
// sharing a mapping, and a participant waiting for a late one sleeps instead of spinning.
#include "ops/comm/shm_barrier.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "test/support/harness.h"

namespace gradcomp {
namespace {

constexpr int kMaxParticipants = 8;

// What the participants share: the barrier's state, then one slot per participant for two
// alternating rounds (a slot is written again two rounds later, after every reader of it has
// arrived at the next barrier).
struct Shared {
  alignas(64) unsigned char barrier[ShmBarrier::kBytes];
  long slots[2][kMaxParticipants];
};

// One participant's rounds: write its slot, wait, check every participant's slot of the round.
// Returns the number of slots that did not hold the round's value.
int RunRounds(Shared* shared, int me, int participants, int rounds) {
  ShmBarrier barrier(shared->barrier, participants);
  int wrong = 0;
  for (int k = 0; k < rounds; ++k) {
    shared->slots[k % 2][me] = 1000L * k + me;
    barrier.Wait();
    for (int j = 0; j < participants; ++j) wrong += shared->slots[k % 2][j] != 1000L * k + j;
  }
  return wrong;
}

TEST(ShmBarrier, EveryRoundsWritesAreSeenByAllThreads) {
  for (int participants : {1, 2, 3, 4, 8}) {
    Shared shared{};
    ShmBarrier::Reset(shared.barrier);
    std::vector<int> wrong(static_cast<size_t>(participants), 0);
    std::vector<std::thread> threads;
    for (int me = 0; me < participants; ++me) {
      threads.emplace_back([&, me] { wrong[static_cast<size_t>(me)] = RunRounds(&shared, me, participants, 3000); });
    }
    for (std::thread& t : threads) t.join();
    for (int me = 0; me < participants; ++me) {
      EXPECT_EQ(wrong[static_cast<size_t>(me)], 0) << "participant " << me << " of " << participants;
    }
  }
}

TEST(ShmBarrier, WorksBetweenProcessesSharingAMapping) {
  constexpr int kParticipants = 4, kRounds = 2000;
  void* mem = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* shared = new (mem) Shared{};
  ShmBarrier::Reset(shared->barrier);
  std::vector<pid_t> children;
  for (int me = 1; me < kParticipants; ++me) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) _exit(RunRounds(shared, me, kParticipants, kRounds) == 0 ? 0 : 1);
    children.push_back(pid);
  }
  EXPECT_EQ(RunRounds(shared, 0, kParticipants, kRounds), 0);
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child " << pid << " status " << status;
  }
  munmap(mem, sizeof(Shared));
}

TEST(ShmBarrier, WaitersForALateParticipantSleep) {
  constexpr int kParticipants = 3;
  constexpr double kLateSeconds = 0.3;
  Shared shared{};
  ShmBarrier::Reset(shared.barrier);
  std::vector<double> cpu(kParticipants, 0), wall(kParticipants, 0);
  std::vector<std::thread> threads;
  for (int me = 0; me < kParticipants; ++me) {
    threads.emplace_back([&, me] {
      ShmBarrier barrier(shared.barrier, kParticipants);
      if (me == 0) std::this_thread::sleep_for(std::chrono::duration<double>(kLateSeconds));
      const auto start = std::chrono::steady_clock::now();
      const double cpu_start = testing::ThreadCpuSeconds();
      barrier.Wait();
      cpu[static_cast<size_t>(me)] = testing::ThreadCpuSeconds() - cpu_start;
      wall[static_cast<size_t>(me)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int me = 1; me < kParticipants; ++me) {
    EXPECT_GE(wall[static_cast<size_t>(me)], 0.8 * kLateSeconds) << "participant " << me << " left early";
    // A spinning waiter burns about its whole wait (two waiters, two cores or more here).
    EXPECT_LT(cpu[static_cast<size_t>(me)], 0.1 * kLateSeconds)
        << "participant " << me << " used " << cpu[static_cast<size_t>(me)] << " s of CPU waiting "
        << wall[static_cast<size_t>(me)] << " s";
  }
}

// The message of constructing a barrier on `state` for `participants` ("" when it is accepted).
std::string ErrorFor(void* state, int participants) {
  try {
    ShmBarrier barrier(state, participants);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(ShmBarrier, RefusesMisalignedStateAndNoParticipants) {
  Shared shared{};
  EXPECT_NE(ErrorFor(shared.barrier + 4, 2).find("is not aligned to 64 bytes"), std::string::npos)
      << ErrorFor(shared.barrier + 4, 2);
  EXPECT_NE(ErrorFor(shared.barrier, 0).find("needs at least one participant, got 0"), std::string::npos)
      << ErrorFor(shared.barrier, 0);
  EXPECT_NE(ErrorFor(nullptr, 2).find("needs its state's memory"), std::string::npos) << ErrorFor(nullptr, 2);
  EXPECT_EQ(ErrorFor(shared.barrier, 1), "");
}

}  // namespace
}  // namespace gradcomp
