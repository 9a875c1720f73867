#include "ops/comm/tcp_connect.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "ops/comm/net_interfaces.h"
#include "ops/comm/tcp_frames.h"
#include "ops/common/enforce.h"

namespace gradcomp {
namespace tcp {

// "rank 3", "ranks 0-2, 5, 7-9": a large job's ranks named in one line.
std::string RankSet(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + NumberRanges(ranks, ", ");
}

namespace {

void SetNonBlocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

void SetNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// A peer that acknowledges nothing for `seconds` (0: the kernel's defaults) fails the connection
// with ETIMEDOUT: keepalive probes ask an idle connection's peer, and TCP_USER_TIMEOUT bounds how
// long data or probes may go unacknowledged. A live peer's kernel acknowledges both, however busy
// or stopped its process is.
void SetUnreachableTimeout(int fd, double seconds) {
  if (seconds <= 0) return;
  const int one = 1;
  const int idle = std::clamp(static_cast<int>(seconds / 4), 1, 60);
  const int interval = std::clamp(static_cast<int>(seconds / 8), 1, 30);
  const int probes = 127;  // the most Linux takes; TCP_USER_TIMEOUT ends it first
  const unsigned int user_timeout_ms = static_cast<unsigned int>(std::min(seconds, 4e6) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof user_timeout_ms);
}

int MillisLeft(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(left, 1 << 30)));
}

// Waits for `events` on fd until the deadline; false on timeout.
bool WaitFor(int fd, short events, Clock::time_point deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    const int ready = ::poll(&p, 1, MillisLeft(deadline));
    if (ready > 0) return true;
    if (ready == 0) return false;
    if (errno != EINTR) return false;
  }
}

// Moves exactly `bytes` through a nonblocking socket before the deadline; false (with `why`) if not.
bool Exchange(int fd, char* data, size_t bytes, bool send, Clock::time_point deadline, std::string* why) {
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = send ? ::send(fd, data + done, bytes - done, MSG_NOSIGNAL) : ::recv(fd, data + done, bytes - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      *why = "the connection closed during the greeting";
      return false;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      *why = ErrnoText(errno);
      return false;
    }
    if (!WaitFor(fd, send ? POLLOUT : POLLIN, deadline)) {
      *why = "no greeting in time";
      return false;
    }
  }
  return true;
}

// Appends "address:port: why" to a "; "-separated list of failed attempts.
void AddFailure(std::string* failures, const std::string& address, uint16_t port, const std::string& why) {
  *failures += (failures->empty() ? "" : "; ") + address + ":" + std::to_string(port) + ": " + why;
}

// How long a connection attempt to one of a peer's addresses runs alone before the next address
// is tried beside it, and how long an attempt may take at all.
constexpr auto kStagger = std::chrono::milliseconds(250);
constexpr auto kAttempt = std::chrono::seconds(5);

// Opens a TCP connection to the first of the addresses in `left` (in order) that answers, on
// `port`: each address gets an attempt of its own, the next one starting beside it when it has
// not connected within kStagger or has failed, as in happy eyeballs (RFC 8305), so an address
// whose packets are dropped costs kStagger instead of a connect timeout. Run returns the socket
// (and its address in *at, taken out of `left`) or -1. Addresses that failed are taken out of
// `left` and listed in *failures with why; those still connecting when another one won stay in
// `left` (listed as not answering in time), to be tried again should the winner's greeting fail.
class Dialer {
 public:
  Dialer(std::vector<std::string>* left, uint16_t port, Clock::time_point deadline, std::string* failures)
      : left_(left), port_(port), deadline_(deadline), failures_(failures), order_(*left) {}

  int Run(std::string* at) {
    while (won_ < 0) {
      const Clock::time_point now = Clock::now();
      if (now >= deadline_) break;
      if (next_ < order_.size() && (flying_.empty() || now >= next_start_)) {
        Start(order_[next_++], now);
        continue;
      }
      if (flying_.empty() || !Settle(now)) break;  // every address failed, or poll() did
    }
    for (const Attempt& a : flying_) {  // slower than the winner (or out of time)
      AddFailure(failures_, a.address, port_,
                 "no answer within " +
                     std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(kStagger).count()) + " ms");
      ::close(a.fd);
    }
    if (won_ >= 0) {
      *at = winner_;
      const auto it = std::find(left_->begin(), left_->end(), winner_);
      if (it != left_->end()) left_->erase(it);
    }
    return won_;
  }

 private:
  struct Attempt {
    int fd;
    std::string address;
    Clock::time_point until;
  };

  void Failed(const std::string& address, const std::string& why) {
    AddFailure(failures_, address, port_, why);
    const auto it = std::find(left_->begin(), left_->end(), address);
    if (it != left_->end()) left_->erase(it);
  }

  // Starts a nonblocking connect to `address` beside the attempts in flight.
  void Start(const std::string& address, Clock::time_point now) {
    next_start_ = now + kStagger;
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port_);
    if (::inet_pton(AF_INET, address.c_str(), &sa.sin_addr) != 1) return Failed(address, "not an IPv4 address");
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Failed(address, ErrnoText(errno));
    SetNonBlocking(fd);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) {
      won_ = fd;
      winner_ = address;
    } else if (errno == EINPROGRESS) {
      flying_.push_back({fd, address, std::min(deadline_, now + kAttempt)});
    } else {
      Failed(address, ErrnoText(errno));
      ::close(fd);
    }
  }

  // Waits for an attempt to connect or fail (or the next start, or an attempt's time to run
  // out) and settles those that did; false when poll() itself failed.
  bool Settle(Clock::time_point now) {
    Clock::time_point wake = deadline_;
    if (next_ < order_.size()) wake = std::min(wake, next_start_);
    for (const Attempt& a : flying_) wake = std::min(wake, a.until);
    polls_.clear();
    for (const Attempt& a : flying_) polls_.push_back(pollfd{a.fd, POLLOUT, 0});
    const int64_t ms = std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count() + 1;
    if (::poll(polls_.data(), polls_.size(), static_cast<int>(std::min<int64_t>(ms, 1 << 30))) < 0 && errno != EINTR) {
      return false;
    }
    const Clock::time_point then = Clock::now();
    std::vector<Attempt> still;
    for (size_t i = 0; i < flying_.size(); ++i) {
      Attempt& a = flying_[i];
      if (won_ < 0 && polls_[i].revents != 0) {
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(a.fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err == 0) {
          won_ = a.fd;
          winner_ = a.address;
          continue;
        }
        Failed(a.address, ErrnoText(err));
        ::close(a.fd);
        next_start_ = then;  // a failure starts the next address at once
      } else if (then >= a.until) {
        Failed(a.address, "timed out");
        ::close(a.fd);
        next_start_ = then;
      } else {
        still.push_back(std::move(a));
      }
    }
    flying_ = std::move(still);
    return true;
  }

  std::vector<std::string>* left_;
  const uint16_t port_;
  const Clock::time_point deadline_;
  std::string* failures_;
  const std::vector<std::string> order_;
  std::vector<Attempt> flying_;
  std::vector<pollfd> polls_;
  size_t next_ = 0;
  Clock::time_point next_start_ = Clock::now();
  int won_ = -1;
  std::string winner_;
};

// Greets on a new connection to rank `expect_rank`: true when that rank of this job answered.
bool Greet(int fd, const Hello& mine, int expect_rank, Clock::time_point deadline, std::string* why) {
  SetNoDelay(fd);
  Hello theirs{};
  Hello hello = mine;
  hello.to = expect_rank;
  // The peer answers once it is done connecting to the ranks below it: up to the deadline.
  if (!Exchange(fd, reinterpret_cast<char*>(&hello), sizeof hello, true, deadline, why) ||
      !Exchange(fd, reinterpret_cast<char*>(&theirs), sizeof theirs, false, deadline, why)) {
    return false;
  }
  if (theirs.magic != kHelloMagic || theirs.token != mine.token || theirs.rank != expect_rank ||
      theirs.size != mine.size) {
    *why = "another process answered there (not rank " + std::to_string(expect_rank) + " of this job)";
    return false;
  }
  return true;
}

// The descriptors this process has open now (/proc/self/fd's entries, less the directory's own).
int OpenDescriptors() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  int count = 0;
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  ::closedir(dir);
  return count - 1;
}

// The mesh holds a socket per peer: at a thousand ranks that is the soft open-file limit many
// systems start a process with (1024), and past it socket() and accept() fail with EMFILE in
// the middle of the connection phase. Raises the soft limit to the hard one when the
// connections would not fit (as Go's runtime does for every program since 1.19; the hard limit
// is the administrator's); returns "" or why they cannot fit, naming the limits. `raised`
// tells the log what was changed.
std::string MakeRoomForConnections(int peers, std::string* raised) {
  constexpr rlim_t kSpare = 64;  // for the rest of the process: MPI's own sockets, files, pipes
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return "";
  const int open = OpenDescriptors();
  const rlim_t needed = static_cast<rlim_t>(open) + static_cast<rlim_t>(peers) + 1;  // and the listener
  if (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= needed + kSpare) return "";
  rlimit want = lim;
  want.rlim_cur = lim.rlim_max;
  if (lim.rlim_max == RLIM_INFINITY) want.rlim_cur = std::max<rlim_t>(needed + kSpare, 1 << 20);  // Linux's nr_open
  if (want.rlim_cur > lim.rlim_cur && ::setrlimit(RLIMIT_NOFILE, &want) == 0) {
    *raised = "raised this process's open-file limit from " + std::to_string(lim.rlim_cur) + " to " +
              std::to_string(want.rlim_cur) + " for its TCP connections to " + std::to_string(peers) + " peers";
    lim = want;
  }
  if (lim.rlim_cur >= needed) return "";
  return "the TCP connections to " + std::to_string(peers) + " peers need " + std::to_string(needed) +
         " open files with the " + std::to_string(open) + " this process has open, and its open-file limit is " +
         std::to_string(lim.rlim_cur) + " (hard limit " +
         (lim.rlim_max == RLIM_INFINITY ? std::string("unlimited") : std::to_string(lim.rlim_max)) +
         "): raise it (ulimit -n, systemd's LimitNOFILE, docker run --ulimit nofile=...)";
}

// Every rank's listening address, as "host port addr,addr,...".
struct Endpoint {
  std::string host;
  uint16_t port = 0;
  std::vector<std::string> addresses;
};

Endpoint ParseEndpoint(const std::string& text) {
  Endpoint e;
  std::istringstream in(text);
  std::string addresses;
  in >> e.host >> e.port >> addresses;
  std::istringstream list(addresses);
  for (std::string a; std::getline(list, a, ',');) {
    if (!a.empty()) e.addresses.push_back(a);
  }
  return e;
}

// Takes the calls of every rank above `mine.rank` on `listener` (non-blocking) until they all
// came, the deadline passed or `stop` was set; returns "" or what went wrong.
std::string AcceptAbove(int listener, const Hello& mine, double timeout_seconds, Clock::time_point deadline,
                        std::vector<int>* fds, const std::atomic<bool>& stop) {
  const int rank = mine.rank, n = mine.size;
  Hello hello = mine;
  for (int expected = n - 1 - rank; expected > 0 && !stop;) {
    // In slices, to notice `stop` (the dialing failed) soon.
    const Clock::time_point slice = std::min(deadline, Clock::now() + std::chrono::milliseconds(100));
    if (!WaitFor(listener, POLLIN, slice)) {
      if (Clock::now() < deadline) continue;
      std::vector<int> missing;
      for (int p = rank + 1; p < n; ++p) {
        if ((*fds)[static_cast<size_t>(p)] < 0) missing.push_back(p);
      }
      std::ostringstream timeout;
      timeout << timeout_seconds;
      return RankSet(missing) + " did not connect within " + timeout.str() + " s";
    }
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      // The caller's connection stays queued, so retrying would spin until the deadline.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        return "cannot accept the connections of the ranks above it: " + ErrnoText(errno);
      }
      continue;
    }
    SetNoDelay(fd);
    Hello theirs{};
    std::string why;
    const Clock::time_point greeting = std::min(deadline, Clock::now() + std::chrono::seconds(5));
    const bool ok = Exchange(fd, reinterpret_cast<char*>(&theirs), sizeof theirs, false, greeting, &why) &&
                    theirs.magic == kHelloMagic && theirs.token == mine.token && theirs.size == n &&
                    theirs.to == rank && theirs.rank > rank && theirs.rank < n &&
                    (*fds)[static_cast<size_t>(theirs.rank)] < 0 &&
                    Exchange(fd, reinterpret_cast<char*>(&hello), sizeof hello, true, greeting, &why);
    if (!ok) {  // a stranger, or a rank that gave up: keep listening
      ::close(fd);
      continue;
    }
    (*fds)[static_cast<size_t>(theirs.rank)] = fd;
    --expected;
  }
  return "";
}

// This rank's listening socket and the addresses it advertises ("" error: all well).
struct Listening {
  int listener = -1;
  uint16_t port = 0;
  std::vector<NetInterface> interfaces, advertised;
  std::string error;
};

// Makes room for the connections, listens on an ephemeral port and picks the addresses to
// advertise (GRADCOMP_CONTROLLER_IFACE); whatever fails is in .error.
Listening Listen(const TcpOptions& options, int peers, TcpReport* report) {
  Listening l;
  l.error = MakeRoomForConnections(peers, &report->open_file_limit);
  l.listener = l.error.empty() ? ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0) : -1;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof sa;
  // Ports left in TIME_WAIT by earlier connections stay usable (a job's restart, a test's many worlds).
  int one = 1;
  if (l.listener >= 0) ::setsockopt(l.listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (l.error.empty() &&
      (l.listener < 0 || ::bind(l.listener, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
       ::listen(l.listener, peers + 1) != 0 || ::getsockname(l.listener, reinterpret_cast<sockaddr*>(&sa), &len) != 0)) {
    l.error = "cannot listen on a TCP port: " + ErrnoText(errno);
  }
  try {
    if (l.error.empty()) l.interfaces = ListNetInterfaces();
  } catch (const Error& e) {
    l.error = e.what();
  }
  if (l.error.empty()) {
    l.advertised = AdvertisedInterfaces(l.interfaces, options.iface);
    if (l.advertised.empty()) {
      l.error = options.iface.empty() ? "no IPv4 address on this host"
                                      : "no IPv4 address on network interface '" + options.iface +
                                            "' (GRADCOMP_CONTROLLER_IFACE)";
    }
  }
  if (l.error.empty()) l.port = ntohs(sa.sin_port);
  return l;
}

// Every rank's endpoint, through `bootstrap` (port 0: that rank gave up already).
std::vector<Endpoint> ExchangeEndpoints(Communicator& bootstrap, const std::string& host, const Listening& l) {
  std::string mine = host + " " + std::to_string(l.port) + " ";
  for (size_t i = 0; i < l.advertised.size(); ++i) mine += (i ? "," : "") + l.advertised[i].address;
  std::vector<Endpoint> endpoints;
  for (const std::string& text : AllgatherStrings(bootstrap, mine)) endpoints.push_back(ParseEndpoint(text));
  return endpoints;
}

// Dials every rank below this one, the nearest first, each at its addresses in DialOrder until
// one greets back; returns "" or which rank could not be reached and why.
std::string DialBelow(const Hello& hello, const std::vector<Endpoint>& endpoints, const std::string& host,
                      const std::vector<NetInterface>& interfaces, Clock::time_point deadline, std::vector<int>* fds,
                      TcpReport* report) {
  const int rank = hello.rank;
  for (int p = rank - 1; p >= 0; --p) {
    const Endpoint& e = endpoints[static_cast<size_t>(p)];
    std::vector<std::string> left = DialOrder(e.addresses, e.host == host, interfaces);
    std::string failures;
    while (!left.empty() && (*fds)[static_cast<size_t>(p)] < 0) {
      std::string at, why;
      const int fd = Dialer(&left, e.port, deadline, &failures).Run(&at);
      if (fd < 0) break;
      if (!Greet(fd, hello, p, deadline, &why)) {
        AddFailure(&failures, at, e.port, why);
        ::close(fd);
        continue;
      }
      (*fds)[static_cast<size_t>(p)] = fd;
      if (!failures.empty()) {
        report->detours.push_back("rank " + std::to_string(rank) + " reached rank " + std::to_string(p) + " (host " +
                                  e.host + ") at " + at + " only after " + failures);
      }
    }
    if ((*fds)[static_cast<size_t>(p)] < 0) {
      return "cannot reach rank " + std::to_string(p) + " (host " + e.host + ") at " +
             (failures.empty() ? std::string("no address") : failures);
    }
  }
  return "";
}

// Makes every connection nonblocking and names, for the log, this rank's interfaces that carry
// its connections to other hosts.
void NameInterfaces(const std::vector<int>& fds, const std::vector<Endpoint>& endpoints, const std::string& host,
                    const std::vector<NetInterface>& interfaces, TcpReport* report) {
  std::set<std::string> used;
  for (size_t p = 0; p < fds.size(); ++p) {
    const int fd = fds[p];
    if (fd < 0) continue;
    SetNonBlocking(fd);
    sockaddr_in local{};
    socklen_t local_len = sizeof local;
    if (endpoints[p].host == host || ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0) {
      continue;
    }
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof text);
    const std::string name = InterfaceOf(text, interfaces);
    used.insert(name.empty() ? std::string(text) : name);
  }
  for (const std::string& name : used) report->interfaces += (report->interfaces.empty() ? "" : ",") + name;
}

}  // namespace

std::string ConnectMesh(Communicator& bootstrap, const TcpOptions& options, std::vector<int>* fds, TcpReport* report,
                        bool* elsewhere) {
  const int rank = bootstrap.rank(), n = bootstrap.size();
  const Clock::time_point deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(options.connect_timeout_seconds * 1000));
  // The job's token, so that a connection that reaches another process is recognised.
  uint64_t token = 0;
  if (rank == 0) {
    std::random_device rd;
    token = (uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  }
  bootstrap.Broadcast(&token, sizeof token, 0);
  Listening l = Listen(options, n - 1, report);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::vector<Endpoint> endpoints = ExchangeEndpoints(bootstrap, host, l);
  // A rank that gave up already (port 0) would never dial the ranks below it: nobody waits, it
  // and the others alike.
  if (std::any_of(endpoints.begin(), endpoints.end(), [](const Endpoint& e) { return e.port == 0; })) {
    *elsewhere = l.error.empty();
    if (l.listener >= 0) ::close(l.listener);
    return l.error;
  }
  const Hello hello{kHelloMagic, token, rank, n, rank, 0};
  // Take the calls of every rank above on a thread of its own while dialing every rank below,
  // the nearest first. Dialing first and answering after chains the ranks (a rank's greeting is
  // answered only once the peer has dialed all of its own: a round trip per rank in the world),
  // and every rank dialing rank 0 first sends the whole world's calls into rank 0's listen queue
  // at once (net.core.somaxconn: 128 before Linux 5.4, 4096 since), whose overflow costs each
  // dropped call a SYN retry of a second or more. Nearest first, a rank's calls arrive one or two
  // at a time.
  std::atomic<bool> stop{false};
  std::string accept_error;
  std::thread acceptor;
  if (rank + 1 < n) {
    SetNonBlocking(l.listener);
    acceptor = std::thread([&] {
      accept_error = AcceptAbove(l.listener, hello, options.connect_timeout_seconds, deadline, fds, stop);
      // Closed at once: calls still queued (accept() failing with EMFILE, say) are reset, and
      // their ranks learn it now rather than at the deadline.
      ::close(l.listener);
    });
  }
  std::string error = DialBelow(hello, endpoints, host, l.interfaces, deadline, fds, report);
  // Every rank's dials are over. A rank's call ends only once its callee has answered, so if
  // every rank reached every rank below it, every call has been taken; if one did not, the world
  // fails anyway and nobody waits for its calls until the deadline.
  int dialed = error.empty() ? 1 : 0;
  bootstrap.Allreduce(&dialed, &dialed, 1, DataType::kInt32, ReduceOp::kMin);
  if (!dialed) stop = true;
  if (acceptor.joinable()) {
    acceptor.join();
  } else if (l.listener >= 0) {
    ::close(l.listener);
  }
  if (error.empty()) error = accept_error;
  NameInterfaces(*fds, endpoints, host, l.interfaces, report);
  for (int fd : *fds) {
    if (fd >= 0) SetUnreachableTimeout(fd, options.unreachable_seconds);
  }
  return error;
}

}  // namespace tcp
}  // namespace gradcomp
