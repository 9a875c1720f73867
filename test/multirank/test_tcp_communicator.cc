// The TCP communicator (the controller's transport, GRADCOMP_CONTROLLER=tcp, and the data's
// between nodes) between thread ranks over loopback: its allreduce for every dtype and op,
// matching by tag out of order, large messages both ways at once, a waiting rank that sleeps
// instead of polling (in its collectives and in a polling loop's naps), and a failed or vanished
// rank becoming an error on every other rank. The generic collectives run over it in
// test_inproc_collectives too.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "ops/comm/inprocess_communicator.h"
#include "ops/comm/net_interfaces.h"
#include "ops/comm/tcp_communicator.h"
#include "ops/common/enforce.h"
#include "test/support/harness.h"
#include "test/support/reference.h"

namespace gradcomp {
namespace {

using namespace gradcomp::testing;

TEST(Tcp, AllreduceEveryDtypeAndOpGivesEveryRankTheSameBits) {
  for (int world : {2, 3, 5, 6, 8}) {
    const auto results = RunRanks(
        world,
        [&](Communicator& comm) {
          for (const ReduceCase& c : AllReduceCases({1, 7, 4097})) {
            if (c.op == ReduceOp::kAverage) continue;  // the communicator reduces Sum, Min, Max, Product
            std::vector<char> in = MakeInput(c.dtype, c.op, c.count, comm.rank());
            std::vector<char> out(in.size());
            comm.Allreduce(in.data(), out.data(), c.count, c.dtype, c.op);
            std::string wrong = CompareReduction(c, world, out.data(), ExpectedReduction(c, world, 0, c.count));
            // Rank 0's bits, to every rank: each must hold the same.
            std::vector<char> first = out;
            comm.Broadcast(first.data(), first.size(), 0);
            if (wrong.empty() && first != out) wrong = "bits differ from rank 0's";
            if (!wrong.empty()) return c.Describe() + ": " + wrong;
          }
          return std::string();
        },
        RankTransport::kTcp);
    ASSERT_EQ(Failures(results), "") << "world " << world;
  }
}

TEST(Tcp, ControllerWordsBitwiseAnd) {
  // The controller's agreement: an AND of uint64 words, in place.
  const auto results = RunRanks(
      5,
      [](Communicator& comm) {
        std::vector<uint64_t> words(9, ~uint64_t{0});
        words[static_cast<size_t>(comm.rank())] = ~(uint64_t{1} << comm.rank());
        comm.Allreduce(words.data(), words.data(), words.size(), DataType::kInt64, ReduceOp::kBitwiseAnd);
        for (size_t i = 0; i < words.size(); ++i) {
          const uint64_t expected = i < 5 ? ~(uint64_t{1} << i) : ~uint64_t{0};
          if (words[i] != expected) return "word " + std::to_string(i) + " wrong";
        }
        return std::string();
      },
      RankTransport::kTcp);
  EXPECT_EQ(Failures(results), "");
}

TEST(Tcp, MessagesMatchByTagOutOfOrderAndLargeOnesCrossWithoutDeadlock) {
  const size_t big = size_t{24} << 20;  // far beyond the sockets' buffers
  const auto results = RunRanks(
      2,
      [&](Communicator& comm) {
        const int peer = 1 - comm.rank();
        std::vector<char> mine(big, static_cast<char>(comm.rank() + 1)), theirs(big);
        // Both ranks send first (blocking) and receive after: only reading the peer's bytes into a
        // buffer of their own while sending keeps this from deadlocking.
        comm.Send(mine.data(), big, peer, 3);
        comm.Recv(theirs.data(), big, peer, 3);
        if (theirs != std::vector<char>(big, static_cast<char>(peer + 1))) return std::string("big message differs");
        // Tags out of order: rank 0 sends tag 7 then tag 8; rank 1 receives tag 8 first.
        int a = -1, b = -1;
        if (comm.rank() == 0) {
          const int seven = 7, eight = 8;
          comm.Send(&seven, sizeof seven, 1, 7);
          comm.Send(&eight, sizeof eight, 1, 8);
        } else {
          comm.Recv(&b, sizeof b, 0, 8);
          comm.Recv(&a, sizeof a, 0, 7);
          if (a != 7 || b != 8) return "tags matched wrongly: " + std::to_string(a) + ", " + std::to_string(b);
        }
        // Nonblocking transfers, completed by polling Test().
        std::vector<int> out(1000, comm.rank()), in(1000, -1);
        auto r = comm.Irecv(in.data(), in.size() * sizeof(int), peer, 9);
        auto s = comm.Isend(out.data(), out.size() * sizeof(int), peer, 9);
        while (!r->Test() || !s->Test()) std::this_thread::yield();
        if (in != std::vector<int>(1000, peer)) return std::string("nonblocking transfer differs");
        return std::string();
      },
      RankTransport::kTcp);
  EXPECT_EQ(Failures(results), "");
}

TEST(Tcp, ASplitsTrafficStaysApartFromItsParents) {
  const auto results = RunRanks(
      4,
      [](Communicator& comm) {
        auto pair = comm.Split(comm.rank() / 2, comm.rank());
        auto local = comm.SplitLocal(2);
        // Same peer, same tag, three communicators: each receive gets its own communicator's value.
        const int peer = comm.rank() ^ 1;
        const int p0 = 100 + comm.rank(), p1 = 200 + comm.rank(), p2 = 300 + comm.rank();
        comm.Send(&p0, sizeof p0, peer, 1);
        pair->Send(&p1, sizeof p1, pair->rank() ^ 1, 1);
        local->Send(&p2, sizeof p2, local->rank() ^ 1, 1);
        int g2 = 0, g1 = 0, g0 = 0;
        local->Recv(&g2, sizeof g2, local->rank() ^ 1, 1);
        pair->Recv(&g1, sizeof g1, pair->rank() ^ 1, 1);
        comm.Recv(&g0, sizeof g0, peer, 1);
        if (g0 != 100 + peer || g1 != 200 + peer || g2 != 300 + peer) return std::string("contexts mixed");
        double x = comm.rank();
        pair->Allreduce(&x, &x, 1, DataType::kFloat64, ReduceOp::kSum);
        return x == (comm.rank() < 2 ? 1.0 : 5.0) ? std::string() : std::string("split allreduce wrong");
      },
      RankTransport::kTcp);
  EXPECT_EQ(Failures(results), "");
}

TEST(Tcp, ARankWaitingForALatePeerSleeps) {
  // What the controller is for: ranks 1-3 wait 0.3 s for rank 0 in an allreduce, a gather, a
  // broadcast and a barrier. Blocked in poll() they use almost no CPU (MPI's polled calls nap,
  // and use up to a quarter of a core, test_mpi_collectives).
  std::vector<double> cpu(4, 0.0);
  const auto results = RunRanks(
      4,
      [&](Communicator& comm) {
        const double start = ThreadCpuSeconds();
        for (int op = 0; op < 4; ++op) {
          if (comm.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
          uint64_t word = 1, gathered[4] = {};
          switch (op) {
            case 0: comm.Allreduce(&word, &word, 1, DataType::kInt64, ReduceOp::kSum); break;
            case 1: comm.Gatherv(&word, gathered, std::vector<size_t>(4, sizeof word), 0); break;
            case 2: comm.Broadcast(&word, sizeof word, 0); break;
            default: comm.Barrier();
          }
        }
        cpu[static_cast<size_t>(comm.rank())] = ThreadCpuSeconds() - start;
        return std::string();
      },
      RankTransport::kTcp);
  ASSERT_EQ(Failures(results), "");
  // Each waited ~1.2 s in all; 5% of a core would be 60 ms.
  for (int r = 1; r < 4; ++r) EXPECT_LT(cpu[static_cast<size_t>(r)], 0.06) << "rank " << r;
}

TEST(Tcp, APollingLoopsNapEndsWhenThePeersBytesArrive) {
  // The SRA's loop over a TCP communicator naps in WaitForProgress: with nothing coming it lasts
  // the nap; when the peer sends 0.2 s into a 5 s nap, it ends then, and the bytes are in place.
  const auto results = RunRanks(
      2,
      [&](Communicator& comm) -> std::string {
        using Seconds = std::chrono::duration<double>;
        std::vector<char> data(1 << 20, static_cast<char>(comm.rank() + 1));
        if (comm.rank() == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          comm.Send(data.data(), data.size(), 0, 7);
          return "";
        }
        auto start = std::chrono::steady_clock::now();
        comm.WaitForProgress(0.05);
        const double idle = Seconds(std::chrono::steady_clock::now() - start).count();
        if (idle < 0.045 || idle > 0.15) return "a nap of 0.05 s with nothing coming lasted " + std::to_string(idle);
        auto recv = comm.Irecv(data.data(), data.size(), 1, 7);
        start = std::chrono::steady_clock::now();
        comm.WaitForProgress(5.0);
        const double woke = Seconds(std::chrono::steady_clock::now() - start).count();
        if (woke > 2.0) return "a 5 s nap ended " + std::to_string(woke) + " s in, not when the bytes came";
        PollUntil([&] { return recv->Test(); }, &comm);
        if (data.front() != 2 || data.back() != 2) return std::string("the message did not land");
        return "";
      },
      RankTransport::kTcp);
  EXPECT_EQ(Failures(results), "");
}

// Runs `fn` on thread ranks over TCP and returns each rank's error message ("" if none).
std::vector<std::string> ErrorsOn(int world, const std::function<void(std::unique_ptr<Communicator>&)>& fn,
                                  const std::function<TcpOptions(int rank)>& options_of) {
  std::vector<std::unique_ptr<Communicator>> boot = CreateInProcessWorld(world);
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        std::unique_ptr<Communicator> comm = ConnectTcpWorld(*boot[static_cast<size_t>(r)], options_of(r));
        fn(comm);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

std::vector<std::string> ErrorsOn(int world, const std::function<void(std::unique_ptr<Communicator>&)>& fn,
                                  const TcpOptions& options = {}) {
  return ErrorsOn(world, fn, [&](int) { return options; });
}

TEST(Tcp, AFailedRanksReasonReachesEveryRank) {
  // Rank 2 fails (its reason sent to all) while the others wait in allreduces and a broadcast
  // that need it, directly or through another rank.
  const auto errors = ErrorsOn(5, [](std::unique_ptr<Communicator>& comm) {
    double x = 1;
    comm->Allreduce(&x, &x, 1, DataType::kFloat64, ReduceOp::kSum);
    if (comm->rank() == 2) {
      AbortTcpWorld(*comm, "out of memory in rank 2's step");
      throw Error("rank 2 gave up");
    }
    for (int i = 0; i < 3; ++i) {
      comm->Allreduce(&x, &x, 1, DataType::kFloat64, ReduceOp::kSum);
      comm->Broadcast(&x, sizeof x, 4);
    }
  });
  EXPECT_EQ(errors[2], "rank 2 gave up");
  for (int r : {0, 1, 3, 4}) {
    EXPECT_NE(errors[static_cast<size_t>(r)].find("rank 2 failed: out of memory in rank 2's step"), std::string::npos)
        << "rank " << r << ": " << errors[static_cast<size_t>(r)];
  }
}

TEST(Tcp, AVanishedRankIsAnErrorOnEveryRank) {
  // Rank 1 closes its connections without a word (as a killed process does) while the others
  // wait for it; the ranks it never talks to directly learn it from their partners' aborts.
  const auto errors = ErrorsOn(4, [](std::unique_ptr<Communicator>& comm) {
    double x = 1;
    comm->Allreduce(&x, &x, 1, DataType::kFloat64, ReduceOp::kSum);
    if (comm->rank() == 1) {
      comm.reset();
      return;
    }
    comm->Allreduce(&x, &x, 1, DataType::kFloat64, ReduceOp::kSum);
  });
  EXPECT_EQ(errors[1], "");
  for (int r : {0, 2, 3}) {
    EXPECT_NE(errors[static_cast<size_t>(r)].find("lost its connection to rank 1"), std::string::npos)
        << "rank " << r << ": " << errors[static_cast<size_t>(r)];
  }
}

TEST(Tcp, ARankThatCannotConnectFailsEveryRankWithItsReason) {
  TcpOptions options;
  options.iface = "nosuch0";
  const auto errors = ErrorsOn(3, [](std::unique_ptr<Communicator>&) {}, options);
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(errors[static_cast<size_t>(r)].find("no IPv4 address on network interface 'nosuch0'"),
              std::string::npos)
        << "rank " << r << ": " << errors[static_cast<size_t>(r)];
  }
  // A world of one connects to nobody.
  EXPECT_EQ(ErrorsOn(1, [](std::unique_ptr<Communicator>& comm) { comm->Barrier(); }), std::vector<std::string>{""});
}

TEST(Tcp, ARankThatGivesUpBeforeDialingFailsEveryRankAtOnce) {
  // Rank 1 of 4 cannot take part; rank 0 waits for calls from ranks 1-3 and would otherwise
  // wait out the whole connection phase for rank 1's.
  const auto start = std::chrono::steady_clock::now();
  const auto errors = ErrorsOn(4, [](std::unique_ptr<Communicator>&) {}, [](int rank) {
    TcpOptions options;
    options.connect_timeout_seconds = 20;
    if (rank == 1) options.iface = "nosuch0";
    return options;
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 5.0);
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(errors[static_cast<size_t>(r)].find("rank 1: no IPv4 address on network interface 'nosuch0'"),
              std::string::npos)
        << "rank " << r << ": " << errors[static_cast<size_t>(r)];
  }
}

TEST(Tcp, NumberRangesNameALargeJobsRanksInOneLine) {
  // The connection errors' "ranks 0-2, 5" (and AllowedCpus's "0-3,8").
  EXPECT_EQ(NumberRanges({}, ", "), "");
  EXPECT_EQ(NumberRanges({7}, ", "), "7");
  EXPECT_EQ(NumberRanges({0, 1, 2, 5, 7, 8, 9}, ", "), "0-2, 5, 7-9");
  EXPECT_EQ(NumberRanges({0, 1, 2, 3, 8}, ","), "0-3,8");
}

int OpenFiles() {
  int count = 0;
  DIR* dir = ::opendir("/proc/self/fd");
  while (const dirent* entry = ::readdir(dir)) count += entry->d_name[0] != '.';
  ::closedir(dir);
  return count - 1;
}

TEST(Tcp, TheOpenFileLimitIsRaisedForTheConnections) {
  // A soft limit that 8 thread ranks' 56 sockets do not fit under (1024 where a thousand
  // ranks would not fit): raised to the hard limit, and the world connects.
  rlimit before{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &before), 0);
  const rlim_t low = static_cast<rlim_t>(OpenFiles()) + 30;
  ASSERT_GT(before.rlim_max, low + 200) << "this test needs a hard open-file limit above " << low + 200;
  rlimit lowered = before;
  lowered.rlim_cur = low;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &lowered), 0);
  const auto errors = ErrorsOn(8, [](std::unique_ptr<Communicator>& comm) {
    int x = comm->rank();
    comm->Allreduce(&x, &x, 1, DataType::kInt32, ReduceOp::kSum);
    GC_ENFORCE(x == 28, "sum " + std::to_string(x));
  });
  rlimit after{};
  ::getrlimit(RLIMIT_NOFILE, &after);
  ::setrlimit(RLIMIT_NOFILE, &before);
  EXPECT_EQ(errors, std::vector<std::string>(8, ""));
  EXPECT_EQ(after.rlim_cur, before.rlim_max);
}

// In a child process (lowering the hard limit cannot be undone): 8 thread ranks under a hard
// and soft limit that not even one rank's 8 sockets fit under (each rank checks its own need:
// one process per rank in a real job); exits 0 when every rank's error names the limit.
void ConnectUnderTooLowALimit() {
  const rlim_t limit = static_cast<rlim_t>(OpenFiles()) + 4;
  const rlimit low{limit, limit};
  if (::setrlimit(RLIMIT_NOFILE, &low) != 0) std::exit(2);
  const auto errors = ErrorsOn(8, [](std::unique_ptr<Communicator>&) {});
  int named = 0;
  for (const std::string& e : errors) {
    named += e.find(": the TCP connections to 7 peers need") != std::string::npos &&
             e.find("its open-file limit is " + std::to_string(limit) + " (hard limit " + std::to_string(limit) +
                    "): raise it") != std::string::npos &&
             e.find("did not connect") == std::string::npos && e.find("cannot reach") == std::string::npos;
  }
  std::fprintf(stderr, "%d ranks named the limit; rank 0: %s\n", named, errors[0].c_str());
  std::exit(named == 8 ? 0 : 1);
}

TEST(TcpDeathTest, AnOpenFileLimitTooLowForTheConnectionsIsNamedOnEveryRank) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(ConnectUnderTooLowALimit(), ::testing::ExitedWithCode(0), "8 ranks named the limit");
}

// In a child process (the hard limit is lowered), each trial in a process of its own: 8 thread
// ranks under open-file limits 12 to 48 descriptors above what the process holds, each rank's
// precheck (MakeRoomForConnections) passing but the descriptors running out in the middle of the
// connection phase, at an accept() or a dial's socket() by how the ranks' steps interleave. Every
// trial must end within 5 s with all ranks connected or all failing with the reasons named;
// exits 0 when one trial's failure was accept()'s EMFILE, named on all 8 ranks.
void ConnectWhileTheDescriptorsRunOut() {
  // First a connection at the full limit, which must succeed. Under UBSan it is also what lets
  // the trials run: the vptr check reads a vtable it has not met before through a pipe (the
  // runtime's IsAccessibleMemoryRange) and reports "invalid vptr" when no descriptor is left for
  // it, a false report under exactly the shortage made here. The (object type, vtable) pairs it
  // meets now stay in its table for this process and the trials forked from it.
  const auto first = ErrorsOn(8, [](std::unique_ptr<Communicator>&) {});
  if (first != std::vector<std::string>(8, "")) {
    std::fprintf(stderr, "8 ranks did not connect at the full open-file limit: %s\n", first[0].c_str());
    std::exit(1);
  }
  const rlim_t open = static_cast<rlim_t>(OpenFiles());
  bool accept_named = false;
  for (rlim_t extra = 12; extra <= 48 && !accept_named; extra += 4) {
    for (int trial = 0; trial < 2 && !accept_named; ++trial) {
      // A process of its own for each trial: a lowered hard limit cannot be raised again.
      const pid_t pid = ::fork();
      if (pid == 0) {
        const rlimit low{open + extra, open + extra};
        if (::setrlimit(RLIMIT_NOFILE, &low) != 0) std::_Exit(2);
        TcpOptions options;
        options.connect_timeout_seconds = 10;
        const auto start = std::chrono::steady_clock::now();
        const auto errors = ErrorsOn(8, [](std::unique_ptr<Communicator>&) {}, options);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::fprintf(stderr, "limit +%d: %.2f s; rank 0: '%s'\n", static_cast<int>(extra), seconds, errors[0].c_str());
        const char* accept_failed = "cannot accept the connections of the ranks above it: Too many open files";
        int named = 0, failed = 0;
        for (const std::string& e : errors) {
          failed += !e.empty();
          named += e.find(accept_failed) != std::string::npos;
        }
        if (seconds > 5 || (failed != 0 && failed != 8)) std::_Exit(1);
        std::_Exit(named == 8 ? 0 : 3);
      }
      int status = 0;
      if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) std::exit(1);
      if (WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 3) std::exit(1);
      accept_named = WEXITSTATUS(status) == 0;
    }
  }
  std::exit(accept_named ? 0 : 1);
}

TEST(TcpDeathTest, DescriptorsRunningOutMidConnectionFailEveryRankPromptly) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(ConnectWhileTheDescriptorsRunOut(), ::testing::ExitedWithCode(0), "Too many open files");
}

// In a child process, in a network namespace of its own whose listen queues hold 4 calls
// (net.core.somaxconn: 128 before Linux 5.4, 4096 since; a world of thousands of ranks
// overflows either): 100 thread ranks connect within a 10 s connection phase. Every rank
// dialing rank 0 first, and answering calls only after its own dials, took 6.9 s at 64 ranks
// under a queue of 8 and 17 s at 128 (calls dropped from the queue wait for a SYN retry).
void ConnectManyThroughShortListenQueues() {
  if (::unshare(CLONE_NEWNET) != 0) {
    std::fprintf(stderr, "cannot make a network namespace (needs root): %s\n", std::strerror(errno));
    std::exit(3);
  }
  const int fd = ::open("/proc/sys/net/core/somaxconn", O_WRONLY);
  if (fd < 0 || ::write(fd, "4", 1) != 1) std::exit(4);
  ::close(fd);
  const int s = ::socket(AF_INET, SOCK_DGRAM, 0);
  ifreq lo{};
  std::strcpy(lo.ifr_name, "lo");
  if (::ioctl(s, SIOCGIFFLAGS, &lo) != 0) std::exit(5);
  lo.ifr_flags |= IFF_UP;
  if (::ioctl(s, SIOCSIFFLAGS, &lo) != 0) std::exit(6);
  ::close(s);
  TcpOptions options;
  options.connect_timeout_seconds = 10;
  const auto start = std::chrono::steady_clock::now();
  const auto errors = ErrorsOn(
      100,
      [](std::unique_ptr<Communicator>& comm) {
        int x = 1;
        comm->Allreduce(&x, &x, 1, DataType::kInt32, ReduceOp::kSum);
        GC_ENFORCE(x == 100, "sum " + std::to_string(x));
      },
      options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto failed = static_cast<size_t>(
      std::count_if(errors.begin(), errors.end(), [](const std::string& e) { return !e.empty(); }));
  std::fprintf(stderr, "100 ranks: %zu failed in %.1f s%s%s\n", failed, seconds, failed ? "; rank 0: " : "",
               errors[0].c_str());
  std::exit(failed == 0 ? 0 : 1);
}

TEST(TcpDeathTest, AThousandRanksWorthOfCallsThroughShortListenQueues) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(ConnectManyThroughShortListenQueues(), ::testing::ExitedWithCode(0), "100 ranks: 0 failed");
}

TEST(Tcp, MismatchedSizesAreAnErrorNamingBothRanks) {
  const auto errors = ErrorsOn(2, [](std::unique_ptr<Communicator>& comm) {
    std::vector<char> buf(64);
    if (comm->rank() == 0) {
      comm->Send(buf.data(), 64, 1, 4);
    } else {
      comm->Recv(buf.data(), 32, 0, 4);
    }
    comm->Barrier();
  });
  EXPECT_NE(errors[1].find("rank 1 expected 32 bytes from rank 0 (context 0, tag 4) and got a message of 64"),
            std::string::npos)
      << errors[1];
  EXPECT_EQ(errors[0], errors[1]);  // rank 0 learns rank 1's reason
}

NetInterface Nic(const std::string& name, const std::string& address, int prefix, int speed = -1) {
  NetInterface i;
  i.name = name;
  i.address = address;
  unsigned a = 0, b = 0, c = 0, d = 0;
  EXPECT_EQ(std::sscanf(address.c_str(), "%u.%u.%u.%u", &a, &b, &c, &d), 4) << address;
  i.ipv4 = (a << 24) | (b << 16) | (c << 8) | d;
  i.netmask = prefix == 0 ? 0 : ~uint32_t{0} << (32 - prefix);
  i.speed_mbps = speed;
  i.loopback = name == "lo";
  return i;
}

std::vector<std::string> Names(const std::vector<NetInterface>& interfaces) {
  std::vector<std::string> names;
  for (const NetInterface& i : interfaces) names.push_back(i.name);
  return names;
}

TEST(NetInterfaces, AdvertisedFastestOrdinaryFirstThenBridgesThenLoopback) {
  // System order: loopback, a bridge, an unknown-speed NIC, a 1 Gbit/s NIC, a 25 Gbit/s NIC, another bridge.
  const std::vector<NetInterface> system = {
      Nic("lo", "127.0.0.1", 8),          Nic("docker0", "172.17.0.1", 16),   Nic("ens3", "10.0.0.5", 24),
      Nic("eno1", "192.168.1.5", 24, 1000), Nic("ens1f0", "10.1.0.5", 24, 25000), Nic("virbr0", "192.168.122.1", 24)};
  EXPECT_EQ(Names(AdvertisedInterfaces(system, "")),
            (std::vector<std::string>{"ens1f0", "eno1", "ens3", "docker0", "virbr0", "lo"}));
  // Named interfaces: only those (loopback too, when named), in the same order.
  EXPECT_EQ(Names(AdvertisedInterfaces(system, "lo,ens3,eno1")), (std::vector<std::string>{"eno1", "ens3", "lo"}));
  EXPECT_TRUE(AdvertisedInterfaces(system, "nosuch0").empty());
  for (const char* bridge : {"docker0", "br-1a2b3c", "virbr0", "veth9f8e", "cni0", "flannel.1", "cali12", "lxcbr0",
                             "tailscale0", "wg0", "ztabcdef12", "tun0", "tap3"}) {
    EXPECT_TRUE(IsBridgeOrTunnel(bridge)) << bridge;
  }
  for (const char* nic : {"eth0", "ens1f0", "eno1", "ib0", "bond0", "enp65s0f1", "eth0.100"}) {
    EXPECT_FALSE(IsBridgeOrTunnel(nic)) << nic;
  }
}

TEST(NetInterfaces, APeerOnAnotherHostIsDialedOnASharedSubnetFirstAndOnOurOwnAddressesLast) {
  const std::vector<NetInterface> mine = {Nic("lo", "127.0.0.1", 8), Nic("eth0", "10.199.0.12", 24),
                                          Nic("docker0", "172.17.0.1", 16), Nic("eth1", "10.50.0.12", 16)};
  // The peer advertises a storage network first (routed from here: its packets may be dropped),
  // the bridge address every Docker host has, its data NIC and loopback.
  const std::vector<std::string> peer = {"10.198.0.11", "172.17.0.1", "10.199.0.11", "10.50.3.4", "127.0.0.1"};
  EXPECT_EQ(DialOrder(peer, false, mine),
            (std::vector<std::string>{"10.199.0.11", "10.50.3.4", "10.198.0.11", "172.17.0.1"}));
  // A bridge's subnet does not count as a shared network.
  EXPECT_EQ(DialOrder({"172.17.0.2", "10.9.9.9"}, false, mine), (std::vector<std::string>{"172.17.0.2", "10.9.9.9"}));
  // On the same host: loopback first, then everything the peer advertises.
  EXPECT_EQ(DialOrder(peer, true, mine), (std::vector<std::string>{"127.0.0.1", "10.198.0.11", "172.17.0.1",
                                                                   "10.199.0.11", "10.50.3.4"}));
  EXPECT_EQ(InterfaceOf("10.50.0.12", mine), "eth1");
  EXPECT_EQ(InterfaceOf("10.50.0.13", mine), "");
}

TEST(NetInterfaces, ThisHostsListHasLoopbackAndAddressesMatchTheirNames) {
  const std::vector<NetInterface> system = ListNetInterfaces();
  ASSERT_FALSE(system.empty());
  bool loopback = false;
  for (const NetInterface& i : system) {
    loopback = loopback || (i.loopback && i.address == "127.0.0.1" && i.netmask == 0xff000000u);
    EXPECT_EQ(Nic(i.name, i.address, 0).ipv4, i.ipv4) << i.name;
  }
  EXPECT_TRUE(loopback);
  EXPECT_EQ(AdvertisedInterfaces(system, "").back().name, "lo");
}

}  // namespace
}  // namespace gradcomp
