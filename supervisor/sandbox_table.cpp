#include "leasehold/supervisor/sandbox_table.hpp"

#include "leasehold/lease/assert.hpp"

namespace leasehold {

SandboxTable::SandboxTable(std::uint32_t slots) : by_slot_(slots) {}

Sandbox& SandboxTable::add(Sandbox s) {
  LEASEHOLD_ASSERT(!s.id.is_nil());
  LEASEHOLD_ASSERT(s.slot < by_slot_.size());
  LEASEHOLD_ASSERT(by_slot_[s.slot].is_nil());  // a slot holds one sandbox
  const SandboxId id = s.id;
  const std::uint32_t slot = s.slot;
  const auto [it, added] = sandboxes_.emplace(id, std::move(s));
  LEASEHOLD_ASSERT(added);  // an id is never reused
  by_slot_[slot] = id;
  checked();
  return it->second;
}

void SandboxTable::erase(const SandboxId& id) {
  auto it = sandboxes_.find(id);
  if (it == sandboxes_.end()) return;
  LEASEHOLD_ASSERT(by_slot_[it->second.slot] == id);
  by_slot_[it->second.slot] = SandboxId{};
  for (auto n = by_name_.begin(); n != by_name_.end();) {
    if (n->second == id) n = by_name_.erase(n);
    else ++n;
  }
  sandboxes_.erase(it);
  checked();
}

Sandbox* SandboxTable::find(const SandboxId& id) {
  auto it = sandboxes_.find(id);
  return it == sandboxes_.end() ? nullptr : &it->second;
}

const Sandbox* SandboxTable::find(const SandboxId& id) const {
  auto it = sandboxes_.find(id);
  return it == sandboxes_.end() ? nullptr : &it->second;
}

Sandbox* SandboxTable::at_slot(std::uint32_t slot) {
  if (slot >= by_slot_.size() || by_slot_[slot].is_nil()) return nullptr;
  Sandbox* s = find(by_slot_[slot]);
  LEASEHOLD_ASSERT(s != nullptr && s->slot == slot);
  return s;
}

void SandboxTable::bind_name(const std::string& name, const SandboxId& id) {
  LEASEHOLD_ASSERT(sandboxes_.contains(id));
  const auto [it, added] = by_name_.emplace(name, id);
  LEASEHOLD_ASSERT(added || it->second == id);  // one sandbox per name
  checked();
}

void SandboxTable::unbind_name(const std::string& name, const SandboxId& id) {
  if (auto it = by_name_.find(name); it != by_name_.end() && it->second == id) by_name_.erase(it);
}

void SandboxTable::unbind_names_except(const SandboxId& id, const std::optional<std::string>& keep) {
  for (auto it = by_name_.begin(); it != by_name_.end();) {
    if (it->second == id && (!keep || *keep != it->first)) it = by_name_.erase(it);
    else ++it;
  }
}

const SandboxId* SandboxTable::holder_of(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &it->second;
}

void SandboxTable::clear() {
  sandboxes_.clear();
  by_name_.clear();
  for (auto& id : by_slot_) id = SandboxId{};
}

void SandboxTable::check() const {
  for (const auto& [id, s] : sandboxes_) {
    LEASEHOLD_ASSERT(s.id == id);
    LEASEHOLD_ASSERT(s.slot < by_slot_.size() && by_slot_[s.slot] == id);
  }
  std::size_t occupied = 0;
  for (const SandboxId& id : by_slot_) occupied += id.is_nil() ? 0 : 1;
  LEASEHOLD_ASSERT(occupied == sandboxes_.size());  // with the loop above: no slot names a stranger
  for (const auto& [name, id] : by_name_) LEASEHOLD_ASSERT(sandboxes_.contains(id));
}

void SandboxTable::check_slot(std::uint32_t slot, const SandboxId& shm_owner, const SandboxId& left) const {
  LEASEHOLD_ASSERT(slot < by_slot_.size());
  if (!left.is_nil()) {
    LEASEHOLD_ASSERT(shm_owner == left);       // shm still holds the slot for the one that left
    LEASEHOLD_ASSERT(by_slot_[slot].is_nil());  // and nobody here sits in it
    return;
  }
  LEASEHOLD_ASSERT(by_slot_[slot] == shm_owner);  // slot -> sandbox: the same here and in shm
  if (shm_owner.is_nil()) return;
  const auto it = sandboxes_.find(shm_owner);
  LEASEHOLD_ASSERT(it != sandboxes_.end() && it->second.slot == slot);  // sandbox -> slot
}

void SandboxTable::checked() const {
  if (slow_asserts_on()) [[unlikely]] check();
}

}  // namespace leasehold
