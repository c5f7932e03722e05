// FencedStore: the fencing rule over SQLite, the audit table, bad input, and two processes
// writing to one file.
#include "leasehold/resource/fenced_store.hpp"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace leasehold::resource {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/fenced-store-test-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const char* name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

const SandboxId kA{0xa1, 0x4000000000000001ULL};
const SandboxId kB{0xb2, 0x4000000000000002ULL};

std::unique_ptr<FencedStore> open_ok(const std::string& path) {
  StoreOptions o;
  o.durable = false;
  auto s = FencedStore::open(path, o);
  EXPECT_TRUE(s.ok()) << s.message();
  return s ? std::move(s).value() : nullptr;
}

TEST(FencedStore, StaleEpochIsRejectedEqualAcceptedHigherAdvances) {
  TempDir dir;
  auto s = open_ok(dir.file("r.db"));
  ASSERT_NE(s, nullptr);
  const WriteResult first = s->write({"orders", 41, kA}, "a1");
  EXPECT_EQ(first.verdict, Verdict::accepted);
  EXPECT_EQ(first.highest, 41u);
  EXPECT_EQ(first.reason, "");

  const WriteResult equal = s->write({"orders", 41, kA}, "a2");
  EXPECT_EQ(equal.verdict, Verdict::accepted);
  EXPECT_EQ(equal.highest, 41u);

  const WriteResult higher = s->write({"orders", 42, kB}, "b1");
  EXPECT_EQ(higher.verdict, Verdict::accepted);
  EXPECT_EQ(higher.highest, 42u);
  EXPECT_EQ(s->highest("orders"), 42u);

  const WriteResult stale = s->write({"orders", 41, kA}, "a3");
  EXPECT_EQ(stale.verdict, Verdict::stale);
  EXPECT_EQ(stale.highest, 42u);
  EXPECT_EQ(stale.reason, "stale epoch 41 < highest seen 42");
  EXPECT_EQ(s->records("orders"), 3);

  // Another name has its own fence.
  EXPECT_EQ(s->write({"billing", 1, kA}, "x").verdict, Verdict::accepted);
  EXPECT_EQ(s->highest("billing"), 1u);
  EXPECT_EQ(s->highest("orders"), 42u);
}

TEST(FencedStore, EveryWriteLeavesOneAuditRowInOrder) {
  TempDir dir;
  auto s = open_ok(dir.file("r.db"));
  ASSERT_NE(s, nullptr);
  s->write({"orders", 5, kA}, "p1");
  s->write({"orders", 6, kB}, "p2");
  s->write({"orders", 5, kA}, "p3");
  const auto rows = s->audit("orders").value();
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].verdict, Verdict::accepted);
  EXPECT_EQ(rows[0].epoch, 5u);
  EXPECT_EQ(rows[0].holder, kA.str());
  EXPECT_EQ(rows[0].payload, "p1");
  EXPECT_EQ(rows[0].reason, "");
  EXPECT_EQ(rows[1].verdict, Verdict::accepted);
  EXPECT_EQ(rows[1].holder, kB.str());
  EXPECT_EQ(rows[2].verdict, Verdict::stale);
  EXPECT_EQ(rows[2].payload, "p3");
  EXPECT_EQ(rows[2].reason, "stale epoch 5 < highest seen 6");
  EXPECT_LT(rows[0].id, rows[1].id);
  EXPECT_LE(rows[0].time_ns, rows[1].time_ns);
  EXPECT_LE(rows[1].time_ns, rows[2].time_ns);
  EXPECT_GT(rows[0].time_ns, 0);
}

// The audit table keeps each verdict as the text it always had (files written by earlier builds
// read the same), and audit() reads the text back through the one table of verdicts.
TEST(FencedStore, AuditVerdictsAreStoredAsTheirTextAndReadBack) {
  TempDir dir;
  const std::string path = dir.file("r.db");
  {
    auto s = open_ok(path);
    ASSERT_NE(s, nullptr);
    ASSERT_TRUE(s->write({"orders", 5, kA}, "a").accepted());
    ASSERT_EQ(s->write({"orders", 0, kA}, "x").verdict, Verdict::invalid);
    ASSERT_TRUE(s->advance_fence("orders", 6, "revoke").accepted());
    ASSERT_EQ(s->write({"orders", 5, kA}, "late").verdict, Verdict::stale);
    const auto rows = s->audit("orders").value();
    ASSERT_EQ(rows.size(), 4u);
    EXPECT_EQ(rows[0].verdict, Verdict::accepted);
    EXPECT_EQ(rows[1].verdict, Verdict::invalid);
    EXPECT_EQ(rows[2].verdict, Verdict::fence);
    EXPECT_EQ(rows[3].verdict, Verdict::stale);
    EXPECT_EQ(s->tally("orders", 5, Verdict::accepted).rows, 1);
    EXPECT_EQ(s->tally("orders", 5, Verdict::stale).rows, 1);
    EXPECT_EQ(s->tally("orders", 6, Verdict::fence).rows, 1);
    EXPECT_EQ(s->tally("orders", 5, Verdict::forged).rows, 0);
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* q = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT verdict FROM audit ORDER BY id", -1, &q, nullptr), SQLITE_OK);
  std::vector<std::string> stored;
  while (sqlite3_step(q) == SQLITE_ROW) stored.emplace_back(reinterpret_cast<const char*>(sqlite3_column_text(q, 0)));
  sqlite3_finalize(q);
  sqlite3_close(db);
  EXPECT_EQ(stored, (std::vector<std::string>{"accepted", "invalid", "fence", "stale"}));
}

// A verdict text no Verdict has (another program's row, a damaged file) is not guessed at:
// audit() refuses the whole read as corrupt, naming the row, the text and the file.
TEST(FencedStore, AnUnknownStoredVerdictIsCorrupt) {
  TempDir dir;
  const std::string path = dir.file("r.db");
  auto s = open_ok(path);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->write({"orders", 5, kA}, "a").accepted());
  for (const char* text : {"Accepted", "accepted ", "unknown", ""}) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    sqlite3_stmt* q = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(db, "UPDATE audit SET verdict = ?1 WHERE id = 1", -1, &q, nullptr), SQLITE_OK);
    sqlite3_bind_text(q, 1, text, -1, SQLITE_TRANSIENT);
    ASSERT_EQ(sqlite3_step(q), SQLITE_DONE);
    sqlite3_finalize(q);
    sqlite3_close(db);
    const auto rows = s->audit("orders");
    ASSERT_FALSE(rows.ok()) << text;
    EXPECT_EQ(rows.code(), Errc::corrupt);
    EXPECT_NE(rows.message().find("audit row 1 of " + path), std::string::npos) << rows.message();
    EXPECT_NE(rows.message().find("verdict \"" + std::string(text) + "\""), std::string::npos) << rows.message();
    EXPECT_NE(rows.message().find("(accepted, stale, invalid, error, forged, fence)"), std::string::npos)
        << rows.message();
  }
}

TEST(Verdict, TextReadsBackThroughTheOneTable) {
  for (const Verdict v : kVerdicts) EXPECT_EQ(verdict_of(to_string(v)), v) << to_string(v);
  EXPECT_EQ(to_string(Verdict::fence), "fence");
  EXPECT_EQ(to_string(Verdict::stale), "stale");
  EXPECT_EQ(verdict_of("unknown"), std::nullopt);
  EXPECT_EQ(verdict_of("Stale"), std::nullopt);
  EXPECT_EQ(to_string(static_cast<Verdict>(200)), "unknown");
}

TEST(FencedStore, AdvanceFenceRejectsTheOldHolderBeforeTheNewOneWrites) {
  TempDir dir;
  auto s = open_ok(dir.file("r.db"));
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->write({"orders", 7, kA}, "a").accepted());
  const WriteResult f = s->advance_fence("orders", 8, "transfer begin");
  EXPECT_EQ(f.verdict, Verdict::accepted);
  EXPECT_EQ(f.highest, 8u);
  EXPECT_EQ(s->write({"orders", 7, kA}, "late").verdict, Verdict::stale);
  // Announcing a lower epoch never lowers the fence.
  EXPECT_EQ(s->advance_fence("orders", 3, "old news").highest, 8u);
  EXPECT_EQ(s->write({"orders", 8, kB}, "b").verdict, Verdict::accepted);
  const auto rows = s->audit("orders").value();
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_EQ(rows[1].verdict, Verdict::fence);
  EXPECT_EQ(rows[1].reason, "operator fence raise: transfer begin (fence 7 -> 8)");
  EXPECT_EQ(rows[3].verdict, Verdict::fence);
  EXPECT_EQ(rows[3].reason, "operator fence raise: old news (fence already at 8)");
}

TEST(FencedStore, BadInputIsRejectedAndAudited) {
  TempDir dir;
  auto s = open_ok(dir.file("r.db"));
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->write({"orders", 0, kA}, "x").verdict, Verdict::invalid);
  EXPECT_EQ(s->write({"bad name!", 3, kA}, "x").verdict, Verdict::invalid);
  EXPECT_EQ(s->write({"", 3, kA}, "x").verdict, Verdict::invalid);
  EXPECT_EQ(s->write({"orders", 3, SandboxId{}}, "x").verdict, Verdict::invalid);
  EXPECT_EQ(s->write({"orders", kStoreEpochMax + 1, kA}, "x").verdict, Verdict::invalid);
  const WriteResult big = s->write({"orders", 3, kA}, std::string(kPayloadBytesMax + 1, 'z'));
  EXPECT_EQ(big.verdict, Verdict::invalid);
  EXPECT_NE(big.reason.find("limit 4096"), std::string::npos) << big.reason;
  EXPECT_EQ(s->highest("orders"), 0u);  // nothing invalid moved the fence
  EXPECT_EQ(s->records("orders"), 0);
  const auto rows = s->audit().value();
  ASSERT_EQ(rows.size(), 6u);
  for (const auto& r : rows) EXPECT_EQ(r.verdict, Verdict::invalid);
  EXPECT_EQ(rows[5].payload.size(), 64u);  // oversized payloads are cut in the audit
  EXPECT_EQ(s->advance_fence("orders", 0, "x").verdict, Verdict::invalid);
}

TEST(FencedStore, RefusesAForeignDatabaseAndANonDatabase) {
  TempDir dir;
  {
    std::ofstream(dir.file("text.db")) << "this is not a database, just some text to fill a page";
  }
  const auto text = FencedStore::open(dir.file("text.db"));
  EXPECT_EQ(text.code(), Errc::corrupt);
  EXPECT_NE(text.message().find("not a SQLite database"), std::string::npos) << text.message();

  // A SQLite file of some other application.
  {
    auto s = open_ok(dir.file("ok.db"));  // ours, fine
    ASSERT_NE(s, nullptr);
  }
  const std::string foreign = dir.file("foreign.db");
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(foreign.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE t(x)", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  const auto other = FencedStore::open(foreign);
  EXPECT_EQ(other.code(), Errc::corrupt);
  EXPECT_NE(other.message().find("another application"), std::string::npos) << other.message();
  const auto empty = FencedStore::open("");
  EXPECT_EQ(empty.code(), Errc::invalid_argument);
  EXPECT_NE(empty.message().find("empty database path"), std::string::npos) << empty.message();
  const auto nowhere = FencedStore::open(dir.file("no/such/dir/x.db"));
  EXPECT_EQ(nowhere.code(), Errc::io_error);
  EXPECT_NE(nowhere.message().find("cannot open"), std::string::npos) << nowhere.message();
}

TEST(FencedStore, ReopenKeepsTheFence) {
  TempDir dir;
  {
    auto s = open_ok(dir.file("r.db"));
    ASSERT_NE(s, nullptr);
    ASSERT_TRUE(s->write({"orders", 9, kA}, "a").accepted());
  }
  auto s = open_ok(dir.file("r.db"));
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->highest("orders"), 9u);
  EXPECT_EQ(s->write({"orders", 8, kB}, "b").verdict, Verdict::stale);
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(FencedStore, ReadOnlyOpenChangesNothingAndCannotWrite) {
  TempDir dir;
  const std::string path = dir.file("evidence.db");
  {
    auto s = open_ok(path);
    ASSERT_NE(s, nullptr);
    ASSERT_TRUE(s->write({"orders", 3, kA}, "a").accepted());
    ASSERT_EQ(s->write({"orders", 2, kB}, "b").verdict, Verdict::stale);
  }  // the last connection closes: the log is checkpointed and removed
  ASSERT_FALSE(fs::exists(path + "-wal"));
  const std::string before = bytes_of(path);
  auto opened = FencedStore::open_read_only(path);
  ASSERT_TRUE(opened.ok()) << opened.message();
  auto ro = std::move(opened).value();
  EXPECT_EQ(ro->highest("orders"), 3u);
  EXPECT_EQ(ro->audit("orders").value().size(), 2u);
  EXPECT_EQ(ro->names(), std::vector<std::string>{"orders"});
  const WriteResult w = ro->write({"orders", 4, kA}, "c");
  EXPECT_EQ(w.verdict, Verdict::error);
  EXPECT_NE(w.reason.find("read-only"), std::string::npos) << w.reason;
  EXPECT_EQ(ro->advance_fence("orders", 9, "x").verdict, Verdict::error);
  ro.reset();
  EXPECT_EQ(bytes_of(path), before) << "the file changed";
  EXPECT_FALSE(fs::exists(path + "-wal"));
  EXPECT_FALSE(fs::exists(path + "-shm"));
}

TEST(FencedStore, ReadOnlyOpenSeesWritesStillInTheLog) {
  TempDir dir;
  const std::string path = dir.file("live.db");
  StoreOptions o;
  o.durable = false;
  o.checkpoint_pages = 0;  // everything stays in the write-ahead log
  auto writer_opened = FencedStore::open(path, o);
  ASSERT_TRUE(writer_opened.ok()) << writer_opened.message();
  auto writer = std::move(writer_opened).value();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(writer->write({"orders", 1, kA}, "w").accepted());
  auto opened = FencedStore::open_read_only(path);
  ASSERT_TRUE(opened.ok()) << opened.message();
  auto ro = std::move(opened).value();
  EXPECT_EQ(ro->records("orders"), 5);
  ASSERT_TRUE(writer->write({"orders", 1, kA}, "w").accepted());
  EXPECT_EQ(ro->records("orders"), 6) << "a live store is read as it grows";
}

// open_read_only(path) fails with a message containing `text`.
#define EXPECT_REFUSED(path, text)                                                   \
  do {                                                                               \
    const auto refused = FencedStore::open_read_only(path);                          \
    EXPECT_FALSE(refused.ok()) << (path);                                            \
    EXPECT_NE(refused.message().find(text), std::string::npos) << refused.message(); \
  } while (0)

TEST(FencedStore, ReadOnlyOpenRefusesWhatIsNotAFencedStore) {
  TempDir dir;
  { std::ofstream(dir.file("empty.db")); }
  EXPECT_REFUSED(dir.file("empty.db"), "not a fenced store: the file is empty");
  EXPECT_EQ(fs::file_size(dir.file("empty.db")), 0u) << "no schema was created";
  { std::ofstream(dir.file("text.db")) << "this is not a database, just some text to fill a page"; }
  EXPECT_REFUSED(dir.file("text.db"), "not a fenced store: not a SQLite database");
  const std::string foreign = dir.file("foreign.db");
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(foreign.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE t(x)", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  EXPECT_REFUSED(foreign, "not a fenced store: holds another application's data");
  EXPECT_REFUSED(dir.file("missing.db"), "cannot open");
  EXPECT_FALSE(fs::exists(dir.file("missing.db"))) << "nothing was created";
}

// A writer that must not pause for checkpoints leaves them to another connection.
TEST(FencedStore, CheckpointsCanBeLeftToAnotherConnection) {
  TempDir dir;
  const std::string path = dir.file("r.db");
  StoreOptions o;
  o.durable = false;
  o.checkpoint_pages = 0;
  auto writer_opened = FencedStore::open(path, o);
  ASSERT_TRUE(writer_opened.ok()) << writer_opened.message();
  auto writer = std::move(writer_opened).value();
  std::uintmax_t wal_bytes = 0;
  for (int i = 0; i < 50; ++i) {
    const WriteResult r = writer->write({"orders", 1, kA}, std::string(512, 'x'));
    ASSERT_TRUE(r.accepted());
    EXPECT_EQ(r.checkpoint_ns, 0);
    const std::uintmax_t now = fs::file_size(path + "-wal");
    EXPECT_GE(now, wal_bytes) << "write " << i << ": the log only grows";
    wal_bytes = now;
  }
  auto other_opened = FencedStore::open(path, o);
  ASSERT_TRUE(other_opened.ok()) << other_opened.message();
  auto other = std::move(other_opened).value();
  const CheckpointResult c = other->checkpoint();
  ASSERT_TRUE(c.ok) << c.error;
  EXPECT_GT(c.wal_pages, 50);
  EXPECT_EQ(c.copied_pages, c.wal_pages);

  // With a threshold of one page, every commit checkpoints, and says so.
  StoreOptions eager = o;
  eager.checkpoint_pages = 1;
  auto eager_writer_opened = FencedStore::open(path, eager);
  ASSERT_TRUE(eager_writer_opened.ok()) << eager_writer_opened.message();
  auto eager_writer = std::move(eager_writer_opened).value();
  const WriteResult r = eager_writer->write({"orders", 1, kA}, "y");
  ASSERT_TRUE(r.accepted());
  EXPECT_GT(r.checkpoint_ns, 0);
  EXPECT_GE(r.took_ns, r.checkpoint_ns + r.lock_wait_ns);
}

// Time spent waiting for another writer's lock is reported as such.
TEST(FencedStore, LockWaitIsReported) {
  TempDir dir;
  const std::string path = dir.file("r.db");
  StoreOptions o;
  o.durable = false;
  o.busy_timeout_ms = 20;
  auto s_opened = FencedStore::open(path, o);
  ASSERT_TRUE(s_opened.ok()) << s_opened.message();
  auto s = std::move(s_opened).value();
  ASSERT_TRUE(s->write({"orders", 1, kA}, "a").accepted());
  EXPECT_EQ(s->write({"orders", 1, kA}, "b").lock_wait_ns, 0) << "nobody else writes";
  sqlite3* holder = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &holder), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(holder, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  const WriteResult blocked = s->write({"orders", 1, kA}, "c");  // the lock stays taken throughout
  EXPECT_EQ(blocked.verdict, Verdict::error);
  EXPECT_NE(blocked.reason.find("locked"), std::string::npos) << blocked.reason;
  EXPECT_GT(blocked.lock_wait_ns, 0);
  EXPECT_GE(blocked.took_ns, blocked.lock_wait_ns);
  ASSERT_EQ(sqlite3_exec(holder, "COMMIT", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(holder);
  EXPECT_TRUE(s->write({"orders", 1, kA}, "d").accepted());
}

// Two processes, one file: the fence lives in the database, so a process that never saw
// epoch 2 itself still has its epoch-1 writes rejected once the other process wrote epoch 2.
TEST(FencedStore, TwoProcessesShareTheFence) {
  TempDir dir;
  const std::string path = dir.file("shared.db");
  { ASSERT_NE(open_ok(path), nullptr); }
  constexpr int kWrites = 200;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto opened = FencedStore::open(path);
    if (!opened) ::_exit(10);
    const auto s = std::move(opened).value();
    for (int i = 0; i < kWrites; ++i) {
      // The old holder keeps writing with epoch 1 the whole time.
      if (s->write({"orders", 1, kA}, "old-" + std::to_string(i)).verdict == Verdict::error) ::_exit(11);
    }
    ::_exit(0);
  }
  auto s_opened = FencedStore::open(path);
  ASSERT_TRUE(s_opened.ok()) << s_opened.message();
  auto s = std::move(s_opened).value();
  for (int i = 0; i < kWrites; ++i) {
    const Epoch e = i < kWrites / 4 ? 1 : 2;  // the new holder takes over a quarter of the way in
    ASSERT_NE(s->write({"orders", e, e == 1 ? kA : kB}, "new-" + std::to_string(i)).verdict,
              Verdict::error);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);

  const auto rows = s->audit("orders").value();
  ASSERT_EQ(rows.size(), 2u * kWrites);
  bool seen_two = false;
  std::size_t stale = 0;
  for (const auto& r : rows) {
    if (r.verdict == Verdict::accepted && r.epoch == 2) seen_two = true;
    if (seen_two && r.epoch == 1) {
      EXPECT_EQ(r.verdict, Verdict::stale) << "row " << r.id;
      ++stale;
    }
  }
  EXPECT_TRUE(seen_two);
  const AuditReport rep = check_audit(rows);
  EXPECT_TRUE(rep.ok()) << (rep.violations.empty() ? "" : rep.violations[0]);
  EXPECT_EQ(rep.accepted + rep.rejected, 2u * kWrites);
  EXPECT_EQ(rep.rejected, stale);
}

// ---- check_audit on hand-made audits: each rule can fail -------------------------------------

AuditRow row(std::int64_t id, std::int64_t t, Epoch e, const SandboxId& h, Verdict verdict) {
  AuditRow r;
  r.id = id;
  r.time_ns = t;
  r.name = "orders";
  r.epoch = e;
  r.holder = h.str();
  r.verdict = verdict;
  return r;
}

TEST(CheckAudit, CleanAuditPasses) {
  const std::vector<AuditRow> rows{row(1, 10, 1, kA, Verdict::accepted), row(2, 20, 1, kA, Verdict::accepted),
                                   row(3, 30, 2, kB, Verdict::fence),    row(4, 40, 1, kA, Verdict::stale),
                                   row(5, 50, 2, kB, Verdict::accepted)};
  const AuditReport rep = check_audit(rows);
  EXPECT_TRUE(rep.ok());
  EXPECT_EQ(rep.accepted, 3u);
  EXPECT_EQ(rep.rejected, 1u);
  EXPECT_EQ(rep.fences, 1u);
  ASSERT_EQ(rep.epochs.size(), 2u);
  EXPECT_EQ(rep.epochs[0].epoch, 1u);
  EXPECT_EQ(rep.epochs[0].accepted, 2u);
  EXPECT_EQ(rep.epochs[0].rejected, 1u);
  EXPECT_EQ(rep.epochs[0].first_ns, 10);
  EXPECT_EQ(rep.epochs[0].last_ns, 20);
  EXPECT_EQ(rep.epochs[1].accepted, 1u);
  ASSERT_EQ(rep.rejected_rows.size(), 1u);
  EXPECT_EQ(rep.rejected_rows[0].id, 4);
}

TEST(CheckAudit, EpochGoingBackwardsIsAViolation) {
  const AuditReport rep = check_audit({row(1, 10, 2, kB, Verdict::accepted), row(2, 20, 1, kA, Verdict::accepted)});
  ASSERT_FALSE(rep.ok());
  EXPECT_NE(rep.violations[0].find("epochs went backwards"), std::string::npos) << rep.violations[0];
}

TEST(CheckAudit, OverlappingEpochsAreAViolation) {
  // Epoch 1's last write (time 30) comes after epoch 2's first (time 20): the time ranges
  // overlap even though acceptance order alone would not show it.
  const AuditReport rep = check_audit({row(1, 10, 1, kA, Verdict::accepted), row(2, 20, 2, kB, Verdict::accepted),
                                       row(3, 30, 2, kB, Verdict::accepted), row(4, 15, 1, kA, Verdict::stale)});
  EXPECT_TRUE(rep.ok());
  const AuditReport bad = check_audit({row(1, 10, 1, kA, Verdict::accepted), row(2, 20, 2, kB, Verdict::accepted),
                                       row(3, 30, 1, kA, Verdict::accepted)});
  ASSERT_FALSE(bad.ok());
  bool overlap = false;
  for (const auto& v : bad.violations) overlap = overlap || v.find("overlap") != std::string::npos;
  EXPECT_TRUE(overlap);
}

TEST(CheckAudit, TwoHoldersAtOneEpochAndWritesBelowAFenceAreViolations) {
  const AuditReport two = check_audit({row(1, 10, 3, kA, Verdict::accepted), row(2, 20, 3, kB, Verdict::accepted)});
  ASSERT_EQ(two.violations.size(), 1u);
  EXPECT_NE(two.violations[0].find("2 different holders"), std::string::npos);
  const AuditReport below = check_audit({row(1, 10, 4, kB, Verdict::fence), row(2, 20, 3, kA, Verdict::accepted)});
  ASSERT_EQ(below.violations.size(), 1u);
  EXPECT_NE(below.violations[0].find("below the fence 4"), std::string::npos) << below.violations[0];
}

}  // namespace
}  // namespace leasehold::resource
