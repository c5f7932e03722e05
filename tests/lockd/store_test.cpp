// The durable name store: round trip, the epoch high-water rule, and refusals that leave the
// file as it was (foreign, not-a-database, corrupt, newer schema, in use, read-only, full).
#include "leasehold/lockd/store.hpp"
#include "leasehold/lockd/store_thread.hpp"

#include "service_core_fakes.hpp"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/eventfd.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>

namespace leasehold::lockd {
namespace {

namespace fs = std::filesystem;

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, const std::string& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << b;
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/lockd-store-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

StoredName held(std::uint64_t k, Epoch e) {
  StoredName n;
  n.name = "svc/name-" + std::to_string(k);
  n.id = name_id_of(n.name);
  n.state = LockPhase::held;
  n.epoch = e;
  n.owner = SandboxId{1, k};
  n.worker = WorkerId{2, k};
  n.ttl_ns = 10'000'000'000;
  return n;
}

std::string expect_refused(const fs::path& p, const std::string& needle) {
  try {
    NameStore s(p.string());
    ADD_FAILURE() << "store " << p << " opened; expected a refusal mentioning \"" << needle << "\"";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    return e.what();
  }
  return {};
}

TEST(NameStore, RoundTripAndOpenCount) {
  TempDir dir;
  const auto p = dir.path() / "lockd.db";
  std::vector<StoredName> rows;
  for (std::uint64_t k = 0; k < 10; ++k) rows.push_back(held(k, k + 1));
  rows[3].state = LockPhase::transferring;
  rows[3].old_epoch = 3;
  rows[3].peer = SandboxId{9, 9};
  rows[4].state = LockPhase::free;
  rows[4].peer = SandboxId{7, 7};
  {
    NameStore s(p.string());
    EXPECT_EQ(s.open_count(), 1u);
    EXPECT_TRUE(s.load().names.empty());
    rows[5].epoch_fresh = true;
    s.commit(rows, 77);
  }
  NameStore s(p.string());
  EXPECT_EQ(s.open_count(), 2u);
  auto table = s.load();
  EXPECT_EQ(table.epoch_high_water, 77u);
  s.commit({}, 50);  // never lowers the high-water mark
  EXPECT_EQ(s.load().epoch_high_water, 77u);
  auto& loaded = table.names;
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    auto ba = a.id, bb = b.id;
    return std::tie(ba.hi, ba.lo) < std::tie(bb.hi, bb.lo);
  });
  ASSERT_EQ(loaded.size(), rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(loaded[i], rows[i]) << i;
}

TEST(NameStore, RestartMarksRoundTripAndNeverGoDown) {
  TempDir dir;
  const auto p = dir.path() / "lockd.db";
  const WorkerId w1{0x77, 1}, w2{0x77, 2};
  {
    NameStore s(p.string());
    s.commit({}, 0, StoreMarks{1, 300'000'000, {w1}, {}, {}});
    s.commit({}, 0, StoreMarks{1, 200'000'000, {w2}, {}, {}});  // a lower lived is not stored
  }
  {
    NameStore s(p.string());
    ASSERT_EQ(s.open_count(), 2u);
    const StoredTable t = s.load();
    ASSERT_EQ(t.lived_ns.size(), 1u);
    EXPECT_EQ(t.lived_ns.at(1), 300'000'000);
    EXPECT_EQ(t.seen.at(w1), 1u);
    EXPECT_EQ(t.seen.at(w2), 1u);
    s.commit({}, 0, StoreMarks{2, 50'000'000, {w2}, {{w2, 9'000}}, {}});
    s.commit({}, 0, StoreMarks{2, 60'000'000, {w2}, {{w2, 8'000}}, {}});  // a lower floor is not stored
  }
  NameStore s(p.string());
  const StoredTable t = s.load();
  EXPECT_EQ(t.lived_ns.at(1), 300'000'000);
  EXPECT_EQ(t.lived_ns.at(2), 60'000'000);
  EXPECT_EQ(t.seen.at(w1), 1u);
  EXPECT_EQ(t.seen.at(w2), 2u);
  EXPECT_EQ(t.replay_floor.count(w1), 0u);
  EXPECT_EQ(t.replay_floor.at(w2), 9'000u);
  // Pruned: lived marks the restart rule no longer needs are deleted with a batch.
  StoreMarks prune{3, 10'000'000, {}, {}, {1}};
  s.commit({}, 0, prune);
  const StoredTable p2 = s.load();
  EXPECT_EQ(p2.lived_ns.count(1), 0u);
  EXPECT_EQ(p2.lived_ns.at(2), 60'000'000);
  EXPECT_EQ(p2.lived_ns.at(3), 10'000'000);
}

TEST(NameStore, EpochMayStayTheSame) {
  TempDir dir;
  const auto p = dir.path() / "lockd.db";
  NameStore s(p.string());
  std::vector<StoredName> a{held(1, 42)};
  s.commit(a);
  a[0].state = LockPhase::free;  // release keeps the epoch: allowed
  s.commit(a);
  auto loaded = s.load().names;
  ASSERT_EQ(loaded.size(), 1u);
  EXPECT_EQ(loaded[0].epoch, 42u);
  EXPECT_EQ(loaded[0].state, LockPhase::free);
}

// The store's end of "epochs never decrease": a change below the name's durable epoch, or an
// epoch the int64 columns cannot hold, is lockd's own bug (its name table and the store's
// epochs come from the same load), so it aborts, before the batch's transaction begins. The
// durable epochs are those loaded at open too, not only those this process wrote.
// The check itself, as every store's commit runs it (NameStore above, EtcdStore on etcd).
TEST(DurableEpochsDeathTest, OneCheckForEveryStore) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  DurableEpochs e;
  e.note(held(1, 0).id, 42);
  std::vector<StoredName> same{held(1, 42), held(2, 1)};
  e.check(same, 42);  // equal is fine, a new name is fine
  std::vector<StoredName> lower{held(1, 41)};
  EXPECT_DEATH(e.check(lower, 0), "LEASEHOLD_ASSERT\\(it == by_name_.end\\(\\) \\|\\| n.epoch >= it->second\\) failed");
  e.written(lower = {held(1, 50)});
  std::vector<StoredName> below_written{held(1, 49)};
  EXPECT_DEATH(e.check(below_written, 0), "n.epoch >= it->second");
  EXPECT_DEATH(e.check({}, kEpochMax + 1), "LEASEHOLD_ASSERT\\(epoch_high_water <= kEpochMax\\) failed");
}

TEST(NameStoreDeathTest, LoweringAnEpochOrPassingTheLimitAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TempDir dir;
  const auto p = dir.path() / "lockd.db";
  {
    NameStore s(p.string());
    std::vector<StoredName> a{held(1, 42)};
    s.commit(a, 42);
    std::vector<StoredName> lower{held(2, 5), held(1, 41)};  // the first change is fine
    EXPECT_DEATH(s.commit(lower), "LEASEHOLD_ASSERT\\(it == by_name_.end\\(\\) \\|\\| n.epoch >= it->second\\) failed");
    std::vector<StoredName> too_high{held(3, kEpochMax + 1)};
    EXPECT_DEATH(s.commit(too_high), "LEASEHOLD_ASSERT\\(n.epoch <= kEpochMax\\) failed");
    EXPECT_DEATH(s.commit({}, kEpochMax + 1), "LEASEHOLD_ASSERT\\(epoch_high_water <= kEpochMax\\) failed");
    std::vector<StoredName> limit{held(3, kEpochMax)};
    s.commit(limit, kEpochMax);  // the limit itself fits
  }
  NameStore s(p.string());  // reopened: the durable epochs come from the file
  std::vector<StoredName> lower{held(1, 41)};
  EXPECT_DEATH(s.commit(lower), "LEASEHOLD_ASSERT\\(it == by_name_.end\\(\\) \\|\\| n.epoch >= it->second\\) failed");
  const StoredTable t = s.load();
  ASSERT_EQ(t.names.size(), 2u);
  for (const StoredName& n : t.names) EXPECT_EQ(n.epoch, n.id == held(1, 0).id ? 42u : kEpochMax);
  EXPECT_EQ(t.epoch_high_water, kEpochMax);
}

// Nor can a store file make that check fire: lockd's name table is rebuilt from the same rows
// (load), and an epoch the file holds above 2^63-1 (here -1, written into the row by another
// program) is refused when lockd starts, naming the problem, instead of reaching commit().
TEST(NameStore, AnEpochAboveTheLimitInTheFileIsRefusedAtStart) {
  TempDir dir;
  const auto p = dir.path() / "lockd.db";
  {
    NameStore s(p.string());
    std::vector<StoredName> rows{held(1, 7)};
    s.commit(rows, 7);
  }
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(p.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "UPDATE log SET epoch = -1; UPDATE names SET epoch = -1", nullptr, nullptr, nullptr),
              SQLITE_OK)
        << sqlite3_errmsg(db);
    sqlite3_close(db);
  }
  NameStore s(p.string());
  const StoredTable t = s.load();
  ASSERT_EQ(t.names.size(), 1u);
  EXPECT_GT(t.names[0].epoch, kEpochMax);
  try {
    test::CoreRig rig(1'000'000'000'000, t);
    ADD_FAILURE() << "lockd started on a store with epoch " << t.names[0].epoch;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("above the epoch limit"), std::string::npos) << e.what();
  }
}

TEST(NameStore, CompactionFoldsTheLogWithoutChangingContent) {
  TempDir dir;
  const auto p = dir.path() / "lockd.db";
  std::map<std::string, StoredName> expect;
  {
    NameStore s(p.string());
    std::mt19937 rng(11);
    for (int batch = 0; batch < 40; ++batch) {
      std::vector<StoredName> rows;
      for (int i = 0; i < 50; ++i) {
        const std::uint64_t k = rng() % 300;
        const Epoch e = (expect.count("svc/name-" + std::to_string(k)) ? expect["svc/name-" + std::to_string(k)].epoch : 0) + 1;
        StoredName n = held(k, e);
        if (rng() % 3 == 0) n.state = LockPhase::free;
        // within one batch a later change of the same name wins
        expect[n.name] = n;
        rows.push_back(n);
      }
      s.commit(rows, 1000);
      if (batch == 20) {
        const auto before = s.log_rows();
        EXPECT_EQ(s.compact(700), 700u);
        EXPECT_EQ(s.log_rows(), before - 700);
      }
    }
    auto loaded = s.load().names;
    ASSERT_EQ(loaded.size(), expect.size());
    for (const auto& n : loaded) EXPECT_EQ(n, expect[n.name]) << n.name;
    EXPECT_EQ(s.compact(1'000'000), s.log_rows() == 0 ? 0u : s.log_rows());
  }
  NameStore s(p.string());
  EXPECT_EQ(s.log_rows(), 0u);
  auto loaded = s.load().names;
  ASSERT_EQ(loaded.size(), expect.size());
  for (const auto& n : loaded) EXPECT_EQ(n, expect[n.name]) << n.name;
  // After a full compaction the log restarts; new changes still win over the table.
  std::vector<StoredName> one{expect.begin()->second};
  one[0].epoch += 5;
  s.commit(one);
  bool found = false;
  for (const auto& n : s.load().names)
    if (n.id == one[0].id) found = n.epoch == one[0].epoch;
  EXPECT_TRUE(found);
}

TEST(NameStore, RefusesNonDatabaseUntouched) {
  TempDir dir;
  const auto p = dir.path() / "lockd.db";
  write_bytes(p, std::string("this is a text file, not a database\n") + std::string(200, 'x'));
  const auto before = read_bytes(p);
  expect_refused(p, "not a SQLite database");
  EXPECT_EQ(read_bytes(p), before);
  EXPECT_FALSE(fs::exists(dir.path() / "lockd.db-wal"));
}

TEST(NameStore, RefusesForeignSqliteUntouched) {
  TempDir dir;
  const auto p = dir.path() / "other.db";
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(p.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE t(x); INSERT INTO t VALUES(1);", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  const auto before = read_bytes(p);
  expect_refused(p, "another application");
  EXPECT_EQ(read_bytes(p), before);
  EXPECT_FALSE(fs::exists(dir.path() / "other.db-wal"));
}

TEST(NameStore, RefusesNewerSchemaUntouched) {
  TempDir dir;
  const auto p = dir.path() / "lockd.db";
  { NameStore s(p.string()); }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(p.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "PRAGMA journal_mode=DELETE; PRAGMA user_version=99;", nullptr, nullptr,
                         nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  const auto before = read_bytes(p);
  expect_refused(p, "schema version 99");
  EXPECT_EQ(read_bytes(p), before);
}

// Version 2 added the worker a reservation is for (peer_worker). A version 1 store is upgraded in
// place when opened: its rows load (peer_worker nil), and new rows keep the worker.
TEST(NameStore, UpgradesAVersion1StoreAndKeepsTheReservationsWorker) {
  TempDir dir;
  const auto p = dir.path() / "lockd.db";
  {
    NameStore s(p.string());
    const std::vector<StoredName> rows{held(1, 4)};
    s.commit(rows);
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(p.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "PRAGMA journal_mode=DELETE; ALTER TABLE names DROP COLUMN peer_worker;"
                         " ALTER TABLE log DROP COLUMN peer_worker; PRAGMA user_version=1;",
                         nullptr, nullptr, nullptr),
            SQLITE_OK)
      << sqlite3_errmsg(db);
  sqlite3_close(db);
  StoredName reserved = held(2, 7);
  reserved.state = LockPhase::free;
  reserved.epoch_fresh = true;
  reserved.peer = SandboxId{0xB, 2};
  reserved.peer_worker = WorkerId{0x2, 0x22};
  {
    NameStore s(p.string());  // upgraded
    const StoredTable t = s.load();
    ASSERT_EQ(t.names.size(), 1u);
    EXPECT_EQ(t.names[0].epoch, 4u);
    EXPECT_TRUE(t.names[0].peer_worker.is_nil());
    const std::vector<StoredName> rows{reserved};
    s.commit(rows);
  }
  NameStore again(p.string());
  const StoredTable t = again.load();
  ASSERT_EQ(t.names.size(), 2u);
  const auto it = std::find_if(t.names.begin(), t.names.end(), [&](const StoredName& n) { return n.id == reserved.id; });
  ASSERT_NE(it, t.names.end());
  EXPECT_EQ(it->peer_worker, (WorkerId{0x2, 0x22}));
  EXPECT_EQ(it->peer, (SandboxId{0xB, 2}));
}

TEST(NameStore, RefusesCorruptUntouched) {
  TempDir dir;
  const auto p = dir.path() / "lockd.db";
  {
    NameStore s(p.string());
    std::vector<StoredName> rows;
    for (std::uint64_t k = 0; k < 2000; ++k) rows.push_back(held(k, 1));
    s.commit(rows);
  }  // close checkpoints the WAL into the main file
  auto bytes = read_bytes(p);
  ASSERT_GT(bytes.size(), 8u * 4096u);
  std::mt19937 rng(7);
  for (std::size_t i = 4096 * 2; i < bytes.size(); i += 97) bytes[i] = static_cast<char>(rng());
  write_bytes(p, bytes);
  expect_refused(p, "corrupt");
  EXPECT_EQ(read_bytes(p), bytes);
}

TEST(NameStore, RefusesSecondOpener) {
  TempDir dir;
  const auto p = dir.path() / "lockd.db";
  NameStore first(p.string());
  expect_refused(p, "another process");
}

int in_private_tmpfs(const fs::path& dir, const char* options, const std::function<int()>& body);

// Whether `dir`'s file system has room for the WAL to be written out (else the open skips it).
bool room_for_wal(const fs::path& dir) {
  const fs::space_info sp = fs::space(dir);
  return sp.available / kStoreWalRoomFactor >= kStoreWalBytes;
}

// Commits overwrite the WAL in place: the open writes it out to its cycle's size, a commit does
// not grow it, and a close keeps it.
TEST(NameStore, TheWalIsWrittenOutAtOpenAndKeptAtClose) {
  TempDir dir;
  if (!room_for_wal(dir.path())) GTEST_SKIP() << "too little free space here to write the WAL out";
  const auto p = dir.path() / "lockd.db";
  const std::string wal = p.string() + "-wal";
  {
    NameStore s(p.string());
    EXPECT_EQ(fs::file_size(wal), kStoreWalBytes);
    std::vector<StoredName> rows{held(1, 4), held(2, 5)};
    s.commit(rows, 5);
    EXPECT_EQ(fs::file_size(wal), kStoreWalBytes);
  }
  ASSERT_TRUE(fs::exists(wal));
  EXPECT_EQ(fs::file_size(wal), kStoreWalBytes);
  NameStore s(p.string());
  EXPECT_EQ(s.open_count(), 2u);
  EXPECT_EQ(fs::file_size(wal), kStoreWalBytes);
  const StoredTable t = s.load();
  ASSERT_EQ(t.names.size(), 2u);
  EXPECT_EQ(t.epoch_high_water, 5u);
}

// The zeros after the last frame are no frame: what a crash leaves (the store and its WAL as they
// are on disk while the store is open, copied elsewhere) opens with every committed row.
TEST(NameStore, ACrashCopyWithTheWrittenOutWalHasEveryCommit) {
  TempDir dir, copy;
  if (!room_for_wal(dir.path())) GTEST_SKIP() << "too little free space here to write the WAL out";
  const auto p = dir.path() / "lockd.db";
  NameStore s(p.string());
  std::vector<StoredName> rows;
  for (std::uint64_t k = 0; k < 100; ++k) {
    rows.assign(1, held(k, k + 1));
    s.commit(rows, k + 1);
  }
  fs::copy_file(p, copy.path() / "lockd.db");
  fs::copy_file(p.string() + "-wal", copy.path() / "lockd.db-wal");
  NameStore c((copy.path() / "lockd.db").string());
  const StoredTable t = c.load();
  EXPECT_EQ(t.names.size(), 100u);
  EXPECT_EQ(t.epoch_high_water, 100u);
  for (const StoredName& n : t.names) EXPECT_EQ(n.state, LockPhase::held) << n.name;
}

// Past a checkpoint the WAL is written from its start again: it never grows past its cycle's
// size, and every row is still there after a reopen.
TEST(NameStore, TheWalWrapsWithinItsWrittenOutSize) {
  TempDir dir;
  if (!room_for_wal(dir.path())) GTEST_SKIP() << "too little free space here to write the WAL out";
  const auto p = dir.path() / "lockd.db";
  const std::string wal = p.string() + "-wal";
  // Rows of ~1 KiB (long names): ~200 log pages a batch, more than one cycle in all.
  constexpr std::uint64_t kBatches = 24, kPerBatch = 800;
  const std::string padding(900, 'p');
  {
    NameStore s(p.string());
    std::vector<StoredName> rows;
    for (std::uint64_t b = 0; b < kBatches; ++b) {
      rows.clear();
      for (std::uint64_t k = 0; k < kPerBatch; ++k) {
        StoredName n = held(b * kPerBatch + k, b + 1);
        n.name += "/" + padding;
        n.id = name_id_of(n.name);
        rows.push_back(std::move(n));
      }
      s.commit(rows, b + 1);
      ASSERT_EQ(fs::file_size(wal), kStoreWalBytes) << "batch " << b;
    }
    // A checkpoint ran (the log's pages are in the store file): the WAL did wrap.
    EXPECT_GT(fs::file_size(p), std::uint64_t{kStoreWalCheckpointPages} * 4096 / 2);
  }
  NameStore s(p.string());
  const StoredTable t = s.load();
  EXPECT_EQ(t.names.size(), kBatches * kPerBatch);
  EXPECT_EQ(t.epoch_high_water, kBatches);
}

// Without room (a small or nearly full disk) the WAL is not written out: it grows as SQLite
// writes it.
TEST(NameStore, TheWalIsNotWrittenOutWithoutRoom) {
  TempDir dir;
  const int rc = in_private_tmpfs(dir.path(), "size=16m,mode=0700", [&]() -> int {
    const auto p = dir.path() / "lockd.db";
    NameStore s(p.string());
    std::vector<StoredName> rows{held(1, 5)};
    s.commit(rows, 5);
    return fs::file_size(p.string() + "-wal") < kStoreWalBytes ? 0 : 1;
  });
  if (rc == -1) GTEST_SKIP() << "cannot create a private mount namespace with a tmpfs here";
  EXPECT_EQ(rc, 0);
}

TEST(NameStore, FreshStoreOnRefusalIsRemoved) {
  const fs::path p = "/nonexistent-dir-for-lockd/lockd.db";
  expect_refused(p, "cannot create");
  EXPECT_FALSE(fs::exists(p));
}

// Runs `body` in a child in a private mount namespace with a tmpfs at `dir`; returns the
// child's exit code, or -1 when the namespace or mount is not permitted (the test skips).
int in_private_tmpfs(const fs::path& dir, const char* options, const std::function<int()>& body) {
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

// Exit codes of the child bodies below: 0 = refused as expected with the file unchanged.
TEST(NameStore, RefusesReadOnlyFileSystemUntouched) {
  TempDir dir;
  const int rc = in_private_tmpfs(dir.path(), "size=4m,mode=0700", [&]() -> int {
    const auto p = dir.path() / "lockd.db";
    {
      NameStore s(p.string());
      std::vector<StoredName> rows{held(1, 5)};
      s.commit(rows);
    }
    const auto before = read_bytes(p);
    if (::mount(nullptr, dir.path().c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr) != 0) return 100;
    try {
      NameStore s(p.string());
      return 1;  // opened: wrong
    } catch (const StoreError& e) {
      const std::string what = e.what();
      if (what.find("read-only") == std::string::npos) {
        fprintf(stderr, "unexpected message: %s\n", e.what());
        return 2;
      }
    }
    return read_bytes(p) == before ? 0 : 3;
  });
  if (rc == -1) GTEST_SKIP() << "cannot create a private mount namespace with a tmpfs here";
  EXPECT_EQ(rc, 0);
}

TEST(NameStore, RefusesFullDiskUntouched) {
  TempDir dir;
  const int rc = in_private_tmpfs(dir.path(), "size=1m,mode=0700", [&]() -> int {
    const auto p = dir.path() / "lockd.db";
    {
      NameStore s(p.string());
      std::vector<StoredName> rows{held(1, 5)};
      s.commit(rows);
    }
    const auto before = read_bytes(p);
    {  // fill the file system
      std::ofstream fill(dir.path() / "fill", std::ios::binary);
      const std::string chunk(4096, 'f');
      for (int i = 0; i < 1024 && fill.good(); ++i) fill.write(chunk.data(), chunk.size()), fill.flush();
    }
    try {
      NameStore s(p.string());
      return 1;
    } catch (const StoreError& e) {
      const std::string what = e.what();
      if (what.find("full") == std::string::npos) {
        fprintf(stderr, "unexpected message: %s\n", e.what());
        return 2;
      }
    }
    return read_bytes(p) == before ? 0 : 3;
  });
  if (rc == -1) GTEST_SKIP() << "cannot create a private mount namespace with a tmpfs here";
  EXPECT_EQ(rc, 0);
}

TEST(StoreThread, GroupCommitPublishesDurableSeq) {
  TempDir dir;
  const auto p = dir.path() / "lockd.db";
  const int efd = ::eventfd(0, EFD_CLOEXEC);
  ASSERT_GE(efd, 0);
  {
    StoreThread t(std::make_unique<NameStore>(p.string()), [efd] {
      const std::uint64_t one = 1;
      [[maybe_unused]] auto n = ::write(efd, &one, sizeof one);
    });
    std::vector<StoredName> b1{held(1, 1), held(2, 1)};
    ASSERT_TRUE(t.submit(b1, 1));
    EXPECT_TRUE(b1.empty());
    std::uint64_t woken = 0;
    ASSERT_EQ(::read(efd, &woken, sizeof woken), static_cast<ssize_t>(sizeof woken));
    while (t.durable_seq() < 1) ::usleep(100);
    std::vector<StoredName> b2{held(1, 2)};
    ASSERT_TRUE(t.submit(b2, 5));
    while (t.durable_seq() < 5) ASSERT_EQ(::read(efd, &woken, sizeof woken), 8);
    EXPECT_FALSE(t.failed());
    const auto st = t.stats();
    EXPECT_EQ(st.commits, 2u);
    EXPECT_EQ(st.changes, 3u);
    EXPECT_EQ(st.batch_changes_max, 2u);
    EXPECT_GT(st.commit_ns_p50, 0u);
  }
  ::close(efd);
  NameStore s(p.string());
  auto rows = s.load().names;
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& r : rows) EXPECT_EQ(r.epoch, r.name == "svc/name-1" ? 2u : 1u);
}

// Commits `total` held names through `t` in full batches and waits until they are durable;
// the last seq used.
std::uint64_t fill_log(StoreThread& t, std::size_t total) {
  std::uint64_t seq = 0;
  for (std::size_t k = 0; k < total;) {
    std::vector<StoredName> b;
    for (; k < total && b.size() < kStoreBatchChangesMax; ++k) b.push_back(held(k, 1));
    while (!t.submit(b, ++seq)) ::usleep(1000);
  }
  while (t.durable_seq() < seq) ::usleep(1000);
  return seq;
}

TEST(StoreThread, CompactsTheLogWhenIdle) {
  TempDir dir;
  const auto p = dir.path() / "lockd.db";
  StoreThread t(std::make_unique<NameStore>(p.string()), nullptr);
  const std::size_t total = kLogRowsCompactAt + 1000;
  fill_log(t, total);
  // Idle for kCompactIdleNs: one step folds kCompactRowsStep rows.
  for (int i = 0; i < 200 && t.stats().compactions == 0; ++i) ::usleep(20'000);
  const StoreStats st = t.stats();
  EXPECT_GE(st.compactions, 1u);
  EXPECT_LE(st.log_rows, total - kCompactRowsStep);
  EXPECT_FALSE(t.failed());
}

// lockd commits a lived checkpoint (a batch without changes) at most 100 ms apart while any
// lease is held: a store that sees only those is idle, and folds its log.
TEST(StoreThread, CompactsTheLogBetweenCheckpointsThatCarryNoChanges) {
  TempDir dir;
  const auto p = dir.path() / "lockd.db";
  StoreThread t(std::make_unique<NameStore>(p.string()), nullptr);
  const std::size_t total = kLogRowsCompactAt + 1000;
  std::uint64_t seq = fill_log(t, total);
  // Checkpoints every 20 ms, well inside kCompactIdleNs: the queue never stays empty that long.
  for (int i = 0; i < 250 && t.stats().compactions == 0; ++i) {
    std::vector<StoredName> none;
    while (!t.submit(none, ++seq)) ::usleep(1000);
    ::usleep(20'000);
  }
  const StoreStats st = t.stats();
  EXPECT_GE(st.compactions, 1u);
  EXPECT_LE(st.log_rows, total - kCompactRowsStep);
  EXPECT_FALSE(t.failed());
}

// The store thread's end of the durability path: batches arrive in seq order (durable_seq()
// reports that order), at most kStoreBatchChangesMax changes each. Fed a seq below the last
// batch's, or an oversized batch, it aborts in every build rather than report as durable a seq
// no commit covered.
TEST(StoreThreadDeathTest, ASeqBelowTheLastBatchOrAnOversizedBatchAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TempDir dir;
  const auto p = dir.path() / "lockd.db";
  EXPECT_DEATH(
      {
        StoreThread t(std::make_unique<NameStore>(p.string()), nullptr);
        std::vector<StoredName> b1{held(1, 10)};
        if (!t.submit(b1, 5)) std::_Exit(3);
        std::vector<StoredName> b2{held(2, 1)};
        t.submit(b2, 4);
      },
      "LEASEHOLD_ASSERT\\(b.last_seq >= last_seq_ .*\\) failed");
  EXPECT_DEATH(
      {
        StoreThread t(std::make_unique<NameStore>(p.string()), nullptr);
        std::vector<StoredName> big;
        for (std::size_t k = 0; k <= kStoreBatchChangesMax; ++k) big.push_back(held(k, 1));
        t.submit(big, 1);
      },
      "LEASEHOLD_ASSERT\\(b.changes.size\\(\\) <= kStoreBatchChangesMax\\) failed");
  StoreThread t(std::make_unique<NameStore>(p.string()), nullptr);
  std::vector<StoredName> b1{held(1, 10)};
  ASSERT_TRUE(t.submit(b1, 1));
  std::vector<StoredName> b2{held(2, 1)};
  while (!t.submit(b2, 2) && !t.failed()) ::usleep(100);  // in order: accepted once there is room
  while (t.durable_seq() < 2 && !t.failed()) ::usleep(100);
  EXPECT_EQ(t.durable_seq(), 2u) << t.failure();
}

// Every write past `bytes` of a file fails with EFBIG while it lives (RLIMIT_FSIZE, SIGXFSZ
// ignored): SQLite's commit then fails as on a full disk, without a mount namespace.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    EXPECT_EQ(::getrlimit(RLIMIT_FSIZE, &old_), 0);
    old_handler_ = ::signal(SIGXFSZ, SIG_IGN);
    rlimit r = old_;
    r.rlim_cur = bytes;
    EXPECT_EQ(::setrlimit(RLIMIT_FSIZE, &r), 0);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    ::signal(SIGXFSZ, old_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit old_{};
  sighandler_t old_handler_ = SIG_DFL;
};

TEST(StoreThread, FailedCommitIsReportedNotDurable) {
  TempDir dir;
  const auto p = dir.path() / "lockd.db";
  StoreThread t(std::make_unique<NameStore>(p.string()), nullptr);
  std::vector<StoredName> b1{held(1, 10)};
  ASSERT_TRUE(t.submit(b1, 1));
  while (t.durable_seq() < 1) ::usleep(100);
  {
    FileSizeLimit no_room(1);  // the next commit cannot write its log frames
    std::vector<StoredName> b2{held(2, 3)};
    ASSERT_TRUE(t.submit(b2, 2));
    while (!t.failed()) ::usleep(100);
  }
  EXPECT_EQ(t.durable_seq(), 1u);
  EXPECT_NE(t.failure().find("I/O error"), std::string::npos) << t.failure();
  std::vector<StoredName> more{held(2, 1)};
  EXPECT_FALSE(t.submit(more, 3));
  // As a DurabilityPort: seq 1 durable, then seq 2 failed with the cause, once.
  std::vector<DurabilityVerdict> v;
  t.poll(v);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].seq, 1u);
  EXPECT_EQ(v[0].kind, DurabilityVerdict::Kind::durable);
  EXPECT_EQ(v[1].seq, 2u);
  EXPECT_EQ(v[1].kind, DurabilityVerdict::Kind::failed);
  EXPECT_EQ(v[1].why, t.failure());
  v.clear();
  t.poll(v);
  EXPECT_TRUE(v.empty());
}

TEST(StoreThread, OneDurableVerdictPerSeqOfEachBatchInOrder) {
  TempDir dir;
  StoreThread t(std::make_unique<NameStore>((dir.path() / "lockd.db").string()), nullptr);
  // Seqs 1..3: two changes and a mark-only seq; seqs 4..4: a lived checkpoint (no change).
  DurableBatch a{1, 3, {held(1, 1), held(2, 1)}, StoreMarks{1, 5, {WorkerId{0, 9}}, {}, {}}, 1};
  ASSERT_TRUE(t.submit(std::move(a)));
  DurableBatch b{4, 4, {}, StoreMarks{1, 7, {}, {}, {}}, 1};
  ASSERT_TRUE(t.submit(std::move(b)));
  std::vector<DurabilityVerdict> v;
  while (v.size() < 4) {
    t.poll(v);
    ::usleep(100);
  }
  ASSERT_EQ(v.size(), 4u);
  for (std::size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(v[i].seq, i + 1);
    EXPECT_EQ(v[i].kind, DurabilityVerdict::Kind::durable);
    EXPECT_TRUE(v[i].why.empty());
  }
  EXPECT_EQ(t.durable_seq(), 4u);
  EXPECT_EQ(t.stats().changes, 2u);
}

/// A Store that refuses every commit from the `refuse_from`-th on, as etcd refuses the writes of
/// a lockd that no longer leads (a compare on the election key's revision that fails).
class RefusingStore final : public Store {
 public:
  explicit RefusingStore(int refuse_from) : refuse_from_(refuse_from) {}
  StoredTable load() const override { return {}; }
  void commit(std::span<const StoredName>, Epoch, const StoreMarks&) override {
    if (++commits_ >= refuse_from_) throw StoreRejected("test store: leadership moved on");
  }
  std::size_t compact(std::size_t) override { return 0; }
  std::uint64_t log_rows() const noexcept override { return 0; }
  std::uint64_t incarnation() const noexcept override { return 1; }
  std::string describe() const override { return "refusing test store"; }

 private:
  int refuse_from_;
  int commits_ = 0;
};

TEST(StoreThread, ARejectedCommitIsReportedRejectedWithTheBatchesBehindIt) {
  StoreThread t(std::make_unique<RefusingStore>(2), nullptr);
  ASSERT_TRUE(t.submit(DurableBatch{1, 2, {held(1, 1)}, {}, 1}));
  t.drain();
  ASSERT_TRUE(t.submit(DurableBatch{3, 3, {held(2, 1)}, {}, 1}));
  t.drain();
  EXPECT_TRUE(t.failed());
  EXPECT_FALSE(t.submit(DurableBatch{4, 4, {held(3, 1)}, {}, 1}));
  std::vector<DurabilityVerdict> v;
  t.poll(v);
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0].kind, DurabilityVerdict::Kind::durable);
  EXPECT_EQ(v[1].kind, DurabilityVerdict::Kind::durable);
  EXPECT_EQ(v[2].seq, 3u);
  EXPECT_EQ(v[2].kind, DurabilityVerdict::Kind::rejected);
  EXPECT_EQ(v[2].why, "test store: leadership moved on");
  EXPECT_EQ(t.durable_seq(), 2u);
}


// ---- the store's files are lockd's alone ----------------------------------------------------

mode_t mode_of(const fs::path& p) {
  struct stat st {};
  EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

/// Sets the process umask for the scope (the store must not depend on the caller's).
struct ScopedUmask {
  explicit ScopedUmask(mode_t m) : old(::umask(m)) {}
  ~ScopedUmask() { ::umask(old); }
  mode_t old;
};

/// A store at `p` with one held name at epoch `e`, open.
std::unique_ptr<NameStore> store_with_one_name(const fs::path& p, Epoch e) {
  auto s = std::make_unique<NameStore>(p.string());
  const StoredName rows[] = {held(1, e)};
  s->commit(rows, e);
  return s;
}

TEST(NameStoreFiles, StoreAndWalAre0600WhateverTheUmask) {
  ScopedUmask u(022);
  TempDir dir;
  const auto p = dir.path() / "lockd.db";
  {
    const auto s = store_with_one_name(p, 1);
    EXPECT_TRUE(s->modes_fixed().empty());
    EXPECT_EQ(mode_of(p), 0600u);
    ASSERT_TRUE(fs::exists(p.string() + "-wal"));
    EXPECT_EQ(mode_of(p.string() + "-wal"), 0600u);
  }
  // A process's umask is its own again after the open.
  const mode_t now = ::umask(022);
  EXPECT_EQ(now, 022u);
}

TEST(NameStoreFiles, ExistingFilesOthersCouldReadAreMade0600) {
  ScopedUmask u(022);
  TempDir dir;
  const auto p = dir.path() / "lockd.db";
  store_with_one_name(p, 3).reset();
  ASSERT_EQ(::chmod(p.c_str(), 0644), 0);
  if (fs::exists(p.string() + "-wal")) {
    ASSERT_EQ(::chmod((p.string() + "-wal").c_str(), 0666), 0);
  }
  NameStore s(p.string());
  EXPECT_EQ(mode_of(p), 0600u);
  ASSERT_FALSE(s.modes_fixed().empty());
  EXPECT_EQ(s.modes_fixed()[0], p.string() + " 0644->0600");
  EXPECT_EQ(s.load().names.size(), 1u);  // nothing lost
}

TEST(NameStoreFiles, RefusesADirectoryOthersOrItsGroupCanWrite) {
  for (const mode_t m : {mode_t{0777}, mode_t{01777}, mode_t{0770}, mode_t{0722}}) {
    TempDir dir;
    ASSERT_EQ(::chmod(dir.path().c_str(), m), 0);
    const auto p = dir.path() / "lockd.db";
    const std::string err = expect_refused(p, "its directory " + dir.path().string());
    EXPECT_NE(err.find("chmod go-w " + dir.path().string()), std::string::npos) << err;
    EXPECT_NE(err.find((m & S_IWOTH) != 0 ? "writable by others" : "writable by its group"), std::string::npos) << err;
    EXPECT_FALSE(fs::exists(p));  // nothing created
    ::chmod(dir.path().c_str(), 0700);
    NameStore ok(p.string());  // the fix named works
  }
}

TEST(NameStoreFiles, RefusesASymlinkedWalOrAFileOfAnotherUid) {
  TempDir dir;
  const auto p = dir.path() / "lockd.db";
  { NameStore s(p.string()); }
  fs::remove(p.string() + "-wal");
  fs::create_symlink(dir.path() / "elsewhere", p.string() + "-wal");
  expect_refused(p, p.string() + "-wal is not a regular file");
  fs::remove(p.string() + "-wal");
  if (::geteuid() != 0) GTEST_SKIP() << "a file of another uid needs root to make (chown)";
  ASSERT_EQ(::chown(p.c_str(), 65534, 65534), 0);
  const std::string err = expect_refused(p, "is owned by uid 65534, not lockd's uid 0");
  EXPECT_NE(err.find("fix: chown 0 " + p.string()), std::string::npos) << err;
}

TEST(NameStoreFiles, WithoutPrivateFilesTheUmaskDecides) {  // the store-mode ablation
  ScopedUmask u(022);
  TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0777), 0);
  const auto p = dir.path() / "lockd.db";
  StoreOptions o;
  o.private_files = false;
  NameStore s(p.string(), o);
  EXPECT_EQ(mode_of(p), 0644u);
}

}  // namespace
}  // namespace leasehold::lockd
