// The emulated NCCL (nccl.h says what it is for and what it checks).
//
// A communicator's ranks share a Shared: the collectives posted so far by sequence number (each
// rank numbers its own calls, as NCCL matches them) and a queue of messages per ordered pair of
// ranks. An operation, or a group of them, is one piece of stream work that runs in three steps,
// each waiting for the peers (the engine's lock released while it waits): post what this rank
// brings; read what it needs (every rank's send buffers, a message) into memory of its own; once
// every rank has read, write its output. So in-place operations are safe, and every buffer stays
// open (its owner's work still runs) while a peer reads it.
#include "test/support/cuda_emulation/nccl.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "ops/common/dtype.h"
#include "ops/reduce/reduce.h"
#include "test/support/cuda_emulation/engine.h"

using gc_cuda_emulation::EngineLock;
using gc_cuda_emulation::Fatal;

namespace {

constexpr auto kPatience = std::chrono::minutes(5);

std::atomic<size_t> bytes_moved{0};

thread_local std::string last_message;

ncclResult_t Error(ncclResult_t result, const std::string& what) {
  last_message = what;
  std::fprintf(stderr, "gradcomp NCCL emulation: %s\n", what.c_str());
  return result;
}

size_t TypeSize(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
  }
  return 0;
}

const char* TypeName(ncclDataType_t t) {
  static const char* const names[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
                                      "float64", "bfloat16"};
  return t >= 0 && t <= ncclBfloat16 ? names[t] : "an unknown type";
}

// gradcomp's type for the arithmetic; false for NCCL's unsigned 32- and 64-bit integers.
bool Arithmetic(ncclDataType_t t, gradcomp::DataType* out) {
  switch (t) {
    case ncclInt8: *out = gradcomp::DataType::kInt8; return true;
    case ncclUint8: *out = gradcomp::DataType::kUInt8; return true;
    case ncclInt32: *out = gradcomp::DataType::kInt32; return true;
    case ncclInt64: *out = gradcomp::DataType::kInt64; return true;
    case ncclFloat16: *out = gradcomp::DataType::kFloat16; return true;
    case ncclBfloat16: *out = gradcomp::DataType::kBFloat16; return true;
    case ncclFloat32: *out = gradcomp::DataType::kFloat32; return true;
    case ncclFloat64: *out = gradcomp::DataType::kFloat64; return true;
    default: return false;
  }
}

const char* OpName(ncclRedOp_t op) {
  static const char* const names[] = {"sum", "prod", "max", "min", "avg"};
  return op >= 0 && op <= ncclAvg ? names[op] : "an unknown operation";
}

struct Op {
  enum Kind { kAllReduce, kReduce, kBroadcast, kAllGather, kReduceScatter, kSend, kRecv };
  Kind kind = kAllReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // elements (each rank's part for AllGather and ReduceScatter, as NCCL's)
  ncclDataType_t dtype = ncclUint8;
  ncclRedOp_t op = ncclSum;
  int root = 0;      // the peer of a send or receive
  uint64_t seq = 0;  // collectives: the rank's call number on the communicator

  bool collective() const { return kind != kSend && kind != kRecv; }
  size_t bytes() const { return count * TypeSize(dtype); }
  std::string Describe() const {
    static const char* const names[] = {"ncclAllReduce", "ncclReduce", "ncclBroadcast", "ncclAllGather",
                                        "ncclReduceScatter", "ncclSend", "ncclRecv"};
    std::string out = std::string(names[kind]) + "(" + std::to_string(count) + " " + TypeName(dtype);
    if (kind == kAllReduce || kind == kReduce || kind == kReduceScatter) out += std::string(", ") + OpName(op);
    if (kind == kReduce || kind == kBroadcast) out += ", root " + std::to_string(root);
    if (kind == kSend || kind == kRecv) out += ", peer " + std::to_string(root);
    return out + ")";
  }
};

// A collective as the ranks post it.
struct Meeting {
  std::vector<const Op*> ops;  // by rank: null until posted (each points into its rank's running work)
  int posted = 0, read = 0, left = 0;
};

struct Message {
  const void* data = nullptr;
  size_t bytes = 0;
  std::string sent_as;  // for a mismatch's message
  bool consumed = false;
};

struct Shared;

struct SplitMeeting {
  std::vector<std::pair<int, int>> color_key;  // by rank
  std::vector<bool> posted_by;
  int posted = 0, left = 0;
  std::map<int, std::shared_ptr<Shared>> children;  // by color
};

// What the ranks of one communicator share (under the engine's lock).
struct Shared {
  std::string name;
  std::vector<int> devices;  // by rank
  std::map<uint64_t, Meeting> meetings;
  std::map<std::pair<int, int>, std::deque<std::shared_ptr<Message>>> channels;  // by (from, to)
  std::map<uint64_t, SplitMeeting> splits;

  int size() const { return static_cast<int>(devices.size()); }
};

std::shared_ptr<Shared> NewShared(std::vector<int> devices) {
  static int made = 0;
  auto s = std::make_shared<Shared>();
  s->name = "communicator " + std::to_string(++made) + " (" + std::to_string(devices.size()) + " ranks)";
  s->devices = std::move(devices);
  return s;
}

// Waits (the engine's lock released) until `ready`, or dies with `waiting()` after kPatience.
void Await(const std::function<bool()>& ready, const std::function<std::string()>& waiting) {
  const auto deadline = std::chrono::steady_clock::now() + kPatience;
  while (!ready()) {
    if (std::chrono::steady_clock::now() > deadline) Fatal("NCCL: " + waiting());
    gc_cuda_emulation::WaitForChange();
  }
}

std::string Missing(const std::vector<bool>& present) {
  std::string out;
  for (size_t r = 0; r < present.size(); ++r) {
    if (!present[r]) out += (out.empty() ? "" : ", ") + std::to_string(r);
  }
  return out;
}

}  // namespace

struct ncclComm {
  std::shared_ptr<Shared> shared;
  int rank = 0;
  int device = 0;
  uint64_t next_seq = 0;
  uint64_t next_split = 0;
};

namespace {

// An operation enqueued, with its communicator's shared state.
struct Posted {
  Op op;
  std::shared_ptr<Shared> shared;
  int rank = 0;
};

// What this rank's part of a collective computes, every rank's part posted: its output's bytes.
std::vector<char> Compute(const Meeting& m, int rank) {
  const Op& mine = *m.ops[static_cast<size_t>(rank)];
  const int n = static_cast<int>(m.ops.size());
  const size_t part = mine.bytes();
  std::vector<char> out;
  std::vector<const void*> sends;
  for (const Op* o : m.ops) sends.push_back(o->send);
  const auto reduce = [&](size_t offset) {
    gradcomp::DataType dtype;
    if (!Arithmetic(mine.dtype, &dtype)) Fatal(std::string("NCCL: no arithmetic on ") + TypeName(mine.dtype));
    static const gradcomp::ReduceOp ops[] = {gradcomp::ReduceOp::kSum, gradcomp::ReduceOp::kProduct,
                                             gradcomp::ReduceOp::kMax, gradcomp::ReduceOp::kMin,
                                             gradcomp::ReduceOp::kSum};
    out.resize(part);
    gradcomp::ReduceMany(out.data(), sends, offset, mine.count, dtype, ops[mine.op]);
    if (mine.op == ncclAvg) {
      gradcomp::FinishReduction(out.data(), mine.count, dtype, gradcomp::ReduceOp::kAverage, 1.0, n);
    }
  };
  switch (mine.kind) {
    case Op::kAllReduce: reduce(0); break;
    case Op::kReduce:
      if (rank == mine.root) reduce(0);
      break;
    case Op::kBroadcast: {
      const char* from = static_cast<const char*>(m.ops[static_cast<size_t>(mine.root)]->send);
      out.assign(from, from + part);
      break;
    }
    case Op::kAllGather:
      for (const void* s : sends) {
        const char* from = static_cast<const char*>(s);
        out.insert(out.end(), from, from + part);
      }
      break;
    case Op::kReduceScatter: reduce(static_cast<size_t>(rank) * part); break;
    default: break;
  }
  return out;
}

// Every rank of a collective called the same one.
void CheckAgreement(const Shared& sh, const Meeting& m, uint64_t seq) {
  const Op& first = *m.ops[0];
  for (size_t r = 1; r < m.ops.size(); ++r) {
    const Op& o = *m.ops[r];
    const bool rooted = o.kind == Op::kReduce || o.kind == Op::kBroadcast;
    const bool reduces = o.kind == Op::kAllReduce || o.kind == Op::kReduce || o.kind == Op::kReduceScatter;
    if (o.kind != first.kind || o.count != first.count || o.dtype != first.dtype || (rooted && o.root != first.root) ||
        (reduces && o.op != first.op)) {
      Fatal("NCCL: collective #" + std::to_string(seq) + " of " + sh.name + ": rank 0 called " + first.Describe() +
            ", rank " + std::to_string(r) + " " + o.Describe());
    }
  }
}

// One piece of stream work: this rank's operations of one group (or a single one).
void Run(const std::vector<Posted>& group) {
  std::vector<std::shared_ptr<Message>> sent;
  for (const Posted& p : group) {  // post
    Shared& sh = *p.shared;
    bytes_moved += p.op.bytes();
    if (p.op.kind == Op::kSend) {
      auto msg = std::make_shared<Message>();
      msg->data = p.op.send;
      msg->bytes = p.op.bytes();
      msg->sent_as = p.op.Describe();
      sh.channels[{p.rank, p.op.root}].push_back(msg);
      sent.push_back(msg);
    } else if (p.op.collective()) {
      Meeting& m = sh.meetings[p.op.seq];
      if (m.ops.empty()) m.ops.assign(static_cast<size_t>(sh.size()), nullptr);
      m.ops[static_cast<size_t>(p.rank)] = &p.op;
      ++m.posted;
    }
  }
  gc_cuda_emulation::Notify();
  std::vector<std::vector<char>> results(group.size());
  for (size_t i = 0; i < group.size(); ++i) {  // read
    const Posted& p = group[i];
    Shared& sh = *p.shared;
    const std::string who = "rank " + std::to_string(p.rank) + " of " + sh.name + ", in " + p.op.Describe();
    if (p.op.kind == Op::kRecv) {
      auto& channel = sh.channels[{p.op.root, p.rank}];
      Await([&] { return !channel.empty(); },
            [&] { return who + ", waited 5 minutes for rank " + std::to_string(p.op.root) + "'s send"; });
      std::shared_ptr<Message> msg = channel.front();
      channel.pop_front();
      if (msg->bytes != p.op.bytes()) {
        Fatal("NCCL: " + who + ", received rank " + std::to_string(p.op.root) + "'s " + msg->sent_as +
              " of " + std::to_string(msg->bytes) + " bytes");
      }
      if (msg->bytes > 0) std::memcpy(p.op.recv, msg->data, msg->bytes);
      msg->consumed = true;
      gc_cuda_emulation::Notify();
    } else if (p.op.collective()) {
      Meeting& m = sh.meetings[p.op.seq];
      Await([&] { return m.posted == sh.size(); }, [&] {
        std::vector<bool> present;
        for (const Op* o : m.ops) present.push_back(o != nullptr);
        return who + " (call #" + std::to_string(p.op.seq) + "), waited 5 minutes for ranks " + Missing(present);
      });
      CheckAgreement(sh, m, p.op.seq);
      results[i] = Compute(m, p.rank);
      ++m.read;
      gc_cuda_emulation::Notify();
    }
  }
  for (size_t i = 0; i < group.size(); ++i) {  // write, once every rank has read
    const Posted& p = group[i];
    if (!p.op.collective()) continue;
    Shared& sh = *p.shared;
    Meeting& m = sh.meetings[p.op.seq];
    Await([&] { return m.read == sh.size(); }, [&] { return sh.name + ": a rank never finished reading"; });
    if (!results[i].empty()) std::memcpy(p.op.recv, results[i].data(), results[i].size());
    if (++m.left == sh.size()) sh.meetings.erase(p.op.seq);
  }
  for (const auto& msg : sent) {
    Await([&] { return msg->consumed; }, [&] { return "a " + msg->sent_as + " was never received"; });
  }
  gc_cuda_emulation::Notify();
}

thread_local int group_depth = 0;
thread_local std::vector<std::pair<cudaStream_t, Posted>> pending;

// Enqueues the pending operations: one piece of work per stream, in call order.
ncclResult_t Launch() {
  std::vector<std::pair<cudaStream_t, std::vector<Posted>>> by_stream;
  for (auto& [stream, posted] : pending) {
    const cudaStream_t s = stream;  // a structured binding cannot be captured in C++17
    auto it = std::find_if(by_stream.begin(), by_stream.end(), [s](const auto& e) { return e.first == s; });
    if (it == by_stream.end()) it = by_stream.insert(by_stream.end(), {stream, {}});
    it->second.push_back(std::move(posted));
  }
  pending.clear();
  for (auto& [stream, group] : by_stream) {
    std::vector<const void*> touches;
    for (const Posted& p : group) {
      if (p.op.send != nullptr) touches.push_back(p.op.send);
      if (p.op.recv != nullptr) touches.push_back(p.op.recv);
    }
    auto ops = std::make_shared<std::vector<Posted>>(std::move(group));
    if (gc_cuda_emulation::EnqueueWork(stream, [ops] { Run(*ops); }, std::move(touches)) != cudaSuccess) {
      return Error(ncclUnhandledCudaError, "the stream refused the work (unknown stream or a failed context)");
    }
  }
  return ncclSuccess;
}

// The buffer an operation touches on this rank is device memory of the communicator's GPU.
bool OnDevice(const char* call, const char* what, const void* p, size_t bytes, const ncclComm* comm,
              ncclResult_t* result) {
  if (bytes == 0) return true;
  const int device = gc_cuda_emulation::DeviceOf(p, bytes);
  if (device == comm->device) return true;
  char line[128];
  std::snprintf(line, sizeof line, "%s: %s %p (%zu bytes) is ", call, what, p, bytes);
  *result = Error(ncclInvalidArgument, line + gc_cuda_emulation::DescribeMemory(p, bytes) + ", not GPU " +
                                           std::to_string(comm->device) + "'s (rank " + std::to_string(comm->rank) +
                                           " of " + comm->shared->name + ")");
  return false;
}

// Checks an operation and enqueues it (or keeps it for the group's end).
ncclResult_t Enqueue(const char* call, Op op, ncclComm_t comm, cudaStream_t stream) {
  if (comm == nullptr) return Error(ncclInvalidArgument, std::string(call) + ": a null communicator");
  if (TypeSize(op.dtype) == 0) return Error(ncclInvalidArgument, std::string(call) + ": an unknown datatype");
  gradcomp::DataType arithmetic;
  const bool reduces = op.kind == Op::kAllReduce || op.kind == Op::kReduce || op.kind == Op::kReduceScatter;
  if (reduces && (op.op < ncclSum || op.op > ncclAvg)) {
    return Error(ncclInvalidArgument, std::string(call) + ": an unknown reduction");
  }
  if (reduces && !Arithmetic(op.dtype, &arithmetic)) {
    return Error(ncclInvalidArgument, std::string(call) + ": the emulation has no arithmetic on " + TypeName(op.dtype));
  }
  const int n = comm->shared->size(), me = comm->rank;
  if (op.kind != Op::kAllReduce && op.kind != Op::kAllGather && op.kind != Op::kReduceScatter &&
      (op.root < 0 || op.root >= n)) {
    return Error(ncclInvalidArgument, std::string(call) + ": root or peer " + std::to_string(op.root) + " of " +
                                          std::to_string(n) + " ranks");
  }
  const int stream_device = gc_cuda_emulation::DeviceOfStream(stream);
  if (stream_device != comm->device) {
    return Error(ncclInvalidArgument, std::string(call) + ": the stream is " +
                                          (stream_device < 0 ? std::string("unknown")
                                                             : "GPU " + std::to_string(stream_device) + "'s") +
                                          ", the communicator on GPU " + std::to_string(comm->device));
  }
  const size_t b = op.bytes(), all = b * static_cast<size_t>(n);
  size_t send_bytes = b, recv_bytes = b;
  switch (op.kind) {
    case Op::kReduce: recv_bytes = me == op.root ? b : 0; break;
    case Op::kBroadcast: send_bytes = me == op.root ? b : 0; break;
    case Op::kAllGather: recv_bytes = all; break;
    case Op::kReduceScatter: send_bytes = all; break;
    case Op::kSend: recv_bytes = 0; break;
    case Op::kRecv: send_bytes = 0; break;
    default: break;
  }
  ncclResult_t result = ncclSuccess;
  if (!OnDevice(call, "sendbuff", op.send, send_bytes, comm, &result) ||
      !OnDevice(call, "recvbuff", op.recv, recv_bytes, comm, &result)) {
    return result;
  }
  if (send_bytes == 0) op.send = nullptr;  // what this rank does not touch
  if (recv_bytes == 0) op.recv = nullptr;
  if (op.collective()) {
    if (op.count == 0) return ncclSuccess;  // NCCL skips empty collectives (every rank alike)
    op.seq = comm->next_seq++;
  }
  pending.emplace_back(stream, Posted{op, comm->shared, comm->rank});
  return group_depth > 0 ? ncclSuccess : Launch();
}

std::string IdKey(const ncclUniqueId& id) { return std::string(id.internal, sizeof id.internal); }

struct Joining {
  int nranks = 0;
  std::vector<int> devices;  // by rank, -1 until it joins
  int joined = 0, left = 0;
  std::shared_ptr<Shared> shared;
};
std::map<std::string, Joining> joining;  // by unique id, under the engine's lock

}  // namespace

size_t gc_cuda_emulation::NcclBytes() { return bytes_moved; }

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
  }
  return "unknown result code";
}

const char* ncclGetLastError(ncclComm_t) { return last_message.c_str(); }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return Error(ncclInvalidArgument, "ncclGetUniqueId: a null id");
  static std::atomic<uint64_t> made{0};
  std::memset(id->internal, 0, sizeof id->internal);
  std::snprintf(id->internal, sizeof id->internal, "gradcomp-emulated-nccl %d %llu", static_cast<int>(getpid()),
                static_cast<unsigned long long>(++made));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (comm == nullptr || nranks < 1 || rank < 0 || rank >= nranks) {
    return Error(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " of " +
                                          std::to_string(nranks) + " ranks, or a null result");
  }
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return Error(ncclUnhandledCudaError, "ncclCommInitRank: cudaGetDevice");
  EngineLock lock;
  const std::string key = IdKey(id);
  Joining& j = joining[key];
  if (j.nranks == 0) {
    j.nranks = nranks;
    j.devices.assign(static_cast<size_t>(nranks), -1);
  }
  if (j.nranks != nranks) {
    Fatal("NCCL: ncclCommInitRank: rank " + std::to_string(rank) + " joins " + std::to_string(nranks) +
          " ranks, an earlier rank " + std::to_string(j.nranks));
  }
  if (j.devices[static_cast<size_t>(rank)] != -1) {
    Fatal("NCCL: ncclCommInitRank: rank " + std::to_string(rank) + " joined twice with one id");
  }
  j.devices[static_cast<size_t>(rank)] = device;
  ++j.joined;
  gc_cuda_emulation::Notify();
  Await([&] { return j.joined == j.nranks; }, [&] {
    std::vector<bool> present;
    for (int d : j.devices) present.push_back(d != -1);
    return "ncclCommInitRank: rank " + std::to_string(rank) + " waited 5 minutes for ranks " + Missing(present);
  });
  if (!j.shared) j.shared = NewShared(j.devices);
  std::shared_ptr<Shared> shared = j.shared;
  if (++j.left == j.nranks) joining.erase(key);
  for (int a = 0; a < nranks; ++a) {
    for (int b = a + 1; b < nranks; ++b) {
      if (shared->devices[static_cast<size_t>(a)] == shared->devices[static_cast<size_t>(b)]) {
        return Error(ncclInvalidUsage, "Duplicate GPU detected: rank " + std::to_string(a) + " and rank " +
                                           std::to_string(b) + " both on CUDA device " +
                                           std::to_string(shared->devices[static_cast<size_t>(a)]));
      }
    }
  }
  *comm = new ncclComm{shared, rank, device};
  return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  if (comm == nullptr || newcomm == nullptr) return Error(ncclInvalidArgument, "ncclCommSplit: a null communicator");
  if (config != nullptr) return Error(ncclInvalidArgument, "ncclCommSplit: the emulation takes no config");
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR) {
    return Error(ncclInvalidArgument, "ncclCommSplit: color " + std::to_string(color));
  }
  EngineLock lock;
  Shared& sh = *comm->shared;
  const uint64_t seq = comm->next_split++;
  SplitMeeting& m = sh.splits[seq];
  if (m.color_key.empty()) {
    m.color_key.assign(static_cast<size_t>(sh.size()), {0, 0});
    m.posted_by.assign(static_cast<size_t>(sh.size()), false);
  }
  m.color_key[static_cast<size_t>(comm->rank)] = {color, key};
  m.posted_by[static_cast<size_t>(comm->rank)] = true;
  ++m.posted;
  gc_cuda_emulation::Notify();
  Await([&] { return m.posted == sh.size(); }, [&] {
    return "ncclCommSplit #" + std::to_string(seq) + " of " + sh.name + ": rank " + std::to_string(comm->rank) +
           " waited 5 minutes for ranks " + Missing(m.posted_by);
  });
  *newcomm = nullptr;
  if (color != NCCL_SPLIT_NOCOLOR) {
    std::vector<std::pair<int, int>> members;  // (key, parent rank) of this color
    for (int r = 0; r < sh.size(); ++r) {
      const auto& [c, k] = m.color_key[static_cast<size_t>(r)];
      if (c == color) members.emplace_back(k, r);
    }
    std::sort(members.begin(), members.end());
    std::shared_ptr<Shared>& child = m.children[color];
    if (!child) {
      std::vector<int> devices;
      for (const auto& [k, r] : members) devices.push_back(sh.devices[static_cast<size_t>(r)]);
      child = NewShared(devices);
    }
    const auto at = std::find(members.begin(), members.end(), std::make_pair(key, comm->rank));
    *newcomm = new ncclComm{child, static_cast<int>(at - members.begin()), comm->device};
  }
  if (++m.left == sh.size()) sh.splits.erase(seq);
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  EngineLock lock;  // the shared state is released under the engine's lock
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return Error(ncclInvalidArgument, "ncclCommUserRank: a null argument");
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return Error(ncclInvalidArgument, "ncclCommCount: a null argument");
  *count = comm->shared->size();
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(ncclComm_t comm, int* device) {
  if (comm == nullptr || device == nullptr) return Error(ncclInvalidArgument, "ncclCommCuDevice: a null argument");
  *device = comm->device;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (group_depth == 0) return Error(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  return --group_depth > 0 ? ncclSuccess : Launch();
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return Enqueue("ncclAllReduce", Op{Op::kAllReduce, sendbuff, recvbuff, count, datatype, op}, comm, stream);
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  return Enqueue("ncclReduce", Op{Op::kReduce, sendbuff, recvbuff, count, datatype, op, root}, comm, stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return Enqueue("ncclBroadcast", Op{Op::kBroadcast, sendbuff, recvbuff, count, datatype, ncclSum, root}, comm,
                 stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return Enqueue("ncclAllGather", Op{Op::kAllGather, sendbuff, recvbuff, sendcount, datatype}, comm, stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return Enqueue("ncclReduceScatter", Op{Op::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op}, comm,
                 stream);
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return Enqueue("ncclSend", Op{Op::kSend, sendbuff, nullptr, count, datatype, ncclSum, peer}, comm, stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return Enqueue("ncclRecv", Op{Op::kRecv, nullptr, recvbuff, count, datatype, ncclSum, peer}, comm, stream);
}
