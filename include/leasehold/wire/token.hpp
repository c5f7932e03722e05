// leasehold/io: signed fencing tokens (Ed25519, OpenSSL libcrypto).
//
// DESIGN.md "Trust model: Tokens". Every grant lockd makes carries a token
// {name, epoch, holder, worker, issued_at, key_id} signed with lockd's Ed25519 signing key, so a
// resource can tell a real grant from a made-up one with lockd's *public* key alone: a key that
// gives no power over any name (beyond Chubby's sequencers, which a resource must check against
// the lock service). A plain epoch compare admits any epoch above the highest seen, so a stale
// holder that invents one (its own + 1000, or 2^63-1) fences the rightful holder out; a signed
// token makes an epoch something only lockd can hand out.
//
// Encoding (canonical, versioned, exactly kTokenBytes long; integers little-endian, ids 16 bytes
// hi then lo as on the wire):
//
//   offset size  field
//        0    4  magic         kTokenMagic ("LHT1" as bytes 'L','H','T','1')
//        4    1  version       kTokenVersion
//        5    1  reserved      0 (anything else is rejected)
//        6    2  reserved      0
//        8    4  key_id        which signing key (signing_key_id_of its public key); 0 = none
//       12   16  name_id       NameId of the name (UUIDv5 of the text, lease/types.hpp)
//       28    8  epoch         the grant's epoch (> 0)
//       36   16  holder        the sandbox the name is granted to
//       52   16  worker        the holder's worker (nil for a grant without one)
//       68    8  issued_at_ns  lockd's CLOCK_REALTIME at the grant, ns since the Unix epoch
//       76   64  signature     Ed25519 (RFC 8032) over bytes [0, 76)
//
// A decoder refuses any other length, magic, version or non-zero reserved byte: there is one
// encoding of a token, so a signature covers exactly one meaning.
//
// Key ids: the id of a public key is the first 4 bytes (little-endian) of SHA-256 over its 32
// raw bytes (never 0), so anyone holding the public key computes the same id and a verifier can
// hold several keys (a rotation: the old and the new signing key) and pick one per token.
//
// Thread-safety: TokenSigner and TokenVerifier are safe to use from several threads at once
// (OpenSSL keys are read-only once loaded; the verifier's cache has its own mutex).
#pragma once

#include "leasehold/lease/result.hpp"
#include "leasehold/lease/types.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace leasehold::token {

inline constexpr std::uint32_t kTokenMagic = 0x3154484Cu;  ///< bytes "LHT1" little-endian
inline constexpr std::uint8_t kTokenVersion = 1;
inline constexpr std::size_t kSignedBytes = 76;     ///< the signed part
inline constexpr std::size_t kSignatureBytes = 64;  ///< Ed25519
inline constexpr std::size_t kTokenBytes = kSignedBytes + kSignatureBytes;  // 140
inline constexpr std::size_t kPublicKeyBytes = 32;   ///< raw Ed25519 public key
inline constexpr std::size_t kPrivateKeyBytes = 32;  ///< raw Ed25519 private key (seed)
/// Most public keys one verifier holds (current + previous during a rotation, and some slack).
inline constexpr std::size_t kVerifierKeysMax = 16;
/// Verified tokens a verifier remembers (one per name: the newest epoch); beyond it the cache
/// is emptied and refilled (a miss costs one signature check, never a wrong answer).
inline constexpr std::size_t kVerifyCacheEntriesMax = 1u << 16;

using TokenBytes = std::array<std::uint8_t, kTokenBytes>;

/// A grant as lockd signs it.
struct GrantToken {
  NameId name;
  Epoch epoch = 0;
  SandboxId holder;
  WorkerId worker;
  std::int64_t issued_at_ns = 0;  ///< lockd's CLOCK_REALTIME, ns (informational: nobody times by it)
  std::uint32_t key_id = 0;
  std::array<std::uint8_t, kSignatureBytes> signature{};
  friend bool operator==(const GrantToken&, const GrantToken&) = default;
};

/// The canonical encoding (the layout above).
TokenBytes encode(const GrantToken& t) noexcept;

/// Why bytes are not a token, or a token does not verify. Values are stable (counted, printed).
enum class Reject : std::uint8_t {
  none = 0,
  unsigned_token = 1,  ///< no token at all (a write that carries only an epoch)
  malformed = 2,       ///< wrong length, magic, version or reserved bytes
  unknown_key = 3,     ///< key_id names no public key this verifier holds
  bad_signature = 4,   ///< the signature does not verify: forged, altered, or another key's
  wrong_name = 5,      ///< a valid token, but for another name
  wrong_epoch = 6,     ///< a valid token, but the write claims another epoch
  wrong_holder = 7,    ///< a valid token, but the write claims another holder
};
inline constexpr std::size_t kRejectCount = 8;
/// "unsigned", "malformed", "unknown_key", "bad_signature", "wrong_name", "wrong_epoch",
/// "wrong_holder" ("ok" for none).
std::string_view to_string(Reject r) noexcept;

/// Decodes exactly kTokenBytes bytes. Errc::corrupt otherwise, the message naming the field
/// (length, magic, version, reserved byte, key id 0, epoch 0). A decoded token allocates
/// nothing (TokenVerifier::verify decodes every write's token).
Result<GrantToken> decode(std::span<const std::uint8_t> bytes);

/// The key id of a raw Ed25519 public key (see the top of this file).
std::uint32_t key_id_of(std::span<const std::uint8_t, kPublicKeyBytes> public_key) noexcept;
/// "1a2b3c4d": a key id as 8 hex digits (how tools print it).
std::string key_id_text(std::uint32_t key_id);
/// Lowercase hex of bytes, and back (nullopt for odd length or a non-hex digit).
std::string to_hex(std::span<const std::uint8_t> bytes);
std::optional<std::vector<std::uint8_t>> from_hex(std::string_view text);

/// lockd's signing key. Loaded from a file or generated; signs grants.
class TokenSigner {
 public:
  /// Loads an Ed25519 private key: PEM (PKCS#8, as `openssl genpkey -algorithm ed25519` and
  /// generate_signing_key_file write it) or exactly 32 raw bytes. The file must be a regular
  /// file of mode 0600 or stricter owned by this uid or root (as every key file; wire/auth.hpp).
  /// The signer (never nullptr), or a Status naming the file, what is wrong and the fix: as
  /// wire::read_private_file (not_found, permission_denied, invalid_argument, io_error), or
  /// corrupt (too large, not a PEM private key, not Ed25519).
  static Result<std::unique_ptr<TokenSigner>> load(const std::string& path);
  /// A new random key (tests, benchmarks; lockd uses generate_signing_key_file). io_error if
  /// OpenSSL fails.
  static Result<std::unique_ptr<TokenSigner>> generate();
  /// From 32 raw private-key bytes. invalid_argument for another size or a key OpenSSL refuses.
  static Result<std::unique_ptr<TokenSigner>> from_raw(std::span<const std::uint8_t> private_key);
  ~TokenSigner();
  TokenSigner(const TokenSigner&) = delete;
  TokenSigner& operator=(const TokenSigner&) = delete;

  /// Sets t.key_id to this key's id and t.signature over the encoding. False only if OpenSSL
  /// fails (then the signature is zero and the token verifies nowhere).
  bool sign(GrantToken& t) const noexcept;
  std::uint32_t key_id() const noexcept { return key_id_; }
  const std::array<std::uint8_t, kPublicKeyBytes>& public_key() const noexcept { return public_; }
  /// The public key as PEM (SubjectPublicKeyInfo), what `F.pub` holds.
  std::string public_key_pem() const;
  /// Writes the private key as PEM to `path` (0600, never overwriting) and the public key to
  /// `path + ".pub"` (0644). Errors: as wire::write_new_key_file (exists: never overwrites),
  /// io_error (OpenSSL cannot encode the key).
  Status write_files(const std::string& path) const;

 private:
  struct Key;
  explicit TokenSigner(std::unique_ptr<Key> key);
  std::unique_ptr<Key> key_;
  std::array<std::uint8_t, kPublicKeyBytes> public_{};
  std::uint32_t key_id_ = 0;
};

/// Generates a signing key and writes `path` (private, 0600) and `path.pub` (public, 0644).
/// Errors: as TokenSigner::write_files (exists: an existing file is never overwritten).
Status generate_signing_key_file(const std::string& path);

/// A raw Ed25519 public key as PEM (SubjectPublicKeyInfo, what `F.pub` holds); "" if OpenSSL fails.
std::string public_key_pem(std::span<const std::uint8_t, kPublicKeyBytes> public_key);
/// Reads a public key file: PEM (SubjectPublicKeyInfo, `F.pub`), 32 raw bytes or 64 hex digits.
/// A public key is not secret: any mode is accepted. Errors name the file and the problem:
/// errc_of_errno (cannot open), corrupt (too large, not a public key, not Ed25519).
Result<std::array<std::uint8_t, kPublicKeyBytes>> read_public_key_file(const std::string& path);

/// What verify() decided.
struct Verdict {
  Reject reject = Reject::none;
  bool cached = false;  ///< accepted from the cache (no signature check this time)
  std::string detail;   ///< why not accepted: names the reason and the numbers; empty if accepted
  bool ok() const noexcept { return reject == Reject::none; }
};

/// A resource's view of lockd's public keys: verifies tokens with them alone.
class TokenVerifier {
 public:
  TokenVerifier();
  ~TokenVerifier();
  TokenVerifier(const TokenVerifier&) = delete;
  TokenVerifier& operator=(const TokenVerifier&) = delete;

  /// Adds a raw public key (32 bytes). Errors: invalid_argument (bad size, a key OpenSSL
  /// refuses, more than kVerifierKeysMax keys), exists (another key with the same key id).
  /// Adding a key already held is a no-op.
  Status add_public_key(std::span<const std::uint8_t> raw);
  /// Adds a public key from a file: PEM (SubjectPublicKeyInfo, `F.pub`) or 32 raw bytes or 64
  /// hex digits. A public key is not secret: any mode is accepted. Errors: as
  /// read_public_key_file and add_public_key, the message naming the file.
  Status add_public_key_file(const std::string& path);
  /// Key ids held, ascending.
  std::vector<std::uint32_t> key_ids() const;

  /// Verifies `bytes` as the token of a write to (name, epoch, holder): decodes it, finds its
  /// key id, checks the fields against the claim and the signature. A token accepted once is
  /// remembered per (name, epoch, signature), so later writes of the same grant cost a compare.
  Verdict verify(std::span<const std::uint8_t> bytes, NameId name, Epoch epoch, SandboxId holder);

  /// Signature checks made, and verify() calls answered from the cache.
  std::uint64_t signature_checks() const noexcept;
  std::uint64_t cache_hits() const noexcept;

 private:
  struct Keys;
  std::unique_ptr<Keys> keys_;
  mutable std::mutex mutex_;
  std::unordered_map<NameId, TokenBytes> cache_;  // the newest verified token per name
  std::uint64_t checks_ = 0;
  std::uint64_t hits_ = 0;
};

}  // namespace leasehold::token
