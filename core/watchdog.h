// The watchdog: bounds how long the background thread may stay inside one blocking step
// (a negotiation round, a collective, the init handshake). MPI cannot cancel a call whose
// peer died, stopped or lost its link (over shared memory or TCP the call waits forever,
// and mpirun only kills the survivors when it sees the death itself), so gradcomp watches
// its own progress, as c10d's NCCL watchdog does: once a step has run for the timeout, the
// callback reports what was waiting and ends the process.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace gradcomp {

class Handle;

class Watchdog {
 public:
  /// What was in progress when the timeout expired: its description, how long it had run
  /// and the handles of the operations it carried (to fail them).
  struct Expired {
    std::string what;
    double seconds = 0;
    std::vector<std::shared_ptr<Handle>> handles;
  };
  /// `timeout_seconds` <= 0 disables it (no thread). `on_expired` runs once, on the
  /// watchdog's thread.
  Watchdog(double timeout_seconds, std::function<void(Expired)> on_expired);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  /// A blocking step begins (replacing any step in progress).
  void Begin(std::string what, std::vector<std::shared_ptr<Handle>> handles = {});
  /// The step in progress ended.
  void End();
  /// True once the timeout expired.
  bool expired() const;
  double timeout_seconds() const { return timeout_; }

  /// Begin ... End for a scope.
  class Step {
   public:
    Step(Watchdog& w, std::string what, std::vector<std::shared_ptr<Handle>> handles = {}) : w_(w) {
      w_.Begin(std::move(what), std::move(handles));
    }
    ~Step() { w_.End(); }
    Step(const Step&) = delete;
    Step& operator=(const Step&) = delete;

   private:
    Watchdog& w_;
  };

 private:
  void Loop();

  const double timeout_;
  std::function<void(Expired)> on_expired_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool active_ = false;
  bool stop_ = false;
  bool expired_ = false;
  std::string what_;
  std::vector<std::shared_ptr<Handle>> handles_;
  std::chrono::steady_clock::time_point since_;
  std::thread thread_;
};

}  // namespace gradcomp
