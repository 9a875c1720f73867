// The watchdog: fires once, for the step that ran past the timeout, with its handles; never
// for steps that end in time, however many there are; never when disabled.
#include "core/watchdog.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "core/handle.h"

namespace gradcomp {
namespace {

using namespace std::chrono_literals;

struct Recorder {
  std::mutex mu;
  std::atomic<int> calls{0};
  Watchdog::Expired last;
  std::function<void(Watchdog::Expired)> Callback() {
    return [this](Watchdog::Expired e) {
      std::lock_guard<std::mutex> lock(mu);
      last = std::move(e);
      ++calls;
    };
  }
};

TEST(Watchdog, FiresForTheStepThatRunsPastTheTimeoutWithItsHandles) {
  Recorder rec;
  Watchdog w(0.2, rec.Callback());
  auto handle = std::make_shared<Handle>();
  const auto begun = std::chrono::steady_clock::now();
  w.Begin("the allreduce of 'w'", {handle});
  while (rec.calls.load() == 0 && std::chrono::steady_clock::now() - begun < 5s) std::this_thread::sleep_for(5ms);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - begun).count();
  ASSERT_EQ(rec.calls.load(), 1);
  EXPECT_TRUE(w.expired());
  std::lock_guard<std::mutex> lock(rec.mu);
  EXPECT_EQ(rec.last.what, "the allreduce of 'w'");
  EXPECT_GE(rec.last.seconds, 0.2);
  EXPECT_GE(waited, 0.2);
  EXPECT_LT(waited, 2.0);
  ASSERT_EQ(rec.last.handles.size(), 1u);
  EXPECT_EQ(rec.last.handles[0], handle);
}

TEST(Watchdog, StepsThatEndInTimeNeverFire) {
  Recorder rec;
  {
    Watchdog w(0.15, rec.Callback());
    // Many short steps over several timeouts, with idle gaps: the deadline follows each step.
    const auto until = std::chrono::steady_clock::now() + 600ms;
    while (std::chrono::steady_clock::now() < until) {
      Watchdog::Step step(w, "a negotiation round");
      std::this_thread::sleep_for(10ms);
    }
    std::this_thread::sleep_for(400ms);  // idle, longer than the timeout
    EXPECT_FALSE(w.expired());
  }
  EXPECT_EQ(rec.calls.load(), 0);
}

TEST(Watchdog, ALongStepAfterShortOnesFiresOnTime) {
  Recorder rec;
  Watchdog w(0.2, rec.Callback());
  for (int i = 0; i < 20; ++i) Watchdog::Step step(w, "short");
  std::this_thread::sleep_for(150ms);  // the watchdog's next wake-up falls inside the long step
  const auto begun = std::chrono::steady_clock::now();
  w.Begin("long");
  while (rec.calls.load() == 0 && std::chrono::steady_clock::now() - begun < 5s) std::this_thread::sleep_for(5ms);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - begun).count();
  ASSERT_EQ(rec.calls.load(), 1);
  EXPECT_GE(waited, 0.2);
  EXPECT_LT(waited, 1.0);
  std::lock_guard<std::mutex> lock(rec.mu);
  EXPECT_EQ(rec.last.what, "long");
}

TEST(Watchdog, DisabledByAZeroTimeout) {
  Recorder rec;
  {
    Watchdog w(0, rec.Callback());
    w.Begin("forever");
    std::this_thread::sleep_for(100ms);
    EXPECT_FALSE(w.expired());
  }
  EXPECT_EQ(rec.calls.load(), 0);
}

}  // namespace
}  // namespace gradcomp
