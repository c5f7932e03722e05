// leasehold/lease: FenceGate, the fencing check of a resource server.
//
// This is where fencing really happens. A lease tells its holder when to stop, but a holder
// that was paused (GC, VM suspend, SIGSTOP) or partitioned can wake up and act on a lease that
// lockd has already given to someone else. Checking "do I still hold it?" on the holder's own
// node cannot catch that: the check consults the node's own view - its shm slot, its last
// acknowledged heartbeat - and a stale node's view is exactly what is stale, so it passes its
// own test. The shm check (`leasehold_check`) therefore only rejects staleness the node already
// knows about. The rejection that makes exclusivity something an outsider can rely on must be
// made by the party the effect lands on, against the newest state it has seen: the resource
// server remembers the highest epoch it has admitted per name and refuses anything lower
// (DESIGN.md "Vocabulary: fencing"; Kleppmann, "How to do distributed locking", fencing tokens;
// Chubby §2.4, sequencers checked by the server against the most recent one it observed).
//
// Admitting epoch e raises the name's highest epoch to e, so once the new holder's first write
// (or an explicit `admit` of its token) reaches the gate, every older token is rejected for
// good. Before that, an old token is still admitted: the gate can only fence what it has seen,
// which is why a new holder should present its token before relying on exclusivity.
//
// Thread-safe: names are spread over kFenceShards shards, each a mutex and a hash map, so
// concurrent admits on different names rarely contend. Bounded: at most `names_max` names are
// tracked; an admit of a new name beyond that is refused (Verdict::full) rather than forgetting
// an epoch, because forgetting one would re-admit stale tokens.
#pragma once

#include "leasehold/lease/types.hpp"

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string_view>
#include <unordered_map>

namespace leasehold {

/// Number of independently locked shards of a FenceGate.
inline constexpr std::size_t kFenceShards = 64;
/// Default bound on the names one FenceGate tracks.
inline constexpr std::size_t kFenceNamesMax = std::size_t{1} << 22;

class FenceGate {
 public:
  enum class Verdict : std::uint8_t {
    accepted = 0,  ///< epoch >= the highest seen; the highest is now max(highest, epoch)
    stale = 1,     ///< epoch < the highest seen (a superseded token): reject the request
    full = 2,      ///< a new name and the gate already tracks names_max names: reject
    invalid = 3,   ///< epoch 0 or a nil name: no grant ever carries these
  };

  struct Admission {
    Verdict verdict = Verdict::invalid;
    Epoch highest = 0;  ///< the highest epoch seen for the name after this call
    bool accepted() const noexcept { return verdict == Verdict::accepted; }
  };

  /// `names_max`: most names tracked (1..kFenceNamesMax); values out of range are clamped.
  explicit FenceGate(std::size_t names_max = kFenceNamesMax);
  FenceGate(const FenceGate&) = delete;
  FenceGate& operator=(const FenceGate&) = delete;

  /// The fencing check, valid_fence(e) := e >= highest seen, applied atomically with
  /// recording e. Call it for every request that carries a token, before its effect lands
  /// (or, for a reply gate, after the effect is durable and before acknowledging it).
  Admission admit(NameId name, Epoch epoch);
  Admission admit(const Token& token) { return admit(token.name, token.epoch); }

  /// The highest epoch admitted for `name` (0 if none).
  Epoch highest(NameId name) const;
  /// Names tracked.
  std::size_t size() const;

 private:
  struct Shard {
    mutable std::mutex mutex;
    std::unordered_map<NameId, Epoch> highest;
  };
  Shard& shard_of(NameId name) const noexcept;

  std::size_t names_max_;
  mutable std::array<Shard, kFenceShards> shards_;
  std::atomic<std::size_t> size_{0};  // names tracked; reserved before a name is added
};

std::string_view to_string(FenceGate::Verdict v) noexcept;

}  // namespace leasehold
