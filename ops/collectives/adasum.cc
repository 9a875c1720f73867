#include "ops/collectives/adasum.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "ops/collectives/context.h"
#include "ops/common/half.h"
#include "ops/reduce/reduce.h"

namespace gradcomp {

namespace {

constexpr int kAdasumDataTag = 0x5600, kAdasumDotTag = 0x5601;

// Element access per dtype: the stored type, the type the combination is computed in, and the
// conversions (16-bit floats widen to float32 and round back to nearest even).
struct F16 {
  using Stored = uint16_t;
  using Compute = float;
  static float Get(uint16_t v) { return HalfBitsToFloat(v); }
  static uint16_t Put(float v) { return FloatToHalfBits(v); }
};
struct BF16 {
  using Stored = uint16_t;
  using Compute = float;
  static float Get(uint16_t v) { return BFloat16BitsToFloat(v); }
  static uint16_t Put(float v) { return FloatToBFloat16Bits(v); }
};
struct F32 {
  using Stored = float;
  using Compute = double;
  static double Get(float v) { return v; }
  static float Put(double v) { return static_cast<float>(v); }
};
struct F64 {
  using Stored = double;
  using Compute = double;
  static double Get(double v) { return v; }
  static double Put(double v) { return v; }
};

// out[0] += a.b, out[1] += a.a, out[2] += b.b over n elements, in float64.
template <typename E>
void Dots(const void* a_bytes, const void* b_bytes, size_t n, double* out) {
  const auto* a = static_cast<const typename E::Stored*>(a_bytes);
  const auto* b = static_cast<const typename E::Stored*>(b_bytes);
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(E::Get(a[i])), y = static_cast<double>(E::Get(b[i]));
    ab += x * y;
    aa += x * x;
    bb += y * y;
  }
  out[0] += ab;
  out[1] += aa;
  out[2] += bb;
}

// a[i] = ca * a[i] + cb * b[i] over n elements.
template <typename E>
void Combine(void* a_bytes, const void* b_bytes, size_t n, double ca, double cb) {
  auto* a = static_cast<typename E::Stored*>(a_bytes);
  const auto* b = static_cast<const typename E::Stored*>(b_bytes);
  using C = typename E::Compute;
  const C x = static_cast<C>(ca), y = static_cast<C>(cb);
  for (size_t i = 0; i < n; ++i) a[i] = E::Put(x * static_cast<C>(E::Get(a[i])) + y * static_cast<C>(E::Get(b[i])));
}

struct Kernels {
  void (*dots)(const void*, const void*, size_t, double*);
  void (*combine)(void*, const void*, size_t, double, double);
};

Kernels KernelsFor(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat16: return {&Dots<F16>, &Combine<F16>};
    case DataType::kBFloat16: return {&Dots<BF16>, &Combine<BF16>};
    case DataType::kFloat32: return {&Dots<F32>, &Combine<F32>};
    case DataType::kFloat64: return {&Dots<F64>, &Combine<F64>};
    default: break;
  }
  throw InvalidArgument(std::string("op adasum needs floating-point tensors (float16, bfloat16, float32, float64), "
                                    "got ") + DataTypeName(dtype));
}

// The coefficient of a vector of squared norm `normsq` whose dot product with the other is `dot`.
double Coefficient(double dot, double normsq) { return normsq > 0 ? 1.0 - dot / (2.0 * normsq) : 1.0; }

struct Range {
  size_t lo = 0, hi = 0;
  size_t size() const { return hi - lo; }
};

// Per tensor (its elements [offsets[t], offsets[t] + counts[t]) of the fused buffer), the part
// of `r` it covers, as `visit(t, begin, count)`.
template <typename Visit>
void ForEachPart(const std::vector<size_t>& counts, const std::vector<size_t>& offsets, Range r, Visit&& visit) {
  for (size_t t = 0; t < counts.size(); ++t) {
    const size_t begin = std::max(offsets[t], r.lo), end = std::min(offsets[t] + counts[t], r.hi);
    if (begin < end) visit(t, begin, end - begin);
  }
}

// Where a rank's values sit in the fused vector, and which ranks hold the rest of each tensor.
struct Layout {
  std::vector<size_t> counts, offsets;  // the tensors of the whole fused vector
  size_t base = 0;                      // the fused index of this rank's first value
  Communicator* shards = nullptr;       // the ranks holding the vector's other shards (a node), or null
};

Layout WholeVectors(const std::vector<size_t>& counts) { return Layout{counts, Offsets(counts), 0, nullptr}; }

// Sums `values` over the block of `block` ranks (a power of two) that holds rank `rank`:
// recursive doubling, so every rank of the block adds the same two halves (commutatively) and
// gets the same bits.
void BlockSum(Communicator& comm, std::vector<double>& values, int block) {
  std::vector<double> theirs(values.size());
  const size_t bytes = values.size() * sizeof(double);
  for (int k = 1; k < block; k <<= 1) {
    const int peer = comm.rank() ^ k;
    comm.SendRecv(values.data(), bytes, peer, theirs.data(), bytes, peer, kAdasumDotTag);
    for (size_t i = 0; i < values.size(); ++i) values[i] += theirs[i];
  }
}

// Adds the shards' values in their rank order, so every rank of them gets the same bits (they
// all hold the same block sums, node after node).
void SumOverShards(const Layout& l, std::vector<double>& values) {
  if (l.shards == nullptr || l.shards->size() == 1) return;
  const size_t n = values.size(), shards = static_cast<size_t>(l.shards->size());
  std::vector<double> all(n * shards);
  l.shards->Allgatherv(values.data(), all.data(), std::vector<size_t>(shards, n * sizeof(double)));
  std::fill(values.begin(), values.end(), 0.0);
  for (size_t s = 0; s < shards; ++s) {
    for (size_t i = 0; i < n; ++i) values[i] += all[s * n + i];
  }
}

// Per tensor t: sums[3t] = a.b, sums[3t+1] = |a|^2, sums[3t+2] = |b|^2 over this rank's `part`
// (indices into its own values a and b), before the other ranks' parts are added.
void PartDots(const Layout& l, Range part, const char* a, const char* b, const Kernels& k, size_t esize,
              std::vector<double>& sums) {
  std::fill(sums.begin(), sums.end(), 0.0);
  const Range fused{l.base + part.lo, l.base + part.hi};
  ForEachPart(l.counts, l.offsets, fused, [&](size_t t, size_t begin, size_t count) {
    const size_t at = (begin - l.base) * esize;
    k.dots(a + at, b + at, count, &sums[3 * t]);
  });
}

// data = its tensors' (+) with `other` on `part`, each tensor's coefficients from the whole
// vectors' `sums` (as PartDots orders them: data is a when data_is_a).
void CombinePart(const Layout& l, Range part, char* data, const char* other, bool data_is_a,
                 const std::vector<double>& sums, const Kernels& k, size_t esize) {
  const Range fused{l.base + part.lo, l.base + part.hi};
  ForEachPart(l.counts, l.offsets, fused, [&](size_t t, size_t begin, size_t count) {
    const double dot = sums[3 * t], ca = Coefficient(dot, sums[3 * t + 1]), cb = Coefficient(dot, sums[3 * t + 2]);
    const size_t at = (begin - l.base) * esize;
    k.combine(data + at, other + at, count, data_is_a ? ca : cb, data_is_a ? cb : ca);
  });
}

// data = data (+) other, whole vectors (or this rank's shard of them, its n values).
void CombineWhole(const Layout& l, char* data, const char* other, size_t n, const Kernels& k, size_t esize) {
  std::vector<double> sums(3 * l.counts.size());
  PartDots(l, Range{0, n}, data, other, k, esize, sums);
  SumOverShards(l, sums);
  CombinePart(l, Range{0, n}, data, other, true, sums, k, esize);
}

// The tree among the first p ranks of `comm` (p a power of two) on this rank's n values `data`,
// `recv` as large.
void VectorHalvingDistanceDoubling(Communicator& comm, int p, char* data, char* recv, size_t n, const Layout& l,
                                   const Kernels& k, size_t esize) {
  const int rank = comm.rank();
  std::vector<Range> held;  // the range before each level's split
  Range mine{0, n};
  std::vector<double> sums(3 * l.counts.size());
  for (int d = 1; d < p; d <<= 1) {
    const int peer = rank ^ d;
    const bool left = (rank & d) == 0;  // holds the lower subtree's vector ("a")
    const size_t mid = mine.lo + mine.size() / 2;
    const Range keep = left ? Range{mine.lo, mid} : Range{mid, mine.hi};
    const Range give = left ? Range{mid, mine.hi} : Range{mine.lo, mid};
    comm.SendRecv(data + give.lo * esize, give.size() * esize, peer, recv + keep.lo * esize, keep.size() * esize,
                  peer, kAdasumDataTag);
    held.push_back(mine);
    mine = keep;
    // Per tensor: a.b, |a|^2, |b|^2 of the whole vectors, summed over the 2d ranks holding them
    // (and over the shards of each).
    PartDots(l, mine, left ? data : recv, left ? recv : data, k, esize, sums);
    BlockSum(comm, sums, 2 * d);
    SumOverShards(l, sums);
    CombinePart(l, mine, data, recv, left, sums, k, esize);
  }
  for (int d = p / 2; d >= 1; d >>= 1) {  // gather the ranges back, the last split first
    const int peer = rank ^ d;
    const Range whole = held.back();
    held.pop_back();
    const Range theirs = (rank & d) == 0 ? Range{mine.hi, whole.hi} : Range{whole.lo, mine.lo};
    comm.SendRecv(data + mine.lo * esize, mine.size() * esize, peer, data + theirs.lo * esize, theirs.size() * esize,
                  peer, kAdasumDataTag);
    mine = whole;
  }
}

// The whole tree over `comm`: the ranks beyond the largest power of two p fold into rank - p,
// which sends the result back.
void Tree(Communicator& comm, char* data, char* recv, size_t n, const Layout& l, const Kernels& k, size_t esize) {
  const size_t bytes = n * esize;
  const int size = comm.size(), rank = comm.rank();
  int p = 1;
  while (2 * p <= size) p *= 2;
  if (rank >= p) {
    comm.Send(data, bytes, rank - p, kAdasumDataTag);
    comm.Recv(data, bytes, rank - p, kAdasumDataTag);
    return;
  }
  const bool folds = rank + p < size;
  if (folds) {
    comm.Recv(recv, bytes, rank + p, kAdasumDataTag);
    CombineWhole(l, data, recv, n, k, esize);
  }
  VectorHalvingDistanceDoubling(comm, p, data, recv, n, l, k, esize);
  if (folds) comm.Send(data, bytes, rank + p, kAdasumDataTag);
}

std::vector<size_t> CountsOf(const std::vector<BufferPiece>& pieces) {
  std::vector<size_t> counts;
  counts.reserve(pieces.size());
  for (const BufferPiece& piece : pieces) counts.push_back(piece.count);
  return counts;
}

FinishFn Postscale(const AllreduceOptions& o) {
  if (o.postscale == 1.0) return nullptr;
  return [&o](void* out, size_t count) { ScaleInPlace(out, count, o.dtype, o.postscale); };
}

}  // namespace

void AdasumCombine(void* a, const void* b, const std::vector<size_t>& counts, DataType dtype) {
  size_t n = 0;
  for (size_t count : counts) n += count;
  CombineWhole(WholeVectors(counts), static_cast<char*>(a), static_cast<const char*>(b), n, KernelsFor(dtype),
               DataTypeSize(dtype));
}

void AdasumAllreduce(Communicator& comm, const std::vector<BufferPiece>& pieces, const AllreduceOptions& o,
                     std::vector<char>& scratch) {
  WithTensorContext("adasum allreduce", o.name, [&] {
    const Kernels k = KernelsFor(o.dtype);
    const size_t esize = DataTypeSize(o.dtype);
    const size_t n = FusePieces(pieces, o.dtype, o.prescale, scratch);
    if (n == 0) return;
    if (scratch.size() < 2 * n * esize) scratch.resize(2 * n * esize);
    Tree(comm, scratch.data(), scratch.data() + n * esize, n, WholeVectors(CountsOf(pieces)), k, esize);
    UnfusePieces(pieces, o.dtype, scratch.data(), Postscale(o));
  });
}

void NodeAdasumAllreduce(const Topology& topo, const std::vector<BufferPiece>& pieces, const AllreduceOptions& o,
                         std::vector<char>& scratch) {
  WithTensorContext("adasum allreduce of node averages", o.name, [&] {
    const Kernels k = KernelsFor(o.dtype);
    const size_t esize = DataTypeSize(o.dtype);
    Communicator& local = *topo.local;
    // The node's average is summed from values already divided by its size.
    const size_t n = FusePieces(pieces, o.dtype, o.prescale / local.size(), scratch);
    if (n == 0) return;
    Layout l = WholeVectors(CountsOf(pieces));
    if (!topo.homogeneous) {  // the average on every rank of the node, its first rank's tree across nodes
      if (scratch.size() < 2 * n * esize) scratch.resize(2 * n * esize);
      char* data = scratch.data();
      local.Allreduce(data, data, n, o.dtype, ReduceOp::kSum);
      if (local.rank() == 0) Tree(*topo.cross, data, data + n * esize, n, l, k, esize);
      local.Broadcast(data, n * esize, 0);
    } else {  // each rank of a node: its shard of the node's sum, the tree across nodes on it
      const std::vector<size_t> shard_counts = EvenSplit(n, local.size());
      const size_t mine = shard_counts[static_cast<size_t>(local.rank())];
      l.base = Offsets(shard_counts)[static_cast<size_t>(local.rank())];
      l.shards = &local;
      if (scratch.size() < (n + 2 * mine) * esize) scratch.resize((n + 2 * mine) * esize);
      char* data = scratch.data();
      char* shard = data + n * esize;
      local.ReduceScatter(data, shard, shard_counts, o.dtype, ReduceOp::kSum);
      Tree(*topo.cross, shard, shard + mine * esize, mine, l, k, esize);
      std::vector<size_t> bytes(shard_counts.size());
      for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = shard_counts[i] * esize;
      local.Allgatherv(shard, data, bytes);
    }
    UnfusePieces(pieces, o.dtype, scratch.data(), Postscale(o));
  });
}

}  // namespace gradcomp
