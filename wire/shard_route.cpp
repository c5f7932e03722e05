#include "leasehold/wire/shard_route.hpp"

#include <span>

namespace leasehold::wire {
namespace {

std::optional<RequestShard> of_entries(std::span<const HeartbeatEntry> entries, unsigned shards) {
  if (entries.empty()) return std::nullopt;
  RequestShard r;
  r.shard = shard_of(entries.front().name_id, shards);
  for (const HeartbeatEntry& e : entries.subspan(1)) {
    const unsigned s = shard_of(e.name_id, shards);
    if (s != r.shard) {
      r.mixed = true;
      r.other = s;
      break;
    }
  }
  return r;
}

}  // namespace

std::optional<RequestShard> shard_of_heartbeat(std::span<const HeartbeatEntry> entries, unsigned shards) {
  return of_entries(entries, shards);
}

std::optional<RequestShard> shard_of_request(const Body& body, unsigned shards) {
  const auto of = [&](const NameId& id) { return std::optional<RequestShard>(RequestShard{shard_of(id, shards)}); };
  return std::visit(
      [&](const auto& m) -> std::optional<RequestShard> {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, Acquire> || std::is_same_v<T, Wait>) {
          return of(name_id_of(m.name));
        } else if constexpr (std::is_same_v<T, Show>) {
          return of(m.name.empty() ? m.name_id : name_id_of(m.name));
        } else if constexpr (std::is_same_v<T, Heartbeat>) {
          return of_entries(std::span(m.entries.data(), m.entries.size()), shards);
        } else if constexpr (std::is_same_v<T, WorkerHeartbeat>) {
          return of_entries(std::span(m.held.data(), m.held.size()), shards);
        } else if constexpr (std::is_same_v<T, Commit> || std::is_same_v<T, Release> ||
                             std::is_same_v<T, TransferBegin> || std::is_same_v<T, TransferComplete> ||
                             std::is_same_v<T, TransferAccept> || std::is_same_v<T, Revoke> ||
                             std::is_same_v<T, Reassign> || std::is_same_v<T, KillConfirmed>) {
          return of(m.name_id);
        } else {
          return std::nullopt;
        }
      },
      body);
}

}  // namespace leasehold::wire
