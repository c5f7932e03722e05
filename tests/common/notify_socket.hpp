// A stand-in for systemd's notification socket (sd_notify(3)): a unix datagram socket the test
// owns, whose path goes into a daemon's $NOTIFY_SOCKET. Each datagram is one notification
// ("READY=1\nSTATUS=...", "WATCHDOG=1", "STOPPING=1\n...").
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace leasehold::testing_common {

class NotifySocket {
 public:
  /// Binds `path` (a file that must not exist yet; at most 107 bytes).
  explicit NotifySocket(const std::filesystem::path& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    if (fd_ < 0 || path.string().size() >= sizeof a.sun_path) return;
    std::memcpy(a.sun_path, path.c_str(), path.string().size());
    if (::bind(fd_, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~NotifySocket() {
    if (fd_ >= 0) ::close(fd_);
    ::unlink(path_.c_str());
  }
  NotifySocket(const NotifySocket&) = delete;
  NotifySocket& operator=(const NotifySocket&) = delete;

  bool ok() const { return fd_ >= 0; }
  std::string path() const { return path_.string(); }

  /// Every notification received so far (kept), in order.
  const std::vector<std::string>& messages() const { return messages_; }

  /// Waits up to `timeout` for a notification that holds the line `line` (e.g. "READY=1");
  /// returns that whole notification. Earlier ones are kept in messages().
  std::optional<std::string> wait_for(std::string_view line, std::chrono::milliseconds timeout) {
    for (std::size_t i = seen_; i < messages_.size(); ++i)
      if (has_line(messages_[i], line)) {
        seen_ = i + 1;
        return messages_[i];
      }
    seen_ = messages_.size();
    const auto end = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) continue;
      messages_.emplace_back(buf, static_cast<std::size_t>(n));
      seen_ = messages_.size();
      if (has_line(messages_.back(), line)) return messages_.back();
    }
  }

  /// How many notifications received so far hold the line `line`.
  std::size_t count(std::string_view line) const {
    std::size_t n = 0;
    for (const auto& m : messages_) n += has_line(m, line) ? 1 : 0;
    return n;
  }

  static bool has_line(std::string_view message, std::string_view line) {
    std::size_t at = 0;
    while (at <= message.size()) {
      const std::size_t eol = std::min(message.find('\n', at), message.size());
      if (message.substr(at, eol - at) == line) return true;
      at = eol + 1;
    }
    return false;
  }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  std::vector<std::string> messages_;
  std::size_t seen_ = 0;
};

}  // namespace leasehold::testing_common
