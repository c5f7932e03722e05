#include "leasehold/lockd/daemon.hpp"

#include "leasehold/etcd/client.hpp"
#include "leasehold/io/event_log.hpp"
#include "leasehold/lease/clock.hpp"
#include "leasehold/lockd/etcd_store.hpp"
#include "leasehold/lockd/leadership.hpp"
#include "leasehold/lockd/shards.hpp"

#include "leasehold/wire/replay.hpp"
#include "leasehold/wire/token.hpp"

#include <openssl/rand.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace leasehold::lockd {

WorkerId random_instance_id() {
  WorkerId id;
  unsigned char b[16];
  if (RAND_bytes(b, sizeof b) != 1) throw std::runtime_error("cannot draw a random lockd instance id");
  for (int i = 0; i < 8; ++i) {
    id.hi = (id.hi << 8) | b[i];
    id.lo = (id.lo << 8) | b[8 + i];
  }
  if (id.is_nil()) id.lo = 1;
  return id;
}

/// lockd on etcd: the cluster side of the daemon.
struct LockdDaemon::Cluster {
  /// The store of a follower: it takes nothing (a follower changes nothing).
  struct NoStore final : DurabilityPort {
    bool submit(DurableBatch&&) override { return false; }
    void poll(std::vector<DurabilityVerdict>&) override {}
  };
  EtcdLocation location;
  std::string shard;  ///< the key prefix of the shard this lockd is a replica of (--shard)
  std::shared_ptr<etcd::Client> client;
  std::unique_ptr<Leadership> leadership;
  /// Every shard's leader (--shards > 1), and the version of them the service was given.
  std::unique_ptr<ShardLeaders> shard_leaders;
  std::uint64_t shard_leaders_seen = 0;
  NoStore no_store;
  std::int64_t leading = 0;        ///< the revision served as the leader (0: a follower)
  /// While leading: the fence of `leading` as read at the start of this loop turn's checks
  /// (Leadership::view() once per turn, not per datagram). The thread only moves a fence later
  /// while the revision stays, so a turn-old copy can only stop serving earlier.
  std::int64_t fence_ns = 0;
  std::int64_t refused = 0;        ///< a revision given up: not taken over again
  std::string advertise;           ///< this lockd's own address in the election key
  std::string leader_seen;         ///< the hint the follower answers with
  /// The hint a follower answers with for the leader `leader` (the election key's value): never
  /// this lockd's own address - its key may outlive it (a restart within the lease), or it won
  /// and does not serve yet - a client sent back to the lockd that refused it would loop.
  std::string hint(const std::string& leader) const { return leader == advertise ? std::string() : leader; }
  std::string error_seen;          ///< the leadership's last error, as last logged
  /// Store threads of services given up, destroyed once their last commit returned (a commit
  /// to an unreachable etcd blocks until its deadline; the io thread never waits for it).
  std::vector<std::unique_ptr<StoreThread>> retired;
  /// A takeover's load of the table, on a thread of its own: the io thread goes on answering
  /// (not_leader, as the follower it still is) while etcd's range reads run.
  struct Load {
    std::int64_t revision = 0;
    std::int64_t started_ns = 0;
    std::mutex mu;
    bool done = false;                  // guarded by mu
    std::unique_ptr<EtcdStore> store;   // guarded by mu: the store, once loaded
    StoredTable table;                  // guarded by mu
    std::string error;                  // guarded by mu: why the load failed ("" = it did not)
    std::thread thread;
    ~Load() {
      if (thread.joinable()) thread.join();
    }
  };
  std::unique_ptr<Load> load;
};

LockdDaemon::LockdDaemon(const LockdConfig& cfg, const std::vector<wire::WireKey>& keys, EventLoop& loop)
    : loop_(loop), cfg_(cfg), keys_(keys) {
  const std::int64_t now = loop.clock().now_ns();
  RestoredTable restored;
  if (uses_etcd(cfg)) {
    cluster_ = std::make_unique<Cluster>();
    auto loc = parse_etcd_url(cfg.store_path);
    if (!loc.ok()) throw std::runtime_error(loc.status().message());
    cluster_->location = std::move(*loc);
    cluster_->shard = shard_prefix(cluster_->location.prefix, cfg.shard);
    auto client = etcd::Client::open(cluster_->location.endpoints);
    if (!client.ok()) throw std::runtime_error("--store " + cfg.store_path + ": " + client.status().message());
    cluster_->client = std::move(*client);
    // The cluster's shard count before anything of a shard: a lockd with another count would
    // serve names that another shard's leader serves too.
    if (Status s = ensure_shard_count(*cluster_->client, cluster_->location.prefix, cfg.shards,
                                      boottime_ns() + kShardCountWaitNs);
        !s.ok())
      throw std::runtime_error("--shards " + std::to_string(cfg.shards) + ": " + s.message());
    // The cluster's key record (etcd_store.hpp): a lockd with none of the keys the cluster
    // accepts is another cluster's and must not start; one that lacks a key added by a rotation
    // starts, and campaigns once it has it. An unreachable etcd is no refusal: the campaign
    // checks again before every election.
    std::string note;
    const Status keys_ok = check_cluster_keys(*cluster_->client, cluster_->location.prefix, cluster_keys_value(keys_),
                                              boottime_ns() + 2'000'000'000, &note);
    if (keys_ok.code() == Errc::permission_denied)
      throw std::runtime_error("--store " + cfg.store_path + ": refusing to start: " + keys_ok.message());
    log_ += "ts_boot_ns=" + std::to_string(now) + " event=cluster_keys keys=\"" + cluster_keys_value(keys_) +
            "\" record=\"" + (keys_ok.ok() ? note : "unread: " + keys_ok.message()) + "\"\n";
  } else {
    StoreOptions store_options;
    store_options.private_files = !cfg.ablate_store_mode;
    store_options.busy_timeout_ms = cfg.ablate_store_busy_timeout ? 0 : kStoreOpenBusyTimeoutMsDefault;
    auto store = std::make_unique<NameStore>(cfg.store_path, store_options);  // throws StoreError
    restored.incarnation = store->open_count();
    for (const std::string& fixed : store->modes_fixed())
      log_ += "ts_boot_ns=" + std::to_string(now) + " level=warn event=store_mode_fixed file=" + fixed + "\n";
    restored.stored = store->load();
    store_ = std::make_unique<StoreThread>(std::move(store), [&loop] { loop.wake(); });
  }

  const auto addr = SocketAddress::parse(cfg.listen);
  if (!addr) throw std::runtime_error("--listen \"" + cfg.listen + "\" is not a numeric ADDR:PORT");
  const int fd = open_udp_socket(*addr);
  if (fd < 0)
    throw std::runtime_error("cannot bind UDP " + cfg.listen + ": " + std::strerror(-fd));
  // Deep socket buffers: bursts of heartbeats from many workers arrive at once.
  set_socket_buffers(fd, 8 << 20, 8 << 20);
  local_ = leasehold::local_address(fd).value_or(*addr);
  socket_ = loop.add_udp_socket(UniqueFd(fd), [this](const Datagram& d) {
    // One clock reading per turn: every datagram of a turn is served at the same now_ns.
    const std::int64_t turn_now = loop_.turn_now_ns();
    // Self-fencing (leadership.hpp): a leader whose leadership lease may have run out serves no
    // request any more, not even one already received.
    if (fenced(turn_now)) become_follower(turn_now, "the leadership lease was not renewed in time (fenced)", true);
    service_->on_datagram(std::span(reinterpret_cast<const std::uint8_t*>(d.payload.data()), d.payload.size()),
                          d.source_address(), turn_now);
  });
  if (!socket_.valid()) throw std::runtime_error("cannot register the UDP socket with the io loop");
  net_ = std::make_unique<UdpDatagramPort>(loop, socket_, local_);
  try {
    if (cluster_ == nullptr) {
      service_ = make_service(restored, *store_, now);
    } else {
      LeadershipConfig lc;
      lc.shard_prefix = cluster_->shard;
      lc.advertise = cfg.advertise.empty() ? local_.str() : cfg.advertise;
      cluster_->advertise = lc.advertise;
      lc.lease_s = cfg.leader_lease_s;
      lc.cluster_key_path = cluster_key_key(cluster_->location.prefix);
      lc.signing_key_path = signing_key_key(cluster_->location.prefix);
      lc.cluster_keys = cluster_keys_value(keys_);
      if (cfg.shards > 1)
        cluster_->shard_leaders =
            std::make_unique<ShardLeaders>(cluster_->client, cluster_->location.prefix, cfg.shards,
                                           cfg.etcd_txn_ops_max, lc.poll_ns, [&loop] { loop.wake(); });
      auto leadership = Leadership::start(cluster_->client, lc, [&loop] { loop.wake(); });
      if (!leadership.ok()) throw std::runtime_error(leadership.status().message());
      cluster_->leadership = std::move(*leadership);
      const std::int64_t window_ms = serve_until_ns(0, lc.lease_s, lc.clock_rate_bound, lc.margin_ns) / 1'000'000;
      log_ += "ts_boot_ns=" + std::to_string(now) + " event=cluster store=etcd://" + cluster_->location.endpoints +
              cluster_->location.prefix + " shard=" + std::to_string(cfg.shard) +
              " shards=" + std::to_string(cfg.shards) + " advertise=" + lc.advertise +
              " leader_lease_s=" + std::to_string(lc.lease_s) + " serve_window_ms=" + std::to_string(window_ms) +
              " failover_bound_ms=" + std::to_string(failover_bound_ms(cfg)) + " ttl_ms=" + std::to_string(cfg.ttl_ms) +
              "\n";
      become_follower(now, "starting", false);
    }
  } catch (...) {
    loop.close_socket(socket_);
    throw;
  }
  loop.set_wake_handler([] {});  // the wake only ends run_once; after_iteration does the work
  write_log();
}

bool LockdDaemon::fenced(std::int64_t now_ns) const {
  if (cluster_ == nullptr || cluster_->leading == 0 || cfg_.ablate_self_fence) return false;
  return now_ns >= cluster_->fence_ns;
}

std::unique_ptr<LockService> LockdDaemon::make_service(const RestoredTable& restored, DurabilityPort& store,
                                                       std::int64_t now_ns) {
  auto s = std::make_unique<LockService>(cfg_, keys_, restored, *net_, store, now_ns,
                                         ServiceSeeds{random_instance_id(), wire::seq_seed(), {}});
  if (signer_) s->set_token_signer(signer_);
  if (cluster_ != nullptr && cluster_->shard_leaders != nullptr)
    s->set_shard_leaders(cluster_->shard_leaders->leaders(), cluster_->advertise);
  return s;
}

Status LockdDaemon::set_token_signer(std::shared_ptr<const token::TokenSigner> signer) {
  if (cluster_ != nullptr && signer != nullptr) {
    std::string note;
    const Status ok = check_signing_key(*cluster_->client, cluster_->location.prefix,
                                        signing_key_value(signer->public_key(), signer->key_id()),
                                        boottime_ns() + 2'000'000'000, &note);
    if (ok.code() == Errc::permission_denied) return ok;
    // Unread (etcd did not answer): the election checks the record again before every campaign.
    cluster_->leadership->set_signing_key(signing_key_value(signer->public_key(), signer->key_id()));
    log_ += "ts_boot_ns=" + std::to_string(loop_.clock().now_ns()) + " event=signing_key key_id=" +
            token::key_id_text(signer->key_id()) + " record=\"" + (ok.ok() ? note : "unread: " + ok.message()) + "\"\n";
    write_log();
  }
  signer_ = std::move(signer);
  service_->set_token_signer(signer_);
  return Status{};
}

Status LockdDaemon::reload_keys(const std::vector<wire::WireKey>& keys, std::int64_t now_ns) {
  std::vector<wire::WireKey> ordered = keys;
  std::stable_partition(ordered.begin(), ordered.end(),
                        [](const wire::WireKey& k) { return k.kind == wire::KeyKind::cluster; });
  if (Status err = service_->reload_keys(ordered, now_ns); !err.ok()) return err;
  keys_ = std::move(ordered);
  if (cluster_ != nullptr) cluster_->leadership->set_cluster_keys(cluster_keys_value(keys_));
  return Status{};
}

void LockdDaemon::become_follower(std::int64_t now_ns, const std::string& why, bool fence) {
  Cluster& c = *cluster_;
  if (c.leading != 0) {
    write_log();
    log_ += "ts_boot_ns=" + std::to_string(now_ns) + " level=warn event=step_down revision=" + std::to_string(c.leading) +
            " why=\"" + why + "\"\n";
    c.leadership->step_down(c.leading, fence ? Leadership::StepDown::fenced : Leadership::StepDown::failed);
    c.refused = c.leading;
    c.leading = 0;
  }
  service_.reset();  // before its store: it holds a reference
  if (store_ != nullptr) c.retired.push_back(std::move(store_));
  service_ = make_service(RestoredTable{}, c.no_store, now_ns);
  c.leader_seen = c.leadership != nullptr ? c.hint(c.leadership->view().leader) : std::string();
  service_->set_not_leader(c.leader_seen);
}

void LockdDaemon::start_load(std::int64_t revision, std::int64_t now_ns) {
  Cluster& c = *cluster_;
  auto load = std::make_unique<Cluster::Load>();
  load->revision = revision;
  load->started_ns = now_ns;
  Cluster::Load* l = load.get();
  load->thread = std::thread([l, client = c.client, shard = c.shard, ops = cfg_.etcd_txn_ops_max, &loop = loop_] {
    std::unique_ptr<EtcdStore> store;
    StoredTable table;
    std::string error;
    try {
      store = std::make_unique<EtcdStore>(client, shard, l->revision, ops);
      table = store->load();  // a linearizable read after the election: every earlier write
    } catch (const std::exception& e) {
      error = e.what();
    }
    {
      std::lock_guard lock(l->mu);
      l->store = std::move(store);
      l->table = std::move(table);
      l->error = std::move(error);
      l->done = true;
    }
    loop.wake();
  });
  c.load = std::move(load);
  service_->set_loading(true);
  // The key is this lockd's now: no other leader to name while it loads (the hint it had may
  // name the leader whose key just expired).
  c.leader_seen.clear();
  service_->set_not_leader({});
  log_ += "ts_boot_ns=" + std::to_string(now_ns) + " event=take_over_loading revision=" + std::to_string(revision) +
          "\n";
}

std::int64_t LockdDaemon::finish_load(const Leadership::View& v, std::int64_t now_ns) {
  Cluster& c = *cluster_;
  {
    std::lock_guard lock(c.load->mu);
    if (!c.load->done) return now_ns;  // still loading: a follower meanwhile
  }
  std::unique_ptr<Cluster::Load> load = std::move(c.load);
  load->thread.join();
  service_->set_loading(false);
  const std::int64_t revision = load->revision;
  if (!load->error.empty()) {
    log_ += "ts_boot_ns=" + std::to_string(now_ns) + " level=warn event=take_over_failed revision=" + std::to_string(revision) +
            " why=\"" + load->error + "\"\n";
    c.refused = revision;
    c.leadership->step_down(revision, Leadership::StepDown::failed);
    return now_ns;
  }
  // The leadership may have moved on (or its fence passed) while the table loaded: the load
  // is then of no use, and the guard would refuse every write of it anyway.
  if (!load_still_leads(v, revision, now_ns)) {
    log_ += "ts_boot_ns=" + std::to_string(now_ns) + " event=take_over_dropped revision=" + std::to_string(revision) +
            " why=\"the leadership ended while the table loaded\"\n";
    return now_ns;
  }
  RestoredTable restored;
  restored.incarnation = load->store->incarnation();
  restored.stored = std::move(load->table);
  auto thread = std::make_unique<StoreThread>(std::move(load->store), [this] { loop_.wake(); });
  // The table is served as of now: every held lease refreshed now, within the restart rule.
  const std::int64_t now = loop_.clock().now_ns();
  auto leader = make_service(restored, *thread, now);
  service_.reset();
  store_ = std::move(thread);
  service_ = std::move(leader);
  c.leading = revision;
  c.fence_ns = fence_of(c.leadership->view(), revision);
  log_ += "ts_boot_ns=" + std::to_string(now) + " event=leading revision=" + std::to_string(revision) +
          " names=" + std::to_string(restored.stored.names.size()) +
          " load_ms=" + std::to_string((now - load->started_ns) / 1'000'000) + "\n";
  if (restored.stored.foreign_keys != 0) {
    std::string keys;
    for (const std::string& k : restored.stored.foreign_key_samples) keys += (keys.empty() ? "" : ",") + k;
    log_ += "ts_boot_ns=" + std::to_string(now) + " level=warn event=foreign_keys count=" +
            std::to_string(restored.stored.foreign_keys) + " keys=\"" + keys +
            "\" why=\"keys under names/ that are not names/<name-id>: not rows, skipped\"\n";
  }
  return now;
}

std::int64_t LockdDaemon::follow_leadership(std::int64_t now_ns) {
  Cluster& c = *cluster_;
  if (c.shard_leaders != nullptr) {
    if (const std::uint64_t v = c.shard_leaders->version(); v != c.shard_leaders_seen) {
      c.shard_leaders_seen = v;
      service_->set_shard_leaders(c.shard_leaders->leaders(), c.advertise);
    }
  }
  // Store threads of earlier services go once nothing of theirs is committing.
  std::erase_if(c.retired, [](const std::unique_ptr<StoreThread>& t) { return t->in_flight() == 0 || t->failed(); });
  if (c.leading != 0) {
    c.fence_ns = fence_of(c.leadership->view(), c.leading);
    if (service_->failed()) become_follower(now_ns, service_->failure(), false);
    else if (fenced(now_ns)) become_follower(now_ns, "the leadership lease was not renewed in time (fenced)", true);
    return now_ns;
  }
  const Leadership::View v = c.leadership->view();
  if (v.last_error != c.error_seen) {
    c.error_seen = v.last_error;
    if (!v.last_error.empty())
      log_ += "ts_boot_ns=" + std::to_string(now_ns) + " level=warn event=leadership_error why=\"" + v.last_error + "\"\n";
  }
  if (c.load != nullptr) {
    const std::int64_t now = finish_load(v, now_ns);
    if (c.leading != 0 || c.load != nullptr) return now;  // leading now, or still loading
  }
  if (may_take_over(v, c.refused, now_ns)) {
    start_load(v.revision, now_ns);
    return now_ns;
  }
  if (const std::string h = c.hint(v.leader); h != c.leader_seen) {
    c.leader_seen = h;
    service_->set_not_leader(h);
    log_ += "ts_boot_ns=" + std::to_string(now_ns) + " event=leader leader=" + (h.empty() ? "none" : h) + "\n";
  }
  return now_ns;
}

LockdDaemon::~LockdDaemon() {
  if (socket_.valid()) loop_.close_socket(socket_);
  // Let the store thread finish what it was handed, then log what became durable.
  if (store_ != nullptr) store_->drain();
  if (service_ != nullptr) {
    service_->tick(loop_.clock().now_ns());
    write_log();
  }
  service_.reset();
  store_.reset();
  // Last: a leader revokes its leadership lease so that another lockd takes over at once.
  cluster_.reset();
}

bool LockdDaemon::after_iteration() {
  std::int64_t now = loop_.turn_now_ns();
  // A leader built this turn was restored at a later clock reading (after its load): tick it there.
  if (cluster_ != nullptr) now = follow_leadership(now);
  const std::int64_t next = service_->tick(now);
  // A follower polls the leadership every turn, so it waits at most a tick.
  wait_ns_ = std::clamp<std::int64_t>(next - now, 0, kTickNs);
  // The answers this turn released (their changes now durable) leave before the log lines are
  // formatted and handed to the log's writer thread (a wake-up of it): not behind them.
  loop_.submit_queued();
  write_log();
  return cluster_ != nullptr || !service_->failed();
}

bool LockdDaemon::drain_for_shutdown() {
  if (store_ == nullptr) return true;  // a follower has nothing to make durable
  service_->begin_drain();
  for (;;) {
    service_->tick(loop_.clock().now_ns());
    write_log();
    if (service_->failed()) return false;
    if (service_->drained()) return true;
    store_->drain();
  }
}

void LockdDaemon::write_log() {
  service_->take_log(log_);
  if (log_.empty()) return;
  // Bounded and non-blocking (io/event_log.hpp over io/log_writer.hpp): a full stderr drops
  // lines, never answers.
  daemon_log().emit_lines(log_);
  log_.clear();
  service_->set_log_lines_dropped(daemon_log().dropped());
}

}  // namespace leasehold::lockd
