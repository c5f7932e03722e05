// leasehold/io: the wire protocol between lockd, the supervisors and the CLI.
//
// DESIGN.md "The wire protocol". One message per UDP datagram, at most kDatagramBytesMax
// bytes. Binary, little-endian, versioned. Layout of every datagram:
//
//   offset size  field
//        0    4  magic        kMagic ("LHW1" read as bytes 'L','H','W','1')
//        4    1  version      kVersion
//        5    1  type         MessageType
//        6    2  flags        kFlag* bits; unknown bits are rejected (DecodeError::bad_flags)
//        8   16  sender       WorkerId of the sender (lockd uses its own instance id)
//       24    8  seq          per-sender, strictly increasing (replay window, RFC 4303 §3.4.3)
//       32    8  request_id   chosen by the requester; retries reuse it; answers echo it
//       40    2  payload_len  bytes of payload that follow the header
//       42    2  key_id       which key tagged the datagram (wire/auth.hpp); 0 names no key
//       44    n  payload      per type, see the structs below
//     44+n   32  tag          HMAC-SHA256 over bytes [0, 44+n) with the key that key_id and
//                             sender select: a worker's own key (derived from the cluster key
//                             and the worker id), or an admin key (wire/auth.hpp Keyring)
//
// Version stability: bytes 0..43 (the header) and the trailing 32-byte tag keep this meaning in
// every future version, so a receiver can authenticate a datagram of an unknown version and
// answer it with Error{unknown_version} addressed to its sender and request id.
//
// Integers are little-endian; ids are 16 bytes (hi then lo, each u64 little-endian); booleans are
// one byte 0/1 (anything else is rejected); text is a length (u8, or u16 where noted) followed by
// the bytes. Counts are u16 and are checked against the per-type limits below.
#pragma once

#include "leasehold/wire/token.hpp"
#include "leasehold/lease/code_table.hpp"
#include "leasehold/lease/types.hpp"

#include <boost/container/static_vector.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace leasehold::wire {

// ---------------------------------------------------------------------------------------------
// Limits (named; every list on the wire is bounded by one of these).

inline constexpr std::uint32_t kMagic = 0x3157484Cu;  ///< bytes "LHW1" little-endian
/// 2: key_id in the header, per-worker keys; 3: a Grant carries lockd's signed token
inline constexpr std::uint8_t kVersion = 4;
inline constexpr std::size_t kDatagramBytesMax = 1400;  ///< below a 1500-byte MTU with IPv6+UDP
inline constexpr std::size_t kHeaderBytes = 44;
inline constexpr std::size_t kTagBytes = 32;  ///< HMAC-SHA256
inline constexpr std::size_t kDatagramBytesMin = kHeaderBytes + kTagBytes;
inline constexpr std::size_t kPayloadBytesMax = kDatagramBytesMax - kHeaderBytes - kTagBytes;  // 1324

/// Size of one Heartbeat entry on the wire (name_id 16 + sandbox 16 + epoch 8).
inline constexpr std::size_t kHeartbeatEntryBytes = 40;
/// Size of one HeartbeatAck entry on the wire (name_id 16 + status 1 + holder 16 + epoch 8 + ttl 4).
inline constexpr std::size_t kHeartbeatAckEntryBytes = 45;
/// Entries per Heartbeat datagram. Bounded by the *answer*: the HeartbeatAck for a full heartbeat
/// must fit one datagram too (2 + 29·45 = 1307 ≤ kPayloadBytesMax). Larger batches are split by
/// split_heartbeat().
inline constexpr std::size_t kHeartbeatEntriesMax = 29;
/// Text limits.
inline constexpr std::size_t kErrorTextBytesMax = 256;
inline constexpr std::size_t kCounterKeyBytesMax = 64;
/// ListPage and StatsAnswer are further bounded by kPayloadBytesMax (see payload_bytes()).
inline constexpr std::size_t kListEntriesMax = 64;
inline constexpr std::size_t kCountersMax = 128;

/// Header flag bits.
inline constexpr std::uint16_t kFlagRetry = 1u << 0;  ///< informational: this is a retry of request_id
inline constexpr std::uint16_t kFlagsKnown = kFlagRetry;

// ---------------------------------------------------------------------------------------------
// Enumerations that travel on the wire. Values are stable.

enum class MessageType : std::uint8_t {
  // requests
  acquire = 1,
  commit = 2,
  heartbeat = 3,
  release = 4,
  transfer_begin = 5,
  transfer_complete = 6,
  transfer_accept = 7,
  revoke = 8,
  reassign = 9,
  worker_heartbeat = 10,
  is_running = 11,  ///< lockd → supervisor
  list = 12,
  show = 13,
  stats = 14,
  revoked = 15,         ///< lockd → supervisor: a grant of yours was revoked; kill it
  kill_confirmed = 16,  ///< supervisor → lockd: the revoked grant's sandbox is dead
  wait = 17,            ///< an acquire that joins the name's FIFO of waiters when it is taken
  // answers
  grant = 0x81,
  deny = 0x82,
  heartbeat_ack = 0x83,
  ok = 0x84,
  transfer_state = 0x85,
  worker_ack = 0x86,
  running_answer = 0x87,
  list_page = 0x88,
  name_info = 0x89,
  stats_answer = 0x8A,
  revoked_ack = 0x8B,
  queued = 0x8C,
  error = 0xFF,
};

/// Stable snake_case text ("heartbeat_ack"); "unknown" for values outside the enum.
std::string_view to_string(MessageType t) noexcept;
/// True for the request types (lockd answers them); false for answers.
constexpr bool is_request(MessageType t) noexcept { return static_cast<std::uint8_t>(t) < 0x80; }

/// The wire byte of each lock state (leasehold::LockPhase, DESIGN.md "Lock states"). The codec
/// encodes and decodes through this table only; a byte outside it is refused (bad_value).
inline constexpr CodeTable<LockPhase, std::uint8_t, 4> kLockPhaseCodes{{{
    {LockPhase::free, 0}, {LockPhase::acquiring, 1}, {LockPhase::held, 2}, {LockPhase::transferring, 3}}}};
static_assert(kLockPhaseCodes.covers(kLockPhases));

/// The wire byte of each per-entry heartbeat answer (leasehold::RefreshStatus).
inline constexpr CodeTable<RefreshStatus, std::uint8_t, 4> kRefreshStatusCodes{{{
    {RefreshStatus::refreshed, 0}, {RefreshStatus::lost, 1}, {RefreshStatus::unknown, 2}, {RefreshStatus::queued, 3}}}};
static_assert(kRefreshStatusCodes.covers(kRefreshStatuses));

/// The wire byte of each refusal (leasehold::Refusal) in a Deny: the enumerators' values, as
/// earlier builds sent them, and they stay so (docs/PROTOCOL.md). The codec encodes and decodes
/// through this table only; a byte outside it is refused (bad_value).
inline constexpr CodeTable<Refusal, std::uint8_t, 23> kRefusalCodes{{{
    {Refusal::none, 0},
    {Refusal::invalid_name, 1},
    {Refusal::name_collision, 2},
    {Refusal::held, 3},
    {Refusal::acquiring, 4},
    {Refusal::transferring, 5},
    {Refusal::reserved, 6},
    {Refusal::lock_delay, 7},
    {Refusal::unknown_name, 8},
    {Refusal::not_holder, 9},
    {Refusal::stale_epoch, 10},
    {Refusal::not_acquiring, 11},
    {Refusal::acquiring_expired, 12},
    {Refusal::not_transferring, 13},
    {Refusal::not_free, 14},
    {Refusal::wrong_mode, 15},
    {Refusal::worker_alive, 16},
    {Refusal::table_full, 17},
    {Refusal::bad_request, 18},
    {Refusal::epoch_exhausted, 19},
    {Refusal::not_held, 20},
    {Refusal::expired, 21},
    {Refusal::forbidden, 22}}}};
static_assert(kRefusalCodes.covers(kRefusals));

/// Why a datagram was not delivered. Every rejection is counted by reason (DecodeStats).
/// Reasons up to and including bad_tag are found *before* authentication: the datagram is dropped
/// silently (it may be spoofed). Later reasons concern authenticated datagrams and are answered
/// with Error{code = the reason} (see error_code_of()).
enum class DecodeError : std::uint8_t {
  none = 0,
  truncated = 1,         ///< shorter than header + tag (kDatagramBytesMin)
  oversized = 2,         ///< longer than kDatagramBytesMax
  bad_magic = 3,         ///< first 4 bytes are not kMagic
  bad_tag = 4,           ///< HMAC-SHA256 tag does not match (wrong key or altered bytes)
  unknown_version = 5,   ///< version is not kVersion
  unknown_type = 6,      ///< type is not a MessageType
  bad_flags = 7,         ///< unknown flag bits or non-zero reserved bytes
  length_mismatch = 8,   ///< payload_len disagrees with the datagram size
  short_payload = 9,     ///< the payload ends inside a field
  trailing_bytes = 10,   ///< bytes left after the last field of the payload
  bad_count = 11,        ///< an entry count above its limit
  bad_value = 12,        ///< an enum or boolean byte out of range
  invalid_name = 13,     ///< the name text breaks lease::validate_name
  bad_text = 14,         ///< a text field over its limit
  replayed = 15,         ///< seq already seen in the sender's window (and no cached answer)
  stale_seq = 16,        ///< seq below the sender's window, or zero
  request_id_reused = 17,///< request_id has a cached answer for a different request
  unknown_key = 18,      ///< no key for this (sender, key_id): found before authentication, dropped
  seq_out_of_range = 19, ///< seq at or above kSeqLimit: no sender makes one (seeds are far below)
  seq_jump = 20,         ///< seq more than kSeqAheadMaxNs above the receiver's wall clock (replay.hpp)
};
inline constexpr std::size_t kDecodeErrorCount = 21;
/// Every seq is below this (2^63). A sender's seed is CLOCK_REALTIME nanoseconds (about 2^61 in
/// this century); a receiver refuses a seq at or above it, so a window's highest seq + 1 (its
/// seq_floor) never overflows and one datagram cannot push a sender's window to the top.
inline constexpr std::uint64_t kSeqLimit = std::uint64_t{1} << 63;
/// Stable snake_case text ("length_mismatch").
std::string_view to_string(DecodeError e) noexcept;
/// True if a datagram rejected for this reason authenticated (and so deserves an Error answer).
constexpr bool is_authenticated_reason(DecodeError e) noexcept {
  return static_cast<std::uint8_t>(e) > static_cast<std::uint8_t>(DecodeError::bad_tag) &&
         e != DecodeError::unknown_key;
}

/// Counters of rejected datagrams, indexed by reason; `accepted` counts delivered messages.
/// Not thread-safe: one per receiving thread.
struct DecodeStats {
  std::array<std::uint64_t, kDecodeErrorCount> rejected{};  ///< [DecodeError::none] stays 0
  std::uint64_t accepted = 0;
  std::uint64_t resent = 0;  ///< retries answered from the response cache
  std::uint64_t in_flight_retries = 0;  ///< retries dropped: their request's answer is still pending
  std::uint64_t resends_refused_source = 0;  ///< cached answer not resent: another source address
  std::uint64_t resends_refused_rate = 0;    ///< cached answer not resent: too often, or too many
  std::uint64_t error_answers_suppressed = 0;  ///< replay/stale errors not answered (rate bound)
  std::uint64_t error_answers_refused_source = 0;  ///< replay/stale errors not sent: another address
  void count(DecodeError e) noexcept {
    if (e == DecodeError::none) ++accepted;
    else ++rejected[static_cast<std::size_t>(e) < kDecodeErrorCount ? static_cast<std::size_t>(e) : 0];
  }
  std::uint64_t operator[](DecodeError e) const noexcept { return rejected[static_cast<std::size_t>(e)]; }
};

/// The code of an Error answer. 1..63 are DecodeError values (the request was rejected by the
/// codec/receiver); 64.. are service errors. Unknown codes are kept as their number.
enum class ErrorCode : std::uint16_t {
  none = 0,
  // 1..20: as DecodeError
  internal = 64,     ///< the service failed (store error); the request may be retried
  overloaded = 65,   ///< too many requests in flight; retry with backoff
  unsupported = 66,  ///< a well-formed request this service does not implement
  /// this lockd does not lead the name's shard (lockd on etcd): `message` is the leader's
  /// ADDR:PORT (wire/address.hpp SocketAddress text), or empty while no leader is known; the
  /// request changed nothing here. A client retries at that address (if it is one of the
  /// lockd addresses it was configured with) or at its next configured address.
  not_leader = 67,
};
constexpr ErrorCode error_code_of(DecodeError e) noexcept { return static_cast<ErrorCode>(e); }
std::string_view to_string(ErrorCode c) noexcept;

/// Why an encode failed. An encoder never writes a datagram that the decoder would reject.
enum class EncodeError : std::uint8_t {
  none = 0,
  buffer_too_small = 1,  ///< out has fewer bytes than the datagram needs
  too_large = 2,         ///< the payload exceeds kPayloadBytesMax (split it, or fill fewer entries)
  bad_count = 3,         ///< more entries than the per-type limit
  invalid_name = 4,      ///< a name text breaks validate_name
  bad_text = 5,          ///< a text field over its limit
  bad_flags = 6,         ///< header.flags has bits outside kFlagsKnown
  seq_exhausted = 7,     ///< Sender: the next seq would be at or above kSeqLimit
};
std::string_view to_string(EncodeError e) noexcept;

// ---------------------------------------------------------------------------------------------
// Messages. Plain values; ids use the lease vocabulary. `_ms` fields are u32 milliseconds.

/// Acquire a name for a sandbox (DESIGN.md "Lock states": Acquire, lease mode or 2-phase).
/// Answer: Grant (state held, or acquiring if two_phase) or Deny.
struct Acquire {
  std::string name;          ///< the name text (validated at encode and decode)
  SandboxId sandbox;         ///< nil is refused by lockd (Refusal::bad_request), not by the codec
  WorkerId worker;           ///< nil allowed: a control plane acquiring on a sandbox's behalf
  std::uint32_t ttl_ms = 0;  ///< requested lease TTL; 0 = lockd default
  bool two_phase = false;    ///< Free → Acquiring (commit later) instead of Free → Held
  friend bool operator==(const Acquire&, const Acquire&) = default;
};

/// A 2-phase acquire that waits its turn (DESIGN.md "Waiters"). A grantable name with nobody
/// waiting is granted at once (Grant, state acquiring: the caller then commits, as after a
/// 2-phase Acquire). Otherwise the sandbox joins the name's FIFO of waiters and the answer is
/// Queued; re-sending the same Wait (a new request id) keeps its place for another `ttl_ms`
/// and answers its position, or the Grant once it has been granted. When the name is released,
/// expires, or its revoke or lock-delay ends, lockd grants it (2-phase, a new epoch) to the
/// first waiter whose place has not lapsed, and sends that Grant, once durable, to the address
/// and request id of the waiter's latest Wait. A waiter leaves the queue with a Release of
/// {name_id, sandbox, epoch 0}, or by not re-sending for `ttl_ms`. Refusals as a 2-phase
/// Acquire's, except that a taken name queues; a full queue is Error{overloaded} naming the
/// bound.
struct Wait {
  std::string name;          ///< the name text (validated at encode and decode)
  SandboxId sandbox;         ///< the sandbox that will hold it; nil is refused (bad_request)
  WorkerId worker;           ///< the worker it will run on; nil: the sender's
  std::uint32_t ttl_ms = 0;  ///< how long the place is kept without a re-send; 0 = lockd's TTL
  friend bool operator==(const Wait&, const Wait&) = default;
};

/// Answer to Wait: the sandbox waits at `position` (1 = next) of `waiters`, behind the state
/// the name is in (its holder, worker, epoch); its place is kept for `ttl_ms` more.
struct Queued {
  NameId name_id;
  std::uint32_t position = 0;
  std::uint32_t waiters = 0;
  SandboxId holder;
  WorkerId worker;
  Epoch epoch = 0;
  LockPhase state = LockPhase::free;
  std::uint32_t ttl_ms = 0;
  friend bool operator==(const Queued&, const Queued&) = default;
};

/// Second phase of a 2-phase acquire: Acquiring → Held. Answer: Grant or Deny.
struct Commit {
  NameId name_id;
  SandboxId sandbox;
  Epoch epoch = 0;
  WorkerId worker;  ///< the worker that now supervises the sandbox
  friend bool operator==(const Commit&, const Commit&) = default;
};

struct HeartbeatEntry {
  NameId name_id;
  SandboxId sandbox;
  Epoch epoch = 0;
  friend bool operator==(const HeartbeatEntry&, const HeartbeatEntry&) = default;
};

/// Batched lease refresh from one supervisor (DESIGN.md "Time": every refresh is capped at the
/// time left). Answer: HeartbeatAck with one entry per request entry, in order.
struct Heartbeat {
  std::uint32_t ttl_cap_ms = 0;  ///< refresh at most this far ahead; 0 = no cap (lockd's TTL)
  boost::container::static_vector<HeartbeatEntry, kHeartbeatEntriesMax> entries;
  friend bool operator==(const Heartbeat&, const Heartbeat&) = default;
};

struct HeartbeatAckEntry {
  NameId name_id;
  RefreshStatus status = RefreshStatus::unknown;
  SandboxId holder;              ///< lost: the current holder (nil if free)
  Epoch epoch = 0;               ///< refreshed: the lease's epoch; lost: the current epoch
  std::uint32_t ttl_left_ms = 0; ///< refreshed: time left on lockd's clock after the refresh
  friend bool operator==(const HeartbeatAckEntry&, const HeartbeatAckEntry&) = default;
};

struct HeartbeatAck {
  boost::container::static_vector<HeartbeatAckEntry, kHeartbeatEntriesMax> entries;
  friend bool operator==(const HeartbeatAck&, const HeartbeatAck&) = default;
};

/// Held → Free by the holder. Answer: Ok or Deny.
struct Release {
  NameId name_id;
  SandboxId sandbox;
  Epoch epoch = 0;
  friend bool operator==(const Release&, const Release&) = default;
};

/// Held(from) → Transferring (epoch +1). Answer: TransferState or Deny. The reservation the
/// transfer leaves is for (to, to_worker): only to_worker may acquire it (lockd refuses a nil
/// to_worker: bad_request).
struct TransferBegin {
  NameId name_id;
  SandboxId from;
  Epoch epoch = 0;  ///< from's current epoch
  SandboxId to;
  WorkerId to_worker;  ///< the worker that runs `to`
  friend bool operator==(const TransferBegin&, const TransferBegin&) = default;
};

/// Transferring → Free{reserved_for = to} once `from` has stopped. Answer: TransferState or Deny.
struct TransferComplete {
  NameId name_id;
  Epoch new_epoch = 0;
  friend bool operator==(const TransferComplete&, const TransferComplete&) = default;
};

/// Acquire by the intended owner: Free{reserved_for = to} → Held(to). Answer: Grant or Deny.
struct TransferAccept {
  NameId name_id;
  SandboxId to;
  WorkerId worker;
  friend bool operator==(const TransferAccept&, const TransferAccept&) = default;
};

/// Coordinator revoke (no cooperation needed): → Free, epoch +1, not grantable until the old
/// holder's kill is confirmed or its lease would have expired. Answer: Ok{new epoch} or Deny
/// (stale_epoch if expected_epoch is not the current epoch; not_held for a Free name unless
/// force).
struct Revoke {
  NameId name_id;
  Epoch expected_epoch = 0;  ///< 0: any; else refused unless it is the current epoch
  bool force = false;        ///< also revoke a Free name (burns an epoch)
  friend bool operator==(const Revoke&, const Revoke&) = default;
};

/// lockd → the revoked holder's supervisor (to its last heartbeat address), retried until
/// answered or the revoke's bound passes: the grant {name_id, epoch} was revoked; kill its
/// sandbox. Answer: RevokedAck. Once the sandbox is dead the supervisor sends KillConfirmed.
struct Revoked {
  NameId name_id;
  Epoch epoch = 0;      ///< the revoked grant's epoch
  Epoch new_epoch = 0;  ///< the name's epoch after the revoke
  friend bool operator==(const Revoked&, const Revoked&) = default;
};

/// Answer to Revoked.
struct RevokedAck {
  NameId name_id;
  Epoch epoch = 0;
  bool running = false;  ///< a sandbox of that grant runs (or is being placed) here: killing it
  friend bool operator==(const RevokedAck&, const RevokedAck&) = default;
};

/// Supervisor → lockd: the sandbox of the revoked grant {name_id, epoch} is dead. lockd
/// accepts it only from the revoked holder's worker (the header's sender) for that epoch and
/// lifts the revoke's lock-delay. Answer: Ok{current epoch} (also when nothing is pending) or
/// Deny (not_holder: another worker; stale_epoch: a revoke of another epoch is pending).
struct KillConfirmed {
  NameId name_id;
  SandboxId sandbox;
  Epoch epoch = 0;
  friend bool operator==(const KillConfirmed&, const KillConfirmed&) = default;
};

/// Free → Free reserved for (`to`, `worker`), epoch +1: only `worker` may acquire it (lockd
/// refuses a nil worker: bad_request). Answer: Ok{new epoch} or Deny.
struct Reassign {
  NameId name_id;
  SandboxId to;
  WorkerId worker;  ///< the worker that runs `to`
  friend bool operator==(const Reassign&, const Reassign&) = default;
};

/// Names one WorkerHeartbeat may carry (and its WorkerAck report on): bounded by the answer,
/// like a Heartbeat's.
inline constexpr std::size_t kWorkerBeatEntriesMax = kHeartbeatEntriesMax;

/// Worker liveness in preemptible mode: one datagram per worker and beat, not per lease.
/// `held` is a window of the names this worker believes its sandboxes hold (committed to this
/// worker); the supervisor rotates the window over all of them, so with N such names each is
/// checked at least every ceil(N / kWorkerBeatEntriesMax) beats. Answer: WorkerAck.
struct WorkerHeartbeat {
  WorkerId worker;
  boost::container::static_vector<HeartbeatEntry, kWorkerBeatEntriesMax> held;
  friend bool operator==(const WorkerHeartbeat&, const WorkerHeartbeat&) = default;
};

/// lockd → supervisor: "is this sandbox still running under this lease?". Answer: RunningAnswer.
struct IsRunning {
  NameId name_id;
  SandboxId sandbox;
  Epoch epoch = 0;
  friend bool operator==(const IsRunning&, const IsRunning&) = default;
};

/// Page through the name table. Answer: ListPage.
struct List {
  std::uint64_t cursor = 0;  ///< 0 = from the start; otherwise a ListPage::next_cursor
  std::uint16_t limit = 0;   ///< entries wanted; 0 = as many as fit
  /// Each entry's count of waiters is wanted (ListPage::with_waiters). On the wire a trailing
  /// u8 1, sent only when true; a lockd from before waiters were listed refuses it
  /// (Error{trailing_bytes}) and the client asks again without.
  bool waiters = false;
  friend bool operator==(const List&, const List&) = default;
};

/// One name: by text when `name` is non-empty, else by `name_id`. Answer: NameInfo or Deny.
struct Show {
  std::string name;
  NameId name_id;
  /// Its waiters are wanted, from this index of its FIFO (0 = the first in line): NameInfo
  /// then carries them (with_waiters). On the wire a trailing u32, sent only when set; a lockd
  /// from before waiters were listed refuses it (Error{trailing_bytes}).
  std::optional<std::uint32_t> waiters_from;
  friend bool operator==(const Show&, const Show&) = default;
};

/// Service counters. Answer: StatsAnswer. Without `first` (an empty payload, as every version
/// sends) the answer is what fits one datagram of the counter list. With `first` (a u16 payload;
/// a lockd from before paging refuses it, Error{trailing_bytes}) it is the
/// page of the list that starts at index `first`, as many counters in a row as fit; an empty page
/// is the end. A client pages with first = 0, then first = the count it has so far.
struct Stats {
  std::optional<std::uint16_t> first;
  friend bool operator==(const Stats&, const Stats&) = default;
};

/// A Grant's signed token (wire/token.hpp encoding): on the wire a u8 length, 0 (lockd signs
/// nothing) or token::kTokenBytes, then the bytes; any other length is rejected (bad_value).
using GrantTokenBytes = boost::container::static_vector<std::uint8_t, token::kTokenBytes>;

/// Answer: the name is granted (state held), or reserved in 2-phase (state acquiring).
struct Grant {
  NameId name_id;
  Epoch epoch = 0;
  SandboxId holder;
  WorkerId worker;
  LockPhase state = LockPhase::held;
  std::uint32_t ttl_ms = 0;  ///< TTL granted (held) or time left to commit (acquiring)
  /// lockd's signed token {name_id, epoch, holder, worker, issued_at, key_id} of this grant,
  /// which the holder hands to a resource with its writes; empty from a lockd without a
  /// signing key.
  GrantTokenBytes token;
  friend bool operator==(const Grant&, const Grant&) = default;
};

/// Answer: refused, with the reason and the state that caused it.
struct Deny {
  NameId name_id;
  Refusal refusal = Refusal::none;  ///< lease::Refusal, stable values
  SandboxId holder;                 ///< current holder (nil if none)
  WorkerId worker;                  ///< current holder's worker (nil if none)
  Epoch epoch = 0;                  ///< current epoch
  LockPhase state = LockPhase::free;
  friend bool operator==(const Deny&, const Deny&) = default;
};

/// Answer to Release, Revoke, Reassign: done; `epoch` is the name's epoch afterwards.
struct Ok {
  NameId name_id;
  Epoch epoch = 0;
  friend bool operator==(const Ok&, const Ok&) = default;
};

/// Answer to TransferBegin / TransferComplete.
struct TransferState {
  NameId name_id;
  SandboxId from;
  SandboxId to;
  Epoch old_epoch = 0;
  Epoch new_epoch = 0;
  LockPhase state = LockPhase::transferring;  ///< transferring after begin, free after complete
  friend bool operator==(const TransferState&, const TransferState&) = default;
};

/// Answer to WorkerHeartbeat.
struct WorkerAck {
  std::uint32_t liveness_ttl_ms = 0;  ///< the worker counts as live this long from lockd's receipt
  /// The entries of the beat's `held` that are not held by that sandbox at that epoch on this
  /// worker (revoked, preempted, transferred away, unknown): status lost / unknown with the
  /// current holder and epoch, as in a HeartbeatAck (ttl_left_ms 0). The supervisor kills those
  /// sandboxes at once (mutex violation recovery). A lost answer costs nothing: the next beat
  /// that carries the name asks again.
  boost::container::static_vector<HeartbeatAckEntry, kWorkerBeatEntriesMax> not_held;
  friend bool operator==(const WorkerAck&, const WorkerAck&) = default;
};

/// Answer to IsRunning.
struct RunningAnswer {
  NameId name_id;
  SandboxId sandbox;
  Epoch epoch = 0;
  bool running = false;
  friend bool operator==(const RunningAnswer&, const RunningAnswer&) = default;
};

/// How the latest revoke's lock-delay ended (NameRecord::revoke_ended).
enum class RevokeEnd : std::uint8_t {
  none = 0,            ///< no revoke at this epoch, or it is still pending
  kill_confirmed = 1,  ///< the revoked holder's worker confirmed the kill
  lease_expired = 2,   ///< the old grant's lease (or worker liveness) would have ended
};
std::string_view to_string(RevokeEnd e) noexcept;

/// One name record, as listed or shown.
struct NameRecord {
  std::string name;
  NameId name_id;
  LockPhase state = LockPhase::free;
  SandboxId holder;        ///< owner (held/acquiring), from (transferring), nil (free)
  WorkerId worker;         ///< held: the holder's; free with revoke_pending: the revoked holder's
  Epoch epoch = 0;
  /// Time to expiry (held), to the commit deadline (acquiring) or to the end of lock-delay
  /// (free). kNoExpiryMs: none (preemptible mode: kept by worker liveness, not by a TTL).
  std::uint32_t ttl_left_ms = 0;
  SandboxId reserved_for;  ///< free: reserved for this sandbox (nil if none); transferring: to
  /// free: a revoke is pending (not grantable until ttl_left_ms passes or `worker`, the
  /// revoked holder's worker, confirms the kill of the grant at revoked_epoch).
  bool revoke_pending = false;
  Epoch revoked_epoch = 0;
  /// free, reserved: ms until the reservation lapses; kNoExpiryMs while a lock-delay is pending
  /// (its TTL starts when that ends); 0 when not reserved.
  std::uint32_t reservation_left_ms = 0;
  /// How the lock-delay of the revoke that produced this epoch ended (none while pending).
  RevokeEnd revoke_ended = RevokeEnd::none;
  /// Sandboxes in the name's FIFO of waiters. Not part of the record's own encoding: carried by
  /// the waiter sections of ListPage and NameInfo, when asked for (else 0).
  std::uint32_t waiters = 0;
  friend bool operator==(const NameRecord&, const NameRecord&) = default;
};

/// NameRecord::ttl_left_ms of a lease that does not expire by TTL (preemptible mode).
inline constexpr std::uint32_t kNoExpiryMs = UINT32_MAX;

/// Answer to List. Filled by lockd until payload_bytes() would exceed kPayloadBytesMax.
struct ListPage {
  std::vector<NameRecord> entries;  ///< at most kListEntriesMax
  std::uint64_t next_cursor = 0;    ///< 0 = end of table
  /// Answers a List with `waiters`: after the entries, a u8 1 and one u32 per entry, its
  /// `waiters`. Without it every entry's `waiters` must be 0 (the encoder refuses: bad_count).
  bool with_waiters = false;
  friend bool operator==(const ListPage&, const ListPage&) = default;
};

/// One sandbox in a name's FIFO of waiters (NameInfo::waiters).
struct WaiterRecord {
  SandboxId sandbox;
  WorkerId worker;                 ///< the worker it will run on (the grant is bound to it)
  std::uint32_t ttl_left_ms = 0;   ///< its place is kept this much longer without a renewal; 0: lapsed
  friend bool operator==(const WaiterRecord&, const WaiterRecord&) = default;
};

/// Answer to Show. With `with_waiters` (answering a Show with waiters_from), a trailing
/// section: record.waiters (u32), waiters_from (u32), a u16 count and that many WaiterRecords
/// (the FIFO from index waiters_from on, as many as fit the datagram: page on with
/// waiters_from + count while it is below record.waiters).
struct NameInfo {
  NameRecord record;
  bool with_waiters = false;
  std::uint32_t waiters_from = 0;
  std::vector<WaiterRecord> waiters;  ///< position of waiters[i] in line: waiters_from + i + 1
  friend bool operator==(const NameInfo&, const NameInfo&) = default;
};

struct Counter {
  std::string key;  ///< snake_case, at most kCounterKeyBytesMax bytes, e.g. "refusal_held"
  std::uint64_t value = 0;
  friend bool operator==(const Counter&, const Counter&) = default;
};

/// Answer to Stats: generic {key, value} counters (at most kCountersMax, and fitting a datagram).
struct StatsAnswer {
  std::vector<Counter> counters;
  friend bool operator==(const StatsAnswer&, const StatsAnswer&) = default;
};

/// Answer to an authenticated datagram that could not be served: unknown version or type,
/// malformed payload, replay (codes from DecodeError), or a service error.
struct Error {
  ErrorCode code = ErrorCode::none;
  std::string message;  ///< at most kErrorTextBytesMax bytes
  /// stale_seq / replayed: the lowest seq the receiver accepts from this sender now (its
  /// window's highest + 1), so a sender restarted with a lower seq (a wall clock stepped back)
  /// resumes above it; the answer is authenticated with the sender's own key. 0 otherwise.
  std::uint64_t seq_floor = 0;
  friend bool operator==(const Error&, const Error&) = default;
};

/// Any message body. The variant index does not matter on the wire; type_of() gives the type.
using Body = std::variant<Acquire, Commit, Heartbeat, Release, TransferBegin, TransferComplete,
                          TransferAccept, Revoke, Reassign, WorkerHeartbeat, IsRunning, List, Show,
                          Stats, Grant, Deny, HeartbeatAck, Ok, TransferState, WorkerAck,
                          RunningAnswer, ListPage, NameInfo, StatsAnswer, Error, Revoked,
                          KillConfirmed, RevokedAck, Wait, Queued>;

/// The MessageType of a body.
MessageType type_of(const Body& body) noexcept;

/// The header fields (see the layout at the top of this file).
struct Header {
  std::uint8_t version = kVersion;
  MessageType type = MessageType::error;  ///< set by encode() from the body
  std::uint16_t flags = 0;
  WorkerId sender;
  std::uint64_t seq = 0;         ///< must be > 0
  std::uint64_t request_id = 0;  ///< answers echo the request's id
  std::uint16_t payload_len = 0; ///< set by encode()
  std::uint16_t key_id = 0;      ///< the key that tags the datagram (Sender sets its key's id)
  friend bool operator==(const Header&, const Header&) = default;
};

struct Message {
  Header header;
  Body body;
};

/// A datagram buffer (no allocation): bytes [0, size).
struct Datagram {
  std::array<std::uint8_t, kDatagramBytesMax> bytes{};
  std::uint16_t size = 0;
  std::span<const std::uint8_t> view() const noexcept { return {bytes.data(), size}; }
  std::span<std::uint8_t> buffer() noexcept { return {bytes.data(), bytes.size()}; }
};

class Authenticator;  // wire/auth.hpp

// ---------------------------------------------------------------------------------------------
// Encoding.

struct EncodeResult {
  std::size_t bytes = 0;  ///< datagram size (header + payload + tag); 0 on error
  EncodeError error = EncodeError::none;
  explicit operator bool() const noexcept { return error == EncodeError::none; }
};

/// Bytes the payload of `body` takes on the wire (lockd fills a ListPage/StatsAnswer while
/// payload_bytes(page) <= kPayloadBytesMax).
std::size_t payload_bytes(const Body& body) noexcept;

/// Encodes header + payload into `out` and signs it with `auth` (HMAC-SHA256 tag). header.type
/// and header.payload_len are taken from the body; header.version is ignored (kVersion is
/// written). Ids are not checked for nil: that is lockd's business (Refusal::bad_request). With auth == nullptr the tag is left zero
/// (for measurement and tests only: such a datagram fails authentication).
EncodeResult encode(const Header& header, const Body& body, const Authenticator* auth,
                    std::span<std::uint8_t> out) noexcept;

/// Rewrites the seq of an encoded datagram (header bytes 24..31) and signs it again with `auth`:
/// a retry with a fresh seq. False (nothing changed) if it is shorter than kDatagramBytesMin or
/// does not start with kMagic.
bool restamp(std::span<std::uint8_t> datagram, std::uint64_t seq, const Authenticator& auth) noexcept;

/// A heartbeat batch of any size goes out as heartbeat_chunks(n) datagrams, each its own request
/// (own request id): chunk i holds entries [i * kHeartbeatEntriesMax, ...), at most
/// kHeartbeatEntriesMax of them, in order, each entry exactly once.
constexpr std::size_t heartbeat_chunks(std::size_t entries) noexcept {
  return (entries + kHeartbeatEntriesMax - 1) / kHeartbeatEntriesMax;
}
/// Chunk `i` of a heartbeat batch (see heartbeat_chunks()), a view of `entries`; empty past the end.
constexpr std::span<const HeartbeatEntry> heartbeat_chunk(std::span<const HeartbeatEntry> entries,
                                                          std::size_t i) noexcept {
  const std::size_t first = i * kHeartbeatEntriesMax;
  if (first >= entries.size()) return {};
  return entries.subspan(first, std::min(kHeartbeatEntriesMax, entries.size() - first));
}

/// Encodes the Heartbeat {ttl_cap_ms, entries} straight from `entries` (at most
/// kHeartbeatEntriesMax, else too_large), without building a Heartbeat: the same bytes as
/// encode() of that Heartbeat. With heartbeat_chunk(), a batch of any size is sent from one
/// reusable Datagram, nothing allocated or copied on the way.
EncodeResult encode_heartbeat(const Header& header, std::uint32_t ttl_cap_ms, std::span<const HeartbeatEntry> entries,
                              const Authenticator* auth, std::span<std::uint8_t> out) noexcept;

/// The chunks of a heartbeat batch (heartbeat_chunk()) as Heartbeat messages, each carrying
/// ttl_cap_ms: for a caller that keeps them (a load generator); a sender needs none of it
/// (encode_heartbeat()).
std::vector<Heartbeat> split_heartbeat(std::span<const HeartbeatEntry> entries,
                                       std::uint32_t ttl_cap_ms);

// ---------------------------------------------------------------------------------------------
// Decoding: a total function over arbitrary bytes. It never reads outside `datagram`, never
// throws for bad input, and reports the first problem found with a reason and a text.

struct DecodeResult {
  DecodeError error = DecodeError::none;
  std::string detail;  ///< human text for the rejection (names the field / offset); empty if ok
  /// The header: valid when error is none or is_authenticated_reason(error) (the receiver uses it
  /// to address an Error answer); otherwise unspecified.
  Header header;
  Body body;  ///< valid when error is none
  explicit operator bool() const noexcept { return error == DecodeError::none; }
};

/// Checks size, magic and (if auth != nullptr) the tag, then version, type, flags, length and the
/// payload. With auth == nullptr the tag is not checked (measurement, tests, fuzzing).
DecodeResult decode(std::span<const std::uint8_t> datagram, const Authenticator* auth);

/// Only the header checks of decode() (size, magic, tag, version, type, flags, length); leaves
/// `body` untouched. Cheap: no allocation.
DecodeError decode_header(std::span<const std::uint8_t> datagram, const Authenticator* auth,
                          Header& out) noexcept;

/// What may end a request `self` sent: an answer (not a request) whose header passes
/// decode_header() under `auth` (tag included) and whose sender is not `self`. The tag alone
/// does not tell: a request of our own, reflected back at us by anyone on the path, carries our
/// own valid tag and the same request id.
bool is_answer_to(std::span<const std::uint8_t> datagram, const Authenticator& auth, const WorkerId& self) noexcept;

/// The request id of a datagram (header bytes 32..39), for matching an answer to its request:
/// nullopt if it is shorter than kDatagramBytesMin or does not start with kMagic. Checks neither
/// the tag nor version, type or length, so an answer from another protocol version (an
/// Error{unknown_version}) still finds its request. Decode the datagram before trusting it.
std::optional<std::uint64_t> request_id_of(std::span<const std::byte> datagram) noexcept;

/// Who a datagram claims to be and which key it claims to carry: header bytes 8..23 and 42..43,
/// read before authentication so a receiver can pick the key to check the tag with. nullopt
/// if the datagram is shorter than kDatagramBytesMin or does not start with kMagic.
struct KeyRef {
  WorkerId sender;
  std::uint16_t key_id = 0;
};
std::optional<KeyRef> key_ref_of(std::span<const std::uint8_t> datagram) noexcept;

/// The key-rejected notice (PROTOCOL.md "A wrong key"): what lockd sends, rate-limited, to the
/// source of a request it dropped for its key (a key id it does not have for that sender, or a
/// tag that does not verify). It is NOT a message of Body and carries no tag: lockd cannot
/// authenticate anything to a sender whose key it does not share, so anyone on the path can
/// forge one. A client therefore never lets it end a request; it only changes the wording of a
/// request that ends without an authentic answer ("lockd rejected our key" instead of "no
/// answer"). Layout: the 44-byte header (magic, version kVersion, type kKeyRejectedType, flags 0,
/// sender nil, seq 0, the dropped request's request id, payload_len 3, key_id 0), then the key id
/// the dropped datagram named (u16) and the reason (u8). 47 bytes: shorter than any datagram that
/// can be dropped for its key (kDatagramBytesMin), so a notice never amplifies, and a notice that
/// reaches a lockd is dropped there as truncated (never answered by another notice).
inline constexpr std::uint8_t kKeyRejectedType = 0xFE;
inline constexpr std::size_t kKeyRejectedBytes = kHeaderBytes + 3;
static_assert(kKeyRejectedBytes < kDatagramBytesMin);
enum class KeyRejectReason : std::uint8_t {
  unknown_key = 1,  ///< lockd has no key of that key id for the sender (rotated out, never loaded)
  bad_mac = 2,      ///< lockd has that key id, and the tag does not verify under it (another key)
};
std::string_view to_string(KeyRejectReason r) noexcept;
struct KeyRejected {
  std::uint64_t request_id = 0;
  std::uint16_t key_id = 0;  ///< the key id the dropped datagram named
  KeyRejectReason reason = KeyRejectReason::bad_mac;
  friend bool operator==(const KeyRejected&, const KeyRejected&) = default;
};
std::array<std::uint8_t, kKeyRejectedBytes> encode_key_rejected(const KeyRejected& n) noexcept;
/// The notice in `datagram`, or nullopt unless it is exactly one as encode_key_rejected writes
/// it (length, magic, version, type, zero flags, sender, seq and header key id, payload_len 3,
/// a known reason).
std::optional<KeyRejected> decode_key_rejected(std::span<const std::uint8_t> datagram) noexcept;

/// Parses the payload of a datagram whose header passed decode_header().
DecodeResult decode_payload(const Header& header, std::span<const std::uint8_t> datagram);

}  // namespace leasehold::wire
