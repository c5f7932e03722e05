// leasehold/io: datagram authentication with HMAC-SHA256 and a shared key file.
//
// DESIGN.md "The wire protocol": every datagram ends in an HMAC-SHA256 tag (RFC 2104) over its
// header and payload, computed with a key shared by lockd, the supervisors and the CLI. The key
// lives in a file that only its owner may read (mode 0600 or stricter); the daemons refuse to
// start otherwise.
//
// Key file format: the key as hex text, kKeyBytesMin..kKeyBytesMax bytes (64..128 hex digits),
// optionally followed by one newline. generate_key_file() writes one.
#pragma once

#include "io/protocol.hpp"

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
inline constexpr std::size_t kKeyFileBytesMax = 2 * kKeyBytesMax + 2;

/// A shared HMAC key (raw bytes).
struct WireKey {
  std::vector<std::uint8_t> bytes;
};

struct KeyLoad {
  std::optional<WireKey> key;
  std::string error;  ///< set when key is empty: what is wrong with which file, and the fix
  explicit operator bool() const noexcept { return key.has_value(); }
};

/// Loads the key file at `path`. Refuses (error text names the path, what was found and the fix):
/// a missing/unreadable file, a file that is not a regular file, a mode with any group/other bit
/// set ("mode 0644 ... fix: chmod 600 <path>"), an owner other than this process's uid or root
/// ("owned by uid N ... fix: chown ..."), an empty or too short key, non-hex content. The file's
/// text is wiped from memory before returning.
KeyLoad load_key_file(const std::string& path);

/// Writes a fresh random key (kKeyBytesMin bytes from the OpenSSL CSPRNG) as hex to `path`,
/// created with mode 0600 (O_EXCL: an existing file is never overwritten). Returns "" on
/// success, otherwise the error text.
std::string generate_key_file(const std::string& path);

/// Key from hex text (the file format); nullopt if not 64..128 hex digits.
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

}  // namespace leasehold::wire
