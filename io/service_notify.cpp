#include "leasehold/io/service_notify.hpp"

#include <systemd/sd-daemon.h>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

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
  if (enabled_) {
    // A path, or '@' for an abstract name (sd_notify(3)); anything else is not systemd's.
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    const std::size_t n = std::strlen(socket);
    if ((socket[0] != '/' && socket[0] != '@') || n >= sizeof sa.sun_path) {
      enabled_ = false;
    } else {
      std::memcpy(sa.sun_path, socket, n);
      if (socket[0] == '@') sa.sun_path[0] = '\0';
      const std::size_t len = offsetof(sockaddr_un, sun_path) + n + (socket[0] == '@' ? 0 : 1);
      address_.assign(reinterpret_cast<const char*>(&sa), len);
      fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      enabled_ = fd_ >= 0;
    }
  }
  std::uint64_t usec = 0;
  // > 0 only when WATCHDOG_USEC is set and WATCHDOG_PID (if set) is this process.
  if (enabled_ && sd_watchdog_enabled(0, &usec) > 0 && usec > 0)
    watchdog_ns_ = static_cast<std::int64_t>(std::min<std::uint64_t>(usec, INT64_MAX / 1000) * 1000);
}

ServiceNotifier::~ServiceNotifier() {
  if (fd_ >= 0) ::close(fd_);
}

void ServiceNotifier::send(const std::string& message) {
  if (!enabled_) return;
  // Best effort, as logging is: a notification that cannot be sent at once changes nothing here
  // (a watchdog that misses its pings restarts the service, which is what it is for).
  const ssize_t n = ::sendto(fd_, message.data(), message.size(), MSG_DONTWAIT | MSG_NOSIGNAL,
                             reinterpret_cast<const sockaddr*>(address_.data()),
                             static_cast<socklen_t>(address_.size()));
  if (n != static_cast<ssize_t>(message.size())) ++dropped_;
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
