// Every wire message type over real loopback UDP through the io_uring loop, authenticated with a
// key file (DESIGN.md "The wire protocol").
//
// The worker side is the supervisor's LockdLink (supervisor/lockd_link.hpp): it seals requests
// with a wire::Sender, sends them through the RequestClient and authenticates + decodes the
// answers, and it answers lockd's IsRunning on the same socket. The lockd side is a stand-in
// responder on the same loop that admits datagrams through a wire::Receiver (replay window and
// response cache) and answers every request type with a fixed answer of the right type. A raw
// RequestClient sends hand-made datagrams: a retry of the same bytes, a correctly signed
// datagram of an unknown type and of an unknown version, one signed with the wrong key and one
// that replays a seq.
#include "leasehold/wire/auth.hpp"
#include "leasehold/io/client.hpp"
#include "leasehold/io/clock.hpp"
#include "leasehold/io/loop.hpp"
#include "leasehold/wire/protocol.hpp"
#include "leasehold/wire/replay.hpp"
#include "leasehold/supervisor/lockd_link.hpp"
#include "tests/io/io_uring_skip.hpp"
#include "tests/io/wire_samples.hpp"

#include <gtest/gtest.h>

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace leasehold {
namespace {

using namespace wire::samples;

constexpr int kIterationsMax = 2000;  // x 10 ms: a hung exchange fails instead of hanging CI
constexpr std::int64_t kDeadlineNs = 10 * kNsPerS;  // a guard against hangs, not a measurement

bool run_until(EventLoop& loop, const std::function<bool()>& done) {
  for (int i = 0; i < kIterationsMax && !done(); ++i)
    if (loop.run_once(10 * kNsPerMs) < 0) return false;
  return done();
}

std::span<const std::uint8_t> as_u8(std::span<const std::byte> b) {
  return {reinterpret_cast<const std::uint8_t*>(b.data()), b.size()};
}

/// A temporary directory with key files made by generate_key_file (mode 0600).
class KeyDir {
 public:
  KeyDir() {
    char tmpl[] = "/tmp/leasehold-bridge-XXXXXX";
    const char* p = ::mkdtemp(tmpl);
    if (p != nullptr) path_ = p;
  }
  ~KeyDir() {
    if (!path_.empty()) std::filesystem::remove_all(path_);
  }
  KeyDir(const KeyDir&) = delete;
  KeyDir& operator=(const KeyDir&) = delete;
  /// Generates and loads `<dir>/<name>`; nullopt (with a test failure) on any error.
  std::optional<wire::WireKey> make_key(const std::string& name) {
    if (path_.empty()) {
      ADD_FAILURE() << "mkdtemp failed: " << std::strerror(errno);
      return std::nullopt;
    }
    const std::string file = path_ + "/" + name;
    if (const Status err = wire::generate_key_file(file); !err.ok()) {
      ADD_FAILURE() << err.message();
      return std::nullopt;
    }
    wire::KeyLoad k = wire::load_key_file(file);
    if (!k) {
      ADD_FAILURE() << k.message();
      return std::nullopt;
    }
    return *k;
  }

 private:
  std::string path_;
};

// The fixed answer the stand-in lockd gives to each request; the test's expectations are
// written out literally below, not derived from this function.
wire::Body answer_for(const wire::Body& b, std::uint64_t stats_served) {
  using namespace wire;
  if (const auto* q = std::get_if<Acquire>(&b))
    return Grant{name_id_of(q->name), 7, q->sandbox, q->worker,
                 q->two_phase ? LockPhase::acquiring : LockPhase::held, q->ttl_ms, {}};
  if (const auto* q = std::get_if<Commit>(&b))
    return Grant{q->name_id, q->epoch, q->sandbox, q->worker, LockPhase::held, 5000, {}};
  if (const auto* q = std::get_if<Heartbeat>(&b)) {
    HeartbeatAck ack;
    for (std::size_t i = 0; i < q->entries.size(); ++i) {
      const HeartbeatEntry& e = q->entries[i];
      if (i % 2 == 0)
        ack.entries.push_back({e.name_id, RefreshStatus::refreshed, e.sandbox, e.epoch, q->ttl_cap_ms});
      else
        ack.entries.push_back({e.name_id, RefreshStatus::lost, sid(900), e.epoch + 1, 0});
    }
    return ack;
  }
  if (const auto* q = std::get_if<Release>(&b)) return Ok{q->name_id, q->epoch + 1};
  if (const auto* q = std::get_if<TransferBegin>(&b))
    return TransferState{q->name_id, q->from, q->to, q->epoch, q->epoch + 1, LockPhase::transferring};
  if (const auto* q = std::get_if<TransferComplete>(&b))
    return TransferState{q->name_id, SandboxId{}, SandboxId{}, q->new_epoch, q->new_epoch, LockPhase::free};
  if (const auto* q = std::get_if<TransferAccept>(&b))
    return Grant{q->name_id, 46, q->to, q->worker, LockPhase::held, 5000, {}};
  if (const auto* q = std::get_if<Revoke>(&b)) return Ok{q->name_id, 101};
  if (const auto* q = std::get_if<Reassign>(&b))
    return Deny{q->name_id, Refusal::not_free, sid(77), wid(77), 12, LockPhase::held};
  if (std::get_if<WorkerHeartbeat>(&b) != nullptr) return WorkerAck{9000, {}};
  if (const auto* q = std::get_if<IsRunning>(&b)) return RunningAnswer{q->name_id, q->sandbox, q->epoch, false};
  if (const auto* q = std::get_if<List>(&b)) {
    ListPage page;
    for (std::uint64_t i = 1; i <= q->limit && i <= 3; ++i) page.entries.push_back(record(q->cursor + i));
    page.next_cursor = q->cursor + page.entries.size();
    page.with_waiters = q->waiters;
    return page;
  }
  if (const auto* q = std::get_if<Show>(&b)) {
    NameRecord r = record(19);
    if (!q->name.empty()) {
      r.name = q->name;
      r.name_id = name_id_of(q->name);
    } else {
      r.name_id = q->name_id;
    }
    NameInfo info{r, q->waiters_from.has_value(), q->waiters_from.value_or(0), {}};
    if (info.with_waiters) {
      info.record.waiters = 26;
      info.waiters.push_back(WaiterRecord{sid(950), wid(950), 700});
    }
    return info;
  }
  if (const auto* q = std::get_if<Revoked>(&b)) return RevokedAck{q->name_id, q->epoch, true};
  if (const auto* q = std::get_if<KillConfirmed>(&b)) return Ok{q->name_id, q->epoch + 1};
  if (const auto* q = std::get_if<Wait>(&b))
    return Queued{name_id_of(q->name), 2, 3, sid(901), wid(901), 70, LockPhase::held, q->ttl_ms};
  if (std::get_if<Stats>(&b) != nullptr)
    return StatsAnswer{{{"refusal_held", 12}, {"stats_served", stats_served}}};
  return Error{ErrorCode::unsupported, "not a request"};
}

/// Stands in for lockd on the loop: admit → answer (sealed, remembered for retries) → send.
struct Responder {
  EventLoop& loop;
  wire::Receiver receiver;
  wire::Sender sender;
  SocketId sock;
  SocketAddress addr;
  std::map<wire::MessageType, std::uint64_t> executed;  ///< delivered requests by type
  std::uint64_t dropped = 0;
  std::uint64_t errors_sent = 0;
  std::map<WorkerId, SocketAddress> peers;  ///< where each sender's requests came from
  std::vector<wire::Message> answers;       ///< answers delivered to us (RunningAnswer)
  /// If set, every answer is preceded by a forgery: the same request id and key id, sealed
  /// with this other key (an on-path attacker racing lockd's answer).
  std::unique_ptr<wire::Sender> forger;
  /// If set, every request is first sent back to its sender unchanged (a reflection: the
  /// sender's own tag and request id), before the answer.
  bool reflect = false;

  Responder(EventLoop& l, const wire::WireKey& key)
      : loop(l), receiver(key), sender(wid(700), 1, key) {
    UniqueFd fd(open_udp_socket(SocketAddress::loopback_v4(0)));
    EXPECT_TRUE(fd.valid()) << std::strerror(-fd.get());
    addr = local_address(fd.get()).value_or(SocketAddress{});
    sock = loop.add_udp_socket(std::move(fd), [this](const Datagram& d) { on_datagram(d); });
  }

  void send(std::span<const std::uint8_t> bytes, const SocketAddress& to) {
    EXPECT_EQ(loop.send_to(sock, std::as_bytes(bytes), &to), 0);
  }

  void answer(const wire::Admission& a, const wire::Body& body, const SocketAddress& to, bool remember) {
    wire::Datagram out;
    const wire::EncodeResult r = sender.seal(a.message.header.request_id, body, out);
    ASSERT_TRUE(r) << wire::to_string(r.error);
    if (remember) receiver.remember_answer(a.key, out.view());
    send(out.view(), to);
  }

  /// lockd → worker: asks whether a sandbox runs (the answer arrives in on_datagram).
  void ask(std::uint64_t request_id, const wire::IsRunning& q, const SocketAddress& worker) {
    wire::Datagram out;
    ASSERT_TRUE(sender.seal(request_id, q, out));
    send(out.view(), worker);
  }

  void on_datagram(const Datagram& d) {
    wire::Admission a = receiver.admit(as_u8(d.payload), boottime_ns());
    const SocketAddress from = d.source_address();
    switch (a.verdict) {
      case wire::Verdict::drop:
        ++dropped;
        return;
      case wire::Verdict::resend:
        send(a.cached_answer, from);
        return;
      case wire::Verdict::answer_error:
        ++errors_sent;
        answer(a, wire::error_answer(a), from, false);
        return;
      case wire::Verdict::deliver:
        break;
    }
    const wire::MessageType type = wire::type_of(a.message.body);
    if (!wire::is_request(type)) {
      answers.push_back(std::move(a.message));
      return;
    }
    ++executed[type];
    peers[a.message.header.sender] = from;
    if (reflect) send(as_u8(d.payload), from);
    if (forger) {
      wire::Datagram fake;
      ASSERT_TRUE(forger->seal(a.message.header.request_id, wire::Error{wire::ErrorCode::unsupported, "forged"}, fake));
      send(fake.view(), from);
    }
    answer(a, answer_for(a.message.body, executed[wire::MessageType::stats]), from, true);
  }
};

/// A raw RequestClient with its own sender identity, for hand-made datagrams.
struct RawClient {
  EventLoop& loop;
  RequestClient client;
  wire::Sender sender;
  std::uint64_t unsolicited = 0;

  static RetryPolicy single_attempt() {
    RetryPolicy p;
    p.attempts_max = 1;  // every resend in this test is explicit
    return p;
  }

  RawClient(EventLoop& l, const wire::WireKey& key, WorkerId self, std::uint64_t first_seq)
      : loop(l), client(l, &wire::request_id_of, single_attempt()), sender(self, first_seq, key) {
    EXPECT_EQ(client.open(SocketAddress::loopback_v4(0)), 0);
    client.set_unsolicited_handler([this](const Datagram&) { ++unsolicited; });
  }

  /// Sends `bytes` as one request and returns the answer's bytes (nullopt: none came).
  std::optional<std::vector<std::uint8_t>> exchange(std::span<const std::uint8_t> bytes,
                                                   const SocketAddress& to) {
    bool done = false;
    std::optional<std::vector<std::uint8_t>> answer;
    const int rc = client.start(std::as_bytes(bytes), to, boottime_ns() + kDeadlineNs,
                                [&](const RequestOutcome& o) {
                                  done = true;
                                  if (o.status == RequestStatus::answered) {
                                    const auto a = as_u8(o.answer);
                                    answer.emplace(a.begin(), a.end());
                                  }
                                });
    EXPECT_EQ(rc, 0);
    if (rc != 0) return std::nullopt;
    EXPECT_TRUE(run_until(loop, [&] { return done; }));
    return answer;
  }
};

std::set<wire::MessageType> all_types() {
  std::set<wire::MessageType> all;
  for (unsigned t = 0; t < 256; ++t)
    if (wire::to_string(static_cast<wire::MessageType>(t)) != "unknown")
      all.insert(static_cast<wire::MessageType>(t));
  return all;
}

class WireBridgeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LEASEHOLD_REQUIRE_IO_URING();
    auto k = keys_.make_key("wire.key");
    ASSERT_TRUE(k.has_value());
    key_ = std::move(*k);
    ProbeResult error;
    loop_ = EventLoop::create({}, &error);
    ASSERT_NE(loop_, nullptr) << error.message;
    lockd_ = std::make_unique<Responder>(*loop_, key_);
    ASSERT_TRUE(lockd_->addr.is_set());
    verify_ = std::make_unique<wire::Authenticator>(key_);
  }
  void TearDown() override {
    // Clients before the loop (client.hpp).
    lockd_.reset();
    loop_.reset();
  }

  /// Authenticates and decodes an answer; adds its type to `seen_`.
  wire::DecodeResult decode_answer(const std::vector<std::uint8_t>& bytes) {
    wire::DecodeResult d = wire::decode(bytes, verify_.get());
    if (d) seen_.insert(wire::type_of(d.body));
    return d;
  }

  KeyDir keys_;
  wire::WireKey key_;
  std::unique_ptr<EventLoop> loop_;
  std::unique_ptr<Responder> lockd_;
  std::unique_ptr<wire::Authenticator> verify_;
  std::set<wire::MessageType> seen_;
};

TEST_F(WireBridgeTest, EveryMessageTypeCrossesLoopbackAuthenticated) {
  using namespace wire;
  RetryPolicy once;
  once.attempts_max = 1;  // loopback does not lose datagrams here; counts below stay exact
  const WorkerId worker = wid(600);
  auto opened = LockdLink::open(*loop_, lockd_->addr, worker, key_, once);
  ASSERT_TRUE(opened.ok()) << opened.message();
  auto link = std::move(opened).value();
  // Bound to the address that reaches lockd (loopback here), not the wildcard 0.0.0.0.
  EXPECT_EQ(link->local().str().rfind("127.0.0.1:", 0), 0u) << link->local().str();
  link->set_is_running_handler([](const IsRunning& q) { return q.sandbox == sid(10); });

  // --- worker → lockd: every request type (the samples, both forms of Show) ----------------
  std::vector<Body> requests;
  for (const Body& b : every_type())
    if (is_request(type_of(b))) requests.push_back(b);
  ASSERT_EQ(requests.size(), 20u);

  // The answers, written out from the sample values of wire_samples.hpp.
  HeartbeatAck hb_ack;
  hb_ack.entries.push_back({nid(0), RefreshStatus::refreshed, sid(0), 7, 3000});
  hb_ack.entries.push_back({nid(1), RefreshStatus::lost, sid(900), 9, 0});
  hb_ack.entries.push_back({nid(2), RefreshStatus::refreshed, sid(2), 9, 3000});
  hb_ack.entries.push_back({nid(3), RefreshStatus::lost, sid(900), 11, 0});
  hb_ack.entries.push_back({nid(4), RefreshStatus::refreshed, sid(4), 11, 3000});
  hb_ack.entries.push_back({nid(6), RefreshStatus::lost, sid(900), 1, 0});  // the place at epoch 0
  NameRecord shown_by_name = record(19);
  shown_by_name.name = "svc.a/b_c";
  shown_by_name.name_id = name_id_of("svc.a/b_c");
  NameRecord shown_by_id = record(19);
  shown_by_id.name_id = nid(12);
  NameInfo shown_with_waiters{record(19), true, 25, {WaiterRecord{sid(950), wid(950), 700}}};
  shown_with_waiters.record.name = "svc.q";
  shown_with_waiters.record.name_id = name_id_of("svc.q");
  shown_with_waiters.record.waiters = 26;
  const std::vector<Body> expected = {
      Grant{name_id_of("db/primary:shard-7"), 7, sid(1), wid(1), LockPhase::acquiring, 5000, {}},
      Grant{nid(2), 42, sid(2), wid(2), LockPhase::held, 5000, {}},
      hb_ack,
      Ok{nid(3), 44},
      TransferState{nid(4), sid(4), sid(5), 44, 45, LockPhase::transferring},
      TransferState{nid(5), SandboxId{}, SandboxId{}, 45, 45, LockPhase::free},
      Grant{nid(6), 46, sid(6), wid(6), LockPhase::held, 5000, {}},
      Ok{nid(7), 101},
      Deny{nid(8), Refusal::not_free, sid(77), wid(77), 12, LockPhase::held},
      WorkerAck{9000, {}},
      RunningAnswer{nid(10), sid(10), 50, false},
      ListPage{{record(78), record(79), record(80)}, 80, false},
      ListPage{{}, 78, true},
      NameInfo{shown_by_name, false, 0, {}},
      NameInfo{shown_by_id, false, 0, {}},
      shown_with_waiters,
      StatsAnswer{{{"refusal_held", 12}, {"stats_served", 1}}},
      RevokedAck{nid(20), 60, true},
      Ok{nid(21), 63},
      Queued{name_id_of("queue/game-server-3"), 2, 3, sid(901), wid(901), 70, LockPhase::held, 4000},
  };
  ASSERT_EQ(expected.size(), requests.size());

  std::vector<std::optional<LockdReply>> replies(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i)
    link->call(requests[i], boottime_ns() + kDeadlineNs,
               [&replies, i](LockdReply r) { replies[i] = std::move(r); });
  ASSERT_TRUE(run_until(*loop_, [&] {
    for (const auto& r : replies)
      if (!r) return false;
    return true;
  }));
  for (std::size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE("request " + std::string(to_string(type_of(requests[i]))));
    ASSERT_TRUE(replies[i]->ok()) << replies[i]->problem;
    EXPECT_EQ(replies[i]->attempts, 1u);
    EXPECT_GT(replies[i]->first_send_ns, 0);
    EXPECT_EQ(type_of(*replies[i]->body), type_of(expected[i]));
    EXPECT_TRUE(*replies[i]->body == expected[i]) << describe_answer(*replies[i]->body);
    seen_.insert(type_of(*replies[i]->body));
  }
  EXPECT_EQ(link->stats().answers_bad, 0u);
  for (const Body& b : requests) EXPECT_GE(lockd_->executed[type_of(b)], 1u) << to_string(type_of(b));
  EXPECT_EQ(lockd_->executed[MessageType::show], 3u);  // by name, by id, with its waiters
  EXPECT_EQ(lockd_->executed[MessageType::list], 2u);  // plain, with waiter counts

  // --- lockd → worker: IsRunning on the link's socket, answered by its handler -------------
  ASSERT_EQ(lockd_->peers.count(worker), 1u);
  const SocketAddress worker_addr = lockd_->peers[worker];
  lockd_->ask(7001, IsRunning{nid(10), sid(10), 50}, worker_addr);
  lockd_->ask(7002, IsRunning{nid(11), sid(11), 51}, worker_addr);
  ASSERT_TRUE(run_until(*loop_, [&] { return lockd_->answers.size() == 2; }));
  std::map<std::uint64_t, Message> by_id;
  for (const Message& m : lockd_->answers) by_id[m.header.request_id] = m;
  ASSERT_EQ(by_id.count(7001), 1u);
  ASSERT_EQ(by_id.count(7002), 1u);
  EXPECT_EQ(by_id[7001].header.sender, worker);
  EXPECT_TRUE(by_id[7001].body == Body(RunningAnswer{nid(10), sid(10), 50, true}));
  EXPECT_TRUE(by_id[7002].body == Body(RunningAnswer{nid(11), sid(11), 51, false}));
  EXPECT_EQ(link->stats().is_running_answered, 2u);
  EXPECT_EQ(link->stats().is_running_rejected, 0u);

  // --- hand-made datagrams through a raw RequestClient ---------------------------------------
  constexpr std::uint64_t kFirstSeq = 1000;
  RawClient raw(*loop_, key_, wid(500), kFirstSeq);

  // A retry (the same bytes, same seq and request id) is answered from the response cache with
  // byte-identical answer bytes, and the request is not executed again.
  wire::Datagram acquire;
  ASSERT_TRUE(raw.sender.seal(5001, Acquire{"jobs/retry", sid(30), wid(500), 2000, false}, acquire));
  const std::uint64_t acquires_before = lockd_->executed[MessageType::acquire];
  const auto first = raw.exchange(acquire.view(), lockd_->addr);
  ASSERT_TRUE(first.has_value());
  const auto again = raw.exchange(acquire.view(), lockd_->addr);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*first, *again);
  EXPECT_EQ(lockd_->executed[MessageType::acquire], acquires_before + 1);
  EXPECT_EQ(lockd_->receiver.stats().resent, 1u);
  {
    const DecodeResult d = decode_answer(*first);
    ASSERT_TRUE(d) << d.detail;
    EXPECT_EQ(d.header.request_id, 5001u);
    EXPECT_TRUE(d.body == Body(Grant{name_id_of("jobs/retry"), 7, sid(30), wid(500), LockPhase::held, 2000, {}}));
  }

  // A correctly signed datagram of an unknown type, and one of an unknown version: an Error
  // answer addressed to its request id, not silence.
  const auto forge = [&](std::uint64_t request_id, std::size_t offset, std::uint8_t value) {
    wire::Datagram d;
    EXPECT_TRUE(raw.sender.seal(request_id, Stats{}, d));
    d.bytes[offset] = value;
    raw.sender.authenticator().sign(std::span(d.bytes.data(), d.size));
    return d;
  };
  const wire::Datagram unknown_type = forge(5002, 5, 0x40);
  const wire::Datagram unknown_version = forge(5003, 4, kVersion + 1);
  for (const auto& [dg, reason] : {std::pair{&unknown_type, DecodeError::unknown_type},
                                   std::pair{&unknown_version, DecodeError::unknown_version}}) {
    SCOPED_TRACE(std::string(to_string(reason)));
    const auto bytes = raw.exchange(dg->view(), lockd_->addr);
    ASSERT_TRUE(bytes.has_value());
    const DecodeResult d = decode_answer(*bytes);
    ASSERT_TRUE(d) << d.detail;
    EXPECT_EQ(d.header.request_id, dg == &unknown_type ? 5002u : 5003u);
    const auto* e = std::get_if<Error>(&d.body);
    ASSERT_NE(e, nullptr) << to_string(type_of(d.body));
    EXPECT_EQ(e->code, error_code_of(reason));
    EXPECT_FALSE(e->message.empty());
    EXPECT_EQ(lockd_->receiver.stats()[reason], 1u);
  }

  // Signed with another key: dropped without an answer, counted as bad_tag. The valid request
  // sent after it on the same socket is answered; nothing else arrives.
  const auto other_key = keys_.make_key("other.key");
  ASSERT_TRUE(other_key.has_value());
  wire::Sender impostor(wid(500), kFirstSeq + 100, *other_key);
  wire::Datagram forged;
  ASSERT_TRUE(impostor.seal(5004, Revoke{nid(40)}, forged));
  const std::uint64_t dropped_before = lockd_->dropped;
  ASSERT_EQ(loop_->send_to(raw.client.socket(), std::as_bytes(forged.view()), &lockd_->addr), 0);
  wire::Datagram stats;
  ASSERT_TRUE(raw.sender.seal(5005, Stats{}, stats));
  const auto stats_answer = raw.exchange(stats.view(), lockd_->addr);
  ASSERT_TRUE(stats_answer.has_value());
  {
    const DecodeResult d = decode_answer(*stats_answer);
    ASSERT_TRUE(d) << d.detail;
    EXPECT_TRUE(d.body == Body(StatsAnswer{{{"refusal_held", 12}, {"stats_served", 2}}}));
  }
  EXPECT_EQ(lockd_->receiver.stats()[DecodeError::bad_tag], 1u);
  EXPECT_EQ(lockd_->dropped, dropped_before + 1);
  EXPECT_EQ(lockd_->executed[MessageType::revoke], 1u);  // only the link's
  EXPECT_EQ(raw.unsolicited, 0u);
  EXPECT_EQ(raw.client.stats().answers_unmatched, 0u);

  // A new request that reuses an already received seq: Error{replayed}, counted.
  wire::Sender replayer(wid(500), kFirstSeq, key_);  // kFirstSeq went out with the acquire above
  wire::Datagram replayed;
  ASSERT_TRUE(replayer.seal(5006, Release{nid(41), sid(41), 3}, replayed));
  const auto replay_answer = raw.exchange(replayed.view(), lockd_->addr);
  ASSERT_TRUE(replay_answer.has_value());
  {
    const DecodeResult d = decode_answer(*replay_answer);
    ASSERT_TRUE(d) << d.detail;
    EXPECT_EQ(d.header.request_id, 5006u);
    const auto* e = std::get_if<Error>(&d.body);
    ASSERT_NE(e, nullptr) << to_string(type_of(d.body));
    EXPECT_EQ(e->code, error_code_of(DecodeError::replayed));
  }
  EXPECT_EQ(lockd_->receiver.stats()[DecodeError::replayed], 1u);
  EXPECT_EQ(lockd_->executed[MessageType::release], 1u);  // only the link's

  // Every message type crossed the loopback, in one direction or the other: requests as
  // executed by the responder (and IsRunning also towards the worker), answers as decoded by
  // their receiver.
  std::set<MessageType> crossed = seen_;
  for (const auto& [type, count] : lockd_->executed)
    if (count > 0) crossed.insert(type);
  for (const Message& m : lockd_->answers) crossed.insert(type_of(m.body));
  EXPECT_EQ(crossed, all_types());
  EXPECT_EQ(all_types().size(), 30u);
}

TEST_F(WireBridgeTest, AForgedAnswerRacingLockdsDoesNotEndTheCall) {
  auto forged_key = keys_.make_key("forger.key");
  ASSERT_TRUE(forged_key.has_value());
  forged_key->key_id = key_.key_id;  // names our key id; only the MAC tells it apart
  lockd_->forger = std::make_unique<wire::Sender>(wid(700), 1, *forged_key);
  RetryPolicy once;
  once.attempts_max = 1;
  auto opened = LockdLink::open(*loop_, lockd_->addr, wid(601), key_, once);
  ASSERT_TRUE(opened.ok()) << opened.message();
  auto link = std::move(opened).value();
  std::optional<LockdReply> reply;
  link->call(wire::Stats{}, boottime_ns() + kDeadlineNs, [&](LockdReply r) { reply = std::move(r); });
  ASSERT_TRUE(run_until(*loop_, [&] { return reply.has_value(); }));
  ASSERT_TRUE(reply->ok()) << reply->problem;
  EXPECT_NE(std::get_if<wire::StatsAnswer>(&*reply->body), nullptr) << describe_answer(*reply->body);
  EXPECT_EQ(link->stats().answers_forged, 1u);
  EXPECT_EQ(link->stats().answers_bad, 0u);
  EXPECT_EQ(link->client_stats().answers_forged, 1u);
}

// An on-path attacker needs no key to send a worker's own request back to it: the tag is the
// worker's and the request id matches. It is not an answer, so it must not end the call.
TEST_F(WireBridgeTest, ARequestReflectedBackToItsSenderDoesNotEndTheCall) {
  lockd_->reflect = true;
  RetryPolicy once;
  once.attempts_max = 1;
  auto opened = LockdLink::open(*loop_, lockd_->addr, wid(602), key_, once);
  ASSERT_TRUE(opened.ok()) << opened.message();
  auto link = std::move(opened).value();
  std::optional<LockdReply> reply;
  wire::Heartbeat hb;
  hb.entries.push_back({nid(1), sid(1), 7});
  link->call(hb, boottime_ns() + kDeadlineNs, [&](LockdReply r) { reply = std::move(r); });
  ASSERT_TRUE(run_until(*loop_, [&] { return reply.has_value(); }));
  ASSERT_TRUE(reply->ok()) << reply->problem;
  EXPECT_NE(std::get_if<wire::HeartbeatAck>(&*reply->body), nullptr) << describe_answer(*reply->body);
  EXPECT_EQ(link->stats().answers_forged, 1u);
  EXPECT_EQ(link->stats().answers_bad, 0u);
}

}  // namespace
}  // namespace leasehold
