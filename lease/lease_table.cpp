// Interim: the API compiles and validates its configuration; transitions are not implemented
// yet and refuse with bad_request.
#include "lease/lease_table.hpp"

#include <stdexcept>

namespace leasehold {

std::string validate_config(const LeaseConfig& c) {
  auto in_range = [](std::int64_t v) { return v > 0 && v <= kLeaseTtlNsMax; };
  if (!in_range(c.default_ttl_ns)) return "default_ttl_ns " + std::to_string(c.default_ttl_ns) + " is out of (0, 86400e9]";
  if (!in_range(c.max_ttl_ns)) return "max_ttl_ns " + std::to_string(c.max_ttl_ns) + " is out of (0, 86400e9]";
  if (c.default_ttl_ns > c.max_ttl_ns) return "default_ttl_ns exceeds max_ttl_ns";
  if (!in_range(c.acquiring_ttl_ns)) return "acquiring_ttl_ns is out of range";
  if (c.lock_delay_ns < 0 || c.lock_delay_ns > kLeaseTtlNsMax) return "lock_delay_ns is out of range";
  if (!in_range(c.worker_liveness_ttl_ns)) return "worker_liveness_ttl_ns is out of range";
  if (c.capacity == 0 || c.capacity > kLeaseCapacityMax) return "capacity is out of range";
  return {};
}

std::string_view to_string(LockPhase p) noexcept {
  switch (p) {
    case LockPhase::free: return "free";
    case LockPhase::acquiring: return "acquiring";
    case LockPhase::held: return "held";
    case LockPhase::transferring: return "transferring";
  }
  return "unknown_phase";
}

std::string_view to_string(RefreshStatus s) noexcept {
  switch (s) {
    case RefreshStatus::refreshed: return "refreshed";
    case RefreshStatus::lost: return "lost";
    case RefreshStatus::unknown: return "unknown";
  }
  return "unknown_status";
}

std::uint32_t name_fingerprint_of(std::string_view name) noexcept {
  std::uint32_t h = 2166136261u;
  for (unsigned char c : name) h = (h ^ c) * 16777619u;
  return h | 1u;
}

struct LeaseTable::Impl {
  LeaseConfig config;
};

LeaseTable::LeaseTable(const LeaseConfig& config) {
  if (auto err = validate_config(config); !err.empty()) throw std::invalid_argument(err);
  impl_ = std::make_unique<Impl>();
  impl_->config = config;
}
LeaseTable::~LeaseTable() = default;
LeaseTable::LeaseTable(LeaseTable&&) noexcept = default;
LeaseTable& LeaseTable::operator=(LeaseTable&&) noexcept = default;
const LeaseConfig& LeaseTable::config() const noexcept { return impl_->config; }

namespace {
Outcome refused(NameId name = {}) { return Outcome{Refusal::bad_request, name, {}, {}}; }
}  // namespace

Outcome LeaseTable::acquire(std::string_view, SandboxId, WorkerId, std::int64_t, std::int64_t) { return refused(); }
Outcome LeaseTable::acquire_2pc(std::string_view, SandboxId, std::int64_t) { return refused(); }
Outcome LeaseTable::commit(NameId n, SandboxId, Epoch, WorkerId, std::int64_t, std::int64_t) { return refused(n); }
Refusal LeaseTable::refresh(WorkerId, std::span<const RefreshEntry>, std::int64_t, std::span<RefreshAnswer>, std::int64_t) { return Refusal::bad_request; }
Refusal LeaseTable::worker_heartbeat(WorkerId, std::int64_t) { return Refusal::bad_request; }
bool LeaseTable::worker_alive(WorkerId, std::int64_t) const noexcept { return false; }
Outcome LeaseTable::release(NameId n, SandboxId, Epoch, std::int64_t) { return refused(n); }
std::size_t LeaseTable::advance(std::int64_t, std::vector<Expiry>&, std::size_t) { return 0; }
Outcome LeaseTable::begin_transfer(NameId n, SandboxId, Epoch, SandboxId, std::int64_t) { return refused(n); }
Outcome LeaseTable::complete_release(NameId n, SandboxId, Epoch) { return refused(n); }
Outcome LeaseTable::revoke(NameId n, std::int64_t) { return refused(n); }
Outcome LeaseTable::reassign(std::string_view, SandboxId, std::int64_t) { return refused(); }
Outcome LeaseTable::preempt(NameId n, SandboxId, Epoch, bool, std::int64_t) { return refused(n); }
LockState LeaseTable::state(NameId) const noexcept { return {}; }
bool LeaseTable::may_mutate(NameId, SandboxId, Epoch, std::int64_t) const noexcept { return false; }
bool LeaseTable::token_authorized(const Token&, std::int64_t) const noexcept { return false; }
bool LeaseTable::valid_fence(NameId, Epoch) const noexcept { return false; }
std::size_t LeaseTable::size() const noexcept { return 0; }
std::size_t LeaseTable::held() const noexcept { return 0; }
Epoch LeaseTable::epoch_high_water() const noexcept { return 0; }
std::size_t LeaseTable::memory_bytes() const noexcept { return sizeof(Impl); }
void LeaseTable::for_each(const std::function<void(NameId, const LockState&)>&) const {}
DurableSnapshot LeaseTable::export_durable() const { return {}; }
std::string LeaseTable::restore(const DurableSnapshot&, std::int64_t) { return "not implemented"; }

}  // namespace leasehold
