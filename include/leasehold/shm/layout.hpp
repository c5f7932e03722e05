// leasehold/shm: the byte layout of the shared-memory epoch table.
//
// Modelled on Aeron's CnC file (DESIGN.md "The shared-memory epoch table"): one file, mapped
// read-write by the single writer (the supervisor) and read-only by every sandbox runtime.
// Optimised for the reader's hot check: a slot's first word is the *check word*, so
// `check(slot, epoch)` is one acquire load and a compare, with no syscall and no lock.
//
//   offset 0      Header          (128 B)  versioned; `ready` is stored LAST with release
//   offset 128    WriterLiveness  ( 64 B)  the writer heartbeat, alone in its cache line
//   offset 192    Stats           (1792 B) histograms + counters, written by the supervisor
//   offset 4096   Slot[slot_count] (64 B each, cache-line aligned)
//
// Signed tokens are not in this table (every sandbox of the worker maps it, and a token is a
// bearer capability): each sandbox has its own token channel (TokenChannelHeader below).
//
// Every field that is read while the writer may write it is a lock-free std::atomic, so the
// layout is well defined across processes (lock-free atomics are address-free, [atomics.lockfree]).
// All times are CLOCK_BOOTTIME nanoseconds (DESIGN.md "Time"); `_ns` is the unit suffix.
#pragma once

#include "leasehold/lease/code_table.hpp"
#include "leasehold/lease/types.hpp"

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace leasehold::shm {

inline constexpr std::uint64_t kMagic = 0x31454C4254534C48ULL;  // "HLSTBLE1" little-endian
/// 2: a token area after the slots. 3: no token area (tokens moved to each sandbox's own token
/// channel, so no sandbox reads a sibling's); the header bytes 88..123 are reserved again.
inline constexpr std::uint16_t kLayoutMajor = 3;  ///< incompatible changes; readers refuse a newer major
inline constexpr std::uint16_t kLayoutMinor = 0;  ///< additive changes; readers accept a newer minor
inline constexpr std::size_t kCacheLineBytes = 64;
inline constexpr std::size_t kSlotBytes = 64;
inline constexpr std::size_t kSlotsOffset = 4096;       ///< slots start on a page boundary
inline constexpr std::uint32_t kSlotCountMax = 1u << 20;  ///< bound on slots per table (64 MiB)
inline constexpr std::uint32_t kReady = 1;              ///< Header::ready once the table is usable
inline constexpr std::size_t kNamePrefixBytes = 6;      ///< printable name prefix kept in a slot

/// The check word: holds the epoch while the slot's lease is valid. A revoke sets
/// kRevokedBit (sticky until the slot is freed), so epochs must be in [1, 2^63).
/// 0 means "no epoch published" (claimed, cooling or free).
inline constexpr std::uint64_t kRevokedBit = 1ULL << 63;
inline constexpr std::uint64_t kEpochMax = kRevokedBit - 1;
// The vocabulary's limit: lockd refuses (epoch_exhausted) every grant this table could not publish.
static_assert(kEpochMax == leasehold::kEpochMax, "lease/ and the shm check word disagree on the epoch limit");

/// A caller's epoch can only match a check word if it lies in [1, 2^63).
constexpr bool epoch_in_range(std::uint64_t epoch) noexcept {
  return static_cast<std::int64_t>(epoch) > 0;
}

/// Slot lifecycle (writer view). The revoked condition is not a state: it is the check
/// word's kRevokedBit, because the real-time thread sets it without the seqlock.
enum class SlotState : std::uint8_t {
  free = 0,       ///< never used, or cooled down
  claimed = 1,    ///< owned by a sandbox, no epoch published yet
  published = 2,  ///< {name, epoch, valid_until} published
  cooling = 3,    ///< freed; not reusable until slot_cooldown_ns has passed (no ABA)
};
/// Every SlotState, for the encoding tables' completeness checks (the C ABI's LEASEHOLD_SLOT_*).
inline constexpr std::array<SlotState, 4> kSlotStates{SlotState::free, SlotState::claimed,
                                                      SlotState::published, SlotState::cooling};
namespace detail {
// No default: -Wswitch (an error in this build) names a state without a case here.
constexpr bool is_slot_state(SlotState s) noexcept {
  switch (s) {
    case SlotState::free:
    case SlotState::claimed:
    case SlotState::published:
    case SlotState::cooling: return true;
  }
  return false;
}
}  // namespace detail
// Every state is in kSlotStates, so a new one reaches every table that `covers(kSlotStates)`.
static_assert(lists_every(kSlotStates, detail::is_slot_state), "a SlotState is missing from kSlotStates");

struct Header {
  std::uint64_t magic;                 // kMagic
  std::uint16_t layout_major;          // kLayoutMajor
  std::uint16_t layout_minor;          // kLayoutMinor
  std::uint32_t slots_offset;          // kSlotsOffset
  std::uint32_t slot_count;            // number of slots
  std::uint32_t slot_bytes;            // kSlotBytes
  std::uint64_t total_bytes;           // kSlotsOffset + slot_count * kSlotBytes (table_bytes)
  std::int32_t writer_pid;             // getpid() of the writer
  std::int32_t clock_id;               // CLOCK_BOOTTIME: the clock of every *_ns field
  std::uint64_t writer_start_ns;       // when the writer created this incarnation
  std::uint64_t incarnation;           // +1 each time a dead writer's table is replaced
  std::uint64_t liveness_timeout_ns;   // heartbeat older than this = writer dead
  std::uint64_t slot_cooldown_ns;      // a freed slot is not reused for this long
  std::uint32_t stats_offset;          // offsetof Stats
  std::uint32_t liveness_offset;       // offsetof WriterLiveness
  std::atomic<std::uint64_t> closed_ns;  // 0, or when the writer closed the table cleanly
  std::uint8_t reserved[36];           // zero (layout 2 kept its token area's offset here)
  std::atomic<std::uint32_t> ready;    // kReady, stored LAST with memory_order_release
};

/// The writer heartbeat, alone in its cache line so the writer's stores do not
/// invalidate the lines that hold slots or the header.
struct alignas(kCacheLineBytes) WriterLiveness {
  std::atomic<std::uint64_t> heartbeat_ns;  // last heartbeat (store release); 0 = closed
  std::atomic<std::uint64_t> heartbeats;    // count, for tools
};

/// A log2-bucket histogram of u64 values: bucket b counts values v with bit_width(v) == b
/// (bucket 0 counts v == 0, bucket 64 values >= 2^63). Recording is wait-free: relaxed
/// fetch_add (one `lock xadd` each on x86), no allocation, no syscall.
inline constexpr std::size_t kHistogramBuckets = 65;
struct alignas(kCacheLineBytes) Histogram {
  std::atomic<std::uint64_t> count;
  std::atomic<std::uint64_t> sum;
  std::atomic<std::uint64_t> max;  // single writer per histogram: load+store, not CAS
  std::atomic<std::uint64_t> buckets[kHistogramBuckets];
};

struct alignas(kCacheLineBytes) Counters {
  std::atomic<std::uint64_t> kills;
  std::atomic<std::uint64_t> heartbeat_failures;
  std::atomic<std::uint64_t> revokes;
  std::atomic<std::uint64_t> publishes;
  std::atomic<std::uint64_t> claims_refused_full;
};

struct Stats {
  Histogram rt_lateness_ns;     // rt-loop wake-up lateness (rt thread)
  Histogram heartbeat_rtt_ns;   // heartbeat round-trip time (io thread)
  Histogram kill_latency_ns;    // kill deadline -> death confirmed (rt thread)
  Counters counters;
};

/// One slot, one cache line. The seqlock `seq` guards the descriptive fields (generation,
/// sandbox, name, state) that only the io thread writes. The check word and valid_until_ns
/// are read outside the seqlock by the hot checks (see table.hpp "Memory ordering").
struct alignas(kCacheLineBytes) Slot {
  std::atomic<std::uint64_t> check_word;      // epoch | kRevokedBit | 0
  std::atomic<std::uint64_t> valid_until_ns;  // lease deadline, CLOCK_BOOTTIME
  std::atomic<std::uint32_t> seq;             // seqlock: odd while the writer updates
  std::atomic<std::uint32_t> generation;      // +1 at every claim
  std::atomic<std::uint64_t> sandbox_hi;
  std::atomic<std::uint64_t> sandbox_lo;
  std::atomic<std::uint64_t> name_hi;
  std::atomic<std::uint64_t> name_lo;
  std::atomic<std::uint64_t> info;  // byte0 state, byte1 name length, bytes2..7 name prefix
};

/// A sandbox's token channel: a small sealed memfd of its own, written by the supervisor and
/// inherited read-only by that sandbox alone (LEASEHOLD_TOKENS=4), holding the signed token of
/// the sandbox's current grant (wire/token.hpp encoding, from lockd's Grant), so the sandbox can
/// hand it to a resource with its writes. No other sandbox maps it: a token is a bearer
/// capability, and a sibling that read one could write as its holder.
///
///   offset 0    TokenChannelHeader (64 B)  versioned; `ready` stored LAST with release
///   offset 64   TokenRecord        (192 B)
///   file size   kTokenChannelBytes (one page)
inline constexpr std::uint64_t kTokenChannelMagic = 0x314E4B5444484C48ULL;  // "HLDTKN1" little-endian
inline constexpr std::uint16_t kTokenChannelMajor = 1;  ///< readers refuse another major
inline constexpr std::uint16_t kTokenChannelMinor = 0;
inline constexpr std::size_t kTokenChannelBytes = 4096;
inline constexpr std::size_t kTokenChannelRecordOffset = 64;
struct TokenChannelHeader {
  std::uint64_t magic;               // kTokenChannelMagic
  std::uint16_t major;               // kTokenChannelMajor
  std::uint16_t minor;               // kTokenChannelMinor
  std::uint32_t record_bytes;        // kTokenRecordBytes
  std::uint64_t record_offset;       // kTokenChannelRecordOffset
  std::uint8_t reserved[36];
  std::atomic<std::uint32_t> ready;  // kReady, stored LAST with memory_order_release
};

/// The token record of a channel. Guarded by its own seqlock (`seq`, odd while the io thread
/// writes): a reader copies it and re-reads `seq`, and never returns a torn token. `epoch` names
/// the grant it belongs to; a reader uses the token only while it equals the epoch it checks.
/// Written before the table's check word shows the epoch, so a sandbox that sees epoch E finds
/// E's token. The token proves nothing by itself being here: a resource verifies its signature
/// with lockd's public key.
inline constexpr std::size_t kTokenRecordBytes = 192;
inline constexpr std::size_t kTokenRecordWords = 18;  ///< 144 bytes: room for token::kTokenBytes (140)
struct alignas(kCacheLineBytes) TokenRecord {
  std::atomic<std::uint32_t> seq;     // seqlock
  std::atomic<std::uint32_t> length;  // token bytes (0: none)
  std::atomic<std::uint64_t> epoch;   // the epoch of the grant the token is for
  std::atomic<std::uint64_t> words[kTokenRecordWords];  // token bytes, 8 per word, little-endian
};

static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);
static_assert(sizeof(Header) == 128);
static_assert(offsetof(Header, magic) == 0);
static_assert(offsetof(Header, layout_major) == 8);
static_assert(offsetof(Header, slot_count) == 16);
static_assert(offsetof(Header, total_bytes) == 24);
static_assert(offsetof(Header, writer_pid) == 32);
static_assert(offsetof(Header, clock_id) == 36);
static_assert(offsetof(Header, writer_start_ns) == 40);
static_assert(offsetof(Header, incarnation) == 48);
static_assert(offsetof(Header, liveness_timeout_ns) == 56);
static_assert(offsetof(Header, slot_cooldown_ns) == 64);
static_assert(offsetof(Header, closed_ns) == 80);
static_assert(sizeof(TokenRecord) == kTokenRecordBytes);
static_assert(sizeof(TokenChannelHeader) == kTokenChannelRecordOffset);
static_assert(offsetof(TokenChannelHeader, ready) == 60);
static_assert(kTokenChannelRecordOffset + kTokenRecordBytes <= kTokenChannelBytes);
static_assert(offsetof(Header, ready) == 124);
static_assert(sizeof(WriterLiveness) == kCacheLineBytes);
static_assert(sizeof(Histogram) == 9 * kCacheLineBytes);
static_assert(sizeof(Counters) == kCacheLineBytes);
static_assert(sizeof(Stats) == 28 * kCacheLineBytes);
static_assert(sizeof(Slot) == kSlotBytes);
static_assert(offsetof(Slot, check_word) == 0);  // the C ABI's inline check relies on this
static_assert(offsetof(Slot, valid_until_ns) == 8);
static_assert(offsetof(Slot, seq) == 16);
static_assert(offsetof(Slot, generation) == 20);
static_assert(offsetof(Slot, sandbox_hi) == 24);
static_assert(offsetof(Slot, name_hi) == 40);
static_assert(offsetof(Slot, info) == 56);

inline constexpr std::size_t kLivenessOffset = sizeof(Header);
inline constexpr std::size_t kStatsOffset = kLivenessOffset + sizeof(WriterLiveness);
static_assert(kStatsOffset + sizeof(Stats) <= kSlotsOffset);
static_assert(kSlotsOffset % kCacheLineBytes == 0);

constexpr std::uint64_t table_bytes(std::uint32_t slot_count) noexcept {
  return kSlotsOffset + static_cast<std::uint64_t>(slot_count) * kSlotBytes;
}

}  // namespace leasehold::shm
