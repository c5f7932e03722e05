#include "leasehold/lockd/config.hpp"

#include "leasehold/lease/shard.hpp"
#include "leasehold/wire/address.hpp"

#include <CLI/CLI.hpp>

#include <arpa/inet.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>


namespace leasehold::lockd {

bool listen_address_ok(std::string_view text) {
  const auto colon = text.rfind(':');
  if (colon == std::string_view::npos || colon + 1 >= text.size()) return false;
  std::string host(text.substr(0, colon));
  const std::string_view port = text.substr(colon + 1);
  if (port.size() > 5) return false;
  unsigned long p = 0;
  for (char c : port) {
    if (c < '0' || c > '9') return false;
    p = p * 10 + static_cast<unsigned long>(c - '0');
  }
  if (p > 65535) return false;
  unsigned char buf[16];
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    return ::inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), buf) == 1;
  return ::inet_pton(AF_INET, host.c_str(), buf) == 1;
}

std::string signing_key_path(const LockdConfig& cfg) {
  return cfg.signing_key_file.empty() ? cfg.store_path + ".signing.key" : cfg.signing_key_file;
}

namespace {

constexpr std::string_view kEtcdScheme = "etcd://";

bool parse_port(std::string_view text, unsigned& out) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc{} && end == text.data() + text.size() && !text.empty();
}

Status bad_url(std::string_view url, const std::string& why) {
  return Status(Errc::invalid_argument, "--store \"" + std::string(url) + "\": " + why +
                                            " (expected etcd://HOST:PORT[,HOST:PORT...][/PREFIX])");
}

}  // namespace

bool is_etcd_url(std::string_view store) noexcept { return store.substr(0, kEtcdScheme.size()) == kEtcdScheme; }

Result<EtcdLocation> parse_etcd_url(std::string_view url) {
  if (!is_etcd_url(url)) return bad_url(url, "not an etcd:// URL");
  std::string_view rest = url.substr(kEtcdScheme.size());
  EtcdLocation loc;
  const std::size_t slash = rest.find('/');
  if (slash != std::string_view::npos) {
    loc.prefix = std::string(rest.substr(slash));
    rest = rest.substr(0, slash);
    if (loc.prefix.size() < 2) return bad_url(url, "an empty key prefix");
    if (loc.prefix.back() == '/') return bad_url(url, "the key prefix ends with '/'");
    if (loc.prefix.find("//") != std::string::npos) return bad_url(url, "the key prefix has an empty segment");
  }
  if (rest.empty()) return bad_url(url, "no etcd endpoint");
  std::size_t start = 0;
  while (start <= rest.size()) {
    const std::size_t comma = std::min(rest.find(',', start), rest.size());
    const std::string_view ep = rest.substr(start, comma - start);
    const std::size_t colon = ep.rfind(':');
    unsigned port = 0;
    if (ep.empty()) return bad_url(url, "an empty endpoint");
    if (colon == std::string_view::npos || colon == 0 || !parse_port(ep.substr(colon + 1), port) || port == 0 ||
        port > 65535)
      return bad_url(url, "endpoint \"" + std::string(ep) + "\" has no valid :PORT");
    start = comma + 1;
  }
  loc.endpoints = std::string(rest);
  return loc;
}

bool uses_etcd(const LockdConfig& cfg) noexcept { return is_etcd_url(cfg.store_path); }

std::uint64_t failover_bound_ms(const LockdConfig& cfg) noexcept {
  return static_cast<std::uint64_t>(std::max<std::int64_t>(cfg.leader_lease_s, 0)) * 1000 + 1000;
}

void add_lockd_flags(CLI::App& app, LockdConfig& cfg) {
  add_config_file(app, kLockdConfigDefault);
  add_log_flags(app, cfg.log);
  app.add_option("--listen", cfg.listen,
                 "UDP address to serve on, ADDR:PORT (IPv4 or [IPv6]); port 0 picks a free port "
                 "and prints it as 'listening ADDR:PORT' on stdout")
      ->capture_default_str();
  add_metrics_flags(app, cfg.metrics_listen, cfg.metrics_allow, 9740);
  app.add_option("--store", cfg.store_path,
                 "the durable name table: a SQLite file (created when absent; WAL files beside it), or "
                 "etcd://HOST:PORT[,HOST:PORT...][/PREFIX] for a cluster of lockd processes sharing one "
                 "etcd: one leads and serves, the others answer not_leader with its address and take "
                 "over when it stops (PREFIX default /leasehold; needs --signing-key-file)")
      ->capture_default_str();
  app.add_option("--advertise", cfg.advertise,
                 "etcd store: ADDR:PORT clients reach this lockd at, handed out by the others while "
                 "it leads (default: the --listen address; required when listening on a wildcard)");
  app.add_option("--leader-lease-s", cfg.leader_lease_s,
                 "etcd store: TTL of the leadership lease in seconds; a leader that cannot renew it "
                 "stops serving before it ends, and another takes over after it")
      ->capture_default_str();
  app.add_option("--etcd-txn-ops-max", cfg.etcd_txn_ops_max,
                 "etcd store: operations per etcd transaction at most (etcd's --max-txn-ops)")
      ->capture_default_str();
  app.add_option("--shard", cfg.shard,
                 "etcd store: the shard this lockd is a replica of, 0..--shards-1 (each shard's leader is "
                 "a process of its own: run R replicas of each shard)")
      ->capture_default_str();
  app.add_option("--shards", cfg.shards,
                 "etcd store: the cluster's number of shards, 1.." + std::to_string(kShardsMax) +
                     "; names hash to shards (FNV-1a of the name id, mod this). Fixed when the cluster is "
                     "first started: a lockd started with another count refuses to start")
      ->capture_default_str();
  app.add_option("--key-file", cfg.key_files,
                 "a cluster key file; each worker's key is derived from it and the worker id "
                 "(HKDF-SHA256), so no supervisor holds it; must be mode 0600 (no group/other "
                 "access). Repeat it to accept two (a rotation: tags under either key id are "
                 "accepted). This or --key-dir is required");
  app.add_option("--key-dir", cfg.key_dir,
                 "a directory of key files (every *.key in it: cluster or admin keys, mode 0600; the "
                 "directory not group/other-writable), re-read on SIGHUP: add the new key, reload, "
                 "later remove the old one and reload again, without a restart");
  app.add_option("--admin-key-file", cfg.admin_key_files,
                 "an admin key file (mode 0600) for revoke, transfer, reassign, list and show; "
                 "repeat it to accept two during a rotation");
  app.add_option("--generate-key", cfg.generate_key_path,
                 "write a new random key (mode 0600; its first line names its kind and key id) to "
                 "PATH, or to --out when PATH is not given, and exit; refuses to overwrite")
      ->expected(0, 1)
      ->default_str("");
  app.add_option("--kind", cfg.generate_kind, "with --generate-key: cluster | admin")
      ->check(CLI::IsMember({"cluster", "admin"}))
      ->capture_default_str();
  app.add_option("--key-id", cfg.key_id,
                 "with --generate-key: the key id every tag made with it carries (a cluster key 1..32767, "
                 "an admin key 1..65535; a rotation gives the new key the next id)")
      ->check(CLI::Range(1, 65535))
      ->capture_default_str();
  app.add_flag("--derive-worker-key", cfg.derive_worker_key,
               "write the key of --worker-id, derived from --key-file, to --out (mode 0600) and "
               "exit: the only key that worker's supervisor holds");
  app.add_option("--worker-id", cfg.derive_worker_id, "with --derive-worker-key: the worker id (UUID)");
  app.add_option("--out", cfg.derive_out,
                 "with --derive-worker-key: the worker key file to write; with --generate-key: the key file "
                 "to write; with --generate-signing-key: the signing key file to write (its public key "
                 "goes to PATH.pub)");
  app.add_option("--signing-key-file", cfg.signing_key_file,
                 "lockd's Ed25519 key that signs the fencing token of every grant (PEM or 32 raw bytes; "
                 "mode 0600, owned by this uid or root). Default: STORE.signing.key beside --store, "
                 "generated (with STORE.signing.key.pub) on first start");
  app.add_flag("--generate-signing-key", cfg.generate_signing_key,
               "write a new Ed25519 signing key to --out (mode 0600) and its public key to --out.pub "
               "(mode 0644) and exit; refuses to overwrite");
  app.add_flag("--print-public-key", cfg.print_public_key,
               "print the public key (PEM) and key id of the signing key (--signing-key-file or the "
               "default beside --store) and exit: what resources verify tokens with");
  app.add_option("--ttl-ms", cfg.ttl_ms, "lease TTL, milliseconds: the default and the longest a request may ask for (1.." +
                                             std::to_string(kTtlMsMax) + ")")
      ->capture_default_str();
  app.add_option("--acquiring-ttl-ms", cfg.acquiring_ttl_ms,
                 "2-phase acquire: milliseconds to commit before the acquiring record lapses (1.." +
                     std::to_string(kAcquiringTtlMsMax) + ")")
      ->capture_default_str();
  app.add_option("--lock-delay-ms", cfg.lock_delay_ms,
                 "milliseconds a name stays unavailable after its lease expired (Chubby lock-delay); "
                 "0 = off; below " + std::to_string(kLockDelayMsMax) + " and below --ttl-ms")
      ->capture_default_str();
  app.add_option("--mode", "lock mode: lease | preemptible (default: lease)")
      ->check(CLI::IsMember({"lease", "preemptible"}))
      ->each([&cfg](const std::string& v) {
        cfg.mode = v == "preemptible" ? LockMode::preemptible : LockMode::lease;
      });
  app.add_option("--worker-ttl-ms", cfg.worker_ttl_ms,
                 "preemptible mode only: milliseconds a worker counts as live after its last "
                 "worker heartbeat (default: --ttl-ms)");
  app.add_option("--reservation-ttl-ms", cfg.reservation_ttl_ms,
                 "milliseconds a transfer reservation (free, reserved for one sandbox) waits for its "
                 "sandbox after the name became grantable; then the name is free for anyone at the "
                 "same epoch (1.." + std::to_string(kReservationTtlMsMax) + "; default: " +
                     std::to_string(kReservationTtlsDefault) + " x --ttl-ms)");
  app.add_option("--max-names", cfg.max_names,
                 "name table capacity, names (1.." + std::to_string(kMaxNamesLimit) + ")")
      ->capture_default_str();
  app.add_option("--max-workers", cfg.max_workers,
                 "preemptible mode: worker-liveness table capacity, workers (1.." +
                     std::to_string(kMaxWorkersLimit) + ")")
      ->capture_default_str();
  // The one-shot actions (write a key and exit) are command-line only: a config file that held
  // one would turn every start of the service into that action.
  for (const char* name : {"--generate-key", "--kind", "--key-id", "--derive-worker-key", "--worker-id", "--out",
                           "--generate-signing-key", "--print-public-key"})
    app.get_option(name)->configurable(false);
}

namespace {

std::string kind_article(wire::KeyKind k) {
  return std::string(k == wire::KeyKind::admin ? "an " : "a ") + std::string(wire::to_string(k));
}

}  // namespace

Result<std::vector<wire::WireKey>> load_keys(const LockdConfig& cfg) {
  std::vector<wire::WireKey> out;
  auto load = [&](const std::string& path, const char* flag, bool cluster_ok, bool admin_ok) -> Status {
    wire::KeyLoad k = wire::load_key_file(path);
    if (!k) return k.status();
    const bool ok = (k->kind == wire::KeyKind::cluster && cluster_ok) || (k->kind == wire::KeyKind::admin && admin_ok);
    if (!ok)
      return Status{Errc::invalid_argument,
                    std::string(flag) + " " + path + " is " + kind_article(k->kind) + " key; " +
                        (k->kind == wire::KeyKind::worker
                             ? "a worker key belongs to its supervisor: give lockd the cluster key it was derived from"
                             : std::string(cluster_ok ? "--key-file takes cluster keys (admin keys: --admin-key-file)"
                                                      : "--admin-key-file takes admin keys (make one with --generate-key "
                                                        "--kind admin --key-id N --out PATH)"))};
    out.push_back(std::move(*k));
    return {};
  };
  for (const std::string& p : cfg.key_files)
    if (Status e = load(p, "--key-file", true, false); !e.ok()) return e;
  for (const std::string& p : cfg.admin_key_files)
    if (Status e = load(p, "--admin-key-file", false, true); !e.ok()) return e;
  if (!cfg.key_dir.empty()) {
    struct stat d {};
    if (::stat(cfg.key_dir.c_str(), &d) != 0 || !S_ISDIR(d.st_mode))
      return Status{Errc::not_found, "--key-dir " + cfg.key_dir + " is not a directory"};
    if ((d.st_mode & (S_IWGRP | S_IWOTH)) != 0)
      return Status{Errc::permission_denied, "--key-dir " + cfg.key_dir + " is writable by " +
                                                 ((d.st_mode & S_IWOTH) != 0 ? "others" : "its group") +
                                                 ", who could add a key of their own; fix: chmod go-w " + cfg.key_dir};
    std::vector<std::string> files;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(cfg.key_dir, ec))
      if (e.path().extension() == ".key") files.push_back(e.path().string());
    if (ec) return Status{errc_of_errno(ec.value()), "--key-dir " + cfg.key_dir + ": " + ec.message()};
    std::sort(files.begin(), files.end());
    for (const std::string& p : files)
      if (Status e = load(p, "--key-dir file", true, true); !e.ok()) return e;
  }
  if (std::none_of(out.begin(), out.end(), [](const wire::WireKey& k) { return k.kind == wire::KeyKind::cluster; }))
    return Status{Errc::invalid_argument,
                  "no cluster key in " +
                      std::string(cfg.key_dir.empty() ? "--key-file" : "--key-file or --key-dir " + cfg.key_dir) +
                      " (create one with: leasehold-lockd --generate-key --out PATH)"};
  // Refuse what the keyring would (two keys with one id...), naming it, before lockd uses them.
  wire::ClusterKeyring probe;
  for (const wire::WireKey& k : out)
    if (Status e = probe.add(k); !e.ok()) return e;
  return out;
}

Status read_ablations(LockdConfig& cfg, const char* env) {
  if (env == nullptr) return Status{};
  std::string_view rest(env);
  while (!rest.empty()) {
    const std::size_t comma = std::min(rest.find(','), rest.size());
    const std::string_view a = rest.substr(0, comma);
    rest.remove_prefix(std::min(comma + 1, rest.size()));
    if (a.empty()) continue;
    if (a == "shared-worker-key") cfg.ablate_shared_worker_key = true;
    else if (a == "no-authz") cfg.ablate_authz = true;
    else if (a == "replay-heartbeats") cfg.ablate_replay_heartbeats = true;
    else if (a == "reflection") cfg.ablate_reflection = true;
    else if (a == "acquiring-unbound") cfg.ablate_acquiring_unbound = true;
    else if (a == "admin-as-worker") cfg.ablate_admin_as_worker = true;
    else if (a == "transfer-unguarded") cfg.ablate_transfer_guard = true;
    else if (a == "store-mode") cfg.ablate_store_mode = true;
    else if (a == "store-busy-timeout") cfg.ablate_store_busy_timeout = true;
    else if (a == "reservation-unbound") cfg.ablate_reservation_unbound = true;
    else if (a == "seq-unbounded") cfg.ablate_seq_limit = true;
    else if (a == "seq-jump") cfg.ablate_seq_jump = true;
    else if (a == "first-push-address") cfg.ablate_first_push_address = true;
    else if (a == "self-fence") cfg.ablate_self_fence = true;
    else if (a == "no-seq-resync") continue;  // a sender's switch (wire/replay.hpp), not lockd's
    else return Status::invalid("LEASEHOLD_ABLATE: unknown ablation \"" + std::string(a) + "\"");
  }
  return Status{};
}

Status validate(const LockdConfig& cfg) {
  if (cfg.generate_key_path) {  // --generate-key needs nothing else
    if (cfg.generate_key_path->empty() && cfg.derive_out.empty())
      return Status::invalid("--generate-key needs a PATH, or --out PATH (the key file to write)");
    if (!cfg.generate_key_path->empty() && !cfg.derive_out.empty() && *cfg.generate_key_path != cfg.derive_out)
      return Status::invalid("--generate-key " + *cfg.generate_key_path + " and --out " + cfg.derive_out +
             " name two files; give one");
    if (cfg.generate_kind == "cluster" && cfg.key_id > wire::kClusterKeyIdMax)
      return Status::invalid("--key-id " + std::to_string(cfg.key_id) + " is out of range for a cluster key: 1.." +
             std::to_string(wire::kClusterKeyIdMax) + " (a tag made with cluster key N itself carries key id N | " +
             std::to_string(wire::kAdminKeyIdBit) + "; admin keys take 1..65535)");
    return Status{};
  }
  if (cfg.generate_signing_key) {
    if (cfg.derive_out.empty())
      return Status::invalid("--generate-signing-key needs --out PATH (the signing key file to write; PATH.pub gets the public key)");
    return Status{};
  }
  if (cfg.print_public_key) return Status{};  // needs only the signing key
  if (cfg.derive_worker_key) {
    if (cfg.key_files.size() != 1)
      return Status::invalid("--derive-worker-key needs one --key-file (the cluster key to derive from; during a "
             "rotation, the new one)");
    if (cfg.derive_out.empty()) return Status::invalid("--derive-worker-key needs --out PATH (the worker key file to write)");
    const auto w = WorkerId::parse(cfg.derive_worker_id);
    if (!w || w->is_nil())
      return Status::invalid("--derive-worker-key needs --worker-id UUID (got \"" + cfg.derive_worker_id + "\")");
    return Status{};
  }
  if (cfg.key_files.empty() && cfg.key_dir.empty())
    return Status::invalid("--key-file or --key-dir is required (create a key with: leasehold-lockd --generate-key --out PATH)");
  if (!listen_address_ok(cfg.listen))
    return Status::invalid("--listen \"" + cfg.listen +
           "\" is not a numeric ADDR:PORT (e.g. 127.0.0.1:7400 or [::1]:7400)");
  if (!cfg.metrics_listen.empty() && !listen_address_ok(cfg.metrics_listen))
    return Status::invalid("--metrics-listen \"" + cfg.metrics_listen +
           "\" is not a numeric ADDR:PORT (e.g. 127.0.0.1:9740 or [::1]:9740)");
  if (cfg.store_path.empty()) return Status::invalid("--store must not be empty");
  {
    // "etcd:host:port", "ETCD://..." or "etcd:/...": a mistyped etcd URL would otherwise open a
    // SQLite file of that name and serve a table of its own beside the cluster.
    const std::string& st = cfg.store_path;
    const std::size_t colon = st.find(':');
    const bool scheme = colon != std::string::npos && colon > 0 &&
                        std::all_of(st.begin(), st.begin() + static_cast<std::ptrdiff_t>(colon), [](char ch) {
                          return std::isalnum(static_cast<unsigned char>(ch)) != 0 || ch == '+' || ch == '-' || ch == '.';
                        }) && std::isalpha(static_cast<unsigned char>(st[0])) != 0;
    if (scheme && !uses_etcd(cfg))
      return Status::invalid("--store \"" + st + "\" looks like a URL but is not etcd://HOST:PORT[,HOST:PORT...][/PREFIX] "
                             "(a SQLite store is a file path; write ./" + st + " for a file of that name)");
  }
  if (uses_etcd(cfg)) {
    if (const auto loc = parse_etcd_url(cfg.store_path); !loc.ok()) return loc.status();
    if (cfg.signing_key_file.empty())
      return Status::invalid("--store " + cfg.store_path + " needs --signing-key-file: every lockd of a cluster "
                             "signs tokens with the same key (create one with leasehold-lockd "
                             "--generate-signing-key --out PATH, and give each lockd a copy)");
    if (cfg.leader_lease_s < 1 || cfg.leader_lease_s > kLeaderLeaseSMax)
      return Status::invalid("--leader-lease-s " + std::to_string(cfg.leader_lease_s) + " must be in 1.." +
                             std::to_string(kLeaderLeaseSMax));
    if (cfg.etcd_txn_ops_max < 4 || cfg.etcd_txn_ops_max > 65536)
      return Status::invalid("--etcd-txn-ops-max must be in 4..65536");
    if (cfg.shards < 1 || cfg.shards > kShardsMax)
      return Status::invalid("--shards " + std::to_string(cfg.shards) + " must be in 1.." + std::to_string(kShardsMax));
    if (cfg.shard >= cfg.shards)
      return Status::invalid("--shard " + std::to_string(cfg.shard) + " is not a shard of a cluster of --shards " +
                             std::to_string(cfg.shards) + " (shards are numbered 0.." +
                             std::to_string(cfg.shards - 1) + ")");
    // A supervisor keeps one worker liveness, which one lockd leader tracks: with several
    // shards each leader would need its own, and a worker beat its own per shard.
    if (cfg.shards > 1 && cfg.mode == LockMode::preemptible)
      return Status::invalid("--mode preemptible runs on one shard only (--shards 1): worker liveness is kept by "
                             "one leader");
    const auto wildcard = [](std::string_view a) {
      return a.substr(0, a.rfind(':')) == "0.0.0.0" || a.substr(0, a.rfind(':')) == "[::]";
    };
    if (!cfg.advertise.empty()) {
      const auto a = SocketAddress::parse(cfg.advertise);
      if (!a || a->port() == 0 || wildcard(cfg.advertise))
        return Status::invalid("--advertise \"" + cfg.advertise + "\" is not a numeric ADDR:PORT that clients can reach");
    }
    if (cfg.advertise.empty()) {
      if (wildcard(cfg.listen))
        return Status::invalid("--listen " + cfg.listen + " is a wildcard address: give --advertise ADDR:PORT, "
                               "the address the other lockd hand to clients");
    }
    // A failover must complete before supervisors' kill-switches fire, which they do before
    // the TTL: a TTL at or below the failover bound kills every named sandbox at each failover.
    if (cfg.ttl_ms <= failover_bound_ms(cfg))
      return Status::invalid("--ttl-ms " + std::to_string(cfg.ttl_ms) + " must be above the failover bound " +
                             std::to_string(failover_bound_ms(cfg)) + " ms (--leader-lease-s " +
                             std::to_string(cfg.leader_lease_s) + " s + 1000 ms to elect and load): a failover "
                             "would outlast every lease");
  } else if (cfg.advertise.size() != 0) {
    return Status::invalid("--advertise applies to an etcd store only (--store etcd://...)");
  } else if (cfg.shards != 1 || cfg.shard != 0) {
    return Status::invalid("--shard and --shards apply to an etcd store only (--store etcd://...): a SQLite "
                           "store is one lockd, one shard");
  }
  if (cfg.ttl_ms == 0) return Status::invalid("--ttl-ms must be at least 1 (a lease needs a TTL)");
  if (cfg.ttl_ms > kTtlMsMax)
    return Status::invalid("--ttl-ms " + std::to_string(cfg.ttl_ms) + " exceeds " + std::to_string(kTtlMsMax) +
           " (1 h)");
  if (cfg.acquiring_ttl_ms == 0)
    return Status::invalid("--acquiring-ttl-ms must be at least 1 (a 2-phase acquire needs time to commit)");
  if (cfg.acquiring_ttl_ms > kAcquiringTtlMsMax)
    return Status::invalid("--acquiring-ttl-ms " + std::to_string(cfg.acquiring_ttl_ms) + " exceeds " +
           std::to_string(kAcquiringTtlMsMax) +
           " (an acquiring record blocks the name and is not preemptible)");
  if (cfg.lock_delay_ms >= kLockDelayMsMax)
    return Status::invalid("--lock-delay-ms " + std::to_string(cfg.lock_delay_ms) + " must be below " +
           std::to_string(kLockDelayMsMax) + " (Chubby bounds lock-delay at one minute)");
  if (cfg.lock_delay_ms != 0 && cfg.lock_delay_ms >= cfg.ttl_ms)
    return Status::invalid("--lock-delay-ms " + std::to_string(cfg.lock_delay_ms) + " must be below --ttl-ms " +
           std::to_string(cfg.ttl_ms) +
           " (the delay covers a lapsed holder's last TTL; longer only blocks the name)");
  if (cfg.mode == LockMode::lease && cfg.worker_ttl_ms)
    return Status::invalid("--worker-ttl-ms applies to --mode preemptible only (lease mode has no worker "
           "liveness)");
  if (cfg.mode == LockMode::preemptible) {
    const auto w = cfg.effective_worker_ttl_ms();
    if (w == 0) return Status::invalid("--worker-ttl-ms must be at least 1");
    if (w > kWorkerTtlMsMax)
      return Status::invalid("--worker-ttl-ms " + std::to_string(w) + " exceeds " + std::to_string(kWorkerTtlMsMax));
  }
  if (cfg.reservation_ttl_ms && *cfg.reservation_ttl_ms == 0)
    return Status::invalid("--reservation-ttl-ms must be at least 1 (a reservation needs time to be taken)");
  if (cfg.reservation_ttl_ms && *cfg.reservation_ttl_ms > kReservationTtlMsMax)
    return Status::invalid("--reservation-ttl-ms " + std::to_string(*cfg.reservation_ttl_ms) + " exceeds " +
           std::to_string(kReservationTtlMsMax) + " (one day)");
  if (cfg.max_names == 0 || cfg.max_names > kMaxNamesLimit)
    return Status::invalid("--max-names must be in 1.." + std::to_string(kMaxNamesLimit));
  if (cfg.max_workers == 0 || cfg.max_workers > kMaxWorkersLimit)
    return Status::invalid("--max-workers must be in 1.." + std::to_string(kMaxWorkersLimit));
  return Status{};
}

}  // namespace leasehold::lockd
