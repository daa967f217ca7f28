// The TCP rendezvous (make_tcp_rendezvous, detail/group_internal.h): how the ranks meet without MPI.
//
// A star around rank 0: rank 0 listens on MASTER_PORT (all interfaces), every other rank connects to
// MASTER_ADDR:MASTER_PORT and says who it is (magic, protocol version, rank, world size). The constructor
// returns on every rank only once the whole world has met, so a missing rank shows up at once, as a
// TimeoutError on every rank that did start. broadcast() and barrier() only move a few bytes (the NCCL
// unique id, a barrier token), so relaying through rank 0 costs nothing that matters.
//
// Every wait is bounded: sockets are used with poll() and MSG_DONTWAIT, so a peer that stops reading or
// writing gives a TimeoutError after the timeout, and one that exits gives a DistributedError at once.
// The ranks of one job run the same build on the same architecture: the headers travel in host byte order.
#include <arpa/inet.h>    // htons, htonl, inet_ntop
#include <netdb.h>        // getaddrinfo, gai_strerror
#include <netinet/in.h>   // sockaddr_in, INADDR_ANY
#include <netinet/tcp.h>  // TCP_NODELAY
#include <poll.h>         // poll
#include <sys/socket.h>   // socket, bind, listen, accept4, connect, send, recv
#include <unistd.h>       // close

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <system_error>  // std::generic_category: a thread-safe strerror
#include <thread>
#include <utility>
#include <vector>

#include "kiln/distributed/detail/group_internal.h"

namespace kiln::dist::detail {
namespace {

using Clock = std::chrono::steady_clock;
using kiln::detail::str_cat;

constexpr uint32_t kMagic = 0x6e6c696b;  // "kiln"
constexpr uint32_t kProtocolVersion = 1;
constexpr auto kRetryInterval = std::chrono::milliseconds(100);
// A real rank sends its hello right after connecting; anything slower is not one of ours.
constexpr auto kHelloTimeout = std::chrono::seconds(5);

// What a rank says when it connects, and rank 0's answer.
struct Hello {
  uint32_t magic;
  uint32_t version;
  int32_t rank;
  int32_t size;
};
enum class Status : int32_t { Ok, SizeMismatch, BadRank, DuplicateRank, VersionMismatch, JoinTimeout };
struct Reply {
  uint32_t magic;
  Status status;
  int32_t size;  // rank 0's world size
};

// Every broadcast/barrier message starts with this, so ranks that call different operations (or broadcast
// different sizes) get a clear error instead of misreading each other's bytes.
enum class Op : uint32_t { Broadcast = 1, Barrier = 2 };
struct Frame {
  uint32_t magic;
  Op op;
  int32_t root;
  uint32_t unused;
  uint64_t bytes;
};

const char* op_name(Op op) { return op == Op::Broadcast ? "broadcast" : op == Op::Barrier ? "barrier" : "?"; }

std::string error_text(int err) { return std::generic_category().message(err); }

// Owns a file descriptor.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { reset(); }
  Socket(Socket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Socket& operator=(Socket&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

enum class Io { Ok, Timeout, Closed, Failed };
struct IoResult {
  Io io = Io::Ok;
  int err = 0;  // errno of Failed
};

// Waits until fd is ready for `events` (or in error, which the next send/recv reports); false at the deadline.
bool wait_ready(int fd, short events, Clock::time_point deadline, int& err) {
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(left, 0, INT_MAX)));
    if (r > 0) return true;
    if (r == 0) {
      if (Clock::now() >= deadline) return false;
      continue;  // poll may wake a little early
    }
    if (errno != EINTR) {
      err = errno;
      return true;  // let the caller's send/recv fail with the real error
    }
  }
}

// Moves exactly n bytes, looping over partial transfers, until the deadline.
IoResult transfer(int fd, void* data, size_t n, bool sending, Clock::time_point deadline) {
  auto* p = static_cast<char*>(data);
  size_t done = 0;
  while (done < n) {
    int err = 0;
    if (!wait_ready(fd, sending ? POLLOUT : POLLIN, deadline, err)) return {Io::Timeout};
    // MSG_NOSIGNAL: a closed peer is an EPIPE error here, not a SIGPIPE that ends the process.
    const ssize_t k = sending ? ::send(fd, p + done, n - done, MSG_DONTWAIT | MSG_NOSIGNAL)
                              : ::recv(fd, p + done, n - done, MSG_DONTWAIT);
    if (k > 0) {
      done += static_cast<size_t>(k);
    } else if (k == 0 && !sending) {
      return {Io::Closed};
    } else if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) {
      continue;
    } else if (k < 0 && (errno == EPIPE || errno == ECONNRESET)) {
      return {Io::Closed};
    } else {
      return {Io::Failed, k < 0 ? errno : EIO};
    }
  }
  return {};
}

void set_no_delay(int fd) {
  const int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // latency only: failure is harmless
}

class TcpRendezvous final : public Rendezvous {
 public:
  TcpRendezvous(std::string addr, int port, int rank, int size, std::chrono::milliseconds timeout)
      : addr_(std::move(addr)), port_(port), rank_(rank), size_(size), timeout_(timeout) {
    KILN_CHECK(size >= 1 && rank >= 0 && rank < size, "TCP rendezvous: rank ", rank, " is not in a world of size ",
               size, "; check RANK and WORLD_SIZE");
    KILN_CHECK(port >= 1 && port <= 65535, "TCP rendezvous: MASTER_PORT ", port,
               " is not a TCP port (1..65535); set MASTER_PORT to a free port of rank 0's host");
    peers_.resize(static_cast<size_t>(size));
    if (size == 1) return;  // nobody to meet
    const auto deadline = Clock::now() + timeout_;
    if (rank == 0) {
      accept_peers(deadline);
    } else {
      connect_to_root(deadline);
    }
  }

  void broadcast(void* data, size_t n, int root) override {
    KILN_CHECK(root >= 0 && root < size_, "TCP rendezvous broadcast: root ", root, " is not a rank of a world of size ",
               size_);
    if (size_ == 1) return;
    const auto deadline = Clock::now() + timeout_;
    const Frame frame{kMagic, Op::Broadcast, root, 0, n};
    if (rank_ == 0) {
      if (root != 0) receive(root, frame, data, deadline);
      for (int r = 1; r < size_; ++r) {
        if (r != root) send(r, frame, data, deadline);
      }
    } else if (rank_ == root) {
      send(0, frame, data, deadline);
    } else {
      receive(0, frame, data, deadline);
    }
  }

  void barrier() override {
    if (size_ == 1) return;
    const auto deadline = Clock::now() + timeout_;
    const Frame frame{kMagic, Op::Barrier, 0, 0, 0};
    if (rank_ == 0) {
      for (int r = 1; r < size_; ++r) receive(r, frame, nullptr, deadline);
      for (int r = 1; r < size_; ++r) send(r, frame, nullptr, deadline);
    } else {
      send(0, frame, nullptr, deadline);
      receive(0, frame, nullptr, deadline);
    }
  }

 private:
  std::string where() const { return str_cat(addr_, ":", port_); }
  std::string ms() const { return str_cat(timeout_.count(), " ms"); }

  // ---- meeting ----

  void accept_peers(Clock::time_point deadline) {
    Socket listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!listener.valid()) {
      throw DistributedError(str_cat("rank 0: cannot create the rendezvous socket (", error_text(errno), ")"));
    }
    const int one = 1;
    // A previous job's connections in TIME_WAIT must not keep the port from being reused.
    (void)::setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in any{};
    any.sin_family = AF_INET;
    any.sin_addr.s_addr = htonl(INADDR_ANY);  // the others reach us through MASTER_ADDR, whichever interface
    any.sin_port = htons(static_cast<uint16_t>(port_));
    if (::bind(listener.get(), reinterpret_cast<const sockaddr*>(&any), sizeof any) != 0 ||
        ::listen(listener.get(), size_) != 0) {
      throw DistributedError(str_cat("rank 0: cannot listen on port ", port_, " for the rendezvous at ", where(), " (",
                                     error_text(errno), "); is MASTER_PORT free on this host? choose another one"));
    }
    int joined = 0, strangers = 0;
    while (joined < size_ - 1) {
      int err = 0;
      if (!wait_ready(listener.get(), POLLIN, deadline, err)) {
        give_up_waiting(joined, strangers, deadline);
      }
      Socket peer(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!peer.valid()) {
        if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
        throw DistributedError(
            str_cat("rank 0: accepting a connection at ", where(), " failed (", error_text(errno), ")"));
      }
      Hello hello{};
      const IoResult got = transfer(peer.get(), &hello, sizeof hello, false,
                                    std::min<Clock::time_point>(deadline, Clock::now() + kHelloTimeout));
      if (got.io != Io::Ok || hello.magic != kMagic) {
        ++strangers;  // not a kiln rank (a port scanner, another program): drop it and keep waiting
        continue;
      }
      const Status status = hello.version != kProtocolVersion                 ? Status::VersionMismatch
                            : hello.size != size_                             ? Status::SizeMismatch
                            : hello.rank < 1 || hello.rank >= size_           ? Status::BadRank
                            : peers_[static_cast<size_t>(hello.rank)].valid() ? Status::DuplicateRank
                                                                              : Status::Ok;
      if (status != Status::Ok) {
        // Tell the newcomer why, then fail here too: the job is misconfigured, waiting would not help.
        const Reply reply{kMagic, status, size_};
        (void)transfer(peer.get(), const_cast<Reply*>(&reply), sizeof reply, true, Clock::now() + kHelloTimeout);
        throw DistributedError(str_cat("rank 0: a process connected to the rendezvous at ", where(), " as rank ",
                                       hello.rank, " with world size ", hello.size, " (protocol ", hello.version,
                                       "), but rank 0 has world size ", size_, " (protocol ", kProtocolVersion,
                                       "): ", mismatch_advice(status)));
      }
      set_no_delay(peer.get());
      peers_[static_cast<size_t>(hello.rank)] = std::move(peer);
      ++joined;
    }
    // Everyone is here: tell them, so every rank's constructor returns knowing the whole world met.
    const Reply ok{kMagic, Status::Ok, size_};
    for (int r = 1; r < size_; ++r) send_raw(r, &ok, sizeof ok, deadline, "the rendezvous");
  }

  [[noreturn]] void give_up_waiting(int joined, int strangers, Clock::time_point deadline) {
    std::string missing;
    for (int r = 1; r < size_; ++r) {
      if (!peers_[static_cast<size_t>(r)].valid()) missing += str_cat(missing.empty() ? "" : ", ", r);
    }
    // The ranks that did come learn that this is a timeout (not a crash of rank 0).
    const Reply timeout{kMagic, Status::JoinTimeout, size_};
    for (auto& peer : peers_) {
      if (peer.valid()) (void)transfer(peer.get(), const_cast<Reply*>(&timeout), sizeof timeout, true, deadline);
    }
    throw TimeoutError(str_cat("rank 0: only ", joined + 1, " of ", size_, " ranks joined the rendezvous at ", where(),
                               " within ", ms(), " (missing ranks: ", missing, ")",
                               strangers ? str_cat("; ", strangers,
                                                   " connection(s) that were not kiln ranks were "
                                                   "refused (another program on MASTER_PORT?)")
                                         : std::string(),
                               "; start every rank with MASTER_ADDR=", addr_, " MASTER_PORT=", port_,
                               " and the same WORLD_SIZE, and check that the port is reachable from their hosts"));
  }

  static const char* mismatch_advice(Status status) {
    switch (status) {
      case Status::SizeMismatch: return "start every rank with the same WORLD_SIZE";
      case Status::BadRank: return "every rank needs a distinct RANK in [1, WORLD_SIZE) besides rank 0";
      case Status::DuplicateRank: return "two processes claim the same RANK; give every process its own";
      case Status::VersionMismatch: return "run the same kiln build on every rank";
      default: return "check RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT of every rank";
    }
  }

  void connect_to_root(Clock::time_point deadline) {
    Socket s;
    std::string last_error = "no attempt";
    const std::string port_text = std::to_string(port_);
    while (!s.valid()) {
      addrinfo hints{};
      hints.ai_family = AF_INET;  // rank 0 listens on IPv4
      hints.ai_socktype = SOCK_STREAM;
      addrinfo* found = nullptr;
      const int gai = ::getaddrinfo(addr_.c_str(), port_text.c_str(), &hints, &found);
      if (gai != 0) {
        last_error = str_cat("cannot resolve \"", addr_, "\": ", ::gai_strerror(gai));
      } else {
        for (addrinfo* ai = found; ai != nullptr && !s.valid(); ai = ai->ai_next) {
          s = try_connect(*ai, deadline, last_error);
        }
        ::freeaddrinfo(found);
      }
      if (s.valid()) break;
      const auto now = Clock::now();
      if (now >= deadline) {
        throw TimeoutError(
            str_cat("rank ", rank_, ": could not connect to rank 0 at ", where(), " within ", ms(),
                    " (last error: ", last_error,
                    "); is rank 0 running? is MASTER_ADDR reachable from "
                    "this host? is MASTER_PORT the same on every rank, free and open on rank 0's host?"));
      }
      std::this_thread::sleep_for(std::min<Clock::duration>(kRetryInterval, deadline - now));  // rank 0 may be late
    }
    set_no_delay(s.get());
    peers_[0] = std::move(s);
    const Hello hello{kMagic, kProtocolVersion, rank_, size_};
    send_raw(0, &hello, sizeof hello, deadline, "the rendezvous");
    Reply reply{};
    const IoResult got = transfer(peers_[0].get(), &reply, sizeof reply, false, deadline);
    if (got.io == Io::Timeout || (got.io == Io::Ok && reply.magic == kMagic && reply.status == Status::JoinTimeout)) {
      throw TimeoutError(str_cat("rank ", rank_, ": connected to rank 0 at ", where(), ", but not all ", size_,
                                 " ranks joined within ", ms(),
                                 "; were all of them started, with the same "
                                 "MASTER_ADDR, MASTER_PORT and WORLD_SIZE?"));
    }
    if (got.io != Io::Ok || reply.magic != kMagic) {
      throw DistributedError(str_cat("rank ", rank_, ": rank 0 at ", where(),
                                     " closed the connection before every rank "
                                     "joined",
                                     got.io == Io::Failed ? str_cat(" (", error_text(got.err), ")") : "",
                                     "; see rank 0's error (is MASTER_PORT used by another program?)"));
    }
    if (reply.status != Status::Ok) {
      throw DistributedError(str_cat("rank ", rank_, ": rank 0 at ", where(), " refused this rank (rank ", rank_,
                                     " with world size ", size_, "; rank 0 has world size ", reply.size,
                                     "): ", mismatch_advice(reply.status)));
    }
  }

  // One non-blocking connect, bounded by the deadline; an invalid socket (and last_error) when it failed.
  static Socket try_connect(const addrinfo& ai, Clock::time_point deadline, std::string& last_error) {
    Socket s(::socket(ai.ai_family, ai.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai.ai_protocol));
    if (!s.valid()) {
      last_error = str_cat("socket: ", error_text(errno));
      return {};
    }
    int err = 0;
    if (::connect(s.get(), ai.ai_addr, ai.ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS || err == EINTR) {
        // Bounded by our deadline, not the kernel's SYN retries (minutes) for a host that does not answer.
        int poll_err = 0;
        if (!wait_ready(s.get(), POLLOUT, deadline, poll_err)) {
          err = ETIMEDOUT;
        } else {
          socklen_t len = sizeof err;
          if (::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        }
      }
    }
    if (err != 0) {
      last_error = error_text(err);
      return {};
    }
    return s;
  }

  // ---- moving bytes ----

  std::string peer_name(int peer) const {
    return peer == 0 ? str_cat("rank 0 (at ", where(), ")") : str_cat("rank ", peer);
  }

  void check(const IoResult& result, int peer, const std::string& what, bool sending) const {
    switch (result.io) {
      case Io::Ok: return;
      case Io::Timeout:
        throw TimeoutError(str_cat("rank ", rank_, ": timed out after ", ms(), " in ", what, " ",
                                   sending ? "sending to " : "waiting for ", peer_name(peer), " (rendezvous at ",
                                   where(),
                                   "); did every rank call the same rendezvous operations "
                                   "in the same order? a rank may be stuck or much slower"));
      case Io::Closed:
        throw DistributedError(str_cat("rank ", rank_, ": ", peer_name(peer), " closed the connection during ", what,
                                       " (rendezvous at ", where(), "); it probably exited or crashed: see its log"));
      case Io::Failed:
        throw DistributedError(str_cat("rank ", rank_, ": the connection to ", peer_name(peer), " failed during ", what,
                                       " (rendezvous at ", where(), "): ", error_text(result.err)));
    }
  }

  void send_raw(int peer, const void* data, size_t n, Clock::time_point deadline, const std::string& what) {
    check(transfer(peers_[static_cast<size_t>(peer)].get(), const_cast<void*>(data), n, true, deadline), peer, what,
          true);
  }

  void send(int peer, const Frame& frame, const void* data, Clock::time_point deadline) {
    const std::string what = op_name(frame.op);
    send_raw(peer, &frame, sizeof frame, deadline, what);
    if (frame.bytes > 0) send_raw(peer, data, frame.bytes, deadline, what);
  }

  void receive(int peer, const Frame& expected, void* data, Clock::time_point deadline) {
    const std::string what = op_name(expected.op);
    const int fd = peers_[static_cast<size_t>(peer)].get();
    Frame got{};
    check(transfer(fd, &got, sizeof got, false, deadline), peer, what, false);
    if (got.magic != kMagic || got.op != expected.op || got.root != expected.root || got.bytes != expected.bytes) {
      throw DistributedError(str_cat(
          "rank ", rank_, ": in ", what, " (root ", expected.root, ", ", expected.bytes, " bytes), ", peer_name(peer),
          " sent ", got.magic == kMagic ? op_name(got.op) : "garbage", " (root ", got.root, ", ", got.bytes,
          " bytes); every rank must call the same rendezvous operations, with the same sizes, in the same order"));
    }
    if (expected.bytes > 0) check(transfer(fd, data, expected.bytes, false, deadline), peer, what, false);
  }

  std::string addr_;
  int port_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  // Rank 0: peers_[r] is the connection of rank r (peers_[0] unused). Others: peers_[0] is rank 0.
  std::vector<Socket> peers_;
};

}  // namespace

std::unique_ptr<Rendezvous> make_tcp_rendezvous(const std::string& addr, int port, int rank, int size,
                                                std::chrono::milliseconds timeout) {
  return std::make_unique<TcpRendezvous>(addr, port, rank, size, timeout);
}

}  // namespace kiln::dist::detail
