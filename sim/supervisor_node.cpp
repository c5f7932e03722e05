#include "leasehold/sim/supervisor_node.hpp"

#include "leasehold/wire/protocol.hpp"
#include "leasehold/wire/replay.hpp"
#include "leasehold/supervisor/deadline_wheel.hpp"
#include "leasehold/supervisor/heartbeat.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace leasehold::sim {
namespace {

constexpr std::uint32_t kSlotsMax = 32;
constexpr std::int64_t kReleaseTimeoutNs = 1 * kS;
constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max();

}  // namespace

struct SupervisorNode::Impl {
  /// One shm slot: {state, epoch, name, sandbox, valid_until} as the supervisor writes it.
  struct Slot {
    bool used = false;
    bool published = false;  ///< the epoch is published (revoked: false)
    /// Preemptible mode: started, its Commit in flight; the epoch is not published (its check
    /// says "not valid") but it runs under the worker's kill deadline and IsRunning says yes.
    bool commit_pending = false;
    bool killed = false;     ///< the kill was sent; the slot stays until the process is gone
    NameId name;
    SandboxId sandbox;
    Epoch epoch = 0;
    std::int64_t valid_until_ns = 0;
    TimerHandle timer;
  };
  /// One call to lockd, retried with a fresh seq until its deadline (LockdLink::call).
  struct Call {
    enum class Kind : std::uint8_t { acquire, commit, heartbeat, worker_beat, release } kind = Kind::acquire;
    wire::Datagram dg;
    std::int64_t first_send_ns = 0;
    std::int64_t deadline_ns = 0;
    std::int64_t next_retry_ns = 0;
    SandboxId sandbox;
    NameId name;
    Epoch epoch = 0;
    std::vector<RefreshEntry> entries;
  };

  Impl(const SimConfig& c, std::uint32_t i, WorkerId w, const wire::WireKey& key,
       std::span<const std::string> n, Rng r, SupervisorEnv& e, std::int64_t now)
      : cfg(c),
        index(i),
        self(w),
        preemptible(c.preemptible()),
        names(n.begin(), n.end()),
        rng(r),
        env(e),
        sender(w, 1, key),
        auth(key),
        hb(static_cast<std::uint64_t>(c.timing.kill_after_ns), static_cast<std::uint64_t>(c.heartbeat_interval_ns),
           kSlotsMax, c.preemptible()),
        wheel(kSlotsMax, static_cast<std::uint64_t>(c.timing.wheel_granularity_ns), static_cast<std::uint64_t>(now)),
        slots(kSlotsMax) {
    next_create_ns = now + rng.range(0, 500 * kMs);
  }

  const SimConfig& cfg;
  std::uint32_t index;
  WorkerId self;
  bool preemptible;  ///< supervisor --mode preemptible (with lockd's)
  std::vector<std::string> names;
  Rng rng;
  SupervisorEnv& env;
  wire::Sender sender;
  wire::Authenticator auth;
  HeartbeatSchedule hb;
  DeadlineWheel wheel;
  std::vector<Slot> slots;
  std::map<std::uint64_t, Call> calls;  ///< by request id
  std::uint64_t next_request_id = 1;
  std::int64_t next_create_ns = 0;
  std::int64_t last_now_ns = 0;

  std::optional<std::uint32_t> slot_of(const SandboxId& sb) const {
    for (std::uint32_t i = 0; i < slots.size(); ++i)
      if (slots[i].used && slots[i].sandbox == sb) return i;
    return std::nullopt;
  }
  std::size_t busy() const {
    std::size_t n = 0;
    for (const Slot& s : slots) n += s.used ? 1 : 0;
    for (const auto& [id, c] : calls) n += c.kind == Call::Kind::acquire || c.kind == Call::Kind::commit ? 1 : 0;
    return n + (preemptible ? 0 : scheduling.size());  // preemptible: a scheduled one has its slot
  }

  /// A 2-phase acquire answered `acquiring`: the sandbox is being scheduled; its Commit goes
  /// out when that is done.
  struct Scheduling {
    std::int64_t commit_at_ns = 0;
    NameId name;
    SandboxId sandbox;
    Epoch epoch = 0;
  };
  std::vector<Scheduling> scheduling;

  /// The sandbox is being created here: its acquire or commit is in flight, or it is being
  /// scheduled between the two.
  bool creating(const SandboxId& sb) const {
    for (const auto& [id, c] : calls)
      if (c.sandbox == sb && (c.kind == Call::Kind::acquire || c.kind == Call::Kind::commit)) return true;
    for (const Scheduling& sc : scheduling)
      if (sc.sandbox == sb) return true;
    return false;
  }

  void commits(std::int64_t now) {
    for (auto it = scheduling.begin(); it != scheduling.end();) {
      if (now < it->commit_at_ns) {
        ++it;
        continue;
      }
      if (preemptible) {
        // Started unpublished: a sandbox that is gone or being killed commits nothing (its exit
        // gave the Acquiring record back).
        const auto i = slot_of(it->sandbox);
        if (!i || slots[*i].killed) {
          it = scheduling.erase(it);
          continue;
        }
      }
      Call c;
      c.sandbox = it->sandbox;
      c.name = it->name;
      c.epoch = it->epoch;
      env.note(index, "commit", it->sandbox.lo, it->epoch);
      call(Call::Kind::commit, wire::Commit{it->name, it->sandbox, it->epoch, self}, now + cfg.acquire_timeout_ns, now,
           std::move(c));
      it = scheduling.erase(it);
    }
  }

  void call(Call::Kind kind, const wire::Body& body, std::int64_t deadline_ns, std::int64_t now, Call c) {
    const std::uint64_t rid = next_request_id++;
    c.kind = kind;
    if (!sender.seal(rid, body, c.dg)) return;  // cannot happen for the bodies built here
    c.first_send_ns = now;
    c.deadline_ns = deadline_ns;
    c.next_retry_ns = now + cfg.retry_interval_ns;
    env.send_to_lockd(index, c.dg.view());
    calls.emplace(rid, std::move(c));
  }

  void kill_slot(std::uint32_t i, std::string_view why, std::int64_t now) {
    Slot& s = slots[i];
    if (!s.used || s.killed || (!s.published && !s.commit_pending)) return;
    // The rt thread's order: revoke the slot in shm first, then kill the process.
    s.published = false;
    s.killed = true;
    hb.remove(s.sandbox);
    if (!s.timer.is_nil()) wheel.cancel(s.timer);
    s.timer = {};
    env.note(index, "kill", s.sandbox.lo, static_cast<std::uint64_t>(now));
    env.kill(index, s.sandbox, why);
  }

  void apply(const HeartbeatAction& a, std::int64_t now) {
    const auto i = slot_of(a.sandbox);
    if (!i) return;
    switch (a.kind) {
      case HeartbeatAction::Kind::none: return;
      case HeartbeatAction::Kind::extend:
        // The io thread writes valid_until into the slot; the rt thread re-reads it when the
        // wheel fires (lazy re-arm).
        slots[*i].valid_until_ns = static_cast<std::int64_t>(a.valid_until_ns);
        return;
      case HeartbeatAction::Kind::kill:
        kill_slot(*i, a.lapsed ? "lease lapsed" : a.cause == RefreshStatus::lost ? "lost" : "unknown", now);
        return;
    }
  }

  void start_sandbox(const wire::Grant& g, const Call& c, std::int64_t now) {
    // A grant that came back after its lease would already have lapsed is not started
    // (ArmBeforeExec): the name is given back.
    if (now >= c.first_send_ns + cfg.timing.kill_after_ns) {
      env.note(index, "grant_too_late", g.epoch, 0);
      release(g.name_id, g.holder, g.epoch, now);
      return;
    }
    const auto i = free_slot();
    if (!i || !hb.add(g.name_id, g.holder, g.epoch, *i, static_cast<std::uint64_t>(c.first_send_ns))) {
      release(g.name_id, g.holder, g.epoch, now);
      return;
    }
    occupy(*i, g, c.first_send_ns + cfg.timing.kill_after_ns, true);
  }

  std::optional<std::uint32_t> free_slot() const {
    for (std::uint32_t i = 0; i < slots.size(); ++i)
      if (!slots[i].used) return i;
    return std::nullopt;
  }

  /// Takes slot `i` for the grant's sandbox, armed at `valid_until_ns`, and starts it: published
  /// (lease mode), or with its Commit pending (preemptible).
  void occupy(std::uint32_t i, const wire::Grant& g, std::int64_t valid_until_ns, bool published) {
    Slot& s = slots[i];
    s.used = true;
    s.published = published;
    s.commit_pending = !published;
    s.name = g.name_id;
    s.sandbox = g.holder;
    s.epoch = g.epoch;
    s.valid_until_ns = valid_until_ns;
    s.timer = wheel.schedule(static_cast<std::uint64_t>(valid_until_ns), i).handle;
    env.note(index, published ? "publish" : "start_unpublished", g.holder.lo, g.epoch);
    env.spawn(index, g.holder, g.name_id, g.epoch);
  }

  /// Preemptible mode, the 2-phase acquire answered Acquiring (Supervisor::Impl::on_acquiring):
  /// the kill-switch synchronisation check, then the sandbox starts with its epoch unpublished,
  /// armed at the worker's deadline, and only then does the Commit go out (after a scheduling
  /// delay: the sandbox's start), so lockd has the name Held here only while it runs here.
  void start_pending(const wire::Grant& g, const Call& c, std::int64_t now) {
    for (const HeartbeatAction& a : hb.check_worker_liveness(static_cast<std::uint64_t>(now))) apply(a, now);
    if (!hb.may_create_named(static_cast<std::uint64_t>(now))) {
      env.note(index, "create_refused_killswitch", g.epoch, 0);
      release(g.name_id, g.holder, g.epoch, now);
      return;
    }
    const auto valid_until = static_cast<std::int64_t>(hb.worker_valid_until_ns());
    const auto i = free_slot();
    if (now >= valid_until || !i ||
        !hb.add(g.name_id, g.holder, g.epoch, *i,
                lease_measured_from_ns(static_cast<std::uint64_t>(c.first_send_ns), static_cast<std::uint64_t>(now)))) {
      release(g.name_id, g.holder, g.epoch, now);
      return;
    }
    hb.mark_worker_refreshed(g.holder);
    hb.set_commit_pending(g.holder, true);
    occupy(*i, g, valid_until, false);
    const std::int64_t left = std::int64_t{g.ttl_ms} * kMs;
    scheduling.push_back(Scheduling{now + rng.range(0, std::min<std::int64_t>(left / 4, 100 * kMs)), g.name_id,
                                    g.holder, g.epoch});
  }

  /// Preemptible mode: lockd has the name Held on this worker (Supervisor::Impl::on_committed):
  /// the epoch is published with the worker's valid_until.
  void on_committed(const wire::Grant& g, std::int64_t now) {
    const auto i = slot_of(g.holder);
    if (!i || !slots[*i].commit_pending || slots[*i].epoch != g.epoch) {
      // Gone (or killed) meanwhile: its exit gave the name back; this covers the late commit.
      release(g.name_id, g.holder, g.epoch, now);
      return;
    }
    Slot& s = slots[*i];
    if (s.killed) {  // being killed (kill-switch): it never runs with this name
      hb.remove(g.holder);
      release(g.name_id, g.holder, g.epoch, now);
      return;
    }
    s.commit_pending = false;
    hb.set_commit_pending(g.holder, false);
    const HeartbeatLease* l = hb.find(g.holder);
    if (l == nullptr || static_cast<std::int64_t>(l->valid_until_ns) <= now) {
      hb.remove(g.holder);
      release(g.name_id, g.holder, g.epoch, now);
      s.commit_pending = true;  // so kill_slot stops it: it never saw its epoch published
      kill_slot(*i, "commit too late", now);
      return;
    }
    s.published = true;
    s.valid_until_ns = static_cast<std::int64_t>(l->valid_until_ns);
    env.note(index, "publish", g.holder.lo, g.epoch);
  }

  /// Preemptible mode: a Commit refused or unanswered (Supervisor::Impl::commit_failed): the
  /// Acquiring record is given back and the sandbox started for it is stopped.
  void commit_failed(const Call& c, std::int64_t now) {
    release(c.name, c.sandbox, c.epoch, now);
    const auto i = slot_of(c.sandbox);
    if (!i || !slots[*i].commit_pending || slots[*i].epoch != c.epoch) return;
    hb.remove(c.sandbox);
    kill_slot(*i, "commit failed", now);
  }

  /// lockd asks (preemptible mode, before it preempts a live worker's name) whether the
  /// sandbox of {name, epoch} runs here (Supervisor::Impl::is_running): a sandbox still alive
  /// counts, also while it is being killed and while its Commit is in flight.
  bool is_running(const wire::IsRunning& q) const {
    const auto i = slot_of(q.sandbox);
    return i && slots[*i].name == q.name_id && slots[*i].epoch == q.epoch;
  }

  void release(NameId name, SandboxId sb, Epoch epoch, std::int64_t now) {
    Call c;
    c.sandbox = sb;
    c.name = name;
    c.epoch = epoch;
    call(Call::Kind::release, wire::Release{name, sb, epoch}, now + kReleaseTimeoutNs, now, std::move(c));
  }

  void on_answer(std::uint64_t rid, const wire::Body& body, std::int64_t now) {
    const auto it = calls.find(rid);
    if (it == calls.end()) {
      // An answer to a call that gave up (or a second answer): lockd acted on it after all.
      // Unless a sandbox here holds this grant or is still acquiring that name, nobody will
      // heartbeat it: it is given back (the supervisor's on_late_answer).
      if (const auto* g = std::get_if<wire::Grant>(&body); g != nullptr && !slot_of(g->holder) &&
                                                           !creating(g->holder)) {
        env.note(index, "late_grant_released", g->epoch, 0);
        release(g->name_id, g->holder, g->epoch, now);
      }
      return;
    }
    if (const auto* e = std::get_if<wire::Error>(&body)) {
      // stale_seq / replayed: move the seq above lockd's window; the retry goes out as planned.
      if (e->seq_floor != 0) sender.advance_to(e->seq_floor);
      return;
    }
    Call c = std::move(it->second);
    calls.erase(it);
    switch (c.kind) {
      case Call::Kind::acquire:
      case Call::Kind::commit:
        if (preemptible) {
          const auto* g = std::get_if<wire::Grant>(&body);
          const bool ours = g != nullptr && g->holder == c.sandbox && g->epoch != 0;
          if (c.kind == Call::Kind::acquire && ours && g->state == LockPhase::acquiring) {
            start_pending(*g, c, now);
          } else if (c.kind == Call::Kind::commit && ours && g->state == LockPhase::held && g->epoch == c.epoch) {
            on_committed(*g, now);
          } else if (c.kind == Call::Kind::commit) {
            env.note(index, "commit_refused", c.name.lo, 0);
            commit_failed(c, now);
          } else {
            if (ours) release(g->name_id, g->holder, g->epoch, now);  // not the 2-phase answer asked for
            env.note(index, "acquire_refused", c.name.lo, 0);
          }
          return;
        }
        if (const auto* g = std::get_if<wire::Grant>(&body); g != nullptr && g->holder == c.sandbox) {
          if (g->state == LockPhase::held) {
            // One-phase: the lease counts from the acquire's send; 2-phase: from the commit's.
            start_sandbox(*g, c, now);
          } else if (g->state == LockPhase::acquiring && c.kind == Call::Kind::acquire) {
            // Scheduling the sandbox takes a while (image pull, cgroup, exec), within the
            // acquiring TTL lockd gave.
            const std::int64_t left = std::int64_t{g->ttl_ms} * kMs;
            scheduling.push_back(Scheduling{now + rng.range(0, left * 8 / 10), g->name_id, g->holder, g->epoch});
          }
        } else {
          env.note(index, c.kind == Call::Kind::acquire ? "acquire_refused" : "commit_refused", c.name.lo, 0);
        }
        return;
      case Call::Kind::heartbeat: {
        const auto* ack = std::get_if<wire::HeartbeatAck>(&body);
        if (ack == nullptr || ack->entries.size() != c.entries.size()) return;  // a heartbeat failure
        for (std::size_t k = 0; k < c.entries.size(); ++k) {
          const RefreshEntry& e = c.entries[k];
          const wire::HeartbeatAckEntry& a = ack->entries[k];
          if (a.name_id != e.name) continue;
          const RefreshStatus res = a.status;
          if (res == RefreshStatus::refreshed && std::int64_t{a.ttl_left_ms} + 1 < cfg.timing.ttl_ns / kMs) {
            // lockd refreshed for less than the TTL the safety condition was checked for.
            if (const auto i = slot_of(e.sandbox)) kill_slot(*i, "ttl mismatch", now);
            continue;
          }
          apply(hb.on_refresh_answer(e.sandbox, e.epoch, res, a.holder, a.epoch,
                                     static_cast<std::uint64_t>(c.first_send_ns), static_cast<std::uint64_t>(now)),
                now);
        }
        return;
      }
      case Call::Kind::worker_beat: {
        // Supervisor::Impl::send_worker_beat's answer.
        const auto* w = std::get_if<wire::WorkerAck>(&body);
        if (w == nullptr) return;  // a heartbeat failure
        for (const wire::HeartbeatAckEntry& a : w->not_held) {
          const auto e = std::find_if(c.entries.begin(), c.entries.end(),
                                      [&](const RefreshEntry& x) { return x.name == a.name_id; });
          if (e == c.entries.end() || a.status == RefreshStatus::refreshed) continue;
          apply(hb.on_refresh_answer(e->sandbox, e->epoch, a.status, a.holder, a.epoch,
                                     static_cast<std::uint64_t>(c.first_send_ns), static_cast<std::uint64_t>(now)),
                now);
        }
        if (std::int64_t{w->liveness_ttl_ms} < cfg.timing.ttl_ns / kMs) return;  // not liveness: the kill-switch fires
        for (const HeartbeatAction& a : hb.on_worker_liveness_ack(static_cast<std::uint64_t>(c.first_send_ns),
                                                                 static_cast<std::uint64_t>(now)))
          apply(a, now);
        return;
      }
      case Call::Kind::release: return;
    }
  }

  void rt_step(std::int64_t now) {
    wheel.advance(static_cast<std::uint64_t>(now), [&](const DueTimer& due) -> Rearm {
      const auto i = static_cast<std::uint32_t>(due.payload);
      Slot& s = slots[i];
      if (!s.used || s.killed || (!s.published && !s.commit_pending) || s.timer != due.handle) return Rearm::none();
      const auto current = static_cast<std::uint64_t>(s.valid_until_ns);
      if (current > due.deadline_ns && !wheel.due_by(current, static_cast<std::uint64_t>(now)))
        return Rearm::at(current);
      s.timer = {};
      kill_slot(i, "kill-switch", now);
      return Rearm::none();
    });
  }

  void heartbeat(std::int64_t now) {
    if (hb.next_round_ns() > static_cast<std::uint64_t>(now)) return;
    if (preemptible)  // the worker-wide kill-switch (Supervisor::Impl::on_heartbeat_tick)
      for (const HeartbeatAction& a : hb.check_worker_liveness(static_cast<std::uint64_t>(now))) apply(a, now);
    HeartbeatRound round = hb.begin_round(static_cast<std::uint64_t>(now), wire::kHeartbeatEntriesMax);
    for (auto& req : round.requests) {
      wire::Heartbeat h;
      h.ttl_cap_ms = 0;
      for (const auto& e : req.entries) h.entries.push_back(wire::HeartbeatEntry{e.name, e.sandbox, e.epoch});
      Call c;
      c.entries = std::move(req.entries);
      call(Call::Kind::heartbeat, h, static_cast<std::int64_t>(req.deadline_ns), now, std::move(c));
    }
    if (round.worker_liveness) {
      wire::WorkerHeartbeat beat{self, {}};
      for (const RefreshEntry& e : round.worker_held) beat.held.push_back(wire::HeartbeatEntry{e.name, e.sandbox, e.epoch});
      Call c;
      c.entries = std::move(round.worker_held);
      call(Call::Kind::worker_beat, beat, static_cast<std::int64_t>(round.worker_liveness_deadline_ns), now,
           std::move(c));
    }
  }

  void retries(std::int64_t now) {
    for (auto it = calls.begin(); it != calls.end();) {
      Call& c = it->second;
      if (now >= c.deadline_ns) {
        // Given up: a late answer goes to the late-answer handler. A Commit nobody answered
        // (preemptible) stops the sandbox started for it.
        const Call gone = std::move(c);
        it = calls.erase(it);
        if (preemptible && gone.kind == Call::Kind::commit) commit_failed(gone, now);
        continue;
      }
      if (now >= c.next_retry_ns) {
        sender.restamp(c.dg.buffer().first(c.dg.size));
        env.send_to_lockd(index, c.dg.view());
        c.next_retry_ns = now + cfg.retry_interval_ns;
      }
      ++it;
    }
  }

  /// A sandbox here holds `name`, or is being created for it.
  bool local_claim(NameId name) const {
    for (const Slot& s : slots)
      if (s.used && s.name == name) return true;
    for (const auto& [id, c] : calls)
      if (c.name == name && (c.kind == Call::Kind::acquire || c.kind == Call::Kind::commit)) return true;
    for (const Scheduling& sc : scheduling)
      if (sc.name == name) return true;
    return false;
  }

  void workload(std::int64_t now) {
    if (now < next_create_ns) return;
    next_create_ns = now + rng.range(100 * kMs, 1500 * kMs);
    if (busy() >= cfg.sandboxes_per_worker_max) return;
    const std::string& name = names[rng.below(names.size())];
    const SandboxId sb{rng.next() | 1, rng.next()};
    // A name this worker holds or is acquiring is refused locally (Supervisor::Impl::do_run:
    // "is held on this worker"); it never reaches lockd.
    if (local_claim(name_id_of(name))) return;
    Call c;
    c.sandbox = sb;
    c.name = name_id_of(name);
    const bool two_phase = preemptible || rng.chance(cfg.two_phase_share);
    wire::Acquire a{name, sb, self, static_cast<std::uint32_t>(cfg.timing.ttl_ns / kMs), two_phase};
    env.note(index, "acquire", c.name.lo, sb.lo);
    call(Call::Kind::acquire, a, now + cfg.acquire_timeout_ns, now, std::move(c));
  }

  std::int64_t next_wake() const {
    std::int64_t t = next_create_ns;
    if (hb.size() != 0 || preemptible) t = std::min(t, static_cast<std::int64_t>(hb.next_round_ns()));
    const std::uint64_t w = wheel.next_event_ns();
    if (w != std::numeric_limits<std::uint64_t>::max()) t = std::min(t, static_cast<std::int64_t>(w));
    for (const auto& [id, c] : calls) t = std::min({t, c.next_retry_ns, c.deadline_ns});
    for (const Scheduling& sc : scheduling) t = std::min(t, sc.commit_at_ns);
    return t;
  }
};

SupervisorNode::SupervisorNode(const SimConfig& cfg, std::uint32_t index, WorkerId id, const wire::WireKey& key,
                               std::span<const std::string> names, Rng rng, SupervisorEnv& env, std::int64_t now_ns)
    : impl_(std::make_unique<Impl>(cfg, index, id, key, names, rng, env, now_ns)) {}

SupervisorNode::~SupervisorNode() = default;

WorkerId SupervisorNode::id() const noexcept { return impl_->self; }

void SupervisorNode::on_datagram(std::span<const std::uint8_t> bytes, std::int64_t now_ns) {
  Impl& m = *impl_;
  wire::DecodeResult d = wire::decode(bytes, &m.auth);
  if (!d) return;  // not authentic or malformed: dropped (LockdLink counts answers_bad)
  if (!wire::is_request(d.header.type)) {
    m.on_answer(d.header.request_id, d.body, now_ns);
    return;
  }
  // lockd's own request (LockdLink::on_unsolicited): answered at once under the same request id.
  wire::Body answer;
  if (const auto* q = std::get_if<wire::IsRunning>(&d.body)) {
    const bool running = m.is_running(*q);
    m.env.note(m.index, running ? "is_running_yes" : "is_running_no", q->sandbox.lo, q->epoch);
    answer = wire::RunningAnswer{q->name_id, q->sandbox, q->epoch, running};
  } else {
    return;  // nothing else is asked of a worker in the simulation (no revocations are pushed)
  }
  wire::Datagram out;
  if (m.sender.seal(d.header.request_id, answer, out)) m.env.send_to_lockd(m.index, out.view());
}

void SupervisorNode::on_sandbox_exit(SandboxId sandbox, std::int64_t now_ns) {
  Impl& m = *impl_;
  const auto i = m.slot_of(sandbox);
  if (!i) return;
  Impl::Slot& s = m.slots[*i];
  // Exit -> release (supervisor on_pidfd -> release_to_lockd), also after a kill.
  if (s.published || s.commit_pending) {
    s.published = false;
    s.commit_pending = false;
    m.hb.remove(sandbox);
    if (!s.timer.is_nil()) m.wheel.cancel(s.timer);
  }
  m.env.note(m.index, "exit_release", sandbox.lo, s.epoch);
  m.release(s.name, s.sandbox, s.epoch, now_ns);
  s = Impl::Slot{};
}

std::int64_t SupervisorNode::tick(std::int64_t now_ns) {
  Impl& m = *impl_;
  m.last_now_ns = now_ns;
  m.rt_step(now_ns);
  m.heartbeat(now_ns);
  m.retries(now_ns);
  m.commits(now_ns);
  m.workload(now_ns);
  return m.next_wake();
}

bool SupervisorNode::check_deadline(SandboxId sandbox, std::int64_t now_ns, NameId* name, Epoch* epoch) const {
  const auto i = impl_->slot_of(sandbox);
  if (!i) return false;
  const Impl::Slot& s = impl_->slots[*i];
  if (!s.published || now_ns >= s.valid_until_ns) return false;
  *name = s.name;
  *epoch = s.epoch;
  return true;
}

}  // namespace leasehold::sim
