// `leasehold demo`: stopping on a signal (see cmd_demo_env.hpp). Registers no subcommand.
#include "tools/cmd_demo_env.hpp"

#include <signal.h>

#include <iterator>

namespace leasehold::cli::demo {

std::atomic<int> g_interrupted{0};

void check_interrupted() {
  if (const int sig = g_interrupted.load(std::memory_order_relaxed); sig != 0) throw Interrupted{sig};
}

std::string signal_name(int signal) {
  switch (signal) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return "signal " + std::to_string(signal);
  }
}

namespace {
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP};
struct sigaction g_old_stop[std::size(kStopSignals)] {}, g_old_pipe {};
void on_signal(int sig) {
  int none = 0;
  g_interrupted.compare_exchange_strong(none, sig, std::memory_order_relaxed);  // the first one wins
}
void on_sigpipe(int) {}

}  // namespace

SignalGuard::SignalGuard() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (std::size_t i = 0; i < std::size(kStopSignals); ++i) ::sigaction(kStopSignals[i], &sa, &g_old_stop[i]);
  struct sigaction pipe_sa {};
  pipe_sa.sa_handler = on_sigpipe;  // a handler, not SIG_IGN: exec resets it for the children
  sigemptyset(&pipe_sa.sa_mask);
  ::sigaction(SIGPIPE, &pipe_sa, &g_old_pipe);
}
SignalGuard::~SignalGuard() {
  for (std::size_t i = 0; i < std::size(kStopSignals); ++i) ::sigaction(kStopSignals[i], &g_old_stop[i], nullptr);
  ::sigaction(SIGPIPE, &g_old_pipe, nullptr);
}


}  // namespace leasehold::cli::demo
