#include "launcher/serve/guarded_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <string>

namespace tandem::launcher {

using Clock = std::chrono::steady_clock;

namespace {

// Waits up to `ms` for `events` on `sock`; false on timeout or error.
bool wait_for(socket_t sock, short events, int ms) {
  pollfd p{sock, events, 0};
  for (;;) {
    const int r = ::poll(&p, 1, std::max(0, ms));
    if (r > 0) return true;
    if (r == 0 || errno != EINTR) return false;
  }
}

void address_of(const sockaddr_storage& a, std::string& ip, int& port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &v4->sin_addr, buf, sizeof buf);
    port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, buf, sizeof buf);
    port = ntohs(v6->sin6_port);
  }
  ip = buf;
}

}  // namespace

// One request's stream over the connection: reads buffered (httplib reads a
// head a byte at a time), the head's two bounds checked at every read.
class GuardedStream : public httplib::Stream {
 public:
  GuardedStream(GuardedServer& server, socket_t sock, int read_ms, int write_ms)
      : server_(server), sock_(sock), read_ms_(read_ms), write_ms_(write_ms), started_(Clock::now()) {}
  ~GuardedStream() override { head_done(); }
  GuardedStream(const GuardedStream&) = delete;
  GuardedStream& operator=(const GuardedStream&) = delete;

  bool is_readable() const override { return pos_ < len_ || wait_for(sock_, POLLIN, wait_ms()); }
  bool is_writable() const override { return wait_for(sock_, POLLOUT, write_ms_); }

  ssize_t read(char* ptr, size_t size) override {
    if (pos_ == len_) {
      for (;;) {
        if (in_head_ && !head_allowed()) return -1;
        const bool checkpoint = in_head_ && !slow_;  // this wait ends at kSlowAfter at the latest
        if (wait_for(sock_, POLLIN, wait_ms())) break;
        if (!checkpoint) return -1;  // the read timed out, or the head's deadline passed
      }
      if (in_head_ && !head_allowed()) return -1;
      ssize_t n;
      do n = ::recv(sock_, buf_.data(), buf_.size(), 0);
      while (n < 0 && errno == EINTR);
      if (n <= 0) return n;
      pos_ = 0;
      len_ = static_cast<std::size_t>(n);
    }
    const std::size_t n = std::min(size, len_ - pos_);
    std::memcpy(ptr, buf_.data() + pos_, n);
    if (in_head_) see(ptr, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    ssize_t n;
    do n = ::send(sock_, ptr, size, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (::getpeername(sock_, reinterpret_cast<sockaddr*>(&a), &len) == 0) address_of(a, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (::getsockname(sock_, reinterpret_cast<sockaddr*>(&a), &len) == 0) address_of(a, ip, port);
  }
  socket_t socket() const override { return sock_; }
  // The head was refused (too slow): the connection ends (httplib answers 400 and would wait for another).
  bool refused() const { return refused_; }

 private:
  // While the head is arriving: within its deadline, and past kSlowAfter one of at most max_slow such heads.
  bool head_allowed() {
    const auto since = Clock::now() - started_;
    if (since > std::chrono::duration<double>(server_.head_seconds_)) return refuse();
    if (!slow_ && since > GuardedServer::kSlowAfter) {
      if (server_.slow_.fetch_add(1) >= server_.max_slow_) {
        server_.slow_.fetch_sub(1);
        return refuse();
      }
      slow_ = true;
    }
    return true;
  }
  bool refuse() {
    server_.refused_.fetch_add(1);
    refused_ = true;
    head_done();
    return false;
  }
  // The head ends at its first empty line: CRLF CRLF (or LF LF).
  void see(const char* p, std::size_t n) {
    for (std::size_t i = 0; i < n && in_head_; ++i) {
      const char c = p[i];
      if (c == '\n') {
        if (blank_) head_done();
        blank_ = true;
      } else if (c != '\r') {
        blank_ = false;
      }
    }
  }
  void head_done() {
    in_head_ = false;
    if (slow_) server_.slow_.fetch_sub(1);
    slow_ = false;
  }
  // A read waits at most the read timeout; while the head arrives, not past kSlowAfter until it is counted
  // as slow (head_allowed decides then), and not past its deadline.
  int wait_ms() const {
    if (!in_head_) return read_ms_;
    const auto until = slow_ ? std::chrono::duration<double>(server_.head_seconds_)
                             : std::chrono::duration<double>(GuardedServer::kSlowAfter);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - (Clock::now() - started_));
    return static_cast<int>(std::clamp<int64_t>(left.count() + 1, 0, read_ms_));
  }

  GuardedServer& server_;
  socket_t sock_;
  int read_ms_, write_ms_;
  Clock::time_point started_;
  std::array<char, 4096> buf_{};
  std::size_t pos_ = 0, len_ = 0;
  bool in_head_ = true, blank_ = false, slow_ = false, refused_ = false;
};

// httplib's loop for one connection (keep-alive: up to its count of
// requests, each after its first byte came within the keep-alive timeout),
// each request's head timed from that first byte.
bool GuardedServer::process_and_close_socket(socket_t sock) {
  const int read_ms = static_cast<int>(read_timeout_sec_ * 1000 + read_timeout_usec_ / 1000);
  const int write_ms = static_cast<int>(write_timeout_sec_ * 1000 + write_timeout_usec_ / 1000);
  bool ok = true;
  for (std::size_t left = keep_alive_max_count_; svr_sock_ != INVALID_SOCKET && left > 0; --left) {
    // The next request: its first byte within the keep-alive timeout (looking every 100 ms for a stop).
    bool readable = false;
    for (int64_t waited = 0; !readable && svr_sock_ != INVALID_SOCKET && waited < keep_alive_timeout_sec_ * 1000;
         waited += 100)
      readable = wait_for(sock, POLLIN, 100);
    if (!readable) break;
    GuardedStream stream(*this, sock, read_ms, write_ms);
    bool closed = false;
    ok = process_request(stream, left == 1, closed, nullptr);
    if (!ok || closed || stream.refused()) break;
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ok;
}

}  // namespace tandem::launcher
