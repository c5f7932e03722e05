#include "leasehold/sim/supervisor_node.hpp"

#include "leasehold/lease/assert.hpp"
#include "leasehold/shm/table.hpp"
#include "leasehold/supervisor/control.hpp"
#include "leasehold/supervisor/ports.hpp"
#include "leasehold/supervisor/rt_core.hpp"
#include "leasehold/supervisor/shm_slot_table.hpp"
#include "leasehold/supervisor/supervisor_core.hpp"
#include "leasehold/wire/protocol.hpp"
#include "leasehold/wire/replay.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace leasehold::sim {
namespace {

/// Slots of each worker's shm table (a freed slot cools down before reuse, so more than the
/// sandboxes a worker runs at once).
constexpr std::uint32_t kSlots = 64;
constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max();
constexpr std::uint64_t kRtIdlePollNs = 100 * kMs;

/// The event name of one of the core's log lines ("event=started sandbox=..." -> "started").
std::string_view event_of(std::string_view line) {
  constexpr std::string_view kKey = "event=";
  if (line.substr(0, kKey.size()) != kKey) return "log";
  line.remove_prefix(kKey.size());
  return line.substr(0, line.find(' '));
}

}  // namespace

// The supervisor's own sandbox logic (SupervisorCore) and the rt thread's (RtCore), behind
// simulated ports: this struct is the host, the lockd link, the rt thread's command queue and
// kill path, and the control socket's client. The shm table is a real memfd table: the sandbox
// runtimes' check is TableReader::check_deadline_at on it.
struct SupervisorNode::Impl final : SandboxHost, LockdPort, RtPort, ControlPort, RtKillPath, RtCommandSource {
  /// One call to lockd, retried with a fresh seq until its deadline (LockdLink::call).
  struct Call {
    wire::Datagram dg;
    std::int64_t first_send_ns = 0;
    std::int64_t deadline_ns = 0;
    std::int64_t next_retry_ns = 0;
    std::uint32_t attempts = 1;
    LockdCallback done;
  };
  /// A sandbox as the host sees it: created at its gate, released to run (the world's
  /// process), or gone.
  struct Hosted {
    SandboxSpec spec;
    enum class State : std::uint8_t { gated, running, exited } state = State::gated;
    int handle = 0;  ///< the fake pidfd in its KillTarget
  };
  /// A 2-phase acquire of the control plane (DESIGN.md "creation flows"): answered Acquiring,
  /// the sandbox is scheduled, then the supervisor is told to expect it (expect-commit).
  struct Scheduling {
    std::int64_t at_ns = 0;
    std::string name;
    SandboxId sandbox;
    Epoch epoch = 0;
  };

  Impl(const SimConfig& c, std::uint32_t i, WorkerId w, const wire::WireKey& key, std::span<const std::string> n,
       Rng r, SupervisorEnv& e, std::int64_t now)
      : cfg(c),
        index(i),
        self(w),
        preemptible(c.preemptible()),
        queues(c.queues()),
        names(n.begin(), n.end()),
        rng(r),
        queue_rng(c.seed ^ 0x9a3e5e9a3e5e9a3eULL ^ (std::uint64_t{i + 1} * 0x9e3779b97f4a7c15ULL)),
        env(e),
        sender(w, 1, key),
        auth(key),
        writer(make_table(i, c.timing.kill_after_ns)),
        slot_table(writer),
        reader(shm::TableReader::open(writer_location(writer))),
        deadlines(kSlots, 0),
        now_ns(now) {
    LEASEHOLD_ASSERT(now > 0);
    RtHooks hooks;
    hooks.context = this;
    hooks.current_deadline_ns = [](void* ctx, std::uint32_t slot) { return static_cast<Impl*>(ctx)->deadlines[slot]; };
    hooks.revoke_slot = [](void* ctx, std::uint32_t slot) { static_cast<Impl*>(ctx)->writer.revoke(slot); };
    hooks.writer_heartbeat = [](void* ctx, std::uint64_t t) { static_cast<Impl*>(ctx)->writer.heartbeat(t); };
    hooks.record_kill = [](void* ctx, std::uint32_t slot, const KillRecord& rec) {
      static_cast<Impl*>(ctx)->rt_events.push_back(RtKillEvent{slot, rec});
    };
    // The thread's idle wake-ups only beat the writer heartbeat here: every 100 ms, well inside
    // the table's liveness timeout (>= 800 ms), instead of production's command poll, which
    // would be most of a run's events. Commands are taken one production poll after the first
    // of them was queued, the latest production takes them (see rt_step).
    rt = std::make_unique<RtCore>(kSlots, static_cast<std::uint64_t>(c.timing.wheel_granularity_ns), kRtIdlePollNs,
                                  hooks, *this, static_cast<std::uint64_t>(now));
    writer.heartbeat(static_cast<std::uint64_t>(now));

    SupervisorCoreConfig sc;
    sc.worker = w;
    sc.mode = preemptible ? SupervisorMode::preemptible : SupervisorMode::lease;
    sc.ttl_ms = static_cast<std::uint64_t>(c.timing.ttl_ns / kMs);
    sc.kill_after_ms = static_cast<std::uint64_t>(c.timing.kill_after_ns / kMs);
    sc.heartbeat_interval_ms = static_cast<std::uint64_t>(c.heartbeat_interval_ns / kMs);
    sc.slots = kSlots;
    sc.rt_command_poll_ns = kDefaultRtCommandPollNs;  // the latency rt_step gives its commands
    sc.lockd_ttl_ms = sc.ttl_ms;
    sc.stop_grace_ms = kDefaultStopGraceMs;  // as the daemon's default (a stop sends SIGTERM first)
    SupervisorCoreHooks hk;
    hk.log = [this](const std::string& line) { env.note(index, event_of(line), 0, 0); };
    hk.new_sandbox_id = [this] { return SandboxId{rng.next() | 1, rng.next()}; };
    core = std::make_unique<SupervisorCore>(std::move(sc), std::move(hk), *this, *this, *this, *this, slot_table);

    next_heartbeat_ns = now + c.heartbeat_interval_ns;
    next_create_ns = now + rng.range(0, 500 * kMs);
    if (preemptible) start_worker_liveness();
    else ready = true;
  }

  /// The table as the daemon makes it: a memfd, the writer counted dead after min(1 s,
  /// kill_after) without a heartbeat (Supervisor::Impl::start).
  static shm::TableWriter make_table(std::uint32_t worker, std::int64_t kill_after_ns) {
    shm::TableOptions o;
    o.liveness_timeout_ns = static_cast<std::uint64_t>(std::min<std::int64_t>(1 * kS, kill_after_ns));
    o.location = std::string(shm::kMemfdPrefix) + "leasehold-sim-" + std::to_string(worker);
    o.slot_count = kSlots;
    o.slot_cooldown_ns = 200 * kMs;
    return shm::TableWriter::create(o);
  }
  static std::string writer_location(const shm::TableWriter& w) { return w.reader_location(); }

  const SimConfig& cfg;
  std::uint32_t index;
  WorkerId self;
  bool preemptible;
  bool queues;  ///< this run queues named runs (SimConfig::queues())
  std::vector<std::string> names;
  Rng rng;
  /// The queued runs' draws (which runs queue, their timeouts, clients that close): a stream
  /// of its own, so a run that does not queue draws what it drew before queued runs existed.
  Rng queue_rng;
  SupervisorEnv& env;
  wire::Sender sender;
  wire::Authenticator auth;
  shm::TableWriter writer;
  ShmSlotTable slot_table;
  shm::TableReader reader;
  // The rt thread: its core, the commands queued for it, the per-slot deadline it re-reads.
  std::vector<std::uint64_t> deadlines;
  std::deque<RtCommand> rt_queue;
  std::uint64_t rt_seq = 0;
  bool rt_stopped = false;
  std::unique_ptr<RtCore> rt;
  std::uint64_t rt_wake_ns = 0;
  std::uint64_t rt_commands_due_ns = 0;  ///< queued commands are taken by then (rt_step)
  std::vector<RtKillEvent> rt_events;
  std::unique_ptr<SupervisorCore> core;
  // The host.
  std::map<SandboxId, Hosted> hosted;
  std::vector<SandboxId> handles;  ///< by fake pidfd
  std::vector<SandboxId> exits_due;  ///< gone without a world process: reported after this step
  // The link.
  std::map<std::uint64_t, Call> calls;
  std::uint64_t next_request_id = 1;
  // The workload (the control socket's clients and the control plane).
  ControlClientId next_client = 1;
  std::vector<Scheduling> scheduling;
  /// Clients of queued runs that close their connection at a time (if still unanswered then).
  struct Closing {
    ControlClientId client = 0;
    std::int64_t at_ns = 0;
  };
  std::vector<Closing> closing;
  std::size_t placing = 0;  ///< control-plane acquires in flight or scheduled
  bool ready = false;       ///< preemptible: the start-up worker beat was answered
  std::int64_t next_heartbeat_ns = 0;
  std::int64_t next_create_ns = 0;
  std::int64_t now_ns = 0;

  // ---- SandboxHost -----------------------------------------------------------------------
  std::optional<PortError> open_tokens(const SandboxId&) override { return std::nullopt; }
  /// The sandbox's token channel: a sandbox learns its grant's epoch there (a sandbox named
  /// after it started - a transfer's receiver - has no LEASEHOLD_EPOCH), and checks with it.
  shm::TableErrc publish_token(const SandboxId& id, Epoch epoch, std::span<const std::uint8_t>) override {
    if (const auto it = hosted.find(id); it != hosted.end()) it->second.spec.epoch = epoch;
    return shm::TableErrc::ok;
  }
  void clear_tokens(const SandboxId&) override {}
  std::optional<PortError> create(const SandboxSpec& spec, HostedSandbox& out) override {
    Hosted h;
    h.spec = spec;
    h.handle = static_cast<int>(handles.size());
    handles.push_back(spec.id);
    hosted[spec.id] = std::move(h);
    out.pid = 1000 + static_cast<pid_t>(handles.size());
    out.uid = 0;
    out.at_gate = true;
    env.note(index, "created", spec.id.lo, spec.epoch);
    return std::nullopt;
  }
  KillTarget kill_target(const SandboxId& id) const override {
    KillTarget t;
    const auto it = hosted.find(id);
    if (it == hosted.end()) return t;
    t.pidfd = it->second.handle;
    t.pgid = 1000 + it->second.handle;
    return t;
  }
  std::optional<PortError> release(const SandboxId& id, std::uint64_t exec_by_ns) override {
    const auto it = hosted.find(id);
    if (it == hosted.end() || it->second.state != Hosted::State::gated) return std::nullopt;
    if (exec_by_ns != 0 && static_cast<std::uint64_t>(now_ns) >= exec_by_ns)
      return PortError{ControlError::killswitch, "its kill deadline was less than one rt command poll away"};
    it->second.state = Hosted::State::running;
    const Sandbox* s = core->sandboxes().find(id);
    env.spawn(index, id, s != nullptr ? s->name_id : NameId{}, it->second.spec.epoch);
    return std::nullopt;
  }
  void abandon(const SandboxId& id) override {
    const auto it = hosted.find(id);
    if (it == hosted.end() || it->second.state != Hosted::State::gated) return;
    gone_at_gate(it->second);
  }
  void kill(const SandboxId& id, std::uint64_t) override { kill_hosted(id, "host_kill"); }
  void terminate(const SandboxId& id) override {
    const auto it = hosted.find(id);
    if (it != hosted.end() && it->second.state == Hosted::State::running) env.terminate(index, id);
  }
  ReapedSandbox reap(const SandboxId& id) override {
    hosted.erase(id);
    return ReapedSandbox{0, false};
  }
  bool leaf_emptied(const SandboxId&) override { return true; }  // no process outlives its kill here
  void forget(const SandboxId& id) override { hosted.erase(id); }

  void gone_at_gate(Hosted& h) {
    h.state = Hosted::State::exited;
    exits_due.push_back(h.spec.id);
  }
  void kill_hosted(const SandboxId& id, std::string_view why) {
    const auto it = hosted.find(id);
    if (it == hosted.end()) return;
    switch (it->second.state) {
      case Hosted::State::gated: gone_at_gate(it->second); return;
      case Hosted::State::running: env.kill(index, id, why); return;  // the world reports its death
      case Hosted::State::exited: return;
    }
  }

  // ---- RtKillPath ------------------------------------------------------------------------
  KillRecord kill(const KillTarget& target, std::uint64_t deadline_ns) noexcept override {
    KillRecord r;
    r.deadline_ns = deadline_ns;
    r.issued_ns = static_cast<std::uint64_t>(now_ns);
    r.path = KillPath::cgroup_kill;
    if (target.pidfd >= 0 && static_cast<std::size_t>(target.pidfd) < handles.size())
      kill_hosted(handles[static_cast<std::size_t>(target.pidfd)], "rt_kill");
    return r;
  }
  int confirm_dead(const KillTarget& target) noexcept override {
    if (target.pidfd < 0 || static_cast<std::size_t>(target.pidfd) >= handles.size()) return 1;
    const auto it = hosted.find(handles[static_cast<std::size_t>(target.pidfd)]);
    return it == hosted.end() || it->second.state == Hosted::State::exited ? 1 : 0;
  }

  // ---- RtPort ----------------------------------------------------------------------------
  RtSubmitted submit(RtOp op, std::uint32_t slot, std::uint64_t deadline_ns, const KillTarget& target) {
    if (rt_stopped) return RtSubmitted{0, RtRefusal::stopped};
    if (slot >= kSlots) return RtSubmitted{0, RtRefusal::bad_slot};
    RtCommand c;
    c.seq = ++rt_seq;
    c.op = op;
    c.slot = slot;
    c.deadline_ns = deadline_ns;
    c.target = target;
    if (rt_queue.empty()) rt_commands_due_ns = static_cast<std::uint64_t>(now_ns) + kDefaultRtCommandPollNs;
    rt_queue.push_back(c);
    return RtSubmitted{c.seq, RtRefusal::none};
  }
  RtSubmitted arm(std::uint32_t slot, std::uint64_t valid_until_ns, const KillTarget& target) override {
    set_deadline(slot, valid_until_ns);
    return submit(RtOp::arm, slot, valid_until_ns, target);
  }
  void set_deadline(std::uint32_t slot, std::uint64_t valid_until_ns) override {
    if (slot < kSlots) deadlines[slot] = valid_until_ns;
  }
  RtSubmitted disarm(std::uint32_t slot) override { return submit(RtOp::disarm, slot, 0, {}); }
  RtSubmitted kill_now(std::uint32_t slot) override { return submit(RtOp::kill_now, slot, 0, {}); }
  bool applied(std::uint64_t seq) const override { return rt->applied_seq() >= seq; }
  void stop() override { rt_stopped = true; }

  // ---- RtCommandSource -------------------------------------------------------------------
  bool pop(RtCommand& out) noexcept override {
    if (rt_queue.empty()) return false;
    out = rt_queue.front();
    rt_queue.pop_front();
    return true;
  }

  // ---- ControlPort -----------------------------------------------------------------------
  std::map<ControlClientId, ControlRequest> asked;
  SandboxId last_unnamed;  ///< the sandbox the last unnamed run started (nil: refused)
  void reply(ControlClientId client, const std::string& line) override {
    const auto it = asked.find(client);
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    const bool ok = j.is_object() && j.value("ok", false);
    const bool lock_delay = !ok && j.is_object() && j.value("reason", std::string()) == "lock_delay";
    env.note(index, ok ? "control_ok" : lock_delay ? "refused_lock_delay" : "control_refused", client, 0);
    if (it == asked.end()) return;
    const ControlRequest req = std::move(it->second);
    asked.erase(it);
    if (ok && req.op == ControlOp::run && !req.name)  // an unnamed run answers with its sandbox id
      last_unnamed = SandboxId::parse(j.value("sandbox", std::string())).value_or(SandboxId{});
    // A refused expect-commit leaves the control plane's Acquiring record: it aborts it.
    if (!ok && req.op == ControlOp::expect_commit) release_name(*req.name, *req.sandbox, req.epoch);
  }
  ControlClientId request(ControlRequest req) {
    const ControlClientId client = next_client++;
    req.argv = {"sim-sandbox"};
    req.caller_uid = 0;
    req.caller_gid = 0;
    asked.emplace(client, req);
    core->on_request(client, std::move(req), static_cast<std::uint64_t>(now_ns));
    return client;
  }
  /// A queued run's client that gave up closes its connection (`leasehold run --wait` interrupted):
  /// the supervisor leaves lockd's FIFO for it, or stops its sandbox once started.
  void close_clients() {
    for (auto it = closing.begin(); it != closing.end();) {
      if (now_ns < it->at_ns) {
        ++it;
        continue;
      }
      const ControlClientId client = it->client;
      it = closing.erase(it);
      if (asked.erase(client) == 0) continue;  // answered already: nothing waits on it
      env.note(index, "client_closed", client, 0);
      core->on_client_closed(client);
    }
  }

  // ---- LockdPort -------------------------------------------------------------------------
  void call(const wire::Body& body, std::int64_t deadline_ns, LockdCallback on_done) override {
    send_call(next_request_id++, body, deadline_ns, std::move(on_done));
  }
  /// The control plane's own client (`leasehold acquire`): its request ids have kControlPlaneBit
  /// set, and an answer that comes after its call gave up is dropped there; it never reaches the
  /// supervisor's late-answer handler, which would give back a grant it was about to be told to
  /// expect.
  static constexpr std::uint64_t kControlPlaneBit = std::uint64_t{1} << 63;
  void control_plane_call(const wire::Body& body, std::int64_t deadline_ns, LockdCallback on_done) {
    send_call(kControlPlaneBit | next_request_id++, body, deadline_ns, std::move(on_done));
  }
  void send_call(std::uint64_t rid, const wire::Body& body, std::int64_t deadline_ns, LockdCallback on_done) {
    Call c;
    c.done = std::move(on_done);
    c.first_send_ns = now_ns;
    c.deadline_ns = deadline_ns;
    c.next_retry_ns = now_ns + cfg.retry_interval_ns;
    if (!sender.seal(rid, body, c.dg)) {
      c.deadline_ns = now_ns;  // fails at the next step (the callback never runs within call())
      c.next_retry_ns = kNever;
    } else {
      env.send_to_lockd(index, c.dg.view());
    }
    calls.emplace(rid, std::move(c));
  }
  void on_answer(std::uint64_t rid, wire::Body body) {
    if (const auto* e = std::get_if<wire::Error>(&body); e != nullptr && e->code == wire::ErrorCode::not_leader) {
      // Authenticated, so a lockd's: it changed nothing. The call stays and its next retry goes
      // to the lockd named.
      env.redirect(index, e->message);
      return;
    }
    const auto it = calls.find(rid);
    if (it == calls.end()) {
      if ((rid & kControlPlaneBit) == 0) core->on_late_answer(body, static_cast<std::uint64_t>(now_ns));
      return;
    }
    if (const auto* e = std::get_if<wire::Error>(&body); e != nullptr && e->seq_floor != 0) {
      // stale_seq / replayed: the seq moves above lockd's window; the retry goes out as planned.
      sender.advance_to(e->seq_floor);
      return;
    }
    Call c = std::move(it->second);
    calls.erase(it);
    LockdReply r;
    r.status = RequestStatus::answered;
    r.body = std::move(body);
    r.first_send_ns = c.first_send_ns;
    r.attempts = c.attempts;
    r.key_id = 1;
    r.now_ns = now_ns;
    c.done(std::move(r));
  }
  void retries() {
    for (auto it = calls.begin(); it != calls.end();) {
      Call& c = it->second;
      if (now_ns >= c.deadline_ns) {
        Call gone = std::move(c);
        it = calls.erase(it);
        LockdReply r;
        r.status = RequestStatus::deadline_passed;
        r.first_send_ns = gone.first_send_ns;
        r.attempts = gone.attempts;
        r.problem = "no answer from lockd before the deadline";
        r.now_ns = now_ns;
        gone.done(std::move(r));
        continue;
      }
      if (now_ns >= c.next_retry_ns) {
        sender.restamp(c.dg.buffer().first(c.dg.size));
        env.send_to_lockd(index, c.dg.view());
        c.next_retry_ns = now_ns + cfg.retry_interval_ns;
        ++c.attempts;
      }
      ++it;
    }
  }

  // ---- start-up, workload ----------------------------------------------------------------
  /// Preemptible mode: the daemon's start-up worker beat (Supervisor::Impl::start), retried
  /// until lockd answers; worker liveness counts from its send.
  void start_worker_liveness() {
    call(wire::WorkerHeartbeat{self, {}}, now_ns + 2 * cfg.timing.ttl_ns, [this](LockdReply r) {
      const auto* w = r.ok() ? std::get_if<wire::WorkerAck>(&*r.body) : nullptr;
      if (w == nullptr || std::int64_t{w->liveness_ttl_ms} * kMs < cfg.timing.ttl_ns) {
        start_worker_liveness();
        return;
      }
      core->heartbeat().start_worker_liveness(static_cast<std::uint64_t>(r.first_send_ns));
      ++core->counters().worker_beats_acked;
      ready = true;
      env.note(index, "worker_live", 0, 0);
    });
  }
  void release_name(const std::string& name, const SandboxId& sb, Epoch epoch) {
    control_plane_call(wire::Release{name_id_of(name), sb, epoch}, now_ns + 1 * kS, [](LockdReply) {});
  }
  void workload() {
    if (now_ns < next_create_ns) return;
    if (!ready) {  // no named sandbox before the start-up worker beat is answered
      next_create_ns = now_ns + cfg.heartbeat_interval_ns;
      return;
    }
    next_create_ns = now_ns + rng.range(100 * kMs, 1500 * kMs);
    // Queued runs that still wait in lockd's FIFO run nothing yet: they have a bound of their own
    // (SimConfig::waiting_runs_per_worker_max), so a worker whose runs wait for held names still
    // asks for the others, and every name keeps being asked for.
    std::size_t waiting = 0;
    if (queues)
      for (const auto& [id, s] : core->sandboxes())
        if (core->queue_place(id)) ++waiting;
    if (core->sandboxes().size() - waiting + placing >= cfg.sandboxes_per_worker_max) return;
    const std::string name = names[rng.below(names.size())];
    if (!rng.chance(cfg.two_phase_share)) {
      ControlRequest req;
      req.op = ControlOp::run;
      req.name = name;
      if (queues && waiting < cfg.waiting_runs_per_worker_max && queue_rng.chance(cfg.queued_run_share)) {
        // `leasehold run --wait --name NAME [--queue-timeout-ms T]`: waits in lockd's FIFO.
        req.queue = true;
        if (queue_rng.chance(0.3)) req.queue_timeout_ms = static_cast<std::uint64_t>(queue_rng.range(200, 6000));
        env.note(index, "run_queued", name_id_of(name).lo, req.queue_timeout_ms.value_or(0));
        const ControlClientId client = request(std::move(req));
        if (queue_rng.chance(0.1)) closing.push_back(Closing{client, now_ns + queue_rng.range(50 * kMs, 5 * kS)});
        return;
      }
      env.note(index, "run", name_id_of(name).lo, 0);
      request(std::move(req));
      return;
    }
    // The control plane's 2-phase acquire (`leasehold acquire --two-phase` and then
    // expect-commit on the chosen worker), with this worker's key.
    const SandboxId sb{rng.next() | 1, rng.next()};
    ++placing;
    env.note(index, "acquire_2phase", name_id_of(name).lo, sb.lo);
    wire::Acquire a{name, sb, self, static_cast<std::uint32_t>(cfg.timing.ttl_ns / kMs), true};
    control_plane_call(a, now_ns + cfg.acquire_timeout_ns, [this, name, sb](LockdReply r) {
      const auto* g = r.ok() ? std::get_if<wire::Grant>(&*r.body) : nullptr;
      if (g == nullptr || g->holder != sb || g->state != LockPhase::acquiring || g->epoch == 0) {
        --placing;
        if (g != nullptr && g->holder == sb) release_name(name, sb, g->epoch);
        return;
      }
      // Scheduling the sandbox takes a while (image pull, cgroup, exec), mostly well within the
      // acquiring TTL, sometimes close to its end (the Commit then rides the next heartbeat tick
      // and may come too late: refused, the sandbox is not started).
      const std::int64_t left = std::int64_t{g->ttl_ms} * kMs;
      const std::int64_t delay = rng.chance(0.25) ? rng.range(left * 7 / 10, left) : rng.range(0, left / 2);
      scheduling.push_back(Scheduling{now_ns + delay, name, sb, g->epoch});
    });
  }
  void expect_commits() {
    for (auto it = scheduling.begin(); it != scheduling.end();) {
      if (now_ns < it->at_ns) {
        ++it;
        continue;
      }
      ControlRequest req;
      req.op = ControlOp::expect_commit;
      req.name = it->name;
      req.sandbox = it->sandbox;
      req.epoch = it->epoch;
      it = scheduling.erase(it);
      --placing;
      env.note(index, "expect_commit", req.sandbox->lo, req.epoch);
      request(std::move(req));
    }
  }

  // ---- one step --------------------------------------------------------------------------
  /// The rt thread's wake-up, when it is due or queued commands are (production takes them
  /// within its command poll; the simulator at the end of it, the latest), then the kill records.
  void rt_step() {
    const auto now = static_cast<std::uint64_t>(now_ns);
    if (now >= rt_wake_ns || (!rt_queue.empty() && now >= rt_commands_due_ns)) {
      rt->step(now, std::min(now, rt_wake_ns), *this);
      rt_wake_ns = rt->next_wake_ns(now, !rt_queue.empty());
    }
    std::vector<RtKillEvent> events;
    events.swap(rt_events);
    for (const RtKillEvent& e : events) core->on_rt_kill(e, now);
  }
  /// Everything that happened inside this step and reports back: exits of sandboxes that never
  /// ran, the rt thread's kill records, disarms it applied.
  void settle() {
    for (int round = 0; round < 16; ++round) {
      rt_step();
      if (core->disarms_pending()) core->check_disarms(static_cast<std::uint64_t>(now_ns));
      if (exits_due.empty() && rt_events.empty()) return;  // queued commands wait for their poll
      std::vector<SandboxId> due;
      due.swap(exits_due);
      for (const SandboxId& id : due) core->on_exit(id, static_cast<std::uint64_t>(now_ns));
    }
  }
  std::int64_t next_wake() const {
    std::int64_t t = std::min({next_create_ns, next_heartbeat_ns, static_cast<std::int64_t>(rt_wake_ns)});
    if (!rt_queue.empty()) t = std::min(t, static_cast<std::int64_t>(rt_commands_due_ns));
    for (const auto& [id, c] : calls) t = std::min({t, c.next_retry_ns, c.deadline_ns});
    for (const Scheduling& sc : scheduling) t = std::min(t, sc.at_ns);
    for (const Closing& c : closing) t = std::min(t, c.at_ns);
    return t;
  }
};

SupervisorNode::SupervisorNode(const SimConfig& cfg, std::uint32_t index, WorkerId id, const wire::WireKey& key,
                               std::span<const std::string> names, Rng rng, SupervisorEnv& env, std::int64_t now_ns)
    : impl_(std::make_unique<Impl>(cfg, index, id, key, names, rng, env, now_ns)) {}

SupervisorNode::~SupervisorNode() = default;

WorkerId SupervisorNode::id() const noexcept { return impl_->self; }

SupervisorNode::QueuedRuns SupervisorNode::queued_runs() const noexcept {
  const SupervisorCore::Counters& c = impl_->core->counters();
  return QueuedRuns{c.runs_queued, c.queue_grants, c.queue_timeouts};
}

void SupervisorNode::on_datagram(std::span<const std::uint8_t> bytes, std::int64_t now_ns) {
  Impl& m = *impl_;
  m.now_ns = now_ns;
  wire::DecodeResult d = wire::decode(bytes, &m.auth);
  if (!d) return;  // not authentic or malformed: dropped (LockdLink counts answers_bad)
  if (!wire::is_request(d.header.type)) {
    m.on_answer(d.header.request_id, std::move(d.body));
    m.settle();
    return;
  }
  // lockd's own requests (LockdLink::on_unsolicited): answered at once under the same request id.
  wire::Body answer;
  if (const auto* q = std::get_if<wire::IsRunning>(&d.body)) {
    const bool running = m.core->is_running(*q);
    m.env.note(m.index, running ? "is_running_yes" : "is_running_no", q->sandbox.lo, q->epoch);
    answer = wire::RunningAnswer{q->name_id, q->sandbox, q->epoch, running};
  } else if (const auto* rv = std::get_if<wire::Revoked>(&d.body)) {
    const bool running = m.core->on_revoked(*rv, static_cast<std::uint64_t>(now_ns));
    answer = wire::RevokedAck{rv->name_id, rv->epoch, running};
  } else {
    return;
  }
  wire::Datagram out;
  if (m.sender.seal(d.header.request_id, answer, out)) m.env.send_to_lockd(m.index, out.view());
  m.settle();
}

void SupervisorNode::on_sandbox_exit(SandboxId sandbox, std::int64_t now_ns) {
  Impl& m = *impl_;
  m.now_ns = now_ns;
  const auto it = m.hosted.find(sandbox);
  if (it == m.hosted.end() || it->second.state == Impl::Hosted::State::exited) return;
  it->second.state = Impl::Hosted::State::exited;
  m.core->on_exit(sandbox, static_cast<std::uint64_t>(now_ns));
  m.settle();
}

std::int64_t SupervisorNode::tick(std::int64_t now_ns) {
  Impl& m = *impl_;
  m.now_ns = now_ns;
  m.settle();
  // As the daemon's heartbeat timer, which starts once its start-up worker beat is answered
  // (Supervisor::Impl::start): a periodic liveness ack must not start liveness first, or the
  // start-up answer, sent earlier, would move its deadline back.
  if (now_ns >= m.next_heartbeat_ns) {
    if (m.ready) m.core->on_heartbeat_tick(static_cast<std::uint64_t>(now_ns));
    m.next_heartbeat_ns = now_ns + m.cfg.heartbeat_interval_ns;
  }
  m.retries();
  m.expect_commits();
  m.close_clients();
  m.workload();
  m.settle();
  return m.next_wake();
}

SandboxId SupervisorNode::run_unnamed(std::int64_t now_ns) {
  Impl& m = *impl_;
  m.now_ns = now_ns;
  m.settle();
  m.last_unnamed = SandboxId{};
  ControlRequest req;
  req.op = ControlOp::run;
  m.env.note(m.index, "run_unnamed", 0, 0);
  m.request(std::move(req));  // answered at once: an unnamed sandbox needs no lockd
  m.settle();
  return m.last_unnamed;
}

void SupervisorNode::name_sandbox(SandboxId sandbox, const std::string& name, std::int64_t now_ns) {
  Impl& m = *impl_;
  m.now_ns = now_ns;
  m.settle();
  ControlRequest req;
  req.op = ControlOp::name;
  req.sandbox = sandbox;
  req.name = name;
  m.env.note(m.index, "name", name_id_of(name).lo, sandbox.lo);
  m.request(std::move(req));
  m.settle();
}

bool SupervisorNode::check_deadline(SandboxId sandbox, std::int64_t now_ns, NameId* name, Epoch* epoch) const {
  const Impl& m = *impl_;
  const auto it = m.hosted.find(sandbox);
  if (it == m.hosted.end()) return false;
  const SandboxSpec& spec = it->second.spec;
  // What the sandbox's runtime does with LEASEHOLD_SLOT and LEASEHOLD_EPOCH (libleasehold-check).
  if (!m.reader.check_deadline_at(spec.slot, spec.epoch, static_cast<std::uint64_t>(now_ns))) return false;
  shm::SlotSnapshot snap;
  if (m.reader.snapshot(spec.slot, snap) != shm::TableErrc::ok) return false;
  *name = snap.name;
  *epoch = spec.epoch;
  return true;
}

}  // namespace leasehold::sim
