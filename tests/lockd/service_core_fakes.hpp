// Test rig for LockService as a core: a fake DatagramPort that records every datagram sent, a
// fake DurabilityPort whose verdicts the test gives on demand, and a worker that speaks to the
// service with its own derived key. No socket, thread, file or clock.
#pragma once

#include "leasehold/wire/auth.hpp"
#include "leasehold/io/clock.hpp"
#include "leasehold/io/ports.hpp"
#include "leasehold/wire/protocol.hpp"
#include "leasehold/wire/replay.hpp"
#include "leasehold/lockd/config.hpp"
#include "leasehold/lockd/durability.hpp"
#include "leasehold/lockd/service.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace leasehold::lockd::test {

inline SandboxId sandbox(std::uint64_t n) { return SandboxId{0x5b5b, n}; }

struct FakeNet final : DatagramPort {
  struct Sent {
    SocketAddress to;
    std::vector<std::uint8_t> bytes;
  };
  std::vector<Sent> sent;
  bool send(const SocketAddress& to, std::span<const std::uint8_t> bytes) override {
    sent.push_back(Sent{to, {bytes.begin(), bytes.end()}});
    return true;
  }
};

/// Takes every batch; verdict(i, kind) makes batch i's verdicts available to the next poll.
struct FakeDisk final : DurabilityPort {
  std::vector<DurableBatch> submitted;
  std::vector<bool> durable;
  std::vector<DurabilityVerdict> ready;
  bool busy = false;
  bool submit(DurableBatch&& b) override {
    if (busy) return false;
    submitted.push_back(std::move(b));
    durable.push_back(false);
    return true;
  }
  void poll(std::vector<DurabilityVerdict>& out) override {
    out.insert(out.end(), ready.begin(), ready.end());
    ready.clear();
  }
  void verdict(std::size_t i, DurabilityVerdict::Kind kind, const std::string& why = {}) {
    ASSERT_LT(i, submitted.size());
    for (std::uint64_t s = submitted[i].first_seq; s <= submitted[i].last_seq; ++s)
      ready.push_back(DurabilityVerdict{s, kind, why});
    durable[i] = kind == DurabilityVerdict::Kind::durable;
  }
  /// What a store would load after the durable batches (names by id, the latest row; marks).
  StoredTable apply_durable() const {
    StoredTable t;
    std::map<NameId, StoredName> rows;
    for (std::size_t i = 0; i < submitted.size(); ++i) {
      if (!durable[i]) continue;
      const DurableBatch& b = submitted[i];
      for (const StoredName& n : b.changes) rows[n.id] = n;
      t.epoch_high_water = std::max(t.epoch_high_water, b.epoch_high_water);
      if (b.marks.lived_ns >= 0) t.lived_ns[b.marks.incarnation] = b.marks.lived_ns;
      for (const std::uint64_t j : b.marks.drop_lived) t.lived_ns.erase(j);
      for (const WorkerId& w : b.marks.seen) t.seen[w] = b.marks.incarnation;
      for (const auto& [w, seq] : b.marks.replay_floor) t.replay_floor[w] = std::max(t.replay_floor[w], seq);
    }
    for (auto& [id, n] : rows) t.names.push_back(n);
    return t;
  }
};

inline wire::WireKey cluster_key() { return wire::WireKey(std::vector<std::uint8_t>(32, 0x42)); }

/// One LockService on fake ports, and worker `worker` speaking to it from `worker_address`.
struct CoreRig {
  explicit CoreRig(std::int64_t now_ns, const StoredTable& stored = {}, std::uint64_t incarnation = 1,
                   LockdConfig c = {}, ServiceSeeds seeds = ServiceSeeds{WorkerId{0x10cd, 1}, 1, {}})
      : cfg(std::move(c)),
        worker_key(wire::derive_worker_key(cluster_key(), worker)),
        client(worker, 1, worker_key),
        worker_auth(worker_key) {
    cfg.store_path = "fake";
    RestoredTable r;
    r.stored = stored;
    r.incarnation = incarnation;
    service = std::make_unique<LockService>(cfg, std::vector<wire::WireKey>{cluster_key()}, r, net, disk, now_ns,
                                            seeds);
  }

  std::vector<std::uint8_t> seal(const wire::Body& body) {
    wire::Datagram dg;
    EXPECT_TRUE(client.seal(next_request_id++, body, dg));
    const auto v = dg.view();
    return {v.begin(), v.end()};
  }
  std::vector<std::uint8_t> acquire(const std::string& name, SandboxId sb, std::uint32_t ttl_ms = 0,
                                    bool two_phase = false) {
    wire::Acquire a;
    a.name = name;
    a.sandbox = sb;
    a.worker = worker;
    a.ttl_ms = ttl_ms;
    a.two_phase = two_phase;
    return seal(a);
  }
  void deliver(const std::vector<std::uint8_t>& bytes, std::int64_t now_ns) {
    service->on_datagram(bytes, worker_address, now_ns);
  }
  /// The body of an answer lockd sent to the worker (authenticated with the worker's key).
  wire::Body decode(const std::vector<std::uint8_t>& bytes) {
    wire::DecodeResult r = wire::decode(bytes, &worker_auth);
    EXPECT_TRUE(r) << r.detail;
    return r.body;
  }
  /// Sends the pending changes and makes every submitted batch durable.
  void settle(std::int64_t now_ns) {
    service->tick(now_ns);
    for (std::size_t i = 0; i < disk.submitted.size(); ++i)
      if (!disk.durable[i]) disk.verdict(i, DurabilityVerdict::Kind::durable);
    service->tick(now_ns);
  }

  LockdConfig cfg;
  FakeNet net;
  FakeDisk disk;
  WorkerId worker{0x77, 1};
  SocketAddress worker_address = SocketAddress::loopback_v4(40001);
  wire::WireKey worker_key;
  wire::Sender client;
  wire::Authenticator worker_auth;
  std::uint64_t next_request_id = 1;
  std::unique_ptr<LockService> service;
};

}  // namespace leasehold::lockd::test
