// Chrome-trace timeline (loads in Perfetto and chrome://tracing). Events are queued by the
// runtime threads and written by one writer thread that owns the file, so recording stays
// off the hot path. The file is valid JSON after every write: each batch of events replaces
// the closing bracket and writes a new one behind it, in a single pwrite.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>

namespace gradcomp {

class Timeline {
 public:
  /// Events the queue holds before new ones are dropped (and counted).
  static constexpr size_t kQueueCapacity = 1 << 16;

  Timeline() = default;
  ~Timeline() { Stop(); }
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  /// Starts writing to `path` (truncates it); throws naming the path if it cannot be opened.
  /// `pid` is the process id shown in the trace (the rank).
  void Start(const std::string& path, int pid);
  /// Ends the phases still open (their end events carry "cut_by_stop": true), flushes the
  /// queue, finishes the file and stops the writer.
  void Stop();
  bool active() const;

  /// Opens phase `phase` on the row of `tensor`.
  void Begin(const std::string& tensor, const std::string& phase);
  /// Closes phase `phase`; `args` is a JSON object body ("\"bytes\": 12") or empty. A phase
  /// that began before recording started is not shown (its end is dropped).
  void End(const std::string& tensor, const std::string& phase, const std::string& args = "");
  /// A point event on the row of `tensor` (per-rank ready marks, cycle marks).
  void Instant(const std::string& tensor, const std::string& what, const std::string& args = "");
  /// Events dropped because the queue was full.
  uint64_t dropped() const;
  /// Tensors with a row in the current trace, and events waiting for the writer.
  void Sizes(uint64_t* rows, uint64_t* queued) const;

 private:
  void Record(const std::string& tensor, const std::string& phase, char ph, const std::string& args);
  /// Record with mu_ held and recording active.
  void RecordLocked(const std::string& tensor, const std::string& phase, char ph, const std::string& args,
                    std::chrono::steady_clock::time_point now);
  void WriterLoop();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool active_ = false;
  bool stopping_ = false;
  int pid_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::deque<std::string> queue_;
  std::unordered_map<std::string, int> rows_;  // tensor -> tid
  std::set<std::pair<std::string, std::string>> open_;  // (tensor, phase) begun and not ended
  uint64_t dropped_ = 0;
  std::thread writer_;
  int fd_ = -1;
  int64_t end_ = 0;  // file size: the closing "]\n" occupies its last two bytes
};

/// Escapes `s` for a JSON string literal (without the quotes).
std::string JsonEscape(const std::string& s);

}  // namespace gradcomp
