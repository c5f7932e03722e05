// leasehold/supervisor: the deadline wheel (see deadline_wheel.hpp for the rationale).
#include "leasehold/supervisor/deadline_wheel.hpp"

#include "leasehold/lease/assert.hpp"
#include <string>

namespace leasehold {

const char* describe(WheelError error) noexcept {
  switch (error) {
    case WheelError::none: return "ok";
    case WheelError::capacity_full: return "deadline wheel full: every timer slot is in use";
    case WheelError::stale_handle: return "stale timer handle: the timer already fired or was cancelled";
  }
  return "unknown deadline wheel error";
}

DeadlineWheel::DeadlineWheel(std::uint32_t capacity, std::uint64_t granularity_ns,
                             std::uint64_t start_ns)
    : granularity_ns_(granularity_ns), cur_tick_(0) {
  if (capacity == 0 || capacity > kDeadlineWheelCapacityMax) {
    throw std::invalid_argument("deadline wheel capacity " + std::to_string(capacity) +
                                " out of range 1.." + std::to_string(kDeadlineWheelCapacityMax));
  }
  if (granularity_ns == 0) {
    throw std::invalid_argument("deadline wheel granularity_ns must be at least 1");
  }
  cur_tick_ = start_ns / granularity_ns_;
  nodes_.resize(capacity);
  heads_.assign(kListCount, kNil);
  clear();
}

void DeadlineWheel::clear() noexcept {
  for (std::uint32_t i = 0; i < nodes_.size(); ++i) {
    Node& n = nodes_[i];
    ++n.generation;  // every handle given out before is stale now
    n.list = kNotLinked;
    n.prev = kNil;
    n.next = (i + 1 < nodes_.size()) ? i + 1 : kNil;
  }
  free_head_ = 0;
  size_ = 0;
  hint_tick_ = 0;
  for (auto& h : heads_) h = kNil;
  for (auto& level : occupied_) level.fill(0);
}

void DeadlineWheel::link(std::uint32_t list, std::uint32_t index) noexcept {
  Node& n = nodes_[index];
  n.list = list;
  n.prev = kNil;
  n.next = heads_[list];
  if (n.next != kNil) nodes_[n.next].prev = index;
  heads_[list] = index;
  if (list < kBucketCount) {
    const std::uint32_t level = list / kDeadlineWheelSlots;
    const std::uint32_t b = list % kDeadlineWheelSlots;
    occupied_[level][b / 64] |= std::uint64_t{1} << (b % 64);
  }
}

void DeadlineWheel::unlink(std::uint32_t index) noexcept {
  Node& n = nodes_[index];
  LEASEHOLD_ASSERT(n.list != kNotLinked);
  if (n.prev != kNil) {
    nodes_[n.prev].next = n.next;
  } else {
    heads_[n.list] = n.next;
  }
  if (n.next != kNil) nodes_[n.next].prev = n.prev;
  if (n.list < kBucketCount && heads_[n.list] == kNil) {
    const std::uint32_t level = n.list / kDeadlineWheelSlots;
    const std::uint32_t b = n.list % kDeadlineWheelSlots;
    occupied_[level][b / 64] &= ~(std::uint64_t{1} << (b % 64));
  }
  n.list = kNotLinked;
  n.prev = kNil;
  n.next = kNil;
}

void DeadlineWheel::file(std::uint32_t index) noexcept {
  const std::uint64_t e = nodes_[index].deadline_ns / granularity_ns_;
  if (e < cur_tick_) {
    link(kDueList, index);
    return;
  }
  if (e - cur_tick_ < kDeadlineWheelSlots) {
    link(static_cast<std::uint32_t>(e & (kDeadlineWheelSlots - 1)), index);
    if (e < hint_tick_) hint_tick_ = e;
    return;
  }
  for (std::uint32_t level = 1; level < kDeadlineWheelLevels; ++level) {
    const std::uint32_t shift = kSlotBits * level;
    const std::uint64_t blocks = (e >> shift) - (cur_tick_ >> shift);
    // blocks >= 1 here (a smaller level would have taken it otherwise); a bucket is cascaded
    // when cur_tick_ enters its block, so a block distance in 1..255 is never late.
    if (blocks < kDeadlineWheelSlots) {
      link(level * kDeadlineWheelSlots + static_cast<std::uint32_t>((e >> shift) & (kDeadlineWheelSlots - 1)),
           index);
      const std::uint64_t cascade_tick = (e >> shift) << shift;  // when this bucket cascades
      if (cascade_tick < hint_tick_) hint_tick_ = cascade_tick;
      return;
    }
  }
  // Beyond the top level's span: park in the farthest top-level bucket; it is re-filed (and
  // parked again if still too far) each time that bucket cascades.
  constexpr std::uint32_t top = kDeadlineWheelLevels - 1;
  const std::uint64_t far_block = (cur_tick_ >> (kSlotBits * top)) + (kDeadlineWheelSlots - 1);
  link(top * kDeadlineWheelSlots + static_cast<std::uint32_t>(far_block & (kDeadlineWheelSlots - 1)),
       index);
  const std::uint64_t cascade_tick = far_block << (kSlotBits * top);
  if (cascade_tick < hint_tick_) hint_tick_ = cascade_tick;
}

void DeadlineWheel::retire(std::uint32_t index) noexcept {
  Node& n = nodes_[index];
  LEASEHOLD_ASSERT(n.list == kNotLinked);
  ++n.generation;
  n.next = free_head_;
  free_head_ = index;
  --size_;
}

ScheduleResult DeadlineWheel::schedule(std::uint64_t deadline_ns, std::uint64_t payload) noexcept {
  if (free_head_ == kNil) return {TimerHandle{}, WheelError::capacity_full};
  const std::uint32_t i = free_head_;
  Node& n = nodes_[i];
  free_head_ = n.next;
  n.deadline_ns = deadline_ns;
  n.payload = payload;
  ++size_;
  file(i);
  return {TimerHandle{i, n.generation}, WheelError::none};
}

bool DeadlineWheel::live(TimerHandle handle) const noexcept {
  return handle.index < nodes_.size() && nodes_[handle.index].generation == handle.generation &&
         nodes_[handle.index].list != kNotLinked;
}

std::uint64_t DeadlineWheel::deadline_ns(TimerHandle handle) const noexcept {
  return live(handle) ? nodes_[handle.index].deadline_ns : 0;
}

WheelError DeadlineWheel::reschedule(TimerHandle handle, std::uint64_t deadline_ns) noexcept {
  if (!live(handle)) return WheelError::stale_handle;
  unlink(handle.index);
  Node& n = nodes_[handle.index];
  n.deadline_ns = deadline_ns;
  file(handle.index);
  return WheelError::none;
}

WheelError DeadlineWheel::cancel(TimerHandle handle) noexcept {
  if (!live(handle)) return WheelError::stale_handle;
  unlink(handle.index);
  retire(handle.index);
  return WheelError::none;
}

void DeadlineWheel::cascade(std::uint32_t level, std::uint64_t tick) noexcept {
  const std::uint32_t b = level * kDeadlineWheelSlots +
                          static_cast<std::uint32_t>((tick >> (kSlotBits * level)) & (kDeadlineWheelSlots - 1));
  std::uint32_t i = heads_[b];
  if (i == kNil) return;
  heads_[b] = kNil;
  const std::uint32_t local = b % kDeadlineWheelSlots;
  occupied_[level][local / 64] &= ~(std::uint64_t{1} << (local % 64));
  // Re-file each node relative to cur_tick_ (== tick). Every node lands in a lower level
  // (or is parked again), never back in bucket b, so walking the detached chain is safe.
  while (i != kNil) {
    const std::uint32_t next = nodes_[i].next;
    if (next != kNil) __builtin_prefetch(&nodes_[next], 1);  // overlap the chase with file(i)
    nodes_[i].list = kNotLinked;
    file(i);
    i = next;
  }
}

std::uint32_t DeadlineWheel::next_set(const std::array<std::uint64_t, kWords>& bits,
                                      std::uint32_t from) noexcept {
  // Distance (0..255) from bucket `from` to the next occupied bucket, wrapping; 256 if none.
  for (std::uint32_t step = 0; step <= kWords; ++step) {
    const std::uint32_t word = ((from / 64) + step) % kWords;
    std::uint64_t w = bits[word];
    if (step == 0) w &= ~std::uint64_t{0} << (from % 64);
    if (step == kWords) w &= (from % 64 == 0) ? 0 : ~(~std::uint64_t{0} << (from % 64));
    if (w != 0) {
      const std::uint32_t idx = word * 64 + static_cast<std::uint32_t>(std::countr_zero(w));
      return (idx + kDeadlineWheelSlots - from) % kDeadlineWheelSlots;
    }
  }
  return kDeadlineWheelSlots;
}

std::uint64_t DeadlineWheel::next_event_ns() const noexcept {
  if (heads_[kDueList] != kNil) return next_tick_ns();  // due at the next advance
  const std::uint64_t t = next_event_tick();
  if (t == kNoTick || t > UINT64_MAX / granularity_ns_) return UINT64_MAX;
  return t * granularity_ns_;
}

std::uint64_t DeadlineWheel::next_event_tick() const noexcept {
  if (size_ == 0) return kNoTick;
  std::uint64_t best = kNoTick;
  {
    const std::uint32_t d = next_set(occupied_[0], static_cast<std::uint32_t>(cur_tick_ & (kDeadlineWheelSlots - 1)));
    if (d < kDeadlineWheelSlots) best = cur_tick_ + d;
  }
  for (std::uint32_t level = 1; level < kDeadlineWheelLevels; ++level) {
    const std::uint32_t shift = kSlotBits * level;
    const std::uint64_t block = cur_tick_ >> shift;
    // Level L (and every higher level) only acts on block boundaries of level L: an event
    // before the next boundary cannot be beaten from here up, unless we sit on a boundary.
    const bool on_boundary = (cur_tick_ & ((std::uint64_t{1} << shift) - 1)) == 0;
    if (!on_boundary && best < ((block + 1) << shift)) break;
    const std::uint32_t d = next_set(occupied_[level], static_cast<std::uint32_t>(block & (kDeadlineWheelSlots - 1)));
    if (d == kDeadlineWheelSlots) continue;
    std::uint64_t when;
    if (d == 0) {
      // The current block's bucket is only occupied when cur_tick_ sits on its boundary and it
      // has not been cascaded yet.
      LEASEHOLD_ASSERT((cur_tick_ & ((std::uint64_t{1} << shift) - 1)) == 0);
      when = cur_tick_;
    } else {
      when = (block + d) << shift;
    }
    if (when < best) best = when;
  }
  return best;
}

}  // namespace leasehold
