// leasehold/io: the request client — one request datagram, one answer matched by request id.
//
// Used by the supervisor (heartbeats, acquire/release on lockd) and by the CLI. Codec-agnostic:
// it moves bytes and learns a datagram's request id from a RequestIdOf function supplied by
// the codec, so it does not depend on the message format.
//
// Rules (DESIGN.md "Time", "The wire protocol"):
//   - Every request has a CLOCK_BOOTTIME deadline; nothing is sent at or after it. The caller
//     caps it (the supervisor caps a refresh at the lease time left).
//   - Retries resend the same request id, so lockd's dedup answers a retry with the answer it
//     already gave (every request is idempotent). The bytes are the same unless a resend hook
//     (set_resend_hook) restamps them: the supervisor gives every retry a fresh sequence number,
//     because a receiver never executes a replayed one.
//   - Between attempts: exponential backoff with jitter (RetryPolicy), bounded by attempts_max.
//   - An answer ends a request only if its request id matches AND the answer check (the codec's
//     authentication, set_answer_check) accepts it. A datagram that names an outstanding id but
//     fails the check is dropped and counted, and the request keeps waiting for the real answer:
//     anyone who can reach the socket can guess an id, so an unauthenticated match would let
//     them end a heartbeat early (and so kill every sandbox whose lease it carried).
//   - Bounded: at most ClientLimits::outstanding_max requests in flight per client.
#pragma once

#include "leasehold/io/loop.hpp"
#include "leasehold/io/udp.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

namespace leasehold {

/// Extracts the request id from a request or answer datagram; nullopt if it has none (too
/// short, not ours). Provided by the codec; must not throw.
using RequestIdOf = std::optional<std::uint64_t> (*)(std::span<const std::byte> datagram) noexcept;

/// Backoff between attempts: delay(k) = min(first_backoff_ns * multiplier^(k-1), backoff_max_ns)
/// scaled by a uniform factor in [1 - jitter, 1 + jitter], k = 1 for the first retry.
/// Spacing strictly grows (below the cap) when multiplier * (1 - jitter) > 1 + jitter, which
/// holds for the defaults (2 * 0.8 > 1.2).
struct RetryPolicy {
  std::int64_t first_backoff_ns = 50'000'000;   ///< 50 ms
  std::int64_t backoff_max_ns = 1'000'000'000;  ///< 1 s
  std::uint32_t multiplier = 2;
  std::uint32_t jitter_percent = 20;            ///< 0..50
  std::uint32_t attempts_max = 16;              ///< datagrams per request, first one included
};

/// A seed for the backoff jitter drawn at start-up (getrandom; the clock and pid if it is
/// unavailable). Never 0. Production callers pass it (or leave jitter_seed 0); a simulator
/// passes one derived from its run seed, so a run's retries replay exactly.
std::uint64_t random_jitter_seed() noexcept;

/// The delay before retry `retry` (>= 1), in ns (>= 1). `rng_state` is a splitmix64 state,
/// advanced by one step. Pure apart from that state.
std::int64_t backoff_delay_ns(const RetryPolicy& policy, std::uint32_t retry,
                              std::uint64_t* rng_state) noexcept;

/// The longest delay backoff_delay_ns can return for `policy`: backoff_max_ns (at least 1)
/// scaled by 1 + jitter, rounded up. The longest gap between two attempts of one request.
std::int64_t longest_backoff_ns(const RetryPolicy& policy) noexcept;

enum class RequestStatus : std::uint8_t {
  answered = 0,
  deadline_passed = 1,  ///< no answer before the deadline (also after attempts_max)
  cancelled = 2,        ///< cancel() was called (its handler still runs, once)
};
const char* to_string(RequestStatus status) noexcept;

/// What a request came to. `answer` points into a loop buffer: valid during the handler only.
struct RequestOutcome {
  RequestStatus status = RequestStatus::deadline_passed;
  std::uint64_t request_id = 0;
  std::span<const std::byte> answer;
  std::uint32_t attempts = 0;        ///< datagrams sent
  std::int64_t first_send_ns = 0;    ///< CLOCK_BOOTTIME of the first send: measure lease validity
                                     ///< from here (the answer may be to any attempt)
  std::int64_t last_send_ns = 0;
  SocketAddress from;                ///< answered: where the answer came from (any address)
};
using AnswerHandler = std::function<void(const RequestOutcome&)>;
/// Called right before each send (attempt 1 = the first), for RTT statistics and tests.
using SendObserver = std::function<void(std::uint64_t request_id, std::uint32_t attempt,
                                        std::int64_t send_ns)>;
/// Called before every attempt after the first with the request's bytes, which it may rewrite
/// in place (same length, same request id): e.g. a fresh sequence number and tag.
using ResendHook = std::function<void(std::span<std::byte> request)>;
/// Called before every attempt after the first, before the resend hook, with the address the
/// previous attempt went to, which it may change: that attempt and the later ones go to the new
/// one (a client of several service addresses moves on from one that did not answer).
using RetargetHook = std::function<void(std::uint64_t request_id, SocketAddress& to)>;
/// Decides whether a datagram whose request id matches an outstanding request is authentic
/// (e.g. its HMAC checks under the key it names). Must not throw. An empty check accepts all.
using AnswerCheck = std::function<bool(std::span<const std::byte> answer)>;

struct ClientLimits {
  std::uint32_t outstanding_max = 256;  ///< requests in flight; start() refuses beyond (-EBUSY)
};

struct ClientStats {
  std::uint64_t requests = 0;
  std::uint64_t answered = 0;
  std::uint64_t deadlines_passed = 0;
  std::uint64_t retries = 0;             ///< datagrams sent after the first per request
  std::uint64_t sends_refused = 0;       ///< loop refused a send (in-flight bound): retried later
  std::uint64_t answers_unmatched = 0;   ///< no request id, or no outstanding request with it
  std::uint64_t answers_forged = 0;      ///< an outstanding id, but the answer check refused it
};

/// Asynchronous client on an EventLoop (loop thread only). Owns one UDP socket on the loop and
/// needs one loop timer per outstanding request (size LoopConfig::timers_max for it). Destroy it
/// before the loop. Handlers must not throw (see loop.hpp).
class RequestClient {
 public:
  /// `jitter_seed` seeds the backoff jitter (0: random_jitter_seed()). Times are read from the
  /// loop's Clock (LoopConfig::clock): start() and each send read it, a retry timer uses the
  /// turn's reading.
  RequestClient(EventLoop& loop, RequestIdOf id_of, RetryPolicy policy = {},
                ClientLimits limits = {}, std::uint64_t jitter_seed = 0);
  /// Closes the socket and drops outstanding requests without running their handlers.
  ~RequestClient();
  RequestClient(const RequestClient&) = delete;
  RequestClient& operator=(const RequestClient&) = delete;

  /// Opens the client's UDP socket bound to `bind_to` and registers it. 0 or -errno
  /// (-EBUSY: the loop's socket pool is full; -EALREADY: already open).
  int open(const SocketAddress& bind_to);
  SocketId socket() const noexcept { return socket_; }

  /// Sends `request` (its id taken with id_of) to `to` and calls `on_done` once: answered,
  /// deadline passed, or cancelled. Returns 0, or without calling on_done:
  /// -EINVAL (no request id, or empty), -EMSGSIZE (> kUdpPayloadBytesMax), -ETIMEDOUT (deadline
  /// not in the future), -EEXIST (that id is outstanding), -EBUSY (outstanding_max reached or
  /// no timer left), -ENOTCONN (open() not done).
  int start(std::span<const std::byte> request, const SocketAddress& to,
            std::int64_t deadline_boottime_ns, AnswerHandler on_done);
  /// Ends an outstanding request now (handler runs with `cancelled`). False if not outstanding.
  bool cancel(std::uint64_t request_id);
  std::size_t outstanding() const noexcept { return outstanding_; }

  /// Datagrams on this socket that answer no outstanding request (e.g. lockd asking "is this
  /// sandbox running?") go here; without a handler they are counted and dropped.
  void set_unsolicited_handler(RecvHandler handler) { unsolicited_ = std::move(handler); }
  void set_send_observer(SendObserver observer) { observer_ = std::move(observer); }
  void set_resend_hook(ResendHook hook) { resend_hook_ = std::move(hook); }
  void set_retarget_hook(RetargetHook hook) { retarget_hook_ = std::move(hook); }
  /// Authenticates a matching answer before it ends its request (see the rules above).
  void set_answer_check(AnswerCheck check) { check_ = std::move(check); }
  const ClientStats& stats() const noexcept { return stats_; }

 private:
  struct Pending;
  void on_datagram(const Datagram& d);
  void on_timer(std::uint32_t index, std::uint32_t gen);
  void send_attempt(Pending& p);
  void schedule(std::uint32_t index);
  void finish(std::uint32_t index, RequestStatus status, std::span<const std::byte> answer,
              const SocketAddress& from = {});
  Pending* find(std::uint64_t request_id, std::uint32_t* index);

  EventLoop& loop_;
  RequestIdOf id_of_;
  RetryPolicy policy_;
  ClientLimits limits_;
  std::uint64_t rng_state_;
  SocketId socket_;
  std::vector<Pending> pending_;
  std::size_t outstanding_ = 0;
  RecvHandler unsolicited_;
  SendObserver observer_;
  ResendHook resend_hook_;
  RetargetHook retarget_hook_;
  AnswerCheck check_;
  ClientStats stats_;
};

/// The blocking variant for the CLI: no loop, one socket, poll(2) between attempts.
struct BlockingOutcome {
  RequestStatus status = RequestStatus::deadline_passed;
  int error = 0;                     ///< -errno if the request could not be sent at all
  std::size_t answer_bytes = 0;      ///< bytes written to `answer_out`
  std::uint32_t attempts = 0;
  std::int64_t first_send_ns = 0;
  /// ICMP port-unreachable reports for `to` read from the socket's error queue (only with
  /// enable_recv_errors on it): nothing listened at `to` when a datagram arrived there. Like
  /// any unauthenticated datagram it ends nothing; the caller words a deadline with it.
  std::uint32_t port_unreachable = 0;
};

/// Sees every datagram that arrives while request_blocking waits and does not end the request
/// (another request id, or one `check` refuses): e.g. an unauthenticated notice that the caller
/// records and that must never count as the answer. Must not throw.
using DatagramObserver = std::function<void(std::span<const std::byte> datagram)>;

/// Sends `request` from `fd` (a UDP socket, blocking or not) to `to`, retrying per `policy`,
/// until an answer with the same request id that `check` accepts arrives or the deadline
/// passes. Other datagrams (and matching ones the check refuses) are discarded. An answer
/// longer than `answer_out` yields error -EMSGSIZE. `others` sees the datagrams that do not end
/// the request. With enable_recv_errors on `fd`, ICMP port-unreachable reports for `to` are
/// counted (port_unreachable) and the request goes on until the deadline.
BlockingOutcome request_blocking(int fd, std::span<const std::byte> request, const SocketAddress& to,
                                 std::int64_t deadline_boottime_ns, RequestIdOf id_of,
                                 std::span<std::byte> answer_out, const RetryPolicy& policy = {},
                                 std::uint64_t jitter_seed = 0, const AnswerCheck& check = {},
                                 const DatagramObserver& others = {});

}  // namespace leasehold
