// NameTexts and EpochMap: see name_maps.hpp.
#include "leasehold/lockd/name_maps.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace leasehold::lockd {

namespace {

constexpr std::size_t kChunkBytes = std::size_t{256} << 10;  // text arena chunk
constexpr std::size_t kChunkShift = 18;
static_assert(kChunkBytes == std::size_t{1} << kChunkShift);
constexpr std::size_t kSlotsMin = 64;
constexpr std::size_t kTailSlots = 64;  // overflow slots past the home range (grown as needed)
constexpr std::size_t kChunksMax = (std::size_t{1} << 32) / kChunkBytes;  // offsets are 32-bit

// Load factor bound 0.92 (23/25), growth 1.25x: 0.74..0.92 between rebuilds. Ordered hashing
// keeps probes short at that load: a search, found or not, stops at the first greater key
// (about (1 + 1/(1 - a)) / 2 entries: 6.5 at 0.92), and an insertion moves the rest of its run.
bool over_load(std::size_t count, std::size_t cap) noexcept { return count * 25 > cap * 23; }
std::size_t grown(std::size_t cap) noexcept { return cap + cap / 4; }

// A NameId as four 32-bit words (4-byte alignment: 20-byte slots pack without padding).
NameId slot_id(const std::uint32_t (&w)[4]) noexcept {
  return NameId{(std::uint64_t{w[0]} << 32) | w[1], (std::uint64_t{w[2]} << 32) | w[3]};
}
void set_slot_id(std::uint32_t (&w)[4], NameId id) noexcept {
  w[0] = static_cast<std::uint32_t>(id.hi >> 32);
  w[1] = static_cast<std::uint32_t>(id.hi);
  w[2] = static_cast<std::uint32_t>(id.lo >> 32);
  w[3] = static_cast<std::uint32_t>(id.lo);
}

std::uint64_t mulhi(std::uint64_t a, std::uint64_t b) noexcept {
  return static_cast<std::uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
}

}  // namespace

// ---- NameTexts -------------------------------------------------------------------------------

NameTexts::NameTexts() = default;
NameTexts::~NameTexts() = default;
NameTexts::NameTexts(NameTexts&&) noexcept = default;
NameTexts& NameTexts::operator=(NameTexts&&) noexcept = default;

NameId NameTexts::id_of(const Slot& s) noexcept { return slot_id(s.w); }

void NameTexts::set_id(Slot& s, NameId id) noexcept { set_slot_id(s.w, id); }

// Monotone in the id (its high half), so array order is id order.
std::size_t NameTexts::home(NameId id) const noexcept { return static_cast<std::size_t>(mulhi(id.hi, cap_)); }

std::size_t NameTexts::locate(NameId id) const noexcept {
  if (cap_ == 0) return slots_.size();
  for (std::size_t i = home(id); i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.text == 0) break;
    const NameId k = id_of(s);
    if (k == id) return i;
    if (k > id) break;
  }
  return slots_.size();
}

std::uint32_t NameTexts::store_text(std::string_view text) {
  const std::size_t need = 1 + text.size();
  if (chunks_.empty() || chunk_used_ + need > kChunkBytes) {
    if (chunks_.size() >= kChunksMax) throw std::length_error("NameTexts: text arena full");
    chunks_.push_back(std::make_unique<char[]>(kChunkBytes));
    chunk_used_ = 0;
  }
  char* at = chunks_.back().get() + chunk_used_;
  at[0] = static_cast<char>(static_cast<unsigned char>(text.size()));
  std::memcpy(at + 1, text.data(), text.size());
  const std::size_t offset = ((chunks_.size() - 1) << kChunkShift) + chunk_used_;
  chunk_used_ += need;
  text_live_ += need;
  return static_cast<std::uint32_t>(offset + 1);
}

std::string_view NameTexts::text_at(std::uint32_t ref) const noexcept {
  const std::size_t offset = ref - 1;
  const char* at = chunks_[offset >> kChunkShift].get() + (offset & (kChunkBytes - 1));
  return {at + 1, static_cast<unsigned char>(at[0])};
}

bool NameTexts::emplace(NameId id, std::string_view text) {
  if (text.empty()) return false;  // nothing to keep: find() answers "" for it either way
  if (text.size() > kTextBytesMax) throw std::length_error("NameTexts: text longer than kTextBytesMax");
  if (locate(id) != slots_.size()) return false;
  if (cap_ == 0 || over_load(count_ + 1, cap_)) rebuild(std::max(kSlotsMin, grown(cap_)), nullptr);
  // The first slot from home that is empty or holds a greater id; the run from there to the
  // next empty slot moves up by one.
  std::size_t p = home(id);
  while (p < slots_.size() && slots_[p].text != 0 && id_of(slots_[p]) < id) ++p;
  std::size_t e = p;
  while (e < slots_.size() && slots_[e].text != 0) ++e;
  if (e >= slots_.size()) slots_.resize(e + kTailSlots, Slot{});
  const std::uint32_t ref = store_text(text);
  std::memmove(slots_.data() + p + 1, slots_.data() + p, (e - p) * sizeof(Slot));
  set_id(slots_[p], id);
  slots_[p].text = ref;
  ++count_;
  return true;
}

std::string_view NameTexts::find(NameId id) const noexcept {
  const std::size_t i = locate(id);
  return i == slots_.size() ? std::string_view{} : text_at(slots_[i].text);
}

bool NameTexts::erase(NameId id) noexcept {
  std::size_t q = locate(id);
  if (q == slots_.size()) return false;
  const std::size_t bytes = 1 + text_at(slots_[q].text).size();
  text_live_ -= bytes;
  text_garbage_ += bytes;
  // Pull the displaced rest of the run back by one (they stay sorted and at or after home).
  for (std::size_t j = q + 1; j < slots_.size() && slots_[j].text != 0 && home(id_of(slots_[j])) < j; ++j) {
    slots_[q] = slots_[j];
    q = j;
  }
  slots_[q] = Slot{};
  --count_;
  // Erased text is reclaimed by a rebuild once it outweighs the live text.
  if (text_garbage_ > text_live_ + kChunkBytes) rebuild(cap_, nullptr);
  return true;
}

void NameTexts::erase_if(const std::function<bool(NameId)>& drop) { rebuild(cap_, &drop); }

void NameTexts::rebuild(std::size_t cap, const std::function<bool(NameId)>* drop) {
  std::vector<Slot> old;
  old.swap(slots_);
  std::vector<std::unique_ptr<char[]>> old_chunks;
  old_chunks.swap(chunks_);
  // The old texts are copied out of old_chunks, which lives to the end of this call.
  auto old_text = [&](std::uint32_t ref) {
    const std::size_t offset = ref - 1;
    const char* at = old_chunks[offset >> kChunkShift].get() + (offset & (kChunkBytes - 1));
    return std::string_view{at + 1, static_cast<unsigned char>(at[0])};
  };
  chunk_used_ = 0;
  text_live_ = text_garbage_ = 0;
  count_ = 0;
  cap_ = cap;
  slots_.assign(cap_ + kTailSlots, Slot{});
  std::size_t next = 0;  // first slot not taken yet
  for (const Slot& s : old) {
    if (s.text == 0) continue;
    const NameId id = id_of(s);
    if (drop != nullptr && (*drop)(id)) continue;
    const std::size_t at = std::max(home(id), next);
    if (at >= slots_.size()) slots_.resize(at + kTailSlots, Slot{});
    set_id(slots_[at], id);
    slots_[at].text = store_text(old_text(s.text));
    next = at + 1;
    ++count_;
  }
  if (drop != nullptr && cap_ > kSlotsMin && count_ * 4 < cap_)  // shrink after a large prune
    rebuild(std::max(kSlotsMin, cap_ / 2), nullptr);
}

NameTexts::Cursor NameTexts::lower_bound(NameId id) const noexcept {
  if (cap_ == 0) return Cursor(this, slots_.size());
  Cursor c(this, home(id));
  while (!c.done() && c.id() < id) c.next();
  return c;
}

NameId NameTexts::Cursor::id() const noexcept { return id_of(owner_->slots_[at_]); }
std::string_view NameTexts::Cursor::text() const noexcept { return owner_->text_at(owner_->slots_[at_].text); }
void NameTexts::Cursor::next() noexcept {
  ++at_;
  skip();
}
void NameTexts::Cursor::skip() noexcept {
  while (at_ < owner_->slots_.size() && owner_->slots_[at_].text == 0) ++at_;
}

std::size_t NameTexts::memory_bytes() const noexcept {
  return slots_.capacity() * sizeof(Slot) + chunks_.size() * kChunkBytes;
}

// ---- EpochMap --------------------------------------------------------------------------------
//
// Ordered hashing as in NameTexts, on a mixed hash of the id (so ids that are not uniform, as
// in tests, spread too): entries sorted by (hash, id), each at or after its home slot.

std::uint64_t EpochMap::hash(NameId id) noexcept { return id.hi ^ (id.lo * 0x9E3779B97F4A7C15ULL); }

bool EpochMap::before(NameId e, std::uint64_t h, NameId id) noexcept {
  const std::uint64_t eh = hash(e);
  return eh < h || (eh == h && e < id);
}

std::size_t EpochMap::home(std::uint64_t h) const noexcept { return static_cast<std::size_t>(mulhi(h, cap_)); }

std::size_t EpochMap::locate(NameId id) const noexcept {
  if (cap_ == 0) return slots_.size();
  const std::uint64_t h = hash(id);
  for (std::size_t i = home(h); i < slots_.size(); ++i) {
    const NameId k = slot_id(slots_[i].w);
    if (k.is_nil()) break;
    if (k == id) return i;
    if (!before(k, h, id)) break;
  }
  return slots_.size();
}

void EpochMap::put_epoch(Slot& s, NameId id, Epoch epoch) {
  if (epoch < kBigEpoch) {
    if (s.epoch == kBigEpoch) big_.erase(id);
    s.epoch = static_cast<std::uint32_t>(epoch);
  } else {
    s.epoch = kBigEpoch;
    big_[id] = epoch;
  }
}

Epoch EpochMap::epoch_of(const Slot& s, NameId id) const noexcept {
  if (s.epoch != kBigEpoch) return s.epoch;
  const auto it = big_.find(id);
  return it == big_.end() ? 0 : it->second;
}

void EpochMap::set(NameId id, Epoch epoch) {
  if (id.is_nil()) {
    has_nil_ = true;
    nil_epoch_ = epoch;
    return;
  }
  if (const std::size_t i = locate(id); i != slots_.size()) {
    put_epoch(slots_[i], id, epoch);
    return;
  }
  if (cap_ == 0 || over_load(count_ + 1, cap_)) rebuild(std::max(kSlotsMin, grown(cap_)));
  const std::uint64_t h = hash(id);
  std::size_t p = home(h);
  while (p < slots_.size() && !slot_id(slots_[p].w).is_nil() && before(slot_id(slots_[p].w), h, id)) ++p;
  std::size_t e = p;
  while (e < slots_.size() && !slot_id(slots_[e].w).is_nil()) ++e;
  if (e >= slots_.size()) slots_.resize(e + kTailSlots, Slot{});
  std::memmove(slots_.data() + p + 1, slots_.data() + p, (e - p) * sizeof(Slot));
  slots_[p] = Slot{};
  set_slot_id(slots_[p].w, id);
  put_epoch(slots_[p], id, epoch);
  ++count_;
}

EpochMap::Found EpochMap::find(NameId id) const noexcept {
  if (id.is_nil()) return has_nil_ ? Found{id, nil_epoch_, true} : end();
  const std::size_t i = locate(id);
  return i == slots_.size() ? end() : Found{id, epoch_of(slots_[i], id), true};
}

std::size_t EpochMap::memory_bytes() const noexcept {
  return slots_.capacity() * sizeof(Slot) + big_.size() * (sizeof(NameId) + sizeof(Epoch) + 2 * sizeof(void*)) +
         big_.bucket_count() * sizeof(void*);
}

void EpochMap::rebuild(std::size_t cap) {
  std::vector<Slot> old;
  old.swap(slots_);
  cap_ = cap;
  slots_.assign(cap_ + kTailSlots, Slot{});
  std::size_t next = 0;
  for (const Slot& s : old) {
    const NameId id = slot_id(s.w);
    if (id.is_nil()) continue;
    const std::size_t at = std::max(home(hash(id)), next);
    if (at >= slots_.size()) slots_.resize(at + kTailSlots, Slot{});
    slots_[at] = s;
    next = at + 1;
  }
}

}  // namespace leasehold::lockd
