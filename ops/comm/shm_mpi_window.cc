#include "ops/comm/shm_mpi_window.h"

#include <utility>
#include <vector>

#include "ops/comm/mpi_communicator.h"
#include "ops/comm/mpi_exit.h"

namespace gradcomp {

namespace {

class MpiWindow final : public SharedSegments {
 public:
  MpiWindow(const MpiCommunicator& node, size_t segment_bytes) : rank_(node.rank()) {
    MPI_Info info;
    GC_MPI_CHECK(MPI_Info_create(&info));
    MPI_Info_set(info, "alloc_shared_noncontig", "true");
    void* base = nullptr;
    const int rc = MPI_Win_allocate_shared(static_cast<MPI_Aint>(segment_bytes), 1, info, node.handle(), &base, &win_);
    MPI_Info_free(&info);
    GC_MPI_CHECK(rc);
    segments_.resize(static_cast<size_t>(node.size()));
    for (int r = 0; r < node.size(); ++r) {
      MPI_Aint bytes = 0;
      int disp_unit = 0;
      void* ptr = nullptr;
      GC_MPI_CHECK(MPI_Win_shared_query(win_, r, &bytes, &disp_unit, &ptr));
      segments_[static_cast<size_t>(r)] = static_cast<char*>(ptr);
    }
    GC_MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_));
  }

  ~MpiWindow() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized || win_ == MPI_WIN_NULL) return;
    // MPI_Win_free is collective: after a peer failed it would wait for that peer forever.
    // The process is about to exit; the launcher removes the segment with the job.
    if (MpiAbandoned()) return;
    MpiTeardownStep step("MPI_Win_free");
    MPI_Win_unlock_all(win_);
    MPI_Win_free(&win_);
  }

  char* segment(int r) const override { return segments_[static_cast<size_t>(r)]; }
  void Fence() override { GC_MPI_CHECK(MPI_Win_sync(win_)); }

 private:
  const int rank_;  // for GC_MPI_CHECK messages
  MPI_Win win_ = MPI_WIN_NULL;
  std::vector<char*> segments_;
};

}  // namespace

std::unique_ptr<Communicator> MakeMpiShmCommunicator(MPI_Comm node, size_t staging_bytes) {
  auto messages = std::make_unique<MpiCommunicator>(node);
  auto window = std::make_unique<MpiWindow>(*messages, ShmCommunicator::SegmentBytes(staging_bytes));
  return std::make_unique<ShmCommunicator>(std::move(messages), std::move(window), staging_bytes);
}

}  // namespace gradcomp
