// leasehold/etcd: a small synchronous client for etcd v3 (the KV, Lease and Maintenance
// services), over gRPC with stubs generated at build time from etcd's own .proto files
// (Debian golang-etcd-server-dev; etcd/CMakeLists.txt strips their gogoproto and google.api
// options, which only the Go code generator reads).
//
// What lockd needs from etcd and nothing more: ranges, guarded transactions (compare, then
// put/delete), leases (grant, keep-alive, revoke), and the member status. Every call takes an
// absolute deadline on CLOCK_BOOTTIME (ns, lease/clock.hpp) and returns a Status / Result
// (lease/result.hpp); no call throws and none blocks past its deadline.
//
// Errors: Errc::timeout (the deadline passed: unknown whether a write took effect),
// Errc::io_error (unavailable, cancelled, connection refused or reset, or the deadline passed
// before any endpoint could be connected: unknown as well for a write),
// Errc::invalid_argument (etcd refused the request as malformed: too many operations in a
// transaction, a request over its size limit, a key empty), Errc::not_found (a lease that
// etcd no longer has), Errc::refused (any other gRPC status); the message names the endpoint
// list, the call and etcd's text. A transaction whose compares fail is not an error: it is a
// Txn with succeeded = false.
//
// Endpoints: "HOST:PORT[,HOST:PORT...]" (plain TCP; hosts are resolved with getaddrinfo when the
// client is opened). Any member serves every call (etcd forwards writes to its raft leader); the
// channel moves to another endpoint when one fails (gRPC pick_first over the resolved list). A call
// waits for a connection within its deadline. A member that stops answering on an open connection
// (frozen, partitioned) is given up by HTTP/2 keepalive pings while calls are outstanding (every
// 10 s, 3 s to answer); until then calls to it time out.
//
// Thread safety: one client may be used by several threads at once (gRPC stubs are); a
// KeepAlive stream belongs to the thread that opened it.
#pragma once

#include "leasehold/lease/result.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace leasehold::etcd {

/// One key-value as etcd returns it (mvccpb.KeyValue).
struct KeyValue {
  std::string key;
  std::string value;
  std::int64_t create_revision = 0;
  std::int64_t mod_revision = 0;
  std::int64_t version = 0;
  std::int64_t lease = 0;
  friend bool operator==(const KeyValue&, const KeyValue&) = default;
};

/// A range read's answer.
struct Range {
  std::vector<KeyValue> kvs;
  bool more = false;            ///< a limit cut the answer short
  std::int64_t count = 0;       ///< keys in the range (before the limit)
  std::int64_t revision = 0;    ///< the store revision the read saw (header.revision)
};

/// One compare of a transaction (etcdserverpb.Compare), on one key.
struct Compare {
  enum class Target : std::uint8_t { version, create_revision, mod_revision, value, lease };
  enum class Op : std::uint8_t { equal, greater, less, not_equal };
  std::string key;
  Target target = Target::create_revision;
  Op op = Op::equal;
  std::int64_t number = 0;  ///< for every target but value
  std::string value;        ///< for Target::value
  /// `key`'s `target` (not value) compared with `number`, e.g. of(k, Target::create_revision,
  /// Op::equal, 0): "k does not exist".
  static Compare of(std::string key, Target target, Op op, std::int64_t number);
  /// `key`'s value compared with `value`.
  static Compare of_value(std::string key, Op op, std::string value);
};

/// One operation of a transaction branch: a put, a delete of one key or a range
/// [key, range_end), or a range read.
struct Op {
  enum class Kind : std::uint8_t { put, del, range };
  Kind kind = Kind::put;
  std::string key;
  std::string value;       ///< put
  std::int64_t lease = 0;  ///< put: attach to this lease (0: none)
  std::string range_end;   ///< del / range: empty = the key alone
  static Op put(std::string k, std::string v, std::int64_t lease_id = 0);
  static Op del(std::string k, std::string range_end = {});
  static Op get(std::string k, std::string range_end = {});
};

/// A transaction's answer.
struct Txn {
  bool succeeded = false;       ///< the compares held and the success branch ran
  std::int64_t revision = 0;    ///< the store revision after it (header.revision)
  /// One Range per range op of the branch that ran, in order (puts and deletes give none).
  std::vector<Range> ranges;
};

/// A granted lease.
struct LeaseGrant {
  std::int64_t id = 0;
  std::int64_t ttl_s = 0;  ///< what etcd granted (it may raise a TTL below its minimum)
};

/// The member that answered a status call.
struct MemberStatus {
  std::uint64_t member_id = 0;
  std::uint64_t leader_id = 0;  ///< raft leader as that member sees it (0: none)
  std::uint64_t raft_term = 0;
  std::int64_t revision = 0;
  std::string version;
};

/// The key just after every key that starts with `prefix` (a range [prefix, prefix_end(prefix))
/// is "everything under prefix"): the prefix with its last byte incremented, bytes of 0xff
/// dropped; "\0" for an empty or all-0xff prefix (etcd: from the key to the end of the keyspace).
std::string prefix_end(std::string_view prefix);

class KeepAlive;

class Client {
 public:
  /// Parses `endpoints` ("HOST:PORT[,HOST:PORT...]", at most 16; HOST a name or an IPv4/IPv6
  /// literal, IPv6 in brackets), resolves the names (getaddrinfo) and creates the channel. Does
  /// not wait for a connection: the first call does. Errors: invalid_argument naming the
  /// malformed endpoint; not_found for a name that does not resolve.
  static Result<std::unique_ptr<Client>> open(std::string_view endpoints);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  /// The endpoint list as given.
  const std::string& endpoints() const noexcept;

  /// Range [key, range_end) (range_end empty: the key alone), at `revision` (0: the latest),
  /// at most `limit` keys (0: all), linearizable. Keys ascend.
  Result<Range> range(std::string_view key, std::string_view range_end, std::int64_t deadline_ns,
                      std::int64_t limit = 0, std::int64_t revision = 0);
  /// If every compare holds, runs `success`, else `failure`; atomically (etcd's Txn).
  Result<Txn> txn(const std::vector<Compare>& compares, const std::vector<Op>& success,
                  const std::vector<Op>& failure, std::int64_t deadline_ns);
  /// Plain put (no guard), for tests and tools.
  Status put(std::string_view key, std::string_view value, std::int64_t deadline_ns, std::int64_t lease = 0);

  /// Grants a lease of `ttl_s` seconds (etcd rounds a TTL below its minimum up).
  Result<LeaseGrant> lease_grant(std::int64_t ttl_s, std::int64_t deadline_ns);
  /// Revokes a lease: the keys attached to it are deleted. not_found when etcd has no such lease.
  Status lease_revoke(std::int64_t id, std::int64_t deadline_ns);
  /// Opens a keep-alive stream (one per lease holder; the stream's calls are synchronous).
  Result<std::unique_ptr<KeepAlive>> keep_alive(std::int64_t deadline_ns);

  /// Moves the client to the next endpoint (a new channel that tries it first): for a caller
  /// whose keep-alive timed out on a member that keeps its connection but answers nothing. A
  /// unary call that times out on a connected member does this itself. Calls in flight finish
  /// on the old channel. No-op with one address.
  void next_endpoint();

  /// The status of the member the channel is connected to.
  Result<MemberStatus> status(std::int64_t deadline_ns);

 private:
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend class KeepAlive;
};

/// A LeaseKeepAlive stream. refresh() sends one keep-alive and waits for its answer.
class KeepAlive {
 public:
  ~KeepAlive();
  KeepAlive(const KeepAlive&) = delete;
  KeepAlive& operator=(const KeepAlive&) = delete;
  /// Sends a keep-alive for lease `id` and returns the TTL (s) etcd now gives it, counted from
  /// when etcd received it. not_found (a TTL of 0 in etcd's answer) when the lease has expired or
  /// was revoked; timeout / io_error when no answer came by `deadline_ns` (the stream is then
  /// broken: open another). The caller measures from before this call: the lease is alive at
  /// least until send time + the returned TTL.
  Result<std::int64_t> refresh(std::int64_t id, std::int64_t deadline_ns);

 private:
  struct Impl;
  explicit KeepAlive(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend class Client;
};

}  // namespace leasehold::etcd
