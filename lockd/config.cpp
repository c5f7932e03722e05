#include "lockd/config.hpp"

#include <CLI/CLI.hpp>

#include <arpa/inet.h>


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

void add_lockd_flags(CLI::App& app, LockdConfig& cfg) {
  app.add_option("--listen", cfg.listen,
                 "UDP address to serve on, ADDR:PORT (IPv4 or [IPv6]); port 0 picks a free port "
                 "and prints it as 'listening ADDR:PORT' on stdout")
      ->capture_default_str();
  app.add_option("--store", cfg.store_path,
                 "SQLite file of the durable name table (created when absent; WAL files beside it)")
      ->capture_default_str();
  app.add_option("--key-file", cfg.key_file,
                 "the cluster key file; each worker's key is derived from it and the worker id "
                 "(HKDF-SHA256), so no supervisor holds it; must be mode 0600 (no group/other "
                 "access). Required");
  app.add_option("--admin-key-file", cfg.admin_key_files,
                 "an admin key file (mode 0600) for revoke, transfer, reassign, list and show; "
                 "repeat it to accept two during a rotation");
  app.add_option("--generate-key", cfg.generate_key_path,
                 "write a new random key (mode 0600) to PATH and exit; refuses to overwrite");
  app.add_option("--kind", cfg.generate_kind, "with --generate-key: cluster | admin")
      ->check(CLI::IsMember({"cluster", "admin"}))
      ->capture_default_str();
  app.add_option("--key-id", cfg.key_id,
                 "with --generate-key: the key id every tag made with it carries (1..65535; a "
                 "rotation gives the new key the next id)")
      ->check(CLI::Range(1, 65535))
      ->capture_default_str();
  app.add_flag("--derive-worker-key", cfg.derive_worker_key,
               "write the key of --worker-id, derived from --key-file, to --out (mode 0600) and "
               "exit: the only key that worker's supervisor holds");
  app.add_option("--worker-id", cfg.derive_worker_id, "with --derive-worker-key: the worker id (UUID)");
  app.add_option("--out", cfg.derive_out,
                 "with --derive-worker-key: the worker key file to write; with --generate-signing-key: "
                 "the signing key file to write (its public key goes to PATH.pub)");
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
}

std::string read_ablations(LockdConfig& cfg, const char* env) {
  if (env == nullptr) return {};
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
    else if (a == "no-seq-resync") continue;  // a sender's switch (io/replay.hpp), not lockd's
    else return "LEASEHOLD_ABLATE: unknown ablation \"" + std::string(a) + "\"";
  }
  return {};
}

std::string validate(const LockdConfig& cfg) {
  if (cfg.generate_key_path) return {};  // --generate-key needs nothing else
  if (cfg.generate_signing_key) {
    if (cfg.derive_out.empty())
      return "--generate-signing-key needs --out PATH (the signing key file to write; PATH.pub gets the public key)";
    return {};
  }
  if (cfg.print_public_key) return {};  // needs only the signing key
  if (cfg.derive_worker_key) {
    if (cfg.key_file.empty()) return "--derive-worker-key needs --key-file (the cluster key)";
    if (cfg.derive_out.empty()) return "--derive-worker-key needs --out PATH (the worker key file to write)";
    const auto w = WorkerId::parse(cfg.derive_worker_id);
    if (!w || w->is_nil())
      return "--derive-worker-key needs --worker-id UUID (got \"" + cfg.derive_worker_id + "\")";
    return {};
  }
  if (cfg.key_file.empty())
    return "--key-file is required (create one with: leasehold-lockd --generate-key PATH)";
  if (!listen_address_ok(cfg.listen))
    return "--listen \"" + cfg.listen +
           "\" is not a numeric ADDR:PORT (e.g. 127.0.0.1:7400 or [::1]:7400)";
  if (cfg.store_path.empty()) return "--store must not be empty";
  if (cfg.ttl_ms == 0) return "--ttl-ms must be at least 1 (a lease needs a TTL)";
  if (cfg.ttl_ms > kTtlMsMax)
    return "--ttl-ms " + std::to_string(cfg.ttl_ms) + " exceeds " + std::to_string(kTtlMsMax) +
           " (1 h)";
  if (cfg.acquiring_ttl_ms == 0)
    return "--acquiring-ttl-ms must be at least 1 (a 2-phase acquire needs time to commit)";
  if (cfg.acquiring_ttl_ms > kAcquiringTtlMsMax)
    return "--acquiring-ttl-ms " + std::to_string(cfg.acquiring_ttl_ms) + " exceeds " +
           std::to_string(kAcquiringTtlMsMax) +
           " (an acquiring record blocks the name and is not preemptible)";
  if (cfg.lock_delay_ms >= kLockDelayMsMax)
    return "--lock-delay-ms " + std::to_string(cfg.lock_delay_ms) + " must be below " +
           std::to_string(kLockDelayMsMax) + " (Chubby bounds lock-delay at one minute)";
  if (cfg.lock_delay_ms != 0 && cfg.lock_delay_ms >= cfg.ttl_ms)
    return "--lock-delay-ms " + std::to_string(cfg.lock_delay_ms) + " must be below --ttl-ms " +
           std::to_string(cfg.ttl_ms) +
           " (the delay covers a lapsed holder's last TTL; longer only blocks the name)";
  if (cfg.mode == LockMode::lease && cfg.worker_ttl_ms)
    return "--worker-ttl-ms applies to --mode preemptible only (lease mode has no worker "
           "liveness)";
  if (cfg.mode == LockMode::preemptible) {
    const auto w = cfg.effective_worker_ttl_ms();
    if (w == 0) return "--worker-ttl-ms must be at least 1";
    if (w > kWorkerTtlMsMax)
      return "--worker-ttl-ms " + std::to_string(w) + " exceeds " + std::to_string(kWorkerTtlMsMax);
  }
  if (cfg.reservation_ttl_ms && *cfg.reservation_ttl_ms == 0)
    return "--reservation-ttl-ms must be at least 1 (a reservation needs time to be taken)";
  if (cfg.reservation_ttl_ms && *cfg.reservation_ttl_ms > kReservationTtlMsMax)
    return "--reservation-ttl-ms " + std::to_string(*cfg.reservation_ttl_ms) + " exceeds " +
           std::to_string(kReservationTtlMsMax) + " (one day)";
  if (cfg.max_names == 0 || cfg.max_names > kMaxNamesLimit)
    return "--max-names must be in 1.." + std::to_string(kMaxNamesLimit);
  if (cfg.max_workers == 0 || cfg.max_workers > kMaxWorkersLimit)
    return "--max-workers must be in 1.." + std::to_string(kMaxWorkersLimit);
  return {};
}

}  // namespace leasehold::lockd
