#include "leasehold/sim/world.hpp"

#include "leasehold/wire/auth.hpp"
#include "leasehold/wire/protocol.hpp"
#include "leasehold/wire/replay.hpp"
#include "leasehold/lease/assert.hpp"
#include "leasehold/lease/fence.hpp"
#include "leasehold/sim/disk.hpp"
#include "leasehold/sim/invariants.hpp"
#include "leasehold/lockd/etcd_store.hpp"
#include "leasehold/sim/cluster.hpp"
#include "leasehold/sim/lockd_node.hpp"
#include "leasehold/sim/rng.hpp"
#include "leasehold/sim/supervisor_node.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <limits>
#include <map>
#include <deque>
#include <memory>
#include <optional>
#include <queue>
#include <set>
#include <stdexcept>
#include <unordered_map>
#include <utility>
#include <vector>

namespace leasehold::sim {

std::int64_t SimConfig::safety_margin_ns() const noexcept { return timing::check_safety(timing).margin_ns; }

SimConfig with_drawn_timing(SimConfig cfg) {
  if (cfg.leader_lease_s == 0) {
    Rng l(cfg.seed ^ 0x1ea5e1ea5e1ea5e1ULL);
    cfg.leader_lease_s = cfg.faults && cfg.draw_timing && l.chance(0.5) ? 2 : 1;
  }
  if (!cfg.faults || !cfg.draw_timing) return cfg;
  // The inequality's other terms first (their own stream): the lease TTL up to twice the
  // configured one (whole ms, as lockd takes it), the clock-rate bound up to 5x, the wheel's
  // granularity up to 10x. Each stays safe at the configured kill_after (validate() checks the
  // configured values; a larger TTL only adds margin, and at the defaults the worst rate and
  // granularity leave 131 ms).
  const timing::Inputs configured = cfg.timing;
  Rng t(cfg.seed ^ 0x5eed7e3a5eed7e3aULL);
  cfg.timing.ttl_ns = t.range(cfg.timing.ttl_ns / kMs, 2 * cfg.timing.ttl_ns / kMs) * kMs;
  cfg.timing.rho_ppb = t.range(0, 5 * cfg.timing.rho_ppb);
  cfg.timing.wheel_granularity_ns = t.range(cfg.timing.wheel_granularity_ns, 10 * cfg.timing.wheel_granularity_ns);
  // Not safe with the configured kill_after at these draws (a configuration already near its
  // limit): the configured terms stay.
  if (timing::check_safety(cfg.timing).margin_ns < kMs) cfg.timing = configured;
  timing::Inputs in = cfg.timing;
  std::int64_t lo = cfg.timing.kill_after_ns;
  std::int64_t hi = cfg.timing.ttl_ns;
  while (lo < hi) {  // the largest kill_after with margin >= 1 ms
    in.kill_after_ns = lo + (hi - lo + 1) / 2;
    if (timing::check_safety(in).margin_ns >= kMs) lo = in.kill_after_ns;
    else hi = in.kill_after_ns - 1;
  }
  Rng r(cfg.seed ^ 0x7133a61e7133a61eULL);
  // Whole ms, as the supervisor takes it (--kill-after-ms), rounded toward safety.
  cfg.timing.kill_after_ns = r.range(cfg.timing.kill_after_ns / kMs, lo / kMs) * kMs;
  Rng d(cfg.seed ^ 0x10cdde1a10cdde1aULL);  // lock-delay: its own stream as well
  if (d.chance(0.5)) cfg.lock_delay_ns = d.range(1, cfg.timing.ttl_ns / kMs) * kMs;
  return cfg;
}


bool SimConfig::preemptible() const noexcept {
  if (preemptible_share >= 1) return true;
  if (preemptible_share <= 0) return false;
  Rng r(seed ^ 0x9e3779b97f4a7c15ULL);  // its own stream: the other draws do not move with the share
  return r.chance(preemptible_share);
}

bool SimConfig::queues() const noexcept {
  if (queue_share >= 1) return true;
  if (queue_share <= 0) return false;
  Rng r(seed ^ 0x9a3e5e9a3e5e9a3eULL);  // its own stream: the other draws do not move with the share
  return r.chance(queue_share);
}

Status SimConfig::validate() const {
  if (supervisors == 0 || supervisors > 64) return Status::invalid("supervisors must be in 1..64, not " + std::to_string(supervisors));
  if (names == 0 || names > 64) return Status::invalid("names must be in 1..64, not " + std::to_string(names));
  if (sandboxes_per_worker_max == 0 || sandboxes_per_worker_max > 16)
    return Status::invalid("sandboxes_per_worker_max must be in 1..16, not " + std::to_string(sandboxes_per_worker_max));
  if (duration_ns <= 0 || heal_ns < 0 || heal_ns > duration_ns)
    return Status::invalid("need 0 <= heal_ns <= duration_ns and duration_ns > 0 (heal " + std::to_string(heal_ns) +
           " ns, duration " + std::to_string(duration_ns) + " ns)");
  if (timing.ttl_ns < 10 * kMs || timing.kill_after_ns <= 0 || heartbeat_interval_ns <= 0 || retry_interval_ns <= 0 ||
      timing.wheel_granularity_ns <= 0 || timing.kill_latency_budget_ns < 0 || sandbox_tick_ns <= 0 || write_interval_ns <= 0)
    return Status::invalid("durations must be > 0 (ttl at least 10 ms)");
  if (lockd_replicas == 0 || lockd_replicas > 5)
    return Status::invalid("lockd_replicas must be in 1..5, not " + std::to_string(lockd_replicas));
  if (leader_lease_s < 0 || leader_lease_s > 10)
    return Status::invalid("leader_lease_s must be in 0 (drawn) ..10, not " + std::to_string(leader_lease_s));
  if (!(preemptible_share >= 0 && preemptible_share <= 1))
    return Status::invalid("preemptible_share must be in 0..1, not " + std::to_string(preemptible_share));
  if (waiting_runs_per_worker_max > 16)
    return Status::invalid("waiting_runs_per_worker_max must be in 0..16, not " + std::to_string(waiting_runs_per_worker_max));
  if (!(queue_share >= 0 && queue_share <= 1) || !(queued_run_share >= 0 && queued_run_share <= 1))
    return Status::invalid("queue_share and queued_run_share must be in 0..1, not " + std::to_string(queue_share) + " and " +
                           std::to_string(queued_run_share));
  if (lock_delay_ns < 0 || lock_delay_ns % kMs != 0)
    return Status::invalid("lock_delay_ns must be a whole number of ms >= 0, not " + std::to_string(lock_delay_ns));
  if (worker_ttl_ns != 0 && worker_ttl_ns < timing.ttl_ns)
    return Status::invalid("worker_ttl_ns " + std::to_string(worker_ttl_ns / kMs) + " ms must be 0 (= ttl) or at least ttl " +
           std::to_string(timing.ttl_ns / kMs) + " ms: the supervisor refuses a shorter worker-liveness TTL");
  if (heartbeat_interval_ns >= timing.kill_after_ns)
    return Status::invalid("heartbeat interval " + std::to_string(heartbeat_interval_ns / kMs) + " ms must be below kill_after " +
           std::to_string(timing.kill_after_ns / kMs) + " ms");
  if (!timing::check_safety(timing).safe)
    return Status::invalid("the safety condition kill_after*(1+rho) + wheel_granularity + kill_latency_budget < ttl*(1-rho) fails: " +
           std::to_string(timing.kill_after_ns / kMs) + " ms, rho " + std::to_string(timing.rho_ppb / 1000) + " ppm, ttl " +
           std::to_string(timing.ttl_ns / kMs) + " ms");
  return Status{};
}

namespace {

constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max();
constexpr int kWorldNode = -1;  ///< events of the world itself (sandbox processes, faults): never paused
constexpr int kLockd = 0;       ///< node 0 is lockd; node 1 + w is worker w's supervisor

/// A node's clock: local(t) = base + t + t * ppm / 1e6 (a rate error of ppm parts per million).
struct NodeClock {
  std::int64_t base_ns = 0;
  std::int64_t ppm = 0;
  /// t * ppm / 1e6 is taken without a 128-bit division (it ran for every sandbox at every step):
  /// with t = q·1e6 + r (t >= 0), t·ppm = q·ppm·1e6 + r·ppm, two terms of one sign, so its
  /// quotient truncated toward zero is q·ppm plus r·ppm / 1e6 truncated the same way.
  std::int64_t local(std::int64_t t) const noexcept {
    LEASEHOLD_ASSERT(t >= 0);
    return base_ns + t + (t / 1'000'000) * ppm + (t % 1'000'000) * ppm / 1'000'000;
  }
  /// The first true time at which local() reaches `l`.
  std::int64_t true_at(std::int64_t l) const noexcept {
    if (l <= base_ns) return 0;
    std::int64_t t = static_cast<std::int64_t>(static_cast<__int128>(l - base_ns) * 1'000'000 / (1'000'000 + ppm));
    while (local(t) < l) ++t;
    while (t > 0 && local(t - 1) >= l) --t;
    return t;
  }
};

/// One direction of one path: worker w -> lockd or lockd -> worker w.
struct Path {
  std::int64_t base_delay_ns = 0;
  std::int64_t jitter_ns = 0;   ///< delay = base + U(0,j) * U(0,j) / j (skewed to small)
  double loss = 0;
  double duplicate = 0;
  double tail = 0;              ///< probability of a long delay (reorders, outlives a TTL share)
  std::int64_t tail_max_ns = 0;
  std::uint64_t sent = 0;
  std::uint64_t highest_delivered = 0;
  // An attacker on the path: it replays a datagram it captured earlier (of the last
  // kCapturedMax on this path), or delivers a copy with one byte changed. Both must be inert.
  double replay = 0;
  double tamper = 0;
  std::deque<std::shared_ptr<const std::vector<std::uint8_t>>> captured;
};
constexpr std::size_t kCapturedMax = 256;

struct Partition {
  std::uint32_t worker = 0;
  bool to_lockd = true;    ///< datagrams worker -> lockd are dropped
  bool from_lockd = true;  ///< datagrams lockd -> worker are dropped
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
};

/// A congested direction of one worker's link: every datagram on it takes `extra_ns` longer.
struct Congestion {
  std::uint32_t worker = 0;
  bool to_lockd = false;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  std::int64_t extra_ns = 0;
};

struct Pause {
  int node = 0;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  bool over_budget = false;
};

struct Sandbox {
  std::uint32_t worker = 0;
  NameId name;
  Epoch epoch = 0;
  SandboxFate fate;
  bool dying = false;
};

struct Event {
  std::int64_t at_ns;
  std::uint64_t seq;
  int node;
  std::function<void()> fn;
};
struct Later {
  bool operator()(const Event& a, const Event& b) const noexcept {
    return a.at_ns != b.at_ns ? a.at_ns > b.at_ns : a.seq > b.seq;
  }
};

std::string short_id(std::uint64_t lo) {
  char b[17];
  std::snprintf(b, sizeof b, "%08" PRIx64, lo & 0xffffffffu);
  return b;
}

class World final : public SupervisorEnv, public LockdReplica::Env {
 public:
  World(const SimConfig& cfg, const TraceFn& trace) : cfg_(with_drawn_timing(cfg)), trace_(trace), rng_(cfg.seed) {
    Rng setup = rng_.fork(1);
    net_rng_ = rng_.fork(2);
    proc_rng_ = rng_.fork(3);
    std::vector<std::uint8_t> key(32);
    for (auto& b : key) b = static_cast<std::uint8_t>(setup.next());
    cluster_ = wire::WireKey(key, wire::KeyKind::cluster, 1);
    for (std::uint32_t i = 0; i < cfg_.names; ++i) names_.push_back("sim/name-" + std::to_string(i));
    for (const auto& n : names_) {
      name_ids_.push_back(name_id_of(n));
      first_grant_after_heal_[name_ids_.back()] = -1;
    }

    const std::uint32_t n_nodes = cfg_.supervisors + cfg_.lockd_replicas;
    clocks_.resize(n_nodes);
    paused_until_.assign(n_nodes, 0);
    last_step_pause_end_.assign(n_nodes, 0);
    // Intra-step pauses draw from their own stream, so the other draws of a seed do not move.
    step_pause_rng_ = Rng(cfg_.seed ^ 0x57e9a05e57e9a05eULL);
    wake_at_.assign(n_nodes, kNever);
    wake_gen_.assign(n_nodes, 0);
    for (auto& c : clocks_) {
      c.base_ns = setup.range(1 * kS, 1000 * kS);
      c.ppm = cfg_.faults ? setup.range(-cfg_.timing.rho_ppb / 1000, cfg_.timing.rho_ppb / 1000) : 0;
      if (c.ppm != 0) ++counts_.skewed_clocks;
    }
    up_.resize(cfg_.supervisors + 1);  // the last path: the hostile worker's
    down_.resize(cfg_.supervisors + 1);
    for (std::uint32_t w = 0; w <= cfg_.supervisors; ++w) {
      draw_path(setup, up_[w]);
      draw_path(setup, down_[w]);
    }
    // The on-path attacker draws from its own stream, so the other draws of a seed do not move.
    attack_rng_ = Rng(cfg_.seed ^ 0x0a77ac4e0a77ac4eULL);
    if (cfg_.faults && attack_rng_.chance(0.5))
      for (std::uint32_t w = 0; w <= cfg_.supervisors; ++w)
        for (Path* p : {&up_[w], &down_[w]}) {
          p->replay = static_cast<double>(attack_rng_.range(0, 200)) / 10'000.0;  // 0..2 %
          p->tamper = static_cast<double>(attack_rng_.range(0, 100)) / 10'000.0;  // 0..1 %
        }
    disk_base_ns_ = setup.range(200'000, 3 * kMs);
    disk_slow_ = cfg_.faults ? static_cast<double>(setup.range(0, 300)) / 10'000.0 : 0;
    // Disk failures draw from their own stream, so the other draws of a seed do not move.
    disk_fail_rng_ = Rng(cfg_.seed ^ 0xd15cfa11d15cfa11ULL);
    crash_rng_ = Rng(cfg_.seed ^ 0xc7a5ec7a5ec7a5e1ULL);  // crashes at a batch: their own stream too
    disk_fail_ = cfg_.faults && disk_fail_rng_.chance(0.5) ? static_cast<double>(disk_fail_rng_.range(1, 40)) / 10'000.0 : 0;
    // A killed sandbox dies within the kill-latency budget, at worst at its end.
    kill_ticks_max_ = std::max<std::int64_t>(0, cfg_.timing.kill_latency_budget_ns / cfg_.sandbox_tick_ns);

    if (replicated()) {
      etcd_ = std::make_unique<SimEtcd>([this] { return now_; });
      replicas_.resize(cfg_.lockd_replicas);
      replica_inc_.assign(cfg_.lockd_replicas, 0);
      call_seq_.assign(cfg_.lockd_replicas, 0);
      target_.assign(cfg_.supervisors + 1, 0);
      etcd_rng_ = Rng(cfg_.seed ^ 0xe7cde7cde7cde7cdULL);
      for (std::uint32_t k = 0; k < cfg_.lockd_replicas; ++k) {
        EtcdPath e;
        e.base_delay_ns = etcd_rng_.range(100'000, 3 * kMs);
        e.jitter_ns = etcd_rng_.range(100'000, 5 * kMs);
        if (cfg_.faults) {
          e.loss = static_cast<double>(etcd_rng_.range(0, 300)) / 10'000.0;  // 0..3 %
          e.tail = static_cast<double>(etcd_rng_.range(0, 200)) / 10'000.0;  // 0..2 %
        }
        etcd_paths_.push_back(e);
      }
      for (std::uint32_t k = 0; k < cfg_.lockd_replicas; ++k) start_replica(k);
    } else {
      disk_.on_submit([this] { disk_submitted(); });
      lockd_ = std::make_unique<LockdNode>(cfg_, cluster_, *this, disk_, local(kLockd));
    }
    for (std::uint32_t w = 0; w < cfg_.supervisors; ++w) {
      const WorkerId id{0x5000 + w, setup.next()};
      worker_ids_.push_back(id);
      sups_.push_back(std::make_unique<SupervisorNode>(cfg_, w, id, wire::derive_worker_key(cluster_, id), names_,
                                                       rng_.fork(100 + w), *this, local(1 + static_cast<int>(w))));
    }
    if (cfg_.hostile_worker) {
      const WorkerId id{0x4057, setup.next()};
      hostile_id_ = id;
      hostile_ = std::make_unique<wire::Sender>(id, 1, wire::derive_worker_key(cluster_, id));
      hostile_rng_ = rng_.fork(99);
      // Its forgeries draw from their own stream: the heartbeats' draws stay as they were.
      forge_rng_ = Rng(cfg_.seed ^ 0xf0a9ef0a9ef0a9e5ULL);
      push(hostile_rng_.range(0, 100 * kMs), kWorldNode, [this] { hostile_heartbeat(); });
    }
    // An operator (half the seeds, its own stream) revokes names now and then with the cluster
    // key, as an admin would: legitimate revocations, which the supervisors must carry out and
    // lockd must guard until the kill is confirmed or its bound passes.
    operator_rng_ = Rng(cfg_.seed ^ 0x0e7a70e70e7a70e7ULL);
    if (cfg_.faults && operator_rng_.chance(0.5)) {
      operator_ = std::make_unique<wire::Sender>(WorkerId{0x0e7a, operator_rng_.next()}, 1, operator_key());
      push(operator_rng_.range(2 * kS, 10 * kS), kWorldNode, [this] { operator_revoke(); });
    }
    // The operator also transfers held names gracefully (half the seeds, a stream of its own), as
    // `leasehold transfer NAME --to SANDBOX --to-worker W` does: an unnamed sandbox started on a
    // worker, TransferBegin, TransferComplete polled until lockd's transfer guard lifts, then
    // `leasehold name SANDBOX NAME` on that worker.
    transfer_rng_ = Rng(cfg_.seed ^ 0x7a4f5e47a4f5e4f1ULL);
    if (cfg_.faults && transfer_rng_.chance(0.5)) {
      if (!operator_) operator_ = std::make_unique<wire::Sender>(WorkerId{0x0e7a, transfer_rng_.next()}, 1, operator_key());
      operator_auth_ = std::make_unique<wire::Authenticator>(operator_key());
      push(transfer_rng_.range(3 * kS, 10 * kS), kWorldNode, [this] { operator_transfer(); });
    }
    if (cfg_.preemptible()) ++counts_.preemptible_runs;
    if (cfg_.queues()) ++counts_.queueing_runs;
    // The seed's drawn timing (with_drawn_timing), first in the trace.
    record(kWorldNode, "ttl_ms", 0, static_cast<std::uint64_t>(cfg_.timing.ttl_ns / kMs));
    record(kWorldNode, "rho_ppm", 0, static_cast<std::uint64_t>(cfg_.timing.rho_ppb / 1000));
    record(kWorldNode, "wheel_granularity_us", 0, static_cast<std::uint64_t>(cfg_.timing.wheel_granularity_ns / 1000));
    record(kWorldNode, "kill_after_ms", 0, static_cast<std::uint64_t>(cfg_.timing.kill_after_ns / kMs));
    record(kWorldNode, "safety_margin_us", 0, static_cast<std::uint64_t>(cfg_.safety_margin_ns() / 1000));
    record(kWorldNode, "lock_delay_ms", 0, static_cast<std::uint64_t>(cfg_.lock_delay_ns / kMs));
    if (replicated()) record(kWorldNode, "leader_lease_s", 0, static_cast<std::uint64_t>(cfg_.leader_lease_s));
    if (cfg_.faults) plan_faults(setup);
    if (replicated() && cfg_.faults) plan_cluster_faults();
    for (int n = 0; n < static_cast<int>(n_nodes); ++n) tick_node(n);
  }

  RunResult run() {
    while (!queue_.empty() && !violation_) {
      if (queue_.top().at_ns > cfg_.duration_ns) break;
      // Moved out, not copied (a copy of its closure is an allocation per event): the heap orders
      // by at_ns and seq, which the move leaves in place for the pop.
      Event ev = std::move(const_cast<Event&>(queue_.top()));
      queue_.pop();
      if (ev.node >= 0 && ev.at_ns < paused_until_[static_cast<std::size_t>(ev.node)]) {
        // The node is frozen: its event waits until it resumes (its clock keeps counting).
        ++counts_.events_deferred_by_pause;
        push(paused_until_[static_cast<std::size_t>(ev.node)], ev.node, std::move(ev.fn));
        continue;
      }
      now_ = ev.at_ns;
      ++events_;
      ev.fn();
      if (!violation_) check_single_holder();
    }
    if (!violation_) {
      now_ = std::max(now_, cfg_.duration_ns);
      for (const NameId& id : name_ids_)
        if (auto v = inv_.free_name_acquired(id, first_grant_after_heal_[id], cfg_.heal_ns, cfg_.liveness_bound_ns, now_))
          fail(*v);
    }
    for (const auto& s : sups_) {
      const SupervisorNode::QueuedRuns q = s->queued_runs();
      counts_.queued_runs += q.queued;
      counts_.queued_runs_granted += q.granted;
      counts_.queued_runs_timed_out += q.timed_out;
    }
    RunResult r;
    r.seed = cfg_.seed;
    r.violation = violation_;
    r.trace_hash = hash_;
    r.events = events_;
    r.simulated_ns = now_;
    r.counts = counts_;
    return r;
  }

  // ---- SupervisorEnv -------------------------------------------------------------------------
  void send_to_lockd(std::uint32_t worker, std::span<const std::uint8_t> bytes) override {
    transmit(up_[worker], worker, true, bytes);
  }
  void redirect(std::uint32_t worker, std::string_view leader) override {
    if (!replicated()) return;
    const std::optional<std::uint32_t> k = replica_of(leader);
    target_[worker] = k && *k < cfg_.lockd_replicas ? *k : (target_[worker] + 1) % cfg_.lockd_replicas;
    record(1 + static_cast<int>(worker), "redirect", target_[worker], leader.empty() ? 0 : 1);
  }
  void spawn(std::uint32_t worker, SandboxId sb, NameId name, Epoch epoch) override {
    Sandbox s;
    s.worker = worker;
    s.name = name;
    s.epoch = epoch;
    s.fate.known = true;
    Sandbox& added = sandboxes_[sb] = s;
    running_[sb] = &added;
    ++counts_.sandboxes_started;
    std::int64_t life = proc_rng_.range(500 * kMs, 8 * kS);
    if (proc_rng_.chance(0.1)) life = proc_rng_.range(8 * kS, cfg_.sandbox_lifetime_max_ns);
    const std::int64_t start = now_ + effects_delay_ns_;  // it starts after a step pause
    push(start + life, kWorldNode, [this, sb] { sandbox_exit(sb, false); });
    push(start + proc_rng_.range(0, cfg_.write_interval_ns), kWorldNode, [this, sb] { sandbox_write(sb); });
    record(1 + static_cast<int>(worker), "spawn", sb.lo, epoch);
  }
  void kill(std::uint32_t worker, SandboxId sb, std::string_view why) override {
    const auto it = sandboxes_.find(sb);
    if (it == sandboxes_.end() || it->second.fate.exited || it->second.fate.killed) return;
    it->second.fate.killed = true;
    it->second.fate.killed_at_ns = now_ + effects_delay_ns_;  // the kill lands after a step pause
    ++counts_.kills;
    const std::int64_t k = proc_rng_.range(0, kill_ticks_max_);
    push(now_ + effects_delay_ns_ + k * cfg_.sandbox_tick_ns, kWorldNode, [this, sb] { sandbox_exit(sb, true); });
    record(1 + static_cast<int>(worker), why, sb.lo, static_cast<std::uint64_t>(k));
  }
  void terminate(std::uint32_t worker, SandboxId sb) override {
    // Half of the simulated commands handle SIGTERM and exit within 0..3 s (before or after a
    // grace deadline); the others ignore it and are killed at the deadline.
    const auto it = sandboxes_.find(sb);
    if (it == sandboxes_.end() || it->second.fate.exited || it->second.fate.killed) return;
    record(1 + static_cast<int>(worker), "sigterm", sb.lo, 0);
    if (!proc_rng_.chance(0.5)) return;
    push(now_ + effects_delay_ns_ + proc_rng_.range(0, 3 * kS), kWorldNode, [this, sb] { sandbox_exit(sb, false); });
  }
  void note(std::uint32_t worker, std::string_view what, std::uint64_t a, std::uint64_t b) override {
    if (what == "refused_lock_delay") ++counts_.lock_delay_refusals;
    if (what == "client_closed") ++counts_.queued_clients_closed;
    record(1 + static_cast<int>(worker), what, a, b);
  }

  // ---- LockdEnv ------------------------------------------------------------------------------
  void send_to_worker(std::uint32_t worker, std::span<const std::uint8_t> bytes) override {
    observe_lockd_answer(bytes);
    transmit(down_[worker], worker, false, bytes);
  }
  void waiters_counted(const WaiterCounts& d) override {
    counts_.waiters_queued += d.queued;
    counts_.waiters_granted += d.granted;
    counts_.waiters_granted_on_release += d.granted_on_release;
    counts_.waiters_granted_on_kill_confirmed += d.granted_on_kill_confirmed;
    counts_.waiters_lapsed += d.lapsed;
  }
  void disk_submitted() {
    std::int64_t latency = disk_base_ns_ + proc_rng_.range(0, disk_base_ns_);
    if (now_ < cfg_.heal_ns && proc_rng_.chance(disk_slow_)) {
      latency += proc_rng_.range(20 * kMs, 300 * kMs);
      ++counts_.disk_slow;
    }
    const std::uint64_t inc = incarnation_;
    if (!crashes_at_batch_.empty() && now_ < cfg_.heal_ns) {
      const std::int64_t down = crashes_at_batch_.front();
      crashes_at_batch_.pop_front();
      ++counts_.lockd_crashes_in_flight;
      push(now_ + crash_rng_.range(0, latency - 1), kWorldNode, [this, inc, down] {
        if (inc == incarnation_) crash_lockd(down);
      });
    }
    const bool fails = now_ < cfg_.heal_ns && disk_fail_rng_.chance(disk_fail_);
    push(now_ + latency, kLockd, [this, inc, fails] {
      if (!lockd_ || inc != incarnation_) return;
      if (fails) {
        disk_.fail();
        ++counts_.disk_failures;
      } else {
        disk_.complete();
        ++counts_.batches_durable;
        if (!table_.regression().empty()) fail(Violation{"stored_epoch_monotone", now_, table_.regression()});
      }
      run_lockd([&] { return lockd_->tick(local(kLockd)); });
      // lockd exits on a failed store (production: the process exits, its service manager
      // restarts it): what it had not made durable is gone, as in a crash.
      if (lockd_ && lockd_->failed()) crash_lockd(disk_fail_rng_.range(20 * kMs, kS), /*store_failed=*/true);
    });
  }

  // ---- LockdReplica::Env (lockd on etcd) ------------------------------------------------------
  void election_call(std::uint32_t k) override { issue(k); }

  void load_table(std::uint32_t k, std::int64_t revision) override {
    const std::uint64_t inc = replica_inc_[k];
    const int node = replica_node(k);
    // The load's range reads: a round trip to etcd, read there (linearizable, after the
    // election); a cut path or a lost answer fails the load after the call timeout.
    if (etcd_lost(k) || etcd_lost(k)) {
      push(now_ + kS, node, [this, k, inc, node, revision] {
        if (replica_inc_[k] != inc || !replicas_[k]) return;
        run_replica(k, [&] {
          replicas_[k]->load_failed(revision);
          return replicas_[k]->tick(local(node));
        });
      });
      return;
    }
    push(now_ + etcd_delay(k), kWorldNode, [this, k, inc, node, revision] {
      auto table = std::make_shared<lockd::RestoredTable>(etcd_->table().open());
      push(now_ + etcd_delay(k), node, [this, k, inc, node, revision, table] {
        if (replica_inc_[k] != inc || !replicas_[k]) return;
        run_replica(k, [&] {
          replicas_[k]->load_done(revision, std::move(*table));
          return replicas_[k]->tick(local(node));
        });
      });
    });
  }

  void store_submitted(std::uint32_t k) override {
    const bool fails = now_ < cfg_.heal_ns && disk_fail_rng_.chance(disk_fail_);
    store_attempt(k, replica_inc_[k], replicas_[k]->store(), now_ + lockd::kEtcdCommitDeadlineNs, fails);
  }

  /// One attempt of a leader's guarded transaction (EtcdStore::commit): it reaches etcd after
  /// the path's delay and is decided there (the guard read at that moment). Cut off etcd, the
  /// attempt times out and is made again (the same puts, still guarded) until the commit's
  /// deadline, when the batch fails unwritten; `fails`: etcd refuses it (failed, unwritten).
  void store_attempt(std::uint32_t k, std::uint64_t inc, std::shared_ptr<SimDisk> store, std::int64_t give_up,
                     bool fails) {
    const int node = replica_node(k);
    if (fails || etcd_lost(k)) {
      const std::int64_t next = now_ + (fails ? etcd_delay(k) : kS + 50 * kMs);
      if (fails || next >= give_up) {
        push(std::min(next, give_up), kWorldNode, [this, store, k, inc, node] {
          store->fail();
          ++counts_.disk_failures;
          wake_replica(k, inc, node);
        });
        return;
      }
      push(next, kWorldNode, [this, k, inc, store, give_up] { store_attempt(k, inc, store, give_up, false); });
      return;
    }
    push(now_ + etcd_delay(k), kWorldNode, [this, store, k, inc, node, give_up] {
      if (etcd_lost(k)) {
        // Decided at etcd, its answer cut off: the attempt times out and the next one (the same
        // puts, still guarded) brings the verdict, or the commit deadline fails it.
        store->write_unanswered();
        ++counts_.batches_unanswered;
        if (!etcd_->table().regression().empty()) fail(Violation{"stored_epoch_monotone", now_, etcd_->table().regression()});
        store_attempt(k, inc, store, give_up, false);
        return;
      }
      if (store->complete()) ++counts_.batches_durable;
      else ++counts_.batches_rejected;
      if (!etcd_->table().regression().empty()) fail(Violation{"stored_epoch_monotone", now_, etcd_->table().regression()});
      push(now_ + etcd_delay(k), node, [this, k, inc, node] { wake_replica(k, inc, node); });
    });
  }

 private:
  // ---- lockd on etcd ---------------------------------------------------------------------------
  /// One replica's path to etcd (both ways).
  struct EtcdPath {
    std::int64_t base_delay_ns = 0;
    std::int64_t jitter_ns = 0;
    double loss = 0;  ///< a segment lost: its retransmission 200 ms .. 1 s later
    double tail = 0;  ///< a slow answer (100 ms .. 1.5 s): a slow etcd, a stalled raft round
  };
  struct EtcdCut {
    std::uint32_t replica = 0;
    std::int64_t start_ns = 0;
    std::int64_t end_ns = 0;
  };

  bool replicated() const noexcept { return cfg_.lockd_replicas > 1; }
  /// Replica 0 is node 0 (lockd's); replica k > 0 is node supervisors + k.
  int replica_node(std::uint32_t k) const noexcept {
    return k == 0 ? kLockd : static_cast<int>(cfg_.supervisors + k);
  }
  bool etcd_cut(std::uint32_t k) const {
    for (const EtcdCut& c : etcd_cuts_)
      if (c.replica == k && now_ >= c.start_ns && now_ < c.end_ns) return true;
    return false;
  }
  /// A call or answer that the path to etcd loses: cut off etcd (gRPC runs over TCP, so a lost
  /// segment is a retransmission: etcd_delay).
  bool etcd_lost(std::uint32_t k) {
    if (!cfg_.faults || now_ >= cfg_.heal_ns || !etcd_cut(k)) return false;
    ++counts_.etcd_calls_lost;
    return true;
  }
  std::int64_t etcd_delay(std::uint32_t k) {
    const EtcdPath& e = etcd_paths_[k];
    std::int64_t d = e.base_delay_ns + etcd_rng_.range(0, e.jitter_ns);
    if (cfg_.faults && now_ < cfg_.heal_ns) {
      if (etcd_rng_.chance(e.loss)) d += etcd_rng_.range(200 * kMs, 1000 * kMs);  // TCP retransmission
      if (etcd_rng_.chance(e.tail)) d += etcd_rng_.range(100 * kMs, 1500 * kMs);  // a slow raft round
    }
    return d;
  }

  void start_replica(std::uint32_t k) {
    const int node = replica_node(k);
    ++replica_inc_[k];
    replicas_[k] = std::make_unique<LockdReplica>(cfg_, cluster_, *this, *etcd_, k, (std::uint64_t{k} << 32) | replica_inc_[k],
                                                  [this, node] { return local(node); });
    issue(k);
  }

  /// Makes the pending call of replica k's election (or schedules its wait).
  void issue(std::uint32_t k) {
    LockdReplica& r = *replicas_[k];
    const lockd::ElectionCall& c = r.core().pending();
    const std::uint64_t seq = ++call_seq_[k];
    const std::uint64_t inc = replica_inc_[k];
    const int node = replica_node(k);
    using Kind = lockd::ElectionCall::Kind;
    switch (c.kind) {
      case Kind::done:
        return;
      case Kind::wait: {
        const std::int64_t at = r.take_interrupt() ? now_ : clocks_[static_cast<std::size_t>(node)].true_at(c.until_ns);
        push(at, node, [this, k, seq, inc] { answer(k, seq, inc, lockd::ElectionReply{}); });
        return;
      }
      case Kind::next_endpoint:
        push(now_, node, [this, k, seq, inc] { answer(k, seq, inc, lockd::ElectionReply{}); });
        return;
      default:
        break;
    }
    // The call's deadline: its timeout answers unless the reply came first.
    lockd::ElectionReply timeout;
    timeout.status = Status(Errc::timeout, "simulated etcd: no answer before the deadline");
    push(clocks_[static_cast<std::size_t>(node)].true_at(c.until_ns), node,
         [this, k, seq, inc, timeout] { answer(k, seq, inc, timeout); });
    if (etcd_lost(k)) return;
    auto call = std::make_shared<lockd::ElectionCall>(c);
    push(now_ + etcd_delay(k), kWorldNode, [this, k, seq, inc, node, call] {
      lockd::ElectionReply reply = etcd_->handle(*call);
      counts_.leases_expired = etcd_->leases_expired();
      if (etcd_lost(k)) return;
      push(now_ + etcd_delay(k), node, [this, k, seq, inc, node, call, reply = std::move(reply)]() mutable {
        if (local(node) >= call->until_ns) return;  // the timeout answers
        answer(k, seq, inc, std::move(reply));
      });
    });
  }

  /// Resumes replica k's election with the reply to its call `seq`, then runs its io side.
  void answer(std::uint32_t k, std::uint64_t seq, std::uint64_t inc, lockd::ElectionReply reply) {
    if (replica_inc_[k] != inc || !replicas_[k] || call_seq_[k] != seq) return;
    const int node = replica_node(k);
    run_replica(k, [&] {
      LockdReplica& r = *replicas_[k];
      r.core().resume(std::move(reply));
      issue(k);
      return r.tick(local(node));
    });
  }

  void wake_replica(std::uint32_t k, std::uint64_t inc, int node) {
    if (replica_inc_[k] != inc || !replicas_[k]) return;
    run_replica(k, [&] { return replicas_[k]->tick(local(node)); });
  }

  /// Runs a step of replica k, then ends its election's wait if its io side stepped down, and
  /// checks the invariants that read the authority's table.
  template <class Step>
  void run_replica(std::uint32_t k, Step&& step) {
    if (!replicas_[k]) return;
    run_node(replica_node(k), step);
    if (replicas_[k] && replicas_[k]->core().pending().kind == lockd::ElectionCall::Kind::wait &&
        replicas_[k]->take_interrupt()) {
      const std::uint64_t s2 = ++call_seq_[k];
      const std::uint64_t inc = replica_inc_[k];
      push(now_, replica_node(k), [this, k, s2, inc] { answer(k, s2, inc, lockd::ElectionReply{}); });
    }
    // one_leader: a replica that still serves revision R after its step (its fence checked on its
    // own clock at this instant) holds etcd's election key of revision R now - the self-fence's
    // promise that no lockd answers once another can win. (The other invariants see a deposed
    // leader only through its refreshes' effect on a later leader's expiries, so they miss one
    // that serves up to about a TTL too long.)
    if (replicas_[k] && replicas_[k]->leading() != 0) {
      const std::int64_t held = etcd_->election_revision();
      if (held != replicas_[k]->leading()) {
        fail(Violation{"one_leader", now_,
                       "lockd" + std::to_string(k) + " serves revision " + std::to_string(replicas_[k]->leading()) +
                           " while etcd's election key is " +
                           (held == 0 ? std::string("gone") : "of revision " + std::to_string(held))});
        return;
      }
    }
    if (replicas_[k] && replicas_[k]->leading() > authority_rev_) {
      authority_rev_ = replicas_[k]->leading();
      ++counts_.takeovers;
      record(replica_node(k), "take_over", static_cast<std::uint64_t>(authority_rev_), 0);
      // A new authority: every acknowledged grant current at the last one must be in its table.
      if (!grants_kept_by(authority()->table(), authority_current_)) return;
    }
    const LockdNode* a = authority();
    if (a == nullptr) return;
    check_grants_kept();
    authority_current_ = current_acked(*a);
  }

  /// The acknowledged grants still current in `n`'s table.
  std::vector<Invariants::AckedGrant> current_acked(const LockdNode& n) const {
    std::vector<Invariants::AckedGrant> out;
    for (const auto& [id, g] : acked_) {
      const LockState s = n.table().state(id);
      if (s.phase == LockPhase::held && s.owner == g.holder && s.epoch == g.epoch) out.push_back(g);
    }
    return out;
  }

  /// The replica serving the newest leadership taken over (its table is the name table of
  /// record); null while it is down or stepped down (a deposed leader with an older revision
  /// never is). One lockd: lockd_.
  const LockdReplica* authority_replica() const {
    for (const auto& r : replicas_)
      if (r && authority_rev_ != 0 && r->leading() == authority_rev_) return r.get();
    return nullptr;
  }
  const LockdNode* authority() const {
    if (!replicated()) return lockd_.get();
    const LockdReplica* r = authority_replica();
    return r == nullptr ? nullptr : &r->node();
  }
  /// The node whose clock the authority's expiries are on.
  int authority_node() const {
    const LockdReplica* r = replicated() ? authority_replica() : nullptr;
    return r == nullptr ? kLockd : replica_node(r->index());
  }

  void crash_replica(std::uint32_t k, std::int64_t down_ns) {
    if (!replicas_[k]) return;
    ++counts_.replica_crashes;
    replicas_[k].reset();
    ++replica_inc_[k];
    const int node = replica_node(k);
    wake_gen_[static_cast<std::size_t>(node)]++;
    wake_at_[static_cast<std::size_t>(node)] = kNever;
    record(node, "crash", static_cast<std::uint64_t>(down_ns), 0);
    push(now_ + down_ns, kWorldNode, [this, k] {
      ++counts_.lockd_restarts;
      start_replica(k);
      record(replica_node(k), "restart", replica_inc_[k], 0);
      run_replica(k, [&] { return replicas_[k]->tick(local(replica_node(k))); });
    });
  }

  /// The cluster's own faults (after the others, from a stream of its own).
  void plan_cluster_faults() {
    Rng& r = etcd_rng_;
    const std::int64_t last_start = std::max<std::int64_t>(kS, cfg_.heal_ns - 5 * kS);
    const std::int64_t lease = cfg_.leader_lease_s * kS;
    for (std::int64_t i = 0, n = r.range(1, 4); i < n; ++i) {
      const auto k = static_cast<std::uint32_t>(r.below(cfg_.lockd_replicas));
      const std::int64_t at = r.range(kS, last_start);
      const std::int64_t down = r.range(20 * kMs, 3 * lease);
      push(at, kWorldNode, [this, k, down] { crash_replica(k, down); });
    }
    // Paused past the leadership lease (SIGSTOP, a VM stall): it resumes as a deposed leader
    // that must fence itself before it answers anything.
    for (std::int64_t i = 0, n = r.range(0, 3); i < n; ++i) {
      Pause p;
      p.node = replica_node(static_cast<std::uint32_t>(r.below(cfg_.lockd_replicas)));
      p.start_ns = r.range(kS, last_start);
      p.end_ns = p.start_ns + r.range(lease / 2, 3 * lease);
      schedule_pause(p);
      ++counts_.replica_long_pauses;
    }
    for (std::int64_t i = 0, n = r.range(0, 3); i < n; ++i) {
      EtcdCut c;
      c.replica = static_cast<std::uint32_t>(r.below(cfg_.lockd_replicas));
      c.start_ns = r.range(kS, last_start);
      c.end_ns = c.start_ns + r.range(100 * kMs, 3 * lease + lockd::kEtcdCommitDeadlineNs);
      etcd_cuts_.push_back(c);
      push(c.start_ns, kWorldNode, [this, c] {
        ++counts_.etcd_cuts;
        record(replica_node(c.replica), "etcd_cut", static_cast<std::uint64_t>((c.end_ns - c.start_ns) / kMs), 0);
      });
    }
  }

  // ---- set-up ----------------------------------------------------------------------------------
  void draw_path(Rng& r, Path& p) {
    p.base_delay_ns = r.range(50'000, 2 * kMs);
    p.jitter_ns = r.range(100'000, 3 * kMs);
    if (!cfg_.faults) return;
    p.loss = static_cast<double>(r.range(0, 500)) / 10'000.0;       // 0..5 %
    p.duplicate = static_cast<double>(r.range(0, 300)) / 10'000.0;  // 0..3 %
    p.tail = static_cast<double>(r.range(0, 100)) / 10'000.0;       // 0..1 %
    p.tail_max_ns = r.range(20 * kMs, 600 * kMs);
  }

  void plan_faults(Rng& r) {
    const std::int64_t last_start = std::max<std::int64_t>(kS, cfg_.heal_ns - 5 * kS);
    const std::int64_t n_partitions = r.range(0, 4);
    for (std::int64_t i = 0; i < n_partitions; ++i) {
      Partition p;
      p.worker = static_cast<std::uint32_t>(r.below(cfg_.supervisors));
      const auto dir = r.below(3);
      p.to_lockd = dir != 1;
      p.from_lockd = dir != 2;
      p.start_ns = r.range(kS, last_start);
      p.end_ns = p.start_ns + r.range(200 * kMs, 4 * kS);
      add_partition(p);
    }
    const std::int64_t n_congestions = r.range(1, 4);
    for (std::int64_t i = 0; i < n_congestions; ++i) {
      Congestion c;
      c.worker = static_cast<std::uint32_t>(r.below(cfg_.supervisors));
      c.to_lockd = r.chance(0.5);
      c.start_ns = r.range(kS, last_start);
      c.end_ns = c.start_ns + r.range(500 * kMs, 5 * kS);
      c.extra_ns = r.range(50 * kMs, 900 * kMs);
      congestions_.push_back(c);
      if (r.chance(0.8)) {
        // A link that congests often fails next: a partition of the same worker inside the
        // episode (either direction), the overlap that lets old answers arrive after the
        // requests stopped reaching lockd.
        Partition p;
        p.worker = c.worker;
        const auto dir = r.below(3);
        p.to_lockd = dir != 1;
        p.from_lockd = dir != 2;
        p.start_ns = r.range(c.start_ns, c.end_ns);
        p.end_ns = p.start_ns + r.range(200 * kMs, 4 * kS);
        add_partition(p);
      }
      push(c.start_ns, kWorldNode, [this, c] {
        ++counts_.congestions;
        record(kWorldNode, c.to_lockd ? "congestion_up" : "congestion_down", c.worker, static_cast<std::uint64_t>(c.extra_ns / kMs));
      });
    }
    // Pauses that cannot break the inequality stay within its margin (ttl·(1−ρ) − left side),
    // not the pause budget (ttl − left side), which exceeds it by ttl·ρ.
    const std::int64_t margin = cfg_.safety_margin_ns();
    const std::int64_t n_pauses = r.range(0, 6);
    for (std::int64_t i = 0; i < n_pauses; ++i) {
      Pause p;
      p.node = static_cast<int>(r.below(cfg_.supervisors + 1));
      p.start_ns = r.range(kS, last_start);
      p.end_ns = p.start_ns + r.range(kMs, margin * 9 / 10);
      schedule_pause(p);
    }
    if (cfg_.over_budget_pauses && r.chance(0.05)) {
      Pause p;
      p.node = 1 + static_cast<int>(r.below(cfg_.supervisors));
      p.start_ns = r.range(kS, last_start);
      p.end_ns = p.start_ns + r.range(margin * 12 / 10, 3 * cfg_.timing.ttl_ns);
      p.over_budget = true;
      schedule_pause(p);
    }
    const std::int64_t n_crashes = r.range(0, 3);
    for (std::int64_t i = 0; i < n_crashes; ++i) {
      const std::int64_t at = r.range(kS, last_start);
      const std::int64_t down = r.range(20 * kMs, 2 * kS);
      // Half of them (a stream of their own) wait from `at` for lockd's next disk batch and hit
      // it in flight: a crash during a write loses that batch and every change after it.
      if (crash_rng_.chance(0.5))
        push(at, kWorldNode, [this, down] { crashes_at_batch_.push_back(down); });
      else
        push(at, kWorldNode, [this, down] { crash_lockd(down); });
    }
  }

  void add_partition(const Partition& p) {
    partitions_.push_back(p);
    push(p.start_ns, kWorldNode, [this, p] {
      ++counts_.partitions;
      record(kWorldNode, "partition", p.worker, (p.to_lockd ? 1u : 0u) | (p.from_lockd ? 2u : 0u));
    });
  }

  void schedule_pause(const Pause& p) {
    pauses_.push_back(p);
    push(p.start_ns, kWorldNode, [this, p] {
      auto& until = paused_until_[static_cast<std::size_t>(p.node)];
      until = std::max(until, p.end_ns);
      ++counts_.pauses;
      if (p.over_budget) ++counts_.pauses_over_budget;
      record(p.node, p.over_budget ? "pause_over_budget" : "pause", static_cast<std::uint64_t>(p.end_ns - p.start_ns), 0);
    });
  }

  // ---- time and events -------------------------------------------------------------------------
  std::int64_t local(int node) const { return clocks_[static_cast<std::size_t>(node)].local(now_); }

  void push(std::int64_t at, int node, std::function<void()> fn) {
    queue_.push(Event{std::max(at, now_), next_seq_++, node, std::move(fn)});
  }

  /// An intra-step pause of `node`, drawn now: the node reads its clock, then stops for the
  /// returned ns before what it decided takes effect (its datagrams leave, its kills land, its
  /// sandboxes start), and its next events wait as in a pause. Within the safety margin, never
  /// within a margin of another pause of the node (so no stall adds up past the margin); 0 for
  /// none.
  std::int64_t step_pause(int node) {
    if (!cfg_.faults || now_ >= cfg_.heal_ns || !step_pause_rng_.chance(0.0005)) return 0;
    const std::int64_t margin = cfg_.safety_margin_ns();
    const std::int64_t d = step_pause_rng_.range(10'000, std::max<std::int64_t>(10'000, margin * 9 / 10));
    if (now_ < last_step_pause_end_[static_cast<std::size_t>(node)] + margin) return 0;
    for (const Pause& p : pauses_)
      if (p.node == node && p.start_ns <= now_ + d + margin && p.end_ns + margin >= now_) return 0;
    last_step_pause_end_[static_cast<std::size_t>(node)] = now_ + d;
    auto& until = paused_until_[static_cast<std::size_t>(node)];
    until = std::max(until, now_ + d);
    ++counts_.step_pauses;
    record(node, "step_pause", static_cast<std::uint64_t>(d), 0);
    return d;
  }

  /// Runs `step` on a node (it returns its next wake on its own clock) and schedules that wake.
  template <class Step>
  void run_node(int node, Step&& step) {
    const std::int64_t delay = step_pause(node);
    effects_delay_ns_ = delay;
    const std::int64_t next_local = step();
    effects_delay_ns_ = 0;
    const std::int64_t at = next_local == kNever ? kNever : clocks_[static_cast<std::size_t>(node)].true_at(next_local);
    auto& w = wake_at_[static_cast<std::size_t>(node)];
    if (at >= w && w > now_) return;  // an earlier wake is already scheduled
    w = at;
    if (at == kNever) return;
    const std::uint64_t gen = ++wake_gen_[static_cast<std::size_t>(node)];
    push(at, node, [this, node, gen] {
      if (gen != wake_gen_[static_cast<std::size_t>(node)]) return;
      wake_at_[static_cast<std::size_t>(node)] = kNever;
      tick_node(node);
    });
  }
  template <class Step>
  void run_lockd(Step&& step) {
    if (!lockd_) return;
    run_node(kLockd, step);
    check_grants_kept();
  }
  /// The replica a node is (-1: none).
  int replica_at(int node) const noexcept {
    if (!replicated()) return -1;
    if (node == kLockd) return 0;
    if (node > static_cast<int>(cfg_.supervisors)) return node - static_cast<int>(cfg_.supervisors);
    return -1;
  }
  void tick_node(int node) {
    if (const int k = replica_at(node); k >= 0) {
      const auto kk = static_cast<std::uint32_t>(k);
      if (replicas_[kk]) run_replica(kk, [&] { return replicas_[kk]->tick(local(node)); });
      return;
    }
    if (node == kLockd) {
      run_lockd([&] { return lockd_->tick(local(kLockd)); });
    } else {
      SupervisorNode& s = *sups_[static_cast<std::size_t>(node - 1)];
      run_node(node, [&] { return s.tick(local(node)); });
    }
  }

  // ---- network ---------------------------------------------------------------------------------
  bool partitioned(std::uint32_t worker, bool to_lockd) const {
    for (const Partition& p : partitions_)
      if (p.worker == worker && now_ >= p.start_ns && now_ < p.end_ns && (to_lockd ? p.to_lockd : p.from_lockd))
        return true;
    return false;
  }

  std::int64_t congestion(std::uint32_t worker, bool to_lockd) const {
    std::int64_t extra = 0;
    for (const Congestion& c : congestions_)
      if (c.worker == worker && c.to_lockd == to_lockd && now_ >= c.start_ns && now_ < c.end_ns)
        extra = std::max(extra, c.extra_ns);
    return extra;
  }

  void transmit(Path& path, std::uint32_t worker, bool to_lockd, std::span<const std::uint8_t> bytes) {
    ++counts_.datagrams_sent;
    const bool faulty = cfg_.faults && now_ < cfg_.heal_ns;
    if (faulty && partitioned(worker, to_lockd)) {
      ++counts_.datagrams_partitioned;
      record(kWorldNode, to_lockd ? "cut_up" : "cut_down", worker, bytes.size());
      return;
    }
    if (faulty && net_rng_.chance(path.loss)) {
      ++counts_.datagrams_lost;
      record(kWorldNode, to_lockd ? "lost_up" : "lost_down", worker, bytes.size());
      return;
    }
    const std::int64_t extra = faulty ? congestion(worker, to_lockd) : 0;
    const int copies = faulty && net_rng_.chance(path.duplicate) ? 2 : 1;
    if (copies == 2) {
      ++counts_.datagrams_duplicated;
      record(kWorldNode, to_lockd ? "dup_up" : "dup_down", worker, bytes.size());
    }
    auto data = std::make_shared<std::vector<std::uint8_t>>(bytes.begin(), bytes.end());
    const std::uint32_t replica = to_lockd ? replica_for(worker) : 0;
    if (faulty) attack(path, worker, to_lockd, data, replica);
    const std::uint64_t index = ++path.sent;
    for (int c = 0; c < copies; ++c) {
      const auto j = static_cast<std::uint64_t>(path.jitter_ns);
      std::int64_t delay = extra + path.base_delay_ns + static_cast<std::int64_t>(net_rng_.below(j) * net_rng_.below(j) / j);
      if (faulty && net_rng_.chance(path.tail)) {
        delay += net_rng_.range(path.tail_max_ns / 10, path.tail_max_ns);
        ++counts_.datagrams_delayed;
      }
      const int to_node = to_lockd ? replica_node(replica) : worker < sups_.size() ? 1 + static_cast<int>(worker) : kWorldNode;
      push(now_ + effects_delay_ns_ + delay, to_node, [this, &path, data, index, worker, to_lockd, replica] {
        if (index < path.highest_delivered) ++counts_.datagrams_reordered;
        path.highest_delivered = std::max(path.highest_delivered, index);
        deliver(worker, to_lockd, *data, replica);
      });
    }
  }

  /// The on-path attacker (Path::replay, Path::tamper): remembers `data`, and may inject an old
  /// capture or a tampered copy of it, delivered like any datagram on the path.
  void attack(Path& path, std::uint32_t worker, bool to_lockd, const std::shared_ptr<std::vector<std::uint8_t>>& data,
              std::uint32_t replica) {
    if (path.replay == 0 && path.tamper == 0) return;
    std::shared_ptr<const std::vector<std::uint8_t>> inject;
    if (!path.captured.empty() && attack_rng_.chance(path.replay)) {
      inject = path.captured[static_cast<std::size_t>(attack_rng_.below(path.captured.size()))];
      ++counts_.datagrams_replayed;
      record(kWorldNode, to_lockd ? "replay_up" : "replay_down", worker, inject->size());
    } else if (!data->empty() && attack_rng_.chance(path.tamper)) {
      auto t = std::make_shared<std::vector<std::uint8_t>>(*data);
      (*t)[static_cast<std::size_t>(attack_rng_.below(t->size()))] ^=
          static_cast<std::uint8_t>(1u << attack_rng_.below(8));
      inject = std::move(t);
      ++counts_.datagrams_tampered;
      record(kWorldNode, to_lockd ? "tamper_up" : "tamper_down", worker, inject->size());
    }
    path.captured.push_back(data);
    if (path.captured.size() > kCapturedMax) path.captured.pop_front();
    if (!inject) return;
    const int to_node = to_lockd ? replica_node(replica) : worker < sups_.size() ? 1 + static_cast<int>(worker) : kWorldNode;
    push(now_ + effects_delay_ns_ + path.base_delay_ns + attack_rng_.range(0, path.jitter_ns), to_node,
         [this, inject, worker, to_lockd, replica] { deliver(worker, to_lockd, *inject, replica); });
  }

  /// The replica a datagram of `worker` goes to: the one its link targets (redirect()); the
  /// operator and the hostile worker (the last path) go to the leader as etcd names it.
  std::uint32_t replica_for(std::uint32_t worker) {
    if (!replicated()) return 0;
    if (worker < cfg_.supervisors) return target_[worker];
    const std::optional<std::uint32_t> k = replica_of(etcd_->election_value());
    return k && *k < cfg_.lockd_replicas ? *k : 0;
  }

  void deliver(std::uint32_t worker, bool to_lockd, const std::vector<std::uint8_t>& bytes, std::uint32_t replica = 0) {
    if (to_lockd && replicated()) {
      if (!replicas_[replica]) {
        ++counts_.datagrams_to_down_lockd;
        return;
      }
      ++counts_.datagrams_delivered;
      const int node = replica_node(replica);
      run_replica(replica, [&] {
        const std::int64_t t = local(node);
        replicas_[replica]->on_datagram(bytes, worker, t);
        return replicas_[replica]->tick(t);
      });
      return;
    }
    if (to_lockd) {
      if (!lockd_) {
        ++counts_.datagrams_to_down_lockd;
        return;
      }
      ++counts_.datagrams_delivered;
      run_lockd([&] {
        const std::int64_t t = local(kLockd);
        lockd_->on_datagram(bytes, worker, t);
        return lockd_->tick(t);
      });
    } else {
      ++counts_.datagrams_delivered;
      if (worker >= sups_.size()) {  // to the hostile worker or the operator
        if (transfer_ && operator_auth_) {
          wire::DecodeResult a = wire::decode(bytes, operator_auth_.get());
          if (a && a.header.request_id == transfer_->request_id) {
            operator_transfer_answer(a.body);
            return;
          }
        }
        const wire::DecodeResult d = wire::decode(bytes, nullptr);
        if (d) record(kWorldNode, "outsider_answer", static_cast<std::uint64_t>(wire::type_of(d.body)), d.header.request_id);
        return;
      }
      const int node = 1 + static_cast<int>(worker);
      SupervisorNode& s = *sups_[worker];
      run_node(node, [&] {
        const std::int64_t t = local(node);
        s.on_datagram(bytes, t);
        return s.tick(t);
      });
    }
  }

  /// The hostile worker: a heartbeat naming every name with a made-up sandbox and epoch, signed
  /// with its own (valid) worker key, every 100 ms. lockd must answer lost for all of them and
  /// move no other worker's lease.
  void hostile_heartbeat() {
    wire::Heartbeat h;
    for (const NameId& id : name_ids_) {
      // Half the time the exact (sandbox, epoch) of another worker's grant, sniffed off the
      // network: only lockd's check that the refresh comes from the grant's own worker stands
      // between this beat and a dead holder's lease kept alive.
      const auto g = sniffed_.find(id);
      if (g != sniffed_.end() && hostile_rng_.chance(0.5)) {
        h.entries.push_back(wire::HeartbeatEntry{id, g->second.holder, g->second.epoch});
        continue;
      }
      h.entries.push_back(wire::HeartbeatEntry{id, SandboxId{hostile_rng_.next() | 1, hostile_rng_.next()},
                                               static_cast<Epoch>(hostile_rng_.range(1, 400))});
    }
    wire::Datagram dg;
    if (hostile_->seal(hostile_next_request_++, h, dg)) {
      record(kWorldNode, "hostile_heartbeat", h.entries.size(), 0);
      transmit(up_[cfg_.supervisors], cfg_.supervisors, true, dg.view());
    }
    hostile_forge();
    push(now_ + 100 * kMs, kWorldNode, [this] { hostile_heartbeat(); });
  }

  /// The hostile worker also replays what it sniffed off the network (datagrams are
  /// authenticated, not encrypted): for a grant another worker's sandbox got, a Release, a
  /// Commit naming itself or a real worker, a TransferBegin to a sandbox of its own, a Revoke, a
  /// RunningAnswer saying the sandbox is gone, an Acquire in a real worker's name for the
  /// holder's sandbox (or a transfer's receiver), a TransferComplete, or a WorkerHeartbeat in the
  /// victim worker's name - each signed
  /// with its own valid worker key. lockd must refuse or ignore every one: a worker key gives no
  /// power over other workers' names (the no-authz ablation shows what happens otherwise).
  void hostile_forge() {
    if (sniffed_.empty()) return;
    auto it = sniffed_.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(forge_rng_.below(sniffed_.size())));
    const Invariants::AckedGrant& g = it->second;
    const SandboxId mine{0x4057'0000 | forge_rng_.below(1 << 16), forge_rng_.next()};
    wire::Body body;
    const WorkerId someone = worker_ids_[forge_rng_.below(worker_ids_.size())];
    // The seeds that queue also forge the waiters' requests (9, 10); the others draw as before.
    switch (forge_rng_.below(queues_ ? 11 : 9)) {
      case 0: body = wire::Release{g.name, g.holder, g.epoch}; break;
      case 1: body = wire::Commit{g.name, g.holder, g.epoch, hostile_id_}; break;
      case 2: body = wire::TransferBegin{g.name, g.holder, g.epoch, mine, hostile_id_}; break;
      case 3: body = wire::Revoke{g.name, g.epoch, false}; break;
      case 4: body = wire::RunningAnswer{g.name, g.holder, g.epoch, false}; break;
      // A Commit that claims to come from a real worker (perhaps the grant's own).
      case 5: body = wire::Commit{g.name, g.holder, g.epoch, someone}; break;
      // An Acquire in a real worker's name for the holder's sandbox id or, while the operator
      // moves a name, for the transfer's receiver: a reservation is for (sandbox, worker).
      case 6:
        if (transfer_ && !transfer_->to.is_nil())
          body = wire::Acquire{names_[name_index(transfer_->name)], transfer_->to, worker_ids_[transfer_->to_worker],
                               static_cast<std::uint32_t>(cfg_.timing.ttl_ns / kMs), forge_rng_.chance(0.5)};
        else
          body = wire::Acquire{names_[name_index(g.name)], g.holder, someone,
                               static_cast<std::uint32_t>(cfg_.timing.ttl_ns / kMs), forge_rng_.chance(0.5)};
        break;
      case 7: body = wire::TransferComplete{g.name, g.epoch + 1}; break;
      // A Wait for the sniffed grant's sandbox (perhaps one granted from a FIFO and not yet
      // committed) in its own name or a real worker's: a waiter's place and its grant are bound
      // to the waiter's worker.
      case 9:
        body = wire::Wait{names_[name_index(g.name)], g.holder, forge_rng_.chance(0.5) ? someone : WorkerId{}, 0};
        break;
      // Leaving the FIFO for that sandbox (Release with epoch 0), which gives back a grant from
      // it not yet committed: only the waiter's own worker may.
      case 10: body = wire::Release{g.name, g.holder, 0}; break;
      default: {
        wire::WorkerHeartbeat w;
        w.worker = worker_ids_[forge_rng_.below(worker_ids_.size())];
        body = w;
        break;
      }
    }
    wire::Datagram dg;
    if (!hostile_->seal(hostile_next_request_++, body, dg)) return;
    ++counts_.hostile_forgeries;
    record(kWorldNode, "hostile_forgery", static_cast<std::uint64_t>(wire::type_of(body)), g.epoch);
    transmit(up_[cfg_.supervisors], cfg_.supervisors, true, dg.view());
  }

  /// The operator's revoke of a name (held or not), until the faults heal; its answers go to a
  /// path nobody reads.
  void operator_revoke() {
    if (now_ >= cfg_.heal_ns) return;
    const NameId name = name_ids_[static_cast<std::size_t>(operator_rng_.below(name_ids_.size()))];
    wire::Datagram dg;
    if (operator_->seal(operator_next_request_++, wire::Revoke{name, 0, false}, dg)) {
      ++counts_.operator_revokes;
      record(kWorldNode, "operator_revoke", name.lo, 0);
      transmit(up_[cfg_.supervisors], cfg_.supervisors, true, dg.view());
    }
    push(now_ + operator_rng_.range(2 * kS, 10 * kS), kWorldNode, [this] { operator_revoke(); });
  }

  /// The operator's key: the cluster key used directly, as the CLI does
  /// (lockd/admin_client.cpp signing_key): an admin key whose id has kAdminKeyIdBit.
  wire::WireKey operator_key() const {
    wire::WireKey k = cluster_;
    k.kind = wire::KeyKind::admin;
    k.key_id = static_cast<std::uint16_t>(cluster_.key_id | wire::kAdminKeyIdBit);
    return k;
  }

  /// The operator's graceful transfer of a held name to a new sandbox on a worker drawn at
  /// random (perhaps the holder's own): one at a time, begun until the faults heal and always
  /// completed (a name left transferring stays so: the CLI's `transfer` resumes it the same way).
  void operator_transfer() {
    if (now_ >= cfg_.heal_ns) return;
    push(now_ + transfer_rng_.range(3 * kS, 12 * kS), kWorldNode, [this] { operator_transfer(); });
    if (transfer_ || authority() == nullptr) return;
    // What `leasehold show` would tell the operator: the held names, their holders and epochs.
    const std::map<NameId, HeldView> held = held_now();
    if (held.empty()) return;
    auto it = held.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(transfer_rng_.below(held.size())));
    OperatorTransfer t;
    t.name = it->first;
    t.from = it->second.owner;
    t.epoch = it->second.epoch;
    t.to_worker = static_cast<std::uint32_t>(transfer_rng_.below(sups_.size()));
    t.request_id = operator_next_request_++;
    transfer_ = t;
    ++counts_.operator_transfers;
    record(kWorldNode, "operator_transfer", t.name.lo, t.epoch);
    // The receiver, `leasehold run -- CMD` on that worker: its control request is an event of
    // that node (it waits while the node is paused).
    const int node = 1 + static_cast<int>(t.to_worker);
    push(now_, node, [this, node] {
      if (!transfer_ || !transfer_->to.is_nil()) return;
      SupervisorNode& s = *sups_[transfer_->to_worker];
      SandboxId to;
      run_node(node, [&] {
        const std::int64_t l = local(node);
        to = s.run_unnamed(l);
        return s.tick(l);
      });
      if (!transfer_) return;
      if (to.is_nil()) {
        transfer_.reset();  // refused (its table full): nothing began
        return;
      }
      transfer_->to = to;
      operator_transfer_send();
    });
  }

  /// Sends the transfer's current request (TransferBegin, then TransferComplete) and retries it
  /// every 300 ms with the same request id until an answer comes (lockd's response cache
  /// answers a retry of a request it carried out).
  void operator_transfer_send() {
    OperatorTransfer& t = *transfer_;
    const wire::Body body = t.begun ? wire::Body{wire::TransferComplete{t.name, t.new_epoch}}
                                    : wire::Body{wire::TransferBegin{t.name, t.from, t.epoch, t.to,
                                                                     worker_ids_[t.to_worker]}};
    wire::Datagram dg;
    if (operator_->seal(t.request_id, body, dg)) transmit(up_[cfg_.supervisors], cfg_.supervisors, true, dg.view());
    const std::uint64_t gen = ++t.sends;
    push(now_ + 300 * kMs, kWorldNode, [this, gen] {
      if (transfer_ && transfer_->sends == gen) operator_transfer_send();
    });
  }

  void operator_transfer_answer(const wire::Body& body) {
    OperatorTransfer& t = *transfer_;
    // lockd on etcd: a lockd that does not lead (or still loads) changed nothing; the retry
    // armed goes to the leader (replica_for), as the CLI follows not_leader.
    if (const auto* e = std::get_if<wire::Error>(&body); e != nullptr && e->code == wire::ErrorCode::not_leader) return;
    // A new leader's replay window is above the operator's seq (stale_seq / replayed, nothing
    // executed): continue above it, as the CLI does; the armed retry carries the new seq.
    if (const auto* e = std::get_if<wire::Error>(&body); e != nullptr && e->seq_floor != 0) {
      operator_->advance_to(e->seq_floor);
      return;
    }
    const auto* st = std::get_if<wire::TransferState>(&body);
    const auto* d = std::get_if<wire::Deny>(&body);
    if (!t.begun) {
      if (st != nullptr && st->state == LockPhase::transferring && st->to == t.to) {
        t.begun = true;
        t.new_epoch = st->new_epoch;
      } else if (const LockState s = authority() != nullptr ? authority()->table().state(t.name) : LockState{};
                 d != nullptr && s.phase == LockPhase::transferring && s.to == t.to) {
        // Its answer was lost with a lockd restart (the retry is refused: transferring): resume
        // it, as `leasehold transfer` does for a name left transferring to its sandbox.
        t.begun = true;
        t.new_epoch = s.epoch;
      } else {
        record(kWorldNode, "transfer_refused", t.name.lo, d != nullptr ? static_cast<std::uint64_t>(d->refusal) : 0);
        transfer_.reset();  // the holder changed meanwhile: nothing began
        return;
      }
      record(kWorldNode, "transfer_begun", t.name.lo, t.new_epoch);
    } else if (st != nullptr && st->state == LockPhase::free) {
      // Complete: the name is Free, reserved for `to` on its worker, which now names it.
      record(kWorldNode, "transfer_complete", t.name.lo, t.new_epoch);
      ++counts_.transfers_completed;
      const std::string text = names_[name_index(t.name)];
      const SandboxId to = t.to;
      const std::uint32_t w = t.to_worker;
      transfer_.reset();
      const int node = 1 + static_cast<int>(w);
      push(now_, node, [this, node, w, to, text] {
        SupervisorNode& s = *sups_[w];
        run_node(node, [&] {
          const std::int64_t l = local(node);
          s.name_sandbox(to, text, l);
          return s.tick(l);
        });
      });
      return;
    } else if (d == nullptr || d->refusal != Refusal::lock_delay) {
      // Not transferring any more (revoked meanwhile) or refused otherwise: nothing to finish.
      record(kWorldNode, "transfer_dropped", t.name.lo, d != nullptr ? static_cast<std::uint64_t>(d->refusal) : 0);
      transfer_.reset();
      return;
    }
    // Begun, or the guard still pending (lock_delay): poll the completion under a new request
    // id (lockd caches the answer of the last one) 200 ms on.
    t.request_id = operator_next_request_++;
    const std::uint64_t gen = ++t.sends;
    push(now_ + 200 * kMs, kWorldNode, [this, gen] {
      if (transfer_ && transfer_->sends == gen) operator_transfer_send();
    });
  }

  std::size_t name_index(NameId id) const {
    for (std::size_t i = 0; i < name_ids_.size(); ++i)
      if (name_ids_[i] == id) return i;
    LEASEHOLD_ASSERT(false && "a name the world never drew");
    return 0;
  }

  // ---- observation of lockd --------------------------------------------------------------------
  void observe_lockd_answer(std::span<const std::uint8_t> bytes) {
    wire::Header h;
    if (wire::decode_header(bytes, nullptr, h) != wire::DecodeError::none) return;
    if (h.type == wire::MessageType::is_running) ++counts_.is_running_asked;
    if (h.type != wire::MessageType::grant) return;
    const wire::DecodeResult d = wire::decode(bytes, nullptr);
    const auto* g = d ? std::get_if<wire::Grant>(&d.body) : nullptr;
    if (g != nullptr && (g->state == LockPhase::held || g->state == LockPhase::acquiring))
      sniffed_[g->name_id] = Invariants::AckedGrant{g->name_id, g->epoch, g->holder};
    // A 2-phase grant (Acquiring: a control plane's acquire, a waiter's grant from the FIFO)
    // tells its epoch as well: a crash may drop the reservation (a restarted lockd keeps no
    // Acquiring record) but never the epoch, which stays burned, so no other sandbox is ever
    // told it.
    if (g != nullptr && (g->state == LockPhase::held || g->state == LockPhase::acquiring)) {
      Epoch& told = told_epoch_[g->name_id];
      told = std::max(told, g->epoch);
    }
    if (g != nullptr && g->state == LockPhase::acquiring) {
      if (auto v = inv_.epoch_monotone(g->name_id, g->epoch, g->holder, now_)) fail(*v);
      return;
    }
    if (g == nullptr || g->state != LockPhase::held) return;
    ++counts_.grants;
    record(kLockd, "grant", g->name_id.lo, g->epoch);
    acked_[g->name_id] = Invariants::AckedGrant{g->name_id, g->epoch, g->holder};
    // Liveness needs a new grant: a resend of one made before the heal (lockd's response
    // cache answering a retry) shows nothing about whether the name can still be acquired.
    const bool new_grant = acknowledged_.insert(std::pair{g->name_id, g->epoch}).second;
    if (new_grant && now_ >= cfg_.heal_ns && first_grant_after_heal_[g->name_id] < 0)
      first_grant_after_heal_[g->name_id] = now_;
    if (auto v = inv_.epoch_monotone(g->name_id, g->epoch, g->holder, now_)) fail(*v);
  }

  struct HeldView {
    SandboxId owner;
    Epoch epoch = 0;
    std::int64_t expiry_ns = 0;  ///< lockd's clock; kNoExpiry in preemptible mode
    int node = kLockd;           ///< the lockd (replica) whose clock expiry_ns is on
    /// The same grant (a refresh moves only expiry_ns).
    bool same_grant(const HeldView& o) const noexcept { return owner == o.owner && epoch == o.epoch; }
  };
  std::map<NameId, HeldView> held_now() const {
    std::map<NameId, HeldView> out;
    const LockdNode* a = authority();
    if (a == nullptr) return out;
    const int node = authority_node();
    a->table().for_each([&](NameId id, const LockState& s) {
      if (s.phase == LockPhase::held) out.emplace(id, HeldView{s.owner, s.epoch, s.expiry_ns, node});
    });
    return out;
  }

  /// kill_before_expiry's excuse: an over-budget pause froze `worker`'s supervisor (its rt
  /// thread too), so its kill-switch fires late; once it resumes, the overdue kills go out
  /// within a step (at most the safety margin) and the processes die within the kill-latency
  /// budget (kill_ticks_max_ ticks), and from then on nothing is excused.
  bool excused(std::uint32_t worker) const {
    for (const Pause& p : pauses_)
      if (p.over_budget && p.node == 1 + static_cast<int>(worker) && p.start_ns <= now_ &&
          now_ <= p.end_ns + cfg_.safety_margin_ns() + kill_ticks_max_ * cfg_.sandbox_tick_ns)
        return true;
    return false;
  }

  /// True while lockd guards the revoked (or transferred-away) grant `epoch` of `id`: nobody can
  /// be granted the name until its worker confirms the kill or the revoke's bound passes.
  bool revoke_guards(NameId id, Epoch epoch) const {
    const LockdNode* a = authority();
    if (a == nullptr) return false;
    const LockState s = a->table().state(id);
    return s.revoke_pending && s.revoked_epoch == epoch &&
           (s.phase == LockPhase::free || s.phase == LockPhase::transferring);
  }

  /// kill_before_expiry: every grant that left lockd's table since the last step. A revoked
  /// grant leaves it when its guard is lifted (confirmation or bound), not at the revoke.
  void check_grants_kept() {
    std::map<NameId, HeldView> now_held = held_now();
    for (const auto& [id, h] : held_) {
      const auto it = now_held.find(id);
      if (it != now_held.end() && it->second.same_grant(h)) continue;
      if (it == now_held.end() && revoke_guards(id, h.epoch)) {
        now_held.emplace(id, h);
        continue;
      }
      // The grant ended now or, if earlier, when its lease expired by lockd's clock: lockd
      // notices an expiry only at its next tick, and the sandbox must be dead by the deadline.
      std::int64_t end_ns = now_;
      if (h.expiry_ns > 0 && h.expiry_ns < kNoExpiry)
        end_ns = std::min(end_ns, clocks_[static_cast<std::size_t>(h.node)].true_at(h.expiry_ns));
      // Held in memory but never answered (its batch not yet durable): nobody was told.
      if (acknowledged_.count(std::pair{id, h.epoch}) == 0) continue;
      const auto sb = sandboxes_.find(h.owner);
      SandboxFate fate = sb == sandboxes_.end() ? SandboxFate{} : sb->second.fate;
      if (sb != sandboxes_.end() && !fate.exited && !fate.passed) {
        NameId n;
        Epoch e = 0;  // published in this very step: it can act from now on
        fate.passed = sups_[sb->second.worker]->check_deadline(sb->first, local(1 + static_cast<int>(sb->second.worker)), &n, &e);
      }
      const bool ex = sb != sandboxes_.end() && excused(sb->second.worker);
      if (auto v = inv_.kill_before_expiry(id, h.epoch, h.owner, fate, end_ns, ex)) {
        fail(*v);
        return;
      }
    }
    held_ = std::move(now_held);
  }

  /// lockd goes down for `down_ns`: a crash, or (`store_failed`) its exit on a failed store.
  void crash_lockd(std::int64_t down_ns, bool store_failed = false) {
    if (!lockd_) return;
    if (!store_failed) ++counts_.lockd_crashes;
    // The acknowledged grants still current at the crash: the next incarnation must have them.
    crash_current_.clear();
    for (const auto& [id, g] : acked_) {
      const LockState s = lockd_->table().state(id);
      if (s.phase == LockPhase::held && s.owner == g.holder && s.epoch == g.epoch) crash_current_.push_back(g);
    }
    lockd_.reset();
    if (disk_.crash()) ++counts_.batches_lost;
    ++incarnation_;
    wake_gen_[kLockd]++;
    wake_at_[kLockd] = kNever;
    record(kLockd, store_failed ? "store_failed" : "crash", static_cast<std::uint64_t>(down_ns), 0);
    push(now_ + down_ns, kWorldNode, [this] { restart_lockd(); });
  }

  /// no_lost_grant: `t` (a restarted lockd's, a new leader's) has every grant of `current`
  /// held; epoch_durable: it knows every name at the highest epoch lockd told a client or
  /// above. False (the run failed) when either fails.
  bool grants_kept_by(const LeaseTable& t, const std::vector<Invariants::AckedGrant>& current) {
    if (auto v = inv_.no_lost_grant(std::span<const Invariants::AckedGrant>(current),
                                    [&](NameId id) {
                                      const LockState s = t.state(id);
                                      return RestoredName{s.phase == LockPhase::held, s.owner, s.epoch};
                                    },
                                    now_)) {
      fail(*v);
      return false;
    }
    if (auto v = inv_.epoch_durable(told_epoch_, [&](NameId id) { return t.state(id).epoch; }, now_)) {
      fail(*v);
      return false;
    }
    return true;
  }

  void restart_lockd() {
    ++counts_.lockd_restarts;
    lockd_ = std::make_unique<LockdNode>(cfg_, cluster_, *this, disk_, local(kLockd));
    record(kLockd, "restart", incarnation_, 0);
    if (!grants_kept_by(lockd_->table(), crash_current_)) return;
    run_lockd([&] { return lockd_->tick(local(kLockd)); });
  }

  // ---- sandboxes and the resource ----------------------------------------------------------------
  void sandbox_exit(SandboxId sb, bool after_kill) {
    const auto it = sandboxes_.find(sb);
    if (it == sandboxes_.end() || it->second.fate.exited) return;
    Sandbox& s = it->second;
    s.fate.exited = true;
    s.fate.exited_at_ns = now_;
    running_.erase(sb);
    record(1 + static_cast<int>(s.worker), after_kill ? "died" : "exited", sb.lo, 0);
    const int node = 1 + static_cast<int>(s.worker);
    const std::uint32_t w = s.worker;
    // The exit reaches the supervisor as a pidfd event: it waits while the supervisor is paused.
    push(now_, node, [this, sb, w, node] {
      SupervisorNode& sup = *sups_[w];
      run_node(node, [&] {
        const std::int64_t t = local(node);
        sup.on_sandbox_exit(sb, t);
        return sup.tick(t);
      });
    });
  }

  void sandbox_write(SandboxId sb) {
    const auto it = sandboxes_.find(sb);
    if (it == sandboxes_.end() || it->second.fate.exited) return;
    const Sandbox& s = it->second;
    NameId name;
    Epoch epoch = 0;
    if (sups_[s.worker]->check_deadline(sb, local(1 + static_cast<int>(s.worker)), &name, &epoch)) {
      std::int64_t delay = proc_rng_.range(50'000, kMs);
      if (cfg_.faults && now_ < cfg_.heal_ns && proc_rng_.chance(0.003)) {
        delay += proc_rng_.range(100 * kMs, 2500 * kMs);  // the sandbox stalls between check and write
        ++counts_.sandbox_stalls;
      }
      push(now_ + delay, kWorldNode, [this, sb, name, epoch] { resource_write(sb, name, epoch); });
    }
    push(now_ + cfg_.write_interval_ns / 2 + proc_rng_.range(0, cfg_.write_interval_ns), kWorldNode,
         [this, sb] { sandbox_write(sb); });
  }

  void resource_write(SandboxId sb, NameId name, Epoch epoch) {
    const FenceGate::Admission a = gate_.admit(name, epoch);
    WriteRecord w{now_, name, epoch, sb, a.accepted(), a.highest};
    if (w.accepted) ++counts_.writes_accepted;
    else ++counts_.writes_rejected;
    record(kWorldNode, w.accepted ? "write_accepted" : "write_rejected", sb.lo, epoch);
    if (auto v = inv_.resource_fenced(w)) fail(*v);
  }

  void check_single_holder() {
    passing_.clear();
    for (const auto& [sb, sp] : running_) {
      Sandbox& s = *sp;
      NameId name;
      Epoch epoch = 0;
      if (sups_[s.worker]->check_deadline(sb, local(1 + static_cast<int>(s.worker)), &name, &epoch)) {
        passing_.push_back(Passing{name, sb, epoch, s.worker});
        s.fate.passed = true;
      }
    }
    // No pause excuses an overlap: a sandbox passes check_deadline only until the valid_until its
    // supervisor published, counted from the heartbeat's send on the worker's clock, which keeps
    // counting through a pause; a frozen supervisor cannot extend it. (An over-budget pause
    // excuses only a late kill: kill_before_expiry.)
    if (auto v = inv_.single_holder(passing_, now_)) {
      fail(*v);
      return;
    }
    if (const LockdNode* a = authority()) {
      const LeaseTable& t = a->table();
      if (auto v = inv_.current_grant(std::span<const Passing>(passing_),
                                      [&](NameId id) {
                                        const LockState s = t.state(id);
                                        // Revoked, guarded: its holder may still pass until it is killed.
                                        if (const auto h = held_.find(id);
                                            s.phase != LockPhase::held && h != held_.end() && revoke_guards(id, h->second.epoch))
                                          return RestoredName{true, h->second.owner, h->second.epoch};
                                        return RestoredName{s.phase == LockPhase::held, s.owner, s.epoch};
                                      },
                                      now_))
        fail(*v);
    }
    // Exited sandboxes are forgotten once nothing can refer to them any more.
    if (++sweep_ % 4096 == 0) {
      for (auto it = sandboxes_.begin(); it != sandboxes_.end();)
        it = it->second.fate.exited && it->second.fate.exited_at_ns + 10 * cfg_.timing.ttl_ns < now_ ? sandboxes_.erase(it)
                                                                                               : std::next(it);
    }
  }

  // ---- trace -----------------------------------------------------------------------------------
  void mix(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      hash_ ^= (v >> (i * 8)) & 0xff;
      hash_ *= 0x100000001b3ULL;
    }
  }
  void record(int node, std::string_view what, std::uint64_t a, std::uint64_t b) {
    mix(static_cast<std::uint64_t>(now_));
    mix(static_cast<std::uint64_t>(node + 1));
    for (char c : what) {
      hash_ ^= static_cast<std::uint8_t>(c);
      hash_ *= 0x100000001b3ULL;
    }
    mix(a);
    mix(b);
    if (!trace_) return;
    char line[160];
    const char* who = node == kWorldNode ? "world" : node == kLockd ? "lockd" : "sup";
    char who_buf[16];
    if (const int k = replica_at(node); k >= 0) {
      std::snprintf(who_buf, sizeof who_buf, "lockd%d", k);
      who = who_buf;
    } else if (node > 0) {
      std::snprintf(who_buf, sizeof who_buf, "sup%d", node - 1);
      who = who_buf;
    }
    std::snprintf(line, sizeof line, "%12.6f  %-6s %-20.*s %s %" PRIu64, static_cast<double>(now_) / 1e9, who,
                  static_cast<int>(what.size()), what.data(), short_id(a).c_str(), b);
    trace_(line);
  }

  void fail(const Violation& v) {
    if (violation_) return;
    violation_ = v;
    record(kWorldNode, "VIOLATION", 0, 0);
    if (trace_) trace_("violation: " + v.invariant + ": " + v.detail);
  }

  const SimConfig cfg_;  ///< the caller's, with this seed's drawn kill_after
  const bool queues_ = cfg_.queues();
  const TraceFn& trace_;
  Rng rng_;
  Rng net_rng_{0};
  Rng proc_rng_{0};
  wire::WireKey cluster_;
  std::vector<std::string> names_;
  std::vector<NameId> name_ids_;

  std::priority_queue<Event, std::vector<Event>, Later> queue_;
  std::uint64_t next_seq_ = 0;
  std::int64_t now_ = 0;
  std::uint64_t events_ = 0;
  std::vector<NodeClock> clocks_;
  std::vector<std::int64_t> paused_until_;
  std::vector<std::int64_t> wake_at_;
  std::vector<std::uint64_t> wake_gen_;

  std::vector<Path> up_, down_;
  std::vector<Partition> partitions_;
  std::vector<Congestion> congestions_;
  std::vector<Pause> pauses_;
  Rng step_pause_rng_{0};
  Rng attack_rng_{0};
  std::vector<std::int64_t> last_step_pause_end_;  ///< per node: when its last intra-step pause ended
  /// While a node's step runs: how long after the step's clock read its effects happen (an
  /// intra-step pause); 0 otherwise.
  std::int64_t effects_delay_ns_ = 0;

  DurableTable table_;
  SimDisk disk_{table_};
  std::int64_t disk_base_ns_ = 0;
  double disk_slow_ = 0;
  Rng disk_fail_rng_{0};
  double disk_fail_ = 0;
  Rng crash_rng_{0};
  std::deque<std::int64_t> crashes_at_batch_;  ///< armed crashes (their down time), fired at the next batch  ///< per batch, before heal_ns (half the seeds with faults: 0.01%..0.4%)
  std::unique_ptr<LockdNode> lockd_;
  // lockd on etcd (SimConfig::lockd_replicas > 1): the replicas (null while one is down), their
  // incarnations and election call sequence numbers, the replica each worker's link targets.
  std::unique_ptr<SimEtcd> etcd_;
  std::vector<std::unique_ptr<LockdReplica>> replicas_;
  std::vector<std::uint64_t> replica_inc_;
  std::vector<std::uint64_t> call_seq_;
  std::vector<std::uint32_t> target_;
  Rng etcd_rng_{0};
  std::vector<EtcdPath> etcd_paths_;
  std::vector<EtcdCut> etcd_cuts_;
  /// The acknowledged grants current at the authority after its last step (a takeover must
  /// have every one of them).
  std::vector<Invariants::AckedGrant> authority_current_;
  std::int64_t authority_rev_ = 0;  ///< the newest leadership taken over (its revision)
  std::uint64_t incarnation_ = 1;
  std::vector<std::unique_ptr<SupervisorNode>> sups_;
  std::unique_ptr<wire::Sender> hostile_;
  WorkerId hostile_id_;
  std::vector<WorkerId> worker_ids_;  ///< the supervisors' (the hostile worker forges beats in their names)
  std::map<NameId, Invariants::AckedGrant> sniffed_;  ///< the latest grant seen per name
  Rng hostile_rng_{0};
  Rng forge_rng_{0};
  std::uint64_t hostile_next_request_ = 1;
  std::unique_ptr<wire::Sender> operator_;  ///< the operator's (cluster key: root authority)
  Rng operator_rng_{0};
  std::uint64_t operator_next_request_ = std::uint64_t{1} << 40;  // apart from the hostile worker's ids
  std::unique_ptr<wire::Authenticator> operator_auth_;  ///< authenticates lockd's answers to the operator
  Rng transfer_rng_{0};
  /// The operator's transfer in progress (at most one).
  struct OperatorTransfer {
    NameId name;
    SandboxId from;
    Epoch epoch = 0;      ///< from's epoch
    SandboxId to;         ///< the receiver (nil until its unnamed run is answered)
    std::uint32_t to_worker = 0;
    bool begun = false;   ///< TransferBegin answered: TransferComplete is polled
    Epoch new_epoch = 0;  ///< begun: the transfer's epoch
    std::uint64_t request_id = 0;
    std::uint64_t sends = 0;  ///< generation of the pending retry
  };
  std::optional<OperatorTransfer> transfer_;

  std::map<SandboxId, Sandbox> sandboxes_;
  /// The sandboxes of sandboxes_ not exited yet, in the same order (the ones the per-step
  /// check reads; exited ones stay in sandboxes_ a while for kill_before_expiry).
  std::map<SandboxId, Sandbox*> running_;
  std::int64_t kill_ticks_max_ = 0;
  FenceGate gate_;

  Invariants inv_;
  std::vector<Passing> passing_;
  std::map<NameId, Invariants::AckedGrant> acked_;
  std::set<std::pair<NameId, Epoch>> acknowledged_;  ///< every (name, epoch) lockd sent Held for
  std::map<NameId, Epoch> told_epoch_;  ///< per name, the highest epoch lockd sent a grant of (Held or Acquiring)
  std::vector<Invariants::AckedGrant> crash_current_;
  std::map<NameId, HeldView> held_;
  std::map<NameId, std::int64_t> first_grant_after_heal_;
  std::optional<Violation> violation_;
  std::uint64_t hash_ = 0xcbf29ce484222325ULL;
  std::uint64_t sweep_ = 0;
  FaultCounts counts_;
};

}  // namespace

RunResult run_seed(const SimConfig& cfg, const TraceFn& trace) {
  if (const Status why = cfg.validate(); !why.ok()) throw std::invalid_argument(why.message());
  World w(cfg, trace);
  return w.run();
}

}  // namespace leasehold::sim
