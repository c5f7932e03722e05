// leasehold/io: datagram authentication with HMAC-SHA256, per-worker keys and key files.
//
// DESIGN.md "The wire protocol", "Trust model": every datagram ends in an HMAC-SHA256 tag
// (RFC 2104) over its header and payload. Three kinds of key:
//   - the cluster key (lockd and the operator): lockd derives the worker keys from it; used
//     directly (key id | kAdminKeyIdBit) it is the root authority (Authority::root): an admin
//     key that may also speak for any worker - who holds it can derive every worker key anyway,
//     so this gives no power it does not already have
//   - a worker key, K_W = HKDF-SHA256(cluster key, salt "leasehold worker key v1",
//     info = worker id (16 bytes, hi then lo, big-endian) || key id (2 bytes, big-endian)),
//     RFC 5869. A supervisor holds only its own; since lockd derives the key from the sender id
//     the datagram claims, a valid tag proves that the sender is worker W.
//   - an admin key (the CLI's admin commands; lockd --admin-key-file): no supervisor holds it.
// Every tag carries its key's id (header key_id), so lockd can accept two cluster keys during
// a rotation. A key lives in a file that only its owner may read (mode 0600 or stricter); the
// daemons refuse to start otherwise.
//
// Key file format (text):
//   leasehold-key kind=<cluster|worker|admin> key-id=<1..65535>[ worker=<uuid>]
// (a cluster key's id, and so its worker keys', is 1..32767: see kAdminKeyIdBit; lockd's
// keyring refuses a higher one)
//   <the key as hex, kKeyBytesMin..kKeyBytesMax bytes: 64..128 hex digits>
// each line optionally ending in a newline. A file of only the hex line (the format before key
// ids) is a cluster key with key id 1. generate_key_file() and write_key_file() write one.
#pragma once

#include "leasehold/lease/result.hpp"
#include "leasehold/wire/protocol.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace leasehold::wire {

inline constexpr std::size_t kKeyBytesMin = 32;  ///< RFC 2104 §3: at least the hash output size
inline constexpr std::size_t kKeyBytesMax = 64;  ///< SHA-256 block size; longer keys add nothing
inline constexpr std::size_t kKeyFileHeaderBytesMax = 128;
inline constexpr std::size_t kKeyFileBytesMax = kKeyFileHeaderBytesMax + 2 * kKeyBytesMax + 2;
inline constexpr std::uint16_t kKeyIdDefault = 1;  ///< the id of a key written without one
/// A tag made with cluster key N itself (not a key derived from it) carries key id N | this bit;
/// so cluster key ids (and the worker keys derived from them) are 1..kClusterKeyIdMax.
inline constexpr std::uint16_t kAdminKeyIdBit = 0x8000;
inline constexpr std::uint16_t kClusterKeyIdMax = kAdminKeyIdBit - 1;  ///< 32767
inline constexpr std::size_t kDerivedKeyBytes = 32;

/// What a key gives power over (see the top of this file).
enum class KeyKind : std::uint8_t { cluster = 0, worker = 1, admin = 2 };
std::string_view to_string(KeyKind k) noexcept;

/// An HMAC key (raw bytes) and what it is. `worker` is set for a worker key only.
struct WireKey {
  WireKey() = default;
  WireKey(std::vector<std::uint8_t> b, KeyKind k = KeyKind::cluster, std::uint16_t id = kKeyIdDefault,
          WorkerId w = {})
      : bytes(std::move(b)), kind(k), key_id(id), worker(w) {}
  std::vector<std::uint8_t> bytes;
  KeyKind kind = KeyKind::cluster;
  std::uint16_t key_id = kKeyIdDefault;
  WorkerId worker;
};

/// A key as its file names it, for messages: "cluster key 1", "admin key 7", "worker key 2" -
/// the key id of the file, never the wire key id that a cluster key used directly carries
/// (N | kAdminKeyIdBit).
std::string key_text(const WireKey& key);

/// K_W for `worker` from a cluster key (HKDF-SHA256, see the top of this file); the result has
/// kind worker, the cluster key's id and `worker`. Throws std::invalid_argument if `cluster` is
/// not a cluster key or `worker` is nil, std::runtime_error if OpenSSL has no HKDF.
WireKey derive_worker_key(const WireKey& cluster, const WorkerId& worker);

/// The key lockd issues to `worker` (--derive-worker-key): derive_worker_key(), or under the
/// shared-worker-key ablation (see ClusterKeyring) the one shared key, named for `worker`.
WireKey derive_worker_key_as_issued(const WireKey& cluster, const WorkerId& worker, bool shared_ablation);

/// A loaded key, or what is wrong with which file and the fix: as read_private_file
/// (not_found, permission_denied, invalid_argument, io_error), or corrupt (the text is not a key).
using KeyLoad = Result<WireKey>;

/// Reads a private file (a key) into `buf`: refuses, with the message load_key_file gives, a
/// file that cannot be opened, is not a regular file, has any group/other mode bit, or is owned
/// by another uid than this process's or root's. `n` gets the bytes read (at most buf.size();
/// == buf.size() means the file may be longer). `fix_new` is appended to "cannot open: no such
/// file". Errors: not_found (with `fix_new`), permission_denied (mode, owner), invalid_argument
/// (not a regular file), io_error. The caller wipes `buf`.
Status read_private_file(const std::string& path, std::span<char> buf, std::size_t& n, std::string_view fix_new);
/// Writes `text` to a new file `path` with `mode` (O_EXCL: an existing key is never
/// overwritten; fsynced; removed again on failure). Errors: exists (the file is there),
/// errc_of_errno of the failing step otherwise. The caller wipes `text`.
Status write_new_key_file(const std::string& path, std::string_view text, unsigned mode);

/// Loads the key file at `path`. Refuses (error text names the path, what was found and the fix):
/// a missing/unreadable file, a file that is not a regular file, a mode with any group/other bit
/// set ("mode 0644 ... fix: chmod 600 <path>"), an owner other than this process's uid or root
/// ("owned by uid N ... fix: chown ..."), an empty or too short key, non-hex content. The file's
/// text is wiped from memory before returning. The key file's bytes check (mode, owner, type)
/// and read are load_key_file's; the text is parsed by parse_key_file_text (also for tests): a
/// header line (kind, key id, worker) and the hex key, or the hex key alone (a cluster key with
/// id kKeyIdDefault).
KeyLoad load_key_file(const std::string& path);
KeyLoad parse_key_file_text(const std::string& path, std::string_view text);

/// Writes `key` to `path` in the key file format, created with mode 0600 (O_EXCL: an existing
/// file is never overwritten). Errors: invalid_argument (key size, key id 0), as
/// write_new_key_file.
Status write_key_file(const std::string& path, const WireKey& key);

/// Writes a fresh random key (kKeyBytesMin bytes from the OpenSSL CSPRNG) of `kind` (cluster or
/// admin) and `key_id` to `path` (see write_key_file). Errors: invalid_argument (a worker key:
/// those are derived), io_error (no randomness), as write_key_file.
Status generate_key_file(const std::string& path, KeyKind kind = KeyKind::cluster,
                              std::uint16_t key_id = kKeyIdDefault);

/// The key file text of `key` (both lines, newline-terminated).
std::string format_key(const WireKey& key);

/// Key from hex text (the key line of the file format); nullopt if not 64..128 hex digits.
std::optional<WireKey> parse_key_hex(std::string_view text);

/// Computes and checks tags. Holds prepared OpenSSL HMAC state for one key: not thread-safe, use
/// one per thread. Tag compare is constant-time (CRYPTO_memcmp).
class Authenticator {
 public:
  /// Throws std::invalid_argument if the key is shorter than kKeyBytesMin or longer than
  /// kKeyBytesMax, std::runtime_error if OpenSSL cannot provide HMAC-SHA256.
  explicit Authenticator(const WireKey& key);
  ~Authenticator();
  Authenticator(const Authenticator&) = delete;
  Authenticator& operator=(const Authenticator&) = delete;
  Authenticator(Authenticator&&) noexcept;
  Authenticator& operator=(Authenticator&&) noexcept;

  /// HMAC-SHA256 of `data`.
  std::array<std::uint8_t, kTagBytes> mac(std::span<const std::uint8_t> data) const noexcept;
  /// Writes the tag over datagram[0, size-32) into the last 32 bytes. Requires size >= 32.
  void sign(std::span<std::uint8_t> datagram) const noexcept;
  /// True if the last 32 bytes are the tag over the rest. False for datagrams shorter than 32.
  bool verify(std::span<const std::uint8_t> datagram) const noexcept;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// What a datagram's key proves about its sender.
enum class Authority : std::uint8_t {
  none = 0,
  peer = 1,    ///< a single shared key (a supervisor checking lockd's answers, tests)
  worker = 2,  ///< the sender's own worker key: the sender is the worker its header names
  admin = 3,   ///< an admin key: revoke, transfer, reassign, list, show, stats; never a worker's message
  root = 4,    ///< the cluster key itself (key id | kAdminKeyIdBit): the root secret, everything
               ///< an admin may, and it may speak for any worker (it can derive every worker key)
};
std::string_view to_string(Authority a) noexcept;

/// The key a datagram must be tagged with, or auth == nullptr (no such key: drop it).
struct KeyMatch {
  const Authenticator* auth = nullptr;
  Authority authority = Authority::none;
};

/// Picks the key that must have tagged a datagram from (sender, key_id), before the tag is
/// checked. Not thread-safe (one per receiving thread, like the Receiver that owns it).
class Keyring {
 public:
  virtual ~Keyring() = default;
  /// The returned Authenticator stays valid until the next find().
  virtual KeyMatch find(const WorkerId& sender, std::uint16_t key_id) = 0;
};

/// One key: every datagram tagged with its key id, whatever its sender, is checked with it
/// (Authority::peer; Authority::worker for a worker key, Authority::admin for an admin key).
/// After rotate(), also the previous key (a supervisor reloading its worker key: answers to
/// requests it sent under the old key id, and lockd's pushes before lockd saw the new id, still
/// check).
class SingleKeyring final : public Keyring {
 public:
  explicit SingleKeyring(const WireKey& key);
  KeyMatch find(const WorkerId& sender, std::uint16_t key_id) override;
  /// `next` becomes the key; the current one is kept as the previous one (the one before is
  /// dropped), unless `next` has the same key id (then it replaces it). Authenticators returned
  /// by find() before are invalid after it.
  void rotate(const WireKey& next);
  std::uint16_t key_id() const noexcept { return key_id_; }

 private:
  std::uint16_t key_id_;
  Authority authority_;
  std::unique_ptr<Authenticator> auth_;
  std::uint16_t previous_id_ = 0;  ///< 0: none
  std::unique_ptr<Authenticator> previous_;
};

/// lockd's keys: cluster keys by id (a datagram with a cluster key id is checked with the key
/// derived for its claimed sender: Authority::worker; with the id | kAdminKeyIdBit, with the
/// cluster key itself: Authority::root) and admin keys by id (Authority::admin).
/// Derived keys are cached per (worker, key id), at most `derived_max` (then the cache is
/// emptied), so a heartbeat costs one hash lookup and one HMAC.
class ClusterKeyring final : public Keyring {
 public:
  static constexpr std::size_t kDerivedKeysMax = 16384;
  explicit ClusterKeyring(std::size_t derived_max = kDerivedKeysMax);
  /// Ablation (tests only, LEASEHOLD_ABLATE=shared-worker-key): every worker gets the same key
  /// (the one derived for worker kSharedWorker), as with one shared key: a valid tag then no
  /// longer proves the sender. derive_worker_key_as_issued() follows the same switch.
  static constexpr WorkerId kSharedWorker{0, 1};
  void ablate_shared_worker_key() noexcept;
  ~ClusterKeyring() override;
  /// Adds a cluster or admin key. Errors: invalid_argument (a worker key, key id 0, a cluster
  /// key id above kClusterKeyIdMax), exists (a key id already used).
  Status add(const WireKey& key);
  /// Replaces every key with `keys` (a key rotation: lockd reloads its keys). Errors: as add(),
  /// or invalid_argument (no cluster key among them), and then nothing changes. Derived keys are
  /// derived again as needed. Authenticators returned by find() before are invalid after it:
  /// call it between datagrams.
  Status replace(const std::vector<WireKey>& keys);
  /// The ids of the loaded keys of `kind` (cluster or admin), ascending.
  std::vector<std::uint16_t> key_ids(KeyKind kind) const;
  KeyMatch find(const WorkerId& sender, std::uint16_t key_id) override;
  /// The authenticator lockd signs with when it writes to `worker` and knows no key id that
  /// worker used (LockService prefers the one it last used): the key derived with the newest
  /// (highest) cluster key id; nullptr if there is no cluster key.
  const Authenticator* for_worker(const WorkerId& worker, std::uint16_t* key_id);
  std::size_t derived() const noexcept;
  std::uint64_t derivations() const noexcept;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace leasehold::wire
