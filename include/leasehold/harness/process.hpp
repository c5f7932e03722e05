// leasehold/harness: real processes for the demo, the pause-probe and the process tests - spawn
// with an environment and stdout/stderr in files, a pidfd, bounded waits, SIGTERM and SIGKILL;
// temporary directories; the one clock and the polling waits they are measured with.
//
// Times are CLOCK_BOOTTIME (io/clock.hpp), timeouts std::chrono::milliseconds. Errors come back
// as false (or nullopt) with a message naming the program, the file or the system call.
#pragma once

#include "leasehold/io/clock.hpp"
#include "leasehold/lease/result.hpp"

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace leasehold::harness {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

/// What slurp() reads at most by default (a log can grow without bound).
inline constexpr std::size_t kSlurpBytesMax = std::size_t{16} << 20;

/// The content of the file at `path`, at most `max_bytes` of it; empty when it cannot be read
/// (a log not yet created reads as empty).
std::string slurp(const fs::path& path, std::size_t max_bytes = kSlurpBytesMax);

/// The last `lines` lines of `text` ("(empty)" for none): for error messages about a log.
std::string tail_lines(std::string_view text, std::size_t lines);

/// Nanoseconds on CLOCK_BOOTTIME: lease/clock.hpp's boottime_ns(), the clock of every deadline.
inline std::int64_t now_ns() noexcept { return boottime_ns(); }

/// Sleeps `ms` milliseconds (CLOCK_BOOTTIME, restarted after a signal); `ms` <= 0 returns at once.
void sleep_ms(std::int64_t ms);

/// What a driver's `tick` throws to abandon a wait, a trial or a sweep (Ctrl-C). Not a
/// std::exception: code that turns failures into messages does not swallow it; the harness
/// cleans up and rethrows it.
struct Interrupted {};

/// Ctrl-C for a driver: while one lives, SIGINT and SIGTERM only set a process-wide flag, and
/// check() - the driver's `tick` - throws Interrupted once one of them arrived. The flag is
/// cleared on construction; the former handlers come back on destruction. One at a time per
/// process; not thread-safe to construct, check() may run on any thread.
class InterruptScope {
 public:
  InterruptScope();
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;
  /// Throws Interrupted when SIGINT or SIGTERM arrived since the scope began.
  static void check();
};

/// The most sleep_until_ns() sleeps between two calls of its `tick` (ns).
inline constexpr std::int64_t kSleepTickNs = 10'000'000;

/// Sleeps until `t_ns` (CLOCK_BOOTTIME ns, as now_ns()), calling `tick` (may throw, e.g. to honour
/// Ctrl-C) first and then at least every kSleepTickNs (10 ms); a `t_ns` already past returns
/// after one tick.
void sleep_until_ns(std::int64_t t_ns, const std::function<void()>& tick = {});

/// Writes `text` to `path`, created (mode 0666 less the umask) or truncated. Errors: the
/// errno's Errc (io_error when the stream set none), "cannot write PATH: REASON".
Status write_file(const fs::path& path, std::string_view text);

/// The directory part of `path`: everything before its last '/' ("." when it has none, "" for
/// a file right below the root, "/x").
std::string dir_of(const std::string& path);

/// Calls `tick` (may throw, e.g. to honour Ctrl-C) then `pred` every `interval` until `pred` is
/// true (true) or `timeout` has passed (the last answer of `pred`).
bool eventually(const std::function<bool()>& pred, milliseconds timeout = milliseconds(10'000),
                milliseconds interval = milliseconds(5), const std::function<void()>& tick = {});

/// pidfd_open(2) of `pid`: a file descriptor that becomes readable when the process exits;
/// -1 with errno set (ESRCH: no such process; ENOSYS: a kernel older than 5.3).
int pidfd_open(pid_t pid) noexcept;

/// True once the process behind `pidfd` has exited (the pidfd is readable); never blocks.
bool pidfd_exited(int pidfd) noexcept;

/// Waits up to `timeout` for the process behind `pidfd` to exit, calling `tick` (which may
/// throw) every millisecond: now_ns() when it was seen gone, or -1 when it still runs.
std::int64_t wait_pidfd_exit(int pidfd, milliseconds timeout, const std::function<void()>& tick = {});

/// The path of program `name` on PATH, then in /usr/sbin, /sbin, /usr/bin, /bin (where `ip`
/// and `nft` live though a user's PATH may lack them); "" when it is nowhere executable.
std::string find_program(const std::string& name);

/// A private directory /tmp/<prefix>-XXXXXX (mode 0700), removed with its content on
/// destruction unless keep() was called. Throws std::runtime_error naming the template and the
/// reason when it cannot be made.
class TempDir {
 public:
  explicit TempDir(std::string_view prefix = "leasehold");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const noexcept { return path_; }
  /// Leaves the directory in place when this object goes.
  void keep() noexcept { keep_ = true; }
  bool kept() const noexcept { return keep_; }

 private:
  fs::path path_;
  bool keep_ = false;
};

/// How to start a Process.
struct Spawn {
  /// argv[0] is the program: a path, or a name looked up on PATH when `search_path`.
  std::vector<std::string> argv;
  /// NAME, value pairs set in the child over this process's environment.
  std::vector<std::pair<std::string, std::string>> env;
  /// The child's stdout; empty: /dev/null. The file is made 0600 if it does not exist.
  fs::path stdout_path;
  /// The child's stderr; empty: /dev/null; equal to `stdout_path`: the same open file (one log).
  fs::path stderr_path;
  /// >= 0: the child's stderr is this descriptor (`stderr_path` is then ignored).
  int stderr_fd = -1;
  bool append_stdout = false;  ///< append to `stdout_path` (default: truncate it)
  bool append_stderr = false;  ///< append to `stderr_path` (default: truncate it)
  bool search_path = false;    ///< look argv[0] up on PATH (execvp)
  bool own_process_group = true;  ///< setpgid(0, 0): kill9() then kills its whole group
  bool die_with_parent = true;    ///< PR_SET_PDEATHSIG SIGKILL: nothing outlives a crashed driver
  /// Non-empty: the child enters the network namespace /run/netns/<netns> before it execs.
  std::string netns;
  /// A label for error messages ("lockd", "worker 1"); empty: argv[0].
  std::string label;
};

/// One child process. Killed (SIGKILL, and its group) and reaped on destruction. Not thread-safe.
class Process {
 public:
  Process() = default;
  ~Process();
  Process(Process&& o) noexcept;
  Process& operator=(Process&& o) noexcept;
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  /// Starts `spec` (a running child of this object is killed first). Errors, the message naming
  /// the file, namespace or system call that failed: invalid_argument (empty argv), or the errno
  /// of open(2) or fork(2) (errc_of_errno). An exec failure shows as exit code 127 with "cannot
  /// execute ARGV0: REASON" on the child's stderr.
  Status start(const Spawn& spec);

  /// The child's pid; -1 before start() and once it has been reaped.
  pid_t pid() const noexcept { return pid_; }
  /// A pidfd of the child (readable once it exits); -1 when pidfd_open is unavailable.
  int pidfd() const noexcept { return pidfd_; }
  const std::string& label() const noexcept { return label_; }
  const fs::path& stdout_path() const noexcept { return stdout_path_; }
  const fs::path& stderr_path() const noexcept { return stderr_path_; }
  std::string out() const { return slurp(stdout_path_); }
  std::string err() const { return slurp(stderr_path_); }

  /// True while the child runs; reaps it (and records its exit code) once it has exited.
  bool running();
  /// The exit status once reaped: the exit code, or 128 + the signal that ended it.
  std::optional<int> exit_code() const noexcept { return code_; }
  /// Waits up to `timeout` for the child to exit: its exit code (128 + signal), or -1 when it
  /// still runs (or never started and has no code).
  int wait(milliseconds timeout);
  /// Sends `sig` to the child (no-op when it is not running).
  void signal(int sig) noexcept;
  /// SIGCONT then SIGTERM, waits up to `grace`, then kill9(): the exit code (128 + signal), or
  /// -1 when there was no child.
  int terminate(milliseconds grace = milliseconds(5'000));
  /// SIGCONT and SIGKILL (its process group too, when it has one) and reap; no-op without a child.
  void kill9() noexcept;

 private:
  void reaped(int status) noexcept;
  void close_pidfd() noexcept;
  pid_t pid_ = -1;
  int pidfd_ = -1;
  bool own_group_ = false;
  std::optional<int> code_;
  std::string label_;
  fs::path stdout_path_, stderr_path_;
};

/// Waits until `file` has a whole line (newline-terminated) containing `pattern` and returns
/// that line (without its newline), the first such line from byte `from` on. A `pattern` that
/// ends with "\n" matches the end of a line. nullopt when
/// `timeout` passes first, or when `watched` (if given) has exited without printing it. `tick`
/// runs at every poll (it may throw).
std::optional<std::string> wait_for_log_line(const fs::path& file, std::string_view pattern, milliseconds timeout,
                                             Process* watched = nullptr, const std::function<void()>& tick = {},
                                             std::size_t from = 0);

/// As wait_for_log_line, the line or why not, with the last lines of `file`: timeout "LABEL did
/// not print "PATTERN" within N ms", or refused "LABEL exited during start-up (code C, before
/// printing "PATTERN")".
Result<std::string> wait_for_log_line(const fs::path& file, std::string_view pattern, milliseconds timeout,
                                      Process& watched, const std::function<void()>& tick = {});

/// Runs `argv` (argv[0] looked up on PATH) to completion with stdin from /dev/null, stdout and
/// stderr together into `*output` (at most 1 MiB kept); SIGKILLed after `timeout`. The exit code,
/// 128 + signal, or 127 when it cannot be run.
int run_command(const std::vector<std::string>& argv, std::string* output = nullptr,
                milliseconds timeout = milliseconds(10'000));

}  // namespace leasehold::harness
