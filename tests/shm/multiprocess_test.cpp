// shm table across processes (fork): one writer, several readers mapping read-only; and a
// writer killed with SIGKILL mid-update.
#include "leasehold/shm/table.hpp"
#include "tests/shm/hammer.hpp"
#include "tests/shm/test_util.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <atomic>
#include <csignal>
#include <new>
#include <sys/mman.h>
#include <random>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace leasehold::shm {
namespace {

using namespace test;

inline constexpr int kReaders = 3;
// The run ends on counts, not on time: the writer cycles until it has done kCyclesMin cycles
// and every reader has made kValidChecksMin valid checks (the positive control), however slowly
// a loaded machine schedules them. kHangGuard only turns a reader that never gets there into a
// failure instead of a hung test.
inline constexpr std::uint64_t kCyclesMin = 2'000;
inline constexpr std::uint64_t kValidChecksMin = 200;
inline constexpr auto kHangGuard = std::chrono::seconds(120);

// What the readers report to the writer, in a MAP_SHARED page mapped before the fork.
struct Progress {
  std::atomic<int> ready{0};                          // readers that have the table open
  std::atomic<std::uint64_t> valid_checks[kReaders];  // each reader's positive-control count
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);

// Reader child: hammer until the writer closes the table; exit status = verdict.
[[noreturn]] void reader_child(const std::string& location, unsigned seed, Progress& progress, int k) {
  try {
    OpenOptions oo;
    oo.wait_ns = 60'000'000'000;
    const auto r = TableReader::open(location, oo);
    progress.ready.fetch_add(1);
    Violations v;
    std::mt19937 rng(seed);
    const auto end = std::chrono::steady_clock::now() + 2 * kHangGuard;  // the writer closes first
    while (r.header().closed_ns.load(std::memory_order_acquire) == 0 &&
           std::chrono::steady_clock::now() < end) {
      reader_step(r, static_cast<std::uint32_t>(rng() % r.slot_count()), v);
      progress.valid_checks[k].store(v.valid_checks.load(), std::memory_order_relaxed);
    }
    if (v.wrong_sandbox.load() != 0) ::_exit(10);
    if (v.revoked_but_valid.load() != 0) ::_exit(11);
    if (v.deadline_mismatch.load() != 0) ::_exit(12);
    if (v.valid_checks.load() == 0) ::_exit(13);  // vacuous run
    ::_exit(0);
  } catch (...) {
    ::_exit(20);
  }
}

TEST(ShmMultiProcess, ReadersNeverSeeWrongPairingsOrRevokedAsValid) {
  TempTable t;
  TableOptions o = options_for(t, 4);
  o.slot_cooldown_ns = 0;
  o.liveness_timeout_ns = kLivenessTimeoutMaxNs;  // the probes use synthetic times near kBaseNs
  auto w = TableWriter::create(o);
  w.heartbeat(kBaseNs);
  void* page = ::mmap(nullptr, sizeof(Progress), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(page, MAP_FAILED);
  auto* progress = new (page) Progress{};
  std::vector<pid_t> kids;
  // However the test ends, no reader outlives it.
  struct Reap {
    std::vector<pid_t>& kids;
    ~Reap() {
      for (const pid_t pid : kids) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
      }
    }
  } reap{kids};
  for (int k = 0; k < kReaders; ++k) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) reader_child(t.location, static_cast<unsigned>(k + 1), *progress, k);
    kids.push_back(pid);
  }
  const auto guard = std::chrono::steady_clock::now() + kHangGuard;
  while (progress->ready.load() < kReaders && std::chrono::steady_clock::now() < guard)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(progress->ready.load(), kReaders) << "the readers did not open the table";
  auto readers_done = [&] {
    for (int k = 0; k < kReaders; ++k)
      if (progress->valid_checks[k].load(std::memory_order_relaxed) < kValidChecksMin) return false;
    return true;
  };
  // The writer: cycles with random revokes in between (one thread plays io and rt).
  std::mt19937 rng(99);
  std::uint64_t cycles = 0;
  for (std::uint64_t c = 0; (cycles < kCyclesMin || !readers_done()) && std::chrono::steady_clock::now() < guard; ++c) {
    const Result<ClaimedSlot> cl = w.claim(sandbox_of_claim(c), 10 + c);
    ASSERT_TRUE(cl.ok()) << cl.message();
    const bool revoke_at_first = rng() % 3 == 0;
    for (Epoch e = 4 * c + 1; e <= 4 * c + 2; ++e) {
      if (w.publish(cl->slot, NameId{e, e}, "hammer", e, deadline_for(e, 0)) != TableErrc::ok) break;
      for (int k = 1; k <= 4; ++k) w.extend(cl->slot, deadline_for(e, static_cast<std::uint64_t>(k)));
      if (revoke_at_first) {
        w.revoke(cl->slot);
        EXPECT_EQ(w.extend(cl->slot, deadline_for(e, 5)), TableErrc::revoked);
      }
    }
    if (rng() % 2 == 0) std::this_thread::yield();  // let readers see the slot published
    w.free(cl->slot, 10 + c);
    ++cycles;
  }
  EXPECT_GE(cycles, kCyclesMin);
  for (int k = 0; k < kReaders; ++k)
    EXPECT_GE(progress->valid_checks[k].load(), kValidChecksMin) << "reader " << k << " saw too few published slots";
  w.close(boottime_ns());
  for (const pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status)) << "reader crashed";
    EXPECT_EQ(WEXITSTATUS(status), 0)
        << "10 wrong sandbox, 11 revoked seen valid, 12 deadline of another epoch, 13 vacuous";
  }
  kids.clear();
  ::munmap(page, sizeof(Progress));
}

TEST(ShmMultiProcess, KilledWriterIsSeenDeadWithinTheLivenessTimeout) {
  TempTable t;
  constexpr std::uint64_t kTimeoutNs = 100'000'000;
  int ready_pipe[2];
  ASSERT_EQ(::pipe(ready_pipe), 0);
  const pid_t writer = ::fork();
  ASSERT_GE(writer, 0);
  if (writer == 0) {
    try {
      TableOptions o = options_for(t, 4);
      o.liveness_timeout_ns = kTimeoutNs;
      o.slot_cooldown_ns = 0;
      auto w = TableWriter::create(o);
      const char one = 1;
      if (::write(ready_pipe[1], &one, 1) != 1) ::_exit(2);
      // Mid-update forever: heartbeat + publish/extend/free until killed.
      for (std::uint64_t c = 0;; ++c) {
        w.heartbeat(boottime_ns());
        writer_cycle(w, c, 10 + c, 2);
        const auto cl = w.claim(sandbox_of_claim(1'000'000 + c), 10 + c);
        if (cl.ok()) {
          const Epoch e = 4 * (1'000'000 + c) + 1;
          w.publish(cl->slot, NameId{e, e}, "held", e, boottime_ns() + 60'000'000'000ULL);
          if (c % 2 == 0) w.free(cl->slot, 10 + c);
        }
      }
    } catch (...) {
      ::_exit(3);
    }
  }
  char byte = 0;
  ASSERT_EQ(::read(ready_pipe[0], &byte, 1), 1);
  ::close(ready_pipe[0]);
  ::close(ready_pipe[1]);
  const auto r = TableReader::open(t.location);
  // Wait (bounded) until the writer has run a while, so the kill lands mid-update.
  for (int k = 0; k < 1000 && r.liveness().heartbeats.load() < 50; ++k)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_GE(r.liveness().heartbeats.load(), 50u);
  EXPECT_TRUE(r.writer_liveness().alive);

  ASSERT_EQ(::kill(writer, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(writer, &status, 0), writer);
  ASSERT_TRUE(WIFSIGNALED(status));
  const std::uint64_t reaped_ns = boottime_ns();
  const std::uint64_t last_hb = r.liveness().heartbeat_ns.load();
  ASSERT_LE(last_hb, reaped_ns);

  // Deterministic: one ns past the timeout after the last heartbeat, the writer is dead and
  // every deadline check fails, whatever state the slots were left in.
  const std::uint64_t after_timeout = last_hb + kTimeoutNs + 1;
  EXPECT_FALSE(r.writer_liveness(after_timeout).alive);
  std::uint64_t torn = 0, held = 0;
  for (std::uint32_t i = 0; i < r.slot_count(); ++i) {
    SlotSnapshot s;
    const TableErrc e = r.snapshot(i, s);
    ASSERT_TRUE(e == TableErrc::ok || e == TableErrc::busy) << to_string(e);
    if (e != TableErrc::ok || s.epoch == 0) continue;
    if (s.sandbox != sandbox_of_claim(claim_of_epoch(s.epoch))) ++torn;
    if (r.check(i, s.epoch)) ++held;
    EXPECT_FALSE(r.check_deadline_at(i, s.epoch, after_timeout));
  }
  EXPECT_EQ(torn, 0u);
  // And on the real clock: the reader observes the death (bounded wait, 50x the timeout).
  bool dead = false;
  for (int k = 0; k < 500 && !dead; ++k) {
    dead = !r.writer_liveness().alive;
    if (!dead) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(dead);
  for (std::uint32_t i = 0; i < r.slot_count(); ++i) {
    SlotSnapshot s;
    if (r.snapshot(i, s) == TableErrc::ok && s.epoch != 0) {
      EXPECT_FALSE(r.check_deadline(i, s.epoch));
    }
  }
  RecordProperty("slots_left_published", static_cast<int>(held));
}

}  // namespace
}  // namespace leasehold::shm
