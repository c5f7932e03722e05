#include "leasehold/supervisor/output_pump.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

namespace leasehold {

namespace {

void write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;  // a full or failing log loses output, never the supervisor
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

}  // namespace

Status OutputPump::start() {
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) return Status::from_errno(errno, "sandbox output: eventfd");
  thread_ = std::thread([this] { run(); });
  return {};
}

void OutputPump::stop() {
  if (thread_.joinable()) {
    stop_.store(true, std::memory_order_release);
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t w = ::write(wake_fd_, &one, sizeof one);
    thread_.join();
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (Stream& s : incoming_) drain_and_close(s);  // added after the thread's last look
  incoming_.clear();
}

OutputPump::~OutputPump() {
  stop();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void OutputPump::add(int pipe_read_fd, int log_fd, std::uint64_t cap_bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    incoming_.push_back({pipe_read_fd, log_fd, cap_bytes, 0, false});
  }
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t w = ::write(wake_fd_, &one, sizeof one);
}

bool OutputPump::pump(Stream& s) {
  std::array<char, 65536> buf;
  const ssize_t n = ::read(s.pipe_fd, buf.data(), buf.size());
  if (n <= 0) return false;
  auto len = static_cast<std::uint64_t>(n);
  const std::uint64_t room = s.cap > s.written ? s.cap - s.written : 0;
  const std::uint64_t keep = len < room ? len : room;
  if (keep > 0) {
    write_all(s.log_fd, buf.data(), static_cast<std::size_t>(keep));
    s.written += keep;
  }
  if (keep < len) {
    discarded_.fetch_add(len - keep, std::memory_order_relaxed);
    if (!s.capped) {
      s.capped = true;
      const std::string note = "\n[leasehold: this sandbox's output passed " + std::to_string(s.cap) +
                               " bytes (--sandbox-log-max-bytes); the rest is discarded]\n";
      write_all(s.log_fd, note.data(), note.size());
    }
  }
  return true;
}

void OutputPump::drain_and_close(Stream& s) {
  // What is in the pipe now (the writer may still hold it open: never wait for its end).
  for (;;) {
    pollfd p{s.pipe_fd, POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0 || !(p.revents & POLLIN)) break;
    if (!pump(s)) break;
  }
  ::close(s.pipe_fd);
  ::close(s.log_fd);
}

void OutputPump::run() {
  std::vector<Stream> streams;
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    for (const Stream& s : streams) fds.push_back({s.pipe_fd, POLLIN, 0});
    const int r = ::poll(fds.data(), fds.size(), -1);
    if (r < 0 && errno != EINTR) return;
    if (r <= 0) continue;
    // The polled streams (fds[i + 1] is streams[i]); a stream at end of file is closed.
    std::vector<Stream> still;
    still.reserve(streams.size());
    for (std::size_t i = 0; i < streams.size(); ++i) {
      Stream& s = streams[i];
      const short ev = fds[i + 1].revents;
      if (ev & POLLIN) pump(s);
      if ((ev & (POLLHUP | POLLERR | POLLNVAL)) && !(ev & POLLIN)) {
        ::close(s.pipe_fd);
        ::close(s.log_fd);
        continue;
      }
      still.push_back(s);
    }
    streams.swap(still);
    if (fds[0].revents & POLLIN) {
      std::uint64_t v = 0;
      [[maybe_unused]] const ssize_t rd = ::read(wake_fd_, &v, sizeof v);
      std::lock_guard<std::mutex> lock(mu_);
      for (Stream& s : incoming_) streams.push_back(s);
      incoming_.clear();
    }
    if (stop_.load(std::memory_order_acquire)) {
      for (Stream& s : streams) drain_and_close(s);
      return;
    }
  }
}

}  // namespace leasehold
