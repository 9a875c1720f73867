#include "ops/comm/tcp_point_to_point.h"

#include <mutex>
#include <string>
#include <utility>

#include "ops/comm/tcp_collectives.h"
#include "ops/comm/tcp_communicator.h"
#include "ops/common/enforce.h"

namespace gradcomp {

struct TcpPointToPoint::Shared {
  std::mutex mu;
  std::unique_ptr<Communicator> group;
};

namespace {

class TcpRequest final : public PointToPointRequest {
 public:
  TcpRequest(std::shared_ptr<TcpPointToPoint::Shared> shared, std::unique_ptr<PendingTransfer> transfer, bool send,
             int peer, int tag)
      : shared_(std::move(shared)), transfer_(std::move(transfer)), send_(send), peer_(peer), tag_(tag),
        source_(peer) {}
  ~TcpRequest() override {
    // The backend keeps its messages until they complete: one still pending here is dropped at
    // the group's end, and its transfer would wait for it forever. The group's messages end
    // instead, the peers told why (a cancelled receive's transfer failed so already).
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (transfer_ && !done_ && !cancelled_) {
      try {
        if (!transfer_->Test()) AbortTcpWorld(*shared_->group, Describe() + " was dropped before it completed");
      } catch (const std::exception&) {
        // Failed already: the transfer's destructor returns at once.
      }
    }
    transfer_.reset();
  }

  bool Test() override {
    if (cancelled_) return false;
    if (done_) return true;
    std::lock_guard<std::mutex> lock(shared_->mu);
    try {
      done_ = transfer_->Test();
    } catch (const Error& e) {
      throw Error(Describe() + ": " + e.what());
    }
    return done_;
  }

  void CancelReceive() override {
    if (send_ || done_ || cancelled_) return;
    // A receive posted on the mesh cannot be withdrawn: the group's messages end here, every peer
    // told why (their pending and later sends and receives fail with it).
    std::lock_guard<std::mutex> lock(shared_->mu);
    AbortTcpWorld(*shared_->group,
                  Describe() + " was given up on after its timeout; this group's send and recv are closed");
    cancelled_ = true;
  }

  int source() const override { return source_; }
  std::string Describe() const {
    // As the MPI messages name themselves (mpi_point_to_point.cc).
    const std::string who = peer_ < 0 ? "any rank" : "rank " + std::to_string(peer_);
    return std::string(send_ ? "send to " : "recv from ") + who + " (tag " + std::to_string(tag_) + ")";
  }
  /// Where a receive from any rank writes the rank it took.
  int* source_slot() { return &source_; }
  void Start(std::unique_ptr<PendingTransfer> transfer) { transfer_ = std::move(transfer); }

 private:
  std::shared_ptr<TcpPointToPoint::Shared> shared_;
  std::unique_ptr<PendingTransfer> transfer_;
  const bool send_;
  const int peer_, tag_;
  int source_;
  bool done_ = false, cancelled_ = false;
};

}  // namespace

TcpPointToPoint::TcpPointToPoint(std::unique_ptr<Communicator> group) : shared_(std::make_shared<Shared>()) {
  shared_->group = std::move(group);
}

int TcpPointToPoint::rank() const { return shared_->group->rank(); }
int TcpPointToPoint::size() const { return shared_->group->size(); }

std::unique_ptr<PointToPointRequest> TcpPointToPoint::Send(const void* data, size_t bytes, int peer, int tag) {
  if (peer < 0 || peer >= size() || tag < 0) {
    throw InvalidArgument("send of " + std::to_string(bytes) + " bytes to rank " + std::to_string(peer) + " (tag " +
                          std::to_string(tag) + "): the rank must be in 0.." + std::to_string(size() - 1) +
                          " and the tag at least 0");
  }
  std::lock_guard<std::mutex> lock(shared_->mu);
  auto transfer = shared_->group->Isend(data, bytes, peer, tag);
  return std::make_unique<TcpRequest>(shared_, std::move(transfer), true, peer, tag);
}

std::unique_ptr<PointToPointRequest> TcpPointToPoint::Receive(void* data, size_t bytes, int peer, int tag) {
  if (peer < -1 || peer >= size() || tag < 0) {
    throw InvalidArgument("receive of " + std::to_string(bytes) + " bytes from rank " + std::to_string(peer) +
                          " (tag " + std::to_string(tag) + "): the rank must be in 0.." + std::to_string(size() - 1) +
                          " and the tag at least 0");
  }
  std::lock_guard<std::mutex> lock(shared_->mu);
  auto request = std::make_unique<TcpRequest>(shared_, nullptr, false, peer, tag);
  request->Start(peer < 0 ? tcp::IrecvFromAny(*shared_->group, data, bytes, tag, request->source_slot())
                          : shared_->group->Irecv(data, bytes, peer, tag));
  return request;
}

}  // namespace gradcomp
