// Signed fencing tokens (wire/token.hpp) on OpenSSL 3 libcrypto: EVP_PKEY_ED25519, one-shot
// EVP_DigestSign / EVP_DigestVerify (Ed25519 takes no separate digest).
#include "leasehold/wire/token.hpp"

#include "leasehold/wire/auth.hpp"
#include "leasehold/wire/le_bytes.hpp"

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/sha.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

namespace leasehold::token {
namespace {

constexpr std::size_t kOffMagic = 0;
constexpr std::size_t kOffVersion = 4;
constexpr std::size_t kOffReserved = 5;  // 3 bytes
constexpr std::size_t kOffKeyId = 8;
constexpr std::size_t kOffName = 12;
constexpr std::size_t kOffEpoch = 28;
constexpr std::size_t kOffHolder = 36;
constexpr std::size_t kOffWorker = 52;
constexpr std::size_t kOffIssuedAt = 68;
constexpr std::size_t kOffSignature = 76;
static_assert(kOffSignature == kSignedBytes);
static_assert(kOffSignature + kSignatureBytes == kTokenBytes);
/// Largest key file read (a PEM private key is 119 bytes).
constexpr std::size_t kKeyFileBytesMax = 4096;

struct PkeyFree {
  void operator()(EVP_PKEY* k) const noexcept { EVP_PKEY_free(k); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;
struct BioFree {
  void operator()(BIO* b) const noexcept { BIO_free(b); }
};
struct MdCtxFree {
  void operator()(EVP_MD_CTX* c) const noexcept { EVP_MD_CTX_free(c); }
};

std::array<std::uint8_t, kPublicKeyBytes> raw_public(EVP_PKEY* k) {
  std::array<std::uint8_t, kPublicKeyBytes> out{};
  std::size_t len = out.size();
  if (EVP_PKEY_get_raw_public_key(k, out.data(), &len) != 1 || len != out.size()) out.fill(0);
  return out;
}

}  // namespace

TokenBytes encode(const GrantToken& t) noexcept {
  TokenBytes b{};
  wire::store_le(b.data() + kOffMagic, kTokenMagic);
  b[kOffVersion] = kTokenVersion;
  wire::store_le(b.data() + kOffKeyId, t.key_id);
  wire::store_id(b.data() + kOffName, t.name);
  wire::store_le(b.data() + kOffEpoch, t.epoch);
  wire::store_id(b.data() + kOffHolder, t.holder);
  wire::store_id(b.data() + kOffWorker, t.worker);
  wire::store_le(b.data() + kOffIssuedAt, t.issued_at_ns);
  std::memcpy(b.data() + kOffSignature, t.signature.data(), kSignatureBytes);
  return b;
}

Result<GrantToken> decode(std::span<const std::uint8_t> bytes) {
  auto fail = [](std::string text) -> Result<GrantToken> { return Status{Errc::corrupt, std::move(text)}; };
  if (bytes.size() != kTokenBytes)
    return fail("a token is " + std::to_string(kTokenBytes) + " bytes, not " + std::to_string(bytes.size()));
  if (wire::load_le<std::uint32_t>(bytes.data() + kOffMagic) != kTokenMagic) return fail("not a leasehold token (bad magic)");
  if (bytes[kOffVersion] != kTokenVersion)
    return fail("token version " + std::to_string(bytes[kOffVersion]) + ", this build understands " +
                std::to_string(kTokenVersion));
  for (std::size_t i = kOffReserved; i < kOffKeyId; ++i)
    if (bytes[i] != 0) return fail("reserved token byte " + std::to_string(i) + " is not zero");
  GrantToken t;
  t.key_id = wire::load_le<std::uint32_t>(bytes.data() + kOffKeyId);
  t.name = wire::load_id<NameTag>(bytes.data() + kOffName);
  t.epoch = wire::load_le<std::uint64_t>(bytes.data() + kOffEpoch);
  t.holder = wire::load_id<SandboxTag>(bytes.data() + kOffHolder);
  t.worker = wire::load_id<WorkerTag>(bytes.data() + kOffWorker);
  t.issued_at_ns = wire::load_le<std::int64_t>(bytes.data() + kOffIssuedAt);
  std::memcpy(t.signature.data(), bytes.data() + kOffSignature, kSignatureBytes);
  if (t.key_id == 0) return fail("token key id 0 names no key");
  if (t.epoch == 0) return fail("token epoch 0: no grant carries it");
  return t;
}

std::string_view to_string(Reject r) noexcept {
  switch (r) {
    case Reject::none: return "ok";
    case Reject::unsigned_token: return "unsigned";
    case Reject::malformed: return "malformed";
    case Reject::unknown_key: return "unknown_key";
    case Reject::bad_signature: return "bad_signature";
    case Reject::wrong_name: return "wrong_name";
    case Reject::wrong_epoch: return "wrong_epoch";
    case Reject::wrong_holder: return "wrong_holder";
  }
  return "unknown_reject";
}

std::uint32_t key_id_of(std::span<const std::uint8_t, kPublicKeyBytes> public_key) noexcept {
  std::uint8_t digest[SHA256_DIGEST_LENGTH];
  SHA256(public_key.data(), public_key.size(), digest);
  const auto id = wire::load_le<std::uint32_t>(digest);
  return id == 0 ? 1 : id;
}

std::string key_id_text(std::uint32_t key_id) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", key_id);
  return buf;
}

std::string to_hex(std::span<const std::uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (const std::uint8_t b : bytes) {
    s.push_back(kDigits[b >> 4]);
    s.push_back(kDigits[b & 0xF]);
  }
  return s;
}

std::optional<std::vector<std::uint8_t>> from_hex(std::string_view text) {
  if (text.size() % 2 != 0) return std::nullopt;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::vector<std::uint8_t> out(text.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const int hi = nibble(text[2 * i]);
    const int lo = nibble(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out[i] = static_cast<std::uint8_t>(hi << 4 | lo);
  }
  return out;
}

// ---- signer --------------------------------------------------------------------------------------

struct TokenSigner::Key {
  Pkey pkey;
};

TokenSigner::TokenSigner(std::unique_ptr<Key> key) : key_(std::move(key)) {
  public_ = raw_public(key_->pkey.get());
  key_id_ = key_id_of(public_);
}
TokenSigner::~TokenSigner() = default;

Result<std::unique_ptr<TokenSigner>> TokenSigner::from_raw(std::span<const std::uint8_t> private_key) {
  if (private_key.size() != kPrivateKeyBytes)
    return Status{Errc::invalid_argument, "an Ed25519 private key is " + std::to_string(kPrivateKeyBytes) +
                                              " bytes, not " + std::to_string(private_key.size())};
  Pkey k(EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr, private_key.data(), private_key.size()));
  if (!k) return Status{Errc::invalid_argument, "OpenSSL refused the Ed25519 private key"};
  return std::unique_ptr<TokenSigner>(new TokenSigner(std::make_unique<Key>(Key{std::move(k)})));
}

Result<std::unique_ptr<TokenSigner>> TokenSigner::generate() {
  Pkey k(EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519"));
  if (!k) return Status{Errc::io_error, "cannot generate an Ed25519 key: OpenSSL failed"};
  return std::unique_ptr<TokenSigner>(new TokenSigner(std::make_unique<Key>(Key{std::move(k)})));
}

Result<std::unique_ptr<TokenSigner>> TokenSigner::load(const std::string& path) {
  std::array<char, kKeyFileBytesMax + 1> buf{};
  struct Wipe {
    char* p;
    std::size_t n;
    ~Wipe() { OPENSSL_cleanse(p, n); }
  } wipe{buf.data(), buf.size()};
  std::size_t n = 0;
  if (Status st = wire::read_private_file(path, buf, n, "; create one with leasehold-lockd --generate-signing-key --out " + path);
      !st.ok())
    return st;
  if (n > kKeyFileBytesMax)
    return Status{Errc::corrupt, "signing key file " + path + " is larger than " + std::to_string(kKeyFileBytesMax) +
                                     " bytes: expected an Ed25519 private key (PEM or 32 raw bytes)"};
  if (n == kPrivateKeyBytes) {
    auto s = from_raw({reinterpret_cast<const std::uint8_t*>(buf.data()), n});
    if (!s) return Status{s.code(), "signing key file " + path + ": " + s.message()};
    return s;
  }
  std::unique_ptr<BIO, BioFree> bio(BIO_new_mem_buf(buf.data(), static_cast<int>(n)));
  Pkey k(bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!k)
    return Status{Errc::corrupt, "signing key file " + path + " is neither a PEM private key nor " +
                                     std::to_string(kPrivateKeyBytes) + " raw bytes (" + std::to_string(n) +
                                     " bytes); create one with leasehold-lockd --generate-signing-key"};
  if (EVP_PKEY_get_id(k.get()) != EVP_PKEY_ED25519)
    return Status{Errc::corrupt, "signing key file " + path + " holds a " +
                                     std::string(EVP_PKEY_get0_type_name(k.get())) + " key, not Ed25519"};
  return std::unique_ptr<TokenSigner>(new TokenSigner(std::make_unique<Key>(Key{std::move(k)})));
}

bool TokenSigner::sign(GrantToken& t) const noexcept {
  t.key_id = key_id_;
  t.signature.fill(0);
  const TokenBytes b = encode(t);
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  std::size_t len = kSignatureBytes;
  if (!ctx || EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, key_->pkey.get()) != 1 ||
      EVP_DigestSign(ctx.get(), t.signature.data(), &len, b.data(), kSignedBytes) != 1 || len != kSignatureBytes) {
    t.signature.fill(0);
    return false;
  }
  return true;
}

std::string public_key_pem(std::span<const std::uint8_t, kPublicKeyBytes> public_key) {
  Pkey k(EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, public_key.data(), public_key.size()));
  std::unique_ptr<BIO, BioFree> bio(BIO_new(BIO_s_mem()));
  if (!k || !bio || PEM_write_bio_PUBKEY(bio.get(), k.get()) != 1) return {};
  char* data = nullptr;
  const long len = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<std::size_t>(len));
}

std::string TokenSigner::public_key_pem() const { return token::public_key_pem(public_); }

Status TokenSigner::write_files(const std::string& path) const {
  std::unique_ptr<BIO, BioFree> bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_PrivateKey(bio.get(), key_->pkey.get(), nullptr, nullptr, 0, nullptr, nullptr) != 1)
    return Status{Errc::io_error, "cannot encode the signing key as PEM: OpenSSL failed"};
  char* data = nullptr;
  const long len = BIO_get_mem_data(bio.get(), &data);
  Status error = wire::write_new_key_file(path, std::string_view(data, static_cast<std::size_t>(len)), 0600);
  OPENSSL_cleanse(data, static_cast<std::size_t>(len));
  if (!error.ok()) return error;
  error = wire::write_new_key_file(path + ".pub", public_key_pem(), 0644);
  if (!error.ok()) ::unlink(path.c_str());
  return error;
}

Status generate_signing_key_file(const std::string& path) {
  const auto signer = TokenSigner::generate();
  if (!signer) return signer.status();
  return (*signer)->write_files(path);
}

// ---- verifier ------------------------------------------------------------------------------------

struct TokenVerifier::Keys {
  std::map<std::uint32_t, std::pair<Pkey, std::array<std::uint8_t, kPublicKeyBytes>>> by_id;
};

TokenVerifier::TokenVerifier() : keys_(std::make_unique<Keys>()) {}
TokenVerifier::~TokenVerifier() = default;

Status TokenVerifier::add_public_key(std::span<const std::uint8_t> raw) {
  if (raw.size() != kPublicKeyBytes)
    return Status{Errc::invalid_argument, "an Ed25519 public key is " + std::to_string(kPublicKeyBytes) +
                                              " bytes, not " + std::to_string(raw.size())};
  std::array<std::uint8_t, kPublicKeyBytes> key{};
  std::copy(raw.begin(), raw.end(), key.begin());
  const std::uint32_t id = key_id_of(key);
  std::lock_guard lock(mutex_);
  if (const auto it = keys_->by_id.find(id); it != keys_->by_id.end()) {
    if (it->second.second == key) return {};
    return Status{Errc::exists, "two public keys with key id " + key_id_text(id) + ": keep one of them"};
  }
  if (keys_->by_id.size() >= kVerifierKeysMax)
    return Status{Errc::invalid_argument,
                  "more than " + std::to_string(kVerifierKeysMax) + " public keys; remove retired ones"};
  Pkey k(EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, key.data(), key.size()));
  if (!k) return Status{Errc::invalid_argument, "OpenSSL refused the Ed25519 public key"};
  keys_->by_id.emplace(id, std::make_pair(std::move(k), key));
  return {};
}

Result<std::array<std::uint8_t, kPublicKeyBytes>> read_public_key_file(const std::string& path) {
  auto fail = [&](std::string why, Errc code = Errc::corrupt) { return Status{code, "public key file " + path + std::move(why)}; };
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    return fail(std::string(": cannot open: ") + std::strerror(err), errc_of_errno(err == 0 ? EIO : err));
  }
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() > kKeyFileBytesMax) return fail(" is larger than " + std::to_string(kKeyFileBytesMax) + " bytes");
  std::array<std::uint8_t, kPublicKeyBytes> key{};
  if (text.size() == kPublicKeyBytes) {
    std::memcpy(key.data(), text.data(), key.size());
  } else if (text.find("-----BEGIN") != std::string::npos) {
    std::unique_ptr<BIO, BioFree> bio(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
    Pkey k(bio ? PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr) : nullptr);
    if (!k) return fail(": not a PEM public key");
    if (EVP_PKEY_get_id(k.get()) != EVP_PKEY_ED25519)
      return fail(" holds a " + std::string(EVP_PKEY_get0_type_name(k.get())) + " key, not Ed25519");
    key = raw_public(k.get());
  } else {
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.pop_back();
    const auto raw = from_hex(text);
    if (!raw || raw->size() != kPublicKeyBytes)
      return fail(" is neither PEM, nor " + std::to_string(kPublicKeyBytes) + " raw bytes, nor " +
                  std::to_string(2 * kPublicKeyBytes) + " hex digits");
    std::memcpy(key.data(), raw->data(), key.size());
  }
  return key;
}

Status TokenVerifier::add_public_key_file(const std::string& path) {
  const auto key = read_public_key_file(path);
  if (!key) return key.status();
  const Status added = add_public_key(*key);
  return added.ok() ? added : Status{added.code(), "public key file " + path + ": " + added.message()};
}

std::vector<std::uint32_t> TokenVerifier::key_ids() const {
  std::lock_guard lock(mutex_);
  std::vector<std::uint32_t> ids;
  for (const auto& [id, k] : keys_->by_id) ids.push_back(id);
  return ids;
}

Verdict TokenVerifier::verify(std::span<const std::uint8_t> bytes, NameId name, Epoch epoch, SandboxId holder) {
  Verdict v;
  auto reject = [&](Reject r, std::string detail) {
    v.reject = r;
    v.detail = "token " + std::string(to_string(r)) + ": " + detail;
    return v;
  };
  if (bytes.empty()) return reject(Reject::unsigned_token, "the write carries no signed token, only an epoch");
  const Result<GrantToken> t = decode(bytes);
  if (!t) return reject(Reject::malformed, t.message());
  if (t->name != name) return reject(Reject::wrong_name, "signed for name id " + t->name.str() + ", not " + name.str());
  if (t->epoch != epoch)
    return reject(Reject::wrong_epoch, "signed for epoch " + std::to_string(t->epoch) + ", the write claims " +
                                           std::to_string(epoch));
  if (t->holder != holder)
    return reject(Reject::wrong_holder, "signed for holder " + t->holder.str() + ", the write claims " + holder.str());
  std::lock_guard lock(mutex_);
  if (const auto it = cache_.find(name);
      it != cache_.end() && std::equal(it->second.begin(), it->second.end(), bytes.begin())) {
    ++hits_;
    v.cached = true;
    return v;
  }
  const auto key = keys_->by_id.find(t->key_id);
  if (key == keys_->by_id.end()) {
    std::string held;
    for (const auto& [id, k] : keys_->by_id) held += (held.empty() ? "" : ", ") + key_id_text(id);
    return reject(Reject::unknown_key, "signed with key id " + key_id_text(t->key_id) + "; this resource holds " +
                                           (held.empty() ? std::string("no key") : held));
  }
  ++checks_;
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  const bool good = ctx && EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, key->second.first.get()) == 1 &&
                    EVP_DigestVerify(ctx.get(), bytes.data() + kSignedBytes, kSignatureBytes, bytes.data(), kSignedBytes) == 1;
  if (!good)
    return reject(Reject::bad_signature, "the signature does not verify with key " + key_id_text(t->key_id) +
                                             " (forged, altered, or signed by another key)");
  // Remember it: one entry per name, the newest epoch (an older one is stale at the resource).
  if (cache_.size() >= kVerifyCacheEntriesMax && cache_.find(name) == cache_.end()) cache_.clear();
  auto& slot = cache_[name];
  if (slot[0] == 0 || wire::load_le<std::uint64_t>(slot.data() + kOffEpoch) <= epoch)
    std::copy(bytes.begin(), bytes.end(), slot.begin());
  return v;
}

std::uint64_t TokenVerifier::signature_checks() const noexcept {
  std::lock_guard lock(mutex_);
  return checks_;
}
std::uint64_t TokenVerifier::cache_hits() const noexcept {
  std::lock_guard lock(mutex_);
  return hits_;
}

}  // namespace leasehold::token
