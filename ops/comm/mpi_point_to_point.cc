#include "ops/comm/mpi_point_to_point.h"

#include <mpi.h>

#include <climits>
#include <string>

#include "ops/comm/mpi_communicator.h"
#include "ops/comm/mpi_environment.h"
#include "ops/common/enforce.h"

namespace gradcomp {

namespace {

// MPI counts are ints: a message carries at most INT_MAX bytes.
int CountOf(size_t bytes, const char* what, int peer, int tag) {
  if (bytes > static_cast<size_t>(INT_MAX)) {
    throw InvalidArgument(detail::StrCat(what, " of ", bytes, " bytes (rank ", peer, ", tag ", tag,
                                         "): a point-to-point message carries at most ", INT_MAX,
                                         " bytes; send the tensor in parts"));
  }
  return static_cast<int>(bytes);
}

class MpiRequest final : public PointToPointRequest {
 public:
  MpiRequest(bool send, size_t bytes, int peer, int tag, int rank)
      : send_(send), bytes_(bytes), peer_(peer), tag_(tag), rank_(rank) {}
  ~MpiRequest() override {
    // A request still pending when dropped (its caller gave up on it) is left to MPI: freeing
    // it lets the transfer end on its own; the caller keeps the buffer alive.
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && request_ != MPI_REQUEST_NULL) MPI_Request_free(&request_);
  }

  MPI_Request* handle() { return &request_; }

  bool Test() override {
    if (!error_.empty()) throw Error(error_);
    if (done_) return true;
    if (cancelled_) return false;
    int flag = 0;
    MPI_Status status;
    const int rc = MPI_Test(&request_, &flag, &status);
    if (rc != MPI_SUCCESS) {
      int error_class = 0;
      MPI_Error_class(rc, &error_class);
      Fail(error_class == MPI_ERR_TRUNCATE ? Larger() : MpiErrorMessage(rc, Describe().c_str(), rank_));
    }
    if (!flag) return false;
    done_ = true;
    source_ = status.MPI_SOURCE;
    if (!send_) {
      int count = 0;
      MPI_Get_count(&status, MPI_BYTE, &count);
      if (static_cast<size_t>(count) != bytes_) Fail(Smaller(count));
    }
    return true;
  }

  void CancelReceive() override {
    if (send_ || done_ || request_ == MPI_REQUEST_NULL) return;
    MPI_Cancel(&request_);
    MPI_Status status;
    MPI_Wait(&request_, &status);
    int cancelled = 0;
    MPI_Test_cancelled(&status, &cancelled);
    if (cancelled) {
      cancelled_ = true;  // never completes now
      return;
    }
    done_ = true;  // it arrived meanwhile: complete, as if tested
    source_ = status.MPI_SOURCE;
    int count = 0;
    MPI_Get_count(&status, MPI_BYTE, &count);
    if (static_cast<size_t>(count) != bytes_) error_ = Smaller(count);
  }

  int source() const override { return send_ ? peer_ : source_; }

 private:
  std::string Describe() const {
    const std::string from = peer_ < 0 ? std::string("any rank") : "rank " + std::to_string(peer_);
    return send_ ? detail::StrCat("send to rank ", peer_, " (tag ", tag_, ")")
                 : detail::StrCat("recv from ", from, " (tag ", tag_, ")");
  }
  std::string Larger() const {
    return detail::StrCat(Describe(), ": the message is larger than the tensor's ", bytes_,
                          " bytes (send and receive tensors of the same size)");
  }
  std::string Smaller(int count) const {
    return detail::StrCat(Describe(), ": the message holds ", count, " bytes, the tensor ", bytes_,
                          " (send and receive tensors of the same size)");
  }
  [[noreturn]] void Fail(const std::string& message) {
    error_ = message;
    throw Error(error_);
  }

  MPI_Request request_ = MPI_REQUEST_NULL;
  const bool send_;
  const size_t bytes_;
  const int peer_, tag_, rank_;
  bool done_ = false, cancelled_ = false;
  int source_ = -1;
  std::string error_;
};

}  // namespace

struct PointToPoint::Impl {
  // The group's own duplicate (MpiCommunicator: MPI_ERRORS_RETURN, freed unless MPI finalized);
  // the messages use its MPI handle directly (any source, cancellation, the received size).
  std::unique_ptr<Communicator> comm;
  MPI_Comm handle = MPI_COMM_NULL;
  int max_tag = 32767;
};

PointToPoint::PointToPoint(const std::vector<int>& ranks, int tag) : impl_(std::make_unique<Impl>()) {
  RequireThreadMultiple();
  impl_->comm = ranks.empty() ? CreateMpiWorld() : CreateMpiGroupWorld(ranks, tag);
  impl_->handle = static_cast<MpiCommunicator&>(*impl_->comm).handle();
  void* bound = nullptr;
  int found = 0;
  MPI_Comm_get_attr(impl_->handle, MPI_TAG_UB, &bound, &found);
  if (found && bound != nullptr) impl_->max_tag = *static_cast<int*>(bound);
}

PointToPoint::~PointToPoint() = default;

int PointToPoint::rank() const { return impl_->comm->rank(); }
int PointToPoint::size() const { return impl_->comm->size(); }
int PointToPoint::max_tag() const { return impl_->max_tag; }

std::unique_ptr<PointToPointRequest> PointToPoint::Send(const void* data, size_t bytes, int peer, int tag) {
  const int rank_ = rank(), size = this->size();
  const int count = CountOf(bytes, "send", peer, tag);
  GC_ENFORCE(peer >= 0 && peer < size && tag >= 0 && tag <= impl_->max_tag, "send to rank ", peer, " with tag ", tag,
             " in a group of ", size);
  auto request = std::make_unique<MpiRequest>(true, bytes, peer, tag, rank_);
  GC_MPI_CHECK(MPI_Isend(data, count, MPI_BYTE, peer, tag, impl_->handle, request->handle()));
  return request;
}

std::unique_ptr<PointToPointRequest> PointToPoint::Receive(void* data, size_t bytes, int peer, int tag) {
  const int rank_ = rank(), size = this->size();
  const int count = CountOf(bytes, "recv", peer, tag);
  GC_ENFORCE(peer >= -1 && peer < size && tag >= 0 && tag <= impl_->max_tag, "recv from rank ", peer, " with tag ",
             tag, " in a group of ", size);
  auto request = std::make_unique<MpiRequest>(false, bytes, peer, tag, rank_);
  const int source = peer < 0 ? MPI_ANY_SOURCE : peer;
  GC_MPI_CHECK(MPI_Irecv(data, count, MPI_BYTE, source, tag, impl_->handle, request->handle()));
  return request;
}

}  // namespace gradcomp
