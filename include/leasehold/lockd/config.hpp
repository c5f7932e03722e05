// leasehold/lockd: the lockd command line and its validation.
//
// Every duration flag carries its unit in its name and in --help. `validate()` refuses
// combinations that cannot work and says why (DESIGN.md "lockd", "Time").
#pragma once

#include "leasehold/io/daemon_options.hpp"
#include "leasehold/wire/auth.hpp"
#include "leasehold/lease/lease_table.hpp"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>
#include <string_view>

namespace CLI {
class App;
}

namespace leasehold::lockd {

/// The lock mode is the LeaseTable's (lease/lease_table.hpp): lease mode expires unrefreshed
/// leases; preemptible mode adds worker liveness, and a lapsed worker's names (or a live
/// worker's names whose sandbox no longer runs) may be preempted (DESIGN.md "Lock states").
using leasehold::LockMode;

// Named bounds on the flags.
inline constexpr std::uint64_t kTtlMsMax = 3'600'000;            ///< a lease TTL above 1 h is a mistake
inline constexpr std::uint64_t kAcquiringTtlMsMax = 300'000;     ///< 2-phase: commit within 5 min
/// Chubby §2.4 bounds lock-delay at one minute; a delay that long or longer is refused.
inline constexpr std::uint64_t kLockDelayMsMax = 60'000;
inline constexpr std::uint64_t kWorkerTtlMsMax = 3'600'000;
/// A transfer reservation held longer than a day is a reservation nobody will take.
inline constexpr std::uint64_t kReservationTtlMsMax = 86'400'000;
/// Default reservation TTL, in lease TTLs (--reservation-ttl-ms unset).
inline constexpr std::uint64_t kReservationTtlsDefault = 3;
inline constexpr std::uint64_t kMaxNamesLimit = 16'777'216;      ///< 2^24 names per lockd
inline constexpr std::uint64_t kMaxWorkersLimit = kWorkersMax;  ///< the LeaseTable's worker bound
/// --leader-lease-s upper bound: a longer lease only lengthens every failover.
inline constexpr std::int64_t kLeaderLeaseSMax = 60;

struct LockdConfig {
  /// The program's version ("0.1.0"), set by main() from the build (LEASEHOLD_VERSION; the
  /// libraries do not see it): lockd's Stats and /metrics give it as version_major/minor/patch.
  std::string version;
  std::string listen = "127.0.0.1:7400";  ///< ADDR:PORT; port 0 = ephemeral (printed on stdout)
  /// ADDR:PORT of the HTTP endpoint (/metrics, /healthz; conventionally port 9740); empty: none.
  /// Port 0 picks a free one, printed as "metrics http://ADDR:PORT/metrics" on stdout (a line that a reader of "listening ADDR:PORT" does not take for it).
  std::string metrics_listen;
  /// --metrics-allow: CIDR[,CIDR...] of the peers the HTTP endpoint admits; empty: every peer.
  std::string metrics_allow;
  /// SQLite file (relative to the working directory), or an etcd store
  /// "etcd://HOST:PORT[,HOST:PORT...][/PREFIX]" shared by a cluster of lockd (etcd_store.hpp).
  std::string store_path = "lockd.db";
  /// etcd store: the ADDR:PORT other lockd hand to clients when this one leads (the election
  /// key's value). Empty: the bound --listen address (refused for a wildcard address).
  std::string advertise;
  /// etcd store: the TTL of the leadership lease, in s (leadership.hpp; etcd's smallest TTL is
  /// 2 s with its default timing). A leader that cannot renew it stops serving within it.
  std::int64_t leader_lease_s = 2;
  /// etcd store: at most this many operations per etcd transaction (etcd's --max-txn-ops).
  std::size_t etcd_txn_ops_max = 128;
  /// etcd store: the shard this process is a replica of (0..shards-1), and the cluster's shard
  /// count (1..kShardsMax, fixed per cluster: etcd_store.hpp `PREFIX/shards`). Each shard has
  /// its own leader among its replicas; a name belongs to shard_of(name) (lease/shard.hpp).
  unsigned shard = 0;
  unsigned shards = 1;
  /// --key-file, repeatable: cluster keys (mode 0600). Two during a rotation window.
  std::vector<std::string> key_files;
  std::vector<std::string> admin_key_files;  ///< --admin-key-file: keys for admin requests
  /// --key-dir: every `*.key` file in it (cluster or admin keys), re-read on SIGHUP, so keys
  /// are added and removed without a restart. The directory must not be group/other-writable.
  std::string key_dir;
  std::uint64_t ttl_ms = 10'000;          ///< default lease TTL
  std::uint64_t acquiring_ttl_ms = 5'000; ///< 2-phase: time to commit before the record lapses
  std::uint64_t lock_delay_ms = 0;        ///< after an expiry the name stays unavailable; 0 = off
  LockMode mode = LockMode::lease;
  std::optional<std::uint64_t> worker_ttl_ms;  ///< preemptible only; default = ttl_ms
  std::uint64_t max_names = 1'000'000;    ///< name table capacity (also bounds the store)
  std::uint64_t max_workers = 65'535;     ///< preemptible: worker-liveness table capacity
  /// A reservation (transfer complete, reassign) lapses this long after the name became
  /// grantable to its owner; default kReservationTtlsDefault × ttl_ms.
  std::optional<std::uint64_t> reservation_ttl_ms;
  /// --generate-key [PATH]: write a key to PATH (or --out) and exit; "" when given without PATH.
  std::optional<std::string> generate_key_path;
  std::string generate_kind = "cluster";         ///< --kind for --generate-key: cluster | admin
  std::uint16_t key_id = 1;                      ///< --key-id for --generate-key
  bool derive_worker_key = false;                ///< --derive-worker-key: write a worker key and exit
  std::string derive_worker_id;                  ///< --worker-id (UUID) for --derive-worker-key
  std::string derive_out;                        ///< --out for --derive-worker-key / --generate-signing-key
  /// --signing-key-file: lockd's Ed25519 token signing key (PEM or 32 raw bytes, 0600). Empty:
  /// default_signing_key_path(), generated on first start (like sshd's host keys).
  std::string signing_key_file;
  bool generate_signing_key = false;  ///< --generate-signing-key: write --out and --out.pub, exit
  bool print_public_key = false;      ///< --print-public-key: print the signing key's public key, exit
  /// --log-format, --log-level (io/daemon_options.hpp); the level is re-read on SIGHUP.
  LogOptions log;
  /// Ablations for the attack tests (LEASEHOLD_ABLATE, comma-separated; never a flag):
  /// shared-worker-key (one key for every worker), no-authz (a worker's key may act on any name),
  /// replay-heartbeats (a replayed heartbeat is executed again), reflection (cached answers
  /// resent anywhere, unbounded), acquiring-unbound, admin-as-worker, transfer-unguarded,
  /// store-mode, store-busy-timeout, reservation-unbound, seq-unbounded, seq-jump, first-push-address,
  /// self-fence (below). Each switches
  /// one defence off, to show the attack it stops.
  bool ablate_shared_worker_key = false;
  bool ablate_authz = false;
  bool ablate_replay_heartbeats = false;
  bool ablate_reflection = false;
  /// acquiring-unbound: an Acquiring record may be committed or aborted by any worker (as
  /// when the record did not store the worker whose acquire made it).
  bool ablate_acquiring_unbound = false;
  /// admin-as-worker: an admin key may send worker messages (acquire, commit, release,
  /// heartbeats, kill confirmations, answers) for any worker, as before admin keys were bounded.
  bool ablate_admin_as_worker = false;
  /// transfer-unguarded: a transfer completes as soon as asked, without waiting for the old
  /// holder's kill confirmation or its lease's end (LeaseConfig::ablate_transfer_guard).
  bool ablate_transfer_guard = false;
  /// store-mode: the store's files get the process umask's mode, in any directory (as before
  /// lockd made them 0600); store-busy-timeout: the store's open does not wait for a lock.
  bool ablate_store_mode = false;
  bool ablate_store_busy_timeout = false;
  /// reservation-unbound: a transfer's or reassign's reservation is for its sandbox only, and
  /// any worker naming that sandbox may take it (as before reservations recorded the worker).
  bool ablate_reservation_unbound = false;
  /// seq-unbounded: a seq at or above 2^63 is accepted (the window's floor then wraps to 0).
  bool ablate_seq_limit = false;
  /// seq-jump: a seq however far above lockd's wall clock is accepted (one datagram under a
  /// worker's key could move its window to 2^63-1, leaving it no seq to use).
  bool ablate_seq_jump = false;
  /// first-push-address: a worker's address for revocation pushes is learned from its heartbeats
  /// only (a revoke before its first heartbeat is pushed only after it).
  bool ablate_first_push_address = false;
  /// self-fence (etcd store): a leader keeps serving past its leadership lease, until a write of
  /// its store is refused (as a lockd without the fence of leadership.hpp).
  bool ablate_self_fence = false;

  /// The worker-liveness TTL in force (preemptible mode), in ms.
  std::uint64_t effective_worker_ttl_ms() const { return worker_ttl_ms.value_or(ttl_ms); }
  /// The reservation TTL in force, in ms.
  std::uint64_t effective_reservation_ttl_ms() const {
    return reservation_ttl_ms.value_or(std::min(kReservationTtlMsMax, kReservationTtlsDefault * ttl_ms));
  }
};

/// The signing key file in force: --signing-key-file, or `<store>.signing.key` beside the store.
std::string signing_key_path(const LockdConfig& cfg);
/// True when --store names an etcd store (a lockd cluster).
bool uses_etcd(const LockdConfig& cfg) noexcept;

/// The parts of an etcd store URL (--store etcd://..., lockd/etcd_store.hpp).
struct EtcdLocation {
  std::string endpoints;              ///< "HOST:PORT[,HOST:PORT...]"
  std::string prefix = "/leasehold";  ///< key prefix of the cluster (no trailing '/')
};
/// True when `store` names an etcd store ("etcd://...").
bool is_etcd_url(std::string_view store) noexcept;
/// Parses "etcd://HOST:PORT[,HOST:PORT...][/PREFIX]". Errors (invalid_argument) name the URL and
/// the problem: no endpoint, an endpoint without a port, a prefix with a trailing '/' or "//".
Result<EtcdLocation> parse_etcd_url(std::string_view url);
/// etcd store: how long after a leader stops (crash, partition, pause) another lockd serves its
/// names at the latest, in ms: the leadership lease, plus an allowance for a follower to see the
/// key gone (its poll), win the election and load the table. Supervisors size their
/// --lockd-failover-ms from it.
std::uint64_t failover_bound_ms(const LockdConfig& cfg) noexcept;

/// Adds lockd's flags to `app`, bound to `cfg`.
void add_lockd_flags(CLI::App& app, LockdConfig& cfg);

/// Ok when `cfg` is usable; otherwise invalid_argument with one message that names the
/// flag(s) and says why (e.g. "--worker-ttl-ms applies to --mode preemptible only").
Status validate(const LockdConfig& cfg);
/// The keys lockd serves with: the --key-file cluster keys, the --admin-key-file admin keys and
/// the keys of --key-dir, in that order, each loaded with wire::load_key_file (0600, owner).
/// Read at start and again on SIGHUP. The keys, or one message naming the file (or directory)
/// and the fix: a file that does not load (as wire::load_key_file), a key of the wrong kind (a
/// worker key, an admin key given as --key-file: invalid_argument), a key directory others can
/// write (permission_denied) or that is none (not_found), no cluster key at all
/// (invalid_argument), two keys with one id (exists, as wire::ClusterKeyring::add).
Result<std::vector<wire::WireKey>> load_keys(const LockdConfig& cfg);

/// Sets the ablation switches from `env` (LEASEHOLD_ABLATE, comma-separated; nullptr: none).
/// invalid_argument naming an unknown ablation.
Status read_ablations(LockdConfig& cfg, const char* env);


/// True for a numeric "A.B.C.D:PORT" or "[v6]:PORT" (no DNS).
bool listen_address_ok(std::string_view text);

}  // namespace leasehold::lockd
