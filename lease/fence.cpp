#include "leasehold/lease/fence.hpp"

#include <algorithm>
#include <functional>

namespace leasehold {

FenceGate::FenceGate(std::size_t names_max)
    : names_max_(std::clamp<std::size_t>(names_max, 1, kFenceNamesMax)) {}

FenceGate::Shard& FenceGate::shard_of(NameId name) const noexcept {
  // Ids are uniform (SHA-1 derived); the low bits of the mixed hash pick the shard.
  const std::size_t h = std::hash<NameId>{}(name);
  return shards_[(h >> 7) % kFenceShards];
}

FenceGate::Admission FenceGate::admit(NameId name, Epoch epoch) {
  if (name.is_nil() || epoch == 0) return {Verdict::invalid, 0};
  Shard& shard = shard_of(name);
  std::lock_guard lock(shard.mutex);
  auto it = shard.highest.find(name);
  if (it == shard.highest.end()) {
    // Reserve room first so concurrent adds on other shards cannot exceed names_max_.
    if (size_.fetch_add(1, std::memory_order_relaxed) >= names_max_) {
      size_.fetch_sub(1, std::memory_order_relaxed);
      return {Verdict::full, 0};
    }
    shard.highest.emplace(name, epoch);
    return {Verdict::accepted, epoch};
  }
  if (epoch < it->second) return {Verdict::stale, it->second};
  it->second = epoch;
  return {Verdict::accepted, epoch};
}

Epoch FenceGate::highest(NameId name) const {
  const Shard& shard = shard_of(name);
  std::lock_guard lock(shard.mutex);
  auto it = shard.highest.find(name);
  return it == shard.highest.end() ? 0 : it->second;
}

std::size_t FenceGate::size() const { return size_.load(std::memory_order_relaxed); }

std::string_view to_string(FenceGate::Verdict v) noexcept {
  switch (v) {
    case FenceGate::Verdict::accepted: return "accepted";
    case FenceGate::Verdict::stale: return "stale";
    case FenceGate::Verdict::full: return "full";
    case FenceGate::Verdict::invalid: return "invalid";
  }
  return "unknown_verdict";
}

}  // namespace leasehold
