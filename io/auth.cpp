// HMAC-SHA256 datagram tags and the key file (io/auth.hpp), on OpenSSL 3 libcrypto.
//
// The Authenticator keeps one keyed EVP_MAC_CTX; EVP_MAC_init with a NULL key re-initialises it
// with the key already set (OpenSSL 3 HMAC provider), which avoids re-deriving the HMAC pads and
// any allocation per datagram.
#include "io/auth.hpp"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

namespace leasehold::wire {
namespace {

std::string octal_mode(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string to_hex(std::span<const std::uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (std::uint8_t b : bytes) {
    s.push_back(kDigits[b >> 4]);
    s.push_back(kDigits[b & 0xF]);
  }
  return s;
}

}  // namespace

// ---- key file ----------------------------------------------------------------------------------

std::optional<WireKey> parse_key_hex(std::string_view text) {
  if (text.size() % 2 != 0 || text.size() < 2 * kKeyBytesMin || text.size() > 2 * kKeyBytesMax)
    return std::nullopt;
  WireKey key;
  key.bytes.reserve(text.size() / 2);
  for (std::size_t i = 0; i < text.size(); i += 2) {
    const int hi = hex_value(text[i]);
    const int lo = hex_value(text[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    key.bytes.push_back(static_cast<std::uint8_t>(hi << 4 | lo));
  }
  return key;
}

KeyLoad load_key_file(const std::string& path) {
  KeyLoad res;
  const std::string fix_new = "; create one with --generate-key " + path;
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer for ever, and
  // lockd or the supervisor would hang at start-up instead of refusing the key file below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    res.error = "key file " + path + ": cannot open: " + std::strerror(err) +
                (err == ENOENT ? fix_new : std::string());
    return res;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    res.error = "key file " + path + ": cannot stat: " + std::strerror(errno);
    ::close(fd);
    return res;
  }
  if (!S_ISREG(st.st_mode)) {
    res.error = "key file " + path + " is not a regular file";
    ::close(fd);
    return res;
  }
  if ((st.st_mode & 07777 & ~static_cast<mode_t>(0600)) != 0) {
    res.error = "key file " + path + " has mode " + octal_mode(st.st_mode) +
                ": it must be readable and writable by its owner only (0600 or stricter); fix: chmod 600 " + path;
    ::close(fd);
    return res;
  }
  // Owner: a key file another user owns could be replaced or read by that user; only the
  // process's own uid and root are trusted with it.
  if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    res.error = "key file " + path + " is owned by uid " + std::to_string(st.st_uid) + ", not by this process (uid " +
                std::to_string(::geteuid()) + ") or root: another user could read or replace it; fix: chown " +
                std::to_string(::geteuid()) + " " + path;
    ::close(fd);
    return res;
  }
  char buf[kKeyFileBytesMax + 1];
  // The hex text is a copy of the key: it is wiped on every way out of this function.
  struct Wipe {
    char* p;
    std::size_t n;
    ~Wipe() { OPENSSL_cleanse(p, n); }
  } wipe{buf, sizeof buf};
  std::size_t n = 0;
  while (n < sizeof buf) {
    const ssize_t got = ::read(fd, buf + n, sizeof buf - n);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      res.error = "key file " + path + ": cannot read: " + std::strerror(errno);
      ::close(fd);
      return res;
    }
    if (got == 0) break;
    n += static_cast<std::size_t>(got);
  }
  ::close(fd);
  std::string_view text(buf, n);
  if (n > kKeyFileBytesMax) {
    res.error = "key file " + path + " is larger than " + std::to_string(kKeyFileBytesMax) +
                " bytes; expected " + std::to_string(2 * kKeyBytesMin) + ".." + std::to_string(2 * kKeyBytesMax) +
                " hex digits" + fix_new;
    return res;
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.remove_suffix(1);
  if (text.empty()) {
    res.error = "key file " + path + " is empty" + fix_new;
    return res;
  }
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (hex_value(text[i]) < 0) {
      res.error = "key file " + path + ": byte " + std::to_string(i) +
                  " is not a hex digit; the key is " + std::to_string(2 * kKeyBytesMin) + ".." +
                  std::to_string(2 * kKeyBytesMax) + " hex digits" + fix_new;
      return res;
    }
  }
  if (text.size() < 2 * kKeyBytesMin || text.size() % 2 != 0) {
    res.error = "key file " + path + " holds " + std::to_string(text.size()) + " hex digits; at least " +
                std::to_string(2 * kKeyBytesMin) + " (an even number) are needed" + fix_new;
    return res;
  }
  if (text.size() > 2 * kKeyBytesMax) {
    res.error = "key file " + path + " holds " + std::to_string(text.size()) + " hex digits; at most " +
                std::to_string(2 * kKeyBytesMax) + " are used by HMAC-SHA256" + fix_new;
    return res;
  }
  res.key = parse_key_hex(text);
  return res;
}

std::string generate_key_file(const std::string& path) {
  std::uint8_t raw[kKeyBytesMin];
  if (RAND_bytes(raw, sizeof raw) != 1) return "cannot generate a key: the OpenSSL random generator failed";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    const int err = errno;
    return "cannot create key file " + path + ": " + std::strerror(err) +
           (err == EEXIST ? " (an existing key is never overwritten; remove it first to replace it)" : "");
  }
  std::string text = to_hex(raw) + "\n";
  OPENSSL_cleanse(raw, sizeof raw);
  std::string error;
  if (::fchmod(fd, 0600) != 0) error = "cannot chmod 600 key file " + path + ": " + std::strerror(errno);
  std::size_t done = 0;
  while (error.empty() && done < text.size()) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) error = "cannot write key file " + path + ": " + std::strerror(errno);
    else done += static_cast<std::size_t>(w);
  }
  if (error.empty() && ::fsync(fd) != 0) error = "cannot fsync key file " + path + ": " + std::strerror(errno);
  ::close(fd);
  OPENSSL_cleanse(text.data(), text.size());
  if (!error.empty()) ::unlink(path.c_str());
  return error;
}

// ---- HMAC --------------------------------------------------------------------------------------

struct Authenticator::State {
  EVP_MAC* mac = nullptr;
  EVP_MAC_CTX* ctx = nullptr;
  ~State() {
    EVP_MAC_CTX_free(ctx);
    EVP_MAC_free(mac);
  }
};

Authenticator::Authenticator(const WireKey& key) : state_(std::make_unique<State>()) {
  if (key.bytes.size() < kKeyBytesMin || key.bytes.size() > kKeyBytesMax)
    throw std::invalid_argument("HMAC key is " + std::to_string(key.bytes.size()) + " bytes; expected " +
                                std::to_string(kKeyBytesMin) + ".." + std::to_string(kKeyBytesMax));
  state_->mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (state_->mac == nullptr) throw std::runtime_error("OpenSSL provides no HMAC implementation");
  state_->ctx = EVP_MAC_CTX_new(state_->mac);
  if (state_->ctx == nullptr) throw std::runtime_error("OpenSSL: EVP_MAC_CTX_new failed");
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_construct_end()};
  if (EVP_MAC_init(state_->ctx, key.bytes.data(), key.bytes.size(), params) != 1)
    throw std::runtime_error("OpenSSL: HMAC-SHA256 initialisation failed");
}

Authenticator::~Authenticator() = default;
Authenticator::Authenticator(Authenticator&&) noexcept = default;
Authenticator& Authenticator::operator=(Authenticator&&) noexcept = default;

std::array<std::uint8_t, kTagBytes> Authenticator::mac(std::span<const std::uint8_t> data) const noexcept {
  std::array<std::uint8_t, kTagBytes> tag{};
  std::size_t len = 0;
  // Re-initialise with the key already set; every call starts from the keyed state.
  const bool ok = EVP_MAC_init(state_->ctx, nullptr, 0, nullptr) == 1 &&
                  EVP_MAC_update(state_->ctx, data.data(), data.size()) == 1 &&
                  EVP_MAC_final(state_->ctx, tag.data(), &len, tag.size()) == 1 && len == kTagBytes;
  if (!ok) {
    // Cannot happen with a working libcrypto; a random tag makes verification fail closed.
    RAND_bytes(tag.data(), static_cast<int>(tag.size()));
  }
  return tag;
}

void Authenticator::sign(std::span<std::uint8_t> datagram) const noexcept {
  if (datagram.size() < kTagBytes) return;
  const std::size_t body = datagram.size() - kTagBytes;
  const auto tag = mac(datagram.first(body));
  std::memcpy(datagram.data() + body, tag.data(), kTagBytes);
}

bool Authenticator::verify(std::span<const std::uint8_t> datagram) const noexcept {
  if (datagram.size() < kTagBytes) return false;
  const std::size_t body = datagram.size() - kTagBytes;
  const auto tag = mac(datagram.first(body));
  return CRYPTO_memcmp(tag.data(), datagram.data() + body, kTagBytes) == 0;
}

}  // namespace leasehold::wire
