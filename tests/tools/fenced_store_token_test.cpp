// FencedStore with signed tokens: the made-up-epoch attacks of issue 15 succeed with the token
// check switched off (the test hook) and fail, counted and audited, with it on; every kind of
// bad token has its own counted reason; verification is cached per epoch.
#include "leasehold/resource/fenced_store.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>

namespace leasehold::resource {
namespace {

namespace fs = std::filesystem;

class TokenStore : public ::testing::Test {
 public:
  void SetUp() override {
    char tmpl[] = "/tmp/fenced-token-test-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    lockd_key_ = token::TokenSigner::generate().value();
    ASSERT_NE(lockd_key_, nullptr);
    verifier_ = std::make_shared<token::TokenVerifier>();
    ASSERT_EQ(verifier_->add_public_key(lockd_key_->public_key()).message(), "");
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<FencedStore> open(const char* file, bool verify = true) {
    StoreOptions o;
    o.durable = false;
    if (verify) o.verifier = verifier_;
    auto s = FencedStore::open((dir_ / file).string(), o);
    EXPECT_TRUE(s.ok()) << s.message();
    return s ? std::move(s).value() : nullptr;
  }

  /// The token lockd hands out with a grant of `name` at `epoch` to `holder`.
  WriteToken grant(const std::string& name, Epoch epoch, SandboxId holder, const token::TokenSigner* key = nullptr) {
    token::GrantToken t;
    t.name = name_id_of(name);
    t.epoch = epoch;
    t.holder = holder;
    t.worker = WorkerId{0x77, 0x4000000000000007ULL};
    t.issued_at_ns = 1'700'000'000'000'000'000;
    EXPECT_TRUE((key != nullptr ? key : lockd_key_.get())->sign(t));
    const auto bytes = token::encode(t);
    return WriteToken{name, epoch, holder, std::vector<std::uint8_t>(bytes.begin(), bytes.end())};
  }

  fs::path dir_;
  std::unique_ptr<token::TokenSigner> lockd_key_;
  std::shared_ptr<token::TokenVerifier> verifier_;
};

const SandboxId kStale{0xa1, 0x4000000000000001ULL};     // held the name at epoch 5
const SandboxId kRightful{0xb2, 0x4000000000000002ULL};  // holds it now, at epoch 6

/// The attack: a stale holder (its grant was epoch 5; the rightful holder now has 6) writes
/// with an epoch it made up, keeping its own token bytes or sending none.
struct Attack {
  const char* what;
  Epoch made_up;
  bool send_old_token;  // the old token's bytes (signed for epoch 5) with the made-up epoch
};

void run_attack(TokenStore& f, FencedStore& s, const Attack& a, bool defended) {
  SCOPED_TRACE(a.what);
  const WriteToken old = f.grant("orders", 5, kStale);
  const WriteToken now = f.grant("orders", 6, kRightful);
  ASSERT_TRUE(s.write(old, "stale-1").accepted());
  ASSERT_TRUE(s.write(now, "rightful-1").accepted());
  WriteToken forged{"orders", a.made_up, kStale, a.send_old_token ? old.signed_token : std::vector<std::uint8_t>{}};
  const WriteResult attack = s.write(forged, "attack");
  const WriteResult after = s.write(now, "rightful-2");
  const AuditReport rep = check_audit(s.audit("orders").value());
  if (!defended) {
    // The plain epoch compare: the made-up epoch is admitted and the rightful holder fenced out.
    EXPECT_EQ(attack.verdict, Verdict::accepted);
    EXPECT_EQ(after.verdict, Verdict::stale) << after.reason;
    EXPECT_EQ(s.highest("orders"), a.made_up);
    EXPECT_FALSE(rep.exclusive());
    EXPECT_EQ(rep.forged, 0u);
    EXPECT_EQ(rep.unverified, 3u) << "with the check off, no accepted write (the attack included) was verified";
    EXPECT_TRUE(rep.summary().starts_with("unverified")) << rep.summary();
    return;
  }
  EXPECT_EQ(attack.verdict, Verdict::forged) << attack.reason;
  EXPECT_NE(attack.reason, "");
  EXPECT_EQ(attack.highest, 6u);
  EXPECT_EQ(after.verdict, Verdict::accepted) << after.reason;
  EXPECT_EQ(s.highest("orders"), 6u);
  EXPECT_EQ(s.records("orders"), 3);
  EXPECT_EQ(s.token_stats().forged(), 1u);
  EXPECT_EQ(rep.forged, 1u);
  EXPECT_EQ(rep.verified, 3u);
  EXPECT_EQ(rep.unverified, 0u);
  EXPECT_TRUE(rep.ok()) << "the accepted writes are exclusive";
  EXPECT_FALSE(rep.exclusive()) << "but the history holds a forgery";
  EXPECT_TRUE(rep.summary().starts_with("ATTACKED: 1 write")) << rep.summary();
  EXPECT_EQ(rep.summary().find("exclusive"), std::string::npos) << rep.summary();
  ASSERT_FALSE(rep.rejected_rows.empty());
  EXPECT_EQ(rep.rejected_rows.back().verdict, Verdict::forged);
  EXPECT_EQ(rep.rejected_rows.back().reason, attack.reason);
}

const Attack kAttacks[] = {
    {"own epoch + 1000, no token", 5 + 1000, false},
    {"own epoch + 1000, its old token", 5 + 1000, true},
    {"2^63-1, no token", static_cast<Epoch>(INT64_MAX), false},
    {"2^63-1, its old token", static_cast<Epoch>(INT64_MAX), true},
};

TEST_F(TokenStore, MadeUpEpochFencesTheRightfulHolderOutWithoutTheCheck) {
  int i = 0;
  for (const Attack& a : kAttacks) {
    auto s = open(("off" + std::to_string(i++) + ".db").c_str());
    ASSERT_NE(s, nullptr);
    s->testing_skip_token_check(true);
    run_attack(*this, *s, a, /*defended=*/false);
  }
}

TEST_F(TokenStore, MadeUpEpochIsRejectedAndCountedWithTheCheck) {
  int i = 0;
  for (const Attack& a : kAttacks) {
    auto s = open(("on" + std::to_string(i++) + ".db").c_str());
    ASSERT_NE(s, nullptr);
    run_attack(*this, *s, a, /*defended=*/true);
    const auto& st = s->token_stats();
    const token::Reject expected = a.send_old_token ? token::Reject::wrong_epoch : token::Reject::unsigned_token;
    EXPECT_EQ(st.rejected[static_cast<std::size_t>(expected)], 1u) << a.what;
  }
}

// Each kind of bad token: its own reason, counted, in the audit row, and nothing written.
TEST_F(TokenStore, EveryBadTokenHasItsCountedReason) {
  auto s = open("reasons.db");
  ASSERT_NE(s, nullptr);
  const auto other_key = token::TokenSigner::generate().value();
  ASSERT_NE(other_key, nullptr);
  ASSERT_TRUE(s->write(grant("orders", 6, kRightful), "ok").accepted());

  WriteToken unsigned_write{"orders", 7, kStale, {}};
  WriteToken malformed = grant("orders", 7, kStale);
  malformed.signed_token.pop_back();
  WriteToken unknown_key = grant("orders", 7, kStale, other_key.get());
  WriteToken bad_sig = grant("orders", 7, kStale);
  bad_sig.signed_token[60] ^= 1;  // the worker field, after signing
  WriteToken wrong_name = grant("billing", 7, kStale);
  wrong_name.name = "orders";
  WriteToken wrong_epoch = grant("orders", 7, kStale);
  wrong_epoch.epoch = 8;
  WriteToken wrong_holder = grant("orders", 7, kRightful);
  wrong_holder.holder = kStale;
  const std::pair<WriteToken, token::Reject> cases[] = {
      {unsigned_write, token::Reject::unsigned_token}, {malformed, token::Reject::malformed},
      {unknown_key, token::Reject::unknown_key},       {bad_sig, token::Reject::bad_signature},
      {wrong_name, token::Reject::wrong_name},         {wrong_epoch, token::Reject::wrong_epoch},
      {wrong_holder, token::Reject::wrong_holder},
  };
  for (const auto& [t, reject] : cases) {
    const WriteResult r = s->write(t, "x");
    EXPECT_EQ(r.verdict, Verdict::forged) << token::to_string(reject);
    EXPECT_TRUE(r.reason.starts_with("token " + std::string(token::to_string(reject)) + ":")) << r.reason;
    EXPECT_EQ(s->token_stats().rejected[static_cast<std::size_t>(reject)], 1u) << r.reason;
  }
  EXPECT_EQ(s->token_stats().forged(), std::size(cases));
  EXPECT_EQ(s->highest("orders"), 6u);
  EXPECT_EQ(s->records("orders"), 1);
  EXPECT_EQ(s->tally("orders", 7, Verdict::forged).rows, 6);
  // A valid grant at 7 is admitted after all that.
  EXPECT_TRUE(s->write(grant("orders", 7, kStale), "next").accepted());
}

// Below the highest epoch a write is stale whatever it carries (no signature check is paid for
// it); at or above it only a signed token is admitted.
TEST_F(TokenStore, BelowTheHighestEpochAWriteIsStaleSignedOrNot) {
  auto s = open("stale.db");
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->write(grant("orders", 6, kRightful), "ok").accepted());
  const std::uint64_t checks = verifier_->signature_checks();
  EXPECT_EQ(s->write(WriteToken{"orders", 5, kStale, {}}, "x").verdict, Verdict::stale);
  EXPECT_EQ(s->write(grant("orders", 5, kStale), "x").verdict, Verdict::stale);
  EXPECT_EQ(s->token_stats().forged(), 0u);
  EXPECT_EQ(s->write(WriteToken{"orders", 6, kStale, {}}, "x").verdict, Verdict::forged);
  EXPECT_LE(verifier_->signature_checks(), checks + 1);
}

TEST_F(TokenStore, VerificationIsPaidOncePerEpoch) {
  auto s = open("cache.db");
  ASSERT_NE(s, nullptr);
  const WriteToken t = grant("orders", 3, kRightful);
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(s->write(t, "w").accepted());
  EXPECT_EQ(s->token_stats().verified, 20u);
  EXPECT_EQ(s->token_stats().cache_hits, 19u);
  EXPECT_EQ(verifier_->signature_checks(), 1u);
  const WriteToken next = grant("orders", 4, kStale);
  ASSERT_TRUE(s->write(next, "w").accepted());
  EXPECT_EQ(verifier_->signature_checks(), 2u);
}

// present(): a holder's token raises the fence only if it verifies; advance_fence (the
// operator's announcement) stays unsigned.
TEST_F(TokenStore, PresentedTokenMustVerify) {
  auto s = open("present.db");
  ASSERT_NE(s, nullptr);
  const WriteResult forged = s->present(WriteToken{"orders", 1000, kStale, {}}, "holder presents");
  EXPECT_EQ(forged.verdict, Verdict::forged) << forged.reason;
  EXPECT_EQ(s->highest("orders"), 0u);
  const WriteResult real = s->present(grant("orders", 9, kRightful), "holder presents");
  EXPECT_EQ(real.verdict, Verdict::accepted) << real.reason;
  EXPECT_EQ(s->highest("orders"), 9u);
  EXPECT_EQ(s->advance_fence("orders", 10, "revoke").verdict, Verdict::accepted);
  EXPECT_EQ(s->highest("orders"), 10u);
}

// A store without a verifier: the old behaviour, and the audit says its epochs are unproven.
TEST_F(TokenStore, StoreWithoutVerifierAuditsWritesAsUnverified) {
  auto s = open("plain.db", /*verify=*/false);
  ASSERT_NE(s, nullptr);
  EXPECT_FALSE(s->verifies_tokens());
  ASSERT_TRUE(s->write({"orders", 1, kRightful}, "w").accepted());
  const AuditReport rep = check_audit(s->audit().value());
  EXPECT_TRUE(rep.ok());
  EXPECT_EQ(rep.unverified, 1u);
  EXPECT_FALSE(rep.exclusive());
  auto v = open("verified.db");
  ASSERT_TRUE(v->write(grant("orders", 1, kRightful), "w").accepted());
  const AuditReport good = check_audit(v->audit().value());
  EXPECT_TRUE(good.exclusive());
  EXPECT_TRUE(good.summary().starts_with("exclusive: ")) << good.summary();
}

// Review finding H5: a store with a verifier still admitted an unsigned advance_fence(name,
// 2^63-1), the rightful holder's signed writes were stale for good, and the audit said
// "exclusive ... every accepted epoch signed by lockd". Now a raise more than kFenceRaiseMax above
// the highest epoch is refused unless forced, and every unsigned raise is audited as the
// operator's and reported (from -> to), so the audit says what happened.
TEST_F(TokenStore, UnsignedFenceRaiseIsBoundedAndAuditedAsTheOperators) {
  auto s = open("raise.db");
  ASSERT_NE(s, nullptr);
  const WriteToken holder = grant("orders", 1, kRightful);
  ASSERT_TRUE(s->write(holder, "valid").accepted());
  const WriteResult far = s->advance_fence("orders", static_cast<Epoch>(INT64_MAX), "test raise");
  EXPECT_EQ(far.verdict, Verdict::invalid);
  EXPECT_NE(far.reason.find("more than " + std::to_string(kFenceRaiseMax) + " above the highest epoch 1"),
            std::string::npos)
      << far.reason;
  EXPECT_EQ(s->highest("orders"), 1u) << "the refused raise moved nothing";
  EXPECT_TRUE(s->write(holder, "still valid").accepted());
  // Revoke/transfer's order (the epoch above lockd's, announced first) stays admitted.
  EXPECT_TRUE(s->advance_fence("orders", 2, "revoke").accepted());
  EXPECT_TRUE(s->advance_fence("orders", 2 + kFenceRaiseMax, "transfer begin").accepted());
  const AuditReport rep = check_audit(s->audit("orders").value());
  EXPECT_TRUE(rep.ok());
  ASSERT_EQ(rep.operator_fences.size(), 2u);
  EXPECT_EQ(rep.operator_fences[0].epoch, 2u);
  EXPECT_NE(rep.operator_fences[0].reason.find("operator fence raise: revoke (fence 1 -> 2)"), std::string::npos)
      << rep.operator_fences[0].reason;
  EXPECT_TRUE(rep.summary().starts_with("exclusive, fence raised by operator 2 times")) << rep.summary();
  EXPECT_EQ(rep.summary().find("every accepted epoch signed by lockd"), std::string::npos) << rep.summary();
  // Forced: the raise the bound stops goes through, and is reported like the others.
  EXPECT_TRUE(s->advance_fence("orders", static_cast<Epoch>(INT64_MAX), "forced", /*force=*/true).accepted());
  EXPECT_EQ(check_audit(s->audit("orders").value()).operator_fences.size(), 3u);
  // A signed present() is no operator raise.
  auto p = open("present-only.db");
  ASSERT_TRUE(p->present(grant("orders", 3, kRightful), "holder presents").accepted());
  EXPECT_TRUE(check_audit(p->audit().value()).operator_fences.empty());
  EXPECT_TRUE(check_audit(p->audit().value()).summary().starts_with("exclusive: "));
}

}  // namespace
}  // namespace leasehold::resource
