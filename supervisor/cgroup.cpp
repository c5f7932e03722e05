// leasehold/supervisor: cgroup v2 discovery and leaves (see cgroup.hpp).
#include "leasehold/supervisor/cgroup.hpp"

#include <poll.h>

#include <dirent.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <vector>

namespace leasehold {
namespace {

std::string errno_text(int err) { return std::string(std::strerror(err)); }

std::vector<std::string_view> split_fields(std::string_view line) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    const std::size_t start = i;
    while (i < line.size() && line[i] != ' ') ++i;
    if (i > start) out.push_back(line.substr(start, i - start));
  }
  return out;
}

bool valid_leaf_name(std::string_view name) {
  if (name.empty() || name.size() > kCgroupLeafNameBytesMax || name.front() == '.') return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

int write_all_fd(int fd, const char* text, std::size_t n) noexcept {
  const ssize_t w = ::write(fd, text, n);
  if (w < 0) return -errno;
  return static_cast<std::size_t>(w) == n ? 0 : -EIO;
}

int read_keyed_fd(int fd, std::string_view key) noexcept {
  char buf[256];
  const ssize_t n = ::pread(fd, buf, sizeof buf, 0);
  if (n < 0) return -errno;
  const long v = parse_cgroup_keyed(std::string_view(buf, static_cast<std::size_t>(n)), key);
  if (v < 0) return static_cast<int>(v);
  return v != 0 ? 1 : 0;
}

}  // namespace

const char* describe(KillMode mode) noexcept {
  switch (mode) {
    case KillMode::cgroup_v2_delegated: return "cgroup-v2-delegated";
    case KillMode::process_group: return "process-group";
  }
  return "unknown";
}

std::string unescape_mountinfo(std::string_view field) {
  std::string out;
  out.reserve(field.size());
  for (std::size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size()) {
      const char a = field[i + 1], b = field[i + 2], c = field[i + 3];
      if (a >= '0' && a <= '3' && b >= '0' && b <= '7' && c >= '0' && c <= '7') {
        out.push_back(static_cast<char>((a - '0') * 64 + (b - '0') * 8 + (c - '0')));
        i += 3;
        continue;
      }
    }
    out.push_back(field[i]);
  }
  return out;
}

std::optional<Cgroup2Mount> find_cgroup2_mount(std::string_view mountinfo) {
  std::optional<Cgroup2Mount> first;
  std::size_t pos = 0;
  while (pos < mountinfo.size()) {
    std::size_t end = mountinfo.find('\n', pos);
    if (end == std::string_view::npos) end = mountinfo.size();
    const auto fields = split_fields(mountinfo.substr(pos, end - pos));
    pos = end + 1;
    // id parent maj:min root mount-point options [optional...] - fstype source super-options
    if (fields.size() < 10) continue;
    std::size_t sep = 6;
    while (sep < fields.size() && fields[sep] != "-") ++sep;
    if (sep + 1 >= fields.size() || fields[sep + 1] != "cgroup2") continue;
    Cgroup2Mount m{unescape_mountinfo(fields[4]), unescape_mountinfo(fields[3])};
    if (m.root == "/") return m;
    if (!first) first = std::move(m);
  }
  return first;
}

std::optional<std::string> own_cgroup2_path(std::string_view text) {
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.substr(0, 3) == "0::" && line.size() > 3 && line[3] == '/') {
      return std::string(line.substr(3));
    }
  }
  return std::nullopt;
}

long parse_cgroup_keyed(std::string_view text, std::string_view key) noexcept {
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.size() > key.size() && line.substr(0, key.size()) == key && line[key.size()] == ' ') {
      const std::string_view v = line.substr(key.size() + 1);
      if (v.empty() || v.size() > 18) return -EINVAL;
      long out = 0;
      for (char c : v) {
        if (c < '0' || c > '9') return -EINVAL;
        out = out * 10 + (c - '0');
      }
      return out;
    }
  }
  return -ENOENT;
}

Result<std::string> read_small_file(const std::string& path) {
  std::string out;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::from_errno(errno, "cannot read " + path);
  char buf[16384];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return Status::from_errno(err, "cannot read " + path);
    }
    if (n == 0) break;
    if (out.size() + static_cast<std::size_t>(n) > kProcFileBytesMax) {
      ::close(fd);
      return Status{Errc::io_error, path + " is larger than " + std::to_string(kProcFileBytesMax) + " bytes"};
    }
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

// ---- CgroupLeaf ------------------------------------------------------------------------------

CgroupLeaf::CgroupLeaf(CgroupLeaf&& o) noexcept
    : path_(std::move(o.path_)), dir_fd_(o.dir_fd_), kill_fd_(o.kill_fd_),
      events_fd_(o.events_fd_), freeze_fd_(o.freeze_fd_) {
  o.dir_fd_ = o.kill_fd_ = o.events_fd_ = o.freeze_fd_ = -1;
  o.path_.clear();
}

CgroupLeaf& CgroupLeaf::operator=(CgroupLeaf&& o) noexcept {
  if (this != &o) {
    remove_dir();
    close_fds();
    path_ = std::move(o.path_);
    dir_fd_ = o.dir_fd_;
    kill_fd_ = o.kill_fd_;
    events_fd_ = o.events_fd_;
    freeze_fd_ = o.freeze_fd_;
    o.dir_fd_ = o.kill_fd_ = o.events_fd_ = o.freeze_fd_ = -1;
    o.path_.clear();
  }
  return *this;
}

CgroupLeaf::~CgroupLeaf() {
  remove_dir();
  close_fds();
}

void CgroupLeaf::close_fds() noexcept {
  for (int* fd : {&dir_fd_, &kill_fd_, &events_fd_, &freeze_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

int CgroupLeaf::kill() const noexcept { return cgroup_kill_fd(kill_fd_); }
int CgroupLeaf::populated() const noexcept { return cgroup_populated_fd(events_fd_); }
int CgroupLeaf::freeze() const noexcept {
  return freeze_fd_ < 0 ? -EBADF : write_all_fd(freeze_fd_, "1", 1);
}
int CgroupLeaf::thaw() const noexcept {
  return freeze_fd_ < 0 ? -EBADF : write_all_fd(freeze_fd_, "0", 1);
}
int CgroupLeaf::frozen() const noexcept {
  return events_fd_ < 0 ? -EBADF : read_keyed_fd(events_fd_, "frozen");
}

int CgroupLeaf::remove_dir() noexcept {
  if (path_.empty()) return 0;
  if (::rmdir(path_.c_str()) != 0 && errno != ENOENT) return -errno;
  close_fds();
  path_.clear();
  return 0;
}

Status CgroupLeaf::remove() {
  const std::string path = path_;
  if (const int r = remove_dir(); r < 0) return Status::from_errno(r, "cannot remove the cgroup leaf " + path);
  return {};
}

// ---- CgroupTree ------------------------------------------------------------------------------

CgroupTree CgroupTree::discover(const CgroupConfig& config) {
  CgroupTree t;
  auto fallback = [&](std::string why) {
    t.mode_ = KillMode::process_group;
    t.reason_ = std::string(describe(KillMode::process_group)) + ": " + std::move(why);
    return t;
  };
  if (!config.use_cgroup) return fallback("cgroup use disabled by configuration");

  Result<std::string> text = read_small_file(config.mountinfo_path);
  if (!text) return fallback(text.message());
  const auto mount = find_cgroup2_mount(*text);
  if (!mount) return fallback("no cgroup2 mount in " + config.mountinfo_path + " (cgroup v1-only host)");
  t.mount_point_ = mount->mount_point;

  std::string parent = config.parent_path;
  if (parent.empty()) {
    text = read_small_file(config.proc_self_cgroup_path);
    if (!text) return fallback(text.message());
    const auto own = own_cgroup2_path(*text);
    if (!own) return fallback("no \"0::\" line in " + config.proc_self_cgroup_path);
    parent = t.mount_point_ + (*own == "/" ? std::string() : *own) + "/leasehold";
  }
  t.parent_path_ = parent;

  if (::mkdir(parent.c_str(), 0755) != 0 && errno != EEXIST) {
    return fallback("cannot create the leaf parent " + parent + ": " + errno_text(errno) +
                    " (cgroup v2 not delegated to us?)");
  }
  struct stat st {};
  if (::stat(parent.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return fallback("leaf parent " + parent + " is not a directory");
  }
  const std::string probe = parent + "/probe-" + std::to_string(::getpid());
  if (::mkdir(probe.c_str(), 0755) != 0 && errno != EEXIST) {
    return fallback("cannot create a child cgroup in " + parent + ": " + errno_text(errno));
  }
  std::string why;
  if (::access((probe + "/cgroup.procs").c_str(), W_OK) != 0) {
    why = "cgroup.procs of a child of " + parent + " is not writable: " + errno_text(errno);
  } else if (::access((probe + "/cgroup.kill").c_str(), W_OK) != 0) {
    why = "no writable cgroup.kill in a child of " + parent + " (needs Linux 5.14+): " + errno_text(errno);
  }
  ::rmdir(probe.c_str());
  if (!why.empty()) return fallback(why);

  t.mode_ = KillMode::cgroup_v2_delegated;
  t.reason_ = std::string(describe(t.mode_)) + ": leaves under " + parent + " (cgroup2 at " +
              t.mount_point_ + ", cgroup.kill present)";
  if (config.pids_max > 0) {
    // The leaves' pids controller: available to the parent (its cgroup.controllers, i.e. enabled
    // by whoever delegated it), then enabled for its children.
    const Result<std::string> read = read_small_file(parent + "/cgroup.controllers");
    std::string controllers = read.ok() ? *read : std::string();
    while (!controllers.empty() && (controllers.back() == '\n' || controllers.back() == ' ')) controllers.pop_back();
    bool listed = false;
    std::istringstream words(controllers);
    for (std::string w; words >> w;) listed = listed || w == "pids";
    if (!read) {
      t.pids_reason_ = read.message();
    } else if (!listed) {
      t.pids_reason_ = "the pids controller is not delegated to " + parent + " (its cgroup.controllers: \"" +
                       controllers + "\")";
    } else if (const int fd = ::open((parent + "/cgroup.subtree_control").c_str(), O_WRONLY | O_CLOEXEC); fd < 0) {
      t.pids_reason_ = "cannot open " + parent + "/cgroup.subtree_control: " + errno_text(errno);
    } else {
      const int w = write_all_fd(fd, "+pids", 5);
      ::close(fd);
      if (w < 0) t.pids_reason_ = "cannot enable +pids in " + parent + "/cgroup.subtree_control: " + errno_text(-w);
      else t.pids_max_ = config.pids_max;
    }
    t.reason_ += t.pids_max_ > 0 ? ", pids.max " + std::to_string(t.pids_max_) + " per leaf"
                                 : ", no pids.max (" + t.pids_reason_ + ")";
  }
  return t;
}

Result<CgroupLeaf> CgroupTree::create_leaf(std::string_view name) const {
  if (mode_ != KillMode::cgroup_v2_delegated)
    return Status{Errc::unsupported, "no leaf cgroups in " + std::string(describe(mode_)) + " mode"};
  if (!valid_leaf_name(name))
    return Status::invalid("bad cgroup leaf name \"" + std::string(name) + "\": want 1.." +
                           std::to_string(kCgroupLeafNameBytesMax) + " bytes of [A-Za-z0-9._-], not starting with '.'");
  const std::string path = parent_path_ + "/" + std::string(name);
  if (::mkdir(path.c_str(), 0755) != 0) {
    const int e = errno;
    return Status{errc_of_errno(e), "cannot create cgroup " + path + ": " + errno_text(e)};
  }
  Result<CgroupLeaf> leaf = open_leaf(path);
  if (leaf && pids_max_ > 0) {
    // Before any process is in the leaf: a fork bomb never runs unbounded.
    const std::string limit = std::to_string(pids_max_);
    const int fd = ::openat(leaf->dir_fd(), "pids.max", O_WRONLY | O_CLOEXEC);
    const int w = fd < 0 ? -errno : write_all_fd(fd, limit.data(), limit.size());
    if (fd >= 0) ::close(fd);
    if (w < 0)  // the leaf's destructor removes the directory
      return Status{errc_of_errno(w), "cannot set " + path + "/pids.max to " + limit + ": " + errno_text(-w)};
  }
  return leaf;
}

Result<CgroupLeaf> CgroupTree::open_leaf(const std::string& path) const {
  CgroupLeaf leaf;
  leaf.path_ = path;  // from here on the leaf's destructor removes the directory
  leaf.dir_fd_ = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (leaf.dir_fd_ < 0) {
    const int e = errno;
    return Status{errc_of_errno(e), "cannot open cgroup " + path + ": " + errno_text(e)};
  }
  struct Want {
    const char* file;
    int flags;
    int* fd;
  } const wants[] = {{"cgroup.kill", O_WRONLY, &leaf.kill_fd_},
                     {"cgroup.events", O_RDONLY, &leaf.events_fd_},
                     {"cgroup.freeze", O_WRONLY, &leaf.freeze_fd_}};
  for (const auto& w : wants) {
    *w.fd = ::openat(leaf.dir_fd_, w.file, w.flags | O_CLOEXEC);
    if (*w.fd < 0) {
      const int e = errno;
      return Status{errc_of_errno(e), "cannot open " + path + "/" + w.file + ": " + errno_text(e)};
    }
  }
  return leaf;
}

std::vector<CgroupTree::SweptLeaf> CgroupTree::sweep_leaves() const {
  std::vector<SweptLeaf> out;
  if (mode_ != KillMode::cgroup_v2_delegated) return out;
  DIR* dir = ::opendir(parent_path_.c_str());
  if (dir == nullptr) return out;
  std::vector<std::string> paths;
  while (const dirent* e = ::readdir(dir))
    if (e->d_type == DT_DIR && e->d_name[0] != '.') paths.push_back(parent_path_ + "/" + e->d_name);
  ::closedir(dir);
  for (const auto& path : paths) {
    SweptLeaf s{path, false, 0};
    Result<CgroupLeaf> leaf = open_leaf(path);
    if (!leaf) {
      s.error = -EIO;
      out.push_back(std::move(s));
      continue;
    }
    s.had_processes = leaf->populated() == 1;
    if (s.had_processes) {
      s.error = leaf->kill();
      for (int waited = 0; s.error == 0 && leaf->populated() == 1 && waited < kSweepWaitMs; waited += 10) {
        pollfd p{leaf->events_fd(), POLLPRI, 0};  // cgroup.events signals a change with POLLPRI
        ::poll(&p, 1, 10);
      }
    }
    if (s.error == 0) s.error = leaf->remove_dir();
    if (s.error != 0) leaf->path_.clear();  // keep the directory (it is not ours to lose track of)
    out.push_back(std::move(s));
  }
  return out;
}

int cgroup_kill_fd(int kill_fd) noexcept {
  if (kill_fd < 0) return -EBADF;
  return write_all_fd(kill_fd, "1", 1);
}

int cgroup_populated_fd(int events_fd) noexcept {
  if (events_fd < 0) return -EBADF;
  return read_keyed_fd(events_fd, "populated");
}

}  // namespace leasehold
