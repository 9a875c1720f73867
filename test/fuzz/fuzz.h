// Shared pieces of the fuzz harnesses (libFuzzer entry points, built two ways: with clang's
// -fsanitize=fuzzer by scripts/fuzz.sh, and with replay_main.cc by every build, where ctest
// replays the committed corpora under the build's sanitizers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace gradcomp::fuzz {

/// Inputs worth starting from (valid encodings, messages, settings), written by
/// `replay --write-seeds DIR` into the seed corpus.
std::vector<std::string> Seeds();

/// Reads fixed-size header fields off the front of the input; zeros once it runs out.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  template <typename T>
  T Take() {
    T v{};
    const size_t n = size_ < sizeof(T) ? size_ : sizeof(T);
    if (n > 0) std::memcpy(&v, data_, n);  // an empty input's data may be null
    data_ += n;
    size_ -= n;
    return v;
  }
  const uint8_t* rest() const { return data_; }
  size_t rest_size() const { return size_; }

 private:
  const uint8_t* data_;
  size_t size_;
};

/// Fails the run (libFuzzer and the replay both report an abort with the message).
[[noreturn]] inline void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz check failed: %s\n", what.c_str());
  std::abort();
}

}  // namespace gradcomp::fuzz
