#include "ops/comm/tcp_frames.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

namespace gradcomp {
namespace tcp {

int FrameRest(Op& op, iovec iov[2]) {
  if (op.done >= sizeof(Header)) {
    iov[0] = {op.data + (op.done - sizeof(Header)), sizeof(Header) + op.bytes - op.done};
    return 1;
  }
  iov[0] = {reinterpret_cast<char*>(&op.header) + op.done, sizeof(Header) - op.done};
  iov[1] = {op.data, op.bytes};
  return op.bytes > 0 ? 2 : 1;
}

void WriteSome(int fd, std::vector<iovec>* iov, bool* gone) {
  while (!iov->empty()) {
    msghdr msg{};
    msg.msg_iov = iov->data();
    msg.msg_iovlen = iov->size();
    const ssize_t wrote = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (wrote < 0) {
      if (errno == EINTR) continue;
      *gone = errno != EAGAIN && errno != EWOULDBLOCK;
      return;
    }
    for (size_t left = static_cast<size_t>(wrote); !iov->empty() && (left > 0 || iov->front().iov_len == 0);) {
      iovec& first = iov->front();
      const size_t step = std::min(left, first.iov_len);
      first.iov_base = static_cast<char*>(first.iov_base) + step;
      first.iov_len -= step;
      left -= step;
      if (first.iov_len == 0) iov->erase(iov->begin());
    }
    if (wrote == 0) return;
  }
}

}  // namespace tcp
}  // namespace gradcomp
