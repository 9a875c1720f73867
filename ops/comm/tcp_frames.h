// The TCP mesh's wire format (ops/comm/tcp_communicator.h): the frame every message travels
// in, the greeting that opens a connection, and the posted operations and early messages the
// data path matches frames against. Internal to ops/comm/tcp_*.
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <list>
#include <memory>
#include <string>
#include <vector>

namespace gradcomp {
namespace tcp {

using Clock = std::chrono::steady_clock;

// Frames: a header, then `bytes` bytes of payload. Contexts separate communicators (and, in
// each, point-to-point from collective traffic); the abort context carries a failure's text.
struct Header {
  uint32_t context;
  int32_t tag;
  uint64_t bytes;
};
static_assert(sizeof(Header) == 16, "the frame header is 16 bytes on the wire");
constexpr uint32_t kAbortContext = 0xffffffffu;
constexpr size_t kMaxAbortText = 4096;

// The first bytes each side of a new connection sends.
struct Hello {
  uint64_t magic;
  uint64_t token;  // the job's, drawn by rank 0
  int32_t rank;    // the sender's
  int32_t size;
  int32_t to;      // the rank the sender means to reach
  int32_t unused;
};
constexpr uint64_t kHelloMagic = 0x3130307063746367ull;  // "gctcp001"

inline std::string ErrnoText(int err) { return std::string(std::strerror(err)); }

// A posted send or receive.
struct Op {
  bool send = false;
  int peer = 0;  // world rank
  uint32_t context = 0;
  int tag = 0;
  char* data = nullptr;
  size_t bytes = 0;
  Header header{};  // sends: the frame's header
  size_t done = 0;  // sends: header and payload bytes written
  bool complete = false;
};
using OpPtr = std::shared_ptr<Op>;

// A message that arrived before a receive asked for it.
struct Unexpected {
  uint32_t context = 0;
  int tag = 0;
  std::vector<char> data;
  bool complete = false;
  OpPtr claimed;  // a receive posted while it was still arriving
};

// What is left to write of a send's frame (header, then payload) after op.done bytes: one or
// two pieces into iov, their number returned.
int FrameRest(Op& op, iovec iov[2]);

// Writes what a nonblocking socket takes of `iov`, dropping the written bytes from it; sets
// *gone when the connection failed (the peer closed or reset it).
void WriteSome(int fd, std::vector<iovec>* iov, bool* gone);

}  // namespace tcp
}  // namespace gradcomp
