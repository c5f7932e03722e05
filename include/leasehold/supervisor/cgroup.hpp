// leasehold/supervisor: cgroup v2 discovery and per-sandbox leaf cgroups.
//
// The kill-switch kills a sandbox's whole process tree by writing "1" to its leaf's `cgroup.kill`
// (Linux 5.14+), and confirms death by `populated 0` in `cgroup.events` (DESIGN.md "The
// supervisor"). That needs a cgroup v2 hierarchy we may create children in ("delegated"). Where
// there is none, the supervisor falls back to signalling the sandbox's pidfd and process group;
// `CgroupTree::discover` decides which mode is in use and says why, so the daemon can print it.
//
// The cgroup2 mount is found in /proc/self/mountinfo, never assumed to be /sys/fs/cgroup: hybrid
// hosts mount it elsewhere (e.g. /sys/fs/cgroup/unified). Errors are -errno (liburing style) or a
// message string naming the file and the reason; nothing here throws.
//
// Threading: a CgroupTree and its leaves belong to the io thread; the rt thread only uses the fds
// a leaf opened in advance (`kill_fd`, `events_fd`) through the free functions at the bottom.
#pragma once

#include "leasehold/lease/result.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace leasehold {

/// Longest leaf name (a sandbox id in UUID text is 36 bytes).
inline constexpr std::size_t kCgroupLeafNameBytesMax = 64;
/// Largest /proc or cgroupfs file we read whole (mountinfo on a busy host is a few 10 kB).
inline constexpr std::size_t kProcFileBytesMax = 4u << 20;
/// sweep_leaves: how long a killed leaf may take to empty before it is left in place.
inline constexpr int kSweepWaitMs = 1000;

/// How the kill-switch reaches a sandbox's processes.
enum class KillMode : std::uint8_t {
  cgroup_v2_delegated,  ///< per-sandbox leaf cgroups; kill = cgroup.kill, death = populated 0
  process_group,        ///< pidfd_send_signal(SIGKILL) + kill(-pgid); death = pidfd readable
};
const char* describe(KillMode mode) noexcept;

/// Undoes mountinfo's octal escapes (\040 space, \011 tab, \012 newline, \134 backslash;
/// proc_pid_mountinfo(5)). Other backslashes are kept as they are.
std::string unescape_mountinfo(std::string_view field);

/// The cgroup2 mount found in mountinfo: where it is mounted and which cgroup it shows.
struct Cgroup2Mount {
  std::string mount_point;  ///< unescaped, e.g. "/sys/fs/cgroup/unified"
  std::string root;         ///< the mount's root inside the hierarchy, usually "/"
};

/// Finds the cgroup2 mount in the text of /proc/self/mountinfo (fstype after the " - "
/// separator is "cgroup2"). Prefers a mount whose root is "/". nullopt if there is none
/// (a cgroup-v1-only host). Malformed lines are skipped.
std::optional<Cgroup2Mount> find_cgroup2_mount(std::string_view mountinfo);

/// Our cgroup v2 path from the text of /proc/self/cgroup: the "0::<path>" line. nullopt if
/// there is none.
std::optional<std::string> own_cgroup2_path(std::string_view proc_self_cgroup);

/// Parses `key value` lines of a cgroup.events / cgroup.stat text. Returns the value (>= 0)
/// or -ENOENT when the key is missing, -EINVAL when its value is not a number.
long parse_cgroup_keyed(std::string_view text, std::string_view key) noexcept;

/// Reads a whole (small) file. Errors, the message naming the path: as open(2) and read(2)
/// (errc_of_errno), or io_error above kProcFileBytesMax.
Result<std::string> read_small_file(const std::string& path);

struct CgroupConfig {
  /// Where leaves are created. Empty: <cgroup2 mount>/<our cgroup>/leasehold.
  std::string parent_path;
  /// False forces the process-group fallback (e.g. for a host whose cgroup is managed elsewhere).
  bool use_cgroup = true;
  /// pids.max of every leaf (processes and threads of one sandbox), where the pids controller is
  /// delegated to the parent: discover() enables it in the parent's cgroup.subtree_control.
  /// 0: leave pids.max alone.
  std::uint64_t pids_max = 0;
  /// Sources, replaceable in tests.
  std::string mountinfo_path = "/proc/self/mountinfo";
  std::string proc_self_cgroup_path = "/proc/self/cgroup";
};

/// A per-sandbox leaf cgroup `<parent>/<name>`. Owns four fds opened at creation so the rt path
/// never resolves a path: the directory (for CLONE_INTO_CGROUP), cgroup.kill, cgroup.events and
/// cgroup.freeze. Move-only. The destructor closes the fds and tries to remove the directory
/// (it stays if still populated: call kill() and wait for populated() == 0 first).
class CgroupLeaf {
 public:
  CgroupLeaf() noexcept = default;
  CgroupLeaf(CgroupLeaf&& o) noexcept;
  CgroupLeaf& operator=(CgroupLeaf&& o) noexcept;
  CgroupLeaf(const CgroupLeaf&) = delete;
  CgroupLeaf& operator=(const CgroupLeaf&) = delete;
  ~CgroupLeaf();

  bool valid() const noexcept { return dir_fd_ >= 0; }
  const std::string& path() const noexcept { return path_; }
  int dir_fd() const noexcept { return dir_fd_; }
  int kill_fd() const noexcept { return kill_fd_; }
  int events_fd() const noexcept { return events_fd_; }

  /// Writes "1" to cgroup.kill: SIGKILL to every process in the leaf. 0 or -errno.
  int kill() const noexcept;
  /// 1 while any process lives in the leaf, 0 when none; -errno if unreadable.
  int populated() const noexcept;
  /// Writes cgroup.freeze ("1" freeze, "0" thaw). 0 or -errno. Freezing is asynchronous:
  /// frozen() turns 1 once every process has stopped.
  int freeze() const noexcept;
  int thaw() const noexcept;
  /// 1 when frozen, 0 when not; -errno if unreadable.
  int frozen() const noexcept;
  /// Closes the fds and removes the directory. Errors, the message naming the leaf: as rmdir(2)
  /// (errc_of_errno); busy (EBUSY) while populated: then the leaf stays valid so the caller can
  /// retry after the processes died.
  Status remove();

 private:
  friend class CgroupTree;
  /// remove() without a message: 0 or -errno (the destructor's).
  int remove_dir() noexcept;
  void close_fds() noexcept;
  std::string path_;
  int dir_fd_ = -1;
  int kill_fd_ = -1;
  int events_fd_ = -1;
  int freeze_fd_ = -1;
};

/// The leaf-cgroup parent and the mode in use on this host.
class CgroupTree {
 public:
  /// Discovers the cgroup2 mount and our cgroup, creates the parent if needed, and probes
  /// (with a throw-away child) that a child can be created, that its cgroup.procs is writable
  /// and that cgroup.kill exists. Never fails: when anything is missing the mode is
  /// process_group and reason() says what was missing and where.
  static CgroupTree discover(const CgroupConfig& config);

  KillMode mode() const noexcept { return mode_; }
  /// One line for the daemon's start-up log, e.g. "cgroup-v2-delegated: leaves under
  /// /sys/fs/cgroup/unified/leasehold (cgroup2 at /sys/fs/cgroup/unified, cgroup.kill present)".
  const std::string& reason() const noexcept { return reason_; }
  const std::string& mount_point() const noexcept { return mount_point_; }
  const std::string& parent_path() const noexcept { return parent_path_; }
  /// Whether create_leaf sets pids.max (CgroupConfig::pids_max) and to what (0: it does not).
  std::uint64_t pids_max() const noexcept { return pids_max_; }
  /// Why leaves get no pids.max (no pids controller in the parent's cgroup.controllers, or
  /// enabling it failed); empty when they do or none was asked for.
  const std::string& pids_reason() const noexcept { return pids_reason_; }

  /// Creates the leaf `<parent>/<name>` and opens its fds. `name`: 1..kCgroupLeafNameBytesMax
  /// bytes of [A-Za-z0-9._-], not starting with '.'. Fails, leaving nothing behind, with a
  /// Status naming the problem: invalid_argument (bad name), exists (already there), the
  /// errno's code of mkdir/open or of writing pids.max, unsupported (not
  /// cgroup_v2_delegated mode). Sets pids.max when pids_max() > 0.
  Result<CgroupLeaf> create_leaf(std::string_view name) const;

  /// What a sweep found: each leaf left under the parent, and whether processes still ran in it.
  struct SweptLeaf {
    std::string path;
    bool had_processes = false;
    int error = 0;  ///< -errno if the leaf could not be killed or removed (it stays)
  };
  /// Kills (cgroup.kill) every process in every leaf already under the parent and removes the
  /// leaves: at start-up they can only be an earlier supervisor's of the same worker (crashed,
  /// or stopped with --on-shutdown keep), and nothing watches their leases any more. Waits at
  /// most kSweepWaitMs per leaf for it to empty. Only in cgroup_v2_delegated mode.
  std::vector<SweptLeaf> sweep_leaves() const;

 private:
  Result<CgroupLeaf> open_leaf(const std::string& path) const;
  KillMode mode_ = KillMode::process_group;
  std::string reason_;
  std::string mount_point_;
  std::string parent_path_;
  std::uint64_t pids_max_ = 0;
  std::string pids_reason_;
};

// ---- rt path: fds opened in advance, no allocation, no path lookup --------------------------

/// Writes "1" to an open cgroup.kill fd. 0 or -errno.
int cgroup_kill_fd(int kill_fd) noexcept;
/// Reads `populated` from an open cgroup.events fd (pread at 0). 1/0 or -errno.
int cgroup_populated_fd(int events_fd) noexcept;

}  // namespace leasehold
