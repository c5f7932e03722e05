// SupervisorCore (supervisor/supervisor_core.cpp) with fake ports: every effect it has on the
// world is a recorded call, every answer from lockd is given by the test, and time is what the
// test passes in. The assertions are on values: what was sent to lockd, published in the table,
// armed in the rt thread and released from the gate, in which order, with which deadlines.
#include "leasehold/supervisor/status.hpp"
#include "leasehold/supervisor/supervisor_core.hpp"

#include "leasehold/supervisor/control.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <functional>
#include <set>
#include <string>
#include <variant>
#include <vector>

namespace leasehold {
namespace {

using nlohmann::json;

constexpr std::uint64_t kMs = 1'000'000;
constexpr std::uint64_t kTtlMs = 1000;
constexpr std::uint64_t kKillAfterMs = 600;
constexpr std::uint64_t kIntervalMs = 100;
constexpr std::uint64_t kT0 = 10'000 * kMs;  // every test starts here

// One ordered record of what the core asked of the world: "what slot/id value...".
using Events = std::vector<std::string>;

class FakeHost final : public SandboxHost {
 public:
  explicit FakeHost(Events& ev) : ev_(ev) {}
  std::optional<PortError> open_tokens(const SandboxId&) override { return std::nullopt; }
  shm::TableErrc publish_token(const SandboxId&, Epoch epoch, std::span<const std::uint8_t>) override {
    ev_.push_back("token epoch=" + std::to_string(epoch));
    return shm::TableErrc::ok;
  }
  void clear_tokens(const SandboxId&) override { ev_.push_back("clear_tokens"); }
  std::optional<PortError> create(const SandboxSpec& spec, HostedSandbox& out) override {
    created.push_back(spec);
    out.pid = 100 + static_cast<pid_t>(created.size());
    out.uid = 1000;
    out.log_path = "/logs/" + spec.id.str();
    out.at_gate = true;
    ev_.push_back("create slot=" + std::to_string(spec.slot) + " epoch=" + std::to_string(spec.epoch));
    return std::nullopt;
  }
  KillTarget kill_target(const SandboxId&) const override { return KillTarget{}; }
  std::optional<PortError> release(const SandboxId& id, std::uint64_t deadline_ns) override {
    released.emplace_back(id, deadline_ns);
    ev_.push_back("release deadline=" + std::to_string(deadline_ns));
    return std::nullopt;
  }
  void abandon(const SandboxId&) override { ev_.push_back("abandon"); }
  void kill(const SandboxId& id, std::uint64_t) override {
    killed.push_back(id);
    ev_.push_back("host_kill");
  }
  void terminate(const SandboxId& id) override {
    terminated.push_back(id);
    ev_.push_back("sigterm");
  }
  ReapedSandbox reap(const SandboxId& id) override {
    reaped.push_back(id);
    ev_.push_back("reap");
    return ReapedSandbox{exit_code, populated_on_reap};
  }
  bool leaf_emptied(const SandboxId&) override { return !populated_on_reap; }
  void forget(const SandboxId&) override { ev_.push_back("forget"); }

  std::vector<SandboxSpec> created;
  std::vector<std::pair<SandboxId, std::uint64_t>> released;
  std::vector<SandboxId> killed;
  std::vector<SandboxId> terminated;
  std::vector<SandboxId> reaped;
  bool populated_on_reap = false;  ///< a process of it outlives the kill (cgroup.kill failed)
  int exit_code = 0;               ///< what reap() reports

 private:
  Events& ev_;
};

class FakeLockd final : public LockdPort {
 public:
  struct Call {
    wire::Body body;
    std::int64_t deadline_ns = 0;
    LockdCallback done;
    bool answered = false;
  };
  void call(const wire::Body& body, std::int64_t deadline_ns, LockdCallback on_done) override {
    calls.push_back(Call{body, deadline_ns, std::move(on_done), false});
  }
  /// Answers call `i` with `body`, first sent at `first_send_ns`, handled at `now_ns`.
  void answer(std::size_t i, wire::Body body, std::uint64_t first_send_ns, std::uint64_t now_ns) {
    ASSERT_LT(i, calls.size());
    ASSERT_FALSE(calls[i].answered);
    calls[i].answered = true;
    LockdReply r;
    r.status = RequestStatus::answered;
    r.body = std::move(body);
    r.first_send_ns = static_cast<std::int64_t>(first_send_ns);
    r.attempts = 1;
    r.now_ns = static_cast<std::int64_t>(now_ns);
    LockdCallback done = std::move(calls[i].done);
    done(std::move(r));
  }
  /// Call `i` gave up: no answer before its deadline.
  void give_up(std::size_t i, std::uint64_t first_send_ns, std::uint64_t now_ns) {
    ASSERT_LT(i, calls.size());
    calls[i].answered = true;
    LockdReply r;
    r.status = RequestStatus::deadline_passed;
    r.first_send_ns = static_cast<std::int64_t>(first_send_ns);
    r.problem = "no answer from lockd before the deadline";
    r.now_ns = static_cast<std::int64_t>(now_ns);
    LockdCallback done = std::move(calls[i].done);
    done(std::move(r));
  }
  template <typename T>
  const T* body(std::size_t i) const {
    return i < calls.size() ? std::get_if<T>(&calls[i].body) : nullptr;
  }
  template <typename T>
  std::size_t count() const {
    return static_cast<std::size_t>(std::count_if(calls.begin(), calls.end(), [](const Call& c) {
      return std::holds_alternative<T>(c.body);
    }));
  }
  std::deque<Call> calls;  // stable: a callback may call again
};

class FakeRt final : public RtPort {
 public:
  explicit FakeRt(Events& ev) : ev_(ev) {}
  RtSubmitted arm(std::uint32_t slot, std::uint64_t valid_until_ns, const KillTarget&) override {
    deadline[slot] = valid_until_ns;
    ev_.push_back("arm slot=" + std::to_string(slot) + " deadline=" + std::to_string(valid_until_ns));
    return RtSubmitted{++seq, RtRefusal::none};
  }
  void set_deadline(std::uint32_t slot, std::uint64_t valid_until_ns) override { deadline[slot] = valid_until_ns; }
  RtSubmitted disarm(std::uint32_t slot) override {
    if (stopped) return RtSubmitted{0, RtRefusal::stopped};
    ev_.push_back("disarm slot=" + std::to_string(slot));
    return RtSubmitted{++seq, RtRefusal::none};
  }
  RtSubmitted kill_now(std::uint32_t slot) override {
    if (stopped) return RtSubmitted{0, RtRefusal::stopped};
    kills.push_back(slot);
    ev_.push_back("rt_kill slot=" + std::to_string(slot));
    return RtSubmitted{++seq, RtRefusal::none};
  }
  bool applied(std::uint64_t s) const override { return s <= applied_upto; }
  void stop() override {
    stopped = true;
    ev_.push_back("rt_stop");
  }

  std::map<std::uint32_t, std::uint64_t> deadline;
  std::vector<std::uint32_t> kills;
  std::uint64_t seq = 0;
  std::uint64_t applied_upto = 0;
  bool stopped = false;

 private:
  Events& ev_;
};

class FakeTable final : public SlotTable {
 public:
  struct Published {
    NameId name;
    std::string text;
    Epoch epoch = 0;
    std::uint64_t valid_until_ns = 0;
  };
  explicit FakeTable(Events& ev) : ev_(ev) {}
  Result<shm::ClaimedSlot> claim(const SandboxId& sandbox, std::uint64_t) override {
    shm::ClaimedSlot r;
    r.slot = next_slot++;
    claimed.push_back(r.slot);
    owners[r.slot] = claim_for.is_nil() ? sandbox : claim_for;
    return r;
  }
  shm::TableErrc publish(std::uint32_t slot, const NameId& name, const std::string& text, Epoch epoch,
                         std::uint64_t valid_until_ns) override {
    published[slot] = Published{name, text, epoch, valid_until_ns};
    ev_.push_back("publish slot=" + std::to_string(slot) + " epoch=" + std::to_string(epoch) +
                  " valid_until=" + std::to_string(valid_until_ns));
    return shm::TableErrc::ok;
  }
  shm::TableErrc extend(std::uint32_t slot, std::uint64_t valid_until_ns) override {
    if (!published.contains(slot)) return shm::TableErrc::wrong_state;
    published[slot].valid_until_ns = valid_until_ns;
    return shm::TableErrc::ok;
  }
  void revoke(std::uint32_t slot) override { ev_.push_back("revoke slot=" + std::to_string(slot)); }
  void free(std::uint32_t slot, std::uint64_t) override {
    freed.push_back(slot);
    published.erase(slot);
    if (!keep_claimed_on_free) owners.erase(slot);
    ev_.push_back("free slot=" + std::to_string(slot));
  }
  SandboxId owner(std::uint32_t slot) const override {
    const auto it = owners.find(slot);
    return it == owners.end() ? SandboxId{} : it->second;
  }
  void record_heartbeat_rtt_ns(std::uint64_t) override {}
  void record_heartbeat_failure() override { ++heartbeat_failures; }

  std::uint32_t next_slot = 0;
  std::map<std::uint32_t, SandboxId> owners;  ///< claimed, not yet freed
  SandboxId claim_for;               ///< not nil: a broken table records claims for this sandbox
  bool keep_claimed_on_free = false;  ///< a broken table: free() leaves the slot claimed
  std::vector<std::uint32_t> claimed;
  std::vector<std::uint32_t> freed;
  std::map<std::uint32_t, Published> published;
  int heartbeat_failures = 0;

 private:
  Events& ev_;
};

class FakeControl final : public ControlPort {
 public:
  void reply(ControlClientId client, const std::string& line) override {
    answers.emplace_back(client, json::parse(line));
  }
  void progress(ControlClientId client, const std::string& line) override {
    progress_lines.emplace_back(client, json::parse(line));
    if (on_progress) on_progress(client);
  }
  /// What writing a progress line does besides (the daemon's server drops a client found gone
  /// by the write and reports the close at once).
  std::function<void(ControlClientId)> on_progress;
  bool client_gone(ControlClientId client) const override { return gone.contains(client); }
  std::vector<std::pair<ControlClientId, json>> answers;
  std::set<ControlClientId> gone;  ///< closed, the close not yet handed to on_client_closed
  std::vector<std::pair<ControlClientId, json>> progress_lines;
};

class SupervisorCoreTest : public ::testing::Test {
 protected:
  void make(SupervisorMode mode, ShutdownPolicy on_shutdown = ShutdownPolicy::kill, std::uint64_t stop_grace_ms = 0) {
    SupervisorCoreConfig c;
    c.on_shutdown = on_shutdown;
    c.stop_grace_ms = stop_grace_ms;
    c.worker = WorkerId{0x77, 0x1};
    c.mode = mode;
    c.ttl_ms = kTtlMs;
    c.kill_after_ms = kKillAfterMs;
    c.heartbeat_interval_ms = kIntervalMs;
    c.slots = 8;
    c.lockd_ttl_ms = kTtlMs;
    SupervisorCoreHooks h;
    h.new_sandbox_id = [this] { return SandboxId{0x5b, ++ids}; };
    h.log = [this](const std::string& line) { log.push_back(line); };
    h.recently_gone = [this](const SandboxId& id) -> std::optional<GoneSandbox> {
      for (const GoneSandbox& g : gone)
        if (g.id == id) return g;
      return std::nullopt;
    };
    h.gone = [this](const Sandbox& s) {
      gone.push_back(GoneSandbox{s.id, s.name, s.owner, s.exit_code, s.kill_reason.empty() ? "exited" : s.kill_reason});
    };
    core = std::make_unique<SupervisorCore>(std::move(c), std::move(h), host, lockd, rt, control, table);
  }
  ControlRequest run(std::optional<std::string> name) {
    ControlRequest r;
    r.op = ControlOp::run;
    r.id = 1;
    r.name = std::move(name);
    r.argv = {"/bin/sleep", "60"};
    r.caller_uid = 1000;
    return r;
  }
  /// The control plane's expect-commit of lockd's reservation {"job", 5c..9, epoch 4}.
  static ControlRequest expect_commit(uid_t caller) {
    ControlRequest r;
    r.op = ControlOp::expect_commit;
    r.name = "job";
    r.sandbox = SandboxId{0x5c, 0x9};
    r.epoch = 4;
    r.argv = {"/bin/sleep", "60"};
    r.caller_uid = caller;
    return r;
  }
  const json& last_answer() const { return control.answers.back().second; }
  static ControlRequest op_on(ControlOp op, const SandboxId& sb, uid_t caller = 1000) {
    ControlRequest r;
    r.op = op;
    r.id = 3;
    r.sandbox = sb;
    r.caller_uid = caller;
    return r;
  }
  static ControlRequest release_of(const std::string& name, std::optional<std::uint64_t> grace_ms = std::nullopt) {
    ControlRequest r;
    r.op = ControlOp::release;
    r.id = 2;
    r.name = name;
    r.grace_ms = grace_ms;
    r.caller_uid = 1000;
    return r;
  }
  /// The sandbox exits (its pidfd) and the rt thread applied its disarm: it is reaped.
  void exits(const SandboxId& sb, std::uint64_t now) {
    core->on_exit(sb, now);
    rt.applied_upto = 1'000'000;
    core->check_disarms(now + kMs);
  }
  std::size_t index_of(const std::string& prefix) const {
    for (std::size_t i = 0; i < events.size(); ++i)
      if (events[i].rfind(prefix, 0) == 0) return i;
    return events.size();
  }
  /// Starts a lease-mode named run whose Acquire is answered at once with `epoch`.
  SandboxId granted_run(Epoch epoch) {
    core->on_request(7, run("job"), kT0);
    const auto* a = lockd.body<wire::Acquire>(lockd.calls.size() - 1);
    EXPECT_NE(a, nullptr);
    wire::Grant g{name_id_of("job"), epoch, a->sandbox, a->worker, LockPhase::held, kTtlMs, {}};
    lockd.answer(lockd.calls.size() - 1, g, kT0, kT0 + 2 * kMs);
    return a->sandbox;
  }

  Events events;
  FakeHost host{events};
  FakeLockd lockd;
  FakeRt rt{events};
  FakeTable table{events};
  FakeControl control;
  std::vector<std::string> log;
  std::vector<GoneSandbox> gone;
  std::uint64_t ids = 0;
  std::unique_ptr<SupervisorCore> core;
};

TEST_F(SupervisorCoreTest, NamedRunAcquiresThenPublishesArmsAndOnlyThenReleasesTheGate) {
  make(SupervisorMode::lease);
  core->on_request(7, run("job"), kT0);
  // The Acquire goes out first; nothing is created before lockd answers.
  ASSERT_EQ(lockd.calls.size(), 1u);
  const auto* a = lockd.body<wire::Acquire>(0);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->name, "job");
  EXPECT_EQ(a->worker, (WorkerId{0x77, 0x1}));
  EXPECT_EQ(a->ttl_ms, kTtlMs);
  EXPECT_FALSE(a->two_phase);
  EXPECT_EQ(lockd.calls[0].deadline_ns, static_cast<std::int64_t>(kT0) + SupervisorCore::kAcquireTimeoutNs);
  EXPECT_TRUE(host.created.empty());
  EXPECT_TRUE(control.answers.empty());
  ASSERT_EQ(core->sandboxes().size(), 1u);
  EXPECT_EQ(core->sandboxes().find(a->sandbox)->phase, SandboxPhase::acquiring);

  const SandboxId sb = a->sandbox;
  wire::Grant g{name_id_of("job"), 42, sb, a->worker, LockPhase::held, kTtlMs, {}};
  lockd.answer(0, g, kT0, kT0 + 2 * kMs);

  const std::uint64_t valid_until = kT0 + kKillAfterMs * kMs;
  ASSERT_EQ(host.created.size(), 1u);
  EXPECT_EQ(host.created[0].epoch, 42u);
  EXPECT_EQ(host.created[0].name, std::optional<std::string>("job"));
  ASSERT_TRUE(table.published.contains(0));
  EXPECT_EQ(table.published[0].epoch, 42u);
  EXPECT_EQ(table.published[0].valid_until_ns, valid_until);
  ASSERT_EQ(host.released.size(), 1u);
  // It may exec only while the deadline is more than one rt command poll away: the arm may
  // reach the wheel that much later, and a late arm would kill up to a poll past the deadline.
  EXPECT_EQ(host.released[0].second, valid_until - kDefaultRtCommandPollNs);
  // Token, then the table, then the child, then the rt deadline, then (last) the gate.
  const std::size_t token = index_of("token epoch=42"), publish = index_of("publish slot=0 epoch=42"),
                    create = index_of("create slot=0"), arm = index_of("arm slot=0 deadline=" + std::to_string(valid_until)),
                    release = index_of("release deadline=");
  ASSERT_LT(release, events.size());
  EXPECT_LT(token, publish);
  EXPECT_LT(publish, create);
  EXPECT_LT(create, arm);
  EXPECT_LT(arm, release);
  EXPECT_EQ(core->sandboxes().find(sb)->phase, SandboxPhase::running);
  ASSERT_EQ(control.answers.size(), 1u);
  EXPECT_EQ(control.answers[0].first, 7u);
  EXPECT_EQ(last_answer()["ok"], true);
  EXPECT_EQ(last_answer()["epoch"], 42);
  EXPECT_EQ(last_answer()["name"], "job");
  EXPECT_EQ(last_answer()["pid"], 101);
  EXPECT_EQ(core->counters().spawned, 1u);
}

TEST_F(SupervisorCoreTest, KillDeadlineCountsFromTheFirstSendNotFromTheAnswer) {
  make(SupervisorMode::lease);
  core->on_request(7, run("job"), kT0);
  const auto* a = lockd.body<wire::Acquire>(0);
  ASSERT_NE(a, nullptr);
  // Sent at kT0 (the retry that was answered went later), answered 400 ms after the first send.
  wire::Grant g{name_id_of("job"), 3, a->sandbox, a->worker, LockPhase::held, kTtlMs, {}};
  lockd.answer(0, g, kT0, kT0 + 400 * kMs);
  const std::uint64_t from_send = kT0 + kKillAfterMs * kMs;
  EXPECT_EQ(rt.deadline[0], from_send);
  EXPECT_EQ(table.published[0].valid_until_ns, from_send);
  ASSERT_EQ(host.released.size(), 1u);
  EXPECT_EQ(host.released[0].second, from_send - kDefaultRtCommandPollNs);
  EXPECT_EQ(last_answer()["valid_until_ms"], 200);  // 600 ms from the send, 400 ms of them gone

  // A heartbeat answered late extends from its send as well.
  const std::uint64_t tick = kT0 + 100 * kMs;
  core->on_heartbeat_tick(tick);
  ASSERT_EQ(lockd.calls.size(), 2u);
  const auto* h = lockd.body<wire::Heartbeat>(1);
  ASSERT_NE(h, nullptr);
  ASSERT_EQ(h->entries.size(), 1u);
  EXPECT_EQ(h->entries[0].name_id, name_id_of("job"));
  EXPECT_EQ(h->entries[0].epoch, 3u);
  wire::HeartbeatAck ack;
  ack.entries.push_back(wire::HeartbeatAckEntry{name_id_of("job"), RefreshStatus::refreshed, {}, 3, kTtlMs});
  lockd.answer(1, ack, tick, tick + 350 * kMs);
  EXPECT_EQ(rt.deadline[0], tick + kKillAfterMs * kMs);
  EXPECT_EQ(table.published[0].valid_until_ns, tick + kKillAfterMs * kMs);
  EXPECT_EQ(core->counters().refreshed, 1u);
}

TEST_F(SupervisorCoreTest, GrantArrivingAfterItsLeaseWouldHaveLapsedIsGivenBackAndNothingStarts) {
  make(SupervisorMode::lease);
  core->on_request(7, run("job"), kT0);
  const auto* a = lockd.body<wire::Acquire>(0);
  ASSERT_NE(a, nullptr);
  const SandboxId sb = a->sandbox;
  wire::Grant g{name_id_of("job"), 9, sb, a->worker, LockPhase::held, kTtlMs, {}};
  lockd.answer(0, g, kT0, kT0 + (kKillAfterMs + 1) * kMs);
  EXPECT_TRUE(host.created.empty());
  ASSERT_EQ(lockd.calls.size(), 2u);
  const auto* rel = lockd.body<wire::Release>(1);
  ASSERT_NE(rel, nullptr);
  EXPECT_EQ(rel->sandbox, sb);
  EXPECT_EQ(rel->epoch, 9u);
  EXPECT_EQ(last_answer()["ok"], false);
  EXPECT_EQ(last_answer()["error"], "unreachable");
  EXPECT_TRUE(core->sandboxes().empty());
  EXPECT_EQ(table.freed, std::vector<std::uint32_t>{0});
}

// A grant with less than the TTL left (an answer to a retry) counts from its send minus the
// shortfall. Sent 100 ms after boot with 300 ms missing, that is before boot: no boot-clock time
// to count from, so the name is given back. (Counting from a wrapped send time once gave the
// lease the deadline "never": the kill-switch could not fire.) Sent later, the same short grant
// is kept with its deadline moved forward by the shortfall.
TEST_F(SupervisorCoreTest, ShortGrantCountsFromBeforeItsSendAndIsGivenBackWithinItsShortfallOfBoot) {
  make(SupervisorMode::lease);
  const std::uint64_t send = 100 * kMs;
  core->on_request(7, run("job"), send);
  const auto* a = lockd.body<wire::Acquire>(0);
  ASSERT_NE(a, nullptr);
  const SandboxId sb = a->sandbox;
  wire::Grant g{name_id_of("job"), 5, sb, a->worker, LockPhase::held, kTtlMs - 300, {}};
  lockd.answer(0, g, send, send + 50 * kMs);
  EXPECT_TRUE(host.created.empty());
  EXPECT_TRUE(rt.deadline.empty());
  ASSERT_EQ(lockd.calls.size(), 2u);
  const auto* rel = lockd.body<wire::Release>(1);
  ASSERT_NE(rel, nullptr);
  EXPECT_EQ(rel->sandbox, sb);
  EXPECT_EQ(rel->epoch, 5u);
  EXPECT_EQ(last_answer()["ok"], false);
  EXPECT_EQ(last_answer()["error"], "unreachable");
  EXPECT_TRUE(core->sandboxes().empty());

  // The same shortfall on a send 10 s after boot: kept, 300 ms earlier than a full grant's.
  core->on_request(7, run("job"), kT0);
  const auto* b = lockd.body<wire::Acquire>(2);
  ASSERT_NE(b, nullptr);
  wire::Grant g2{name_id_of("job"), 6, b->sandbox, b->worker, LockPhase::held, kTtlMs - 300, {}};
  lockd.answer(2, g2, kT0, kT0 + 50 * kMs);
  const std::uint64_t deadline = kT0 - 300 * kMs + kKillAfterMs * kMs;
  const std::uint32_t slot = table.claimed.back();
  ASSERT_EQ(rt.deadline.count(slot), 1u);
  EXPECT_EQ(rt.deadline[slot], deadline);
  EXPECT_EQ(table.published[slot].valid_until_ns, deadline);
  EXPECT_EQ(host.created.size(), 1u);
}

TEST_F(SupervisorCoreTest, HeartbeatAnswerLostKillsTheSandboxAndItsExitConfirmsTheKill) {
  make(SupervisorMode::lease);
  const SandboxId sb = granted_run(5);
  ASSERT_EQ(core->sandboxes().find(sb)->phase, SandboxPhase::running);
  const std::uint64_t tick = kT0 + 100 * kMs;
  core->on_heartbeat_tick(tick);
  ASSERT_NE(lockd.body<wire::Heartbeat>(1), nullptr);
  const SandboxId other{0x99, 0x1};
  wire::HeartbeatAck ack;
  ack.entries.push_back(wire::HeartbeatAckEntry{name_id_of("job"), RefreshStatus::lost, other, 6, 0});
  lockd.answer(1, ack, tick, tick + 1 * kMs);
  // The armed slot is killed through the rt thread at once.
  EXPECT_EQ(rt.kills, std::vector<std::uint32_t>{0});
  const Sandbox* s = core->sandboxes().find(sb);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->phase, SandboxPhase::killing);
  EXPECT_TRUE(s->revoked);
  EXPECT_NE(s->kill_reason.find("lost"), std::string::npos);
  EXPECT_EQ(core->heartbeat().find(sb), nullptr);
  EXPECT_EQ(core->counters().lost, 1u);

  // It exits: disarmed, reaped once the rt thread applied that, slot freed, and (its grant no
  // longer ours) the kill confirmed to lockd instead of a release.
  core->on_exit(sb, tick + 5 * kMs);
  EXPECT_TRUE(core->disarms_pending());
  EXPECT_TRUE(host.reaped.empty());
  rt.applied_upto = rt.seq;
  core->check_disarms(tick + 6 * kMs);
  EXPECT_FALSE(core->disarms_pending());
  EXPECT_EQ(host.reaped, std::vector<SandboxId>{sb});
  EXPECT_EQ(table.freed, std::vector<std::uint32_t>{0});
  EXPECT_TRUE(core->sandboxes().empty());
  const auto* kc = lockd.body<wire::KillConfirmed>(lockd.calls.size() - 1);
  ASSERT_NE(kc, nullptr);
  EXPECT_EQ(kc->sandbox, sb);
  EXPECT_EQ(kc->epoch, 5u);
  EXPECT_EQ(lockd.count<wire::Release>(), 0u);
}

TEST_F(SupervisorCoreTest, ALostAnswerToAHeartbeatThatCrossedTheReleaseIsNotALoss) {
  make(SupervisorMode::lease);
  const SandboxId sb = granted_run(5);
  const std::uint64_t tick = kT0 + 100 * kMs;
  core->on_heartbeat_tick(tick);
  const std::size_t beat = lockd.calls.size() - 1;
  ASSERT_NE(lockd.body<wire::Heartbeat>(beat), nullptr);
  // The sandbox exits and its name is released while the heartbeat is still unanswered.
  core->on_exit(sb, tick + 5 * kMs);
  rt.applied_upto = rt.seq;
  core->check_disarms(tick + 6 * kMs);
  EXPECT_TRUE(core->sandboxes().empty());
  ASSERT_EQ(lockd.count<wire::Release>(), 1u);
  // lockd handled the release first, so it answers the heartbeat "lost": nothing was lost.
  wire::HeartbeatAck ack;
  ack.entries.push_back(wire::HeartbeatAckEntry{name_id_of("job"), RefreshStatus::lost, {}, 0, 0});
  lockd.answer(beat, ack, tick, tick + 10 * kMs);
  EXPECT_EQ(core->counters().lost, 0u);
  EXPECT_EQ(core->counters().unknown, 0u);
  EXPECT_EQ(core->counters().kills_request, 0u);
}

TEST_F(SupervisorCoreTest, LateGrantAfterTheCallerGaveUpIsReleasedBack) {
  make(SupervisorMode::lease);
  core->on_request(7, run("job"), kT0);
  const auto* a = lockd.body<wire::Acquire>(0);
  ASSERT_NE(a, nullptr);
  const SandboxId sb = a->sandbox;
  lockd.give_up(0, kT0, kT0 + 3000 * kMs);
  EXPECT_EQ(last_answer()["error"], "unreachable");
  EXPECT_TRUE(core->sandboxes().empty());
  EXPECT_TRUE(host.created.empty());
  ASSERT_EQ(lockd.calls.size(), 1u);

  // lockd granted after all (the request sat in its queue): nobody here will heartbeat it.
  wire::Grant late{name_id_of("job"), 11, sb, WorkerId{0x77, 0x1}, LockPhase::held, kTtlMs, {}};
  core->on_late_answer(late, kT0 + 3100 * kMs);
  ASSERT_EQ(lockd.calls.size(), 2u);
  const auto* rel = lockd.body<wire::Release>(1);
  ASSERT_NE(rel, nullptr);
  EXPECT_EQ(rel->name_id, name_id_of("job"));
  EXPECT_EQ(rel->sandbox, sb);
  EXPECT_EQ(rel->epoch, 11u);
  EXPECT_EQ(core->counters().late_grants_released, 1u);
  EXPECT_TRUE(host.created.empty());
}

TEST_F(SupervisorCoreTest, LateGrantOfASandboxThatHoldsItIsKept) {
  make(SupervisorMode::lease);
  const SandboxId sb = granted_run(5);
  const std::size_t calls = lockd.calls.size();
  wire::Grant dup{name_id_of("job"), 5, sb, WorkerId{0x77, 0x1}, LockPhase::held, kTtlMs, {}};
  core->on_late_answer(dup, kT0 + 50 * kMs);
  EXPECT_EQ(lockd.calls.size(), calls);
  EXPECT_EQ(core->counters().late_grants_released, 0u);
}

TEST_F(SupervisorCoreTest, UnnamedRunStartsAtOnceWithoutLockd) {
  make(SupervisorMode::lease);
  core->on_request(3, run(std::nullopt), kT0);
  EXPECT_TRUE(lockd.calls.empty());
  ASSERT_EQ(host.created.size(), 1u);
  EXPECT_EQ(host.created[0].epoch, 0u);
  EXPECT_EQ(rt.deadline[0], SupervisorCore::kNoDeadlineNs);
  ASSERT_EQ(host.released.size(), 1u);
  EXPECT_EQ(host.released[0].second, 0u);  // no lease: no deadline to check at the gate
  EXPECT_TRUE(table.published.empty());
  EXPECT_EQ(last_answer()["ok"], true);
}

TEST_F(SupervisorCoreTest, NameHeldOnThisWorkerIsRefusedLocally) {
  make(SupervisorMode::lease);
  const SandboxId sb = granted_run(5);
  const std::size_t calls = lockd.calls.size();
  core->on_request(8, run("job"), kT0 + 10 * kMs);
  EXPECT_EQ(lockd.calls.size(), calls);
  EXPECT_EQ(last_answer()["error"], "held");
  EXPECT_EQ(last_answer()["holder"], sb.str());
  EXPECT_EQ(last_answer()["epoch"], 5);
}

TEST_F(SupervisorCoreTest, ReleaseKillsTheHolderAndItsExitGivesTheNameBack) {
  make(SupervisorMode::lease);
  const SandboxId sb = granted_run(5);
  ControlRequest rel;
  rel.op = ControlOp::release;
  rel.id = 2;
  rel.name = "job";
  rel.caller_uid = 1000;
  core->on_request(9, rel, kT0 + 20 * kMs);
  EXPECT_EQ(rt.kills, std::vector<std::uint32_t>{0});
  const std::size_t answers = control.answers.size();
  rt.applied_upto = 1'000'000;
  core->on_exit(sb, kT0 + 30 * kMs);
  core->check_disarms(kT0 + 31 * kMs);
  const auto* r = lockd.body<wire::Release>(lockd.calls.size() - 1);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->sandbox, sb);
  EXPECT_EQ(r->epoch, 5u);
  EXPECT_EQ(control.answers.size(), answers);  // answered once lockd has the name back
  lockd.answer(lockd.calls.size() - 1, wire::Ok{}, kT0 + 31 * kMs, kT0 + 32 * kMs);
  ASSERT_EQ(control.answers.size(), answers + 1);
  EXPECT_EQ(control.answers.back().first, 9u);
  EXPECT_EQ(last_answer()["ok"], true);
  EXPECT_EQ(last_answer()["released"], true);
  EXPECT_EQ(core->counters().names_released, 1u);
}

TEST_F(SupervisorCoreTest, ReleaseByAnotherUidIsForbidden) {
  make(SupervisorMode::lease);
  granted_run(5);
  ControlRequest rel;
  rel.op = ControlOp::release;
  rel.name = "job";
  rel.caller_uid = 2000;
  core->on_request(9, rel, kT0 + 20 * kMs);
  EXPECT_TRUE(rt.kills.empty());
  EXPECT_EQ(last_answer()["error"], "forbidden");
}

// The status part (status.hpp): `list` shows a caller its own sandboxes only (root all of
// them), with the lease's time left; `status` counts them and the core's counters.
TEST_F(SupervisorCoreTest, ListAndStatusShowTheCoresSandboxesToTheirOwner) {
  make(SupervisorMode::lease);
  const SandboxId sb = granted_run(5);
  const json mine = sandbox_list_json(*core, 1000, kT0 + 100 * kMs);
  ASSERT_EQ(mine.size(), 1u);
  EXPECT_EQ(mine[0]["sandbox"], sb.str());
  EXPECT_EQ(mine[0]["name"], "job");
  EXPECT_EQ(mine[0]["epoch"], 5);
  EXPECT_EQ(mine[0]["owner"], 1000);
  EXPECT_EQ(mine[0]["valid_until_ms"], static_cast<std::int64_t>(kKillAfterMs) - 100);
  EXPECT_TRUE(sandbox_list_json(*core, 2000, kT0).empty());
  EXPECT_EQ(sandbox_list_json(*core, 0, kT0).size(), 1u);
  const json st = core_status_json(*core, kT0);
  EXPECT_EQ(st["sandboxes"], 1);
  EXPECT_EQ(st["named"], 1);
  EXPECT_EQ(st["may_create_named"], true);
  EXPECT_EQ(st["counters"]["spawned"], 1);
  EXPECT_FALSE(st.contains("worker_valid_until_ms"));  // lease mode
}

// expect-commit claims lockd's 2-phase reservation by {name, sandbox, epoch}, which a refused
// `run` of that name shows any client: only root or the supervisor's own uid may send it.
TEST_F(SupervisorCoreTest, ExpectCommitFromAnotherUidIsForbidden) {
  make(SupervisorMode::lease);
  ControlRequest ec = expect_commit(1000);
  ec.argv = {"/bin/sh", "-c", "evil"};
  core->on_request(9, ec, kT0);
  EXPECT_EQ(last_answer()["error"], "forbidden");
  EXPECT_EQ(core->sandboxes().size(), 0u);
  core->on_heartbeat_tick(kT0 + kIntervalMs * kMs);
  EXPECT_TRUE(lockd.calls.empty());  // no Commit went out for it
  ec.caller_uid = 0;  // root (the control plane) may
  core->on_request(10, ec, kT0 + kIntervalMs * kMs);
  EXPECT_EQ(core->sandboxes().size(), 1u);
  EXPECT_EQ(core->pending_commits(), 1u);
}

// A sandbox id names one sandbox, once. After it ran and its grant's Release went out, a
// repeated expect-commit of the same {name, sandbox, epoch} is refused: its Commit could
// overtake that Release at lockd (Commit is idempotent there), revive the grant, and the late
// Release would free the name under a sandbox that believes it holds it.
TEST_F(SupervisorCoreTest, ExpectCommitOfASandboxIdThatRanHereIsRefusedWhileItsReleaseMayBeInFlight) {
  make(SupervisorMode::lease);
  ControlRequest ec = expect_commit(0);
  core->on_request(9, ec, kT0);
  core->on_heartbeat_tick(kT0 + kMs);
  const auto* c = lockd.body<wire::Commit>(lockd.calls.size() - 1);
  ASSERT_NE(c, nullptr);
  lockd.answer(lockd.calls.size() - 1, wire::Grant{name_id_of("job"), 4, *ec.sandbox, c->worker, LockPhase::held, kTtlMs, {}},
               kT0 + kMs, kT0 + 2 * kMs);
  ASSERT_EQ(host.created.size(), 1u);
  rt.applied_upto = 1'000'000;
  core->on_exit(*ec.sandbox, kT0 + 10 * kMs);
  core->check_disarms(kT0 + 11 * kMs);
  ASSERT_NE(lockd.body<wire::Release>(lockd.calls.size() - 1), nullptr);  // in flight, unanswered
  const std::size_t calls = lockd.calls.size();
  core->on_request(9, ec, kT0 + 12 * kMs);
  EXPECT_EQ(last_answer()["error"], "refused");
  EXPECT_NE(last_answer()["message"].get<std::string>().find("already ran on this worker"), std::string::npos);
  EXPECT_EQ(core->counters().reused_ids_refused, 1u);
  EXPECT_EQ(core->sandboxes().size(), 0u);
  core->on_heartbeat_tick(kT0 + 13 * kMs);
  EXPECT_EQ(lockd.count<wire::Commit>(), 1u);  // no second Commit went out
  // Once lockd has surely applied or expired that grant, the id may be used again.
  const std::uint64_t later = kT0 + 11 * kMs + core->tombstone_ns();
  EXPECT_EQ(core->tombstone_ns(), 2 * kTtlMs * kMs + static_cast<std::uint64_t>(SupervisorCore::kReleaseTimeoutNs));
  core->on_request(9, ec, later);
  EXPECT_EQ(core->sandboxes().size(), 1u);
  EXPECT_GE(lockd.calls.size(), calls);
}

// Preemptible mode: lockd may commit a name and then revoke it before the Commit's answer
// arrives. The Revoked for that epoch must stop the sandbox started for it (it runs under the
// grant's epoch, its name still pending), not just be acknowledged.
TEST_F(SupervisorCoreTest, PreemptibleRevocationDuringTheCommitKillsTheSandboxStartedForIt) {
  make(SupervisorMode::preemptible);
  core->heartbeat().start_worker_liveness(kT0);
  core->on_request(7, run("job"), kT0);
  const auto* a = lockd.body<wire::Acquire>(0);
  ASSERT_NE(a, nullptr);
  const SandboxId sb = a->sandbox;
  wire::Grant acquiring{name_id_of("job"), 12, sb, a->worker, LockPhase::acquiring, kTtlMs, {}};
  lockd.answer(0, acquiring, kT0, kT0 + 1 * kMs);
  ASSERT_EQ(core->sandboxes().find(sb)->phase, SandboxPhase::committing);
  EXPECT_TRUE(core->on_revoked(wire::Revoked{name_id_of("job"), 12, 13}, kT0 + 2 * kMs));
  EXPECT_EQ(rt.kills.size(), 1u);
  EXPECT_LT(index_of("revoke slot=0"), events.size());  // its checks fail before the rt thread acts
  EXPECT_TRUE(core->sandboxes().find(sb)->revoked);
  EXPECT_EQ(core->sandboxes().find(sb)->phase, SandboxPhase::killing);
  // The Commit's Held answer after that publishes nothing.
  wire::Grant held{name_id_of("job"), 12, sb, a->worker, LockPhase::held, kTtlMs, {}};
  lockd.answer(1, held, kT0 + 1 * kMs, kT0 + 3 * kMs);
  EXPECT_TRUE(table.published.empty());
}

TEST_F(SupervisorCoreTest, IsRunningAnswersForTheGrantOfAStartedSandboxOnly) {
  make(SupervisorMode::lease);
  core->on_request(7, run("job"), kT0);
  const SandboxId sb = lockd.body<wire::Acquire>(0)->sandbox;
  // Acquire in flight: not started, no epoch.
  EXPECT_FALSE(core->is_running(wire::IsRunning{name_id_of("job"), sb, 4}));
  wire::Grant g{name_id_of("job"), 4, sb, WorkerId{0x77, 0x1}, LockPhase::held, kTtlMs, {}};
  lockd.answer(0, g, kT0, kT0 + 1 * kMs);
  EXPECT_TRUE(core->is_running(wire::IsRunning{name_id_of("job"), sb, 4}));
  EXPECT_FALSE(core->is_running(wire::IsRunning{name_id_of("job"), sb, 3}));
  EXPECT_FALSE(core->is_running(wire::IsRunning{name_id_of("other"), sb, 4}));
}

TEST_F(SupervisorCoreTest, RevocationKillsTheSandboxOfThatGrant) {
  make(SupervisorMode::lease);
  const SandboxId sb = granted_run(5);
  EXPECT_TRUE(core->on_revoked(wire::Revoked{name_id_of("job"), 5, 6}, kT0 + 10 * kMs));
  EXPECT_EQ(rt.kills, std::vector<std::uint32_t>{0});
  EXPECT_TRUE(core->sandboxes().find(sb)->revoked);
  // A revocation of a grant nothing here runs is confirmed at once.
  EXPECT_FALSE(core->on_revoked(wire::Revoked{name_id_of("gone"), 2, 3}, kT0 + 11 * kMs));
  const auto* kc = lockd.body<wire::KillConfirmed>(lockd.calls.size() - 1);
  ASSERT_NE(kc, nullptr);
  EXPECT_EQ(kc->name_id, name_id_of("gone"));
  EXPECT_EQ(kc->epoch, 2u);
}

TEST_F(SupervisorCoreTest, RtDeadlineKillIsCountedAsADeadlineKill) {
  make(SupervisorMode::lease);
  const SandboxId sb = granted_run(5);
  RtKillEvent e;
  e.slot = 0;
  e.record.deadline_ns = kT0 + kKillAfterMs * kMs;
  e.record.path = KillPath::signals;
  core->on_rt_kill(e, kT0 + kKillAfterMs * kMs + 1);
  EXPECT_EQ(core->counters().kills_deadline, 1u);
  EXPECT_TRUE(core->sandboxes().find(sb)->rt_killed);
  EXPECT_EQ(core->sandboxes().find(sb)->kill_reason, "kill-switch: lease not refreshed in time");
}

// Preemptible mode: the sandbox starts (unpublished, under the worker's deadline) before the
// Commit goes out, so whenever lockd has the name Held here IsRunning finds it running.
TEST_F(SupervisorCoreTest, PreemptibleStartsTheSandboxBeforeItsCommitAndPublishesOnHeld) {
  make(SupervisorMode::preemptible);
  core->heartbeat().start_worker_liveness(kT0);
  core->on_request(7, run("job"), kT0);
  const auto* a = lockd.body<wire::Acquire>(0);
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(a->two_phase);
  const SandboxId sb = a->sandbox;
  wire::Grant acquiring{name_id_of("job"), 12, sb, a->worker, LockPhase::acquiring, kTtlMs, {}};
  lockd.answer(0, acquiring, kT0, kT0 + 1 * kMs);
  ASSERT_EQ(host.created.size(), 1u);
  ASSERT_EQ(host.released.size(), 1u);
  EXPECT_TRUE(table.published.empty());  // its check says "not valid" until the Commit is acknowledged
  ASSERT_EQ(lockd.calls.size(), 2u);
  const auto* c = lockd.body<wire::Commit>(1);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->epoch, 12u);
  EXPECT_EQ(c->sandbox, sb);
  EXPECT_LT(index_of("release deadline="), events.size());
  EXPECT_EQ(core->sandboxes().find(sb)->phase, SandboxPhase::committing);
  EXPECT_TRUE(core->is_running(wire::IsRunning{name_id_of("job"), sb, 12}));
  EXPECT_TRUE(control.answers.empty());

  wire::Grant held{name_id_of("job"), 12, sb, a->worker, LockPhase::held, kTtlMs, {}};
  lockd.answer(1, held, kT0 + 1 * kMs, kT0 + 2 * kMs);
  ASSERT_TRUE(table.published.contains(0));
  EXPECT_EQ(table.published[0].epoch, 12u);
  EXPECT_EQ(table.published[0].valid_until_ns, kT0 + kKillAfterMs * kMs);
  EXPECT_EQ(core->sandboxes().find(sb)->phase, SandboxPhase::running);
  EXPECT_EQ(last_answer()["ok"], true);
  EXPECT_EQ(last_answer()["epoch"], 12);
}

TEST_F(SupervisorCoreTest, PreemptibleRefusedCommitStopsTheSandboxStartedForIt) {
  make(SupervisorMode::preemptible);
  core->heartbeat().start_worker_liveness(kT0);
  core->on_request(7, run("job"), kT0);
  const SandboxId sb = lockd.body<wire::Acquire>(0)->sandbox;
  lockd.answer(0, wire::Grant{name_id_of("job"), 12, sb, WorkerId{0x77, 0x1}, LockPhase::acquiring, kTtlMs, {}}, kT0,
               kT0 + 1 * kMs);
  ASSERT_NE(lockd.body<wire::Commit>(1), nullptr);
  wire::Deny d;
  d.name_id = name_id_of("job");
  d.refusal = Refusal::held;
  lockd.answer(1, d, kT0 + 1 * kMs, kT0 + 2 * kMs);
  EXPECT_EQ(rt.kills, std::vector<std::uint32_t>{0});
  EXPECT_EQ(core->sandboxes().find(sb)->phase, SandboxPhase::killing);
  const auto* rel = lockd.body<wire::Release>(2);  // the Acquiring record is given back
  ASSERT_NE(rel, nullptr);
  EXPECT_EQ(rel->epoch, 12u);
  EXPECT_TRUE(table.published.empty());
}

TEST_F(SupervisorCoreTest, WorkerLivenessLapseKillsAndRefusesNamedCreation) {
  make(SupervisorMode::preemptible);
  core->heartbeat().start_worker_liveness(kT0);
  core->on_request(7, run("job"), kT0);
  const SandboxId sb = lockd.body<wire::Acquire>(0)->sandbox;
  lockd.answer(0, wire::Grant{name_id_of("job"), 12, sb, WorkerId{0x77, 0x1}, LockPhase::acquiring, kTtlMs, {}}, kT0,
               kT0 + 1 * kMs);
  lockd.answer(1, wire::Grant{name_id_of("job"), 12, sb, WorkerId{0x77, 0x1}, LockPhase::held, kTtlMs, {}},
               kT0 + 1 * kMs, kT0 + 2 * kMs);
  // No worker beat acknowledged: at kill_after past the last acknowledged send the kill-switch fires.
  core->on_heartbeat_tick(kT0 + kKillAfterMs * kMs);
  EXPECT_EQ(rt.kills, std::vector<std::uint32_t>{0});
  EXPECT_EQ(core->counters().worker_killswitch, 1u);
  const std::size_t calls = lockd.calls.size();
  core->on_request(8, run("job2"), kT0 + kKillAfterMs * kMs + 1);
  EXPECT_EQ(last_answer()["error"], "killswitch");
  EXPECT_EQ(lockd.count<wire::Acquire>(), 1u);
  EXPECT_GE(lockd.calls.size(), calls);
}

TEST_F(SupervisorCoreTest, ShutdownKillsStartedSandboxesAndRefusesNewOnes) {
  make(SupervisorMode::lease);
  const SandboxId sb = granted_run(5);
  core->begin_shutdown("SIGTERM", kT0 + 50 * kMs);
  EXPECT_TRUE(core->shutting_down());
  EXPECT_EQ(rt.kills, std::vector<std::uint32_t>{0});
  EXPECT_FALSE(core->quiescent());
  core->on_request(8, run("other"), kT0 + 51 * kMs);
  EXPECT_EQ(last_answer()["error"], "shutting_down");
  rt.applied_upto = 1'000'000;
  core->on_exit(sb, kT0 + 60 * kMs);
  core->check_disarms(kT0 + 61 * kMs);
  EXPECT_FALSE(core->quiescent());  // its release is in flight
  lockd.answer(lockd.calls.size() - 1, wire::Ok{}, kT0 + 61 * kMs, kT0 + 62 * kMs);
  EXPECT_TRUE(core->quiescent());
}

// A process that outlived its sandbox's kill (its leaf still populated at the reap) still reads
// the table: its slot is not freed while the leaf holds a process, so no later sandbox's grant
// shows in it, and its name is left to expire at lockd. Once the leaf is empty the slot is free.
TEST_F(SupervisorCoreTest, ASlotIsFreedOnlyOnceItsLeafIsEmpty) {
  make(SupervisorMode::lease);
  const SandboxId sb = granted_run(5);
  host.populated_on_reap = true;
  rt.applied_upto = 1'000'000;
  const std::size_t before = events.size();
  core->on_exit(sb, kT0 + 30 * kMs);
  core->check_disarms(kT0 + 31 * kMs);
  EXPECT_TRUE(table.freed.empty());
  EXPECT_NE(std::find(events.begin() + static_cast<std::ptrdiff_t>(before), events.end(), "revoke slot=0"), events.end());
  EXPECT_EQ(core->counters().slots_quarantined, 1u);
  EXPECT_EQ(lockd.count<wire::Release>(), 0u);
  EXPECT_EQ(core->sandboxes().find(sb), nullptr);
  core->on_heartbeat_tick(kT0 + 100 * kMs);  // still populated: still held
  EXPECT_TRUE(table.freed.empty());
  // A revocation of its grant meanwhile is not confirmed: the survivor may still act.
  const std::size_t calls = lockd.calls.size();
  EXPECT_TRUE(core->on_revoked(wire::Revoked{name_id_of("job"), 5, 6}, kT0 + 150 * kMs));
  EXPECT_EQ(lockd.calls.size(), calls);
  EXPECT_EQ(lockd.count<wire::KillConfirmed>(), 0u);
  host.populated_on_reap = false;  // the survivor is gone: the next tick frees the slot
  core->on_heartbeat_tick(kT0 + 200 * kMs);
  EXPECT_EQ(table.freed, std::vector<std::uint32_t>{0});
  EXPECT_EQ(core->counters().slots_released_from_quarantine, 1u);
}

// --on-shutdown keep keeps unnamed processes only. A named process kept past its supervisor
// would outlive the kill-switch of its lease and run beside the name's next holder: it is
// killed, spawned to die with the supervisor, and its name goes back only once it is dead.
TEST_F(SupervisorCoreTest, KeepOnShutdownKeepsUnnamedSandboxesOnlyAndKillsNamedOnes) {
  make(SupervisorMode::lease, ShutdownPolicy::keep);
  core->on_request(3, run(std::nullopt), kT0);
  const SandboxId kept{0x5b, ids};
  const SandboxId named = granted_run(5);
  ASSERT_EQ(host.created.size(), 2u);
  EXPECT_FALSE(host.created[0].die_with_supervisor);  // unnamed: may outlive us
  EXPECT_TRUE(host.created[1].die_with_supervisor);   // named: PDEATHSIG
  core->begin_shutdown("SIGTERM", kT0 + 50 * kMs);
  EXPECT_EQ(host.killed, std::vector<SandboxId>{named});
  EXPECT_EQ(std::count(events.begin(), events.end(), "forget"), 1);
  EXPECT_EQ(core->sandboxes().find(kept), nullptr);
  EXPECT_EQ(lockd.count<wire::Release>(), 0u);  // not while it may still run
  EXPECT_FALSE(core->quiescent());
  core->on_exit(named, kT0 + 60 * kMs);
  const auto* r = lockd.body<wire::Release>(lockd.calls.size() - 1);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->sandbox, named);
  EXPECT_EQ(r->epoch, 5u);
  lockd.answer(lockd.calls.size() - 1, wire::Ok{}, kT0 + 61 * kMs, kT0 + 62 * kMs);
  EXPECT_TRUE(core->quiescent());
  for (const std::string& line : log) EXPECT_EQ(line.find("disarm_refused"), std::string::npos) << line;
}

TEST_F(SupervisorCoreTest, AnUnnamedSandboxThatMayOutliveUsCannotBeNamedLater) {
  make(SupervisorMode::lease, ShutdownPolicy::keep);
  core->on_request(3, run(std::nullopt), kT0);
  ControlRequest n;
  n.op = ControlOp::name;
  n.id = 4;
  n.name = "late";
  n.sandbox = SandboxId{0x5b, ids};
  n.caller_uid = 1000;
  core->on_request(3, n, kT0 + kMs);
  EXPECT_EQ(last_answer()["error"], "refused");
  EXPECT_NE(last_answer()["message"].get<std::string>().find("--on-shutdown keep"), std::string::npos);
  EXPECT_TRUE(lockd.calls.empty());
  // Under the default policy the same request goes to lockd.
  make(SupervisorMode::lease);
  core->on_request(3, run(std::nullopt), kT0);
  n.sandbox = SandboxId{0x5b, ids};
  core->on_request(3, n, kT0 + kMs);
  EXPECT_EQ(lockd.count<wire::Acquire>(), 1u);
}

// The sandbox logic's end of "a slot and a sandbox id name the same sandbox": where a slot is
// bound to a sandbox and where it is let go, the shm table's owner of the slot is checked
// against the sandbox table (O(1)). A slot table that disagrees (a broken fake here) aborts the
// supervisor before it publishes, kills or frees for the wrong sandbox.
using SupervisorCoreDeathTest = SupervisorCoreTest;

TEST_F(SupervisorCoreDeathTest, ASlotClaimedForAnotherSandboxAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  make(SupervisorMode::lease);
  table.claim_for = SandboxId{0x99, 1};
  EXPECT_DEATH(core->on_request(3, run(std::nullopt), kT0), "LEASEHOLD_ASSERT\\(by_slot_\\[slot\\] == shm_owner\\) failed");
  table.claim_for = SandboxId{};
  core->on_request(3, run(std::nullopt), kT0);
  EXPECT_EQ(last_answer()["ok"], true);
}

TEST_F(SupervisorCoreDeathTest, ASlotTheShmTableDidNotFreeAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  make(SupervisorMode::lease);
  core->on_request(3, run(std::nullopt), kT0);
  ASSERT_EQ(host.created.size(), 1u);
  const SandboxId sb = host.created[0].id;
  rt.applied_upto = 1'000'000;  // every disarm applied
  table.keep_claimed_on_free = true;
  EXPECT_DEATH(
      {
        core->on_exit(sb, kT0 + 30 * kMs);
        core->check_disarms(kT0 + 31 * kMs);
      },
      "LEASEHOLD_ASSERT\\(by_slot_\\[slot\\] == shm_owner\\) failed");
  table.keep_claimed_on_free = false;
  core->on_exit(sb, kT0 + 30 * kMs);
  core->check_disarms(kT0 + 31 * kMs);
  EXPECT_EQ(table.freed, std::vector<std::uint32_t>{0});
  EXPECT_EQ(core->sandboxes().find(sb), nullptr);
}

// ---- stopping with a grace period (--stop-grace-ms) ----------------------------------------

// A release with a grace period asks the sandbox to stop (SIGTERM) and changes nothing else: its
// slot stays valid, its lease is still heartbeated, its kill-switch stays armed. It exits by
// itself: only then (its leaf empty) is the name given back and the release answered.
TEST_F(SupervisorCoreTest, ReleaseWithGraceSendsSigtermAndGivesTheNameBackOnlyAfterTheExit) {
  make(SupervisorMode::lease, ShutdownPolicy::kill, 2000);
  const SandboxId sb = granted_run(5);
  const std::size_t before = events.size();
  core->on_request(9, release_of("job"), kT0 + 20 * kMs);
  EXPECT_EQ(host.terminated, std::vector<SandboxId>{sb});
  EXPECT_TRUE(rt.kills.empty());
  EXPECT_TRUE(host.killed.empty());
  EXPECT_EQ(std::find(events.begin() + static_cast<std::ptrdiff_t>(before), events.end(), "revoke slot=0"), events.end());
  const Sandbox* s = core->sandboxes().find(sb);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->phase, SandboxPhase::running);
  EXPECT_EQ(s->stop_deadline_ns, kT0 + 20 * kMs + 2000 * kMs);
  EXPECT_EQ(s->stop_reason, "released");
  EXPECT_TRUE(s->kill_reason.empty());
  // Its lease is still refreshed meanwhile.
  const std::uint64_t tick = kT0 + 100 * kMs;
  core->on_heartbeat_tick(tick);
  const auto* h = lockd.body<wire::Heartbeat>(lockd.calls.size() - 1);
  ASSERT_NE(h, nullptr);
  ASSERT_EQ(h->entries.size(), 1u);
  EXPECT_EQ(h->entries[0].epoch, 5u);
  wire::HeartbeatAck ack;
  ack.entries.push_back(wire::HeartbeatAckEntry{name_id_of("job"), RefreshStatus::refreshed, {}, 5, kTtlMs});
  lockd.answer(lockd.calls.size() - 1, ack, tick, tick + kMs);
  EXPECT_EQ(rt.deadline[0], tick + kKillAfterMs * kMs);
  EXPECT_EQ(lockd.count<wire::Release>(), 0u);
  // A second release while it stops is answered with the first.
  core->on_request(10, release_of("job"), kT0 + 150 * kMs);
  EXPECT_EQ(host.terminated.size(), 1u);
  EXPECT_TRUE(control.answers.empty() || control.answers.back().first == 7u);
  host.exit_code = 15;  // it handled SIGTERM: exit(15)
  exits(sb, kT0 + 200 * kMs);
  EXPECT_TRUE(rt.kills.empty());
  const auto* r = lockd.body<wire::Release>(lockd.calls.size() - 1);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->epoch, 5u);
  const std::size_t answers = control.answers.size();
  lockd.answer(lockd.calls.size() - 1, wire::Ok{}, kT0 + 201 * kMs, kT0 + 202 * kMs);
  ASSERT_EQ(control.answers.size(), answers + 2);
  for (std::size_t i = answers; i < control.answers.size(); ++i) {
    const json& a = control.answers[i].second;
    EXPECT_EQ(a["ok"], true);
    EXPECT_EQ(a["released"], true);
    EXPECT_EQ(a["exit_status"], 15);
    EXPECT_EQ(a["exit_code"], 15);
    EXPECT_EQ(a["reason"], "released (exited after SIGTERM)");
  }
  EXPECT_EQ(core->counters().stops_graceful, 1u);
  EXPECT_EQ(core->counters().stops_grace_expired, 0u);
}

// One that does not exit is killed at the grace deadline, as a release without grace kills it.
TEST_F(SupervisorCoreTest, ASandboxStillRunningAtItsGraceDeadlineIsKilled) {
  make(SupervisorMode::lease, ShutdownPolicy::kill, 2000);
  const SandboxId sb = granted_run(5);
  const std::uint64_t asked = kT0 + 20 * kMs;
  core->on_request(9, release_of("job", 500), asked);  // its own grace, below the supervisor's
  core->check_stops(asked + 499 * kMs);
  EXPECT_TRUE(rt.kills.empty());
  core->check_stops(asked + 500 * kMs);
  EXPECT_EQ(rt.kills, std::vector<std::uint32_t>{0});
  EXPECT_LT(index_of("sigterm"), index_of("revoke slot=0"));
  EXPECT_LT(index_of("revoke slot=0"), index_of("rt_kill slot=0"));
  const Sandbox* s = core->sandboxes().find(sb);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->phase, SandboxPhase::killing);
  EXPECT_EQ(s->kill_reason, "released (still running at the end of its grace period after SIGTERM)");
  EXPECT_EQ(core->counters().stops_grace_expired, 1u);
  host.exit_code = -9;
  exits(sb, asked + 510 * kMs);
  lockd.answer(lockd.calls.size() - 1, wire::Ok{}, asked + 511 * kMs, asked + 512 * kMs);
  EXPECT_EQ(last_answer()["exit_status"], -9);
  EXPECT_EQ(last_answer()["exit_code"], 137);
  EXPECT_EQ(core->counters().stops_graceful, 0u);
}

// The grace period never delays the kill-switch: a heartbeat answered "lost" meanwhile kills at
// once, and the kill is the heartbeat's, not the release's.
TEST_F(SupervisorCoreTest, AHeartbeatLossDuringTheGracePeriodKillsAtOnce) {
  make(SupervisorMode::lease, ShutdownPolicy::kill, 2000);
  const SandboxId sb = granted_run(5);
  core->on_request(9, release_of("job"), kT0 + 20 * kMs);
  ASSERT_TRUE(rt.kills.empty());
  const std::uint64_t tick = kT0 + 100 * kMs;
  core->on_heartbeat_tick(tick);
  wire::HeartbeatAck ack;
  ack.entries.push_back(wire::HeartbeatAckEntry{name_id_of("job"), RefreshStatus::lost, SandboxId{0x99, 1}, 6, 0});
  lockd.answer(lockd.calls.size() - 1, ack, tick, tick + kMs);
  EXPECT_EQ(rt.kills, std::vector<std::uint32_t>{0});
  const Sandbox* s = core->sandboxes().find(sb);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->phase, SandboxPhase::killing);
  EXPECT_NE(s->kill_reason.find("heartbeat answer lost"), std::string::npos) << s->kill_reason;
  core->check_stops(kT0 + 5000 * kMs);  // the grace deadline passing changes nothing more
  EXPECT_EQ(rt.kills.size(), 1u);
  EXPECT_EQ(core->counters().stops_grace_expired, 0u);
}

// grace_ms 0 on a request kills at once; a larger one than --stop-grace-ms is capped by it.
TEST_F(SupervisorCoreTest, ARequestsGraceIsCappedByTheSupervisorsAndZeroKillsAtOnce) {
  make(SupervisorMode::lease, ShutdownPolicy::kill, 2000);
  core->on_request(3, run(std::nullopt), kT0);
  const SandboxId a{0x5b, ids};
  core->on_request(4, run(std::nullopt), kT0);
  const SandboxId b{0x5b, ids};
  ControlRequest now = op_on(ControlOp::kill, a);
  now.grace_ms = 0;
  core->on_request(5, now, kT0 + kMs);
  EXPECT_TRUE(host.terminated.empty());
  EXPECT_EQ(rt.kills.size(), 1u);
  ControlRequest capped = op_on(ControlOp::kill, b);
  capped.grace_ms = 60'000;
  core->on_request(6, capped, kT0 + kMs);
  EXPECT_EQ(host.terminated, std::vector<SandboxId>{b});
  EXPECT_EQ(core->sandboxes().find(b)->stop_deadline_ns, kT0 + kMs + 2000 * kMs);
}

// A shutdown stops sandboxes with the grace period too, and is quiescent only once they are gone.
TEST_F(SupervisorCoreTest, ShutdownSendsSigtermAndKillsWhatIsLeftAtTheGraceDeadline) {
  make(SupervisorMode::lease, ShutdownPolicy::kill, 1000);
  const SandboxId sb = granted_run(5);
  core->begin_shutdown("SIGTERM", kT0 + 50 * kMs);
  EXPECT_EQ(host.terminated, std::vector<SandboxId>{sb});
  EXPECT_TRUE(rt.kills.empty());
  EXPECT_FALSE(core->quiescent());
  core->on_heartbeat_tick(kT0 + 1050 * kMs);  // the tick checks the grace deadlines too
  EXPECT_EQ(rt.kills, std::vector<std::uint32_t>{0});
  EXPECT_EQ(core->sandboxes().find(sb)->kill_reason, "shutdown (still running at the end of its grace period after SIGTERM)");
}

// ---- wait ----------------------------------------------------------------------------------

TEST_F(SupervisorCoreTest, WaitIsAnsweredWhenTheSandboxIsGoneWithItsExitStatusAndReason) {
  make(SupervisorMode::lease);
  core->on_request(3, run(std::nullopt), kT0);
  const SandboxId sb{0x5b, ids};
  const std::size_t answers = control.answers.size();
  core->on_request(11, op_on(ControlOp::wait, sb), kT0 + kMs);
  EXPECT_EQ(control.answers.size(), answers);
  EXPECT_EQ(core->waits(), 1u);
  host.exit_code = 3;
  exits(sb, kT0 + 10 * kMs);
  ASSERT_EQ(control.answers.size(), answers + 1);
  EXPECT_EQ(control.answers.back().first, 11u);
  EXPECT_EQ(last_answer()["ok"], true);
  EXPECT_EQ(last_answer()["id"], 3);
  EXPECT_EQ(last_answer()["sandbox"], sb.str());
  EXPECT_EQ(last_answer()["exit_status"], 3);
  EXPECT_EQ(last_answer()["exit_code"], 3);
  EXPECT_EQ(last_answer()["reason"], "exited");
  EXPECT_EQ(core->waits(), 0u);
  // Asked again after it is gone: its owner's record answers at once.
  core->on_request(12, op_on(ControlOp::wait, sb), kT0 + 20 * kMs);
  EXPECT_EQ(control.answers.back().first, 12u);
  EXPECT_EQ(last_answer()["exit_status"], 3);
  EXPECT_EQ(last_answer()["reason"], "exited");
  // By another uid: forbidden, as logs and kill are.
  core->on_request(13, op_on(ControlOp::wait, sb, 2000), kT0 + 21 * kMs);
  EXPECT_EQ(last_answer()["error"], "forbidden");
  // Never here: not_found.
  core->on_request(14, op_on(ControlOp::wait, SandboxId{0x1, 0x2}), kT0 + 22 * kMs);
  EXPECT_EQ(last_answer()["error"], "not_found");
}

// A named sandbox's wait ends once its name is given back, also when the wait came after the
// exit but before lockd answered the Release; a kill's reason comes with it.
TEST_F(SupervisorCoreTest, WaitForANamedSandboxEndsAfterItsReleaseWithTheKillReason) {
  make(SupervisorMode::lease);
  const SandboxId sb = granted_run(5);
  core->on_request(11, op_on(ControlOp::wait, sb), kT0 + kMs);
  core->on_request(9, release_of("job"), kT0 + 20 * kMs);
  host.exit_code = -9;
  exits(sb, kT0 + 30 * kMs);
  ASSERT_NE(lockd.body<wire::Release>(lockd.calls.size() - 1), nullptr);
  const std::size_t answers = control.answers.size();
  core->on_request(12, op_on(ControlOp::wait, sb), kT0 + 31 * kMs);  // gone, its Release in flight
  EXPECT_EQ(control.answers.size(), answers);
  lockd.answer(lockd.calls.size() - 1, wire::Ok{}, kT0 + 31 * kMs, kT0 + 32 * kMs);
  ASSERT_EQ(control.answers.size(), answers + 3);
  std::vector<ControlClientId> who;
  for (std::size_t i = answers; i < control.answers.size(); ++i) {
    who.push_back(control.answers[i].first);
    EXPECT_EQ(control.answers[i].second["reason"], "released");
    EXPECT_EQ(control.answers[i].second["exit_code"], 137);
    EXPECT_EQ(control.answers[i].second["released"], true);
  }
  std::sort(who.begin(), who.end());
  EXPECT_EQ(who, (std::vector<ControlClientId>{9, 11, 12}));
  EXPECT_EQ(core->waits(), 0u);
}

// Waits are bounded per uid (and in total): the one over is refused busy, naming the bound; a
// waiting client that hangs up no longer counts.
TEST_F(SupervisorCoreTest, WaitsAreBoundedPerUidAndAClosedClientsWaitIsDropped) {
  make(SupervisorMode::lease);
  core->on_request(3, run(std::nullopt), kT0);
  const SandboxId sb{0x5b, ids};
  for (ControlClientId c = 100; c < 100 + kControlWaitsPerUidMax; ++c) core->on_request(c, op_on(ControlOp::wait, sb), kT0);
  EXPECT_EQ(core->waits(), kControlWaitsPerUidMax);
  const std::size_t answers = control.answers.size();
  core->on_request(200, op_on(ControlOp::wait, sb), kT0);
  ASSERT_EQ(control.answers.size(), answers + 1);
  EXPECT_EQ(last_answer()["error"], "busy");
  EXPECT_NE(last_answer()["message"].get<std::string>().find("per uid"), std::string::npos);
  EXPECT_EQ(core->counters().waits_refused, 1u);
  core->on_client_closed(100);
  EXPECT_EQ(core->waits(), kControlWaitsPerUidMax - 1);
  core->on_request(201, op_on(ControlOp::wait, sb), kT0);
  EXPECT_EQ(core->waits(), kControlWaitsPerUidMax);
  exits(sb, kT0 + 10 * kMs);
  // Every wait still open is answered; the closed client's is not.
  std::size_t to_closed = 0;
  for (const auto& [c, a] : control.answers) to_closed += c == 100 ? 1 : 0;
  EXPECT_EQ(to_closed, 0u);
  EXPECT_EQ(control.answers.size(), answers + 1 + kControlWaitsPerUidMax);
  EXPECT_EQ(core->waits(), 0u);
}


// ---- a run that waits its turn for its name (ControlRequest::queue) ----------------------------

namespace {
ControlRequest queued_run(const std::string& name, std::optional<std::uint64_t> timeout_ms = std::nullopt) {
  ControlRequest r;
  r.op = ControlOp::run;
  r.id = 9;
  r.name = name;
  r.argv = {"/bin/sleep", "60"};
  r.caller_uid = 1000;
  r.queue = true;
  r.queue_timeout_ms = timeout_ms;
  return r;
}
}  // namespace

// Lease mode: Wait → Queued (nothing starts, the place is renewed each tick) → lockd's pushed
// 2-phase grant → Commit → Held → the sandbox starts and the run is answered.
TEST_F(SupervisorCoreTest, AQueuedRunWaitsItsTurnThenCommitsAndStarts) {
  make(SupervisorMode::lease);
  core->on_request(7, queued_run("job"), kT0);
  ASSERT_EQ(lockd.calls.size(), 1u);
  const auto* w = lockd.body<wire::Wait>(0);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->name, "job");
  EXPECT_EQ(w->worker, (WorkerId{0x77, 0x1}));
  EXPECT_EQ(w->ttl_ms, kTtlMs);
  const SandboxId sb = w->sandbox;
  lockd.answer(0, wire::Queued{name_id_of("job"), 2, 2, SandboxId{0x99, 1}, WorkerId{0x88, 1}, 7, LockPhase::held, kTtlMs},
               kT0, kT0 + kMs);
  EXPECT_TRUE(host.created.empty());
  EXPECT_TRUE(control.answers.empty());
  EXPECT_EQ(core->waits(), 1u);  // a waiting connection counts against the bound of `wait`
  const json listed = sandbox_list_json(*core, 0, kT0 + kMs);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0]["state"], "queued");
  EXPECT_EQ(listed[0]["queued_for"], "job");
  EXPECT_EQ(listed[0]["queue_position"], 2);
  EXPECT_EQ(listed[0]["queue_waiters"], 2);
  // Its client learns the place before the answer.
  ASSERT_EQ(control.progress_lines.size(), 1u);
  EXPECT_EQ(control.progress_lines[0].first, 7u);
  EXPECT_EQ(control.progress_lines[0].second["progress"], "queued");
  EXPECT_EQ(control.progress_lines[0].second["position"], 2);
  EXPECT_EQ(control.progress_lines[0].second["holder"], (SandboxId{0x99, 1}).str());
  EXPECT_TRUE(is_control_progress(control.progress_lines[0].second));
  // Each heartbeat tick renews the place: an entry at epoch 0 in the tick's heartbeat.
  auto renewal = [&](std::uint64_t at) -> std::size_t {
    core->on_heartbeat_tick(at);
    const std::size_t beat = lockd.calls.size() - 1;
    const auto* h = lockd.body<wire::Heartbeat>(beat);
    EXPECT_NE(h, nullptr);
    if (h == nullptr) return beat;
    EXPECT_EQ(h->entries.size(), 1u);
    EXPECT_EQ(h->entries.at(0), (wire::HeartbeatEntry{name_id_of("job"), sb, 0}));
    return beat;
  };
  const std::uint64_t tick1 = kT0 + kIntervalMs * kMs;
  wire::HeartbeatAck kept;
  kept.entries.push_back(wire::HeartbeatAckEntry{name_id_of("job"), RefreshStatus::queued, SandboxId{0x99, 1}, 7, kTtlMs});
  lockd.answer(renewal(tick1), kept, tick1, tick1 + kMs);
  EXPECT_EQ(lockd.count<wire::Wait>(), 1u) << "kept, the line under the same holder: no Wait";
  EXPECT_EQ(core->counters().places_renewed, 1u);
  // lockd no longer has the place (it restarted, say): a Wait re-joins, and tells the new place.
  const std::uint64_t tick2 = tick1 + kIntervalMs * kMs;
  wire::HeartbeatAck missing;
  missing.entries.push_back(wire::HeartbeatAckEntry{name_id_of("job"), RefreshStatus::lost, SandboxId{0x99, 1}, 7, 0});
  lockd.answer(renewal(tick2), missing, tick2, tick2 + kMs);
  EXPECT_EQ(core->counters().places_lost, 1u);
  ASSERT_EQ(lockd.count<wire::Wait>(), 2u);
  const std::size_t again = lockd.calls.size() - 1;
  ASSERT_NE(lockd.body<wire::Wait>(again), nullptr);
  lockd.answer(again, wire::Queued{name_id_of("job"), 1, 1, SandboxId{0x99, 1}, WorkerId{0x88, 1}, 7, LockPhase::held, kTtlMs},
               tick2 + kMs, tick2 + 2 * kMs);
  ASSERT_EQ(control.progress_lines.size(), 2u);  // moved up: told again
  EXPECT_EQ(control.progress_lines[1].second["position"], 1);
  // lockd pushes the grant as a late answer to that Wait.
  const std::uint64_t t = tick2 + 3 * kMs;
  core->on_late_answer(wire::Grant{name_id_of("job"), 8, sb, WorkerId{0x77, 0x1}, LockPhase::acquiring, 5000, {}}, t);
  const std::size_t commit = lockd.calls.size() - 1;
  const auto* c = lockd.body<wire::Commit>(commit);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->epoch, 8u);
  EXPECT_EQ(c->sandbox, sb);
  EXPECT_TRUE(host.created.empty()) << "lease mode starts only once the name is Held";
  lockd.answer(commit, wire::Grant{name_id_of("job"), 8, sb, WorkerId{0x77, 0x1}, LockPhase::held, kTtlMs, {}}, t, t + kMs);
  ASSERT_EQ(host.created.size(), 1u);
  EXPECT_EQ(host.created[0].epoch, 8u);
  ASSERT_EQ(control.answers.size(), 1u);
  EXPECT_EQ(control.answers[0].first, 7u);
  EXPECT_EQ(last_answer()["ok"], true);
  EXPECT_EQ(last_answer()["epoch"], 8);
  EXPECT_EQ(core->waits(), 0u);
  EXPECT_EQ(core->counters().queue_grants, 1u);
  // No more Waits, nor places, once granted: the tick's heartbeat carries the lease alone.
  core->on_heartbeat_tick(t + kIntervalMs * kMs);
  EXPECT_EQ(lockd.count<wire::Wait>(), 2u);
  const auto* h = lockd.body<wire::Heartbeat>(lockd.calls.size() - 1);
  ASSERT_NE(h, nullptr);
  ASSERT_EQ(h->entries.size(), 1u);
  EXPECT_EQ(h->entries[0].epoch, 8u);
}

// A place rides in the same heartbeat datagram as the worker's leases (after them), and the
// answer's entries are taken apart in that order.
TEST_F(SupervisorCoreTest, APlaceIsRenewedInTheSameDatagramAsTheLeases) {
  make(SupervisorMode::lease);
  core->on_request(6, run("held"), kT0);
  const auto* a = lockd.body<wire::Acquire>(0);
  ASSERT_NE(a, nullptr);
  const SandboxId holder = a->sandbox;
  lockd.answer(0, wire::Grant{name_id_of("held"), 3, holder, WorkerId{0x77, 0x1}, LockPhase::held, kTtlMs, {}}, kT0, kT0 + kMs);
  core->on_request(7, queued_run("job"), kT0 + kMs);
  const auto* w = lockd.body<wire::Wait>(lockd.calls.size() - 1);
  ASSERT_NE(w, nullptr);
  const SandboxId waiter = w->sandbox;
  lockd.answer(lockd.calls.size() - 1,
               wire::Queued{name_id_of("job"), 1, 1, SandboxId{0x99, 1}, WorkerId{0x88, 1}, 7, LockPhase::held, kTtlMs},
               kT0 + kMs, kT0 + 2 * kMs);
  const std::size_t calls = lockd.calls.size();
  const std::uint64_t tick = kT0 + kIntervalMs * kMs;
  core->on_heartbeat_tick(tick);
  ASSERT_EQ(lockd.calls.size(), calls + 1) << "one datagram for the lease and the place";
  const auto* h = lockd.body<wire::Heartbeat>(calls);
  ASSERT_NE(h, nullptr);
  ASSERT_EQ(h->entries.size(), 2u);
  EXPECT_EQ(h->entries[0], (wire::HeartbeatEntry{name_id_of("held"), holder, 3}));
  EXPECT_EQ(h->entries[1], (wire::HeartbeatEntry{name_id_of("job"), waiter, 0}));
  wire::HeartbeatAck ack;
  ack.entries.push_back(wire::HeartbeatAckEntry{name_id_of("held"), RefreshStatus::refreshed, {}, 3, kTtlMs});
  ack.entries.push_back(wire::HeartbeatAckEntry{name_id_of("job"), RefreshStatus::queued, SandboxId{0x99, 1}, 7, kTtlMs});
  lockd.answer(calls, ack, tick, tick + kMs);
  EXPECT_EQ(core->counters().refreshed, 1u);
  EXPECT_EQ(core->counters().places_renewed, 1u);
  EXPECT_EQ(lockd.calls.size(), calls + 1) << "nothing else asked";
  EXPECT_EQ(host.created.size(), 1u) << "the waiter has not started";
}

// A queued run that reaches its deadline leaves lockd's FIFO (Release with epoch 0) and is
// answered `timeout`, naming its place; nothing started.
TEST_F(SupervisorCoreTest, AQueuedRunGivesUpAtItsTimeoutAndLeavesTheQueue) {
  make(SupervisorMode::lease);
  core->on_request(7, queued_run("job", 150), kT0);
  lockd.answer(0, wire::Queued{name_id_of("job"), 3, 3, SandboxId{0x99, 1}, WorkerId{0x88, 1}, 7, LockPhase::held, kTtlMs},
               kT0, kT0 + kMs);
  core->on_heartbeat_tick(kT0 + 200 * kMs);
  const auto* leave = lockd.body<wire::Release>(lockd.calls.size() - 1);
  ASSERT_NE(leave, nullptr);
  EXPECT_EQ(leave->epoch, 0u);
  EXPECT_EQ(leave->name_id, name_id_of("job"));
  ASSERT_EQ(control.answers.size(), 1u);
  EXPECT_EQ(last_answer()["error"], "timeout");
  EXPECT_NE(last_answer()["message"].get<std::string>().find("at position 3 of 3"), std::string::npos) << last_answer();
  EXPECT_TRUE(host.created.empty());
  EXPECT_EQ(core->sandboxes().size(), 0u);
  EXPECT_EQ(core->counters().queue_timeouts, 1u);
  EXPECT_EQ(core->waits(), 0u);
}

// The client of a queued run goes away: its place is given up. If it goes away after the grant,
// the sandbox is stopped as soon as it has started (nobody would watch it hold the name).
TEST_F(SupervisorCoreTest, AQueuedRunWhoseClientLeftIsNotLeftRunning) {
  make(SupervisorMode::lease);
  core->on_request(7, queued_run("job"), kT0);
  lockd.answer(0, wire::Queued{name_id_of("job"), 1, 1, SandboxId{0x99, 1}, WorkerId{0x88, 1}, 7, LockPhase::held, kTtlMs},
               kT0, kT0 + kMs);
  core->on_client_closed(7);
  ASSERT_NE(lockd.body<wire::Release>(lockd.calls.size() - 1), nullptr);
  EXPECT_EQ(lockd.body<wire::Release>(lockd.calls.size() - 1)->epoch, 0u);
  EXPECT_EQ(core->sandboxes().size(), 0u);

  // Second run: the client leaves between the grant and the start.
  core->on_request(8, queued_run("job"), kT0 + 10 * kMs);
  const std::size_t wait = lockd.calls.size() - 1;
  const SandboxId sb = lockd.body<wire::Wait>(wait)->sandbox;
  lockd.answer(wait, wire::Grant{name_id_of("job"), 9, sb, WorkerId{0x77, 0x1}, LockPhase::acquiring, 5000, {}},
               kT0 + 10 * kMs, kT0 + 11 * kMs);
  core->on_client_closed(8);
  const std::size_t commit = lockd.calls.size() - 1;
  ASSERT_NE(lockd.body<wire::Commit>(commit), nullptr);
  lockd.answer(commit, wire::Grant{name_id_of("job"), 9, sb, WorkerId{0x77, 0x1}, LockPhase::held, kTtlMs, {}},
               kT0 + 11 * kMs, kT0 + 12 * kMs);
  ASSERT_EQ(host.created.size(), 1u);
  EXPECT_TRUE(core->sandboxes().find(sb) == nullptr || kill_asked_or_gone(core->sandboxes().find(sb)->phase))
      << "started for a client that left, and left running";
  for (const auto& [client, answer] : control.answers) EXPECT_NE(client, 8u) << answer;

  // Third run: the client closed during the start itself, and the close has not been handed
  // over when the answer is ready (the spawn ran first): the answer finds it gone.
  core->on_request(9, queued_run("job3"), kT0 + 20 * kMs);
  const std::size_t wait3 = lockd.calls.size() - 1;
  const SandboxId sb3 = lockd.body<wire::Wait>(wait3)->sandbox;
  lockd.answer(wait3, wire::Grant{name_id_of("job3"), 10, sb3, WorkerId{0x77, 0x1}, LockPhase::acquiring, 5000, {}},
               kT0 + 20 * kMs, kT0 + 21 * kMs);
  control.gone.insert(9);
  const std::size_t commit3 = lockd.calls.size() - 1;
  ASSERT_NE(lockd.body<wire::Commit>(commit3), nullptr);
  lockd.answer(commit3, wire::Grant{name_id_of("job3"), 10, sb3, WorkerId{0x77, 0x1}, LockPhase::held, kTtlMs, {}},
               kT0 + 21 * kMs, kT0 + 22 * kMs);
  ASSERT_EQ(host.created.size(), 2u);
  EXPECT_TRUE(core->sandboxes().find(sb3) == nullptr || kill_asked_or_gone(core->sandboxes().find(sb3)->phase))
      << "started for a client that had closed, and left running";
}

// A client found gone by the write of its progress line is reported closed during that write:
// its run leaves the FIFO then, and nothing of it is touched afterwards (the next run, moved
// into its place in queued_, would be).
TEST_F(SupervisorCoreTest, AClientFoundGoneByItsProgressLineLeavesTheLine) {
  make(SupervisorMode::lease);
  core->on_request(7, queued_run("job"), kT0);
  ControlRequest other = queued_run("job");
  other.id = 10;
  core->on_request(8, other, kT0);
  const SandboxId a = lockd.body<wire::Wait>(0)->sandbox, b = lockd.body<wire::Wait>(1)->sandbox;
  lockd.answer(1, wire::Queued{name_id_of("job"), 3, 3, SandboxId{0x99, 1}, WorkerId{0x88, 1}, 7, LockPhase::held, kTtlMs},
               kT0, kT0 + kMs);
  control.on_progress = [&](ControlClientId c) {
    if (c == 7) core->on_client_closed(c);
  };
  lockd.answer(0, wire::Queued{name_id_of("job"), 2, 3, SandboxId{0x99, 1}, WorkerId{0x88, 1}, 7, LockPhase::held, kTtlMs},
               kT0 + kMs, kT0 + 2 * kMs);
  const auto* leave = lockd.body<wire::Release>(lockd.calls.size() - 1);
  ASSERT_NE(leave, nullptr);
  EXPECT_EQ(leave->sandbox, a);
  EXPECT_EQ(leave->epoch, 0u);
  EXPECT_FALSE(core->queue_place(a).has_value());
  // The other run keeps its own place, not the one told to the run that left.
  ASSERT_TRUE(core->queue_place(b).has_value());
  EXPECT_EQ(core->queue_place(b)->position, 3u);
}

// Members of --group (uids other than root and the supervisor's) wait on at most
// kControlWaitsMax - kControlWaitsReserved places together: root still waits. And a run that will
// be waited for (`attach`) is refused before it starts when its caller could not wait now.
TEST_F(SupervisorCoreTest, WaitPlacesAreKeptForRootAndARunThatCouldNotBeWaitedForStartsNothing) {
  make(SupervisorMode::lease);
  // One sandbox of each member (a caller waits on its own sandboxes), and one of uid 2999.
  auto own = [&](uid_t uid) {
    ControlRequest r = run(std::nullopt);
    r.caller_uid = uid;
    core->on_request(3, r, kT0);
    return SandboxId{0x5b, ids};
  };
  const std::size_t members = (kControlWaitsMax - kControlWaitsReserved) / kControlWaitsPerUidMax;
  ControlClientId c = 100;
  for (std::size_t m = 0; m < members; ++m) {
    const uid_t uid = static_cast<uid_t>(2000 + m);
    const SandboxId sb = own(uid);
    for (std::size_t i = 0; i < kControlWaitsPerUidMax; ++i) core->on_request(c++, op_on(ControlOp::wait, sb, uid), kT0);
  }
  ASSERT_EQ(core->waits(), kControlWaitsMax - kControlWaitsReserved);
  const SandboxId late = own(2999);
  core->on_request(c++, op_on(ControlOp::wait, late, 2999), kT0);
  EXPECT_EQ(last_answer()["error"], "busy");
  EXPECT_NE(last_answer()["message"].get<std::string>().find("are kept for root and the supervisor's user"), std::string::npos)
      << last_answer();
  EXPECT_EQ(core->waits(), kControlWaitsMax - kControlWaitsReserved);
  core->on_request(c++, op_on(ControlOp::wait, late, 0), kT0);  // root
  EXPECT_EQ(core->waits(), kControlWaitsMax - kControlWaitsReserved + 1);

  ControlRequest attached = run(std::nullopt);
  attached.caller_uid = 2999;
  attached.attach = true;
  const std::size_t sandboxes = core->sandboxes().size();
  core->on_request(c++, attached, kT0);
  EXPECT_EQ(last_answer()["error"], "busy");
  EXPECT_NE(last_answer()["message"].get<std::string>().find("nothing started"), std::string::npos) << last_answer();
  EXPECT_EQ(core->sandboxes().size(), sandboxes);
}

}  // namespace
}  // namespace leasehold
