// Tests of spawn: clone3 + pidfd, new session, environment, exec failures reported through the
// pipe (and nothing leaked), CLONE_INTO_CGROUP into a leaf, bubblewrap, parent-death SIGKILL with
// the supervisor as child subreaper, and the two-step start (prepare_sandbox: stopped before its
// exec until release_sandbox).
#include "leasehold/supervisor/spawn.hpp"

#include "leasehold/supervisor/cgroup.hpp"
#include "leasehold/supervisor/kill_switch.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/syscall.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

namespace leasehold {
namespace {

std::string path_env() {
  const char* p = std::getenv("PATH");
  return std::string("PATH=") + (p != nullptr ? p : kDefaultSearchPath);
}

SpawnRequest request(std::vector<std::string> argv) {
  SpawnRequest r;
  r.argv = std::move(argv);
  r.env = {path_env(), "LEASEHOLD_SHM=/dev/shm/leasehold-test", "LEASEHOLD_SLOT=7", "LEASEHOLD_EPOCH=42"};
  return r;
}

// Spawns or skips the test when the kernel lacks clone3.
#define SPAWN_OR_SKIP(var, req)                                                  \
  SpawnError var##_error;                                                        \
  auto var = spawn_sandbox(req, var##_error);                                    \
  if (!var && var##_error.errno_value == ENOSYS) GTEST_SKIP() << var##_error.message; \
  ASSERT_TRUE(var.has_value()) << var##_error.message

siginfo_t wait_exit(const SandboxProcess& p) {
  siginfo_t info{};
  EXPECT_EQ(reap(p.pidfd(), info, true), 0);
  return info;
}

bool no_children_left() {
  return ::waitpid(-1, nullptr, WNOHANG) == -1 && errno == ECHILD;
}

// A file with the executable bit that is no valid binary and has no #!: execve fails with
// ENOEXEC in the child (resolve_command in the parent accepts it). The caller unlinks it.
std::string junk_executable() {
  char path[] = "/tmp/leasehold-spawn-badexec-XXXXXX";
  const int fd = ::mkstemp(path);
  EXPECT_GE(fd, 0);
  const char junk[] = "\x01\x02\x03\x04not an executable";
  EXPECT_EQ(::write(fd, junk, sizeof junk), static_cast<ssize_t>(sizeof junk));
  ::close(fd);
  ::chmod(path, 0755);
  return path;
}

TEST(Spawn, RunsACommandWithAPidfdInANewSession) {
  SPAWN_OR_SKIP(p, request({"sleep", "100"}));
  EXPECT_GT(p->pid(), 0);
  EXPECT_GE(p->pidfd(), 0);
  EXPECT_EQ(::getpgid(p->pid()), p->pid());
  EXPECT_EQ(::getsid(p->pid()), p->pid());
  EXPECT_EQ(p->pgid(), p->pid());
  siginfo_t info{};
  EXPECT_EQ(reap(p->pidfd(), info, false), 0);
  EXPECT_EQ(info.si_pid, 0) << "still running: nothing to reap yet";
  ASSERT_EQ(::syscall(SYS_pidfd_send_signal, p->pidfd(), SIGKILL, nullptr, 0), 0);
  info = wait_exit(*p);
  EXPECT_EQ(info.si_pid, p->pid());
  EXPECT_EQ(info.si_code, CLD_KILLED);
  EXPECT_EQ(info.si_status, SIGKILL);
  EXPECT_EQ(reap(p->pidfd(), info, false), -ECHILD);
}

TEST(Spawn, PassesTheEnvironmentExactly) {
  SPAWN_OR_SKIP(ok, request({"sh", "-c",
                             "test \"$LEASEHOLD_SLOT\" = 7 && test \"$LEASEHOLD_EPOCH\" = 42 && "
                             "test \"$LEASEHOLD_SHM\" = /dev/shm/leasehold-test && test -z \"$HOME\""}));
  siginfo_t info = wait_exit(*ok);
  EXPECT_EQ(info.si_code, CLD_EXITED);
  EXPECT_EQ(info.si_status, 0);
  SPAWN_OR_SKIP(bad, request({"sh", "-c", "test \"$LEASEHOLD_SLOT\" = 8"}));
  info = wait_exit(*bad);
  EXPECT_EQ(info.si_status, 1);
}

TEST(Spawn, ChangesToTheWorkingDirectoryBeforeExec) {
  char dir_template[] = "/tmp/leasehold-spawn-cwd-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  SpawnRequest req = request({"sh", "-c", "test \"$(pwd -P)\" = \"$1\"", "sh", dir});
  req.working_directory = dir;
  SPAWN_OR_SKIP(p, req);
  siginfo_t info = wait_exit(*p);
  EXPECT_EQ(info.si_code, CLD_EXITED);
  EXPECT_EQ(info.si_status, 0) << "the sandbox did not start in " << dir;

  // A relative command path is found below the working directory.
  const std::string script = dir + "/run.sh";
  {
    FILE* f = std::fopen(script.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("#!/bin/sh\nexit 3\n", f);
    std::fclose(f);
    ASSERT_EQ(::chmod(script.c_str(), 0755), 0);
  }
  SpawnRequest rel = request({"./run.sh"});
  rel.working_directory = dir;
  SPAWN_OR_SKIP(q, rel);
  info = wait_exit(*q);
  EXPECT_EQ(info.si_status, 3);
  ::unlink(script.c_str());
  ::rmdir(dir.c_str());
}

TEST(Spawn, MissingWorkingDirectoryIsAClearErrorAndLeavesNothing) {
  SpawnRequest req = request({"true"});
  req.working_directory = "/nonexistent/leasehold-dir";
  SpawnError err;
  auto p = spawn_sandbox(req, err);
  if (!p && err.errno_value == ENOSYS) GTEST_SKIP() << err.message;
  ASSERT_FALSE(p.has_value());
  EXPECT_EQ(err.errno_value, ENOENT);
  EXPECT_EQ(err.message, "cannot change directory to /nonexistent/leasehold-dir: No such file or directory");
  EXPECT_TRUE(no_children_left());
  // The same from a two-step start, at its release (the child's own set-up step); the child is
  // left for its owner to reap.
  auto q = prepare_sandbox(req, err);
  ASSERT_TRUE(q.has_value()) << err.message;
  EXPECT_FALSE(release_sandbox(*q, err));
  EXPECT_EQ(err.errno_value, ENOENT);
  EXPECT_EQ(err.message, "cannot change directory to /nonexistent/leasehold-dir: No such file or directory");
  EXPECT_EQ(wait_exit(q->process()).si_status, 127);
  EXPECT_TRUE(no_children_left());
}

TEST(Spawn, CommandNotFoundIsAClearErrorAndLeavesNothing) {
  SpawnError err;
  auto p = spawn_sandbox(request({"leasehold-no-such-command"}), err);
  EXPECT_FALSE(p.has_value());
  EXPECT_EQ(err.errno_value, ENOENT);
  EXPECT_EQ(err.message, "command not found: leasehold-no-such-command");
  p = spawn_sandbox(request({"/nonexistent/bin/x"}), err);
  EXPECT_EQ(err.message, "command not found: /nonexistent/bin/x");
  EXPECT_TRUE(no_children_left());
}

TEST(Spawn, PermissionDeniedIsAClearError) {
  char path[] = "/tmp/leasehold-spawn-noexec-XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  ::chmod(path, 0644);
  SpawnError err;
  EXPECT_FALSE(spawn_sandbox(request({path}), err).has_value());
  EXPECT_EQ(err.errno_value, EACCES);
  EXPECT_EQ(err.message, std::string("permission denied: ") + path);
  ::unlink(path);
}

TEST(Spawn, ExecFailureInTheChildComesBackThroughThePipe) {
  const std::string path = junk_executable();
  SpawnError err;
  auto p = spawn_sandbox(request({path}), err);
  ::unlink(path.c_str());
  if (!p && err.errno_value == ENOSYS) GTEST_SKIP() << err.message;
  EXPECT_FALSE(p.has_value());
  EXPECT_EQ(err.errno_value, ENOEXEC);
  EXPECT_EQ(err.message, std::string("cannot execute ") + path + ": " + std::strerror(ENOEXEC));
  EXPECT_TRUE(no_children_left()) << "the failed child must have been reaped";
}

TEST(Spawn, RejectsEmptyAndOversizedRequests) {
  SpawnError err;
  EXPECT_FALSE(spawn_sandbox(SpawnRequest{}, err).has_value());
  EXPECT_EQ(err.message, "empty argv: no command to run");
  auto big = request({"true"});
  big.env.assign(kSpawnStringsMax + 1, "X=1");
  EXPECT_FALSE(spawn_sandbox(big, err).has_value());
  EXPECT_EQ(err.errno_value, E2BIG);
  EXPECT_NE(err.message.find("argv + env too large"), std::string::npos) << err.message;
}

TEST(Spawn, ResolvesLikeExecvp) {
  const Result<std::string> found = resolve_command("sh", "/nonexistent:/bin:/usr/bin");
  ASSERT_TRUE(found.ok()) << found.message();
  EXPECT_EQ(*found, "/bin/sh");
  const Result<std::string> missing = resolve_command("sh", "/nonexistent");
  EXPECT_EQ(missing.code(), Errc::not_found);
  EXPECT_EQ(missing.message(), "command not found: sh");
  const Result<std::string> empty = resolve_command("", "/bin");
  EXPECT_EQ(empty.code(), Errc::invalid_argument);
  EXPECT_EQ(empty.message(), "empty command");
}

TEST(Spawn, IntoALeafCgroup) {
  const Result<std::string> mountinfo_read = read_small_file("/proc/self/mountinfo");
  ASSERT_TRUE(mountinfo_read.ok()) << mountinfo_read.message();
  const std::string& mountinfo = *mountinfo_read;
  const auto mount = find_cgroup2_mount(mountinfo);
  if (!mount) GTEST_SKIP() << "no cgroup2 mount on this host";
  CgroupConfig c;
  c.parent_path = mount->mount_point + "/leasehold-spawn-test-" + std::to_string(::getpid());
  const auto tree = CgroupTree::discover(c);
  if (tree.mode() != KillMode::cgroup_v2_delegated) GTEST_SKIP() << tree.reason();
  {
    auto leaf = tree.create_leaf("sandbox");
    ASSERT_TRUE(leaf.ok()) << leaf.message();
    auto req = request({"sleep", "100"});
    req.cgroup_dir_fd = leaf->dir_fd();
    SPAWN_OR_SKIP(p, req);
    const Result<std::string> own_read = read_small_file("/proc/" + std::to_string(p->pid()) + "/cgroup");
    ASSERT_TRUE(own_read.ok()) << own_read.message();
    const std::string& own = *own_read;
    const auto path = own_cgroup2_path(own);
    ASSERT_TRUE(path.has_value());
    EXPECT_EQ(mount->mount_point + *path, leaf->path());
    EXPECT_EQ(leaf->populated(), 1);
    EXPECT_EQ(leaf->kill(), 0);
    const siginfo_t info = wait_exit(*p);
    EXPECT_EQ(info.si_status, SIGKILL);
  }
  EXPECT_EQ(::rmdir(c.parent_path.c_str()), 0) << "the leaf must have been removed";
}

TEST(Spawn, BadCgroupFdIsAClearError) {
  auto req = request({"true"});
  const int not_a_cgroup = ::open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(not_a_cgroup, 0);
  req.cgroup_dir_fd = not_a_cgroup;
  SpawnError err;
  EXPECT_FALSE(spawn_sandbox(req, err).has_value());
  ::close(not_a_cgroup);
  if (err.errno_value == ENOSYS) GTEST_SKIP() << err.message;
  EXPECT_NE(err.message.find("clone3 into the sandbox cgroup failed"), std::string::npos) << err.message;
  EXPECT_TRUE(no_children_left());
}

TEST(Spawn, UnderBubblewrap) {
  BwrapConfig bwrap;
  bwrap.args = default_bwrap_args();
  const Status why = probe_bwrap(bwrap);
  if (!why.ok()) GTEST_SKIP() << "bubblewrap unusable here: " << why.message();
  auto req = request({"sh", "-c", "test -d /proc/self && exit 3"});
  req.bwrap = &bwrap;
  SPAWN_OR_SKIP(p, req);
  const siginfo_t info = wait_exit(*p);
  EXPECT_EQ(info.si_code, CLD_EXITED);
  EXPECT_EQ(info.si_status, 3);
  BwrapConfig missing{"leasehold-no-such-bwrap", {}};
  req.bwrap = &missing;
  SpawnError err;
  EXPECT_FALSE(spawn_sandbox(req, err).has_value());
  EXPECT_EQ(err.message, "bubblewrap requested but unusable: command not found: leasehold-no-such-bwrap");
}

TEST(Spawn, SandboxDiesWithTheSupervisorAndIsReapedByTheSubreaper) {
  // This test process plays the subreaper; a forked "supervisor" spawns `sleep` and exits.
  const Status subreaper = become_child_subreaper();
  ASSERT_TRUE(subreaper.ok()) << subreaper.message();
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t supervisor = ::fork();
  ASSERT_GE(supervisor, 0);
  if (supervisor == 0) {
    SpawnError err;
    auto p = spawn_sandbox(request({"sleep", "100"}), err);
    const pid_t pid = p ? p->pid() : -1;
    (void)!::write(pipe_fds[1], &pid, sizeof pid);
    ::_exit(0);
  }
  pid_t sandbox = -1;
  ASSERT_EQ(::read(pipe_fds[0], &sandbox, sizeof sandbox), static_cast<ssize_t>(sizeof sandbox));
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  ASSERT_GT(sandbox, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(supervisor, &status, 0), supervisor);
  // The orphaned sandbox was re-parented to us (subreaper) and killed by its parent-death signal.
  ASSERT_EQ(::waitpid(sandbox, &status, 0), sandbox);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  ::prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0);
}

// ---- the two-step start: prepare_sandbox stops the child right before its exec -------------

// A command that leaves a trace first thing: the marker file exists once it has run at all.
struct Marker {
  Marker() {
    char t[] = "/tmp/leasehold-spawn-gate-XXXXXX";
    EXPECT_NE(::mkdtemp(t), nullptr);
    dir = t;
    path = dir + "/ran";
  }
  ~Marker() {
    ::unlink(path.c_str());
    ::rmdir(dir.c_str());
  }
  bool exists() const { return ::access(path.c_str(), F_OK) == 0; }
  SpawnRequest request() const { return leasehold::request({"sh", "-c", "echo ran > \"$0\"; exec sleep 100", path}); }
  std::string dir, path;
};

std::string exe_of(pid_t pid) {
  char buf[4096];
  const ssize_t n = ::readlink(("/proc/" + std::to_string(pid) + "/exe").c_str(), buf, sizeof buf - 1);
  return n < 0 ? std::string() : std::string(buf, static_cast<std::size_t>(n));
}

#define PREPARE_OR_SKIP(var, req)                                                     \
  SpawnError var##_error;                                                             \
  auto var = prepare_sandbox(req, var##_error);                                       \
  if (!var && var##_error.errno_value == ENOSYS) GTEST_SKIP() << var##_error.message; \
  ASSERT_TRUE(var.has_value()) << var##_error.message

TEST(SpawnGate, APreparedChildWaitsBeforeItsExecUntilReleased) {
  Marker m;
  PREPARE_OR_SKIP(p, m.request());
  const SandboxProcess& proc = p->process();
  ASSERT_TRUE(proc.valid());
  EXPECT_TRUE(p->at_gate());
  pollfd pf{proc.pidfd(), POLLIN, 0};
  EXPECT_EQ(::poll(&pf, 1, 200), 0) << "the child must wait at its gate, not exit";
  // Still this test's image: it has not exec'd, and its command has not run.
  EXPECT_EQ(exe_of(proc.pid()), exe_of(::getpid()));
  EXPECT_FALSE(m.exists()) << "the command ran before it was released";
  SpawnError err;
  ASSERT_TRUE(release_sandbox(*p, err)) << err.message;
  EXPECT_FALSE(p->at_gate());
  EXPECT_NE(exe_of(proc.pid()), exe_of(::getpid()));
  EXPECT_EQ(::getsid(proc.pid()), proc.pid());
  for (int i = 0; i < 10'000 && !m.exists(); ++i) ::usleep(1000);  // hang guard only
  EXPECT_TRUE(m.exists()) << "released, the command runs";
  ASSERT_EQ(KillSwitch::pidfd_signal(proc.pidfd(), SIGKILL), 0);
  const siginfo_t info = wait_exit(proc);
  EXPECT_EQ(info.si_status, SIGKILL);
  EXPECT_TRUE(no_children_left());
}

TEST(SpawnGate, AChildKilledAtItsGateNeverRunsItsCommand) {
  Marker m;
  PREPARE_OR_SKIP(p, m.request());
  const SandboxProcess& proc = p->process();
  const KillRecord rec = KillSwitch::kill(KillTarget{-1, -1, proc.pidfd(), proc.pgid()}, KillSwitch::now_ns());
  EXPECT_EQ(rec.error, 0);
  EXPECT_EQ(rec.path, KillPath::signals);
  pollfd pf{proc.pidfd(), POLLIN, 0};
  ASSERT_EQ(::poll(&pf, 1, 20'000), 1);
  SpawnError err;
  EXPECT_FALSE(release_sandbox(*p, err));
  EXPECT_EQ(err.errno_value, ESRCH);
  EXPECT_EQ(err.message, "the sandbox was killed before its exec: its command never ran");
  EXPECT_FALSE(m.exists());
  // Not reaped by release: its owner reaps it.
  const siginfo_t info = wait_exit(proc);
  EXPECT_EQ(info.si_code, CLD_KILLED);
  EXPECT_EQ(info.si_status, SIGKILL);
  EXPECT_TRUE(no_children_left());
}

TEST(SpawnGate, AnAbandonedGateEndsTheChildWithoutExec) {
  Marker m;
  std::optional<SandboxProcess> proc;
  {
    PREPARE_OR_SKIP(p, m.request());
    proc = std::move(p->process());  // the owner keeps the process; the gate goes with `p`
  }
  const siginfo_t info = wait_exit(*proc);
  EXPECT_EQ(info.si_code, CLD_EXITED);
  EXPECT_EQ(info.si_status, 127);
  EXPECT_FALSE(m.exists());
  SpawnError err;
  PREPARE_OR_SKIP(q, m.request());
  q->abandon();
  EXPECT_FALSE(release_sandbox(*q, err));
  EXPECT_EQ(err.errno_value, EBADF);
  EXPECT_EQ(wait_exit(q->process()).si_status, 127);
  EXPECT_FALSE(m.exists());
  EXPECT_TRUE(no_children_left());
}

TEST(SpawnGate, AnExecFailureAfterTheGateIsReportedAndLeftUnreaped) {
  SpawnError err;
  EXPECT_FALSE(prepare_sandbox(request({"leasehold-no-such-command"}), err).has_value());
  EXPECT_EQ(err.message, "command not found: leasehold-no-such-command");
  EXPECT_TRUE(no_children_left());
  const std::string path = junk_executable();
  auto q = prepare_sandbox(request({path}), err);
  if (!q && err.errno_value == ENOSYS) GTEST_SKIP() << err.message;
  ASSERT_TRUE(q.has_value()) << err.message;
  EXPECT_FALSE(release_sandbox(*q, err));
  ::unlink(path.c_str());
  EXPECT_EQ(err.errno_value, ENOEXEC);
  EXPECT_EQ(err.message, std::string("cannot execute ") + path + ": " + std::strerror(ENOEXEC));
  // release leaves the reap to the owner: the child is still there to be reaped.
  const siginfo_t info = wait_exit(q->process());
  EXPECT_EQ(info.si_pid, q->process().pid());
  EXPECT_EQ(info.si_status, 127);
  EXPECT_TRUE(no_children_left());
}

}  // namespace
}  // namespace leasehold
