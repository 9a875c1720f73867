// Time under SimGrid's SMPI. A GRADCOMP_SIMULATION build (cmake -DGRADCOMP_SIMULATION=ON, driven
// by examples/benchmarks/simulate.py) runs the data plane's real code as the ranks of a
// simulated cluster: every rank is a SimGrid actor, one at a time in one process, and time is
// the simulation's. SMPI can measure the CPU time spent between MPI calls and advance the rank's
// clock by it (simulate.py's default counts only codec work instead: CodecCost); what happens
// outside MPI calls needs this header:
//  - waiting without an MPI call (PollUntil's naps) must advance simulated time, not real time;
//  - work the real build runs on a helper thread (the striped SRA's Pipeline) overlaps with the
//    rank's communication: it is run for real, timed, and its duration is placed on a timeline
//    of its own (the helper's core) instead of the rank's.
// In an ordinary build Now and Sleep are the real clock (Poller uses them), the rest no-ops.
#pragma once

#include <cstddef>
#include <functional>

namespace gradcomp {
namespace sim {

#if defined(GRADCOMP_SIMULATION)
constexpr bool kSimulated = true;
#else
constexpr bool kSimulated = false;
#endif

/// Seconds on this rank's simulated clock (MPI_Wtime under SMPI).
double Now();
/// Advances this rank's simulated clock by `seconds` without using its CPU.
void Sleep(double seconds);
/// Occupies this rank's simulated core for `seconds` (of this machine's CPU time).
void Compute(double seconds);
/// What codec work that took `real_seconds` here costs a simulated host, times
/// GRADCOMP_SIM_CODEC_SCALE (default 1; 0: free, the network alone): `priced_seconds` under a
/// profile (GRADCOMP_SIM_CODEC_PROFILE, below), else the time measured, scaled by how much slower
/// the simulated host is than this machine (SMPI's smpi/host-speed over its speed). Adds it to
/// this rank's CodecCharged.
double CodecCost(double real_seconds, double priced_seconds);
/// Seconds of codec work charged to this rank so far (CodecCost's sum).
double CodecCharged();

/// Work a measured profile prices instead of this machine's clock: GRADCOMP_SIM_CODEC_PROFILE=FILE,
/// the seconds one call of n values takes on some device, host or GPU, as
/// examples/benchmarks/codec_profile writes them ("OP CODEC VALUES SECONDS" lines, interpolated
/// between the measured sizes). A profile measured once on a GPU gives a simulation the GPU's
/// codec time; one measured here on real data stands for the codec where the simulated ranks'
/// buffers are shared (GRADCOMP_SIM_SHARED_MB), whose meaningless values the codec takes longer on.
/// Counted where the host device does the work (cpu_device.cc) and where a staged buffer meets the
/// wire (staging.h: a copy between a GPU and the host, none on the host device).
enum class Work { kEncode, kDecode, kDecodeAccumulate, kCopy, kElementwise, kToHost, kFromHost };
/// The profile's name of `work` ("encode", ..., "to_host").
const char* WorkName(Work work);
#if defined(GRADCOMP_SIMULATION)
/// Counts one call of `work` on `values` float32 values (bytes / 4 for copies) of codec `codec`
/// ("maxmin4", "fp16": its CandidateToken; null for work of no codec). Nothing without a profile.
void CountWork(Work work, const char* codec, double values);
#else
inline void CountWork(Work, const char*, double) {}
#endif
/// A Pipeline task's cost on the simulated clock: runs `task` for real, outside SMPI's measurement
/// of this rank's CPU time, and returns CodecCost of the time it took and of the work it counted.
/// Work counted outside any task (the data path's own copies, staging and scaling between its
/// steps) is charged where it is counted, on the rank's own core, when a profile prices it; the
/// codec's timed mode (no profile) charges tasks only.
double TaskCost(const std::function<void()>& task);

/// Seconds on the real (monotonic) clock, in any build.
double RealNow();

/// The clock a phase of work is timed with: the simulated one, except inside an Unaccounted
/// section, where the rank's simulated clock stands still and TaskNow gives the work's cost.
/// The real clock in an ordinary build.
double WorkNow();

/// While one lives, SMPI does not count this rank's CPU time (no-op in an ordinary build).
class Unaccounted {
 public:
  Unaccounted();
  ~Unaccounted();
  Unaccounted(const Unaccounted&) = delete;
  Unaccounted& operator=(const Unaccounted&) = delete;
};

/// Large host buffers of a simulation whose ranks' real memory would not fit in this machine's
/// (GRADCOMP_SIM_SHARED_MB=M: buffers of at least M MB): SMPI's shared allocation, the same
/// physical pages for every rank and buffer, so their contents are meaningless and only the
/// times count. Returns null when the buffer is to be allocated normally (always, in an
/// ordinary build).
void* SharedAllocate(size_t bytes);
/// Frees `ptr` if SharedAllocate returned it; false otherwise.
bool SharedFree(void* ptr);

/// The clock work run outside SMPI's measurement is timed with: the calling thread's CPU time
/// under SMPI (as SMPI times a rank's computation: immune to other processes taking the core),
/// the real clock otherwise.
double TaskNow();

/// Runs `work` for real, outside SMPI's measurement of this rank's CPU time, and returns how
/// long it took (TaskNow).
template <typename Work>
double TimeUnaccounted(Work&& work) {
  Unaccounted pause;
  const double t0 = TaskNow();
  work();
  return TaskNow() - t0;
}

}  // namespace sim
}  // namespace gradcomp
