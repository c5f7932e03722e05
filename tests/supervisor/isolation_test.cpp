// Attacks of a hostile sandbox against the isolated spawn (supervisor/spawn.hpp "Isolation"),
// each run as a real process: it fails with isolation on, and — the ablation that shows the test
// can fail — succeeds with the layer that stops it switched off (the legacy unisolated spawn,
// no RLIMIT_NPROC, no seccomp filter, no hidden paths). Tests skip, naming the reason, where the
// kernel lacks what they need (user namespaces, a delegated cgroup v2, clone3).
#include "leasehold/supervisor/spawn.hpp"

#include "leasehold/shm/table.hpp"
#include "leasehold/supervisor/cgroup.hpp"
#include "leasehold/supervisor/kill_switch.hpp"

#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace leasehold {
namespace {

namespace fs = std::filesystem;

// The host uid an isolated test sandbox runs as: one of a subordinate range for root, our own
// uid otherwise (all a non-root process may map).
uid_t sandbox_uid() { return ::geteuid() == 0 ? 231072 : ::geteuid(); }
gid_t sandbox_gid() { return ::geteuid() == 0 ? 231072 : ::getegid(); }

const SeccompFilter& filter() {
  static const SeccompFilter f = [] {
    auto built = build_seccomp_filter();
    if (!built) throw std::runtime_error(built.message());
    return *built;
  }();
  return f;
}

Isolation isolation() {
  Isolation iso;
  iso.uid = sandbox_uid();
  iso.gid = sandbox_gid();
  iso.seccomp = &filter();
  iso.hide = {"/sys/fs/cgroup"};
  return iso;
}

class Isolated : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/leasehold-isolation-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ::chmod(dir_.c_str(), 0755);
    const Isolation iso = isolation();
    if (const Status why = probe_isolation(iso, "true"); !why.ok())
      GTEST_SKIP() << "isolated spawn unavailable here: " << why.message();
  }
  void TearDown() override {
    kill_marked();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  struct Run {
    int status = -1;  // exit status, or -signal
    std::string out;  // stdout + stderr
  };

  // Starts /bin/sh -c `script`; its stdout and stderr go to a file (a pipe would stay open as
  // long as a surviving descendant holds it).
  std::optional<SandboxProcess> start(const Isolation* iso, const std::string& script, int cgroup_fd = -1,
                                      int inherit_fd = -1) {
    out_path_ = dir_ + "/out-" + std::to_string(++runs_);
    out_fd_ = ::open(out_path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    EXPECT_GE(out_fd_, 0);
    SpawnRequest r;
    r.argv = {"/bin/sh", "-c", script};
    r.env = {std::string("PATH=") + kDefaultSearchPath, "MARK=" + marker()};
    r.isolation = iso;
    r.cgroup_dir_fd = cgroup_fd;
    r.stdout_fd = out_fd_;
    r.stderr_fd = out_fd_;
    r.inherit_fd = inherit_fd;
    SpawnError err;
    auto p = spawn_sandbox(r, err);
    EXPECT_TRUE(p.has_value()) << err.message;
    return p;
  }
  std::string output() const {
    std::ifstream in(out_path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  Run finish(SandboxProcess& p) {
    // Bounded: a kill that did not land fails the test instead of hanging it.
    pollfd pfd{p.pidfd(), POLLIN, 0};
    if (::poll(&pfd, 1, 30'000) != 1) {
      ADD_FAILURE() << "the sandbox is still running 30 s later";
      KillSwitch::pidfd_signal(p.pidfd(), SIGKILL);
    }
    siginfo_t info{};
    EXPECT_EQ(reap(p.pidfd(), info, true), 0);
    if (out_fd_ >= 0) ::close(out_fd_);
    out_fd_ = -1;
    return {info.si_code == CLD_EXITED ? info.si_status : -info.si_status, output()};
  }
  Run run(const Isolation* iso, const std::string& script, int inherit_fd = -1) {
    auto p = start(iso, script, -1, inherit_fd);
    if (!p) return {};
    return finish(*p);
  }
  // Waits (bounded by an event, not a fixed sleep) until the sandbox wrote `text`.
  bool await_output(const std::string& text) {
    for (int i = 0; i < 3000; ++i) {
      if (output().find(text) != std::string::npos) return true;
      ::usleep(10'000);
    }
    return false;
  }

  // A number no other test uses, in the command lines of the processes a test starts (as
  // `sleep <marker>`), so the host's /proc tells whether any of them still runs.
  std::string marker() const { return std::to_string(7'000'000 + (::getpid() % 1'000'000)); }
  std::vector<pid_t> marked() const {
    std::vector<pid_t> out;
    DIR* d = ::opendir("/proc");
    if (d == nullptr) return out;
    while (dirent* e = ::readdir(d)) {
      const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
      if (pid <= 0) continue;
      Result<std::string> read = read_small_file("/proc/" + std::string(e->d_name) + "/cmdline");
      if (!read) continue;  // a process that just exited reads as an error: skipped
      std::string& cmd = *read;
      for (auto& c : cmd)
        if (c == '\0') c = ' ';
      if (cmd.rfind("sleep " + marker(), 0) == 0) out.push_back(pid);
    }
    ::closedir(d);
    return out;
  }
  // Marked processes may take a moment to be torn down after a kill: wait for the event.
  bool marked_gone(int polls = 3000) const {
    for (int i = 0; i < polls; ++i) {
      if (marked().empty()) return true;
      ::usleep(10'000);
    }
    return false;
  }
  void kill_marked() const {
    for (pid_t pid : marked()) ::kill(pid, SIGKILL);
  }

  std::string dir_;
  std::string out_path_;
  int out_fd_ = -1;
  int runs_ = 0;
};

// This host's cgroup2 mount (nullopt: none).
std::optional<Cgroup2Mount> cgroup2_mount() {
  const Result<std::string> mountinfo = read_small_file("/proc/self/mountinfo");
  if (!mountinfo) return std::nullopt;
  return find_cgroup2_mount(*mountinfo);
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string status_line(const std::string& out, const std::string& key) {
  const auto at = out.find(key);
  if (at == std::string::npos) return {};
  const auto end = out.find('\n', at);
  return out.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

TEST_F(Isolated, RunsAsAnUnprivilegedUidWithoutCapabilitiesUnderSeccompAndNoNewPrivs) {
  const Isolation iso = isolation();
  const std::string script = "id -u; id -g; id -G; grep -E '^(CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status";
  const Run on = run(&iso, script);
  ASSERT_EQ(on.status, 0) << on.out;
  std::istringstream lines(on.out);
  std::string uid, gid, groups;
  std::getline(lines, uid);
  std::getline(lines, gid);
  std::getline(lines, groups);
  EXPECT_EQ(uid, std::to_string(sandbox_uid()));
  EXPECT_EQ(gid, std::to_string(sandbox_gid()));
  if (::geteuid() == 0) {
    EXPECT_EQ(groups, std::to_string(sandbox_gid())) << "no supplementary group is left";
  }
  EXPECT_EQ(status_line(on.out, "CapEff:"), "CapEff:\t0000000000000000");
  EXPECT_EQ(status_line(on.out, "CapPrm:"), "CapPrm:\t0000000000000000");
  EXPECT_EQ(status_line(on.out, "CapBnd:"), "CapBnd:\t0000000000000000");
  EXPECT_EQ(status_line(on.out, "CapAmb:"), "CapAmb:\t0000000000000000");
  EXPECT_EQ(status_line(on.out, "NoNewPrivs:"), "NoNewPrivs:\t1");
  EXPECT_EQ(status_line(on.out, "Seccomp:"), "Seccomp:\t2");

  // Ablation: the legacy spawn runs as the supervisor's uid with its capabilities.
  const Run off = run(nullptr, script);
  ASSERT_EQ(off.status, 0) << off.out;
  EXPECT_EQ(off.out.substr(0, off.out.find('\n')), std::to_string(::geteuid()));
  if (::geteuid() == 0) {
    EXPECT_NE(status_line(off.out, "CapEff:"), "CapEff:\t0000000000000000");
  }
}

TEST_F(Isolated, IsTheInitOfItsOwnPidNamespaceAndSeesNoProcessOutside) {
  const Isolation iso = isolation();
  const std::string me = std::to_string(::getpid());
  const std::string script = "echo pid=$$; ls /proc | grep -c '^[0-9]'; "
                             "if [ -e /proc/" + me + "/cmdline ]; then echo supervisor-visible; fi; "
                             "kill -0 " + me + " 2>/dev/null && echo supervisor-signalable; true";
  const Run on = run(&iso, script);
  ASSERT_EQ(on.status, 0) << on.out;
  EXPECT_TRUE(contains(on.out, "pid=1\n")) << on.out;
  EXPECT_FALSE(contains(on.out, "supervisor-visible")) << on.out;
  EXPECT_FALSE(contains(on.out, "supervisor-signalable")) << on.out;
  const Run off = run(nullptr, script);
  EXPECT_TRUE(contains(off.out, "supervisor-visible")) << off.out;
}

// Issue 14: "a grandchild that called setsid survived release and the kill-switch" (no
// delegated cgroup: the kill is pidfd + process group). Also a double fork that daemonizes.
TEST_F(Isolated, SetsidGrandchildAndDaemonDieWithTheSandbox) {
  const Isolation iso = isolation();
  const std::string script =
      "setsid sh -c 'exec sleep $MARK' </dev/null >/dev/null 2>&1 & "
      "( ( exec sleep $MARK ) </dev/null >/dev/null 2>&1 & ) ; "
      "echo started; exec sleep $MARK";
  for (const bool isolated : {true, false}) {
    SCOPED_TRACE(isolated ? "isolated" : "legacy spawn");
    auto p = start(isolated ? &iso : nullptr, script);
    ASSERT_TRUE(p.has_value());
    ASSERT_TRUE(await_output("started"));
    for (int i = 0; i < 3000 && marked().size() < 3; ++i) ::usleep(10'000);
    ASSERT_EQ(marked().size(), 3u) << "the sandbox and its two escapees run";
    // The kill-switch's fallback path: pidfd_send_signal + kill(-pgid).
    const KillRecord rec = KillSwitch::kill(KillTarget{-1, -1, p->pidfd(), p->pgid()}, KillSwitch::now_ns());
    EXPECT_EQ(rec.path, KillPath::signals);
    const Run r = finish(*p);
    EXPECT_EQ(r.status, -SIGKILL);
    if (isolated) {
      EXPECT_TRUE(marked().empty()) << "every descendant died before the init's exit was reported";
    } else {
      EXPECT_FALSE(marked_gone(100)) << "ablation: without a pid namespace the escapees survive the kill";
      kill_marked();
      ASSERT_TRUE(marked_gone());
    }
  }
}

// The supervisor dies (SIGKILL, OOM): its isolated sandbox must die with it, or lockd expires
// the lease while the sandbox still runs and grants the name to another worker. The kernel
// clears the parent-death signal on every credential change, so it must be set after the
// sandbox's setresuid, and nothing else kills the init of a pid namespace whose parent died.
TEST_F(Isolated, DiesWithItsSupervisorAfterDroppingPrivileges) {
  const Isolation iso = isolation();
  int pids[2];
  ASSERT_EQ(::pipe2(pids, O_CLOEXEC), 0);
  out_path_ = dir_ + "/out-supervisor";
  const std::string script = "echo started; exec sleep " + marker();
  const pid_t supervisor = ::fork();
  ASSERT_GE(supervisor, 0);
  if (supervisor == 0) {
    // The stand-in supervisor: starts the sandbox, says its pid, and waits to be killed.
    const int out = ::open(out_path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    SpawnRequest r;
    r.argv = {"/bin/sh", "-c", script};
    r.env = {std::string("PATH=") + kDefaultSearchPath};
    r.isolation = &iso;
    r.die_with_supervisor = true;
    r.stdout_fd = out;
    r.stderr_fd = out;
    SpawnError err;
    auto p = spawn_sandbox(r, err);
    const pid_t pid = p ? p->pid() : -1;
    (void)!::write(pids[1], &pid, sizeof pid);
    for (;;) ::pause();
  }
  ::close(pids[1]);
  // Whatever fails below, the stand-in supervisor (it pauses for ever, holding this test's
  // output) goes with the test.
  struct Reap {
    pid_t pid;
    ~Reap() {
      if (::kill(pid, SIGKILL) == 0) ::waitpid(pid, nullptr, 0);
    }
  } reap_on_failure{supervisor};
  pid_t sandbox = -1;
  ASSERT_EQ(::read(pids[0], &sandbox, sizeof sandbox), static_cast<ssize_t>(sizeof sandbox));
  ::close(pids[0]);
  ASSERT_GT(sandbox, 0) << "the stand-in supervisor could not start the sandbox";
  ASSERT_TRUE(await_output("started"));
  // "started" is echoed before the shell execs `sleep MARK`: wait for the exec.
  for (int i = 0; i < 3000 && marked().empty(); ++i) ::usleep(10'000);
  ASSERT_EQ(marked().size(), 1u) << "the sandbox runs";
  ASSERT_EQ(::kill(supervisor, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(supervisor, &status, 0), supervisor);
  EXPECT_TRUE(marked_gone()) << "the sandbox outlived its supervisor";
  kill_marked();
}

TEST_F(Isolated, ASandboxThatIgnoresSigtermStillDies) {
  const Isolation iso = isolation();
  auto p = start(&iso, "trap '' TERM; sh -c \"trap '' TERM; exec sleep $MARK\" & echo started; wait");
  ASSERT_TRUE(p.has_value());
  ASSERT_TRUE(await_output("started"));
  EXPECT_EQ(KillSwitch::pidfd_signal(p->pidfd(), SIGTERM), 0);
  EXPECT_EQ(KillSwitch::pidfd_exited(p->pidfd()), 0) << "SIGTERM is ignored";
  const KillRecord rec = KillSwitch::kill(KillTarget{-1, -1, p->pidfd(), p->pgid()}, KillSwitch::now_ns());
  EXPECT_EQ(rec.error, 0);
  EXPECT_EQ(finish(*p).status, -SIGKILL);
  EXPECT_TRUE(marked().empty());
}

// A sandbox cannot take a real-time scheduling class (SCHED_FIFO above the rt thread's priority
// on every core would keep the kill-switch from running), even where the supervisor runs with a
// high RLIMIT_RTPRIO (a unit's LimitRTPRIO=, limits.conf): its limits are zeroed at spawn. The
// ablation keeps the inherited limit, and the sandbox gets SCHED_FIFO.
TEST_F(Isolated, ASandboxCannotTakeARealTimePriority) {
  if (::access("/usr/bin/chrt", X_OK) != 0) GTEST_SKIP() << "chrt (util-linux) is not installed";
  rlimit before{};
  ASSERT_EQ(::getrlimit(RLIMIT_RTPRIO, &before), 0);
  const rlimit high{99, 99};
  if (::setrlimit(RLIMIT_RTPRIO, &high) != 0) GTEST_SKIP() << "cannot raise RLIMIT_RTPRIO here: " << std::strerror(errno);
  const std::string script = "if /usr/bin/chrt -f 10 /bin/true 2>/dev/null; then echo rt-granted; else echo rt-refused; fi";
  for (const bool defended : {true, false}) {
    SCOPED_TRACE(defended ? "limits zeroed" : "ablation: the supervisor's limit inherited");
    Isolation iso = isolation();
    iso.zero_rt_limits = defended;
    auto p = start(&iso, script);
    ASSERT_TRUE(p.has_value());
    ASSERT_TRUE(await_output(defended ? "rt-refused" : "rt-granted")) << output();
    EXPECT_EQ(finish(*p).status, 0);
  }
  ::setrlimit(RLIMIT_RTPRIO, &before);
}

// A fork bomb stops at RLIMIT_NPROC of the sandbox's own user namespace (per sandbox, also where
// the leaf has no pids controller). The bomb runs in a child shell, which dies at its first
// failed fork; its sleeps stay, and the host counts them.
TEST_F(Isolated, AForkBombStopsAtTheProcessLimit) {
  Isolation iso = isolation();
  iso.nproc_max = 16;
  const std::string script =
      "sh -c 'i=0; while [ $i -lt 64 ]; do i=$((i+1)); sleep $MARK & done' 2>/dev/null; "
      "echo bomb-stopped; exec sleep $MARK";
  auto p = start(&iso, script);
  ASSERT_TRUE(p.has_value());
  ASSERT_TRUE(await_output("bomb-stopped")) << output();
  const std::size_t bounded = marked().size();
  EXPECT_GT(bounded, 1u);
  EXPECT_LE(bounded, 16u) << "processes of the sandbox, its init included";
  KillSwitch::kill(KillTarget{-1, -1, p->pidfd(), p->pgid()}, KillSwitch::now_ns());
  EXPECT_EQ(finish(*p).status, -SIGKILL);
  EXPECT_TRUE(marked().empty());

  iso.nproc_max = 0;  // ablation: no limit
  p = start(&iso, script);
  ASSERT_TRUE(p.has_value());
  ASSERT_TRUE(await_output("bomb-stopped")) << output();
  for (int i = 0; i < 3000 && marked().size() < 65; ++i) ::usleep(10'000);
  EXPECT_EQ(marked().size(), 65u);
  KillSwitch::kill(KillTarget{-1, -1, p->pidfd(), p->pgid()}, KillSwitch::now_ns());
  EXPECT_EQ(finish(*p).status, -SIGKILL);
  EXPECT_TRUE(marked().empty());
}

// The same fork bomb in a cgroup leaf with pids.max (--pids-max), without RLIMIT_NPROC: the
// leaf's pids controller bounds it. Skips where the pids controller is not delegated to the
// leaves' parent (e.g. a hybrid host whose cgroup2 mount has no pids controller): the daemon then
// relies on RLIMIT_NPROC (the test above) and its start-up summary says so.
TEST_F(Isolated, AForkBombStopsAtThePidsMaxOfItsLeaf) {
  const auto mount = cgroup2_mount();
  if (!mount) GTEST_SKIP() << "no cgroup2 mount on this host";
  CgroupConfig c;
  c.parent_path = mount->mount_point + "/leasehold-pids-test-" + std::to_string(::getpid());
  c.pids_max = 16;
  const auto tree = CgroupTree::discover(c);
  if (tree.mode() != KillMode::cgroup_v2_delegated) GTEST_SKIP() << tree.reason();
  if (tree.pids_max() == 0) {
    ::rmdir(c.parent_path.c_str());
    GTEST_SKIP() << "no pids.max for the leaves here: " << tree.pids_reason();
  }
  c.pids_max = 0;  // the ablation: the same parent, leaves without pids.max
  const auto unbounded_tree = CgroupTree::discover(c);
  const std::string script =
      "sh -c 'i=0; while [ $i -lt 64 ]; do i=$((i+1)); sleep $MARK & done' 2>/dev/null; "
      "echo bomb-stopped; exec sleep $MARK";
  Isolation iso = isolation();
  iso.nproc_max = 0;  // no RLIMIT_NPROC: only the leaf bounds it
  for (const bool bounded : {true, false}) {
    SCOPED_TRACE(bounded ? "pids.max 16" : "ablation: no pids.max");
    auto leaf = (bounded ? tree : unbounded_tree).create_leaf(bounded ? "bounded" : "unbounded");
    ASSERT_TRUE(leaf.ok()) << leaf.message();
    const Result<std::string> limit_read = read_small_file(leaf->path() + "/pids.max");
    ASSERT_TRUE(limit_read.ok()) << limit_read.message();
    const std::string& limit = *limit_read;
    EXPECT_EQ(limit, bounded ? "16\n" : "max\n");
    auto p = start(&iso, script, leaf->dir_fd());
    ASSERT_TRUE(p.has_value());
    ASSERT_TRUE(await_output("bomb-stopped")) << output();
    if (bounded) {
      EXPECT_GT(marked().size(), 1u);
      EXPECT_LE(marked().size(), 16u) << "processes of the leaf, the sandbox's init and shells included";
    } else {
      for (int i = 0; i < 3000 && marked().size() < 65; ++i) ::usleep(10'000);
      EXPECT_EQ(marked().size(), 65u);
    }
    const KillTarget target{leaf->kill_fd(), leaf->events_fd(), p->pidfd(), p->pgid()};
    KillSwitch::kill(target, KillSwitch::now_ns());
    EXPECT_EQ(finish(*p).status, -SIGKILL);
    EXPECT_TRUE(marked_gone());
    for (int i = 0; i < 100 && leaf->remove().code() == Errc::busy; ++i) ::usleep(10'000);
  }
  EXPECT_EQ(::rmdir(c.parent_path.c_str()), 0);
}

// Issue 14: "it read the HMAC key file (directly, or through /proc/<supervisor>/cmdline and
// /root)". The key is root's 0600 file (the uid cannot read it), and a hidden path is covered
// even where the mode would let it through (a non-root supervisor's sandbox shares its uid).
TEST_F(Isolated, CannotReadTheKeyFileDirectlyOrThroughTheSupervisorsProc) {
  const std::string key = dir_ + "/lh.key";
  { std::ofstream(key) << "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n"; }
  ASSERT_EQ(::chmod(key.c_str(), 0644), 0);  // readable by anyone: only hiding keeps it out
  const std::string me = std::to_string(::getpid());
  const std::string script = "cat " + key + " 2>&1; cat /proc/" + me + "/cmdline 2>&1; cat /proc/" + me +
                             "/root" + key + " 2>&1; true";
  Isolation iso = isolation();
  iso.hide.push_back(key);
  const Run on = run(&iso, script);
  EXPECT_FALSE(contains(on.out, "00112233")) << on.out;
  EXPECT_FALSE(contains(on.out, "isolation_test")) << "the supervisor's cmdline: " << on.out;

  iso.hide.pop_back();  // ablation: the key path not hidden
  const Run unhidden = run(&iso, script);
  EXPECT_TRUE(contains(unhidden.out, "00112233")) << unhidden.out;
  const Run legacy = run(nullptr, script);
  EXPECT_TRUE(contains(legacy.out, "00112233")) << legacy.out;

  if (::geteuid() == 0) {  // the supervisor's own key mode: 0600 root, unreadable by the uid
    ASSERT_EQ(::chmod(key.c_str(), 0600), 0);
    const Run mode = run(&iso, "cat " + key + " 2>&1; true");
    EXPECT_FALSE(contains(mode.out, "00112233")) << mode.out;
    EXPECT_TRUE(contains(mode.out, "Permission denied")) << mode.out;
  }
}

TEST_F(Isolated, NamespaceAndMountEscapesAreRefusedBySeccomp) {
  Isolation iso = isolation();
  const std::string script = "unshare -U true 2>/dev/null && echo unshared; "
                             "unshare -Ur sh -c 'mount -t tmpfs none /tmp' 2>/dev/null && echo mounted; true";
  const Run on = run(&iso, script);
  EXPECT_FALSE(contains(on.out, "unshared")) << on.out;
  EXPECT_FALSE(contains(on.out, "mounted")) << on.out;
  iso.seccomp = nullptr;  // ablation: capabilities dropped, no filter: a new user namespace is open
  const Run off = run(&iso, script);
  EXPECT_TRUE(contains(off.out, "unshared")) << off.out;
}

// Issue 14: "the sandbox moved its own process out of its cgroup leaf; cgroup.kill then emptied
// an empty leaf" (also "by writing through /proc/<supervisor>/root").
TEST_F(Isolated, CannotLeaveItsCgroupLeaf) {
  const auto mount = cgroup2_mount();
  if (!mount) GTEST_SKIP() << "no cgroup2 mount on this host";
  CgroupConfig c;
  c.parent_path = mount->mount_point + "/leasehold-isolation-test-" + std::to_string(::getpid());
  const auto tree = CgroupTree::discover(c);
  if (tree.mode() != KillMode::cgroup_v2_delegated) GTEST_SKIP() << tree.reason();
  const std::string me = std::to_string(::getpid());
  const std::string root_procs = mount->mount_point + "/cgroup.procs";
  const std::string script = "echo $$ > " + root_procs + " 2>/dev/null; echo $$ > /proc/" + me + "/root" +
                             root_procs + " 2>/dev/null; echo $$ > /sys/fs/cgroup/cgroup.procs 2>/dev/null; "
                             "cat /proc/self/cgroup; echo tried; exec sleep $MARK";
  Isolation iso = isolation();
  iso.hide = {"/sys/fs/cgroup", mount->mount_point};
  {
    for (const bool isolated : {true, false}) {
      SCOPED_TRACE(isolated ? "isolated" : "legacy spawn");
      auto leaf = tree.create_leaf(isolated ? "on" : "off");
      ASSERT_TRUE(leaf.ok()) << leaf.message();
      auto p = start(isolated ? &iso : nullptr, script, leaf->dir_fd());
      ASSERT_TRUE(p.has_value());
      ASSERT_TRUE(await_output("tried"));
      if (isolated) {
        EXPECT_EQ(leaf->populated(), 1) << "the sandbox is still in its leaf";
        EXPECT_TRUE(contains(output(), "0::/\n")) << "its cgroup namespace is rooted at the leaf: " << output();
      } else {
        EXPECT_EQ(leaf->populated(), 0) << "ablation: the legacy sandbox left its leaf";
      }
      const KillTarget target{leaf->kill_fd(), leaf->events_fd(), p->pidfd(), p->pgid()};
      EXPECT_EQ(KillSwitch::confirm_dead(target), 0) << "an empty leaf alone never counts as dead";
      // The kill-switch kills through both: cgroup.kill and the pidfd.
      KillSwitch::kill(target, KillSwitch::now_ns());
      EXPECT_EQ(finish(*p).status, -SIGKILL);
      EXPECT_TRUE(marked_gone());
      for (int i = 0; i < 100 && leaf->remove().code() == Errc::busy; ++i) ::usleep(10'000);
    }
  }
  EXPECT_EQ(::rmdir(c.parent_path.c_str()), 0);
}

// Issue 14: "truncating the table killed the supervisor with SIGBUS (every sandbox on the worker
// died)". The sandbox gets the table as LEASEHOLD_SHM=3, a read-only descriptor of a sealed memfd,
// and is made its owner (as a non-root supervisor's sandbox is: it shares the uid). From inside
// it tries every way to write: ftruncate, write(2), a writable mapping and mprotect on fd 3,
// reopening /proc/self/fd/3 for writing, and — after chmod, which the owner may do — writing,
// mapping and truncating through the reopened descriptor. Every write fails, and the writer then
// stores into its mapping and lives (its neighbour's lease stays valid). The ablation (the seals
// off) shows the test can fail: the truncation succeeds and the writer's next store is SIGBUS.
TEST_F(Isolated, CannotWriteGrowOrShrinkTheSealedShmTable) {
  const std::string attack = dir_ + "/attack.py";
  {
    std::ofstream(attack) << R"PY(
import ctypes, errno, mmap, os
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
def attempt(name, f):
    try:
        f()
        print(name + ": succeeded", flush=True)
    except OSError as e:
        print(name + ": " + errno.errorcode.get(e.errno, str(e.errno)), flush=True)
def mprotect(fd):
    a = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if a in (None, ctypes.c_void_p(-1).value): raise OSError(ctypes.get_errno(), "mmap")
    if libc.mprotect(a, 4096, mmap.PROT_READ | mmap.PROT_WRITE) != 0: raise OSError(ctypes.get_errno(), "mprotect")
size = os.fstat(3).st_size
print("size", size, flush=True)
attempt("ftruncate-fd3", lambda: os.ftruncate(3, 0))
attempt("grow-fd3", lambda: os.ftruncate(3, size * 2))
attempt("write-fd3", lambda: os.pwrite(3, b"\xff" * 8, 0))
attempt("mmap-write-fd3", lambda: mmap.mmap(3, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE))
attempt("mprotect-fd3", lambda: mprotect(3))
attempt("reopen-rw", lambda: os.close(os.open("/proc/self/fd/3", os.O_RDWR)))
attempt("chmod", lambda: os.fchmod(3, 0o600))
fd = os.open("/proc/self/fd/3", os.O_RDWR)
attempt("write-rw", lambda: os.pwrite(fd, b"\xff" * 8, size - 8))
attempt("mmap-write-rw", lambda: mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE))
attempt("mprotect-rw", lambda: mprotect(fd))
attempt("grow-rw", lambda: os.ftruncate(fd, size * 2))
attempt("ftruncate-rw", lambda: os.ftruncate(fd, 0))
print("done", flush=True)
)PY";
  }
  ASSERT_EQ(::chmod(attack.c_str(), 0644), 0);
  for (const bool sealed : {true, false}) {
    SCOPED_TRACE(sealed ? "sealed" : "ablation: unsealed");
    shm::TableOptions o;
    o.location = "memfd:isolation-test";
    o.slot_count = 4;
    o.seal = sealed;
    auto w = shm::TableWriter::create(o);
    const auto now = boottime_ns();
    const Result<shm::ClaimedSlot> claimed = w.claim(SandboxId{1, 2}, now);
    ASSERT_TRUE(claimed.ok()) << claimed.message();
    const shm::ClaimedSlot claim = *claimed;
    ASSERT_EQ(w.publish(claim.slot, NameId{3, 4}, "neighbour", 7, now + 3'600'000'000'000ull), shm::TableErrc::ok);
    if (sealed) {
      EXPECT_EQ(w.seals().value(), F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL);
    } else {
      EXPECT_EQ(w.seals().value(), 0);
    }
    const Result<int> reopened = w.reopen_read_only();
    ASSERT_TRUE(reopened.ok()) << reopened.message();
    const int ro = *reopened;
    struct stat st{};
    ASSERT_EQ(::fstat(ro, &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0440u) << "a memfd table keeps its read bits only";
    if (::geteuid() == 0) {  // the sandbox owns it
      ASSERT_EQ(::fchown(ro, sandbox_uid(), static_cast<gid_t>(-1)), 0);
    }
    const Isolation iso = isolation();
    const Run r = run(&iso, "python3 " + attack, ro);
    ::close(ro);
    ASSERT_TRUE(contains(r.out, "done")) << r.out;
    const std::string size = "size " + std::to_string(shm::table_bytes(4));
    EXPECT_TRUE(contains(r.out, size)) << r.out;
    EXPECT_TRUE(contains(r.out, "chmod: succeeded")) << "the sandbox owns the memfd: " << r.out;
    for (const char* a : {"ftruncate-fd3", "grow-fd3", "write-fd3", "mmap-write-fd3", "mprotect-fd3", "reopen-rw"})
      EXPECT_FALSE(contains(r.out, std::string(a) + ": succeeded")) << a << ":\n" << r.out;
    for (const char* a : {"write-rw", "mmap-write-rw", "mprotect-rw", "grow-rw", "ftruncate-rw"})
      EXPECT_EQ(contains(r.out, std::string(a) + ": succeeded"), !sealed) << a << ":\n" << r.out;
    if (sealed) {
      EXPECT_TRUE(contains(r.out, "ftruncate-rw: EPERM")) << r.out;
      EXPECT_TRUE(contains(r.out, "mmap-write-rw: EPERM")) << r.out;
    }
    // The writer stores into its mapping (heartbeat, extend) in a child of this process, which
    // shares the mapping: it lives with the seals, and dies of SIGBUS once the table was truncated.
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      struct sigaction dfl{};
      dfl.sa_handler = SIG_DFL;
      ::sigaction(SIGBUS, &dfl, nullptr);  // not the sanitizer's report: the plain kernel verdict
      w.heartbeat(boottime_ns());
      w.extend(claim.slot, boottime_ns() + 3'600'000'000'000ull);
      ::_exit(w.header().magic == shm::kMagic ? 0 : 3);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    if (sealed) {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
      const Result<int> again = w.reopen_read_only();
      ASSERT_TRUE(again.ok()) << again.message();
      auto reader = shm::TableReader::open(std::to_string(*again));
      ::close(*again);
      EXPECT_TRUE(reader.check(claim.slot, 7)) << "the neighbour's lease stays valid";
    } else {
      EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS) << "status " << status;
    }
  }
}

TEST(IsolationArguments, RefusesUidZeroAndBubblewrapTogether) {
  Isolation iso;
  iso.uid = 0;
  iso.gid = 0;
  SpawnRequest r;
  r.argv = {"true"};
  r.isolation = &iso;
  SpawnError err;
  EXPECT_FALSE(spawn_sandbox(r, err).has_value());
  EXPECT_EQ(err.errno_value, EINVAL);
  EXPECT_TRUE(contains(err.message, "never runs as uid or gid 0")) << err.message;
  iso.uid = iso.gid = 231072;
  BwrapConfig b;
  r.bwrap = &b;
  EXPECT_FALSE(spawn_sandbox(r, err).has_value());
  EXPECT_TRUE(contains(err.message, "exclusive")) << err.message;
}

TEST(IsolationArguments, TheFilterDeniesTheListedCalls) {
  const auto f = build_seccomp_filter();
  ASSERT_TRUE(f.ok()) << f.message();
  EXPECT_GT(f->words.size(), 20u);
  for (const char* name : {"mount", "umount2", "unshare", "setns", "ptrace", "bpf", "keyctl", "perf_event_open",
                           "kexec_load", "init_module", "finit_module", "clone3", "clone(CLONE_NEW*)"})
    EXPECT_NE(std::find(f->denied.begin(), f->denied.end(), name), f->denied.end()) << name;
}

}  // namespace
}  // namespace leasehold
