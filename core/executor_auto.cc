// The executor's side of adaptive compression: the response's tensors as auto reads them, one
// allreduce per setting auto resolves them to (a reduce-scatter's one tensor: its setting), and
// the probe its cost model times.
#include "core/executor.h"

#include <chrono>

#include "core/executor_parts.h"
#include "ops/reduce/reduce.h"

namespace gradcomp {

// The response's entries as adaptive compression reads them: float32 on the host, copied from
// their device or cast where they are not that already.
class Executor::AutoView final : public AutoTensors {
 public:
  AutoView(Executor& ex, const Response& r, const EntryList& entries) : ex_(ex), r_(r), entries_(entries) {}
  bool Has(size_t i) const override { return entries_[i] != nullptr; }
  const float* Values(size_t i, const std::vector<std::pair<size_t, size_t>>& ranges,
                      std::vector<float>* keep) override {
    const auto n = static_cast<size_t>(NumElements(r_.shapes[i]));
    if (ranges.size() == 1 && ranges[0].first == 0 && ranges[0].second == n) {
      return ex_.HostFloats(*entries_[i], r_.dtype, n, keep);
    }
    return ex_.SampleFloats(*entries_[i], r_.dtype, ranges, keep);
  }
  std::vector<float> Residual(size_t i) override {
    OnDevice& on = ex_.On(EntryDevice(*entries_[i]));
    return ex_.memory_.OwnResidual(on.device(), on.stream(), r_.names[i]);
  }

 private:
  Executor& ex_;
  const Response& r_;
  const EntryList& entries_;
};

void Executor::RunAutoAllreduce(const Response& r, EntryList& entries) {
  AutoView view(*this, r, entries);
  for (const AutoGroup& g : auto_->Resolve(r, view, *topo_.world)) RunAutoGroup(r, entries, g);
}

void Executor::RunAutoReducescatter(const Response& r, EntryList& entries) {
  AutoView view(*this, r, entries);
  const std::vector<AutoGroup> groups = auto_->Resolve(r, view, *topo_.world);
  Response sub = r;  // one tensor: one group
  sub.compression = groups.at(0).spec;
  RunReducescatter(sub, entries, groups[0].flush);
  if (groups[0].flush) memory_.Forget(r.names[0]);  // it moved to none: its residual went out exactly
}

void Executor::RunAutoGroup(const Response& r, EntryList& entries, const AutoGroup& g) {
  Response sub = r;
  sub.names.clear();
  sub.shapes.clear();
  sub.compression = g.spec;
  EntryList part;
  for (size_t i : g.members) {
    sub.names.push_back(r.names[i]);
    sub.shapes.push_back(r.shapes[i]);
    part.push_back(std::move(entries[i]));
  }
  // The entries go back whatever happens: the caller fails their handles on an error.
  struct Return {
    EntryList& from;
    EntryList& to;
    const std::vector<size_t>& at;
    ~Return() {
      for (size_t j = 0; j < at.size(); ++j) to[at[j]] = std::move(from[j]);
    }
  } give_back{part, entries, g.members};
  // A tensor that moved to none with a residual sends it this once, exactly, and drops it (none
  // with error feedback: DeliversResiduals); after that, none is the plain allreduce.
  if (sub.compression.exact()) sub.compression.error_feedback = g.flush;
  RunAllreduce(sub, part);
}

double Executor::TimeUncompressed(size_t bytes) {
  Response r;
  r.names = {"gradcomp.auto.probe"};
  r.shapes = {{static_cast<int64_t>(bytes / sizeof(float))}};
  std::vector<float> values(bytes / sizeof(float), 1.0f);
  EntryList entries;
  entries.push_back(std::make_unique<TensorEntry>());
  entries[0]->input = entries[0]->output = values.data();
  entries[0]->handle = std::make_shared<Handle>();
  Prepare(r, entries);
  topo_.world->Barrier();
  const auto start = std::chrono::steady_clock::now();
  RunAllreduce(r, entries);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

const float* Executor::HostFloats(const TensorEntry& e, DataType dtype, size_t n, std::vector<float>* keep) {
  if (&EntryDevice(e) == &HostDevice() && dtype == DataType::kFloat32) return static_cast<const float*>(e.input);
  return SampleFloats(e, dtype, {{0, n}}, keep);
}

const float* Executor::SampleFloats(const TensorEntry& e, DataType dtype,
                                    const std::vector<std::pair<size_t, size_t>>& ranges, std::vector<float>* keep) {
  Device& device = EntryDevice(e);
  const size_t width = DataTypeSize(dtype);
  size_t m = 0;
  for (const auto& range : ranges) m += range.second;
  keep->resize(m);
  if (&device == &HostDevice()) {  // cast range by range, straight from the tensor
    size_t at = 0;
    for (const auto& [from, count] : ranges) {
      CastBuffer(static_cast<const char*>(e.input) + from * width, dtype, count, keep->data() + at,
                 DataType::kFloat32, false);
      at += count;
    }
    return keep->data();
  }
  std::vector<char> raw(m * width);
  if (e.ready) e.ready->Block(StreamOf(device));
  size_t at = 0;
  for (const auto& [from, count] : ranges) {
    device.CopyToHost(raw.data() + at, static_cast<const char*>(e.input) + from * width, count * width,
                      StreamOf(device));
    at += count * width;
  }
  StreamOf(device).Synchronize();
  CastBuffer(raw.data(), dtype, m, keep->data(), DataType::kFloat32, false);
  return keep->data();
}

}  // namespace gradcomp
