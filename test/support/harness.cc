#include "test/support/harness.h"

#include <time.h>

#include <exception>
#include <mutex>
#include <thread>

#include "ops/comm/inprocess_communicator.h"
#include "ops/comm/tcp_communicator.h"
#include "ops/common/enforce.h"

namespace gradcomp::testing {

std::vector<std::string> RunRanks(int world_size, const std::function<std::string(Communicator&)>& fn,
                                  RankTransport transport) {
  std::vector<std::unique_ptr<Communicator>> comms = CreateInProcessWorld(world_size);
  std::vector<std::string> results(static_cast<size_t>(world_size));
  std::mutex mu;
  std::exception_ptr first_error;
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Communicator> tcp;
      try {
        if (transport == RankTransport::kTcp) tcp = ConnectTcpWorld(*comms[static_cast<size_t>(r)], TcpOptions{});
        results[static_cast<size_t>(r)] = fn(tcp ? *tcp : *comms[static_cast<size_t>(r)]);
      } catch (const std::exception& e) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (!first_error) first_error = std::current_exception();
        }
        AbortInProcessWorld(*comms[static_cast<size_t>(r)], "rank " + std::to_string(r) + " failed: " + e.what());
        if (tcp) AbortTcpWorld(*tcp, e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
  return results;
}

std::vector<std::string> RunTopology(int world_size, int local_size,
                                     const std::function<std::string(Topology&)>& fn) {
  return RunRanks(world_size, [&](Communicator& world) {
    // The topology owns its world communicator; hand it a Split copy of this rank's world.
    Topology topo = BuildTopology(world.Split(0, world.rank()), local_size, LocalTransport::kSharedMemory);
    return fn(topo);
  });
}

double ThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

std::string Failures(const std::vector<std::string>& results) {
  std::string out;
  for (size_t r = 0; r < results.size(); ++r) {
    if (!results[r].empty()) out += "rank " + std::to_string(r) + ": " + results[r] + "\n";
  }
  return out;
}

}  // namespace gradcomp::testing
