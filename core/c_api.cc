#include "core/c_api.h"

#include <cstring>
#include <memory>
#include <string>

#include "core/runtime.h"
#include "ops/common/enforce.h"

struct gradcomp_runtime {
  std::unique_ptr<gradcomp::Runtime> runtime;
};

struct gradcomp_handle {
  std::shared_ptr<gradcomp::Handle> handle;
};

namespace {

void WriteError(const std::string& message, char* error, size_t error_len) {
  if (error == nullptr || error_len == 0) return;
  const size_t n = std::min(message.size(), error_len - 1);
  std::memcpy(error, message.data(), n);
  error[n] = '\0';
}

// Runs `body`, turning exceptions into a status code and a message.
template <typename Body>
int Guard(char* error, size_t error_len, Body&& body) {
  try {
    body();
    WriteError("", error, error_len);
    return GRADCOMP_OK;
  } catch (const gradcomp::InvalidArgument& e) {
    WriteError(e.what(), error, error_len);
    return GRADCOMP_INVALID_ARGUMENT;
  } catch (const std::exception& e) {
    WriteError(e.what(), error, error_len);
    return GRADCOMP_ERROR;
  }
}

std::vector<int64_t> Shape(const int64_t* shape, int ndim) {
  if (ndim < 0 || (ndim > 0 && shape == nullptr)) {
    throw gradcomp::InvalidArgument("shape: ndim " + std::to_string(ndim) + " with " +
                                    (shape ? "a shape" : "no shape array"));
  }
  return std::vector<int64_t>(shape, shape + ndim);
}

gradcomp::Runtime& Rt(gradcomp_runtime_t* rt) {
  if (rt == nullptr || !rt->runtime) throw gradcomp::InvalidArgument("null gradcomp runtime (call gradcomp_init)");
  return *rt->runtime;
}

void Out(gradcomp_handle_t** out, std::shared_ptr<gradcomp::Handle> h) {
  if (out == nullptr) throw gradcomp::InvalidArgument("null handle pointer");
  *out = new gradcomp_handle{std::move(h)};
}

}  // namespace

extern "C" {

int gradcomp_init(gradcomp_runtime_t** runtime, char* error, size_t error_len) {
  return Guard(error, error_len, [&] {
    if (runtime == nullptr) throw gradcomp::InvalidArgument("gradcomp_init: null runtime pointer");
    auto rt = std::make_unique<gradcomp_runtime>();
    rt->runtime = std::make_unique<gradcomp::Runtime>(gradcomp::RuntimeOptions{});
    *runtime = rt.release();
  });
}

void gradcomp_shutdown(gradcomp_runtime_t* runtime) {
  if (runtime == nullptr) return;
  delete runtime;  // ~Runtime shuts down
}

int gradcomp_rank(const gradcomp_runtime_t* rt) { return rt ? rt->runtime->rank() : -1; }
int gradcomp_size(const gradcomp_runtime_t* rt) { return rt ? rt->runtime->size() : -1; }
int gradcomp_local_rank(const gradcomp_runtime_t* rt) { return rt ? rt->runtime->local_rank() : -1; }
int gradcomp_local_size(const gradcomp_runtime_t* rt) { return rt ? rt->runtime->local_size() : -1; }
int gradcomp_cross_rank(const gradcomp_runtime_t* rt) { return rt ? rt->runtime->cross_rank() : -1; }
int gradcomp_cross_size(const gradcomp_runtime_t* rt) { return rt ? rt->runtime->cross_size() : -1; }

int gradcomp_allreduce_async(gradcomp_runtime_t* rt, const char* name, int dtype, const int64_t* shape, int ndim,
                             const void* input, void* output, int op, double prescale, double postscale,
                             gradcomp_handle_t** handle, char* error, size_t error_len) {
  return Guard(error, error_len, [&] {
    Out(handle, Rt(rt).Allreduce(name ? name : "", gradcomp::DataTypeFromInt(dtype), Shape(shape, ndim), input,
                                 output, gradcomp::ReduceOpFromInt(op), prescale, postscale));
  });
}

int gradcomp_allgather_async(gradcomp_runtime_t* rt, const char* name, int dtype, const int64_t* shape, int ndim,
                             const void* input, gradcomp_handle_t** handle, char* error, size_t error_len) {
  return Guard(error, error_len, [&] {
    Out(handle, Rt(rt).Allgather(name ? name : "", gradcomp::DataTypeFromInt(dtype), Shape(shape, ndim), input));
  });
}

int gradcomp_broadcast_async(gradcomp_runtime_t* rt, const char* name, int dtype, const int64_t* shape, int ndim,
                             void* buffer, int root, gradcomp_handle_t** handle, char* error, size_t error_len) {
  return Guard(error, error_len, [&] {
    Out(handle,
        Rt(rt).Broadcast(name ? name : "", gradcomp::DataTypeFromInt(dtype), Shape(shape, ndim), buffer, root));
  });
}

int gradcomp_barrier(gradcomp_runtime_t* rt, char* error, size_t error_len) {
  return Guard(error, error_len, [&] { Rt(rt).Barrier()->Wait(); });
}

int gradcomp_join(gradcomp_runtime_t* rt, int* last_rank, char* error, size_t error_len) {
  return Guard(error, error_len, [&] {
    auto h = Rt(rt).Join();
    h->Wait();
    if (last_rank) *last_rank = static_cast<int>(h->aux().at(0));
  });
}

int gradcomp_poll(const gradcomp_handle_t* handle) { return handle && handle->handle->Poll() ? 1 : 0; }

int gradcomp_wait(gradcomp_handle_t* handle, char* error, size_t error_len) {
  return Guard(error, error_len, [&] {
    if (handle == nullptr) throw gradcomp::InvalidArgument("gradcomp_wait: null handle");
    handle->handle->Wait();
  });
}

int gradcomp_handle_output(const gradcomp_handle_t* handle, const void** data, size_t* bytes, const int64_t** shape,
                           int* ndim) {
  if (handle == nullptr || !handle->handle->Poll()) return GRADCOMP_INVALID_ARGUMENT;
  const gradcomp::Handle& h = *handle->handle;
  if (data) *data = h.output().data();
  if (bytes) *bytes = h.output().size();
  if (shape) *shape = h.output_shape().data();
  if (ndim) *ndim = static_cast<int>(h.output_shape().size());
  return GRADCOMP_OK;
}

void gradcomp_handle_free(gradcomp_handle_t* handle) { delete handle; }

}  // extern "C"
