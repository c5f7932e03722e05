// leasehold/wire: which shard of a lockd cluster a request is for (lease/shard.hpp says which
// shard a name is in; this says which name a request is about).
//
// Routed by name: Acquire and Wait (their text), Commit, Release, KillConfirmed, Show, the transfer
// requests, Revoke, Reassign (their name id), a Heartbeat and a WorkerHeartbeat (their entries).
// A heartbeat's entries must all be of one shard: a supervisor builds one batch per shard, and
// lockd refuses a batch that mixes shards as a whole (it cannot answer part of one: an entry
// answered anything but `refreshed` kills its sandbox). List and Stats are about no name: each
// lockd process answers them for the shard it serves, and a client that wants the whole
// cluster asks every shard's leader.
#pragma once

#include "leasehold/lease/shard.hpp"
#include "leasehold/wire/protocol.hpp"

#include <optional>
#include <span>

namespace leasehold::wire {

/// The shard of a request, nullopt when the request is about no name (List, Stats, an empty
/// heartbeat; an answer).
struct RequestShard {
  unsigned shard = 0;
  /// A Heartbeat or WorkerHeartbeat whose entries are in more than one shard (`shard` is its
  /// first entry's); `other` is the first other shard found.
  bool mixed = false;
  unsigned other = 0;
};
std::optional<RequestShard> shard_of_request(const Body& body, unsigned shards);
/// The shard of a Heartbeat of `entries`: shard_of_request() of that Heartbeat, without one.
std::optional<RequestShard> shard_of_heartbeat(std::span<const HeartbeatEntry> entries, unsigned shards);

}  // namespace leasehold::wire
