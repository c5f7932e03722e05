// Sample messages of every wire type, with non-default values in every field, for round-trip
// tests and the fuzz seed corpus.
#pragma once

#include "leasehold/wire/protocol.hpp"

#include <vector>

namespace leasehold::wire::samples {

inline NameId nid(std::uint64_t n) { return NameId{0x1111000000000000ULL + n, 0xAAAA + n}; }
inline SandboxId sid(std::uint64_t n) { return SandboxId{0x2222000000000000ULL + n, 0xBBBB + n}; }
inline WorkerId wid(std::uint64_t n) { return WorkerId{0x3333000000000000ULL + n, 0xCCCC + n}; }

inline NameRecord record(std::uint64_t n) {
  NameRecord r;
  r.name = "jobs/etl-" + std::to_string(n);
  r.name_id = name_id_of(r.name);
  r.state = LockPhase::held;
  r.holder = sid(n);
  r.worker = wid(n);
  r.epoch = 1000 + n;
  r.ttl_left_ms = 4000 + static_cast<std::uint32_t>(n);
  r.reserved_for = sid(n + 100);
  r.revoke_pending = n % 2 == 1;
  r.revoked_epoch = 900 + n;
  r.reservation_left_ms = 7000 + static_cast<std::uint32_t>(n);
  r.revoke_ended = n % 2 == 1 ? RevokeEnd::none : RevokeEnd::kill_confirmed;
  return r;
}

/// One body of every type (in MessageType order, answers after requests).
inline std::vector<Body> every_type() {
  std::vector<Body> v;
  v.push_back(Acquire{"db/primary:shard-7", sid(1), wid(1), 5000, true});
  v.push_back(Commit{nid(2), sid(2), 42, wid(2)});
  Heartbeat hb;
  hb.ttl_cap_ms = 3000;
  for (std::uint64_t i = 0; i < 5; ++i) hb.entries.push_back(HeartbeatEntry{nid(i), sid(i), 7 + i});
  hb.entries.push_back(HeartbeatEntry{nid(6), sid(6), 0});  // a waiter's place
  v.push_back(hb);
  v.push_back(Release{nid(3), sid(3), 43});
  v.push_back(TransferBegin{nid(4), sid(4), 44, sid(5), wid(5)});
  v.push_back(TransferComplete{nid(5), 45});
  v.push_back(TransferAccept{nid(6), sid(6), wid(6)});
  v.push_back(Revoke{nid(7), 47, true});
  v.push_back(Reassign{nid(8), sid(8), wid(8)});
  WorkerHeartbeat beat{wid(9), {}};
  beat.held.push_back(HeartbeatEntry{nid(9), sid(9), 49});
  beat.held.push_back(HeartbeatEntry{nid(10), sid(10), 50});
  v.push_back(beat);
  v.push_back(IsRunning{nid(10), sid(10), 50});
  v.push_back(List{77, 20, false});
  v.push_back(List{78, 0, true});
  v.push_back(Show{"svc.a/b_c", NameId{}, std::nullopt});
  v.push_back(Show{"", nid(12), std::nullopt});
  v.push_back(Show{"svc.q", NameId{}, 25});
  v.push_back(Stats{});
  v.push_back(Revoked{nid(20), 60, 61});
  v.push_back(KillConfirmed{nid(21), sid(21), 62});
  v.push_back(Wait{"queue/game-server-3", sid(23), wid(23), 4000});
  v.push_back(Grant{nid(13), 53, sid(13), wid(13), LockPhase::acquiring, 1500, {}});
  {
    // A grant carrying a token (the bytes need not be a valid signature for the codec).
    Grant signed_grant{nid(16), 56, sid(16), wid(16), LockPhase::held, 3000, {}};
    for (std::size_t i = 0; i < token::kTokenBytes; ++i) signed_grant.token.push_back(static_cast<std::uint8_t>(i * 7));
    v.push_back(signed_grant);
  }
  v.push_back(Deny{nid(14), Refusal::held, sid(14), wid(14), 54, LockPhase::held});
  HeartbeatAck ack;
  ack.entries.push_back(HeartbeatAckEntry{nid(1), RefreshStatus::refreshed, sid(1), 8, 2900});
  ack.entries.push_back(HeartbeatAckEntry{nid(2), RefreshStatus::lost, sid(99), 12, 0});
  ack.entries.push_back(HeartbeatAckEntry{nid(3), RefreshStatus::unknown, SandboxId{}, 0, 0});
  ack.entries.push_back(HeartbeatAckEntry{nid(4), RefreshStatus::queued, sid(5), 13, 2950});
  v.push_back(ack);
  v.push_back(Ok{nid(15), 55});
  v.push_back(TransferState{nid(16), sid(16), sid(17), 56, 57, LockPhase::transferring});
  WorkerAck wack{9000, {}};
  wack.not_held.push_back(HeartbeatAckEntry{nid(9), RefreshStatus::lost, sid(77), 51, 0});
  v.push_back(wack);
  v.push_back(RunningAnswer{nid(18), sid(18), 58, true});
  v.push_back(ListPage{{record(1), record(2), record(3)}, 4, false});
  {
    ListPage counted{{record(5), record(6)}, 7, true};
    counted.entries[0].waiters = 3;
    v.push_back(counted);
  }
  v.push_back(NameInfo{record(19), false, 0, {}});
  {
    NameInfo queue{record(20), true, 2, {}};
    queue.record.waiters = 4;
    queue.waiters.push_back(WaiterRecord{sid(30), wid(30), 900});
    queue.waiters.push_back(WaiterRecord{sid(31), wid(31), 0});
    v.push_back(queue);
  }
  v.push_back(StatsAnswer{{{"refusal_held", 12}, {"refreshes_per_s", 34000}, {"store_commit_ns_p99", 81234}}});
  v.push_back(RevokedAck{nid(22), 63, true});
  v.push_back(Queued{nid(23), 2, 5, sid(24), wid(24), 64, LockPhase::held, 3500});
  v.push_back(Error{ErrorCode::unsupported, "list is not served by this lockd"});
  return v;
}

}  // namespace leasehold::wire::samples
