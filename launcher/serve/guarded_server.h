// cpp-httplib's server with a bound on clients that send their request head
// slowly (Debian's httplib 0.11 waits for a head as long as each byte comes
// within its read timeout: 900 clients trickling headers held every thread
// and stalled the API for ~35 s).
//
// A request's head (request line and headers) must arrive within
// head_seconds, and at most max_slow heads may be still arriving after
// kSlowAfter (a client on a network sends its head in one go): a connection
// past either is closed. So slow clients hold a thread for a tenth of a
// second, or up to head_seconds for the first max_slow of them, and the
// other requests keep their threads. The rest is httplib's own: this class
// runs its connection loop (keep-alive, its process_request) over a stream
// of its own that enforces the two bounds.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>

namespace tandem::launcher {

class GuardedServer : public httplib::Server {
 public:
  static constexpr std::chrono::milliseconds kSlowAfter{100};

  // head_seconds: the whole head's deadline; max_slow: heads still arriving after kSlowAfter, at most.
  GuardedServer(double head_seconds, int max_slow) : head_seconds_(head_seconds), max_slow_(max_slow) {}
  // Connections closed for a slow head so far.
  int64_t refused_slow() const { return refused_.load(); }

 private:
  bool process_and_close_socket(socket_t sock) override;

  double head_seconds_;
  int max_slow_;
  std::atomic<int> slow_{0};  // heads still arriving after kSlowAfter, now
  std::atomic<int64_t> refused_{0};
  friend class GuardedStream;
};

}  // namespace tandem::launcher
