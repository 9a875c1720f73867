#include "core/timeline.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "ops/common/cpu.h"
#include "ops/common/enforce.h"

namespace gradcomp {

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

void Timeline::Start(const std::string& path, int pid) {
  Stop();
  std::lock_guard<std::mutex> lock(mu_);
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0 || ::pwrite(fd_, "[\n]\n", 4, 0) != 4) {
    const std::string why = std::strerror(errno);
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    throw InvalidArgument("cannot open timeline file '" + path + "' for writing (GRADCOMP_TIMELINE): " + why);
  }
  end_ = 4;
  pid_ = pid;
  start_ = std::chrono::steady_clock::now();
  rows_.clear();
  open_.clear();
  dropped_ = 0;
  stopping_ = false;
  active_ = true;
  writer_ = std::thread([this] {
    NameThisThread("gc-timeline");
    WriterLoop();
  });
}

void Timeline::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!active_) return;
    // Phases still open end at the stop, so every begin in the file has its end (a peer's
    // tensor whose negotiation began just before this rank stopped recording, say).
    const auto now = std::chrono::steady_clock::now();
    const auto open = open_;  // RecordLocked erases from open_
    for (const auto& [tensor, phase] : open) RecordLocked(tensor, phase, 'E', "\"cut_by_stop\": true", now);
    stopping_ = true;
    active_ = false;
  }
  cv_.notify_all();
  writer_.join();
  ::close(fd_);
  fd_ = -1;
}

bool Timeline::active() const {
  std::lock_guard<std::mutex> lock(mu_);
  return active_;
}

void Timeline::Sizes(uint64_t* rows, uint64_t* queued) const {
  std::lock_guard<std::mutex> lock(mu_);
  *rows = rows_.size();
  *queued = queue_.size();
}

uint64_t Timeline::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

void Timeline::Begin(const std::string& tensor, const std::string& phase) { Record(tensor, phase, 'B', ""); }

void Timeline::End(const std::string& tensor, const std::string& phase, const std::string& args) {
  Record(tensor, phase, 'E', args);
}

void Timeline::Instant(const std::string& tensor, const std::string& what, const std::string& args) {
  Record(tensor, what, 'i', args);
}

void Timeline::Record(const std::string& tensor, const std::string& phase, char ph, const std::string& args) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!active_) return;
  // The time is read under the lock: events recorded by several threads (the caller's
  // "queued" mark, the background thread's phases) reach the file in time order per row.
  RecordLocked(tensor, phase, ph, args, std::chrono::steady_clock::now());
}

void Timeline::RecordLocked(const std::string& tensor, const std::string& phase, char ph, const std::string& args,
                            std::chrono::steady_clock::time_point now) {
  if (ph == 'B') open_.emplace(tensor, phase);
  if (ph == 'E' && open_.erase({tensor, phase}) == 0) return;  // began before recording started
  if (queue_.size() >= kQueueCapacity) {
    ++dropped_;
    return;
  }
  auto [row, fresh] = rows_.try_emplace(tensor, static_cast<int>(rows_.size()) + 1);
  std::ostringstream os;
  if (fresh) {
    // One row per tensor: name the row once.
    os << "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " << pid_ << ", \"tid\": " << row->second
       << ", \"args\": {\"name\": \"" << JsonEscape(tensor) << "\"}}";
    queue_.push_back(os.str());
    os.str("");
  }
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(now - start_).count();
  os << "{\"name\": \"" << JsonEscape(phase) << "\", \"ph\": \"" << ph << "\", \"ts\": " << us
     << ", \"pid\": " << pid_ << ", \"tid\": " << row->second;
  if (ph == 'i') os << ", \"s\": \"t\"";
  if (!args.empty()) os << ", \"args\": {" << args << "}";
  os << "}";
  queue_.push_back(os.str());
  cv_.notify_one();
}

void Timeline::WriterLoop() {
  bool first = true;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    std::deque<std::string> batch;
    batch.swap(queue_);
    const bool stop = stopping_;
    lock.unlock();
    if (!batch.empty()) {
      // Replace the closing "]\n" with ",\n<events>\n]\n" in one write: the file is valid JSON
      // before and after it.
      std::string chunk;
      for (const std::string& event : batch) {
        chunk += first ? "" : ",\n";
        chunk += event;
        first = false;
      }
      chunk += "\n]\n";
      const ssize_t written = ::pwrite(fd_, chunk.data(), chunk.size(), end_ - 2);
      if (written == static_cast<ssize_t>(chunk.size())) end_ += static_cast<int64_t>(chunk.size()) - 2;
    }
    if (stop) return;
    lock.lock();
  }
}

}  // namespace gradcomp
