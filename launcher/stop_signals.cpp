#include "launcher/stop_signals.h"

#include <signal.h>

namespace tandem::launcher {

std::atomic<int> g_stop_signal{0};

namespace {

extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

void set_action(int sig, void (*handler)(int)) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a read or write in progress goes on; the loops poll g_stop_signal
  sigaction(sig, &sa, nullptr);
}

sigset_t stop_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

void hold_stop_signals() {
  const sigset_t set = stop_set();
  sigprocmask(SIG_BLOCK, &set, nullptr);
}

void catch_stop_signals() {
  set_action(SIGUSR1, on_stop_signal);
  set_action(SIGTERM, on_stop_signal);
  const sigset_t set = stop_set();
  sigprocmask(SIG_UNBLOCK, &set, nullptr);
}

void release_stop_signals() {
  set_action(SIGUSR1, SIG_DFL);
  set_action(SIGTERM, SIG_DFL);
  if (const int sig = g_stop_signal.load(); sig != 0) raise(sig);
}

}  // namespace tandem::launcher
