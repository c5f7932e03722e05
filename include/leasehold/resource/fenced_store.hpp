// leasehold/resource: FencedStore, a fenced resource over SQLite that applications can copy.
//
// What it is: an append-only record log that accepts a write only if it carries a fencing
// token {name, epoch, holder} whose epoch is not below the highest epoch the store has seen for
// that name - FenceGate's rule, valid_fence(e) := e >= highest seen (DESIGN.md "Vocabulary:
// fencing"; Kleppmann, "How to do distributed locking", fencing tokens; Chubby §2.4). Every
// write, accepted or rejected, leaves one row in an audit table
// (time, name, epoch, holder, payload, verdict, reason), so exclusivity can be checked after
// the fact (`check_audit`).
//
// Why not just FenceGate (lease/fence.hpp): FenceGate keeps the highest epoch in the memory of
// one process. Here several processes (one agent per worker, the operator's CLI) write to one
// SQLite file, and a gate in each of them would only know the epochs *its* process admitted:
// process A's gate would happily admit epoch 41 after process B's gate admitted 42. So the
// highest epoch per name lives in the database (table `fence`), and the check and the write
// run in one `BEGIN IMMEDIATE` transaction: SQLite takes the write lock at BEGIN, so no other
// connection can raise the fence between our compare and our insert, across processes.
//
// Who tells the resource about a new epoch: a fence only learns epochs from the writes it
// admits (or from an explicit announcement). Whoever moves the epoch - a transfer begin, a
// revoke - should call `advance_fence(name, new_epoch)` so the old holder's writes are refused
// from that moment, not only from the new holder's first write. A new holder may also present
// its token first (advance_fence with its own epoch) before relying on exclusivity.
//
// Signed tokens (wire/token.hpp): an epoch alone is a number anyone can write, so a stale holder
// that makes one up (its own + 1000, or 2^63-1) would be admitted and fence the rightful holder
// out for good. A store opened with a TokenVerifier (StoreOptions::verifier: lockd's public
// keys) admits a write only if it carries a token lockd signed for exactly that name, epoch and
// holder (a write below the highest epoch is stale whatever it carries); anything else is
// rejected as Verdict::forged with the reason counted (token_stats())
// and written in the audit row. Verification is cached per (name, epoch, signature), so a
// holder pays one signature check per epoch. A store without a verifier keeps the plain epoch
// compare (only safe when every writer is trusted); its accepted audit rows say that no token
// was verified, and `check_audit` reports them as unverified.
//
// Time: audit rows carry CLOCK_BOOTTIME nanoseconds read *inside* the write transaction, so
// the row order (rowid) and the time order agree across processes on one host.
//
// Durability: WAL mode. `synchronous` FULL by default (an acknowledged write survives power
// loss); NORMAL (survives a process crash, not power loss) when `durable = false`.
//
// Thread-safety: one FencedStore per thread (one SQLite connection). Any number of stores,
// in any number of processes, may share one file.
#pragma once

#include "leasehold/wire/token.hpp"
#include "leasehold/lease/code_table.hpp"
#include "leasehold/lease/types.hpp"
#include "leasehold/lease/result.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

struct sqlite3;

namespace leasehold::resource {

/// Largest payload one write may carry (bytes); larger writes are rejected and audited.
inline constexpr std::size_t kPayloadBytesMax = 4096;
/// Longest a writer waits for another process's transaction (SQLite busy timeout).
inline constexpr int kBusyTimeoutMsDefault = 5000;
/// Most audit rows `audit()` returns in one call.
inline constexpr std::size_t kAuditRowsMax = 1'000'000;
/// WAL size (pages) at which a commit runs a passive checkpoint: SQLite's own default
/// (SQLITE_DEFAULT_WAL_AUTOCHECKPOINT).
inline constexpr int kWalCheckpointPagesDefault = 1000;
/// Most names `names()` returns.
inline constexpr std::size_t kNamesListedMax = 1000;
/// Largest epoch the store accepts: SQLite integers are signed 64-bit.
inline constexpr Epoch kStoreEpochMax = static_cast<Epoch>(INT64_MAX);

/// A fencing token as a resource receives it (lease/types.hpp Token, with the name as text).
struct WriteToken {
  WriteToken() = default;
  WriteToken(std::string n, Epoch e, SandboxId h, std::vector<std::uint8_t> signed_bytes = {})
      : name(std::move(n)), epoch(e), holder(h), signed_token(std::move(signed_bytes)) {}
  std::string name;
  Epoch epoch = 0;
  SandboxId holder;
  /// The signed token of the grant (wire/token.hpp encoding, kTokenBytes); empty: unsigned.
  /// Required by a store with a verifier.
  std::vector<std::uint8_t> signed_token;
};

/// What the store decided about a write (WriteResult) and what an audit row records (AuditRow,
/// the `verdict` column holds to_string of it).
enum class Verdict : std::uint8_t {
  accepted = 0,  ///< epoch >= highest seen; the record was appended; highest = epoch
  stale = 1,     ///< epoch < highest seen: a superseded token
  invalid = 2,   ///< malformed token or payload (epoch 0, bad name, nil holder, too large)
  error = 3,     ///< the database failed (busy past the timeout, disk full, ...); nothing written
  forged = 4,    ///< a store with a verifier: the token is unsigned, forged, mis-signed, of an
                 ///< unknown key id or of another grant (reason says which, token::Reject)
  fence = 5,     ///< audit rows only: an admitted advance_fence or present() (whose
                 ///< WriteResult says accepted)
};
/// Every Verdict, for verdict_of.
inline constexpr std::array<Verdict, 6> kVerdicts{Verdict::accepted, Verdict::stale, Verdict::invalid,
                                                  Verdict::error,    Verdict::forged, Verdict::fence};
namespace detail {
// The one definition of each verdict's text, also the audit table's stored text (so it never
// changes). No default: -Wswitch (an error in this build) names a verdict without a case.
constexpr std::string_view verdict_name(Verdict v) noexcept {
  switch (v) {
    case Verdict::accepted: return "accepted";
    case Verdict::stale: return "stale";
    case Verdict::invalid: return "invalid";
    case Verdict::error: return "error";
    case Verdict::forged: return "forged";
    case Verdict::fence: return "fence";
  }
  return {};
}
}  // namespace detail
static_assert(lists_every(kVerdicts, [](Verdict v) { return !detail::verdict_name(v).empty(); }),
              "a Verdict is missing from kVerdicts");

/// "accepted", "stale", "invalid", "error", "forged", "fence"; "unknown" outside the enum.
constexpr std::string_view to_string(Verdict v) noexcept {
  const std::string_view name = detail::verdict_name(v);
  return name.empty() ? std::string_view("unknown") : name;
}
/// The verdict whose text (to_string) is `text`; nullopt for text no verdict has.
constexpr std::optional<Verdict> verdict_of(std::string_view text) noexcept {
  return enum_of_text(kVerdicts, detail::verdict_name, text);
}

struct WriteResult {
  Verdict verdict = Verdict::error;
  Epoch highest = 0;        ///< the highest epoch for the name after the call
  std::string reason;       ///< why not accepted (names the numbers); empty when accepted
  std::int64_t time_ns = 0; ///< CLOCK_BOOTTIME of the decision (0 on error)
  std::int64_t audit_id = 0;///< rowid of the audit row (0 on error)
  // Where the time of the call went (CLOCK_BOOTTIME ns), so a writer can say why a write was
  // slow: waiting for another connection's lock, a WAL checkpoint (it writes the database file
  // and syncs it), or the rest (the transaction itself).
  std::int64_t took_ns = 0;       ///< the whole call
  std::int64_t lock_wait_ns = 0;  ///< of which asleep in the busy handler (another writer held the lock)
  std::int64_t checkpoint_ns = 0; ///< of which in a WAL checkpoint after the commit
  bool accepted() const noexcept { return verdict == Verdict::accepted; }
};

/// Prefix of the reason of an accepted audit row whose token was verified ("token verified
/// (key 1a2b3c4d)"); an accepted row without it carried no verified token.
inline constexpr std::string_view kVerifiedReasonPrefix = "token verified";
/// The audit reason of an advance_fence row (no token: the caller owns the store, e.g. an
/// operator's `--fence-db`): "operator fence raise: WHY (fence FROM -> TO)".
inline constexpr std::string_view kOperatorFencePrefix = "operator fence raise";
/// advance_fence refuses (unless forced) an epoch more than this above the name's highest.
inline constexpr Epoch kFenceRaiseMax = Epoch{1} << 20;

/// One audit row. `verdict` is accepted, stale, invalid, forged or fence (an advance_fence or
/// a presented token).
struct AuditRow {
  std::int64_t id = 0;
  std::int64_t time_ns = 0;
  std::string name;
  Epoch epoch = 0;
  std::string holder;  ///< UUID text ("" for fence rows without a holder)
  std::string payload;
  Verdict verdict = Verdict::invalid;
  std::string reason;
};

struct StoreOptions {
  bool durable = true;                       ///< synchronous=FULL (else NORMAL)
  int busy_timeout_ms = kBusyTimeoutMsDefault;
  /// A commit that leaves the write-ahead log at least this many pages long runs a passive
  /// checkpoint (copies the log into the database file and syncs it) before write() returns.
  /// 0: never here - a writer that must not pause for that I/O leaves checkpoints to another
  /// connection, which calls checkpoint() (SQLite: "checkpoints in a separate thread").
  int checkpoint_pages = kWalCheckpointPagesDefault;
  /// lockd's public keys: when set, every write (and present()) must carry a token that
  /// verifies with one of them. Shared: one verifier (and its cache) may serve many stores.
  std::shared_ptr<token::TokenVerifier> verifier;
};

/// Token checks of one FencedStore (since it was opened).
struct TokenStats {
  std::uint64_t verified = 0;     ///< writes whose token verified (with a signature check or cached)
  std::uint64_t cache_hits = 0;   ///< of which answered from the cache
  std::array<std::uint64_t, token::kRejectCount> rejected{};  ///< forged writes by token::Reject
  std::uint64_t forged() const noexcept {
    std::uint64_t n = 0;
    for (const auto v : rejected) n += v;
    return n;
  }
};

/// What one checkpoint() did.
struct CheckpointResult {
  bool ok = false;
  int wal_pages = 0;      ///< pages in the write-ahead log
  int copied_pages = 0;   ///< of which now in the database file
  std::int64_t took_ns = 0;
  std::string error;      ///< when !ok
};

class FencedStore {
 public:
  /// Opens (creating if needed) the store at `path`: the store (never nullptr), or a Status
  /// naming the path and what was found: invalid_argument (an empty path), corrupt (not a
  /// SQLite database, another application's data), unsupported (another schema version),
  /// io_error (SQLite cannot open it, set WAL mode, create the schema).
  static Result<std::unique_ptr<FencedStore>> open(const std::string& path, const StoreOptions& options = {});
  /// Opens an existing store to read it (audit, tally, highest) and changes nothing: no schema,
  /// no pragma, no lock file; works on a read-only file or mount (a copy kept as evidence).
  /// Files that are not a fenced store - empty, another application's database, not a
  /// database at all - are refused with a Status (corrupt, unsupported, io_error as open())
  /// whose message says "not a fenced store: ..." and why. write() and advance_fence() on it
  /// answer Verdict::error.
  static Result<std::unique_ptr<FencedStore>> open_read_only(const std::string& path);
  ~FencedStore();
  FencedStore(const FencedStore&) = delete;
  FencedStore& operator=(const FencedStore&) = delete;

  /// The fenced write: in one IMMEDIATE transaction, compare token.epoch with the name's
  /// highest epoch, append the record if epoch >= highest (and raise highest to epoch), and
  /// write the audit row either way. Invalid tokens and oversized payloads are rejected and
  /// audited too. Never throws.
  WriteResult write(const WriteToken& token, std::string_view payload);

  /// Announces `epoch` for `name` (the epoch moved at lockd: transfer begin, revoke, grant):
  /// highest = max(highest, epoch), audited as verdict "fence" with `why`. Returns the
  /// highest after the call; verdict invalid/error as for write(). The raise is unsigned, so
  /// it is audited as an operator's ("operator fence raise: ...", from -> to) and check_audit
  /// reports it; an epoch more than kFenceRaiseMax above the highest is refused (invalid,
  /// nothing raised) unless `force`. Never throws.
  WriteResult advance_fence(std::string_view name, Epoch epoch, std::string_view why, bool force = false);

  /// A holder presents its token before relying on exclusivity: like advance_fence(token.name,
  /// token.epoch), but with a verifier the token must verify (else Verdict::forged, counted
  /// and audited), so only a grant lockd signed can raise the fence this way.
  WriteResult present(const WriteToken& token, std::string_view why);

  /// Token checks so far (all zero without a verifier).
  const TokenStats& token_stats() const noexcept { return token_stats_; }
  /// Whether writes are checked against signed tokens (a verifier was given).
  bool verifies_tokens() const noexcept { return verifier_ != nullptr; }

  /// Test hook (the ablation of the attack tests, not an option): skip the token check even
  /// with a verifier, i.e. the plain epoch compare.
  void testing_skip_token_check(bool skip) noexcept { skip_token_check_ = skip; }

  /// The highest epoch seen for `name` (0: none, or on error).
  Epoch highest(std::string_view name);

  /// Audit rows in acceptance order (rowid), all names when `name` is empty, at most
  /// `rows_max` (clamped to kAuditRowsMax). A database error is io_error ("audit query: ...")
  /// and a row whose verdict text no Verdict has is corrupt (the message names the row, the
  /// text and the store); either returns no rows: a check over the rows read before the error
  /// could call a double grant exclusive.
  Result<std::vector<AuditRow>> audit(std::string_view name = {}, std::size_t rows_max = kAuditRowsMax);

  /// Records appended (accepted writes) for `name`.
  std::int64_t records(std::string_view name);

  /// The names with audit rows, sorted, at most `names_max` (clamped to kNamesListedMax).
  std::vector<std::string> names(std::size_t names_max = kNamesListedMax);

  /// A passive checkpoint now: copies what no reader still needs from the write-ahead log into
  /// the database file, waiting for nobody; writers go on meanwhile.
  CheckpointResult checkpoint();

  /// Audit rows of (name, epoch) with `verdict`: how many, and the first and last time_ns (0
  /// when none).
  struct Tally {
    std::int64_t rows = 0;
    std::int64_t first_ns = 0;
    std::int64_t last_ns = 0;
  };
  Tally tally(std::string_view name, Epoch epoch, Verdict verdict);

  const std::string& path() const noexcept { return path_; }

 private:
  struct Statements;
  FencedStore(sqlite3* db, std::string path, std::unique_ptr<Statements> st, int busy_timeout_ms);
  static Result<std::unique_ptr<FencedStore>> open_impl(const std::string& path, const StoreOptions& options,
                                                        bool read_only);
  WriteResult fenced(const WriteToken& token, std::string_view payload, bool announce,
                     std::string_view why, bool check_token, bool force = false);
  static int on_busy(void* self, int count);
  static int on_wal_commit(void* self, sqlite3* db, const char* schema, int wal_pages);
  sqlite3* db_ = nullptr;
  std::string path_;
  std::unique_ptr<Statements> st_;
  int busy_timeout_ms_ = kBusyTimeoutMsDefault;
  int checkpoint_pages_ = kWalCheckpointPagesDefault;
  bool read_only_ = false;
  std::shared_ptr<token::TokenVerifier> verifier_;
  bool skip_token_check_ = false;
  TokenStats token_stats_;
  // Per call (reset by fenced()): time asleep in on_busy, time in checkpoints, and when the
  // current busy episode began.
  std::int64_t lock_wait_ns_ = 0;
  std::int64_t checkpoint_ns_ = 0;
  std::int64_t busy_since_ns_ = 0;
};

// ---- checking an audit ----------------------------------------------------------------------

/// Accepted writes of one (name, epoch).
struct EpochSummary {
  std::string name;
  Epoch epoch = 0;
  std::uint64_t accepted = 0;
  std::uint64_t rejected = 0;      ///< stale writes carrying this epoch
  std::uint64_t forged = 0;        ///< writes claiming this epoch whose token did not verify
  std::int64_t first_ns = 0;       ///< first accepted write (0 if none)
  std::int64_t last_ns = 0;        ///< last accepted write
  std::vector<std::string> holders;///< distinct holders of accepted writes (exactly 1 expected)
};

/// The exclusivity check over an audit (pure; rows in acceptance order):
///  - per name, epochs of accepted writes never decrease in acceptance order;
///  - the time ranges [first_ns, last_ns] of different epochs of a name do not overlap;
///  - all accepted writes of one (name, epoch) carry one holder;
///  - no accepted write carries an epoch below the highest announced before it.
/// `violations` lists each broken rule with the rows involved; empty means the accepted writes
/// are exclusive. That says nothing of epochs nobody can vouch for: accepted writes whose token
/// was not verified (`unverified`; a store without a verifier) may carry a made-up epoch, and
/// `forged` counts writes refused because their token did not verify (someone wrote without a
/// grant). `exclusive()` is true only with no violation, no forgery and no unverified write.
struct AuditReport {
  std::vector<EpochSummary> epochs;   ///< by name, then epoch
  std::uint64_t accepted = 0;
  std::uint64_t rejected = 0;         ///< stale + invalid + forged
  std::uint64_t forged = 0;           ///< writes refused: the token did not verify
  std::uint64_t verified = 0;         ///< accepted writes whose token was verified
  std::uint64_t unverified = 0;       ///< accepted writes without a verified token
  std::uint64_t fences = 0;           ///< advance_fence rows
  std::vector<AuditRow> operator_fences;  ///< unsigned fence raises (advance_fence that moved it)
  std::vector<AuditRow> rejected_rows;///< at most kRejectedRowsKept, oldest first
  std::vector<std::string> violations;
  bool ok() const noexcept { return violations.empty(); }
  /// Exclusive and every accepted epoch vouched for by lockd, with no forgery attempted.
  bool exclusive() const noexcept { return ok() && forged == 0 && unverified == 0; }
  /// One line: "exclusive: ...", "NOT exclusive", "exclusive among accepted writes, but N
  /// forged ..." or "... unverified ..." (what `leasehold audit` prints last).
  std::string summary() const;
};
inline constexpr std::size_t kRejectedRowsKept = 64;
AuditReport check_audit(const std::vector<AuditRow>& rows);

}  // namespace leasehold::resource
