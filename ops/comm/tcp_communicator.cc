// The TCP world (ops/comm/tcp_communicator.h): connecting it (tcp_connect), its communicator
// and collectives (tcp_collectives), the data path (tcp_mesh) and the spreading of failures
// (tcp_abort), over the wire format of tcp_frames.h.
#include "ops/comm/tcp_communicator.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "ops/comm/tcp_collectives.h"
#include "ops/comm/tcp_connect.h"
#include "ops/common/enforce.h"

namespace gradcomp {

std::unique_ptr<Communicator> ConnectTcpWorld(Communicator& bootstrap, const TcpOptions& options, TcpReport* report) {
  const int n = bootstrap.size();
  std::vector<int> fds(static_cast<size_t>(n), -1);
  TcpReport ignored;
  if (report == nullptr) report = &ignored;
  *report = TcpReport();
  bool elsewhere = false;
  const std::string error = n > 1 ? tcp::ConnectMesh(bootstrap, options, &fds, report, &elsewhere) : std::string();
  // Every rank learns whether every rank connected, and fails alike if not.
  int ok = error.empty() && !elsewhere ? 1 : 0;
  bootstrap.Allreduce(&ok, &ok, 1, DataType::kInt32, ReduceOp::kMin);
  if (!ok) {
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
    const std::vector<std::string> errors = AllgatherStrings(bootstrap, error);
    // Each reason once, with the ranks that gave it (at a thousand ranks, often all of them).
    std::vector<std::pair<std::string, std::vector<int>>> reasons;
    for (size_t r = 0; r < errors.size(); ++r) {
      if (errors[r].empty()) continue;
      auto same = std::find_if(reasons.begin(), reasons.end(), [&](const auto& x) { return x.first == errors[r]; });
      if (same == reasons.end()) same = reasons.insert(reasons.end(), {errors[r], {}});
      same->second.push_back(static_cast<int>(r));
    }
    std::string text = "cannot connect the ranks over TCP:";
    for (const auto& [reason, ranks] : reasons) text += " " + tcp::RankSet(ranks) + ": " + reason + ";";
    throw Error(text);
  }
  std::vector<int> members(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) members[static_cast<size_t>(r)] = r;
  return tcp::MakeCommunicator(std::make_shared<tcp::Mesh>(bootstrap.rank(), std::move(fds), options.unreachable_seconds),
                               0, std::move(members), bootstrap.rank());
}

void AbortTcpWorld(Communicator& comm, const std::string& why) {
  tcp::Mesh* mesh = tcp::MeshOf(comm);
  if (mesh == nullptr) return;
  mesh->Abort("tcp communicator: rank " + std::to_string(mesh->rank()) + " failed: " + why, false);
}

}  // namespace gradcomp
