// leasehold/supervisor: ShmSlotTable, the production SlotTable (ports.hpp): the sandbox logic's
// writes to the shm table go straight to shm::TableWriter's io-thread calls. The simulator
// (sim/) uses it too, over a memfd table its sandboxes' checks read with shm::TableReader.
#pragma once

#include "leasehold/shm/table.hpp"
#include "leasehold/supervisor/ports.hpp"

#include <cstdint>
#include <string>

namespace leasehold {

class ShmSlotTable final : public SlotTable {
 public:
  /// `t` outlives this object.
  explicit ShmSlotTable(shm::TableWriter& t) : t_(t) {}
  Result<shm::ClaimedSlot> claim(const SandboxId& sandbox, std::uint64_t now_ns) override {
    return t_.claim(sandbox, now_ns);
  }
  shm::TableErrc publish(std::uint32_t slot, const NameId& name, const std::string& name_text, Epoch epoch,
                         std::uint64_t valid_until_ns) override {
    return t_.publish(slot, name, name_text, epoch, valid_until_ns);
  }
  shm::TableErrc extend(std::uint32_t slot, std::uint64_t valid_until_ns) override {
    return t_.extend(slot, valid_until_ns);
  }
  void revoke(std::uint32_t slot) override { t_.revoke(slot); }
  void free(std::uint32_t slot, std::uint64_t now_ns) override { t_.free(slot, now_ns); }
  SandboxId owner(std::uint32_t slot) const override { return t_.owner(slot); }
  void record_heartbeat_rtt_ns(std::uint64_t ns) override { t_.record_heartbeat_rtt_ns(ns); }
  void record_heartbeat_failure() override { t_.record_heartbeat_failure(); }

 private:
  shm::TableWriter& t_;
};

}  // namespace leasehold
