// How a Runtime ends on a failure: a collective that timed out (the watchdog), a stop every rank
// agreed on (a stall shutdown, whose MPI teardown is bounded), a failed background thread (the
// TCP peers told, MPI left unfinalized), a rank lost between the shutdown round and MPI's
// teardown, and the exit that follows.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "core/runtime.h"
#include "ops/comm/mpi_exit.h"
#include "ops/comm/tcp_communicator.h"

namespace gradcomp {

namespace {

// `text` followed by the sentence `more`.
std::string AddSentence(const std::string& text, const std::string& more) {
  return text + (!text.empty() && text.back() == '.' ? " " : ". ") + more;
}

}  // namespace

std::string Runtime::BackgroundFailure(const std::exception& e) {
  return std::string("gradcomp's background thread failed: ") + e.what();
}

std::string Runtime::ShutDownBy(const std::vector<int>& stopped_by) const {
  std::string who;
  for (size_t i = 0; i < stopped_by.size(); ++i) {
    who += (i == 0 ? "" : i + 1 == stopped_by.size() ? " and " : ", ") + std::to_string(RankName(rank_names_, stopped_by[i]));
  }
  if (who.empty()) return "gradcomp was shut down (shutdown() was called on a rank)";
  return "gradcomp was shut down by rank" + std::string(stopped_by.size() > 1 ? "s " : " ") + who +
         " (its script called shutdown() or ended, on an error or not)";
}

void Runtime::OnCollectiveTimeout(Watchdog::Expired expired) {
  if (mpi_world_) AbandonMpiAtExit();  // MPI_Finalize would wait for the lost peer
  const std::string message =
      "rank " + (started_.load() ? std::to_string(RankName(rank_names_, topo_.rank())) : std::string("?")) + ": " +
      expired.what +
      " has not completed after " + std::to_string(static_cast<int>(expired.seconds)) +
      " s (GRADCOMP_COLLECTIVE_TIMEOUT_SECONDS=" + std::to_string(static_cast<int>(watchdog_.timeout_seconds())) +
      "): a peer rank died, stopped or lost its network link. MPI cannot cancel the call, so gradcomp cannot "
      "continue and this process exits with status 1";
  if (!started_.load()) {
    // Still in the constructor: log_ may not exist yet, and the caller is blocked in MPI.
    std::fprintf(stderr, "gradcomp (pid %d): %s\n", static_cast<int>(getpid()), message.c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }
  log_->error("{}", message);
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    stopped_reason_ = message;
  }
  running_.store(false);
  // The caller waiting for these sees the message (a Python exception), and can exit.
  for (const std::shared_ptr<Handle>& h : expired.handles) h->Fail(message);
  queue_->FailAll(message);
  if (stop_requested_.load()) ExitProcess(message);
  // The background thread stays blocked inside MPI, so this process cannot shut down cleanly:
  // give the training thread a moment to react (save a checkpoint, print), then end it.
  const double grace = std::min(30.0, watchdog_.timeout_seconds());
  std::this_thread::sleep_for(std::chrono::duration<double>(grace));
  ExitProcess("still running " + std::to_string(static_cast<int>(grace)) + " s after: " + message);
}

std::string Runtime::AgreedStop(const std::string& fatal) {
  std::string reason = fatal;
  if (mpi_world_) {
    const double bound = watchdog_.timeout_seconds();
    BoundMpiTeardown(bound, RankName(rank_names_, topo_.rank()), fatal);
    reason = AddSentence(reason, "Every rank stopped gradcomp: the job ends with the scripts' own exit codes once "
                                 "every rank's script has ended");
    if (bound > 0) {
      reason += " (a rank whose script is still running " + std::to_string(static_cast<int>(bound)) +
                " s after this one's ended, GRADCOMP_COLLECTIVE_TIMEOUT_SECONDS, makes the job fail)";
    }
  }
  log_->error("{}", reason);
  return reason;
}

std::string Runtime::BackgroundFailed(const std::exception& e) {
  std::string reason = BackgroundFailure(e);
  // Over TCP the other ranks hear why at once (over MPI they wait for the watchdog).
  if (tcp_) AbortTcpWorld(*tcp_, e.what());
  if (mpi_world_) {
    // A peer may be gone, or a collective left half done: MPI cannot be finalized.
    AbandonMpiAtExit();
    reason = AddSentence(reason, "MPI is left unfinalized at this process's exit (a finalize could wait forever for "
                                 "a lost rank), so mpirun ends the job with a non-zero exit status whatever this "
                                 "script returns (unless run with --enable-recovery)");
  }
  log_->error("{}", reason);
  return reason;
}

void Runtime::MeetBeforeMpiTeardown() {
  // Every rank agreed in the shutdown round, but each reaches its teardown when its own script
  // ends. A rank that dies in between (SIGKILLed, the OOM killer) never reaches MPI_Win_free, and
  // under a launcher that lets the survivors run (mpirun --enable-recovery) they would wait for it
  // there forever. The dead rank's TCP connections close with it: this barrier fails at once on
  // every rank, naming it. A rank still running its script is waited for, as MPI would, up to
  // the collective timeout: a rank alive but never coming (its script waits in torch's
  // rendezvous for this one, say) then ends this process (the watchdog, OnCollectiveTimeout).
  // A script ending on an uncaught exception does not come here at all (MPI abandoned: the
  // Python package's sys.excepthook).
  if (!mpi_world_ || !tcp_ || MpiAbandoned()) return;
  try {
    // Bounded as MPI's own teardown steps are after a stall shutdown (a stopped rank never comes).
    MpiTeardownStep step("the ranks' meeting before MPI_Win_free");
    Watchdog::Step watched(watchdog_, "the ranks' meeting at shutdown, before MPI's teardown (a rank that has not "
                                      "shut gradcomp down: its script still runs, or waits outside gradcomp)");
    tcp_->Barrier();
  } catch (const std::exception& e) {
    AbandonMpiAtExit();
    log_->error("at shutdown, before MPI's teardown: {}. MPI_Win_free and MPI_Finalize would wait for that rank "
                "forever, so this process skips them: MPI is left unfinalized at its exit, so mpirun ends the job with a "
                "non-zero exit status whatever this script returns (unless run with --enable-recovery)",
                e.what());
  }
}

void Runtime::ExitProcess(const std::string& why) {
  log_->error("exiting with status 1: {}", why);
  log_->flush();
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);
}

}  // namespace gradcomp
