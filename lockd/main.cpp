// leasehold-lockd: the lock service (DESIGN.md "lockd"). See lockd/service.hpp.
//
// Exit codes: 0 after SIGTERM/SIGINT; 1 when it cannot start or its store fails (the message on
// stderr names the cause); 2 for a bad command line or config file.
// Signals: SIGTERM/SIGINT stop it (pending changes made durable first); SIGHUP reloads the key
// files and the log level (the config file and flags read again; nothing else changes).
#include "leasehold/wire/auth.hpp"
#include "leasehold/io/daemon_options.hpp"
#include "leasehold/io/clock.hpp"
#include "leasehold/io/event_log.hpp"
#include "leasehold/io/loop.hpp"
#include "leasehold/io/service_notify.hpp"
#include "leasehold/lease/clock.hpp"
#include "leasehold/wire/token.hpp"
#include "leasehold/lockd/config.hpp"
#include "leasehold/lockd/daemon.hpp"
#include "leasehold/metrics/exchange.hpp"
#include "leasehold/metrics/http_endpoint.hpp"

#include <CLI/CLI.hpp>

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

namespace {

/// What /metrics and /healthz show of `service`, built on the io thread.
leasehold::metrics::Snapshot snapshot_of(const leasehold::lockd::LockService& service) {
  leasehold::metrics::Snapshot snap;
  service.metric_samples(snap.samples);
  snap.healthy = service.serving(&snap.health);
  return snap;
}

constexpr const char* kDescription =
    "leasehold-lockd: the lock service. Serves the name table over authenticated UDP and keeps "
    "ownership changes durable in a SQLite store (WAL, group commit), or in etcd shared by a "
    "cluster of lockd processes of which one leads (--store etcd://...).\n"
    "Logs one line per event on stderr (logfmt or JSON: time, ts_boot_ns, level, event, ...); prints "
    "'listening ADDR:PORT' on stdout once it serves, and tells systemd (Type=notify) when it serves.\n"
    "Flags may also come from a TOML config file (--config, default /etc/leasehold/lockd.toml, read "
    "whenever it exists, also by a daemon started by hand; --no-config reads none): flag-name = value "
    "lines; flags on the command line override it. The start line (event=serving) names the file read: "
    "config=PATH or config=none.\n"
    "SIGTERM/SIGINT: stop (pending changes made durable first). SIGHUP: reload the key files and "
    "the log level.";

/// Parses the command line (and the config file it names); the exit code on failure.
std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (const std::string why = leasehold::config_file_error(app, e, argc, argv); !why.empty()) {
      std::fprintf(stderr, "leasehold-lockd: %s\n", why.c_str());
      return 2;
    }
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace leasehold;
  CLI::App app{kDescription};
  app.set_version_flag("--version", "leasehold-lockd " LEASEHOLD_VERSION);
  lockd::LockdConfig cfg;
  cfg.version = LEASEHOLD_VERSION;
  lockd::add_lockd_flags(app, cfg);
  if (const auto rc = parse(app, argc, argv)) return *rc;
  daemon_log().set_format(cfg.log.format);
  daemon_log().set_level(cfg.log.level);
  if (cfg.generate_key_path) {
    if (const Status why = lockd::validate(cfg); !why.ok()) {
      std::fprintf(stderr, "leasehold-lockd: %s\n", why.message().c_str());
      return 2;
    }
    const std::string path = cfg.generate_key_path->empty() ? cfg.derive_out : *cfg.generate_key_path;
    const wire::KeyKind kind = cfg.generate_kind == "admin" ? wire::KeyKind::admin : wire::KeyKind::cluster;
    if (const Status err = wire::generate_key_file(path, kind, cfg.key_id); !err.ok()) {
      std::fprintf(stderr, "leasehold-lockd: %s\n", err.message().c_str());
      return 1;
    }
    std::printf("wrote a new %s key (key id %u) to %s (mode 0600)\n", cfg.generate_kind.c_str(),
                static_cast<unsigned>(cfg.key_id), path.c_str());
    return 0;
  }
  if (const Status why = lockd::validate(cfg); cfg.generate_signing_key && !why.ok()) {
    std::fprintf(stderr, "leasehold-lockd: %s\n", why.message().c_str());
    return 2;
  }
  if (cfg.generate_signing_key) {
    if (const Status err = token::generate_signing_key_file(cfg.derive_out); !err.ok()) {
      std::fprintf(stderr, "leasehold-lockd: %s\n", err.message().c_str());
      return 1;
    }
    const auto signer = token::TokenSigner::load(cfg.derive_out);
    std::printf("wrote a new signing key (key id %s) to %s (mode 0600) and its public key to %s.pub (mode 0644)\n",
                signer ? token::key_id_text((*signer)->key_id()).c_str() : "?", cfg.derive_out.c_str(),
                cfg.derive_out.c_str());
    return 0;
  }
  if (cfg.print_public_key) {
    const std::string path = lockd::signing_key_path(cfg);
    const auto signer = token::TokenSigner::load(path);
    if (!signer) {
      // Given the public key file itself (F.pub): print it; it needs no mode, it is not secret.
      if (const auto pub = token::read_public_key_file(path)) {
        std::printf("# leasehold token public key file %s, key id %s\n%s", path.c_str(),
                    token::key_id_text(token::key_id_of(*pub)).c_str(), token::public_key_pem(*pub).c_str());
        return 0;
      }
      std::fprintf(stderr, "leasehold-lockd: %s\n", signer.message().c_str());
      return 1;
    }
    std::printf("# leasehold token signing key %s, key id %s\n%s", path.c_str(),
                token::key_id_text((*signer)->key_id()).c_str(), (*signer)->public_key_pem().c_str());
    return 0;
  }
  if (const Status why = lockd::read_ablations(cfg, std::getenv("LEASEHOLD_ABLATE")); !why.ok()) {
    std::fprintf(stderr, "leasehold-lockd: %s\n", why.message().c_str());
    return 2;
  }
  if (const Status why = lockd::validate(cfg); !why.ok()) {
    std::fprintf(stderr, "leasehold-lockd: %s\n", why.message().c_str());
    return 2;
  }
  if (cfg.derive_worker_key) {
    wire::KeyLoad key = wire::load_key_file(cfg.key_files.front());
    if (!key) {
      std::fprintf(stderr, "leasehold-lockd: %s\n", key.message().c_str());
      return 1;
    }
    if (key->kind != wire::KeyKind::cluster) {
      std::fprintf(stderr, "leasehold-lockd: --key-file %s is a%s %s key; a worker key is derived from the cluster key\n",
                   cfg.key_files.front().c_str(), key->kind == wire::KeyKind::admin ? "n" : "",
                   std::string(wire::to_string(key->kind)).c_str());
      return 1;
    }
    const wire::WireKey wk = wire::derive_worker_key_as_issued(*key, *WorkerId::parse(cfg.derive_worker_id),
                                                               cfg.ablate_shared_worker_key);
    if (const Status err = wire::write_key_file(cfg.derive_out, wk); !err.ok()) {
      std::fprintf(stderr, "leasehold-lockd: %s\n", err.message().c_str());
      return 1;
    }
    std::printf("wrote the key of worker %s (key id %u) to %s (mode 0600)\n", wk.worker.str().c_str(),
                static_cast<unsigned>(wk.key_id), cfg.derive_out.c_str());
    return 0;
  }
  auto loaded_keys = lockd::load_keys(cfg);
  if (!loaded_keys) {
    std::fprintf(stderr, "leasehold-lockd: %s\n", loaded_keys.message().c_str());
    return 1;
  }
  std::vector<wire::WireKey> keys = std::move(loaded_keys).value();
  // The cluster keys first: lockd's own sender starts with one.
  std::stable_partition(keys.begin(), keys.end(), [](const wire::WireKey& k) { return k.kind == wire::KeyKind::cluster; });

  // Termination by signalfd on the loop, so shutdown happens between iterations.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGHUP);  // reload the keys
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);  // before the store thread starts: it inherits it
  const int sfd = ::signalfd(-1, &sigs, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) {
    std::perror("leasehold-lockd: signalfd");
    return 1;
  }

  // The HTTP endpoint (--metrics-listen) first, before anything is created on disk: a busy port
  // is refused as the busy --listen port is (exit 1) and leaves no store behind. On threads of
  // its own, started after the signals above are blocked (they inherit the mask: SIGTERM stays
  // the signalfd's); it asks the io thread for a snapshot through an eventfd the loop polls
  // once the service exists (until then an answer waits its second and is 503 "did not answer").
  std::unique_ptr<metrics::SnapshotExchange> exchange;
  std::unique_ptr<metrics::HttpEndpoint> http;
  if (!cfg.metrics_listen.empty()) {
    exchange = std::make_unique<metrics::SnapshotExchange>();
    metrics::HttpLimits limits;
    limits.allow = cfg.metrics_allow;
    auto started = metrics::HttpEndpoint::serve(cfg.metrics_listen, *exchange, "leasehold_lockd_", "lockd", limits);
    if (!started) {
      std::fprintf(stderr, "leasehold-lockd: %s\n", started.message().c_str());
      // A malformed address or allow list is a bad command line (2); a busy port, like a busy
      // --listen port, a start that failed (1).
      return started.code() == Errc::invalid_argument ? 2 : 1;
    }
    http = std::move(started).value();
  }

  LoopConfig lc;
  lc.sq_entries = 1024;
  lc.recv_buffer_count = 2048;
  lc.sends_in_flight_max = 4096;
  lc.sockets_max = 4;
  lc.polls_max = 4;
  lc.timers_max = 16;
  ProbeResult probe;
  std::unique_ptr<EventLoop> loop = EventLoop::create(lc, &probe);
  if (!loop) {
    std::fprintf(stderr, "leasehold-lockd: io_uring: %s\n", probe.message.c_str());
    return 1;
  }
  // A lockd that cannot start (its port busy, ...) leaves no store behind that it created: the
  // SQLite files that are not there now are removed again if the start fails.
  std::vector<std::string> created_files;
  if (!lockd::is_etcd_url(cfg.store_path))
    for (const char* suffix : {"", "-wal", "-shm", "-journal"})
      if (const std::string f = cfg.store_path + suffix; ::access(f.c_str(), F_OK) != 0 && errno == ENOENT)
        created_files.push_back(f);
  std::unique_ptr<lockd::LockdDaemon> service;
  try {
    service = std::make_unique<lockd::LockdDaemon>(cfg, keys, *loop);
  } catch (const std::exception& e) {
    for (const std::string& f : created_files) ::unlink(f.c_str());
    std::fprintf(stderr, "leasehold-lockd: %s\n", e.what());
    return 1;
  }
  // The token signing key: the configured one, or the default beside the store, generated on
  // first start (sshd's host keys), before anything is served: a grant never goes out
  // unsigned. After the store opened, so a store problem is reported as such first.
  std::shared_ptr<const token::TokenSigner> signer;
  {
    const std::string path = lockd::signing_key_path(cfg);
    bool generated = false;
    if (cfg.signing_key_file.empty() && ::access(path.c_str(), F_OK) != 0 && errno == ENOENT) {
      if (const Status err = token::generate_signing_key_file(path); !err.ok()) {
        std::fprintf(stderr, "leasehold-lockd: cannot create the token signing key: %s\n", err.message().c_str());
        service.reset();
        return 1;
      }
      generated = true;
    }
    auto loaded = token::TokenSigner::load(path);
    if (!loaded) {
      std::fprintf(stderr, "leasehold-lockd: %s\n", loaded.message().c_str());
      service.reset();
      return 1;
    }
    signer = std::move(loaded).value();
    // The public key file operators copy to resources must be this key's: one that is not
    // would have every write refused as unknown_key. lockd never rewrites it (an operator may
    // have put it there); it refuses to start and names both files.
    const std::string pub_path = path + ".pub";
    std::string pub_note = "public key " + pub_path;
    if (::access(pub_path.c_str(), F_OK) == 0 || errno != ENOENT) {
      const auto pub = token::read_public_key_file(pub_path);
      if (!pub || *pub != signer->public_key()) {
        if (pub)
          std::fprintf(stderr,
                       "leasehold-lockd: public key file %s (key id %s) is not the public key of the signing key %s "
                       "(key id %s): resources given it would refuse every token as unknown_key; fix: replace it "
                       "with the output of `leasehold-lockd --print-public-key --signing-key-file %s`\n",
                       pub_path.c_str(), token::key_id_text(token::key_id_of(*pub)).c_str(), path.c_str(),
                       token::key_id_text(signer->key_id()).c_str(), path.c_str());
        else
          std::fprintf(stderr, "leasehold-lockd: %s (beside the signing key %s); fix: replace it with the output of "
                       "`leasehold-lockd --print-public-key --signing-key-file %s`\n",
                       pub.message().c_str(), path.c_str(), path.c_str());
        service.reset();
        return 1;
      }
    } else {
      pub_note = "no public key file " + pub_path + " (`--print-public-key` prints it)";
    }
    // On etcd, the cluster's record first: a lockd it refuses says so, not that it signs.
    if (const Status err = service->set_token_signer(signer); !err.ok()) {
      std::fprintf(stderr, "leasehold-lockd: --signing-key-file %s: refusing to start: %s\n", path.c_str(),
                   err.message().c_str());
      service.reset();
      return 1;
    }
    service->write_log();  // one log, in time order: the lines the start buffered first
    daemon_log().emit(boottime_ns(), "event=token_signing_key action=" + std::string(generated ? "generated" : "loaded") +
                                         " path=" + path + " key_id=" + token::key_id_text(signer->key_id()) +
                                         " note=\"" + pub_note + "\"");
  }
  bool stopping = false;
  bool reload = false;
  loop->add_poll(sfd, POLLIN, PollMode::multishot, [&](int) {
    signalfd_siginfo si{};
    while (::read(sfd, &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
      if (si.ssi_signo == SIGHUP) reload = true;
      else stopping = true;
    }
  });
  if (http) {
    // From here on the endpoint's snapshots come from the service.
    loop->add_poll(exchange->wake_fd(), POLLIN, PollMode::multishot, [&](int) {
      if (exchange->take_request()) exchange->publish(snapshot_of(service->service()));
    });
    std::printf("metrics http://%s/metrics\n", http->address().c_str());
  }
  std::printf("listening %s\n", service->local_address().str().c_str());
  std::fflush(stdout);
  ServiceNotifier notifier;  // before the loop's first turn: its wait is bounded by the pings
  notifier.ready("serving on " + service->local_address().str() + ", store " + cfg.store_path);
  service->write_log();  // the lines the start buffered (cluster_keys, signing_key, ...) come first
  daemon_log().emit(boottime_ns(), "event=serving listen=" + service->local_address().str() + " store=" +
                                       cfg.store_path + " config=" + logfmt_value(config_file_read(app)) +
                                       " log_level=" + std::string(to_string(cfg.log.level)) +
                                       " watchdog_ms=" + std::to_string(notifier.watchdog_interval_ns() / kNsPerMs));

  while (!stopping) {
    // An idle lockd sleeps until its next expiry; a watchdog ping may be due before that.
    const int rc = loop->run_once(std::min(service->wait_ns(), notifier.wait_ns(boottime_ns())));
    if (rc < 0) {
      daemon_log().emit(boottime_ns(), "level=error event=loop_failed error=\"io_uring_enter: " +
                                           std::string(std::strerror(-rc)) + "\"");
      return 1;
    }
    notifier.watchdog(loop->turn_now_ns());
    if (reload) {
      reload = false;
      // The config file and the flags, read again (flags still override the file): the key
      // files they name now (a rotation adds a key-file to the file's list, or a file to
      // --key-dir) and the log level; nothing else of them changes without a restart. A file
      // that no longer parses changes neither: the keys named before are read again, the level
      // stays. A key set that does not load changes nothing.
      CLI::App again{kDescription};
      lockd::LockdConfig fresh;
      fresh.version = LEASEHOLD_VERSION;
      lockd::add_lockd_flags(again, fresh);
      std::string parse_error;
      try {
        again.parse(argc, argv);
      } catch (const CLI::ParseError& e) {
        parse_error = config_file_error(again, e, argc, argv);
        if (parse_error.empty()) parse_error = e.what();
      }
      if (parse_error.empty()) {
        cfg.key_files = fresh.key_files;
        cfg.admin_key_files = fresh.admin_key_files;
        cfg.key_dir = fresh.key_dir;
      }
      const auto next = lockd::load_keys(cfg);
      const Status err = next ? service->reload_keys(*next, loop->turn_now_ns()) : next.status();
      // The service's lines (keys_reloaded) are buffered until the end of the turn: written now,
      // so the log stays in time order, keys_reloaded before reloaded.
      service->write_log();
      if (!err.ok())
        daemon_log().emit(boottime_ns(), "level=warn event=key_reload_refused error=\"the keys stay as they were: " +
                                             err.message() + "\"");
      if (parse_error.empty()) {
        const LogLevel before = daemon_log().level();
        daemon_log().set_level(fresh.log.level);
        daemon_log().emit(boottime_ns(), "event=reloaded log_level=" + std::string(to_string(fresh.log.level)) +
                                             " log_level_before=" + std::string(to_string(before)) +
                                             " keys=" + (err.ok() ? "reloaded" : "unchanged"));
      } else {
        daemon_log().emit(boottime_ns(), "level=warn event=config_reload_refused error=" +
                                             quoted_value("the log level stays " +
                                                          std::string(to_string(daemon_log().level())) + ": " +
                                                          parse_error + " (the key files named before were read again)"));
      }
    }
    if (!service->after_iteration()) {
      // Through the log queue, after the lines it holds (and never blocking on a full stderr):
      // it is flushed, with a bound, at exit.
      daemon_log().emit(boottime_ns(), "level=error event=store_failed action=stopping error=\"nothing of the failed "
                                           "batch was acknowledged: " + service->failure() + "\"");
      notifier.stopping("the store failed: " + service->failure());
      return 1;
    }
  }
  http.reset();  // no scrape waits for this loop from here on
  // Orderly stop: make the pending changes durable and send the answers that waited for them.
  notifier.stopping("stopping: making pending changes durable");
  const bool drained = service->drain_for_shutdown();
  loop->run_once(0);
  service.reset();
  ::close(sfd);
  if (!drained) {
    daemon_log().emit(boottime_ns(), "level=error event=store_failed action=stopped error=\"the store failed while "
                                         "stopping\"");
    return 1;
  }
  daemon_log().emit(boottime_ns(), "event=stopped");
  return 0;
}
