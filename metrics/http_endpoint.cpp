// The one translation unit that includes cpp-httplib (a large header): keep it that way, so the
// daemons' other code compiles without it.
#include "leasehold/metrics/http_endpoint.hpp"

#include "leasehold/metrics/exchange.hpp"
#include "leasehold/metrics/exposition.hpp"

#include <httplib.h>

#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <thread>

namespace leasehold::metrics {

struct HttpEndpoint::Server {
  httplib::Server http;
  std::thread thread;
};

namespace {

/// "HOST:PORT" or "[V6]:PORT" into host and port (0..65535).
Result<std::pair<std::string, int>> split_listen(const std::string& listen) {
  const Status bad{Errc::invalid_argument, "--metrics-listen \"" + listen + "\" is not ADDR:PORT (e.g. 127.0.0.1:9740, [::1]:9740)"};
  const std::size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == listen.size()) return bad;
  std::string host = listen.substr(0, colon);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return bad;
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string::npos) {
    return bad;  // a bare IPv6 address needs brackets
  }
  const std::string port_text = listen.substr(colon + 1);
  char* end = nullptr;
  errno = 0;
  const long port = std::strtol(port_text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || port < 0 || port > 65535 || port_text.front() < '0' || port_text.front() > '9')
    return bad;
  return std::pair<std::string, int>{std::move(host), static_cast<int>(port)};
}

void answer(httplib::Response& res, const HttpAnswer& a) {
  res.status = a.status;
  res.set_content(a.body, a.content_type.c_str());
}

}  // namespace

Result<std::unique_ptr<HttpEndpoint>> HttpEndpoint::start(const std::string& listen, Handler metrics, Handler healthz) {
  auto where = split_listen(listen);
  if (!where) return where.status();
  const auto& [host, port] = *where;
  std::unique_ptr<HttpEndpoint> ep(new HttpEndpoint());
  ep->server_ = std::make_unique<Server>();
  httplib::Server& http = ep->server_->http;
  // Two threads answer (the scrapes of one Prometheus, a health check now and then). A client
  // that sends nothing is cut off after 1 s and a connection serves at most 4 requests, so an
  // idle or slow client (a sandbox that reaches the supervisor's address: README "Metrics and
  // health") holds a thread for about a second, not for minutes.
  http.new_task_queue = [] { return new httplib::ThreadPool(2); };
  http.set_keep_alive_max_count(4);
  http.set_keep_alive_timeout(1);
  http.set_read_timeout(1, 0);
  http.set_write_timeout(2, 0);
  http.set_payload_max_length(4096);  // GETs only
  // SO_REUSEADDR alone: httplib's default adds SO_REUSEPORT, with which a second daemon given the
  // same port binds it too and scrapes alternate between the two.
  http.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  http.Get("/metrics", [metrics = std::move(metrics)](const httplib::Request&, httplib::Response& res) {
    answer(res, metrics());
  });
  http.Get("/healthz", [healthz = std::move(healthz)](const httplib::Request&, httplib::Response& res) {
    answer(res, healthz());
  });
  int bound = port;
  if (port == 0) bound = http.bind_to_any_port(host);
  else if (!http.bind_to_port(host, port)) bound = -1;
  if (bound <= 0)
    return Status{Errc::io_error, "--metrics-listen " + listen + ": cannot bind (in use, or not an address of this host)"};
  ep->address_ = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(bound);
  Server* s = ep->server_.get();
  ep->server_->thread = std::thread([s] { s->http.listen_after_bind(); });
  return ep;
}

Result<std::unique_ptr<HttpEndpoint>> HttpEndpoint::serve(const std::string& listen, SnapshotExchange& exchange,
                                                          std::string prefix, std::string who) {
  const std::string stalled = who + "'s io thread did not answer within 1 s\n";
  return start(
      listen,
      [&exchange, prefix = std::move(prefix), stalled] {
        const auto snap = exchange.get(kSnapshotWaitNs);
        if (!snap) return HttpAnswer{503, stalled};
        return HttpAnswer{200, format_text(prefix, *snap), kPrometheusContentType};
      },
      [&exchange, stalled] {
        const auto snap = exchange.get(kSnapshotWaitNs);
        if (!snap) return HttpAnswer{503, stalled};
        return HttpAnswer{snap->healthy ? 200 : 503, snap->health + "\n"};
      });
}

HttpEndpoint::~HttpEndpoint() {
  if (!server_) return;
  server_->http.stop();
  if (server_->thread.joinable()) server_->thread.join();
}

}  // namespace leasehold::metrics
