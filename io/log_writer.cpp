#include "leasehold/io/log_writer.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace leasehold {

struct LogWriter::State {
  int fd = -1;
  std::size_t capacity = 0;
  std::mutex mu;
  std::condition_variable wake;     // the writer: text queued, or stop
  std::condition_variable drained;  // flush(): the writer caught up
  std::string queue;                // guarded by mu; reserved to `capacity`
  std::uint64_t queued_total = 0;   // bytes ever queued (guarded by mu)
  std::uint64_t written_total = 0;  // bytes handed to the fd, or given up on (guarded by mu)
  bool stop = false;                // guarded by mu
  std::atomic<std::uint64_t> dropped{0};

  void run() {
    std::string out;
    out.reserve(capacity);
    std::unique_lock lock(mu);
    for (;;) {
      wake.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;  // stop, and nothing left
      out.swap(queue);            // both keep their reserved capacity
      lock.unlock();
      std::size_t off = 0;
      while (off < out.size()) {
        const ssize_t n = ::write(fd, out.data() + off, out.size() - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;  // fd closed or broken: drop the rest of this batch
        off += static_cast<std::size_t>(n);
      }
      lock.lock();
      written_total += out.size();
      out.clear();
      drained.notify_all();
    }
  }
};

LogWriter::LogWriter(int fd, std::size_t capacity_bytes) : state_(std::make_shared<State>()) {
  state_->fd = fd;
  state_->capacity = std::max<std::size_t>(capacity_bytes, 1);
  state_->queue.reserve(state_->capacity);
  // The writer thread takes no signal: a daemon blocks SIGTERM/SIGHUP in every thread to read
  // them from a signalfd, and a LogWriter may start before it does (at the first log line).
  // Started with every signal blocked, the thread keeps that mask; this thread's is restored.
  sigset_t all, before;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &before);
  std::thread([s = state_] { s->run(); }).detach();
  ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
}

LogWriter::~LogWriter() {
  flush(kLogFlushAtExit);
  std::lock_guard lock(state_->mu);
  state_->stop = true;
  state_->wake.notify_all();
}

bool LogWriter::write(std::string_view text) noexcept {
  if (text.empty()) return true;
  State& s = *state_;
  bool queued = false;
  {
    std::lock_guard lock(s.mu);
    if (s.queue.size() + text.size() <= s.capacity) {
      s.queue.append(text);
      s.queued_total += text.size();
      queued = true;
    }
  }
  if (queued) {
    // After the unlock: the writer, woken, does not block on the mutex this thread still holds
    // (a second futex call and a second wake-up on the caller's path, an io loop's).
    s.wake.notify_one();
    return true;
  }
  s.dropped.fetch_add(static_cast<std::uint64_t>(std::max<std::ptrdiff_t>(1, std::count(text.begin(), text.end(), '\n'))),
                      std::memory_order_relaxed);
  return false;
}

std::uint64_t LogWriter::dropped() const noexcept { return state_->dropped.load(std::memory_order_relaxed); }

bool LogWriter::flush(std::chrono::milliseconds timeout) noexcept {
  State& s = *state_;
  std::unique_lock lock(s.mu);
  const std::uint64_t target = s.queued_total;
  return s.drained.wait_for(lock, timeout, [&] { return s.written_total >= target; });
}

LogWriter& stderr_log() {
  static LogWriter log(STDERR_FILENO);
  return log;
}

}  // namespace leasehold
