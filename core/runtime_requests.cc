// The framework side of the Runtime: each collective's request checked and queued with its
// entry and handle (core/runtime.h); the background thread takes them from the queue.
#include "core/runtime.h"

#include "ops/common/enforce.h"
#include "ops/compression/codec.h"

namespace gradcomp {

Request Runtime::NewRequest(RequestType type, const std::string& name, DataType dtype,
                            const std::vector<int64_t>& shape) {
  CheckRunning();
  if (name.empty()) throw InvalidArgument(std::string(RequestTypeName(type)) + " needs a tensor name");
  (void)DataTypeSize(dtype);
  for (int64_t d : shape) {
    if (d < 0) throw InvalidArgument("tensor '" + name + "' has a negative dimension in its shape");
  }
  Request r;
  r.rank = topo_.rank();
  r.type = type;
  r.name = name;
  r.dtype = dtype;
  r.shape = shape;
  return r;
}

TensorEntry Runtime::NewEntry(const void* input, void* output, Placement placement) {
  TensorEntry entry;
  entry.input = input;
  entry.output = output;
  entry.device = placement.device != nullptr && placement.device != &HostDevice() ? placement.device : nullptr;
  if (entry.device != nullptr && placement.stream != nullptr) {
    entry.ready = entry.device->NewEvent();
    entry.ready->Record(*placement.stream);
  }
  entry.handle = std::make_shared<Handle>(std::weak_ptr<WaitObserver>(queue_));
  return entry;
}

std::shared_ptr<Handle> Runtime::Submit(Request request, const void* input, void* output, Placement placement,
                                        size_t output_bytes) {
  TensorEntry entry = NewEntry(input, output, placement);
  entry.output_bytes = output_bytes;
  request.on_device = entry.device != nullptr;
  std::shared_ptr<Handle> handle = entry.handle;
  // When this rank handed the tensor over: with the response cache, tensors after the first
  // step have no NEGOTIATE row, and this mark is what shows how long a ready tensor waited.
  if (timeline_.active()) timeline_.Instant(request.name, "queued");
  queue_->Push(std::move(request), std::move(entry));
  return handle;
}

CompressionSpec Runtime::CompressionFor(DataType dtype, const std::vector<int64_t>& shape, ReduceOp op) const {
  const bool compressible = IsCodecDataType(dtype) && (op == ReduceOp::kSum || op == ReduceOp::kAverage);
  if (settings_.compression.exact() || !compressible) return CompressionSpec{};
  if (shape.size() <= 1 || NumElements(shape) < settings_.min_size) return CompressionSpec{};  // the layer filter
  return settings_.compression;
}

CompressionSpec Runtime::AllgatherCompressionFor(DataType dtype, const std::vector<int64_t>& shape) const {
  // By the rows' size, which every rank's shape shares (the first dimension may differ).
  const std::vector<int64_t> row(shape.empty() ? shape.begin() : shape.begin() + 1, shape.end());
  if (IsExactCodec(settings_.allgather_codec) || !IsCodecDataType(dtype) || NumElements(row) < settings_.min_size) {
    return CompressionSpec{};
  }
  CompressionSpec spec;
  spec.codec = settings_.allgather_codec;
  spec.bits = static_cast<int>(settings_.allgather_bits);
  spec.bucket_size = settings_.compression.bucket_size;
  return spec;
}

namespace {

// Throws unless an explicit compression other than none makes sense for this tensor (`what`: the
// collective and the tensor; the codec is a known one, or auto).
void CheckExplicitCompression(const CompressionSpec& spec, DataType dtype, ReduceOp op, const std::string& what) {
  const std::string with = what + " with compression " + spec.Describe();
  if (!spec.is_auto()) FindCodec(spec.codec);  // names the known codecs
  if (!IsCodecDataType(dtype)) {
    throw InvalidArgument(with + ": dtype " + DataTypeName(dtype) + " cannot be compressed (float32, float16, bfloat16)");
  }
  if (op != ReduceOp::kSum && op != ReduceOp::kAverage) {
    throw InvalidArgument(with + ": op " + std::string(ReduceOpName(op)) + " cannot be compressed (sum, average)");
  }
  ValidateSpec(spec, with);
}

// Sparse codecs and auto compress allreduces only, unless given explicitly: a reducescatter
// takes an explicit auto (its tensor named across steps, as compress_fsdp's modules are).
bool AllreduceOnly(const CompressionSpec& spec) { return spec.is_auto() || FindCodec(spec.codec).sparse(); }

// The compression a reducescatter (`reduces`) or allgather runs with: `given` checked for this
// tensor, or the settings' (`fallback`, already fit for it; exact where it compresses allreduces
// only: a settings' auto would key its choices by the unnamed calls' fresh names).
CompressionSpec ShardCompression(const CompressionSpec* given, const CompressionSpec& fallback, DataType dtype,
                                 ReduceOp op, const std::string& what, bool reduces) {
  if (given == nullptr) return AllreduceOnly(fallback) ? CompressionSpec{} : fallback;
  if (given->exact()) return *given;
  if (AllreduceOnly(*given) && !(reduces && given->is_auto())) {
    throw InvalidArgument(what + " with compression " + given->Describe() + ": " +
                          (given->is_auto() ? "a per-tensor choice compresses allreduces and reducescatters only"
                                            : "a sparse codec compresses allreduces only") +
                          "; use none, fp16, bf16 or maxmin" + (reduces ? " (or auto)" : ""));
  }
  CheckExplicitCompression(*given, dtype, op, what);
  return *given;
}

}  // namespace

std::shared_ptr<Handle> Runtime::Allreduce(const std::string& name, DataType dtype, const std::vector<int64_t>& shape,
                                           const void* input, void* output, ReduceOp op, double prescale,
                                           double postscale, const CompressionSpec* compression, Placement placement,
                                           int32_t priority) {
  Request r = AllreduceRequest(name, dtype, shape, op, prescale, postscale, compression);
  r.priority = priority;
  return Submit(std::move(r), input, output, placement);
}

Request Runtime::AllreduceRequest(const std::string& name, DataType dtype, const std::vector<int64_t>& shape,
                                  ReduceOp op, double prescale, double postscale,
                                  const CompressionSpec* compression) {
  Request r = NewRequest(RequestType::kAllreduce, name, dtype, shape);
  if (op == ReduceOp::kBitwiseAnd) throw InvalidArgument("allreduce of '" + name + "': unsupported op");
  if (dtype == DataType::kBool && op == ReduceOp::kAverage) {
    throw InvalidArgument("allreduce of '" + name + "': op average is not defined for bool tensors");
  }
  if (op == ReduceOp::kAdasum && !IsFloatingPoint(dtype)) {
    throw InvalidArgument("allreduce of '" + name + "': op adasum needs a floating-point tensor (float16, bfloat16, "
                          "float32, float64), got " + DataTypeName(dtype));
  }
  r.op = op;
  r.prescale = prescale;
  r.postscale = postscale;
  r.compression = compression ? *compression : CompressionFor(dtype, shape, op);
  if (compression != nullptr && !compression->exact()) {
    CheckExplicitCompression(*compression, dtype, op, "allreduce of '" + name + "'");
  }
  return r;
}

std::vector<std::shared_ptr<Handle>> Runtime::GroupedAllreduce(const std::vector<std::string>& names, DataType dtype,
                                                               const std::vector<std::vector<int64_t>>& shapes,
                                                               const std::vector<const void*>& inputs,
                                                               const std::vector<void*>& outputs, ReduceOp op,
                                                               double prescale, double postscale,
                                                               const CompressionSpec* compression,
                                                               const std::vector<Placement>& placements,
                                                               int32_t priority) {
  if (shapes.size() != names.size() || inputs.size() != names.size() || outputs.size() != names.size()) {
    throw InvalidArgument("grouped allreduce needs one shape, input and output per name");
  }
  if (placements.size() > 1 && placements.size() != names.size()) {
    throw InvalidArgument("grouped allreduce needs no placement, one, or one per name (got " +
                          std::to_string(placements.size()) + " for " + std::to_string(names.size()) + " names)");
  }
  // Pushed together: the background thread negotiates (and fuses) the group in one cycle.
  std::vector<Request> requests;
  std::vector<TensorEntry> entries;
  std::vector<std::shared_ptr<Handle>> handles;
  for (size_t i = 0; i < names.size(); ++i) {
    requests.push_back(AllreduceRequest(names[i], dtype, shapes[i], op, prescale, postscale, compression));
    requests.back().priority = priority;
    const Placement placement = placements.empty() ? Placement{} : placements[placements.size() == 1 ? 0 : i];
    entries.push_back(NewEntry(inputs[i], outputs[i], placement));
    requests.back().on_device = entries.back().device != nullptr;
    handles.push_back(entries[i].handle);
    if (timeline_.active()) timeline_.Instant(names[i], "queued");
  }
  queue_->PushGroup(std::move(requests), std::move(entries));
  return handles;
}

std::shared_ptr<Handle> Runtime::SubmitShards(Request request, const void* input, Placement placement,
                                             OutputBuffer into) {
  if (into.data != nullptr && placement.device != nullptr && placement.device != &HostDevice()) {
    throw InvalidArgument(std::string(RequestTypeName(request.type)) + " of '" + request.name +
                          "': the output buffer given is host memory, and the tensor is on a device");
  }
  return Submit(std::move(request), input, into.data, placement, into.data != nullptr ? into.bytes : 0);
}

std::shared_ptr<Handle> Runtime::Allgather(const std::string& name, DataType dtype, const std::vector<int64_t>& shape,
                                           const void* input, const CompressionSpec* compression,
                                           Placement placement, OutputBuffer into) {
  Request r = NewRequest(RequestType::kAllgather, name, dtype, shape);
  if (shape.empty()) throw InvalidArgument("allgather of '" + name + "' needs a tensor with at least one dimension");
  r.compression = ShardCompression(compression, AllgatherCompressionFor(dtype, shape), dtype, ReduceOp::kSum,
                                   "allgather of '" + name + "'", false);
  r.compression.error_feedback = false;  // every step gathers the owners' exact values again
  return SubmitShards(std::move(r), input, placement, into);
}

std::shared_ptr<Handle> Runtime::Broadcast(const std::string& name, DataType dtype, const std::vector<int64_t>& shape,
                                           void* buffer, int root, Placement placement) {
  Request r = NewRequest(RequestType::kBroadcast, name, dtype, shape);
  if (root < 0 || root >= topo_.size()) {
    throw InvalidArgument("broadcast of '" + name + "': root rank " + std::to_string(root) + " is outside 0.." +
                          std::to_string(topo_.size() - 1));
  }
  r.root = root;
  return Submit(std::move(r), buffer, buffer, placement);
}

std::shared_ptr<Handle> Runtime::Alltoall(const std::string& name, DataType dtype, const std::vector<int64_t>& shape,
                                          const void* input, const std::vector<int64_t>& splits,
                                          Placement placement) {
  Request r = NewRequest(RequestType::kAlltoall, name, dtype, shape);
  if (shape.empty()) throw InvalidArgument("alltoall of '" + name + "' needs a tensor with at least one dimension");
  std::vector<int64_t> s = splits;
  if (s.empty()) {  // Horovod's default: the first dimension split evenly, or an error
    if (shape[0] % topo_.size() != 0) {
      throw InvalidArgument("alltoall of '" + name + "': without splits the first dimension (" +
                            std::to_string(shape[0]) + ") must be a multiple of the number of ranks (" +
                            std::to_string(topo_.size()) + "); pass splits for an uneven exchange");
    }
    s.assign(static_cast<size_t>(topo_.size()), shape[0] / topo_.size());
  }
  if (s.size() != static_cast<size_t>(topo_.size())) {
    throw InvalidArgument("alltoall of '" + name + "': " + std::to_string(s.size()) + " splits for " +
                          std::to_string(topo_.size()) + " ranks");
  }
  int64_t sum = 0;
  for (int64_t v : s) {
    if (v < 0) throw InvalidArgument("alltoall of '" + name + "': negative split " + std::to_string(v));
    sum += v;
  }
  if (sum != shape[0]) {
    throw InvalidArgument("alltoall of '" + name + "': splits sum to " + std::to_string(sum) +
                          " but the first dimension is " + std::to_string(shape[0]));
  }
  r.splits = s;
  return Submit(std::move(r), input, nullptr, placement);
}

std::shared_ptr<Handle> Runtime::Reducescatter(const std::string& name, DataType dtype,
                                               const std::vector<int64_t>& shape, const void* input, ReduceOp op,
                                               double prescale, double postscale,
                                               const CompressionSpec* compression, Placement placement,
                                               OutputBuffer into) {
  Request r = NewRequest(RequestType::kReducescatter, name, dtype, shape);
  if (shape.empty()) throw InvalidArgument("reducescatter of '" + name + "' needs at least one dimension");
  if (op == ReduceOp::kBitwiseAnd || (dtype == DataType::kBool && op == ReduceOp::kAverage)) {
    throw InvalidArgument("reducescatter of '" + name + "': op " + ReduceOpName(op) + " is not supported for " +
                          DataTypeName(dtype));
  }
  if (op == ReduceOp::kAdasum) {
    throw InvalidArgument("reducescatter of '" + name + "': op adasum is an allreduce only (Horovod's too)");
  }
  r.op = op;
  r.prescale = prescale;
  r.postscale = postscale;
  r.compression = ShardCompression(compression, CompressionFor(dtype, shape, op), dtype, op,
                                   "reducescatter of '" + name + "'", true);
  return SubmitShards(std::move(r), input, placement, into);
}

std::shared_ptr<Handle> Runtime::Barrier() {
  Request r = NewRequest(RequestType::kBarrier, "__barrier." + std::to_string(barrier_count_++), DataType::kUInt8, {});
  return Submit(std::move(r), nullptr, nullptr);
}

std::shared_ptr<Handle> Runtime::Join() {
  Request r = NewRequest(RequestType::kJoin, "__join__", DataType::kUInt8, {});
  return Submit(std::move(r), nullptr, nullptr);
}

}  // namespace gradcomp
