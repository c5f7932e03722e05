#include "leasehold/sim/cluster.hpp"

#include <algorithm>
#include <charconv>
#include <utility>

namespace leasehold::sim {
namespace {

constexpr std::uint16_t kReplicaPortBase = 2000;

lockd::LeadershipConfig leadership_config_of(const SimConfig& cfg, std::uint32_t index) {
  lockd::LeadershipConfig c;
  c.shard_prefix = "/leasehold/shards/0/";
  c.election_key = std::string(kSimElectionKey);
  c.advertise = replica_address(index);
  c.lease_s = cfg.leader_lease_s;
  // The bound on the rate error between a replica's clock and etcd's (true time): the world
  // draws every node's within timing.rho_ppb.
  c.clock_rate_bound = static_cast<double>(cfg.timing.rho_ppb) / 1e9;
  return c;
}

}  // namespace

std::string replica_address(std::uint32_t replica) {
  return "127.0.0.1:" + std::to_string(kReplicaPortBase + replica);
}

std::optional<std::uint32_t> replica_of(std::string_view address) {
  constexpr std::string_view kHost = "127.0.0.1:";
  if (address.substr(0, kHost.size()) != kHost) return std::nullopt;
  const std::string_view port = address.substr(kHost.size());
  std::uint32_t p = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (ec != std::errc{} || end != port.data() + port.size() || p < kReplicaPortBase) return std::nullopt;
  return p - kReplicaPortBase;
}

// ---- SimEtcd ------------------------------------------------------------------------------------

void SimEtcd::drop_lease(std::int64_t id) {
  bool deleted = false;
  for (auto it = kv_.begin(); it != kv_.end();) {
    if (it->second.lease == id) {
      it = kv_.erase(it);
      deleted = true;
    } else {
      ++it;
    }
  }
  if (deleted) ++revision_;
  leases_.erase(id);
}

void SimEtcd::expire() {
  const std::int64_t now = now_();
  for (auto it = leases_.begin(); it != leases_.end();) {
    const std::int64_t id = it->first;
    const bool gone = it->second.expiry_ns <= now;
    ++it;
    if (gone) {
      ++leases_expired_;
      drop_lease(id);
    }
  }
}

void SimEtcd::put(const std::string& key, const std::string& value, std::int64_t lease) {
  Kv& kv = kv_[key];
  if (kv.create_revision == 0) kv.create_revision = revision_;
  kv.mod_revision = revision_;
  kv.value = value;
  kv.lease = lease;
}

std::int64_t SimEtcd::election_revision() {
  expire();
  const auto it = kv_.find(std::string(kSimElectionKey));
  return it == kv_.end() ? 0 : it->second.create_revision;
}

std::string SimEtcd::election_value() {
  expire();
  const auto it = kv_.find(std::string(kSimElectionKey));
  return it == kv_.end() ? std::string() : it->second.value;
}

lockd::ElectionReply SimEtcd::handle(const lockd::ElectionCall& c) {
  using Kind = lockd::ElectionCall::Kind;
  expire();
  lockd::ElectionReply r;
  const auto read = [&](const std::string& key) {
    if (const auto it = kv_.find(key); it != kv_.end()) {
      r.found = true;
      r.value = it->second.value;
      r.create_revision = it->second.create_revision;
      r.mod_revision = it->second.mod_revision;
    }
  };
  switch (c.kind) {
    case Kind::lease_grant:
      r.lease_id = next_lease_++;
      leases_[r.lease_id] = Lease{c.ttl_s, now_() + c.ttl_s * kS};
      break;
    case Kind::keep_alive_open:
      break;
    case Kind::keep_alive:
      if (const auto it = leases_.find(c.lease_id); it != leases_.end()) it->second.expiry_ns = now_() + it->second.ttl_s * kS;
      else r.status = Status(Errc::not_found, "simulated etcd: no lease " + std::to_string(c.lease_id));
      break;
    case Kind::lease_revoke:
      if (leases_.count(c.lease_id) != 0) drop_lease(c.lease_id);
      else r.status = Status(Errc::not_found, "simulated etcd: no lease " + std::to_string(c.lease_id));
      break;
    case Kind::read_key:
      read(c.key);
      break;
    case Kind::campaign: {
      bool holds = kv_.count(c.key) == 0;
      for (const lockd::ElectionRecord& want : c.records) {
        const auto rec = kv_.find(want.key);
        holds = holds && (rec == kv_.end() ? 0 : rec->second.mod_revision) == want.mod_revision;
      }
      if (holds && c.lease_id != 0 && leases_.count(c.lease_id) == 0) {
        // etcd refuses a put on a lease it does not have (requested lease not found).
        r.status = Status(Errc::not_found, "simulated etcd: no lease " + std::to_string(c.lease_id));
        break;
      }
      if (holds) {
        ++revision_;  // one revision for every put of the transaction, as etcd's
        put(c.key, c.value, c.lease_id);
        for (const lockd::ElectionRecord& want : c.records)
          if (!want.value.empty()) put(want.key, want.value, 0);
        r.won = true;
        r.revision = kv_[c.key].create_revision;
      } else {
        read(c.key);
        r.revision = revision_;
      }
      break;
    }
    case Kind::write_record:
      if (const auto it = kv_.find(c.key); it != kv_.end() && it->second.create_revision == c.guard_revision) {
        ++revision_;
        put(c.records.at(0).key, c.records.at(0).value, 0);
      }
      break;
    case Kind::wait:
    case Kind::next_endpoint:
    case Kind::done:
      break;
  }
  return r;
}

// ---- LockdReplica -------------------------------------------------------------------------------

LockdReplica::LockdReplica(const SimConfig& cfg, const wire::WireKey& cluster_key, Env& env, SimEtcd& etcd,
                           std::uint32_t index, std::uint64_t instance, std::function<std::int64_t()> now)
    : cfg_(cfg), cluster_key_(cluster_key), env_(env), etcd_(etcd), index_(index), instance_(instance), now_(std::move(now)) {
  const std::int64_t t = now_();
  node_ = std::make_unique<LockdNode>(cfg_, cluster_key_, env_, lockd::RestoredTable{}, no_store_, t,
                                      (instance_ << 16) | ++services_);
  node_->set_not_leader({});
  core_ = std::make_unique<lockd::LeadershipCore>(
      leadership_config_of(cfg_, index_), now_, cfg_.seed ^ (instance_ * 0x9e3779b97f4a7c15ULL),
      [this] { interrupted_ = true; }, nullptr);
}

LockdReplica::~LockdReplica() = default;

bool LockdReplica::fenced(std::int64_t now_ns) const {
  if (leading_ == 0 || ablation_name() == "no-self-fence") return false;
  return now_ns >= fence_ns_;
}

void LockdReplica::become_follower(std::int64_t now_ns, bool fence) {
  if (leading_ != 0) {
    core_->step_down(leading_, fence ? lockd::StepDown::fenced : lockd::StepDown::failed);
    refused_ = leading_;
    leading_ = 0;
  }
  node_ = std::make_unique<LockdNode>(cfg_, cluster_key_, env_, lockd::RestoredTable{}, no_store_, now_ns,
                                      (instance_ << 16) | ++services_);
  store_.reset();  // the world keeps a batch in flight alive until it reaches etcd
  leader_seen_ = core_->view().leader == replica_address(index_) ? std::string() : core_->view().leader;
  node_->set_not_leader(leader_seen_);
}

void LockdReplica::on_datagram(std::span<const std::uint8_t> bytes, std::uint32_t from, std::int64_t now_ns) {
  // Self-fencing: a leader whose leadership lease may have run out serves nothing more.
  if (fenced(now_ns)) become_follower(now_ns, true);
  node_->on_datagram(bytes, from, now_ns);
}

void LockdReplica::load_done(std::int64_t revision, lockd::RestoredTable table) {
  if (loading_ != revision) return;
  loading_ = 0;
  const std::int64_t now = now_();
  node_->set_loading(false);
  // The election may have moved on (or its fence passed) while the table loaded.
  if (!lockd::load_still_leads(core_->view(), revision, now)) return;
  // The incarnation is the election's revision, as EtcdStore::incarnation().
  table.incarnation = static_cast<std::uint64_t>(revision);
  const std::int64_t rev = revision;
  SimEtcd* etcd = &etcd_;
  const bool guarded = ablation_name() != "unguarded-writes";
  store_ = std::make_shared<SimDisk>(etcd_.table(), [etcd, rev, guarded] { return !guarded || etcd->election_revision() == rev; });
  store_->on_submit([this] { env_.store_submitted(index_); });
  node_ = std::make_unique<LockdNode>(cfg_, cluster_key_, env_, std::move(table), *store_, now,
                                      (instance_ << 16) | ++services_);
  leading_ = revision;
  fence_ns_ = lockd::fence_of(core_->view(), revision);
  ++takeovers_;
}

void LockdReplica::load_failed(std::int64_t revision) {
  if (loading_ != revision) return;
  loading_ = 0;
  node_->set_loading(false);
  refused_ = revision;
  core_->step_down(revision, lockd::StepDown::failed);
}

void LockdReplica::follow(std::int64_t now_ns) {
  if (leading_ != 0) {
    fence_ns_ = lockd::fence_of(core_->view(), leading_);
    if (node_->failed()) become_follower(now_ns, false);
    else if (fenced(now_ns)) become_follower(now_ns, true);
    return;
  }
  if (loading_ != 0) return;
  const lockd::LeadershipView v = core_->view();
  if (lockd::may_take_over(v, refused_, now_ns)) {
    loading_ = v.revision;
    node_->set_loading(true);
    leader_seen_.clear();
    node_->set_not_leader({});
    env_.load_table(index_, v.revision);
    return;
  }
  if (const std::string h = v.leader == replica_address(index_) ? std::string() : v.leader; h != leader_seen_) {
    leader_seen_ = h;
    node_->set_not_leader(h);
  }
}

std::int64_t LockdReplica::tick(std::int64_t now_ns) {
  follow(now_ns);
  const std::int64_t next = node_->tick(now_ns);
  // A follower polls the election every turn, so it waits at most a tick (the daemon's kTickNs).
  return std::min(next, now_ns + 10 * kMs);
}

}  // namespace leasehold::sim
