// leasehold/harness: a real etcd cluster on loopback (include/leasehold/harness/etcd.hpp).
#include "leasehold/harness/etcd.hpp"

#include "leasehold/etcd/client.hpp"
#include "leasehold/harness/process.hpp"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <system_error>

namespace leasehold::harness {

namespace {

constexpr int kMaxMembers = 9;
constexpr std::int64_t kServeWaitNs = 30'000'000'000;  // start() and restart(): every member serving
constexpr std::int64_t kProbeNs = 300'000'000;         // one Status call while waiting
constexpr int kStartAttempts = 5;                      // fresh ports when one was taken
constexpr std::int64_t kRestartPortRetryNs = 5'000'000'000;
constexpr std::size_t kLogTailLines = 12;
constexpr std::string_view kAddressInUse = "address already in use";

/// "3.4.23" of "etcd Version: 3.4.23\n..."; major * 100 + minor, or -1.
int etcd_version(const std::string& text, std::string* shown) {
  const std::string key = "etcd Version: ";
  const auto at = text.find(key);
  if (at == std::string::npos) return -1;
  const auto end = text.find_first_of(" \n", at + key.size());
  *shown = text.substr(at + key.size(), end == std::string::npos ? std::string::npos : end - at - key.size());
  int major = 0, minor = 0;
  if (std::sscanf(shown->c_str(), "%d.%d", &major, &minor) != 2) return -1;
  return major * 100 + minor;
}

Result<std::string> find_etcd() {
  std::string bin;
  if (const char* env = std::getenv("LEASEHOLD_ETCD"); env != nullptr && *env != '\0') {
    bin = env;
    if (::access(bin.c_str(), X_OK) != 0)
      return Status{Errc::not_found, "LEASEHOLD_ETCD=" + bin + " is not an executable file: " + std::strerror(errno)};
  } else {
    bin = find_program("etcd");
    if (bin.empty())
      return Status{Errc::not_found,
                    "no etcd executable on PATH (Debian: apt-get install etcd-server, as scripts/setup.sh does; "
                    "or set LEASEHOLD_ETCD to its path)"};
  }
  std::string out;
  const int rc = run_command({bin, "--version"}, &out, milliseconds(10'000));
  if (rc != 0)
    return Status{Errc::unsupported,
                  bin + " --version failed (exit " + std::to_string(rc) + "): " + tail_lines(out, 5)};
  std::string shown;
  const int v = etcd_version(out, &shown);
  if (v < 0) return Status{Errc::unsupported, bin + " --version printed no \"etcd Version: X.Y\": " + tail_lines(out, 5)};
  if (v < 304)
    return Status{Errc::unsupported, bin + " is etcd " + shown + "; the test harness needs etcd 3.4 or newer"};
  return bin;
}

/// `n` distinct TCP ports on 127.0.0.1 that were free a moment ago: each bound to port 0 (the
/// kernel picks), all held open together so they differ, then closed for etcd to bind.
Result<std::vector<int>> free_ports(int n) {
  std::vector<int> fds, ports;
  Status failure;
  for (int i = 0; i < n && failure.ok(); ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      failure = Status::from_errno(errno, "socket(AF_INET, SOCK_STREAM) for a free port");
      break;
    }
    fds.push_back(fd);
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sin.sin_port = 0;
    socklen_t len = sizeof sin;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&sin), sizeof sin) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&sin), &len) != 0) {
      failure = Status::from_errno(errno, "bind 127.0.0.1:0 for a free port");
      break;
    }
    ports.push_back(ntohs(sin.sin_port));
  }
  for (int fd : fds) ::close(fd);
  if (!failure.ok()) return failure;
  return ports;
}

/// The state letter of /proc/<pid>/stat ('R', 'S', 'T', ...), or 0.
char proc_state(pid_t pid) {
  const std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat", 4096);
  const auto paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return 0;
  return stat[paren + 2];
}

}  // namespace

Result<std::string> etcd_binary() {
  static const Result<std::string> found = find_etcd();
  return found;
}

struct EtcdCluster::Member {
  int index = 0;
  std::string name;
  int client_port = 0, peer_port = 0;
  fs::path data_dir, log;
  Process proc;
  std::unique_ptr<etcd::Client> client;  // to this member alone (status)
  std::size_t log_from = 0;              // the log's size when the current process started
  bool stopped = false;

  std::string client_url() const { return "http://127.0.0.1:" + std::to_string(client_port); }
  std::string peer_url() const { return "http://127.0.0.1:" + std::to_string(peer_port); }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(client_port); }
  /// "etcd member 1 (m1, client 127.0.0.1:P, peer 127.0.0.1:Q)"
  std::string label() const {
    return "etcd member " + std::to_string(index) + " (" + name + ", client " + endpoint() + ", peer 127.0.0.1:" +
           std::to_string(peer_port) + ")";
  }
  /// This run's part of the log.
  std::string run_log() const {
    const std::string text = slurp(log);
    return log_from <= text.size() ? text.substr(log_from) : text;
  }
  std::string log_tail() const { return "; log " + log.string() + ":\n" + tail_lines(run_log(), kLogTailLines); }
};

EtcdCluster::EtcdCluster(std::string bin, std::string dir, int members) : bin_(std::move(bin)), dir_(std::move(dir)) {
  for (int i = 0; i < members; ++i) {
    auto m = std::make_unique<Member>();
    m->index = i;
    m->name = "m" + std::to_string(i);
    m->data_dir = fs::path(dir_) / ("member-" + std::to_string(i));
    m->log = fs::path(dir_) / ("member-" + std::to_string(i) + ".log");
    members_.push_back(std::move(m));
  }
}

EtcdCluster::~EtcdCluster() {
  for (auto& m : members_) {
    m->client.reset();
    m->proc.kill9();
    std::error_code ec;
    fs::remove_all(m->data_dir, ec);
  }
}

Result<std::unique_ptr<EtcdCluster>> EtcdCluster::start(int members, const std::string& dir) {
  auto bin = etcd_binary();
  if (!bin) return bin.status();
  if (members < 1 || members > kMaxMembers)
    return Status::invalid("EtcdCluster::start: " + std::to_string(members) + " members (want 1.." +
                           std::to_string(kMaxMembers) + ")");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status{errc_of_errno(ec.value()), "cannot make the etcd cluster's directory " + dir + ": " + ec.message()};

  std::unique_ptr<EtcdCluster> c(new EtcdCluster(*bin, dir, members));
  static std::atomic<int> clusters{0};
  Status last;
  for (int attempt = 0; attempt < kStartAttempts; ++attempt) {
    auto ports = free_ports(2 * members);
    if (!ports) return ports.status();
    for (int i = 0; i < members; ++i) {
      c->members_[i]->client_port = (*ports)[2 * i];
      c->members_[i]->peer_port = (*ports)[2 * i + 1];
      fs::remove_all(c->members_[i]->data_dir, ec);  // a new cluster: no data of an earlier attempt
    }
    // A token of its own: members of another test's cluster that reach these ports by accident
    // are refused rather than joined.
    c->token_ = "leasehold-" + std::to_string(::getpid()) + "-" + std::to_string(clusters.fetch_add(1)) + "-" +
                std::to_string(attempt);
    Status spawned;
    for (int i = 0; i < members && spawned.ok(); ++i) spawned = c->spawn(i);
    if (!spawned.ok()) return spawned;
    std::vector<int> all(static_cast<std::size_t>(members));
    for (int i = 0; i < members; ++i) all[static_cast<std::size_t>(i)] = i;
    bool in_use = false;
    last = c->wait_serving(all, now_ns() + kServeWaitNs, &in_use);
    if (last.ok()) return c;
    for (auto& m : c->members_) m->proc.kill9();
    if (!in_use) return last;
  }
  return Status{Errc::busy, "etcd cluster: a port was taken at every one of " + std::to_string(kStartAttempts) +
                                " attempts; the last: " + last.message()};
}

Status EtcdCluster::spawn(int i) {
  Member& m = *members_[static_cast<std::size_t>(i)];
  std::string initial;
  for (const auto& p : members_) {
    if (!initial.empty()) initial += ',';
    initial += p->name + "=" + p->peer_url();
  }
  Spawn spec;
  spec.argv = {bin_,
               "--name", m.name,
               "--data-dir", m.data_dir.string(),
               "--listen-client-urls", m.client_url(),
               "--advertise-client-urls", m.client_url(),
               "--listen-peer-urls", m.peer_url(),
               "--initial-advertise-peer-urls", m.peer_url(),
               "--initial-cluster", initial,
               "--initial-cluster-token", token_,
               "--initial-cluster-state", "new",  // ignored once the data dir holds a member
               // Fast elections for tests. etcd's minimum lease TTL is 1.5 election timeouts
               // rounded up to a second: 1 s.
               "--heartbeat-interval", "50",
               "--election-timeout", "500",
               "--logger", "zap",
               "--log-level", "info"};
  spec.stdout_path = m.log;
  spec.stderr_path = m.log;
  spec.append_stdout = true;  // a restart adds to the log
  spec.append_stderr = true;
  spec.label = "etcd member " + std::to_string(i);
  std::error_code ec;
  m.log_from = fs::exists(m.log, ec) ? static_cast<std::size_t>(fs::file_size(m.log, ec)) : 0;
  if (ec) m.log_from = 0;
  m.client.reset();
  m.stopped = false;
  if (Status st = m.proc.start(spec); !st.ok())
    return Status{st.code(), "cannot start " + m.label() + ": " + st.message()};
  auto client = etcd::Client::open(m.endpoint());
  if (!client) return Status{client.code(), m.label() + ": " + client.message()};
  m.client = std::move(*client);
  return {};
}

Status EtcdCluster::wait_serving(const std::vector<int>& which, std::int64_t deadline_ns, bool* port_in_use) {
  *port_in_use = false;
  std::vector<int> waiting = which;
  std::vector<std::string> last(members_.size(), "no answer yet");
  const std::int64_t started = now_ns();
  while (true) {
    for (auto it = waiting.begin(); it != waiting.end();) {
      Member& m = *members_[static_cast<std::size_t>(*it)];
      if (!m.proc.running()) {
        const std::string log = m.run_log();
        *port_in_use = log.find(kAddressInUse) != std::string::npos;
        return Status{*port_in_use ? Errc::busy : Errc::refused,
                      m.label() + " exited during start-up (code " + std::to_string(m.proc.exit_code().value_or(-1)) +
                          ")" + m.log_tail()};
      }
      auto st = m.client->status(std::min(deadline_ns, now_ns() + kProbeNs));
      if (st && st->leader_id != 0) {
        it = waiting.erase(it);
        continue;
      }
      last[static_cast<std::size_t>(*it)] = st ? "it answers but knows no raft leader" : st.message();
      ++it;
    }
    if (waiting.empty()) return {};
    if (now_ns() >= deadline_ns) {
      const Member& m = *members_[static_cast<std::size_t>(waiting.front())];
      return Status{Errc::timeout, m.label() + " did not serve within " +
                                       std::to_string((now_ns() - started) / 1'000'000) + " ms (last: " +
                                       last[static_cast<std::size_t>(waiting.front())] + ")" + m.log_tail()};
    }
    sleep_ms(20);
  }
}

Status EtcdCluster::check(int i, const char* what) const {
  if (i < 0 || i >= size())
    return Status::invalid(std::string("EtcdCluster::") + what + "(" + std::to_string(i) + "): no such member (" +
                           std::to_string(size()) + " members)");
  return {};
}

std::string EtcdCluster::endpoints() const {
  std::string out;
  for (const auto& m : members_) {
    if (!out.empty()) out += ',';
    out += m->endpoint();
  }
  return out;
}

std::string EtcdCluster::endpoint(int i) const {
  LEASEHOLD_ASSERT(i >= 0 && i < size());
  return members_[static_cast<std::size_t>(i)]->endpoint();
}

int EtcdCluster::size() const noexcept { return static_cast<int>(members_.size()); }

std::string EtcdCluster::log_path(int i) const {
  LEASEHOLD_ASSERT(i >= 0 && i < size());
  return members_[static_cast<std::size_t>(i)]->log.string();
}

bool EtcdCluster::running(int i) {
  LEASEHOLD_ASSERT(i >= 0 && i < size());
  return members_[static_cast<std::size_t>(i)]->proc.running();
}

Status EtcdCluster::kill(int i) {
  if (Status st = check(i, "kill"); !st.ok()) return st;
  Member& m = *members_[static_cast<std::size_t>(i)];
  m.proc.kill9();  // SIGCONT, SIGKILL, reaped
  m.stopped = false;
  return {};
}

Status EtcdCluster::restart(int i, bool wait) {
  if (Status st = check(i, "restart"); !st.ok()) return st;
  Member& m = *members_[static_cast<std::size_t>(i)];
  m.proc.kill9();
  const std::int64_t give_up = now_ns() + kRestartPortRetryNs;
  while (true) {
    if (Status st = spawn(i); !st.ok()) return st;
    if (!wait) return {};
    bool in_use = false;
    Status st = wait_serving({i}, now_ns() + kServeWaitNs, &in_use);
    if (st.ok() || !in_use || now_ns() >= give_up) return st;
    sleep_ms(200);  // its port is taken for now (another test's client); same ports or nothing
  }
}

Status EtcdCluster::stop(int i) {
  if (Status st = check(i, "stop"); !st.ok()) return st;
  Member& m = *members_[static_cast<std::size_t>(i)];
  if (!m.proc.running()) return Status::invalid(m.label() + " is not running: nothing to stop");
  m.proc.signal(SIGSTOP);
  m.stopped = true;
  if (!eventually([&] { return proc_state(m.proc.pid()) == 'T'; }, milliseconds(2'000), milliseconds(1)))
    return Status{Errc::timeout, m.label() + ": SIGSTOP sent, but the process is not shown stopped after 2 s"};
  return {};
}

Status EtcdCluster::cont(int i) {
  if (Status st = check(i, "cont"); !st.ok()) return st;
  Member& m = *members_[static_cast<std::size_t>(i)];
  if (!m.proc.running()) return Status::invalid(m.label() + " is not running: nothing to continue");
  m.proc.signal(SIGCONT);
  m.stopped = false;
  if (!eventually([&] { return proc_state(m.proc.pid()) != 'T'; }, milliseconds(2'000), milliseconds(1)))
    return Status{Errc::timeout, m.label() + ": SIGCONT sent, but the process is still shown stopped after 2 s"};
  return {};
}

Result<int> EtcdCluster::leader(std::int64_t deadline_ns) {
  std::vector<std::string> last(members_.size(), "not asked");
  while (true) {
    for (auto& m : members_) {
      const auto i = static_cast<std::size_t>(m->index);
      if (!m->proc.running()) {
        last[i] = "not running";
        continue;
      }
      if (m->stopped) {
        last[i] = "stopped";
        continue;
      }
      if (!m->client) {
        last[i] = "no client";
        continue;
      }
      auto st = m->client->status(std::min(deadline_ns, now_ns() + kProbeNs));
      if (!st) {
        last[i] = st.message();
        continue;
      }
      if (st->leader_id != 0 && st->leader_id == st->member_id) return m->index;
      last[i] = st->leader_id == 0 ? "knows no leader" : "follows another member";
    }
    if (now_ns() >= deadline_ns) {
      std::string why = "etcd cluster " + endpoints() + ": no member said it leads by the deadline";
      for (std::size_t i = 0; i < last.size(); ++i) why += "; member " + std::to_string(i) + ": " + last[i];
      return Status{Errc::timeout, why};
    }
    sleep_ms(20);
  }
}

}  // namespace leasehold::harness
