// leasehold/io: telling systemd how a daemon is doing (sd_notify(3), libsystemd): READY=1 once
// it serves, STATUS= lines, STOPPING=1 when it shuts down, and WATCHDOG=1 pings from the main
// loop when the unit sets WatchdogSec= (systemd then restarts a daemon whose loop stopped turning).
//
// Without $NOTIFY_SOCKET (not started by systemd with Type=notify) every call does nothing.
// A message is one datagram to systemd's socket, sent without blocking (sd_notify(3) would block
// the io thread while PID 1's queue is full; a message that does not fit is dropped, as a log
// line would be); a ping goes out at most every half watchdog interval (sd_watchdog_enabled(3)),
// so the cost on the io thread is one sendto per few seconds.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace leasehold {

class ServiceNotifier {
 public:
  /// Reads $NOTIFY_SOCKET and $WATCHDOG_USEC/$WATCHDOG_PID once (the environment is left as it is).
  ServiceNotifier();
  ~ServiceNotifier();
  ServiceNotifier(const ServiceNotifier&) = delete;
  ServiceNotifier& operator=(const ServiceNotifier&) = delete;

  /// True when systemd listens ($NOTIFY_SOCKET set).
  bool enabled() const noexcept { return enabled_; }
  /// The watchdog interval systemd asked for, in ns; 0 when there is none.
  std::int64_t watchdog_interval_ns() const noexcept { return watchdog_ns_; }

  /// READY=1 with a STATUS= line: the daemon serves.
  void ready(std::string_view status);
  /// A STATUS= line (shown by systemctl status).
  void status(std::string_view status);
  /// STOPPING=1 with a STATUS= line: the orderly shutdown began.
  void stopping(std::string_view status);
  /// WATCHDOG=1 when half the interval has passed since the last ping (or none was sent yet).
  /// Call it every loop turn with that turn's boot-clock reading; nothing when the watchdog is off.
  void watchdog(std::int64_t now_ns);
  /// How long a loop that calls watchdog() each turn may sleep at `now_ns` before the next ping
  /// is due, in ns (INT64_MAX when the watchdog is off): a bound on its wait.
  std::int64_t wait_ns(std::int64_t now_ns) const noexcept;
  /// WATCHDOG=1 pings sent so far.
  std::uint64_t pings() const noexcept { return pings_; }
  /// Messages dropped because systemd's socket did not take them at once (or failed).
  std::uint64_t dropped() const noexcept { return dropped_; }

 private:
  void send(const std::string& message);

  bool enabled_ = false;
  int fd_ = -1;                ///< a non-blocking AF_UNIX datagram socket
  std::string address_;        ///< sockaddr_un of $NOTIFY_SOCKET ('@' = abstract)
  std::uint64_t dropped_ = 0;
  std::int64_t watchdog_ns_ = 0;
  std::int64_t last_ping_ns_ = -1;
  std::uint64_t pings_ = 0;
};

}  // namespace leasehold
