// How MPI's collective teardown at process exit (MPI_Win_free of the shared-memory window,
// MPI_Finalize) runs after gradcomp stopped. Both wait for every rank of the job: after a clean
// shutdown they return at once; after a failure they may never.
#pragma once

#include <string>

namespace gradcomp {

/// After a peer failed (died, lost its link, or a collective is left half done): the teardown
/// would wait for that peer forever, so it is skipped; the launcher sees a rank exit without
/// finalizing and ends the job with a non-zero status.
void AbandonMpiAtExit();
/// True after AbandonMpiAtExit.
bool MpiAbandoned();

/// After a stop that every rank agreed on in a negotiation round (a stall shutdown): every rank
/// is alive and each may still end its script cleanly (catch the error, save a checkpoint, exit
/// 0), so the teardown runs and the job ends with the scripts' own exit codes. A rank that never
/// ends (its training thread hangs) would hold the others in it forever: once `seconds` have
/// passed since this rank's first teardown step (0: no limit), this process prints why (rank
/// `rank`, `why` the stop) and exits with status 1 without finalizing, and the launcher ends
/// the job.
void BoundMpiTeardown(double seconds, int rank, const std::string& why);

/// One collective teardown step, bounded as BoundMpiTeardown says (unbounded when it was not
/// called). `what`: the MPI call, for the message.
class MpiTeardownStep {
 public:
  explicit MpiTeardownStep(const char* what);
  ~MpiTeardownStep();
  MpiTeardownStep(const MpiTeardownStep&) = delete;
  MpiTeardownStep& operator=(const MpiTeardownStep&) = delete;
};

}  // namespace gradcomp
