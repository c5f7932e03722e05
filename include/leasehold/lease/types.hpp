// leasehold/lease: identifiers, epochs, tokens and refusal reasons.
//
// The vocabulary of DESIGN.md ("Vocabulary"). Everything here is a value type: trivially
// copyable, no I/O, no clocks. Time, where it appears, is a parameter in nanoseconds on
// CLOCK_BOOTTIME (suffix `_ns`).
#pragma once

#include "leasehold/lease/code_table.hpp"
#include "leasehold/lease/result.hpp"

#include <array>
#include <cstdint>
#include <compare>
#include <limits>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace leasehold {

/// A 128-bit identifier, printed and parsed as UUID text (8-4-4-4-12 lowercase hex).
/// `Tag` keeps names, sandboxes and workers from being mixed up at compile time.
/// The all-zero id is "none" (`is_nil()`); it never names a real name, sandbox or worker.
template <class Tag>
struct Id {
  std::uint64_t hi = 0;
  std::uint64_t lo = 0;

  constexpr bool is_nil() const noexcept { return hi == 0 && lo == 0; }
  friend constexpr auto operator<=>(const Id&, const Id&) = default;

  /// UUID text, e.g. "0f8fad5b-d9cb-469f-a165-70867728950e".
  std::string str() const;
  /// Parses UUID text (with or without dashes, any case); nullopt if malformed.
  static std::optional<Id> parse(std::string_view text) noexcept;
};

struct NameTag {};
struct SandboxTag {};
struct WorkerTag {};

/// NameId: the 128-bit id of a name (a UUIDv5 of the name text in leasehold's namespace),
/// used on the wire and in the shm table. lockd keeps the text too and refuses a second
/// name whose id collides with a held one (Refusal::name_collision).
using NameId = Id<NameTag>;
using SandboxId = Id<SandboxTag>;
using WorkerId = Id<WorkerTag>;

/// Per-name lock generation (Chubby's sequencer number; DESIGN.md "epoch"). Strictly
/// increases at every grant, transfer begin and revoke; never reused, also across restarts.
using Epoch = std::uint64_t;

/// The largest epoch, 2^63-1: bit 63 of a shm check word is the revoked flag (shm/layout.hpp
/// static_asserts its limit equal), so a larger epoch could be granted but never published. A
/// transition that would go above it is refused with Refusal::epoch_exhausted.
inline constexpr Epoch kEpochMax = (Epoch{1} << 63) - 1;
static_assert(kEpochMax == static_cast<Epoch>(std::numeric_limits<std::int64_t>::max()));

/// Limits on a name (DESIGN.md "Vocabulary").
inline constexpr std::size_t kNameBytesMax = 128;

/// Checks a name: 1..128 bytes of [A-Za-z0-9._:/-]. Ok when valid (no allocation: the hot
/// paths of lockd and the codec call it on every name), otherwise invalid_argument with a
/// message that says what is wrong and where (byte offset, the bad byte).
Status validate_name(std::string_view name);

/// validate_name, and the rule for a name that is acquired anew: it does not begin with '-'.
/// Such a name would read as an option on every command line, and "-" is what listings print
/// for "none". Names already held (a store written before this rule) stay valid for
/// validate_name, so they are still decoded, restored, refreshed and released.
Status validate_new_name(std::string_view name);

/// The NameId of a *valid* name (deterministic; the same on every host).
NameId name_id_of(std::string_view name);

/// A token: the capability a grant hands out (Chubby §2.4 sequencer; ownership model
/// "Capability tokens"). Once issued it exists forever; whether it *authorizes* anything is
/// decided by the current lock state (`token_authorized`). `holder` is the sandbox.
struct Token {
  NameId name;
  Epoch epoch = 0;
  SandboxId holder;
  friend constexpr bool operator==(const Token&, const Token&) = default;
};

/// Why a transition was refused. Every refused transition returns one; none is undefined
/// behaviour (DESIGN.md "Lock states"). Values are stable: wire::kRefusalCodes sends each as its
/// value.
enum class Refusal : std::uint8_t {
  none = 0,
  invalid_name = 1,        ///< the name text breaks validate_name
  name_collision = 2,      ///< another name with the same NameId is known
  held = 3,                ///< held by another sandbox (see holder/epoch in the answer)
  acquiring = 4,           ///< in the 2-phase Acquiring state for another sandbox
  transferring = 5,        ///< a transfer is in progress; nobody may acquire or mutate
  reserved = 6,            ///< Free but reserved for another sandbox (transfer/reassign)
  lock_delay = 7,          ///< not grantable yet: Free inside the lock-delay after an expiry or
                           ///< preemption (Chubby §2.4), or a revoke whose old holder's kill is
                           ///< neither confirmed nor past its bound; or a transfer-complete
                           ///< refused while the transfer guard waits for the outgoing holder
  unknown_name = 8,        ///< lockd has no record of the name
  not_holder = 9,          ///< the caller does not hold the name
  stale_epoch = 10,        ///< the caller's epoch is not the current one
  not_acquiring = 11,      ///< commit of a name that is not in Acquiring
  acquiring_expired = 12,  ///< commit after the Acquiring deadline
  not_transferring = 13,   ///< complete-release of a name that is not Transferring
  not_free = 14,           ///< reassign of a name that is not Free
  wrong_mode = 15,         ///< operation not available in this lock mode
  worker_alive = 16,       ///< preempt refused: the worker is live and says it runs
  table_full = 17,         ///< the name table is at capacity
  bad_request = 18,        ///< malformed arguments (nil ids, zero TTL, ...)
  epoch_exhausted = 19,    ///< the epoch would go above kEpochMax (2^63-1)
  not_held = 20,           ///< release/transfer/preempt of a name that is not Held
  expired = 21,            ///< the lease's expiry has passed; advance() reclaims it (retry)
  forbidden = 22,          ///< the caller's key gives no power over this name (another worker's)
};

namespace detail {
// The one definition of each refusal's text. No default: -Wswitch (an error in this build)
// names an enumerator without a case.
constexpr std::string_view refusal_name(Refusal r) noexcept {
  switch (r) {
    case Refusal::none: return "none";
    case Refusal::invalid_name: return "invalid_name";
    case Refusal::name_collision: return "name_collision";
    case Refusal::held: return "held";
    case Refusal::acquiring: return "acquiring";
    case Refusal::transferring: return "transferring";
    case Refusal::reserved: return "reserved";
    case Refusal::lock_delay: return "lock_delay";
    case Refusal::unknown_name: return "unknown_name";
    case Refusal::not_holder: return "not_holder";
    case Refusal::stale_epoch: return "stale_epoch";
    case Refusal::not_acquiring: return "not_acquiring";
    case Refusal::acquiring_expired: return "acquiring_expired";
    case Refusal::not_transferring: return "not_transferring";
    case Refusal::not_free: return "not_free";
    case Refusal::wrong_mode: return "wrong_mode";
    case Refusal::worker_alive: return "worker_alive";
    case Refusal::table_full: return "table_full";
    case Refusal::bad_request: return "bad_request";
    case Refusal::epoch_exhausted: return "epoch_exhausted";
    case Refusal::not_held: return "not_held";
    case Refusal::expired: return "expired";
    case Refusal::forbidden: return "forbidden";
  }
  return {};
}
}  // namespace detail

/// Every Refusal, for the encoding tables' completeness checks (wire::kRefusalCodes).
inline constexpr std::array<Refusal, 23> kRefusals{
    Refusal::none,         Refusal::invalid_name,      Refusal::name_collision,   Refusal::held,
    Refusal::acquiring,    Refusal::transferring,      Refusal::reserved,         Refusal::lock_delay,
    Refusal::unknown_name, Refusal::not_holder,        Refusal::stale_epoch,      Refusal::not_acquiring,
    Refusal::acquiring_expired, Refusal::not_transferring, Refusal::not_free,     Refusal::wrong_mode,
    Refusal::worker_alive, Refusal::table_full,        Refusal::bad_request,      Refusal::epoch_exhausted,
    Refusal::not_held,     Refusal::expired,           Refusal::forbidden};

// Every value that names a refusal (a case of refusal_name) is in kRefusals, so a new
// enumerator reaches every table that `covers(kRefusals)` or fails the build.
static_assert(lists_every(kRefusals, [](Refusal r) { return !detail::refusal_name(r).empty(); }),
              "a Refusal is missing from kRefusals");

/// Stable snake_case text of a refusal ("held", "lock_delay", ...); "unknown_refusal" for a
/// value outside the enum.
constexpr std::string_view to_string(Refusal r) noexcept {
  const std::string_view name = detail::refusal_name(r);
  return name.empty() ? std::string_view("unknown_refusal") : name;
}
/// The refusal whose text (to_string) is `text`; nullopt for text no refusal has
/// ("unknown_refusal" included).
constexpr std::optional<Refusal> refusal_of(std::string_view text) noexcept {
  return enum_of_text(kRefusals, detail::refusal_name, text);
}

/// The four lock states of DESIGN.md "Lock states" (the one definition: the wire and the
/// durable store encode it through their own tables, wire::kLockPhaseCodes and the store's).
enum class LockPhase : std::uint8_t { free = 0, acquiring = 1, held = 2, transferring = 3 };
/// Every LockPhase, for the encoding tables' completeness checks.
inline constexpr std::array<LockPhase, 4> kLockPhases{LockPhase::free, LockPhase::acquiring,
                                                      LockPhase::held, LockPhase::transferring};

/// Stable text of a phase ("free", "acquiring", "held", "transferring").
std::string_view to_string(LockPhase p) noexcept;

/// One entry of a heartbeat batch: "sandbox holds name at epoch; keep it".
struct RefreshEntry {
  NameId name;
  SandboxId sandbox;
  Epoch epoch = 0;
};

/// Per-entry refresh answer (DESIGN.md "lockd": refreshed / lost{holder, epoch} / unknown).
/// Anything but `refreshed` kills the sandbox (DESIGN.md "mutex violation recovery").
enum class RefreshStatus : std::uint8_t {
  refreshed = 0,  ///< held by this sandbox at this epoch on this worker; expiry moved
  lost = 1,       ///< the table knows the name but not as this grant (see holder, epoch)
  unknown = 2,    ///< the table has no record of the name
  /// lockd only, never the table: the entry (epoch 0) renews a waiter's place in the name's
  /// FIFO and the place was kept (docs/PROTOCOL.md "Waiters").
  queued = 3,
};
/// Every RefreshStatus, for the encoding tables' completeness checks.
inline constexpr std::array<RefreshStatus, 4> kRefreshStatuses{
    RefreshStatus::refreshed, RefreshStatus::lost, RefreshStatus::unknown, RefreshStatus::queued};

/// Stable text ("refreshed", "lost", "unknown").
std::string_view to_string(RefreshStatus s) noexcept;

}  // namespace leasehold

template <class Tag>
struct std::hash<leasehold::Id<Tag>> {
  std::size_t operator()(const leasehold::Id<Tag>& id) const noexcept {
    // The ids are uniformly random (UUIDv4) or SHA-1 derived (UUIDv5): mixing the halves suffices.
    return static_cast<std::size_t>(id.hi ^ (id.lo * 0x9E3779B97F4A7C15ULL));
  }
};
