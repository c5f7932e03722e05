// leasehold/supervisor: the sandboxes of one supervisor and the two indexes over them.
//
// A sandbox is found by its id, by its shm slot (the rt thread reports kills by slot) and by the
// name it is acquiring or holds. SandboxTable keeps the three in agreement: every sandbox sits
// in exactly its own slot, a slot names only a sandbox that is here and sits in it, and a name
// is bound only to a sandbox that is here. Each change checks its own part with
// LEASEHOLD_ASSERT (a supervisor that lost track of which sandbox holds a slot or a name could
// kill, publish or release for the wrong one); check() verifies the whole table (debug builds
// call it after every change). Single-threaded: the io thread.
#pragma once

#include "leasehold/lease/types.hpp"
#include "leasehold/supervisor/control_error.hpp"
#include "leasehold/supervisor/ports.hpp"
#include "leasehold/supervisor/sandbox_phase.hpp"
#include "leasehold/wire/protocol.hpp"

#include <nlohmann/json.hpp>

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace leasehold {

/// One sandbox as the supervisor's logic sees it (its process, leaf, pipes and token channel
/// are the SandboxHost's).
struct Sandbox {
  SandboxId id;
  std::uint32_t slot = 0;
  std::optional<std::string> name;  ///< set once the name is ours (published)
  NameId name_id;                   ///< with epoch: set at the grant (preemptible: the acquiring one)
  Epoch epoch = 0;
  wire::GrantTokenBytes token;      ///< lockd's signed token of that grant, published with it
  /// Preemptible mode: the name its Commit is for, from the Acquiring grant until the Commit's
  /// answer (phase committing, or killed/exited meanwhile); its epoch is not yet published.
  std::optional<std::string> pending_name;
  SandboxPhase phase = SandboxPhase::reserved;  ///< sandbox_phase.hpp: the table of phases
  pid_t pid = -1;
  std::string cgroup_path;       ///< its cgroup leaf ("" without one)
  bool armed = false;            ///< an arm command was queued for the slot
  bool rt_killed = false;        ///< the rt thread killed it (either cause)
  bool synthetic = false;
  bool revoked = false;          ///< its grant was revoked or lost: on exit, confirm the kill to lockd
  bool outlives_us = false;      ///< started unnamed under --on-shutdown keep (no PDEATHSIG): never named
  std::uint64_t disarm_seq = 0;  ///< exited: reaped once the rt thread applied this
  /// Why it was killed ("" = it exited on its own): set by the first kill request or by the rt
  /// thread's kill record, whichever came first.
  std::string kill_reason;
  /// Asked to stop with a grace period (release, kill or shutdown with --stop-grace-ms): SIGTERM
  /// was sent and, unless it exits first, it is killed at stop_deadline_ns (0: not stopping).
  /// Until then it is running as before: its slot valid, its lease heartbeated, its kill-switch
  /// armed.
  std::uint64_t stop_deadline_ns = 0;
  std::string stop_reason;  ///< why it is being stopped ("released", "shutdown", ...)
  std::uint64_t valid_until_ns = 0;
  std::uint64_t started_ns = 0;
  int exit_code = -1;  ///< exit status, or -signal
  std::vector<std::pair<ControlClientId, nlohmann::json>> waiters;  ///< answered when it is gone
  std::optional<ControlError> waiter_error;  ///< e.g. exec_failed: answer waiters with it
  std::string waiter_message;
  uid_t owner = static_cast<uid_t>(-1);  ///< the caller that started it (SO_PEERCRED)
  uid_t uid = static_cast<uid_t>(-1);    ///< the host uid it runs as
  std::string log_path;                  ///< its stdout and stderr ("" before it started)
};

class SandboxTable {
 public:
  using Map = std::unordered_map<SandboxId, Sandbox>;
  /// Slots 0..slots-1 (the shm table's).
  explicit SandboxTable(std::uint32_t slots = 0);

  /// Adds a sandbox in its slot. Asserts: the slot exists and is empty, the id is new (not nil).
  Sandbox& add(Sandbox s);
  /// Forgets a sandbox: its slot is empty and its names are unbound afterwards. No-op if absent.
  void erase(const SandboxId& id);

  Sandbox* find(const SandboxId& id);
  const Sandbox* find(const SandboxId& id) const;
  /// The sandbox in `slot` (nullptr: empty or out of range).
  Sandbox* at_slot(std::uint32_t slot);

  /// Binds `name` (being acquired or held) to sandbox `id`. Asserts: `id` is here and `name`
  /// is bound to no other sandbox.
  void bind_name(const std::string& name, const SandboxId& id);
  /// Unbinds `name` if it is bound to `id`.
  void unbind_name(const std::string& name, const SandboxId& id);
  /// Unbinds every name of `id` except `keep` (the name it already holds, if any).
  void unbind_names_except(const SandboxId& id, const std::optional<std::string>& keep);
  /// The sandbox `name` is bound to (nullptr: none).
  const SandboxId* holder_of(const std::string& name) const;
  /// name → sandbox, for the names being acquired or held here.
  const std::unordered_map<std::string, SandboxId>& names() const noexcept { return by_name_; }

  Map::iterator begin() noexcept { return sandboxes_.begin(); }
  Map::iterator end() noexcept { return sandboxes_.end(); }
  Map::const_iterator begin() const noexcept { return sandboxes_.begin(); }
  Map::const_iterator end() const noexcept { return sandboxes_.end(); }
  std::size_t size() const noexcept { return sandboxes_.size(); }
  bool empty() const noexcept { return sandboxes_.empty(); }
  void clear();

  /// Verifies that the three indexes agree (aborts through LEASEHOLD_ASSERT if not). O(n).
  void check() const;
  /// Cross-checks one slot with the shm table's owner of it, `shm_owner` (SlotTable::owner),
  /// in O(1), aborting through LEASEHOLD_ASSERT unless: the slot exists; it holds `shm_owner`
  /// here too (both nil: empty in both), and that sandbox's record names this slot. With
  /// `left` (a sandbox erased here whose slot shm keeps claimed: quarantined, or kept at
  /// shutdown), the slot is empty here and `shm_owner` is `left`.
  void check_slot(std::uint32_t slot, const SandboxId& shm_owner, const SandboxId& left = {}) const;

 private:
  void checked() const;  // check() in debug builds (LEASEHOLD_ASSERT_SLOW)
  Map sandboxes_;
  std::vector<SandboxId> by_slot_;
  std::unordered_map<std::string, SandboxId> by_name_;
};

}  // namespace leasehold
