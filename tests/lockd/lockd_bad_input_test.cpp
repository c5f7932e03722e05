// lockd refuses bad input at start-up with a clear message and a non-zero exit, and leaves the
// store exactly as it was: key files, foreign/corrupt stores, read-only and full disks, flags.
#include "leasehold/io/probe.hpp"
#include "leasehold/lockd/admin_client.hpp"
#include "leasehold/lockd/store.hpp"
#include "lockd_process.hpp"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <fstream>
#include <map>
#include <random>

namespace leasehold::lockd {
namespace {

using namespace testing;

class LockdBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const Status why = io_uring_usable(); !why.ok()) GTEST_SKIP() << why.message();
    key_ = make_key(dir_.path());
  }
  std::string key_path() const { return (dir_.path() / "lockd.key").string(); }
  ExitResult run(std::vector<std::string> args) {
    args.insert(args.end(), {"--listen", "127.0.0.1:0"});
    return run_lockd_to_exit(args, dir_.path());
  }
  /// A real store with a few held names, written by lockd itself.
  void make_store(const fs::path& store) {
    LockdProcess p;
    std::string err;
    ASSERT_TRUE(p.start({"--key-file", key_path(), "--store", store.string()}, dir_.path() / "mk.log", &err))
        << err;
    AdminClient c(p.address(), key_);
    for (int i = 0; i < 300; ++i) {
      const Answer a = c.acquire("n/" + std::to_string(i), SandboxId{1, static_cast<std::uint64_t>(i + 1)},
                                 WorkerId{2, 1});
      ASSERT_NE(a.as<wire::Grant>(), nullptr) << a.message();
    }
    ASSERT_EQ(p.terminate(), 0);
  }

  TempDir dir_;
  wire::WireKey key_;
};

TEST_F(LockdBadInput, KeyFileReadableByOthers) {
  ASSERT_EQ(::chmod(key_path().c_str(), 0644), 0);
  const fs::path store = dir_.path() / "lockd.db";
  const ExitResult r = run({"--key-file", key_path(), "--store", store.string()});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("0644"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("chmod 600"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(store)) << "a refused start must not create the store";
}

TEST_F(LockdBadInput, KeyFileMissingOrAbsentFlag) {
  const ExitResult r = run({"--key-file", (dir_.path() / "nope.key").string()});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("nope.key"), std::string::npos) << r.err;
  const ExitResult r2 = run({});
  EXPECT_EQ(r2.code, 2);
  EXPECT_NE(r2.err.find("--key-file or --key-dir is required"), std::string::npos) << r2.err;
}

TEST_F(LockdBadInput, InvalidFlagCombinations) {
  const ExitResult r = run({"--key-file", key_path(), "--ttl-ms", "0"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--ttl-ms must be at least 1"), std::string::npos) << r.err;
  const ExitResult r2 = run({"--key-file", key_path(), "--worker-ttl-ms", "100"});
  EXPECT_EQ(r2.code, 2);
  EXPECT_NE(r2.err.find("preemptible only"), std::string::npos) << r2.err;
}

TEST_F(LockdBadInput, CorruptStoreUntouched) {
  const fs::path store = dir_.path() / "lockd.db";
  make_store(store);
  std::string bytes = slurp(store);
  ASSERT_GT(bytes.size(), 4u * 4096u);
  std::mt19937 rng(3);
  for (std::size_t i = 2 * 4096; i < bytes.size(); i += 61) bytes[i] = static_cast<char>(rng());
  { std::ofstream(store, std::ios::binary | std::ios::trunc) << bytes; }
  const ExitResult r = run({"--key-file", key_path(), "--store", store.string()});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("corrupt"), std::string::npos) << r.err;
  EXPECT_EQ(slurp(store), bytes);
}

TEST_F(LockdBadInput, ForeignAndNonDatabaseFilesUntouched) {
  const fs::path foreign = dir_.path() / "app.db";
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(foreign.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE users(name); INSERT INTO users VALUES('x');", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  const std::string before = slurp(foreign);
  const ExitResult r = run({"--key-file", key_path(), "--store", foreign.string()});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("another application"), std::string::npos) << r.err;
  EXPECT_EQ(slurp(foreign), before);

  const fs::path text = dir_.path() / "notes.txt";
  { std::ofstream(text) << "not a database\n" << std::string(300, 'z'); }
  const std::string tb = slurp(text);
  const ExitResult r2 = run({"--key-file", key_path(), "--store", text.string()});
  EXPECT_EQ(r2.code, 1);
  EXPECT_NE(r2.err.find("not a SQLite database"), std::string::npos) << r2.err;
  EXPECT_EQ(slurp(text), tb);
}

TEST_F(LockdBadInput, SecondLockdOnTheSameStoreRefused) {
  const fs::path store = dir_.path() / "lockd.db";
  LockdProcess first;
  std::string err;
  ASSERT_TRUE(first.start({"--key-file", key_path(), "--store", store.string()}, dir_.path() / "1.log", &err)) << err;
  const ExitResult r = run({"--key-file", key_path(), "--store", store.string()});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("another lockd"), std::string::npos) << r.err;
  EXPECT_TRUE(first.running());
}

// Runs `body` in a child with a private mount namespace and a tmpfs (options) at `dir`;
// returns its exit code, or -1 if the namespace/mount is not permitted here.
int in_private_tmpfs(const fs::path& dir, const char* options, const std::function<int()>& body) {
  fs::create_directories(dir);
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::unshare(CLONE_NEWNS) != 0) ::_exit(100);
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) ::_exit(100);
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, options) != 0) ::_exit(100);
    ::_exit(body());
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status)) return -2;
  return WEXITSTATUS(status) == 100 ? -1 : WEXITSTATUS(status);
}

// Child-side check: lockd on `store` exits 1 naming `needle`, the store bytes unchanged.
// Returns 0 if so; a distinct code per failed expectation (its stderr is in dir/run.err).
int expect_lockd_refuses(const fs::path& store, const std::string& key, const fs::path& out_dir,
                         const char* needle) {
  const std::string before = slurp(store);
  const ExitResult r = run_lockd_to_exit({"--key-file", key, "--store", store.string(), "--listen",
                                          "127.0.0.1:0"},
                                         out_dir);
  if (r.code != 1) return 10;
  if (r.err.find(needle) == std::string::npos) return 11;
  if (slurp(store) != before) return 12;
  return 0;
}

TEST_F(LockdBadInput, ReadOnlyFileSystemUntouched) {
  const fs::path mnt = dir_.path() / "ro";
  const int rc = in_private_tmpfs(mnt, "size=8m,mode=0700", [&]() -> int {
    const fs::path store = mnt / "lockd.db";
    {
      NameStore s(store.string());
      StoredName n;
      n.name = "ro/name";
      n.id = name_id_of(n.name);
      n.state = LockPhase::held;
      n.epoch = 3;
      n.owner = SandboxId{1, 1};
      n.worker = WorkerId{1, 1};
      std::vector<StoredName> rows{n};
      s.commit(rows, 3);
    }
    if (::mount(nullptr, mnt.c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr) != 0) return 100;
    return expect_lockd_refuses(store, key_path(), dir_.path(), "read-only");
  });
  if (rc == -1) GTEST_SKIP() << "no private mount namespace / tmpfs here (needs CAP_SYS_ADMIN)";
  EXPECT_EQ(rc, 0) << slurp(dir_.path() / "run.err");
}

TEST_F(LockdBadInput, FullDiskUntouched) {
  const fs::path mnt = dir_.path() / "full";
  const int rc = in_private_tmpfs(mnt, "size=2m,mode=0700", [&]() -> int {
    const fs::path store = mnt / "lockd.db";
    {
      NameStore s(store.string());
      std::vector<StoredName> rows;
      for (int i = 0; i < 50; ++i) {
        StoredName n;
        n.name = "full/" + std::to_string(i);
        n.id = name_id_of(n.name);
        n.state = LockPhase::held;
        n.epoch = 1;
        n.owner = SandboxId{1, static_cast<std::uint64_t>(i + 1)};
        n.worker = WorkerId{1, 1};
        rows.push_back(n);
      }
      s.commit(rows, 1);
    }
    {
      std::ofstream fill(mnt / "fill", std::ios::binary);
      const std::string chunk(4096, 'f');
      for (int i = 0; i < 1024 && fill.good(); ++i) fill.write(chunk.data(), chunk.size()).flush();
    }
    return expect_lockd_refuses(store, key_path(), dir_.path(), "full");
  });
  if (rc == -1) GTEST_SKIP() << "no private mount namespace / tmpfs here (needs CAP_SYS_ADMIN)";
  EXPECT_EQ(rc, 0) << slurp(dir_.path() / "run.err");
}

// The disk fills up while lockd serves: it must never acknowledge a grant it could not make
// durable, and it stops with a message naming the cause. After space is freed, a restart has
// every acknowledged grant.
TEST_F(LockdBadInput, DiskFullWhileServingLosesNoAcknowledgedGrant) {
  const fs::path mnt = dir_.path() / "fills";
  const fs::path report = dir_.path() / "report.txt";
  const int rc = in_private_tmpfs(mnt, "size=3m,mode=0700", [&]() -> int {
    const fs::path store = mnt / "lockd.db";
    std::map<std::string, Epoch> acked;
    bool stopped = false;
    std::string log;
    {
      LockdProcess p;
      std::string err;
      if (!p.start({"--key-file", key_path(), "--store", store.string()}, dir_.path() / "full.log", &err)) return 20;
      AdminClient c(p.address(), key_, WorkerId{3, 3}, 300'000'000);
      int i = 0;
      for (; i < 100; ++i) {  // some grants before the disk fills
        const std::string name = "full/" + std::to_string(i);
        const Answer a = c.acquire(name, SandboxId{3, static_cast<std::uint64_t>(i + 1)}, WorkerId{3, 3});
        if (const auto* g = a.as<wire::Grant>()) acked[name] = g->epoch;
      }
      {
        std::ofstream fill(mnt / "fill", std::ios::binary);
        const std::string chunk(4096, 'f');
        for (int k = 0; k < 1024 && fill.good(); ++k) fill.write(chunk.data(), chunk.size()).flush();
      }
      for (; i < 3000 && p.running(); ++i) {
        const std::string name = "full/" + std::to_string(i);
        const Answer a = c.acquire(name, SandboxId{3, static_cast<std::uint64_t>(i + 1)}, WorkerId{3, 3});
        if (const auto* g = a.as<wire::Grant>()) acked[name] = g->epoch;
      }
      stopped = !p.running();
      p.kill9();
      log = p.log();
    }
    std::ofstream(report) << "acked " << acked.size() << " stopped " << stopped << "\n" << log;
    if (acked.size() < 100) return 25;
    if (!stopped) return 21;  // 3000 new names must outgrow a full 3 MiB disk
    if (log.find("disk is full") == std::string::npos) return 22;
    // The log shows only durable changes: one grant line per acknowledged grant at most.
    std::size_t grant_lines = 0;
    for (std::size_t pos = 0; (pos = log.find("event=grant", pos)) != std::string::npos; ++pos) ++grant_lines;
    if (grant_lines < acked.size()) return 26;
    fs::remove(mnt / "fill");
    LockdProcess q;
    std::string err;
    if (!q.start({"--key-file", key_path(), "--store", store.string()}, dir_.path() / "full2.log", &err)) return 23;
    AdminClient c(q.address(), key_);
    for (const auto& [name, epoch] : acked) {
      const Answer s = c.show(name);
      const auto* info = s.as<wire::NameInfo>();
      if (info == nullptr || info->record.epoch != epoch || info->record.state != LockPhase::held) return 24;
    }
    return 0;
  });
  if (rc == -1) GTEST_SKIP() << "no private mount namespace / tmpfs here (needs CAP_SYS_ADMIN)";
  EXPECT_EQ(rc, 0) << slurp(report).substr(0, 4000);
}

TEST_F(LockdBadInput, StoreDirectoryMissing) {
  const fs::path store = dir_.path() / "no" / "such" / "dir" / "lockd.db";
  const ExitResult r = run({"--key-file", key_path(), "--store", store.string()});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("cannot create"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(store));
}

}  // namespace
}  // namespace leasehold::lockd
