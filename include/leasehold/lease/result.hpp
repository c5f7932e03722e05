// leasehold/lease: the one error convention at module boundaries.
//
// A call that can fail at a module boundary (a key file, a store, a table location, a lockd
// request, the io_uring probe) returns a `Status` (nothing to hand back) or a `Result<T>` (a T
// or a Status). A Status is `{code, message}`: `code` is a coarse `Errc` a caller branches on
// (retry on busy, tell the user to fix a mode on permission_denied, exit code in tools/), and
// `message` is the whole story for a human: it names the thing (path, name, location), what was
// found and, where there is one, the fix. Callers print the message as it is; they do not parse
// it.
//
// Not everything goes through here. Hot paths keep their cheap enums and never allocate a
// message: the shm table's reads and check_deadline (shm::TableErrc, also the C ABI's codes),
// the codec (wire::DecodeError), LeaseTable's answers (LeaseTable::Outcome), the event loop's
// submit path (-errno). The control socket keeps its wire enum ControlError
// (supervisor/control_error.hpp): the supervisor's ports fail with a PortError, which is that
// code and a message (supervisor/ports.hpp), and the CLI maps the code to its exit code.
#pragma once

#include "leasehold/lease/assert.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace leasehold {

/// What kind of failure a Status is. Stable names (to_string) for logs and JSON.
enum class Errc : std::uint8_t {
  ok = 0,
  invalid_argument,   ///< the caller's input is malformed or out of range
  not_found,          ///< no such file, descriptor, name or entry
  permission_denied,  ///< refused by mode, owner or credentials (EACCES, EPERM, a 0644 key)
  exists,             ///< would overwrite something that is there (O_EXCL)
  io_error,           ///< a syscall or library call failed (the message has the errno text)
  corrupt,            ///< the content is not what it should be (not a key, not a store, bad magic)
  unsupported,        ///< this kernel, library or file version lacks what is needed
  busy,               ///< temporarily unavailable: retry
  timeout,            ///< no answer within the deadline
  refused,            ///< the peer answered, and said no (an Error{...} from lockd)
};

/// "ok", "invalid_argument", "not_found", ...
std::string_view to_string(Errc code) noexcept;

/// The Errc of an errno value: ENOENT/ENOTDIR/ESRCH not_found; EACCES/EPERM/EROFS
/// permission_denied; EEXIST exists; EINVAL/ERANGE/ENAMETOOLONG/EBADF invalid_argument;
/// EAGAIN/EBUSY/EINTR busy; ETIMEDOUT timeout; ENOSYS/EOPNOTSUPP/EAFNOSUPPORT unsupported;
/// 0 ok; anything else io_error. Negative values (a -errno) are read as their magnitude.
Errc errc_of_errno(int err) noexcept;

/// Success, or a failure's code and message. Default-constructed: ok.
class [[nodiscard]] Status {
 public:
  Status() = default;
  /// A failure. `code` must not be Errc::ok and `message` must not be empty (aborts otherwise:
  /// a failure nobody can explain is a defect at the call site).
  Status(Errc code, std::string message) : code_(code), message_(std::move(message)) {
    LEASEHOLD_ASSERT(code_ != Errc::ok);
    LEASEHOLD_ASSERT(!message_.empty());
  }
  /// A failure from an errno value: code errc_of_errno(err), message "`what`: strerror(err)".
  /// `err` may be negative (-errno) and must not be 0.
  static Status from_errno(int err, std::string_view what);
  /// Errc::invalid_argument with `message` (the refusal of a flag, a config field, an input).
  static Status invalid(std::string message) { return Status{Errc::invalid_argument, std::move(message)}; }

  bool ok() const noexcept { return code_ == Errc::ok; }
  Errc code() const noexcept { return code_; }
  /// Empty when ok.
  const std::string& message() const noexcept { return message_; }

 private:
  Errc code_ = Errc::ok;
  std::string message_;
};

/// "ok", or the message alone (the code is for programs; the message already says it all).
inline const std::string& to_string(const Status& s) noexcept { return s.message(); }

/// A T, or the Status of why there is none. Implicit from either, so a function writes
/// `return value;` or `return Status{Errc::not_found, "..."};`.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit by design
  /// From a failure; aborts when `error` is ok (a Result with neither value nor error).
  Result(Status error) : v_(std::in_place_index<1>, std::move(error)) {  // NOLINT: implicit by design
    LEASEHOLD_ASSERT(!std::get<1>(v_).ok());
  }

  bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }

  /// The value; aborts when !ok() (check ok() first).
  T& value() & {
    LEASEHOLD_ASSERT(ok());
    return std::get<0>(v_);
  }
  const T& value() const& {
    LEASEHOLD_ASSERT(ok());
    return std::get<0>(v_);
  }
  T&& value() && {
    LEASEHOLD_ASSERT(ok());
    return std::get<0>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  /// The failure, or an ok Status when there is a value.
  const Status& status() const noexcept { return ok() ? kOk : std::get<1>(v_); }
  Errc code() const noexcept { return status().code(); }
  /// Empty when ok.
  const std::string& message() const noexcept { return status().message(); }

 private:
  static inline const Status kOk{};
  std::variant<T, Status> v_;
};

}  // namespace leasehold
