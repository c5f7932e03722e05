// shm table: writer/reader protocol, creation rules, bad input (DESIGN.md "The shared-memory
// epoch table").
#include "leasehold/shm/table.hpp"
#include "tests/shm/test_util.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <sys/mman.h>
#include <fcntl.h>
#include <fstream>
#include <sstream>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

namespace leasehold::shm {
namespace {

using test::options_for;
using test::sandbox;
using test::TempTable;

constexpr std::uint64_t kS = 1'000'000'000ULL;

// Claims a slot for sandbox(1) and publishes epoch 5 on it, valid forever.
ClaimedSlot claim_and_publish(TableWriter& w) {
  const Result<ClaimedSlot> c = w.claim(sandbox(1), 1);
  if (!c.ok()) {
    ADD_FAILURE() << c.message();
    return {};
  }
  EXPECT_EQ(w.publish(c->slot, NameId{1, 2}, "n", 5, UINT64_MAX), TableErrc::ok);
  return *c;
}

TEST(ShmTable, PublishThenCheckAndSnapshot) {
  TempTable t;
  auto w = TableWriter::create(options_for(t));
  const auto now = boottime_ns();
  const auto c = w.claim(sandbox(1), now);
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->generation, 1u);
  auto r = TableReader::open(t.location);
  EXPECT_FALSE(r.check(c->slot, 5)) << "claimed but unpublished slot must not be valid";
  ASSERT_EQ(w.publish(c->slot, name_id_of("db/primary"), "db/primary", 5, now + 60 * kS), TableErrc::ok);
  EXPECT_TRUE(r.check(c->slot, 5));
  EXPECT_TRUE(TableReader::check(*r.slot(c->slot), 5));
  EXPECT_FALSE(r.check(c->slot, 4));
  EXPECT_FALSE(r.check(c->slot, 6));
  EXPECT_FALSE(r.check(c->slot, 0));
  EXPECT_FALSE(r.check(c->slot, 5 | kRevokedBit));
  EXPECT_FALSE(r.check(r.slot_count(), 5)) << "out of range";
  EXPECT_EQ(r.slot(r.slot_count()), nullptr);
  EXPECT_TRUE(r.check_deadline(c->slot, 5));
  EXPECT_TRUE(r.lease(c->slot, 5).valid());
  EXPECT_FALSE(r.lease(c->slot, 6).valid());
  EXPECT_FALSE(r.lease(c->slot, 0).valid()) << "epoch 0 is out of range";
  EXPECT_FALSE(r.lease(c->slot, 5 | kRevokedBit).valid()) << "epoch >= 2^63 is out of range";
  EXPECT_FALSE(r.lease(r.slot_count(), 5).valid()) << "slot out of range";
  const LeaseCheck held = r.lease(c->slot, 5);
  w.revoke(c->slot);
  EXPECT_FALSE(held.valid()) << "a resolved lease sees the revoke";
  ASSERT_EQ(w.free(c->slot, now), TableErrc::ok);
  EXPECT_FALSE(r.lease(c->slot, 0).valid()) << "a freed slot's word is 0; epoch 0 still fails";
  const auto c1 = w.claim(sandbox(1), now + 10'000'000);
  ASSERT_TRUE(c1.ok()) << c1.message();
  ASSERT_EQ(w.publish(c1->slot, name_id_of("db/primary"), "db/primary", 5, now + 60 * kS), TableErrc::ok);

  SlotSnapshot s;
  ASSERT_EQ(r.snapshot(c1->slot, s), TableErrc::ok);
  EXPECT_EQ(s.state, SlotState::published);
  EXPECT_EQ(s.epoch, 5u);
  EXPECT_FALSE(s.revoked);
  EXPECT_EQ(s.sandbox, sandbox(1));
  EXPECT_EQ(s.name, name_id_of("db/primary"));
  EXPECT_EQ(s.name_bytes, 10u);
  EXPECT_STREQ(s.name_prefix, "db/pri");
  EXPECT_EQ(s.valid_until_ns, now + 60 * kS);
  EXPECT_EQ(r.snapshot(r.slot_count(), s), TableErrc::bad_slot);

  const auto found = r.find(sandbox(1));
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->index, c1->slot);
  EXPECT_FALSE(r.find(sandbox(2)).has_value());
  EXPECT_FALSE(r.find(SandboxId{}).has_value());

  const Header& h = r.header();
  EXPECT_EQ(h.magic, kMagic);
  EXPECT_EQ(h.layout_major, kLayoutMajor);
  EXPECT_EQ(h.slot_count, 8u);
  EXPECT_EQ(h.writer_pid, ::getpid());
  EXPECT_EQ(h.clock_id, CLOCK_BOOTTIME);
  EXPECT_EQ(h.incarnation, 1u);
  EXPECT_EQ(h.total_bytes, table_bytes(8));
}

// A sandbox's token channel: the token of its grant, replaced by the next grant's, cleared on
// demand; a read-only descriptor maps it but cannot write, grow, shrink or remap it writable; a
// reader refuses what is not a token channel (the shm table's descriptor, a non-number).
TEST(ShmTokenChannel, HoldsTheGrantsTokenAndIsSealedReadOnly) {
  auto c = TokenChannel::create("test-tokens");
  constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL;
  const Result<int> seals = c.seals();
  ASSERT_TRUE(seals.ok()) << seals.message();
  EXPECT_EQ(*seals & kSeals, kSeals);
  const Result<int> reopened = c.reopen_read_only();
  ASSERT_TRUE(reopened.ok()) << reopened.message();
  const int ro = *reopened;
  const auto r = TokenChannelReader::open(std::to_string(ro));
  std::vector<std::uint8_t> tok(140);
  for (std::size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<std::uint8_t>(i * 3 + 1);
  TokenSnapshot ts;
  ASSERT_EQ(r.read(ts), TableErrc::ok);
  EXPECT_EQ(ts.length, 0u) << "a new channel holds no token";
  ASSERT_EQ(c.publish(5, tok), TableErrc::ok);
  ASSERT_EQ(r.read(ts), TableErrc::ok);
  EXPECT_EQ(ts.epoch, 5u);
  ASSERT_EQ(ts.length, tok.size());
  EXPECT_TRUE(std::equal(tok.begin(), tok.end(), ts.view().begin()));
  const auto own5 = own_token(std::to_string(ro), 5);
  ASSERT_TRUE(own5.ok()) << own5.message();
  EXPECT_EQ(*own5, tok);
  const auto own6 = own_token(std::to_string(ro), 6);
  ASSERT_FALSE(own6.ok());
  EXPECT_EQ(own6.code(), Errc::not_found);
  EXPECT_NE(own6.message().find("for epoch 6"), std::string::npos) << own6.message();
  tok[0] ^= 0xFF;
  ASSERT_EQ(c.publish(6, tok), TableErrc::ok);
  ASSERT_EQ(r.read(ts), TableErrc::ok);
  EXPECT_EQ(ts.epoch, 6u);
  EXPECT_EQ(ts.bytes[0], tok[0]);
  c.clear();
  ASSERT_EQ(r.read(ts), TableErrc::ok);
  EXPECT_EQ(ts.length, 0u);
  EXPECT_EQ(ts.epoch, 0u);
  EXPECT_EQ(c.publish(1, std::vector<std::uint8_t>(kTokenRecordWords * 8 + 1)), TableErrc::bad_argument);
  EXPECT_EQ(c.publish(0, tok), TableErrc::bad_argument) << "a token needs an epoch in [1, 2^63)";
  // The read-only descriptor: no write, no truncate, no writable mapping, no writable reopen.
  EXPECT_EQ(::write(ro, "x", 1), -1);
  EXPECT_NE(::ftruncate(ro, 0), 0);
  EXPECT_EQ(::mmap(nullptr, kTokenChannelBytes, PROT_READ | PROT_WRITE, MAP_SHARED, ro, 0), MAP_FAILED);
  // Mode 0400: only root reopens it for writing, and then the seals refuse every write.
  if (const int rw = ::open(("/proc/self/fd/" + std::to_string(ro)).c_str(), O_RDWR | O_CLOEXEC); rw >= 0) {
    EXPECT_EQ(::geteuid(), 0u) << "a non-root owner reopened the 0400 channel for writing";
    EXPECT_EQ(::write(rw, "x", 1), -1);
    EXPECT_EQ(errno, EPERM);
    EXPECT_EQ(::mmap(nullptr, kTokenChannelBytes, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0), MAP_FAILED);
    ::close(rw);
  }
  // Not a token channel.
  auto code_of_open = [](const std::string& loc) {
    try {
      (void)TokenChannelReader::open(loc);
      return TableErrc::ok;
    } catch (const TableError& e) {
      return e.code();
    }
  };
  EXPECT_EQ(code_of_open("/dev/shm/x"), TableErrc::bad_argument);
  EXPECT_EQ(code_of_open(""), TableErrc::bad_argument);
  EXPECT_EQ(code_of_open("999"), TableErrc::missing);
  TempTable t;
  auto w = TableWriter::create(options_for(t));
  const Result<int> table_fd_result = w.reopen_read_only();
  ASSERT_TRUE(table_fd_result.ok()) << table_fd_result.message();
  const int table_fd = *table_fd_result;
  EXPECT_EQ(code_of_open(std::to_string(table_fd)), TableErrc::bad_magic);
  ::close(table_fd);
  ::close(ro);
}

// Layout 3 has no token area: the table is the header, stats and slots alone, and a reader
// refuses a layout-2 table (which held every slot's token) as older.
TEST(ShmTable, Layout3HoldsNoTokens) {
  static_assert(kLayoutMajor == 3);
  EXPECT_EQ(table_bytes(16), kSlotsOffset + 16 * kSlotBytes);
  TempTable t;
  auto o = options_for(t);
  o.slot_count = 16;
  auto w = TableWriter::create(o);
  EXPECT_EQ(TableReader::open(t.location).header().total_bytes, table_bytes(16));
  std::vector<char> file(table_bytes(16));
  std::memcpy(file.data(), static_cast<const void*>(&w.header()), sizeof(Header));
  const std::uint16_t old_major = 2;
  std::memcpy(file.data() + offsetof(Header, layout_major), &old_major, sizeof old_major);
  TempTable old(true);
  {
    std::ofstream out(old.path(), std::ios::binary);
    out.write(file.data(), static_cast<std::streamsize>(file.size()));
    ASSERT_TRUE(out.good()) << old.path();
  }
  try {
    (void)TableReader::open(old.location);
    ADD_FAILURE() << "a layout-2 table opened";
  } catch (const TableError& e) {
    EXPECT_EQ(e.code(), TableErrc::older_major);
    EXPECT_NE(std::string(e.what()).find("layout 2.0 is older"), std::string::npos) << e.what();
    EXPECT_EQ(errc_of(e.code()), Errc::unsupported);
  }
}

TEST(ShmTable, DeadlineAndExtend) {
  TempTable t;
  auto w = TableWriter::create(options_for(t));
  const std::uint64_t now = boottime_ns();
  const auto c = w.claim(sandbox(1), now);
  ASSERT_EQ(w.publish(c->slot, name_id_of("n"), "n", 9, now + 100), TableErrc::ok);
  auto r = TableReader::open(t.location);
  EXPECT_TRUE(r.check_deadline_at(c->slot, 9, now + 99));
  EXPECT_FALSE(r.check_deadline_at(c->slot, 9, now + 100)) << "valid_until is exclusive";
  ASSERT_EQ(w.extend(c->slot, now + 1000), TableErrc::ok);
  EXPECT_TRUE(r.check_deadline_at(c->slot, 9, now + 999));
  EXPECT_FALSE(r.check_deadline_at(c->slot, 8, now + 10)) << "wrong epoch";
  EXPECT_FALSE(r.check_deadline_at(99, 9, now + 10)) << "out of range";
  EXPECT_EQ(w.extend(c->slot + 1, now), TableErrc::wrong_state) << "slot is not published";
  EXPECT_EQ(w.extend(1000, now), TableErrc::bad_slot);
}

// A writer with one claimed slot, for the death tests (threadsafe style: the table is mapped).
class ShmTableDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
  TempTable t;
  TableWriter w = TableWriter::create(options_for(t));
  const std::uint64_t now = boottime_ns();
  const ClaimedSlot c = w.claim(sandbox(1), now).value();
};

// The publish end of "epoch monotone": a slot's published epoch never goes down until the slot is
// freed (a lower one would make a fenced token valid again). Fed the violation, it aborts.
TEST_F(ShmTableDeathTest, PublishingALowerEpochAborts) {
  ASSERT_EQ(w.publish(c.slot, name_id_of("n"), "n", 7, now + 100), TableErrc::ok);
  EXPECT_DEATH(w.publish(c.slot, name_id_of("n"), "n", 6, now + 200), "LEASEHOLD_ASSERT\\(cur == 0 \\|\\| epoch >= cur\\) failed");
  ASSERT_EQ(w.publish(c.slot, name_id_of("n"), "n", 7, now + 200), TableErrc::ok) << "the same epoch again is fine";
  ASSERT_EQ(w.publish(c.slot, name_id_of("n"), "n", 8, now + 300), TableErrc::ok);
}

// The shm end of "valid_until never decreasing": an extend that moves a published deadline back
// aborts; the same deadline again, or a later one, is fine.
TEST_F(ShmTableDeathTest, ExtendingToAnEarlierDeadlineAborts) {
  ASSERT_EQ(w.publish(c.slot, name_id_of("n"), "n", 9, now + 1000), TableErrc::ok);
  ASSERT_EQ(w.extend(c.slot, now + 1000), TableErrc::ok);
  EXPECT_DEATH(w.extend(c.slot, now + 999), "LEASEHOLD_ASSERT\\(valid_until_ns >= .*\\) failed");
  ASSERT_EQ(w.extend(c.slot, now + 2000), TableErrc::ok);
  auto r = TableReader::open(t.location);
  EXPECT_TRUE(r.check_deadline_at(c.slot, 9, now + 1999));
}

// The same end through publish(): the same epoch again may move its deadline only forward.
TEST_F(ShmTableDeathTest, RepublishingAnEpochWithAnEarlierDeadlineAborts) {
  ASSERT_EQ(w.publish(c.slot, name_id_of("n"), "n", 4, now + 1000), TableErrc::ok);
  EXPECT_DEATH(w.publish(c.slot, name_id_of("n"), "n", 4, now + 999), "LEASEHOLD_ASSERT\\(valid_until_ns >= .*\\) failed");
  ASSERT_EQ(w.publish(c.slot, name_id_of("n"), "n", 4, now + 1000), TableErrc::ok) << "the same deadline again is fine";
  ASSERT_EQ(w.publish(c.slot, name_id_of("n"), "n", 5, now + 500), TableErrc::ok) << "a new epoch starts its own deadline";
}

TEST(ShmTable, RevokeIsStickyUntilFree) {
  TempTable t;
  auto o = options_for(t, 1);
  o.slot_cooldown_ns = 10;
  auto w = TableWriter::create(o);
  auto r = TableReader::open(t.location);
  const std::uint64_t now = boottime_ns();
  const auto c = w.claim(sandbox(1), now);
  ASSERT_EQ(w.publish(c->slot, name_id_of("n"), "n", 3, now + 60 * kS), TableErrc::ok);
  ASSERT_TRUE(w.revoke(c->slot));
  EXPECT_FALSE(r.check(c->slot, 3));
  EXPECT_FALSE(r.check_deadline(c->slot, 3));
  EXPECT_EQ(w.extend(c->slot, now + 120 * kS), TableErrc::revoked) << "extend must not resurrect";
  EXPECT_EQ(w.publish(c->slot, name_id_of("n"), "n", 3, now + 60 * kS), TableErrc::revoked);
  EXPECT_EQ(w.publish(c->slot, name_id_of("n"), "n", 4, now + 60 * kS), TableErrc::revoked);
  EXPECT_FALSE(r.check(c->slot, 3));
  EXPECT_FALSE(r.check(c->slot, 4));
  SlotSnapshot s;
  ASSERT_EQ(r.snapshot(c->slot, s), TableErrc::ok);
  EXPECT_TRUE(s.revoked);
  EXPECT_EQ(s.epoch, 3u) << "the revoked epoch stays visible to tools";
  EXPECT_FALSE(w.revoke(5)) << "out of range";

  // A revoke before the first publish also sticks.
  ASSERT_EQ(w.free(c->slot, now), TableErrc::ok);
  const auto c2 = w.claim(sandbox(2), now + 10);
  ASSERT_TRUE(c2.ok()) << c2.message();
  EXPECT_EQ(c2->generation, 2u);
  ASSERT_TRUE(w.revoke(c2->slot));
  EXPECT_EQ(w.publish(c2->slot, name_id_of("n"), "n", 5, now + 60 * kS), TableErrc::revoked);
  EXPECT_FALSE(r.check(c2->slot, 5));
}

// owner() is the writer's O(1) answer to "which sandbox is in this slot", which the supervisor
// cross-checks against its own sandbox table: claimed and published slots name their sandbox,
// a revoked one still does (until free), a freed (cooling) or never-claimed one names none.
TEST(ShmTable, OwnerFollowsClaimAndFree) {
  TempTable t;
  auto w = TableWriter::create(options_for(t, 2));
  const std::uint64_t now = boottime_ns();
  EXPECT_TRUE(w.owner(0).is_nil());
  const Result<ClaimedSlot> claimed = w.claim(sandbox(7), now);
  ASSERT_TRUE(claimed.ok()) << claimed.message();
  const ClaimedSlot c = *claimed;
  EXPECT_EQ(w.owner(c.slot), sandbox(7));
  ASSERT_EQ(w.publish(c.slot, name_id_of("n"), "n", 3, now + 60 * kS), TableErrc::ok);
  EXPECT_EQ(w.owner(c.slot), sandbox(7));
  ASSERT_TRUE(w.revoke(c.slot));
  EXPECT_EQ(w.owner(c.slot), sandbox(7));
  EXPECT_TRUE(w.owner(1 - c.slot).is_nil());
  ASSERT_EQ(w.free(c.slot, now), TableErrc::ok);
  EXPECT_TRUE(w.owner(c.slot).is_nil());
  EXPECT_TRUE(w.owner(2).is_nil()) << "out of range";
}

TEST(ShmTable, PublishingANewEpochRetiresTheOld) {
  TempTable t;
  auto w = TableWriter::create(options_for(t));
  auto r = TableReader::open(t.location);
  const std::uint64_t now = boottime_ns();
  const auto c = w.claim(sandbox(1), now);
  ASSERT_EQ(w.publish(c->slot, name_id_of("a"), "a", 10, now + 100), TableErrc::ok);
  ASSERT_EQ(w.publish(c->slot, name_id_of("b"), "b", 11, now + 200), TableErrc::ok);
  EXPECT_FALSE(r.check(c->slot, 10));
  EXPECT_TRUE(r.check(c->slot, 11));
  EXPECT_TRUE(r.check_deadline_at(c->slot, 11, now + 150));
  SlotSnapshot s;
  ASSERT_EQ(r.snapshot(c->slot, s), TableErrc::ok);
  EXPECT_EQ(s.name, name_id_of("b"));
}

TEST(ShmTable, PublishRejectsBadArguments) {
  TempTable t;
  auto w = TableWriter::create(options_for(t));
  const std::uint64_t now = boottime_ns();
  const auto c = w.claim(sandbox(1), now);
  EXPECT_EQ(w.publish(c->slot, NameId{}, "n", 0, now), TableErrc::bad_epoch);
  EXPECT_EQ(w.publish(c->slot, NameId{}, "n", kRevokedBit, now), TableErrc::bad_epoch);
  EXPECT_EQ(w.publish(c->slot, NameId{}, std::string(kNameBytesMax + 1, 'x'), 1, now),
            TableErrc::bad_argument);
  EXPECT_EQ(w.publish(c->slot + 1, NameId{}, "n", 1, now), TableErrc::wrong_state) << "free slot";
  EXPECT_EQ(w.publish(100, NameId{}, "n", 1, now), TableErrc::bad_slot);
  const Result<ClaimedSlot> nil = w.claim(SandboxId{}, now);
  EXPECT_EQ(nil.code(), Errc::invalid_argument);
  EXPECT_NE(nil.message().find("claim needs a sandbox id (got nil)"), std::string::npos) << nil.message();
  EXPECT_EQ(w.free(c->slot + 1, now), TableErrc::wrong_state);
}

TEST(ShmTable, FullTableIsAClearError) {
  TempTable t;
  auto w = TableWriter::create(options_for(t, 2));
  const std::uint64_t now = boottime_ns();
  ASSERT_TRUE(w.claim(sandbox(1), now).ok());
  ASSERT_TRUE(w.claim(sandbox(2), now).ok());
  const auto c = w.claim(sandbox(3), now);
  EXPECT_EQ(c.code(), Errc::busy);
  EXPECT_NE(c.message().find("shm table '" + t.location + "' is full: all 2 slots are in use"), std::string::npos)
      << c.message();
  auto r = TableReader::open(t.location);
  EXPECT_EQ(r.stats().counters.claims_refused_full.load(), 1u);
}

TEST(ShmTable, FreedSlotCoolsDownBeforeReuse) {
  TempTable t;
  auto o = options_for(t, 2);
  o.slot_cooldown_ns = 1000;
  auto w = TableWriter::create(o);
  auto r = TableReader::open(t.location);
  const std::uint64_t now = 5'000'000;
  const auto a = w.claim(sandbox(1), now);
  const auto b = w.claim(sandbox(2), now);
  ASSERT_EQ(w.publish(a->slot, NameId{}, "a", 1, now + 1'000'000), TableErrc::ok);
  ASSERT_EQ(w.free(a->slot, now), TableErrc::ok);
  SlotSnapshot s;
  ASSERT_EQ(r.snapshot(a->slot, s), TableErrc::ok);
  EXPECT_EQ(s.state, SlotState::cooling);
  EXPECT_FALSE(r.find(sandbox(1)).has_value()) << "a freed slot is nobody's";
  const auto early = w.claim(sandbox(3), now + 999);
  EXPECT_EQ(early.code(), Errc::busy);
  EXPECT_NE(early.message().find("1 free slots are still cooling down; the next is usable in 0 ms"), std::string::npos)
      << early.message();
  EXPECT_EQ(w.claim(sandbox(3), now - 1).code(), Errc::busy)
      << "a clock earlier than the free time still counts as cooling";
  const auto later = w.claim(sandbox(3), now + 1000);
  ASSERT_TRUE(later.ok()) << later.message();
  EXPECT_EQ(later->slot, a->slot);
  EXPECT_EQ(later->generation, 2u) << "generation tells two sandboxes in one slot apart";
  // FIFO: the slot freed first is reused first.
  ASSERT_EQ(w.publish(b->slot, NameId{}, "b", 1, now + 1'000'000), TableErrc::ok);
  ASSERT_EQ(w.publish(later->slot, NameId{}, "c", 1, now + 1'000'000), TableErrc::ok);
  ASSERT_EQ(w.free(b->slot, now + 2000), TableErrc::ok);
  ASSERT_EQ(w.free(later->slot, now + 2001), TableErrc::ok);
  const auto next = w.claim(sandbox(4), now + 10'000);
  EXPECT_EQ(next->slot, b->slot);
}

TEST(ShmTable, NeverPublishedSlotIsReusableAtOnce) {
  // A refused create claims a slot and frees it without publishing: no reader ever saw an epoch
  // there, so it must not cool down (a burst of refused creates would otherwise fill the table).
  TempTable t;
  auto o = options_for(t, 2);
  o.slot_cooldown_ns = 1'000'000'000;
  auto w = TableWriter::create(o);
  auto r = TableReader::open(t.location);
  const std::uint64_t now = 5'000'000;
  const auto a = w.claim(sandbox(1), now);
  const auto b = w.claim(sandbox(2), now);
  ASSERT_TRUE(a.ok()) << a.message();
  ASSERT_TRUE(b.ok()) << b.message();
  ASSERT_EQ(w.publish(b->slot, NameId{}, "b", 1, now + 1'000'000), TableErrc::ok);
  ASSERT_EQ(w.free(b->slot, now), TableErrc::ok);  // published: cools down, queued first
  ASSERT_EQ(w.free(a->slot, now), TableErrc::ok);  // never published: ahead of it, ready now
  SlotSnapshot s;
  ASSERT_EQ(r.snapshot(a->slot, s), TableErrc::ok);
  EXPECT_EQ(s.state, SlotState::cooling);
  EXPECT_FALSE(r.find(sandbox(1)).has_value());
  for (int i = 0; i < 5; ++i) {
    const auto c = w.claim(sandbox(10 + i), now + 1);
    ASSERT_TRUE(c.ok()) << "round " << i << ": " << c.message();
    EXPECT_EQ(c->slot, a->slot);
    EXPECT_EQ(c->generation, 2u + static_cast<unsigned>(i)) << "every reuse is a new generation";
    ASSERT_EQ(w.free(c->slot, now + 1), TableErrc::ok);
  }
  const auto d = w.claim(sandbox(20), now + 1);
  ASSERT_EQ(w.publish(d->slot, NameId{}, "d", 1, now + 1'000'000), TableErrc::ok);
  EXPECT_EQ(w.claim(sandbox(21), now + 2).code(), Errc::busy)
      << "the published-and-freed slot still cools down";
}

TEST(ShmTable, CreateRefusesALiveWriter) {
  TempTable t;
  auto w = TableWriter::create(options_for(t));
  try {
    auto w2 = TableWriter::create(options_for(t));
    FAIL() << "second create must be refused";
  } catch (const TableError& e) {
    EXPECT_EQ(e.code(), TableErrc::writer_alive);
    EXPECT_NE(std::string(e.what()).find("is alive"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::to_string(::getpid())), std::string::npos) << e.what();
  }
  auto r = TableReader::open(t.location);
  EXPECT_EQ(r.header().incarnation, 1u) << "the live table is untouched";
}

TEST(ShmTable, DeadWritersTableIsReplacedWithANewIncarnation) {
  TempTable t;
  auto o = options_for(t);
  o.liveness_timeout_ns = 50'000'000;
  std::optional<TableReader> old_reader;
  {
    auto w = TableWriter::create(o);
    const auto c = w.claim(sandbox(1), boottime_ns());
    ASSERT_EQ(w.publish(c->slot, NameId{}, "n", 8, boottime_ns() + 60 * kS), TableErrc::ok);
    w.heartbeat(boottime_ns() - 2 * o.liveness_timeout_ns);  // as if it died 100 ms ago
    old_reader.emplace(TableReader::open(t.location));
    EXPECT_FALSE(old_reader->writer_liveness().alive);
    EXPECT_TRUE(old_reader->check(c->slot, 8)) << "plain check has no clock (documented)";
    EXPECT_FALSE(old_reader->check_deadline(c->slot, 8)) << "a dead writer fails every deadline check";
  }
  auto w2 = TableWriter::create(o);
  auto r = TableReader::open(t.location);
  EXPECT_EQ(r.header().incarnation, 2u);
  EXPECT_TRUE(r.writer_liveness().alive);
  EXPECT_TRUE(old_reader->replaced());
  EXPECT_FALSE(r.replaced());
  SlotSnapshot s;
  ASSERT_EQ(r.snapshot(0, s), TableErrc::ok);
  EXPECT_EQ(s.state, SlotState::free) << "the new incarnation starts empty";
}

TEST(ShmTable, ClosedTableFailsDeadlineChecksAndCanBeReplaced) {
  TempTable t;
  auto w = TableWriter::create(options_for(t));
  const std::uint64_t now = boottime_ns();
  const auto c = w.claim(sandbox(1), now);
  ASSERT_EQ(w.publish(c->slot, NameId{}, "n", 8, now + 60 * kS), TableErrc::ok);
  auto r = TableReader::open(t.location);
  ASSERT_TRUE(r.check_deadline(c->slot, 8));
  w.close(boottime_ns());
  const Liveness l = r.writer_liveness();
  EXPECT_TRUE(l.closed);
  EXPECT_FALSE(l.alive);
  EXPECT_FALSE(r.check_deadline(c->slot, 8));
  auto w2 = TableWriter::create(options_for(t));
  EXPECT_EQ(TableReader::open(t.location).header().incarnation, 2u);
}

TEST(ShmTable, LivenessFollowsTheHeartbeat) {
  TempTable t;
  auto w = TableWriter::create(options_for(t));
  auto r = TableReader::open(t.location);
  w.heartbeat(1'000'000'000);
  EXPECT_TRUE(r.writer_liveness(1'500'000'000).alive);
  EXPECT_EQ(r.writer_liveness(1'500'000'000).age_ns, 500'000'000u);
  EXPECT_TRUE(r.writer_liveness(2'000'000'000).alive) << "age == timeout is still alive";
  EXPECT_FALSE(r.writer_liveness(2'000'000'001).alive);
  // A beat stored after the reader's clock read is ahead of it: the writer is alive now.
  const Liveness ahead = r.writer_liveness(999'999'999);
  EXPECT_TRUE(ahead.alive);
  EXPECT_EQ(ahead.age_ns, 0u);
  w.heartbeat(3'000'000'000);
  EXPECT_TRUE(r.writer_liveness(2'000'000'000).alive) << "ahead by exactly the timeout";
  const Liveness future = r.writer_liveness(1'999'999'999);
  EXPECT_FALSE(future.alive) << "more than the timeout ahead: another boot, or corruption";
  EXPECT_EQ(future.age_ns, UINT64_MAX);
}

// check_deadline_at with a clock read taken just before the writer's heartbeat: the heartbeat is
// newer than `now`, which means the writer is alive, not dead.
TEST(ShmTable, CheckDeadlineAcceptsAHeartbeatNewerThanTheClockRead) {
  TempTable t;
  auto w = TableWriter::create(options_for(t));  // liveness timeout 1 s
  const std::uint64_t now = boottime_ns();
  const auto c = w.claim(sandbox(1), now);
  ASSERT_EQ(w.publish(c->slot, name_id_of("n"), "n", 9, now + 10'000'000'000), TableErrc::ok);
  auto r = TableReader::open(t.location);
  w.heartbeat(now + 1'000);
  EXPECT_TRUE(r.check_deadline_at(c->slot, 9, now)) << "heartbeat 1 us after the clock read";
  EXPECT_TRUE(r.check_deadline_at(c->slot, 9, now + 1'000));
  w.heartbeat(now + kS);
  EXPECT_TRUE(r.check_deadline_at(c->slot, 9, now)) << "ahead by exactly the liveness timeout";
  w.heartbeat(now + kS + 1);
  EXPECT_FALSE(r.check_deadline_at(c->slot, 9, now)) << "further ahead: another boot or corruption";
  w.heartbeat(now);
  EXPECT_TRUE(r.check_deadline_at(c->slot, 9, now + kS));
  EXPECT_FALSE(r.check_deadline_at(c->slot, 9, now + kS + 1)) << "stale writer";
}

TEST(ShmTable, FileModeGroupAndReadOnlyMapping) {
  TempTable t;
  auto o = options_for(t);
  auto w = TableWriter::create(o);
  struct stat st{};
  ASSERT_EQ(::stat(t.path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u) << "0640 by default: other uids map it only through an inherited descriptor";
  auto r = TableReader::open(t.location);
  // The reader's mapping must be read-only: find it in /proc/self/maps.
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const auto addr = reinterpret_cast<std::uintptr_t>(&r.header());
  bool seen = false;
  while (std::getline(maps, line)) {
    std::uintptr_t lo = 0, hi = 0;
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %4s", &lo, &hi, perms) != 3) continue;
    if (addr >= lo && addr < hi) {
      EXPECT_EQ(perms[0], 'r');
      EXPECT_EQ(perms[1], '-') << "reader mapping must not be writable: " << line;
      seen = true;
    }
  }
  EXPECT_TRUE(seen);

  TempTable t2;
  auto o2 = options_for(t2);
  o2.mode = 0640;
  if (::geteuid() == 0) o2.group = 1;
  auto w2 = TableWriter::create(o2);
  ASSERT_EQ(::stat(t2.path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  if (::geteuid() == 0) {
    EXPECT_EQ(st.st_gid, 1u);
  }
}

TEST(ShmTable, TableAtAFilesystemPath) {
  char dir[] = "/tmp/lh-shm-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/table";
  TableOptions o;
  o.location = path;
  o.slot_count = 4;
  {
    auto w = TableWriter::create(o);
    auto r = TableReader::open(path);
    const auto c = w.claim(sandbox(1), boottime_ns());
    ASSERT_EQ(w.publish(c->slot, NameId{}, "n", 2, boottime_ns() + kS), TableErrc::ok);
    EXPECT_TRUE(r.check(c->slot, 2));
    EXPECT_TRUE(r.location().is_path);
    w.remove();
  }
  struct stat st{};
  EXPECT_NE(::stat(path.c_str(), &st), 0) << "remove() unlinks the file";
  ::rmdir(dir);
}

TEST(ShmTable, LocationParsing) {
  EXPECT_FALSE(parse_location("leasehold").is_path);
  EXPECT_EQ(parse_location("/leasehold").name, "leasehold");
  EXPECT_TRUE(parse_location("/dev/shm/x").is_path);
  auto code = [](std::string_view s) {
    try {
      parse_location(s);
      return TableErrc::ok;
    } catch (const TableError& e) {
      return e.code();
    }
  };
  EXPECT_EQ(code(""), TableErrc::bad_argument);
  EXPECT_EQ(code("/"), TableErrc::bad_argument);
  EXPECT_EQ(code("a/b"), TableErrc::bad_argument);
  EXPECT_EQ(code("/tmp/dir/"), TableErrc::bad_argument);
  EXPECT_TRUE(parse_location("memfd:w1").is_memfd);
  EXPECT_EQ(parse_location("memfd:w1").name, "w1");
  EXPECT_EQ(code("memfd:"), TableErrc::bad_argument);
  EXPECT_EQ(code("memfd:a/b"), TableErrc::bad_argument);
  ::setenv(kLocationEnv, "from-env", 1);
  EXPECT_EQ(location_from_env(), "from-env");
  ::unsetenv(kLocationEnv);
  EXPECT_THROW(location_from_env(), TableError);
}

// A hostile or corrupt header's liveness timeout (here UINT64_MAX) would make a dead writer's last
// heartbeat count as fresh forever, and any heartbeat "ahead" of the reader's clock as alive. A
// reader clamps it to kLivenessTimeoutMaxNs.
TEST(ShmTable, AReaderClampsTheHeadersLivenessTimeout) {
  TempTable t;
  auto w = TableWriter::create(options_for(t));
  const ClaimedSlot c = claim_and_publish(w);
  w.heartbeat(1 * kS);
  const std::uint64_t hostile = UINT64_MAX;
  {
    const int fd = ::open(t.path().c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, &hostile, sizeof hostile, offsetof(Header, liveness_timeout_ns)),
              static_cast<ssize_t>(sizeof hostile));
    ::close(fd);
  }
  auto r = TableReader::open(t.location);
  ASSERT_EQ(r.header().liveness_timeout_ns, hostile);
  EXPECT_EQ(clamp_liveness_timeout_ns(hostile), kLivenessTimeoutMaxNs);
  EXPECT_TRUE(r.check_deadline_at(c.slot, 5, 1 * kS + kLivenessTimeoutMaxNs)) << "within the bound";
  EXPECT_FALSE(r.check_deadline_at(c.slot, 5, 1 * kS + kLivenessTimeoutMaxNs + 1)) << "a dead writer";
  EXPECT_FALSE(r.writer_liveness(1 * kS + 3600 * kS).alive);
  w.heartbeat(100 * kS);  // far ahead of the reader's clock: another boot, or corruption
  EXPECT_FALSE(r.check_deadline_at(c.slot, 5, 2 * kS));
  EXPECT_FALSE(r.writer_liveness(2 * kS).alive);
  EXPECT_EQ(r.writer_liveness(2 * kS).age_ns, UINT64_MAX);
}

// The supervisor's table: an anonymous memfd, sealed once the writer holds its mapping.
TEST(ShmTable, AMemfdTableIsSealedAndReadOnlyToItsReaders) {
  TableOptions o;
  o.location = "memfd:table-test";
  o.slot_count = 4;
  auto w = TableWriter::create(o);
  EXPECT_TRUE(w.location().is_memfd);
  EXPECT_EQ(w.seals().value(), F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL);
  const ClaimedSlot c = claim_and_publish(w);
  const Result<int> reopened = w.reopen_read_only();
  ASSERT_TRUE(reopened.ok()) << reopened.message();
  const int fd = *reopened;
  EXPECT_EQ(::fcntl(fd, F_GETFL) & O_ACCMODE, O_RDONLY);
  struct stat st{};
  ASSERT_EQ(::fstat(fd, &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0440u);
  EXPECT_NE(::ftruncate(fd, 0), 0);
  auto r = TableReader::open(std::to_string(fd));
  EXPECT_TRUE(r.check(c.slot, 5));
  // Outside readers: /proc/<pid>/fd/<N> of the writer.
  const std::string outside = w.reader_location();
  EXPECT_EQ(outside.rfind("/proc/" + std::to_string(::getpid()) + "/fd/", 0), 0u) << outside;
  auto by_path = TableReader::open(outside);
  EXPECT_TRUE(by_path.check(c.slot, 5));
  w.revoke(c.slot);
  EXPECT_FALSE(r.check(c.slot, 5));
  EXPECT_FALSE(by_path.check(c.slot, 5));
  w.remove();  // nothing named: the mapping and descriptors stay valid
  EXPECT_FALSE(r.replaced());
  ::close(fd);
  try {
    TableReader::open("memfd:table-test");
    ADD_FAILURE() << "a memfd opened by its name";
  } catch (const TableError& e) {
    EXPECT_EQ(e.code(), TableErrc::bad_argument);
    EXPECT_NE(std::string(e.what()).find("opened by its descriptor"), std::string::npos) << e.what();
  }
  o.seal = false;  // the ablation switch of the attack tests
  EXPECT_EQ(TableWriter::create(o).seals().value(), 0);
}

TEST(ShmTable, CreateRejectsBadOptions) {
  TempTable t;
  auto o = options_for(t);
  o.slot_count = 0;
  EXPECT_THROW(TableWriter::create(o), TableError);
  o.slot_count = kSlotCountMax + 1;
  EXPECT_THROW(TableWriter::create(o), TableError);
  o.slot_count = 4;
  o.liveness_timeout_ns = 0;
  EXPECT_THROW(TableWriter::create(o), TableError);
  o.liveness_timeout_ns = kLivenessTimeoutMaxNs + 1;
  EXPECT_THROW(TableWriter::create(o), TableError);
  o.liveness_timeout_ns = kLivenessTimeoutMaxNs;
  o.location = "3";
  EXPECT_THROW(TableWriter::create(o), TableError) << "a writer creates, it does not adopt a descriptor";
}

TEST(ShmTable, StatsHistogramsAreLog2Buckets) {
  TempTable t;
  auto w = TableWriter::create(options_for(t));
  auto r = TableReader::open(t.location);
  EXPECT_EQ(histogram_bucket(0), 0u);
  EXPECT_EQ(histogram_bucket(1), 1u);
  EXPECT_EQ(histogram_bucket(1023), 10u);
  EXPECT_EQ(histogram_bucket(1024), 11u);
  EXPECT_EQ(histogram_bucket(UINT64_MAX), 64u);
  w.record_rt_lateness_ns(1000);
  w.record_rt_lateness_ns(3000);
  w.record_kill(2'000'000);
  w.record_heartbeat_rtt_ns(0);
  w.record_heartbeat_failure();
  const Stats& s = r.stats();
  EXPECT_EQ(s.rt_lateness_ns.count.load(), 2u);
  EXPECT_EQ(s.rt_lateness_ns.sum.load(), 4000u);
  EXPECT_EQ(s.rt_lateness_ns.max.load(), 3000u);
  EXPECT_EQ(s.rt_lateness_ns.buckets[10].load(), 1u);
  EXPECT_EQ(s.rt_lateness_ns.buckets[12].load(), 1u);
  EXPECT_EQ(s.counters.kills.load(), 1u);
  EXPECT_EQ(s.kill_latency_ns.buckets[21].load(), 1u);
  EXPECT_EQ(s.heartbeat_rtt_ns.buckets[0].load(), 1u);
  EXPECT_EQ(s.counters.heartbeat_failures.load(), 1u);
}

TEST(ShmTable, OpenWaitsForTheWriter) {
  TempTable t;
  std::thread creator([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    auto w = TableWriter::create(options_for(t));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  });
  OpenOptions o;
  o.wait_ns = 5 * kS;
  auto r = TableReader::open(t.location, o);
  EXPECT_EQ(r.header().magic, kMagic);
  creator.join();
}

// ---- bad input: each gets a clear error, never a crash ---------------------------------------

class CorruptTable : public ::testing::Test {
 protected:
  void SetUp() override {
    auto w = TableWriter::create(options_for(t_, 4));
  }
  void poke(std::size_t offset, const void* data, std::size_t n) {
    const int fd = ::open(t_.path().c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, data, n, static_cast<off_t>(offset)), static_cast<ssize_t>(n));
    ::close(fd);
  }
  void truncate_to(std::size_t n) { ASSERT_EQ(::truncate(t_.path().c_str(), static_cast<off_t>(n)), 0); }
  std::pair<TableErrc, std::string> open_error(std::uint64_t wait_ns = 0) {
    try {
      OpenOptions o;
      o.wait_ns = wait_ns;
      TableReader::open(t_.location, o);
      return {TableErrc::ok, ""};
    } catch (const TableError& e) {
      return {e.code(), e.what()};
    }
  }
  TempTable t_;
};

TEST_F(CorruptTable, Missing) {
  t_.remove();
  const auto [code, msg] = open_error();
  EXPECT_EQ(code, TableErrc::missing);
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
  const auto [code2, msg2] = open_error(20'000'000);
  EXPECT_EQ(code2, TableErrc::missing);
  EXPECT_NE(msg2.find("awaiting file"), std::string::npos) << msg2;
}

TEST_F(CorruptTable, TruncatedBelowTheHeader) {
  truncate_to(100);
  const auto [code, msg] = open_error();
  EXPECT_EQ(code, TableErrc::truncated);
  EXPECT_NE(msg.find("smaller than the 128-byte header"), std::string::npos) << msg;
}

TEST_F(CorruptTable, TruncatedSlots) {
  truncate_to(kSlotsOffset + 64);
  const auto [code, msg] = open_error();
  EXPECT_EQ(code, TableErrc::truncated);
  EXPECT_NE(msg.find("slot count 4 needs"), std::string::npos) << msg;
}

TEST_F(CorruptTable, WrongMagic) {
  const std::uint64_t bad = 0x0123456789ABCDEFULL;
  poke(offsetof(Header, magic), &bad, sizeof bad);
  const auto [code, msg] = open_error();
  EXPECT_EQ(code, TableErrc::bad_magic);
  EXPECT_NE(msg.find("wrong magic"), std::string::npos) << msg;
}

TEST_F(CorruptTable, NewerMajorVersion) {
  const std::uint16_t major = kLayoutMajor + 1;
  poke(offsetof(Header, layout_major), &major, sizeof major);
  const auto [code, msg] = open_error();
  EXPECT_EQ(code, TableErrc::newer_major);
  EXPECT_NE(msg.find("newer"), std::string::npos) << msg;
}

TEST_F(CorruptTable, NewerMinorVersionIsAccepted) {
  const std::uint16_t minor = kLayoutMinor + 3;
  poke(offsetof(Header, layout_minor), &minor, sizeof minor);
  EXPECT_EQ(open_error().first, TableErrc::ok);
}

TEST_F(CorruptTable, SlotCountDoesNotFitTheFile) {
  const std::uint32_t slots = 1000;
  const std::uint64_t total = table_bytes(slots);
  poke(offsetof(Header, slot_count), &slots, sizeof slots);
  poke(offsetof(Header, total_bytes), &total, sizeof total);
  const auto [code, msg] = open_error();
  EXPECT_EQ(code, TableErrc::truncated);
  EXPECT_NE(msg.find("slot count 1000 needs"), std::string::npos) << msg;
}

TEST_F(CorruptTable, SlotCountDisagreesWithTotalBytes) {
  const std::uint32_t slots = 3;
  poke(offsetof(Header, slot_count), &slots, sizeof slots);
  const auto [code, msg] = open_error();
  EXPECT_EQ(code, TableErrc::bad_geometry);
  EXPECT_NE(msg.find("does not match slot count 3"), std::string::npos) << msg;
}

TEST_F(CorruptTable, HugeSlotCount) {
  const std::uint32_t slots = 0xFFFFFFFFu;
  poke(offsetof(Header, slot_count), &slots, sizeof slots);
  const auto [code, msg] = open_error();
  EXPECT_EQ(code, TableErrc::bad_geometry);
  EXPECT_NE(msg.find("outside 1.."), std::string::npos) << msg;
}

TEST_F(CorruptTable, NotReady) {
  const std::uint32_t zero = 0;
  poke(offsetof(Header, ready), &zero, sizeof zero);
  const auto [code, msg] = open_error(20'000'000);
  EXPECT_EQ(code, TableErrc::not_ready);
  EXPECT_NE(msg.find("awaiting ready flag"), std::string::npos) << msg;
}

TEST_F(CorruptTable, CreateReplacesACorruptTable) {
  // Our magic, broken geometry: a leasehold table, so create() may replace it.
  const std::uint32_t slots = 3;
  poke(offsetof(Header, slot_count), &slots, sizeof slots);
  ASSERT_EQ(open_error().first, TableErrc::bad_geometry);
  auto w = TableWriter::create(options_for(t_, 4));
  EXPECT_EQ(open_error().first, TableErrc::ok);
}

TEST_F(CorruptTable, CreateReplacesATableWhoseCreatorDiedBeforeTheHeader) {
  // A writer that died between sizing the file and writing the header leaves zeros.
  const std::uint64_t zero = 0;
  poke(offsetof(Header, magic), &zero, sizeof zero);
  const std::uint32_t not_ready = 0;
  poke(offsetof(Header, ready), &not_ready, sizeof not_ready);
  auto w = TableWriter::create(options_for(t_, 4));
  EXPECT_EQ(open_error().first, TableErrc::ok);
}

TEST_F(CorruptTable, CreateReplacesAnEmptyFile) {
  truncate_to(0);  // a writer that died before sizing the file
  auto w = TableWriter::create(options_for(t_, 4));
  EXPECT_EQ(open_error().first, TableErrc::ok);
}

// create() unlinks what it replaces, so it must only replace what a writer left behind: a
// mistyped location must never delete someone else's file.
std::pair<TableErrc, std::string> create_error(const TableOptions& o) {
  try {
    auto w = TableWriter::create(o);
    return {TableErrc::ok, ""};
  } catch (const TableError& e) {
    return {e.code(), e.what()};
  }
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

TEST(ShmTableForeignFile, CreateRefusesToDeleteAFileThatIsNotATable) {
  TempTable t(/*as_path=*/true);
  const std::string text(4096 + 4 * 64, 'x');  // as large as a table, but not one
  std::ofstream(t.path(), std::ios::binary) << text;
  const auto [code, msg] = create_error(options_for(t, 4));
  EXPECT_EQ(code, TableErrc::bad_magic);
  EXPECT_NE(msg.find("not a leasehold table"), std::string::npos) << msg;
  EXPECT_NE(msg.find("refusing to replace it"), std::string::npos) << msg;
  EXPECT_TRUE(read_all(t.path()) == text) << "create() changed or removed the file";
}

TEST(ShmTableForeignFile, CreateRefusesToDeleteASmallFile) {
  TempTable t;  // a shm name
  std::ofstream(t.path(), std::ios::binary) << "precious notes\n";
  const auto [code, msg] = create_error(options_for(t, 4));
  EXPECT_EQ(code, TableErrc::bad_magic);
  EXPECT_NE(msg.find("15-byte file"), std::string::npos) << msg;
  EXPECT_EQ(read_all(t.path()), "precious notes\n");
}

TEST_F(CorruptTable, CreateRefusesToReplaceATableWithForeignMagic) {
  const std::uint64_t bad = 1;
  poke(offsetof(Header, magic), &bad, sizeof bad);
  const auto [code, msg] = create_error(options_for(t_, 4));
  EXPECT_EQ(code, TableErrc::bad_magic);
  EXPECT_NE(msg.find("wrong magic"), std::string::npos) << msg;
  EXPECT_EQ(open_error().first, TableErrc::bad_magic);  // still there, untouched
}

// Runs `fn` in a child that SIGALRM kills after 20 s; returns the child's exit code, or -signal.
// A FIFO under a table's name must give an error, not block the reader or the writer for ever.
template <class Fn>
int in_child(Fn fn) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(20);
    ::_exit(fn());
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1000;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

TEST(ShmTableNotAFile, FifoUnderAShmNameIsAnErrorNotAHang) {
  for (const bool as_path : {false, true}) {
    TempTable t(as_path);
    ASSERT_EQ(::mkfifo(t.path().c_str(), 0644), 0);
    EXPECT_EQ(in_child([&] {
                try {
                  OpenOptions o;
                  o.wait_ns = 50'000'000;
                  TableReader::open(t.location, o);
                  return 1;
                } catch (const TableError& e) {
                  const std::string msg = e.what();
                  return e.code() == TableErrc::bad_magic && msg.find("a FIFO") != std::string::npos ? 0 : 2;
                }
              }),
              0)
        << t.location;
    EXPECT_EQ(in_child([&] {
                const auto [code, msg] = create_error(options_for(t, 4));
                return code == TableErrc::bad_magic && msg.find("a FIFO") != std::string::npos ? 0 : 3;
              }),
              0)
        << t.location;
    struct stat st{};
    ASSERT_EQ(::stat(t.path().c_str(), &st), 0);
    EXPECT_TRUE(S_ISFIFO(st.st_mode));  // create() left it alone
  }
}

TEST(ShmTableNotAFile, DirectoryUnderAShmNameIsNamed) {
  TempTable t;
  ASSERT_EQ(::mkdir(t.path().c_str(), 0755), 0);
  std::string msg;
  try {
    TableReader::open(t.location);
  } catch (const TableError& e) {
    EXPECT_EQ(e.code(), TableErrc::bad_magic);
    msg = e.what();
  }
  EXPECT_NE(msg.find("is a directory"), std::string::npos) << msg;
  const auto [code, cmsg] = create_error(options_for(t, 4));
  EXPECT_EQ(code, TableErrc::bad_magic);
  EXPECT_NE(cmsg.find("is a directory"), std::string::npos) << cmsg;
  ::rmdir(t.path().c_str());
}

// LEASEHOLD_SHM as a descriptor number: what an isolated sandbox gets (a read-only descriptor
// of the table, no path).
TEST(ShmTable, OpensAnInheritedDescriptor) {
  TempTable t;
  auto w = TableWriter::create(options_for(t));
  const ClaimedSlot c = claim_and_publish(w);
  const int fd = ::open(t.path().c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  auto r = TableReader::open(std::to_string(fd));
  EXPECT_TRUE(r.location().is_fd);
  EXPECT_TRUE(r.check(c.slot, 5));
  w.revoke(c.slot);
  EXPECT_FALSE(r.check(c.slot, 5));
  EXPECT_FALSE(r.replaced());
  ::close(fd);
  try {
    TableReader::open(std::to_string(fd));
    ADD_FAILURE() << "a closed descriptor opened";
  } catch (const TableError& e) {
    EXPECT_EQ(e.code(), TableErrc::missing) << e.what();
  }
}

// Opened by path, a table must be root's or the reader's, and writable by neither group nor
// others: a table another user can write could show a revoked lease as valid.
TEST(ShmTable, RefusesByPathATableOthersMayWriteOrAnotherUserOwns) {
  TempTable t;
  auto w = TableWriter::create(options_for(t));
  EXPECT_NO_THROW(TableReader::open(t.location));
  ASSERT_EQ(::chmod(t.path().c_str(), 0662), 0);
  try {
    TableReader::open(t.location);
    ADD_FAILURE() << "a table others may write opened";
  } catch (const TableError& e) {
    EXPECT_EQ(e.code(), TableErrc::untrusted);
    EXPECT_NE(std::string(e.what()).find("group or others may write it (mode 662)"), std::string::npos) << e.what();
  }
  ASSERT_EQ(::chmod(t.path().c_str(), 0640), 0);
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown(t.path().c_str(), 4242, 0), 0);
    try {
      TableReader::open(t.location);
      ADD_FAILURE() << "another user's table opened";
    } catch (const TableError& e) {
      EXPECT_EQ(e.code(), TableErrc::untrusted);
      EXPECT_NE(std::string(e.what()).find("owned by uid 4242"), std::string::npos) << e.what();
    }
    OpenOptions trusting;
    trusting.trusted_uid = 4242;  // the configured writer's uid
    EXPECT_NO_THROW(TableReader::open(t.location, trusting));
  }
}

}  // namespace
}  // namespace leasehold::shm
