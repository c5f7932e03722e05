// leasehold/harness: a real etcd cluster on loopback for the tests of the etcd client and of lockd
// on etcd (library leasehold_harness_etcd, which links the etcd client; the rest of the harness
// does not need gRPC).
//
// Each member is an `etcd` process (harness::Process) on 127.0.0.1 with a client and a peer port
// of its own, picked free by the kernel (bind to port 0) and picked again when a member finds its
// port taken at start-up (several test processes start clusters at once under ctest -j).
// Below `dir`: member-<i>/ (its --data-dir, removed with the cluster) and member-<i>.log (its
// stdout and stderr, kept). Fast raft timings for tests: a 50 ms heartbeat and a 500 ms election
// timeout, so etcd's minimum lease TTL is 1 s. Every write is fsync'ed (no --unsafe-no-fsync): a
// killed member restarts with what it acknowledged.
//
// Errors name the member (its index and name), what failed and the last lines of its log.
// Not thread-safe.
#pragma once

#include "leasehold/lease/result.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace leasehold::harness {

/// The etcd executable: $LEASEHOLD_ETCD when set, else `etcd` on PATH (or in /usr/bin, /bin...).
/// not_found when there is none (the message says which package installs it); unsupported when
/// `etcd --version` fails or says a version older than 3.4 (the flags used here). Tests skip on
/// either (GTEST_SKIP() << message). Looked up once per process.
Result<std::string> etcd_binary();

class EtcdCluster {
 public:
  /// Starts `members` (1..9) etcd members below `dir` (made if missing) as one new cluster and
  /// waits until every member serves: answers a Status call and knows a raft leader (within 30 s
  /// in all). Errors: etcd_binary()'s; invalid_argument for a bad count; the member that exited
  /// during start-up (refused) or did not serve in time (timeout), with its log file and tail.
  static Result<std::unique_ptr<EtcdCluster>> start(int members, const std::string& dir);
  /// Kills every member (SIGKILL) and removes their data dirs; the logs stay in `dir`.
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  /// Every member's client address: "127.0.0.1:P0,127.0.0.1:P1,..." (etcd::Client::open's form).
  std::string endpoints() const;
  /// Member `i`'s client address, "127.0.0.1:P".
  std::string endpoint(int i) const;
  int size() const noexcept;
  /// Member `i`'s log file (its stdout and stderr).
  std::string log_path(int i) const;
  /// True while member `i`'s process runs (also while it is stopped).
  bool running(int i);

  /// SIGKILL to member `i`, and waits until it exited. ok when it was not running.
  Status kill(int i);
  /// Starts member `i` again with the same name, data dir and ports (killing it first if it
  /// runs) and, when `wait` is true, waits until it serves (as start(), within 30 s; etcd serves
  /// only once a quorum runs: to restart a whole cluster, restart each member with `wait` false,
  /// then wait with leader()). A port taken meanwhile by another process is retried for a few
  /// seconds, then reported.
  Status restart(int i, bool wait = true);
  /// SIGSTOP / SIGCONT to member `i`: it keeps its connections but answers nothing while
  /// stopped. stop() returns once the kernel shows the process stopped. invalid_argument when it
  /// is not running.
  Status stop(int i);
  Status cont(int i);

  /// The index of the member that is the raft leader: the first running, not stopped member whose
  /// Status says it leads itself (etcd::Client::status), asked in turn until `deadline_ns`
  /// (CLOCK_BOOTTIME). timeout when no member says so by then (no quorum, an election running).
  Result<int> leader(std::int64_t deadline_ns);

 private:
  struct Member;
  EtcdCluster(std::string bin, std::string dir, int members);
  Status spawn(int i);
  Status wait_serving(const std::vector<int>& which, std::int64_t deadline_ns, bool* port_in_use);
  Status check(int i, const char* what) const;
  std::string bin_;
  std::string dir_;
  std::string token_;
  std::vector<std::unique_ptr<Member>> members_;
};

}  // namespace leasehold::harness
