// HMAC-SHA256 tags and the key file rules (DESIGN.md "The wire protocol": key file, 0600).
#include "leasehold/wire/auth.hpp"

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace leasehold::wire {
namespace {

namespace fs = std::filesystem;

class KeyFile : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/leasehold-wire-key-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& content, mode_t mode) {
    const std::string path = dir_ + "/" + name;
    { std::ofstream(path) << content; }
    EXPECT_EQ(::chmod(path.c_str(), mode), 0);
    return path;
  }
  static bool contains(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
  }

  std::string dir_;
  const std::string hex64_ = std::string(64, 'a');
};

TEST_F(KeyFile, LoadsAKeyWithMode0600Or0400) {
  for (mode_t mode : {0600, 0400}) {
    const KeyLoad k = load_key_file(write("k" + std::to_string(mode), hex64_ + "\n", mode));
    ASSERT_TRUE(k) << k.message();
    EXPECT_EQ(k->bytes, std::vector<std::uint8_t>(32, 0xAA));
  }
}

TEST_F(KeyFile, RefusesGroupOrOtherAccessNamingModeAndFix) {
  for (mode_t mode : {0644, 0640, 0604, 0660, 0602, 0700}) {
    const std::string path = write("k", hex64_, mode);
    const KeyLoad k = load_key_file(path);
    EXPECT_FALSE(k);
    char mode_text[8];
    std::snprintf(mode_text, sizeof mode_text, "%04o", static_cast<unsigned>(mode));
    EXPECT_EQ(k.code(), Errc::permission_denied);
    EXPECT_TRUE(contains(k.message(), path)) << k.message();
    EXPECT_TRUE(contains(k.message(), mode_text)) << k.message();
    EXPECT_TRUE(contains(k.message(), "chmod 600 " + path)) << k.message();
    fs::remove(path);
  }
}

// A key file another user owns could be read or replaced by that user: refused, whatever its
// mode, naming the owner and the fix. Root and the process's own uid are accepted.
TEST_F(KeyFile, RefusesAFileOwnedByAnotherUserNamingOwnerAndFix) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give the key file another owner";
  const std::string path = write("k", hex64_ + "\n", 0600);
  ASSERT_EQ(::chown(path.c_str(), 4242, 4242), 0);
  const KeyLoad k = load_key_file(path);
  EXPECT_FALSE(k);
  EXPECT_EQ(k.code(), Errc::permission_denied);
  EXPECT_TRUE(contains(k.message(), path)) << k.message();
  EXPECT_TRUE(contains(k.message(), "owned by uid 4242")) << k.message();
  EXPECT_TRUE(contains(k.message(), "fix: chown 0 " + path)) << k.message();
  ASSERT_EQ(::chown(path.c_str(), 0, 0), 0);
  EXPECT_TRUE(load_key_file(path)) << "root's own key file loads";
}

TEST_F(KeyFile, RefusesMissingEmptyShortAndMalformedKeys) {
  const std::string missing = dir_ + "/absent";
  KeyLoad k = load_key_file(missing);
  EXPECT_FALSE(k);
  EXPECT_EQ(k.code(), Errc::not_found);
  EXPECT_TRUE(contains(k.message(), missing)) << k.message();
  EXPECT_TRUE(contains(k.message(), "No such file")) << k.message();
  EXPECT_TRUE(contains(k.message(), "`leasehold-lockd --generate-key " + missing + "`")) << k.message();

  k = load_key_file(write("empty", "", 0600));
  EXPECT_FALSE(k);
  EXPECT_EQ(k.code(), Errc::corrupt);
  EXPECT_TRUE(contains(k.message(), "is empty")) << k.message();

  k = load_key_file(write("short", std::string(62, 'b'), 0600));
  EXPECT_FALSE(k);
  EXPECT_TRUE(contains(k.message(), "62 hex digits")) << k.message();

  k = load_key_file(write("odd", std::string(65, 'b'), 0600));
  EXPECT_FALSE(k);

  k = load_key_file(write("nothex", std::string(63, 'b') + "g", 0600));
  EXPECT_FALSE(k);
  EXPECT_TRUE(contains(k.message(), "byte 63 is not a hex digit")) << k.message();

  k = load_key_file(write("long", std::string(2 * kKeyBytesMax + 2, 'c'), 0600));
  EXPECT_FALSE(k);

  k = load_key_file(dir_);
  EXPECT_FALSE(k);
  EXPECT_EQ(k.code(), Errc::invalid_argument);
  EXPECT_TRUE(contains(k.message(), "not a regular file")) << k.message();
}

// A FIFO is refused like a directory, at once: opening it must not wait for a writer (which
// hung lockd at start-up). The load runs in a child that SIGALRM ends if it blocks.
TEST_F(KeyFile, RefusesAFifoWithoutBlocking) {
  const std::string path = dir_ + "/fifo.key";
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::alarm(20);
    const KeyLoad k = load_key_file(path);
    ::_exit(!k && contains(k.message(), "not a regular file") ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "load_key_file blocked on a FIFO (killed by signal "
                                 << (WIFSIGNALED(status) ? WTERMSIG(status) : 0) << ")";
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST_F(KeyFile, GeneratedKeyIs0600LoadsAndIsNeverOverwritten) {
  const std::string path = dir_ + "/generated.key";
  ASSERT_EQ(generate_key_file(path).message(), "");
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  const KeyLoad a = load_key_file(path);
  ASSERT_TRUE(a) << a.message();
  EXPECT_EQ(a->bytes.size(), kKeyBytesMin);

  const Status again = generate_key_file(path);
  EXPECT_EQ(again.code(), Errc::exists);
  EXPECT_TRUE(contains(again.message(), "never overwritten")) << again.message();
  const KeyLoad b = load_key_file(path);
  ASSERT_TRUE(b);
  EXPECT_EQ(a->bytes, b->bytes);

  const std::string other = dir_ + "/other.key";
  ASSERT_EQ(generate_key_file(other).message(), "");
  EXPECT_NE(load_key_file(other)->bytes, a->bytes);  // fresh randomness
}

TEST(Authenticator, MatchesOpenSslOneShotHmacSha256) {
  WireKey key;
  for (int i = 0; i < 32; ++i) key.bytes.push_back(static_cast<std::uint8_t>(i * 7 + 1));
  Authenticator auth(key);
  const std::string msg = "what do ya want for nothing?";
  const std::span<const std::uint8_t> data(reinterpret_cast<const std::uint8_t*>(msg.data()), msg.size());
  unsigned char expected[32];
  unsigned int len = 0;
  ASSERT_NE(HMAC(EVP_sha256(), key.bytes.data(), static_cast<int>(key.bytes.size()), data.data(), data.size(),
                 expected, &len),
            nullptr);
  ASSERT_EQ(len, 32u);
  // Twice: the re-initialised context starts from the keyed state every time.
  for (int round = 0; round < 2; ++round) {
    const auto tag = auth.mac(data);
    EXPECT_TRUE(std::equal(tag.begin(), tag.end(), expected)) << round;
  }
}

// The tag is computed from precomputed pad states: the same bytes as OpenSSL's HMAC for every
// allowed key length and for data around SHA-256's block boundaries (and datagram sizes).
TEST(Authenticator, MatchesOpenSslHmacForEveryKeyLengthAndBlockBoundary) {
  for (std::size_t key_bytes : {kKeyBytesMin, kKeyBytesMin + 1, std::size_t{55}, std::size_t{56}, kKeyBytesMax - 1,
                                kKeyBytesMax}) {
    WireKey key;
    for (std::size_t i = 0; i < key_bytes; ++i) key.bytes.push_back(static_cast<std::uint8_t>(0xA5 ^ (i * 13)));
    const Authenticator auth(key);
    for (std::size_t n : {0, 1, 31, 55, 56, 63, 64, 65, 119, 120, 128, 1210, 1351, 1400}) {
      std::vector<std::uint8_t> data(n);
      for (std::size_t i = 0; i < n; ++i) data[i] = static_cast<std::uint8_t>(i * 31 + key_bytes);
      unsigned char expected[32];
      unsigned int len = 0;
      ASSERT_NE(HMAC(EVP_sha256(), key.bytes.data(), static_cast<int>(key.bytes.size()), data.data(), data.size(),
                     expected, &len),
                nullptr);
      const auto tag = auth.mac(data);
      EXPECT_TRUE(std::equal(tag.begin(), tag.end(), expected)) << "key " << key_bytes << " bytes, data " << n;
    }
  }
}

TEST(Authenticator, SignThenVerifyAndRejectTampering) {
  Authenticator auth(WireKey{std::vector<std::uint8_t>(40, 3)});
  std::vector<std::uint8_t> d(100, 9);
  auth.sign(d);
  EXPECT_TRUE(auth.verify(d));
  d[0] ^= 1;
  EXPECT_FALSE(auth.verify(d));
  d[0] ^= 1;
  d[99] ^= 1;
  EXPECT_FALSE(auth.verify(d));
  EXPECT_FALSE(auth.verify(std::span<const std::uint8_t>(d).first(10)));
}

TEST(Authenticator, RefusesKeysOutsideTheAllowedLength) {
  EXPECT_THROW(Authenticator(WireKey{std::vector<std::uint8_t>(kKeyBytesMin - 1, 1)}), std::invalid_argument);
  EXPECT_THROW(Authenticator(WireKey{std::vector<std::uint8_t>(kKeyBytesMax + 1, 1)}), std::invalid_argument);
  EXPECT_FALSE(parse_key_hex("zz"));
  EXPECT_TRUE(parse_key_hex(std::string(64, 'F')));
}

}  // namespace
}  // namespace leasehold::wire
