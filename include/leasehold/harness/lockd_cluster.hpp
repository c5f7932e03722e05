// leasehold/harness: several leasehold-lockd processes on one etcd (DESIGN.md §4.1), as the
// process tests of lockd on etcd, the supervisors' failover tests and perf/failover run them:
// the flags, the shared key files, the start on an ephemeral loopback port, waiting until one
// leads, and the faults (kill -9, SIGSTOP/SIGCONT, a restart on the same address).
//
// Every lockd gets the same cluster key and token signing key, `--store etcd://ENDPOINTS/PREFIX`
// (its own endpoints when the spec gives one list per lockd: relays that cut it off etcd,
// tcp_relay.hpp), `--leader-lease-s` and `--ttl-ms`. Files below `dir`: lockd-<i>.log (stderr:
// the event= lines, appended across restarts) and lockd-<i>.out (stdout, "listening ADDR").
// Who leads is asked as a client would (its Stats: the `leading` counter); when a leader took
// over is read from its log (`event=leading`, CLOCK_BOOTTIME like now_ns()).
//
// Errors name the lockd (its index and address), what failed and the last lines of its log.
// Not thread-safe; start and restart from a thread that outlives the cluster (each lockd is
// killed with the thread that started it: PR_SET_PDEATHSIG).
#pragma once

#include "leasehold/harness/log.hpp"
#include "leasehold/harness/process.hpp"
#include "leasehold/lease/result.hpp"
#include "leasehold/wire/address.hpp"
#include "leasehold/wire/auth.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace leasehold::harness {

/// How LockdCluster::start runs its lockd processes.
struct LockdClusterSpec {
  std::string bin;            ///< leasehold-lockd
  fs::path dir;               ///< exists; the logs go here
  fs::path key_file;          ///< --key-file: the cluster key (also what stats are asked with)
  /// --signing-key-file, one key for every lockd (resources keep one public key, F.pub);
  /// empty: dir/signing.key, generated.
  fs::path signing_key_file;
  /// etcd endpoints "HOST:PORT[,HOST:PORT...]": one list for every lockd, or one per lockd.
  std::vector<std::string> etcd;
  std::string prefix = "/leasehold";  ///< the key prefix in etcd (a cluster's own)
  std::size_t lockds = 3;
  int leader_lease_s = 1;             ///< --leader-lease-s
  std::uint64_t ttl_ms = 6000;        ///< --ttl-ms
  std::vector<std::string> extra_args;                       ///< after the others
  std::vector<std::pair<std::string, std::string>> env;      ///< e.g. LEASEHOLD_ABLATE
  milliseconds ready_timeout = milliseconds(20'000);         ///< per lockd, for "listening"
};

/// A lockd that took over: which one, when (its `event=leading` line) and at which revision.
struct Takeover {
  int index = -1;
  std::int64_t at_ns = 0;     ///< CLOCK_BOOTTIME
  std::int64_t revision = 0;  ///< its incarnation
};

class LockdCluster {
 public:
  /// Starts spec.lockds lockd processes and waits until each prints "listening" (it does not
  /// wait for a leader: wait_leader()). Errors: invalid_argument (no bin, no etcd endpoints, a
  /// list count that is neither 1 nor spec.lockds, no lockd); the key files' errors; the
  /// lockd that could not start or did not print in time, with its log.
  static Result<std::unique_ptr<LockdCluster>> start(LockdClusterSpec spec);
  /// SIGKILLs every lockd.
  ~LockdCluster();
  LockdCluster(const LockdCluster&) = delete;
  LockdCluster& operator=(const LockdCluster&) = delete;

  std::size_t size() const noexcept { return lockds_.size(); }
  /// lockd `i`'s address (kept across restarts).
  const SocketAddress& address(std::size_t i) const { return lockds_.at(i).address; }
  /// Every lockd's address, as a supervisor's --lockd takes them: "A:P,B:P,C:P".
  std::string addresses() const;
  std::vector<SocketAddress> socket_addresses() const;
  /// The cluster key (what the clients of the tests sign with).
  const wire::WireKey& key() const noexcept { return key_; }
  /// The token signing key's public key file (signing key file + ".pub"): what resources verify with.
  std::string public_key_file() const { return spec_.signing_key_file.string() + ".pub"; }
  /// The failover bound every lockd states (`event=cluster ... failover_bound_ms=`): ms.
  std::int64_t failover_bound_ms() const noexcept { return failover_bound_ms_; }
  Process& process(std::size_t i) { return lockds_.at(i).proc; }
  bool running(std::size_t i) { return lockds_.at(i).proc.running(); }

  /// SIGKILL to lockd `i`, and reaps it.
  void kill9(std::size_t i);
  /// SIGSTOP / SIGCONT to lockd `i`. invalid_argument when it is not running.
  Status stop(std::size_t i);
  Status cont(std::size_t i);
  /// Starts lockd `i` again on its address (killing it first if it runs), with the same flags,
  /// and waits for "listening". Errors as start()'s.
  Status restart(std::size_t i);

  /// Whether lockd `i` says it leads (its stats); nullopt when it does not answer within
  /// `timeout` (not running, stopped, busy).
  std::optional<bool> leading(std::size_t i, milliseconds timeout = milliseconds(300));
  /// The index of the one lockd that says it leads, asking every lockd but `except` in turn
  /// until `timeout`: timeout (with what each said and every log's tail) when none, or more
  /// than one, leads by then.
  Result<int> wait_leader(milliseconds timeout, int except = -1);
  /// The first takeover logged at or after `after_ns` (CLOCK_BOOTTIME) by a lockd other than
  /// `except`, waiting up to `timeout`: timeout (with every log's tail) when none by then.
  Result<Takeover> wait_takeover(std::int64_t after_ns, milliseconds timeout, int except = -1);
  /// Every takeover logged by lockd `i` (all its runs), in order.
  std::vector<Takeover> takeovers(std::size_t i) const;

  /// lockd `i`'s log (its stderr, every run).
  std::string log(std::size_t i) const;
  /// lockd `i`'s log lines with event=`event`, as fields.
  std::vector<LogFields> events(std::size_t i, std::string_view event) const;
  /// Every lockd's log, each under a "--- lockd I (ADDR):" line: for failure messages. At most
  /// `tail` lines of each (0: all).
  std::string logs(std::size_t tail = 0) const;

 private:
  struct Lockd {
    Process proc;
    SocketAddress address;
    fs::path log, out;
  };
  explicit LockdCluster(LockdClusterSpec spec) : spec_(std::move(spec)) {}
  Status launch(std::size_t i, const std::string& listen);
  std::string label(std::size_t i) const;
  LockdClusterSpec spec_;
  wire::WireKey key_;
  std::int64_t failover_bound_ms_ = 0;
  std::vector<Lockd> lockds_;
};

}  // namespace leasehold::harness
