// leasehold/lockd: the durable name store (SQLite, the embedded default).
//
// What it holds: one row per name that lockd has ever granted, with the name's ownership
// state and its epoch. The epoch column is the name's durable epoch high-water mark: a row's
// epoch never decreases (the upsert refuses to lower it), so after any restart the next
// grant of that name is strictly above every epoch ever acknowledged (DESIGN.md "lockd",
// "Time": epochs continue from the durable high-water mark).
//
// What it does not hold: refreshes and expiry deadlines. Those stay in memory; a restart
// counts every held lease as refreshed at restart time (never shortens a lease), for at most
// what the restart rule leaves it (lockd/service.hpp), which the restart marks (StoreMarks:
// per incarnation how long it served, per worker its last acknowledging incarnation) bound.
//
// Optimised for: group commit. `commit()` appends a whole batch of ownership changes to a
// change log in one transaction, and with WAL + synchronous=FULL one commit is one fsync, so a
// batch of N changes costs one disk flush and ~N*110 bytes of sequential pages (upserting into
// the names table directly would dirty one random B-tree leaf per change: 4 KiB each).
// `compact()` folds the log into the names table in large steps, so the random writes are
// paid once per many commits. `StoreThread` (store_thread.hpp) drives both off the io loop.
//
// Safety on open: a file that is not a SQLite database, is a SQLite database of another
// application (wrong application_id), has a newer schema, or fails `PRAGMA quick_check` is
// refused and left byte-for-byte as it was; a read-only or full disk is refused before
// anything is acknowledged (a write probe runs at open).
#pragma once

#include "leasehold/lease/code_table.hpp"
#include "leasehold/lease/types.hpp"

#include <cstdint>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

struct sqlite3;
struct sqlite3_stmt;

namespace leasehold::lockd {

/// The durable state of one name. Field meaning depends on `state`:
///  - free:         epoch = high-water mark; peer = reserved_for (nil: not reserved);
///                  epoch_fresh = the epoch was allocated (transfer, revoke, reassign) but not
///                  granted yet, so the next grant takes it rather than epoch + 1
///  - acquiring:    epoch = allocated at acquire; owner = acquiring sandbox (dropped at restart:
///                  it rebuilds as free at the same epoch)
///  - held:         epoch, owner, worker, ttl_ns (the lease TTL it was granted with)
///  - transferring: epoch = new_epoch, old_epoch, owner = from, peer = to, worker = from's worker
/// The `state` column's integer for each phase: the store encodes and decodes through this
/// table only, and refuses to open a row whose code it does not name (StoreError).
inline constexpr CodeTable<LockPhase, std::int64_t, 4> kStoredPhaseCodes{{{
    {LockPhase::free, 0}, {LockPhase::acquiring, 1}, {LockPhase::held, 2}, {LockPhase::transferring, 3}}}};
static_assert(kStoredPhaseCodes.covers(kLockPhases));

struct StoredName {
  NameId id;
  std::string name;  ///< the name text (1..128 bytes, validate_name)
  LockPhase state = LockPhase::free;
  Epoch epoch = 0;
  Epoch old_epoch = 0;
  SandboxId owner;
  SandboxId peer;
  WorkerId worker;
  WorkerId peer_worker;  ///< Free reserved / Transferring: the worker `peer` runs on (nil: any)
  std::uint64_t ttl_ns = 0;  ///< informational: the TTL of the grant (restart uses its own)
  bool epoch_fresh = false;
  friend bool operator==(const StoredName&, const StoredName&) = default;
};

/// Durable facts that bound how long restarts may keep a lease whose holder stopped (the
/// restart rule, lockd/service.hpp): how long each incarnation (store open) is known to have
/// served, and the last incarnation in which lockd acknowledged each worker (a refresh, a worker
/// heartbeat, a grant or commit to it). O(workers) + O(restarts) rows, never O(refreshes).
struct StoreMarks {
  std::uint64_t incarnation = 0;  ///< the writing lockd's incarnation (open_count())
  std::int64_t lived_ns = -1;     ///< a lower bound of how long it has served; -1: not written
  std::vector<WorkerId> seen;     ///< workers acknowledged in `incarnation`
  /// Of the workers in `seen`: the highest seq lockd had taken from each when the batch was cut
  /// (its replay window's), the floor a later incarnation starts that worker's window at.
  std::unordered_map<WorkerId, std::uint64_t> replay_floor;
  /// Incarnations whose lived marks the restart rule no longer needs: deleted with this batch
  /// (LockService: at or below the oldest seen mark of a worker that holds a lease).
  std::vector<std::uint64_t> drop_lived;
  bool empty() const noexcept { return lived_ns < 0 && seen.empty() && drop_lived.empty(); }
};

/// Everything load() returns: the rows and the table-wide epoch high-water mark (the largest
/// epoch ever allocated, including epochs of names no longer in the table), and the marks.
struct StoredTable {
  std::vector<StoredName> names;
  Epoch epoch_high_water = 0;
  std::map<std::uint64_t, std::int64_t> lived_ns;         ///< by incarnation
  std::unordered_map<WorkerId, std::uint64_t> seen;       ///< worker -> last incarnation
  std::unordered_map<WorkerId, std::uint64_t> replay_floor;  ///< worker -> seq floor (StoreMarks)
  /// Keys in the store's space that are not its own and were skipped (etcd: a key under
  /// names/ that is not names/<name-id>, put there by hand): how many, and the first few.
  std::uint64_t foreign_keys = 0;
  std::vector<std::string> foreign_key_samples;
};

/// The durable epoch of every name a store holds, and the check every store's commit makes
/// before it writes anything (NameStore, EtcdStore): no change lowers a name's durable epoch,
/// and no epoch (nor the high-water mark) exceeds kEpochMax. Not a property of the store's
/// contents: these epochs and the LeaseTable that made the changes were loaded from the same
/// rows, and the table grants only above every epoch it loaded (its high-water mark covers the
/// rows it drops too); a breach is lockd's own bug - written, the next start or takeover would
/// grant an epoch already handed out - so it aborts (LEASEHOLD_ASSERT) with nothing written.
class DurableEpochs {
 public:
  /// A name's epoch as loaded or written.
  void note(NameId id, Epoch epoch) { by_name_[id] = epoch; }
  /// Aborts if a change lowers its name's durable epoch or an epoch exceeds kEpochMax.
  void check(std::span<const StoredName> changes, Epoch epoch_high_water) const;
  /// The changes are durable: their epochs are the names' durable epochs from now on.
  void written(std::span<const StoredName> changes);

 private:
  std::unordered_map<NameId, Epoch> by_name_;
};

/// Why the store refused to open or to commit. `what()` names the file and the problem.
class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A commit the store refused on purpose, with nothing of it written: a replicated store whose
/// write is guarded on this lockd's leadership (EtcdStore: the election key's revision) after
/// leadership moved on. The durability port reports it as `rejected` (durability.hpp).
class StoreRejected : public StoreError {
 public:
  using StoreError::StoreError;
};

/// A durable name store, as the store thread (store_thread.hpp) drives it: SQLite (NameStore,
/// below: one machine) or etcd (etcd_store.hpp: a lockd cluster). Used from one thread at a time.
class Store {
 public:
  virtual ~Store() = default;
  /// All rows, in name-id order, the high-water mark and the restart marks.
  virtual StoredTable load() const = 0;
  /// Makes `changes`, `epoch_high_water` and `marks` durable (see NameStore::commit); returns
  /// when they are. Throws StoreRejected when the store refused the batch on purpose (nothing
  /// of it written), StoreError when it could not write it (unknown whether it will be seen).
  virtual void commit(std::span<const StoredName> changes, Epoch epoch_high_water, const StoreMarks& marks) = 0;
  /// Background maintenance while idle (SQLite: folding the change log); the rows it folded.
  virtual std::size_t compact(std::size_t rows_max) = 0;
  /// Rows waiting for compact() (0 for a store that needs none).
  virtual std::uint64_t log_rows() const noexcept = 0;
  /// This lockd's incarnation for the restart rule (service.hpp): strictly above the
  /// incarnation of every earlier lockd that wrote this store.
  virtual std::uint64_t incarnation() const noexcept = 0;
  /// What the store is, for logs and errors ("lockd.db", "etcd://h:p/prefix shard 0").
  virtual std::string describe() const = 0;
};

/// SQLite `application_id` of a leasehold lockd store ("LHLD").
inline constexpr std::uint32_t kStoreApplicationId = 0x4C484C44;
/// Schema version (PRAGMA user_version). A store with a higher version is refused; a version 1
/// store (before `peer_worker`) is upgraded in place when opened.
inline constexpr std::uint32_t kStoreSchemaVersion = 2;
/// Upper bound on the changes written in one transaction (bounds a transaction's WAL growth).
inline constexpr std::size_t kStoreBatchChangesMax = 16384;

/// The WAL's cycle: a commit that takes the WAL to this many pages checkpoints it into the
/// store (wal_autocheckpoint); the commit after that writes the WAL from its start again.
inline constexpr std::uint32_t kStoreWalCheckpointPages = 4096;
/// The WAL's size once it has run a cycle: the checkpoint's pages plus a largest batch's
/// (kStoreBatchChangesMax log rows fill about 450 pages), in frames of a 4 KiB page and its
/// 24-byte header, after the 32-byte WAL header. The open writes the WAL out to this size (see
/// StoreOptions::preallocate_wal).
inline constexpr std::uint64_t kStoreWalBytes = 32 + std::uint64_t{kStoreWalCheckpointPages + 512} * (4096 + 24);
/// The WAL is written out only on a file system with this many times the bytes it adds free.
inline constexpr std::uint64_t kStoreWalRoomFactor = 8;

/// How long the store's open waits for a lock another process holds (a reader of lockd's uid
/// or root, e.g. sqlite3 or a backup) before it refuses to start, in ms.
inline constexpr std::uint32_t kStoreOpenBusyTimeoutMsDefault = 5000;

struct StoreOptions {
  /// The store's files are lockd's alone: its directory must not be writable by group/others
  /// and be owned by lockd's uid or root; the store, -wal, -shm and -journal are created 0600,
  /// existing ones of another mode are made 0600 (refused if they are another uid's or not
  /// regular files). false only for the store-mode ablation (tests).
  bool private_files = true;
  /// See kStoreOpenBusyTimeoutMsDefault; 0: fail at once (the store-busy-timeout ablation).
  std::uint32_t busy_timeout_ms = kStoreOpenBusyTimeoutMsDefault;
  /// Commits overwrite the WAL in place instead of growing it. A write + fdatasync into blocks
  /// a file already has costs one device flush; one that grows the file also commits its new
  /// size (on ext4 a journal commit: about twice as long). SQLite grows the WAL during its first
  /// cycle after the file is made (then writes it from the start again) and deletes it at
  /// close; so the open writes zeros out to this many bytes of the WAL (once: it is kept at
  /// close, SQLITE_FCNTL_PERSIST_WAL). Zeros are no valid frame: a recovery stops at the first
  /// of them. Skipped on a file system with less than kStoreWalRoomFactor times the bytes it
  /// would add free (a small or nearly full disk). 0: the WAL grows as SQLite writes it (still
  /// kept at close).
  std::uint64_t preallocate_wal = kStoreWalBytes;
};

/// Checks the store's files (path, path-wal, path-shm, path-journal, those that exist): regular
/// files of lockd's uid; with fix_modes, a mode with group/other bits becomes 0600. Returns the
/// files fixed ("PATH 0644->0600"); throws StoreError naming the file and the fix.
std::vector<std::string> secure_store_files(const std::string& path, bool fix_modes);

class NameStore final : public Store {
 public:
  /// Opens (creating when absent) the store at `path`. Checks, before any write: the file is
  /// empty or a SQLite database whose application_id is ours (or 0 with no tables, i.e. fresh)
  /// and whose schema version we know; `PRAGMA quick_check` passes. Then switches to WAL
  /// with synchronous=FULL and runs a write probe (increments the open counter), so a
  /// read-only or full disk is detected here. Throws StoreError naming the cause; on a
  /// refusal the file is left as it was (a file this call created is removed again).
  /// Before that, with options.private_files: the directory and file checks of StoreOptions
  /// (a store directory others can write is refused, naming it and the fix). A lock another
  /// process holds on the store is waited for at most options.busy_timeout_ms, then refused
  /// naming that process; once open, lockd holds the store's exclusive lock until it closes it.
  explicit NameStore(const std::string& path, const StoreOptions& options = {});
  ~NameStore() override;
  NameStore(const NameStore&) = delete;
  NameStore& operator=(const NameStore&) = delete;

  /// All rows, in name-id order, and the high-water mark. Used at restart to rebuild the table.
  StoredTable load() const override;

  /// Writes `changes` (upserts by id), raises the stored high-water mark to `epoch_high_water`
  /// (never lowers it) and records `marks` (never lowering a stored value) in one transaction;
  /// returns when it is durable.
  /// A change never lowers a stored epoch, and no epoch (nor `epoch_high_water`) exceeds
  /// kEpochMax: a breach is lockd's own bug (the rows and its name table come from the same
  /// load), so it aborts (LEASEHOLD_ASSERT) with nothing written. Throws StoreError for a batch
  /// above kStoreBatchChangesMax.
  /// Throws StoreError on an I/O error (disk full, read-only, ...); the transaction is then
  /// rolled back and nothing in the batch is durable.
  void commit(std::span<const StoredName> changes, Epoch epoch_high_water = 0,
              const StoreMarks& marks = {}) override;

  /// Folds up to `rows_max` of the oldest change-log rows into the names table (one
  /// transaction; random B-tree writes amortised over many commits) and returns how many were
  /// folded. Throws StoreError like commit().
  std::size_t compact(std::size_t rows_max) override;
  /// Change-log rows not yet folded into the names table.
  std::uint64_t log_rows() const noexcept override { return log_rows_; }

  /// How many times this store has been opened (1 on a fresh store). Durable.
  std::uint64_t open_count() const noexcept { return open_count_; }
  /// The open count: each open of the file is one incarnation.
  std::uint64_t incarnation() const noexcept override { return open_count_; }
  std::string describe() const override { return path_; }
  const std::string& path() const noexcept { return path_; }
  /// Files whose mode the open made 0600 ("PATH 0644->0600"), for lockd's log.
  const std::vector<std::string>& modes_fixed() const noexcept { return modes_fixed_; }

 private:
  void exec(const char* sql);
  [[noreturn]] void fail(const std::string& what) const;
  /// Writes zeros from the WAL's end out to `bytes` and makes them durable (no-op if it is that
  /// large already).
  void write_out_wal(std::uint64_t bytes);

  std::string path_;
  std::uint32_t busy_timeout_ms_ = 0;
  std::vector<std::string> modes_fixed_;
  sqlite3* db_ = nullptr;
  sqlite3_stmt* upsert_ = nullptr;
  sqlite3_stmt* raise_high_water_ = nullptr;
  sqlite3_stmt* raise_mark_ = nullptr;
  sqlite3_stmt* fold_ = nullptr;
  sqlite3_stmt* trim_ = nullptr;
  std::uint64_t log_rows_ = 0;
  std::int64_t log_first_seq_ = 0;                 ///< lowest seq in the log (when log_rows_ > 0)
  DurableEpochs epochs_;  ///< durable epoch per name (the never-lower check)
  std::uint64_t open_count_ = 0;
};

}  // namespace leasehold::lockd
