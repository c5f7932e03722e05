// leasehold/resource: FencedStore (see fenced_store.hpp).
#include "leasehold/resource/fenced_store.hpp"

#include "leasehold/lease/assert.hpp"
#include "leasehold/lease/clock.hpp"

#include <sqlite3.h>

#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <map>
#include <utility>

namespace leasehold::resource {
namespace {

/// PRAGMA application_id of a FencedStore file ("LHRS"): a file with another id is refused.
constexpr std::int32_t kApplicationId = 0x4C485253;
/// Schema version (PRAGMA user_version).
constexpr int kSchemaVersion = 1;
/// Longest name text kept in an audit row of an invalid token (the token is shown, cut).
constexpr std::size_t kAuditNameBytesMax = 2 * kNameBytesMax;
/// Payload bytes kept in the audit row of an oversized write.
constexpr std::size_t kAuditOversizeBytesKept = 64;
/// Sleeps of the busy handler while another connection holds the lock, ms (SQLite's own
/// schedule in sqliteDefaultBusyCallback); the last one repeats until the busy timeout.
constexpr int kBusySleepsMs[] = {1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100};

const char* kSchema =
    "CREATE TABLE IF NOT EXISTS fence("
    "  name TEXT PRIMARY KEY, epoch INTEGER NOT NULL) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS records("
    "  id INTEGER PRIMARY KEY, time_ns INTEGER NOT NULL, name TEXT NOT NULL,"
    "  epoch INTEGER NOT NULL, holder TEXT NOT NULL, payload BLOB NOT NULL);"
    "CREATE TABLE IF NOT EXISTS audit("
    "  id INTEGER PRIMARY KEY, time_ns INTEGER NOT NULL, name TEXT NOT NULL,"
    "  epoch INTEGER NOT NULL, holder TEXT NOT NULL, payload BLOB NOT NULL,"
    "  verdict TEXT NOT NULL, reason TEXT NOT NULL);"
    "CREATE INDEX IF NOT EXISTS audit_by_name ON audit(name, id);";

std::string errmsg(sqlite3* db) { return db != nullptr ? sqlite3_errmsg(db) : "out of memory"; }

}  // namespace

struct FencedStore::Statements {
  sqlite3_stmt* begin = nullptr;
  sqlite3_stmt* commit = nullptr;
  sqlite3_stmt* rollback = nullptr;
  sqlite3_stmt* highest = nullptr;
  sqlite3_stmt* raise = nullptr;
  sqlite3_stmt* append = nullptr;
  sqlite3_stmt* audit = nullptr;
  sqlite3_stmt* count = nullptr;
  ~Statements() {
    for (sqlite3_stmt* s : {begin, commit, rollback, highest, raise, append, audit, count})
      sqlite3_finalize(s);
  }
};

Result<std::unique_ptr<FencedStore>> FencedStore::open(const std::string& path, const StoreOptions& options) {
  return open_impl(path, options, /*read_only=*/false);
}

Result<std::unique_ptr<FencedStore>> FencedStore::open_read_only(const std::string& path) {
  return open_impl(path, StoreOptions{}, /*read_only=*/true);
}

namespace {
/// `path` as a SQLite URI ("file:" + path, with the bytes URIs reserve percent-encoded).
std::string file_uri(const std::string& path, const char* query) {
  std::string uri = "file:";
  for (const char c : path) {
    if (c == '%' || c == '?' || c == '#') {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", static_cast<unsigned char>(c));
      uri += buf;
    } else {
      uri += c;
    }
  }
  return uri + "?" + query;
}
}  // namespace

Result<std::unique_ptr<FencedStore>> FencedStore::open_impl(const std::string& path, const StoreOptions& options,
                                                            bool read_only) {
  if (path.empty()) return Status{Errc::invalid_argument, "fenced store: empty database path"};
  sqlite3* db = nullptr;
  int rc = SQLITE_OK;
  if (!read_only) {
    rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                         nullptr);
  } else {
    // Nothing may change, not even on a copy kept as evidence or on a read-only mount. With no
    // write-ahead log next to it the file holds every committed write: open it immutable (no
    // locks, no -shm or -wal created). With a log (a live store, or a copy taken with its
    // log), SQLite must read the log, which needs its -shm index: read-only mode.
    struct stat wal {};
    const bool has_wal = ::stat((path + "-wal").c_str(), &wal) == 0 && wal.st_size > 0;
    rc = sqlite3_open_v2(file_uri(path, has_wal ? "mode=ro" : "mode=ro&immutable=1").c_str(), &db,
                         SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX, nullptr);
  }
  auto fail = [&](Errc code, const std::string& what) {
    sqlite3_close(db);
    return Status{code, "fenced store " + path + ": " + what};
  };
  if (rc != SQLITE_OK) return fail(Errc::io_error, "cannot open: " + errmsg(db));
  sqlite3_busy_timeout(db, std::clamp(options.busy_timeout_ms, 1, 600'000));
  sqlite3_extended_result_codes(db, 1);

  int last_rc = SQLITE_OK;  // of the last scalar() that failed: a lock is not a foreign file
  auto scalar = [&](const char* sql, std::int64_t& out) -> bool {
    sqlite3_stmt* s = nullptr;
    if (const int prc = sqlite3_prepare_v2(db, sql, -1, &s, nullptr); prc != SQLITE_OK) {
      last_rc = prc;
      return false;
    }
    const int step = sqlite3_step(s);
    out = step == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
    sqlite3_finalize(s);
    if (step != SQLITE_ROW && step != SQLITE_DONE) last_rc = step;
    return step == SQLITE_ROW || step == SQLITE_DONE;
  };
  auto locked = [&] { return (last_rc & 0xFF) == SQLITE_BUSY || (last_rc & 0xFF) == SQLITE_LOCKED; };
  const std::string not_fenced = read_only ? "not a fenced store: " : "";
  std::int64_t app_id = 0;
  if (!scalar("PRAGMA application_id", app_id)) {
    if (locked())
      return fail(Errc::busy, "locked by another connection for longer than " +
                                  std::to_string(std::clamp(options.busy_timeout_ms, 1, 600'000)) + " ms (" +
                                  errmsg(db) + "); retry once it lets go, or check a copy");
    return fail(Errc::corrupt, not_fenced + "not a SQLite database (" + errmsg(db) + ")");
  }
  std::int64_t tables = 0;
  if (!scalar("SELECT count(*) FROM sqlite_schema WHERE type = 'table'", tables))
    return fail(Errc::corrupt, "cannot read the schema: " + errmsg(db));
  if (read_only && app_id != kApplicationId) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && st.st_size == 0) return fail(Errc::corrupt, not_fenced + "the file is empty");
    if (app_id == 0 && tables == 0) return fail(Errc::corrupt, not_fenced + "a SQLite database without tables");
  }
  if (app_id != kApplicationId && !(app_id == 0 && tables == 0))
    return fail(Errc::corrupt, not_fenced + "holds another application's data (application_id " +
                                   std::to_string(app_id) + ", " + std::to_string(tables) + " tables); use a new file");
  std::int64_t version = 0;
  scalar("PRAGMA user_version", version);
  if (app_id == kApplicationId && version != kSchemaVersion)
    return fail(Errc::unsupported, "schema version " + std::to_string(version) + ", this build understands " +
                                       std::to_string(kSchemaVersion));

  char* msg = nullptr;
  const std::string setup = std::string("PRAGMA journal_mode=WAL; PRAGMA synchronous=") +
                            (options.durable ? "FULL" : "NORMAL") + ";";
  if (!read_only && sqlite3_exec(db, setup.c_str(), nullptr, nullptr, &msg) != SQLITE_OK) {
    const std::string m = msg != nullptr ? msg : errmsg(db);
    sqlite3_free(msg);
    return fail(Errc::io_error, "cannot set WAL mode: " + m);
  }
  if (!read_only && app_id == 0) {
    const std::string init = std::string("BEGIN IMMEDIATE;") + kSchema +
                             "PRAGMA application_id=" + std::to_string(kApplicationId) +
                             "; PRAGMA user_version=" + std::to_string(kSchemaVersion) + "; COMMIT;";
    if (sqlite3_exec(db, init.c_str(), nullptr, nullptr, &msg) != SQLITE_OK) {
      const std::string m = msg != nullptr ? msg : errmsg(db);
      sqlite3_free(msg);
      sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
      return fail(Errc::io_error, "cannot create the schema: " + m);
    }
  }
  auto st = std::make_unique<Statements>();
  struct Prep {
    sqlite3_stmt** out;
    const char* sql;
  };
  const Prep preps[] = {
      {&st->begin, "BEGIN IMMEDIATE"},
      {&st->commit, "COMMIT"},
      {&st->rollback, "ROLLBACK"},
      {&st->highest, "SELECT epoch FROM fence WHERE name = ?1"},
      {&st->raise,
       "INSERT INTO fence(name, epoch) VALUES(?1, ?2) "
       "ON CONFLICT(name) DO UPDATE SET epoch = max(epoch, excluded.epoch)"},
      {&st->append,
       "INSERT INTO records(time_ns, name, epoch, holder, payload) VALUES(?1, ?2, ?3, ?4, ?5)"},
      {&st->audit,
       "INSERT INTO audit(time_ns, name, epoch, holder, payload, verdict, reason) "
       "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)"},
      {&st->count, "SELECT count(*) FROM records WHERE name = ?1"},
  };
  for (const Prep& p : preps) {
    if (sqlite3_prepare_v3(db, p.sql, -1, SQLITE_PREPARE_PERSISTENT, p.out, nullptr) != SQLITE_OK) {
      const std::string m = errmsg(db);
      st.reset();
      return fail(Errc::io_error, std::string("cannot prepare \"") + p.sql + "\": " + m);
    }
  }
  auto store = std::unique_ptr<FencedStore>(
      new FencedStore(db, path, std::move(st), std::clamp(options.busy_timeout_ms, 1, 600'000)));
  store->read_only_ = read_only;
  store->checkpoint_pages_ = std::max(options.checkpoint_pages, 0);
  store->verifier_ = options.verifier;
  return store;
}

FencedStore::FencedStore(sqlite3* db, std::string path, std::unique_ptr<Statements> st, int busy_timeout_ms)
    : db_(db), path_(std::move(path)), st_(std::move(st)), busy_timeout_ms_(busy_timeout_ms) {
  // Our own busy handler and checkpoint hook: the same behaviour as sqlite3_busy_timeout and
  // the default auto-checkpoint, but they account their time (WriteResult::lock_wait_ns,
  // checkpoint_ns).
  sqlite3_busy_handler(db_, &FencedStore::on_busy, this);
  sqlite3_wal_hook(db_, &FencedStore::on_wal_commit, this);
}

int FencedStore::on_busy(void* self, int count) {
  auto* store = static_cast<FencedStore*>(self);
  const std::int64_t now = boottime_ns();
  if (count == 0) store->busy_since_ns_ = now;
  const std::int64_t left_ns =
      static_cast<std::int64_t>(store->busy_timeout_ms_) * 1'000'000 - (now - store->busy_since_ns_);
  if (left_ns <= 0) return 0;  // give up: the statement returns SQLITE_BUSY
  constexpr int kSleeps = static_cast<int>(std::size(kBusySleepsMs));
  const std::int64_t sleep_ns =
      std::min<std::int64_t>(static_cast<std::int64_t>(kBusySleepsMs[std::min(count, kSleeps - 1)]) * 1'000'000, left_ns);
  const timespec ts{static_cast<time_t>(sleep_ns / 1'000'000'000), static_cast<long>(sleep_ns % 1'000'000'000)};
  ::nanosleep(&ts, nullptr);
  store->lock_wait_ns_ += boottime_ns() - now;
  return 1;
}

int FencedStore::on_wal_commit(void* self, sqlite3* db, const char* schema, int wal_pages) {
  auto* store = static_cast<FencedStore*>(self);
  if (store->checkpoint_pages_ == 0 || wal_pages < store->checkpoint_pages_) return SQLITE_OK;
  const std::int64_t start = boottime_ns();
  // Passive: copies what no reader still needs, never waits for anyone; a failure here does
  // not undo the commit, and the next commit tries again.
  sqlite3_wal_checkpoint_v2(db, schema, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
  store->checkpoint_ns_ += boottime_ns() - start;
  return SQLITE_OK;
}

FencedStore::~FencedStore() {
  st_.reset();
  sqlite3_close(db_);
}

WriteResult FencedStore::write(const WriteToken& token, std::string_view payload) {
  return fenced(token, payload, false, {}, true);
}

WriteResult FencedStore::advance_fence(std::string_view name, Epoch epoch, std::string_view why, bool force) {
  WriteToken t;
  t.name = std::string(name);
  t.epoch = epoch;
  return fenced(t, {}, true, why, false, force);
}

WriteResult FencedStore::present(const WriteToken& token, std::string_view why) {
  return fenced(token, {}, true, why, true);
}

WriteResult FencedStore::fenced(const WriteToken& token, std::string_view payload, bool announce,
                                std::string_view why, bool check_token, bool force) {
  WriteResult r;
  if (read_only_) {
    r.verdict = Verdict::error;
    r.reason = "the store " + path_ + " is open read-only";
    return r;
  }
  Statements& s = *st_;
  const std::int64_t call_start = boottime_ns();
  lock_wait_ns_ = 0;
  checkpoint_ns_ = 0;
  auto timed = [&] {
    r.took_ns = boottime_ns() - call_start;
    r.lock_wait_ns = lock_wait_ns_;
    r.checkpoint_ns = checkpoint_ns_;
    return r;
  };
  auto step_done = [](sqlite3_stmt* stmt) {
    const int rc = sqlite3_step(stmt);
    sqlite3_reset(stmt);
    return rc == SQLITE_DONE;
  };
  auto db_error = [&](const char* what) {
    r = WriteResult{};
    r.verdict = Verdict::error;
    r.reason = std::string(what) + ": " + errmsg(db_);
    if (sqlite3_get_autocommit(db_) == 0) step_done(s.rollback);
    return timed();
  };
  // The signature check runs before the write lock is taken (it needs no database state), so
  // other writers do not wait for it.
  token::Verdict token_verdict;
  const bool token_checked = check_token && verifier_ != nullptr && !skip_token_check_ &&
                             validate_name(token.name).ok() && token.epoch != 0;
  if (token_checked)
    token_verdict = verifier_->verify(token.signed_token, name_id_of(token.name), token.epoch, token.holder);
  if (!step_done(s.begin)) return db_error("begin");
  // Inside the write lock: the time order of audit rows is their commit order.
  const std::int64_t now = boottime_ns();

  Epoch highest = 0;
  sqlite3_bind_text(s.highest, 1, token.name.data(), static_cast<int>(token.name.size()),
                    SQLITE_TRANSIENT);
  const int hrc = sqlite3_step(s.highest);
  if (hrc == SQLITE_ROW) highest = static_cast<Epoch>(sqlite3_column_int64(s.highest, 0));
  sqlite3_reset(s.highest);
  if (hrc != SQLITE_ROW && hrc != SQLITE_DONE) return db_error("read fence");

  // Decide (FenceGate's rule: valid_fence(e) := e >= highest seen).
  std::string reason;
  Verdict verdict = Verdict::accepted;
  const Status name_problem = validate_name(token.name);
  if (!name_problem.ok()) {
    verdict = Verdict::invalid;
    reason = "invalid name: " + name_problem.message();
  } else if (token.epoch == 0) {
    verdict = Verdict::invalid;
    reason = "epoch 0: no grant carries it";
  } else if (token.epoch > kStoreEpochMax) {
    verdict = Verdict::invalid;
    reason = "epoch " + std::to_string(token.epoch) + " above 2^63-1";
  } else if ((!announce || check_token) && token.holder.is_nil()) {
    verdict = Verdict::invalid;
    reason = "nil holder";
  } else if (!announce && payload.size() > kPayloadBytesMax) {
    verdict = Verdict::invalid;
    reason = "payload of " + std::to_string(payload.size()) + " bytes, limit " +
             std::to_string(kPayloadBytesMax);
  } else if (!announce && token.epoch < highest) {
    verdict = Verdict::stale;
    reason = "stale epoch " + std::to_string(token.epoch) + " < highest seen " +
             std::to_string(highest);
  } else if (announce && !check_token && !force && token.epoch > highest && token.epoch - highest > kFenceRaiseMax) {
    // An unsigned raise far above every epoch seen would fence the name out (2^63-1: for good).
    verdict = Verdict::invalid;
    reason = "fence raise to " + std::to_string(token.epoch) + " is more than " + std::to_string(kFenceRaiseMax) +
             " above the highest epoch " + std::to_string(highest) + " of \"" + token.name +
             "\" (no grant is that far ahead); force it to raise it anyway";
  } else if (token_checked && !token_verdict.ok()) {
    // An epoch at or above the highest is admitted only with lockd's signature on it.
    verdict = Verdict::forged;
    reason = token_verdict.detail;
  }

  const std::string holder = token.holder.is_nil() ? std::string() : token.holder.str();
  if (verdict == Verdict::accepted && token.epoch > highest) {
    sqlite3_bind_text(s.raise, 1, token.name.data(), static_cast<int>(token.name.size()),
                      SQLITE_TRANSIENT);
    sqlite3_bind_int64(s.raise, 2, static_cast<sqlite3_int64>(token.epoch));
    if (!step_done(s.raise)) return db_error("raise fence");
  }
  const Epoch after = verdict == Verdict::accepted ? std::max(highest, token.epoch) : highest;
  if (verdict == Verdict::accepted && !announce) {
    sqlite3_bind_int64(s.append, 1, now);
    sqlite3_bind_text(s.append, 2, token.name.data(), static_cast<int>(token.name.size()),
                      SQLITE_TRANSIENT);
    sqlite3_bind_int64(s.append, 3, static_cast<sqlite3_int64>(token.epoch));
    sqlite3_bind_text(s.append, 4, holder.data(), static_cast<int>(holder.size()), SQLITE_TRANSIENT);
    sqlite3_bind_blob(s.append, 5, payload.empty() ? "" : payload.data(), static_cast<int>(payload.size()), SQLITE_TRANSIENT);
    if (!step_done(s.append)) return db_error("append record");
  }
  // The audit row: every write, accepted or not, and every announcement.
  const std::string_view audit_name =
      std::string_view(token.name).substr(0, std::min(token.name.size(), kAuditNameBytesMax));
  const std::string_view audit_payload =
      payload.size() > kPayloadBytesMax ? payload.substr(0, kAuditOversizeBytesKept) : payload;
  const std::string_view audit_verdict =
      to_string(announce && verdict == Verdict::accepted ? Verdict::fence : verdict);
  std::string audit_reason = reason;
  if (token_checked && token_verdict.ok() && verdict == Verdict::accepted) {
    const Result<token::GrantToken> t = token::decode(token.signed_token);
    audit_reason = std::string(kVerifiedReasonPrefix) + " (key " + token::key_id_text(t ? t->key_id : 0) + ")";
  }
  if (announce && verdict == Verdict::accepted) {
    if (!audit_reason.empty()) audit_reason += "; ";
    if (!check_token) audit_reason += std::string(kOperatorFencePrefix) + ": ";
    audit_reason += std::string(why) + (token.epoch > highest ? " (fence " + std::to_string(highest) + " -> " +
                                                                    std::to_string(token.epoch) + ")"
                                                              : " (fence already at " + std::to_string(highest) + ")");
  }
  sqlite3_bind_int64(s.audit, 1, now);
  sqlite3_bind_text(s.audit, 2, audit_name.data(), static_cast<int>(audit_name.size()), SQLITE_TRANSIENT);
  sqlite3_bind_int64(s.audit, 3, static_cast<sqlite3_int64>(std::min(token.epoch, kStoreEpochMax)));
  sqlite3_bind_text(s.audit, 4, holder.data(), static_cast<int>(holder.size()), SQLITE_TRANSIENT);
  sqlite3_bind_blob(s.audit, 5, audit_payload.empty() ? "" : audit_payload.data(), static_cast<int>(audit_payload.size()),
                    SQLITE_TRANSIENT);
  sqlite3_bind_text(s.audit, 6, audit_verdict.data(), static_cast<int>(audit_verdict.size()),
                    SQLITE_TRANSIENT);
  sqlite3_bind_text(s.audit, 7, audit_reason.data(), static_cast<int>(audit_reason.size()),
                    SQLITE_TRANSIENT);
  if (!step_done(s.audit)) return db_error("write audit row");
  const std::int64_t audit_id = sqlite3_last_insert_rowid(db_);
  if (!step_done(s.commit)) return db_error("commit");

  if (token_checked && (verdict == Verdict::accepted || verdict == Verdict::forged)) {
    if (token_verdict.ok()) {
      ++token_stats_.verified;
      if (token_verdict.cached) ++token_stats_.cache_hits;
    } else {
      ++token_stats_.rejected[static_cast<std::size_t>(token_verdict.reject) % token::kRejectCount];
    }
  }
  r.verdict = verdict;
  r.highest = after;
  r.reason = std::move(reason);
  r.time_ns = now;
  r.audit_id = audit_id;
  // An accepted write carries no reason and a refused one always says why: callers log and
  // return `reason` as the refusal, so a refusal without one would read as an acceptance.
  LEASEHOLD_ASSERT(r.accepted() == r.reason.empty());
  return timed();
}

Epoch FencedStore::highest(std::string_view name) {
  Statements& s = *st_;
  sqlite3_bind_text(s.highest, 1, name.data(), static_cast<int>(name.size()), SQLITE_TRANSIENT);
  Epoch e = 0;
  if (sqlite3_step(s.highest) == SQLITE_ROW) e = static_cast<Epoch>(sqlite3_column_int64(s.highest, 0));
  sqlite3_reset(s.highest);
  return e;
}

std::int64_t FencedStore::records(std::string_view name) {
  Statements& s = *st_;
  sqlite3_bind_text(s.count, 1, name.data(), static_cast<int>(name.size()), SQLITE_TRANSIENT);
  std::int64_t n = 0;
  if (sqlite3_step(s.count) == SQLITE_ROW) n = sqlite3_column_int64(s.count, 0);
  sqlite3_reset(s.count);
  return n;
}

std::vector<std::string> FencedStore::names(std::size_t names_max) {
  std::vector<std::string> out;
  sqlite3_stmt* q = nullptr;
  if (sqlite3_prepare_v2(db_, "SELECT DISTINCT name FROM audit ORDER BY name LIMIT ?1", -1, &q, nullptr) != SQLITE_OK)
    return out;
  sqlite3_bind_int64(q, 1, static_cast<sqlite3_int64>(std::min(names_max, kNamesListedMax)));
  while (sqlite3_step(q) == SQLITE_ROW) {
    const auto* p = static_cast<const char*>(sqlite3_column_blob(q, 0));
    out.emplace_back(p != nullptr ? std::string(p, static_cast<std::size_t>(sqlite3_column_bytes(q, 0))) : std::string());
  }
  sqlite3_finalize(q);
  return out;
}

CheckpointResult FencedStore::checkpoint() {
  CheckpointResult c;
  const std::int64_t start = boottime_ns();
  const int rc = sqlite3_wal_checkpoint_v2(db_, nullptr, SQLITE_CHECKPOINT_PASSIVE, &c.wal_pages, &c.copied_pages);
  c.took_ns = boottime_ns() - start;
  c.ok = rc == SQLITE_OK;
  if (!c.ok) c.error = "checkpoint of " + path_ + ": " + errmsg(db_);
  return c;
}

FencedStore::Tally FencedStore::tally(std::string_view name, Epoch epoch, Verdict v) {
  const std::string_view verdict = to_string(v);
  Tally t;
  sqlite3_stmt* q = nullptr;
  if (sqlite3_prepare_v2(db_,
                         "SELECT count(*), min(time_ns), max(time_ns) FROM audit "
                         "WHERE name = ?1 AND epoch = ?2 AND verdict = ?3",
                         -1, &q, nullptr) != SQLITE_OK)
    return t;
  sqlite3_bind_text(q, 1, name.data(), static_cast<int>(name.size()), SQLITE_TRANSIENT);
  sqlite3_bind_int64(q, 2, static_cast<sqlite3_int64>(std::min(epoch, kStoreEpochMax)));
  sqlite3_bind_text(q, 3, verdict.data(), static_cast<int>(verdict.size()), SQLITE_TRANSIENT);
  if (sqlite3_step(q) == SQLITE_ROW) {
    t.rows = sqlite3_column_int64(q, 0);
    t.first_ns = sqlite3_column_int64(q, 1);
    t.last_ns = sqlite3_column_int64(q, 2);
  }
  sqlite3_finalize(q);
  return t;
}

Result<std::vector<AuditRow>> FencedStore::audit(std::string_view name, std::size_t rows_max) {
  std::vector<AuditRow> rows;
  rows_max = std::min(rows_max, kAuditRowsMax);
  const char* sql = name.empty()
                        ? "SELECT id, time_ns, name, epoch, holder, payload, verdict, reason "
                          "FROM audit ORDER BY id LIMIT ?2"
                        : "SELECT id, time_ns, name, epoch, holder, payload, verdict, reason "
                          "FROM audit WHERE name = ?1 ORDER BY id LIMIT ?2";
  sqlite3_stmt* q = nullptr;
  if (sqlite3_prepare_v2(db_, sql, -1, &q, nullptr) != SQLITE_OK)
    return Status{Errc::io_error, "audit query: " + errmsg(db_)};
  if (!name.empty()) sqlite3_bind_text(q, 1, name.data(), static_cast<int>(name.size()), SQLITE_TRANSIENT);
  sqlite3_bind_int64(q, 2, static_cast<sqlite3_int64>(rows_max));
  auto text = [&](int col) {
    const auto* p = static_cast<const char*>(sqlite3_column_blob(q, col));
    return p ? std::string(p, static_cast<std::size_t>(sqlite3_column_bytes(q, col))) : std::string();
  };
  int rc = SQLITE_ROW;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    AuditRow r;
    r.id = sqlite3_column_int64(q, 0);
    r.time_ns = sqlite3_column_int64(q, 1);
    r.name = text(2);
    r.epoch = static_cast<Epoch>(sqlite3_column_int64(q, 3));
    r.holder = text(4);
    r.payload = text(5);
    const std::string verdict = text(6);
    const std::optional<Verdict> v = verdict_of(verdict);
    if (!v) {
      std::string known;
      for (const Verdict k : kVerdicts) known += (known.empty() ? "" : ", ") + std::string(to_string(k));
      Status corrupt{Errc::corrupt, "audit row " + std::to_string(r.id) + " of " + path_ + ": verdict \"" + verdict +
                                        "\" is none this leasehold knows (" + known + ")"};
      sqlite3_finalize(q);
      return corrupt;
    }
    r.verdict = *v;
    r.reason = text(7);
    rows.push_back(std::move(r));
  }
  if (rc != SQLITE_DONE) {
    Status failed{Errc::io_error, "audit query: " + errmsg(db_)};
    sqlite3_finalize(q);
    return failed;
  }
  sqlite3_finalize(q);
  return rows;
}

// ---- check_audit ---------------------------------------------------------------------------

AuditReport check_audit(const std::vector<AuditRow>& rows) {
  AuditReport rep;
  std::map<std::pair<std::string, Epoch>, EpochSummary> by_epoch;
  std::map<std::string, std::pair<Epoch, std::int64_t>> last_accepted;  // epoch, row id
  std::map<std::string, std::pair<Epoch, std::int64_t>> fence;          // highest announced, row id
  for (const AuditRow& r : rows) {
    if (r.verdict == Verdict::fence) {
      ++rep.fences;
      if (r.reason.starts_with(kOperatorFencePrefix) && r.reason.find(" -> ") != std::string::npos)
        rep.operator_fences.push_back(r);
      auto& f = fence[r.name];
      if (r.epoch > f.first) f = {r.epoch, r.id};
      continue;
    }
    EpochSummary& e = by_epoch[{r.name, r.epoch}];
    e.name = r.name;
    e.epoch = r.epoch;
    if (r.verdict != Verdict::accepted) {
      ++rep.rejected;
      if (r.verdict == Verdict::stale) ++e.rejected;
      if (r.verdict == Verdict::forged) {
        ++rep.forged;
        ++e.forged;
      }
      if (rep.rejected_rows.size() < kRejectedRowsKept) rep.rejected_rows.push_back(r);
      continue;
    }
    ++rep.accepted;
    if (r.reason.starts_with(kVerifiedReasonPrefix)) ++rep.verified;
    else ++rep.unverified;
    if (auto it = last_accepted.find(r.name); it != last_accepted.end() && r.epoch < it->second.first) {
      rep.violations.push_back("\"" + r.name + "\": audit row " + std::to_string(r.id) +
                               " accepted epoch " + std::to_string(r.epoch) + " after row " +
                               std::to_string(it->second.second) + " accepted epoch " +
                               std::to_string(it->second.first) + " (epochs went backwards)");
    }
    if (auto it = fence.find(r.name); it != fence.end() && r.epoch < it->second.first) {
      rep.violations.push_back("\"" + r.name + "\": audit row " + std::to_string(r.id) +
                               " accepted epoch " + std::to_string(r.epoch) +
                               " below the fence " + std::to_string(it->second.first) +
                               " announced in row " + std::to_string(it->second.second));
    }
    last_accepted[r.name] = {r.epoch, r.id};
    if (e.accepted == 0) e.first_ns = r.time_ns;
    e.last_ns = std::max(e.last_ns, r.time_ns);
    e.first_ns = std::min(e.first_ns, r.time_ns);
    ++e.accepted;
    if (std::find(e.holders.begin(), e.holders.end(), r.holder) == e.holders.end())
      e.holders.push_back(r.holder);
  }
  for (auto& [key, e] : by_epoch) {
    if (e.holders.size() > 1)
      rep.violations.push_back("\"" + e.name + "\" epoch " + std::to_string(e.epoch) + ": " +
                               std::to_string(e.holders.size()) +
                               " different holders had writes accepted");
    rep.epochs.push_back(e);
  }
  // Accepted-write time ranges of different epochs of one name must not overlap.
  std::map<std::string, std::vector<const EpochSummary*>> per_name;
  for (const EpochSummary& e : rep.epochs)
    if (e.accepted > 0) per_name[e.name].push_back(&e);
  for (auto& [name, list] : per_name) {
    std::sort(list.begin(), list.end(),
              [](const EpochSummary* a, const EpochSummary* b) { return a->first_ns < b->first_ns; });
    for (std::size_t i = 1; i < list.size(); ++i) {
      if (list[i]->first_ns <= list[i - 1]->last_ns)
        rep.violations.push_back(
            "\"" + name + "\": epochs " + std::to_string(list[i - 1]->epoch) + " and " +
            std::to_string(list[i]->epoch) + " overlap (epoch " + std::to_string(list[i]->epoch) +
            " first accepted at " + std::to_string(list[i]->first_ns) + " ns, epoch " +
            std::to_string(list[i - 1]->epoch) + " last accepted at " +
            std::to_string(list[i - 1]->last_ns) + " ns)");
    }
  }
  return rep;
}

std::string AuditReport::summary() const {
  if (!ok()) return "NOT exclusive";
  const std::string rules = "no overlapping or backwards epochs, one holder per epoch";
  if (forged > 0)
    return "ATTACKED: " + std::to_string(forged) + " write" + (forged == 1 ? "" : "s") +
           " with a token lockd never signed refused; the accepted writes show " + rules;
  if (unverified > 0)
    return "unverified: " + rules + ", but " + std::to_string(unverified) + " accepted write" +
           (unverified == 1 ? "" : "s") +
           " carried no verified token, so their epochs are unproven (a store opened without lockd's public key)";
  if (!operator_fences.empty())
    return "exclusive, fence raised by operator " + std::to_string(operator_fences.size()) + " time" +
           (operator_fences.size() == 1 ? "" : "s") + ": " + rules +
           ", every accepted write's epoch signed by lockd, but the fence raises were not signed";
  return "exclusive: " + rules + ", every accepted epoch signed by lockd";
}

}  // namespace leasehold::resource
