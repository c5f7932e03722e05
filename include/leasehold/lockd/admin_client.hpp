// leasehold/lockd: a blocking client of lockd's protocol, for the CLI, tests and tools.
//
// One UDP socket, one request at a time: seal (HMAC, fresh seq), send, wait for the answer
// with the same request id, retrying the same bytes with backoff until the deadline
// (io/client.hpp request_blocking), then authenticate and decode the answer. Not thread-safe:
// one client per thread.
//
// Several lockd addresses (a replicated lockd, one leader at a time): the client sends to the
// one it last saw lead (the first at the start). An Error{not_leader, hint} is followed, within
// the request's timeout: to the hint at once if it is one of the addresses (at most as many times
// in a row as there are addresses), else to the next address after a short backoff; an address
// that does not answer within its share of the timeout (timeout / addresses, at least 100 ms)
// is left for the next. With one address, a not_leader is asked again after the backoff.
//
// Shards (a cluster of several, lease/shard.hpp): a request about a name is followed to its
// shard's leader by the same not_leader hints (a process of another shard names that shard's
// leader). A listing of the whole cluster (list_cluster) asks every configured address which
// shard it serves and whether it leads (Stats), then pages through each shard at its leader.
//
// Every call returns an `Answer`: the decoded answer body (Grant, Deny, Ok, ...) or, when
// there is none, a Status (lease/result.hpp): timeout (no answer before the deadline), io_error
// (cannot send), corrupt (a bad answer), refused (Error{...} from lockd; the body holds it),
// invalid_argument (the request cannot be encoded), permission_denied (no answer, but lockd sent
// a key-rejected notice: it does not accept this key; Answer::key_rejected). A Deny is an answer, not an error: the
// caller looks at `refusal`.
#pragma once

#include "leasehold/lease/result.hpp"
#include "leasehold/wire/auth.hpp"
#include "leasehold/wire/protocol.hpp"
#include "leasehold/wire/replay.hpp"
#include "leasehold/io/udp.hpp"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace leasehold::lockd {

inline constexpr std::int64_t kAdminTimeoutNsDefault = 2'000'000'000;  ///< per request

struct Answer {
  wire::Body body;  ///< valid when status is ok (and the Error{...} of a refused one)
  Status status;    ///< why there is no answer body (see the top of this file); ok on success
  std::uint32_t attempts = 0;
  /// timeout because no configured lockd led before the deadline (one answered not_leader):
  /// the message is "no lockd among A, B leads: ..." with what each said.
  bool no_leader = false;
  /// An unauthenticated key-rejected notice naming this request (wire::KeyRejected) arrived from
  /// while `rejected_by` was asked. With no authentic answer before the deadline the status is
  /// permission_denied (lockd dropped the request for its key); with one, the answer stands: a
  /// notice never ends a request early (anyone can forge one), it only says why a request that
  /// got no answer got none.
  std::optional<wire::KeyRejected> key_rejected;
  std::string rejected_by;
  /// Set with status timeout: the kernel reported ICMP port unreachable for the address(es)
  /// asked (nothing listens there), instead of silence. The message says so.
  bool nothing_listens = false;
  bool ok() const noexcept { return status.ok(); }
  Errc code() const noexcept { return status.code(); }
  /// Empty on success.
  const std::string& message() const noexcept { return status.message(); }
  /// The body as T, or nullptr (e.g. a Deny where a Grant was hoped for).
  template <class T>
  const T* as() const& noexcept {
    return ok() ? std::get_if<T>(&body) : nullptr;
  }
  /// Not on a temporary: the pointer would dangle.
  template <class T>
  const T* as() const&& = delete;
};

/// Ablation for the attack test (LEASEHOLD_ABLATE contains "notice-as-answer"): a key-rejected
/// notice ends the request as if it were lockd's answer, so a forged one fails the call.
bool notice_as_answer_ablated() noexcept;

class AdminClient {
 public:
  /// `self`: the sender id on the wire. With a worker key it is the key's worker (nil, or the
  /// same id; another throws std::invalid_argument), and lockd lets the client act only as that
  /// worker; with an admin key, or a cluster key (used directly, as an admin key: wire/auth.hpp),
  /// `self` (nil: a random one). `timeout_ns`: per request. Throws std::runtime_error if no UDP socket can be opened.
  AdminClient(const SocketAddress& lockd, const wire::WireKey& key, WorkerId self = {},
              std::int64_t timeout_ns = kAdminTimeoutNsDefault);
  /// The same with a replicated lockd's addresses (at least one, all of one family, no
  /// duplicates: io/address_list.hpp resolve_address_list); throws std::invalid_argument
  /// otherwise. The client follows the leader among them (top of this file).
  AdminClient(std::vector<SocketAddress> lockds, const wire::WireKey& key, WorkerId self = {},
              std::int64_t timeout_ns = kAdminTimeoutNsDefault);
  ~AdminClient();
  AdminClient(const AdminClient&) = delete;
  AdminClient& operator=(const AdminClient&) = delete;

  /// Any request body; the answer as decoded. Error{...} answers become `error`, except
  /// Error{not_leader}, which is followed (top of this file) until the timeout.
  Answer request(const wire::Body& body);

  // Typed helpers (DESIGN.md "Lock states"); each is request() with the matching body.
  Answer acquire(const std::string& name, SandboxId sandbox, WorkerId worker, std::uint32_t ttl_ms = 0,
                 bool two_phase = false);
  Answer commit(NameId name, SandboxId sandbox, Epoch epoch, WorkerId worker);
  Answer heartbeat(std::span<const wire::HeartbeatEntry> entries, std::uint32_t ttl_cap_ms = 0);
  Answer release(NameId name, SandboxId sandbox, Epoch epoch);
  /// `to_worker`: the worker `to` runs on (only it may take the reservation; nil is refused).
  Answer transfer_begin(NameId name, SandboxId from, Epoch epoch, SandboxId to, WorkerId to_worker);
  Answer transfer_complete(NameId name, Epoch new_epoch);
  Answer transfer_accept(NameId name, SandboxId to, WorkerId worker);
  /// expected_epoch 0: any; force: also revoke a Free name (see wire::Revoke).
  Answer revoke(NameId name, Epoch expected_epoch = 0, bool force = false);
  Answer reassign(NameId name, SandboxId to, WorkerId worker);
  Answer worker_heartbeat(WorkerId worker);
  Answer show(const std::string& name);
  Answer show(NameId name);
  /// show() with the name's FIFO of waiters: Show with waiters_from, paged until the NameInfo
  /// holds all of them (its `waiters` in order; pages taken while the FIFO moves may repeat or
  /// miss a waiter). A lockd from before waiters were listed (Error{trailing_bytes}) is asked
  /// plainly: its NameInfo has with_waiters false. Errors: as request().
  Answer show_waiters(const std::string& name);
  /// `waiters`: each entry's count of waiters wanted (wire::List::waiters); a lockd from before
  /// them (Error{trailing_bytes}) is asked again without (its page has with_waiters false).
  Answer list(std::uint64_t cursor = 0, std::uint16_t limit = 0, bool waiters = false);
  /// Pages through the whole table (bounded by `names_max`). Errors: as request(), or corrupt
  /// (an answer that is not a page, a cursor that does not advance).
  /// `waiters` non-null: each entry's count of waiters is asked for, and *waiters is set false
  /// when a page came without them (a lockd from before them: their counts are 0 then).
  Result<std::vector<wire::NameRecord>> list_all(std::size_t names_max = 1u << 20, bool* waiters = nullptr);
  Answer stats();
  /// Every counter: paged Stats requests (first = 0, then the count so far) until an empty page,
  /// as one StatsAnswer (its counters may exceed one datagram's kCountersMax). A lockd that does
  /// not page (Error{trailing_bytes}: older) is asked the unpaged way: one datagram's worth.
  /// Errors as request(); corrupt when the pages never end.
  Answer stats_all();
  /// stats_all() as key → value: every counter (one datagram's worth from a lockd that does not
  /// page). Errors: as request(), or corrupt (an answer that is not stats).
  Result<std::vector<wire::Counter>> counters();

  /// `body` sent to the configured address `index` alone (no leader followed; a not_leader is
  /// the Error it is, status refused), within the timeout.
  Answer request_at(std::size_t index, const wire::Body& body);
  /// Where each shard of the cluster is led: `leader[k]`, the index in lockds() of shard k's
  /// leader (nullopt when no configured address leads it); `said` what each address answered.
  struct ShardLeaders {
    unsigned shards = 1;
    std::vector<std::optional<std::size_t>> leader;
    std::vector<std::string> said;
  };
  /// Asks every configured address for its Stats (shard, shards, leading), each within a share
  /// of the timeout. Errors: timeout when no address answered; corrupt when two addresses report
  /// different shard counts.
  Result<ShardLeaders> shard_leaders();
  /// Every name of the cluster: list_all() for one shard (or a lockd that reports none); with
  /// several, each shard's pages from that shard's leader, one after the other, at most
  /// `names_max` names in all. Errors: as list_all and shard_leaders; timeout naming the shard
  /// and what each address said when a shard has no leader among the configured addresses.
  Result<std::vector<wire::NameRecord>> list_cluster(std::size_t names_max = 1u << 20, bool* waiters = nullptr);

  WorkerId self() const noexcept { return sender_.self(); }
  std::uint16_t key_id() const noexcept { return sender_.key_id(); }
  /// The id of the last request sent (tests replay it).
  std::uint64_t last_request_id() const noexcept { return next_request_id_ - 1; }
  /// Where the next request goes first: the lockd last seen to lead (or not yet asked).
  const SocketAddress& lockd() const noexcept { return lockds_[current_]; }
  const std::vector<SocketAddress>& lockds() const noexcept { return lockds_; }

 private:
  AdminClient(std::vector<SocketAddress> lockds, WorkerId self, const wire::WireKey& signing, std::string key_text,
              std::int64_t timeout_ns);
  std::vector<SocketAddress> lockds_;
  std::size_t current_ = 0;
  std::string key_text_;  ///< the key as its file names it (wire::key_text), for messages
  wire::Sender sender_;
  wire::Authenticator auth_;
  std::int64_t timeout_ns_;
  int fd_ = -1;
  std::uint64_t next_request_id_ = 1;
  std::uint64_t rng_ = 1;  ///< the not_leader backoff's jitter
  bool no_follow_ = false;  ///< request_at: a not_leader ends the request
};

}  // namespace leasehold::lockd
