#include "leasehold/supervisor/status.hpp"

#include "leasehold/supervisor/sandbox_phase.hpp"

namespace leasehold {

using json = nlohmann::json;

namespace {

std::int64_t ms_from(std::uint64_t until_ns, std::uint64_t now_ns) {
  return (static_cast<std::int64_t>(until_ns) - static_cast<std::int64_t>(now_ns)) / 1'000'000;
}

}  // namespace

json sandbox_list_json(const SupervisorCore& core, uid_t caller, std::uint64_t now_ns) {
  json arr = json::array();
  for (const auto& [id, s] : core.sandboxes()) {
    if (caller != 0 && caller != s.owner) continue;  // a caller sees its own sandboxes only (root: all)
    json j = {{"sandbox", id.str()}, {"slot", s.slot}, {"pid", s.pid}, {"state", phase_row(s.phase).list_state},
              {"epoch", s.epoch}};
    j["name"] = s.name ? json(*s.name) : json(nullptr);
    if (s.pending_name) j["committing"] = *s.pending_name;
    if (const auto place = core.queue_place(id)) {  // waiting its turn in lockd's FIFO
      j["state"] = "queued";
      j["queued_for"] = place->name;
      j["queue_position"] = place->position;
      j["queue_waiters"] = place->waiters;
    }
    if (s.name) {
      const HeartbeatLease* l = core.heartbeat().find(id);
      j["valid_until_ms"] = ms_from(l ? l->valid_until_ns : s.valid_until_ns, now_ns);
    }
    if (!s.kill_reason.empty()) j["kill_reason"] = s.kill_reason;
    if (s.stop_deadline_ns != 0 && runs_unkilled(s.phase)) {  // SIGTERM sent, killed at the deadline
      j["state"] = "stopping";
      j["stop_reason"] = s.stop_reason;
      j["grace_left_ms"] = ms_from(s.stop_deadline_ns, now_ns);
    }
    if (s.synthetic) j["synthetic"] = true;
    j["owner"] = s.owner;
    if (s.uid != static_cast<uid_t>(-1)) j["uid"] = s.uid;
    if (!s.log_path.empty()) j["log"] = s.log_path;
    if (core.config().unsafe_kill) j["unsafe_kill"] = true;
    arr.push_back(std::move(j));
  }
  return arr;
}

void core_metric_samples(const SupervisorCore& core, std::uint64_t now_ns, std::vector<metrics::Sample>& out) {
  using metrics::Kind;
  std::size_t named = 0;
  for (const auto& [id, s] : core.sandboxes()) named += s.name ? 1 : 0;
  const SupervisorCore::Counters& cc = core.counters();
  const HeartbeatSchedule& hb = core.heartbeat();
  auto gauge = [&](std::string_view name, std::uint64_t v, std::string_view help) {
    out.push_back(metrics::Sample{name, Kind::gauge, v, {}, help});
  };
  auto counter = [&](std::string_view name, std::uint64_t v, std::string_view help) {
    out.push_back(metrics::Sample{name, Kind::counter, v, {}, help});
  };
  gauge("sandboxes", core.sandboxes().size(), "sandboxes on this worker");
  gauge("named", named, "of those, holding a name");
  gauge("waits", core.waits(), "control wait requests not answered yet (their sandboxes run)");
  gauge("may_create_named", hb.may_create_named(now_ns) ? 1 : 0, "1 while a named sandbox may be created");
  gauge("killswitch_engaged", hb.killswitch_engaged() ? 1 : 0, "1 while the worker kill-switch is engaged (preemptible)");
  counter("heartbeat_datagrams", cc.heartbeat_datagrams, "heartbeat datagrams sent");
  counter("heartbeat_failures", cc.heartbeat_failures, "heartbeats that got no answer");
  counter("refreshed", cc.refreshed, "leases refreshed by lockd");
  counter("lost", cc.lost, "leases answered lost (killed)");
  counter("unknown", cc.unknown, "leases answered unknown (killed)");
  counter("kills_deadline", cc.kills_deadline, "sandboxes killed by the kill-switch (their deadline passed)");
  counter("kills_request", cc.kills_request, "sandboxes killed on request (kill, release, revoke, lost)");
  counter("worker_killswitch", cc.worker_killswitch, "worker kill-switch engagements (preemptible)");
  counter("spawned", cc.spawned, "sandboxes started");
  counter("spawn_failures", cc.spawn_failures, "sandboxes that failed to start");
  counter("exited", cc.exited, "sandboxes exited");
  counter("acquire_refused", cc.acquire_refused, "acquires refused by lockd");
  counter("creates_refused_killswitch", cc.creates_refused_killswitch, "named creates refused: kill-switch engaged");
  counter("names_released", cc.names_released, "names released to lockd");
  counter("late_grants_released", cc.late_grants_released, "grants that arrived after their call gave up, released");
  counter("worker_beats_acked", cc.worker_beats_acked, "worker heartbeats acknowledged (preemptible)");
  counter("reused_ids_refused", cc.reused_ids_refused, "expect-commits of a sandbox id that ran here recently");
  counter("tombstones_evicted", cc.tombstones_evicted, "used sandbox ids forgotten early (bound reached)");
  counter("slots_quarantined", cc.slots_quarantined, "slots kept revoked: a process outlived its sandbox");
  counter("slots_released_from_quarantine", cc.slots_released_from_quarantine, "quarantined slots freed");
  counter("stops_graceful", cc.stops_graceful, "sandboxes asked to stop (SIGTERM) that exited within the grace period");
  counter("stops_grace_expired", cc.stops_grace_expired,
          "sandboxes asked to stop (SIGTERM) still running at the grace deadline, then killed");
  counter("waits_refused", cc.waits_refused, "control wait requests refused: too many waits at once");
  counter("runs_queued", cc.runs_queued, "runs that waited in lockd's FIFO of waiters for their name");
  counter("queue_grants", cc.queue_grants, "queued runs granted their name by lockd");
  counter("queue_timeouts", cc.queue_timeouts, "queued runs that gave up at their queue_timeout_ms");
  counter("places_renewed", cc.places_renewed, "waiters' places in lockd's FIFO kept by a heartbeat entry");
  counter("places_lost", cc.places_lost, "heartbeat entries that found no place in lockd's FIFO (a Wait re-joins)");
}

json core_status_json(const SupervisorCore& core, std::uint64_t now_ns) {
  std::vector<metrics::Sample> samples;
  core_metric_samples(core, now_ns, samples);
  json counters = json::object();
  for (const metrics::Sample& m : samples)
    if (m.kind == metrics::Kind::counter) counters[std::string(m.name)] = m.value;
  std::size_t named = 0;
  for (const auto& [id, s] : core.sandboxes()) named += s.name ? 1 : 0;
  const HeartbeatSchedule& hb = core.heartbeat();
  json j = {{"sandboxes", core.sandboxes().size()},
            {"named", named},
            {"waits", core.waits()},
            {"may_create_named", hb.may_create_named(now_ns)},
            {"killswitch_engaged", hb.killswitch_engaged()},
            {"counters", std::move(counters)}};
  if (core.config().mode == SupervisorMode::preemptible)
    j["worker_valid_until_ms"] = ms_from(hb.worker_valid_until_ns(), now_ns);
  return j;
}

}  // namespace leasehold
