// HMAC-SHA256 datagram tags and the key file (wire/auth.hpp), on OpenSSL 3 libcrypto.
//
// The Authenticator keeps the SHA-256 states of the key's inner and outer HMAC pads (see "HMAC"
// below): no pad is derived and nothing is allocated per datagram.
#include "leasehold/wire/auth.hpp"

#include <algorithm>
#include <array>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <unordered_map>

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

using token::to_hex;  // wire/token.hpp

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

namespace {

bool parse_u16(std::string_view v, std::uint16_t& out) {
  if (v.empty() || v.size() > 5) return false;
  unsigned x = 0;
  for (char c : v) {
    if (c < '0' || c > '9') return false;
    x = x * 10 + static_cast<unsigned>(c - '0');
  }
  if (x == 0 || x > 65535) return false;
  out = static_cast<std::uint16_t>(x);
  return true;
}

// The header line: "leasehold-key kind=K key-id=N [worker=UUID]". "" or what is wrong.
std::string parse_key_header(std::string_view line, WireKey& key) {
  constexpr std::string_view kMagicWord = "leasehold-key";
  line.remove_prefix(kMagicWord.size());
  bool have_kind = false, have_id = false, have_worker = false;
  while (!line.empty()) {
    while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    if (line.empty()) break;
    const std::size_t end = std::min(line.find(' '), line.size());
    const std::string_view tok = line.substr(0, end);
    line.remove_prefix(end);
    const std::size_t eq = tok.find('=');
    if (eq == std::string_view::npos) return "header field \"" + std::string(tok) + "\" is not NAME=VALUE";
    const std::string_view name = tok.substr(0, eq), value = tok.substr(eq + 1);
    if (name == "kind") {
      if (value == "cluster") key.kind = KeyKind::cluster;
      else if (value == "worker") key.kind = KeyKind::worker;
      else if (value == "admin") key.kind = KeyKind::admin;
      else return "kind \"" + std::string(value) + "\" is not cluster, worker or admin";
      have_kind = true;
    } else if (name == "key-id") {
      if (!parse_u16(value, key.key_id)) return "key-id \"" + std::string(value) + "\" is not 1..65535";
      have_id = true;
    } else if (name == "worker") {
      const auto w = WorkerId::parse(std::string(value));
      if (!w || w->is_nil()) return "worker \"" + std::string(value) + "\" is not a worker id (a UUID)";
      key.worker = *w;
      have_worker = true;
    } else {
      return "unknown header field \"" + std::string(name) + "\"";
    }
  }
  if (!have_kind) return "the header line has no kind=";
  if (!have_id) return "the header line has no key-id=";
  if (key.kind == KeyKind::worker && !have_worker) return "a worker key needs worker=";
  if (key.kind != KeyKind::worker && have_worker) return "only a worker key names a worker";
  return {};
}

}  // namespace

KeyLoad parse_key_file_text(const std::string& path, std::string_view text) {
  // The fix names the program that makes keys: the CLI and the supervisor have no such flag.
  const std::string fix_new = "; create one with `leasehold-lockd --generate-key " + path +
                              "` (a cluster key) or `leasehold-lockd --derive-worker-key --worker-id W "
                              "--key-file CLUSTER_KEY --out " + path + "` (a worker's)";
  WireKey meta;
  if (text.rfind("leasehold-key", 0) == 0) {
    const std::size_t nl = text.find('\n');
    if (nl == std::string_view::npos) {
      return Status{Errc::corrupt, "key file " + path + " has a header line but no key line" + fix_new};
    }
    std::string_view header = text.substr(0, nl);
    if (!header.empty() && header.back() == '\r') header.remove_suffix(1);
    if (header.size() > kKeyFileHeaderBytesMax) {
      return Status{Errc::corrupt, "key file " + path + ": the header line is longer than " +
                  std::to_string(kKeyFileHeaderBytesMax) + " bytes"};
    }
    if (std::string why = parse_key_header(header, meta); !why.empty()) {
      return Status{Errc::corrupt, "key file " + path + ": " + why};
    }
    text.remove_prefix(nl + 1);
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.remove_suffix(1);
  if (text.empty()) {
    return Status{Errc::corrupt, "key file " + path + " is empty" + fix_new};
  }
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (hex_value(text[i]) < 0) {
      return Status{Errc::corrupt, "key file " + path + ": byte " + std::to_string(i) +
                  " is not a hex digit; the key is " + std::to_string(2 * kKeyBytesMin) + ".." +
                  std::to_string(2 * kKeyBytesMax) + " hex digits" + fix_new};
    }
  }
  if (text.size() < 2 * kKeyBytesMin || text.size() % 2 != 0) {
    return Status{Errc::corrupt, "key file " + path + " holds " + std::to_string(text.size()) + " hex digits; at least " +
                std::to_string(2 * kKeyBytesMin) + " (an even number) are needed" + fix_new};
  }
  if (text.size() > 2 * kKeyBytesMax) {
    return Status{Errc::corrupt, "key file " + path + " holds " + std::to_string(text.size()) + " hex digits; at most " +
                std::to_string(2 * kKeyBytesMax) + " are used by HMAC-SHA256" + fix_new};
  }
  std::optional<WireKey> key = parse_key_hex(text);
  if (!key) return Status{Errc::corrupt, "key file " + path + ": the key line is not hex" + fix_new};
  key->kind = meta.kind;
  key->key_id = meta.key_id;
  key->worker = meta.worker;
  return std::move(*key);
}

Status read_private_file(const std::string& path, std::span<char> buf, std::size_t& n, std::string_view fix_new) {
  n = 0;
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer for ever, and
  // lockd or the supervisor would hang at start-up instead of refusing the key file below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    return Status{errc_of_errno(err), "key file " + path + ": cannot open: " + std::strerror(err) +
                                          (err == ENOENT ? std::string(fix_new) : std::string())};
  }
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } close_fd{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Status::from_errno(errno, "key file " + path + ": cannot stat");
  if (!S_ISREG(st.st_mode)) return Status{Errc::invalid_argument, "key file " + path + " is not a regular file"};
  if ((st.st_mode & 07777 & ~static_cast<mode_t>(0600)) != 0)
    return Status{Errc::permission_denied,
                  "key file " + path + " has mode " + octal_mode(st.st_mode) +
                      ": it must be readable and writable by its owner only (0600 or stricter); fix: chmod 600 " + path};
  // Owner: a key file another user owns could be replaced or read by that user; only the
  // process's own uid and root are trusted with it.
  if (st.st_uid != ::geteuid() && st.st_uid != 0)
    return Status{Errc::permission_denied,
                  "key file " + path + " is owned by uid " + std::to_string(st.st_uid) + ", not by this process (uid " +
                      std::to_string(::geteuid()) + ") or root: another user could read or replace it; fix: chown " +
                      std::to_string(::geteuid()) + " " + path};
  while (n < buf.size()) {
    const ssize_t got = ::read(fd, buf.data() + n, buf.size() - n);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return Status::from_errno(errno, "key file " + path + ": cannot read");
    if (got == 0) break;
    n += static_cast<std::size_t>(got);
  }
  return {};
}

KeyLoad load_key_file(const std::string& path) {
  // The fix names the program that makes keys: the CLI and the supervisor have no such flag.
  const std::string fix_new = "; create one with `leasehold-lockd --generate-key " + path +
                              "` (a cluster key) or `leasehold-lockd --derive-worker-key --worker-id W "
                              "--key-file CLUSTER_KEY --out " + path + "` (a worker's)";
  char buf[kKeyFileBytesMax + 1];
  // The hex text is a copy of the key: it is wiped on every way out of this function.
  struct Wipe {
    char* p;
    std::size_t n;
    ~Wipe() { OPENSSL_cleanse(p, n); }
  } wipe{buf, sizeof buf};
  std::size_t n = 0;
  if (Status st = read_private_file(path, buf, n, fix_new); !st.ok()) return st;
  if (n > kKeyFileBytesMax) {
    return Status{Errc::corrupt, "key file " + path + " is larger than " + std::to_string(kKeyFileBytesMax) +
                " bytes; expected a header line and " + std::to_string(2 * kKeyBytesMin) + ".." +
                std::to_string(2 * kKeyBytesMax) + " hex digits" + fix_new};
  }
  return parse_key_file_text(path, std::string_view(buf, n));
}

std::string_view to_string(KeyKind k) noexcept {
  switch (k) {
    case KeyKind::cluster: return "cluster";
    case KeyKind::worker: return "worker";
    case KeyKind::admin: return "admin";
  }
  return "unknown";
}

std::string key_text(const WireKey& key) {
  return std::string(to_string(key.kind)) + " key " + std::to_string(key.key_id);
}

std::string format_key(const WireKey& key) {
  std::string text = "leasehold-key kind=" + std::string(to_string(key.kind)) +
                     " key-id=" + std::to_string(key.key_id);
  if (key.kind == KeyKind::worker) text += " worker=" + key.worker.str();
  text += "\n" + to_hex(key.bytes) + "\n";
  return text;
}

Status write_new_key_file(const std::string& path, std::string_view text, mode_t mode) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) {
    const int err = errno;
    return Status{errc_of_errno(err),
                  "cannot create key file " + path + ": " + std::strerror(err) +
                      (err == EEXIST ? " (an existing key is never overwritten; remove it first to replace it)" : "")};
  }
  Status error;
  if (::fchmod(fd, mode) != 0)
    error = Status::from_errno(errno, "cannot chmod " + octal_mode(mode).substr(1) + " key file " + path);
  std::size_t done = 0;
  while (error.ok() && done < text.size()) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) error = Status::from_errno(errno, "cannot write key file " + path);
    else done += static_cast<std::size_t>(w);
  }
  if (error.ok() && ::fsync(fd) != 0) error = Status::from_errno(errno, "cannot fsync key file " + path);
  ::close(fd);
  if (!error.ok()) ::unlink(path.c_str());
  return error;
}

Status write_key_file(const std::string& path, const WireKey& key) {
  if (key.bytes.size() < kKeyBytesMin || key.bytes.size() > kKeyBytesMax)
    return Status{Errc::invalid_argument,
                  "cannot write key file " + path + ": the key is " + std::to_string(key.bytes.size()) + " bytes"};
  if (key.key_id == 0) return Status{Errc::invalid_argument, "cannot write key file " + path + ": key id 0 names no key"};
  std::string text = format_key(key);
  Status error = write_new_key_file(path, text, 0600);
  OPENSSL_cleanse(text.data(), text.size());
  return error;
}

Status generate_key_file(const std::string& path, KeyKind kind, std::uint16_t key_id) {
  if (kind == KeyKind::worker)
    return Status{Errc::invalid_argument,
                  "a worker key is derived from the cluster key (--derive-worker-key), not generated"};
  WireKey key;
  key.kind = kind;
  key.key_id = key_id;
  key.bytes.resize(kKeyBytesMin);
  if (RAND_bytes(key.bytes.data(), static_cast<int>(key.bytes.size())) != 1)
    return Status{Errc::io_error, "cannot generate a key: the OpenSSL random generator failed"};
  Status err = write_key_file(path, key);
  OPENSSL_cleanse(key.bytes.data(), key.bytes.size());
  return err;
}

WireKey derive_worker_key(const WireKey& cluster, const WorkerId& worker) {
  if (cluster.kind != KeyKind::cluster)
    throw std::invalid_argument("a worker key is derived from a cluster key, not from a " +
                                std::string(to_string(cluster.kind)) + " key");
  if (worker.is_nil()) throw std::invalid_argument("a worker key needs a worker id");
  EVP_KDF* kdf = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
  if (kdf == nullptr) throw std::runtime_error("OpenSSL provides no HKDF implementation");
  EVP_KDF_CTX* ctx = EVP_KDF_CTX_new(kdf);
  EVP_KDF_free(kdf);
  if (ctx == nullptr) throw std::runtime_error("OpenSSL: EVP_KDF_CTX_new failed");
  std::uint8_t info[18];
  for (int i = 0; i < 8; ++i) {
    info[i] = static_cast<std::uint8_t>(worker.hi >> (56 - 8 * i));
    info[8 + i] = static_cast<std::uint8_t>(worker.lo >> (56 - 8 * i));
  }
  info[16] = static_cast<std::uint8_t>(cluster.key_id >> 8);
  info[17] = static_cast<std::uint8_t>(cluster.key_id);
  char digest[] = "SHA256";
  char salt[] = "leasehold worker key v1";
  const OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, const_cast<std::uint8_t*>(cluster.bytes.data()),
                                        cluster.bytes.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, salt, sizeof salt - 1),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, info, sizeof info),
      OSSL_PARAM_construct_end()};
  WireKey out;
  out.kind = KeyKind::worker;
  out.key_id = cluster.key_id;
  out.worker = worker;
  out.bytes.resize(kDerivedKeyBytes);
  const int ok = EVP_KDF_derive(ctx, out.bytes.data(), out.bytes.size(), params);
  EVP_KDF_CTX_free(ctx);
  if (ok != 1) throw std::runtime_error("OpenSSL: HKDF-SHA256 derivation failed");
  return out;
}

// ---- HMAC --------------------------------------------------------------------------------------

// HMAC-SHA256 (RFC 2104) from the SHA-256 states after the key's inner and outer padded blocks,
// computed once per key: a tag is then a copy of each state, the data, and two finals, the least
// SHA-256 work HMAC allows. OpenSSL's low-level SHA256_* (deprecated in OpenSSL 3, not removed)
// runs the CPU's SHA extensions like the EVP path does, without the EVP_MAC re-initialisation
// per datagram (its context copy through the provider): perf/mac measured 0.86x of its time for
// a 29-entry heartbeat. The tags are the same bytes.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

struct Authenticator::State {
  SHA256_CTX inner{};  ///< after (key ^ ipad)
  SHA256_CTX outer{};  ///< after (key ^ opad)
  ~State() { OPENSSL_cleanse(this, sizeof *this); }
};

Authenticator::Authenticator(const WireKey& key) : state_(std::make_unique<State>()) {
  if (key.bytes.size() < kKeyBytesMin || key.bytes.size() > kKeyBytesMax)
    throw std::invalid_argument("HMAC key is " + std::to_string(key.bytes.size()) + " bytes; expected " +
                                std::to_string(kKeyBytesMin) + ".." + std::to_string(kKeyBytesMax));
  static_assert(kKeyBytesMax <= SHA256_CBLOCK, "a key longer than the block would be hashed first");
  std::array<std::uint8_t, SHA256_CBLOCK> ipad{}, opad{};
  std::memcpy(ipad.data(), key.bytes.data(), key.bytes.size());  // zero-padded to the block
  std::memcpy(opad.data(), key.bytes.data(), key.bytes.size());
  for (auto& b : ipad) b ^= 0x36;
  for (auto& b : opad) b ^= 0x5c;
  const bool ok = SHA256_Init(&state_->inner) == 1 && SHA256_Update(&state_->inner, ipad.data(), ipad.size()) == 1 &&
                  SHA256_Init(&state_->outer) == 1 && SHA256_Update(&state_->outer, opad.data(), opad.size()) == 1;
  OPENSSL_cleanse(ipad.data(), ipad.size());
  OPENSSL_cleanse(opad.data(), opad.size());
  if (!ok) throw std::runtime_error("OpenSSL: SHA-256 initialisation for HMAC-SHA256 failed");
}

Authenticator::~Authenticator() = default;
Authenticator::Authenticator(Authenticator&&) noexcept = default;
Authenticator& Authenticator::operator=(Authenticator&&) noexcept = default;

std::array<std::uint8_t, kTagBytes> Authenticator::mac(std::span<const std::uint8_t> data) const noexcept {
  static_assert(kTagBytes == SHA256_DIGEST_LENGTH);
  std::array<std::uint8_t, kTagBytes> tag{};
  SHA256_CTX c = state_->inner;  // every call starts from the keyed states
  bool ok = SHA256_Update(&c, data.data(), data.size()) == 1 && SHA256_Final(tag.data(), &c) == 1;
  c = state_->outer;
  ok = ok && SHA256_Update(&c, tag.data(), tag.size()) == 1 && SHA256_Final(tag.data(), &c) == 1;
  OPENSSL_cleanse(&c, sizeof c);
  if (!ok) {
    // Cannot happen with a working libcrypto; a random tag makes verification fail closed.
    RAND_bytes(tag.data(), static_cast<int>(tag.size()));
  }
  return tag;
}

#pragma GCC diagnostic pop

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

namespace leasehold::wire {

// ---- keyrings ----------------------------------------------------------------------------------

std::string_view to_string(Authority a) noexcept {
  switch (a) {
    case Authority::none: return "none";
    case Authority::peer: return "peer";
    case Authority::worker: return "worker";
    case Authority::admin: return "admin";
    case Authority::root: return "root";
  }
  return "unknown";
}

namespace {
Authority authority_of(const WireKey& key) {
  return key.kind == KeyKind::worker ? Authority::worker : key.kind == KeyKind::admin ? Authority::admin : Authority::peer;
}
}  // namespace

SingleKeyring::SingleKeyring(const WireKey& key)
    : key_id_(key.key_id), authority_(authority_of(key)), auth_(std::make_unique<Authenticator>(key)) {}

KeyMatch SingleKeyring::find(const WorkerId&, std::uint16_t key_id) {
  if (key_id == key_id_) return KeyMatch{auth_.get(), authority_};
  if (key_id == previous_id_ && previous_ != nullptr) return KeyMatch{previous_.get(), authority_};
  return {};
}

void SingleKeyring::rotate(const WireKey& next) {
  auto fresh = std::make_unique<Authenticator>(next);  // throws before anything changes
  if (next.key_id != key_id_) {
    previous_ = std::move(auth_);
    previous_id_ = key_id_;
  }
  auth_ = std::move(fresh);
  key_id_ = next.key_id;
  authority_ = authority_of(next);
  if (previous_id_ == key_id_) {
    previous_.reset();
    previous_id_ = 0;
  }
}

namespace {
struct DerivedKeyRef {
  WorkerId worker;
  std::uint16_t key_id = 0;
  friend bool operator==(const DerivedKeyRef&, const DerivedKeyRef&) = default;
};
struct DerivedKeyRefHash {
  std::size_t operator()(const DerivedKeyRef& k) const noexcept {
    return std::hash<WorkerId>{}(k.worker) ^ (static_cast<std::size_t>(k.key_id) * 0x9E3779B97F4A7C15ULL);
  }
};
}  // namespace

struct ClusterKeyring::State {
  std::size_t derived_max;
  std::unordered_map<std::uint16_t, WireKey> cluster;
  std::unordered_map<std::uint16_t, std::unique_ptr<Authenticator>> cluster_direct;  // id | kAdminKeyIdBit
  std::unordered_map<std::uint16_t, std::unique_ptr<Authenticator>> admin;
  std::unordered_map<DerivedKeyRef, std::unique_ptr<Authenticator>, DerivedKeyRefHash> derived;
  std::uint16_t newest_cluster = 0;
  std::uint64_t derivations = 0;
  bool shared = false;  // ablation
};

void ClusterKeyring::ablate_shared_worker_key() noexcept {
  state_->shared = true;
  state_->derived.clear();
}

WireKey derive_worker_key_as_issued(const WireKey& cluster, const WorkerId& worker, bool shared_ablation) {
  if (!shared_ablation) return derive_worker_key(cluster, worker);
  WireKey k = derive_worker_key(cluster, ClusterKeyring::kSharedWorker);
  k.worker = worker;
  return k;
}

ClusterKeyring::ClusterKeyring(std::size_t derived_max) : state_(std::make_unique<State>()) {
  state_->derived_max = derived_max == 0 ? 1 : derived_max;
}
ClusterKeyring::~ClusterKeyring() {
  for (auto& [id, k] : state_->cluster) OPENSSL_cleanse(k.bytes.data(), k.bytes.size());
}

Status ClusterKeyring::add(const WireKey& key) {
  State& s = *state_;
  if (key.key_id == 0) return Status{Errc::invalid_argument, "key id 0 names no key"};
  if (s.cluster.count(key.key_id) != 0 || s.admin.count(key.key_id) != 0 ||
      s.cluster_direct.count(key.key_id) != 0)
    return Status{Errc::exists, "key id " + std::to_string(key.key_id) + " is used by two keys; every key needs its own id"};
  switch (key.kind) {
    case KeyKind::cluster:
      if ((key.key_id & kAdminKeyIdBit) != 0)
        return Status{Errc::invalid_argument,
                      "cluster key id " + std::to_string(key.key_id) + " is above " + std::to_string(kClusterKeyIdMax)};
      if (s.admin.count(key.key_id | kAdminKeyIdBit) != 0)
        return Status{Errc::exists, "key id " + std::to_string(key.key_id | kAdminKeyIdBit) + " (cluster key " +
                                        std::to_string(key.key_id) + " used directly) is also an admin key's id"};
      s.cluster.emplace(key.key_id, key);
      s.cluster_direct.emplace(key.key_id | kAdminKeyIdBit, std::make_unique<Authenticator>(key));
      s.newest_cluster = std::max(s.newest_cluster, key.key_id);
      return {};
    case KeyKind::admin:
      if (s.cluster.count(key.key_id & ~kAdminKeyIdBit) != 0 && (key.key_id & kAdminKeyIdBit) != 0)
        return Status{Errc::exists, "admin key id " + std::to_string(key.key_id) + " is cluster key " +
                                        std::to_string(key.key_id & ~kAdminKeyIdBit) + "'s direct id"};
      s.admin.emplace(key.key_id, std::make_unique<Authenticator>(key));
      return {};
    case KeyKind::worker: break;
  }
  return Status{Errc::invalid_argument, "a worker key (worker " + key.worker.str() +
                                            ") is not lockd's: give lockd the cluster key it was derived from"};
}

Status ClusterKeyring::replace(const std::vector<WireKey>& keys) {
  ClusterKeyring next(state_->derived_max);
  next.state_->shared = state_->shared;
  bool cluster = false;
  for (const WireKey& k : keys) {
    if (Status err = next.add(k); !err.ok()) return err;
    cluster = cluster || k.kind == KeyKind::cluster;
  }
  if (!cluster) return Status{Errc::invalid_argument, "no cluster key: lockd needs at least one"};
  std::swap(state_, next.state_);  // the old keys are wiped when `next` goes
  return {};
}

std::vector<std::uint16_t> ClusterKeyring::key_ids(KeyKind kind) const {
  std::vector<std::uint16_t> ids;
  if (kind == KeyKind::cluster)
    for (const auto& [id, k] : state_->cluster) ids.push_back(id);
  if (kind == KeyKind::admin)
    for (const auto& [id, a] : state_->admin) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

KeyMatch ClusterKeyring::find(const WorkerId& sender, std::uint16_t key_id) {
  State& s = *state_;
  const DerivedKeyRef ref{sender, key_id};
  if (auto it = s.derived.find(ref); it != s.derived.end()) return KeyMatch{it->second.get(), Authority::worker};
  if (auto it = s.admin.find(key_id); it != s.admin.end()) return KeyMatch{it->second.get(), Authority::admin};
  if (auto it = s.cluster_direct.find(key_id); it != s.cluster_direct.end())
    return KeyMatch{it->second.get(), Authority::root};
  const auto c = s.cluster.find(key_id);
  if (c == s.cluster.end() || sender.is_nil()) return {};
  if (s.derived.size() >= s.derived_max) s.derived.clear();  // re-derived on demand
  WireKey k = derive_worker_key(c->second, s.shared ? kSharedWorker : sender);
  ++s.derivations;
  auto auth = std::make_unique<Authenticator>(k);
  OPENSSL_cleanse(k.bytes.data(), k.bytes.size());
  const Authenticator* p = auth.get();
  s.derived.emplace(ref, std::move(auth));
  return KeyMatch{p, Authority::worker};
}

const Authenticator* ClusterKeyring::for_worker(const WorkerId& worker, std::uint16_t* key_id) {
  if (state_->newest_cluster == 0) return nullptr;
  *key_id = state_->newest_cluster;
  return find(worker, state_->newest_cluster).auth;
}

std::size_t ClusterKeyring::derived() const noexcept { return state_->derived.size(); }
std::uint64_t ClusterKeyring::derivations() const noexcept { return state_->derivations; }

}  // namespace leasehold::wire
