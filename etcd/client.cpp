// leasehold/etcd: the etcd v3 client over gRPC's synchronous API (unary calls) and its
// completion-queue API (the keep-alive stream). See include/leasehold/etcd/client.hpp.
//
// Deadlines. Every call takes an absolute CLOCK_BOOTTIME deadline; gRPC takes a system_clock time
// point, so the deadline becomes "now on system_clock + what is left on the boot clock" at the
// moment of the call (a wall-clock step during a call moves its deadline by as much).
//
// The keep-alive stream. A stream lives for many refreshes, so its ClientContext has no deadline;
// each refresh must still return by its own. The stream therefore runs on a CompletionQueue of its
// own: refresh() starts a Write, waits for it with CompletionQueue::AsyncNext bounded by the
// deadline, then the same for a Read. When the deadline passes first the context is cancelled
// (TryCancel), the pending operation completes at once (not ok) and is collected, and the stream
// is marked broken. No thread, no timer: the wait itself is bounded.
//
// The channel. "ipv4:A:P,B:P" (or "ipv6:[A]:P,...") of every resolved address, gRPC's static
// resolver with pick_first: the channel connects to the first address that answers and moves on
// when that connection fails. A member that stops answering without closing its connections
// (frozen, partitioned) is dropped by HTTP/2 keepalive pings while a call is outstanding: every
// 10 s (etcd refuses pings more often than every 5 s, --grpc-keepalive-min-time), 3 s to answer.
// Reconnection backs off from 100 ms to 1 s, and a connection attempt (TCP, then etcd's HTTP/2
// SETTINGS) gets at least 1 s (gRPC's defaults: 1 s growing to 120 s, and 20 s, too slow to follow
// a member that restarts).
//
// Every call waits for a connection within its deadline (wait_for_ready) rather than failing at
// once while the channel is in TRANSIENT_FAILURE: gRPC's pick_first reports that state until a
// connection is ready, and only a waiting call polls the connection attempts forward (without one,
// gRPC's backup poller does, every 5 s). A call whose deadline passed with no endpoint connected
// is io_error, not timeout: it was never sent.
#include "leasehold/etcd/client.hpp"

#include "leasehold/lease/clock.hpp"

// Generated at build time from etcd's rpc.proto (etcd/CMakeLists.txt); angled: it is not a
// file of the source tree.
#include <etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h>
#include <grpcpp/grpcpp.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstdio>
#include <mutex>
#include <utility>

namespace leasehold::etcd {

namespace pb = etcdserverpb;

namespace {

constexpr std::size_t kMaxEndpoints = 16;

const char* code_name(grpc::StatusCode code) noexcept {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "UNRECOGNIZED";
  }
}

/// The Errc of a gRPC status (client.hpp "Errors"). CANCELLED is io_error: the call was cut off
/// (a member shutting down), and whether a write took effect is unknown, as for UNAVAILABLE.
Errc errc_of(grpc::StatusCode code) noexcept {
  switch (code) {
    case grpc::StatusCode::DEADLINE_EXCEEDED: return Errc::timeout;
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::CANCELLED: return Errc::io_error;
    case grpc::StatusCode::INVALID_ARGUMENT: return Errc::invalid_argument;
    case grpc::StatusCode::NOT_FOUND: return Errc::not_found;
    default: return Errc::refused;
  }
}

/// "etcd [ENDPOINTS] CALL: "
std::string prefix(const std::string& endpoints, std::string_view call) {
  std::string s = "etcd [";
  s += endpoints;
  s += "] ";
  s += call;
  s += ": ";
  return s;
}

Status from_grpc(const grpc::Status& st, const std::string& endpoints, std::string_view call) {
  std::string msg = prefix(endpoints, call);
  msg += code_name(st.error_code());
  if (!st.error_message().empty()) {
    msg += ": ";
    msg += st.error_message();
  }
  return Status{errc_of(st.error_code()), std::move(msg)};
}

/// The system_clock time point of boot-clock deadline `deadline_ns`, measured now. What is left
/// is clamped to [0, a year], so a far deadline ("never", INT64_MAX) cannot overflow.
std::chrono::system_clock::time_point system_deadline(std::int64_t deadline_ns) {
  constexpr std::int64_t kYearNs = std::int64_t{365} * 24 * 3600 * 1'000'000'000;
  const std::int64_t left = std::clamp<std::int64_t>(deadline_ns - boottime_ns(), 0, kYearNs);
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::nanoseconds(left));
}

KeyValue from_pb(const mvccpb::KeyValue& kv) {
  return KeyValue{kv.key(), kv.value(), kv.create_revision(), kv.mod_revision(), kv.version(), kv.lease()};
}

Range from_pb(const pb::RangeResponse& r, std::int64_t fallback_revision) {
  Range out;
  out.kvs.reserve(static_cast<std::size_t>(r.kvs_size()));
  for (const auto& kv : r.kvs()) out.kvs.push_back(from_pb(kv));
  out.more = r.more();
  out.count = r.count();
  out.revision = r.has_header() && r.header().revision() != 0 ? r.header().revision() : fallback_revision;
  return out;
}

void fill_range(pb::RangeRequest* r, std::string_view key, std::string_view range_end, std::int64_t limit,
                std::int64_t revision) {
  r->set_key(std::string(key));
  if (!range_end.empty()) r->set_range_end(std::string(range_end));
  r->set_limit(limit);
  r->set_revision(revision);
  r->set_serializable(false);  // linearizable
}

void fill_op(pb::RequestOp* out, const Op& op) {
  switch (op.kind) {
    case Op::Kind::put: {
      auto* p = out->mutable_request_put();
      p->set_key(op.key);
      p->set_value(op.value);
      p->set_lease(op.lease);
      break;
    }
    case Op::Kind::del: {
      auto* d = out->mutable_request_delete_range();
      d->set_key(op.key);
      if (!op.range_end.empty()) d->set_range_end(op.range_end);
      break;
    }
    case Op::Kind::range:
      fill_range(out->mutable_request_range(), op.key, op.range_end, 0, 0);
      break;
  }
}

void fill_compare(pb::Compare* out, const Compare& c) {
  out->set_key(c.key);
  switch (c.op) {
    case Compare::Op::equal: out->set_result(pb::Compare_CompareResult_EQUAL); break;
    case Compare::Op::greater: out->set_result(pb::Compare_CompareResult_GREATER); break;
    case Compare::Op::less: out->set_result(pb::Compare_CompareResult_LESS); break;
    case Compare::Op::not_equal: out->set_result(pb::Compare_CompareResult_NOT_EQUAL); break;
  }
  switch (c.target) {
    case Compare::Target::version:
      out->set_target(pb::Compare_CompareTarget_VERSION);
      out->set_version(c.number);
      break;
    case Compare::Target::create_revision:
      out->set_target(pb::Compare_CompareTarget_CREATE);
      out->set_create_revision(c.number);
      break;
    case Compare::Target::mod_revision:
      out->set_target(pb::Compare_CompareTarget_MOD);
      out->set_mod_revision(c.number);
      break;
    case Compare::Target::value:
      out->set_target(pb::Compare_CompareTarget_VALUE);
      out->set_value(c.value);
      break;
    case Compare::Target::lease:
      out->set_target(pb::Compare_CompareTarget_LEASE);
      out->set_lease(c.number);
      break;
  }
}

/// One endpoint of the list as written: host (brackets removed) and port.
struct Endpoint {
  std::string text;
  std::string host;
  std::string port;
};

Result<std::vector<Endpoint>> parse_endpoints(std::string_view text) {
  const std::string all(text);
  if (text.empty()) return Status::invalid("etcd endpoints \"\": empty (want HOST:PORT[,HOST:PORT...])");
  std::vector<Endpoint> out;
  std::size_t pos = 0;
  while (true) {
    const std::size_t comma = text.find(',', pos);
    const std::string_view item = text.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    auto bad = [&](std::string_view why) {
      return Status::invalid("etcd endpoints \"" + all + "\": endpoint \"" + std::string(item) + "\" " +
                             std::string(why) + " (want HOST:PORT, an IPv6 address in brackets: [::1]:2379)");
    };
    if (item.empty()) return bad("is empty");
    Endpoint ep;
    ep.text = std::string(item);
    std::string_view rest;
    if (item.front() == '[') {
      const std::size_t close = item.find(']');
      if (close == std::string_view::npos) return bad("has no closing ']'");
      ep.host = std::string(item.substr(1, close - 1));
      rest = item.substr(close + 1);
      if (rest.empty() || rest.front() != ':') return bad("has no :PORT after the bracketed address");
      rest.remove_prefix(1);
      if (ep.host.empty()) return bad("has an empty address in brackets");
    } else {
      const std::size_t colon = item.rfind(':');
      if (colon == std::string_view::npos) return bad("has no :PORT");
      ep.host = std::string(item.substr(0, colon));
      rest = item.substr(colon + 1);
      if (ep.host.empty()) return bad("has no host");
      if (ep.host.find(':') != std::string::npos) return bad("is an IPv6 address without brackets");
    }
    unsigned port = 0;
    const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), port);
    if (rest.empty() || ec != std::errc{} || end != rest.data() + rest.size() || port == 0 || port > 65535)
      return bad("has no port in 1..65535");
    ep.port = std::to_string(port);
    out.push_back(std::move(ep));
    if (out.size() > kMaxEndpoints)
      return Status::invalid("etcd endpoints \"" + all + "\": more than " + std::to_string(kMaxEndpoints) +
                             " endpoints");
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  return out;
}

/// The resolved addresses of one endpoint, per family, as gRPC's ipv4:/ipv6: targets spell them
/// ("127.0.0.1:2379", "[::1]:2379").
struct Resolved {
  std::vector<std::string> v4, v6;
};

Result<Resolved> resolve(const Endpoint& ep, const std::string& all) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(ep.host.c_str(), ep.port.c_str(), &hints, &res);
  if (rc != 0) {
    const std::string why = rc == EAI_SYSTEM ? std::string("system error") : std::string(::gai_strerror(rc));
    return Status{rc == EAI_MEMORY || rc == EAI_SYSTEM ? Errc::io_error : Errc::not_found,
                  "etcd endpoints \"" + all + "\": cannot resolve host \"" + ep.host + "\" of endpoint \"" +
                      ep.text + "\": " + why};
  }
  Resolved out;
  for (const addrinfo* a = res; a != nullptr; a = a->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET) {
      const auto* sin = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
      if (::inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof buf) == nullptr) continue;
      std::string s = std::string(buf) + ":" + ep.port;
      if (std::find(out.v4.begin(), out.v4.end(), s) == out.v4.end()) out.v4.push_back(std::move(s));
    } else if (a->ai_family == AF_INET6) {
      const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
      if (::inet_ntop(AF_INET6, &sin6->sin6_addr, buf, sizeof buf) == nullptr) continue;
      std::string s = "[" + std::string(buf) + "]:" + ep.port;
      if (std::find(out.v6.begin(), out.v6.end(), s) == out.v6.end()) out.v6.push_back(std::move(s));
    }
  }
  ::freeaddrinfo(res);
  if (out.v4.empty() && out.v6.empty())
    return Status{Errc::not_found, "etcd endpoints \"" + all + "\": host \"" + ep.host + "\" of endpoint \"" +
                                       ep.text + "\" has no IPv4 or IPv6 address"};
  return out;
}

/// gRPC's static-resolver target for every address of every endpoint. One family: the ipv4:
/// scheme when every endpoint has an IPv4 address (a name with both keeps its IPv4 ones), else
/// ipv6: when every endpoint has an IPv6 address; a list that mixes IPv4-only and IPv6-only
/// endpoints is refused (one target holds one family).
Result<std::string> channel_target(const std::vector<Endpoint>& eps, const std::string& all) {
  std::vector<Resolved> resolved;
  bool all_v4 = true, all_v6 = true;
  for (const Endpoint& ep : eps) {
    auto r = resolve(ep, all);
    if (!r) return r.status();
    all_v4 = all_v4 && !r->v4.empty();
    all_v6 = all_v6 && !r->v6.empty();
    resolved.push_back(std::move(*r));
  }
  if (!all_v4 && !all_v6)
    return Status::invalid("etcd endpoints \"" + all +
                           "\": mixes endpoints with only IPv4 and only IPv6 addresses; list endpoints of one "
                           "address family");
  std::string target = all_v4 ? "ipv4:" : "ipv6:";
  std::vector<std::string> seen;
  for (const Resolved& r : resolved) {
    for (const std::string& a : all_v4 ? r.v4 : r.v6) {
      if (std::find(seen.begin(), seen.end(), a) != seen.end()) continue;
      if (!seen.empty()) target += ',';
      target += a;
      seen.push_back(a);
    }
  }
  return target;
}

}  // namespace

Compare Compare::of(std::string key, Target target, Op op, std::int64_t number) {
  Compare c;
  c.key = std::move(key);
  c.target = target;
  c.op = op;
  c.number = number;
  return c;
}

Compare Compare::of_value(std::string key, Op op, std::string value) {
  Compare c = of(std::move(key), Target::value, op, 0);
  c.value = std::move(value);
  return c;
}

std::string prefix_end(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    const auto c = static_cast<unsigned char>(end.back());
    if (c < 0xff) {
      end.back() = static_cast<char>(c + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

Op Op::put(std::string k, std::string v, std::int64_t lease_id) {
  Op op;
  op.kind = Kind::put;
  op.key = std::move(k);
  op.value = std::move(v);
  op.lease = lease_id;
  return op;
}

Op Op::del(std::string k, std::string range_end) {
  Op op;
  op.kind = Kind::del;
  op.key = std::move(k);
  op.range_end = std::move(range_end);
  return op;
}

Op Op::get(std::string k, std::string range_end) {
  Op op;
  op.kind = Kind::range;
  op.key = std::move(k);
  op.range_end = std::move(range_end);
  return op;
}

struct Client::Impl {
  /// One channel and its stubs: the client's current connection (replaced by rotate()).
  struct Conn {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<pb::KV::Stub> kv;
    std::unique_ptr<pb::Lease::Stub> lease;
    std::unique_ptr<pb::Maintenance::Stub> maintenance;
  };
  std::string endpoints;
  std::string scheme;                   ///< "ipv4:" or "ipv6:"
  std::vector<std::string> addresses;   ///< every resolved address, in the order given
  grpc::ChannelArguments args;
  std::mutex mu;
  std::shared_ptr<Conn> conn;           // guarded by mu
  std::size_t first = 0;                // guarded by mu: the address pick_first tries first

  /// A channel whose pick_first list starts at addresses[first] (mu held).
  std::shared_ptr<Conn> make_conn() {
    std::string target = scheme;
    for (std::size_t i = 0; i < addresses.size(); ++i) {
      if (i != 0) target += ',';
      target += addresses[(first + i) % addresses.size()];
    }
    auto c = std::make_shared<Conn>();
    c->channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
    if (!c->channel) return nullptr;
    c->kv = pb::KV::NewStub(c->channel);
    c->lease = pb::Lease::NewStub(c->channel);
    c->maintenance = pb::Maintenance::NewStub(c->channel);
    return c;
  }
  std::shared_ptr<Conn> current() {
    std::lock_guard lock(mu);
    return conn;
  }
  /// Moves to the next address when `from` is still the current connection (several calls that
  /// timed out on one member move once).
  void rotate(const std::shared_ptr<Conn>& from) {
    std::lock_guard lock(mu);
    if (addresses.size() < 2 || (from != nullptr && conn != from)) return;
    first = (first + 1) % addresses.size();
    if (auto next = make_conn()) conn = std::move(next);
  }

  /// Runs one unary call `fn(ClientContext*, Conn&)` with the deadline set; ok, or the mapped
  /// failure. A call that timed out on a connected member (it holds its connection but answers
  /// nothing: stopped, or cut off from its peers) moves the client to the next address: gRPC's
  /// pick_first would stay on that member until its keepalive pings time out (13 s), longer
  /// than a leadership lease.
  template <class Fn>
  Status call(std::string_view what, std::int64_t deadline_ns, Fn&& fn) {
    if (deadline_ns <= boottime_ns())
      return Status{Errc::timeout, prefix(endpoints, what) + "the deadline passed before the call"};
    const std::shared_ptr<Conn> c = current();
    grpc::ClientContext ctx;
    ctx.set_deadline(system_deadline(deadline_ns));
    ctx.set_wait_for_ready(true);
    const grpc::Status st = fn(&ctx, *c);
    if (st.ok()) return {};
    Status out = failure(st, what, *c);
    if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && c->channel->GetState(false) == GRPC_CHANNEL_READY)
      rotate(c);
    return out;
  }

  /// The mapped failure; a deadline that passed with no endpoint connected is io_error.
  Status failure(const grpc::Status& st, std::string_view what, Conn& c) {
    Status out = from_grpc(st, endpoints, what);
    if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
        c.channel->GetState(false) == GRPC_CHANNEL_TRANSIENT_FAILURE)
      return Status{Errc::io_error, out.message() + " (no endpoint could be connected)"};
    return out;
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::open(std::string_view endpoints) {
  auto eps = parse_endpoints(endpoints);
  if (!eps) return eps.status();
  const std::string all(endpoints);
  auto target = channel_target(*eps, all);
  if (!target) return target.status();

  grpc::ChannelArguments args;
  args.SetLoadBalancingPolicyName("pick_first");
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 3'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1'000);  // gRPC's minimum connect timeout too
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1'000);
  args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, -1);  // etcd's own limit applies (--max-request-bytes)
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);     // connections of this client alone
  auto impl = std::make_unique<Impl>();
  impl->endpoints = all;
  impl->args = args;
  const std::size_t colon = target->find(':');
  impl->scheme = target->substr(0, colon + 1);
  for (std::size_t at = colon + 1; at <= target->size();) {
    const std::size_t comma = std::min(target->find(',', at), target->size());
    impl->addresses.push_back(target->substr(at, comma - at));
    at = comma + 1;
  }
  impl->conn = impl->make_conn();
  if (!impl->conn)
    return Status{Errc::io_error, "etcd endpoints \"" + all + "\": gRPC made no channel for " + *target};
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

const std::string& Client::endpoints() const noexcept { return impl_->endpoints; }

void Client::next_endpoint() { impl_->rotate(nullptr); }

Result<Range> Client::range(std::string_view key, std::string_view range_end, std::int64_t deadline_ns,
                            std::int64_t limit, std::int64_t revision) {
  pb::RangeRequest req;
  fill_range(&req, key, range_end, limit, revision);
  pb::RangeResponse resp;
  Status st = impl_->call("Range", deadline_ns,
                          [&](grpc::ClientContext* ctx, Impl::Conn& c) { return c.kv->Range(ctx, req, &resp); });
  if (!st.ok()) return st;
  return from_pb(resp, resp.header().revision());
}

Result<Txn> Client::txn(const std::vector<Compare>& compares, const std::vector<Op>& success,
                        const std::vector<Op>& failure, std::int64_t deadline_ns) {
  pb::TxnRequest req;
  for (const Compare& c : compares) fill_compare(req.add_compare(), c);
  for (const Op& op : success) fill_op(req.add_success(), op);
  for (const Op& op : failure) fill_op(req.add_failure(), op);
  pb::TxnResponse resp;
  Status st = impl_->call("Txn", deadline_ns,
                          [&](grpc::ClientContext* ctx, Impl::Conn& c) { return c.kv->Txn(ctx, req, &resp); });
  if (!st.ok()) return st;
  Txn out;
  out.succeeded = resp.succeeded();
  out.revision = resp.header().revision();
  for (const pb::ResponseOp& r : resp.responses()) {
    if (r.has_response_range()) out.ranges.push_back(from_pb(r.response_range(), out.revision));
  }
  return out;
}

Status Client::put(std::string_view key, std::string_view value, std::int64_t deadline_ns, std::int64_t lease) {
  pb::PutRequest req;
  req.set_key(std::string(key));
  req.set_value(std::string(value));
  req.set_lease(lease);
  pb::PutResponse resp;
  return impl_->call("Put", deadline_ns, [&](grpc::ClientContext* ctx, Impl::Conn& c) { return c.kv->Put(ctx, req, &resp); });
}

Result<LeaseGrant> Client::lease_grant(std::int64_t ttl_s, std::int64_t deadline_ns) {
  pb::LeaseGrantRequest req;
  req.set_ttl(ttl_s);
  req.set_id(0);  // etcd picks the id
  pb::LeaseGrantResponse resp;
  Status st = impl_->call("LeaseGrant", deadline_ns,
                          [&](grpc::ClientContext* ctx, Impl::Conn& c) { return c.lease->LeaseGrant(ctx, req, &resp); });
  if (!st.ok()) return st;
  if (!resp.error().empty()) return Status{Errc::refused, prefix(impl_->endpoints, "LeaseGrant") + resp.error()};
  return LeaseGrant{resp.id(), resp.ttl()};
}

Status Client::lease_revoke(std::int64_t id, std::int64_t deadline_ns) {
  pb::LeaseRevokeRequest req;
  req.set_id(id);
  pb::LeaseRevokeResponse resp;
  return impl_->call("LeaseRevoke", deadline_ns,
                     [&](grpc::ClientContext* ctx, Impl::Conn& c) { return c.lease->LeaseRevoke(ctx, req, &resp); });
}

Result<MemberStatus> Client::status(std::int64_t deadline_ns) {
  pb::StatusRequest req;
  pb::StatusResponse resp;
  Status st = impl_->call("Status", deadline_ns, [&](grpc::ClientContext* ctx, Impl::Conn& c) {
    return c.maintenance->Status(ctx, req, &resp);
  });
  if (!st.ok()) return st;
  MemberStatus out;
  out.member_id = resp.header().member_id();
  out.leader_id = resp.leader();
  out.raft_term = resp.raftterm();
  out.revision = resp.header().revision();
  out.version = resp.version();
  return out;
}

// --- the keep-alive stream ----------------------------------------------------------------------

struct KeepAlive::Impl {
  std::string endpoints;
  std::shared_ptr<grpc::Channel> channel;  // outlives the stream even if the Client goes first
  grpc::ClientContext ctx;                 // no deadline: the stream serves many refreshes
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::ClientAsyncReaderWriter<pb::LeaseKeepAliveRequest, pb::LeaseKeepAliveResponse>> stream;
  bool broken = false;    // an operation failed or timed out: no more calls on the stream
  bool finished = false;  // Finish() was collected
  std::string why_broken;

  enum class Wait { ok, failed, timeout };

  static void* tag(int n) noexcept { return reinterpret_cast<void*>(static_cast<std::intptr_t>(n)); }
  static constexpr int kStart = 1, kWrite = 2, kRead = 3, kFinish = 4;

  /// Waits for the one pending operation `expected` until `deadline_ns` (boot clock). On timeout
  /// the context is cancelled and the operation collected (it completes at once once cancelled),
  /// so nothing is left pending on the queue.
  Wait wait(int expected, std::int64_t deadline_ns) {
    while (true) {
      void* got = nullptr;
      bool ok = false;
      const auto r = cq.AsyncNext(&got, &ok, system_deadline(deadline_ns));
      if (r == grpc::CompletionQueue::GOT_EVENT) {
        if (got == tag(expected)) return ok ? Wait::ok : Wait::failed;
        continue;  // not ours (cannot happen: one operation at a time)
      }
      if (r == grpc::CompletionQueue::TIMEOUT && boottime_ns() < deadline_ns) continue;  // early wake
      if (r == grpc::CompletionQueue::SHUTDOWN) return Wait::failed;
      ctx.TryCancel();
      while (cq.Next(&got, &ok)) {
        if (got == tag(expected)) break;
      }
      return Wait::timeout;
    }
  }

  /// The stream's final status once an operation failed (Finish, bounded: after a failure it
  /// completes at once; if it does not within a second, the context is cancelled).
  Status finish(std::string_view what) {
    broken = true;
    grpc::Status st;
    if (!finished) {
      stream->Finish(&st, tag(kFinish));
      const std::int64_t deadline = boottime_ns() + 1'000'000'000;
      if (wait(kFinish, deadline) == Wait::timeout) st = grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream did not finish");
      finished = true;
    }
    Status out = st.ok() ? Status{Errc::io_error, prefix(endpoints, what) + "the stream ended"}
                         : from_grpc(st, endpoints, what);
    why_broken = out.message();
    return out;
  }

  Status timed_out(std::string_view what) {
    broken = true;
    Status out = channel->GetState(false) == GRPC_CHANNEL_TRANSIENT_FAILURE
                     ? Status{Errc::io_error, prefix(endpoints, what) +
                                                  "no endpoint could be connected by the deadline; the stream is cancelled"}
                     : Status{Errc::timeout, prefix(endpoints, what) + "no answer by the deadline; the stream is cancelled"};
    why_broken = out.message();
    return out;
  }

  ~Impl() {
    if (stream && !finished) {
      ctx.TryCancel();
      grpc::Status st;
      stream->Finish(&st, tag(kFinish));
      void* got = nullptr;
      bool ok = false;
      while (cq.Next(&got, &ok)) {
        if (got == tag(kFinish)) break;
      }
    }
    cq.Shutdown();
    void* got = nullptr;
    bool ok = false;
    while (cq.Next(&got, &ok)) {
    }
  }
};

KeepAlive::KeepAlive(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KeepAlive::~KeepAlive() = default;

Result<std::unique_ptr<KeepAlive>> Client::keep_alive(std::int64_t deadline_ns) {
  constexpr std::string_view kWhat = "LeaseKeepAlive (open)";
  if (deadline_ns <= boottime_ns())
    return Status{Errc::timeout, prefix(impl_->endpoints, kWhat) + "the deadline passed before the call"};
  auto ka = std::make_unique<KeepAlive::Impl>();
  ka->endpoints = impl_->endpoints;
  const std::shared_ptr<Impl::Conn> conn = impl_->current();
  ka->channel = conn->channel;
  ka->ctx.set_wait_for_ready(true);  // as the unary calls: wait (and poll) for a connection
  ka->stream = conn->lease->AsyncLeaseKeepAlive(&ka->ctx, &ka->cq, KeepAlive::Impl::tag(KeepAlive::Impl::kStart));
  switch (ka->wait(KeepAlive::Impl::kStart, deadline_ns)) {
    case KeepAlive::Impl::Wait::ok: break;
    case KeepAlive::Impl::Wait::failed: return ka->finish(kWhat);
    case KeepAlive::Impl::Wait::timeout: return ka->timed_out(kWhat);
  }
  return std::unique_ptr<KeepAlive>(new KeepAlive(std::move(ka)));
}

Result<std::int64_t> KeepAlive::refresh(std::int64_t id, std::int64_t deadline_ns) {
  Impl& s = *impl_;
  constexpr std::string_view kWhat = "LeaseKeepAlive";
  if (s.broken) return Status{Errc::io_error, s.why_broken + " (earlier; open another stream)"};
  if (deadline_ns <= boottime_ns())
    return Status{Errc::timeout, prefix(s.endpoints, kWhat) + "the deadline passed before the call"};
  pb::LeaseKeepAliveRequest req;
  req.set_id(id);
  s.stream->Write(req, Impl::tag(Impl::kWrite));
  switch (s.wait(Impl::kWrite, deadline_ns)) {
    case Impl::Wait::ok: break;
    case Impl::Wait::failed: return s.finish(kWhat);
    case Impl::Wait::timeout: return s.timed_out(kWhat);
  }
  pb::LeaseKeepAliveResponse resp;
  s.stream->Read(&resp, Impl::tag(Impl::kRead));
  switch (s.wait(Impl::kRead, deadline_ns)) {
    case Impl::Wait::ok: break;
    case Impl::Wait::failed: return s.finish(kWhat);
    case Impl::Wait::timeout: return s.timed_out(kWhat);
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(id));
  if (resp.id() != id) {
    s.broken = true;
    char got[17];
    std::snprintf(got, sizeof got, "%016llx", static_cast<unsigned long long>(resp.id()));
    s.why_broken = prefix(s.endpoints, kWhat) + "answer for lease " + got + " to a keep-alive of lease " + hex;
    return Status{Errc::refused, s.why_broken};
  }
  if (resp.ttl() <= 0)
    return Status{Errc::not_found, prefix(s.endpoints, kWhat) + "lease " + hex + " expired or was revoked (TTL 0)"};
  return resp.ttl();
}

}  // namespace leasehold::etcd
