#include "leasehold/lockd/store.hpp"

#include "leasehold/lease/assert.hpp"

#include <sqlite3.h>

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>

#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <vector>
#include <algorithm>

namespace leasehold::lockd {
namespace {

constexpr char kSqliteMagic[16] = {'S', 'Q', 'L', 'i', 't', 'e', ' ', 'f',
                                   'o', 'r', 'm', 'a', 't', ' ', '3', '\0'};
constexpr std::size_t kSqliteHeaderBytes = 100;

std::uint32_t be32(const unsigned char* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

template <class Tag>
std::array<unsigned char, 16> id_bytes(const Id<Tag>& id) {
  std::array<unsigned char, 16> b{};
  for (int i = 0; i < 8; ++i) {
    b[static_cast<std::size_t>(i)] = static_cast<unsigned char>(id.hi >> (56 - 8 * i));
    b[static_cast<std::size_t>(8 + i)] = static_cast<unsigned char>(id.lo >> (56 - 8 * i));
  }
  return b;
}

template <class Tag>
Id<Tag> id_from_column(sqlite3_stmt* st, int col) {
  Id<Tag> id;
  const void* blob = sqlite3_column_blob(st, col);
  if (blob == nullptr || sqlite3_column_bytes(st, col) != 16) return id;
  const auto* p = static_cast<const unsigned char*>(blob);
  for (int i = 0; i < 8; ++i) {
    id.hi = (id.hi << 8) | p[i];
    id.lo = (id.lo << 8) | p[8 + i];
  }
  return id;
}

bool file_exists(const std::string& path, struct stat* st) {
  return ::stat(path.c_str(), st) == 0;
}

// The header check of an existing file, done with plain reads before SQLite touches it:
// a foreign or non-database file is refused without any byte of it (or a -wal/-shm beside
// it) being created or changed.
void check_existing_header(const std::string& path, const struct stat& st) {
  if (!S_ISREG(st.st_mode)) throw StoreError("store " + path + ": not a regular file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw StoreError("store " + path + ": cannot open for reading: " + std::strerror(errno));
  unsigned char header[kSqliteHeaderBytes] = {};
  const ssize_t n = ::pread(fd, header, sizeof header, 0);
  const int read_errno = errno;
  ::close(fd);
  if (n < 0) throw StoreError("store " + path + ": cannot read: " + std::strerror(read_errno));
  if (n == 0) {
    struct stat wal {};
    if (file_exists(path + "-wal", &wal) && wal.st_size > 0)
      throw StoreError("store " + path +
                       ": the file is empty but a non-empty " + path +
                       "-wal lies beside it; this is not a lockd store (refusing to touch it)");
    return;  // an empty file: a fresh store
  }
  if (static_cast<std::size_t>(n) < kSqliteHeaderBytes ||
      std::memcmp(header, kSqliteMagic, sizeof kSqliteMagic) != 0)
    throw StoreError("store " + path +
                     ": not a SQLite database (bad header magic); refusing to use or change it");
  const std::uint32_t app_id = be32(header + 68);
  if (app_id != kStoreApplicationId) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "application_id is 0x%08x, a lockd store has 0x%08x", app_id,
                  kStoreApplicationId);
    throw StoreError("store " + path + ": a SQLite database of another application (" + buf +
                     "); refusing to use or change it");
  }
  const std::uint32_t version = be32(header + 60);
  if (version > kStoreSchemaVersion)
    throw StoreError("store " + path + ": schema version " + std::to_string(version) +
                     " is newer than this lockd understands (" +
                     std::to_string(kStoreSchemaVersion) + "); refusing to change it");
}

std::string octal_mode(mode_t m) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0%03o", static_cast<unsigned>(m & 07777));
  return buf;
}

// The store's directory: only lockd's user (or root) may create, rename or remove files in it.
// Otherwise another local user could replace the store, or create its -wal / -shm / -journal
// before lockd does (and hold locks on them, or read them). A sticky world-writable directory
// such as /tmp is refused too: its other users can still create those names first.
void check_store_directory(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  struct stat d {};
  if (::stat(dir.c_str(), &d) != 0) {
    if (errno == ENOENT)
      throw StoreError("store " + path + ": cannot create: its directory " + dir +
                       " does not exist; fix: mkdir -m 0700 " + dir);
    throw StoreError("store " + path + ": its directory " + dir + ": " + std::strerror(errno));
  }
  if (!S_ISDIR(d.st_mode)) throw StoreError("store " + path + ": " + dir + " is not a directory");
  const uid_t self = ::geteuid();
  if (d.st_uid != self && d.st_uid != 0)
    throw StoreError("store " + path + ": its directory " + dir + " is owned by uid " +
                     std::to_string(d.st_uid) + ", neither lockd's uid " + std::to_string(self) +
                     " nor root; fix: put the store in a directory of lockd's user (chown " +
                     std::to_string(self) + " " + dir + ")");
  if ((d.st_mode & (S_IWGRP | S_IWOTH)) != 0)
    throw StoreError("store " + path + ": its directory " + dir + " (mode " + octal_mode(d.st_mode) +
                     ") is writable by " +
                     ((d.st_mode & S_IWOTH) != 0 ? std::string("others") : std::string("its group")) +
                     ", who could replace the store or create its -wal/-shm first; fix: chmod go-w " +
                     dir + ", or put the store in a directory only lockd's user can write");
}

// Who holds a POSIX lock on `file` (SQLite's locks are fcntl locks), as "process PID (COMM)",
// or "" if nobody else does. Our own locks never conflict with F_GETLK, so this names another
// process.
std::string lock_holder(const std::string& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = 0;
  fl.l_len = 0;  // the whole file
  const int rc = ::fcntl(fd, F_GETLK, &fl);
  ::close(fd);
  if (rc != 0 || fl.l_type == F_UNLCK || fl.l_pid <= 0) return {};
  std::string comm;
  if (FILE* f = std::fopen(("/proc/" + std::to_string(fl.l_pid) + "/comm").c_str(), "re")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof buf, f) != nullptr) comm = buf;
    std::fclose(f);
    while (!comm.empty() && (comm.back() == '\n' || comm.back() == '\r')) comm.pop_back();
  }
  return "process " + std::to_string(fl.l_pid) + (comm.empty() ? "" : " (" + comm + ")");
}

// Whether the file system of `fd` has kStoreWalRoomFactor times `bytes` free: a WAL written
// out on a small or nearly full disk would take the room the store itself needs next.
bool room_for(int fd, std::uint64_t bytes) {
  struct statvfs fs {};
  if (::fstatvfs(fd, &fs) != 0) return false;
  const std::uint64_t free_bytes = static_cast<std::uint64_t>(fs.f_bavail) * static_cast<std::uint64_t>(fs.f_frsize);
  return free_bytes / kStoreWalRoomFactor >= bytes;
}

}  // namespace

std::vector<std::string> secure_store_files(const std::string& path, bool fix_modes) {
  std::vector<std::string> fixed;
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
    const std::string file = path + suffix;
    struct stat st {};
    if (::lstat(file.c_str(), &st) != 0) {
      if (errno == ENOENT) continue;
      throw StoreError("store " + path + ": " + file + ": " + std::strerror(errno));
    }
    if (!S_ISREG(st.st_mode))
      throw StoreError("store " + path + ": " + file + " is not a regular file (a symlink or "
                       "device); fix: remove it, lockd makes its own");
    const uid_t self = ::geteuid();
    if (st.st_uid != self)
      throw StoreError("store " + path + ": " + file + " is owned by uid " + std::to_string(st.st_uid) +
                       ", not lockd's uid " + std::to_string(self) + "; fix: chown " +
                       std::to_string(self) + " " + file + " (or remove it if it is not lockd's)");
    if (fix_modes && (st.st_mode & 077) != 0) {
      if (::chmod(file.c_str(), 0600) != 0)
        throw StoreError("store " + path + ": " + file + " has mode " + octal_mode(st.st_mode) +
                         " (others may read it) and cannot be made 0600: " + std::strerror(errno) +
                         "; fix: chmod 600 " + file);
      fixed.push_back(file + " " + octal_mode(st.st_mode) + "->0600");
    }
  }
  return fixed;
}

void NameStore::fail(const std::string& what) const {
  const char* msg = db_ != nullptr ? sqlite3_errmsg(db_) : "out of memory";
  const int code = db_ != nullptr ? sqlite3_extended_errcode(db_) : SQLITE_NOMEM;
  std::string hint;
  switch (code & 0xff) {
    case SQLITE_FULL: hint = " (the disk is full)"; break;
    case SQLITE_READONLY: hint = " (the store or its directory is read-only)"; break;
    case SQLITE_BUSY:
    case SQLITE_LOCKED: {
      std::string who = lock_holder(path_);
      if (who.empty()) who = lock_holder(path_ + "-shm");
      hint = " (" + (who.empty() ? std::string("another process") : who) +
             " holds a lock on the store: another lockd, or a reader such as sqlite3 or a backup; lockd waited " +
             std::to_string(busy_timeout_ms_) + " ms for it; stop it and start lockd again)";
      break;
    }
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB: hint = " (the store file is corrupt)"; break;
    case SQLITE_IOERR: hint = " (an I/O error: disk full, read-only or failing?)"; break;
    case SQLITE_CANTOPEN: hint = " (cannot open: missing directory or read-only file system?)"; break;
    default: break;
  }
  throw StoreError("store " + path_ + ": " + what + ": " + msg + hint);
}

void NameStore::exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    sqlite3_free(err);
    fail(std::string("cannot run \"") + sql + "\"");
  }
}

NameStore::NameStore(const std::string& path, const StoreOptions& options)
    : path_(path), busy_timeout_ms_(options.busy_timeout_ms) {
  if (path.empty()) throw StoreError("store path is empty");
  if (options.private_files) {
    check_store_directory(path);
    modes_fixed_ = secure_store_files(path, true);
  }
  struct stat st {};
  const bool existed = file_exists(path, &st);
  if (existed) check_existing_header(path, st);
  const bool fresh = !existed || st.st_size == 0;

  // On any refusal below: close without a checkpoint (no write to the main file), and remove
  // a file this constructor created.
  auto cleanup = [&] {
    if (upsert_ != nullptr) sqlite3_finalize(upsert_);
    if (raise_high_water_ != nullptr) sqlite3_finalize(raise_high_water_);
    if (raise_mark_ != nullptr) sqlite3_finalize(raise_mark_);
    if (fold_ != nullptr) sqlite3_finalize(fold_);
    if (trim_ != nullptr) sqlite3_finalize(trim_);
    upsert_ = raise_high_water_ = raise_mark_ = fold_ = trim_ = nullptr;
    if (db_ != nullptr) {
      sqlite3_db_config(db_, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, nullptr);
      sqlite3_close_v2(db_);
      db_ = nullptr;
    }
    if (!existed) {
      ::unlink(path.c_str());
      ::unlink((path + "-journal").c_str());
      ::unlink((path + "-wal").c_str());
    }
  };

  // Every file SQLite creates (the store, its -journal, -wal, -shm) is 0600 (SQLite gives
  // them the main file's mode; the umask covers the main file). Restored on every way out.
  struct UmaskGuard {
    explicit UmaskGuard(bool enable) : on(enable), old(enable ? ::umask(077) : 0) {}
    ~UmaskGuard() {
      if (on) ::umask(old);
    }
    bool on;
    mode_t old;
  } umask_guard(options.private_files);

  try {
    const int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | (existed ? 0 : SQLITE_OPEN_CREATE);
    if (sqlite3_open_v2(path.c_str(), &db_, flags, nullptr) != SQLITE_OK)
      fail(existed ? "cannot open" : "cannot create");
    sqlite3_extended_result_codes(db_, 1);
    sqlite3_db_config(db_, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, nullptr);
    if (sqlite3_db_readonly(db_, "main") == 1)
      throw StoreError("store " + path + ": opened read-only (read-only file or file system); "
                       "lockd needs to write its store");
    // One lockd per store: EXCLUSIVE locking is taken before the first access, so a second
    // lockd on the same file fails with "busy" rather than sharing it; WAL then needs no -shm.
    // Once the write probe below has run, lockd holds the exclusive lock until it closes the
    // store: no other process can take any lock on it, so nothing can stall a commit. Until
    // then a process holding a lock (a reader of lockd's own uid or root: the files are 0600)
    // delays the start by at most options.busy_timeout_ms; after that lockd refuses to start
    // and names the process.
    exec("PRAGMA locking_mode=EXCLUSIVE");
    sqlite3_busy_timeout(db_, static_cast<int>(options.busy_timeout_ms));

    if (!fresh) {
      sqlite3_stmt* st_check = nullptr;
      if (sqlite3_prepare_v2(db_, "PRAGMA quick_check", -1, &st_check, nullptr) != SQLITE_OK)
        fail("cannot check integrity");
      std::string verdict;
      int rc;
      while ((rc = sqlite3_step(st_check)) == SQLITE_ROW) {
        const auto* t = sqlite3_column_text(st_check, 0);
        if (!verdict.empty()) verdict += "; ";
        verdict += t != nullptr ? reinterpret_cast<const char*>(t) : "?";
        if (verdict.size() > 400) break;
      }
      sqlite3_finalize(st_check);
      if (rc != SQLITE_ROW && rc != SQLITE_DONE) fail("integrity check failed");
      if (verdict != "ok")
        throw StoreError("store " + path + ": corrupt (quick_check: " + verdict +
                         "); refusing to use or change it");
      // The header check read the main file; ask SQLite too (covers a -wal replayed at open).
      sqlite3_stmt* q = nullptr;
      std::int64_t app = -1, ver = -1;
      if (sqlite3_prepare_v2(db_, "PRAGMA application_id", -1, &q, nullptr) == SQLITE_OK &&
          sqlite3_step(q) == SQLITE_ROW)
        app = sqlite3_column_int64(q, 0);
      sqlite3_finalize(q);
      if (sqlite3_prepare_v2(db_, "PRAGMA user_version", -1, &q, nullptr) == SQLITE_OK &&
          sqlite3_step(q) == SQLITE_ROW)
        ver = sqlite3_column_int64(q, 0);
      sqlite3_finalize(q);
      if (app == static_cast<std::int64_t>(kStoreApplicationId) && ver == 1) {
        // Version 1 had no column for the worker a reservation is for: its reservations load
        // bound to their sandbox only (any worker), as that lockd kept them.
        exec("BEGIN IMMEDIATE");
        try {
          exec("ALTER TABLE names ADD COLUMN peer_worker BLOB");
          exec("ALTER TABLE log ADD COLUMN peer_worker BLOB");
          exec(("PRAGMA user_version=" + std::to_string(kStoreSchemaVersion)).c_str());
          exec("COMMIT");
        } catch (...) {
          sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
          throw;
        }
        ver = kStoreSchemaVersion;
      }
      if (app != static_cast<std::int64_t>(kStoreApplicationId) ||
          ver != static_cast<std::int64_t>(kStoreSchemaVersion))
        throw StoreError("store " + path + ": not a lockd store of schema version " +
                         std::to_string(kStoreSchemaVersion) + " (application_id " +
                         std::to_string(app) + ", user_version " + std::to_string(ver) +
                         "); refusing to change it");
    } else {
      // Created with a rollback journal, so the application_id is in the main file's header
      // from the first commit on (the header check above can rely on it); WAL comes after.
      exec("PRAGMA journal_mode=DELETE");
      exec("BEGIN IMMEDIATE");
      exec("CREATE TABLE meta(k TEXT PRIMARY KEY, v INTEGER NOT NULL) WITHOUT ROWID");
      exec("CREATE TABLE names("
           " id BLOB PRIMARY KEY,"      // NameId, 16 bytes big-endian
           " name TEXT NOT NULL,"
           " state INTEGER NOT NULL,"   // kStoredPhaseCodes
           " epoch INTEGER NOT NULL,"   // the name's epoch high-water mark; never decreases
           " old_epoch INTEGER NOT NULL,"
           " owner BLOB, peer BLOB, worker BLOB,"
           " ttl_ns INTEGER NOT NULL,"
           " epoch_fresh INTEGER NOT NULL,"
           " peer_worker BLOB) WITHOUT ROWID");  // the worker `peer` runs on (a reservation's)
      // The change log: commits append here (sequential pages: a batch of N changes writes
      // ~N*110 bytes, not N random B-tree leaves); compact() folds it into `names`.
      exec("CREATE TABLE log("
           " seq INTEGER PRIMARY KEY,"
           " id BLOB NOT NULL, name TEXT NOT NULL, state INTEGER NOT NULL, epoch INTEGER NOT NULL,"
           " old_epoch INTEGER NOT NULL, owner BLOB, peer BLOB, worker BLOB,"
           " ttl_ns INTEGER NOT NULL, epoch_fresh INTEGER NOT NULL, peer_worker BLOB)");
      exec("INSERT INTO meta(k, v) VALUES('open_count', 0), ('epoch_high_water', 0)");
      exec(("PRAGMA application_id=" + std::to_string(kStoreApplicationId)).c_str());
      exec(("PRAGMA user_version=" + std::to_string(kStoreSchemaVersion)).c_str());
      exec("COMMIT");
    }

    // WAL + synchronous=FULL: a COMMIT returns after the WAL is fsynced, so commit == durable.
    {
      sqlite3_stmt* q = nullptr;
      std::string mode;
      if (sqlite3_prepare_v2(db_, "PRAGMA journal_mode=WAL", -1, &q, nullptr) == SQLITE_OK &&
          sqlite3_step(q) == SQLITE_ROW && sqlite3_column_text(q, 0) != nullptr)
        mode = reinterpret_cast<const char*>(sqlite3_column_text(q, 0));
      sqlite3_finalize(q);
      if (mode != "wal") fail("cannot switch to WAL mode (got \"" + mode + "\")");
    }
    exec("PRAGMA synchronous=FULL");
    // The page cache is a fixed cost, not a per-name one: commits append to the change log
    // (its hot tail pages) and compact() folds runs of it into random leaves of a names table
    // that outgrows any cache at a million names (about 250 bytes of file per name), so
    // beyond the tail and the inner B-tree pages a larger cache buys few hits (the kernel's
    // page cache serves the rest) and costs resident memory that grows with the store up to
    // the bound (64 MiB was ~70 bytes per name between 100k and 1M names).
    exec("PRAGMA cache_size=-16384");
    exec(("PRAGMA wal_autocheckpoint=" + std::to_string(kStoreWalCheckpointPages)).c_str());
    // The WAL stays when the store closes (checkpointed: its frames are all in the store), so the
    // next open writes into blocks the file has (StoreOptions::preallocate_wal).
    {
      int persist = 1;
      if (sqlite3_file_control(db_, "main", SQLITE_FCNTL_PERSIST_WAL, &persist) != SQLITE_OK)
        fail("cannot keep the WAL at close");
    }

    // The write probe: a read-only or full disk shows here, before lockd answers anyone.
    exec("BEGIN IMMEDIATE");
    try {
      exec("UPDATE meta SET v = v + 1 WHERE k = 'open_count'");
      exec("COMMIT");
    } catch (...) {
      sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
      throw;
    }
    {
      sqlite3_stmt* q = nullptr;
      if (sqlite3_prepare_v2(db_, "SELECT v FROM meta WHERE k = 'open_count'", -1, &q, nullptr) ==
              SQLITE_OK &&
          sqlite3_step(q) == SQLITE_ROW)
        open_count_ = static_cast<std::uint64_t>(sqlite3_column_int64(q, 0));
      sqlite3_finalize(q);
    }
    // After the probe: the WAL exists (SQLite made it, 0600) and holds the probe's frames.
    if (options.preallocate_wal > 0) write_out_wal(options.preallocate_wal);

    if (sqlite3_prepare_v2(db_,
                           "INSERT INTO log(id, name, state, epoch, old_epoch, owner, peer, worker,"
                           " ttl_ns, epoch_fresh, peer_worker) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                           -1, &upsert_, nullptr) != SQLITE_OK)
      fail("cannot prepare the log append");
    // Folding the oldest log rows into `names`: later rows win (ORDER BY seq), and the
    // upsert never lowers a name's epoch.
    if (sqlite3_prepare_v2(db_,
                           "INSERT INTO names(id, name, state, epoch, old_epoch, owner, peer, worker,"
                           " ttl_ns, epoch_fresh, peer_worker) SELECT id, name, state, epoch, old_epoch, owner,"
                           " peer, worker, ttl_ns, epoch_fresh, peer_worker FROM log WHERE seq <= ?1 ORDER BY seq"
                           " ON CONFLICT(id) DO UPDATE SET name = excluded.name,"
                           " state = excluded.state, epoch = excluded.epoch,"
                           " old_epoch = excluded.old_epoch, owner = excluded.owner,"
                           " peer = excluded.peer, worker = excluded.worker, ttl_ns = excluded.ttl_ns,"
                           " epoch_fresh = excluded.epoch_fresh, peer_worker = excluded.peer_worker"
                           " WHERE excluded.epoch >= names.epoch",
                           -1, &fold_, nullptr) != SQLITE_OK)
      fail("cannot prepare the log fold");
    if (sqlite3_prepare_v2(db_, "DELETE FROM log WHERE seq <= ?1", -1, &trim_, nullptr) != SQLITE_OK)
      fail("cannot prepare the log trim");
    {
      sqlite3_stmt* q = nullptr;
      if (sqlite3_prepare_v2(db_, "SELECT count(*), coalesce(min(seq), 0) FROM log", -1, &q, nullptr) ==
              SQLITE_OK &&
          sqlite3_step(q) == SQLITE_ROW) {
        log_rows_ = static_cast<std::uint64_t>(sqlite3_column_int64(q, 0));
        log_first_seq_ = sqlite3_column_int64(q, 1);
      }
      sqlite3_finalize(q);
    }
    // The durable epoch of every name, for the never-lower check at append time.
    for (const StoredName& n : load().names) epochs_.note(n.id, n.epoch);
    if (sqlite3_prepare_v2(db_,
                           "UPDATE meta SET v = ?1 WHERE k = 'epoch_high_water' AND v < ?1", -1,
                           &raise_high_water_, nullptr) != SQLITE_OK)
      fail("cannot prepare the high-water update");
    if (sqlite3_prepare_v2(db_,
                           "INSERT INTO meta(k, v) VALUES(?1, ?2) ON CONFLICT(k) DO UPDATE SET v = excluded.v"
                           " WHERE excluded.v > v",
                           -1, &raise_mark_, nullptr) != SQLITE_OK)
      fail("cannot prepare the restart-mark update");
    // The exclusive lock is held now: no commit ever waits for another process.
    sqlite3_busy_timeout(db_, 0);
    if (options.private_files) secure_store_files(path, false);  // what SQLite made: ours, 0600
    // Opened and verified: a normal close may checkpoint again.
    sqlite3_db_config(db_, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 0, nullptr);
  } catch (...) {
    cleanup();
    throw;
  }
}

void NameStore::write_out_wal(std::uint64_t bytes) {
  const std::string wal = path_ + "-wal";
  const int fd = ::open(wal.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) throw StoreError("store " + path_ + ": cannot open " + wal + ": " + std::strerror(errno));
  struct stat st {};
  std::string error;
  if (::fstat(fd, &st) != 0) {
    error = std::string("cannot stat it: ") + std::strerror(errno);
  } else if (static_cast<std::uint64_t>(st.st_size) < bytes && room_for(fd, bytes - static_cast<std::uint64_t>(st.st_size))) {
    // Past the WAL's end only: SQLite's own frames before it are not touched.
    std::vector<char> zeros(std::size_t{1} << 20, 0);
    std::uint64_t at = static_cast<std::uint64_t>(st.st_size);
    while (at < bytes && error.empty()) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(zeros.size(), bytes - at));
      const ssize_t w = ::pwrite(fd, zeros.data(), n, static_cast<off_t>(at));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) error = std::string("cannot write it: ") + (w < 0 ? std::strerror(errno) : "no progress");
      else at += static_cast<std::uint64_t>(w);
    }
    if (error.empty() && ::fdatasync(fd) != 0) error = std::string("cannot sync it: ") + std::strerror(errno);
  }
  ::close(fd);
  if (!error.empty())
    throw StoreError("store " + path_ + ": writing out " + wal + " to " + std::to_string(bytes) + " bytes: " + error +
                     " (the disk is full?)");
}

NameStore::~NameStore() {
  if (upsert_ != nullptr) sqlite3_finalize(upsert_);
  if (raise_high_water_ != nullptr) sqlite3_finalize(raise_high_water_);
  if (raise_mark_ != nullptr) sqlite3_finalize(raise_mark_);
  if (fold_ != nullptr) sqlite3_finalize(fold_);
  if (trim_ != nullptr) sqlite3_finalize(trim_);
  if (db_ != nullptr) sqlite3_close_v2(db_);
}

StoredTable NameStore::load() const {
  StoredTable table;
  sqlite3_stmt* q = nullptr;
  if (sqlite3_prepare_v2(db_, "SELECT v FROM meta WHERE k = 'epoch_high_water'", -1, &q, nullptr) !=
      SQLITE_OK)
    fail("cannot read the epoch high-water mark");
  if (sqlite3_step(q) == SQLITE_ROW) table.epoch_high_water = static_cast<Epoch>(sqlite3_column_int64(q, 0));
  sqlite3_finalize(q);
  q = nullptr;
  if (sqlite3_prepare_v2(db_, "SELECT k, v FROM meta WHERE k LIKE 'lived/%' OR k LIKE 'seen/%' OR k LIKE 'floor/%'", -1,
                         &q, nullptr) !=
      SQLITE_OK)
    fail("cannot read the restart marks");
  while (sqlite3_step(q) == SQLITE_ROW) {
    const auto* k = sqlite3_column_text(q, 0);
    const std::string key = k != nullptr ? reinterpret_cast<const char*>(k) : "";
    const std::int64_t v = sqlite3_column_int64(q, 1);
    if (key.rfind("lived/", 0) == 0) {
      table.lived_ns[std::strtoull(key.c_str() + 6, nullptr, 10)] = v;
    } else if (key.rfind("floor/", 0) == 0) {
      if (auto w = WorkerId::parse(std::string_view(key).substr(6)); w && v > 0)
        table.replay_floor[*w] = static_cast<std::uint64_t>(v);
    } else if (auto w = WorkerId::parse(std::string_view(key).substr(5)); w && v >= 0) {
      table.seen[*w] = static_cast<std::uint64_t>(v);
    }
  }
  sqlite3_finalize(q);
  // The compacted table, then the log on top of it in commit order (later changes win).
  std::unordered_map<NameId, StoredName> by_id;
  for (const char* sql :
       {"SELECT id, name, state, epoch, old_epoch, owner, peer, worker, ttl_ns, epoch_fresh, peer_worker FROM names",
        "SELECT id, name, state, epoch, old_epoch, owner, peer, worker, ttl_ns, epoch_fresh, peer_worker FROM log"
        " ORDER BY seq"}) {
    q = nullptr;
    if (sqlite3_prepare_v2(db_, sql, -1, &q, nullptr) != SQLITE_OK) fail("cannot read names");
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
      StoredName n;
      n.id = id_from_column<NameTag>(q, 0);
      const auto* text = sqlite3_column_text(q, 1);
      n.name = text != nullptr ? reinterpret_cast<const char*>(text) : "";
      const auto state = sqlite3_column_int64(q, 2);
      const auto phase = kStoredPhaseCodes.decode(state);
      if (!phase) {
        sqlite3_finalize(q);
        throw StoreError("store " + path_ + ": name \"" + n.name + "\" has unknown state " +
                         std::to_string(state) + " (corrupt store?)");
      }
      n.state = *phase;
      n.epoch = static_cast<Epoch>(sqlite3_column_int64(q, 3));
      n.old_epoch = static_cast<Epoch>(sqlite3_column_int64(q, 4));
      n.owner = id_from_column<SandboxTag>(q, 5);
      n.peer = id_from_column<SandboxTag>(q, 6);
      n.worker = id_from_column<WorkerTag>(q, 7);
      n.ttl_ns = static_cast<std::uint64_t>(sqlite3_column_int64(q, 8));
      n.epoch_fresh = sqlite3_column_int64(q, 9) != 0;
      n.peer_worker = id_from_column<WorkerTag>(q, 10);  // NULL (a version 1 row): nil
      auto [it, inserted] = by_id.try_emplace(n.id, n);
      if (!inserted && n.epoch >= it->second.epoch) it->second = std::move(n);
    }
    sqlite3_finalize(q);
    if (rc != SQLITE_DONE) fail("cannot read names");
  }
  table.names.reserve(by_id.size());
  for (auto& [id, n] : by_id) table.names.push_back(std::move(n));
  std::sort(table.names.begin(), table.names.end(),
            [](const StoredName& a, const StoredName& b) { return a.id < b.id; });
  return table;
}

std::size_t NameStore::compact(std::size_t rows_max) {
  if (log_rows_ == 0 || rows_max == 0) return 0;
  const std::int64_t upto = log_first_seq_ + static_cast<std::int64_t>(rows_max) - 1;
  exec("BEGIN IMMEDIATE");
  try {
    sqlite3_reset(fold_);
    sqlite3_bind_int64(fold_, 1, upto);
    if (sqlite3_step(fold_) != SQLITE_DONE) fail("cannot fold the change log");
    sqlite3_reset(fold_);
    sqlite3_reset(trim_);
    sqlite3_bind_int64(trim_, 1, upto);
    if (sqlite3_step(trim_) != SQLITE_DONE) fail("cannot trim the change log");
    const auto removed = static_cast<std::size_t>(sqlite3_changes(db_));
    sqlite3_reset(trim_);
    exec("COMMIT");
    log_rows_ -= std::min<std::uint64_t>(log_rows_, removed);
    log_first_seq_ = upto + 1;
    return removed;
  } catch (...) {
    sqlite3_reset(fold_);
    sqlite3_reset(trim_);
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
}

void DurableEpochs::check(std::span<const StoredName> changes, Epoch epoch_high_water) const {
  LEASEHOLD_ASSERT(epoch_high_water <= kEpochMax);
  for (const StoredName& n : changes) {
    LEASEHOLD_ASSERT(n.epoch <= kEpochMax);
    const auto it = by_name_.find(n.id);
    LEASEHOLD_ASSERT(it == by_name_.end() || n.epoch >= it->second);
  }
}

void DurableEpochs::written(std::span<const StoredName> changes) {
  for (const StoredName& n : changes) by_name_[n.id] = n.epoch;
}

void NameStore::commit(std::span<const StoredName> changes, Epoch epoch_high_water, const StoreMarks& marks) {
  if (changes.empty() && epoch_high_water == 0 && marks.empty()) return;
  if (changes.size() > kStoreBatchChangesMax)
    throw StoreError("store " + path_ + ": batch of " + std::to_string(changes.size()) +
                     " changes exceeds kStoreBatchChangesMax");
  // Epochs never decrease (DESIGN.md "Vocabulary") and fit the int64 columns, checked before
  // anything is written (DurableEpochs; the file is lockd's under the exclusive lock, so
  // nothing changed it since the load, and a file epoch above 2^63-1 fails LeaseTable::restore).
  epochs_.check(changes, epoch_high_water);
  exec("BEGIN IMMEDIATE");
  try {
    for (const StoredName& n : changes) {
      const auto id = id_bytes(n.id);
      const auto owner = id_bytes(n.owner);
      const auto peer = id_bytes(n.peer);
      const auto worker = id_bytes(n.worker);
      const auto peer_worker = id_bytes(n.peer_worker);
      sqlite3_reset(upsert_);
      sqlite3_bind_blob(upsert_, 1, id.data(), 16, SQLITE_STATIC);
      sqlite3_bind_text(upsert_, 2, n.name.data(), static_cast<int>(n.name.size()), SQLITE_STATIC);
      sqlite3_bind_int64(upsert_, 3, kStoredPhaseCodes.encode(n.state, -1));
      sqlite3_bind_int64(upsert_, 4, static_cast<std::int64_t>(n.epoch));
      sqlite3_bind_int64(upsert_, 5, static_cast<std::int64_t>(n.old_epoch));
      sqlite3_bind_blob(upsert_, 6, owner.data(), 16, SQLITE_STATIC);
      sqlite3_bind_blob(upsert_, 7, peer.data(), 16, SQLITE_STATIC);
      sqlite3_bind_blob(upsert_, 8, worker.data(), 16, SQLITE_STATIC);
      sqlite3_bind_int64(upsert_, 9, static_cast<std::int64_t>(n.ttl_ns));
      sqlite3_bind_int(upsert_, 10, n.epoch_fresh ? 1 : 0);
      sqlite3_bind_blob(upsert_, 11, peer_worker.data(), 16, SQLITE_STATIC);
      if (sqlite3_step(upsert_) != SQLITE_DONE) fail("cannot write name \"" + n.name + "\"");
    }
    sqlite3_reset(upsert_);
    if (epoch_high_water != 0) {
      sqlite3_reset(raise_high_water_);
      sqlite3_bind_int64(raise_high_water_, 1, static_cast<std::int64_t>(epoch_high_water));
      if (sqlite3_step(raise_high_water_) != SQLITE_DONE) fail("cannot raise the epoch high-water mark");
      sqlite3_reset(raise_high_water_);
    }
    auto raise_mark = [&](const std::string& key, std::int64_t v) {
      sqlite3_reset(raise_mark_);
      sqlite3_bind_text(raise_mark_, 1, key.data(), static_cast<int>(key.size()), SQLITE_TRANSIENT);
      sqlite3_bind_int64(raise_mark_, 2, v);
      if (sqlite3_step(raise_mark_) != SQLITE_DONE) fail("cannot write the restart mark " + key);
      sqlite3_reset(raise_mark_);
    };
    if (marks.lived_ns >= 0) raise_mark("lived/" + std::to_string(marks.incarnation), marks.lived_ns);
    for (const WorkerId& w : marks.seen) raise_mark("seen/" + w.str(), static_cast<std::int64_t>(marks.incarnation));
    for (const std::uint64_t j : marks.drop_lived)
      if (j != marks.incarnation) exec(("DELETE FROM meta WHERE k = 'lived/" + std::to_string(j) + "'").c_str());
    for (const auto& [w, seq] : marks.replay_floor)
      if (static_cast<std::int64_t>(seq) > 0) raise_mark("floor/" + w.str(), static_cast<std::int64_t>(seq));
    exec("COMMIT");
    if (log_rows_ == 0) log_first_seq_ = sqlite3_last_insert_rowid(db_) - static_cast<std::int64_t>(changes.size()) + 1;
    log_rows_ += changes.size();
    epochs_.written(changes);
  } catch (...) {
    sqlite3_reset(upsert_);
    sqlite3_reset(raise_high_water_);
    sqlite3_reset(raise_mark_);
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
}

}  // namespace leasehold::lockd
