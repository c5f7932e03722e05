// Signed fencing tokens (wire/token.hpp): the encoding, signing, verification and its cache, and
// the property that a token signed for (name, epoch, holder, worker) verifies for nothing else.
#include "leasehold/wire/token.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

namespace leasehold::token {
namespace {

template <class Tag>
Id<Tag> random_id(std::mt19937_64& rng) {
  Id<Tag> id{rng(), rng()};
  if (id.is_nil()) id.lo = 1;
  return id;
}

GrantToken random_token(std::mt19937_64& rng) {
  GrantToken t;
  t.name = random_id<NameTag>(rng);
  t.epoch = rng() | 1;
  t.holder = random_id<SandboxTag>(rng);
  t.worker = random_id<WorkerTag>(rng);
  t.issued_at_ns = static_cast<std::int64_t>(rng() >> 1);
  return t;
}

std::span<const std::uint8_t> view(const TokenBytes& b) { return {b.data(), b.size()}; }

TEST(Token, EncodeDecodeRoundTripsAndIsCanonical) {
  std::mt19937_64 rng(7);
  const auto signer = TokenSigner::generate().value();
  ASSERT_NE(signer, nullptr);
  GrantToken t = random_token(rng);
  ASSERT_TRUE(signer->sign(t));
  EXPECT_EQ(t.key_id, signer->key_id());
  const TokenBytes b = encode(t);
  EXPECT_EQ(b[0], 'L');
  EXPECT_EQ(b[1], 'H');
  EXPECT_EQ(b[2], 'T');
  EXPECT_EQ(b[3], '1');
  const auto back = decode(view(b));
  ASSERT_TRUE(back.ok()) << back.message();
  EXPECT_EQ(*back, t);
  EXPECT_EQ(encode(*back), b);
}

TEST(Token, DecodeRefusesOtherLengthsVersionsAndReservedBytes) {
  std::mt19937_64 rng(8);
  GrantToken t = random_token(rng);
  t.key_id = 5;
  const TokenBytes b = encode(t);
  // Each refusal is corrupt, and its message names what is wrong.
  auto refused = [](std::span<const std::uint8_t> bytes, std::string_view says) {
    const Result<GrantToken> d = decode(bytes);
    EXPECT_FALSE(d.ok());
    EXPECT_EQ(d.code(), Errc::corrupt);
    EXPECT_NE(d.message().find(says), std::string::npos) << d.message();
  };
  refused(std::span(b.data(), b.size() - 1), "140 bytes, not 139");
  std::vector<std::uint8_t> longer(b.begin(), b.end());
  longer.push_back(0);
  refused(longer, "140 bytes, not 141");
  auto changed = [&](std::size_t at, std::uint8_t v) {
    TokenBytes c = b;
    c[at] = v;
    return c;
  };
  refused(view(changed(4, 2)), "version 2");
  refused(view(changed(6, 1)), "reserved token byte 6");
  refused(view(changed(0, 'X')), "bad magic");
  GrantToken zero = t;
  zero.epoch = 0;
  refused(view(encode(zero)), "epoch 0");
  zero = t;
  zero.key_id = 0;
  refused(view(encode(zero)), "key id 0");
}

// The property of the issue: many random tokens; each verifies for exactly its own claim, and
// never with a field changed, a signature bit flipped, the encoding cut or extended, or with
// another key.
TEST(Token, SignedTokenVerifiesForNothingElse) {
  std::mt19937_64 rng(20261201);
  const auto signer = TokenSigner::generate().value();
  const auto other = TokenSigner::generate().value();
  ASSERT_NE(signer, nullptr);
  ASSERT_NE(other, nullptr);
  TokenVerifier verifier;
  ASSERT_EQ(verifier.add_public_key(signer->public_key()).message(), "");
  TokenVerifier other_verifier;  // holds only the other key
  ASSERT_EQ(other_verifier.add_public_key(other->public_key()).message(), "");

  constexpr int kTokens = 300;
  for (int i = 0; i < kTokens; ++i) {
    GrantToken t = random_token(rng);
    ASSERT_TRUE(signer->sign(t));
    const TokenBytes good = encode(t);
    const Verdict ok = verifier.verify(view(good), t.name, t.epoch, t.holder);
    ASSERT_TRUE(ok.ok()) << ok.detail;

    // The claim differs from the token.
    EXPECT_EQ(verifier.verify(view(good), random_id<NameTag>(rng), t.epoch, t.holder).reject, Reject::wrong_name);
    EXPECT_EQ(verifier.verify(view(good), t.name, t.epoch + 1 + rng() % 1000, t.holder).reject, Reject::wrong_epoch);
    EXPECT_EQ(verifier.verify(view(good), t.name, t.epoch, random_id<SandboxTag>(rng)).reject, Reject::wrong_holder);

    // Any field changed in the token itself (the claim follows it, so only the signature can
    // catch it).
    GrantToken f = t;
    switch (i % 6) {
      case 0: f.name = random_id<NameTag>(rng); break;
      case 1: f.epoch = t.epoch + 1000; break;
      case 2: f.holder = random_id<SandboxTag>(rng); break;
      case 3: f.worker = random_id<WorkerTag>(rng); break;
      case 4: f.issued_at_ns = t.issued_at_ns ^ 1; break;
      case 5: f.epoch = static_cast<Epoch>(INT64_MAX); break;
    }
    const Verdict changed = verifier.verify(view(encode(f)), f.name, f.epoch, f.holder);
    EXPECT_EQ(changed.reject, Reject::bad_signature) << "field case " << i % 6 << ": " << changed.detail;

    // Every bit of the encoding flipped, one at a time (a few per token, all over the run).
    for (int k = 0; k < 8; ++k) {
      const std::size_t bit = rng() % (kTokenBytes * 8);
      TokenBytes flipped = good;
      flipped[bit / 8] ^= static_cast<std::uint8_t>(1u << (bit % 8));
      const auto d = decode(view(flipped));
      const Verdict v = d ? verifier.verify(view(flipped), d->name, d->epoch, d->holder)
                          : verifier.verify(view(flipped), t.name, t.epoch, t.holder);
      EXPECT_FALSE(v.ok()) << "bit " << bit << " flipped still verifies";
      if (bit >= kSignedBytes * 8) {
        EXPECT_EQ(v.reject, Reject::bad_signature) << bit;
      }
    }

    // Cut or extended.
    const std::size_t cut = rng() % kTokenBytes;
    EXPECT_EQ(verifier.verify(std::span(good.data(), cut), t.name, t.epoch, t.holder).reject,
              cut == 0 ? Reject::unsigned_token : Reject::malformed);
    std::vector<std::uint8_t> extended(good.begin(), good.end());
    extended.push_back(static_cast<std::uint8_t>(rng()));
    EXPECT_EQ(verifier.verify(extended, t.name, t.epoch, t.holder).reject, Reject::malformed);

    // Another key: unknown to a verifier without it; signed by another key under this key's
    // id, a bad signature.
    EXPECT_EQ(other_verifier.verify(view(good), t.name, t.epoch, t.holder).reject, Reject::unknown_key);
    GrantToken by_other = t;
    ASSERT_TRUE(other->sign(by_other));
    by_other.key_id = signer->key_id();
    EXPECT_EQ(verifier.verify(view(encode(by_other)), t.name, t.epoch, t.holder).reject, Reject::bad_signature);
  }
}

TEST(Token, VerificationIsCachedPerNameEpochAndSignature) {
  std::mt19937_64 rng(9);
  const auto signer = TokenSigner::generate().value();
  ASSERT_NE(signer, nullptr);
  TokenVerifier verifier;
  ASSERT_EQ(verifier.add_public_key(signer->public_key()).message(), "");
  GrantToken t = random_token(rng);
  ASSERT_TRUE(signer->sign(t));
  const TokenBytes b = encode(t);
  EXPECT_FALSE(verifier.verify(view(b), t.name, t.epoch, t.holder).cached);
  EXPECT_EQ(verifier.signature_checks(), 1u);
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(verifier.verify(view(b), t.name, t.epoch, t.holder).cached);
  EXPECT_EQ(verifier.signature_checks(), 1u);
  EXPECT_EQ(verifier.cache_hits(), 10u);
  // The same (name, epoch) with a forged signature is not a cache hit: it is checked, and fails.
  TokenBytes forged = b;
  forged[kTokenBytes - 1] ^= 0x80;
  const Verdict v = verifier.verify(view(forged), t.name, t.epoch, t.holder);
  EXPECT_EQ(v.reject, Reject::bad_signature);
  EXPECT_FALSE(v.cached);
  EXPECT_EQ(verifier.signature_checks(), 2u);
  // The real one still hits.
  EXPECT_TRUE(verifier.verify(view(b), t.name, t.epoch, t.holder).cached);
}

TEST(Token, VerifierHoldsSeveralKeysByKeyId) {
  std::mt19937_64 rng(10);
  const auto old_key = TokenSigner::generate().value();
  const auto new_key = TokenSigner::generate().value();
  ASSERT_NE(old_key, nullptr);
  ASSERT_NE(new_key, nullptr);
  ASSERT_NE(old_key->key_id(), new_key->key_id());
  TokenVerifier verifier;
  ASSERT_EQ(verifier.add_public_key(old_key->public_key()).message(), "");
  ASSERT_EQ(verifier.add_public_key(new_key->public_key()).message(), "");
  EXPECT_EQ(verifier.add_public_key(new_key->public_key()).message(), "");  // again: a no-op
  EXPECT_EQ(verifier.key_ids().size(), 2u);
  for (const TokenSigner* s : {old_key.get(), new_key.get()}) {
    GrantToken t = random_token(rng);
    ASSERT_TRUE(s->sign(t));
    EXPECT_TRUE(verifier.verify(view(encode(t)), t.name, t.epoch, t.holder).ok());
  }
  EXPECT_FALSE(verifier.add_public_key(std::vector<std::uint8_t>(31, 1)).ok());
}

class TokenFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("leasehold-token-test-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(TokenFiles, GeneratedKeyFilesLoadAndVerify) {
  const std::string path = (dir_ / "signing.key").string();
  ASSERT_EQ(generate_signing_key_file(path).message(), "");
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat((path + ".pub").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  EXPECT_EQ(generate_signing_key_file(path).code(), Errc::exists) << "an existing key must never be overwritten";

  auto loaded = TokenSigner::load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.message();
  const auto signer = std::move(loaded).value();
  TokenVerifier verifier;
  ASSERT_EQ(verifier.add_public_key_file(path + ".pub").message(), "");
  ASSERT_EQ(verifier.key_ids(), std::vector<std::uint32_t>{signer->key_id()});
  std::mt19937_64 rng(11);
  GrantToken t = random_token(rng);
  ASSERT_TRUE(signer->sign(t));
  EXPECT_TRUE(verifier.verify(view(encode(t)), t.name, t.epoch, t.holder).ok());

  // Raw 32-byte private key and 64-hex-digit public key files work too.
  const std::string raw = (dir_ / "raw.key").string();
  {
    std::ofstream out(raw, std::ios::binary);
    for (int i = 0; i < 32; ++i) out.put(static_cast<char>(i + 1));
  }
  ::chmod(raw.c_str(), 0600);
  auto raw_loaded = TokenSigner::load(raw);
  ASSERT_TRUE(raw_loaded.ok()) << raw_loaded.message();
  const auto raw_signer = std::move(raw_loaded).value();
  const std::string hex_pub = (dir_ / "raw.pub").string();
  std::ofstream(hex_pub) << to_hex(raw_signer->public_key()) << "\n";
  TokenVerifier v2;
  EXPECT_EQ(v2.add_public_key_file(hex_pub).message(), "");
  EXPECT_EQ(v2.key_ids(), std::vector<std::uint32_t>{raw_signer->key_id()});
}

TEST_F(TokenFiles, SigningKeyFileOthersCanReadIsRefused) {
  const std::string path = (dir_ / "signing.key").string();
  ASSERT_EQ(generate_signing_key_file(path).message(), "");
  ::chmod(path.c_str(), 0640);
  const auto open_key = TokenSigner::load(path);
  EXPECT_EQ(open_key.code(), Errc::permission_denied);
  EXPECT_NE(open_key.message().find("mode 0640"), std::string::npos) << open_key.message();
  EXPECT_NE(open_key.message().find("chmod 600"), std::string::npos) << open_key.message();
  // Not a key at all.
  const std::string junk = (dir_ / "junk.key").string();
  std::ofstream(junk) << "hello\n";
  ::chmod(junk.c_str(), 0600);
  const auto junk_key = TokenSigner::load(junk);
  EXPECT_EQ(junk_key.code(), Errc::corrupt);
  EXPECT_NE(junk_key.message().find("neither a PEM private key"), std::string::npos) << junk_key.message();
  // A public key file that is not a key.
  TokenVerifier verifier;
  EXPECT_EQ(verifier.add_public_key_file(junk).code(), Errc::corrupt);
  EXPECT_EQ(verifier.add_public_key_file((dir_ / "missing.pub").string()).code(), Errc::not_found);
}

}  // namespace
}  // namespace leasehold::token
