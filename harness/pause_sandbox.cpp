// leasehold/harness: the pause-probe's sandbox (include/leasehold/harness/pause_sandbox.hpp).
#include "leasehold/harness/pause_sandbox.hpp"

#include "leasehold/harness/process.hpp"
#include "leasehold/shm/layout.hpp"
#include "leasehold/shm/table.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>

namespace leasehold::harness {

namespace {

/// The sandbox's log: one write per line (O_APPEND).
class SandboxLog {
 public:
  explicit SandboxLog(int fd) : fd_(fd) {}
  ~SandboxLog() { ::close(fd_); }
  SandboxLog(const SandboxLog&) = delete;
  SandboxLog& operator=(const SandboxLog&) = delete;
  /// One line of at most 255 bytes (printf format), in one write.
  __attribute__((format(printf, 2, 3))) void line(const char* format, ...) {
    char buf[256];
    va_list args;
    va_start(args, format);
    const int n = std::vsnprintf(buf, sizeof buf, format, args);
    va_end(args);
    if (n > 0) (void)!::write(fd_, buf, static_cast<std::size_t>(std::min(n, static_cast<int>(sizeof buf) - 1)));
  }
  /// Logs "# error: MESSAGE" and returns the failure.
  Status error(Errc code, const std::string& message) {
    line("# error: %s\n", message.c_str());
    return Status{code, message};
  }

 private:
  int fd_;
};

/// The latest accepted check, in a shared mapping that outlives a SIGKILL (see
/// leasehold/pause/model.hpp close_open_interval); nullptr when it cannot be made.
std::atomic<std::int64_t>* map_last_accept(const std::string& beacon) {
  std::atomic<std::int64_t>* shared = nullptr;
  const int bfd = ::open(beacon.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (bfd >= 0 && ::ftruncate(bfd, 64) == 0) {
    void* m = ::mmap(nullptr, 64, PROT_READ | PROT_WRITE, MAP_SHARED, bfd, 0);
    if (m != MAP_FAILED) shared = new (m) std::atomic<std::int64_t>(0);
  }
  if (bfd >= 0) ::close(bfd);
  return shared;
}

/// Checks every poll_us until the lifetime ends, logging each change of the answer.
void check_loop(const PauseSandboxOptions& o, SandboxLog& log, const shm::TableReader& table, std::uint32_t slot,
                std::uint64_t epoch, std::atomic<std::int64_t>* last_accept_shared) {
  const shm::Slot* s = table.slot(slot);
  const std::int64_t start = now_ns();
  log.line("start t=%" PRId64 " slot=%u epoch=%" PRIu64 " pid=%d\n", start, slot, epoch, static_cast<int>(::getpid()));
  enum { kUnknown, kValid, kRefused } state = kUnknown;
  std::int64_t last_accept = 0;
  std::uint64_t accepts = 0, refusals = 0, late = 0;
  const std::int64_t end = start + static_cast<std::int64_t>(o.lifetime_ms) * 1'000'000;
  const timespec nap{0, static_cast<long>(std::min<std::uint64_t>(o.poll_us, 999'999) * 1000)};
  for (std::int64_t t = now_ns(); t < end; t = now_ns()) {
    // t is read before check_deadline reads its own clock, and valid_until after it: an accept
    // with t > valid_until can only mean the check accepted an expired lease.
    const bool ok = table.check_deadline(slot, epoch);
    const std::int64_t vu = static_cast<std::int64_t>(s->valid_until_ns.load(std::memory_order_acquire));
    if (ok) {
      ++accepts;
      if (t > vu) {
        ++late;
        log.line("late t=%" PRId64 " vu=%" PRId64 "\n", t, vu);
      }
      if (state != kValid) log.line("valid t=%" PRId64 " vu=%" PRId64 "\n", t, vu);
      state = kValid;
      last_accept = t;
      if (last_accept_shared != nullptr) last_accept_shared->store(t, std::memory_order_relaxed);
    } else {
      ++refusals;
      if (state != kRefused) log.line("refused t=%" PRId64 " last=%" PRId64 " vu=%" PRId64 "\n", t, last_accept, vu);
      state = kRefused;
    }
    ::clock_nanosleep(CLOCK_BOOTTIME, 0, &nap, nullptr);
  }
  log.line("exit t=%" PRId64 " accepts=%" PRIu64 " refusals=%" PRIu64 " late=%" PRIu64 "\n", now_ns(), accepts, refusals,
           late);
}

}  // namespace

Status run_pause_sandbox(const PauseSandboxOptions& o) {
  // One sandbox, one log: truncated at the start (a log of an earlier life would read as two).
  const int fd = ::open(o.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return Status{Errc::invalid_argument, "cannot open " + o.log + ": " + std::strerror(errno)};
  SandboxLog log(fd);
  const char* slot_env = std::getenv("LEASEHOLD_SLOT");
  const char* epoch_env = std::getenv("LEASEHOLD_EPOCH");
  if (slot_env == nullptr || epoch_env == nullptr || std::getenv("LEASEHOLD_SHM") == nullptr)
    return log.error(Errc::invalid_argument,
                     "LEASEHOLD_SHM, LEASEHOLD_SLOT and LEASEHOLD_EPOCH must be set (run it as a named sandbox)");
  const std::uint32_t slot = static_cast<std::uint32_t>(std::strtoul(slot_env, nullptr, 10));
  const std::uint64_t epoch = std::strtoull(epoch_env, nullptr, 10);
  std::optional<shm::TableReader> table;
  try {
    table.emplace(shm::TableReader::open(shm::location_from_env(), shm::OpenOptions{2'000'000'000, 1'000'000}));
  } catch (const shm::TableError& e) {
    return log.error(Errc::corrupt, e.what());
  }
  if (table->slot(slot) == nullptr) return log.error(Errc::not_found, "slot " + std::to_string(slot) + " out of range");
  check_loop(o, log, *table, slot, epoch, map_last_accept(o.log + ".last"));
  return {};
}

}  // namespace leasehold::harness
