#include "ops/comm/mpi_exit.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace gradcomp {

namespace {

using Clock = std::chrono::steady_clock;

std::atomic<bool> abandoned{false};

struct TeardownBound {
  std::mutex mu;
  std::condition_variable cv;
  double seconds = 0;           // 0: no bound (BoundMpiTeardown not called, or called with 0)
  int rank = -1;
  std::string why;
  const char* step = nullptr;   // the teardown step running, if any
  bool watching = false;
  Clock::time_point deadline;
};

// Never destroyed: the watcher thread may still wait on it while static objects are destroyed
// (MPI_Finalize runs from an atexit handler).
TeardownBound& Bound() {
  static TeardownBound* bound = new TeardownBound;
  return *bound;
}

[[noreturn]] void GiveUp(const TeardownBound& b) {
  std::fprintf(stderr,
               "gradcomp (rank %d, pid %d): at exit, %s has waited %.0f s (GRADCOMP_COLLECTIVE_TIMEOUT_SECONDS) "
               "for ranks that have not ended since gradcomp stopped on every rank (%s). This process exits with "
               "status 1 without finalizing MPI, and the launcher ends the job\n",
               b.rank, static_cast<int>(getpid()), b.step, b.seconds, b.why.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

void Watch() {
  TeardownBound& b = Bound();
  std::unique_lock<std::mutex> lock(b.mu);
  while (true) {
    if (b.step != nullptr && Clock::now() >= b.deadline) GiveUp(b);
    if (b.step == nullptr) {
      b.cv.wait(lock);
    } else {
      b.cv.wait_until(lock, b.deadline);
    }
  }
}

}  // namespace

void AbandonMpiAtExit() { abandoned.store(true); }

bool MpiAbandoned() { return abandoned.load(); }

void BoundMpiTeardown(double seconds, int rank, const std::string& why) {
  TeardownBound& b = Bound();
  std::lock_guard<std::mutex> lock(b.mu);
  b.seconds = seconds;
  b.rank = rank;
  b.why = why;
}

MpiTeardownStep::MpiTeardownStep(const char* what) {
  TeardownBound& b = Bound();
  std::lock_guard<std::mutex> lock(b.mu);
  if (b.seconds <= 0) return;
  if (!b.watching) {
    // The bound counts from the first step: the steps are consecutive parts of one exit.
    b.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(b.seconds));
    b.watching = true;
    std::thread(Watch).detach();
  }
  b.step = what;
  b.cv.notify_all();
}

MpiTeardownStep::~MpiTeardownStep() {
  TeardownBound& b = Bound();
  std::lock_guard<std::mutex> lock(b.mu);
  b.step = nullptr;
  b.cv.notify_all();
}

}  // namespace gradcomp
