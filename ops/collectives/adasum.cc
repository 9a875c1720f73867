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

// The tree among the first p ranks (p a power of two) on `data` (n elements), `recv` as large.
void VectorHalvingDistanceDoubling(Communicator& comm, int p, char* data, char* recv, size_t n,
                                   const std::vector<size_t>& counts, const Kernels& k, size_t esize) {
  const int rank = comm.rank();
  const std::vector<size_t> offsets = Offsets(counts);
  std::vector<Range> held;  // the range before each level's split
  Range mine{0, n};
  std::vector<double> sums(3 * counts.size());
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
    // Per tensor: a.b, |a|^2, |b|^2 of the whole vectors, summed over the 2d ranks holding them.
    std::fill(sums.begin(), sums.end(), 0.0);
    ForEachPart(counts, offsets, mine, [&](size_t t, size_t begin, size_t count) {
      double part[3] = {0, 0, 0};
      k.dots(data + begin * esize, recv + begin * esize, count, part);
      sums[3 * t] += part[0];
      sums[3 * t + (left ? 1 : 2)] += part[1];
      sums[3 * t + (left ? 2 : 1)] += part[2];
    });
    BlockSum(comm, sums, 2 * d);
    ForEachPart(counts, offsets, mine, [&](size_t t, size_t begin, size_t count) {
      const double dot = sums[3 * t], ca = Coefficient(dot, sums[3 * t + 1]), cb = Coefficient(dot, sums[3 * t + 2]);
      k.combine(data + begin * esize, recv + begin * esize, count, left ? ca : cb, left ? cb : ca);
    });
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

}  // namespace

void AdasumCombine(void* a, const void* b, const std::vector<size_t>& counts, DataType dtype) {
  const Kernels k = KernelsFor(dtype);
  const size_t esize = DataTypeSize(dtype);
  size_t at = 0;
  for (size_t count : counts) {
    char* x = static_cast<char*>(a) + at * esize;
    const char* y = static_cast<const char*>(b) + at * esize;
    double s[3] = {0, 0, 0};
    k.dots(x, y, count, s);
    k.combine(x, y, count, Coefficient(s[0], s[1]), Coefficient(s[0], s[2]));
    at += count;
  }
}

void AdasumAllreduce(Communicator& comm, const std::vector<BufferPiece>& pieces, const AllreduceOptions& o,
                     std::vector<char>& scratch) {
  WithTensorContext("adasum allreduce", o.name, [&] {
    const Kernels k = KernelsFor(o.dtype);
    const size_t esize = DataTypeSize(o.dtype);
    std::vector<size_t> counts;
    counts.reserve(pieces.size());
    for (const BufferPiece& piece : pieces) counts.push_back(piece.count);
    const size_t n = FusePieces(pieces, o.dtype, o.prescale, scratch);
    if (n == 0) return;
    if (scratch.size() < 2 * n * esize) scratch.resize(2 * n * esize);
    char* data = scratch.data();
    char* recv = data + n * esize;
    const size_t bytes = n * esize;
    const int size = comm.size(), rank = comm.rank();
    int p = 1;
    while (2 * p <= size) p *= 2;
    if (rank >= p) {  // beyond the power of two: folded into rank - p, which sends the result back
      comm.Send(data, bytes, rank - p, kAdasumDataTag);
      comm.Recv(data, bytes, rank - p, kAdasumDataTag);
    } else {
      const bool folds = rank + p < size;
      if (folds) {
        comm.Recv(recv, bytes, rank + p, kAdasumDataTag);
        AdasumCombine(data, recv, counts, o.dtype);
      }
      VectorHalvingDistanceDoubling(comm, p, data, recv, n, counts, k, esize);
      if (folds) comm.Send(data, bytes, rank + p, kAdasumDataTag);
    }
    FinishFn finish;
    if (o.postscale != 1.0) {
      finish = [&o](void* out, size_t count) { ScaleInPlace(out, count, o.dtype, o.postscale); };
    }
    UnfusePieces(pieces, o.dtype, data, finish);
  });
}

}  // namespace gradcomp
