// leasehold/lockd: a blocking client of lockd's protocol, for the CLI, tests and tools.
//
// One UDP socket, one request at a time: seal (HMAC, fresh seq), send, wait for the answer
// with the same request id, retrying the same bytes with backoff until the deadline
// (io/client.hpp request_blocking), then authenticate and decode the answer. Not thread-safe:
// one client per thread.
//
// Every call returns an `Answer`: the decoded answer body (Grant, Deny, Ok, ...) or, when
// there is none, a Status (lease/result.hpp): timeout (no answer before the deadline), io_error
// (cannot send), corrupt (a bad answer), refused (Error{...} from lockd; the body holds it),
// invalid_argument (the request cannot be encoded). A Deny is an answer, not an error: the
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

class AdminClient {
 public:
  /// `self`: the sender id on the wire. With a worker key it is the key's worker (nil, or the
  /// same id; another throws std::invalid_argument), and lockd lets the client act only as that
  /// worker; with an admin key, or a cluster key (used directly, as an admin key: wire/auth.hpp),
  /// `self` (nil: a random one). `timeout_ns`: per request. Throws std::runtime_error if no UDP socket can be opened.
  AdminClient(const SocketAddress& lockd, const wire::WireKey& key, WorkerId self = {},
              std::int64_t timeout_ns = kAdminTimeoutNsDefault);
  ~AdminClient();
  AdminClient(const AdminClient&) = delete;
  AdminClient& operator=(const AdminClient&) = delete;

  /// Any request body; the answer as decoded. Error{...} answers become `error`.
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
  Answer list(std::uint64_t cursor = 0, std::uint16_t limit = 0);
  /// Pages through the whole table (bounded by `names_max`). Errors: as request(), or corrupt
  /// (an answer that is not a page, a cursor that does not advance).
  Result<std::vector<wire::NameRecord>> list_all(std::size_t names_max = 1u << 20);
  Answer stats();
  /// stats() as key → value. Errors: as request(), or corrupt (an answer that is not stats).
  Result<std::vector<wire::Counter>> counters();

  WorkerId self() const noexcept { return sender_.self(); }
  std::uint16_t key_id() const noexcept { return sender_.key_id(); }
  /// The id of the last request sent (tests replay it).
  std::uint64_t last_request_id() const noexcept { return next_request_id_ - 1; }

 private:
  AdminClient(const SocketAddress& lockd, WorkerId self, const wire::WireKey& signing, std::string key_text,
              std::int64_t timeout_ns);
  SocketAddress lockd_;
  std::string key_text_;  ///< the key as its file names it (wire::key_text), for messages
  wire::Sender sender_;
  wire::Authenticator auth_;
  std::int64_t timeout_ns_;
  int fd_ = -1;
  std::uint64_t next_request_id_ = 1;
};

}  // namespace leasehold::lockd
