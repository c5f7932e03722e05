#include "leasehold/io/service_notify.hpp"

#include <systemd/sd-daemon.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

namespace leasehold {

namespace {

/// A STATUS= value is one line: line breaks would start another assignment.
std::string one_line(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c == '\n' || c == '\r') c = ' ';
  return out;
}

}  // namespace

ServiceNotifier::ServiceNotifier() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  enabled_ = socket != nullptr && *socket != '\0';
  std::uint64_t usec = 0;
  // > 0 only when WATCHDOG_USEC is set and WATCHDOG_PID (if set) is this process.
  if (enabled_ && sd_watchdog_enabled(0, &usec) > 0 && usec > 0)
    watchdog_ns_ = static_cast<std::int64_t>(std::min<std::uint64_t>(usec, INT64_MAX / 1000) * 1000);
}

void ServiceNotifier::send(const std::string& message) {
  if (!enabled_) return;
  // Best effort, as logging is: a notification that cannot be sent changes nothing here (a
  // watchdog that misses its pings restarts the service, which is what it is for).
  (void)sd_notify(0, message.c_str());
}

void ServiceNotifier::ready(std::string_view status) { send("READY=1\nSTATUS=" + one_line(status)); }

void ServiceNotifier::status(std::string_view status) { send("STATUS=" + one_line(status)); }

void ServiceNotifier::stopping(std::string_view status) { send("STOPPING=1\nSTATUS=" + one_line(status)); }

std::int64_t ServiceNotifier::wait_ns(std::int64_t now_ns) const noexcept {
  if (watchdog_ns_ == 0) return INT64_MAX;
  if (last_ping_ns_ < 0) return 0;
  return std::max<std::int64_t>(0, last_ping_ns_ + watchdog_ns_ / 2 - now_ns);
}

void ServiceNotifier::watchdog(std::int64_t now_ns) {
  if (watchdog_ns_ == 0) return;
  if (last_ping_ns_ >= 0 && now_ns - last_ping_ns_ < watchdog_ns_ / 2) return;
  last_ping_ns_ = now_ns;
  ++pings_;
  send("WATCHDOG=1");
}

}  // namespace leasehold
