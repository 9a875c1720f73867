#include "ops/comm/shm_communicator.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "ops/common/enforce.h"
#include "ops/reduce/reduce.h"

namespace gradcomp {

namespace {
size_t CeilDiv(size_t a, size_t b) { return (a + b - 1) / b; }
size_t MaxOf(const std::vector<size_t>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }
// Elements of round `round` (slab elements per round) within a slice of `count` elements.
size_t SlabLength(size_t count, size_t slab, size_t round) {
  const size_t start = round * slab;
  return start >= count ? 0 : std::min(slab, count - start);
}

// The concatenation of pieces, addressed by element index.
class PieceRange {
 public:
  explicit PieceRange(const std::vector<BufferPiece>& pieces) : pieces_(pieces), starts_(pieces.size()) {
    for (size_t i = 0; i < pieces.size(); ++i) {
      starts_[i] = total_;
      total_ += pieces[i].count;
    }
  }
  size_t total() const { return total_; }
  // Calls fn(piece, first element in the piece, elements, elements done before) for each
  // part of the concatenation's elements [begin, begin + len).
  template <typename Fn>
  void ForEach(size_t begin, size_t len, Fn&& fn) const {
    if (len == 0) return;
    size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), begin) - starts_.begin()) - 1;
    for (size_t done = 0; done < len; ++i) {
      const size_t at = begin + done - starts_[i];
      const size_t n = std::min(pieces_[i].count - at, len - done);
      if (n > 0) fn(pieces_[i], at, n, done);
      done += n;
    }
  }

 private:
  const std::vector<BufferPiece>& pieces_;
  std::vector<size_t> starts_;
  size_t total_ = 0;
};
}  // namespace

ShmCommunicator::ShmCommunicator(std::unique_ptr<Communicator> messages, std::unique_ptr<SharedSegments> segments,
                                 size_t staging_bytes)
    : messages_(std::move(messages)), shared_(std::move(segments)), rank_(messages_->rank()),
      staging_bytes_(staging_bytes) {
  GC_ENFORCE(staging_bytes_ >= 64, "shared-memory staging area too small: ", staging_bytes_);
  segments_.resize(static_cast<size_t>(size()));
  for (int r = 0; r < size(); ++r) segments_[static_cast<size_t>(r)] = shared_->segment(r);
  // Every segment: the two staging areas, then (rank 0's is used) the barrier's state, on a
  // cache line of its own (segments start anywhere: the line is found from the address, the
  // same in every process since mappings start on page boundaries).
  const uintptr_t after_staging = reinterpret_cast<uintptr_t>(segments_[0] + 2 * staging_bytes_);
  char* barrier_state = reinterpret_cast<char*>(CeilDiv(after_staging, ShmBarrier::kBytes) * ShmBarrier::kBytes);
  if (rank_ == 0) ShmBarrier::Reset(barrier_state);
  shared_->Fence();
  messages_->Barrier();  // the state is zeroed before any rank waits on it
  barrier_ = std::make_unique<ShmBarrier>(barrier_state, size());
}

ShmCommunicator::~ShmCommunicator() { shared_.reset(); }

void ShmCommunicator::Sync() {
  shared_->Fence();
  barrier_->Wait();
  shared_->Fence();
}

void ShmCommunicator::ReduceRound(const char* in, const std::vector<size_t>& counts,
                                  const std::vector<size_t>& offsets, size_t slab, size_t round,
                                  DataType dtype, ReduceOp op, char* dst) {
  const size_t esize = DataTypeSize(dtype);
  // Stage slab `round` of every rank's slice, slice s at s * slab elements.
  char* stage = Stage(rank_);
  for (size_t s = 0; s < counts.size(); ++s) {
    const size_t len = SlabLength(counts[s], slab, round);
    if (len > 0) std::memcpy(stage + s * slab * esize, in + (offsets[s] + round * slab) * esize, len * esize);
  }
  Sync();
  const size_t me = static_cast<size_t>(rank_);
  const size_t len = SlabLength(counts[me], slab, round);
  std::vector<const void*> sources(segments_.begin(), segments_.end());
  ReduceMany(dst, sources, me * slab * esize, len, dtype, op);
}

void ShmCommunicator::ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype,
                                    ReduceOp op) {
  GC_ENFORCE(counts.size() == static_cast<size_t>(size()), "reducescatter needs one count per rank");
  const size_t esize = DataTypeSize(dtype);
  const size_t slab = std::max<size_t>(1, staging_bytes_ / (esize * counts.size()));
  const std::vector<size_t> offsets = Offsets(counts);
  const size_t rounds = CeilDiv(MaxOf(counts), slab);
  char* dst = static_cast<char*>(out);
  for (size_t k = 0; k < rounds; ++k) {
    ReduceRound(static_cast<const char*>(in), counts, offsets, slab, k, dtype, op, dst + k * slab * esize);
    Sync();  // staging areas are free again
  }
}

void ShmCommunicator::Allreduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op) {
  StagedAllreduce({BufferPiece{in, out, count}}, dtype, op, 1.0, nullptr);
}

void ShmCommunicator::AllreducePieces(const std::vector<BufferPiece>& pieces, DataType dtype, ReduceOp op,
                                      double prescale, const FinishFn& finish, std::vector<char>& fusion) {
  size_t total = 0;
  for (const BufferPiece& p : pieces) total += p.count;
  if (total * DataTypeSize(dtype) < kMinStagedBytes) {
    messages_->AllreducePieces(pieces, dtype, op, prescale, finish, fusion);
    return;
  }
  StagedAllreduce(pieces, dtype, op, prescale, finish);
}

void ShmCommunicator::StagedAllreduce(const std::vector<BufferPiece>& pieces, DataType dtype, ReduceOp op,
                                      double prescale, const FinishFn& finish) {
  const size_t esize = DataTypeSize(dtype);
  const PieceRange range(pieces);
  const std::vector<size_t> counts = EvenSplit(range.total(), size());
  const std::vector<size_t> offsets = Offsets(counts);
  const size_t slab = std::max<size_t>(1, staging_bytes_ / (esize * counts.size()));
  const size_t rounds = CeilDiv(MaxOf(counts), slab);
  const size_t me = static_cast<size_t>(rank_);
  // My own slice is read from the inputs where they lie, unless they must be scaled or a
  // piece has no input (zeros): then it is staged like the others.
  bool read_own_inputs = prescale == 1.0;
  range.ForEach(offsets[me], counts[me], [&](const BufferPiece& p, size_t, size_t, size_t) {
    read_own_inputs = read_own_inputs && p.input != nullptr;
  });
  std::vector<const void*> sources(segments_.size());
  for (size_t k = 0; k < rounds; ++k) {
    char* stage = Stage(rank_);
    for (size_t s = 0; s < counts.size(); ++s) {
      if (s == me && read_own_inputs) continue;
      char* dst = stage + s * slab * esize;
      range.ForEach(offsets[s] + k * slab, SlabLength(counts[s], slab, k),
                    [&](const BufferPiece& p, size_t at, size_t n, size_t done) {
                      if (p.input == nullptr) {
                        std::memset(dst + done * esize, 0, n * esize);
                      } else {
                        ScaleCopy(dst + done * esize, static_cast<const char*>(p.input) + at * esize, n, dtype,
                                  prescale);
                      }
                    });
    }
    Sync();  // every rank's slabs are staged
    // Reduce my slab in rank order (the same bits whichever rank computes a slice), in blocks
    // that stay in cache while they are finished and copied to my own outputs.
    char* result = Result(rank_);
    range.ForEach(offsets[me] + k * slab, SlabLength(counts[me], slab, k),
                  [&](const BufferPiece& p, size_t at, size_t n, size_t done) {
                    for (size_t b = 0; b < n; b += kBlockElements) {
                      const size_t len = std::min(kBlockElements, n - b);
                      const size_t in_slab = (me * slab + done + b) * esize;
                      for (size_t r = 0; r < sources.size(); ++r) sources[r] = segments_[r] + in_slab;
                      if (read_own_inputs) sources[me] = static_cast<const char*>(p.input) + (at + b) * esize;
                      char* dst = result + (done + b) * esize;
                      ReduceMany(dst, sources, 0, len, dtype, op);
                      if (finish) finish(dst, len);
                      if (p.output != nullptr) std::memcpy(static_cast<char*>(p.output) + (at + b) * esize, dst, len * esize);
                    }
                  });
    Sync();  // every reduced slab is ready; every staged input was read
    for (size_t r = 0; r < counts.size(); ++r) {
      if (r == me) continue;
      const char* src = Result(static_cast<int>(r));
      range.ForEach(offsets[r] + k * slab, SlabLength(counts[r], slab, k),
                    [&](const BufferPiece& p, size_t at, size_t n, size_t done) {
                      if (p.output != nullptr) {
                        std::memcpy(static_cast<char*>(p.output) + at * esize, src + done * esize, n * esize);
                      }
                    });
    }
    // No barrier here: a rank writes result areas again only after the next round's (or
    // the next allreduce's) first Sync, which every rank reaches after its copies out, and
    // no other collective writes them.
  }
}

void ShmCommunicator::Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) {
  GC_ENFORCE(bytes.size() == static_cast<size_t>(size()), "allgather needs one size per rank");
  const std::vector<size_t> offsets = Offsets(bytes);
  const size_t me = static_cast<size_t>(rank_);
  const size_t rounds = CeilDiv(MaxOf(bytes), staging_bytes_);
  for (size_t k = 0; k < rounds; ++k) {
    const size_t mine = SlabLength(bytes[me], staging_bytes_, k);
    if (mine > 0) std::memcpy(Stage(rank_), static_cast<const char*>(in) + k * staging_bytes_, mine);
    Sync();
    for (int r = 0; r < size(); ++r) {
      const size_t len = SlabLength(bytes[static_cast<size_t>(r)], staging_bytes_, k);
      char* dst = static_cast<char*>(out) + offsets[static_cast<size_t>(r)] + k * staging_bytes_;
      if (len > 0) std::memcpy(dst, Stage(r), len);
    }
    Sync();
  }
}

void ShmCommunicator::Broadcast(void* data, size_t bytes, int root) {
  GC_ENFORCE(root >= 0 && root < size(), "broadcast root ", root, " outside 0..", size() - 1);
  const size_t rounds = CeilDiv(bytes, staging_bytes_);
  for (size_t k = 0; k < rounds; ++k) {
    const size_t len = SlabLength(bytes, staging_bytes_, k);
    char* chunk = static_cast<char*>(data) + k * staging_bytes_;
    if (rank_ == root) std::memcpy(Stage(root), chunk, len);
    Sync();
    if (rank_ != root) std::memcpy(chunk, Stage(root), len);
    Sync();
  }
}

}  // namespace gradcomp
