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
    if (s.name) {
      const HeartbeatLease* l = core.heartbeat().find(id);
      j["valid_until_ms"] = ms_from(l ? l->valid_until_ns : s.valid_until_ns, now_ns);
    }
    if (!s.kill_reason.empty()) j["kill_reason"] = s.kill_reason;
    if (s.synthetic) j["synthetic"] = true;
    j["owner"] = s.owner;
    if (s.uid != static_cast<uid_t>(-1)) j["uid"] = s.uid;
    if (!s.log_path.empty()) j["log"] = s.log_path;
    if (core.config().unsafe_kill) j["unsafe_kill"] = true;
    arr.push_back(std::move(j));
  }
  return arr;
}

json core_status_json(const SupervisorCore& core, std::uint64_t now_ns) {
  std::size_t named = 0;
  for (const auto& [id, s] : core.sandboxes()) named += s.name ? 1 : 0;
  const SupervisorCore::Counters& cc = core.counters();
  const HeartbeatSchedule& hb = core.heartbeat();
  json j = {{"sandboxes", core.sandboxes().size()},
            {"named", named},
            {"may_create_named", hb.may_create_named(now_ns)},
            {"killswitch_engaged", hb.killswitch_engaged()},
            {"counters",
             {{"heartbeat_datagrams", cc.heartbeat_datagrams},
              {"heartbeat_failures", cc.heartbeat_failures},
              {"refreshed", cc.refreshed},
              {"lost", cc.lost},
              {"unknown", cc.unknown},
              {"kills_deadline", cc.kills_deadline},
              {"kills_request", cc.kills_request},
              {"worker_killswitch", cc.worker_killswitch},
              {"spawned", cc.spawned},
              {"spawn_failures", cc.spawn_failures},
              {"exited", cc.exited},
              {"acquire_refused", cc.acquire_refused},
              {"creates_refused_killswitch", cc.creates_refused_killswitch},
              {"names_released", cc.names_released},
              {"late_grants_released", cc.late_grants_released},
              {"worker_beats_acked", cc.worker_beats_acked},
              {"reused_ids_refused", cc.reused_ids_refused},
              {"tombstones_evicted", cc.tombstones_evicted},
              {"slots_quarantined", cc.slots_quarantined},
              {"slots_released_from_quarantine", cc.slots_released_from_quarantine}}}};
  if (core.config().mode == SupervisorMode::preemptible)
    j["worker_valid_until_ms"] = ms_from(hb.worker_valid_until_ns(), now_ns);
  return j;
}

}  // namespace leasehold
