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
#include <string_view>
#include <type_traits>
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

/// True if every value of `Enum`'s 8-bit underlying type that `named` accepts is in `all`.
/// `named` is the enum's switch without a default (-Wswitch names a missing case), so with
/// `static_assert(lists_every(kAll, named))` a new enumerator joins `kAll`, and through it every
/// CodeTable that `covers(kAll)`, or fails the build.
template <class Enum, std::size_t N, class Named>
constexpr bool lists_every(const std::array<Enum, N>& all, Named named) noexcept {
  static_assert(sizeof(std::underlying_type_t<Enum>) == 1, "lists_every walks an 8-bit enum");
  for (unsigned b = 0; b <= 0xFF; ++b) {
    const auto e = static_cast<Enum>(b);
    bool found = false;
    for (const Enum l : all) found = found || l == e;
    if (named(e) && !found) return false;
  }
  return true;
}

/// The enumerator of `all` whose text (`text_of(e)`, a string_view) is `text`; nullopt for a
/// text none has. The reverse of an enum's to_string, through the same one definition.
template <class Enum, std::size_t N, class TextOf>
constexpr std::optional<Enum> enum_of_text(const std::array<Enum, N>& all, TextOf text_of,
                                           std::string_view text) noexcept {
  for (const Enum e : all)
    if (std::string_view(text_of(e)) == text) return e;
  return std::nullopt;
}

}  // namespace leasehold
