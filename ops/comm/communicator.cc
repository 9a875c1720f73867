#include "ops/comm/communicator.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "ops/common/enforce.h"
#include "ops/common/simulation.h"
#include "ops/reduce/reduce.h"

namespace gradcomp {

std::vector<std::string> AllgatherStrings(Communicator& comm, const std::string& mine) {
  const size_t n = static_cast<size_t>(comm.size());
  std::vector<uint64_t> lens(n);
  const uint64_t my_len = mine.size();
  comm.Allgatherv(&my_len, lens.data(), std::vector<size_t>(n, sizeof(uint64_t)));
  const std::vector<size_t> bytes(lens.begin(), lens.end());
  const std::vector<size_t> offsets = Offsets(bytes);
  std::string all(offsets.back() + bytes.back(), '\0');
  comm.Allgatherv(mine.data(), all.data(), bytes);
  std::vector<std::string> out;
  for (size_t r = 0; r < n; ++r) out.push_back(all.substr(offsets[r], bytes[r]));
  return out;
}

std::unique_ptr<PendingTransfer> Communicator::Isend(const void*, size_t, int, int) {
  throw InvalidArgument(std::string("the ") + kind() + " communicator has no nonblocking send");
}

std::unique_ptr<PendingTransfer> Communicator::Irecv(void*, size_t, int, int) {
  throw InvalidArgument(std::string("the ") + kind() + " communicator has no nonblocking receive");
}

namespace {
class CompletedTransfer final : public PendingTransfer {
 public:
  bool Test() override { return true; }
};
}  // namespace

std::unique_ptr<PendingTransfer> Communicator::Iallreduce(const void* in, void* out, size_t count, DataType dtype,
                                                          ReduceOp op) {
  Allreduce(in, out, count, dtype, op);
  return std::make_unique<CompletedTransfer>();
}

void Communicator::WaitForProgress(double seconds, int) { sim::Sleep(seconds); }

Poller::Poller(Communicator* comm, int wake_fd) : comm_(comm), wake_fd_(wake_fd), since_(sim::Now()) {}

void Poller::Pause(bool progressed) {
  // Short waits (shared memory, peers already there) finish within the spin phase at full
  // speed. Longer ones (a slow link, a late peer) nap between polls, a tenth of the time waited
  // since the last progress (50 us to 500 us): each poll costs the transport's progress call
  // (over TCP a poll() of every socket; a perf profile of the polling thread is mostly that and
  // the naps' context switches), and the kernel's socket buffers absorb a 500 us pause of a
  // 25 Gbit/s stream, while ending the wait at most ~10% late. A longer spin cost more CPU and
  // bought no latency. Counting from the last progress rather than from the start matters to
  // long exchanges of many steps (the striped SRA), whose later steps were noticed late
  // (docs/benchmarks.md, "Waiting: a short spin, then naps"). Under SMPI (ops/common/simulation.h)
  // the clock and the naps are the simulation's, and a spinning poll advances it by 1 us (SMPI
  // drops shorter CPU bursts).
  //
  // A transport that wakes its waiters (TCP: poll() on its sockets and the pipeline's eventfd)
  // needs no timer: the wait lasts until an event, and the cap only bounds what a missed one
  // could cost. The training thread then loses its core only when there is work.
  constexpr double kSpin = 20e-6, kMinNap = 50e-6, kMaxNap = 500e-6, kEventWaitCap = 20e-3;
  const double now = sim::Now();
  if (progressed) since_ = now;
  const double waited = now - since_;
  if (waited > kSpin) {
    const bool events = comm_ != nullptr && comm_->wakes_waiters();
    const double nap = events ? kEventWaitCap : std::min(kMaxNap, std::max(kMinNap, waited / 10));
    if (comm_ != nullptr) {
      comm_->WaitForProgress(nap, wake_fd_);
    } else {
      sim::Sleep(nap);
    }
  } else if (sim::kSimulated) {
    sim::Sleep(1e-6);
  }
}

void PollUntil(const std::function<bool()>& done, Communicator* comm) {
  Poller poller(comm);
  while (!done()) poller.Pause(false);
}

size_t FusePieces(const std::vector<BufferPiece>& pieces, DataType dtype, double prescale, std::vector<char>& fusion) {
  const size_t esize = DataTypeSize(dtype);
  size_t total = 0;
  for (const BufferPiece& p : pieces) total += p.count;
  if (fusion.size() < total * esize) fusion.resize(total * esize);
  char* cursor = fusion.data();
  for (const BufferPiece& p : pieces) {
    if (p.count == 0) continue;  // an empty tensor: nothing to copy (and maybe no buffer yet)
    if (p.input == nullptr) {
      std::memset(cursor, 0, p.count * esize);
    } else {
      ScaleCopy(cursor, p.input, p.count, dtype, prescale);
    }
    cursor += p.count * esize;
  }
  return total;
}

void UnfusePieces(const std::vector<BufferPiece>& pieces, DataType dtype, const void* fused, const FinishFn& finish) {
  const size_t esize = DataTypeSize(dtype);
  const char* cursor = static_cast<const char*>(fused);
  for (const BufferPiece& p : pieces) {
    // Piece by piece, so `finish` runs on data still in cache.
    if (p.output != nullptr && p.count > 0) {
      std::memcpy(p.output, cursor, p.count * esize);
      if (finish) finish(p.output, p.count);
    }
    cursor += p.count * esize;
  }
}

void Communicator::AllreducePieces(const std::vector<BufferPiece>& pieces, DataType dtype, ReduceOp op,
                                   double prescale, const FinishFn& finish, std::vector<char>& fusion) {
  if (pieces.size() == 1 && pieces[0].input != nullptr && pieces[0].output != nullptr) {
    const BufferPiece& p = pieces[0];
    if (p.count == 0) return;
    const void* src = p.input;
    if (prescale != 1.0) {
      ScaleCopy(p.output, p.input, p.count, dtype, prescale);
      src = p.output;
    }
    Allreduce(src, p.output, p.count, dtype, op);
    if (finish) finish(p.output, p.count);
    return;
  }
  const size_t total = FusePieces(pieces, dtype, prescale, fusion);
  if (total == 0) return;
  Allreduce(fusion.data(), fusion.data(), total, dtype, op);
  UnfusePieces(pieces, dtype, fusion.data(), finish);
}

std::vector<size_t> EvenSplit(size_t count, int parts) {
  GC_ENFORCE(parts > 0, "EvenSplit needs at least one part, got ", parts);
  std::vector<size_t> sizes(static_cast<size_t>(parts), count / static_cast<size_t>(parts));
  const size_t rest = count % static_cast<size_t>(parts);
  for (size_t i = 0; i < rest; ++i) sizes[i] += 1;
  return sizes;
}

std::vector<size_t> Offsets(const std::vector<size_t>& sizes) {
  std::vector<size_t> offsets(sizes.size(), 0);
  size_t running = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    offsets[i] = running;
    running += sizes[i];
  }
  return offsets;
}

}  // namespace gradcomp
