// leasehold/supervisor: the error codes of the control socket, shared by the supervisor (which
// sends them) and the CLI (which maps them to exit codes).
//
// An error answer carries `"error": "<code>"`, the stable snake_case text of a ControlError from
// kControlErrors; the CLI maps the text back through the same table, so a code the supervisor
// can send and the CLI cannot read does not compile away silently: every enumerator has a row
// (static_assert), and the row says which class of failure (and so which exit code) it is.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace leasehold {

enum class ControlError : std::uint8_t {
  bad_json,       ///< the request line is not a JSON object
  bad_version,    ///< "v" is missing or not a version this supervisor speaks
  bad_request,    ///< a field is missing, of the wrong type or out of range
  unknown_op,     ///< "op" names no operation
  too_long,       ///< the request line is longer than the limit
  unauthorized,   ///< the peer is neither root, the supervisor's uid nor in its --group
  busy,           ///< too many clients or queued commands; retry
  idle,           ///< the client sent nothing within the idle timeout
  timeout,        ///< the operation did not finish within its bound
  shutting_down,  ///< the supervisor is stopping; no new sandboxes
  held,           ///< the name is held (here or by another worker)
  refused,        ///< lockd or this sandbox's state refused the operation
  killswitch,     ///< the kill-switch fired (worker liveness lapsed, sandbox killed)
  table_full,     ///< no free shm slot
  forbidden,      ///< this worker's key gives no power over the name
  not_found,      ///< no such sandbox or name here
  exec_failed,    ///< the command could not be started
  unreachable,    ///< lockd did not answer
  internal,       ///< the supervisor failed (a syscall, the store of its state)
};

/// What a failure means to the caller; the CLI's exit code follows from it.
enum class ControlErrorClass : std::uint8_t {
  refused,       ///< a well-formed request refused (exit kRefused)
  no_supervisor, ///< no supervisor to talk to (exit kNoSupervisor); no code of the table has it today
  not_found,     ///< nothing of that id/name (exit kNotFound)
  usage,         ///< the request itself is wrong (exit kUsage)
  unreachable,   ///< lockd unreachable (exit kUnreachable)
  failure,       ///< anything else (exit kFailure)
};

struct ControlErrorRow {
  ControlError error;
  std::string_view code;  ///< the stable text on the wire
  ControlErrorClass cls;
};

inline constexpr std::array<ControlErrorRow, 19> kControlErrors{{
    {ControlError::bad_json, "bad_json", ControlErrorClass::usage},
    {ControlError::bad_version, "bad_version", ControlErrorClass::failure},
    {ControlError::bad_request, "bad_request", ControlErrorClass::usage},
    {ControlError::unknown_op, "unknown_op", ControlErrorClass::failure},
    {ControlError::too_long, "too_long", ControlErrorClass::usage},
    // The socket lets this user in only to tell it that it may not use it (not root, the
    // supervisor's uid or a member of its --group): refused, as a connect(2) that the socket's
    // mode refuses (EACCES), not "no supervisor" - one runs, and starting another would not help.
    {ControlError::unauthorized, "unauthorized", ControlErrorClass::refused},
    {ControlError::busy, "busy", ControlErrorClass::refused},
    {ControlError::idle, "idle", ControlErrorClass::failure},
    {ControlError::timeout, "timeout", ControlErrorClass::failure},
    {ControlError::shutting_down, "shutting_down", ControlErrorClass::refused},
    {ControlError::held, "held", ControlErrorClass::refused},
    {ControlError::refused, "refused", ControlErrorClass::refused},
    {ControlError::killswitch, "killswitch", ControlErrorClass::refused},
    {ControlError::table_full, "table_full", ControlErrorClass::refused},
    {ControlError::forbidden, "forbidden", ControlErrorClass::refused},
    {ControlError::not_found, "not_found", ControlErrorClass::not_found},
    {ControlError::exec_failed, "exec_failed", ControlErrorClass::not_found},
    {ControlError::unreachable, "unreachable", ControlErrorClass::unreachable},
    {ControlError::internal, "internal", ControlErrorClass::failure},
}};

namespace detail {
constexpr bool control_errors_complete() noexcept {
  // Row i names enumerator i, so the table is complete, ordered and free of duplicates.
  for (std::size_t i = 0; i < kControlErrors.size(); ++i) {
    if (static_cast<std::size_t>(kControlErrors[i].error) != i || kControlErrors[i].code.empty()) return false;
    for (std::size_t j = i + 1; j < kControlErrors.size(); ++j)
      if (kControlErrors[i].code == kControlErrors[j].code) return false;
  }
  return static_cast<std::size_t>(ControlError::internal) + 1 == kControlErrors.size();
}
}  // namespace detail
static_assert(detail::control_errors_complete(), "kControlErrors needs one row per ControlError, in order");

/// The code text of `e` ("held", "not_found", ...).
constexpr std::string_view to_string(ControlError e) noexcept {
  const auto i = static_cast<std::size_t>(e);
  return i < kControlErrors.size() ? kControlErrors[i].code : std::string_view("internal");
}

/// The ControlError whose code text is `code`; nullopt for a code this build does not know
/// (a newer supervisor): the CLI treats it as a failure and prints the text.
constexpr std::optional<ControlError> control_error_of(std::string_view code) noexcept {
  for (const auto& row : kControlErrors)
    if (row.code == code) return row.error;
  return std::nullopt;
}

/// The class of `e` (and so the CLI's exit code).
constexpr ControlErrorClass class_of(ControlError e) noexcept {
  const auto i = static_cast<std::size_t>(e);
  return i < kControlErrors.size() ? kControlErrors[i].cls : ControlErrorClass::failure;
}

}  // namespace leasehold
