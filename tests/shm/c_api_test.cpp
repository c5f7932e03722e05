// libleasehold-check: the C ABI against a live table.
#include "leasehold/check.h"
#include "leasehold/wire/token.hpp"
#include "leasehold/shm/table.hpp"
#include "tests/shm/test_util.hpp"

#include <gtest/gtest.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <string>

namespace leasehold::shm {
namespace {

using test::options_for;
using test::sandbox;
using test::TempTable;

// One version everywhere: the header's macros, the loaded library's answer, its soname (the
// file the loader opened) and its file name (the soname link's target).
TEST(CheckAbi, TheVersionAtRunTimeIsTheHeadersAndTheLibraryFilesName) {
  const std::string header = std::to_string(LEASEHOLD_CHECK_ABI_VERSION) + "." +
                             std::to_string(LEASEHOLD_CHECK_VERSION_MINOR) + "." +
                             std::to_string(LEASEHOLD_CHECK_VERSION_PATCH);
  EXPECT_EQ(std::string(leasehold_check_version()), header);
  EXPECT_EQ(std::string(leasehold_check_version()), "1.1.0");
  Dl_info info{};
  ASSERT_NE(::dladdr(reinterpret_cast<void*>(&leasehold_check_version), &info), 0);
  const std::string loaded = info.dli_fname;
  const std::string soname = "libleasehold-check.so." + std::to_string(LEASEHOLD_CHECK_ABI_VERSION);
  EXPECT_EQ(loaded.substr(loaded.rfind('/') + 1), soname) << loaded;
  char real[4096] = {};
  ASSERT_NE(::realpath(loaded.c_str(), real), nullptr) << loaded;
  const std::string file = real;
  EXPECT_EQ(file.substr(file.rfind('/') + 1), "libleasehold-check.so." + header) << file;
}

TEST(CheckAbi, OpenCheckSnapshotFind) {
  TempTable t;
  auto w = TableWriter::create(options_for(t));
  const std::uint64_t now = boottime_ns();
  const Result<ClaimedSlot> claimed = w.claim(SandboxId{0x0f8fad5bd9cb469fULL, 0xa16570867728950eULL}, now);
  ASSERT_TRUE(claimed.ok()) << claimed.message();
  const ClaimedSlot c = *claimed;
  ASSERT_EQ(w.publish(c.slot, name_id_of("svc"), "svc", 12, now + 60'000'000'000ULL), TableErrc::ok);

  leasehold_table* table = nullptr;
  char err[256];
  ASSERT_EQ(leasehold_open(t.location.c_str(), 0, &table, err, sizeof err), LEASEHOLD_OK) << err;
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(leasehold_slot_count(table), 8u);
  const leasehold_slot* s = leasehold_slot_at(table, c.slot);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(leasehold_slot_at(table, 8), nullptr);
  EXPECT_EQ(leasehold_check(s, 12), 1);
  EXPECT_EQ(leasehold_check(s, 11), 0);
  EXPECT_EQ(leasehold_check(s, 0), 0);
  EXPECT_EQ(leasehold_check(nullptr, 12), 0);
  EXPECT_EQ(leasehold_lease_valid(leasehold_lease_at(table, c.slot, 12)), 1);
  EXPECT_EQ(leasehold_lease_valid(leasehold_lease_at(table, c.slot, 13)), 0);
  EXPECT_EQ(leasehold_lease_valid(leasehold_lease_at(table, c.slot, 0)), 0);
  EXPECT_EQ(leasehold_lease_valid(leasehold_lease_at(table, 99, 12)), 0);
  EXPECT_EQ(leasehold_lease_valid(leasehold_lease_at(nullptr, c.slot, 12)), 0);
  const leasehold_lease held = leasehold_lease_at(table, c.slot, 12);
  EXPECT_EQ(leasehold_check_slot(table, c.slot, 12), 1);
  EXPECT_EQ(leasehold_check_slot(table, 99, 12), 0);
  EXPECT_EQ(leasehold_check_deadline(table, c.slot, 12), 1);
  std::uint64_t age = 0;
  EXPECT_EQ(leasehold_writer_alive(table, &age), 1);
  EXPECT_LT(age, UINT64_MAX);

  leasehold_slot_info info;
  ASSERT_EQ(leasehold_snapshot(table, c.slot, &info), LEASEHOLD_OK);
  EXPECT_EQ(info.epoch, 12u);
  EXPECT_EQ(info.state, 2u);
  EXPECT_EQ(info.sandbox_id[0], 0x0f);
  EXPECT_EQ(info.sandbox_id[15], 0x0e);
  EXPECT_STREQ(info.name_prefix, "svc");
  EXPECT_EQ(leasehold_snapshot(table, 99, &info), LEASEHOLD_E_BAD_SLOT);
  EXPECT_EQ(leasehold_find_sandbox(table, "0f8fad5b-d9cb-469f-a165-70867728950e"),
            static_cast<int64_t>(c.slot));
  EXPECT_EQ(leasehold_find_sandbox(table, "00000000-0000-0000-0000-000000000001"), LEASEHOLD_E_NOT_FOUND);
  EXPECT_EQ(leasehold_find_sandbox(table, "not-a-uuid"), LEASEHOLD_E_ARG);

  w.revoke(c.slot);
  EXPECT_EQ(leasehold_check(s, 12), 0);
  EXPECT_EQ(leasehold_lease_valid(held), 0);
  EXPECT_EQ(leasehold_check_deadline(table, c.slot, 12), 0);
  w.close(boottime_ns());
  EXPECT_EQ(leasehold_writer_alive(table, &age), 0);
  leasehold_close(table);
}

// A snapshot reports each slot state as its LEASEHOLD_SLOT_* constant, through the slot's whole
// lifecycle; a state byte the library does not know is LEASEHOLD_SLOT_UNKNOWN, never passed on
// as a number a caller might read as a state.
TEST(CheckAbi, SnapshotStatesAreTheHeaderConstants) {
  TempTable t;
  auto w = TableWriter::create(options_for(t));
  leasehold_table* table = nullptr;
  char err[256];
  ASSERT_EQ(leasehold_open(t.location.c_str(), 0, &table, err, sizeof err), LEASEHOLD_OK) << err;
  auto state_of = [&](std::uint32_t slot) {
    leasehold_slot_info info;
    info.state = 0xDEAD;
    EXPECT_EQ(leasehold_snapshot(table, slot, &info), LEASEHOLD_OK);
    return info.state;
  };
  EXPECT_EQ(state_of(0), static_cast<std::uint32_t>(LEASEHOLD_SLOT_FREE));
  const std::uint64_t now = boottime_ns();
  const Result<ClaimedSlot> claimed = w.claim(sandbox(1), now);
  ASSERT_TRUE(claimed.ok()) << claimed.message();
  const ClaimedSlot c = *claimed;
  EXPECT_EQ(state_of(c.slot), static_cast<std::uint32_t>(LEASEHOLD_SLOT_CLAIMED));
  ASSERT_EQ(w.publish(c.slot, name_id_of("svc"), "svc", 3, now + 60'000'000'000ULL), TableErrc::ok);
  EXPECT_EQ(state_of(c.slot), static_cast<std::uint32_t>(LEASEHOLD_SLOT_PUBLISHED));
  ASSERT_EQ(w.free(c.slot, now), TableErrc::ok);
  EXPECT_EQ(state_of(c.slot), static_cast<std::uint32_t>(LEASEHOLD_SLOT_COOLING));
  EXPECT_EQ(LEASEHOLD_SLOT_FREE, 0);
  EXPECT_EQ(LEASEHOLD_SLOT_CLAIMED, 1);
  EXPECT_EQ(LEASEHOLD_SLOT_PUBLISHED, 2);
  EXPECT_EQ(LEASEHOLD_SLOT_COOLING, 3);

  // Byte 0 of a slot's info word is its state: write one no SlotState has into the file.
  const std::uint32_t slot = 5;
  const int fd = ::open(t.path().c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const std::uint8_t junk = 0x7E;
  ASSERT_EQ(::pwrite(fd, &junk, 1, static_cast<off_t>(kSlotsOffset + slot * kSlotBytes + offsetof(Slot, info))), 1);
  ::close(fd);
  EXPECT_EQ(state_of(slot), static_cast<std::uint32_t>(LEASEHOLD_SLOT_UNKNOWN));
  leasehold_close(table);
}

TEST(CheckAbi, ErrorsAreCodesWithMessages) {
  leasehold_table* table = nullptr;
  char err[256];
  EXPECT_EQ(leasehold_open("lh-no-such-table-xyz", 0, &table, err, sizeof err), LEASEHOLD_E_MISSING);
  EXPECT_EQ(table, nullptr);
  EXPECT_NE(std::string(err).find("does not exist"), std::string::npos) << err;
  ::unsetenv("LEASEHOLD_SHM");
  EXPECT_EQ(leasehold_open(nullptr, 0, &table, err, sizeof err), LEASEHOLD_E_MISSING);
  EXPECT_NE(std::string(err).find("LEASEHOLD_SHM"), std::string::npos) << err;
  EXPECT_EQ(leasehold_open("a/b", 0, &table, err, sizeof err), LEASEHOLD_E_ARG);
  EXPECT_EQ(leasehold_open("x", 0, nullptr, err, sizeof err), LEASEHOLD_E_ARG);
  EXPECT_STREQ(leasehold_strerror(LEASEHOLD_E_VERSION), "incompatible table layout version");
  EXPECT_EQ(leasehold_writer_alive(nullptr, nullptr), 0);
  EXPECT_EQ(leasehold_check_deadline(nullptr, 0, 1), 0);

  TempTable t;
  auto w = TableWriter::create(options_for(t));
  ::setenv("LEASEHOLD_SHM", t.location.c_str(), 1);
  ASSERT_EQ(leasehold_open(nullptr, 0, &table, err, sizeof err), LEASEHOLD_OK) << err;
  leasehold_close(table);
  ::unsetenv("LEASEHOLD_SHM");
}

// The C ABI gives a runtime its grant's token from its own token channel and lets a resource
// verify one with lockd's public key alone: the made-up epoch is refused with its reason, the
// real token accepted.
TEST(CheckAbi, TokenFromTheChannelVerifiesAndForgeriesDoNot) {
  auto w = TokenChannel::create("capi-tokens");
  const char* holder_text = "0f8fad5b-d9cb-469f-a165-70867728950e";
  const SandboxId holder = *SandboxId::parse(holder_text);
  const auto lockd_key = token::TokenSigner::generate().value();
  ASSERT_NE(lockd_key, nullptr);
  token::GrantToken g;
  g.name = name_id_of("svc");
  g.epoch = 12;
  g.holder = holder;
  ASSERT_TRUE(lockd_key->sign(g));
  const token::TokenBytes signed_bytes = token::encode(g);
  ASSERT_EQ(w.publish(12, signed_bytes), TableErrc::ok);

  const Result<int> reopened = w.reopen_read_only();
  ASSERT_TRUE(reopened.ok()) << reopened.message();
  const int ro = *reopened;
  leasehold_tokens* table = nullptr;
  char err[256];
  ::unsetenv("LEASEHOLD_TOKENS");
  EXPECT_EQ(leasehold_tokens_open(nullptr, &table, err, sizeof err), LEASEHOLD_E_MISSING);
  EXPECT_NE(std::string(err).find("LEASEHOLD_TOKENS is not set"), std::string::npos) << err;
  EXPECT_EQ(leasehold_tokens_open("/dev/shm/x", &table, err, sizeof err), LEASEHOLD_E_ARG);
  ::setenv("LEASEHOLD_TOKENS", std::to_string(ro).c_str(), 1);
  ASSERT_EQ(leasehold_tokens_open(nullptr, &table, err, sizeof err), LEASEHOLD_OK) << err;
  ::unsetenv("LEASEHOLD_TOKENS");
  std::uint8_t buf[LEASEHOLD_TOKEN_BYTES];
  ASSERT_EQ(leasehold_token(table, 12, buf, sizeof buf), LEASEHOLD_TOKEN_BYTES);
  EXPECT_TRUE(std::equal(signed_bytes.begin(), signed_bytes.end(), buf));
  EXPECT_EQ(leasehold_token(table, 13, buf, sizeof buf), LEASEHOLD_E_NOT_FOUND);
  EXPECT_EQ(leasehold_token(table, 12, buf, 10), LEASEHOLD_E_ARG);
  EXPECT_EQ(leasehold_token(nullptr, 12, buf, sizeof buf), LEASEHOLD_E_ARG);

  leasehold_verifier* v = leasehold_verifier_new();
  ASSERT_NE(v, nullptr);
  const auto& pub = lockd_key->public_key();
  ASSERT_EQ(leasehold_verifier_add_key(v, pub.data(), pub.size()), LEASEHOLD_OK);
  EXPECT_EQ(leasehold_verifier_add_key(v, pub.data(), 31), LEASEHOLD_E_ARG);
  EXPECT_EQ(leasehold_verify(v, buf, sizeof buf, "svc", 12, holder_text, err, sizeof err), LEASEHOLD_OK) << err;
  // The stale holder's made-up epoch, with its real token or none: refused, with the reason.
  EXPECT_EQ(leasehold_verify(v, buf, sizeof buf, "svc", 12 + 1000, holder_text, err, sizeof err),
            LEASEHOLD_E_TOKEN_WRONG_EPOCH);
  EXPECT_NE(std::string(err).find("token wrong_epoch"), std::string::npos) << err;
  EXPECT_EQ(leasehold_verify(v, nullptr, 0, "svc", INT64_MAX, holder_text, err, sizeof err), LEASEHOLD_E_TOKEN_UNSIGNED);
  std::uint8_t forged[LEASEHOLD_TOKEN_BYTES];
  std::copy(std::begin(buf), std::end(buf), forged);
  forged[28] ^= 0x01;  // the epoch field, after signing
  EXPECT_EQ(leasehold_verify(v, forged, sizeof forged, "svc", 13, holder_text, err, sizeof err),
            LEASEHOLD_E_TOKEN_BAD_SIGNATURE);
  EXPECT_EQ(leasehold_verify(v, buf, sizeof buf, "other", 12, holder_text, err, sizeof err), LEASEHOLD_E_TOKEN_WRONG_NAME);
  EXPECT_EQ(leasehold_verify(v, buf, sizeof buf, "svc", 12, "00000000-0000-0000-0000-000000000001", err, sizeof err),
            LEASEHOLD_E_TOKEN_WRONG_HOLDER);
  EXPECT_EQ(leasehold_verify(v, buf, 139, "svc", 12, holder_text, err, sizeof err), LEASEHOLD_E_TOKEN_MALFORMED);
  EXPECT_EQ(leasehold_verify(v, buf, sizeof buf, "bad name!", 12, holder_text, err, sizeof err), LEASEHOLD_E_ARG);
  EXPECT_STREQ(leasehold_strerror(LEASEHOLD_E_TOKEN_BAD_SIGNATURE), "token signature does not verify (forged)");
  leasehold_verifier* empty = leasehold_verifier_new();
  EXPECT_EQ(leasehold_verify(empty, buf, sizeof buf, "svc", 12, holder_text, err, sizeof err),
            LEASEHOLD_E_TOKEN_UNKNOWN_KEY);
  EXPECT_EQ(leasehold_verifier_add_key_file(empty, "/nonexistent/lockd.pub", err, sizeof err), LEASEHOLD_E_IO);
  leasehold_verifier_free(empty);
  leasehold_verifier_free(v);
  leasehold_tokens_close(table);
  ::close(ro);
}

}  // namespace
}  // namespace leasehold::shm
