// The store's files against a local user (issue 15 "Files"), on the real leasehold-lockd: the
// store and its WAL are 0600, so another uid cannot open them, let alone hold a SQLite lock that
// keeps lockd from starting; a reader of lockd's own uid delays the start at most the busy
// timeout and is named when it does not let go; once lockd serves, no reader can take a lock.
// The attack runs twice: with the defence ablated (LEASEHOLD_ABLATE), where it succeeds, and on.
#include "leasehold/io/probe.hpp"
#include "leasehold/lockd/admin_client.hpp"
#include "leasehold/lockd/store.hpp"
#include "lockd_process.hpp"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cstring>
#include <thread>

namespace leasehold::lockd {
namespace {

using namespace testing;

const SandboxId S1{0xF1, 1};
const WorkerId W1{0xF0, 1};

/// A child process that opens `db` read-only (as `uid` when >= 0) and holds a read transaction
/// on it until it is stopped, or for `hold_ms` when >= 0. outcome(): "reading" once it holds the
/// lock, else "error: ..." (it could not open or read). With `raw`, it takes SQLite's read lock
/// itself (fcntl F_RDLCK over the file, what a SQLite reader holds), as a user who cannot create
/// the -shm a SQLite reader would need.
class Reader {
 public:
  Reader(const fs::path& db, int uid, int hold_ms, bool raw = false) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(p[0]);
      auto say = [&](const std::string& s) { (void)!::write(p[1], s.data(), s.size()); };
      if (uid >= 0 && (::setgid(static_cast<gid_t>(uid)) != 0 || ::setuid(static_cast<uid_t>(uid)) != 0)) {
        say("error: setuid");
        ::_exit(1);
      }
      if (raw) {
        const int fd = ::open(db.c_str(), O_RDONLY | O_CLOEXEC);
        struct flock fl {};
        fl.l_type = F_RDLCK;
        fl.l_whence = SEEK_SET;
        if (fd < 0 || ::fcntl(fd, F_SETLK, &fl) != 0) {
          say(std::string("error: ") + std::strerror(errno));
          ::_exit(1);
        }
        say("reading");
        for (;;) ::pause();
      }
      sqlite3* h = nullptr;
      sqlite3_stmt* q = nullptr;
      if (sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK ||
          sqlite3_exec(h, "BEGIN", nullptr, nullptr, nullptr) != SQLITE_OK ||
          sqlite3_prepare_v2(h, "SELECT count(*) FROM names", -1, &q, nullptr) != SQLITE_OK ||
          sqlite3_step(q) != SQLITE_ROW) {
        say(std::string("error: ") + (h != nullptr ? sqlite3_errmsg(h) : "open"));
        ::_exit(1);
      }
      say("reading");  // the read transaction (and its lock) stays open
      if (hold_ms >= 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
        ::_exit(0);
      }
      for (;;) ::pause();
    }
    ::close(p[1]);
    char buf[256] = {};
    pollfd pf{p[0], POLLIN, 0};
    if (::poll(&pf, 1, 20'000) > 0) {
      const ssize_t n = ::read(p[0], buf, sizeof buf - 1);
      if (n > 0) outcome_.assign(buf, static_cast<std::size_t>(n));
    }
    ::close(p[0]);
  }
  ~Reader() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;
  const std::string& outcome() const { return outcome_; }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  std::string outcome_;
};

class LockdStoreFiles : public ::testing::TestWithParam<bool> {
 protected:
  bool defended() const { return GetParam(); }
  void SetUp() override {
    if (const Status why = io_uring_usable(); !why.ok()) GTEST_SKIP() << why.message();
    key_ = make_key(dir_.path());
    old_umask_ = ::umask(022);  // a usual umask: lockd must not depend on it
  }
  void TearDown() override {
    ::umask(old_umask_);
    ::unsetenv("LEASEHOLD_ABLATE");
  }
  fs::path store() const { return dir_.path() / "lockd.db"; }
  std::vector<std::string> args() const {
    return {"--key-file", (dir_.path() / "lockd.key").string(), "--store", store().string()};
  }
  void ablate(const char* what) {
    if (!defended()) ::setenv("LEASEHOLD_ABLATE", what, 1);
  }
  /// Runs lockd once: a name granted at epoch 1, then an orderly stop.
  void make_store() {
    LockdProcess p;
    std::string err;
    ASSERT_TRUE(p.start(args(), dir_.path() / "first.log", &err)) << err;
    AdminClient c(p.address(), key_);
    const Answer g = c.acquire("files/one", S1, W1);
    ASSERT_NE(g.as<wire::Grant>(), nullptr) << g.message();
    ASSERT_EQ(p.terminate(), 0);
  }
  mode_t mode_of(const fs::path& p) const {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 ? st.st_mode & 07777 : 0;
  }

  TempDir dir_;
  wire::WireKey key_;
  mode_t old_umask_ = 022;
};

// Another local user holding a read lock on lockd.db kept lockd from starting. The files are
// 0600 now: that user cannot open them, and lockd starts.
TEST_P(LockdStoreFiles, AnotherUserCannotLockTheStoreAndKeepLockdFromStarting) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: the other user is uid 65534 (setuid)";
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);  // others may traverse, not write
  ablate("store-mode,store-busy-timeout");
  make_store();
  const mode_t m = mode_of(store());
  const mode_t wal = mode_of(store().string() + "-wal");
  Reader other(store(), 65534, -1, /*raw=*/true);
  LockdProcess p;
  std::string err;
  const bool started = p.start(args(), dir_.path() / "second.log", &err);
  if (defended()) {
    EXPECT_EQ(m, 0600u);
    EXPECT_TRUE(wal == 0 || wal == 0600u) << std::oct << wal;
    EXPECT_EQ(other.outcome().rfind("error: ", 0), 0u) << "uid 65534 read the store: " << other.outcome();
    ASSERT_TRUE(started) << err;
    AdminClient c(p.address(), key_);
    const Answer g = c.acquire("files/one", S1, W1);  // the first run's grant, restored
    ASSERT_NE(g.as<wire::Grant>(), nullptr) << g.message();
    EXPECT_EQ(g.as<wire::Grant>()->epoch, 1u);
  } else {
    EXPECT_EQ(m, 0644u);
    ASSERT_EQ(other.outcome(), "reading");
    EXPECT_FALSE(started);
    EXPECT_NE(err.find("process " + std::to_string(other.pid())), std::string::npos) << err;
  }
}

// A reader of lockd's own uid (sqlite3, a backup) that holds a read lock while lockd starts:
// lockd waits for it (up to kStoreOpenBusyTimeoutMsDefault) instead of failing at once.
TEST_P(LockdStoreFiles, ABriefReaderOnlyDelaysTheStart) {
  make_store();
  ablate("store-busy-timeout");
  // Ablated, the reader holds on until the test ends: the start must fail however slowly lockd
  // gets to the store (on a loaded machine that can be after a 1 s hold).
  Reader brief(store(), -1, defended() ? 1000 : -1);
  ASSERT_EQ(brief.outcome(), "reading");
  LockdProcess p;
  std::string err;
  const bool started = p.start(args(), dir_.path() / "second.log", &err);
  if (defended()) {
    ASSERT_TRUE(started) << err;
    AdminClient c(p.address(), key_);
    const Answer g = c.acquire("files/two", S1, W1);
    ASSERT_NE(g.as<wire::Grant>(), nullptr) << g.message();
    EXPECT_EQ(g.as<wire::Grant>()->epoch, 2u);  // above the first run's epoch: nothing lost
  } else {
    EXPECT_FALSE(started);
    EXPECT_NE(err.find("holds a lock on the store"), std::string::npos) << err;
  }
}

// A reader that does not let go: lockd gives up after the busy timeout and names it.
TEST_P(LockdStoreFiles, AReaderThatDoesNotLetGoIsNamed) {
  if (!defended()) GTEST_SKIP() << "the ablated run is ABriefReaderOnlyDelaysTheStart's";
  make_store();
  Reader stuck(store(), -1, -1);
  ASSERT_EQ(stuck.outcome(), "reading");
  const ExitResult r = run_lockd_to_exit(args(), dir_.path(), std::chrono::seconds(60));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("process " + std::to_string(stuck.pid())), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("lockd waited " + std::to_string(kStoreOpenBusyTimeoutMsDefault) + " ms"),
            std::string::npos) << r.err;
}

// Once lockd serves it holds the store's exclusive lock: a reader cannot take any lock, so it
// cannot stall a commit; lockd keeps granting while the reader tries.
TEST_P(LockdStoreFiles, AReaderAfterTheStartCannotStallLockd) {
  if (!defended()) GTEST_SKIP() << "nothing is ablated here";
  LockdProcess p;
  std::string err;
  ASSERT_TRUE(p.start(args(), dir_.path() / "serve.log", &err)) << err;
  AdminClient c(p.address(), key_);
  const Answer first = c.acquire("files/a", S1, W1);
  ASSERT_NE(first.as<wire::Grant>(), nullptr) << first.message();
  Reader late(store(), -1, -1);
  EXPECT_EQ(late.outcome().rfind("error: ", 0), 0u) << late.outcome();
  const Answer g = c.acquire("files/b", SandboxId{0xF1, 2}, W1);
  ASSERT_NE(g.as<wire::Grant>(), nullptr) << g.message();
}

INSTANTIATE_TEST_SUITE_P(DefenceOnAndAblated, LockdStoreFiles, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "defended" : "ablated"; });

}  // namespace
}  // namespace leasehold::lockd
