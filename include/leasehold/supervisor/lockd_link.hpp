// leasehold/supervisor: the supervisor's authenticated UDP channel to lockd.
//
// One RequestClient (io/client.hpp) on the io thread's EventLoop, one wire::Sender that stamps
// and signs as this worker with this worker's own key (the header's sender is the worker id:
// lockd derives the key from it, so the tag proves the sender), answers authenticated and
// decoded with the same key. Every retry carries a fresh seq (lockd never executes a replayed
// one); an authenticated Error{stale_seq} (a restart after the wall clock was stepped back)
// moves the seq above lockd's window (its seq_floor) and the request is sent again. Typed calls with a
// CLOCK_BOOTTIME deadline each; the callback runs exactly once on the loop thread with the
// decoded answer, or with `status != answered`. `first_send_ns` is the send time of the first
// attempt: a lease is measured from it (DESIGN.md "Time"), whichever attempt lockd answered.
//
// lockd's own requests to this worker (IsRunning, preemptible mode; Revoked, a pushed
// revocation) arrive on the same socket and go to their handlers; they pass a wire::Receiver (replay window + answer cache).
// They are accepted from any source address (authenticated; each lockd process speaks under
// its own instance id, so each has its own replay window here) and answered to that address.
//
// Several lockd addresses (a replicated lockd, one leader at a time). The link has one current
// target, where every new call and every resend goes:
//   - an authenticated Error{not_leader, hint} is a redirect, never a call's result before its
//     deadline: a hint that is one of the configured addresses (and not the one that answered)
//     becomes the target and the call is resent at once (same request id, fresh seq); at most
//     as many times in a row as there are addresses, so two lockds naming each other cannot
//     make it spin. Otherwise (no hint, an address not configured, the spin bound) the target
//     moves past the lockd that answered (round robin) and the call is resent after a backoff
//     (RetryPolicy's, growing per call), so while no lockd leads the link does not spin either;
//   - an attempt that got no answer before its retry moves the target to the next address when
//     it went to the current one, and the retry goes to the target;
//   - answers from any lockd end the call they answer (also while it waits out a backoff).
//   With one address nothing moves: a not_leader is resent to it after the backoff.
// Shards (a cluster of S shards, lease/shard.hpp): the link keeps one current target per shard,
// and a call goes to the target of its request's shard (wire::shard_of_request; shard 0's for a
// request about no name). Each target moves as above, on its own: a not_leader from a process
// of another shard names that shard's leader. S is 1 until set_shards() (the supervisor reads it
// from lockd's Stats at start); every shard's target starts at shard 0's.
// Each lockd keeps its own replay window for this worker; the seq only grows, so every lockd
// sees it rise, and a stale_seq answer (a window left above us by an earlier run) moves the
// seq above that lockd's floor, once per lockd and call at most.
#pragma once

#include "leasehold/io/client.hpp"
#include "leasehold/io/loop.hpp"
#include "leasehold/lease/result.hpp"
#include "leasehold/supervisor/ports.hpp"
#include "leasehold/wire/protocol.hpp"
#include "leasehold/wire/replay.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace leasehold {

struct LockdLinkStats {
  std::uint64_t answers_bad = 0;       ///< authentic, but failed decoding
  std::uint64_t answers_forged = 0;    ///< named an outstanding request id, failed authentication:
                                       ///< dropped, the call keeps waiting for lockd's answer
  std::uint64_t is_running_answered = 0;
  std::uint64_t is_running_rejected = 0;
  std::uint64_t revocations_pushed = 0;  ///< Revoked from lockd, answered
  std::uint64_t late_answers = 0;      ///< answers that arrived after their call gave up
  std::uint64_t seq_resyncs = 0;       ///< stale_seq answers that moved our seq to lockd's floor
  std::uint64_t not_leader_answers = 0;  ///< Error{not_leader}: redirects (never a call's result)
  std::uint64_t not_leader_waits = 0;    ///< of those, resent after a backoff (no usable leader named)
  std::uint64_t leader_switches = 0;     ///< the target moved to another lockd address (any reason)
  std::uint64_t unconfigured_leader_hints = 0;  ///< not_leader hints naming an address not configured
  std::uint64_t calls_answered = 0;    ///< calls that got an authentic answer (not_leader included)
  std::uint64_t calls_unanswered = 0;  ///< calls that ended with no answer (deadline, no leader)
  std::int64_t last_answer_ns = 0;     ///< loop time of the last authentic answer to a call (0: none)
  std::int64_t last_unanswered_ns = 0; ///< loop time the last call ended unanswered (0: none)
  /// lockd's unauthenticated key-rejected notices (wire::KeyRejected): never an answer, only
  /// what the health text says when calls go unanswered ("lockd rejected our key").
  std::uint64_t key_rejected_notices = 0;
  std::int64_t last_key_rejected_ns = 0;  ///< loop time of the last notice (0: none)
  wire::KeyRejected last_key_rejected{};  ///< the last notice (its key id and reason)
};

class LockdLink final : public LockdPort {
 public:
  /// `lockds` are lockd's addresses (at least one, of one family, no duplicates: see
  /// io/address_list.hpp); the first is the first target. `key` is this worker's key (kind
  /// worker, for `self`). The socket binds to the local address that routes to every lockd
  /// address (the wildcard when none is found or they differ), so it receives nothing sent to
  /// the worker's other addresses. The link, or a Status: invalid_argument (no address, or
  /// mixed families), or from the errno of socket/bind (e.g. io_error, permission_denied)
  /// naming the UDP socket to lockd when it cannot be opened.
  static Result<std::unique_ptr<LockdLink>> open(EventLoop& loop, std::vector<SocketAddress> lockds,
                                                 WorkerId self, const wire::WireKey& key,
                                                 const RetryPolicy& retry);
  /// One lockd address.
  static Result<std::unique_ptr<LockdLink>> open(EventLoop& loop, const SocketAddress& lockd,
                                                 WorkerId self, const wire::WireKey& key,
                                                 const RetryPolicy& retry) {
    return open(loop, std::vector<SocketAddress>{lockd}, self, key, retry);
  }
  ~LockdLink();

  /// Sends `body` (a request type) with a fresh request id; `on_done` runs exactly once
  /// (also when the request cannot be sent: status deadline_passed with `problem`; and when
  /// no lockd led before the deadline: deadline_passed, "no lockd among ... leads").
  /// Retries (RequestClient's policy) resend the same bytes; a retry that reaches lockd while
  /// the first attempt's answer waits for durability is dropped there (wire::Receiver in-flight
  /// set), and a later retry gets the real answer from lockd's response cache.
  void call(const wire::Body& body, std::int64_t deadline_ns, LockdCallback on_done) override;
  /// call() of a Heartbeat, sealed straight from `entries` into the call's datagram.
  void call_heartbeat(std::span<const wire::HeartbeatEntry> entries, std::uint32_t ttl_cap_ms,
                      std::int64_t deadline_ns, LockdCallback on_done) override;

  /// lockd asks whether a sandbox runs; the handler answers synchronously.
  using IsRunningHandler = std::function<bool(const wire::IsRunning&)>;
  void set_is_running_handler(IsRunningHandler h) { is_running_ = std::move(h); }

  /// lockd pushes a revocation (wire::Revoked); the handler starts the kill and returns
  /// whether a sandbox of that grant runs (or is being placed) here. Answered RevokedAck.
  using RevokedHandler = std::function<bool(const wire::Revoked&)>;
  void set_revoked_handler(RevokedHandler h) { revoked_ = std::move(h); }

  /// An authenticated answer from lockd to a call that already gave up (its deadline passed):
  /// lockd acted on the request after all, e.g. a Grant nobody will heartbeat. The handler
  /// decides whether to undo it; answers are never answered back.
  using LateAnswerHandler = std::function<void(const wire::Body&)>;
  void set_late_answer_handler(LateAnswerHandler h) { late_answer_ = std::move(h); }

  /// A not_leader answer named as the leader an address that is not one of `lockds()`: the
  /// link does not go there (the configured list is the operator's), so the calls of that
  /// shard wait for a leader they can reach and the kill-switch fires if none comes. The handler
  /// runs (on the loop thread) once per hinted address in a row - again only after another
  /// one was hinted - with the hint and the lockd that answered, so the supervisor can say so
  /// long before the kill.
  using UnconfiguredLeaderHandler = std::function<void(const std::string& hint, const SocketAddress& from)>;
  void set_unconfigured_leader_handler(UnconfiguredLeaderHandler h) { unconfigured_leader_ = std::move(h); }

  /// A rotated worker key (SIGHUP): requests are signed with `key` from now on (retries too);
  /// answers and lockd's requests under the previous key id still check until the next
  /// rekey. Errors (then nothing changes): invalid_argument for another worker's key or a key
  /// that is not a worker key, the message naming both workers.
  Status rekey(const wire::WireKey& key);
  /// What try_key's probe came to: ok when lockd accepted the key (it is now the key);
  /// otherwise refused (lockd answered under another key id) or timeout (no answer).
  using KeyProbeDone = std::function<void(const Status& accepted)>;
  /// The same, but used only once lockd has shown that it has the key: a Stats request signed
  /// with `key` goes out (retried until `deadline_ns`, CLOCK_BOOTTIME); an answer authenticated
  /// under `key` (lockd answers with the key a request came under, and cannot answer one under a
  /// key it lacks) makes it the key (rekey), and `done` runs with ok. No such answer: nothing
  /// changes, requests stay signed with the current key, and `done` runs with why not; the key
  /// stays pending (pending_key_id()) for try_pending_key(). Errors at once (then nothing
  /// changes): as rekey, or busy while a probe is already in flight.
  Status try_key(const wire::WireKey& key, std::int64_t deadline_ns, KeyProbeDone done);
  /// Probes the pending key again (as try_key); false when there is none or a probe is in flight.
  bool try_pending_key(std::int64_t deadline_ns, KeyProbeDone done);
  /// The key id waiting for lockd's acceptance (0: none).
  std::uint16_t pending_key_id() const noexcept { return pending_ ? pending_->key.key_id : 0; }
  /// The key id requests are signed with.
  std::uint16_t key_id() const noexcept { return sender_.key_id(); }
  /// Calls in flight, including those waiting out a not_leader backoff.
  std::size_t outstanding() const noexcept { return client_->outstanding() + waiting_.size(); }
  const ClientStats& client_stats() const noexcept { return client_->stats(); }
  const LockdLinkStats& stats() const noexcept { return stats_; }
  /// The current target: the lockd believed to lead (shard 0's).
  const SocketAddress& lockd() const noexcept { return lockds_[current_.front()]; }
  /// The current target of shard `shard` (shard 0's for a shard beyond shards()).
  const SocketAddress& lockd(unsigned shard) const noexcept {
    return lockds_[current_[shard < current_.size() ? shard : 0]];
  }
  /// The cluster's shard count (1 until set_shards).
  unsigned shards() const noexcept { return static_cast<unsigned>(current_.size()); }
  /// Keeps a target per shard from now on (1..kShardsMax; anything else is ignored).
  void set_shards(unsigned shards);
  /// Every configured lockd address, in the order given.
  const std::vector<SocketAddress>& lockds() const noexcept { return lockds_; }
  /// The address the socket is bound to.
  SocketAddress local() const { return local_address(loop_.socket_fd(client_->socket())).value_or(SocketAddress{}); }

 private:
  struct Call;
  LockdLink(EventLoop& loop, std::vector<SocketAddress> lockds, WorkerId self, const wire::WireKey& key,
            const RetryPolicy& retry);
  /// A call with a fresh request id, not sealed yet.
  std::shared_ptr<Call> new_call(std::int64_t deadline_ns, LockdCallback on_done);
  /// Starts `c` once sealed (`enc` is its encoding's result: a failure is reported to on_done).
  void start_sealed(std::shared_ptr<Call> c, const wire::EncodeResult& enc, wire::MessageType type);
  void start(std::shared_ptr<Call> c);
  void finish(const std::shared_ptr<Call>& c, const RequestOutcome& o);
  /// An authentic answer to `c` (from `from`), at any time of the call.
  void on_answer(const std::shared_ptr<Call>& c, std::span<const std::uint8_t> answer, const SocketAddress& from);
  /// Error{not_leader, hint} answered `c` from `from`: resend now, later, or fail at the deadline.
  void redirect(const std::shared_ptr<Call>& c, const std::string& hint, const SocketAddress& from);
  /// A call's not_leader backoff ended.
  void resume(std::uint64_t request_id);
  void fail(const std::shared_ptr<Call>& c, std::string problem);
  std::string no_leader_text(const Call& c) const;
  std::optional<std::size_t> index_of(const SocketAddress& a) const;
  void move_to(unsigned shard, std::size_t index);
  std::size_t& target_of(unsigned shard);
  void on_unsolicited(const Datagram& d);
  void restamp(Call& c);
  Status check_worker_key(const wire::WireKey& key) const;
  /// The authenticator for an answer under the key id it names (ours, the previous one after
  /// a rekey, or the pending key if `pending_allowed`); nullptr if this worker has no such key.
  const wire::Authenticator* answer_key(std::span<const std::uint8_t> answer, bool pending_allowed);

  struct PendingKey {  ///< a reloaded key lockd has not yet been seen to accept
    wire::WireKey key;
    wire::Authenticator auth;
    bool probing = false;
    ~PendingKey();
  };

  EventLoop& loop_;
  std::vector<SocketAddress> lockds_;
  std::vector<std::size_t> current_{0};  ///< per shard: index of its target in lockds_
  /// The shard of each call the RequestClient holds, for its retarget hook.
  std::unordered_map<std::uint64_t, unsigned> call_shards_;
  RetryPolicy retry_;        ///< also the not_leader backoff
  std::uint64_t rng_;        ///< the not_leader backoff's jitter
  wire::Sender sender_;
  wire::SingleKeyring* keys_;  ///< owned by receiver_; also checks answers to our calls
  wire::Receiver receiver_;
  std::unique_ptr<RequestClient> client_;
  std::uint64_t next_request_id_;
  IsRunningHandler is_running_;
  RevokedHandler revoked_;
  LateAnswerHandler late_answer_;
  UnconfiguredLeaderHandler unconfigured_leader_;
  std::string last_unconfigured_hint_;  ///< the last hint the handler ran for
  LockdLinkStats stats_;
  std::unique_ptr<PendingKey> pending_;
  /// Calls waiting out a not_leader backoff (not in the RequestClient), by request id.
  std::unordered_map<std::uint64_t, std::shared_ptr<Call>> waiting_;
};

/// Short text of a wire answer for messages and logs ("deny held by <uuid> at epoch 4").
std::string describe_answer(const wire::Body& body);

}  // namespace leasehold
