// leasehold/harness: several leasehold-lockd on one etcd (include/leasehold/harness/lockd_cluster.hpp).
#include "leasehold/harness/lockd_cluster.hpp"

#include "leasehold/lockd/admin_client.hpp"
#include "leasehold/wire/token.hpp"

#include <signal.h>

#include <algorithm>
#include <thread>

namespace leasehold::harness {

namespace {
constexpr std::int64_t kNsPerMs = 1'000'000;
constexpr std::size_t kTailLines = 30;

std::int64_t field_int(const LogFields& f, const char* key) {
  const auto it = f.find(key);
  return it == f.end() ? 0 : std::strtoll(it->second.c_str(), nullptr, 10);
}
}  // namespace

Result<std::unique_ptr<LockdCluster>> LockdCluster::start(LockdClusterSpec spec) {
  if (spec.bin.empty()) return Status::invalid("LockdCluster: no leasehold-lockd binary given");
  if (spec.lockds == 0) return Status::invalid("LockdCluster: no lockd to start");
  if (spec.etcd.empty() || (spec.etcd.size() != 1 && spec.etcd.size() != spec.lockds))
    return Status::invalid("LockdCluster: " + std::to_string(spec.etcd.size()) + " etcd endpoint lists for " +
                           std::to_string(spec.lockds) + " lockd (want one, or one per lockd)");
  auto key = wire::load_key_file(spec.key_file.string());
  if (!key) return key.status();
  if (spec.signing_key_file.empty()) {
    spec.signing_key_file = spec.dir / "signing.key";
    if (const Status made = token::generate_signing_key_file(spec.signing_key_file.string()); !made.ok())
      return made;
  }
  std::unique_ptr<LockdCluster> c(new LockdCluster(std::move(spec)));
  c->key_ = *key;
  c->lockds_ = std::vector<Lockd>(c->spec_.lockds);
  for (std::size_t i = 0; i < c->lockds_.size(); ++i) {
    if (Status started = c->launch(i, "127.0.0.1:0"); !started.ok()) return started;
  }
  // Every lockd states its failover bound at start (event=cluster).
  for (const LogFields& f : c->events(0, "cluster")) c->failover_bound_ms_ = field_int(f, "failover_bound_ms");
  if (c->failover_bound_ms_ <= 0)
    return Status{Errc::corrupt, c->label(0) + " logged no event=cluster line with failover_bound_ms: " +
                                     tail_lines(c->log(0), kTailLines)};
  return c;
}

LockdCluster::~LockdCluster() {
  for (Lockd& l : lockds_) l.proc.kill9();
}

std::string LockdCluster::label(std::size_t i) const {
  const SocketAddress& a = lockds_.at(i).address;
  return "lockd " + std::to_string(i) + (a.is_set() ? " (" + a.str() + ")" : std::string());
}

Status LockdCluster::launch(std::size_t i, const std::string& listen) {
  Lockd& l = lockds_.at(i);
  const std::string tag = "lockd-" + std::to_string(i);
  l.log = spec_.dir / (tag + ".log");
  l.out = spec_.dir / (tag + ".out");
  const std::string& endpoints = spec_.etcd.size() == 1 ? spec_.etcd.front() : spec_.etcd.at(i);
  Spawn s;
  s.argv = {spec_.bin,
            "--no-config",  // the flags given here, never the host's /etc/leasehold/lockd.toml
            "--listen",
            listen,
            "--key-file",
            spec_.key_file.string(),
            "--store",
            "etcd://" + endpoints + spec_.prefix,
            "--signing-key-file",
            spec_.signing_key_file.string(),
            "--leader-lease-s",
            std::to_string(spec_.leader_lease_s),
            "--ttl-ms",
            std::to_string(spec_.ttl_ms)};
  s.argv.insert(s.argv.end(), spec_.extra_args.begin(), spec_.extra_args.end());
  s.env = spec_.env;
  s.stdout_path = l.out;  // truncated: this run's "listening" line
  s.stderr_path = l.log;
  s.append_stderr = true;
  s.label = label(i);
  if (const Status started = l.proc.start(s); !started.ok()) return started;
  const Result<std::string> line = wait_for_log_line(l.out, "listening ", spec_.ready_timeout, l.proc);
  if (!line) {
    l.proc.kill9();
    return Status{line.code(), line.message() + "\n" + label(i) + " log:\n" + tail_lines(log(i), kTailLines)};
  }
  const auto addr = SocketAddress::parse(line->substr(line->find("listening ") + 10));
  if (!addr) {
    l.proc.kill9();
    return Status{Errc::corrupt, label(i) + " printed an address that does not parse: " + *line};
  }
  l.address = *addr;
  return {};
}

std::string LockdCluster::addresses() const {
  std::string s;
  for (const Lockd& l : lockds_) s += (s.empty() ? "" : ",") + l.address.str();
  return s;
}

std::vector<SocketAddress> LockdCluster::socket_addresses() const {
  std::vector<SocketAddress> v;
  for (const Lockd& l : lockds_) v.push_back(l.address);
  return v;
}

void LockdCluster::kill9(std::size_t i) { lockds_.at(i).proc.kill9(); }

Status LockdCluster::stop(std::size_t i) {
  Process& p = lockds_.at(i).proc;
  if (!p.running()) return Status::invalid(label(i) + " is not running: nothing to stop");
  p.signal(SIGSTOP);
  return {};
}

Status LockdCluster::cont(std::size_t i) {
  Process& p = lockds_.at(i).proc;
  if (!p.running()) return Status::invalid(label(i) + " is not running: nothing to continue");
  p.signal(SIGCONT);
  return {};
}

Status LockdCluster::restart(std::size_t i) {
  Lockd& l = lockds_.at(i);
  l.proc.kill9();
  // Its address again (a UDP port freed by the kill): the supervisors know only that one.
  return launch(i, l.address.str());
}

std::optional<bool> LockdCluster::leading(std::size_t i, milliseconds timeout) {
  if (!lockds_.at(i).proc.running()) return std::nullopt;
  lockd::AdminClient c(lockds_[i].address, key_, {}, timeout.count() * kNsPerMs);
  const auto all = c.counters();
  if (!all) return std::nullopt;
  for (const auto& k : *all)
    if (k.key == "leading") return k.value == 1;
  return std::nullopt;
}

Result<int> LockdCluster::wait_leader(milliseconds timeout, int except) {
  const std::int64_t end = now_ns() + timeout.count() * kNsPerMs;
  std::string said;
  for (;;) {
    int found = -1, count = 0;
    said.clear();
    for (std::size_t i = 0; i < lockds_.size(); ++i) {
      if (static_cast<int>(i) == except) continue;
      const std::optional<bool> l = leading(i);
      said += "; " + label(i) + ": " + (!l ? "no answer" : *l ? "leads" : "follows");
      if (l.value_or(false)) {
        found = static_cast<int>(i);
        ++count;
      }
    }
    if (count == 1) return found;
    if (now_ns() >= end) break;
    sleep_ms(20);
  }
  return Status{Errc::timeout, "no single lockd led within " + std::to_string(timeout.count()) + " ms" + said +
                                   "\n" + logs(kTailLines)};
}

std::vector<Takeover> LockdCluster::takeovers(std::size_t i) const {
  std::vector<Takeover> v;
  for (const LogFields& f : events(i, "leading"))
    v.push_back({static_cast<int>(i), field_int(f, "ts_boot_ns"), field_int(f, "revision")});
  return v;
}

Result<Takeover> LockdCluster::wait_takeover(std::int64_t after_ns, milliseconds timeout, int except) {
  std::optional<Takeover> first;
  const bool seen = eventually(
      [&] {
        for (std::size_t i = 0; i < lockds_.size(); ++i) {
          if (static_cast<int>(i) == except) continue;
          for (const Takeover& t : takeovers(i))
            if (t.at_ns >= after_ns && (!first || t.at_ns < first->at_ns)) first = t;
        }
        return first.has_value();
      },
      timeout, milliseconds(20));
  if (!seen)
    return Status{Errc::timeout, "no lockd took over within " + std::to_string(timeout.count()) + " ms\n" +
                                     logs(kTailLines)};
  return *first;
}

std::string LockdCluster::log(std::size_t i) const { return slurp(lockds_.at(i).log); }

std::vector<LogFields> LockdCluster::events(std::size_t i, std::string_view event) const {
  return log_events(log(i), event);
}

std::string LockdCluster::logs(std::size_t tail) const {
  std::string s;
  for (std::size_t i = 0; i < lockds_.size(); ++i)
    s += "--- " + label(i) + ":\n" + (tail == 0 ? log(i) : tail_lines(log(i), tail)) + "\n";
  return s;
}

}  // namespace leasehold::harness
