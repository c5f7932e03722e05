// leasehold/shm: the shared-memory epoch table — writer (supervisor) and reader (runtimes, tools).
//
// DESIGN.md "The shared-memory epoch table"; layout in shm/layout.hpp. One writer process per
// table; inside it, two writer threads with disjoint duties:
//
//   io thread (may allocate, may syscall):  create, claim, publish, extend, free, close, remove
//   rt thread (real-time safe: wait-free, no allocation, no syscall, no lock):
//                                           revoke, heartbeat, record_* (stats)
//
// Memory ordering (every load/store below names its order; nothing is implied):
//  * Header fields are plain: written before `ready` is stored with release; a reader loads
//    `ready` with acquire before it reads any of them.
//  * check word (Slot::check_word): the io thread moves it with compare-and-swap only —
//    0 -> E (publish), E -> 0 (before publishing a new epoch over E), and stores 0 at
//    claim/free. The rt thread's revoke is one `fetch_or(kRevokedBit)`: wait-free, and *sticky*:
//    every io CAS expects a value without the bit, so a publish that races a revoke fails with
//    TableErrc::revoked and can never resurrect the slot; extend never touches the check word.
//    Only free() (after the sandbox is dead) clears the bit.
//  * valid_until_ns is stored with release after the check word left the old epoch, and before
//    the CAS that installs the new one; check_deadline reloads the check word after loading
//    valid_until_ns (acquire), so a deadline is never paired with another epoch.
//  * The descriptive fields (generation, sandbox, name, state) are guarded by a seqlock
//    (Slot::seq, odd while the io thread writes). Fence-free: the io thread stores seq+1
//    (relaxed), then every field with release, then seq+2 with release; snapshot() loads seq
//    with acquire, every field with acquire, then seq again, retries at most
//    kSnapshotRetriesMax times and never returns a torn record.
//  * heartbeat_ns is stored with release, loaded with acquire. 0 means "closed".
//
// Liveness: the hot `check` has no clock, so it cannot see a dead writer or an expired
// valid_until. Runtimes call `check_deadline` (one vDSO clock read more) before side effects,
// or at least periodically; it fails when the writer's heartbeat is older than
// liveness_timeout_ns, when the table is closed, and when valid_until_ns has passed. A heartbeat
// stored after the reader's clock read is ahead of it: age 0 (the writer is alive), unless it is
// more than liveness_timeout_ns ahead (another boot, or corruption): then no valid heartbeat.
//
// Slot reuse (no ABA): free() puts a slot in `cooling`; claim() takes free slots in FIFO order
// of their free time and only once slot_cooldown_ns has passed; each claim bumps the slot's
// generation, which snapshots carry so tools never confuse two sandboxes in one slot.
#pragma once

#include "leasehold/lease/clock.hpp"
#include "leasehold/lease/result.hpp"
#include "leasehold/lease/types.hpp"
#include "leasehold/shm/layout.hpp"

#include <boost/interprocess/mapped_region.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace leasehold::shm {

/// Why a table operation failed. Stable values (the C ABI maps them to LEASEHOLD_E*).
enum class TableErrc : std::uint8_t {
  ok = 0,
  missing,        ///< no table at the location
  truncated,      ///< the file is smaller than its header says
  bad_magic,      ///< not a leasehold table
  newer_major,    ///< written by a newer, incompatible layout
  older_major,    ///< written by an older, incompatible layout
  bad_geometry,   ///< header fields are inconsistent (slot size, offsets, slot count, clock)
  not_ready,      ///< the writer has not finished creating it
  writer_alive,   ///< create refused: a live writer owns the table
  exists,         ///< create raced another creator
  table_full,     ///< no slot is free (or all free slots are still cooling down)
  bad_slot,       ///< slot index out of range
  wrong_state,    ///< the slot is not in the state the operation needs
  revoked,        ///< the slot was revoked; only free() clears that
  bad_epoch,      ///< epoch outside [1, 2^63)
  bad_argument,   ///< malformed option (location, slot count, timeout, ...)
  io_error,       ///< the OS refused (permission, ENOSPC, ...): the message has errno text
  busy,           ///< the seqlock stayed busy for kSnapshotRetriesMax attempts
  untrusted,      ///< open by path: the file is another user's, or group/others may write it
};
std::string_view to_string(TableErrc e) noexcept;

/// A failed create/open, with a message that names the location and the problem.
class TableError : public std::runtime_error {
 public:
  TableError(TableErrc code, const std::string& message);
  TableErrc code() const noexcept { return code_; }

 private:
  TableErrc code_;
};

/// Where a table lives. Text starting with '/' that contains a second '/' is a filesystem
/// path (e.g. /dev/shm/leasehold-w1, /run/leasehold/table); anything else is a POSIX shm name
/// ("leasehold" or "/leasehold", which Boost.Interprocess places in /dev/shm).
///
/// Text of decimal digits only is an inherited file descriptor (what the supervisor gives an
/// isolated sandbox: LEASEHOLD_SHM=3, a read-only descriptor of a sealed memfd, which it may map
/// but never write, grow, shrink or map writable); readers only.
///
/// "memfd:NAME" (writers only) is an anonymous sealed memfd (memfd_create, NAME shows in
/// /proc/<pid>/fd): no path anyone could open, truncate or replace. Readers reach it through a
/// descriptor (TableWriter::reopen_read_only) or, from outside, /proc/<writer pid>/fd/<N>
/// (TableWriter::reader_location).
struct Location {
  std::string text;  ///< as given
  bool is_path = false;
  bool is_fd = false;
  bool is_memfd = false;
  int fd = -1;       ///< is_fd: the descriptor
  std::string name;  ///< shm name without leading '/', the path, or the memfd's name
};
inline constexpr std::string_view kMemfdPrefix = "memfd:";
/// Throws TableError(bad_argument) for empty text, '/'-only, or shm names with '/' inside.
Location parse_location(std::string_view text);
/// The location in $LEASEHOLD_SHM (what the supervisor puts in every sandbox's env);
/// throws TableError(bad_argument) when unset or empty.
std::string location_from_env();
inline constexpr const char* kLocationEnv = "LEASEHOLD_SHM";

inline constexpr std::uint32_t kSnapshotRetriesMax = 64;

/// The longest liveness timeout a reader takes from a table header (10 s): a reader clamps a
/// larger header value to it, so a corrupt or forged header (e.g. UINT64_MAX) cannot make a dead
/// writer's stale heartbeat count as alive for longer. Writers refuse a larger timeout
/// (bad_argument). The supervisor uses min(1 s, kill_after).
inline constexpr std::uint64_t kLivenessTimeoutMaxNs = 10'000'000'000ULL;
/// The liveness timeout a reader applies: the header's value, at most kLivenessTimeoutMaxNs.
constexpr std::uint64_t clamp_liveness_timeout_ns(std::uint64_t header_ns) noexcept {
  return header_ns < kLivenessTimeoutMaxNs ? header_ns : kLivenessTimeoutMaxNs;
}

struct TableOptions {
  std::string location;
  std::uint32_t slot_count = 1024;                     ///< 1..kSlotCountMax
  std::uint64_t liveness_timeout_ns = 1'000'000'000;   ///< heartbeat age that means "dead"
  std::uint64_t slot_cooldown_ns = 2'000'000'000;      ///< freed slot unused for this long
  unsigned mode = 0640;  ///< file mode (umask does not apply; a memfd keeps its read bits only)
  long group = -1;                                     ///< gid to chown to; -1 keeps ours
  /// memfd tables: seal against shrink, grow and any future writable mapping or write(2)
  /// (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE, then F_SEAL_SEAL) once the writer holds
  /// its mapping. false is the ablation for the attack tests only (a holder of the descriptor can
  /// then truncate the table under the writer, which dies of SIGBUS at its next store).
  bool seal = true;
};

/// A consistent copy of one slot (seqlock-validated).
struct SlotSnapshot {
  std::uint32_t index = 0;
  std::uint32_t generation = 0;
  SlotState state = SlotState::free;
  bool revoked = false;  ///< kRevokedBit is set
  Epoch epoch = 0;       ///< the check word without kRevokedBit (0: none published)
  SandboxId sandbox;
  NameId name;
  std::uint8_t name_bytes = 0;           ///< full length of the name text
  char name_prefix[kNamePrefixBytes + 1] = {};  ///< first bytes of the name, NUL-terminated
  std::uint64_t valid_until_ns = 0;
};
std::string_view to_string(SlotState s) noexcept;

/// A consistent copy of a token channel's record (seqlock-validated). Use the bytes only when
/// `epoch` is the epoch being checked (a new grant replaces them).
struct TokenSnapshot {
  Epoch epoch = 0;          ///< the grant the token is for (0: none)
  std::uint32_t length = 0; ///< bytes of the token (0: none; token::kTokenBytes when signed)
  std::array<std::uint8_t, kTokenRecordWords * 8> bytes{};
  std::span<const std::uint8_t> view() const noexcept { return {bytes.data(), length}; }
};

struct Liveness {
  bool alive = false;       ///< heartbeat fresh and not closed
  bool closed = false;      ///< the writer closed the table cleanly
  std::uint64_t age_ns = 0; ///< now - last heartbeat; 0 if the heartbeat is ahead of now by at
                            ///< most the liveness timeout; UINT64_MAX: none, or further ahead
                            ///< (another boot)
};

/// A slot TableWriter::claim took: its index and the generation the claim gave it.
struct ClaimedSlot {
  std::uint32_t slot = 0;
  std::uint32_t generation = 0;
};

/// Histogram bucket of a value: bit_width(v) (0 for 0, 64 for v >= 2^63).
std::size_t histogram_bucket(std::uint64_t v) noexcept;
/// Wait-free record into a histogram (relaxed fetch_add; `max` assumes one writer thread).
void histogram_record(Histogram& h, std::uint64_t v) noexcept;

/// Owns a descriptor (closed by the destructor; -1: none). Move-only.
struct OwnedFd {
  int fd = -1;
  OwnedFd() = default;
  explicit OwnedFd(int f) noexcept : fd(f) {}
  OwnedFd(OwnedFd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  OwnedFd& operator=(OwnedFd&& o) noexcept;
  ~OwnedFd();
};

/// The writer: one per table, owned by the supervisor.
class TableWriter {
 public:
  /// Creates a table (io thread). Refuses with TableError(writer_alive) when a table with a
  /// fresh heartbeat exists at the location; a table whose writer is dead (stale heartbeat,
  /// closed, corrupt) is unlinked and replaced by a new one with incarnation + 1. Other
  /// errors: bad_argument, exists (a concurrent creator won), io_error.
  static TableWriter create(const TableOptions& options);

  TableWriter(TableWriter&&) noexcept;
  TableWriter& operator=(TableWriter&&) noexcept;
  ~TableWriter();  ///< unmaps; does not close or unlink (readers then see the writer die)

  // ---- io thread ----------------------------------------------------------------------
  /// Takes the free slot that was freed longest ago, if its cooldown has passed. Errors:
  /// busy when none is (the message names the table and says whether every slot is in use or
  /// when the next one cools down), invalid_argument for a nil sandbox. Nothing is kept of a
  /// refusal: the answer is the whole story.
  Result<ClaimedSlot> claim(SandboxId sandbox, std::uint64_t now_ns);
  /// Publishes {name, epoch, valid_until} on a claimed or published slot. Over an older epoch it
  /// first clears the check word, so readers see "invalid" in between, never a mix. The grant's
  /// signed token is not here: it goes to the sandbox's own TokenChannel, before this. Errors:
  /// bad_slot, wrong_state, bad_epoch, bad_argument (name > kNameBytesMax), revoked.
  TableErrc publish(std::uint32_t slot, NameId name, std::string_view name_text, Epoch epoch,
                    std::uint64_t valid_until_ns) noexcept;
  /// Moves valid_until (one release store). Never touches the check word, so it cannot undo a
  /// revoke. Errors: bad_slot, wrong_state, revoked (nothing stored). Wait-free and without
  /// syscalls, but it must run on the thread that publishes (the seqlock has one writer).
  TableErrc extend(std::uint32_t slot, std::uint64_t valid_until_ns) noexcept;
  /// Frees a slot whose sandbox is dead. A published slot cools down for slot_cooldown_ns
  /// before reuse (a reader may still hold its index and epoch); a slot that was only claimed
  /// never showed a reader an epoch, so it is reusable at once (first in line), and refused
  /// creates do not use up the table. Errors: bad_slot, wrong_state.
  TableErrc free(std::uint32_t slot, std::uint64_t now_ns) noexcept;
  /// The sandbox a claimed or published slot belongs to (claim()'s argument); nil for a free or
  /// cooling slot and for one out of range. O(1), io thread (it reads the writer's own stores).
  SandboxId owner(std::uint32_t slot) const noexcept;
  /// Marks the table closed (heartbeat 0, closed_ns set): every check_deadline fails.
  void close(std::uint64_t now_ns) noexcept;
  /// Unlinks the file or shm name (mappings stay valid until unmapped); nothing for a memfd.
  void remove() noexcept;
  /// A new read-only descriptor of the table (O_RDONLY | O_CLOEXEC), for a reader to inherit:
  /// of a memfd through /proc/self/fd (its own open file description, so it cannot be used to
  /// write even where the seals would allow it), of a file or shm name by opening it. The
  /// caller closes it. Errors: as open(2) (errc_of_errno), the message naming the table.
  Result<int> reopen_read_only() const;
  /// Where a reader outside this process opens the table: the path or shm name, or for a memfd
  /// /proc/<pid>/fd/<N> (root only when this process is not dumpable).
  std::string reader_location() const;
  /// The seals of a memfd table (F_GET_SEALS), 0 for a file. Errors: as fcntl(2)
  /// (errc_of_errno), the message naming the table.
  Result<int> seals() const;

  // ---- rt thread: wait-free, no allocation, no syscall --------------------------------
  /// Revokes: sets kRevokedBit on the check word (one `lock or`). Sticky until free().
  /// Returns false only for an out-of-range slot. Call it only while the slot still belongs
  /// to the sandbox being killed (free() comes after its death is confirmed); a revoke that
  /// arrives later can only hit the slot's next owner after slot_cooldown_ns, and then errs
  /// on the safe side (it revokes, it never validates).
  bool revoke(std::uint32_t slot) noexcept;
  /// Writer liveness: one release store of now_ns (CLOCK_BOOTTIME).
  void heartbeat(std::uint64_t now_ns) noexcept;
  void record_rt_lateness_ns(std::uint64_t ns) noexcept;
  void record_heartbeat_rtt_ns(std::uint64_t ns) noexcept;   ///< io thread
  void record_heartbeat_failure() noexcept;                   ///< io thread
  void record_kill(std::uint64_t kill_latency_ns) noexcept;
  /// The histograms and counters as the record_* calls leave them, for a reader in the writer's
  /// process (the supervisor's /metrics and status): relaxed loads only, from any thread.
  const Stats& statistics() const noexcept { return stats(); }

  const Header& header() const noexcept;
  std::uint32_t slot_count() const noexcept { return slot_count_; }
  const Location& location() const noexcept { return location_; }

 private:
  TableWriter() = default;
  Slot* slot_ptr(std::uint32_t i) const noexcept;
  Stats& stats() const noexcept;

  Location location_;
  OwnedFd memfd_;
  boost::interprocess::mapped_region region_;
  std::uint32_t slot_count_ = 0;
  std::uint64_t cooldown_ns_ = 0;
  // Free-slot FIFO (ring of slot indices, ordered by free time) and each slot's free time.
  std::vector<std::uint32_t> free_ring_;
  std::vector<std::uint64_t> freed_at_ns_;
  std::size_t free_head_ = 0;
  std::size_t free_len_ = 0;
};

/// How long open() waits for the file, its size and its ready flag.
struct OpenOptions {
  std::uint64_t wait_ns = 0;             ///< 0: one attempt
  std::uint64_t poll_ns = 1'000'000;     ///< sleep between attempts
  /// Opening by path or shm name, the file must be owned by root or this uid and writable by
  /// neither group nor others (else TableError(untrusted)): a table another user could write
  /// could show a revoked lease as valid. (uid_t)-1: this process's euid.
  std::uint32_t trusted_uid = static_cast<std::uint32_t>(-1);
};

/// The open state machine's stages (Aeron's await file -> await version -> ready).
enum class OpenStage : std::uint8_t { awaiting_file, awaiting_size, awaiting_ready, ready };
std::string_view to_string(OpenStage s) noexcept;

/// A resolved (slot, epoch) pair: "resolve once, check many times". The constructor-side
/// validation (slot index in range, epoch in [1, 2^63)) is done by TableReader::lease(), so
/// `valid()` is exactly one acquire load and one compare. A bad slot or epoch resolves to a
/// word that never equals the epoch, so `valid()` needs no branch for it.
struct LeaseCheck {
  const std::atomic<std::uint64_t>* word;
  Epoch epoch;
  bool valid() const noexcept { return word->load(std::memory_order_acquire) == epoch; }
};

/// A read-only mapping of a table. Never writes; never blocks the writer.
class TableReader {
 public:
  /// Opens and validates (stages: file exists -> size >= header -> ready flag (acquire) ->
  /// magic, major version, geometry). Throws TableError: missing, truncated, bad_magic,
  /// newer_major, older_major, bad_geometry, not_ready (after wait_ns), io_error, untrusted
  /// (see OpenOptions::trusted_uid).
  static TableReader open(std::string_view location, const OpenOptions& options = {});

  TableReader(TableReader&&) noexcept;
  TableReader& operator=(TableReader&&) noexcept;
  ~TableReader();

  /// The hot check: one acquire load of the check word and a compare. No syscall.
  /// True iff the slot currently holds `epoch`, published and not revoked. Cannot see a dead
  /// writer or an expired deadline: use check_deadline before side effects.
  static bool check(const Slot& slot, Epoch epoch) noexcept {
    // Unconditional load, branch-free range test: a caller's loop hoists the epoch test.
    const std::uint64_t word = slot.check_word.load(std::memory_order_acquire);
    return (word == epoch) & epoch_in_range(epoch);
  }
  /// check() on slot `index` (false when out of range).
  bool check(std::uint32_t index, Epoch epoch) const noexcept {
    return index < slot_count_ && check(slots_[index], epoch);
  }
  /// Resolves (index, epoch) for repeated checks; see LeaseCheck. Never fails: a bad index or
  /// epoch gives a LeaseCheck whose valid() is always false.
  LeaseCheck lease(std::uint32_t index, Epoch epoch) const noexcept;
  /// check() and: valid_until_ns not passed, writer heartbeat fresh, table not closed.
  /// Reads CLOCK_BOOTTIME once (vDSO).
  bool check_deadline(std::uint32_t index, Epoch epoch) const noexcept;
  /// The same at a given time (for tests and for callers that already read the clock).
  bool check_deadline_at(std::uint32_t index, Epoch epoch, std::uint64_t now_ns) const noexcept;

  /// Consistent copy of slot `index`; busy after kSnapshotRetriesMax torn attempts, bad_slot
  /// when out of range.
  TableErrc snapshot(std::uint32_t index, SlotSnapshot& out) const noexcept;
  /// The claimed/published slot of a sandbox (linear scan; tools and start-up, not hot paths).
  std::optional<SlotSnapshot> find(SandboxId sandbox) const noexcept;
  Liveness writer_liveness(std::uint64_t now_ns) const noexcept;
  Liveness writer_liveness() const noexcept { return writer_liveness(static_cast<std::uint64_t>(boottime_ns())); }
  /// True when the location now holds another table (a new incarnation) or none (syscalls).
  bool replaced() const;

  const Header& header() const noexcept { return *header_; }
  const Stats& stats() const noexcept { return *stats_; }
  const WriterLiveness& liveness() const noexcept { return *liveness_; }
  const Slot* slot(std::uint32_t index) const noexcept {
    return index < slot_count_ ? &slots_[index] : nullptr;
  }
  std::uint32_t slot_count() const noexcept { return slot_count_; }
  const Location& location() const noexcept { return location_; }

 private:
  TableReader() = default;
  Location location_;
  boost::interprocess::mapped_region region_;
  const Header* header_ = nullptr;
  const WriterLiveness* liveness_ = nullptr;
  const Stats* stats_ = nullptr;
  const Slot* slots_ = nullptr;
  std::uint32_t slot_count_ = 0;
  std::uint64_t liveness_timeout_ns_ = 0;
};

/// A sandbox's own token channel (layout.hpp "TokenChannelHeader"), written by the supervisor's
/// io thread: an anonymous memfd "leasehold-tokens-<sandbox>" of kTokenChannelBytes, mode 0400,
/// sealed (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) once mapped; only
/// that sandbox inherits a read-only descriptor of it (LEASEHOLD_TOKENS=4). Move-only.
class TokenChannel {
 public:
  /// Creates it. Throws TableError(io_error) naming the step that failed (memfd_create, sizing,
  /// sealing: F_SEAL_FUTURE_WRITE needs Linux 5.1), bad_argument for a name memfd refuses.
  static TokenChannel create(std::string_view name);
  TokenChannel(TokenChannel&&) noexcept;
  TokenChannel& operator=(TokenChannel&&) noexcept;
  ~TokenChannel();
  /// Stores the token of the grant at `epoch` (wire/token.hpp bytes) under the record's seqlock;
  /// an empty token clears the record. bad_argument (nothing stored) for a token larger than
  /// the record or an epoch outside [1, 2^63) with a token.
  TableErrc publish(Epoch epoch, std::span<const std::uint8_t> token) noexcept;
  void clear() noexcept { publish(0, {}); }
  /// A new O_RDONLY | O_CLOEXEC descriptor of it (its own open file description, through
  /// /proc/self/fd), for the sandbox to inherit; the caller closes it. Errors: as open(2)
  /// (errc_of_errno).
  Result<int> reopen_read_only() const;
  /// Its seals (F_GET_SEALS). Errors: as fcntl(2) (errc_of_errno).
  Result<int> seals() const;

 private:
  TokenChannel() = default;
  OwnedFd memfd_;
  boost::interprocess::mapped_region region_;
};

/// Where $LEASEHOLD_TOKENS points (the descriptor number the supervisor gives a sandbox).
inline constexpr const char* kTokenChannelEnv = "LEASEHOLD_TOKENS";
/// The descriptor number a sandbox inherits its token channel as.
inline constexpr int kTokenChannelFd = 4;

/// A read-only mapping of a token channel, by an inherited descriptor. Never writes.
class TokenChannelReader {
 public:
  /// `location`: decimal digits, an inherited descriptor (what LEASEHOLD_TOKENS holds). Throws
  /// TableError: bad_argument (not a descriptor number), missing (no such descriptor),
  /// truncated, bad_magic (not a token channel, e.g. the shm table), newer_major / older_major,
  /// bad_geometry, not_ready, io_error.
  static TokenChannelReader open(std::string_view location);
  TokenChannelReader(TokenChannelReader&&) noexcept;
  TokenChannelReader& operator=(TokenChannelReader&&) noexcept;
  ~TokenChannelReader();
  /// Consistent copy of the record; busy after kSnapshotRetriesMax torn attempts.
  TableErrc read(TokenSnapshot& out) const noexcept;

 private:
  TokenChannelReader() = default;
  boost::interprocess::mapped_region region_;
  const TokenRecord* record_ = nullptr;
};

/// The signed token of this sandbox's grant at `epoch`, from its token channel at `location`
/// ($LEASEHOLD_TOKENS when empty): its bytes, or a Status naming the reason: not_found (no
/// channel, or no token for that epoch), busy (torn reads), or what opening the channel
/// refused (errc_of). Never throws but for allocation.
Result<std::vector<std::uint8_t>> own_token(std::string_view location, Epoch epoch);

/// The module-boundary code (lease/result.hpp) of a table failure: missing not_found,
/// bad_argument/bad_slot/bad_epoch invalid_argument, truncated/bad_magic/bad_geometry corrupt,
/// newer_major/older_major unsupported, untrusted permission_denied, exists/writer_alive exists,
/// not_ready/busy/table_full busy, wrong_state/revoked refused, io_error io_error.
Errc errc_of(TableErrc e) noexcept;

}  // namespace leasehold::shm
