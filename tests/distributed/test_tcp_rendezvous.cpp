// tests/distributed/test_tcp_rendezvous.cpp — the TCP rendezvous (kiln/distributed/tcp_rendezvous.cpp): N ranks
// as threads of this process meeting on 127.0.0.1. Broadcast from rank 0 and from another root, barrier,
// large payloads (partial transfers), and the failures: a rank that never comes, a mismatched world size,
// a peer that exits, a stranger on the port.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "kiln/distributed/detail/group_internal.h"

namespace kiln::dist::detail {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A port that was free a moment ago: the kernel picks one for port 0, and we give it back.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

// What one rank's thread ended with.
struct Outcome {
  std::exception_ptr error;
  double seconds = 0;  // from the start of the world to the end of the rank's function
};

// Runs `body(rank, rendezvous)` on one thread per rank of `ranks`, each with its own world size.
std::vector<Outcome> run_ranks(int port, const std::vector<int>& ranks, const std::vector<int>& sizes,
                               std::chrono::milliseconds timeout, const std::function<void(int, Rendezvous&)>& body) {
  std::vector<Outcome> out(ranks.size());
  std::vector<std::thread> threads;
  const auto start = Clock::now();
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        auto r = make_tcp_rendezvous("127.0.0.1", port, ranks[i], sizes[i], timeout);
        body(ranks[i], *r);
      } catch (...) {
        out[i].error = std::current_exception();
      }
      out[i].seconds = std::chrono::duration<double>(Clock::now() - start).count();
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

std::vector<Outcome> run_world(int size, std::chrono::milliseconds timeout,
                               const std::function<void(int, Rendezvous&)>& body) {
  std::vector<int> ranks;
  for (int r = 0; r < size; ++r) ranks.push_back(r);
  return run_ranks(free_port(), ranks, std::vector<int>(static_cast<size_t>(size), size), timeout, body);
}

std::string message_of(const std::exception_ptr& e) {
  if (!e) return "";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  }
  return "";
}

void expect_no_errors(const std::vector<Outcome>& out) {
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_FALSE(out[i].error) << "rank " << i << ": " << (out[i].error ? message_of(out[i].error) : "");
  }
}

// The bytes rank `root` holds before a broadcast: distinct per root, so a wrong root would show.
std::vector<uint8_t> payload(int root, size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 7 + static_cast<size_t>(root) * 31 + 1) & 0xff);
  return v;
}

void check_broadcast(int root, size_t n) {
  std::vector<std::vector<uint8_t>> got(3);
  auto out = run_world(3, 10s, [&](int rank, Rendezvous& r) {
    std::vector<uint8_t> data = rank == root ? payload(root, n) : std::vector<uint8_t>(n, 0);
    r.broadcast(data.data(), data.size(), root);
    got[static_cast<size_t>(rank)] = data;
  });
  expect_no_errors(out);
  for (int rank = 0; rank < 3; ++rank) EXPECT_EQ(got[static_cast<size_t>(rank)], payload(root, n)) << "rank " << rank;
}

TEST(TcpRendezvous, BroadcastFromRankZero) { check_broadcast(0, 128); }

TEST(TcpRendezvous, BroadcastFromAnotherRoot) { check_broadcast(2, 128); }

// 8 MB does not fit in one socket buffer: exercises the loops over partial sends and receives.
TEST(TcpRendezvous, BroadcastLargePayload) { check_broadcast(1, size_t{8} << 20); }

TEST(TcpRendezvous, SequenceOfOperations) {
  std::vector<std::vector<int32_t>> got(3);
  auto out = run_world(3, 10s, [&](int rank, Rendezvous& r) {
    for (int root : {0, 2, 1, 0}) {
      int32_t value = rank == root ? 100 + root : -1;
      r.broadcast(&value, sizeof value, root);
      got[static_cast<size_t>(rank)].push_back(value);
      r.barrier();
    }
  });
  expect_no_errors(out);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(got[static_cast<size_t>(rank)], (std::vector<int32_t>{100, 102, 101, 100})) << "rank " << rank;
  }
}

// Nobody leaves the barrier before the last rank has entered it.
TEST(TcpRendezvous, BarrierWaitsForEveryRank) {
  std::atomic<bool> last_arrived{false};
  std::vector<int> saw_last(3, -1);
  auto out = run_world(3, 10s, [&](int rank, Rendezvous& r) {
    if (rank == 2) {
      std::this_thread::sleep_for(300ms);
      last_arrived = true;
    }
    r.barrier();
    saw_last[static_cast<size_t>(rank)] = last_arrived ? 1 : 0;
  });
  expect_no_errors(out);
  EXPECT_EQ(saw_last, (std::vector<int>{1, 1, 1}));
}

TEST(TcpRendezvous, WorldOfOneNeedsNobody) {
  auto r = make_tcp_rendezvous("127.0.0.1", free_port(), 0, 1, 100ms);
  int value = 5;
  r->broadcast(&value, sizeof value, 0);
  r->barrier();
  EXPECT_EQ(value, 5);
}

// Rank 2 of 3 never starts: ranks 0 and 1 give up with a TimeoutError naming the address, once the timeout has
// passed (and not much later: the bound is generous, so that a busy machine cannot fail it).
TEST(TcpRendezvous, MissingRankTimesOut) {
  const int port = free_port();
  auto out = run_ranks(port, {0, 1}, {3, 3}, 500ms, [](int, Rendezvous&) { FAIL() << "the world cannot be complete"; });
  const std::string where = "127.0.0.1:" + std::to_string(port);
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_TRUE(out[i].error) << "rank " << i;
    const std::string msg = message_of(out[i].error);
    EXPECT_THROW(std::rethrow_exception(out[i].error), TimeoutError) << msg;
    EXPECT_NE(msg.find(where), std::string::npos) << msg;
    EXPECT_GE(out[i].seconds, 0.4) << msg;
    EXPECT_LT(out[i].seconds, 20.0) << msg;
  }
  EXPECT_NE(message_of(out[0].error).find("missing ranks: 2"), std::string::npos) << message_of(out[0].error);
}

// A rank started with another world size is refused at once (long before the timeout), with a message that names
// both sizes.
TEST(TcpRendezvous, MismatchedWorldSizeIsRefused) {
  auto out = run_ranks(free_port(), {0, 1}, {2, 3}, 120s, [](int, Rendezvous&) { FAIL() << "should be refused"; });
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_TRUE(out[i].error) << "rank " << i;
    const std::string msg = message_of(out[i].error);
    EXPECT_THROW(std::rethrow_exception(out[i].error), DistributedError) << msg;
    bool is_timeout = false;
    try {
      std::rethrow_exception(out[i].error);
    } catch (const TimeoutError&) {
      is_timeout = true;
    } catch (...) {
    }
    EXPECT_FALSE(is_timeout) << "a mismatch must be reported, not waited out: " << msg;
    EXPECT_NE(msg.find("world size 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("world size 3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("WORLD_SIZE"), std::string::npos) << msg;
    EXPECT_LT(out[i].seconds, 60.0) << msg;
  }
}

// A peer that goes away mid-job gives a clear error at once, not a hang until the timeout.
TEST(TcpRendezvous, PeerThatExitsGivesClearError) {
  auto out = run_world(2, 120s, [](int rank, Rendezvous& r) {
    r.barrier();
    if (rank == 0) r.barrier();  // rank 1 returns and closes its connection instead
  });
  EXPECT_FALSE(out[1].error) << message_of(out[1].error);
  ASSERT_TRUE(out[0].error);
  const std::string msg = message_of(out[0].error);
  EXPECT_NE(msg.find("rank 1 closed the connection"), std::string::npos) << msg;
  EXPECT_LT(out[0].seconds, 60.0) << msg;
}

// Connects to 127.0.0.1:port (retrying while nobody listens), sends `junk` and hangs up: a stranger on the port.
void stranger_knocks(int port, const std::string& junk) {
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      (void)::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
      ::close(fd);
      return;
    }
    ::close(fd);
    std::this_thread::sleep_for(10ms);
  }
  ADD_FAILURE() << "the stranger never got in";
}

// A process that connects to the port and is not a kiln rank is dropped; the world still meets. Rank 1 starts
// only after the strangers got in, so rank 0 must really deal with them.
TEST(TcpRendezvous, StrangerIsIgnored) {
  const int port = free_port();
  std::vector<int> got(2, 0);
  std::exception_ptr errors[2];
  std::thread rank0([&] {
    try {
      auto r = make_tcp_rendezvous("127.0.0.1", port, 0, 2, 10s);
      int value = 42;
      r->broadcast(&value, sizeof value, 0);
      got[0] = value;
    } catch (...) {
      errors[0] = std::current_exception();
    }
  });
  stranger_knocks(port, "GET / HTTP/1.0\r\n\r\n");  // longer than a hello, wrong magic
  stranger_knocks(port, "hi");                      // shorter than a hello, then gone
  try {
    auto r = make_tcp_rendezvous("127.0.0.1", port, 1, 2, 10s);
    int value = 0;
    r->broadcast(&value, sizeof value, 0);
    got[1] = value;
  } catch (...) {
    errors[1] = std::current_exception();
  }
  rank0.join();
  for (int i = 0; i < 2; ++i) EXPECT_FALSE(errors[i]) << "rank " << i << ": " << message_of(errors[i]);
  EXPECT_EQ(got, (std::vector<int>{42, 42}));
}

// When the world does not meet, rank 0's timeout message mentions the strangers it refused.
TEST(TcpRendezvous, TimeoutMentionsStrangers) {
  const int port = free_port();
  std::exception_ptr error;
  std::thread rank0([&] {
    try {
      make_tcp_rendezvous("127.0.0.1", port, 0, 2, 500ms);
    } catch (...) {
      error = std::current_exception();
    }
  });
  stranger_knocks(port, "GET / HTTP/1.0\r\n\r\n");
  rank0.join();
  ASSERT_TRUE(error);
  EXPECT_THROW(std::rethrow_exception(error), TimeoutError);
  const std::string msg = message_of(error);
  EXPECT_NE(msg.find("1 connection(s) that were not kiln ranks"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing ranks: 1"), std::string::npos) << msg;
}

TEST(TcpRendezvous, BadArgumentsAreRefused) {
  EXPECT_THROW(make_tcp_rendezvous("127.0.0.1", free_port(), 3, 2, 100ms), Error);
  EXPECT_THROW(make_tcp_rendezvous("127.0.0.1", 0, 0, 2, 100ms), Error);
  try {
    make_tcp_rendezvous("127.0.0.1", 70000, 1, 2, 100ms);
    ADD_FAILURE() << "port 70000 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MASTER_PORT"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln::dist::detail
