// leasehold/lease: which shard of a lockd cluster a name belongs to (DESIGN.md "lockd on etcd").
//
// A cluster on etcd has S shards (1..kShardsMax, fixed when the cluster is first started); each
// shard has its own leader process, which alone answers for the shard's names. The one function
// every party routes with - lockd (is this name mine?), the supervisor (where does this
// heartbeat go?) and the CLI - is this one:
//
//   shard_of(name) = FNV-1a-64(the 16 bytes of name_id_of(name), hi then lo, each big-endian) mod S
//
// It hashes the name's id, not its text: most requests (commit, release, heartbeats, revoke,
// transfer...) carry only the id, and the id is a function of the text (UUIDv5, SHA-1), so a
// name's shard is fixed by its text alone. The byte order is the UUID's as printed
// ("0f8fad5b-..." hashes 0x0f first). Changing any of this moves names between shards, and is a
// change of the etcd key layout: an existing cluster would find its names under the wrong leader.
//
// Names are spread, not balanced against an adversary: a tenant that chooses its names can make
// them all land in one shard (one name in S does). It then loads that shard's leader only -
// the other shards, and their tenants, do not see it.
#pragma once

#include "leasehold/lease/types.hpp"

#include <cstdint>
#include <string_view>

namespace leasehold {

/// The most shards a cluster may have.
inline constexpr unsigned kShardsMax = 1024;

/// FNV-1a 64 of a name id's 16 bytes (hi then lo, each most significant byte first).
constexpr std::uint64_t shard_hash(const NameId& id) noexcept {
  std::uint64_t h = 14695981039346656037ull;  // FNV-1a 64 offset basis
  for (const std::uint64_t word : {id.hi, id.lo})
    for (int shift = 56; shift >= 0; shift -= 8) {
      h ^= (word >> shift) & 0xFF;
      h *= 1099511628211ull;  // FNV-1a 64 prime
    }
  return h;
}

/// The shard of the name with id `id` in a cluster of `shards` shards (0 when shards <= 1).
constexpr unsigned shard_of(const NameId& id, unsigned shards) noexcept {
  return shards <= 1 ? 0u : static_cast<unsigned>(shard_hash(id) % shards);
}

/// The shard of a valid name's text.
inline unsigned shard_of_name(std::string_view name, unsigned shards) { return shard_of(name_id_of(name), shards); }

}  // namespace leasehold
