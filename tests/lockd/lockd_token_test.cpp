// lockd signs every grant's fencing token (wire/token.hpp): a real lockd on loopback, every path
// that gives a holder an epoch (acquire, 2-phase acquire and commit, transfer accept, reassign
// then acquire, preemptible grants), each token verified with the public key alone; the
// signing key options (--signing-key-file, --generate-signing-key, --print-public-key) and the
// default key generated beside the store.
#include "leasehold/io/probe.hpp"
#include "leasehold/wire/token.hpp"
#include "leasehold/lockd/admin_client.hpp"
#include "lockd_process.hpp"

#include <gtest/gtest.h>

#include <fstream>

#include <sys/stat.h>

namespace leasehold::lockd {
namespace {

using namespace testing;

const SandboxId S1{0x51, 1}, S2{0x51, 2}, S3{0x51, 3};
const WorkerId W1{0x77, 1}, W2{0x77, 2};

class LockdTokenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const Status why = io_uring_usable(); !why.ok()) GTEST_SKIP() << why.message();
    key_ = make_key(dir_.path());
  }
  std::vector<std::string> base_args() const {
    return {"--key-file", (dir_.path() / "lockd.key").string(), "--store", (dir_.path() / "lockd.db").string()};
  }
  void start(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = base_args();
    args.insert(args.end(), extra.begin(), extra.end());
    std::string err;
    ASSERT_TRUE(lockd_.start(args, dir_.path() / "lockd.log", &err)) << err;
  }
  AdminClient client(WorkerId self = {}) { return AdminClient(lockd_.address(), key_, self); }

  /// The grant's token verifies with the public key `pub` for exactly its name, epoch, holder.
  static void expect_signed(const wire::Grant& g, token::TokenVerifier& v, WorkerId worker) {
    ASSERT_EQ(g.token.size(), token::kTokenBytes) << "a grant without a token";
    const std::span<const std::uint8_t> bytes(g.token.data(), g.token.size());
    const token::Verdict ok = v.verify(bytes, g.name_id, g.epoch, g.holder);
    EXPECT_TRUE(ok.ok()) << ok.detail;
    const auto t = token::decode(bytes);
    ASSERT_TRUE(t.ok()) << t.message();
    EXPECT_EQ(t->worker, worker);
    EXPECT_GT(t->issued_at_ns, 1'600'000'000'000'000'000) << "issued_at is lockd's realtime clock";
    EXPECT_FALSE(v.verify(bytes, g.name_id, g.epoch + 1, g.holder).ok());
  }

  TempDir dir_;
  wire::WireKey key_;
  LockdProcess lockd_;
};

TEST_F(LockdTokenTest, EveryGrantPathCarriesATokenTheDefaultPublicKeyVerifies) {
  start();
  const std::string key_path = (dir_.path() / "lockd.db.signing.key").string();
  struct stat st {};
  ASSERT_EQ(::stat(key_path.c_str(), &st), 0) << "no default signing key beside the store";
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat((key_path + ".pub").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  EXPECT_NE(lockd_.log().find("event=token_signing_key action=generated path=" + key_path + " "), std::string::npos)
      << lockd_.log();
  token::TokenVerifier v;
  ASSERT_EQ(v.add_public_key_file(key_path + ".pub").message(), "");

  AdminClient c = client(W1);
  // Acquire.
  const Answer a = c.acquire("tok/a", S1, W1);
  ASSERT_NE(a.as<wire::Grant>(), nullptr) << a.message();
  expect_signed(*a.as<wire::Grant>(), v, W1);
  // 2-phase acquire, then commit.
  const Answer p = c.acquire("tok/b", S2, W1, 0, /*two_phase=*/true);
  ASSERT_NE(p.as<wire::Grant>(), nullptr) << p.message();
  expect_signed(*p.as<wire::Grant>(), v, p.as<wire::Grant>()->worker);
  const Answer cm = c.commit(name_id_of("tok/b"), S2, p.as<wire::Grant>()->epoch, W1);
  ASSERT_NE(cm.as<wire::Grant>(), nullptr) << cm.message();
  expect_signed(*cm.as<wire::Grant>(), v, W1);
  // Transfer: the new owner's grant carries a token for the new epoch.
  const NameId id = name_id_of("tok/a");
  const Epoch e = a.as<wire::Grant>()->epoch;
  const Answer tb = c.transfer_begin(id, S1, e, S3, W2);
  ASSERT_NE(tb.as<wire::TransferState>(), nullptr) << tb.message();
  // The transfer completes once S1's worker confirmed it dead (lockd's transfer guard).
  const Answer killed =
      AdminClient(lockd_.address(), wire::derive_worker_key(key_, W1)).request(wire::KillConfirmed{id, S1, e});
  ASSERT_NE(killed.as<wire::Ok>(), nullptr) << killed.message();
  const Answer tc = c.transfer_complete(id, e + 1);
  ASSERT_NE(tc.as<wire::TransferState>(), nullptr) << tc.message();
  const Answer acc = AdminClient(lockd_.address(), key_, W2).transfer_accept(id, S3, W2);
  ASSERT_NE(acc.as<wire::Grant>(), nullptr) << acc.message();
  EXPECT_EQ(acc.as<wire::Grant>()->epoch, e + 1);
  expect_signed(*acc.as<wire::Grant>(), v, W2);
  // Reassign a free name, then the reserved sandbox acquires it.
  const Answer rel = AdminClient(lockd_.address(), key_, W2).release(id, S3, e + 1);
  ASSERT_NE(rel.as<wire::Ok>(), nullptr) << rel.message();
  const Answer ra = c.reassign(id, S1, W1);
  ASSERT_NE(ra.as<wire::Ok>(), nullptr) << ra.message();
  const Answer re = c.acquire("tok/a", S1, W1);
  ASSERT_NE(re.as<wire::Grant>(), nullptr) << re.message();
  EXPECT_EQ(re.as<wire::Grant>()->epoch, e + 2);
  expect_signed(*re.as<wire::Grant>(), v, W1);

  const auto counters = c.counters();
  ASSERT_TRUE(counters) << counters.message();
  std::uint64_t signed_count = 0;
  for (const auto& k : *counters)
    if (k.key == "tokens_signed") signed_count = k.value;
  EXPECT_EQ(signed_count, 5u);

  // A restarted lockd keeps its key: tokens from before and after verify with one public key.
  lockd_.terminate();
  start();
  const Answer after = client(W1).acquire("tok/c", S2, W1);
  ASSERT_NE(after.as<wire::Grant>(), nullptr) << after.message();
  expect_signed(*after.as<wire::Grant>(), v, W1);
  EXPECT_EQ(v.key_ids().size(), 1u);
}

TEST_F(LockdTokenTest, PreemptibleGrantsAreSigned) {
  start({"--mode", "preemptible"});
  token::TokenVerifier v;
  ASSERT_EQ(v.add_public_key_file((dir_.path() / "lockd.db.signing.key.pub").string()).message(), "");
  AdminClient c = client(W1);
  const Answer beat = c.worker_heartbeat(W1);
  ASSERT_NE(beat.as<wire::WorkerAck>(), nullptr) << beat.message();
  const Answer p = c.acquire("pre/a", S1, W1, 0, /*two_phase=*/true);
  ASSERT_NE(p.as<wire::Grant>(), nullptr) << p.message();
  const Answer cm = c.commit(name_id_of("pre/a"), S1, p.as<wire::Grant>()->epoch, W1);
  ASSERT_NE(cm.as<wire::Grant>(), nullptr) << cm.message();
  expect_signed(*cm.as<wire::Grant>(), v, W1);
}

TEST_F(LockdTokenTest, SigningKeyOptions) {
  const std::string key = (dir_.path() / "sign.key").string();
  ExitResult gen = run_lockd_to_exit({"--generate-signing-key", "--out", key}, dir_.path());
  ASSERT_EQ(gen.code, 0) << gen.err;
  EXPECT_NE(gen.out.find("wrote a new signing key (key id "), std::string::npos) << gen.out;
  ExitResult again = run_lockd_to_exit({"--generate-signing-key", "--out", key}, dir_.path());
  EXPECT_EQ(again.code, 1);
  EXPECT_NE(again.err.find("never overwritten"), std::string::npos) << again.err;
  ExitResult no_out = run_lockd_to_exit({"--generate-signing-key"}, dir_.path());
  EXPECT_EQ(no_out.code, 2);
  EXPECT_NE(no_out.err.find("--generate-signing-key needs --out"), std::string::npos) << no_out.err;

  auto signer_loaded = token::TokenSigner::load(key);
  ASSERT_TRUE(signer_loaded.ok()) << signer_loaded.message();
  const auto signer = std::move(signer_loaded).value();
  ExitResult pub = run_lockd_to_exit({"--print-public-key", "--signing-key-file", key}, dir_.path());
  ASSERT_EQ(pub.code, 0) << pub.err;
  EXPECT_NE(pub.out.find("key id " + token::key_id_text(signer->key_id())), std::string::npos) << pub.out;
  EXPECT_NE(pub.out.find(signer->public_key_pem()), std::string::npos) << pub.out;

  // lockd signs with the given key: its tokens verify with that key's public key.
  start({"--signing-key-file", key});
  token::TokenVerifier v;
  ASSERT_EQ(v.add_public_key(signer->public_key()).message(), "");
  const Answer a = client(W1).acquire("opt/a", S1, W1);
  ASSERT_NE(a.as<wire::Grant>(), nullptr) << a.message();
  expect_signed(*a.as<wire::Grant>(), v, W1);
  EXPECT_FALSE(std::filesystem::exists(dir_.path() / "lockd.db.signing.key")) << "no default key when one is given";
  lockd_.terminate();

  // A signing key others can read is refused, and so is a missing one that was named.
  ::chmod(key.c_str(), 0644);
  std::vector<std::string> args = base_args();
  args.insert(args.end(), {"--listen", "127.0.0.1:0", "--signing-key-file", key});
  ExitResult loose = run_lockd_to_exit(args, dir_.path());
  EXPECT_EQ(loose.code, 1);
  EXPECT_NE(loose.err.find("mode 0644"), std::string::npos) << loose.err;
  args.back() = (dir_.path() / "missing.key").string();
  ExitResult missing = run_lockd_to_exit(args, dir_.path());
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.err.find("--generate-signing-key"), std::string::npos) << missing.err;
}

// The public key lockd advertises beside its signing key is checked at start: another key's
// public key there (what an operator would copy to every resource, whose writes would then all
// be refused as unknown_key) stops lockd with both files named; the matching one starts it.
TEST_F(LockdTokenTest, AdvertisedPublicKeyMustMatchTheSigningKey) {
  const std::string key = (dir_.path() / "signing.key").string();
  const std::string other = (dir_.path() / "other.key").string();
  ASSERT_EQ(run_lockd_to_exit({"--generate-signing-key", "--out", key}, dir_.path()).code, 0);
  ASSERT_EQ(run_lockd_to_exit({"--generate-signing-key", "--out", other}, dir_.path()).code, 0);
  auto signer_loaded = token::TokenSigner::load(key);
  ASSERT_TRUE(signer_loaded.ok()) << signer_loaded.message();
  const auto signer = std::move(signer_loaded).value();
  auto other_signer_loaded = token::TokenSigner::load(other);
  ASSERT_TRUE(other_signer_loaded.ok()) << other_signer_loaded.message();
  const auto other_signer = std::move(other_signer_loaded).value();

  // The matching .pub: lockd starts and names it.
  start({"--signing-key-file", key});
  EXPECT_NE(lockd_.log().find("public key " + key + ".pub"), std::string::npos) << lockd_.log();
  lockd_.terminate();

  // Another key's public key in its place: refused, naming both files and both key ids.
  std::filesystem::copy_file(other + ".pub", key + ".pub", std::filesystem::copy_options::overwrite_existing);
  std::vector<std::string> args = base_args();
  args.insert(args.end(), {"--listen", "127.0.0.1:0", "--signing-key-file", key});
  ExitResult wrong = run_lockd_to_exit(args, dir_.path());
  EXPECT_EQ(wrong.code, 1) << wrong.err;
  EXPECT_NE(wrong.err.find("public key file " + key + ".pub (key id " + token::key_id_text(other_signer->key_id()) +
                           ") is not the public key of the signing key " + key + " (key id " +
                           token::key_id_text(signer->key_id()) + ")"),
            std::string::npos)
      << wrong.err;
  EXPECT_EQ(wrong.out.find("listening"), std::string::npos) << "lockd served with a wrong public key";

  // Not a public key at all: refused too.
  {
    std::ofstream(key + ".pub", std::ios::trunc) << "not a key\n";
  }
  ExitResult garbage = run_lockd_to_exit(args, dir_.path());
  EXPECT_EQ(garbage.code, 1) << garbage.err;
  EXPECT_NE(garbage.err.find("public key file " + key + ".pub is neither PEM"), std::string::npos) << garbage.err;

  // None: lockd starts and says how to print it.
  std::filesystem::remove(key + ".pub");
  start({"--signing-key-file", key});
  EXPECT_NE(lockd_.log().find("no public key file " + key + ".pub"), std::string::npos) << lockd_.log();
  lockd_.terminate();
  EXPECT_FALSE(std::filesystem::exists(key + ".pub")) << "lockd writes no public key file it did not generate";
}

// --print-public-key given the public key file (F.pub) prints it with its key id, instead of
// asking for a private key's mode; a file that is neither key is still refused.
TEST_F(LockdTokenTest, PrintPublicKeyAcceptsThePublicKeyFile) {
  const std::string key = (dir_.path() / "signing.key").string();
  ASSERT_EQ(run_lockd_to_exit({"--generate-signing-key", "--out", key}, dir_.path()).code, 0);
  auto signer_loaded = token::TokenSigner::load(key);
  ASSERT_TRUE(signer_loaded.ok()) << signer_loaded.message();
  const auto signer = std::move(signer_loaded).value();
  ExitResult pub = run_lockd_to_exit({"--print-public-key", "--signing-key-file", key + ".pub"}, dir_.path());
  ASSERT_EQ(pub.code, 0) << pub.err;
  EXPECT_NE(pub.out.find("public key file " + key + ".pub, key id " + token::key_id_text(signer->key_id())),
            std::string::npos)
      << pub.out;
  EXPECT_NE(pub.out.find(signer->public_key_pem()), std::string::npos) << pub.out;
  EXPECT_EQ(pub.err.find("chmod"), std::string::npos) << pub.err;

  const std::string junk = (dir_.path() / "junk").string();
  {
    std::ofstream(junk) << "junk\n";
  }
  ::chmod(junk.c_str(), 0644);
  ExitResult bad = run_lockd_to_exit({"--print-public-key", "--signing-key-file", junk}, dir_.path());
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find(junk), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace leasehold::lockd
