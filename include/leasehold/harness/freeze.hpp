// leasehold/harness: freezing one process for a measured pause (the pause-probe's supervisor) -
// cgroup v2 `cgroup.freeze` of a leaf of its own, or SIGSTOP/SIGCONT - and thawing a process a
// driver that died left frozen.
//
// Times are CLOCK_BOOTTIME nanoseconds (harness::now_ns()). Errors come back as a Status (or the
// Result of make()) whose message names the cgroup file or the signal (DESIGN.md "Errors").
#pragma once

#include "leasehold/lease/result.hpp"

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace leasehold::harness {

/// How long freeze() and thaw() wait to see their effect (cgroup.events frozen, or state T).
inline constexpr std::chrono::milliseconds kFreezeConfirmTimeout{2'000};

/// The name of the cgroup leaf a Freezer moves process `pid` into: "leasehold-pause-<pid>".
std::string freeze_leaf_name(pid_t pid);

/// The state letter of process `pid` from /proc/<pid>/stat ('R', 'S', 'T' stopped, 't' traced
/// stop, ...); '?' when it cannot be read.
char process_state(pid_t pid);

/// Freezes one process: cgroup v2 (the process is moved into a leaf of its own,
/// freeze_leaf_name(pid), next to the cgroup it is in - e.g. beside a supervisor's sandboxes'
/// leaves, so they keep running - and `cgroup.freeze` of that leaf is written) or SIGSTOP/SIGCONT.
/// The destructor thaws, moves the process back to the cgroup it was in at the start (read from
/// /proc/PID/cgroup), and removes the leaf. A leaf left behind by a driver that died (the process
/// still in `<cgroup>/leasehold-pause-<pid>`) is recognised: its parent is the home, and the
/// leaf is reused and removed at the end. Not thread-safe.
class Freezer {
 public:
  enum class Kind { cgroup, sigstop };

  /// `want`: "auto" (cgroup where possible), "cgroup", "sigstop". Errc::unsupported when
  /// "cgroup" was asked for and is impossible; why() says what was chosen and why.
  static Result<std::unique_ptr<Freezer>> make(pid_t pid, const std::string& want);
  ~Freezer();
  Freezer(const Freezer&) = delete;
  Freezer& operator=(const Freezer&) = delete;

  Kind kind() const noexcept { return kind_; }
  /// How it freezes and why ("cgroup v2 freeze of <leaf>", "SIGSTOP/SIGCONT (asked for)", or
  /// SIGSTOP with the reason cgroup v2 freeze was unavailable).
  const std::string& why() const noexcept { return why_; }
  /// "cgroup" or "sigstop".
  const char* name() const noexcept { return kind_ == Kind::cgroup ? "cgroup" : "sigstop"; }
  /// The cgroup v2 directory the process was in at the start ("" with SIGSTOP).
  const std::string& home() const noexcept { return home_; }
  /// The leaf the process was moved into ("" with SIGSTOP).
  const std::string& leaf() const noexcept { return leaf_; }

  /// Freezes; the boot-clock ns at which the freeze was seen complete. io_error (a cgroup
  /// file, a signal) or timeout (not seen frozen within 2 s).
  Result<std::int64_t> freeze();
  /// Thaws; the boot-clock ns at which the process was seen running again. Errors as freeze().
  Result<std::int64_t> thaw();
  /// Thaws if a freeze was requested and not undone. Safe to call at any time.
  Status thaw_if_frozen();

 private:
  Freezer() = default;
  /// Moves the process into a leaf of its own with a cgroup.freeze. Errors: unsupported (no
  /// cgroup2 mount, no cgroup v2 line, no cgroup.freeze), or the errno of a cgroup file or
  /// mkdir (errc_of_errno); the message names the file.
  Status setup_cgroup();
  /// freeze() (true) or thaw() (false): the write or signal, then the wait for its effect.
  Result<std::int64_t> set_frozen(bool frozen);
  Status await_cgroup(int want, std::int64_t& confirmed_ns);
  Status await_stopped(bool want, std::int64_t& confirmed_ns);
  Kind kind_ = Kind::sigstop;
  pid_t pid_ = -1;
  std::string leaf_, home_;
  std::string why_;
  bool frozen_ = false;
};

/// What thaw_left_frozen() found: the frozen leaf of `pid`, and whether writing 0 to its
/// `cgroup.freeze` succeeded (else `error` is the errno).
struct LeftFrozen {
  std::string leaf;
  bool thawed = false;
  int error = 0;
};

/// A driver killed mid-freeze (SIGKILL: no destructor ran) leaves process `pid` frozen in its
/// freeze_leaf_name(pid) leaf. When `pid` is in such a leaf and the leaf is frozen, thaws it (a
/// later Freezer reuses the leaf and moves the process home); nullopt when there is nothing to
/// thaw (or the cgroup files cannot be read).
std::optional<LeftFrozen> thaw_left_frozen(pid_t pid);

}  // namespace leasehold::harness
