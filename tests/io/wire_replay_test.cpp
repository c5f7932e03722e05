// Replay window (RFC 4303 §3.4.3), the response cache and the Receiver policy
// (DESIGN.md "The wire protocol": replayed messages are rejected; retries get the same answer).
#include "leasehold/io/clock.hpp"
#include "leasehold/lease/assert.hpp"
#include "leasehold/wire/replay.hpp"
#include "tests/io/wire_samples.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace leasehold::wire {
namespace {

using Bytes = std::vector<std::uint8_t>;

const WireKey kKey{Bytes(kKeyBytesMin, 0x42)};

Bytes bytes_of(const Datagram& d) { return Bytes(d.view().begin(), d.view().end()); }

// record() of a seq the window already holds means a caller skipped check(): in debug builds
// and after enable_slow_asserts() (the simulator) it aborts.
TEST(ReplayWindowDeathTest, RecordingASeenSeqAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
#if !LEASEHOLD_SLOW_ASSERTS
  enable_slow_asserts();  // as the simulator does
#endif
  ReplayWindow w;
  w.record(100);
  w.record(98);
  EXPECT_DEATH(w.record(98), "LEASEHOLD_ASSERT\\(check\\(seq\\) == DecodeError::none .*\\) failed");
  EXPECT_DEATH(w.record(100 - kReplayWindowSeqs), "LEASEHOLD_ASSERT\\(check\\(seq\\)");
  w.record(99);
  EXPECT_EQ(w.check(99), DecodeError::replayed);
}

TEST(ReplayWindow, AcceptsNewRejectsSeenAndStale) {
  ReplayWindow w;
  EXPECT_EQ(w.check(0), DecodeError::stale_seq);
  EXPECT_EQ(w.check(100), DecodeError::none);
  w.record(100);
  EXPECT_EQ(w.check(100), DecodeError::replayed);
  EXPECT_EQ(w.check(99), DecodeError::none);  // out of order but inside the window
  w.record(99);
  EXPECT_EQ(w.check(99), DecodeError::replayed);
  EXPECT_EQ(w.check(100 - kReplayWindowSeqs + 1), DecodeError::none);
  EXPECT_EQ(w.check(100 - kReplayWindowSeqs), DecodeError::stale_seq);
  w.record(130);  // slide by 30: 100 and 99 are still remembered
  EXPECT_EQ(w.highest(), 130u);
  EXPECT_EQ(w.check(100), DecodeError::replayed);
  EXPECT_EQ(w.check(99), DecodeError::replayed);
  EXPECT_EQ(w.check(101), DecodeError::none);
  w.record(1000);  // jump past the window: everything below 937 is stale
  EXPECT_EQ(w.check(130), DecodeError::stale_seq);
  EXPECT_EQ(w.check(999), DecodeError::none);
  EXPECT_EQ(w.check(1000), DecodeError::replayed);
}

TEST(ReplayWindow, AFloorRefusesEverySeqUpToItAndNothingAbove) {
  ReplayWindow w;
  w.raise_floor(500);
  EXPECT_EQ(w.highest(), 500u);
  EXPECT_EQ(w.check(500), DecodeError::replayed);
  EXPECT_EQ(w.check(437), DecodeError::replayed);
  EXPECT_EQ(w.check(436), DecodeError::stale_seq);
  EXPECT_EQ(w.check(501), DecodeError::none);
  w.record(501);
  w.raise_floor(400);  // below the window: no effect
  EXPECT_EQ(w.highest(), 501u);
  EXPECT_EQ(w.check(502), DecodeError::none);
}

// A lockd taking over from another (or restarted) seeds a worker's window with the floor the
// other recorded: a datagram of that worker captured before is not executed again.
TEST(WireReceiverFloor, AWorkersFloorRefusesItsOlderDatagramsAndKeepsOthersApart) {
  const WireKey worker_key(Bytes(kKeyBytesMin, 0x51), KeyKind::worker, 1, samples::wid(1));
  Sender w{samples::wid(1), 1000, worker_key};
  Receiver before{worker_key};
  Datagram d;
  ASSERT_TRUE(w.seal(1, Stats{}, d));
  const Bytes captured = bytes_of(d);  // seq 1000
  ASSERT_EQ(before.admit(captured, boottime_ns()).verdict, Verdict::deliver);
  EXPECT_EQ(before.highest_seq(samples::wid(1)), 1000u);
  EXPECT_EQ(before.highest_seq(samples::wid(2)), 0u);

  Receiver after{worker_key};
  after.raise_floor(samples::wid(1), before.highest_seq(samples::wid(1)));
  const Admission a = after.admit(captured, boottime_ns());
  EXPECT_NE(a.verdict, Verdict::deliver);
  EXPECT_EQ(a.reason, DecodeError::replayed);
  ASSERT_TRUE(w.seal(2, Stats{}, d));  // the worker's next datagram: seq 1001
  EXPECT_EQ(after.admit(bytes_of(d), boottime_ns()).verdict, Verdict::deliver);
  // Without the floor (a receiver that knows nothing) the captured copy is executed again.
  Receiver fresh{worker_key};
  EXPECT_EQ(fresh.admit(captured, boottime_ns()).verdict, Verdict::deliver);
}

class WireReceiver : public ::testing::Test {
 protected:
  Sender client{samples::wid(1), 1000, kKey};
  Sender lockd{samples::wid(999), 5000, kKey};
  Receiver receiver{kKey};

  Bytes seal(Sender& s, std::uint64_t request_id, const Body& body) {
    Datagram d;
    EXPECT_TRUE(s.seal(request_id, body, d));
    return bytes_of(d);
  }
};

TEST_F(WireReceiver, DeliversAFreshAuthenticMessage) {
  const Bytes d = seal(client, 7, Release{samples::nid(1), samples::sid(1), 3});
  const Admission a = receiver.admit(d, boottime_ns());
  ASSERT_EQ(a.verdict, Verdict::deliver) << a.detail;
  EXPECT_EQ(a.message.header.sender, samples::wid(1));
  EXPECT_EQ(a.message.header.seq, 1000u);
  EXPECT_EQ(a.key.request_id, 7u);
  EXPECT_TRUE((a.message.body == Body{Release{samples::nid(1), samples::sid(1), 3}}));
  EXPECT_EQ(receiver.stats().accepted, 1u);
  EXPECT_EQ(client.next_seq(), 1001u);
}

TEST_F(WireReceiver, ReplayedDatagramWithoutCachedAnswerIsRejectedAndCounted) {
  const Bytes d = seal(client, 7, Revoke{samples::nid(1)});
  ASSERT_EQ(receiver.admit(d, boottime_ns()).verdict, Verdict::deliver);
  const Admission again = receiver.admit(d, boottime_ns());
  EXPECT_EQ(again.verdict, Verdict::answer_error);
  EXPECT_EQ(again.reason, DecodeError::replayed);
  EXPECT_EQ(receiver.stats()[DecodeError::replayed], 1u);
  EXPECT_EQ(error_answer(again).code, error_code_of(DecodeError::replayed));
  EXPECT_EQ(receiver.stats().accepted, 1u);
}

TEST_F(WireReceiver, RetriedRequestIdGetsIdenticalAnswerBytes) {
  const Body request = Acquire{"jobs/x", samples::sid(1), samples::wid(1), 0, false};
  const Bytes first = seal(client, 42, request);
  const Admission a = receiver.admit(first, boottime_ns());
  ASSERT_EQ(a.verdict, Verdict::deliver);
  const Bytes answer = seal(lockd, 42, Grant{name_id_of("jobs/x"), 8, samples::sid(1), samples::wid(1),
                                               LockPhase::held, 5000, {}});
  receiver.remember_answer(a.key, answer);
  EXPECT_EQ(receiver.cached_answers(), 1u);

  // A retry: same request id, new seq.
  const Bytes retry = seal(client, 42, request);
  Admission r = receiver.admit(retry, 1'000);
  ASSERT_EQ(r.verdict, Verdict::resend) << a.detail;
  EXPECT_EQ(Bytes(r.cached_answer.begin(), r.cached_answer.end()), answer);
  // A duplicate of the first datagram (replayed seq) with a cached answer: resent, not rejected
  // (resends of one answer are kResendIntervalNs apart at least).
  r = receiver.admit(first, 1'000 + kResendIntervalNs);
  ASSERT_EQ(r.verdict, Verdict::resend);
  EXPECT_EQ(Bytes(r.cached_answer.begin(), r.cached_answer.end()), answer);
  EXPECT_EQ(receiver.stats().resent, 2u);
  EXPECT_EQ(receiver.stats().accepted, 1u);  // executed once
  // The retry's seq was recorded: replaying it after the cache is gone would be rejected.
}

// A retry that arrives while the first attempt's answer is deferred (lockd answers a change only
// once it is durable) is dropped, not answered with Error{replayed}; once the answer is
// remembered the next retry gets it.
TEST_F(WireReceiver, RetryOfADeferredRequestIsDroppedUntilItsAnswerIsRemembered) {
  const Body request = Acquire{"jobs/x", samples::sid(1), samples::wid(1), 0, false};
  const Bytes first = seal(client, 42, request);
  const Admission a = receiver.admit(first, 1'000);
  ASSERT_EQ(a.verdict, Verdict::deliver);
  ASSERT_TRUE(receiver.defer(a.key, 1'000));
  EXPECT_EQ(receiver.in_flight(), 1u);

  // Same bytes (replayed seq) and a retry with a new seq: both dropped, counted, not errors.
  Admission dup = receiver.admit(first, 2'000);
  EXPECT_EQ(dup.verdict, Verdict::drop) << dup.detail;
  EXPECT_EQ(dup.reason, DecodeError::none);
  const Bytes retry = seal(client, 42, request);
  dup = receiver.admit(retry, 3'000);
  EXPECT_EQ(dup.verdict, Verdict::drop) << dup.detail;
  EXPECT_EQ(receiver.stats().in_flight_retries, 2u);
  EXPECT_EQ(receiver.stats()[DecodeError::replayed], 0u);
  EXPECT_EQ(receiver.stats().accepted, 1u);

  const Bytes answer = seal(lockd, 42, Grant{name_id_of("jobs/x"), 8, samples::sid(1), samples::wid(1),
                                               LockPhase::held, 5000, {}});
  receiver.remember_answer(a.key, answer);
  EXPECT_EQ(receiver.in_flight(), 0u);
  const Admission r = receiver.admit(seal(client, 42, request), 4'000);
  ASSERT_EQ(r.verdict, Verdict::resend) << r.detail;
  EXPECT_EQ(Bytes(r.cached_answer.begin(), r.cached_answer.end()), answer);
}

// A different request that reuses a deferred request id is not swallowed as a retry.
TEST_F(WireReceiver, DeferredRequestIdReusedForADifferentRequestIsDelivered) {
  const Admission a = receiver.admit(seal(client, 42, Revoke{samples::nid(1)}), 0);
  ASSERT_TRUE(receiver.defer(a.key, 0));
  const Admission b = receiver.admit(seal(client, 42, Revoke{samples::nid(2)}), 1);
  EXPECT_EQ(b.verdict, Verdict::deliver);
  EXPECT_EQ(receiver.stats().in_flight_retries, 0u);
}

// A request that never gets an answer does not pin its id: abandon() or the expiry frees it,
// and the retry is delivered (executed again; requests are idempotent).
TEST_F(WireReceiver, AbandonedOrExpiredDeferredRequestIsDeliveredAgain) {
  Receiver::Limits limits;
  limits.in_flight_expiry_ns = 100;
  Receiver rx{kKey, limits};
  const Body request = Revoke{samples::nid(1)};
  Admission a = rx.admit(seal(client, 1, request), 0);
  ASSERT_TRUE(rx.defer(a.key, 0));
  EXPECT_EQ(rx.admit(seal(client, 1, request), 99).verdict, Verdict::drop);
  a = rx.admit(seal(client, 1, request), 100);  // expired
  EXPECT_EQ(a.verdict, Verdict::deliver) << a.detail;
  EXPECT_EQ(rx.in_flight(), 0u);

  ASSERT_TRUE(rx.defer(a.key, 200));
  EXPECT_EQ(rx.admit(seal(client, 1, request), 201).verdict, Verdict::drop);
  rx.abandon(a.key);
  EXPECT_EQ(rx.in_flight(), 0u);
  EXPECT_EQ(rx.admit(seal(client, 1, request), 202).verdict, Verdict::deliver);
  EXPECT_EQ(rx.stats().in_flight_retries, 2u);
}

// The in-flight set is bounded: when it is full of live entries defer() refuses; expired entries
// make room.
TEST_F(WireReceiver, InFlightSetIsBounded) {
  Receiver::Limits limits;
  limits.in_flight_max = 2;
  limits.in_flight_expiry_ns = 1'000;
  Receiver rx{kKey, limits};
  std::vector<RequestKey> keys;
  for (std::uint64_t id = 1; id <= 3; ++id) {
    const Admission a = rx.admit(seal(client, id, Revoke{samples::nid(id)}), 0);
    ASSERT_EQ(a.verdict, Verdict::deliver);
    keys.push_back(a.key);
  }
  EXPECT_TRUE(rx.defer(keys[0], 0));
  EXPECT_TRUE(rx.defer(keys[1], 500));
  EXPECT_FALSE(rx.defer(keys[2], 600));
  EXPECT_EQ(rx.in_flight(), 2u);
  EXPECT_TRUE(rx.defer(keys[2], 1'000));  // keys[0] expired at 1'000
  EXPECT_EQ(rx.in_flight(), 2u);
}

TEST_F(WireReceiver, RequestIdReusedForADifferentRequestIsAnError) {
  const Admission a = receiver.admit(seal(client, 42, Revoke{samples::nid(1)}), boottime_ns());
  ASSERT_EQ(a.verdict, Verdict::deliver);
  receiver.remember_answer(a.key, seal(lockd, 42, Ok{samples::nid(1), 9}));
  const Admission b = receiver.admit(seal(client, 42, Revoke{samples::nid(2)}), boottime_ns());
  EXPECT_EQ(b.verdict, Verdict::answer_error);
  EXPECT_EQ(b.reason, DecodeError::request_id_reused);
  EXPECT_EQ(receiver.stats()[DecodeError::request_id_reused], 1u);
}

// Heartbeats are the bulk of lockd's traffic and their answers are never cached nor deferred:
// admit() does not digest their payload. The requests whose answers are cached still are, and a
// retry of one is still recognised, also after heartbeats under the same sender.
TEST_F(WireReceiver, HeartbeatIsAdmittedWithoutADigestAndCachedRequestsStillAre) {
  const Body acquire = Acquire{"jobs/x", samples::sid(1), samples::wid(1), 0, false};
  const Admission a = receiver.admit(seal(client, 42, acquire), 1'000);
  ASSERT_EQ(a.verdict, Verdict::deliver) << a.detail;
  EXPECT_NE(a.key.digest, kNoDigest);
  const Bytes answer = seal(lockd, 42, Grant{name_id_of("jobs/x"), 8, samples::sid(1), samples::wid(1),
                                               LockPhase::held, 5000, {}});
  receiver.remember_answer(a.key, answer);

  Heartbeat hb;
  hb.entries.push_back(HeartbeatEntry{name_id_of("jobs/x"), samples::sid(1), 8});
  const Admission h = receiver.admit(seal(client, 43, hb), 2'000);
  ASSERT_EQ(h.verdict, Verdict::deliver) << h.detail;
  EXPECT_EQ(h.key.request_id, 43u);
  EXPECT_EQ(h.key.digest, kNoDigest);
  // Such a key is neither cached nor tracked in flight: a retry of the heartbeat is executed again.
  receiver.remember_answer(h.key, seal(lockd, 43, HeartbeatAck{}));
  EXPECT_EQ(receiver.cached_answers(), 1u);
  EXPECT_FALSE(receiver.defer(h.key, 2'000));
  EXPECT_EQ(receiver.in_flight(), 0u);
  EXPECT_EQ(receiver.admit(seal(client, 43, hb), 3'000).verdict, Verdict::deliver);

  // The acquire's retry still gets its answer.
  const Admission r = receiver.admit(seal(client, 42, acquire), 4'000);
  ASSERT_EQ(r.verdict, Verdict::resend) << r.detail;
  EXPECT_EQ(Bytes(r.cached_answer.begin(), r.cached_answer.end()), answer);
  // A heartbeat reusing the acquire's request id is digested then, and told apart from it.
  const Admission reused = receiver.admit(seal(client, 42, hb), 5'000);
  EXPECT_EQ(reused.verdict, Verdict::answer_error);
  EXPECT_EQ(reused.reason, DecodeError::request_id_reused);
  EXPECT_EQ(receiver.stats().accepted, 3u);  // the acquire and the heartbeat twice
}

// A heartbeat reusing the id of a deferred request is not swallowed as that request's retry.
TEST_F(WireReceiver, HeartbeatReusingADeferredRequestIdIsDelivered) {
  const Admission a = receiver.admit(seal(client, 42, Revoke{samples::nid(1)}), 0);
  ASSERT_TRUE(receiver.defer(a.key, 0));
  Heartbeat hb;
  hb.entries.push_back(HeartbeatEntry{samples::nid(1), samples::sid(1), 8});
  const Admission h = receiver.admit(seal(client, 42, hb), 1);
  EXPECT_EQ(h.verdict, Verdict::deliver);
  EXPECT_EQ(receiver.stats().in_flight_retries, 0u);
  // The heartbeat's answer goes out: the deferred request keeps its guard.
  receiver.remember_answer(h.key, seal(lockd, 42, HeartbeatAck{}));
  EXPECT_EQ(receiver.in_flight(), 1u);
  EXPECT_EQ(receiver.admit(seal(client, 42, Revoke{samples::nid(1)}), 2).verdict, Verdict::drop);
  EXPECT_EQ(receiver.stats().in_flight_retries, 1u);
}

TEST_F(WireReceiver, SeqBelowTheWindowIsStale) {
  Sender early{samples::wid(1), 10, kKey};
  const Bytes old = seal(early, 1, Stats{});
  ASSERT_EQ(receiver.admit(seal(client, 2, Stats{}), boottime_ns()).verdict, Verdict::deliver);  // seq 1000
  const Admission a = receiver.admit(old, boottime_ns());                                           // seq 10
  EXPECT_EQ(a.verdict, Verdict::answer_error);
  EXPECT_EQ(a.reason, DecodeError::stale_seq);
  EXPECT_NE(a.detail.find("highest seq 1000"), std::string::npos) << a.detail;
}

TEST_F(WireReceiver, UnauthenticDatagramsAreDroppedAndCounted) {
  Bytes d = seal(client, 1, Stats{});
  d[10] ^= 0xFF;
  Admission a = receiver.admit(d, boottime_ns());
  EXPECT_EQ(a.verdict, Verdict::drop);
  EXPECT_EQ(a.reason, DecodeError::bad_tag);
  a = receiver.admit(Bytes(10, 0), boottime_ns());
  EXPECT_EQ(a.verdict, Verdict::drop);
  EXPECT_EQ(a.reason, DecodeError::truncated);
  a = receiver.admit(Bytes(kDatagramBytesMax + 1, 0), boottime_ns());
  EXPECT_EQ(a.reason, DecodeError::oversized);
  Sender stranger{samples::wid(2), 1, WireKey{Bytes(kKeyBytesMin, 0x43)}};
  a = receiver.admit(seal(stranger, 1, Stats{}), boottime_ns());
  EXPECT_EQ(a.verdict, Verdict::drop);
  EXPECT_EQ(receiver.stats()[DecodeError::bad_tag], 2u);
  EXPECT_EQ(receiver.stats()[DecodeError::truncated], 1u);
  EXPECT_EQ(receiver.stats()[DecodeError::oversized], 1u);
  EXPECT_EQ(receiver.senders(), 0u);  // unauthentic senders take no window
}

TEST_F(WireReceiver, AuthenticButUnknownVersionOrTypeGetsAnAddressedErrorAnswer) {
  Authenticator auth(kKey);
  Bytes d = seal(client, 77, Stats{});
  d[4] = 9;  // version
  auth.sign(d);
  Admission a = receiver.admit(d, boottime_ns());
  EXPECT_EQ(a.verdict, Verdict::answer_error);
  EXPECT_EQ(a.reason, DecodeError::unknown_version);
  EXPECT_EQ(a.message.header.sender, samples::wid(1));
  EXPECT_EQ(a.message.header.request_id, 77u);
  EXPECT_EQ(error_answer(a).code, ErrorCode{5});
  EXPECT_NE(error_answer(a).message.find("version 9"), std::string::npos) << error_answer(a).message;

  d = seal(client, 78, Stats{});
  d[5] = 0x60;  // type
  auth.sign(d);
  a = receiver.admit(d, boottime_ns());
  EXPECT_EQ(a.verdict, Verdict::answer_error);
  EXPECT_EQ(a.reason, DecodeError::unknown_type);
  EXPECT_EQ(receiver.stats()[DecodeError::unknown_version], 1u);
  EXPECT_EQ(receiver.stats()[DecodeError::unknown_type], 1u);
}

TEST_F(WireReceiver, MalformedAuthenticPayloadIsAnsweredAndItsSeqRecorded) {
  Authenticator auth(kKey);
  Bytes d = seal(client, 5, Acquire{"ok", samples::sid(1), {}, 0, false});
  d[kHeaderBytes + 32 + 4] = 7;  // two_phase boolean byte
  auth.sign(d);
  const Admission a = receiver.admit(d, boottime_ns());
  EXPECT_EQ(a.verdict, Verdict::answer_error);
  EXPECT_EQ(a.reason, DecodeError::bad_value);
  EXPECT_EQ(receiver.admit(d, boottime_ns()).reason, DecodeError::replayed);
}

// Each kind of bad datagram, through one receiver: the right verdict, and counted under its own
// reason exactly once.
TEST_F(WireReceiver, EveryRejectionIsCountedUnderItsReason) {
  Authenticator auth(kKey);
  auto resigned = [&](Bytes d, auto&& mutate) {
    mutate(d);
    auth.sign(d);
    return d;
  };
  const Bytes good = seal(client, 1, Revoke{samples::nid(1)});
  struct Case {
    const char* what;
    Bytes datagram;
    Verdict verdict;
    DecodeError reason;
  };
  Bytes oversized = good;
  oversized.resize(kDatagramBytesMax + 1);
  Bytes wrong_tag = good;
  wrong_tag.back() ^= 0x80;
  std::vector<Case> cases;
  cases.push_back({"truncated", Bytes(good.begin(), good.begin() + 50), Verdict::drop, DecodeError::truncated});
  cases.push_back({"oversized", oversized, Verdict::drop, DecodeError::oversized});
  cases.push_back({"bad magic", resigned(seal(client, 2, Stats{}), [](Bytes& d) { d[1] = 'X'; }), Verdict::drop,
                   DecodeError::bad_magic});
  cases.push_back({"wrong hmac", wrong_tag, Verdict::drop, DecodeError::bad_tag});
  cases.push_back({"unknown version", resigned(seal(client, 3, Stats{}), [](Bytes& d) { d[4] = 0; }),
                   Verdict::answer_error, DecodeError::unknown_version});
  cases.push_back({"unknown type", resigned(seal(client, 4, Stats{}), [](Bytes& d) { d[5] = 0x20; }),
                   Verdict::answer_error, DecodeError::unknown_type});
  cases.push_back({"wrong length", resigned(seal(client, 5, Stats{}), [](Bytes& d) { d[40] = 3; }),
                   Verdict::answer_error, DecodeError::length_mismatch});
  cases.push_back({"fresh", good, Verdict::deliver, DecodeError::none});
  cases.push_back({"replayed", good, Verdict::answer_error, DecodeError::replayed});
  for (const Case& c : cases) {
    const Admission a = receiver.admit(c.datagram, boottime_ns());
    EXPECT_EQ(a.verdict, c.verdict) << c.what << ": " << to_string(a.verdict) << " " << a.detail;
    EXPECT_EQ(a.reason, c.reason) << c.what << ": " << to_string(a.reason);
    EXPECT_FALSE(a.verdict != Verdict::deliver && a.detail.empty()) << c.what;
  }
  const DecodeStats& st = receiver.stats();
  for (const Case& c : cases) {
    if (c.reason != DecodeError::none) {
      EXPECT_EQ(st[c.reason], 1u) << c.what;
    }
  }
  EXPECT_EQ(st.accepted, 1u);
  std::uint64_t total = 0;
  for (auto n : st.rejected) total += n;
  EXPECT_EQ(total, cases.size() - 1);
}

TEST(WireReceiverLimits, LeastRecentlyHeardSenderIsEvicted) {
  Receiver receiver(kKey, Receiver::Limits{2, 8});
  Sender a{samples::wid(1), 100, kKey}, b{samples::wid(2), 100, kKey}, c{samples::wid(3), 100, kKey};
  Datagram da, db, dc;
  ASSERT_TRUE(a.seal(1, Stats{}, da));
  ASSERT_TRUE(b.seal(1, Stats{}, db));
  ASSERT_TRUE(c.seal(1, Stats{}, dc));
  EXPECT_EQ(receiver.admit(da.view(), boottime_ns()).verdict, Verdict::deliver);
  EXPECT_EQ(receiver.admit(db.view(), boottime_ns()).verdict, Verdict::deliver);
  EXPECT_EQ(receiver.admit(db.view(), boottime_ns()).reason, DecodeError::replayed);  // b is the most recent
  EXPECT_EQ(receiver.admit(dc.view(), boottime_ns()).verdict, Verdict::deliver);      // evicts a
  EXPECT_EQ(receiver.senders(), 2u);
  EXPECT_EQ(receiver.admit(db.view(), boottime_ns()).reason, DecodeError::replayed);  // b kept its window
  // The documented consequence: a's window is forgotten, its old datagram is accepted once more.
  EXPECT_EQ(receiver.admit(da.view(), boottime_ns()).verdict, Verdict::deliver);
  EXPECT_EQ(receiver.senders(), 2u);
}

TEST(WireReceiverLimits, OldestCachedAnswerIsDropped) {
  Receiver receiver(kKey, Receiver::Limits{16, 2});
  Sender s{samples::wid(1), 100, kKey};
  std::vector<Bytes> requests;
  for (std::uint64_t id = 1; id <= 3; ++id) {
    Datagram d;
    ASSERT_TRUE(s.seal(id, Revoke{samples::nid(id)}, d));
    const Admission a = receiver.admit(d.view(), boottime_ns());
    ASSERT_EQ(a.verdict, Verdict::deliver);
    receiver.remember_answer(a.key, Bytes(100, static_cast<std::uint8_t>(id)));
    requests.push_back(bytes_of(d));
  }
  EXPECT_EQ(receiver.cached_answers(), 2u);
  // Request 1's answer was dropped: its duplicate is now a plain replay.
  EXPECT_EQ(receiver.admit(requests[0], boottime_ns()).reason, DecodeError::replayed);
  const Admission a3 = receiver.admit(requests[2], boottime_ns());
  ASSERT_EQ(a3.verdict, Verdict::resend);
  EXPECT_EQ(a3.cached_answer[0], 3);
}

TEST(WireSender, SeqGrowsOnlyForDatagramsThatExist) {
  Sender s{samples::wid(1), 0, kKey};
  EXPECT_EQ(s.next_seq(), 1u);  // seq 0 is never used
  Datagram d;
  EXPECT_FALSE(s.seal(1, Acquire{"bad name", samples::sid(1), {}, 0, false}, d));
  EXPECT_EQ(s.next_seq(), 1u);
  EXPECT_TRUE(s.seal(1, Stats{}, d));
  EXPECT_EQ(s.next_seq(), 2u);
  EXPECT_GT(seq_seed(), 1'600'000'000'000'000'000ull);  // nanoseconds since 1970, after 2020
}

// A heartbeat sealed straight from its entries is the datagram seal() makes of the Heartbeat.
TEST(WireSender, SealHeartbeatFromEntriesIsTheHeartbeatsDatagram) {
  Sender a{samples::wid(1), 10, kKey};
  Sender b{samples::wid(1), 10, kKey};
  std::vector<HeartbeatEntry> entries;
  for (std::uint64_t i = 0; i < kHeartbeatEntriesMax; ++i)
    entries.push_back(HeartbeatEntry{samples::nid(i), samples::sid(i), 100 + i});
  Heartbeat hb;
  hb.ttl_cap_ms = 1500;
  hb.entries.assign(entries.begin(), entries.end());
  Datagram da, db;
  ASSERT_TRUE(a.seal_heartbeat(7, 1500, entries, da));
  ASSERT_TRUE(b.seal(7, hb, db));
  EXPECT_EQ(bytes_of(da), bytes_of(db));
  EXPECT_EQ(a.next_seq(), 11u);
  entries.push_back(entries.front());  // one more than a datagram holds: refused, no seq used
  EXPECT_EQ(a.seal_heartbeat(8, 0, entries, da).error, EncodeError::too_large);
  EXPECT_EQ(da.size, 0u);
  EXPECT_EQ(a.next_seq(), 11u);
}

}  // namespace
}  // namespace leasehold::wire
