#include "leasehold/supervisor/supervisor_core.hpp"

#include "leasehold/lease/assert.hpp"
#include "leasehold/lease/timing.hpp"

#include "leasehold/supervisor/lockd_link.hpp"  // describe_answer
#include "leasehold/supervisor/sandbox_phase.hpp"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <memory>
#include <utility>

namespace leasehold {

using nlohmann::json;

SupervisorCore::SupervisorCore(SupervisorCoreConfig config, SupervisorCoreHooks hooks, SandboxHost& host,
                               LockdPort& lockd, RtPort& rt, ControlPort& control, SlotTable& table)
    : cfg_(std::move(config)),
      hooks_(std::move(hooks)),
      host_(host),
      lockd_(lockd),
      rt_(rt),
      control_(control),
      table_(table),
      sandboxes_(cfg_.slots),
      hb_(static_cast<std::uint64_t>(timing::ms_to_ns(cfg_.kill_after_ms)),
          static_cast<std::uint64_t>(timing::ms_to_ns(cfg_.heartbeat_interval_ms)), cfg_.slots,
          cfg_.mode == SupervisorMode::preemptible) {}

SupervisorCore::~SupervisorCore() = default;

void SupervisorCore::reply(ControlClientId c, const std::string& line) {
  waits_.erase(c);
  if (const auto it = starting_.find(c); it != starting_.end()) {
    const auto [sb, left] = it->second;
    starting_.erase(it);
    // The close may not have reached on_client_closed yet: the spawn that ends in this answer
    // runs synchronously, and a client interrupted meanwhile is seen only after it.
    if (left || control_.client_gone(c)) {
      // Nobody waits for it (its `run --wait` was interrupted): it must not hold the name alone.
      if (Sandbox* s = find(sb); s != nullptr && !never_started(s->phase) && !kill_asked_or_gone(s->phase)) {
        log_event("event=queued_run_orphaned sandbox=%s action=stop", sb.str().c_str());
        stop_sandbox(*s, "its client left while it was starting", 0);
      }
      return;
    }
  }
  control_.reply(c, line);
}

void SupervisorCore::log_event(const char* fmt, ...) {
  if (!hooks_.log) return;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  hooks_.log(std::string(buf, std::min(static_cast<std::size_t>(n), sizeof buf - 1)));
}

void SupervisorCore::progress() {
  if (shutting_down_ && hooks_.shutdown_progress) hooks_.shutdown_progress();
}

bool SupervisorCore::quiescent() const {
  for (const auto& [id, s] : sandboxes_)
    if (!never_started(s.phase)) return false;
  return releases_in_flight_ == 0;
}

// =============================================================================================
// control requests

void SupervisorCore::on_request(ControlClientId client, ControlRequest req, std::uint64_t now_ns) {
  now_ = now_ns;
  switch (req.op) {
    case ControlOp::release:
      do_release(client, req);
      return;
    case ControlOp::kill:
      do_kill(client, req);
      return;
    case ControlOp::wait:
      do_wait(client, req);
      return;
    case ControlOp::run:
    case ControlOp::name:
    case ControlOp::expect_commit:
      break;
    default:
      reply(client, control_error(req.id, ControlError::internal, "not an operation of the sandbox logic"));
      return;
  }
  if (shutting_down_) {
    reply(client, control_error(req.id, ControlError::shutting_down, "the supervisor is shutting down; no new sandboxes"));
    return;
  }
  switch (req.op) {
    case ControlOp::run: do_run(client, std::move(req)); return;
    case ControlOp::name: do_name(client, std::move(req)); return;
    case ControlOp::expect_commit: do_expect_commit(client, std::move(req)); return;
    default: return;
  }
}

void SupervisorCore::on_exit(const SandboxId& id, std::uint64_t now_ns) {
  now_ = now_ns;
  exited(id);
}

shm::TableErrc SupervisorCore::publish_grant(Sandbox& s, NameId name_id, const std::string& name, Epoch epoch,
                                             std::uint64_t valid_until, const wire::GrantTokenBytes& token) {
  // Its signed token in the sandbox's own channel first (a sandbox that sees epoch E in the
  // table finds E's token), then {name, epoch, valid_until} in the table.
  const std::span<const std::uint8_t> bytes(token.data(), token.size());
  if (const shm::TableErrc e = host_.publish_token(s.id, epoch, bytes); e != shm::TableErrc::ok) return e;
  if (cfg_.shared_tokens)
    for (auto& [other_id, o] : sandboxes_)
      if (&o != &s) host_.publish_token(other_id, epoch, bytes);
  return table_.publish(s.slot, name_id, name, epoch, valid_until);
}

std::string SupervisorCore::ttl_refusal(const std::optional<std::uint64_t>& ttl_ms) const {
  // Below our --ttl-ms the kill-switch would fire after lockd's expiry; above lockd's TTL lockd
  // would clamp the grant (and on_granted would give it back).
  if (!ttl_ms || (*ttl_ms >= cfg_.ttl_ms && *ttl_ms <= cfg_.lockd_ttl_ms)) return {};
  return "ttl_ms " + std::to_string(*ttl_ms) + " must be in [" + std::to_string(cfg_.ttl_ms) + ", " +
         std::to_string(cfg_.lockd_ttl_ms) + "]: at least this supervisor's --ttl-ms (the kill-switch is timed for it), " +
         "at most lockd's --ttl-ms (the longest lease it grants)";
}

bool SupervisorCore::gate_named_creation(ControlClientId client, const json& id) {
  if (cfg_.mode != SupervisorMode::preemptible) return true;
  const std::uint64_t now = now_;
  for (const auto& a : hb_.check_worker_liveness(now)) apply(a);
  if (hb_.may_create_named(now)) return true;
  ++counters_.creates_refused_killswitch;
  reply(client, control_error(id, ControlError::killswitch,
                              "worker liveness lapsed and the worker-wide kill-switch fired; named "
                              "sandboxes are refused until a worker heartbeat succeeds"));
  return false;
}

bool SupervisorCore::refuse_name_here(ControlClientId client, const ControlRequest& req) {
  if (std::string why = ttl_refusal(req.ttl_ms); !why.empty()) {
    reply(client, control_error(req.id, ControlError::bad_request, why));
    return true;
  }
  const SandboxId* holder = sandboxes_.holder_of(*req.name);
  // A queued run waits behind a holder of this worker as behind any other.
  if (holder == nullptr || (req.queue && req.op == ControlOp::run)) return false;
  const Sandbox* h = find(*holder);
  reply(client, control_error(req.id, ControlError::held, "\"" + *req.name + "\" is held on this worker",
                              {{"holder", holder->str()}, {"epoch", h ? h->epoch : 0}}));
  return true;
}

void SupervisorCore::do_run(ControlClientId client, ControlRequest req) {
  // `run --wait` waits for the exit next: refused now, before anything starts, when it could
  // not (a queued run counts as a wait itself while it waits, and is checked there).
  if (req.attach && !req.queue) {
    if (const std::string why = wait_refusal(req.caller_uid); !why.empty()) {
      ++counters_.waits_refused;
      reply(client, control_error(req.id, ControlError::busy, "nothing started: the exit could not be waited for: " + why));
      return;
    }
  }
  if (!cfg_.synthetic && hooks_.command_resolves) {
    if (const Status resolves = hooks_.command_resolves(req); !resolves.ok()) {
      ++counters_.spawn_failures;
      reply(client, control_error(req.id, ControlError::exec_failed, resolves.message()));
      return;
    }
  }
  if (req.name) {
    if (refuse_name_here(client, req)) return;
    if (refuse_unsafe_kill(client, req)) return;
    if (!gate_named_creation(client, req.id)) return;
  }
  const SandboxId id = hooks_.new_sandbox_id();
  const Result<shm::ClaimedSlot> claim = table_.claim(id, now_);
  if (!claim.ok()) {
    reply(client, control_error(req.id, ControlError::table_full, claim.message()));
    return;
  }
  Sandbox s;
  s.id = id;
  s.slot = claim->slot;
  s.synthetic = cfg_.synthetic;
  s.owner = req.caller_uid;
  Sandbox& added = sandboxes_.add(std::move(s));
  check_slot(added.slot);
  if (!req.name) {
    spawn(added, client, req);
    return;
  }
  // A queued run is bound to its name once granted (on_queue_grant): another sandbox of this
  // worker may hold it, or wait for it, until then.
  if (!req.queue) sandboxes_.bind_name(*req.name, id);
  acquire_name(id, client, std::move(req));
}

void SupervisorCore::acquire_name(const SandboxId& sb, ControlClientId client, ControlRequest req) {
  if (req.queue && req.op == ControlOp::run) {
    // Answered once it runs, which may be long: a waiting connection is never idle, so it counts
    // against the bounds of `wait`.
    if (const std::string why = wait_refusal(req.caller_uid); !why.empty()) {
      ++counters_.waits_refused;
      abandon(sb, client, req.id, ControlError::busy, "cannot wait for \"" + *req.name + "\": " + why);
      return;
    }
    if (Sandbox* s = find(sb); s != nullptr && s->phase == SandboxPhase::reserved)
      advance(s->phase, SandboxPhase::acquiring);
    waits_[client] = req.caller_uid;
    ++counters_.runs_queued;
    QueuedRun q;
    q.sandbox = sb;
    q.client = client;
    q.joined_ns = now_;
    q.deadline_ns = req.queue_timeout_ms ? now_ + *req.queue_timeout_ms * 1'000'000 : 0;
    q.request = std::move(req);
    queued_.push_back(std::move(q));
    send_wait(sb);
    return;
  }
  wire::Acquire a;
  a.name = *req.name;
  a.sandbox = sb;
  a.worker = cfg_.worker;
  a.ttl_ms = static_cast<std::uint32_t>(req.ttl_ms.value_or(cfg_.ttl_ms));
  a.two_phase = cfg_.mode == SupervisorMode::preemptible;
  if (Sandbox* s = find(sb); s != nullptr && s->phase == SandboxPhase::reserved)
    advance(s->phase, SandboxPhase::acquiring);  // a run; naming a running sandbox keeps its phase
  lockd_.call(a, now_i() + kAcquireTimeoutNs, [this, sb, client, req](LockdReply r) mutable {
    now_ = static_cast<std::uint64_t>(r.now_ns);
    if (!r.ok()) {
      abandon(sb, client, req.id, ControlError::unreachable, "acquire \"" + *req.name + "\": " + r.problem);
      return;
    }
    if (const auto* d = std::get_if<wire::Deny>(&*r.body)) {
      ++counters_.acquire_refused;
      const ControlError code = d->refusal == Refusal::held || d->refusal == Refusal::acquiring ? ControlError::held : ControlError::refused;
      abandon(sb, client, req.id, code, "\"" + *req.name + "\" " + describe_answer(*r.body),
              {{"holder", d->holder.str()}, {"epoch", d->epoch}, {"reason", std::string(to_string(d->refusal))},
               {"worker", d->worker.str()}});
      return;
    }
    const auto* g = std::get_if<wire::Grant>(&*r.body);
    if (g == nullptr) {
      abandon(sb, client, req.id, ControlError::refused, "acquire \"" + *req.name + "\": " + describe_answer(*r.body));
      return;
    }
    if (cfg_.mode == SupervisorMode::preemptible) {
      // The 2-phase acquire reserved the name (Acquiring: lockd preempts nothing in this state).
      // The sandbox starts before the Commit, so that whenever lockd has the name Held on this
      // worker, IsRunning finds the sandbox running (DESIGN.md "creation flows", preemptible.pml).
      if (g->state != LockPhase::acquiring || g->epoch == 0) {
        abandon(sb, client, req.id, ControlError::refused,
                "2-phase acquire \"" + *req.name + "\" answered with " + describe_answer(*r.body));
        return;
      }
      on_acquiring(sb, client, std::move(req), g->epoch, r.first_send_ns);
      return;
    }
    on_granted(sb, client, std::move(req), *g, r.first_send_ns);
  });
}

// ---- waiting for a name in lockd's FIFO (ControlRequest::queue) -----------------------------

std::optional<SupervisorCore::QueuePlace> SupervisorCore::queue_place(const SandboxId& id) const {
  for (const QueuedRun& q : queued_)
    if (q.sandbox == id) return QueuePlace{*q.request.name, q.position, q.waiters};
  return std::nullopt;
}

void SupervisorCore::send_wait(const SandboxId& sb) {
  const auto it = std::find_if(queued_.begin(), queued_.end(), [&](const QueuedRun& q) { return q.sandbox == sb; });
  if (it == queued_.end() || it->in_flight) return;
  wire::Wait w;
  w.name = *it->request.name;
  w.sandbox = sb;
  w.worker = cfg_.worker;
  // The place lapses one TTL after the last Wait: re-sent every heartbeat tick, a waiter on a
  // live worker keeps it; on a dead or cut-off one it is passed over.
  w.ttl_ms = static_cast<std::uint32_t>(cfg_.ttl_ms);
  it->in_flight = true;
  const bool first = it->position == 0;
  lockd_.call(w, now_i() + kAcquireTimeoutNs, [this, sb, first](LockdReply r) {
    now_ = static_cast<std::uint64_t>(r.now_ns);
    const auto q = std::find_if(queued_.begin(), queued_.end(), [&](const QueuedRun& x) { return x.sandbox == sb; });
    const auto* g = r.ok() ? std::get_if<wire::Grant>(&*r.body) : nullptr;
    if (q == queued_.end()) {
      // Given up meanwhile (timeout, closed client, shutdown): a grant that came anyway goes back.
      if (g != nullptr && g->holder == sb) release_to_lockd(g->name_id, g->name_id.str(), sb, g->epoch, [](bool, std::string) {});
      return;
    }
    q->in_flight = false;
    if (!r.ok()) {
      if (!first) return;  // lockd out of reach for a while: the next tick asks again
      const ControlClientId client = q->client;
      const ControlRequest req = q->request;
      queued_.erase(q);
      abandon(sb, client, req.id, ControlError::unreachable, "wait for \"" + *req.name + "\": " + r.problem);
      return;
    }
    q->last_send_ns = r.first_send_ns;
    if (const auto* p = std::get_if<wire::Queued>(&*r.body)) {
      const bool moved = first || p->position != q->position || p->waiters != q->waiters;
      q->holder = p->holder;
      q->epoch = p->epoch;
      q->position = p->position;
      q->waiters = p->waiters;
      if (moved) {
        log_event("event=queued name=%s sandbox=%s position=%u waiters=%u holder=%s epoch=%" PRIu64,
                  q->request.name->c_str(), sb.str().c_str(), p->position, p->waiters, p->holder.str().c_str(), p->epoch);
        // Its client learns its place before the answer (a line control_call passes over). Last:
        // a client found gone by this write is handled at once (on_client_closed leaves the
        // FIFO and erases this run), so nothing of `q` is read after it.
        nlohmann::json line = {{"v", kControlProtocolVersion}, {"id", q->request.id}, {"progress", "queued"},
                               {"sandbox", sb.str()}, {"name", *q->request.name}, {"position", p->position},
                               {"waiters", p->waiters}, {"state", std::string(to_string(p->state))},
                               {"holder", p->holder.str()}, {"epoch", p->epoch}};
        control_.progress(q->client, line.dump() + "\n");
      }
      return;
    }
    if (g != nullptr && g->state == LockPhase::acquiring && g->holder == sb) {
      on_queue_grant(sb, *g, r.first_send_ns);
      return;
    }
    // A refusal (another worker's sandbox id, a full queue, a bad name): not worth waiting for.
    const ControlClientId client = q->client;
    const ControlRequest req = q->request;
    queued_.erase(q);
    if (const auto* d = std::get_if<wire::Deny>(&*r.body)) {
      ++counters_.acquire_refused;
      abandon(sb, client, req.id, ControlError::refused, "wait for \"" + *req.name + "\" " + describe_answer(*r.body),
              {{"holder", d->holder.str()}, {"epoch", d->epoch}, {"reason", std::string(to_string(d->refusal))}});
      return;
    }
    const auto* e = std::get_if<wire::Error>(&*r.body);
    abandon(sb, client, req.id, e != nullptr && e->code == wire::ErrorCode::overloaded ? ControlError::busy : ControlError::refused,
            "wait for \"" + *req.name + "\": " + describe_answer(*r.body));
  });
}

void SupervisorCore::on_place_renewed(const SandboxId& sb, const wire::HeartbeatAckEntry& a, std::int64_t send_ns) {
  const auto q = std::find_if(queued_.begin(), queued_.end(), [&](const QueuedRun& x) { return x.sandbox == sb; });
  if (q == queued_.end() || q->in_flight || a.name_id != name_id_of(*q->request.name)) return;
  if (a.status != RefreshStatus::queued) {
    // Not in lockd's FIFO (granted with the push lost, its place lapsed, lockd restarted): a
    // Wait re-joins, or answers the grant again (the 2-phase acquire is idempotent for it).
    ++counters_.places_lost;
    send_wait(sb);
    return;
  }
  // Kept. lockd placed it before it granted anything to it: a grant pushed later counts from
  // no earlier than this send.
  ++counters_.places_renewed;
  q->last_send_ns = send_ns;
  if (a.holder != q->holder || a.epoch != q->epoch) send_wait(sb);  // the line moved: its new place
}

void SupervisorCore::on_queue_grant(const SandboxId& sb, const wire::Grant& g, std::int64_t send_ns) {
  const auto q = std::find_if(queued_.begin(), queued_.end(), [&](const QueuedRun& x) { return x.sandbox == sb; });
  if (q == queued_.end()) return;
  const ControlClientId client = q->client;
  ControlRequest req = std::move(q->request);
  const std::uint64_t waited_ms = (now_ - std::min(now_, q->joined_ns)) / 1'000'000;
  queued_.erase(q);
  if (const SandboxId* holder = sandboxes_.holder_of(*req.name); holder != nullptr && *holder != sb) {
    // lockd granted it while a sandbox here still has it bound (its release overtook its exit's
    // bookkeeping): never two local bindings of one name. Give the grant back; the run fails.
    release_to_lockd(g.name_id, *req.name, sb, g.epoch, [](bool, std::string) {});
    abandon(sb, client, req.id, ControlError::internal,
            "\"" + *req.name + "\" was granted while sandbox " + holder->str() + " of this worker still had it");
    return;
  }
  sandboxes_.bind_name(*req.name, sb);
  starting_[client] = {sb, false};
  ++counters_.queue_grants;
  log_event("event=queue_granted name=%s sandbox=%s epoch=%" PRIu64 " waited_ms=%" PRIu64, req.name->c_str(),
            sb.str().c_str(), g.epoch, waited_ms);
  if (cfg_.mode == SupervisorMode::preemptible) {
    on_acquiring(sb, client, std::move(req), g.epoch, send_ns);
    return;
  }
  commit_then_start(sb, client, std::move(req), g.epoch);
}

void SupervisorCore::leave_queue(std::vector<QueuedRun>::iterator it) {
  wire::Release leave;
  leave.name_id = name_id_of(*it->request.name);
  leave.sandbox = it->sandbox;
  leave.epoch = 0;  // leaves the FIFO, and gives back a grant from it not yet committed
  lockd_.call(leave, now_i() + kReleaseTimeoutNs, [](LockdReply) {});
  queued_.erase(it);
}

void SupervisorCore::commit_then_start(const SandboxId& sb, ControlClientId client, ControlRequest req, Epoch epoch) {
  // Lease mode: the committed lease has a TTL from the commit on; it is heartbeated and the
  // sandbox starts once it is granted, as for an acquire.
  if (Sandbox* s = find(sb); s != nullptr && s->phase == SandboxPhase::reserved) advance(s->phase, SandboxPhase::acquiring);
  lockd_.call(wire::Commit{name_id_of(*req.name), sb, epoch, cfg_.worker}, now_i() + kAcquireTimeoutNs, [this, sb, client, req, epoch](LockdReply r) mutable {
    now_ = static_cast<std::uint64_t>(r.now_ns);
    if (!r.ok()) {
      // Its answer may have been lost after lockd committed: give back whatever lockd has.
      release_to_lockd(name_id_of(*req.name), *req.name, sb, epoch, [](bool, std::string) {});
      abandon(sb, client, req.id, ControlError::unreachable, "commit \"" + *req.name + "\": " + r.problem);
      return;
    }
    if (const auto* d = std::get_if<wire::Deny>(&*r.body)) {
      abandon(sb, client, req.id, ControlError::refused, "commit \"" + *req.name + "\" " + describe_answer(*r.body),
              {{"holder", d->holder.str()}, {"epoch", d->epoch}, {"reason", std::string(to_string(d->refusal))}});
      return;
    }
    const auto* g = std::get_if<wire::Grant>(&*r.body);
    if (g == nullptr || g->state != LockPhase::held || g->epoch != epoch) {
      abandon(sb, client, req.id, ControlError::refused, "commit \"" + *req.name + "\": " + describe_answer(*r.body));
      return;
    }
    req.ttl_ms = std::nullopt;
    on_granted(sb, client, std::move(req), *g, r.first_send_ns);
  });
}

void SupervisorCore::on_granted(const SandboxId& sb, ControlClientId client, ControlRequest req,
                                  const wire::Grant& g, std::int64_t send_ns) {
  Sandbox* s = find(sb);
  const std::string name = *req.name;
  const NameId name_id = name_id_of(name);
  if (s == nullptr) {  // gone meanwhile (shutdown, killed before naming): give the name back
    release_to_lockd(name_id, name, sb, g.epoch, [](bool, std::string) {});
    reply(client, control_error(req.id, ControlError::internal, "the sandbox went away while acquiring"));
    return;
  }
  auto give_back = [&](ControlError code, const std::string& msg) {
    give_back_name(*s, client, req, g.epoch, code, msg);
  };
  const std::uint64_t now = now_;
  // The lease is measured from `lease_send_ns`: the send time of the request lockd answered,
  // moved earlier by whatever the grant's time left falls short of --ttl-ms (see below).
  std::uint64_t lease_send_ns = lease_measured_from_ns(static_cast<std::uint64_t>(send_ns), now);
  std::uint64_t valid_until = timing::kill_deadline_ns(lease_send_ns, hb_.kill_after_ns());
  if (cfg_.mode == SupervisorMode::lease) {
    // lockd answered no earlier than `send_ns`, with `g.ttl_ms` left, so its expiry is at least
    // send_ns + g.ttl_ms. A fresh grant has the full TTL; an idempotent answer to a retry (the
    // first answer was lost, lockd restarted meanwhile) has less. Either way the kill-switch
    // keeps the margin the start-up check proved for --ttl-ms (ttl - kill_after) if the lease
    // counts from send_ns - shortfall, shortfall = --ttl-ms - g.ttl_ms: lockd's expiry is then
    // >= (send_ns - shortfall) + --ttl-ms, exactly a full grant's bound for that send time.
    const std::uint64_t ttl_ns = cfg_.ttl_ms * 1'000'000ull;
    const std::uint64_t left_ns = std::uint64_t{g.ttl_ms} * 1'000'000ull;
#if LEASEHOLD_SIM_ABLATE_SHORT_GRANT
    // Simulator ablation, bug class "a grant's time left ignored": the lease counts from the
    // send as if every grant had the full TTL, also an answer to a retry with less left.
    const std::uint64_t shortfall_ns = 0;
    (void)left_ns;
    (void)ttl_ns;
#else
    const std::uint64_t shortfall_ns = left_ns < ttl_ns ? ttl_ns - left_ns : 0;
#endif
    if (shortfall_ns > 0) {
      // The lease counts from lease_send_ns - shortfall_ns. Given back when that is before this
      // host's boot (a retry answered within the shortfall of boot: no boot-clock time to count
      // from) or its kill deadline has passed already.
      if (shortfall_ns > lease_send_ns || valid_until - shortfall_ns <= now) {
        give_back(ControlError::unreachable,
                  "lockd's grant of \"" + name + "\" arrived " +
                      std::to_string((now - static_cast<std::uint64_t>(send_ns)) / 1'000'000) +
                      " ms after the request was first sent with " + std::to_string(g.ttl_ms) +
                      " ms of its lease left (an answer to a retry: lockd restarted or lost its first answer); "
                      "counted from that send, the kill-switch could not fire before lockd's expiry, so the "
                      "name was given back; retry");
        return;
      }
      lease_send_ns -= shortfall_ns;
      valid_until = timing::kill_deadline_ns(lease_send_ns, hb_.kill_after_ns());
      log_event("level=warn event=short_grant name=%s sandbox=%s epoch=%" PRIu64 " ttl_left_ms=%u ttl_ms=%" PRIu64
                " valid_until_ns=%" PRIu64,
                name.c_str(), sb.str().c_str(), g.epoch, g.ttl_ms, cfg_.ttl_ms, valid_until);
    }
  }
  if (now >= valid_until) {
    give_back(ControlError::unreachable, "the grant of \"" + name + "\" arrived after its lease would already have lapsed");
    return;
  }
  if (!hb_.add(name_id, sb, g.epoch, s->slot, lease_send_ns)) {
    give_back(ControlError::internal, "heartbeat schedule refused the lease");
    return;
  }
  s->name_id = name_id;
  s->epoch = g.epoch;
  s->token = g.token;
  s->valid_until_ns = valid_until;
  if (before_spawn(s->phase)) {
    s->name = name;
    spawn(*s, client, req);
    return;
  }
  // Naming a running unnamed sandbox.
  if (!runs_unkilled(s->phase)) {
    hb_.remove(sb);
    give_back(ControlError::not_found, "the sandbox stopped while its name was being acquired");
    return;
  }
  const shm::TableErrc pe = publish_grant(*s, name_id, name, g.epoch, valid_until, s->token);
  if (pe != shm::TableErrc::ok) {
    hb_.remove(sb);
    give_back(ControlError::internal, "publishing the slot failed: " + std::string(shm::to_string(pe)));
    return;
  }
  s->name = name;
  if (!rt_.arm(s->slot, valid_until, host_.kill_target(sb))) {
    // The rt thread cannot take it: an unwatched named sandbox must not run.
    kill_sandbox(*s, "rt command queue full while naming");
  }
  log_event("event=named sandbox=%s slot=%u name=%s epoch=%" PRIu64, sb.str().c_str(), s->slot,
            name.c_str(), g.epoch);
  reply(client, control_ok(req.id, {{"sandbox", sb.str()}, {"slot", s->slot}, {"name", name},
                                    {"epoch", g.epoch}, {"pid", s->pid},
                                    {"valid_until_ms", static_cast<std::int64_t>(valid_until - now) / 1'000'000}}));
}

void SupervisorCore::give_back_name(Sandbox& s, ControlClientId client, const ControlRequest& req, Epoch epoch,
                                      ControlError code, const std::string& message) {
  const std::string name = *req.name;
  bury(s.id);
  release_to_lockd(name_id_of(name), name, s.id, epoch, [](bool, std::string) {});
  if (before_spawn(s.phase)) {
    abandon(s.id, client, req.id, code, message);
    return;
  }
  // Naming a running sandbox failed: it stays unnamed.
  sandboxes_.unbind_name(name, s.id);
  reply(client, control_error(req.id, code, message));
}

void SupervisorCore::abandon(const SandboxId& sb, ControlClientId client, const json& id,
                               ControlError code, const std::string& message, json extra) {
  Sandbox* s = find(sb);
  const bool forget = s != nullptr && before_spawn(s->phase);
  // The name it was getting; a running sandbox keeps a name it already has.
  if (s != nullptr && !forget) sandboxes_.unbind_names_except(sb, s->name);
  if (forget) {
    const std::uint32_t slot = s->slot;
    host_.forget(sb);  // a token channel opened for it
    check_slot(slot);
    table_.free(slot, now_);
    sandboxes_.erase(sb);  // its slot and names with it
    check_slot(slot);      // empty in both
  }
  reply(client, control_error(id, code, message, std::move(extra)));
  progress();
}

void SupervisorCore::on_late_answer(const wire::Body& answer, std::uint64_t now_ns) {
  now_ = now_ns;
  // lockd granted (or committed) after the call gave up, e.g. it was paused with the request in
  // its socket queue. Unless a sandbox here holds exactly this grant or is still acquiring that
  // name, nobody will heartbeat it: give it back now rather than leave the name held (and a
  // create refused) for a whole TTL.
  const auto* g = std::get_if<wire::Grant>(&answer);
  if (g == nullptr) return;
  // The grant lockd pushes to a waiter, as the answer to its latest Wait (docs/PROTOCOL.md
  // "Waiters"): that call has ended with a Queued answer.
  if (g->state == LockPhase::acquiring) {
    const auto q = std::find_if(queued_.begin(), queued_.end(), [&](const QueuedRun& x) {
      return x.sandbox == g->holder && name_id_of(*x.request.name) == g->name_id;
    });
    if (q != queued_.end()) {
      if (q->in_flight) {
        // A Wait is on its way: its answer is this grant again (idempotent); take that one.
        return;
      }
      on_queue_grant(g->holder, *g, q->last_send_ns);
      return;
    }
  }
  if (const Sandbox* s = find(g->holder); s != nullptr) {
    if (s->name && s->name_id == g->name_id) return;
    for (const auto& [name, holder] : sandboxes_.names())
      if (holder == g->holder && name_id_of(name) == g->name_id) return;
  }
  ++counters_.late_grants_released;
  log_event("level=warn event=late_grant name_id=%s sandbox=%s epoch=%" PRIu64 " action=release", g->name_id.str().c_str(),
            g->holder.str().c_str(), g->epoch);
  release_to_lockd(g->name_id, g->name_id.str(), g->holder, g->epoch, [](bool, std::string) {});
}

void SupervisorCore::spawn(Sandbox& s, ControlClientId client, const ControlRequest& req) {
  const SandboxId id = s.id;
  const std::uint64_t now = now_;
  auto fail = [&](const PortError& e) {
    ++counters_.spawn_failures;
    rt_.set_deadline(s.slot, 0);
    if (s.name || s.pending_name) {  // its lease, or the Acquiring record its Commit was for
      hb_.remove(id);
      release_to_lockd(s.name_id, s.name ? *s.name : *s.pending_name, id, s.epoch, [](bool, std::string) {});
    }
    log_event("level=warn event=spawn_failed sandbox=%s name=%s error=\"%s\"", id.str().c_str(),
              s.name ? s.name->c_str() : "-", e.message.c_str());
    abandon(id, client, req.id, e.code, e.message);
  };

  // Publish first: from here on the sandbox's own checks see its lease (and its end). A sandbox
  // whose Commit is still to be sent starts unpublished (its checks say "not valid") but under
  // the worker's kill deadline; on_committed publishes it.
  // Its own token channel first: the publish below writes its grant's token into it.
  if (!s.synthetic)
    if (auto e = host_.open_tokens(id)) return fail(*e);
  if (s.name) {
    const shm::TableErrc pe = publish_grant(s, s.name_id, *s.name, s.epoch, s.valid_until_ns, s.token);
    if (pe != shm::TableErrc::ok)
      return fail({ControlError::internal, "publishing the slot failed: " + std::string(shm::to_string(pe))});
  }
  const bool watched = s.name || s.pending_name;
  const std::uint64_t deadline_ns = watched ? s.valid_until_ns : kNoDeadlineNs;

  if (s.synthetic) {
    // Performance mode: a lease without a process. The rt thread still arms and "kills" it
    // (the revoke happens; there is nothing to signal).
    if (!rt_.arm(s.slot, deadline_ns, KillTarget{}))
      return fail({ControlError::busy, "the rt thread's command queue is full; retry"});
    s.armed = true;
    advance(s.phase, s.pending_name ? SandboxPhase::committing : SandboxPhase::running);
    s.started_ns = now;
    ++counters_.spawned;
    if (s.pending_name) return send_commit(id, client, req, s.epoch);
    json ok = {{"sandbox", id.str()}, {"slot", s.slot}, {"epoch", s.epoch}, {"pid", -1}, {"synthetic", true}};
    if (s.name) ok["name"] = *s.name;
    reply(client, control_ok(req.id, ok));
    return;
  }

  SandboxSpec spec;
  spec.id = id;
  spec.slot = s.slot;
  spec.epoch = s.epoch;
  spec.name = s.name;
  spec.argv = req.argv;
  spec.env = req.env;
  spec.cwd = req.cwd;  // "/" unless the request names one
  spec.caller_uid = req.caller_uid;
  spec.caller_gid = req.caller_gid;
  // Only an unnamed sandbox may outlive us (--on-shutdown keep); it then stays unnamed.
  s.outlives_us = cfg_.on_shutdown == ShutdownPolicy::keep && !s.name && !s.pending_name;
  spec.die_with_supervisor = !s.outlives_us;
  HostedSandbox hosted;
  // The child stops at its gate, right before its exec: its deadline is armed before the
  // command's first instruction. Ablated (arm-after-exec), it execs at once and is armed afterwards.
  if (auto e = host_.create(spec, hosted)) return fail(*e);
  s.log_path = hosted.log_path;
  s.cgroup_path = hosted.cgroup_path;
  advance(s.phase, SandboxPhase::gated);
  s.pid = hosted.pid;
  s.uid = hosted.uid;
  s.started_ns = now;
  // Armed while the child cannot exec yet (it sets itself up, then waits at its gate; its pidfd,
  // process group and leaf are the kill target already): from here the rt thread kills it at its
  // deadline whatever the io thread does, and before its command's first instruction if that
  // deadline comes first. A named sandbox whose deadline already passed is due at the next tick.
  std::optional<PortError> start_error;
  s.armed = static_cast<bool>(rt_.arm(s.slot, deadline_ns, host_.kill_target(id)));
  if (!s.armed) start_error = PortError{ControlError::busy, "the rt thread's command queue is full; the sandbox was stopped"};
  // Let go to exec unless its deadline is less than one rt command poll away (a stalled io
  // thread, a slow set-up): the arm above may reach the wheel only that much later, and an arm
  // taken after its deadline kills at once, up to a poll past the deadline the safety
  // inequality assumes (kill_after + granularity + kill latency). Then the rt thread kills it
  // (or has), and it must not exec now.
  const std::uint64_t exec_by_ns =
      !watched ? 0 : s.valid_until_ns > cfg_.rt_command_poll_ns ? s.valid_until_ns - cfg_.rt_command_poll_ns : 1;
  if (!start_error) start_error = host_.release(id, exec_by_ns);
  if (start_error) {
    // It does not run its command: the gate closes (the child exits without exec) and, unarmed,
    // it is killed from here. Its exit (the host's exit event) disarms, reaps, frees the slot,
    // removes the leaf, gives back the name and answers the client with the error.
    host_.abandon(id);
    if (!s.armed) host_.kill(id, now_);
    advance(s.phase, SandboxPhase::aborted);
    ++counters_.spawn_failures;
    log_event("level=warn event=spawn_failed sandbox=%s name=%s error=\"%s\"", id.str().c_str(),
              s.name ? s.name->c_str() : s.pending_name.value_or("-").c_str(), start_error->message.c_str());
    s.waiter_error = start_error->code;
    s.waiter_message = start_error->message;
    s.waiters.emplace_back(client, req.id);
    return;  // answered when it is gone
  }
  advance(s.phase, s.pending_name ? SandboxPhase::committing : SandboxPhase::running);
  ++counters_.spawned;
  log_event("event=started sandbox=%s slot=%u pid=%d name=%s epoch=%" PRIu64 " valid_until_ns=%" PRIu64 "%s",
            id.str().c_str(), s.slot, s.pid, s.name ? s.name->c_str() : s.pending_name.value_or("-").c_str(),
            s.epoch, s.valid_until_ns, s.pending_name ? " commit=pending" : "");
  if (s.pending_name) return send_commit(id, client, req, s.epoch);
  json ok = {{"sandbox", id.str()}, {"slot", s.slot}, {"epoch", s.epoch}, {"pid", s.pid}};
  if (s.name) {
    ok["name"] = *s.name;
    ok["valid_until_ms"] = (static_cast<std::int64_t>(s.valid_until_ns) - static_cast<std::int64_t>(now_)) / 1'000'000;
  }
  if (!s.cgroup_path.empty()) ok["cgroup"] = s.cgroup_path;
  ok["uid"] = s.uid;
  ok["log"] = s.log_path;
  ok["isolation"] = cfg_.isolation;
  if (cfg_.unsafe_kill) ok["unsafe_kill"] = true;
  reply(client, control_ok(req.id, ok));
}

bool SupervisorCore::refuse_unsafe_kill(ControlClientId client, const ControlRequest& req) {
  if (!cfg_.unsafe_kill || cfg_.allow_unsafe_kill) return false;
  reply(client, control_error(req.id, ControlError::refused,
                              "no unescapable kill on this worker: no delegated cgroup v2 (" + cfg_.cgroup_reason +
                                  ") and no pid namespace (isolation off), so a named sandbox's descendants could "
                                  "outlive its kill-switch and hold \"" + req.name.value_or("") +
                                  "\" twice; fix: start the supervisor with isolation on (the default) or with a "
                                  "delegated cgroup v2 subtree; --allow-unsafe-kill overrides"));
  return true;
}

bool SupervisorCore::may_act_on(ControlClientId client, const ControlRequest& req, const Sandbox& s) {
  return may_act_on(client, req, s.owner, s.id);
}

bool SupervisorCore::may_act_on(ControlClientId client, const ControlRequest& req, uid_t owner, const SandboxId& id) {
  if (req.caller_uid == 0 || req.caller_uid == owner) return true;
  reply(client, control_error(req.id, ControlError::forbidden,
                              "sandbox " + id.str() + " belongs to uid " + std::to_string(owner) + "; uid " +
                                  std::to_string(req.caller_uid) + " may act only on its own sandboxes (root on all)"));
  return false;
}

void SupervisorCore::do_name(ControlClientId client, ControlRequest req) {
  Sandbox* s = find(*req.sandbox);
  if (s == nullptr || !runs_unkilled(s->phase)) {
    reply(client, control_error(req.id, ControlError::not_found, "no running sandbox " + req.sandbox->str()));
    return;
  }
  if (!may_act_on(client, req, *s)) return;
  if (s->stop_deadline_ns != 0) {
    reply(client, control_error(req.id, ControlError::refused,
                                "sandbox " + req.sandbox->str() + " is being stopped (" + s->stop_reason +
                                    "): SIGTERM was sent, it is killed if it has not exited by its grace deadline"));
    return;
  }
  if (s->name || s->epoch != 0) {
    // A well-formed request this sandbox's state refuses (a usage error would be "bad_request").
    reply(client, control_error(req.id, ControlError::refused, "sandbox " + req.sandbox->str() + " already has the name \"" +
                                                       s->name.value_or(s->pending_name.value_or("?")) + "\""));
    return;
  }
  if (s->outlives_us) {
    // It would survive a crashed supervisor, and with it the kill-switch of its lease: the
    // name's next holder would run beside it.
    reply(client, control_error(req.id, ControlError::refused,
                                "sandbox " + req.sandbox->str() +
                                    " was started unnamed under --on-shutdown keep, so it outlives this supervisor; "
                                    "only a sandbox named at creation (run --name) can hold a name here"));
    return;
  }
  if (refuse_name_here(client, req)) return;
  if (!gate_named_creation(client, req.id)) return;
  sandboxes_.bind_name(*req.name, s->id);
  acquire_name(s->id, client, std::move(req));
}

void SupervisorCore::do_expect_commit(ControlClientId client, ControlRequest req) {
  // The request names lockd's reservation only by {name, sandbox, epoch}, which any client that
  // was refused that name learns from the refusal: from another uid it would run its own command
  // as the reservation's holder, with the grant's signed token.
  if (req.caller_uid != 0 && req.caller_uid != cfg_.operator_uid) {
    reply(client, control_error(req.id, ControlError::forbidden,
                                "expect-commit takes over lockd's 2-phase reservation of \"" + req.name.value_or("") +
                                    "\"; only root or the supervisor's uid " + std::to_string(cfg_.operator_uid) +
                                    " (the control plane) may send it, not uid " + std::to_string(req.caller_uid)));
    return;
  }
  if (find(*req.sandbox) != nullptr) {
    reply(client, control_error(req.id, ControlError::refused, "sandbox " + req.sandbox->str() + " already exists here"));
    return;
  }
  if (buried(*req.sandbox)) {
    ++counters_.reused_ids_refused;
    reply(client, control_error(req.id, ControlError::refused,
                                "sandbox " + req.sandbox->str() + " already ran on this worker and is gone; a sandbox id " +
                                    "names one sandbox, once (its grant's release may still be on its way to lockd)"));
    return;
  }
  if (const SandboxId* holder = sandboxes_.holder_of(*req.name)) {
    reply(client, control_error(req.id, ControlError::held, "\"" + *req.name + "\" is held on this worker",
                                {{"holder", holder->str()}}));
    return;
  }
  if (!cfg_.synthetic && hooks_.command_resolves) {
    if (const Status resolves = hooks_.command_resolves(req); !resolves.ok()) {
      reply(client, control_error(req.id, ControlError::exec_failed, resolves.message()));
      return;
    }
  }
  if (pending_commits_.size() >= kPendingCommitsMax) {
    reply(client, control_error(req.id, ControlError::busy, "too many commits waiting for the next heartbeat"));
    return;
  }
  if (refuse_unsafe_kill(client, req)) return;
  if (!gate_named_creation(client, req.id)) return;
  const Result<shm::ClaimedSlot> claim = table_.claim(*req.sandbox, now_);
  if (!claim.ok()) {
    reply(client, control_error(req.id, ControlError::table_full, claim.message()));
    return;
  }
  Sandbox s;
  s.id = *req.sandbox;
  s.slot = claim->slot;
  s.synthetic = cfg_.synthetic;
  s.owner = req.caller_uid;
  const SandboxId id = s.id;
  check_slot(sandboxes_.add(std::move(s)).slot);
  sandboxes_.bind_name(*req.name, id);
  // Committed by this worker's next heartbeat tick (DESIGN.md "creation flows", 2-phase).
  pending_commits_.push_back(PendingCommit{client, std::move(req)});
}

void SupervisorCore::commit_now(const PendingCommit& pc) {
  ControlRequest req = pc.request;
  const SandboxId sb = *req.sandbox;
  if (find(sb) == nullptr) return;
  const ControlClientId client = pc.client;
  if (cfg_.mode == SupervisorMode::preemptible) {
    // The control plane's 2-phase acquire left the name Acquiring for this sandbox: start it
    // (unpublished), then commit it to this worker, as for a run.
    on_acquiring(sb, client, req, req.epoch, now_i());
    return;
  }
  commit_then_start(sb, client, req, req.epoch);
}

void SupervisorCore::on_acquiring(const SandboxId& sb, ControlClientId client, ControlRequest req, Epoch epoch,
                                    std::int64_t acquire_send_ns) {
  Sandbox* s = find(sb);
  const std::string name = *req.name;
  const NameId name_id = name_id_of(name);
  if (s == nullptr) {  // gone meanwhile: abort the acquisition
    release_to_lockd(name_id, name, sb, epoch, [](bool, std::string) {});
    reply(client, control_error(req.id, ControlError::internal, "the sandbox went away while acquiring"));
    return;
  }
  auto give_back = [&](ControlError code, const std::string& msg) {
    give_back_name(*s, client, req, epoch, code, msg);  // also aborts the Acquiring record
  };
  // Kill-switch synchronisation: checked here, right before the sandbox starts, on the io
  // thread that also engages the kill-switch, so the two cannot interleave.
  const std::uint64_t now = now_;
  for (const auto& a : hb_.check_worker_liveness(now)) apply(a);
  if (!hb_.may_create_named(now)) {
    ++counters_.creates_refused_killswitch;
    give_back(ControlError::killswitch, "worker liveness lapsed while acquiring \"" + name +
                                "\"; named sandboxes are refused until a worker heartbeat succeeds");
    return;
  }
  const std::uint64_t valid_until = hb_.worker_valid_until_ns();
  if (now >= valid_until) {
    give_back(ControlError::unreachable, "the grant of \"" + name + "\" arrived after worker liveness would already have lapsed");
    return;
  }
  if (!before_spawn(s->phase) && !runs_unkilled(s->phase)) {
    give_back(ControlError::not_found, "the sandbox stopped while its name was being acquired");
    return;
  }
  if (!hb_.add(name_id, sb, epoch, s->slot, lease_measured_from_ns(static_cast<std::uint64_t>(acquire_send_ns), now))) {
    give_back(ControlError::internal, "heartbeat schedule refused the lease");
    return;
  }
  // Kept by worker liveness from now on (the worker-wide kill-switch covers it), but not carried
  // by worker beats until lockd has it Held on this worker.
  hb_.mark_worker_refreshed(sb);
  hb_.set_commit_pending(sb, true);
  s->name_id = name_id;
  s->epoch = epoch;
  s->valid_until_ns = valid_until;
  s->pending_name = name;
  if (before_spawn(s->phase)) {
#if LEASEHOLD_SIM_ABLATE_COMMIT_BEFORE_SPAWN
    // Simulator ablation, bug class "commit before spawn" (the order a review found in the code
    // earlier): the Commit goes out straight after the Acquiring grant and the sandbox starts
    // only on the Held answer, so lockd has the name Held here while IsRunning says "not running"
    // and may preempt it; the sandbox then starts anyway (two holders). on_committed spawns.
    send_commit(sb, client, std::move(req), epoch);
    return;
#endif
    spawn(*s, client, req);  // sends the Commit once the sandbox runs
    return;
  }
  advance(s->phase, SandboxPhase::committing);  // naming a running sandbox
  send_commit(sb, client, std::move(req), epoch);
}

void SupervisorCore::send_commit(const SandboxId& sb, ControlClientId client, ControlRequest req, Epoch epoch) {
  lockd_.call(wire::Commit{name_id_of(*req.name), sb, epoch, cfg_.worker}, now_i() + kAcquireTimeoutNs, [this, sb, client, req, epoch](LockdReply r) {
    now_ = static_cast<std::uint64_t>(r.now_ns);
    if (!r.ok()) {
      commit_failed(sb, client, req, epoch, ControlError::unreachable, "commit \"" + *req.name + "\": " + r.problem);
      return;
    }
    if (const auto* d = std::get_if<wire::Deny>(&*r.body)) {
      commit_failed(sb, client, req, epoch, ControlError::refused, "commit \"" + *req.name + "\" " + describe_answer(*r.body),
                    {{"holder", d->holder.str()}, {"epoch", d->epoch}, {"reason", std::string(to_string(d->refusal))}});
      return;
    }
    const auto* g = std::get_if<wire::Grant>(&*r.body);
    if (g == nullptr || g->state != LockPhase::held || g->epoch != epoch || g->holder != sb) {
      commit_failed(sb, client, req, epoch, ControlError::refused, "commit \"" + *req.name + "\": " + describe_answer(*r.body));
      return;
    }
    on_committed(sb, client, req, *g);
  });
}

void SupervisorCore::commit_failed(const SandboxId& sb, ControlClientId client, const ControlRequest& req,
                                     Epoch epoch, ControlError code, const std::string& message, json extra) {
  const std::string name = *req.name;
  Sandbox* s = find(sb);
  // Abort the Acquiring record, or give back a commit whose answer never came.
  release_to_lockd(name_id_of(name), name, sb, epoch, [](bool, std::string) {});
  if (s == nullptr || !s->pending_name || s->epoch != epoch) {
    reply(client, control_error(req.id, code, message, std::move(extra)));
    return;
  }
  hb_.remove(sb);
  s->pending_name.reset();
#if LEASEHOLD_SIM_ABLATE_COMMIT_BEFORE_SPAWN
  if (before_spawn(s->phase)) {  // the ablated order: nothing was started for it
    abandon(sb, client, req.id, code, message, std::move(extra));
    return;
  }
#endif
  if (s->phase == SandboxPhase::committing) advance(s->phase, SandboxPhase::running);
  sandboxes_.unbind_name(name, sb);
  if (req.op == ControlOp::name) {  // it ran before and runs on, unnamed
    s->name_id = NameId{};
    s->epoch = 0;
    s->token.clear();
    host_.clear_tokens(sb);
    reply(client, control_error(req.id, code, message, std::move(extra)));
    return;
  }
  // Started for this name: it never saw its epoch published; stop it, answer when it is gone.
  s->waiter_error = code;
  s->waiter_message = message;
  s->waiters.emplace_back(client, req.id);
  kill_sandbox(*s, "commit failed: " + message);
}

void SupervisorCore::on_committed(const SandboxId& sb, ControlClientId client, const ControlRequest& req,
                                    const wire::Grant& g) {
  const std::string name = *req.name;
  const NameId name_id = name_id_of(name);
  Sandbox* s = find(sb);
  if (s == nullptr || !s->pending_name || s->epoch != g.epoch) {
    // It exited (or was killed) meanwhile; its exit gave back the pending name, and this
    // release covers the commit that landed after that.
    release_to_lockd(name_id, name, sb, g.epoch, [](bool, std::string) {});
    reply(client, control_error(req.id, ControlError::not_found, "the sandbox stopped before its commit of \"" + name +
                                                         "\" was acknowledged"));
    return;
  }
  s->pending_name.reset();
  s->token = g.token;
  hb_.set_commit_pending(sb, false);
  if (kill_asked_or_gone(s->phase)) {
    // Being killed (kill-switch, shutdown): it never runs with this name.
    hb_.remove(sb);
    release_to_lockd(name_id, name, sb, g.epoch, [](bool, std::string) {});
    sandboxes_.unbind_name(name, sb);
    if (req.op == ControlOp::name) reply(client, control_error(req.id, ControlError::not_found, "the sandbox stopped while being named"));
    else s->waiters.emplace_back(client, req.id);
    return;
  }
#if LEASEHOLD_SIM_ABLATE_COMMIT_BEFORE_SPAWN
  if (before_spawn(s->phase)) {  // the ablated order: start it only now that lockd has it Held
    const HeartbeatLease* held = hb_.find(sb);
    s->name = name;
    s->valid_until_ns = held != nullptr ? held->valid_until_ns : 0;
    spawn(*s, client, req);  // publishes the grant, arms, releases, answers
    return;
  }
#endif
  advance(s->phase, SandboxPhase::running);
  const HeartbeatLease* l = hb_.find(sb);
  const std::uint64_t valid_until = l != nullptr ? l->valid_until_ns : 0;
  const std::uint64_t now = now_;
  const shm::TableErrc pe = l == nullptr || valid_until <= now
                                ? shm::TableErrc::revoked
                                : publish_grant(*s, name_id, name, g.epoch, valid_until, s->token);
  if (pe != shm::TableErrc::ok) {
    commit_failed(sb, client, req, g.epoch, ControlError::internal,
                  "publishing \"" + name + "\" failed: " + std::string(shm::to_string(pe)));
    return;
  }
  s->name = name;
  s->valid_until_ns = valid_until;
  if (req.op != ControlOp::name) rt_.set_deadline(s->slot, valid_until);  // armed at its start
  else if (!rt_.arm(s->slot, valid_until, host_.kill_target(sb)))
    kill_sandbox(*s, "rt command queue full while naming");  // an unwatched named sandbox must not run
  log_event("event=committed sandbox=%s slot=%u name=%s epoch=%" PRIu64 " valid_until_ns=%" PRIu64, sb.str().c_str(),
            s->slot, name.c_str(), g.epoch, valid_until);
  json ok = {{"sandbox", sb.str()}, {"slot", s->slot}, {"name", name}, {"epoch", g.epoch}, {"pid", s->pid},
             {"valid_until_ms", static_cast<std::int64_t>(valid_until - now) / 1'000'000}};
  if (s->synthetic) ok["synthetic"] = true;
  if (!s->cgroup_path.empty()) ok["cgroup"] = s->cgroup_path;
  reply(client, control_ok(req.id, ok));
}

void SupervisorCore::do_release(ControlClientId client, const ControlRequest& req) {
  const SandboxId* holder = sandboxes_.holder_of(*req.name);
  Sandbox* s = holder == nullptr ? nullptr : find(*holder);
  if (s == nullptr || !s->name) {
    reply(client, control_error(req.id, ControlError::not_found, "no sandbox on this worker holds \"" + *req.name + "\""));
    return;
  }
  if (!may_act_on(client, req, *s)) return;
  s->waiters.emplace_back(client, req.id);
  stop_sandbox(*s, "released", grace_of(req));
}

void SupervisorCore::do_kill(ControlClientId client, const ControlRequest& req) {
  Sandbox* s = find(*req.sandbox);
  if (s == nullptr || never_started(s->phase)) {
    reply(client, control_error(req.id, ControlError::not_found, "no running sandbox " + req.sandbox->str()));
    return;
  }
  if (!may_act_on(client, req, *s)) return;
  s->waiters.emplace_back(client, req.id);
  stop_sandbox(*s, "killed on request", grace_of(req));
}

void SupervisorCore::do_wait(ControlClientId client, const ControlRequest& req) {
  const SandboxId id = *req.sandbox;
  Sandbox* s = find(id);
  std::optional<GoneSandbox> gone;
  if (s == nullptr && !releasing_.contains(id) && hooks_.recently_gone) gone = hooks_.recently_gone(id);
  if (s == nullptr && !releasing_.contains(id) && !gone) {
    reply(client, control_error(req.id, ControlError::not_found,
                                "no sandbox " + id.str() + " on this supervisor, running or gone recently"));
    return;
  }
  if (s != nullptr && before_spawn(s->phase)) {
    reply(client, control_error(req.id, ControlError::not_found,
                                "sandbox " + id.str() + " has not started (its name is still being acquired)"));
    return;
  }
  if (gone) {  // gone before the wait came: its record says how
    if (!may_act_on(client, req, gone->owner, id)) return;
    json fields = {{"sandbox", id.str()}, {"exit_status", gone->exit_status},
                   {"exit_code", shell_exit_code(gone->exit_status)}, {"reason", gone->reason}};
    if (gone->name) fields["name"] = *gone->name;
    reply(client, control_ok(req.id, fields));
    return;
  }
  // Answered later: bounded, since a waiting connection is never idle and cannot be evicted.
  const auto releasing = releasing_.find(id);
  if (!may_act_on(client, req, s != nullptr ? s->owner : releasing->second.owner, id)) return;
  if (const std::string why = wait_refusal(req.caller_uid); !why.empty()) {
    ++counters_.waits_refused;
    reply(client, control_error(req.id, ControlError::busy, why));
    return;
  }
  if (s != nullptr) s->waiters.emplace_back(client, req.id);
  else releasing->second.waiters.emplace_back(client, req.id);
  waits_[client] = req.caller_uid;
}

std::string SupervisorCore::wait_refusal(uid_t uid) const {
  auto privileged = [this](uid_t u) { return u == 0 || u == cfg_.operator_uid; };
  std::size_t same = 0, others = 0;
  for (const auto& [c, u] : waits_) {
    same += u == uid ? 1 : 0;
    others += privileged(u) ? 0 : 1;
  }
  if (waits_.size() >= kControlWaitsMax)
    return "too many waits: " + std::to_string(waits_.size()) + " connections wait already (at most " +
           std::to_string(kControlWaitsMax) + ")";
  if (privileged(uid)) return {};
  if (same >= kControlWaitsPerUidMax)
    return "too many waits for uid " + std::to_string(uid) + ": " + std::to_string(same) +
           " of its connections wait already (at most " + std::to_string(kControlWaitsPerUidMax) + " per uid)";
  if (others >= kControlWaitsMax - kControlWaitsReserved)
    return "too many waits of users other than root and uid " + std::to_string(cfg_.operator_uid) + ": " +
           std::to_string(others) + " wait already (at most " + std::to_string(kControlWaitsMax - kControlWaitsReserved) +
           "; " + std::to_string(kControlWaitsReserved) + " are kept for root and the supervisor's user)";
  return {};
}

void SupervisorCore::on_client_closed(ControlClientId client) {
  if (const auto it = starting_.find(client); it != starting_.end()) it->second.second = true;
  if (waits_.erase(client) == 0) return;
  // A run waiting for its name whose client left: nobody would learn it ran; leave the FIFO.
  for (auto it = queued_.begin(); it != queued_.end();) {
    if (it->client != client) {
      ++it;
      continue;
    }
    const SandboxId sb = it->sandbox;
    leave_queue(it);
    abandon(sb, client, nullptr, ControlError::internal, "the client closed its connection");
    it = queued_.begin();
  }
  auto drop = [client](std::vector<std::pair<ControlClientId, json>>& v) {
    std::erase_if(v, [client](const auto& w) { return w.first == client; });
  };
  for (auto& [id, s] : sandboxes_) drop(s.waiters);
  for (auto& [id, r] : releasing_) drop(r.waiters);
}

std::uint64_t SupervisorCore::grace_of(const ControlRequest& req) const noexcept {
  return req.grace_ms ? std::min(*req.grace_ms, cfg_.stop_grace_ms) : cfg_.stop_grace_ms;
}

void SupervisorCore::stop_sandbox(Sandbox& s, const std::string& reason, std::uint64_t grace_ms) {
  if (kill_asked_or_gone(s.phase)) return;
  // Only a command that runs gets a chance to stop by itself: one not started yet, a synthetic
  // one or a stop without grace is killed as before.
  if (grace_ms == 0 || s.synthetic || !runs_unkilled(s.phase)) {
    kill_sandbox(s, reason);
    return;
  }
  const std::uint64_t deadline = now_ + grace_ms * 1'000'000;
  if (s.stop_deadline_ns != 0 && s.stop_deadline_ns <= deadline) return;  // stopping already, no later
  const bool again = s.stop_deadline_ns != 0;
  s.stop_deadline_ns = deadline;
  if (again) return;
  s.stop_reason = reason;
  stopping_.push_back(s.id);
  // Its slot, lease, heartbeats and rt deadline stay as they are: it still holds its name, and
  // if its lease is not refreshed the kill-switch fires as always.
  log_event("event=stopping sandbox=%s name=%s reason=\"%s\" grace_ms=%" PRIu64, s.id.str().c_str(),
            s.name ? s.name->c_str() : "-", reason.c_str(), grace_ms);
  host_.terminate(s.id);
}

void SupervisorCore::check_stops(std::uint64_t now_ns) {
  now_ = now_ns;
  // Only the sandboxes being stopped are looked at: this runs on every heartbeat tick.
  std::vector<SandboxId> due;
  for (std::size_t i = 0; i < stopping_.size();) {
    const Sandbox* s = find(stopping_[i]);
    if (s == nullptr || !runs_unkilled(s->phase)) {  // exited or killed meanwhile: no longer ours to time
      stopping_[i] = stopping_.back();
      stopping_.pop_back();
      continue;
    }
    if (s->stop_deadline_ns <= now_) due.push_back(stopping_[i]);
    ++i;
  }
  for (const SandboxId& id : due) {
    Sandbox* s = find(id);
    if (s == nullptr || !runs_unkilled(s->phase)) continue;
    ++counters_.stops_grace_expired;
    log_event("level=warn event=grace_expired sandbox=%s name=%s reason=\"%s\"", id.str().c_str(),
              s->name ? s->name->c_str() : "-", s->stop_reason.c_str());
    kill_sandbox(*s, s->stop_reason + " (still running at the end of its grace period after SIGTERM)");
  }
}

void SupervisorCore::release_to_lockd(const NameId& name_id, const std::string& name,
                                        const SandboxId& sb, Epoch epoch,
                                        std::function<void(bool, std::string)> done) {
  wire::Release rel;
  rel.name_id = name_id;
  rel.sandbox = sb;
  rel.epoch = epoch;
  ++releases_in_flight_;
  lockd_.call(rel, now_i() + kReleaseTimeoutNs, [this, name, sb, epoch, done](LockdReply r) {
    now_ = static_cast<std::uint64_t>(r.now_ns);
    --releases_in_flight_;
    bool ok = false;
    std::string text;
    if (!r.ok()) {
      text = r.problem;
    } else {
      ok = std::holds_alternative<wire::Ok>(*r.body);
      text = describe_answer(*r.body);
    }
    if (ok) ++counters_.names_released;
    log_event("event=released name=%s sandbox=%s epoch=%" PRIu64 " result=\"%s\"", name.c_str(),
              sb.str().c_str(), epoch, text.c_str());
    done(ok, text);
    progress();
  });
}

void SupervisorCore::kill_sandbox(Sandbox& s, const std::string& reason) {
  if (kill_asked_or_gone(s.phase)) return;
#if LEASEHOLD_SIM_ABLATE_COMMIT_BEFORE_SPAWN
  if (before_spawn(s.phase)) return;  // the ablated order: nothing started yet (on_committed starts it)
#endif
  advance(s.phase, s.phase == SandboxPhase::aborted ? SandboxPhase::aborting : SandboxPhase::killing);
  if (s.kill_reason.empty()) s.kill_reason = reason;
  // Its checks fail from now on, before the rt thread applies the kill (up to a command poll
  // later) and also when its queue is full and the kill goes out from here.
  table_.revoke(s.slot);
  if (s.armed && !s.rt_killed && rt_.kill_now(s.slot)) return;
  // Not (or no longer) armed, or the queue is full: kill from here.
  host_.kill(s.id, now_);
  if (s.synthetic) exited(s.id);
}

void SupervisorCore::exited(const SandboxId& id) {
  Sandbox* s = find(id);
  if (s == nullptr || s->phase == SandboxPhase::exited) return;
  advance(s->phase, SandboxPhase::exited);
  ++counters_.exited;
  hb_.remove(id);
  rt_.set_deadline(s->slot, 0);
  // The first process stays unreaped (its pid and process group cannot be reused) until the rt
  // thread has applied the disarm (kill_switch.hpp); finish_exit reaps it.
  if (s->armed) {
    const RtSubmitted d = rt_.disarm(s->slot);
    if (d) {
      s->disarm_seq = d.seq;
      disarming_.push_back(id);
      if (hooks_.disarm_pending) hooks_.disarm_pending();
      return;
    }
    // Queue full: the rt thread may still hold the target (finish_exit reaps it anyway; the
    // kill switch's pidfd keeps the pid from reuse). Stopped (a shutdown): it holds nothing.
    if (d.refusal != RtRefusal::stopped) log_event("level=warn event=disarm_refused sandbox=%s", id.str().c_str());
  }
  finish_exit(id);
}

std::uint64_t SupervisorCore::tombstone_ns() const noexcept {
  return 2 * cfg_.lockd_ttl_ms * 1'000'000 + static_cast<std::uint64_t>(kReleaseTimeoutNs);
}

void SupervisorCore::check_slot(std::uint32_t slot, const SandboxId& left) const {
  sandboxes_.check_slot(slot, table_.owner(slot), left);
}

void SupervisorCore::bury(const SandboxId& id) {
  if (tombstone_order_.size() >= kTombstonesMax) {
    const auto& [oldest, until] = tombstone_order_.front();
    if (const auto it = tombstones_.find(oldest); it != tombstones_.end() && it->second == until) {
      tombstones_.erase(it);
      if (until > now_) ++counters_.tombstones_evicted;
    }
    tombstone_order_.pop_front();
  }
  const std::uint64_t until = now_ + tombstone_ns();
  tombstones_[id] = until;
  tombstone_order_.emplace_back(id, until);
  LEASEHOLD_ASSERT(tombstones_.size() <= tombstone_order_.size());
}

bool SupervisorCore::buried(const SandboxId& id) {
  while (!tombstone_order_.empty() && tombstone_order_.front().second <= now_) {
    const auto& [old, until] = tombstone_order_.front();
    if (const auto it = tombstones_.find(old); it != tombstones_.end() && it->second == until) tombstones_.erase(it);
    tombstone_order_.pop_front();
  }
  const auto it = tombstones_.find(id);
  return it != tombstones_.end() && it->second > now_;
}

void SupervisorCore::check_disarms(std::uint64_t now_ns) {
  now_ = now_ns;
  for (std::size_t i = 0; i < disarming_.size();) {
    Sandbox* s = find(disarming_[i]);
    if (s == nullptr || rt_.applied(s->disarm_seq)) {
      const SandboxId id = disarming_[i];
      disarming_[i] = disarming_.back();
      disarming_.pop_back();
      if (s != nullptr) finish_exit(id);
      continue;
    }
    ++i;
  }
  if (!disarming_.empty() && hooks_.disarm_pending) hooks_.disarm_pending();
}

void SupervisorCore::finish_exit(SandboxId id) {
  Sandbox* s = find(id);
  if (s == nullptr) return;
  // Reaped (its pid and process group may be reused from now on), its leaf removed.
  const ReapedSandbox reaped = host_.reap(id);
  s->exit_code = reaped.exit_code;
  if (s->kill_reason.empty() && s->stop_deadline_ns != 0) {  // it exited within its grace period
    ++counters_.stops_graceful;
    s->kill_reason = s->stop_reason + " (exited after SIGTERM)";
  }
  if (s->name || s->pending_name) bury(id);  // before any release of its grant goes out
  log_event("event=exited sandbox=%s slot=%u pid=%d name=%s epoch=%" PRIu64 " status=%d reason=\"%s\"",
            id.str().c_str(), s->slot, s->pid, s->name ? s->name->c_str() : "-", s->epoch, s->exit_code,
            s->kill_reason.empty() ? "exited" : s->kill_reason.c_str());
  const std::uint32_t slot = s->slot;
  check_slot(slot);
  // Let go below: empty in both tables after, or (quarantined) still claimed in shm for it alone.
  const SandboxId left = reaped.still_populated ? id : SandboxId{};
  if (reaped.still_populated) {
    // A process of it outlived the kill and still reads the table: the slot stays revoked and
    // is not handed out again while its leaf holds a process (release_quarantined), so it
    // cannot come to show another sandbox's grant to that process.
    table_.revoke(s->slot);
    quarantined_.push_back(Quarantined{id, s->slot, s->name || s->pending_name ? s->name_id : NameId{}, s->epoch});
    ++counters_.slots_quarantined;
    log_event("level=warn event=slot_quarantined sandbox=%s slot=%u reason=leaf_still_populated", id.str().c_str(), s->slot);
  } else {
    table_.free(s->slot, now_);
  }
  // Dead means the pidfd reported the exit *and* the leaf is empty: while a process of it
  // still runs, the name is not given back (lockd expires it after its TTL; nothing refreshes it).
  const bool leave_to_expire = (s->name || s->pending_name) && reaped.still_populated;
  if (leave_to_expire)
    log_event("level=warn event=leaf_still_populated sandbox=%s name=%s epoch=%" PRIu64 " action=name_left_to_expire",
              id.str().c_str(), s->name ? s->name->c_str() : s->pending_name->c_str(), s->epoch);
  auto answer_waiters = [this](std::vector<std::pair<ControlClientId, json>> waiters,
                               std::optional<ControlError> err, std::string msg, json fields) {
    for (auto& [c, rid] : waiters) {
      if (err) reply(c, control_error(rid, *err, msg, fields));
      else reply(c, control_ok(rid, fields));
    }
  };
  json fields = {{"sandbox", id.str()}, {"exit_status", s->exit_code}, {"exit_code", shell_exit_code(s->exit_code)},
                 {"reason", s->kill_reason.empty() ? std::string("exited") : s->kill_reason}};
  if (s->name) fields["name"] = *s->name;
  auto waiters = std::move(s->waiters);
  auto err = s->waiter_error;
  auto msg = s->waiter_message;
  if (hooks_.gone) hooks_.gone(*s);  // each branch below erases it, with its slot and names
  if ((s->name || s->pending_name) && leave_to_expire) {
    fields["released"] = false;
    fields["release"] = "not released: a process of the sandbox still runs in its cgroup leaf; lockd expires the name";
    sandboxes_.erase(id);
    answer_waiters(std::move(waiters), err, msg, fields);
  } else if ((s->name || s->pending_name) && s->revoked) {  // dead (pidfd, empty leaf): lockd may lift the revoke
    const std::string name = s->name ? *s->name : *s->pending_name;
    confirm_kill_to_lockd(s->name_id, name, id, s->epoch);
    sandboxes_.erase(id);
    fields["released"] = false;
    fields["release"] = "revoked by lockd; kill confirmed to lockd";
    answer_waiters(std::move(waiters), err, msg, fields);
  } else if (s->name || s->pending_name) {
    const std::string name = s->name ? *s->name : *s->pending_name;
    const NameId nid = s->name_id;
    const Epoch epoch = s->epoch;
    releasing_[id].owner = s->owner;  // a wait that comes before lockd answers joins these
    sandboxes_.erase(id);
    release_to_lockd(nid, name, id, epoch,
                     [this, id, answer_waiters, waiters = std::move(waiters), err, msg, fields](bool ok, std::string text) mutable {
                       fields["released"] = ok;
                       fields["release"] = text;
                       if (auto it = releasing_.find(id); it != releasing_.end()) {
                         auto later = std::move(it->second.waiters);
                         releasing_.erase(it);
                         answer_waiters(std::move(later), std::nullopt, "", fields);
                       }
                       answer_waiters(std::move(waiters), err, msg, fields);
                     });
  } else {
    sandboxes_.erase(id);
    answer_waiters(std::move(waiters), err, msg, fields);
  }
  check_slot(slot, left);
  progress();
}

void SupervisorCore::on_rt_kill(const RtKillEvent& e, std::uint64_t now_ns) {
  now_ = now_ns;
  {
    Sandbox* s = sandboxes_.at_slot(e.slot);
    const SandboxId id = s != nullptr ? s->id : SandboxId{};
    if (s == nullptr || e.record.error == -ECANCELED) {
      // A kill the rt thread gave up on because its sandbox was disarmed (it exited first).
      log_event("level=warn event=kill_record slot=%u error=%d", e.slot, e.record.error);
      return;
    }
    // A kill request sets kill_reason first (kill_sandbox); a deadline kill's reason is set here.
    const bool requested = !s->kill_reason.empty();
    if (requested) ++counters_.kills_request;
    else ++counters_.kills_deadline;
    if (s != nullptr) {
      s->rt_killed = true;
      if (s->kill_reason.empty()) s->kill_reason = "kill-switch: lease not refreshed in time";
    }
    const KillRecord& r = e.record;
    log_event("level=warn event=killed sandbox=%s slot=%u cause=%s deadline_ns=%" PRIu64 " issued_ns=%" PRIu64
              " confirmed_ns=%" PRIu64 " path=%s error=%d name=%s epoch=%" PRIu64 " reason=\"%s\"",
              id.str().c_str(), e.slot, requested ? "request" : "deadline", r.deadline_ns, r.issued_ns,
              r.confirmed_ns,
              r.path == KillPath::cgroup_kill ? "cgroup.kill" : r.path == KillPath::signals ? "signals" : "none",
              r.error, s && s->name ? s->name->c_str() : "-", s ? s->epoch : 0, s ? s->kill_reason.c_str() : "");
    if (s != nullptr && s->synthetic) exited(id);  // nothing to wait for
  }
}

void SupervisorCore::begin_shutdown(const char* why, std::uint64_t now_ns) {
  if (shutting_down_) return;
  now_ = now_ns;
  shutting_down_ = true;
  log_event("event=shutdown signal=%s policy=%s sandboxes=%zu", why, std::string(to_string(cfg_.on_shutdown)).c_str(),
            sandboxes_.size());
  // Runs waiting for their name give up their places.
  while (!queued_.empty()) {
    const ControlClientId client = queued_.back().client;
    const ControlRequest req = queued_.back().request;
    const SandboxId sb = queued_.back().sandbox;
    leave_queue(queued_.end() - 1);
    abandon(sb, client, req.id, ControlError::shutting_down, "the supervisor is shutting down");
  }
  // Commits not yet sent will not be: answer them.
  while (!pending_commits_.empty()) {
    PendingCommit pc = std::move(pending_commits_.front());
    pending_commits_.pop_front();
    abandon(*pc.request.sandbox, pc.client, pc.request.id, ControlError::shutting_down, "the supervisor is shutting down");
  }
  std::vector<SandboxId> ids;
  for (auto& [id, s] : sandboxes_) ids.push_back(id);
  if (cfg_.on_shutdown == ShutdownPolicy::kill) {
    for (const auto& id : ids)
      if (Sandbox* s = find(id); s && !never_started(s->phase)) stop_sandbox(*s, "shutdown", cfg_.stop_grace_ms);
  } else {
    // keep: unnamed processes go on. A named one is killed as under `kill`, and its name
    // released once it is dead: kept, it would run beside the name's next holder with nothing
    // to stop it. The rt thread stops first (it must let go of the kept processes' fds and
    // pids), so the named ones are killed from here.
    rt_.stop();
    for (const auto& id : ids) {
      Sandbox* s = find(id);
      if (s == nullptr || never_started(s->phase)) continue;
      if (s->name || s->pending_name) {
        kill_sandbox(*s, "shutdown: a named sandbox is never kept");
        continue;
      }
      hb_.remove(id);
      table_.revoke(s->slot);
      for (auto& [c, rid] : s->waiters) reply(c, control_error(rid, ControlError::shutting_down, "the supervisor is shutting down"));
      log_event("event=kept sandbox=%s pid=%d cgroup=%s", id.str().c_str(), s->pid,
                s->cgroup_path.empty() ? "-" : s->cgroup_path.c_str());
      host_.forget(id);  // closes the pidfd and the leaf's fds; a populated leaf stays
      const std::uint32_t slot = s->slot;
      check_slot(slot);
      sandboxes_.erase(id);
      check_slot(slot, id);  // its slot stays claimed (revoked) in shm
    }
  }
  progress();
}

void SupervisorCore::apply(const HeartbeatAction& a) {
  switch (a.kind) {
    case HeartbeatAction::Kind::none:
      return;
    case HeartbeatAction::Kind::extend: {
      // shm first (the sandbox's own check), then the rt thread's deadline (lazy re-arm: no
      // message needed, it re-reads this when the old deadline comes due).
      Sandbox* s = find(a.sandbox);
      // A sandbox whose Commit is in flight has no published epoch to extend, only its deadline.
      if ((s != nullptr && s->pending_name) || table_.extend(a.slot, a.valid_until_ns) == shm::TableErrc::ok)
        rt_.set_deadline(a.slot, a.valid_until_ns);
      if (s != nullptr) s->valid_until_ns = a.valid_until_ns;
      return;
    }
    case HeartbeatAction::Kind::kill: {
      Sandbox* s = find(a.sandbox);
      if (s == nullptr) return;
      std::string why = a.lapsed ? "lease lapsed before lockd's answer arrived"
                                 : std::string("heartbeat answer ") + std::string(to_string(a.cause));
      if (a.cause == RefreshStatus::lost && !a.holder.is_nil())
        why += " (held by " + a.holder.str() + " at epoch " + std::to_string(a.holder_epoch) + ")";
      if (!kill_asked(s->phase)) log_event("event=recovery sandbox=%s name=%s reason=\"%s\"", a.sandbox.str().c_str(),
                                   s->name ? s->name->c_str() : "-", why.c_str());
      // lockd no longer knows the grant as ours (revoked, or held by another): once dead, say so
      // (a revoke's lock-delay waits for it) rather than release a name that is not ours.
      if (!a.lapsed && a.cause != RefreshStatus::refreshed) s->revoked = true;
      // Counted here, not per answer: a late answer about a lease already released (its
      // heartbeat crossed the release) loses nothing.
      if (!a.lapsed && a.cause != RefreshStatus::refreshed)
        ++(a.cause == RefreshStatus::lost ? counters_.lost : counters_.unknown);
      kill_sandbox(*s, why);
      hb_.remove(a.sandbox);
      return;
    }
  }
}

void SupervisorCore::release_quarantined() {
  for (std::size_t i = 0; i < quarantined_.size();) {
    const SandboxId id = quarantined_[i].id;
    const std::uint32_t slot = quarantined_[i].slot;
    if (!host_.leaf_emptied(id)) {
      ++i;
      continue;
    }
    check_slot(slot, id);
    table_.free(slot, now_);
    check_slot(slot);
    ++counters_.slots_released_from_quarantine;
    log_event("event=slot_released sandbox=%s slot=%u reason=leaf_emptied", id.str().c_str(), slot);
    quarantined_[i] = quarantined_.back();
    quarantined_.pop_back();
  }
}

void SupervisorCore::on_heartbeat_tick(std::uint64_t now_ns) {
  now_ = now_ns;
  check_stops(now_ns);
  release_quarantined();
  // Runs waiting for their name: given up at their deadline; else a place lockd gave is renewed
  // in this tick's heartbeat datagrams (below), and a run not placed yet asks with a Wait.
  std::vector<RefreshEntry> renew;  // {name, sandbox, epoch 0}
  for (std::size_t i = 0; i < queued_.size();) {
    QueuedRun& q = queued_[i];
    if (q.deadline_ns != 0 && now_ >= q.deadline_ns) {
      ++counters_.queue_timeouts;
      const ControlClientId client = q.client;
      const ControlRequest req = q.request;
      const SandboxId sb = q.sandbox;
      const std::string where = q.position == 0 ? std::string("before lockd placed it")
                                                : "at position " + std::to_string(q.position) + " of " + std::to_string(q.waiters);
      leave_queue(queued_.begin() + static_cast<std::ptrdiff_t>(i));
      abandon(sb, client, req.id, ControlError::timeout,
              "waited " + std::to_string(*req.queue_timeout_ms) + " ms for \"" + *req.name + "\" (" + where + "); gave up");
      continue;
    }
    const SandboxId sb = q.sandbox;
    ++i;
    if (q.position != 0 && !q.in_flight && ++q.ticks % kWaitEveryTicks != 0) renew.push_back({name_id_of(*q.request.name), sb, 0});
    else send_wait(sb);  // may erase queued_ entries via an answer delivered at once
  }
  // 2-phase commits ride on this tick.
  while (!pending_commits_.empty()) {
    PendingCommit pc = std::move(pending_commits_.front());
    pending_commits_.pop_front();
    commit_now(pc);
  }
  // Read after the commits: an answer delivered at once (a request that could not start) moves
  // now_ on, and the heartbeat schedule must never see time go back.
  const std::uint64_t now = now_;
  if (cfg_.mode == SupervisorMode::preemptible) {
    auto kills = hb_.check_worker_liveness(now);
    if (!kills.empty()) {
      ++counters_.worker_killswitch;
      log_event("level=warn event=worker_killswitch sandboxes=%zu", kills.size());
    }
    for (const auto& a : kills) apply(a);
  }
  HeartbeatRound round = hb_.begin_round(now, wire::kHeartbeatEntriesMax);
  // The places of queued runs ride in the same datagrams, after the leases (entries at epoch 0,
  // which no grant has), each in a request of its name's shard that has room, else in one more.
  std::vector<std::vector<RefreshEntry>> places(round.requests.size());
  for (const RefreshEntry& place : renew) {
    const unsigned shard = shard_of(place.name, hb_.shards());
    std::size_t k = 0;
    while (k < round.requests.size() &&
           (round.requests[k].entries.empty() || shard_of(round.requests[k].entries.front().name, hb_.shards()) != shard ||
            round.requests[k].entries.size() + places[k].size() >= wire::kHeartbeatEntriesMax))
      ++k;
    if (k == round.requests.size()) {
      RefreshRequest only_places;
      only_places.send_ns = now;
      only_places.deadline_ns = now + static_cast<std::uint64_t>(kAcquireTimeoutNs);
      round.requests.push_back(std::move(only_places));
      places.emplace_back();
    }
    places[k].push_back(place);
  }
  for (std::size_t k = 0; k < round.requests.size(); ++k) {
    RefreshRequest& req = round.requests[k];
    // Encoded straight from this buffer (LockdPort::call_heartbeat): no Heartbeat is built.
    hb_entries_.clear();
    for (const auto& e : req.entries) hb_entries_.push_back(wire::HeartbeatEntry{e.name, e.sandbox, e.epoch});
    for (const auto& e : places[k]) hb_entries_.push_back(wire::HeartbeatEntry{e.name, e.sandbox, e.epoch});
    ++counters_.heartbeat_datagrams;
    auto entries = std::make_shared<std::vector<RefreshEntry>>(std::move(req.entries));
    auto waits = std::make_shared<std::vector<RefreshEntry>>(std::move(places[k]));
    lockd_.call_heartbeat(hb_entries_, 0, static_cast<std::int64_t>(req.deadline_ns), [this, entries, waits](LockdReply r) {
      now_ = static_cast<std::uint64_t>(r.now_ns);
      const std::uint64_t at = now_;
      if (!r.ok()) {
        ++counters_.heartbeat_failures;
        table_.record_heartbeat_failure();
        return;  // the places are renewed at the next tick, or lapse with a worker cut off
      }
      const auto* ack = std::get_if<wire::HeartbeatAck>(&*r.body);
      if (ack == nullptr || ack->entries.size() != entries->size() + waits->size()) {
        ++counters_.heartbeat_failures;
        table_.record_heartbeat_failure();
        log_event("level=warn event=heartbeat_bad_answer answer=\"%s\"", describe_answer(*r.body).c_str());
        return;
      }
      table_.record_heartbeat_rtt_ns(at - static_cast<std::uint64_t>(r.first_send_ns));
      for (std::size_t i = 0; i < entries->size(); ++i) {
        const auto& e = (*entries)[i];
        const auto& a = ack->entries[i];
        if (a.name_id != e.name) continue;  // not an answer about this entry
        const RefreshStatus res = a.status;
        if (res == RefreshStatus::refreshed && cfg_.mode == SupervisorMode::lease &&
            std::uint64_t{a.ttl_left_ms} + 1 < cfg_.ttl_ms) {
          // lockd refreshes for less than --ttl-ms: the safety condition does not hold for this
          // lease. Do not extend it; stop the sandbox.
          if (Sandbox* s = find(e.sandbox)) {
            log_event("level=warn event=ttl_mismatch sandbox=%s ttl_left_ms=%u ttl_ms=%" PRIu64, e.sandbox.str().c_str(),
                      a.ttl_left_ms, cfg_.ttl_ms);
            kill_sandbox(*s, "lockd refreshed for " + std::to_string(a.ttl_left_ms) + " ms, below --ttl-ms " +
                                 std::to_string(cfg_.ttl_ms));
            hb_.remove(e.sandbox);
          }
          continue;
        }
        if (res == RefreshStatus::refreshed) ++counters_.refreshed;
        apply(hb_.on_refresh_answer(e.sandbox, e.epoch, res, a.holder, a.epoch,
                                    static_cast<std::uint64_t>(r.first_send_ns), at));
      }
      for (std::size_t i = 0; i < waits->size(); ++i)
        on_place_renewed((*waits)[i].sandbox, ack->entries[entries->size() + i], r.first_send_ns);
    });
  }
  if (round.worker_liveness) send_worker_beat(round.worker_liveness_deadline_ns, std::move(round.worker_held));
}

void SupervisorCore::send_worker_beat(std::uint64_t deadline_ns, std::vector<RefreshEntry> held) {
  ++counters_.heartbeat_datagrams;
  wire::WorkerHeartbeat beat{cfg_.worker, {}};
  for (const auto& e : held) beat.held.push_back(wire::HeartbeatEntry{e.name, e.sandbox, e.epoch});
  lockd_.call(beat, static_cast<std::int64_t>(deadline_ns),
             [this, held = std::move(held)](LockdReply r) {
               now_ = static_cast<std::uint64_t>(r.now_ns);
               const std::uint64_t at = now_;
               if (!r.ok()) {
                 ++counters_.heartbeat_failures;
                 table_.record_heartbeat_failure();
                 return;
               }
               const auto* w = std::get_if<wire::WorkerAck>(&*r.body);
               if (w == nullptr) {
                 ++counters_.heartbeat_failures;
                 log_event("level=warn event=worker_beat_bad_answer answer=\"%s\"", describe_answer(*r.body).c_str());
                 return;
               }
               // Names lockd no longer has as ours (revoked, preempted, transferred away): kill
               // at once, whatever the liveness part of the answer says (mutex violation recovery).
               for (const auto& a : w->not_held) {
                 const auto e = std::find_if(held.begin(), held.end(), [&](const RefreshEntry& x) { return x.name == a.name_id; });
                 if (e == held.end()) continue;  // not a name this beat carried
                 const RefreshStatus res = a.status;
                 if (res == RefreshStatus::refreshed) continue;
                 apply(hb_.on_refresh_answer(e->sandbox, e->epoch, res, a.holder, a.epoch,
                                             static_cast<std::uint64_t>(r.first_send_ns), at));
               }
               if (w->liveness_ttl_ms < cfg_.ttl_ms) {
                 ++counters_.heartbeat_failures;
                 log_event("level=warn event=worker_ttl_too_short liveness_ttl_ms=%u ttl_ms=%" PRIu64, w->liveness_ttl_ms, cfg_.ttl_ms);
                 return;  // not counted as liveness: the kill-switch will fire in time
               }
               ++counters_.worker_beats_acked;
               table_.record_heartbeat_rtt_ns(at - static_cast<std::uint64_t>(r.first_send_ns));
               const bool was_engaged = hb_.killswitch_engaged();
               for (const auto& a : hb_.on_worker_liveness_ack(static_cast<std::uint64_t>(r.first_send_ns), at)) apply(a);
               if (was_engaged && !hb_.killswitch_engaged()) log_event("event=worker_live_again");
             });
}

bool SupervisorCore::is_running(const wire::IsRunning& q) const {
  const Sandbox* s = sandboxes_.find(q.sandbox);
  // Conservative: a sandbox still alive (even while being killed) counts as running, so lockd
  // never preempts a name whose holder could still act. That includes a sandbox whose Commit
  // is in flight: it was started before the Commit was sent, and name_id / epoch are those of
  // its acquiring grant. A sandbox not yet started (acquire in flight) has no epoch: "no".
  return s != nullptr && answers_running(s->phase) && s->name_id == q.name_id && s->epoch == q.epoch;
}

bool SupervisorCore::on_revoked(const wire::Revoked& q, std::uint64_t now_ns) {
  now_ = now_ns;
  for (auto& [id, s] : sandboxes_) {
    // A sandbox whose Commit is in flight (pending_name, preemptible) runs under that grant's
    // epoch as well: lockd may have committed and then revoked it before the answer arrives.
    const std::optional<std::string>& held = s.name ? s.name : s.pending_name;
    if (s.phase == SandboxPhase::exited || !held || s.name_id != q.name_id || s.epoch != q.epoch) continue;
    if (!s.revoked)
      log_event("level=warn event=revoked sandbox=%s name=%s epoch=%" PRIu64 " new_epoch=%" PRIu64 " action=kill",
                id.str().c_str(), held->c_str(), q.epoch, q.new_epoch);
#if LEASEHOLD_SIM_ABLATE_CONFIRM_BEFORE_EXIT
    // Ablation (simulator only): confirmed as soon as the kill is asked, not once it is dead.
    const std::string name = *held;
    hb_.remove(id);
    kill_sandbox(s, "revoked by lockd");
    confirm_kill_to_lockd(q.name_id, name, id, q.epoch);
    return true;
#else
    s.revoked = true;
    hb_.remove(id);
    kill_sandbox(s, "revoked by lockd (epoch " + std::to_string(q.epoch) + " -> " + std::to_string(q.new_epoch) + ")");
    return true;  // the confirmation follows its exit (finish_exit)
#endif
  }
  // Being placed (its grant may still arrive): its next heartbeat answer is `lost`, so it is
  // killed then; lockd's bound covers it, no confirmation is sent for it.
  for (const auto& [name, holder] : sandboxes_.names())
    if (name_id_of(name) == q.name_id) return true;
  // A process of that grant's sandbox outlived its kill (its leaf is quarantined): it may still
  // act, so no confirmation; lockd's bound frees the name.
  for (const Quarantined& qd : quarantined_)
    if (qd.name_id == q.name_id && qd.epoch == q.epoch) return true;
  // Nothing of that grant runs here (it exited, or a restart stopped it): confirm at once.
  confirm_kill_to_lockd(q.name_id, q.name_id.str(), SandboxId{}, q.epoch);
  return false;
}

void SupervisorCore::confirm_kill_to_lockd(const NameId& name_id, const std::string& name, const SandboxId& sb,
                                             Epoch epoch) {
  ++releases_in_flight_;  // shutdown waits for it like for a release
  lockd_.call(wire::KillConfirmed{name_id, sb, epoch},
             now_i() + static_cast<std::int64_t>(std::max<std::uint64_t>(cfg_.lockd_ttl_ms, cfg_.ttl_ms)) * 1'000'000,
             [this, name, sb, epoch](LockdReply r) {
               now_ = static_cast<std::uint64_t>(r.now_ns);
               --releases_in_flight_;
               const std::string text = r.ok() ? describe_answer(*r.body) : r.problem;
               log_event("event=kill_confirmed name=%s sandbox=%s epoch=%" PRIu64 " result=\"%s\"", name.c_str(),
                         sb.str().c_str(), epoch, text.c_str());
               progress();
             });
}

}  // namespace leasehold
