#include "core/message.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <type_traits>

#include "ops/common/enforce.h"

namespace gradcomp {

const char* RequestTypeName(RequestType type) {
  switch (type) {
    case RequestType::kAllreduce: return "allreduce";
    case RequestType::kAllgather: return "allgather";
    case RequestType::kBroadcast: return "broadcast";
    case RequestType::kAlltoall: return "alltoall";
    case RequestType::kReducescatter: return "reducescatter";
    case RequestType::kBarrier: return "barrier";
    case RequestType::kJoin: return "join";
  }
  return "unknown";
}

int64_t Request::NumElements() const { return gradcomp::NumElements(shape); }

int64_t Response::PayloadBytes() const {
  int64_t total = 0;
  for (const auto& shape : shapes) total += NumElements(shape) * static_cast<int64_t>(DataTypeSize(dtype));
  return total;
}

int64_t Response::Priority() const {
  return priorities.empty() ? 0 : *std::min_element(priorities.begin(), priorities.end());
}

Response Response::Single(size_t k) const {
  Response s;
  s.type = type;
  s.error = error;
  s.names = {names[k]};
  s.dtype = dtype;
  s.op = op;
  s.root = root;
  s.prescale = prescale;
  s.postscale = postscale;
  s.compression = compression;
  if (k < shapes.size()) s.shapes = {shapes[k]};
  s.rank_dims = rank_dims;  // only unfused types carry rank_dims
  s.last_joined = last_joined;
  s.on_device = on_device;
  if (k < priorities.size()) s.priorities = {priorities[k]};
  return s;
}

namespace {

class Writer {
 public:
  template <typename T>
  void Pod(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>, "Pod needs a trivially copyable type");
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void Str(const std::string& s) {
    Pod(static_cast<uint64_t>(s.size()));
    out_.append(s);
  }
  void Ints(const std::vector<int64_t>& v) {
    Pod(static_cast<uint64_t>(v.size()));
    for (int64_t x : v) Pod(x);
  }
  /// Strings as Str, flags as one byte, numbers as themselves (spec.h gives the order).
  void Spec(const CompressionSpec& c) {
    CompressionSpec::ForEachField(
        [this](const SpecField&, const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, std::string>) {
            Str(v);
          } else if constexpr (std::is_same_v<T, bool>) {
            Pod(static_cast<uint8_t>(v));
          } else {
            Pod(v);
          }
        },
        c);
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// Fewest bytes a serialized request / response takes (empty strings and lists): bounds how
// many a message of a given size can hold.
uint64_t MinSpecBytes() {
  CompressionSpec empty;  // every string field empty
  CompressionSpec::ForEachField(
      [](const SpecField&, auto& v) {
        if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>) v.clear();
      },
      empty);
  Writer w;
  w.Spec(empty);
  return w.Take().size();
}
const uint64_t kMinSpecBytes = MinSpecBytes();
const uint64_t kMinRequestBytes = 4 + 1 + 8 + 1 + 8 + 1 + 4 + 8 + 8 + kMinSpecBytes + 8 + 1 + 4;
const uint64_t kMinResponseBytes = 1 + 8 + 8 + 1 + 1 + 4 + 8 + 8 + kMinSpecBytes + 8 + 8 + 4 + 1 + 8;

class Reader {
 public:
  explicit Reader(const std::string& in) : in_(in) {}
  template <typename T>
  T Pod() {
    Need(sizeof(T));
    T v;
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string Str() {
    const uint64_t n = Pod<uint64_t>();
    Need(n);
    std::string s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  std::vector<int64_t> Ints() {
    std::vector<int64_t> v(Count(sizeof(int64_t)));
    for (auto& x : v) x = Pod<int64_t>();
    return v;
  }
  /// A list's length, checked against the bytes left (each item takes at least
  /// `min_item_bytes`) before anything is allocated for it: a corrupted length fails here
  /// instead of asking for exabytes.
  size_t Count(uint64_t min_item_bytes) {
    const uint64_t n = Pod<uint64_t>();
    GC_ENFORCE(n <= (in_.size() - pos_) / min_item_bytes, "corrupt negotiation message: a list of ", n,
               " items at byte ", pos_, " cannot fit in the ", in_.size() - pos_, " bytes left");
    return static_cast<size_t>(n);
  }
  /// An enum stored as its underlying byte, checked to name one of its `count` values.
  template <typename E>
  E Enum(int count, const char* what) {
    const auto v = Pod<std::underlying_type_t<E>>();
    GC_ENFORCE(static_cast<int>(v) < count, "corrupt negotiation message: ", what, " ", static_cast<int>(v),
               " at byte ", pos_ - sizeof(v), " is not one of the ", count, " known");
    return static_cast<E>(v);
  }
  CompressionSpec Spec() {
    CompressionSpec c;
    CompressionSpec::ForEachField(
        [this](const SpecField&, auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, std::string>) {
            v = Str();
          } else if constexpr (std::is_same_v<T, bool>) {
            v = Pod<uint8_t>() != 0;
          } else {
            v = Pod<T>();
          }
        },
        c);
    return c;
  }
  bool Done() const { return pos_ == in_.size(); }

 private:
  void Need(uint64_t n) const {
    GC_ENFORCE(n <= in_.size() - pos_, "truncated negotiation message: need ", n, " bytes at ", pos_, " of ",
               in_.size());
  }
  const std::string& in_;
  size_t pos_ = 0;
};

}  // namespace

std::string SerializeRequests(const std::vector<Request>& requests) {
  Writer w;
  w.Pod(static_cast<uint64_t>(requests.size()));
  for (const Request& r : requests) {
    w.Pod(r.rank);
    w.Pod(r.type);
    w.Str(r.name);
    w.Pod(r.dtype);
    w.Ints(r.shape);
    w.Pod(r.op);
    w.Pod(r.root);
    w.Pod(r.prescale);
    w.Pod(r.postscale);
    w.Spec(r.compression);
    w.Ints(r.splits);
    w.Pod(static_cast<uint8_t>(r.on_device));
    w.Pod(r.priority);
  }
  return w.Take();
}

std::vector<Request> ParseRequests(const std::string& bytes) {
  Reader rd(bytes);
  std::vector<Request> out(rd.Count(kMinRequestBytes));
  for (Request& r : out) {
    r.rank = rd.Pod<int32_t>();
    r.type = rd.Enum<RequestType>(kNumRequestTypes, "request type");
    r.name = rd.Str();
    r.dtype = rd.Enum<DataType>(kNumDataTypes, "dtype");
    r.shape = rd.Ints();
    r.op = rd.Enum<ReduceOp>(kNumReduceOps, "reduce op");
    r.root = rd.Pod<int32_t>();
    r.prescale = rd.Pod<double>();
    r.postscale = rd.Pod<double>();
    r.compression = rd.Spec();
    r.splits = rd.Ints();
    r.on_device = rd.Pod<uint8_t>() != 0;
    r.priority = rd.Pod<int32_t>();
  }
  GC_ENFORCE(rd.Done(), "trailing bytes after the request list");
  return out;
}

std::string SerializeResponses(const std::vector<Response>& responses) {
  Writer w;
  w.Pod(static_cast<uint64_t>(responses.size()));
  for (const Response& r : responses) {
    w.Pod(r.type);
    w.Str(r.error);
    w.Pod(static_cast<uint64_t>(r.names.size()));
    for (const auto& n : r.names) w.Str(n);
    w.Pod(r.dtype);
    w.Pod(r.op);
    w.Pod(r.root);
    w.Pod(r.prescale);
    w.Pod(r.postscale);
    w.Spec(r.compression);
    w.Pod(static_cast<uint64_t>(r.shapes.size()));
    for (const auto& s : r.shapes) w.Ints(s);
    w.Ints(r.rank_dims);
    w.Pod(r.last_joined);
    w.Pod(static_cast<uint8_t>(r.on_device));
    w.Ints(r.priorities);
  }
  return w.Take();
}

std::vector<Response> ParseResponses(const std::string& bytes) {
  Reader rd(bytes);
  std::vector<Response> out(rd.Count(kMinResponseBytes));
  for (Response& r : out) {
    r.type = rd.Enum<RequestType>(kNumRequestTypes, "request type");
    r.error = rd.Str();
    r.names.resize(rd.Count(sizeof(uint64_t)));
    for (auto& n : r.names) n = rd.Str();
    r.dtype = rd.Enum<DataType>(kNumDataTypes, "dtype");
    r.op = rd.Enum<ReduceOp>(kNumReduceOps, "reduce op");
    r.root = rd.Pod<int32_t>();
    r.prescale = rd.Pod<double>();
    r.postscale = rd.Pod<double>();
    r.compression = rd.Spec();
    r.shapes.resize(rd.Count(sizeof(uint64_t)));
    for (auto& s : r.shapes) s = rd.Ints();
    r.rank_dims = rd.Ints();
    r.last_joined = rd.Pod<int32_t>();
    r.on_device = rd.Pod<uint8_t>() != 0;
    r.priorities = rd.Ints();
  }
  GC_ENFORCE(rd.Done(), "trailing bytes after the response list");
  return out;
}

}  // namespace gradcomp
