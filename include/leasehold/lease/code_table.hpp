// leasehold/lease: a table that maps a vocabulary enum to an encoding's codes and back.
//
// The wire and the durable store each encode the vocabulary (LockPhase, RefreshStatus, ...) with
// their own codes. Each encoding declares one CodeTable, and `static_assert`s that it is a
// bijection covering every enumerator (`covers`), so a new enumerator or a changed code fails
// the build instead of turning into a bare cast between enums. Decoding an unknown code gives
// nullopt; the decoder refuses it with its own counted reason.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <utility>

namespace leasehold {

template <class Enum, class Code, std::size_t N>
struct CodeTable {
  std::array<std::pair<Enum, Code>, N> rows;

  /// The code of `e`; `fallback` if the table has no row for it (never for a table that
  /// `covers` its enum, which every table static_asserts).
  constexpr Code encode(Enum e, Code fallback = Code{}) const noexcept {
    for (const auto& [v, c] : rows)
      if (v == e) return c;
    return fallback;
  }
  /// The enumerator whose code is `c`; nullopt for a code the encoding does not define.
  template <class Raw>
  constexpr std::optional<Enum> decode(Raw c) const noexcept {
    for (const auto& [v, code] : rows)
      if (static_cast<Raw>(code) == c) return v;
    return std::nullopt;
  }
  /// True if every value in `all` has exactly one row and no two rows share a code.
  template <std::size_t M>
  constexpr bool covers(const std::array<Enum, M>& all) const noexcept {
    if (M != N) return false;
    for (std::size_t i = 0; i < N; ++i)
      for (std::size_t j = i + 1; j < N; ++j)
        if (rows[i].first == rows[j].first || rows[i].second == rows[j].second) return false;
    for (const Enum e : all) {
      bool found = false;
      for (const auto& [v, c] : rows) found = found || v == e;
      if (!found) return false;
    }
    return true;
  }
};

}  // namespace leasehold
