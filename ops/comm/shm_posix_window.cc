#include "ops/comm/shm_posix_window.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>
#include <string>
#include <utility>

#include "ops/common/enforce.h"

namespace gradcomp {

namespace {

constexpr size_t kPage = 4096;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// One mapping of `ranks` segments of `stride` bytes each.
class PosixSegments final : public SharedSegments {
 public:
  PosixSegments(char* base, size_t bytes, size_t stride) : base_(base), bytes_(bytes), stride_(stride) {}
  ~PosixSegments() override { ::munmap(base_, bytes_); }
  char* segment(int r) const override { return base_ + static_cast<size_t>(r) * stride_; }
  void Fence() override { std::atomic_thread_fence(std::memory_order_seq_cst); }

 private:
  char* base_;
  size_t bytes_;
  size_t stride_;
};

std::string RandomName() {
  std::random_device device;
  char name[64];
  std::snprintf(name, sizeof name, "/gradcomp-%d-%08x%08x", static_cast<int>(::getpid()), device(), device());
  return name;
}

// Rank 0's part: creates the object, reserves its pages (so that a /dev/shm too small for it
// fails here, by name, instead of killing a rank with SIGBUS at its first write), maps it.
// Returns "" or why not.
std::string Create(const std::string& name, size_t bytes, char** base) {
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return "shm_open(" + name + ") failed: " + std::strerror(errno);
  std::string error;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    error = "ftruncate of " + name + " failed: " + std::strerror(errno);
  } else if (const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); rc != 0) {
    error = "cannot reserve " + std::to_string(bytes >> 20) + " MB of shared memory in /dev/shm (" +
            std::strerror(rc) + "): make /dev/shm larger (docker run --shm-size, a Kubernetes emptyDir with medium: "
            "Memory) or the staging smaller (GRADCOMP_SHM_BUFFER_MB)";
  } else {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      error = "mmap of " + name + " failed: " + std::strerror(errno);
    } else {
      *base = static_cast<char*>(p);
    }
  }
  ::close(fd);
  if (!error.empty()) ::shm_unlink(name.c_str());
  return error;
}

std::string Open(const std::string& name, size_t bytes, char** base) {
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) return "shm_open(" + name + ") failed: " + std::strerror(errno) + " (is this rank on the host of "
                     "its node's rank 0?)";
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int mmap_errno = errno;
  ::close(fd);
  if (p == MAP_FAILED) return "mmap of " + name + " failed: " + std::strerror(mmap_errno);
  *base = static_cast<char*>(p);
  return "";
}

// Rank 0's text broadcast to the node (its length first).
std::string BroadcastText(Communicator& node, std::string text) {
  uint64_t len = text.size();
  node.Broadcast(&len, sizeof len, 0);
  text.resize(len);
  if (len > 0) node.Broadcast(text.data(), len, 0);
  return text;
}

}  // namespace

std::unique_ptr<Communicator> MakePosixShmCommunicator(std::unique_ptr<Communicator> node, size_t staging_bytes) {
  const size_t stride = RoundUp(ShmCommunicator::SegmentBytes(staging_bytes), kPage);
  const size_t bytes = stride * static_cast<size_t>(node->size());
  char* base = nullptr;
  std::string name, error;
  if (node->rank() == 0) {
    name = RandomName();
    error = Create(name, bytes, &base);
  }
  error = BroadcastText(*node, error);
  if (!error.empty()) {
    throw Error("the node's shared memory (local rank 0 of " + std::to_string(node->size()) + "): " + error);
  }
  name = BroadcastText(*node, name);
  if (node->rank() != 0) error = Open(name, bytes, &base);
  // Every rank learns whether every rank mapped it; then nobody needs the name any more.
  int ok = error.empty() ? 1 : 0;
  node->Allreduce(&ok, &ok, 1, DataType::kInt32, ReduceOp::kMin);
  if (node->rank() == 0) ::shm_unlink(name.c_str());
  if (!ok) {
    if (base != nullptr) ::munmap(base, bytes);
    const std::vector<std::string> reasons = AllgatherStrings(*node, error);
    std::string text = "the node's shared memory:";
    for (size_t r = 0; r < reasons.size(); ++r) {
      if (!reasons[r].empty()) text += " local rank " + std::to_string(r) + ": " + reasons[r] + ";";
    }
    throw Error(text);
  }
  auto segments = std::make_unique<PosixSegments>(base, bytes, stride);
  return std::make_unique<ShmCommunicator>(std::move(node), std::move(segments), staging_bytes);
}

}  // namespace gradcomp
