// `leasehold demo`: processes and network (see cmd_demo_env.hpp). Registers no subcommand.
#include "tools/cmd_demo_env.hpp"

#include "tools/cmd_common.hpp"

#include "tools/demo_subnet.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

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

/// In a forked child before exec: the default disposition of every signal the demo handles.
void default_signals_in_child() {
  for (int sig : kStopSignals) ::signal(sig, SIG_DFL);
  ::signal(SIGPIPE, SIG_DFL);
}

std::int64_t mono_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1'000'000;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string tail_of(const std::string& text, std::size_t lines) {
  if (text.empty()) return "(empty)";
  std::size_t pos = text.size();
  for (std::size_t n = 0; n <= lines && pos > 0; ++n) {
    const auto p = text.rfind('\n', pos - 1);
    if (p == std::string::npos) return text;
    pos = p;
  }
  return text.substr(pos + 1);
}
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


int run_command(const std::vector<std::string>& argv, std::string* output, std::uint64_t timeout_ms) {
  if (argv.empty()) return 127;
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return 127;
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    return 127;
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    default_signals_in_child();
    ::dup2(pipefd[1], 1);
    ::dup2(pipefd[1], 2);
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(pipefd[1]);
  std::string out;
  const std::int64_t deadline = mono_ms() + static_cast<std::int64_t>(timeout_ms);
  bool killed = false;
  for (;;) {
    pollfd p{pipefd[0], POLLIN, 0};
    const std::int64_t left = deadline - mono_ms();
    if (left <= 0 && !killed) {
      ::kill(pid, SIGKILL);
      killed = true;
    }
    const int rc = ::poll(&p, 1, static_cast<int>(left > 0 ? std::min<std::int64_t>(left, 200) : 200));
    if (rc < 0 && errno == EINTR) continue;
    if (rc > 0) {
      char buf[4096];
      const ssize_t n = ::read(pipefd[0], buf, sizeof buf);
      if (n <= 0) break;
      if (out.size() < (1u << 20)) out.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(pipefd[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (output) *output = out;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

// ---- children -----------------------------------------------------------------------------------

bool Child::running() const {
  if (pid <= 0) return false;
  int status = 0;
  return ::waitpid(pid, &status, WNOHANG) == 0;
}

void Child::stop(std::uint64_t grace_ms) {
  if (pid <= 0) return;
  int status = 0;
  if (::waitpid(pid, &status, WNOHANG) == 0) {
    ::kill(pid, SIGTERM);
    const std::int64_t deadline = mono_ms() + static_cast<std::int64_t>(grace_ms);
    while (mono_ms() < deadline && ::waitpid(pid, &status, WNOHANG) == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (::waitpid(pid, &status, WNOHANG) == 0) {
      ::kill(-pid, SIGKILL);  // its process group
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
    }
  }
  pid = -1;
}

std::optional<Child> start_child(const std::string& label, const std::vector<std::string>& argv,
                                 const std::string& log_path, const std::string& netns, std::string& error) {
  int ns_fd = -1;
  if (!netns.empty()) {
    const std::string p = "/run/netns/" + netns;
    ns_fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (ns_fd < 0) {
      error = "cannot open network namespace " + p + ": " + std::strerror(errno);
      return std::nullopt;
    }
  }
  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (log_fd < 0) {
    error = "cannot create " + log_path + ": " + std::strerror(errno);
    if (ns_fd >= 0) ::close(ns_fd);
    return std::nullopt;
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    error = std::string("fork: ") + std::strerror(errno);
    ::close(log_fd);
    if (ns_fd >= 0) ::close(ns_fd);
    return std::nullopt;
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(126);
    ::setpgid(0, 0);
    default_signals_in_child();
    if (ns_fd >= 0 && ::setns(ns_fd, CLONE_NEWNET) != 0) {
      ::dprintf(log_fd, "setns(%s): %s\n", netns.c_str(), std::strerror(errno));
      ::_exit(126);
    }
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::dprintf(2, "cannot execute %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(log_fd);
  if (ns_fd >= 0) ::close(ns_fd);
  Child c;
  c.label = label;
  c.pid = pid;
  c.log_path = log_path;
  return c;
}

std::optional<std::string> wait_for_line(const Child& child, const std::string& needle,
                                         std::uint64_t timeout_ms, std::string& error) {
  const std::int64_t deadline = mono_ms() + static_cast<std::int64_t>(timeout_ms);
  for (;;) {
    check_interrupted();
    const std::string log = slurp(child.log_path);
    if (const auto p = log.find(needle); p != std::string::npos) {
      const auto e = log.find('\n', p + 1);
      if (e != std::string::npos) return log.substr(p, e - p);  // only whole lines
    }
    const bool alive = child.running();
    if (!alive || mono_ms() > deadline) {
      error = child.label + (alive ? " did not report \"" + needle + "\" within " + std::to_string(timeout_ms) + " ms"
                                   : " exited during start-up") +
              "; last lines of " + child.log_path + ":\n" + tail_of(log, 8);
      return std::nullopt;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// ---- network ------------------------------------------------------------------------------------

namespace {
std::string ip_bin() {
  static const std::string p = find_program("ip");
  return p;
}
bool exists_netns(const std::string& name) { return ::access(("/run/netns/" + name).c_str(), F_OK) == 0; }
/// Serialises choosing and creating demo subnets between runs on this machine (root only:
/// namespaces need root anyway).
constexpr const char* kSubnetLockPath = "/run/leasehold-demo-net.lock";
/// Longest wait for that lock: another run holds it only while it makes its links.
constexpr std::uint64_t kSubnetLockWaitMs = 30'000;

/// The local UDP ports of the sockets a process holds (from /proc/<pid>/fd and /proc/net/udp*).
std::vector<std::uint16_t> udp_ports_of(pid_t pid) {
  std::vector<std::string> inodes;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      char target[256];
      const std::string p = dir + "/" + e->d_name;
      const ssize_t n = ::readlink(p.c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      target[n] = '\0';
      if (std::strncmp(target, "socket:[", 8) == 0) {
        std::string ino(target + 8);
        if (!ino.empty()) ino.pop_back();
        inodes.push_back(ino);
      }
    }
    ::closedir(d);
  }
  std::vector<std::uint16_t> ports;
  for (const char* table : {"/net/udp", "/net/udp6"}) {
    std::ifstream in("/proc/" + std::to_string(pid) + table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::stringstream ss(line);
      std::string sl, local, remote, st, queues, tr, retr, uid, timeout, inode;
      ss >> sl >> local >> remote >> st >> queues >> tr >> retr >> uid >> timeout >> inode;
      for (const auto& i : inodes) {
        if (i != inode) continue;
        const auto colon = local.rfind(':');
        if (colon != std::string::npos)
          ports.push_back(static_cast<std::uint16_t>(std::strtoul(local.c_str() + colon + 1, nullptr, 16)));
      }
    }
  }
  return ports;
}
}  // namespace

std::string Network::setup(const std::string& want, const std::string& run_tag) {
  tag = run_tag;
  if (want != "auto" && want != "netns" && want != "loopback")
    return "--network must be auto, netns or loopback (got \"" + want + "\")";
  std::string reason;
  if (want == "loopback") {
    reason = "--network loopback was asked for";
  } else if (::geteuid() != 0) {
    reason = "network namespaces need root";
  } else if (ip_bin().empty()) {
    reason = "the `ip` program (iproute2) is not installed";
  } else {
    // Pick a /24 under 10.213.0.0/16 that no address or route here uses. Other runs of the
    // demo do the same at the same time, so the look and the making happen under one
    // machine-wide lock (released when `subnet_lock` closes, also if this process dies).
    const int subnet_lock = ::open(kSubnetLockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    const std::int64_t lock_until = mono_ms() + static_cast<std::int64_t>(kSubnetLockWaitMs);
    while (subnet_lock >= 0 && ::flock(subnet_lock, LOCK_EX | LOCK_NB) != 0 && mono_ms() < lock_until) {
      check_interrupted();  // (after the wait: go on unlocked; a clash is then merely unlikely)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    struct LockCloser {
      int fd;
      ~LockCloser() {
        if (fd >= 0) ::close(fd);
      }
    } closer{subnet_lock};
    std::string addrs, routes;
    run_command({ip_bin(), "-o", "-4", "addr", "show"}, &addrs);
    run_command({ip_bin(), "-4", "route", "show", "table", "all"}, &routes);
    const auto picked = pick_demo_subnet(addrs + "\n" + routes, static_cast<unsigned>(::getpid()) % kDemoSubnetCount);
    if (!picked) {
      reason = "every /24 of " + std::string(kDemoSubnetPrefix) + ".0.0/16 is in use here";
      if (want == "netns") return "network namespaces unavailable: " + reason;
    }
    const unsigned octet = picked.value_or(0);
    const std::string net = std::string(kDemoSubnetPrefix) + "." + std::to_string(octet) + ".";
    std::string out;
    bool ok = picked.has_value();
    for (int i = 0; i < 2 && ok; ++i) {
      netns[i] = "lhdemo-" + tag + "-w" + std::to_string(i + 1);
      host_if[i] = "lhd" + tag.substr(0, 8) + "h" + std::to_string(i + 1);
      const std::string peer = "lhd" + tag.substr(0, 8) + "n" + std::to_string(i + 1);
      host_ip[i] = net + std::to_string(4 * i + 1);
      worker_ip[i] = net + std::to_string(4 * i + 2);
      const std::vector<std::vector<std::string>> steps = {
          {ip_bin(), "netns", "add", netns[i]},
          {ip_bin(), "link", "add", host_if[i], "type", "veth", "peer", "name", peer, "netns", netns[i]},
          {ip_bin(), "addr", "add", host_ip[i] + "/30", "dev", host_if[i]},
          {ip_bin(), "link", "set", host_if[i], "up"},
          {ip_bin(), "-n", netns[i], "addr", "add", worker_ip[i] + "/30", "dev", peer},
          {ip_bin(), "-n", netns[i], "link", "set", peer, "up"},
          {ip_bin(), "-n", netns[i], "link", "set", "lo", "up"},
      };
      for (const auto& s : steps) {
        if (run_command(s, &out) != 0) {
          std::string cmd;
          for (const auto& a : s) cmd += (cmd.empty() ? "" : " ") + a;
          reason = "`" + cmd + "` failed: " + out;
          while (!reason.empty() && (reason.back() == '\n' || reason.back() == ' ')) reason.pop_back();
          ok = false;
          break;
        }
      }
    }
    if (ok) {
      mode = Mode::netns;
      why = "each worker in its own network namespace, linked to lockd's by a veth pair";
      return "";
    }
    teardown();  // whatever part was made
    if (want == "netns") return "network namespaces unavailable: " + reason;
  }
  mode = Mode::loopback;
  netns[0] = netns[1] = "";
  for (int i = 0; i < 2; ++i) host_ip[i] = "127.0.0.1";
  why = reason;
  if (::geteuid() == 0 && !find_program("nft").empty() &&
      run_command({find_program("nft"), "list", "tables"}) == 0) {
    filter = "nft";
  } else if (::geteuid() == 0 && !find_program("iptables").empty() &&
             run_command({find_program("iptables"), "-w", "-S", "INPUT"}) == 0) {
    filter = "iptables";
  }
  return "";
}

std::string Network::lockd_address(int i, std::uint16_t port) const {
  return host_ip[i] + ":" + std::to_string(port);
}

std::string Network::cut_off(int i, pid_t supervisor_pid, std::uint16_t lockd_port) {
  std::string out;
  if (mode == Mode::netns) {
    if (run_command({ip_bin(), "link", "set", host_if[i], "down"}, &out) != 0)
      return "ip link set " + host_if[i] + " down: " + out;
    cut[i] = true;
    return "";
  }
  if (filter.empty())
    return "cannot cut worker " + std::to_string(i + 1) +
           " off lockd: no network namespaces and no usable packet filter (nft or iptables, as root)";
  const auto ports = udp_ports_of(supervisor_pid);
  if (ports.empty()) return "cannot find the UDP port of supervisor pid " + std::to_string(supervisor_pid);
  const std::string lp = std::to_string(lockd_port);
  if (filter == "nft") {
    const std::string nft = find_program("nft");
    const std::string table = "lhdemo_" + tag;
    if (run_command({nft, "add", "table", "inet", table}, &out) != 0) return "nft add table: " + out;
    if (run_command({nft, "add", "chain", "inet", table, "in",
                     "{ type filter hook input priority -10 ; policy accept ; }"}, &out) != 0)
      return "nft add chain: " + out;
    for (std::uint16_t p : ports) {
      const std::string sp = std::to_string(p);
      if (run_command({nft, "add", "rule", "inet", table, "in", "udp", "sport", sp, "udp", "dport", lp, "drop"}, &out) != 0 ||
          run_command({nft, "add", "rule", "inet", table, "in", "udp", "sport", lp, "udp", "dport", sp, "drop"}, &out) != 0)
        return "nft add rule: " + out;
    }
  } else {
    const std::string ipt = find_program("iptables");
    for (std::uint16_t p : ports) {
      const std::string sp = std::to_string(p);
      for (const auto& [s, d] : {std::pair{sp, lp}, std::pair{lp, sp}}) {
        const std::string rule = "-p udp --sport " + s + " --dport " + d + " -j DROP";
        if (run_command({ipt, "-w", "-I", "INPUT", "-p", "udp", "--sport", s, "--dport", d, "-j", "DROP"}, &out) != 0)
          return "iptables -I INPUT " + rule + ": " + out;
        filter_rules.push_back(s + " " + d);
      }
    }
  }
  cut[i] = true;
  return "";
}

std::string Network::reconnect(int i) {
  if (!cut[i]) return "";
  std::string out;
  if (mode == Mode::netns) {
    if (run_command({ip_bin(), "link", "set", host_if[i], "up"}, &out) != 0)
      return "ip link set " + host_if[i] + " up: " + out;
  } else if (filter == "nft") {
    if (run_command({find_program("nft"), "delete", "table", "inet", "lhdemo_" + tag}, &out) != 0)
      return "nft delete table: " + out;
  } else {
    for (const auto& r : filter_rules) {
      const auto sp = r.find(' ');
      run_command({find_program("iptables"), "-w", "-D", "INPUT", "-p", "udp", "--sport", r.substr(0, sp),
                   "--dport", r.substr(sp + 1), "-j", "DROP"});
    }
    filter_rules.clear();
  }
  cut[i] = false;
  return "";
}

void Network::teardown() {
  for (int i = 0; i < 2; ++i) {
    if (cut[i]) reconnect(i);
    if (!host_if[i].empty() && !ip_bin().empty()) run_command({ip_bin(), "link", "del", host_if[i]});
    if (!netns[i].empty() && exists_netns(netns[i])) run_command({ip_bin(), "netns", "del", netns[i]});
  }
}

std::string Network::describe() const {
  if (mode == Mode::netns)
    return "network namespaces " + netns[0] + " (" + worker_ip[0] + ") and " + netns[1] + " (" + worker_ip[1] +
           "), veth pairs to lockd at " + host_ip[0] + " / " + host_ip[1] + "; a cut sets the host-side link down";
  return "loopback, all processes in one network namespace; a cut drops the supervisor's datagrams with " +
         (filter.empty() ? std::string("- no packet filter available") : filter);
}

}  // namespace leasehold::cli::demo
