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
};

class LockdLink final : public LockdPort {
 public:
  /// `lockd` is the address of lockd; `key` is this worker's key (kind worker, for `self`).
  /// The socket binds to the local address that routes to lockd (the wildcard only if none is
  /// found), so it receives nothing sent to the worker's other addresses.
  /// The link, or a Status (from the errno of socket/bind, e.g. io_error, permission_denied)
  /// naming the UDP socket to lockd when it cannot be opened.
  static Result<std::unique_ptr<LockdLink>> open(EventLoop& loop, const SocketAddress& lockd,
                                                 WorkerId self, const wire::WireKey& key,
                                                 const RetryPolicy& retry);
  ~LockdLink();

  /// Sends `body` (a request type) with a fresh request id; `on_done` runs exactly once
  /// (also when the request cannot be sent: status deadline_passed with `problem`).
  /// Retries (RequestClient's policy) resend the same bytes; a retry that reaches lockd while
  /// the first attempt's answer waits for durability is dropped there (wire::Receiver in-flight
  /// set), and a later retry gets the real answer from lockd's response cache.
  void call(const wire::Body& body, std::int64_t deadline_ns, LockdCallback on_done) override;

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
  std::size_t outstanding() const noexcept { return client_->outstanding(); }
  const ClientStats& client_stats() const noexcept { return client_->stats(); }
  const LockdLinkStats& stats() const noexcept { return stats_; }
  const SocketAddress& lockd() const noexcept { return lockd_; }
  /// The address the socket is bound to.
  SocketAddress local() const { return local_address(loop_.socket_fd(client_->socket())).value_or(SocketAddress{}); }

 private:
  struct Call;
  LockdLink(EventLoop& loop, const SocketAddress& lockd, WorkerId self, const wire::WireKey& key,
            const RetryPolicy& retry);
  void start(std::shared_ptr<Call> c);
  void finish(const std::shared_ptr<Call>& c, const RequestOutcome& o);
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
  SocketAddress lockd_;
  wire::Sender sender_;
  wire::SingleKeyring* keys_;  ///< owned by receiver_; also checks answers to our calls
  wire::Receiver receiver_;
  std::unique_ptr<RequestClient> client_;
  std::uint64_t next_request_id_;
  IsRunningHandler is_running_;
  RevokedHandler revoked_;
  LateAnswerHandler late_answer_;
  LockdLinkStats stats_;
  std::unique_ptr<PendingKey> pending_;
};

/// Short text of a wire answer for messages and logs ("deny held by <uuid> at epoch 4").
std::string describe_answer(const wire::Body& body);

}  // namespace leasehold
