#include "ops/comm/mpi_environment.h"

#include <mpi.h>
#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>  // MPIX_CUDA_AWARE_SUPPORT, MPIX_Query_cuda_support
#endif

#include <algorithm>
#include <cstdlib>
#include <string>

#include "ops/comm/mpi_communicator.h"
#include "ops/comm/mpi_exit.h"

namespace gradcomp {

namespace {
void FinalizeAtExit() {
  if (MpiAbandoned()) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  MpiTeardownStep step("MPI_Finalize");
  MPI_Finalize();
}
// The launcher's rank for this process (MPI cannot say before MPI_Init succeeds), or "?".
std::string LauncherRank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
    if (const char* value = std::getenv(name)) return value;
  }
  return "?";
}

std::string InitFailure(int code) {
  return detail::StrCat("rank ", LauncherRank(), ": starting MPI failed (MPI_Init_thread: ", MpiErrorText(code),
                        ", code ", code,
                        "): a rank of the job died or could not be reached while the ranks exchanged their "
                        "addresses, or MPI's transports do not fit this host; MPI's own report above names "
                        "the processes");
}
}  // namespace

void EnsureMpiInitialized() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = 0;
  if (!initialized) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) GC_THROW("MPI was already finalized in this process; gradcomp cannot start it again");
    // Open MPI's TCP transport sends a message over 64 KB by rendezvous: the rest waits for the
    // receiver's acknowledgement. The striped SRA keeps one stripe (~1 MB, sra.h) a peer in
    // flight with its receive posted, and with traffic both ways that acknowledgement queues
    // behind the other direction's data at every stripe, far behind gloo's time for the same
    // allreduce (docs/benchmarks.md, "Stripes on the wire"). Stripes go eagerly unless the user
    // chose otherwise (mpirun --mca btl_tcp_eager_limit, or this variable).
    setenv("OMPI_MCA_btl_tcp_eager_limit", "2097152", 0);
    // Open MPI 5's TCP transport pairs every interface address of two ranks, IPv6 link-local ones
    // included, and prints "Unable to find reachable pairing between local and remote interfaces"
    // (btl_tcp_proc.c) for the IPv6 pairs it cannot make on dual-stack hosts, though IPv4 carries
    // the job (open-mpi/ompi#14079). gradcomp's own connections are IPv4: so is MPI's transport,
    // unless the user chose otherwise (btl_tcp_disable_family 0 keeps both families).
    setenv("OMPI_MCA_btl_tcp_disable_family", "6", 0);
    // MPI-4's initial error handler: Open MPI 5 aborts the process when MPI_Init fails (a rank of
    // the job died while the ranks exchanged their addresses: "MPI_INIT has failed because at
    // least one MPI process is unreachable"); returning lets this process say so and exit 1.
    setenv("OMPI_MCA_mpi_initial_errhandler", "mpi_errors_return", 0);
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) throw Error(InitFailure(rc));
    std::atexit(FinalizeAtExit);
  } else {
    MPI_Query_thread(&provided);
  }
  // The background thread makes every MPI call, but not the thread that initialized MPI.
  if (provided < MPI_THREAD_SERIALIZED) {
    GC_THROW("MPI provides thread level ", provided, " but gradcomp needs at least MPI_THREAD_SERIALIZED (",
             MPI_THREAD_SERIALIZED, "); initialize MPI with MPI_Init_thread(MPI_THREAD_MULTIPLE)");
  }
}

std::unique_ptr<Communicator> CreateMpiWorld() {
  EnsureMpiInitialized();
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
}

void RequireThreadMultiple() {
  EnsureMpiInitialized();
  int provided = 0;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    GC_THROW("process sets and point-to-point messages need MPI_THREAD_MULTIPLE (they call MPI from threads of "
             "their own), but MPI provides thread level ", provided,
             "; initialize MPI with MPI_Init_thread(MPI_THREAD_MULTIPLE)");
  }
}

std::unique_ptr<Communicator> CreateMpiGroupWorld(const std::vector<int>& ranks, int tag) {
  RequireThreadMultiple();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Group world = MPI_GROUP_NULL, members = MPI_GROUP_NULL;
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  MPI_Group_incl(world, static_cast<int>(ranks.size()), ranks.data(), &members);
  MPI_Comm sub = MPI_COMM_NULL;
  const int rc = MPI_Comm_create_group(MPI_COMM_WORLD, members, tag, &sub);
  MPI_Group_free(&members);
  MPI_Group_free(&world);
  if (rc != MPI_SUCCESS) throw Error(MpiErrorMessage(rc, "MPI_Comm_create_group (a group of some ranks)", rank));
  if (sub == MPI_COMM_NULL) GC_THROW("rank ", rank, " is not among the ranks of the group it creates");
  auto result = std::make_unique<MpiCommunicator>(sub);
  MPI_Comm_free(&sub);
  return result;
}

std::unique_ptr<Communicator> CreateMpiSubworld(const std::vector<int>& ranks) {
  RequireThreadMultiple();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const bool member = std::binary_search(ranks.begin(), ranks.end(), rank);
  MPI_Comm sub = MPI_COMM_NULL;
  const int rc = MPI_Comm_split(MPI_COMM_WORLD, member ? 0 : MPI_UNDEFINED, rank, &sub);
  if (rc != MPI_SUCCESS) throw Error(MpiErrorMessage(rc, "MPI_Comm_split (a process set)", rank));
  if (sub == MPI_COMM_NULL) return nullptr;
  auto result = std::make_unique<MpiCommunicator>(sub);
  MPI_Comm_free(&sub);  // MpiCommunicator keeps its own duplicate
  return result;
}

bool MpiIsCudaAware() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  EnsureMpiInitialized();
  return MPIX_Query_cuda_support() == 1;
#else
  return false;  // built without CUDA (Debian's Open MPI), or not Open MPI
#endif
}

std::unique_ptr<Communicator> CudaAwareMpiCommunicator(Communicator& host, Device& device) {
  auto* mpi = dynamic_cast<MpiCommunicator*>(&host);
  if (mpi == nullptr || !MpiIsCudaAware()) return nullptr;
  return std::make_unique<MpiCommunicator>(mpi->handle(), &device);
}

}  // namespace gradcomp
