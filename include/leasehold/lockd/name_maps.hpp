// leasehold/lockd: compact per-name maps of lockd (issue "Performance", memory per held name).
//
// lockd keeps two maps with one entry per name, next to the lease table: the text of every
// name the table knows (LockService: list pages, show, the durable record) and the durable
// epoch of every name the store holds (DurableEpochs: the never-lower check). As node-based
// standard containers they cost 80 + 48 bytes per name plus allocator rounding; these two
// are flat arrays of fixed-size entries, with the texts in a chunked arena.
//
// NameTexts: an ordered hash table (Amble & Knuth, "Ordered hash tables", 1974) keyed by the
// NameId. An entry's home slot is a monotone function of the id's high half (the ids are SHA-1
// derived, so uniform), collisions probe linearly without wrap-around (an overflow tail takes
// the last runs), and the entries are kept sorted by id along the array. So a lookup is a
// hash probe (a short run from the home slot), and the entries in array order are in NameId
// order: a list page is the first entry at or after the cursor's home slot whose id is >= the
// cursor, then a walk. 20-byte entries at load factor 0.74..0.92, texts 1 + length bytes.
//
// EpochMap: NameId -> Epoch, the same ordered hashing on a mixed hash of the id, 20-byte
// entries (a 32-bit epoch; a larger one, which takes four billion grants of one name, is kept
// beside them) at load factor 0.74..0.92, no erase (a store's rows are never deleted).
#pragma once

#include "leasehold/lease/types.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace leasehold::lockd {

class NameTexts {
 public:
  /// Longest text kept (validate_name's bound is 128 bytes); a longer one is refused.
  static constexpr std::size_t kTextBytesMax = 255;

  NameTexts();
  ~NameTexts();
  NameTexts(NameTexts&&) noexcept;
  NameTexts& operator=(NameTexts&&) noexcept;

  /// Adds `id` with `text` if it is absent (a present id keeps its text, like map::emplace);
  /// true if added. An empty text is not kept (false). Throws std::length_error for a text
  /// above kTextBytesMax.
  bool emplace(NameId id, std::string_view text);
  /// The text of `id`; empty if absent (a kept text is never empty).
  std::string_view find(NameId id) const noexcept;
  bool contains(NameId id) const noexcept { return !find(id).empty(); }
  /// Removes `id`; true if it was there.
  bool erase(NameId id) noexcept;
  /// Removes every entry for which `drop(id)` is true (one pass; compacts the text arena).
  void erase_if(const std::function<bool(NameId)>& drop);
  std::size_t size() const noexcept { return count_; }
  bool empty() const noexcept { return count_ == 0; }

  /// A position in NameId order (valid until the next change).
  class Cursor {
   public:
    bool done() const noexcept { return at_ >= owner_->slots_.size(); }
    NameId id() const noexcept;
    std::string_view text() const noexcept;
    void next() noexcept;

   private:
    friend class NameTexts;
    Cursor(const NameTexts* owner, std::size_t at) noexcept : owner_(owner), at_(at) { skip(); }
    void skip() noexcept;
    const NameTexts* owner_;
    std::size_t at_;
  };
  /// The first entry whose id is >= `id` (done() if none).
  Cursor lower_bound(NameId id) const noexcept;
  Cursor begin() const noexcept { return Cursor(this, 0); }

  /// Bytes this map owns (slots and text chunks).
  std::size_t memory_bytes() const noexcept;
  /// Bytes of text kept (1 + length per entry) and of text erased but not yet compacted.
  std::size_t text_bytes() const noexcept { return text_live_; }
  std::size_t text_garbage_bytes() const noexcept { return text_garbage_; }
  /// Slots (home range + overflow tail).
  std::size_t slots() const noexcept { return slots_.size(); }

 private:
  struct Slot {
    std::uint32_t w[4];  // the NameId: hi (w[0] high, w[1] low), lo (w[2] high, w[3] low)
    std::uint32_t text;  // arena offset + 1 of the text's length byte; 0: empty
  };
  static_assert(sizeof(Slot) == 20);
  static NameId id_of(const Slot& s) noexcept;
  static void set_id(Slot& s, NameId id) noexcept;
  std::size_t home(NameId id) const noexcept;
  /// The slot of `id`, or slots_.size() if absent.
  std::size_t locate(NameId id) const noexcept;
  std::uint32_t store_text(std::string_view text);
  std::string_view text_at(std::uint32_t ref) const noexcept;
  /// Re-lays the entries for `cap` home slots, in order; copies the texts into fresh chunks.
  void rebuild(std::size_t cap, const std::function<bool(NameId)>* drop);

  std::vector<Slot> slots_;  // cap_ home slots + the overflow tail
  std::size_t cap_ = 0;
  std::size_t count_ = 0;
  std::vector<std::unique_ptr<char[]>> chunks_;
  std::size_t chunk_used_ = 0;  // bytes used in the last chunk
  std::size_t text_live_ = 0;
  std::size_t text_garbage_ = 0;
};

/// NameId -> Epoch (see the file comment). Not thread-safe.
class EpochMap {
 public:
  /// What find() answers, read like a map iterator (`it->first`, `it->second`); end() when
  /// the id is absent.
  struct Found {
    NameId first;
    Epoch second = 0;
    bool present = false;
    const Found* operator->() const noexcept { return this; }
    friend bool operator==(const Found&, const Found&) = default;
  };
  /// Sets the epoch of `id` (adds it if absent).
  void set(NameId id, Epoch epoch);
  Found find(NameId id) const noexcept;
  Found end() const noexcept { return {}; }
  std::size_t size() const noexcept { return count_ + (has_nil_ ? 1 : 0); }
  std::size_t memory_bytes() const noexcept;

 private:
  struct Slot {
    std::uint32_t w[4];     // the NameId as in NameTexts; nil: empty (the nil id is in nil_epoch_)
    std::uint32_t epoch;    // kBigEpoch: the epoch is in big_
  };
  static_assert(sizeof(Slot) == 20);
  static constexpr std::uint32_t kBigEpoch = 0xFFFF'FFFF;
  static std::uint64_t hash(NameId id) noexcept;
  /// Whether the entry of `e` sorts before the key (h, id).
  static bool before(NameId e, std::uint64_t h, NameId id) noexcept;
  std::size_t home(std::uint64_t h) const noexcept;
  /// The slot of `id`, or slots_.size() if absent.
  std::size_t locate(NameId id) const noexcept;
  void put_epoch(Slot& s, NameId id, Epoch epoch);
  Epoch epoch_of(const Slot& s, NameId id) const noexcept;
  void rebuild(std::size_t cap);
  std::vector<Slot> slots_;  // cap_ home slots + the overflow tail
  std::size_t cap_ = 0;
  std::size_t count_ = 0;
  /// Epochs that do not fit 32 bits (a name granted four billion times; kept exact).
  std::unordered_map<NameId, Epoch> big_;
  bool has_nil_ = false;
  Epoch nil_epoch_ = 0;
};

}  // namespace leasehold::lockd
