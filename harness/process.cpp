// leasehold/harness: processes, temporary directories, waits (include/leasehold/harness/process.hpp).
#include "leasehold/harness/process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <system_error>

extern char** environ;

namespace leasehold::harness {

namespace {

constexpr std::size_t kCommandOutputMax = std::size_t{1} << 20;
constexpr std::int64_t kPollMs = 5;

/// The exit code of a waitpid status: the code, or 128 + the signal.
int code_of(int status) noexcept {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

std::int64_t ms_left(std::int64_t deadline_ns) noexcept {
  const std::int64_t left = deadline_ns - now_ns();
  return left <= 0 ? 0 : (left + kNsPerMs - 1) / kNsPerMs;
}

void close_fd(int& fd) noexcept {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

/// In a forked child, before exec: the signals a driver handles back at their defaults, none
/// blocked (exec keeps an ignored disposition and the mask; a child must be stoppable).
void default_signals_in_child() noexcept {
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGQUIT}) ::signal(sig, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
}

/// `environ` with `env` set over it, as NAME=value strings.
std::vector<std::string> environment_with(const std::vector<std::pair<std::string, std::string>>& env) {
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view kv(*e);
    const std::string_view name = kv.substr(0, kv.find('='));
    const bool replaced = std::any_of(env.begin(), env.end(), [&](const auto& p) { return p.first == name; });
    if (!replaced) out.emplace_back(kv);
  }
  for (const auto& [name, value] : env) out.push_back(name + "=" + value);
  return out;
}

Result<int> open_output(const fs::path& p, bool append) {
  const int fd = p.empty() ? ::open("/dev/null", O_WRONLY | O_CLOEXEC)
                           : ::open(p.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0600);
  if (fd < 0) return Status::from_errno(errno, "cannot open " + (p.empty() ? std::string("/dev/null") : p.string()));
  return fd;
}

}  // namespace

std::string slurp(const fs::path& path, std::size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  std::string out;
  char buf[8192];
  while (in && out.size() < max_bytes) {
    in.read(buf, static_cast<std::streamsize>(std::min(sizeof buf, max_bytes - out.size())));
    out.append(buf, static_cast<std::size_t>(in.gcount()));
  }
  return out;
}

std::string tail_lines(std::string_view text, std::size_t lines) {
  if (text.empty()) return "(empty)";
  std::size_t pos = text.size();
  if (text.back() == '\n') --pos;
  for (std::size_t n = 0; n < lines; ++n) {
    const auto p = pos == 0 ? std::string_view::npos : text.rfind('\n', pos - 1);
    if (p == std::string_view::npos) return std::string(text);
    pos = p;
  }
  return std::string(text.substr(pos + 1));
}

void sleep_ms(std::int64_t ms) {
  if (ms <= 0) return;
  const std::int64_t until = now_ns() + ms * kNsPerMs;
  const timespec ts{static_cast<time_t>(until / kNsPerS), static_cast<long>(until % kNsPerS)};
  while (::clock_nanosleep(CLOCK_BOOTTIME, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

namespace {
std::atomic<bool> g_interrupted{false};
struct sigaction g_old_int {}, g_old_term {};
void on_interrupt(int) { g_interrupted.store(true, std::memory_order_relaxed); }
}  // namespace

InterruptScope::InterruptScope() {
  g_interrupted.store(false);
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, &g_old_int);
  ::sigaction(SIGTERM, &sa, &g_old_term);
}

InterruptScope::~InterruptScope() {
  ::sigaction(SIGINT, &g_old_int, nullptr);
  ::sigaction(SIGTERM, &g_old_term, nullptr);
}

void InterruptScope::check() {
  if (g_interrupted.load(std::memory_order_relaxed)) throw Interrupted{};
}

void sleep_until_ns(std::int64_t t_ns, const std::function<void()>& tick) {
  for (;;) {
    if (tick) tick();
    const std::int64_t now = now_ns();
    if (now >= t_ns) return;
    const std::int64_t until = std::min(t_ns, now + kSleepTickNs);
    const timespec ts{static_cast<time_t>(until / kNsPerS), static_cast<long>(until % kNsPerS)};
    while (::clock_nanosleep(CLOCK_BOOTTIME, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
    }
  }
}

Status write_file(const fs::path& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.flush();
  if (!out) {
    const int e = errno;
    return Status(e != 0 ? errc_of_errno(e) : Errc::io_error, "cannot write " + path.string() + ": " + std::strerror(e));
  }
  return {};
}

std::string dir_of(const std::string& path) {
  const auto p = path.rfind('/');
  return p == std::string::npos ? "." : path.substr(0, p);
}

bool eventually(const std::function<bool()>& pred, milliseconds timeout, milliseconds interval,
                const std::function<void()>& tick) {
  const std::int64_t deadline = now_ns() + timeout.count() * kNsPerMs;
  for (;;) {
    if (tick) tick();
    if (pred()) return true;
    if (now_ns() >= deadline) return pred();
    sleep_ms(std::min<std::int64_t>(interval.count(), ms_left(deadline)));
  }
}

int pidfd_open(pid_t pid) noexcept { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

bool pidfd_exited(int pidfd) noexcept {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

std::int64_t wait_pidfd_exit(int pidfd, milliseconds timeout, const std::function<void()>& tick) {
  const std::int64_t deadline = now_ns() + timeout.count() * kNsPerMs;
  while (now_ns() < deadline) {
    if (tick) tick();
    pollfd p{pidfd, POLLIN, 0};
    if (::poll(&p, 1, 1) > 0) return now_ns();
  }
  return -1;
}

std::string find_program(const std::string& name) {
  std::string dirs = std::getenv("PATH") != nullptr ? std::getenv("PATH") : "";
  dirs += ":/usr/sbin:/sbin:/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    const std::size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string d = dirs.substr(start, end - start);
    start = end + 1;
    if (d.empty()) continue;
    const std::string p = d + "/" + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

// ---- TempDir ----------------------------------------------------------------------------------

TempDir::TempDir(std::string_view prefix) {
  std::string tmpl = "/tmp/" + std::string(prefix) + "-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr)
    throw std::runtime_error("cannot make a temporary directory " + tmpl + ": " + std::strerror(errno));
  path_ = tmpl;
}

TempDir::~TempDir() {
  if (keep_ || path_.empty()) return;
  std::error_code ec;
  fs::remove_all(path_, ec);  // best effort: nothing to report to from a destructor
}

// ---- Process ----------------------------------------------------------------------------------

Process::~Process() { kill9(); }

Process::Process(Process&& o) noexcept
    : pid_(std::exchange(o.pid_, -1)),
      pidfd_(std::exchange(o.pidfd_, -1)),
      own_group_(o.own_group_),
      code_(o.code_),
      label_(std::move(o.label_)),
      stdout_path_(std::move(o.stdout_path_)),
      stderr_path_(std::move(o.stderr_path_)) {}

Process& Process::operator=(Process&& o) noexcept {
  if (this != &o) {
    kill9();
    pid_ = std::exchange(o.pid_, -1);
    pidfd_ = std::exchange(o.pidfd_, -1);
    own_group_ = o.own_group_;
    code_ = o.code_;
    label_ = std::move(o.label_);
    stdout_path_ = std::move(o.stdout_path_);
    stderr_path_ = std::move(o.stderr_path_);
  }
  return *this;
}

Status Process::start(const Spawn& spec) {
  kill9();
  code_.reset();
  if (spec.argv.empty() || spec.argv[0].empty()) return Status::invalid("no program to start (empty argv)");
  label_ = spec.label.empty() ? spec.argv[0] : spec.label;
  stdout_path_ = spec.stdout_path;
  stderr_path_ = spec.stderr_fd >= 0 ? fs::path() : spec.stderr_path;

  // Everything the child needs is made before fork: after it, only async-signal-safe calls.
  std::vector<std::string> argv_s = spec.argv;
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s;
  std::vector<char*> envp;
  if (!spec.env.empty()) {
    env_s = environment_with(spec.env);
    for (auto& e : env_s) envp.push_back(e.data());
    envp.push_back(nullptr);
  }
  int ns_fd = -1, out_fd = -1, err_fd = -1, null_fd = -1;
  struct Closer {
    int* fds[4];
    ~Closer() {
      for (int* fd : fds) close_fd(*fd);
    }
  } closer{{&ns_fd, &out_fd, &err_fd, &null_fd}};
  if (!spec.netns.empty()) {
    const std::string p = "/run/netns/" + spec.netns;
    ns_fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (ns_fd < 0) return Status::from_errno(errno, "cannot open network namespace " + p);
  }
  const Result<int> out = open_output(spec.stdout_path, spec.append_stdout);
  if (!out) return out.status();
  out_fd = *out;
  if (spec.stderr_fd < 0 && !(spec.stderr_path.empty() ? spec.stdout_path.empty() : spec.stderr_path == spec.stdout_path)) {
    const Result<int> err = open_output(spec.stderr_path, spec.append_stderr);
    if (!err) return err.status();
    err_fd = *err;
  }
  const int child_err = spec.stderr_fd >= 0 ? spec.stderr_fd : err_fd >= 0 ? err_fd : out_fd;
  null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t parent = ::getpid();

  const pid_t pid = ::fork();
  if (pid < 0) return Status::from_errno(errno, label_ + ": fork");
  if (pid == 0) {
    if (spec.die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(126);
    }
    if (spec.own_process_group) ::setpgid(0, 0);
    default_signals_in_child();
    if (ns_fd >= 0 && ::setns(ns_fd, CLONE_NEWNET) != 0) {
      ::dprintf(child_err, "setns(%s): %s\n", spec.netns.c_str(), std::strerror(errno));
      ::_exit(126);
    }
    if (null_fd >= 0) ::dup2(null_fd, 0);
    ::dup2(out_fd, 1);
    ::dup2(child_err, 2);
    if (!envp.empty()) {
      if (spec.search_path) ::execvpe(argv[0], argv.data(), envp.data());
      else ::execve(argv[0], argv.data(), envp.data());
    } else {
      if (spec.search_path) ::execvp(argv[0], argv.data());
      else ::execv(argv[0], argv.data());
    }
    ::dprintf(2, "cannot execute %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  pid_ = pid;
  own_group_ = spec.own_process_group;
  pidfd_ = pidfd_open(pid);
  return {};
}

void Process::reaped(int status) noexcept {
  code_ = code_of(status);
  pid_ = -1;
  close_pidfd();
}

void Process::close_pidfd() noexcept { close_fd(pidfd_); }

bool Process::running() {
  if (pid_ <= 0) return false;
  int status = 0;
  const pid_t w = ::waitpid(pid_, &status, WNOHANG);
  if (w == pid_) {
    reaped(status);
    return false;
  }
  return true;
}

int Process::wait(milliseconds timeout) {
  const std::int64_t deadline = now_ns() + timeout.count() * kNsPerMs;
  while (running()) {
    const std::int64_t left = ms_left(deadline);
    if (left == 0) return -1;
    if (pidfd_ >= 0) {
      pollfd p{pidfd_, POLLIN, 0};
      ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left, 1000)));  // EINTR: look again
    } else {
      sleep_ms(std::min(left, kPollMs));
    }
  }
  return code_.value_or(-1);
}

void Process::signal(int sig) noexcept {
  if (pid_ > 0) ::kill(pid_, sig);
}

int Process::terminate(milliseconds grace) {
  if (pid_ <= 0) return code_.value_or(-1);
  signal(SIGCONT);  // a stopped process cannot act on SIGTERM
  signal(SIGTERM);
  if (wait(grace) < 0) kill9();
  return code_.value_or(-1);
}

void Process::kill9() noexcept {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGCONT);
  if (own_group_) ::kill(-pid_, SIGKILL);
  ::kill(pid_, SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  reaped(status);
}

// ---- waits on logs, commands --------------------------------------------------------------------

std::optional<std::string> wait_for_log_line(const fs::path& file, std::string_view pattern, milliseconds timeout,
                                             Process* watched, const std::function<void()>& tick, std::size_t from) {
  const auto find = [&]() -> std::optional<std::string> {
    const std::string text = slurp(file);
    for (std::size_t at = text.find(pattern, from); at != std::string::npos; at = text.find(pattern, at + 1)) {
      const auto b = at == 0 ? std::string::npos : text.rfind('\n', at - 1);
      // (a pattern may end with the newline: "ready\n" is the whole line "ready")
      const auto e = text.find('\n', at + (pattern.empty() ? 0 : pattern.size() - 1));
      if (e == std::string::npos) return std::nullopt;  // not a whole line yet
      const std::size_t begin = b == std::string::npos ? 0 : b + 1;
      if (begin < from) continue;
      return text.substr(begin, e - begin);
    }
    return std::nullopt;
  };
  std::optional<std::string> line;
  eventually([&] { return (line = find()).has_value() || (watched != nullptr && !watched->running()); }, timeout,
             milliseconds(kPollMs), tick);
  if (!line && watched != nullptr && !watched->running()) line = find();  // printed just before it exited
  return line;
}

Result<std::string> wait_for_log_line(const fs::path& file, std::string_view pattern, milliseconds timeout,
                                      Process& watched, const std::function<void()>& tick) {
  auto line = wait_for_log_line(file, pattern, timeout, &watched, tick);
  if (line) return std::move(*line);
  const bool alive = watched.running();
  return Status{alive ? Errc::timeout : Errc::refused,
                watched.label() + (alive ? " did not print \"" + std::string(pattern) + "\" within " +
                                               std::to_string(timeout.count()) + " ms"
                                         : " exited during start-up (code " +
                                               std::to_string(watched.exit_code().value_or(-1)) +
                                               ", before printing \"" + std::string(pattern) + "\")") +
                    "; last lines of " + file.string() + ":\n" + tail_lines(slurp(file), 8)};
}

int run_command(const std::vector<std::string>& argv, std::string* output, milliseconds timeout) {
  if (argv.empty()) return 127;
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return 127;
  std::vector<std::string> argv_s = argv;
  std::vector<char*> args;
  for (auto& a : argv_s) args.push_back(a.data());
  args.push_back(nullptr);
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    if (null_fd >= 0) ::close(null_fd);
    return 127;
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    default_signals_in_child();
    ::dup2(pipefd[1], 1);
    ::dup2(pipefd[1], 2);
    if (null_fd >= 0) ::dup2(null_fd, 0);
    ::execvp(args[0], args.data());
    ::dprintf(2, "cannot run %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(pipefd[1]);
  if (null_fd >= 0) ::close(null_fd);
  std::string out;
  const std::int64_t deadline = now_ns() + timeout.count() * kNsPerMs;
  bool killed = false;
  for (;;) {
    const std::int64_t left = ms_left(deadline);
    if (left == 0 && !killed) {
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
      killed = true;
    }
    pollfd p{pipefd[0], POLLIN, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(left > 0 ? std::min<std::int64_t>(left, 200) : 200));
    if (rc < 0 && errno == EINTR) continue;
    if (rc > 0) {
      char buf[4096];
      const ssize_t n = ::read(pipefd[0], buf, sizeof buf);
      if (n <= 0) break;
      if (out.size() < kCommandOutputMax) out.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(pipefd[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (output != nullptr) *output = std::move(out);
  return code_of(status);
}

}  // namespace leasehold::harness
