#include "leasehold/sim/lockd_node.hpp"

#include "leasehold/io/ports.hpp"
#include "leasehold/lockd/config.hpp"
#include "leasehold/lockd/durability.hpp"
#include "leasehold/lockd/service.hpp"
#include "leasehold/wire/protocol.hpp"

#include <algorithm>
#include <string>
#include <map>
#include <vector>

namespace leasehold::sim {
namespace {

constexpr std::uint16_t kWorkerPortBase = 1000;

lockd::LockdConfig lockd_config_of(const SimConfig& cfg) {
  lockd::LockdConfig c;
  c.store_path = "simulated";
  c.ttl_ms = static_cast<std::uint64_t>(cfg.timing.ttl_ns / kMs);
  c.acquiring_ttl_ms = static_cast<std::uint64_t>(cfg.timing.ttl_ns / kMs);
  c.lock_delay_ms = static_cast<std::uint64_t>(cfg.lock_delay_ns / kMs);
  c.max_names = 1024;
  c.max_workers = 64;
  // The no-authz ablation: lockd lets any worker key act on any name (lockd's own
  // LEASEHOLD_ABLATE=no-authz switch); the hostile worker's forgeries must then be caught.
  c.ablate_authz = ablation_name() == "no-authz";
  // The transfer-unguarded ablation (LEASEHOLD_ABLATE=transfer-unguarded): a transfer completes
  // as soon as asked, while the old holder may still run; the operator's transfers must catch it.
  c.ablate_transfer_guard = ablation_name() == "transfer-unguarded";
  if (cfg.preemptible()) {
    c.mode = LockMode::preemptible;
    if (cfg.worker_ttl_ns != 0) c.worker_ttl_ms = static_cast<std::uint64_t>(cfg.worker_ttl_ns / kMs);
  }
  return c;
}

/// lockd's datagram port in the world: the destination's port is the worker's index.
class SimNet final : public DatagramPort {
 public:
  explicit SimNet(LockdEnv& env) : env_(env) {}
  bool send(const SocketAddress& to, std::span<const std::uint8_t> bytes) override {
    const std::uint16_t port = to.port();
    if (port < kWorkerPortBase) return false;
    env_.send_to_worker(static_cast<std::uint32_t>(port - kWorkerPortBase), bytes);
    return true;
  }

 private:
  LockdEnv& env_;
};

}  // namespace

SocketAddress worker_address(std::uint32_t worker) {
  return SocketAddress::loopback_v4(static_cast<std::uint16_t>(kWorkerPortBase + worker));
}

// ---- SimDisk ------------------------------------------------------------------------------------

void DurableTable::apply(const lockd::DurableBatch& b) {
  for (const lockd::StoredName& n : b.changes) {
    lockd::StoredName& row = rows_[n.id];
    if (row.epoch > n.epoch && regression_.empty())
      regression_ = "name " + n.id.str() + ": a write put its row back from epoch " + std::to_string(row.epoch) + " to " +
                    std::to_string(n.epoch);
    row = n;
  }
  epoch_high_water_ = std::max(epoch_high_water_, b.epoch_high_water);
  if (b.marks.lived_ns >= 0) lived_[b.marks.incarnation] = b.marks.lived_ns;
  for (const std::uint64_t j : b.marks.drop_lived)
    if (j != b.marks.incarnation) lived_.erase(j);
  for (const WorkerId& w : b.marks.seen) seen_[w] = b.marks.incarnation;
  for (const auto& [w, seq] : b.marks.replay_floor) replay_floor_[w] = std::max(replay_floor_[w], seq);
}

lockd::RestoredTable DurableTable::open() {
  lockd::RestoredTable r;
  for (const auto& [id, n] : rows_) r.stored.names.push_back(n);
  r.stored.epoch_high_water = epoch_high_water_;
  r.stored.lived_ns = lived_;
  r.stored.seen = seen_;
  r.stored.replay_floor = replay_floor_;
  r.incarnation = ++opens_;
  return r;
}

bool SimDisk::submit(lockd::DurableBatch&& b) {
  if (in_flight_) return false;
  in_flight_ = std::move(b);
  if (on_submit_) on_submit_();
  return true;
}

void SimDisk::poll(std::vector<lockd::DurabilityVerdict>& out) {
  out.insert(out.end(), ready_.begin(), ready_.end());
  ready_.clear();
}

bool SimDisk::complete() {
  if (!in_flight_) return true;
  const lockd::DurableBatch& b = *in_flight_;
  const bool accepted = !guard_ || guard_();
  if (accepted) table_.apply(b);
  for (std::uint64_t s = b.first_seq; s <= b.last_seq && s != 0; ++s)
    ready_.push_back(accepted ? lockd::DurabilityVerdict{s, lockd::DurabilityVerdict::Kind::durable, {}}
                              : lockd::DurabilityVerdict{s, lockd::DurabilityVerdict::Kind::rejected,
                                                         "simulated etcd: the election key is no longer this leader's"});
  in_flight_.reset();
  return accepted;
}

void SimDisk::write_unanswered() {
  if (in_flight_ && (!guard_ || guard_())) table_.apply(*in_flight_);
}

void SimDisk::fail() {
  if (!in_flight_) return;
  const lockd::DurableBatch& b = *in_flight_;
  for (std::uint64_t s = b.first_seq; s <= b.last_seq && s != 0; ++s)
    ready_.push_back(lockd::DurabilityVerdict{s, lockd::DurabilityVerdict::Kind::failed, "simulated disk failure"});
  in_flight_.reset();
}

bool SimDisk::crash() {
  const bool lost = in_flight_.has_value();
  in_flight_.reset();
  ready_.clear();
  return lost;
}

// ---- LockdNode ----------------------------------------------------------------------------------

struct LockdNode::Impl {
  Impl(const SimConfig& c, const wire::WireKey& cluster, LockdEnv& e, lockd::RestoredTable r,
       lockd::DurabilityPort& store, std::int64_t now, std::uint64_t instance)
      : env(e),
        last_now_ns(now),
        restored(std::move(r)),
        net(e),
        service(lockd_config_of(c), std::vector<wire::WireKey>{cluster}, restored, net, store, now,
                lockd::ServiceSeeds{WorkerId{0x10cd, instance}, 1,
                                    // The wall clock of grant tokens' issued_at: lockd's own
                                    // simulated clock on a fixed base, never the host's.
                                    [this] { return kWallBaseNs + last_now_ns; }}) {}
  static constexpr std::int64_t kWallBaseNs = 1'700'000'000 * kS;
  LockdEnv& env;
  std::int64_t last_now_ns = 0;
  lockd::RestoredTable restored;
  SimNet net;
  lockd::LockService service;
  std::string log;
  WaiterCounts seen;  ///< the service's waiter counters as last reported

  /// Reports what the step changed in the waiter counters; `datagram` is the one the step
  /// handled (empty for a tick), which names the grants' occasion.
  void count_waiters(std::span<const std::uint8_t> datagram) {
    const lockd::ServiceCounters& c = service.counters();
    WaiterCounts d;
    d.queued = c.waits_queued - seen.queued;
    d.granted = c.waiters_granted - seen.granted;
    d.lapsed = c.waiters_lapsed - seen.lapsed;
    if (!d.any()) return;
    seen.queued = c.waits_queued;
    seen.granted = c.waiters_granted;
    seen.lapsed = c.waiters_lapsed;
    wire::Header h;
    if (d.granted != 0 && !datagram.empty() && wire::decode_header(datagram, nullptr, h) == wire::DecodeError::none) {
      if (h.type == wire::MessageType::release) d.granted_on_release = d.granted;
      if (h.type == wire::MessageType::kill_confirmed) d.granted_on_kill_confirmed = d.granted;
    }
    env.waiters_counted(d);
  }
};

LockdNode::LockdNode(const SimConfig& cfg, const wire::WireKey& cluster_key, LockdEnv& env, SimDisk& disk,
                     std::int64_t now_ns) {
  lockd::RestoredTable r = disk.open();
  const std::uint64_t incarnation = r.incarnation;
  impl_ = std::make_unique<Impl>(cfg, cluster_key, env, std::move(r), disk, now_ns, incarnation);
}

LockdNode::LockdNode(const SimConfig& cfg, const wire::WireKey& cluster_key, LockdEnv& env,
                     lockd::RestoredTable restored, lockd::DurabilityPort& store, std::int64_t now_ns,
                     std::uint64_t instance)
    : impl_(std::make_unique<Impl>(cfg, cluster_key, env, std::move(restored), store, now_ns, instance)) {}

void LockdNode::set_not_leader(const std::string& hint) { impl_->service.set_not_leader(hint); }

void LockdNode::set_loading(bool loading) { impl_->service.set_loading(loading); }

LockdNode::~LockdNode() = default;

const LeaseTable& LockdNode::table() const noexcept { return impl_->service.table(); }

bool LockdNode::failed() const noexcept { return impl_->service.failed(); }

void LockdNode::on_datagram(std::span<const std::uint8_t> bytes, std::uint32_t from, std::int64_t now_ns) {
  impl_->last_now_ns = now_ns;
  impl_->service.on_datagram(bytes, worker_address(from), now_ns);
  impl_->count_waiters(bytes);
}

std::int64_t LockdNode::tick(std::int64_t now_ns) {
  impl_->last_now_ns = now_ns;
  const std::int64_t next = impl_->service.tick(now_ns);
  impl_->log.clear();
  impl_->service.take_log(impl_->log);  // the change log (production: stderr); not kept
  impl_->count_waiters({});
  // A failed store (SimDisk::fail) stops lockd; the world then restarts it like a crashed one.
  return impl_->service.failed() ? now_ns + kS : std::max(next, now_ns + 1);
}

}  // namespace leasehold::sim
