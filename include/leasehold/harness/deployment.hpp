// leasehold/harness: a deployment on this host - the cluster key and worker keys, one lockd and
// supervisors, each a harness::Process with its log in the deployment's directory - for the
// pause-probe, the demo and the process tests.
//
// Files (below dir()): key (the cluster key, 0600), <worker>.key, lockd.db, lockd.log, and what
// each supervisor is given. Timeouts are milliseconds; errors are messages naming the file or
// the program and ending with the last lines of its log.
#pragma once

#include "leasehold/harness/process.hpp"
#include "leasehold/wire/address.hpp"
#include "leasehold/lease/types.hpp"
#include "leasehold/wire/auth.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace leasehold::harness {

/// The outcome of starting a program of the deployment.
struct Started {
  enum class Kind {
    ok,
    cannot_start,  ///< spawn failed, or a key file could not be made
    not_ready,     ///< it ran but did not print its start-up line in time (or exited first)
    bad_output,    ///< its start-up line did not parse (e.g. not leasehold-lockd)
  };
  Kind kind = Kind::ok;
  std::string error;
  bool ok() const noexcept { return kind == Kind::ok; }
};

/// How start_lockd() runs lockd.
struct LockdSpec {
  std::string bin;                         ///< leasehold-lockd
  std::string listen = "127.0.0.1:0";      ///< --listen (port 0: lockd picks one, printed)
  std::uint64_t ttl_ms = 0;                ///< --ttl-ms; 0: lockd's default
  std::vector<std::string> extra_args;     ///< after the others
  milliseconds ready_timeout = milliseconds(20'000);
};

/// How start_supervisor() runs one supervisor. The flags given here are passed as such; the
/// rest of the configuration goes in `extra_args`.
struct SupervisorSpec {
  std::string bin;            ///< leasehold-supervisor
  std::string label = "leasehold-supervisor";
  std::string lockd;          ///< --lockd HOST:PORT; empty: lockd_text() of this deployment
  fs::path key_file;          ///< --key-file (a worker key: make_worker_key())
  fs::path control_socket;    ///< --control-socket
  fs::path shm;               ///< --shm
  fs::path log;               ///< stdout and stderr
  std::uint64_t ttl_ms = 0, kill_after_ms = 0, heartbeat_interval_ms = 0;  ///< 0: not passed
  std::vector<std::string> extra_args;
  std::string netns;          ///< non-empty: run in /run/netns/<netns>
  milliseconds ready_timeout = milliseconds(20'000);
};

/// One lockd and its supervisors below a directory. Stops them on destruction: supervisors
/// first (SIGTERM, so they release their names while lockd still runs), then lockd. Not
/// thread-safe.
class Deployment {
 public:
  /// Files below `dir`, which exists (a TempDir's path, typically).
  explicit Deployment(fs::path dir);
  ~Deployment();
  Deployment(const Deployment&) = delete;
  Deployment& operator=(const Deployment&) = delete;

  const fs::path& dir() const noexcept { return dir_; }

  /// Generates the cluster key file dir()/key and loads it; the key file's errors.
  Status make_cluster_key();
  /// The cluster key file (after make_cluster_key()).
  fs::path cluster_key_file() const { return dir_ / "key"; }
  /// The cluster key: made by make_cluster_key() or given by set_key(); nullopt before.
  const std::optional<wire::WireKey>& key() const noexcept { return key_; }
  void set_key(const wire::WireKey& key) { key_ = key; }
  /// Writes dir()/`file` with the worker key of `worker` derived from the cluster key (a
  /// supervisor holds only its own). not_found before make_cluster_key(); the key file's errors.
  Status make_worker_key(const std::string& file, const WorkerId& worker);

  /// Starts lockd with its store dir()/lockd.db, the cluster key and its log dir()/lockd.log,
  /// and waits until it prints "listening ADDR:PORT" (then lockd_text(), lockd_address()).
  /// `tick` runs while waiting (it may throw, e.g. to honour Ctrl-C).
  Started start_lockd(const LockdSpec& spec, const std::function<void()>& tick = {});
  Process& lockd() noexcept { return lockd_; }
  /// What lockd printed after "listening " ("127.0.0.1:PORT").
  const std::string& lockd_text() const noexcept { return lockd_text_; }
  const SocketAddress& lockd_address() const noexcept { return lockd_addr_; }

  /// Starts a supervisor and waits until it prints "ready": its index for supervisor().
  Started start_supervisor(const SupervisorSpec& spec, std::size_t* index = nullptr,
                           const std::function<void()>& tick = {});
  Process& supervisor(std::size_t i) { return *supervisors_.at(i); }
  std::size_t supervisors() const noexcept { return supervisors_.size(); }

  /// One request on supervisor control socket `socket` ("v": 1 added): its answer, or why there
  /// is none (as control_call).
  static Result<nlohmann::json> request(const fs::path& socket, nlohmann::json req,
                                        milliseconds timeout = milliseconds(10'000));

  /// SIGTERM to every supervisor (last started first), waiting up to `grace` for each.
  void stop_supervisors(milliseconds grace = milliseconds(5'000));
  /// SIGTERM to lockd, waiting up to `grace`.
  void stop_lockd(milliseconds grace = milliseconds(5'000));

 private:
  fs::path dir_;
  std::optional<wire::WireKey> key_;
  Process lockd_;
  std::string lockd_text_;
  SocketAddress lockd_addr_;
  std::vector<std::unique_ptr<Process>> supervisors_;
};

}  // namespace leasehold::harness
