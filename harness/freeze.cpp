// harness/freeze.cpp: freezing one process by cgroup v2 or SIGSTOP (include/leasehold/harness/freeze.hpp).
#include "leasehold/harness/freeze.hpp"

#include "leasehold/harness/process.hpp"
#include "leasehold/supervisor/cgroup.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace leasehold::harness {
namespace {

constexpr std::int64_t kConfirmTimeoutMs = kFreezeConfirmTimeout.count();

/// Writes `text` to the existing file `path` in one write(2); false with errno on failure.
bool write_text(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int e = errno;
  ::close(fd);
  errno = e;
  return ok;
}

/// The state letter of a /proc/<pid>/stat text ('?' when it does not parse).
char stat_state(const std::string& text) {
  const auto p = text.rfind(')');
  return p != std::string::npos && p + 2 < text.size() ? text[p + 2] : '?';
}

}  // namespace

std::string freeze_leaf_name(pid_t pid) { return "leasehold-pause-" + std::to_string(pid); }

char process_state(pid_t pid) {
  const Result<std::string> text = read_small_file("/proc/" + std::to_string(pid) + "/stat");
  if (!text) return '?';
  return stat_state(*text);
}

Result<std::unique_ptr<Freezer>> Freezer::make(pid_t pid, const std::string& want) {
  std::unique_ptr<Freezer> f(new Freezer());
  f->pid_ = pid;
  if (want == "sigstop") {
    f->kind_ = Kind::sigstop;
    f->why_ = "SIGSTOP/SIGCONT (asked for)";
    return f;
  }
  const Status cgroup = f->setup_cgroup();
  if (cgroup.ok()) {
    f->kind_ = Kind::cgroup;
    f->why_ = "cgroup v2 freeze of " + f->leaf_;
    return f;
  }
  if (want == "cgroup") return Status{Errc::unsupported, "--freeze cgroup: " + cgroup.message()};
  f->kind_ = Kind::sigstop;
  f->why_ = "SIGSTOP/SIGCONT (cgroup v2 freeze unavailable: " + cgroup.message() + ")";
  return f;
}

Freezer::~Freezer() {
  if (const Status thawed = thaw_if_frozen(); !thawed.ok())
    std::fprintf(stderr, "leasehold pause-probe: warning: cannot thaw pid %d: %s\n", static_cast<int>(pid_),
                 thawed.message().c_str());
  if (kind_ == Kind::cgroup && !leaf_.empty()) {
    if (!home_.empty() && !write_text(home_ + "/cgroup.procs", std::to_string(pid_)))
      std::fprintf(stderr, "leasehold pause-probe: warning: cannot move pid %d back to %s: %s\n",
                   static_cast<int>(pid_), home_.c_str(), std::strerror(errno));
    for (int i = 0; i < 100 && ::rmdir(leaf_.c_str()) != 0 && errno == EBUSY; ++i) ::usleep(10'000);
  }
}

Status Freezer::thaw_if_frozen() {
  if (!frozen_) return {};
  const Result<std::int64_t> thawed = thaw();
  return thawed.status();
}

Result<std::int64_t> Freezer::freeze() { return set_frozen(true); }

Result<std::int64_t> Freezer::thaw() { return set_frozen(false); }

Result<std::int64_t> Freezer::set_frozen(bool frozen) {
  frozen_ = frozen;
  std::int64_t confirmed_ns = 0;
  Status seen;
  if (kind_ == Kind::cgroup) {
    const std::string file = leaf_ + "/cgroup.freeze";
    if (!write_text(file, frozen ? "1" : "0")) return Status::from_errno(errno, "cannot write " + file);
    seen = await_cgroup(frozen ? 1 : 0, confirmed_ns);
  } else {
    if (::kill(pid_, frozen ? SIGSTOP : SIGCONT) != 0) return Status::from_errno(errno, frozen ? "SIGSTOP" : "SIGCONT");
    seen = await_stopped(frozen, confirmed_ns);
  }
  if (!seen.ok()) return seen;
  return confirmed_ns;
}

Status Freezer::setup_cgroup() {
  const Result<std::string> mountinfo = read_small_file("/proc/self/mountinfo");
  if (!mountinfo) return mountinfo.status();
  const auto m = find_cgroup2_mount(*mountinfo);
  if (!m) return Status{Errc::unsupported, "no cgroup2 mount in /proc/self/mountinfo"};
  const std::string proc_cg = "/proc/" + std::to_string(pid_) + "/cgroup";
  std::optional<std::string> rel;
  if (const Result<std::string> cg = read_small_file(proc_cg)) rel = own_cgroup2_path(*cg);
  if (!rel) return Status{Errc::unsupported, "no cgroup v2 line in " + proc_cg};
  std::string r = *rel;
  if (m->root != "/" && r.rfind(m->root, 0) == 0) r = r.substr(m->root.size());
  const std::string leaf_name = freeze_leaf_name(pid_);
  home_ = m->mount_point + (r == "/" ? "" : r);
  // Left in a leaf of ours by a driver that died: the leaf's parent is where it belongs.
  if (const auto slash = home_.rfind('/'); slash != std::string::npos && home_.substr(slash + 1) == leaf_name)
    home_.resize(slash);
  const std::string leaf = home_ + "/" + leaf_name;
  if (::mkdir(leaf.c_str(), 0755) != 0 && errno != EEXIST) return Status::from_errno(errno, "cannot create " + leaf);
  leaf_ = leaf;
  if (::access((leaf + "/cgroup.freeze").c_str(), W_OK) != 0) {
    ::rmdir(leaf.c_str());
    leaf_.clear();
    return Status{Errc::unsupported, leaf + "/cgroup.freeze is missing (kernel before 5.2?)"};
  }
  write_text(leaf + "/cgroup.freeze", "0");  // a reused leaf may have been left frozen
  if (!write_text(leaf + "/cgroup.procs", std::to_string(pid_))) {
    const Status moved = Status::from_errno(errno, "cannot move pid " + std::to_string(pid_) + " into " + leaf);
    ::rmdir(leaf.c_str());
    leaf_.clear();
    return moved;
  }
  return {};
}

Status Freezer::await_cgroup(int want, std::int64_t& confirmed_ns) {
  const std::int64_t deadline = now_ns() + kConfirmTimeoutMs * 1'000'000;
  for (;;) {
    const Result<std::string> text = read_small_file(leaf_ + "/cgroup.events");
    if (text && parse_cgroup_keyed(*text, "frozen") == want) {
      confirmed_ns = now_ns();
      return {};
    }
    if (now_ns() > deadline)
      return Status{Errc::timeout, leaf_ + "/cgroup.events did not show frozen " + std::to_string(want) + " within " +
                                       std::to_string(kConfirmTimeoutMs) + " ms"};
    ::usleep(100);
  }
}

Status Freezer::await_stopped(bool want, std::int64_t& confirmed_ns) {
  const std::int64_t deadline = now_ns() + kConfirmTimeoutMs * 1'000'000;
  const std::string path = "/proc/" + std::to_string(pid_) + "/stat";
  for (;;) {
    const Result<std::string> text = read_small_file(path);
    if (!text) return text.status();
    const char state = stat_state(*text);
    const bool stopped = state == 'T' || state == 't';
    if (stopped == want) {
      confirmed_ns = now_ns();
      return {};
    }
    if (now_ns() > deadline)
      return Status{Errc::timeout, "pid " + std::to_string(pid_) + (want ? " did not stop" : " did not continue") +
                                       " within " + std::to_string(kConfirmTimeoutMs) + " ms"};
    ::usleep(100);
  }
}

std::optional<LeftFrozen> thaw_left_frozen(pid_t pid) {
  const Result<std::string> cg = read_small_file("/proc/" + std::to_string(pid) + "/cgroup");
  const Result<std::string> mountinfo = read_small_file("/proc/self/mountinfo");
  if (!cg || !mountinfo) return std::nullopt;
  const auto rel = own_cgroup2_path(*cg);
  const auto m = find_cgroup2_mount(*mountinfo);
  const std::string leaf_name = freeze_leaf_name(pid);
  if (!rel || !m || rel->size() < leaf_name.size() || rel->substr(rel->size() - leaf_name.size()) != leaf_name)
    return std::nullopt;
  std::string r = *rel;
  if (m->root != "/" && r.rfind(m->root, 0) == 0) r = r.substr(m->root.size());
  LeftFrozen left;
  left.leaf = m->mount_point + r;
  const Result<std::string> events = read_small_file(left.leaf + "/cgroup.events");
  if (!events || parse_cgroup_keyed(*events, "frozen") != 1) return std::nullopt;
  const int ffd = ::open((left.leaf + "/cgroup.freeze").c_str(), O_WRONLY | O_CLOEXEC);
  left.thawed = ffd >= 0 && ::write(ffd, "0", 1) == 1;
  left.error = left.thawed ? 0 : errno;
  if (ffd >= 0) ::close(ffd);
  return left;
}

}  // namespace leasehold::harness
