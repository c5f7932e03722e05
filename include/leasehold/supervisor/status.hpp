// leasehold/supervisor: the status part — what `leasehold list` and `leasehold status` show of
// the sandbox logic (DESIGN.md "The supervisor"). Pure functions of a SupervisorCore and the
// time (`now_ns`, CLOCK_BOOTTIME); the daemon (Supervisor::Impl::status_json) adds what only it
// knows (addresses, the rt thread, keys, the control socket).
#pragma once

#include "leasehold/metrics/exposition.hpp"
#include "leasehold/supervisor/supervisor_core.hpp"

#include <nlohmann/json.hpp>

#include <sys/types.h>

#include <cstdint>
#include <vector>

namespace leasehold {

/// One object per sandbox ("sandbox", "slot", "pid", "state", "epoch", "name" (null when
/// unnamed), "committing", "valid_until_ms" (named), "kill_reason", "synthetic", "owner", "uid",
/// "log", "unsafe_kill"). A caller other than root (uid 0) sees only the sandboxes it owns.
nlohmann::json sandbox_list_json(const SupervisorCore& core, uid_t caller, std::uint64_t now_ns);

/// The core's values for /metrics and `status` (every SupervisorCore counter, the sandbox
/// counts, the kill-switch), appended to `out`: the one list both are made from.
void core_metric_samples(const SupervisorCore& core, std::uint64_t now_ns, std::vector<metrics::Sample>& out);

/// The core's part of `status`: "sandboxes", "named", "may_create_named", "killswitch_engaged",
/// "worker_valid_until_ms" (preemptible mode), and "counters" with every SupervisorCore counter.
nlohmann::json core_status_json(const SupervisorCore& core, std::uint64_t now_ns);

}  // namespace leasehold
