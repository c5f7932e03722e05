// leasehold/sim: the simulated disk behind lockd's durability port.
//
// One batch at a time (StoreThread's group commit): a batch submitted at t becomes durable at
// t + latency, when the world calls complete(). A lockd crash before that loses the batch
// (crash()); what was durable survives into the next incarnation (durable()).
#pragma once

#include "leasehold/lease/lease_table.hpp"

#include <cstdint>
#include <optional>
#include <utility>

namespace leasehold::sim {

/// What one batch makes durable: the table's durable content after every change up to
/// `last_seq`.
struct SimBatch {
  std::uint64_t last_seq = 0;
  DurableSnapshot snapshot;
};

class SimDisk {
 public:
  /// False (nothing taken) while a batch is in flight.
  bool submit(SimBatch&& b) {
    if (in_flight_) return false;
    in_flight_ = std::move(b);
    return true;
  }
  bool busy() const noexcept { return in_flight_.has_value(); }
  /// The in-flight batch is on disk.
  void complete() {
    if (!in_flight_) return;
    durable_ = std::move(*in_flight_);
    in_flight_.reset();
  }
  /// lockd crashed: the batch not yet durable is lost. Returns whether there was one.
  bool crash() {
    const bool lost = in_flight_.has_value();
    in_flight_.reset();
    return lost;
  }
  std::uint64_t durable_seq() const noexcept { return durable_.last_seq; }
  const DurableSnapshot& durable() const noexcept { return durable_.snapshot; }

 private:
  std::optional<SimBatch> in_flight_;
  SimBatch durable_;
};

}  // namespace leasehold::sim
