#include "core/timeline.h"

#include <cstdio>
#include <sstream>

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
  file_.open(path, std::ios::out | std::ios::trunc);
  if (!file_) throw InvalidArgument("cannot open timeline file '" + path + "' for writing (GRADCOMP_TIMELINE)");
  file_ << "[\n]\n";
  file_.flush();
  pid_ = pid;
  start_ = std::chrono::steady_clock::now();
  rows_.clear();
  dropped_ = 0;
  stopping_ = false;
  active_ = true;
  writer_ = std::thread([this] { WriterLoop(); });
}

void Timeline::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!active_) return;
    stopping_ = true;
    active_ = false;
  }
  cv_.notify_all();
  writer_.join();
  file_.close();
}

bool Timeline::active() const {
  std::lock_guard<std::mutex> lock(mu_);
  return active_;
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
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  if (!active_) return;
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
    for (const std::string& event : batch) {
      // Overwrite the closing "]\n" with ",\n<event>\n]\n": the file stays valid JSON.
      file_.seekp(-2, std::ios::end);
      file_ << (first ? "" : ",\n") << event << "\n]\n";
      first = false;
    }
    file_.flush();
    if (stop) return;
    lock.lock();
  }
}

}  // namespace gradcomp
