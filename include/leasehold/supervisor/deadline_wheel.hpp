// leasehold/supervisor: the deadline wheel — a hierarchical timing wheel of kill deadlines.
//
// Rationale. The rt thread holds one kill deadline per armed sandbox (up to kDeadlineWheelCapacityMax)
// and almost none of them ever fire: every heartbeat pushes a deadline forward. The structure is
// therefore optimised for O(1) schedule, cancel and re-schedule, with firing cost paid only by timers
// that actually come due. A binary heap costs O(log n) per schedule and cannot cancel without a
// lookup; a balanced tree costs O(log n) and an allocation per node. A hierarchical timing wheel
// (Varghese & Lauck, "Hashed and hierarchical timing wheels", SOSP 1987, scheme 7) gives O(1) for all
// three, with a bounded amortised cascade cost per timer (at most one move per level).
//
// Layout: kDeadlineWheelLevels levels of kDeadlineWheelSlots buckets each; level L covers ticks in
// blocks of 256^L. Timers live in a fixed array of nodes allocated once at construction and linked
// into buckets by 32-bit indices (intrusive doubly-linked lists), so the rt thread never allocates.
// A 256-bit occupancy bitmap per level lets `advance` jump over empty buckets, so a long sleep or a
// far-future timer costs O(levels), not O(ticks).
//
// Time. Deadlines are CLOCK_BOOTTIME nanoseconds (DESIGN.md "Time"). A deadline is rounded DOWN to
// the granularity: a timer with deadline D fires at the first `advance(now_ns)` with
// floor(now_ns / g) >= floor(D / g). Called at tick boundaries, that is never after D and never
// earlier than D - g + 1 ("Timing wheels round down for kill deadlines: fire early, never late").
// `granularity_ns()` is the `wheel_granularity` term of the start-up safety condition.
// Deadlines beyond the top level's span are parked in the top level's farthest bucket and re-filed
// each time it cascades, so no deadline is ever truncated.
//
// Lazy re-arm (issue 6, "when a bucket fires it re-reads the slot's current deadline"): the callback
// given to `advance` returns `Rearm::at(new_deadline_ns)` to keep the same handle alive at a later
// deadline, or `Rearm::none()` to retire the timer. Heartbeats then never touch the wheel.
//
// Threading: none. One owner (the rt thread) calls every method.
#pragma once

#include "leasehold/lease/assert.hpp"

#include <array>
#include <bit>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace leasehold {

/// Buckets per level (8 bits of tick per level).
inline constexpr std::uint32_t kDeadlineWheelSlots = 256;
/// Levels: 4 × 8 bits = 2^32 ticks before a deadline is parked (≈ 49.7 days at 1 ms).
inline constexpr std::uint32_t kDeadlineWheelLevels = 4;
/// Upper bound on the capacity a wheel may be built with (indices are 32-bit, one value is nil).
inline constexpr std::uint32_t kDeadlineWheelCapacityMax = 1u << 24;

/// A timer's identity: node index + generation. A stale handle (its timer fired or was cancelled
/// and the node reused) is detected by the generation and refused, never acted on.
struct TimerHandle {
  std::uint32_t index = 0xffffffffu;
  std::uint32_t generation = 0;
  constexpr bool is_nil() const noexcept { return index == 0xffffffffu; }
  friend constexpr bool operator==(const TimerHandle&, const TimerHandle&) = default;
};

enum class WheelError : std::uint8_t {
  none = 0,
  capacity_full,  ///< every node is in use; cancel or fire timers first
  stale_handle,   ///< the handle's timer already fired or was cancelled
};

/// A short message naming the error, e.g. "deadline wheel full".
const char* describe(WheelError error) noexcept;

/// The result of `schedule`: a handle, or an error (never both).
struct ScheduleResult {
  TimerHandle handle;
  WheelError error = WheelError::none;
  explicit operator bool() const noexcept { return error == WheelError::none; }
};

/// What an `advance` callback returns: retire the timer, or keep its handle at a later deadline.
struct Rearm {
  std::uint64_t deadline_ns = 0;
  bool rearm = false;
  static constexpr Rearm none() noexcept { return {}; }
  static constexpr Rearm at(std::uint64_t deadline_ns) noexcept { return {deadline_ns, true}; }
};

/// One timer handed to the `advance` callback.
struct DueTimer {
  TimerHandle handle;
  std::uint64_t payload = 0;       ///< the caller's value (the rt thread: the shm slot index)
  std::uint64_t deadline_ns = 0;   ///< as scheduled, unrounded
  std::uint64_t tick_ns = 0;       ///< the tick being processed (tick × granularity), <= deadline_ns
};

class DeadlineWheel {
 public:
  /// Builds a wheel of `capacity` timers (1..kDeadlineWheelCapacityMax), `granularity_ns` >= 1,
  /// whose clock starts at `start_ns` (CLOCK_BOOTTIME). Allocates everything here.
  /// Throws std::invalid_argument naming the bad parameter.
  DeadlineWheel(std::uint32_t capacity, std::uint64_t granularity_ns, std::uint64_t start_ns);

  DeadlineWheel(const DeadlineWheel&) = delete;
  DeadlineWheel& operator=(const DeadlineWheel&) = delete;

  std::uint64_t granularity_ns() const noexcept { return granularity_ns_; }
  std::uint32_t capacity() const noexcept { return static_cast<std::uint32_t>(nodes_.size()); }
  std::uint32_t size() const noexcept { return size_; }
  /// Start of the next tick not yet processed, in ns (advance(now) with now below it fires nothing).
  std::uint64_t next_tick_ns() const noexcept { return cur_tick_ * granularity_ns_; }

  /// Start (ns) of the earliest tick, >= next_tick_ns(), at which advance() can next fire or
  /// cascade a timer; UINT64_MAX when the wheel is empty. A lower bound on the next deadline (a
  /// higher level's timers count from the tick that cascades them), so a caller may sleep until
  /// it without missing a deadline. O(levels) bitmap reads.
  std::uint64_t next_event_ns() const noexcept;

  /// True when a deadline counts as due at `now_ns` under this wheel's round-down rule:
  /// floor(deadline / g) <= floor(now / g). Lazy re-arm callbacks use it to decide kill vs re-arm.
  bool due_by(std::uint64_t deadline_ns, std::uint64_t now_ns) const noexcept {
    return deadline_ns / granularity_ns_ <= now_ns / granularity_ns_;
  }

  /// Schedules `payload` at `deadline_ns`. O(1). A deadline whose tick was already processed is due
  /// and fires at the next `advance`. Errors: capacity_full.
  ScheduleResult schedule(std::uint64_t deadline_ns, std::uint64_t payload) noexcept;

  /// Moves a live timer to `deadline_ns`, keeping its handle. O(1). Errors: stale_handle.
  WheelError reschedule(TimerHandle handle, std::uint64_t deadline_ns) noexcept;

  /// Cancels a live timer. O(1). Errors: stale_handle (already fired or cancelled).
  WheelError cancel(TimerHandle handle) noexcept;

  /// True if `handle` names a live (scheduled, not yet fired) timer.
  bool live(TimerHandle handle) const noexcept;

  /// The live timer's deadline (unrounded), or 0 for a stale handle.
  std::uint64_t deadline_ns(TimerHandle handle) const noexcept;

  /// Removes every timer (O(capacity); not for the rt path). Handles given out before become stale.
  void clear() noexcept;

  /// Processes every tick up to floor(now_ns / g) inclusive and calls
  /// `on_due(const DueTimer&) -> Rearm` once for each timer that came due, in tick order
  /// (timers in the same tick: unspecified order). Returns the number of callbacks made.
  /// The callback may call schedule/cancel/reschedule; a timer it makes due (deadline in a processed
  /// tick) fires at the next `advance`, which bounds the work of one call. `Rearm::at(d)` with d in
  /// a processed tick is likewise due at the next `advance` (callers use `due_by` to avoid that).
  /// `now_ns` must not be below the previous call's (CLOCK_BOOTTIME never goes backwards): a
  /// clock that did would silently fire nothing while a kill is due, so it aborts
  /// (LEASEHOLD_ASSERT, as Seastar's timer_set::expire), in every build. The callback must not
  /// call advance: the inner call would take over the list being fired, whose remaining timers
  /// would then never fire, so that aborts too.
  template <class OnDue>
  std::uint32_t advance(std::uint64_t now_ns, OnDue&& on_due);

 private:
  static constexpr std::uint32_t kNil = 0xffffffffu;
  static constexpr std::uint32_t kSlotBits = 8;
  static constexpr std::uint32_t kBucketCount = kDeadlineWheelLevels * kDeadlineWheelSlots;
  static constexpr std::uint32_t kDueList = kBucketCount;       // deadlines in processed ticks
  static constexpr std::uint32_t kFiringList = kBucketCount + 1; // the bucket being fired
  static constexpr std::uint32_t kListCount = kBucketCount + 2;
  static constexpr std::uint32_t kNotLinked = 0xffffu;
  static constexpr std::uint32_t kWords = kDeadlineWheelSlots / 64;

  // 32 bytes, aligned: one node never straddles a cache line (at 1M timers the wheel is
  // memory-bound; the tick is recomputed from deadline_ns rather than stored).
  struct alignas(32) Node {
    std::uint64_t deadline_ns = 0;
    std::uint64_t payload = 0;
    std::uint32_t prev = kNil;
    std::uint32_t next = kNil;
    std::uint32_t generation = 0;
    std::uint32_t list = kNotLinked;
  };

  void link(std::uint32_t list, std::uint32_t index) noexcept;
  void unlink(std::uint32_t index) noexcept;
  void file(std::uint32_t index) noexcept;  // links a node into the right list for cur_tick_
  void retire(std::uint32_t index) noexcept;
  void cascade(std::uint32_t level, std::uint64_t tick) noexcept;
  // The next tick (>= cur_tick_) at which a bucket fires or cascades; kNoTick if the wheel is empty.
  std::uint64_t next_event_tick() const noexcept;
  static std::uint32_t next_set(const std::array<std::uint64_t, kWords>& bits,
                                std::uint32_t from) noexcept;

  static constexpr std::uint64_t kNoTick = ~std::uint64_t{0};

  std::uint64_t granularity_ns_;
  std::uint64_t last_now_ns_ = 0;  // the latest advance()'s now_ns
  std::uint64_t cur_tick_;  // ticks below it are processed
  std::uint64_t hint_tick_ = 0;  // <= the next tick at which a bucket fires or cascades
  std::uint32_t size_ = 0;
  bool advancing_ = false;  // inside advance() (a nested call aborts)
  std::uint32_t free_head_ = kNil;
  std::vector<Node> nodes_;
  std::vector<std::uint32_t> heads_;  // kListCount list heads
  std::array<std::array<std::uint64_t, kWords>, kDeadlineWheelLevels> occupied_{};
};

// ---- inline hot path -------------------------------------------------------------------------

template <class OnDue>
std::uint32_t DeadlineWheel::advance(std::uint64_t now_ns, OnDue&& on_due) {
  LEASEHOLD_ASSERT(now_ns >= last_now_ns_);
  LEASEHOLD_ASSERT(!advancing_);
  struct Advancing {
    bool& flag;
    explicit Advancing(bool& f) noexcept : flag(f) { flag = true; }
    ~Advancing() { flag = false; }
  } advancing(advancing_);
  last_now_ns_ = now_ns;
  const std::uint64_t target = now_ns / granularity_ns_;
  if (target + 1 < cur_tick_) return 0;  // a tick already processed: nothing new is due
  std::uint32_t fired = 0;

  auto fire_list = [&](std::uint64_t tick) {
    while (heads_[kFiringList] != kNil) {
      const std::uint32_t i = heads_[kFiringList];
      unlink(i);
      Node& n = nodes_[i];
      // A timer fires in its deadline's tick or later, never before (the kill is never early
      // by more than the round-down, and the due list only holds processed ticks).
      LEASEHOLD_ASSERT(n.deadline_ns / granularity_ns_ <= tick);
      const DueTimer due{TimerHandle{i, n.generation}, n.payload, n.deadline_ns,
                         tick * granularity_ns_};
      ++fired;
      const Rearm r = on_due(due);
      // The callback may have cancelled or rescheduled this very timer: only act if it is
      // still ours and still unlinked.
      if (nodes_[i].generation != due.handle.generation || nodes_[i].list != kNotLinked) continue;
      if (r.rearm) {
        nodes_[i].deadline_ns = r.deadline_ns;
        file(i);
      } else {
        retire(i);
      }
    }
  };

  // Timers that were already due when scheduled fire first, stamped with the last processed tick.
  if (heads_[kDueList] != kNil) {
    heads_[kFiringList] = heads_[kDueList];
    heads_[kDueList] = kNil;
    for (std::uint32_t i = heads_[kFiringList]; i != kNil; i = nodes_[i].next) nodes_[i].list = kFiringList;
    fire_list(cur_tick_ == 0 ? 0 : cur_tick_ - 1);
  }

  for (;;) {
    // hint_tick_ is a lower bound on the next event: an idle tick costs one comparison.
    if (hint_tick_ > target) break;
    const std::uint64_t t = next_event_tick();
    hint_tick_ = t;
    if (t == kNoTick || t > target) break;
    cur_tick_ = t;
    // Cascade from the highest level whose block starts at t down to level 1, so entries
    // cascaded from level L can land in level L-1's current bucket and be cascaded next.
    for (std::uint32_t level = kDeadlineWheelLevels - 1; level >= 1; --level) {
      const std::uint64_t mask = (std::uint64_t{1} << (kSlotBits * level)) - 1;
      if ((t & mask) == 0) cascade(level, t);
    }
    const std::uint32_t b = static_cast<std::uint32_t>(t & (kDeadlineWheelSlots - 1));
    cur_tick_ = t + 1;  // from here on, a deadline in tick t is due (goes to the due list)
    if (heads_[b] != kNil) {
      heads_[kFiringList] = heads_[b];
      heads_[b] = kNil;
      occupied_[0][b / 64] &= ~(std::uint64_t{1} << (b % 64));
      for (std::uint32_t i = heads_[kFiringList]; i != kNil; i = nodes_[i].next) {
        nodes_[i].list = kFiringList;
      }
      fire_list(t);
    }
  }
  cur_tick_ = target + 1;
  return fired;
}

}  // namespace leasehold
