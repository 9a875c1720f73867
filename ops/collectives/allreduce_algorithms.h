// The compressed allreduce's algorithms as a table, as UCC's (tl/ucp/allreduce): each row names
// an algorithm, says what it needs of an allreduce (the codec's kind, the topology, the memory its
// buffers are in), estimates what it costs a rank (messages and bytes on the wire) and runs it.
// The runtime asks AllreducePlanner::Choose for an allreduce's row and runs that row: the first
// row, in table order, whose needs hold and which the settings want. Adding an algorithm is one
// file with its run function (like sra2d.cc) and one row in allreduce_algorithms.cc
// (docs/design.md, "Adding an algorithm").
//
// The built-in rows, in the order they are tried:
//   sparse        topk's allgather of every rank's encoding and a scatter-add (sparse_allreduce.cc);
//   hierarchical  inside each node first, then an SRA of each shard across nodes
//                 (hierarchical_compressed.cc), where asked for;
//   sra2d         the SRA on a grid of rows and columns (sra2d.cc): nodes of several ranks, or
//                 GRADCOMP_GRID_MIN_RANKS ranks, or asked for;
//   sra           the flat SRA (sra.cc): every dense codec, anywhere.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ops/collectives/compressed_allreduce.h"
#include "ops/comm/topology.h"

namespace gradcomp {

/// Which codecs an algorithm reduces: dense ones (a fixed-size encoding per value: SRA) or
/// sparse ones (a data-dependent selection: allgathered).
enum class CodecKind { kDense, kSparse };

/// GRADCOMP_UNCOMPRESSED_ALGORITHM: an uncompressed allreduce through the communicator's own
/// allreduce ("mpi": MPI's, shared memory's, NCCL's), through the table's SRA with the exact codec
/// ("sra"), or the SRA for float32 sums of 256 KB or more across nodes ("auto").
enum class UncompressedAlgorithm { kAuto, kCommunicator, kSra };
/// "auto", "mpi" or "sra"; throws InvalidArgument naming the setting for anything else.
UncompressedAlgorithm ParseUncompressedAlgorithm(std::string_view name);

/// The settings that choose among the rows.
struct AlgorithmSettings {
  /// GRADCOMP_COMPRESSED_ALGORITHM: "auto", or the name of the row whose shape every SRA takes
  /// ("sra": flat, "sra2d": a grid from 4 ranks on), or a registered row's name.
  std::string algorithm = "auto";
  /// GRADCOMP_GRID_MIN_RANKS and GRADCOMP_GRID_NODE_MESSAGES (GridShape).
  int grid_min_ranks = 32;
  int grid_node_messages = kNodeRowMessages;
  /// CGX_INTRA_BROADCAST: the hierarchical row's leaders alone cross nodes.
  bool leader_only = false;
  UncompressedAlgorithm uncompressed = UncompressedAlgorithm::kAuto;
};

class AllreducePlanner;

/// One allreduce, as the choice sees it.
struct AllreduceCase {
  const Codec* codec = nullptr;
  /// The communicators it runs over (the host's, or a device's).
  const Topology* topo = nullptr;
  /// Whether its buffers are in host memory.
  bool host_memory = true;
  /// Whether the allreduce is asked to reduce inside each node first (GRADCOMP_HIERARCHICAL,
  /// CGX_INTRA_BROADCAST, or the uncompressed SRA chosen automatically).
  bool hierarchy = false;
  /// Values reduced, their type, and the codec's parameters: the cost estimate's sizes.
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
  CodecParams params;
  /// The planner choosing (its settings and the grids it keeps).
  AllreducePlanner* planner = nullptr;
};

/// What a row estimates the allreduce costs a rank: the messages it sends and their bytes
/// (the encoded size for the codec's estimate of its wire size; a hierarchical leader's).
/// Read after the row ran: a grid it has not made yet counts as flat SRA (the estimate makes no
/// grid, which is collective, so that one rank alone may ask).
struct AlgorithmCost {
  size_t messages = 0;
  size_t wire_bytes = 0;
};

/// A row of the table.
struct AllreduceAlgorithm {
  const char* name;
  const char* description;
  /// What it needs: the codec's kind, equal nodes of several ranks (and several nodes), at
  /// least `min_ranks` ranks, host memory.
  CodecKind codec;
  bool nodes;
  int min_ranks;
  bool host_only;
  /// Whether the settings want it for `c` (its needs hold). Every rank must answer alike.
  bool (*wanted)(const AllreduceCase& c);
  AlgorithmCost (*cost)(const AllreduceCase& c);
  CompressedAllreduceStats (*run)(const AllreduceCase& c, const CompressedAllreduceOptions& o);
};

/// The rows, in the order they are tried.
const std::vector<AllreduceAlgorithm>& AllreduceAlgorithms();
/// The row named `name`, or null.
const AllreduceAlgorithm* LookupAllreduceAlgorithm(std::string_view name);
/// Adds `row` ahead of the built-in rows (tried first). For tests and extensions, before
/// any allreduce runs; throws InvalidArgument for a name already in the table.
void RegisterAllreduceAlgorithm(const AllreduceAlgorithm& row);
/// Removes the row named `name` (tests), if there is one.
void UnregisterAllreduceAlgorithm(std::string_view name);
/// Whether `row`'s needs hold for `c`.
bool NeedsHold(const AllreduceAlgorithm& row, const AllreduceCase& c);

/// Chooses the row of each allreduce and keeps what its algorithms plan once (the grids,
/// made collectively at their first use: every rank runs the same allreduces in the same order).
class AllreducePlanner {
 public:
  /// Throws InvalidArgument when settings.algorithm names no row.
  explicit AllreducePlanner(AlgorithmSettings settings);
  const AlgorithmSettings& settings() const { return settings_; }
  /// The first row whose needs hold and which the settings want (sra holds for every dense codec).
  /// Collective where a row's wanted() makes a grid.
  const AllreduceAlgorithm& Choose(const AllreduceCase& c);
  /// Choose, then the row's run.
  CompressedAllreduceStats Run(AllreduceCase c, const CompressedAllreduceOptions& o);
  /// The grid the SRA over `across` (topo.world or topo.cross) runs on, or null (flat SRA): made
  /// the first time, collectively, and kept. topo.world spanning nodes of several ranks runs
  /// on the grid whose rows are the nodes (MakeNodeGrid) unless the setting is sra.
  const Grid* GridFor(const Topology& topo, Communicator& across);
  /// The grid GridFor made for `across`, or null (none yet, or flat). Not collective.
  const Grid* PlannedGrid(const Communicator& across) const;
  /// Whether reduce-scatters and allgathers (compressed, or not) take their flat form on nodes
  /// of several ranks: GRADCOMP_COMPRESSED_ALGORITHM=sra, or GRADCOMP_UNCOMPRESSED_ALGORITHM=mpi.
  bool FlatShards(bool compressed) const;
  /// Whether an SRA over `ranks` ranks runs on a grid by the settings alone.
  bool WantsGrid(int ranks) const;

 private:
  AlgorithmSettings settings_;
  std::map<const Communicator*, std::unique_ptr<Grid>> grids_;
};

}  // namespace gradcomp
