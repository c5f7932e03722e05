// Real processes for the supervisor's process tests: leasehold-lockd and leasehold-supervisor on
// loopback, each with its stdout/stderr in a temporary directory, started, stopped (SIGSTOP/
// SIGCONT), terminated and waited for; plus readers of their structured log lines. The
// processes, files and waits are the harness library's (include/leasehold/harness/).
#pragma once

#include "leasehold/harness/log.hpp"
#include "leasehold/harness/process.hpp"
#include "leasehold/harness/relay.hpp"
#include "leasehold/wire/auth.hpp"
#include "leasehold/io/clock.hpp"
#include "leasehold/io/udp.hpp"
#include "leasehold/supervisor/config.hpp"
#include "leasehold/supervisor/control.hpp"

#include <algorithm>
#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#ifndef LEASEHOLD_LOCKD_BINARY
#error "LEASEHOLD_LOCKD_BINARY must name the leasehold-lockd executable"
#endif
#ifndef LEASEHOLD_SUPERVISOR_BINARY
#error "LEASEHOLD_SUPERVISOR_BINARY must name the leasehold-supervisor executable"
#endif

namespace leasehold::supervisor_testing {

namespace fs = std::filesystem;
using nlohmann::json;

using harness::now_ns;
using harness::slurp;

inline void sleep_ms(int ms) { harness::sleep_ms(ms); }

class TempDir : public harness::TempDir {
 public:
  TempDir() : harness::TempDir("lh-sup-test") {
    // Isolated sandboxes run as another, unprivileged uid: they may pass through (not list) the
    // directory, and write only below sandbox_dir().
    ::chmod(path().c_str(), 0711);
    ::mkdir((path() / "sandbox").c_str(), 0755);
    ::chmod((path() / "sandbox").c_str(), 01777);
  }
  /// Where a sandbox (any uid) may write.
  fs::path sandbox_dir() const { return path() / "sandbox"; }
};

/// One child process (a test's child, in its process group) with stdout/stderr appended to files.
class Child {
 public:
  void start(const std::string& binary, const std::vector<std::string>& args, const fs::path& out,
             const fs::path& err) {
    harness::Spawn s;
    s.argv = {binary};
    s.argv.insert(s.argv.end(), args.begin(), args.end());
    s.stdout_path = out;
    s.stderr_path = err;
    s.append_stdout = s.append_stderr = true;
    s.env = env;
    s.own_process_group = false;
    s.die_with_parent = false;
    if (const Status started = proc_.start(s); !started.ok()) throw std::runtime_error(started.message());
  }
  /// Waits until stdout has a whole line containing `needle` (true; a needle may end with
  /// "\n"), the process exits or the timeout passes.
  bool wait_stdout(const std::string& needle, int timeout_ms = 20'000) {
    return harness::wait_for_log_line(proc_.stdout_path(), needle, std::chrono::milliseconds(timeout_ms), &proc_)
        .has_value();
  }
  bool exited() { return !proc_.running(); }
  /// Waits for exit (bounded); the exit code (128 + signal), or -1 on timeout.
  int wait(int timeout_ms = 20'000) { return proc_.wait(std::chrono::milliseconds(timeout_ms)); }
  void signal(int sig) { proc_.signal(sig); }
  void kill9() { proc_.kill9(); }
  /// NAME, value pairs set in the next start's environment (NOTIFY_SOCKET, WATCHDOG_USEC).
  std::vector<std::pair<std::string, std::string>> env;
  pid_t pid() const { return proc_.pid(); }
  std::string out() const { return proc_.out(); }
  std::string err() const { return proc_.err(); }

 private:
  harness::Process proc_;
};

/// The key every process of a test shares.
inline std::string make_key(const fs::path& dir) {
  const fs::path p = dir / "key";
  if (!fs::exists(p)) {
    const Status err = wire::generate_key_file(p.string());
    if (!err.ok()) throw std::runtime_error(err.message());
  }
  return p.string();
}

inline wire::WireKey load_key(const std::string& path) {
  auto k = wire::load_key_file(path);
  if (!k) throw std::runtime_error(k.message());
  return *k;
}

/// A worker key file (0600) for `worker` derived from the cluster key at `cluster_key`, as
/// `leasehold-lockd --derive-worker-key` writes it: what a supervisor is given.
inline std::string make_worker_key(const fs::path& dir, const std::string& cluster_key, const WorkerId& worker) {
  const fs::path p = dir / ("worker-" + worker.str() + ".key");
  if (!fs::exists(p)) {
    const Status err = wire::write_key_file(p.string(), wire::derive_worker_key(load_key(cluster_key), worker));
    if (!err.ok()) throw std::runtime_error(err.message());
  }
  return p.string();
}

struct Lockd {
  Child child;
  std::string address;  // 127.0.0.1:PORT
  fs::path log;

  /// Starts lockd on an ephemeral loopback port with cluster key file `key` (none when empty);
  /// false (with the reason in *error) if it fails.
  bool start(const fs::path& dir, const std::string& key, std::vector<std::string> extra, std::string* error,
             const std::string& tag = "lockd") {
    log = dir / (tag + ".err");
    std::vector<std::string> args = {"--listen", "127.0.0.1:0", "--store", (dir / (tag + ".db")).string()};
    if (std::find(extra.begin(), extra.end(), "--config") == extra.end()) args.push_back("--no-config");
    if (!key.empty()) args.insert(args.end(), {"--key-file", key});  // empty: the keys come in `extra`
    args.insert(args.end(), extra.begin(), extra.end());
    child.start(LEASEHOLD_LOCKD_BINARY, args, dir / (tag + ".out"), log);
    if (!child.wait_stdout("listening ")) {
      *error = "lockd did not start: " + child.err();
      return false;
    }
    const std::string out = child.out();
    const auto p = out.find("listening ");
    address = out.substr(p + 10, out.find('\n', p) - p - 10);
    return true;
  }
  SocketAddress socket_address() const { return *SocketAddress::parse(address); }
  std::string log_text() const { return slurp(log); }
};

struct Supervisor {
  Supervisor() = default;
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;
  /// A clean shutdown, so the test leaves no shm table or cgroup directory behind
  /// (SIGKILL only if it does not exit in time).
  ~Supervisor() {
    if (!child.exited()) {
      child.signal(SIGCONT);
      child.signal(SIGTERM);
      child.wait(10'000);
    }
    child.kill9();
    remove_stale_worker_lock();
  }
  /// A supervisor the test killed (SIGKILL: no clean exit) leaves its worker lock file in the
  /// runtime directory (/run/leasehold for root); remove it once nobody holds it.
  void remove_stale_worker_lock() const {
    const auto id = WorkerId::parse(worker);
    if (!id) return;
    const std::string path = worker_lock_path(*id);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) ::unlink(path.c_str());  // unlinked while held, as a holder does
    ::close(fd);
  }
  Child child;
  fs::path socket;
  fs::path log;
  std::string worker;
  std::string shm;
  std::string binary = LEASEHOLD_SUPERVISOR_BINARY;  ///< an ablated build's, for attack tests

  /// Starts a supervisor against `lockd` with `extra` flags; waits for "ready". `key` is the
  /// cluster key: the supervisor gets the worker key derived for its --worker-id in `extra` (a
  /// random worker when there is none); a key file that is not a cluster key is passed as is.
  bool start(const fs::path& dir, const std::string& lockd, const std::string& key,
             std::vector<std::string> extra, std::string* error, const std::string& tag = "sup") {
    socket = dir / (tag + ".sock");
    log = dir / (tag + ".err");
    std::string key_file = key;
    if (auto k = wire::load_key_file(key); k && k->kind == wire::KeyKind::cluster) {
      std::random_device rd;
      WorkerId id{(std::uint64_t{rd()} << 32) | rd(), (std::uint64_t{rd()} << 32) | rd() | 1};
      for (std::size_t i = 0; i + 1 < extra.size(); ++i)
        if (extra[i] == "--worker-id")
          if (auto w = WorkerId::parse(extra[i + 1])) id = *w;
      key_file = make_worker_key(dir, key, id);
    }
    std::vector<std::string> args = {"--lockd", lockd, "--key-file", key_file, "--control-socket", socket.string()};
    // The test's flags alone, never the host's /etc/leasehold/supervisor.toml, unless it names one.
    if (std::find(extra.begin(), extra.end(), "--config") == extra.end()) args.push_back("--no-config");
    // Root's supervisors on one host need disjoint sandbox uid ranges (tests run in parallel):
    // one of its own per test process and supervisor, unless the test chose one.
    if (::geteuid() == 0 && std::find(extra.begin(), extra.end(), "--uid-range") == extra.end()) {
      static int instance = 0;
      const std::uint64_t block = static_cast<std::uint64_t>(::getpid() % 30000) * 64 + (instance++ % 64);
      args.insert(args.end(), {"--uid-range", std::to_string(10'000'000 + block * 1024) + ":1024"});
    }
    // Sandbox logs in the test's directory (removed with it), not in the runtime directory.
    if (std::find(extra.begin(), extra.end(), "--sandbox-log-dir") == extra.end())
      args.insert(args.end(), {"--sandbox-log-dir", (dir / (tag + "-logs")).string()});
    args.insert(args.end(), extra.begin(), extra.end());
    child.start(binary, args, dir / (tag + ".out"), log);
    if (!child.wait_stdout("ready\n")) {
      *error = "supervisor did not start: " + child.err();
      return false;
    }
    std::istringstream in(child.out());
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("  worker id", 0) == 0) worker = line.substr(line.find_last_of(' ') + 1);
      if (line.rfind("  shm table", 0) == 0) {
        std::istringstream l(line);
        std::string a, b;
        l >> a >> b >> shm;
      }
    }
    return true;
  }

  json call(const json& req, std::uint64_t timeout_ms = 10'000) const {
    auto a = control_call(socket.string(), req, timeout_ms);
    if (!a) return json{{"ok", false}, {"error", "transport"}, {"message", a.message()}};
    return *a;
  }
  /// call(), also collecting the progress lines (a queued run's place) sent before the answer.
  json call_with_progress(const json& req, std::vector<json>& progress, std::uint64_t timeout_ms = 10'000) const {
    ControlCallFailure failure;
    ControlConnection conn = control_connect(socket.string(), failure);
    if (!conn) return json{{"ok", false}, {"error", "transport"}, {"message", failure.message}};
    const std::string line = req.dump() + "\n";
    if (::send(conn.fd(), line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size()))
      return json{{"ok", false}, {"error", "transport"}, {"message", "send failed"}};
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    std::string in;
    while (std::chrono::steady_clock::now() < deadline) {
      if (const auto nl = in.find('\n'); nl != std::string::npos) {
        json j = json::parse(in.substr(0, nl), nullptr, false);
        in.erase(0, nl + 1);
        if (!j.is_discarded() && is_control_progress(j)) {
          progress.push_back(std::move(j));
          continue;
        }
        return j;
      }
      pollfd p{conn.fd(), POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::recv(conn.fd(), buf, sizeof buf, 0);
      if (n <= 0) break;
      in.append(buf, static_cast<std::size_t>(n));
    }
    return json{{"ok", false}, {"error", "transport"}, {"message", "no answer"}};
  }
  std::string log_text() const { return slurp(log); }

  /// The log lines with `event=<event>` as key → value maps.
  std::vector<harness::LogFields> events(const std::string& event) const {
    return harness::log_events(log_text(), event);
  }
};

/// A UDP relay on loopback between one client (a supervisor) and lockd (harness/relay.hpp): the
/// supervisor is pointed at its address(); retarget() moves it to a restarted lockd on a new
/// port, and cut_answers() / set_answer_filter() drop lockd's answers as a lossy network would.
/// Throws when it cannot start (the test fails with the reason).
inline std::unique_ptr<harness::UdpRelay> start_relay(const SocketAddress& target) {
  auto r = harness::UdpRelay::start(target);
  if (!r) throw std::runtime_error(r.message());
  return std::move(r).value();
}

/// lockd's own log lines (logfmt: ts_boot_ns=... event=grant name=... epoch=...).
inline std::vector<harness::LogFields> lockd_events(const std::string& text, const std::string& event) {
  return harness::log_events(text, event);
}

/// Polls `pred` every 5 ms until true or `timeout_ms`.
template <class Pred>
bool eventually(Pred pred, int timeout_ms = 10'000) {
  return harness::eventually(pred, std::chrono::milliseconds(timeout_ms));
}

/// The lease_probe's log: (t, valid, valid_until) per transition.
struct ProbeLine {
  std::uint64_t t = 0;
  int valid = -1;
  std::uint64_t valid_until = 0;
  std::uint64_t previous_t = 0;  ///< the sample before this change (it still saw the old value)
};
inline std::vector<ProbeLine> probe_lines(const fs::path& p) {
  std::vector<ProbeLine> out;
  std::istringstream in(slurp(p));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("t=", 0) != 0) continue;
    ProbeLine l;
    std::sscanf(line.c_str(), "t=%lu valid=%d valid_until=%lu previous_t=%lu", &l.t, &l.valid, &l.valid_until,
                &l.previous_t);
    out.push_back(l);
  }
  return out;
}

}  // namespace leasehold::supervisor_testing
