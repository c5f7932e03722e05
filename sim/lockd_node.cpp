#include "leasehold/sim/lockd_node.hpp"

#include "leasehold/wire/protocol.hpp"
#include "leasehold/wire/replay.hpp"
#include "leasehold/io/udp.hpp"

#include <algorithm>
#include <deque>
#include <vector>

namespace leasehold::sim {
namespace {

constexpr std::int64_t kTickNs = 20 * kMs;  ///< expiry / housekeeping cadence when idle

LeaseConfig lease_config_of(const SimConfig& cfg) {
  LeaseConfig c;
  c.default_ttl_ns = cfg.ttl_ns;
  c.max_ttl_ns = cfg.ttl_ns;
  c.acquiring_ttl_ns = cfg.ttl_ns;
  c.capacity = 1024;
  return c;
}

std::uint32_t ms_left(std::int64_t expiry_ns, std::int64_t now_ns) {
  return expiry_ns <= now_ns ? 0 : static_cast<std::uint32_t>((expiry_ns - now_ns) / kMs);
}

}  // namespace

struct LockdNode::Impl {
  struct Deferred {
    std::uint64_t seq = 0;
    std::uint32_t to = 0;
    WorkerId worker;
    std::uint16_t key_id = 0;
    std::uint64_t request_id = 0;
    wire::RequestKey key;
    wire::Body body;
  };

  Impl(const SimConfig& c, const wire::WireKey& cluster, LockdEnv& e, SimDisk& d, std::int64_t now)
      : cfg(c),
        env(e),
        disk(d),
        table(lease_config_of(c)),
        receiver(
            [&cluster]() -> std::unique_ptr<wire::Keyring> {
              auto ring = std::make_unique<wire::ClusterKeyring>();
              ring->add(cluster);
              return ring;
            }(),
            wire::Receiver::Limits{}),
        sender(WorkerId{0x10cd, 0x10cd}, 1, cluster) {
    if (const std::string why = table.restore(disk.durable(), now); !why.empty())
      throw std::runtime_error("sim lockd: restore failed: " + why);
    change_seq = disk.durable_seq();
  }

  const SimConfig& cfg;
  LockdEnv& env;
  SimDisk& disk;
  LeaseTable table;
  wire::Receiver receiver;
  wire::Sender sender;
  std::uint64_t change_seq = 0;
  std::uint64_t submitted_seq = 0;
  bool dirty = false;
  std::deque<Deferred> deferred;
  std::vector<Expiry> expired;

  void changed() {
    ++change_seq;
    dirty = true;
  }

  void advance(std::int64_t now) {
    for (;;) {
      expired.clear();
      const std::size_t n = table.advance(now, expired);
      if (n != 0) changed();
      if (n < kAdvanceBatchMax) break;
    }
  }

  void send(std::uint32_t to, WorkerId worker, std::uint16_t key_id, std::uint64_t rid,
            const wire::RequestKey* key, const wire::Body& body) {
    const wire::Authenticator* auth = receiver.keyring().find(worker, key_id).auth;
    if (auth == nullptr) return;
    wire::Datagram dg;
    if (!sender.seal_with(*auth, key_id, rid, body, dg)) return;
    if (key != nullptr) receiver.remember_answer(*key, dg.view(), SocketAddress::loopback_v4(static_cast<std::uint16_t>(1000 + to)));
    env.send_to_worker(to, dg.view());
  }

  /// The durability rule: answers after every change so far is durable.
  void answer_gated(std::uint32_t to, const wire::Admission& a, wire::Body body, std::int64_t now) {
    const WorkerId w = a.message.header.sender;
    if (change_seq > disk.durable_seq()) {
      receiver.defer(a.key, now);
      deferred.push_back(Deferred{change_seq, to, w, a.key_id, a.message.header.request_id, a.key, std::move(body)});
      return;
    }
    send(to, w, a.key_id, a.message.header.request_id, &a.key, body);
  }

  wire::Body grant_or_deny(const Outcome& o) {
    if (!o.ok())
      return wire::Deny{o.name, o.refusal, o.state.owner, o.state.worker, o.state.epoch,
                        static_cast<wire::LockState>(o.state.phase)};
    return wire::Grant{o.name, o.state.epoch, o.state.owner, o.state.worker, static_cast<wire::LockState>(o.state.phase),
                       static_cast<std::uint32_t>(table.config().default_ttl_ns / kMs), {}};
  }

  void dispatch(std::uint32_t from, const wire::Admission& a, std::int64_t now) {
    const WorkerId caller = a.message.header.sender;
    const bool worker_key = a.authority == wire::Authority::worker;
    if (const auto* q = std::get_if<wire::Acquire>(&a.message.body)) {
      if (!worker_key || q->worker != caller) {
        answer_gated(from, a, wire::Deny{name_id_of(q->name), Refusal::forbidden, {}, {}, 0, wire::LockState::free}, now);
        return;
      }
      const LockState before = table.state(name_id_of(q->name));
      const Outcome o = table.acquire(q->name, q->sandbox, q->worker, now, static_cast<std::int64_t>(q->ttl_ms) * kMs);
      if (o.ok() && !(before == o.state)) changed();
      answer_gated(from, a, grant_or_deny(o), now);
    } else if (const auto* h = std::get_if<wire::Heartbeat>(&a.message.body)) {
      std::vector<RefreshEntry> entries;
      for (const auto& e : h->entries) entries.push_back(RefreshEntry{e.name_id, e.sandbox, e.epoch});
      std::vector<RefreshAnswer> answers(entries.size());
      const Refusal r = table.refresh(caller, entries, now, answers, table.config().default_ttl_ns);
      if (r != Refusal::none) return;
      wire::HeartbeatAck ack;
      for (std::size_t i = 0; i < entries.size(); ++i) {
        wire::HeartbeatAckEntry e;
        e.name_id = entries[i].name;
        e.status = static_cast<wire::HeartbeatStatus>(answers[i].status);
        e.holder = answers[i].holder;
        e.epoch = answers[i].epoch;
        if (answers[i].status == RefreshStatus::refreshed) e.ttl_left_ms = ms_left(answers[i].expiry_ns, now);
        ack.entries.push_back(e);
      }
      send(from, caller, a.key_id, a.message.header.request_id, nullptr, ack);  // not cached
    } else if (const auto* rl = std::get_if<wire::Release>(&a.message.body)) {
      const LockState before = table.state(rl->name_id);
      const Outcome o = table.release(rl->name_id, rl->sandbox, rl->epoch, now);
      if (o.ok() && !(before == o.state)) changed();
      answer_gated(from, a,
                   o.ok() ? wire::Body{wire::Ok{rl->name_id, o.state.epoch}}
                          : wire::Body{wire::Deny{rl->name_id, o.refusal, o.state.owner, o.state.worker,
                                                  o.state.epoch, static_cast<wire::LockState>(o.state.phase)}},
                   now);
    } else {
      send(from, caller, a.key_id, a.message.header.request_id, nullptr,
           wire::Error{wire::ErrorCode::unsupported, "not served by the simulated lockd", 0});
    }
  }

  void flush(std::int64_t now) {
    const std::uint64_t durable = disk.durable_seq();
    while (!deferred.empty() && deferred.front().seq <= durable) {
      Deferred d = std::move(deferred.front());
      deferred.pop_front();
      send(d.to, d.worker, d.key_id, d.request_id, &d.key, d.body);
    }
    if (dirty && !disk.busy()) {
      if (disk.submit(SimBatch{change_seq, table.export_durable()})) {
        submitted_seq = change_seq;
        dirty = false;
        env.disk_submitted();
      }
    }
    (void)now;
  }
};

LockdNode::LockdNode(const SimConfig& cfg, const wire::WireKey& cluster_key, LockdEnv& env, SimDisk& disk,
                     std::int64_t now_ns)
    : impl_(std::make_unique<Impl>(cfg, cluster_key, env, disk, now_ns)) {}

LockdNode::~LockdNode() = default;

const LeaseTable& LockdNode::table() const noexcept { return impl_->table; }

void LockdNode::on_datagram(std::span<const std::uint8_t> bytes, std::uint32_t from, std::int64_t now_ns) {
  Impl& m = *impl_;
  m.advance(now_ns);
  const SocketAddress src = SocketAddress::loopback_v4(static_cast<std::uint16_t>(1000 + from));
  wire::Admission a = m.receiver.admit(bytes, &src, now_ns);
  switch (a.verdict) {
    case wire::Verdict::drop: break;
    case wire::Verdict::resend: m.env.send_to_worker(from, a.cached_answer); break;
    case wire::Verdict::answer_error:
      m.send(from, a.message.header.sender, a.key_id, a.message.header.request_id, nullptr, wire::error_answer(a));
      break;
    case wire::Verdict::deliver: m.dispatch(from, a, now_ns); break;
  }
  m.flush(now_ns);
}

std::int64_t LockdNode::tick(std::int64_t now_ns) {
  Impl& m = *impl_;
  m.advance(now_ns);
  m.flush(now_ns);
  return now_ns + kTickNs;
}

}  // namespace leasehold::sim
