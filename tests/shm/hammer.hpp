// The publish/revoke hammer shared by the threads and the fork tests.
//
// Epochs encode their owner: claim number c publishes epochs 4c+1 and 4c+2 for sandbox
// sandbox_of(c), with valid_until = kBaseNs + 1000·epoch + k (k in 1..999). So a reader can
// tell, from one snapshot, whether an epoch is paired with the wrong sandbox, and whether
// check_deadline paired an epoch with another epoch's deadline (see deadline_probe_ns).
#pragma once

#include "leasehold/shm/table.hpp"

#include <atomic>
#include <cstdint>
#include <random>

namespace leasehold::shm::test {

inline constexpr std::uint64_t kBaseNs = 1ULL << 40;

inline SandboxId sandbox_of_claim(std::uint64_t c) {
  return SandboxId{c + 1, (c + 1) * 0x9E3779B97F4A7C15ULL};
}
inline std::uint64_t claim_of_epoch(Epoch e) { return (e - 1) / 4; }
inline std::uint64_t deadline_for(Epoch e, std::uint64_t k) { return kBaseNs + 1000 * e + 1 + k % 999; }
/// At this time a correctly paired deadline has passed, while the deadline of any later epoch
/// has not: check_deadline_at must say false.
inline std::uint64_t deadline_probe_ns(Epoch e) { return kBaseNs + 1000 * e + 999; }
/// At this time a correctly paired deadline has not passed (positive control).
inline std::uint64_t deadline_ok_ns(Epoch e) { return kBaseNs + 1000 * e; }

struct Violations {
  std::atomic<std::uint64_t> wrong_sandbox{0};
  std::atomic<std::uint64_t> revoked_but_valid{0};
  std::atomic<std::uint64_t> deadline_mismatch{0};
  std::atomic<std::uint64_t> valid_checks{0};     // positive control
  std::atomic<std::uint64_t> revoked_seen{0};     // positive control
  std::uint64_t total() const {
    return wrong_sandbox.load() + revoked_but_valid.load() + deadline_mismatch.load();
  }
};

/// One reader step on slot i.
inline void reader_step(const TableReader& r, std::uint32_t i, Violations& v) {
  SlotSnapshot s;
  if (r.snapshot(i, s) != TableErrc::ok) return;  // busy: never torn
  if (s.epoch != 0) {
    if (s.sandbox != sandbox_of_claim(claim_of_epoch(s.epoch))) v.wrong_sandbox.fetch_add(1);
    if (s.revoked) {
      v.revoked_seen.fetch_add(1);
      // Sticky: once seen revoked, the epoch never checks valid again.
      if (r.check(i, s.epoch)) v.revoked_but_valid.fetch_add(1);
      if (r.check_deadline_at(i, s.epoch, deadline_ok_ns(s.epoch))) v.revoked_but_valid.fetch_add(1);
    } else {
      if (r.check_deadline_at(i, s.epoch, deadline_probe_ns(s.epoch))) v.deadline_mismatch.fetch_add(1);
      if (r.check_deadline_at(i, s.epoch, deadline_ok_ns(s.epoch))) v.valid_checks.fetch_add(1);
    }
  }
}

/// The io thread's work on one slot lifecycle: claim, publish, extends, publish a second
/// epoch, extends, free. Returns false when no slot could be claimed.
inline bool writer_cycle(TableWriter& w, std::uint64_t c, std::uint64_t now_ns, int extends) {
  const Result<ClaimedSlot> cl = w.claim(sandbox_of_claim(c), now_ns);
  if (!cl.ok()) return false;
  for (Epoch e = 4 * c + 1; e <= 4 * c + 2; ++e) {
    if (w.publish(cl->slot, NameId{e, e}, "hammer", e, deadline_for(e, 0)) != TableErrc::ok) break;
    for (int k = 1; k <= extends; ++k)
      if (w.extend(cl->slot, deadline_for(e, static_cast<std::uint64_t>(k))) != TableErrc::ok) break;
  }
  w.free(cl->slot, now_ns);
  return true;
}

}  // namespace leasehold::shm::test
