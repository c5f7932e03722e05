// LeaseTable: see lease_table.hpp for the contract. Layout and invariants:
//
// Records and index. Records are 64-byte, cache-line-aligned, kept dense in an array of exactly
// `capacity` entries (a deleted record is replaced by the last one). A separate open-addressing
// index of 8-byte entries {32-bit hash tag, record number + 1} at load factor <= 1/2 maps a
// NameId to its record: with linear probing a lookup's probe run almost always stays inside
// one 64-byte index line, so a lookup costs two cache misses (index line, record), and a
// refresh batch overlaps them across the batch (prefetch every index line, then every record,
// then work). Probing records directly would cost a cache line per probe. Deletion shifts the
// probe run back (no tombstones). Both arrays start as untouched zero pages; large ones are
// mmap'd with transparent huge pages requested, so random probes rarely miss the TLB
// (memory management, not I/O).
//
// Timers. A binary min-heap of {due_ns, name}. A record with a deadline (Held expiry,
// Acquiring deadline, Free lock-delay) has exactly one *authoritative* entry, the one whose
// due equals the record's timer_ns, and timer_ns <= the deadline. Moving a deadline later
// (a refresh) does not touch the heap; when the authoritative entry comes due and the deadline
// is later, it is re-armed at the deadline. Moving a deadline earlier pushes a new entry and
// orphans the old one (its due no longer matches timer_ns; it is dropped when it pops). A
// deadline is reclaimed only when an entry whose due equals it pops, so `advance` reports
// expiries in deadline order. Orphans are bounded: the heap is rebuilt from the records when
// it exceeds 2 * capacity + kTimerSlack entries.
//
// Transferring records have no deadline; they reuse the two time fields to hold `to`.
//
// Free records. time_ns is the end of a lock-delay (an expiry's, a preemption's or a pending
// revoke's bound), or, with kFlagReserveClock, the time a reservation lapses: a reservation's
// TTL starts when the name becomes grantable, so the two never run at once. kFlagRevoking
// marks a pending revoke; `worker` is then the revoked holder's worker (0: none, only the
// bound ends it; it holds a reference like a Held record) and the flag bits above
// kRevokedDeltaShift hold epoch - revoked_epoch (0: unknown).
//
// Transfer guards. A Transferring record's time fields hold `to`, so its guard (the outgoing
// holder's worker, epoch and bound: LeaseTable::begin_transfer) is kept beside it in `guards`,
// one entry per Transferring record (lifted: kill confirmed or bound passed), erased when the
// record leaves Transferring. A pending guard has one timer entry at its bound (a Transferring
// record has no timer_ns: an entry popped for it is the guard's when its due is the bound).
#include "leasehold/lease/lease_table.hpp"

#include "leasehold/lease/assert.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <sys/mman.h>
#include <unordered_map>

namespace leasehold {

Status validate_config(const LeaseConfig& c) {
  const auto range = [](const char* field, std::int64_t v, bool zero_ok) -> std::string {
    if ((zero_ok ? v >= 0 : v > 0) && v <= kLeaseTtlNsMax) return {};
    return std::string(field) + " is " + std::to_string(v) + " ns; it must be in " +
           (zero_ok ? "[0, " : "(0, ") + std::to_string(kLeaseTtlNsMax) + "] ns";
  };
  for (auto err : {range("default_ttl_ns", c.default_ttl_ns, false),
                   range("max_ttl_ns", c.max_ttl_ns, false),
                   range("acquiring_ttl_ns", c.acquiring_ttl_ns, false),
                   range("lock_delay_ns", c.lock_delay_ns, true),
                   range("worker_liveness_ttl_ns", c.worker_liveness_ttl_ns, false),
                   range("reservation_ttl_ns", c.reservation_ttl_ns, false)}) {
    if (!err.empty()) return Status::invalid(err);
  }
  if (c.default_ttl_ns > c.max_ttl_ns)
    return Status::invalid("default_ttl_ns (" + std::to_string(c.default_ttl_ns) + ") exceeds max_ttl_ns (" +
                           std::to_string(c.max_ttl_ns) + ")");
  if (c.mode != LockMode::lease && c.mode != LockMode::preemptible)
    return Status::invalid("mode " + std::to_string(static_cast<int>(c.mode)) + " is not lease (0) or preemptible (1)");
  if (c.capacity == 0 || c.capacity > kLeaseCapacityMax)
    return Status::invalid("capacity is " + std::to_string(c.capacity) + "; it must be in [1, " +
                           std::to_string(kLeaseCapacityMax) + "]");
  return {};
}

std::uint32_t name_fingerprint_of(std::string_view name) noexcept {
  std::uint32_t h = 2166136261u;  // FNV-1a 32
  for (unsigned char c : name) h = (h ^ c) * 16777619u;
  return h | 1u;  // never 0, so a record always carries one
}

namespace {

constexpr std::size_t kTimerSlack = 1024;  // heap entries allowed above 2 * capacity
constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;
constexpr std::size_t kHugePageRegionBytesMin = 2 * kHugePageBytes;  // smaller: calloc
constexpr std::uint8_t kFlagFresh = 1;
constexpr std::uint8_t kFlagRevoking = 2;       // Free: a revoke is pending
constexpr std::uint8_t kFlagReserveClock = 4;   // Free: time_ns is the reservation's lapse
constexpr unsigned kRevokedDeltaShift = 3;      // Free, revoking: epoch - revoked epoch
constexpr Epoch kRevokedDeltaMax = 0xFF >> kRevokedDeltaShift;

struct alignas(64) Slot {
  NameId name;                 // nil: empty slot
  SandboxId owner;             // Held/Acquiring owner; Transferring from; Free reserved_for
  Epoch epoch;                 // Transferring: new_epoch
  std::int64_t time_ns;        // Held expiry; Acquiring deadline; Free lock-delay end (0 none)
  std::int64_t timer_ns;       // due of the authoritative timer entry (0 none)
  std::uint32_t fingerprint;   // name_fingerprint_of(text)
  std::uint16_t worker;        // Held, Acquiring (0: none named): worker index (1..kWorkersMax)
  LockPhase phase;
  std::uint8_t flags;          // kFlag*; revoking: the revoked epoch's distance
};
static_assert(sizeof(Slot) == 64, "one record per cache line");
static_assert(kWorkersMax <= 0xFFFF, "worker index is 16 bits");

struct TimerEntry {
  std::int64_t due_ns;
  NameId name;
};
struct TimerLater {
  bool operator()(const TimerEntry& a, const TimerEntry& b) const noexcept {
    return a.due_ns > b.due_ns;
  }
};

struct WorkerEntry {
  WorkerId id;
  std::int64_t alive_until_ns = 0;
  std::uint32_t refs = 0;  // Held and Acquiring records on this worker, revokes waiting for it
};

inline std::uint64_t mix(NameId n) noexcept {
  std::uint64_t h = n.hi * 0x9E3779B97F4A7C15ULL ^ n.lo;
  h ^= h >> 32;
  h *= 0xD6E8FEB86659FD93ULL;
  h ^= h >> 32;
  return h;
}

struct IndexEntry {
  std::uint32_t tag;  // high 32 bits of the name's mixed hash
  std::uint32_t rec;  // record number + 1; 0: empty
};
static_assert(sizeof(IndexEntry) == 8);

// Zeroed memory for `bytes`, 64-byte aligned; large regions are 2 MiB aligned with THP advised.
class Region {
 public:
  Region() = default;
  explicit Region(std::size_t bytes) {
    if (bytes >= kHugePageRegionBytesMin) {
      mapped_ = bytes + kHugePageBytes;
      raw_ = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (raw_ == MAP_FAILED) throw std::bad_alloc();
      const auto addr = reinterpret_cast<std::uintptr_t>(raw_);
      data_ = reinterpret_cast<void*>((addr + kHugePageBytes - 1) & ~(kHugePageBytes - 1));
      (void)madvise(data_, bytes, MADV_HUGEPAGE);  // advisory: without THP, 4 KiB pages
    } else {
      raw_ = std::calloc(1, bytes + 64);
      if (raw_ == nullptr) throw std::bad_alloc();
      const auto addr = reinterpret_cast<std::uintptr_t>(raw_);
      data_ = reinterpret_cast<void*>((addr + 63) & ~std::uintptr_t{63});
    }
    bytes_ = bytes;
  }
  ~Region() { reset(); }
  Region(Region&& o) noexcept { swap(o); }
  Region& operator=(Region&& o) noexcept {
    if (this != &o) {
      reset();
      swap(o);
    }
    return *this;
  }
  template <class T>
  T* as() const noexcept { return static_cast<T*>(data_); }
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  void reset() noexcept {
    if (mapped_ > 0) munmap(raw_, mapped_);
    else std::free(raw_);
    raw_ = data_ = nullptr;
    mapped_ = bytes_ = 0;
  }
  void swap(Region& o) noexcept {
    std::swap(raw_, o.raw_);
    std::swap(data_, o.data_);
    std::swap(mapped_, o.mapped_);
    std::swap(bytes_, o.bytes_);
  }
  void* raw_ = nullptr;
  void* data_ = nullptr;
  std::size_t mapped_ = 0;  // > 0: mmap'd
  std::size_t bytes_ = 0;
};

// A revoke to leave pending in a Free record (see enter_free).
struct PendingRevoke {
  bool active = false;
  std::uint16_t worker = 0;  // the revoked holder's worker index; 0: no confirmation
  Epoch delta = 0;           // epoch - revoked epoch; 0 or above kRevokedDeltaMax: unknown
};

inline std::int64_t add_sat(std::int64_t a, std::int64_t b) noexcept {
  // Deadlines saturate below kNoExpiry, which is reserved for "never".
  return a > kNoExpiry - 1 - b ? kNoExpiry - 1 : a + b;
}

// The guard of a transfer in progress: the outgoing grant may still run (see the file comment).
struct TransferGuard {
  WorkerId worker;            // the outgoing holder's worker (nil: only the bound lifts it)
  Epoch old_epoch = 0;        // the outgoing grant's epoch
  std::int64_t bound_ns = 0;  // lifted without confirmation at this time
  bool lifted = false;        // the kill was confirmed or the bound passed
};

}  // namespace

struct LeaseTable::Impl {
  LeaseConfig config;
  Region rec_region;
  Region index_region;
  Slot* recs = nullptr;            // [0, count) in use
  IndexEntry* index = nullptr;     // index_mask + 1 entries
  std::size_t index_mask = 0;
  std::size_t count = 0;
  std::size_t held = 0;
  Epoch high_water = 0;
  // The latest now_ns a mutating call passed: time into the table never goes backwards.
  std::int64_t last_now_ns = std::numeric_limits<std::int64_t>::min();
  std::vector<TimerEntry> timers;
  std::vector<WorkerEntry> workers;  // index 0 unused
  std::unordered_map<WorkerId, std::uint16_t> worker_index;
  std::vector<std::uint16_t> free_workers;
  std::unordered_map<NameId, TransferGuard> guards;  // one per Transferring record
  // The worker a reservation (Free reserved_for, or Transferring to) is for. Outside the
  // 64-byte slot, which has no room: an entry counts only while its slot is Free reserved for
  // (or Transferring to) `sandbox` at `epoch`, so a transition that ends the reservation needs
  // no bookkeeping; erase() drops the entry with its slot (at most one per record).
  struct Reservation {
    SandboxId sandbox;
    Epoch epoch = 0;
    WorkerId worker;
  };
  std::unordered_map<NameId, Reservation> reservations;

  /// The sandbox a slot is reserved for (Free) or being transferred to; nil otherwise.
  static SandboxId reservee(const Slot& s) noexcept {
    if (s.phase == LockPhase::free) return s.owner;
    if (s.phase == LockPhase::transferring) return to_of(s);
    return {};
  }
  WorkerId reserved_worker(const Slot& s) const {
    const SandboxId to = reservee(s);
    if (to.is_nil()) return {};
    const auto it = reservations.find(s.name);
    if (it == reservations.end() || it->second.sandbox != to || it->second.epoch != s.epoch) return {};
    return it->second.worker;
  }
  void reserve_for_worker(const Slot& s, WorkerId worker) {
    if (worker.is_nil() || reservee(s).is_nil()) {
      reservations.erase(s.name);
      return;
    }
    reservations[s.name] = Reservation{reservee(s), s.epoch, worker};
  }

  explicit Impl(const LeaseConfig& c) : config(c) {
    std::size_t index_size = 16;
    while (index_size < 2 * c.capacity) index_size *= 2;  // load factor <= 1/2
    rec_region = Region(c.capacity * sizeof(Slot));
    index_region = Region(index_size * sizeof(IndexEntry));
    recs = rec_region.as<Slot>();
    index = index_region.as<IndexEntry>();
    index_mask = index_size - 1;
    timers.reserve(c.capacity);  // untouched until used; avoids copies while a table fills
    workers.resize(1);
  }

  bool preemptible() const noexcept { return config.mode == LockMode::preemptible; }

  // ---- records and index ----
  std::size_t next(std::size_t i) const noexcept { return (i + 1) & index_mask; }
  static std::uint32_t tag_of(std::uint64_t h) noexcept { return static_cast<std::uint32_t>(h >> 32); }

  // Index position of `n` (found) or of the empty entry ending its probe run.
  std::size_t locate(NameId n, std::uint64_t h, bool& found) const noexcept {
    const std::uint32_t tag = tag_of(h);
    for (std::size_t i = h & index_mask;; i = next(i)) {
      const IndexEntry e = index[i];
      if (e.rec == 0) { found = false; return i; }
      if (e.tag == tag && recs[e.rec - 1].name == n) { found = true; return i; }
    }
  }
  Slot* find(NameId n) const noexcept {
    if (n.is_nil()) return nullptr;
    bool found = false;
    const std::size_t i = locate(n, mix(n), found);
    return found ? &recs[index[i].rec - 1] : nullptr;
  }
  void erase(Slot* s) noexcept {
    reservations.erase(s->name);
    const std::size_t r = static_cast<std::size_t>(s - recs);
    bool found = false;
    std::size_t i = locate(s->name, mix(s->name), found);
    LEASEHOLD_ASSERT(found);
    // Backward-shift deletion: pull later entries of the probe run into the hole.
    std::size_t j = i;
    for (;;) {
      j = next(j);
      if (index[j].rec == 0) break;
      const std::size_t k = mix(recs[index[j].rec - 1].name) & index_mask;
      const bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
      if (!stays) {
        index[i] = index[j];
        i = j;
      }
    }
    index[i] = IndexEntry{0, 0};
    // Keep records dense: the last record moves into the hole.
    const std::size_t last = count - 1;
    if (r != last) {
      recs[r] = recs[last];
      const std::size_t p = locate(recs[r].name, mix(recs[r].name), found);
      LEASEHOLD_ASSERT(found);
      index[p].rec = static_cast<std::uint32_t>(r + 1);
    }
    recs[last] = Slot{};
    --count;
  }

  // ---- views ----
  static SandboxId to_of(const Slot& s) noexcept {
    return SandboxId{static_cast<std::uint64_t>(s.time_ns), static_cast<std::uint64_t>(s.timer_ns)};
  }
  static void set_to(Slot& s, SandboxId to) noexcept {
    s.time_ns = static_cast<std::int64_t>(to.hi);
    s.timer_ns = static_cast<std::int64_t>(to.lo);
  }
  LockState view(const Slot& s) const {
    LockState v;
    v.phase = s.phase;
    v.epoch = s.epoch;
    v.known = true;
    switch (s.phase) {
      case LockPhase::free: {
        v.reserved_for = s.owner;
        v.reserved_worker = reserved_worker(s);
        v.lock_delay_until_ns = delay_end(s);
        if ((s.flags & kFlagReserveClock) != 0) v.reservation_until_ns = s.time_ns;
        v.epoch_fresh = (s.flags & kFlagFresh) != 0;
        v.revoke_pending = (s.flags & kFlagRevoking) != 0;
        if (v.revoke_pending) {
          const Epoch delta = revoked_delta(s);
          v.revoked_epoch = delta != 0 && delta < s.epoch ? s.epoch - delta : 0;
          if (s.worker != 0 && v.revoked_epoch != 0) v.revoked_worker = workers[s.worker].id;
        }
        break;
      }
      case LockPhase::acquiring:
        v.owner = s.owner;
        v.deadline_ns = s.time_ns;
        if (s.worker != 0) v.worker = workers[s.worker].id;
        break;
      case LockPhase::held:
        v.owner = s.owner;
        v.worker = workers[s.worker].id;
        v.expiry_ns = s.time_ns;
        break;
      case LockPhase::transferring:
        v.owner = s.owner;
        v.to = to_of(s);
        v.old_epoch = s.epoch - 1;
        if (const TransferGuard* g = pending_guard(s.name)) {
          v.revoke_pending = true;
          v.revoked_epoch = g->old_epoch;
          v.revoked_worker = g->worker;
          v.lock_delay_until_ns = g->bound_ns;
        }
        v.reserved_worker = reserved_worker(s);
        break;
    }
    return v;
  }
  // The pending (not lifted) transfer guard of a Transferring record, or nullptr.
  const TransferGuard* pending_guard(NameId n) const noexcept {
    const auto it = guards.find(n);
    return it != guards.end() && !it->second.lifted ? &it->second : nullptr;
  }
  void add_guard(NameId n, TransferGuard g) {
    guards[n] = g;
    if (!g.lifted) push_timer(g.bound_ns, n);
  }
  // A preemptible revoke's bound (LeaseTable::revoke): fixed, whatever the worker does next.
  std::int64_t liveness_bound(std::int64_t now_ns) const noexcept {
    return add_sat(now_ns, add_sat(config.worker_liveness_ttl_ns, config.lock_delay_ns));
  }
  LockState absent() const noexcept {
    LockState v;
    v.epoch = high_water;
    return v;
  }

  // ---- Free records: lock-delay, pending revoke, reservation ----
  static Epoch revoked_delta(const Slot& s) noexcept { return s.flags >> kRevokedDeltaShift; }
  // End of a Free record's lock-delay (0 or past: none).
  std::int64_t delay_end(const Slot& s) const noexcept {
    return (s.flags & kFlagReserveClock) != 0 ? 0 : s.time_ns;
  }
  // Drops a Free record's pending revoke (and its worker reference).
  void drop_revoke(Slot& s) noexcept {
    if (s.phase != LockPhase::free || (s.flags & kFlagRevoking) == 0) return;
    if (s.worker != 0) {
      LEASEHOLD_ASSERT(workers[s.worker].refs > 0);
      --workers[s.worker].refs;
    }
    s.worker = 0;
    s.flags &= static_cast<std::uint8_t>(kFlagFresh | kFlagReserveClock);
  }

  // ---- timers ----
  std::int64_t deadline_of(const Slot& s) const noexcept {
    switch (s.phase) {
      case LockPhase::held: return preemptible() ? 0 : s.time_ns;
      case LockPhase::acquiring: return s.time_ns;
      case LockPhase::free: return (s.flags & kFlagReserveClock) != 0 ? s.time_ns : delay_end(s);
      case LockPhase::transferring: return 0;
    }
    return 0;
  }
  void arm(Slot& s, std::int64_t deadline_ns) {
    if (deadline_ns <= 0 || deadline_ns >= kNoExpiry) return;
    if (s.timer_ns != 0 && s.timer_ns <= deadline_ns) return;  // lazily re-armed when due
    if (timers.size() >= 2 * config.capacity + kTimerSlack) rebuild_timers();
    s.timer_ns = deadline_ns;
    push_timer(deadline_ns, s.name);
  }
  void push_timer(std::int64_t due_ns, NameId n) {
    if (due_ns <= 0 || due_ns >= kNoExpiry) return;
    timers.push_back(TimerEntry{due_ns, n});
    std::push_heap(timers.begin(), timers.end(), TimerLater{});
  }
  void rebuild_timers() {
    timers.clear();
    for (std::size_t i = 0; i < count; ++i) {
      Slot& s = recs[i];
      if (s.phase == LockPhase::transferring) {
        if (const TransferGuard* g = pending_guard(s.name)) timers.push_back(TimerEntry{g->bound_ns, s.name});
        continue;
      }
      s.timer_ns = 0;
      const std::int64_t d = deadline_of(s);
      if (d > 0 && d < kNoExpiry) {
        s.timer_ns = d;
        timers.push_back(TimerEntry{d, s.name});
      }
    }
    std::make_heap(timers.begin(), timers.end(), TimerLater{});
  }

  // ---- workers ----
  std::uint16_t find_worker(WorkerId w) const noexcept {
    auto it = worker_index.find(w);
    return it == worker_index.end() ? 0 : it->second;
  }
  // Index of `w`, adding it if new; 0 if kWorkersMax workers with leases are tracked.
  std::uint16_t intern_worker(WorkerId w) {
    if (auto i = find_worker(w); i != 0) return i;
    if (free_workers.empty() && workers.size() > kWorkersMax) {
      // Reclaim workers that hold no lease (their liveness only matters for Held records).
      for (std::size_t i = 1; i < workers.size(); ++i) {
        if (workers[i].refs == 0 && !workers[i].id.is_nil()) {
          worker_index.erase(workers[i].id);
          workers[i] = WorkerEntry{};
          free_workers.push_back(static_cast<std::uint16_t>(i));
        }
      }
    }
    std::uint16_t i = 0;
    if (!free_workers.empty()) {
      i = free_workers.back();
      free_workers.pop_back();
    } else if (workers.size() <= kWorkersMax) {
      i = static_cast<std::uint16_t>(workers.size());
      workers.emplace_back();
    } else {
      return 0;
    }
    workers[i].id = w;
    worker_index.emplace(w, i);
    return i;
  }
  void heartbeat(std::uint16_t i, std::int64_t now_ns) noexcept {
    WorkerEntry& e = workers[i];
    e.alive_until_ns = std::max(e.alive_until_ns, add_sat(now_ns, config.worker_liveness_ttl_ns));
  }

  // Every mutating call passes its now_ns here first. A clock that went backwards would let a
  // refresh or a grant land "before" an expiry already reported, so it aborts (as Seastar's
  // timer_set::expire does) rather than being silently accepted. A negative now_ns is left to
  // the caller's bad_request check.
  void clock(std::int64_t now_ns) noexcept {
    if (now_ns < 0) return;
    LEASEHOLD_ASSERT(now_ns >= last_now_ns);
    last_now_ns = now_ns;
  }

  // ---- state changes ----
  void enter_held(Slot& s, SandboxId owner, std::uint16_t worker, Epoch epoch,
                  std::int64_t expiry_ns) {
    LEASEHOLD_ASSERT(epoch != 0 && epoch <= kEpochMax);
    leave_acquiring(s);
    s.phase = LockPhase::held;
    s.owner = owner;
    s.worker = worker;
    s.epoch = epoch;
    s.flags = 0;
    s.time_ns = expiry_ns;
    ++workers[worker].refs;
    ++held;
    high_water = std::max(high_water, epoch);
    arm(s, deadline_of(s));
  }
  // Drops an Acquiring record's worker reference (before it becomes Held or Free).
  void leave_acquiring(Slot& s) noexcept {
    if (s.phase != LockPhase::acquiring || s.worker == 0) return;
    LEASEHOLD_ASSERT(workers[s.worker].refs > 0);
    --workers[s.worker].refs;
    s.worker = 0;
  }
  void leave_held(Slot& s) noexcept {
    LEASEHOLD_ASSERT(s.phase == LockPhase::held);
    LEASEHOLD_ASSERT(workers[s.worker].refs > 0);
    --workers[s.worker].refs;
    --held;
    s.worker = 0;
  }
  // To Free. A reservation with no lock-delay and no pending revoke starts its TTL at
  // now_ns. Returns the state after (the slot may be erased).
  LockState enter_free(Slot* s, Epoch epoch, bool fresh, SandboxId reserved_for,
                       std::int64_t lock_delay_until_ns, std::int64_t now_ns,
                       PendingRevoke revoke = {}) {
    if (s->phase == LockPhase::held) leave_held(*s);
    leave_acquiring(*s);
    if (s->phase == LockPhase::transferring) {
      s->timer_ns = 0;
      guards.erase(s->name);
    }
    drop_revoke(*s);
    s->phase = LockPhase::free;
    s->epoch = epoch;
    s->flags = fresh ? kFlagFresh : 0;
    s->owner = reserved_for;
    s->time_ns = lock_delay_until_ns;
    s->worker = 0;
    if (revoke.active) {
      const Epoch delta = revoke.delta <= kRevokedDeltaMax ? revoke.delta : 0;
      s->flags = static_cast<std::uint8_t>(s->flags | kFlagRevoking | (delta << kRevokedDeltaShift));
      if (delta != 0 && revoke.worker != 0) {
        s->worker = revoke.worker;
        ++workers[revoke.worker].refs;
      }
    } else if (!reserved_for.is_nil() && lock_delay_until_ns == 0) {
      s->flags = static_cast<std::uint8_t>(s->flags | kFlagReserveClock);
      s->time_ns = add_sat(now_ns, config.reservation_ttl_ns);
    }
    high_water = std::max(high_water, epoch);
    LockState after = view(*s);
    if (!fresh && reserved_for.is_nil() && lock_delay_until_ns == 0 && !revoke.active) {
      erase(s);  // a plain Free record is the same as an unknown name
      after.known = false;
    } else {
      arm(*s, deadline_of(*s));
    }
    return after;
  }
  Slot* insert(NameId name, std::uint32_t fingerprint) {
    LEASEHOLD_ASSERT(count < config.capacity);
    bool found = false;
    const std::uint64_t h = mix(name);
    const std::size_t i = locate(name, h, found);
    LEASEHOLD_ASSERT(!found);
    index[i] = IndexEntry{tag_of(h), static_cast<std::uint32_t>(count + 1)};
    Slot& s = recs[count];
    s = Slot{};
    s.name = name;
    s.fingerprint = fingerprint;
    s.phase = LockPhase::free;
    s.epoch = high_water;
    ++count;
    return &s;
  }

  Outcome refuse(Refusal r, NameId name, const Slot* s) const {
    return Outcome{r, name, s != nullptr ? view(*s) : absent(), {}};
  }
  std::int64_t ttl_of(std::int64_t ttl_ns) const noexcept {
    return ttl_ns <= 0 ? config.default_ttl_ns : ttl_ns;
  }
  std::int64_t expiry_at(std::int64_t now_ns, std::int64_t ttl_ns) const noexcept {
    return preemptible() ? kNoExpiry : add_sat(now_ns, ttl_ns);
  }

  Outcome acquire(std::string_view text, SandboxId sandbox, WorkerId worker, std::int64_t now_ns,
                  std::int64_t ttl_ns, bool two_phase);
};

LeaseTable::LeaseTable(const LeaseConfig& config) {
  if (const Status err = validate_config(config); !err.ok()) throw std::invalid_argument(err.message());
  impl_ = std::make_unique<Impl>(config);
}
LeaseTable::~LeaseTable() = default;
LeaseTable::LeaseTable(LeaseTable&&) noexcept = default;
LeaseTable& LeaseTable::operator=(LeaseTable&&) noexcept = default;
const LeaseConfig& LeaseTable::config() const noexcept { return impl_->config; }

// ---- acquisition --------------------------------------------------------------------------

Outcome LeaseTable::Impl::acquire(std::string_view text, SandboxId sandbox, WorkerId worker,
                                  std::int64_t now_ns, std::int64_t ttl_ns, bool two_phase) {
  clock(now_ns);
  if (!validate_new_name(text).ok()) return Outcome{Refusal::invalid_name, {}, absent(), {}};
  const NameId name = name_id_of(text);
  Slot* s = find(name);
  if (sandbox.is_nil() || (!two_phase && worker.is_nil()) || now_ns < 0 ||
      ttl_ns > config.max_ttl_ns)
    return refuse(Refusal::bad_request, name, s);
  if (!two_phase && preemptible()) return refuse(Refusal::wrong_mode, name, s);
  const std::uint32_t fp = name_fingerprint_of(text);
  if (s != nullptr && s->fingerprint != fp) return refuse(Refusal::name_collision, name, s);

  Epoch epoch = 0;
  if (s != nullptr) {
    switch (s->phase) {
      case LockPhase::held:
        if (now_ns >= s->time_ns) return refuse(Refusal::expired, name, s);
        if (s->owner != sandbox) return refuse(Refusal::held, name, s);
        // The holder's grant again, but only to the holder's worker: a sandbox id is no secret.
        if (workers[s->worker].id != worker) return refuse(Refusal::forbidden, name, s);
        return Outcome{Refusal::none, name, view(*s), Token{name, s->epoch, sandbox}};  // idempotent
      case LockPhase::acquiring:
        if (s->owner != sandbox || !two_phase) return refuse(Refusal::acquiring, name, s);
        if (now_ns >= s->time_ns) return refuse(Refusal::expired, name, s);
        if (s->worker != 0 && workers[s->worker].id != worker) return refuse(Refusal::forbidden, name, s);
        return Outcome{Refusal::none, name, view(*s), Token{name, s->epoch, sandbox}};  // idempotent
      case LockPhase::transferring:
        return refuse(Refusal::transferring, name, s);
      case LockPhase::free: {
        if (now_ns < delay_end(*s)) return refuse(Refusal::lock_delay, name, s);
        const bool lapsed = (s->flags & kFlagReserveClock) != 0 && now_ns >= s->time_ns;
        if (!s->owner.is_nil() && s->owner != sandbox && !lapsed)
          return refuse(Refusal::reserved, name, s);
        // A reservation is for (sandbox, worker): another worker naming the reserved sandbox
        // is not it.
        if (!s->owner.is_nil() && !lapsed) {
          const WorkerId rw = reserved_worker(*s);
          if (!rw.is_nil() && rw != worker) return refuse(Refusal::forbidden, name, s);
        }
        if ((s->flags & kFlagFresh) != 0) {
          epoch = s->epoch;
        } else {
          if (s->epoch == kEpochMax) return refuse(Refusal::epoch_exhausted, name, s);
          epoch = s->epoch + 1;
        }
        break;
      }
    }
  } else {
    if (count >= config.capacity) return refuse(Refusal::table_full, name, s);
    if (high_water == kEpochMax) return refuse(Refusal::epoch_exhausted, name, s);
    epoch = high_water + 1;
  }
  std::uint16_t widx = 0;
  if (!worker.is_nil()) {
    widx = intern_worker(worker);
    if (widx == 0) return refuse(Refusal::table_full, name, s);
  }
  // Epoch monotone at grant: a new grant's epoch is above every epoch the name had (a fresh
  // epoch, allocated by a revoke or transfer and not yet granted, is granted as is).
  const bool fresh_grant = s != nullptr && (s->flags & kFlagFresh) != 0;
  LEASEHOLD_ASSERT(epoch > (s != nullptr ? s->epoch : high_water) || (fresh_grant && epoch == s->epoch));
  if (s == nullptr) s = insert(name, fp);
  drop_revoke(*s);
  s->time_ns = 0;
  if (two_phase) {
    s->phase = LockPhase::acquiring;
    s->owner = sandbox;
    s->epoch = epoch;
    s->flags = 0;
    s->worker = widx;
    if (widx != 0) ++workers[widx].refs;
    s->time_ns = add_sat(now_ns, config.acquiring_ttl_ns);
    high_water = std::max(high_water, epoch);
    arm(*s, s->time_ns);
  } else {
    enter_held(*s, sandbox, widx, epoch, expiry_at(now_ns, ttl_of(ttl_ns)));
  }
  LEASEHOLD_ASSERT(s->epoch == epoch);
  return Outcome{Refusal::none, name, view(*s), Token{name, epoch, sandbox}};
}

Outcome LeaseTable::acquire(std::string_view name, SandboxId sandbox, WorkerId worker,
                            std::int64_t now_ns, std::int64_t ttl_ns) {
  return impl_->acquire(name, sandbox, worker, now_ns, ttl_ns, false);
}

Outcome LeaseTable::acquire_2pc(std::string_view name, SandboxId sandbox, std::int64_t now_ns,
                                WorkerId worker) {
  return impl_->acquire(name, sandbox, worker, now_ns, 0, true);
}

Outcome LeaseTable::commit(NameId name, SandboxId sandbox, Epoch epoch, WorkerId worker,
                           std::int64_t now_ns, std::int64_t ttl_ns) {
  impl_->clock(now_ns);
  Impl& m = *impl_;
  Slot* s = m.find(name);
  if (sandbox.is_nil() || worker.is_nil() || now_ns < 0 || ttl_ns > m.config.max_ttl_ns)
    return m.refuse(Refusal::bad_request, name, s);
  if (s == nullptr) return m.refuse(Refusal::unknown_name, name, s);
  if (s->phase == LockPhase::held && s->owner == sandbox && s->epoch == epoch &&
      m.workers[s->worker].id == worker && now_ns < s->time_ns)
    return Outcome{Refusal::none, name, m.view(*s), Token{name, epoch, sandbox}};  // idempotent
  if (s->phase != LockPhase::acquiring) return m.refuse(Refusal::not_acquiring, name, s);
  if (s->owner != sandbox) return m.refuse(Refusal::not_holder, name, s);
  if (s->epoch != epoch) return m.refuse(Refusal::stale_epoch, name, s);
  if (now_ns >= s->time_ns) return m.refuse(Refusal::acquiring_expired, name, s);
  const std::uint16_t widx = m.intern_worker(worker);
  if (widx == 0) return m.refuse(Refusal::table_full, name, s);
  // Preemptible: the Commit is a liveness beat of its worker. Without it, a lockd that restarted
  // since the worker's last beat (liveness lives in memory) would count the worker lapsed and
  // preempt the name it has just committed, at the next competing acquire, while the sandbox
  // runs under the worker's kill deadline (measured from its beats to the old incarnation).
  // Counting liveness from now only delays a preemption: never unsafe.
  if (m.preemptible()) m.heartbeat(widx, now_ns);
#if LEASEHOLD_SIM_ABLATE_ACQUIRING_EXPIRY
  // Simulator ablation (bug class: expiry without the acquiring check, specs/lease.pml
  // NO_ACQUIRING_BEFORE_EXPIRY): the lease's TTL counts from the 2-phase acquire, so it runs
  // while the sandbox is still being scheduled, and the name expires here before the holder's
  // kill-switch (measured from the commit's send) fires.
  const std::int64_t lease_from = s->time_ns - m.config.acquiring_ttl_ns;
#else
  const std::int64_t lease_from = now_ns;  // the lease starts at the commit
#endif
  m.enter_held(*s, sandbox, widx, epoch, m.expiry_at(lease_from, m.ttl_of(ttl_ns)));
  return Outcome{Refusal::none, name, m.view(*s), Token{name, epoch, sandbox}};
}

// ---- heartbeat ----------------------------------------------------------------------------

Refusal LeaseTable::refresh(WorkerId worker, std::span<const RefreshEntry> entries,
                            std::int64_t now_ns, std::span<RefreshAnswer> answers,
                            std::int64_t ttl_ns) {
  impl_->clock(now_ns);
  Impl& m = *impl_;
  if (entries.size() > kRefreshBatchMax || answers.size() < entries.size() || worker.is_nil() ||
      now_ns < 0 || ttl_ns > m.config.max_ttl_ns)
    return Refusal::bad_request;
  const std::uint16_t widx = m.intern_worker(worker);  // 0: table of workers full, no lease here
  if (widx != 0) m.heartbeat(widx, now_ns);
  const std::int64_t expiry_ns = m.expiry_at(now_ns, m.ttl_of(ttl_ns));

  // Memory-level parallelism: start every index line's cache miss, then every record's, before
  // using any of them, so the batch costs about two memory latencies instead of 2 * size.
  const std::size_t n = entries.size();
  std::uint64_t hashes[kRefreshBatchMax];
  std::uint32_t guess[kRefreshBatchMax];  // record number + 1 of the first tag match; 0: none
  for (std::size_t k = 0; k < n; ++k) {
    hashes[k] = mix(entries[k].name);
    __builtin_prefetch(&m.index[hashes[k] & m.index_mask], 0, 3);
  }
  for (std::size_t k = 0; k < n; ++k) {
    const std::uint32_t tag = Impl::tag_of(hashes[k]);
    guess[k] = 0;
    for (std::size_t i = hashes[k] & m.index_mask;; i = m.next(i)) {
      const IndexEntry e = m.index[i];
      if (e.rec == 0) break;
      if (e.tag == tag) {
        guess[k] = e.rec;
        __builtin_prefetch(&m.recs[e.rec - 1], 1, 3);
        break;
      }
    }
  }
  for (std::size_t k = 0; k < n; ++k) {
    const RefreshEntry& e = entries[k];
    RefreshAnswer& a = answers[k];
    Slot* found = nullptr;
    if (guess[k] != 0 && m.recs[guess[k] - 1].name == e.name) found = &m.recs[guess[k] - 1];
    else if (guess[k] != 0) found = m.find(e.name);  // a tag collision: probe on (rare)
    if (found == nullptr || e.name.is_nil()) {
      a = RefreshAnswer{RefreshStatus::unknown, m.high_water, {}, 0};
      continue;
    }
    Slot& s = *found;
    const bool live_held = s.phase == LockPhase::held && now_ns < s.time_ns;
#if LEASEHOLD_SIM_ABLATE_REFRESH_OWNER
    // Simulator ablation (bug class: refresh without the owner check): any live Held lease is
    // extended, whoever asks - another sandbox, another epoch, another worker.
    if (live_held) {
#else
    if (live_held && s.owner == e.sandbox && s.epoch == e.epoch && s.worker == widx &&
        !e.sandbox.is_nil()) {
#endif
      s.time_ns = expiry_ns;  // the only write: the deadline moves, the timer stays lazy
      if (s.timer_ns == 0 || expiry_ns < s.timer_ns) m.arm(s, expiry_ns);
      a = RefreshAnswer{RefreshStatus::refreshed, s.epoch, s.owner, expiry_ns};
      continue;
    }
    // Lost: report who holds it now (nil if nobody does, including an expired lease).
    SandboxId holder;
    if (live_held || s.phase == LockPhase::acquiring) holder = s.owner;
    a = RefreshAnswer{RefreshStatus::lost, s.epoch, holder, 0};
  }
  return Refusal::none;
}

Refusal LeaseTable::worker_heartbeat(WorkerId worker, std::int64_t now_ns) {
  impl_->clock(now_ns);
  Impl& m = *impl_;
  if (worker.is_nil() || now_ns < 0) return Refusal::bad_request;
  const std::uint16_t widx = m.intern_worker(worker);
  if (widx == 0) return Refusal::table_full;
  m.heartbeat(widx, now_ns);
  return Refusal::none;
}

bool LeaseTable::worker_alive(WorkerId worker, std::int64_t now_ns) const noexcept {
  const std::uint16_t i = impl_->find_worker(worker);
  return i != 0 && now_ns < impl_->workers[i].alive_until_ns;
}

// ---- giving names back --------------------------------------------------------------------

Outcome LeaseTable::release(NameId name, SandboxId sandbox, Epoch epoch, std::int64_t now_ns) {
  impl_->clock(now_ns);
  Impl& m = *impl_;
  Slot* s = m.find(name);
  if (s == nullptr) return m.refuse(Refusal::unknown_name, name, s);
  switch (s->phase) {
    case LockPhase::free: return m.refuse(Refusal::not_held, name, s);
    case LockPhase::transferring: return m.refuse(Refusal::transferring, name, s);
    case LockPhase::held:
    case LockPhase::acquiring: break;
  }
  if (s->owner != sandbox) return m.refuse(Refusal::not_holder, name, s);
  if (s->epoch != epoch) return m.refuse(Refusal::stale_epoch, name, s);
  if (s->phase == LockPhase::held && now_ns >= s->time_ns)
    return m.refuse(Refusal::expired, name, s);
  return Outcome{Refusal::none, name, m.enter_free(s, s->epoch, false, {}, 0, now_ns), {}};
}

std::size_t LeaseTable::advance(std::int64_t now_ns, std::vector<Expiry>& expired,
                                std::size_t limit) {
  impl_->clock(now_ns);
  Impl& m = *impl_;
  std::size_t reported = 0;
  while (!m.timers.empty() && m.timers.front().due_ns <= now_ns && reported < limit) {
    std::pop_heap(m.timers.begin(), m.timers.end(), TimerLater{});
    const TimerEntry e = m.timers.back();
    m.timers.pop_back();
    Slot* s = m.find(e.name);
    if (s != nullptr && s->phase == LockPhase::transferring) {
      const auto g = m.guards.find(e.name);
      if (g == m.guards.end() || g->second.lifted || g->second.bound_ns != e.due_ns) continue;
      g->second.lifted = true;  // the transfer guard's bound passed unconfirmed
      expired.push_back(Expiry{s->name, LockPhase::transferring, {}, g->second.worker, s->epoch, e.due_ns,
                               ExpiryKind::revoke_bound});
      ++reported;
      continue;
    }
    if (s == nullptr || s->timer_ns != e.due_ns)
      continue;  // orphan: the record is gone or has a newer authoritative entry
    s->timer_ns = 0;
    const std::int64_t d = m.deadline_of(*s);
    if (d <= 0 || d >= kNoExpiry) continue;  // no deadline any more
    if (d > e.due_ns) {
      m.arm(*s, d);  // refreshed since armed: re-arm at the real deadline (keeps order)
      continue;
    }
    LEASEHOLD_ASSERT(d == e.due_ns);
    switch (s->phase) {
      case LockPhase::held: {
        expired.push_back(Expiry{s->name, LockPhase::held, s->owner, m.workers[s->worker].id,
                                 s->epoch, d, ExpiryKind::lease});
        const std::int64_t delay_until =
            m.config.lock_delay_ns > 0 ? add_sat(d, m.config.lock_delay_ns) : 0;
        m.enter_free(s, s->epoch, false, {}, delay_until, d);
        ++reported;
        break;
      }
      case LockPhase::acquiring:
        expired.push_back(Expiry{s->name, LockPhase::acquiring, s->owner, {}, s->epoch, d,
                                 ExpiryKind::acquiring});
        m.enter_free(s, s->epoch, false, {}, 0, d);
        ++reported;
        break;
      case LockPhase::free: {
        const bool fresh = (s->flags & kFlagFresh) != 0;
        if ((s->flags & kFlagReserveClock) != 0) {  // the reservation lapsed
          expired.push_back(Expiry{s->name, LockPhase::free, s->owner, {}, s->epoch, d,
                                   ExpiryKind::reservation});
          m.enter_free(s, s->epoch, fresh, {}, 0, d);
          ++reported;
        } else if ((s->flags & kFlagRevoking) != 0) {  // a revoke's bound passed unconfirmed
          const WorkerId w = s->worker != 0 ? m.workers[s->worker].id : WorkerId{};
          expired.push_back(Expiry{s->name, LockPhase::free, {}, w, s->epoch, d,
                                   ExpiryKind::revoke_bound});
          m.enter_free(s, s->epoch, fresh, s->owner, 0, d);  // a reservation's TTL starts
          ++reported;
        } else {  // lock-delay over
          m.enter_free(s, s->epoch, fresh, s->owner, 0, d);
        }
        break;
      }
      case LockPhase::transferring:
        break;
    }
  }
  return reported;
}

// ---- transfer -----------------------------------------------------------------------------

Outcome LeaseTable::begin_transfer(NameId name, SandboxId from, Epoch epoch, SandboxId to,
                                   std::int64_t now_ns, WorkerId to_worker) {
  impl_->clock(now_ns);
  Impl& m = *impl_;
  Slot* s = m.find(name);
  if (from.is_nil() || to.is_nil() || from == to) return m.refuse(Refusal::bad_request, name, s);
  if (s == nullptr) return m.refuse(Refusal::unknown_name, name, s);
  switch (s->phase) {
    case LockPhase::free: return m.refuse(Refusal::not_held, name, s);
    case LockPhase::acquiring: return m.refuse(Refusal::acquiring, name, s);
    case LockPhase::transferring:
      if (s->owner == from && Impl::to_of(*s) == to && s->epoch - 1 == epoch)
        return Outcome{Refusal::none, name, m.view(*s), {}};  // idempotent retry
      return m.refuse(Refusal::transferring, name, s);
    case LockPhase::held: break;
  }
  if (s->owner != from) return m.refuse(Refusal::not_holder, name, s);
  if (s->epoch != epoch) return m.refuse(Refusal::stale_epoch, name, s);
  if (now_ns >= s->time_ns) return m.refuse(Refusal::expired, name, s);
  if (s->epoch == kEpochMax) return m.refuse(Refusal::epoch_exhausted, name, s);
  // The guard: `from` may run until its worker confirms the kill or its grant would have
  // ended by lockd's own rules (as for a revoke).
  const TransferGuard guard{m.workers[s->worker].id, epoch,
                            m.preemptible() ? m.liveness_bound(now_ns)
                                            : add_sat(s->time_ns, m.config.lock_delay_ns),
                            m.config.ablate_transfer_guard};
  m.leave_held(*s);
  s->phase = LockPhase::transferring;
  s->epoch = epoch + 1;
  s->flags = 0;
  Impl::set_to(*s, to);  // the timer fields now hold `to`; pending entries become orphans
  m.add_guard(name, guard);
  m.high_water = std::max(m.high_water, s->epoch);
  m.reserve_for_worker(*s, to_worker);
  return Outcome{Refusal::none, name, m.view(*s), {}};
}

Outcome LeaseTable::complete_release(NameId name, SandboxId from, Epoch epoch,
                                     std::int64_t now_ns) {
  impl_->clock(now_ns);
  Impl& m = *impl_;
  Slot* s = m.find(name);
  if (s == nullptr) return m.refuse(Refusal::unknown_name, name, s);
  if (s->phase == LockPhase::free && (s->flags & kFlagFresh) != 0 && s->epoch == epoch &&
      !s->owner.is_nil())
    return Outcome{Refusal::none, name, m.view(*s), {}};  // idempotent retry
  if (s->phase != LockPhase::transferring) return m.refuse(Refusal::not_transferring, name, s);
  if (s->owner != from) return m.refuse(Refusal::not_holder, name, s);
  if (s->epoch != epoch) return m.refuse(Refusal::stale_epoch, name, s);
  if (const TransferGuard* g = m.pending_guard(name); g != nullptr && now_ns < g->bound_ns)
    return m.refuse(Refusal::lock_delay, name, s);  // `from` may still run
  const SandboxId to = Impl::to_of(*s);
  return Outcome{Refusal::none, name, m.enter_free(s, s->epoch, true, to, 0, now_ns), {}};
}

// ---- coordinator actions ------------------------------------------------------------------

Outcome LeaseTable::revoke(NameId name, std::int64_t now_ns, Epoch expected_epoch, bool force) {
  impl_->clock(now_ns);
  Impl& m = *impl_;
  Slot* s = m.find(name);
  if (now_ns < 0) return m.refuse(Refusal::bad_request, name, s);
  if (s == nullptr) return m.refuse(Refusal::unknown_name, name, s);
  if (expected_epoch != 0 && s->epoch != expected_epoch) return m.refuse(Refusal::stale_epoch, name, s);
  if (s->phase == LockPhase::free && !force) return m.refuse(Refusal::not_held, name, s);
  if (s->epoch == kEpochMax) return m.refuse(Refusal::epoch_exhausted, name, s);
  const std::int64_t lock_delay = m.config.lock_delay_ns;
  PendingRevoke rv;
  std::int64_t bound = 0;
  switch (s->phase) {
    case LockPhase::held:
      // Until the old grant would have ended by lockd's own rules, or its worker confirms.
      rv = {true, s->worker, 1};
      bound = m.preemptible() ? m.liveness_bound(now_ns) : add_sat(s->time_ns, lock_delay);
      break;
    case LockPhase::acquiring:  // nobody runs it on a worker lockd knows; its deadline ends it
      rv = {true, 0, 0};
      bound = s->time_ns;
      break;
    case LockPhase::transferring: {  // `from` may still run while the transfer guard is pending
      const auto g = m.guards.find(name);
      if (g == m.guards.end() || m.config.ablate_transfer_guard) {  // no guard known: its lease
        rv = {true, 0, 0};                                           // ended at most max_ttl ago
        bound = add_sat(now_ns, add_sat(m.config.max_ttl_ns, lock_delay));
      } else if (!g->second.lifted && g->second.bound_ns > now_ns) {
        const std::uint16_t widx = g->second.worker.is_nil() ? 0 : m.intern_worker(g->second.worker);
        rv = {true, widx, 2};  // the outgoing grant's epoch: epoch - 1, i.e. (epoch + 1) - 2
        bound = g->second.bound_ns;
      }
      break;
    }
    case LockPhase::free:  // --force: burn an epoch; a pending lock-delay or revoke stays
      if ((s->flags & kFlagRevoking) != 0) {
        const Epoch delta = Impl::revoked_delta(*s);
        rv = {true, s->worker, delta == 0 ? 0 : delta + 1};
      }
      bound = (s->flags & kFlagReserveClock) != 0 ? 0 : s->time_ns;
      break;
  }
  LockState after = m.enter_free(s, s->epoch + 1, true, {}, bound, now_ns, rv);
  if (after.revoke_pending && after.lock_delay_until_ns <= now_ns) {
    s = m.find(name);  // the bound already passed: nothing is pending
    after = m.enter_free(s, after.epoch, true, {}, 0, now_ns);
  }
  return Outcome{Refusal::none, name, after, {}};
}

Outcome LeaseTable::confirm_kill(NameId name, WorkerId worker, Epoch epoch, std::int64_t now_ns) {
  impl_->clock(now_ns);
  Impl& m = *impl_;
  Slot* s = m.find(name);
  if (worker.is_nil() || now_ns < 0) return m.refuse(Refusal::bad_request, name, s);
  if (s == nullptr) return m.refuse(Refusal::unknown_name, name, s);
  if (s->phase == LockPhase::transferring) {  // the transfer guard of the outgoing grant
    const auto g = m.guards.find(name);
    if (g == m.guards.end() || g->second.lifted) return Outcome{Refusal::none, name, m.view(*s), {}};
    if (g->second.worker.is_nil() || g->second.worker != worker) return m.refuse(Refusal::not_holder, name, s);
    if (g->second.old_epoch != epoch) return m.refuse(Refusal::stale_epoch, name, s);
    g->second.lifted = true;
    return Outcome{Refusal::none, name, m.view(*s), {}};
  }
  if (s->phase != LockPhase::free || (s->flags & kFlagRevoking) == 0)
    return Outcome{Refusal::none, name, m.view(*s), {}};  // nothing pending (any more)
  const LockState st = m.view(*s);
  if (st.revoked_worker.is_nil() || st.revoked_worker != worker)
    return m.refuse(Refusal::not_holder, name, s);
  if (st.revoked_epoch != epoch) return m.refuse(Refusal::stale_epoch, name, s);
  const bool fresh = (s->flags & kFlagFresh) != 0;
  return Outcome{Refusal::none, name, m.enter_free(s, s->epoch, fresh, s->owner, 0, now_ns), {}};
}

Outcome LeaseTable::reassign(std::string_view text, SandboxId to, std::int64_t now_ns, WorkerId worker) {
  impl_->clock(now_ns);
  Impl& m = *impl_;
  if (!validate_new_name(text).ok()) return Outcome{Refusal::invalid_name, {}, m.absent(), {}};
  const NameId name = name_id_of(text);
  Slot* s = m.find(name);
  if (to.is_nil() || now_ns < 0) return m.refuse(Refusal::bad_request, name, s);
  const std::uint32_t fp = name_fingerprint_of(text);
  if (s != nullptr && s->fingerprint != fp) return m.refuse(Refusal::name_collision, name, s);
  if (s != nullptr && s->phase != LockPhase::free) return m.refuse(Refusal::not_free, name, s);
  if (s == nullptr && m.count >= m.config.capacity) return m.refuse(Refusal::table_full, name, s);
  const Epoch current = s != nullptr ? s->epoch : m.high_water;
  if (current == kEpochMax) return m.refuse(Refusal::epoch_exhausted, name, s);
  if (s == nullptr) s = m.insert(name, fp);
  PendingRevoke rv;
  if ((s->flags & kFlagRevoking) != 0) {
    const Epoch delta = Impl::revoked_delta(*s);
    rv = {true, s->worker, delta == 0 ? 0 : delta + 1};
  }
  const std::int64_t delay_until = (s->flags & kFlagReserveClock) != 0 ? 0 : s->time_ns;
  m.enter_free(s, current + 1, true, to, delay_until, now_ns, rv);  // fresh: never erased
  m.reserve_for_worker(*s, worker);
  return Outcome{Refusal::none, name, m.view(*s), {}};
}

Outcome LeaseTable::preempt(NameId name, SandboxId holder, Epoch epoch,
                            bool worker_reports_not_running, std::int64_t now_ns) {
  impl_->clock(now_ns);
  Impl& m = *impl_;
  Slot* s = m.find(name);
  if (!m.preemptible()) return m.refuse(Refusal::wrong_mode, name, s);
  if (now_ns < 0) return m.refuse(Refusal::bad_request, name, s);
  if (s == nullptr) return m.refuse(Refusal::unknown_name, name, s);
  switch (s->phase) {
    case LockPhase::free: return m.refuse(Refusal::not_held, name, s);
    case LockPhase::acquiring: return m.refuse(Refusal::acquiring, name, s);
    case LockPhase::transferring: return m.refuse(Refusal::transferring, name, s);
    case LockPhase::held: break;
  }
  if (s->owner != holder) return m.refuse(Refusal::not_holder, name, s);
  if (s->epoch != epoch) return m.refuse(Refusal::stale_epoch, name, s);
  const bool lapsed = now_ns >= m.workers[s->worker].alive_until_ns;
  if (!lapsed && !worker_reports_not_running) return m.refuse(Refusal::worker_alive, name, s);
  const std::int64_t delay_until =
      m.config.lock_delay_ns > 0 ? add_sat(now_ns, m.config.lock_delay_ns) : 0;
  return Outcome{Refusal::none, name, m.enter_free(s, s->epoch, false, {}, delay_until, now_ns), {}};
}

// ---- queries ------------------------------------------------------------------------------

LockState LeaseTable::state(NameId name) const noexcept {
  const Slot* s = impl_->find(name);
  return s != nullptr ? impl_->view(*s) : impl_->absent();
}

bool LeaseTable::may_mutate(NameId name, SandboxId sandbox, Epoch epoch,
                            std::int64_t now_ns) const noexcept {
  return leasehold::may_mutate(state(name), sandbox, epoch, now_ns);
}

bool LeaseTable::token_authorized(const Token& token, std::int64_t now_ns) const noexcept {
  return leasehold::may_mutate(state(token.name), token.holder, token.epoch, now_ns);
}

bool LeaseTable::valid_fence(NameId name, Epoch epoch) const noexcept {
  return leasehold::valid_fence(state(name), epoch);
}

std::size_t LeaseTable::size() const noexcept { return impl_->count; }
std::size_t LeaseTable::held() const noexcept { return impl_->held; }
std::string_view LeaseTable::sim_ablation() noexcept {
#if LEASEHOLD_SIM_ABLATE_REFRESH_OWNER
  return "refresh_owner";
#elif LEASEHOLD_SIM_ABLATE_ACQUIRING_EXPIRY
  return "acquiring_expiry";
#elif LEASEHOLD_SIM_ABLATE_PREEMPT_LIVE_WORKER
  return "preempt_live_worker";  // a LockService ablation; the table is built with it
#elif LEASEHOLD_SIM_ABLATE_ANSWER_BEFORE_DURABLE
  return "answer_before_durable";  // a LockService ablation too
#else
  return "";
#endif
}

std::int64_t LeaseTable::next_due_ns() const noexcept {
  return impl_->timers.empty() ? kNoExpiry : impl_->timers.front().due_ns;
}
Epoch LeaseTable::epoch_high_water() const noexcept { return impl_->high_water; }

std::size_t LeaseTable::memory_bytes() const noexcept {
  const Impl& m = *impl_;
  return sizeof(Impl) + m.rec_region.bytes() + m.index_region.bytes() +
         m.timers.capacity() * sizeof(TimerEntry) + m.workers.capacity() * sizeof(WorkerEntry) +
         m.worker_index.size() * (sizeof(WorkerId) + 2 * sizeof(void*) + 8) +
         m.worker_index.bucket_count() * sizeof(void*);
}

void LeaseTable::for_each(const std::function<void(NameId, const LockState&)>& fn) const {
  const Impl& m = *impl_;
  for (std::size_t i = 0; i < m.count; ++i) {
    fn(m.recs[i].name, m.view(m.recs[i]));
  }
}

// ---- restart ------------------------------------------------------------------------------

DurableSnapshot LeaseTable::export_durable() const { return export_durable(0); }

DurableSnapshot LeaseTable::export_durable(std::int64_t now_ns) const {
  const Impl& m = *impl_;
  DurableSnapshot snap;
  snap.epoch_high_water = m.high_water;
  for (std::size_t i = 0; i < m.count; ++i) {
    const Slot& s = m.recs[i];
    if (s.phase == LockPhase::acquiring) continue;
    DurableRecord r;
    r.name = s.name;
    r.name_fingerprint = s.fingerprint;
    r.phase = s.phase;
    r.epoch = s.epoch;
    switch (s.phase) {
      case LockPhase::held:
        if (now_ns >= s.time_ns) continue;  // expired at now_ns: Free, the same as unknown
        r.owner = s.owner;
        r.worker = m.workers[s.worker].id;
        break;
      case LockPhase::transferring:
        r.owner = s.owner;
        r.to = Impl::to_of(s);
        if (const TransferGuard* g = m.pending_guard(s.name)) r.worker = g->worker;
        break;
      case LockPhase::free: {
        r.to = s.owner;
        r.epoch_fresh = (s.flags & kFlagFresh) != 0;
        const bool revoking = (s.flags & kFlagRevoking) != 0;
        if (!r.epoch_fresh && r.to.is_nil() && !revoking) continue;  // only a lock-delay
        if (revoking) {
          const LockState v = m.view(s);
          // An unknown revoked epoch is stored as epoch - 1 with no worker: only the bound lifts it.
          r.revoked_epoch = v.revoked_epoch != 0 ? v.revoked_epoch : s.epoch - 1;
          r.worker = v.revoked_worker;
          if (r.revoked_epoch == 0) r.revoked_epoch = s.epoch;  // epoch 1 revoked from nothing
        }
        break;
      }
      case LockPhase::acquiring:
        break;
    }
    snap.records.push_back(r);
  }
  return snap;
}

Status LeaseTable::restore(const DurableSnapshot& snap, std::int64_t now_ns) {
  if (impl_->count != 0)
    return Status::invalid("restore needs an empty table; this one has " + std::to_string(impl_->count) + " records");
  if (now_ns < 0) return Status::invalid("restore time " + std::to_string(now_ns) + " ns is negative");
  auto fail = [this](std::size_t k, const std::string& what) {
    impl_ = std::make_unique<Impl>(impl_->config);
    return Status{Errc::corrupt, "durable record " + std::to_string(k) + ": " + what};
  };
  Impl& m = *impl_;
  if (snap.epoch_high_water > kEpochMax)
    return Status{Errc::corrupt, "epoch high-water " + std::to_string(snap.epoch_high_water) +
                                     " is above the epoch limit " + std::to_string(kEpochMax) + " (2^63-1)"};
  Epoch high = snap.epoch_high_water;
  for (const DurableRecord& r : snap.records) high = std::max(high, r.epoch);
  m.high_water = high;
  for (std::size_t k = 0; k < snap.records.size(); ++k) {
    const DurableRecord& r = snap.records[k];
    if (r.name.is_nil()) return fail(k, "nil name id");
    if (r.name_fingerprint == 0) return fail(k, "name fingerprint is 0");
    if (r.epoch == 0) return fail(k, "epoch 0 (epochs start at 1)");
    if (r.epoch > kEpochMax)
      return fail(k, "epoch " + std::to_string(r.epoch) + " is above the epoch limit 2^63-1");
    if (m.find(r.name) != nullptr) return fail(k, "name " + r.name.str() + " appears twice");
    switch (r.phase) {
      case LockPhase::acquiring: continue;  // dropped; its epoch stays burned (in `high`)
      case LockPhase::free:
        if (!r.epoch_fresh && r.to.is_nil() && r.revoked_epoch == 0) continue;  // as unknown
        if (r.revoked_epoch > r.epoch) return fail(k, "revoked epoch above the record's epoch");
        break;
      case LockPhase::held:
        if (r.owner.is_nil() || r.worker.is_nil()) return fail(k, "held with a nil owner or worker");
        break;
      case LockPhase::transferring:
        if (r.owner.is_nil() || r.to.is_nil() || r.owner == r.to)
          return fail(k, "transferring needs distinct non-nil from and to");
        if (r.epoch < 2) return fail(k, "transferring at epoch < 2 has no outgoing epoch");
        break;
      default:
        return fail(k, "phase " + std::to_string(static_cast<int>(r.phase)) + " is unknown");
    }
    if (m.count >= m.config.capacity)
      return fail(k, "more records than the capacity " + std::to_string(m.config.capacity));
    Slot* s = m.insert(r.name, r.name_fingerprint);
    switch (r.phase) {
      case LockPhase::held: {
        const std::uint16_t widx = m.intern_worker(r.worker);
        if (widx == 0) return fail(k, "more than kWorkersMax workers");
        // The lease (and, preemptible, the worker's liveness) counts as refreshed at the
        // restart, for at most the time the restart rule left it (restore_left_ns).
        const std::int64_t ttl = r.restore_left_ns < 0 ? m.config.max_ttl_ns
                                                       : std::min(r.restore_left_ns, m.config.max_ttl_ns);
        const std::int64_t live = r.restore_left_ns < 0 ? m.config.worker_liveness_ttl_ns
                                                        : std::min(r.restore_left_ns, m.config.worker_liveness_ttl_ns);
        WorkerEntry& w = m.workers[widx];
        w.alive_until_ns = std::max(w.alive_until_ns, add_sat(now_ns, live));
        m.enter_held(*s, r.owner, widx, r.epoch, m.expiry_at(now_ns, add_sat(ttl, std::max<std::int64_t>(r.restore_spread_ns, 0))));
        break;
      }
      case LockPhase::transferring: {
        s->phase = LockPhase::transferring;
        s->owner = r.owner;
        s->epoch = r.epoch;
        Impl::set_to(*s, r.to);
        // Times are not durable: the guard waits as a restored pending revoke does.
        const bool live = m.preemptible() && !r.worker.is_nil();
        m.add_guard(r.name, TransferGuard{r.worker, r.epoch - 1,
                                          live ? m.liveness_bound(now_ns)
                                               : add_sat(now_ns, add_sat(m.config.max_ttl_ns, m.config.lock_delay_ns)),
                                          m.config.ablate_transfer_guard});
        m.reserve_for_worker(*s, r.to_worker);
        break;
      }
      case LockPhase::free: {
        PendingRevoke rv;
        std::int64_t bound = 0;
        if (r.revoked_epoch != 0) {
          // Times are not durable: a pending revoke waits a full TTL from the restart, or
          // (preemptible mode) its worker's liveness, counted from now like a holder's.
          std::uint16_t widx = 0;
          if (!r.worker.is_nil()) {
            widx = m.intern_worker(r.worker);
            if (widx == 0) return fail(k, "more than kWorkersMax workers");
            m.heartbeat(widx, now_ns);
          }
          rv = {true, widx, r.epoch - r.revoked_epoch};
          bound = m.preemptible() && widx != 0
                      ? m.liveness_bound(now_ns)
                      : add_sat(now_ns, add_sat(m.config.max_ttl_ns, m.config.lock_delay_ns));
        }
        m.enter_free(s, r.epoch, r.epoch_fresh, r.to, bound, now_ns, rv);
        if (Slot* kept = m.find(r.name); kept != nullptr) m.reserve_for_worker(*kept, r.to_worker);
        break;
      }
      case LockPhase::acquiring:
        break;
    }
  }
  m.clock(now_ns);
  return Status{};
}

}  // namespace leasehold
