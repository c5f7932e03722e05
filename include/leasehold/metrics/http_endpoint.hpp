// leasehold/metrics: the HTTP endpoint of a daemon (--metrics-listen ADDR:PORT): GET /metrics
// and GET /healthz, served by cpp-httplib on threads of its own (one that accepts, one that
// answers), never on the io or rt thread. Only the daemons' executables link it
// (leasehold_metrics_http), so the libraries the simulator links compile no HTTP code.
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
  static Result<std::unique_ptr<HttpEndpoint>> start(const std::string& listen, Handler metrics, Handler healthz);
  /// start() with the handlers every daemon uses: each answer from a snapshot of `exchange`
  /// (which must outlive the endpoint), waited for up to kSnapshotWaitNs (503 naming `who`'s io
  /// thread when none comes); /metrics in the text format with names prefixed `prefix`
  /// ("leasehold_lockd_"), /healthz 200 or 503 with the snapshot's health text.
  static Result<std::unique_ptr<HttpEndpoint>> serve(const std::string& listen, SnapshotExchange& exchange,
                                                     std::string prefix, std::string who);
  /// Stops serving and joins the threads.
  ~HttpEndpoint();
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  /// The bound address, "HOST:PORT" with the real port.
  const std::string& address() const noexcept { return address_; }

 private:
  struct Server;
  HttpEndpoint() = default;
  std::unique_ptr<Server> server_;
  std::string address_;
};

}  // namespace leasehold::metrics
