// The steps every compressed allreduce algorithm (sra.cc, hierarchical_compressed.cc,
// sparse_allreduce.cc) is written with: pieces of a buffer, encoding and decoding them,
// the float32 working copy and the output, phase timing. Internal to ops/collectives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "ops/collectives/compressed_allreduce.h"

namespace gradcomp {

/// Times one phase into `seconds` (sim::WorkNow: the simulated clock under SMPI) and reports
/// its begin and end to the options' hook.
class Phase {
 public:
  Phase(const CompressedAllreduceOptions& o, const char* name, double* seconds);
  ~Phase();
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;

 private:
  const std::function<void(const char*, bool)>& hook_;
  const char* name_;
  double* seconds_;
  double start_;
};

/// A run of values inside one chunk and one tensor: an encoded segment of its own.
struct Piece {
  size_t start;  ///< in buffer coordinates
  size_t len;
};

/// 0, then the end of each tensor of the buffer (o.segments; one tensor when empty).
std::vector<size_t> SegmentBounds(const CompressedAllreduceOptions& o);
/// The pieces of [begin, begin + len) cut at the tensor bounds.
std::vector<Piece> PiecesIn(size_t begin, size_t len, const std::vector<size_t>& bounds);

/// Pieces longer than a block are cut into blocks of whole buckets (and whole 8-value code
/// groups), so each step of the reduction works on data that stays in cache. The buckets, the
/// values and the bytes on the wire stay the same; each block is an encoded segment of its own.
constexpr size_t kBlockValues = size_t{1} << 14;
std::vector<Piece> CutIntoBlocks(const std::vector<Piece>& pieces, size_t bucket_size);

/// Throws InvalidArgument for a sharded collective's options (compressed_shards.h) that cannot
/// run over `ranks` ranks on rank `me`: ValidateCompressed's, a sparse codec, shard counts that
/// are not one per rank or do not sum to o.count. `gather`: the input holds this rank's shard and
/// the output every shard (the allgather), else the reverse (the reduce-scatter).
void ValidateShards(const CompressedAllreduceOptions& o, const std::vector<size_t>& counts, int ranks, int me,
                    bool gather);
/// Throws unless the hierarchical sharded forms can run: homogeneous nodes, host memory.
void CheckNodeShards(const Topology& topo, const CompressedAllreduceOptions& o);

/// Encoded bytes of `pieces` (each a segment of its own).
size_t EncodedSize(const Codec& codec, const CodecParams& p, const std::vector<Piece>& pieces);
/// Encodes the float32 values of `pieces` piece after piece on the workspace's device; x[0] is
/// buffer element `base`; x and out are device memory.
size_t EncodePieces(CompressionWorkspace& ws, const Codec& codec, const CodecParams& p, const float* x, size_t base,
                    const std::vector<Piece>& pieces, uint8_t* out);
/// Decodes pieces (device memory) into `out`, whose element 0 is buffer element `base`.
void DecodePieces(CompressionWorkspace& ws, const Codec& codec, const CodecParams& p, const uint8_t* wire,
                  const std::vector<Piece>& pieces, size_t base, DataType out_dtype, void* out);

/// Communicator::Alltoallv and Allgatherv over point-to-point with every message posted at
/// once, polled to the end (`tag` tells them from other traffic). Every message pays one
/// latency together, where an MPI allgather's ring or an alltoall's pairwise steps pay one a
/// peer, one after the other (docs/benchmarks.md, "Messages posted at once"). A
/// transport without nonblocking transfers (NCCL) runs its own Alltoallv / Allgatherv instead.
/// Allgather may leave this rank's own slot of `out` untouched: callers do not read it, or fill
/// it themselves.
void AlltoallAtOnce(Communicator& comm, int tag, const uint8_t* in, const std::vector<size_t>& send_bytes, uint8_t* out,
                    const std::vector<size_t>& recv_bytes);
void AllgatherAtOnce(Communicator& comm, int tag, const uint8_t* mine, uint8_t* out, const std::vector<size_t>& bytes);

/// Whether `comm` reads and writes the workspace's device memory itself (NCCL, CUDA-aware
/// MPI): then encoded bytes go to it straight from the device, without host staging.
bool WireOnDevice(const Communicator& comm, const CompressionWorkspace& ws);
/// The device of the options' buffers (the host unless o.device says otherwise).
Device& DeviceOf(const CompressedAllreduceOptions& o);
/// Throws InvalidArgument for options an algorithm cannot run (`sparse`: the sparse one).
void ValidateCompressed(const CompressedAllreduceOptions& o, bool sparse);
/// The same for an input of `in_count` values and an output of `out_count` (a null buffer is
/// wrong only where its count is not 0).
void ValidateCompressed(const CompressedAllreduceOptions& o, bool sparse, size_t in_count, size_t out_count);

/// The options' workspace, or `local` made on their device.
class WorkspaceFor {
 public:
  explicit WorkspaceFor(const CompressedAllreduceOptions& o);
  CompressionWorkspace& operator*() { return *ws_; }

 private:
  std::unique_ptr<CompressionWorkspace> local_;
  CompressionWorkspace* ws_;
};

/// The float32 values to reduce (device memory): input * prescale (+ the carried residual). A
/// float32 input with nothing to add is used in place (it is only read, and before any output
/// is written).
const float* WorkingCopy(const CompressedAllreduceOptions& o, CompressionWorkspace& ws);
/// Where the float32 result goes (device memory): the output itself when it is float32.
float* ResultBuffer(const CompressedAllreduceOptions& o, CompressionWorkspace& ws);
/// What ends the sum of a dense allreduce: Average's division by the ranks (`divisor`; 1 for
/// Sum), then the postscale `factor`.
struct OutputScaling {
  double factor = 1.0;
  int divisor = 1;
  /// The none codec's sums: FinishReduction's arithmetic, a true division then the factor, so an
  /// uncompressed Average over SRA has the bits of the one over MPI (the sum over the ranks
  /// divided by their number). Otherwise one multiplication by factor / divisor: the codecs'
  /// sums are quantized anyway.
  bool exact = false;
  /// Applies it to n float32 sums.
  void Apply(Device& d, float* v, size_t n, Stream& stream) const;
};
/// The scaling of the sum over `ranks` ranks: postscale, after a division by them for Average
/// (exact for the none codec).
OutputScaling OutputScale(const CompressedAllreduceOptions& o, int ranks);
/// Converts the float32 result into the output (nothing when it is the output), and waits
/// for the workspace's stream: the collective's work is done.
void StoreOutput(const CompressedAllreduceOptions& o, CompressionWorkspace& ws, const float* result);

}  // namespace gradcomp
