// Tests of cgroup v2 discovery (mountinfo parsing on hybrid and unified hosts, escaped paths)
// and of leaf cgroups on this machine (create, populated, freeze/thaw, kill, remove).
#include "leasehold/supervisor/cgroup.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

namespace leasehold {
namespace {

// A hybrid host (systemd "hybrid"): v1 controllers plus cgroup2 at /sys/fs/cgroup/unified.
constexpr const char* kHybrid =
    "22 28 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw\n"
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime shared:10 - cgroup cgroup rw,cpu\n"
    "37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 master:2 - cgroup2 cgroup2 rw,nsdelegate\n"
    "50 22 0:40 / /proc/sys/fs/binfmt_misc rw,relatime - autofs systemd-1 rw\n";

// A unified host: cgroup2 at /sys/fs/cgroup, no optional fields.
constexpr const char* kUnified =
    "25 1 259:2 / / rw,relatime - ext4 /dev/nvme0n1p2 rw\n"
    "30 25 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";

TEST(CgroupParse, FindsTheUnifiedMountOnAHybridHost) {
  const auto m = find_cgroup2_mount(kHybrid);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->mount_point, "/sys/fs/cgroup/unified");
  EXPECT_EQ(m->root, "/");
}

TEST(CgroupParse, FindsTheMountOnAUnifiedHost) {
  const auto m = find_cgroup2_mount(kUnified);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->mount_point, "/sys/fs/cgroup");
}

TEST(CgroupParse, UnescapesPathsAndIgnoresFstypeLookalikes) {
  // A directory literally named "cgroup2" mounted as tmpfs must not match; the real one has a
  // space, a tab and a backslash in its path.
  const std::string text =
      "60 25 0:50 / /mnt/cgroup2 rw - tmpfs cgroup2 rw\n"
      "61 25 0:51 / /run/my\\040cg\\011roups\\134x rw shared:1 - cgroup2 none rw\n";
  const auto m = find_cgroup2_mount(text);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->mount_point, "/run/my cg\troups\\x");
  EXPECT_EQ(unescape_mountinfo("a\\012b"), "a\nb");
  EXPECT_EQ(unescape_mountinfo("trailing\\04"), "trailing\\04");  // incomplete escape kept
  EXPECT_EQ(unescape_mountinfo("\\999"), "\\999");                 // not octal: kept
}

TEST(CgroupParse, PrefersTheRootMountAndSkipsMalformedLines) {
  const std::string text =
      "garbage\n"
      "1 2 3\n"
      "70 25 0:60 /sub /mnt/sub rw - cgroup2 cgroup2 rw\n"
      "71 25 0:60 / /mnt/root rw - cgroup2 cgroup2 rw\n";
  const auto m = find_cgroup2_mount(text);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->mount_point, "/mnt/root");
  const auto only_sub = find_cgroup2_mount("70 25 0:60 /sub /mnt/sub rw - cgroup2 cgroup2 rw\n");
  ASSERT_TRUE(only_sub.has_value());
  EXPECT_EQ(only_sub->root, "/sub");
}

TEST(CgroupParse, NoCgroup2OnAV1OnlyHost) {
  EXPECT_FALSE(find_cgroup2_mount(
      "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n").has_value());
  EXPECT_FALSE(find_cgroup2_mount("").has_value());
}

TEST(CgroupParse, OwnCgroupFromProcSelfCgroup) {
  EXPECT_EQ(own_cgroup2_path("9:name=systemd:/\n4:memory:/x\n0::/\n").value_or("?"), "/");
  EXPECT_EQ(own_cgroup2_path("0::/system.slice/leasehold.service\n").value_or("?"),
            "/system.slice/leasehold.service");
  EXPECT_FALSE(own_cgroup2_path("4:memory:/x\n1:cpu:/\n").has_value());
}

TEST(CgroupParse, KeyedValues) {
  const std::string events = "populated 1\nfrozen 0\n";
  EXPECT_EQ(parse_cgroup_keyed(events, "populated"), 1);
  EXPECT_EQ(parse_cgroup_keyed(events, "frozen"), 0);
  EXPECT_EQ(parse_cgroup_keyed(events, "froze"), -ENOENT);
  EXPECT_EQ(parse_cgroup_keyed("populated x\n", "populated"), -EINVAL);
  EXPECT_EQ(parse_cgroup_keyed("", "populated"), -ENOENT);
}

std::string write_temp(const std::string& text) {
  char path[] = "/tmp/leasehold-cgroup-test-XXXXXX";
  const int fd = ::mkstemp(path);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  ::close(fd);
  return path;
}

TEST(CgroupDiscover, FallsBackWithAReasonWithoutCgroup2) {
  const std::string mi = write_temp("32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n");
  CgroupConfig c;
  c.mountinfo_path = mi;
  const auto t = CgroupTree::discover(c);
  ::unlink(mi.c_str());
  EXPECT_EQ(t.mode(), KillMode::process_group);
  EXPECT_NE(t.reason().find("no cgroup2 mount"), std::string::npos) << t.reason();
}

TEST(CgroupDiscover, FallsBackWhenDisabledOrUnreadable) {
  CgroupConfig off;
  off.use_cgroup = false;
  EXPECT_EQ(CgroupTree::discover(off).mode(), KillMode::process_group);
  EXPECT_NE(CgroupTree::discover(off).reason().find("disabled"), std::string::npos);
  CgroupConfig missing;
  missing.mountinfo_path = "/nonexistent/mountinfo";
  const auto t = CgroupTree::discover(missing);
  EXPECT_EQ(t.mode(), KillMode::process_group);
  EXPECT_NE(t.reason().find("/nonexistent/mountinfo"), std::string::npos) << t.reason();
}

TEST(CgroupDiscover, FallsBackWhenTheParentCannotBeCreated) {
  CgroupConfig c;
  c.parent_path = "/proc/leasehold-cannot-exist";
  const auto t = CgroupTree::discover(c);
  EXPECT_EQ(t.mode(), KillMode::process_group);
  EXPECT_NE(t.reason().find("/proc/leasehold-cannot-exist"), std::string::npos) << t.reason();
}

// ---- on this machine -------------------------------------------------------------------------

// A discovered tree under a parent private to this test process, removed afterwards.
class CgroupLive : public ::testing::Test {
 protected:
  void SetUp() override {
    const Result<std::string> text_read = read_small_file("/proc/self/mountinfo");
    ASSERT_TRUE(text_read.ok()) << text_read.message();
    const std::string& text = *text_read;
    const auto mount = find_cgroup2_mount(text);
    if (!mount) GTEST_SKIP() << "no cgroup2 mount on this host";
    CgroupConfig c;
    c.parent_path = mount->mount_point + "/leasehold-test-" + std::to_string(::getpid());
    parent_ = c.parent_path;
    tree_ = CgroupTree::discover(c);
    std::printf("cgroup mode on this host: %s\n", tree_.reason().c_str());
    if (tree_.mode() != KillMode::cgroup_v2_delegated) GTEST_SKIP() << tree_.reason();
  }
  void TearDown() override {
    if (!parent_.empty()) ::rmdir(parent_.c_str());
  }
  // A child that waits forever, moved into `leaf`.
  pid_t start_sleeper(const CgroupLeaf& leaf) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      for (;;) ::pause();
    }
    EXPECT_GT(pid, 0);
    const std::string procs = leaf.path() + "/cgroup.procs";
    const int fd = ::open(procs.c_str(), O_WRONLY | O_CLOEXEC);
    EXPECT_GE(fd, 0);
    const std::string s = std::to_string(pid);
    EXPECT_EQ(::write(fd, s.data(), s.size()), static_cast<ssize_t>(s.size())) << std::strerror(errno);
    ::close(fd);
    return pid;
  }
  // Waits (poll on cgroup.events, which signals POLLPRI on change) until `pred` holds.
  template <class Pred>
  bool await_events(const CgroupLeaf& leaf, Pred pred) {
    constexpr int kWaitsMax = 200;  // a guard against hanging, not a timing assertion
    for (int i = 0; i < kWaitsMax; ++i) {
      if (pred()) return true;
      pollfd p{leaf.events_fd(), POLLPRI, 0};
      ::poll(&p, 1, 50);
    }
    return pred();
  }
  std::string parent_;
  CgroupTree tree_;
};

TEST_F(CgroupLive, LeafLifecycleKillAndRemove) {
  auto leaf = tree_.create_leaf("sandbox-a");
  ASSERT_TRUE(leaf.ok()) << leaf.message();
  EXPECT_EQ(leaf->path(), parent_ + "/sandbox-a");
  EXPECT_GE(leaf->dir_fd(), 0);
  EXPECT_EQ(leaf->populated(), 0);

  const pid_t pid = start_sleeper(*leaf);
  EXPECT_EQ(leaf->populated(), 1);
  const Status busy = leaf->remove();
  EXPECT_EQ(busy.code(), Errc::busy) << busy.message();  // populated: stays, still usable
  EXPECT_NE(busy.message().find("cannot remove the cgroup leaf " + parent_ + "/sandbox-a"), std::string::npos)
      << busy.message();
  EXPECT_TRUE(leaf->valid());

  EXPECT_EQ(leaf->freeze(), 0);
  EXPECT_TRUE(await_events(*leaf, [&] { return leaf->frozen() == 1; }));
  EXPECT_EQ(leaf->thaw(), 0);
  EXPECT_TRUE(await_events(*leaf, [&] { return leaf->frozen() == 0; }));

  EXPECT_EQ(leaf->kill(), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  EXPECT_TRUE(await_events(*leaf, [&] { return leaf->populated() == 0; }));
  const Status removed = leaf->remove();
  EXPECT_TRUE(removed.ok()) << removed.message();
  EXPECT_FALSE(leaf->valid());
  struct stat st {};
  EXPECT_NE(::stat((parent_ + "/sandbox-a").c_str(), &st), 0);
}

TEST_F(CgroupLive, BadAndDuplicateLeafNamesAreClearErrors) {
  const auto escape = tree_.create_leaf("../escape");
  EXPECT_EQ(escape.code(), Errc::invalid_argument);
  EXPECT_NE(escape.message().find("bad cgroup leaf name"), std::string::npos) << escape.message();
  EXPECT_EQ(tree_.create_leaf("").code(), Errc::invalid_argument);
  EXPECT_EQ(tree_.create_leaf(std::string(kCgroupLeafNameBytesMax + 1, 'a')).code(), Errc::invalid_argument);
  auto a = tree_.create_leaf("dup");
  ASSERT_TRUE(a.ok()) << a.message();
  const auto dup = tree_.create_leaf("dup");
  EXPECT_EQ(dup.code(), Errc::exists);
  EXPECT_NE(dup.message().find("File exists"), std::string::npos) << dup.message();
}

TEST_F(CgroupLive, SweepKillsAndRemovesLeavesLeftBehind) {
  // As an earlier supervisor of the worker would leave them: one leaf with a process, one empty.
  ASSERT_EQ(::mkdir((parent_ + "/old").c_str(), 0755), 0) << std::strerror(errno);
  ASSERT_EQ(::mkdir((parent_ + "/empty").c_str(), 0755), 0) << std::strerror(errno);
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (;;) ::pause();
  }
  ASSERT_GT(pid, 0);
  {
    const int fd = ::open((parent_ + "/old/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    const std::string s = std::to_string(pid);
    ASSERT_EQ(::write(fd, s.data(), s.size()), static_cast<ssize_t>(s.size())) << std::strerror(errno);
    ::close(fd);
  }
  auto swept = tree_.sweep_leaves();
  std::sort(swept.begin(), swept.end(), [](const auto& a, const auto& b) { return a.path < b.path; });
  ASSERT_EQ(swept.size(), 2u);
  EXPECT_EQ(swept[0].path, parent_ + "/empty");
  EXPECT_FALSE(swept[0].had_processes);
  EXPECT_EQ(swept[0].error, 0);
  EXPECT_EQ(swept[1].path, parent_ + "/old");
  EXPECT_TRUE(swept[1].had_processes);
  EXPECT_EQ(swept[1].error, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  struct stat st {};
  EXPECT_NE(::stat((parent_ + "/old").c_str(), &st), 0);
  EXPECT_NE(::stat((parent_ + "/empty").c_str(), &st), 0);
  EXPECT_TRUE(tree_.sweep_leaves().empty()) << "nothing left to sweep";
}

TEST_F(CgroupLive, DestructorRemovesAnEmptyLeaf) {
  {
    auto leaf = tree_.create_leaf("scoped");
    ASSERT_TRUE(leaf.ok()) << leaf.message();
  }
  struct stat st {};
  EXPECT_NE(::stat((parent_ + "/scoped").c_str(), &st), 0);
}

}  // namespace
}  // namespace leasehold

namespace leasehold {
namespace {

TEST(CgroupDiscover, DefaultParentIsUnderOurOwnCgroup) {
  const Result<std::string> mountinfo_read = read_small_file("/proc/self/mountinfo");
  const Result<std::string> self_read = read_small_file("/proc/self/cgroup");
  ASSERT_TRUE(mountinfo_read.ok()) << mountinfo_read.message();
  ASSERT_TRUE(self_read.ok()) << self_read.message();
  const std::string& mountinfo = *mountinfo_read;
  const std::string& self = *self_read;
  const auto mount = find_cgroup2_mount(mountinfo);
  const auto own = own_cgroup2_path(self);
  if (!mount || !own) GTEST_SKIP() << "no cgroup2 mount or no 0:: line on this host";
  const auto t = CgroupTree::discover(CgroupConfig{});
  std::printf("default cgroup discovery: %s\n", t.reason().c_str());
  if (t.mode() != KillMode::cgroup_v2_delegated) GTEST_SKIP() << t.reason();
  EXPECT_EQ(t.mount_point(), mount->mount_point);
  EXPECT_EQ(t.parent_path(), mount->mount_point + (*own == "/" ? "" : *own) + "/leasehold");
  ::rmdir(t.parent_path().c_str());  // only succeeds when no supervisor uses it
}

}  // namespace
}  // namespace leasehold
