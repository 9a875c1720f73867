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
  /// Any field of a message (Request::ForEachField), as its type travels: flags as one byte,
  /// lists as their length then their items.
  template <typename T>
  void Field(const T& v) {
    if constexpr (std::is_same_v<T, bool>) {
      Pod(static_cast<uint8_t>(v));
    } else if constexpr (std::is_same_v<T, std::string>) {
      Str(v);
    } else if constexpr (std::is_same_v<T, CompressionSpec>) {
      Spec(v);
    } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      Ints(v);
    } else if constexpr (std::is_same_v<T, std::vector<std::string>> ||
                         std::is_same_v<T, std::vector<std::vector<int64_t>>>) {
      Pod(static_cast<uint64_t>(v.size()));
      for (const auto& item : v) Field(item);
    } else {
      Pod(v);
    }
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// Fewest bytes a serialized request / response takes (empty strings and lists): bounds how
// many a message of a given size can hold.
template <typename M>
uint64_t MinBytes() {
  M empty;  // its own lists and strings are empty; the spec's strings emptied too
  CompressionSpec::ForEachField(
      [](const SpecField&, auto& v) {
        if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>) v.clear();
      },
      empty.compression);
  Writer w;
  M::ForEachField(empty, [&w](const auto& v) { w.Field(v); });
  return w.Take().size();
}
const uint64_t kMinRequestBytes = MinBytes<Request>();
const uint64_t kMinResponseBytes = MinBytes<Response>();

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
  /// Any field of a message, as Writer::Field wrote it; enums checked to name a known value.
  template <typename T>
  void Field(T& v) {
    if constexpr (std::is_same_v<T, bool>) {
      v = Pod<uint8_t>() != 0;
    } else if constexpr (std::is_same_v<T, RequestType>) {
      v = Enum<RequestType>(kNumRequestTypes, "request type");
    } else if constexpr (std::is_same_v<T, DataType>) {
      v = Enum<DataType>(kNumDataTypes, "dtype");
    } else if constexpr (std::is_same_v<T, ReduceOp>) {
      v = Enum<ReduceOp>(kNumReduceOps, "reduce op");
    } else if constexpr (std::is_same_v<T, std::string>) {
      v = Str();
    } else if constexpr (std::is_same_v<T, CompressionSpec>) {
      v = Spec();
    } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      v = Ints();
    } else if constexpr (std::is_same_v<T, std::vector<std::string>> ||
                         std::is_same_v<T, std::vector<std::vector<int64_t>>>) {
      v.resize(Count(sizeof(uint64_t)));
      for (auto& item : v) Field(item);
    } else {
      static_assert(std::is_arithmetic_v<T>, "a message field of a type the encoding does not know");
      v = Pod<T>();
    }
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

namespace {

// A list of messages: its length, then each message's fields (M::ForEachField) in order.
template <typename M>
std::string SerializeList(const std::vector<M>& messages) {
  Writer w;
  w.Pod(static_cast<uint64_t>(messages.size()));
  for (const M& m : messages) M::ForEachField(m, [&w](const auto& v) { w.Field(v); });
  return w.Take();
}

template <typename M>
std::vector<M> ParseList(const std::string& bytes, uint64_t min_bytes, const char* what) {
  Reader rd(bytes);
  std::vector<M> out(rd.Count(min_bytes));
  for (M& m : out) M::ForEachField(m, [&rd](auto& v) { rd.Field(v); });
  GC_ENFORCE(rd.Done(), "trailing bytes after the ", what, " list");
  return out;
}

}  // namespace

std::string SerializeRequests(const std::vector<Request>& requests) { return SerializeList(requests); }

std::vector<Request> ParseRequests(const std::string& bytes) {
  return ParseList<Request>(bytes, kMinRequestBytes, "request");
}

std::string SerializeResponses(const std::vector<Response>& responses) { return SerializeList(responses); }

std::vector<Response> ParseResponses(const std::string& bytes) {
  return ParseList<Response>(bytes, kMinResponseBytes, "response");
}

}  // namespace gradcomp
