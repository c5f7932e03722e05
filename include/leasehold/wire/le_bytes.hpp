// leasehold/io: little-endian loads and stores of fixed-width integers and 128-bit ids, for the
// wire codec (wire/protocol.hpp) and the token encoding (wire/token.hpp). Internal to leasehold_wire.
//
// The byte-wise form is the definition: byte i holds bits 8i..8i+7. On a little-endian host a
// load or store is one memcpy (one instruction); the byte-wise loop serves big-endian hosts.
// An id is its `hi` half, then its `lo` half, each 8 bytes little-endian. Callers check bounds.
#pragma once

#include "leasehold/lease/types.hpp"

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace leasehold::wire {

inline constexpr bool kLittleEndianHost = std::endian::native == std::endian::little;

/// The integer T stored little-endian at p[0..sizeof(T)).
template <class T>
T load_le(const std::uint8_t* p) noexcept {
  static_assert(std::is_integral_v<T>);
  if constexpr (kLittleEndianHost) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
  } else {
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
    return static_cast<T>(v);
  }
}

/// Stores v little-endian at p[0..sizeof(T)).
template <class T>
void store_le(std::uint8_t* p, T v) noexcept {
  static_assert(std::is_integral_v<T>);
  if constexpr (kLittleEndianHost) {
    std::memcpy(p, &v, sizeof v);
  } else {
    const auto u = static_cast<std::make_unsigned_t<T>>(v);
    for (std::size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<std::uint8_t>(u >> (8 * i));
  }
}

/// The id stored at p[0..16): hi, then lo.
template <class Tag>
Id<Tag> load_id(const std::uint8_t* p) noexcept {
  return Id<Tag>{load_le<std::uint64_t>(p), load_le<std::uint64_t>(p + 8)};
}

/// Stores id at p[0..16): hi, then lo.
template <class Tag>
void store_id(std::uint8_t* p, const Id<Tag>& id) noexcept {
  store_le(p, id.hi);
  store_le(p + 8, id.lo);
}

}  // namespace leasehold::wire
