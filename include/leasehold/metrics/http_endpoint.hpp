// leasehold/metrics: the HTTP endpoint of a daemon (--metrics-listen ADDR:PORT): GET /metrics
// and GET /healthz, on threads of its own, never on the io or rt thread: one that owns every
// socket (accepts, reads requests, writes answers, all non-blocking under one poll) and a few
// that only answer complete requests (cpp-httplib parses them and formats the response, on
// memory). A client that is slow, silent or hostile (a sandbox on the same host trickling one
// byte at a time over many connections) therefore never holds an answering thread: its
// connection is closed when its request is not complete within a deadline from accept, and
// connections beyond a cap (in all, and per peer address) are closed at once. Only the daemons'
// executables link it (leasehold_metrics_http), so the libraries the simulator links compile no
// HTTP code.
#pragma once

#include "leasehold/lease/result.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace leasehold::metrics {

/// One answer of the endpoint.
struct HttpAnswer {
  int status = 200;
  std::string body;
  std::string content_type = "text/plain; charset=utf-8";
};

class SnapshotExchange;  // leasehold/metrics/exchange.hpp

/// What the endpoint admits. The defaults are the daemons'.
struct HttpLimits {
  /// Connections open at once, from all peers; one more is closed at once (after accept).
  unsigned connections_max = 64;
  /// Connections open at once from one peer address; one more is closed at once.
  unsigned connections_per_peer_max = 8;
  /// The whole request (request line and headers) must arrive within this of its accept, however
  /// its bytes trickle in; else the connection is closed unanswered.
  std::int64_t request_deadline_ns = 2'000'000'000;
  /// The answer must be sent within this of being ready (a client that does not read it).
  std::int64_t answer_deadline_ns = 2'000'000'000;
  /// Threads that answer complete requests (each may wait kSnapshotWaitNs for the io thread).
  unsigned answer_threads = 2;
  /// --metrics-allow: "CIDR[,CIDR...]" (10.0.0.0/8, 192.0.2.7, ::1/128, ...): a peer outside
  /// every one is closed at accept. Empty: every peer.
  std::string allow;
};

/// How long an answer waits for the io thread's snapshot: the io thread answers within a turn,
/// so a second without one means it is stalled (or still starting).
inline constexpr std::int64_t kSnapshotWaitNs = 1'000'000'000;

/// The Prometheus text format's content type.
inline constexpr const char* kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

class HttpEndpoint {
 public:
  using Handler = std::function<HttpAnswer()>;
  /// Binds `listen` ("HOST:PORT", "[V6]:PORT"; port 0 picks a free one) and starts serving:
  /// GET /metrics answers metrics(), GET /healthz healthz(), anything else 404. The handlers run
  /// on the endpoint's thread. Errors: invalid_argument for a malformed address, io_error
  /// naming the address when it cannot be bound.
  /// Errors: invalid_argument for a malformed address or allow list, io_error naming the address
  /// when it cannot be bound.
  static Result<std::unique_ptr<HttpEndpoint>> start(const std::string& listen, Handler metrics, Handler healthz,
                                                     const HttpLimits& limits = {});
  /// start() with the handlers every daemon uses: each answer from a snapshot of `exchange`
  /// (which must outlive the endpoint), waited for up to kSnapshotWaitNs (503 naming `who`'s io
  /// thread when none comes); /metrics in the text format with names prefixed `prefix`
  /// ("leasehold_lockd_"), /healthz 200 or 503 with the snapshot's health text.
  static Result<std::unique_ptr<HttpEndpoint>> serve(const std::string& listen, SnapshotExchange& exchange,
                                                     std::string prefix, std::string who, const HttpLimits& limits = {});
  /// Stops serving, closes every connection and joins the threads.
  ~HttpEndpoint();
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  /// The bound address, "HOST:PORT" with the real port.
  const std::string& address() const noexcept { return address_; }

  /// What the socket thread did so far (for tests and an operator's curiosity).
  struct Counts {
    std::uint64_t accepted = 0;          ///< connections admitted
    std::uint64_t refused_full = 0;      ///< closed at accept: connections_max reached
    std::uint64_t refused_peer = 0;      ///< closed at accept: connections_per_peer_max reached
    std::uint64_t refused_allow = 0;     ///< closed at accept: not in the allow list
    std::uint64_t request_deadline = 0;  ///< closed: the request incomplete at its deadline
    std::uint64_t answered = 0;          ///< answers sent in full
  };
  Counts counts() const;

 private:
  struct Server;
  HttpEndpoint();
  std::unique_ptr<Server> server_;
  std::string address_;
};

}  // namespace leasehold::metrics
