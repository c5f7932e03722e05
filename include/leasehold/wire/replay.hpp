// leasehold/io: replay protection and idempotent retries, the receiver-side policy of the wire
// protocol (DESIGN.md "The wire protocol").
//
// - ReplayWindow: per-sender anti-replay window over `seq`, the sliding bitmap of RFC 4303
//   §3.4.3 (IPsec ESP): the highest seq seen plus a 64-bit bitmap of the 64 seqs below it. A seq
//   above the highest is new; one inside the window is new unless its bit is set; one below the
//   window is stale. O(1), no allocation.
// - Receiver: authenticates, checks the sender's window, answers retries from a bounded response
//   cache keyed by (sender, request_id), and decodes. lockd (and a supervisor, for lockd's
//   requests and answers) calls admit() on every datagram and remember_answer() for every answer
//   it sends.
// - Sender: stamps seq (strictly increasing) and signs.
//
// Bounds and their consequences:
// - kSendersMax windows; beyond it the least recently heard sender is evicted. An evicted sender
//   is new again: one datagram of it recorded before eviction could be accepted once more. The
//   damage is bounded by the lease rules (requests carry epochs; a replayed acquire/release of an
//   old epoch is refused as stale_epoch, a replayed heartbeat refreshes only a lease that is still
//   held by that same epoch).
// - kCachedAnswersMax answers; beyond it the oldest is dropped (FIFO). A retry whose answer was
//   dropped is re-executed — correct, because every request is idempotent under its epoch — or,
//   if it reuses a seq already in the window, rejected as replayed.
//   The cache holds at most kCachedAnswersMax × kDatagramBytesMax bytes (about 5.7 MB).
// - kInFlightMax requests in flight: delivered, their answer deferred (lockd answers a change
//   only once its store made it durable) and not yet remembered. A retry of one (same request id
//   and digest, new or replayed seq) is dropped silently and counted (in_flight_retries): its
//   answer is coming, and the next retry gets it from the cache. An entry leaves the set when
//   its answer is remembered, when it is abandoned (the service dropped the request), or
//   kInFlightExpiryNs after it was deferred, so a request that never gets an answer cannot pin
//   its id; a retry after that is handled as if the request were new.
// - A resent answer is the identical datagram, with its original seq: a requester that already
//   received it rejects the copy as replayed, which is the right outcome (it has the answer).
//   It goes only to the address the answer was first sent to (the request's source), only
//   while the retry's seq is inside the sender's window, at most kResendsPerAnswerMax times
//   and resends at least kResendIntervalNs apart: a captured request replayed from other ports
//   is not reflected (counted in DecodeStats::resends_refused).
// - Error answers to replayed or stale datagrams are at most one per kErrorAnswerIntervalNs per
//   sender (the rest dropped, counted in DecodeStats::error_answers_suppressed), and go only to
//   the address the sender's last accepted datagram came from (else dropped, counted in
//   error_answers_refused_source): a captured datagram replayed from other ports draws nothing.
//   The one exception is a stale_seq after that address has been silent kForeignErrorSilenceNs
//   (a sender restarted on a new port below its window learns seq_floor), once per
//   kForeignErrorIntervalNs.
// - Seq numbers are below kSeqLimit (2^63): a higher one is refused (seq_out_of_range), so the
//   window's highest seq + 1 cannot overflow; a Sender never makes one (seq_exhausted).
// - A seq that would move a window above the receiver's CLOCK_REALTIME + kSeqAheadMaxNs is
//   refused (seq_jump, answered like a stale one, never recorded). Seeds are the sender's wall
//   clock (seq_seed) and a sender makes far fewer than one datagram per nanosecond, so an honest
//   seq is at most the clock offset between the two hosts ahead. So no window is ever more than
//   kSeqAheadMaxNs ahead of the receiver's clock, and its seq_floor is always one a sender can
//   continue from: one datagram under a worker's key (seq 2^63-1) can no longer leave the worker
//   without a usable seq; its running or restarted supervisor resyncs from the stale_seq answer.
// - A replayed seq is never executed, heartbeats included: a retry needs a fresh seq
//   (Sender::restamp), and the answer of one whose request was answered comes from the cache.
// - Keys: a Keyring picks the key per (sender, key id) before the tag is checked (wire/auth.hpp);
//   admin senders have their own windows, so an admin key cannot move a worker's window.
// - After a receiver restart all windows are empty: the same consequence as eviction.
// - A sender's seq must grow across its own restarts: seed it with seq_seed() (see there).
#pragma once

#include "leasehold/wire/auth.hpp"
#include "leasehold/wire/address.hpp"
#include "leasehold/wire/protocol.hpp"

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

namespace leasehold::wire {

inline constexpr std::size_t kReplayWindowSeqs = 64;
inline constexpr std::size_t kSendersMax = 16384;
inline constexpr std::size_t kCachedAnswersMax = 4096;
inline constexpr std::size_t kInFlightMax = 4096;
/// Longest a deferred request stays in flight without an answer (a store commit that takes
/// longer than this has failed; the retry is then re-executed, which is safe: requests are
/// idempotent under their epoch).
inline constexpr std::int64_t kInFlightExpiryNs = 10'000'000'000;
inline constexpr std::uint32_t kResendsPerAnswerMax = 16;          ///< a client's attempts_max
inline constexpr std::int64_t kResendIntervalNs = 5'000'000;        ///< between resends of one answer
inline constexpr std::int64_t kErrorAnswerIntervalNs = 10'000'000;  ///< replay errors per sender
/// A stale_seq from another address than the sender's last datagram is answered only once that
/// address has been silent this long (the sender restarted on a new port) ...
inline constexpr std::int64_t kForeignErrorSilenceNs = 1'000'000'000;
/// ... and at most once per this interval per sender.
inline constexpr std::int64_t kForeignErrorIntervalNs = 1'000'000'000;
/// Farthest a seq may be above the receiver's CLOCK_REALTIME nanoseconds (one hour): the wall
/// clock offset between two hosts that a sender's seq_seed() may show. Above it: seq_jump.
inline constexpr std::uint64_t kSeqAheadMaxNs = 3'600'000'000'000;

/// RFC 4303 §3.4.3 sliding window over one sender's seq numbers.
class ReplayWindow {
 public:
  /// none if `seq` is new (not yet recorded), replayed if already seen, stale_seq if below the
  /// window or zero. Does not record.
  DecodeError check(std::uint64_t seq) const noexcept;
  /// Records `seq` (which check() accepted).
  void record(std::uint64_t seq) noexcept;
  /// Every seq up to `seq` counts as seen (a floor carried over from elsewhere: a lockd taking
  /// over from another). No effect when the window is already at or above it.
  void raise_floor(std::uint64_t seq) noexcept;
  std::uint64_t highest() const noexcept { return highest_; }

 private:
  std::uint64_t highest_ = 0;  ///< 0 = nothing seen yet
  std::uint64_t bitmap_ = 0;   ///< bit i set = seq (highest_ - i) seen
};

/// A seed for Sender::first_seq that grows across restarts of the sender: nanoseconds of
/// CLOCK_REALTIME. Used only to order seq numbers, never as a deadline (DESIGN.md "Time").
/// A sender that sends more than one datagram per nanosecond, or a wall clock stepped back by more
/// than the previous run's lifetime, restarts below its old window: its first datagram is
/// rejected as stale_seq, and the authenticated Error carries seq_floor (the window's highest
/// + 1), which the sender adopts (Sender::advance_to) before its retry. The window never moves
/// back, so no old datagram becomes acceptable again.
std::uint64_t seq_seed() noexcept;

/// CLOCK_REALTIME nanoseconds (0 if unreadable): what a receiver bounds seq numbers by
/// (kSeqAheadMaxNs); LEASEHOLD_TEST_SEQ_SEED does not change it.
std::uint64_t realtime_ns() noexcept;

/// Ablation for tests (LEASEHOLD_ABLATE contains "no-seq-resync"): a sender keeps its seq after
/// an Error{stale_seq}, as before seq_floor existed.
bool seq_resync_ablated() noexcept;

/// Sends as one identity: stamps strictly increasing seq numbers and signs.
class Sender {
 public:
  Sender(WorkerId self, std::uint64_t first_seq, const WireKey& key);

  /// Encodes and signs `body` as a datagram with the next seq. `request_id`: a new id for a new
  /// request, the same id for a retry; an answer uses the id of the request it answers.
  EncodeResult seal(std::uint64_t request_id, const Body& body, Datagram& out,
                    std::uint16_t flags = 0) noexcept;
  EncodeResult seal(std::uint64_t request_id, const Body& body, std::span<std::uint8_t> out,
                    std::uint16_t flags = 0) noexcept;

  /// A Heartbeat {ttl_cap_ms, entries} sealed straight from its entries (encode_heartbeat(): at
  /// most kHeartbeatEntriesMax; a batch is sent chunk by chunk, heartbeat_chunk()).
  EncodeResult seal_heartbeat(std::uint64_t request_id, std::uint32_t ttl_cap_ms,
                              std::span<const HeartbeatEntry> entries, Datagram& out) noexcept;

  /// The same with another key (lockd answers each worker with that worker's key): `key_id`
  /// goes into the header.
  EncodeResult seal_with(const Authenticator& auth, std::uint16_t key_id, std::uint64_t request_id,
                         const Body& body, Datagram& out, std::uint16_t flags = 0) noexcept;
  /// From now on sign with `key` (a rotated key of the same sender); the seq continues.
  void rekey(const WireKey& key);
  /// Gives a sealed datagram (of this sender) the next seq, this sender's key id and a new tag
  /// with its current key: a retry (also of a datagram sealed before a rekey()).
  bool restamp(std::span<std::uint8_t> datagram) noexcept;
  /// The same with another key (`key_id` goes into the header): a retry of a datagram sealed
  /// with seal_with().
  bool restamp(std::span<std::uint8_t> datagram, const Authenticator& auth, std::uint16_t key_id) noexcept;
  /// The next seq is at least `seq` (an authenticated Error{stale_seq}'s seq_floor). A floor
  /// at or above kSeqLimit is ignored (no receiver makes one).
  void advance_to(std::uint64_t seq) noexcept {
    if (seq > next_seq_ && seq < kSeqLimit) next_seq_ = seq;
  }

  WorkerId self() const noexcept { return self_; }
  std::uint64_t next_seq() const noexcept { return next_seq_; }
  std::uint16_t key_id() const noexcept { return key_id_; }
  Authenticator& authenticator() noexcept { return auth_; }

 private:
  EncodeResult seal_into(const Authenticator& auth, std::uint16_t key_id, std::uint64_t request_id,
                         const Body& body, std::span<std::uint8_t> out, std::uint16_t flags) noexcept;
  WorkerId self_;
  std::uint64_t next_seq_;
  std::uint16_t key_id_;
  Authenticator auth_;
};

/// What to do with a received datagram.
enum class Verdict : std::uint8_t {
  deliver,       ///< a new, authentic, well-formed message: execute it (message is set)
  resend,        ///< a retry (or duplicate) of an answered request: send cached_answer again
  answer_error,  ///< authentic but rejected: answer Error{error_code_of(reason), detail}
                 ///< addressed to message.header.sender / request_id (see error_answer())
  drop,          ///< not authentic (or malformed before the tag): drop silently, it is counted
};

std::string_view to_string(Verdict v) noexcept;

/// Identifies a request for the response cache: (sender, request_id) plus a digest of the
/// request's type and payload, so a request id reused for a *different* request is not answered
/// with the old answer.
struct RequestKey {
  WorkerId sender;
  std::uint64_t request_id = 0;
  std::uint64_t digest = 0;  ///< kNoDigest: a request whose answers are never cached
  friend bool operator==(const RequestKey&, const RequestKey&) = default;
};

/// RequestKey::digest of a request admitted without one (see answer_may_be_cached()). No
/// computed digest has this value. Receiver::remember_answer() caches nothing and
/// Receiver::defer() tracks nothing for such a key: a retry of it is handled as new.
inline constexpr std::uint64_t kNoDigest = 0;

/// Whether the answers to requests of type `t` may be cached or deferred (Receiver::
/// remember_answer(), Receiver::defer()), so that admit() digests their payload. Not for
/// heartbeats: lockd answers them at once or after a durable mark, never cached nor tracked
/// (they are idempotent, and the bulk of its traffic); nor for answers, which nobody answers.
/// A heartbeat that reuses the request id of a cached or deferred request is still digested at
/// that moment and told apart from it (request_id_reused).
constexpr bool answer_may_be_cached(MessageType t) noexcept {
  return is_request(t) && t != MessageType::heartbeat;
}

struct Admission {
  Verdict verdict = Verdict::drop;
  DecodeError reason = DecodeError::none;  ///< why, for answer_error and drop
  std::string detail;                       ///< human text for answer_error / drop
  Message message;  ///< deliver: the message; answer_error: header valid, body unspecified
  std::span<const std::uint8_t> cached_answer;  ///< resend: valid until the next admit/remember
  RequestKey key;  ///< deliver/answer_error: pass to remember_answer() with the answer sent
                   ///< (digest kNoDigest unless answer_may_be_cached(type))
  Authority authority = Authority::none;  ///< what the datagram's key proves (authentic only)
  std::uint16_t key_id = 0;               ///< the key that tagged it: answer with the same
  /// The key that checked the tag (authentic only); valid until the next admit().
  const Authenticator* auth = nullptr;
  std::uint64_t seq_floor = 0;  ///< answer_error stale_seq/replayed: see Error::seq_floor
};

/// The Error body to answer an Admission with verdict answer_error.
Error error_answer(const Admission& a);

/// Receiver-side policy: authenticate → replay window → response cache → decode.
/// Not thread-safe: one per receiving thread. Memory is bounded by the limits.
class Receiver {
 public:
  struct Limits {
    std::size_t senders_max = kSendersMax;
    std::size_t cached_answers_max = kCachedAnswersMax;
    std::size_t in_flight_max = kInFlightMax;
    std::int64_t in_flight_expiry_ns = kInFlightExpiryNs;
    /// Ablation (tests only, LEASEHOLD_ABLATE=reflection): resend cached answers to any source,
    /// with no rate bound, and answer every replay with an error.
    bool ablate_reflection_bounds = false;
    /// Ablation (tests only, LEASEHOLD_ABLATE=seq-unbounded): accept a seq at or above
    /// kSeqLimit, as before the limit (the window's floor then wraps to 0).
    bool ablate_seq_limit = false;
    /// Ablation (tests only, LEASEHOLD_ABLATE=seq-jump): accept a seq however far above the
    /// receiver's wall clock, as before seq_jump (one datagram could move a window to 2^63-1).
    bool ablate_seq_jump = false;
  };
  /// One key (SingleKeyring): a supervisor checking lockd, tests.
  explicit Receiver(const WireKey& key);
  Receiver(const WireKey& key, Limits limits);
  /// Keys by (sender, key id): lockd (ClusterKeyring).
  Receiver(std::unique_ptr<Keyring> keys, Limits limits);
  ~Receiver();
  Receiver(const Receiver&) = delete;
  Receiver& operator=(const Receiver&) = delete;

  /// Decides on one datagram. Order: size/magic → tag (drop if not authentic) → version/type/
  /// flags/length (answer_error) → response cache by (sender, request_id): hit → resend (also for
  /// a replayed seq; a hit for a different request → answer_error request_id_reused) → in-flight
  /// set: the same request deferred and not yet answered → drop (reason none, counted in
  /// stats().in_flight_retries) → replay window (replayed / stale_seq → answer_error) → payload
  /// (answer_error if malformed) → deliver. The seq of every authentic datagram that passes the
  /// window is recorded. Every outcome is counted in stats(). `now_ns`: CLOCK_BOOTTIME, used
  /// only to expire in-flight entries.
  /// `from`: the datagram's source address; a cached answer is resent only to the address it
  /// was first sent to (nullptr: no check, for tests of other rules).
  Admission admit(std::span<const std::uint8_t> datagram, const SocketAddress* from, std::int64_t now_ns);
  Admission admit(std::span<const std::uint8_t> datagram, std::int64_t now_ns) {
    return admit(datagram, nullptr, now_ns);
  }

  /// Marks a delivered request (its Admission::key) as in flight: its answer will be sent later.
  /// Until remember_answer() or abandon() for the same key, or in_flight_expiry_ns after `now_ns`
  /// (CLOCK_BOOTTIME), retries of it are dropped silently instead of being re-executed or
  /// rejected as replayed. Returns false (and marks nothing) when limits.in_flight_max
  /// unexpired requests are already in flight; retries of this one are then handled as new.
  bool defer(const RequestKey& request, std::int64_t now_ns);
  /// The deferred request will not be answered (the service dropped it): retries are handled
  /// as new again. No effect for a key that is not in flight.
  void abandon(const RequestKey& request) noexcept;

  /// Caches the answer sent for the request admit() delivered (its Admission::key), so a retry of
  /// the same request id gets these exact bytes again instead of being re-executed. Answers
  /// longer than kDatagramBytesMax are ignored. The request is no longer in flight.
  /// `to`: where the answer goes (the request's source); resends go only there.
  void remember_answer(const RequestKey& request, std::span<const std::uint8_t> answer,
                       const SocketAddress& to = {});

  /// The highest seq taken from worker `sender` (its own key's window), 0 when none is known.
  std::uint64_t highest_seq(const WorkerId& sender) const noexcept;
  /// Worker `sender`'s seqs up to `seq` count as seen: a datagram of it at or below `seq` is
  /// refused as replayed or stale (a lockd that takes over from another seeds the floors the
  /// other recorded durably, so a datagram captured there is not executed again here).
  void raise_floor(const WorkerId& sender, std::uint64_t seq);

  const DecodeStats& stats() const noexcept;
  std::size_t senders() const noexcept;
  std::size_t cached_answers() const noexcept;
  std::size_t in_flight() const noexcept;
  Keyring& keyring() noexcept;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace leasehold::wire
