// leasehold CLI: what the lockd-facing and supervisor-facing subcommands share.
//
// Flags with environment defaults (flag > environment > built-in default):
//   --lockd ADDR[,ADDR] $LEASEHOLD_LOCKD       (default 127.0.0.1:7400; a replicated lockd's list:
//                                               the client follows the leader)
//   --key-file PATH     $LEASEHOLD_KEY_FILE    (default /etc/leasehold/key)
//   --supervisor SOCKET $LEASEHOLD_SUPERVISOR  (default: the supervisor's own default,
//                                               default_control_socket_path())
// Every failure is a `Failure`: an exit code from command.hpp and one message that names the
// problem (the name, the address, the socket) and, where there is one, the fix.
#pragma once

#include "leasehold/harness/process.hpp"
#include "leasehold/wire/protocol.hpp"
#include "leasehold/lease/clock.hpp"
#include "leasehold/lease/types.hpp"
#include "leasehold/lease/result.hpp"
#include "leasehold/lockd/admin_client.hpp"
#include "leasehold/supervisor/control_error.hpp"
#include "tools/command.hpp"
#include "tools/table.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace leasehold::cli {

inline constexpr const char* kLockdEnv = "LEASEHOLD_LOCKD";
inline constexpr const char* kKeyFileEnv = "LEASEHOLD_KEY_FILE";
inline constexpr const char* kSupervisorEnv = "LEASEHOLD_SUPERVISOR";
inline constexpr const char* kLockdDefault = "127.0.0.1:7400";
inline constexpr const char* kKeyFileDefault = "/etc/leasehold/key";
/// Per-request deadline towards lockd (retries with backoff inside it), one address.
inline constexpr std::uint64_t kLockdTimeoutMsDefault = 2'000;
/// The deadline when --timeout-ms is not given: kLockdTimeoutMsDefault for one lockd address;
/// for several (a replicated lockd) the cluster's default failover bound plus that, so that a
/// command run while a leader dies outlasts the failover (5000 ms at lockd's defaults).
std::uint64_t lockd_timeout_ms_default(std::size_t addresses);
/// Per-request deadline towards the supervisor (a `run` includes lockd's acquire).
inline constexpr std::uint64_t kSupervisorTimeoutMsDefault = 10'000;

struct Failure {
  int code = kOk;
  std::string message;
  /// Fields the JSON error object carries besides "error", "exit_code" and "message" (e.g. a
  /// refusal's "reason", "holder", "epoch"); null or an object.
  nlohmann::json detail = nullptr;
  bool failed() const noexcept { return code != kOk; }
};

/// The word of an exit code in a JSON error's "error" field: "failure", "usage", "refused",
/// "not_found", "unreachable", "table_error", "no_supervisor", "internal" ("ok" for 0).
std::string_view error_word(int code) noexcept;
/// The JSON error object of a failure: {"error": error_word, "exit_code": N, "message": TEXT,
/// ...detail}.
nlohmann::json error_json(const Failure& f);
/// Whether failures are also printed as JSON on stdout: the command line has --json (before
/// any `--`, after which the words are a sandbox's command). main() sets it before parsing.
void set_json_errors(bool on) noexcept;
bool json_errors() noexcept;
/// True when `--json` is one of argv's options (before a `--`).
bool wants_json(int argc, const char* const* argv) noexcept;

/// The Failure of a module's Status (lease/result.hpp), "<what>: <message>" (the message alone
/// when `what` is empty), with the exit code of its Errc: invalid_argument, permission_denied,
/// exists, corrupt, unsupported → kUsage (what the caller pointed at is wrong); not_found →
/// kNotFound; refused, busy → kRefused; timeout → kUnreachable; io_error → kFailure. Callers
/// with a more specific code for their context (a key file that is missing is kUsage) say so.
Failure failure_of(const Status& status, std::string_view what = {});

/// Prints "leasehold <command>: <message>" on stderr and returns the code; with --json
/// (json_errors()) also error_json(f) as one line on stdout, so a caller parsing stdout learns
/// why there is no answer. A command prints one JSON document: either its answer or this.
int report(std::string_view command, const Failure& f);
/// Only the stderr line of report(), for a failure that is part of a JSON answer printed anyway
/// (one lockd of several that did not answer `stats`).
void note(std::string_view command, const Failure& f);

// ---- lockd ----------------------------------------------------------------------------------

struct LockdFlags {
  std::string lockd;
  std::string key_file;
  std::string admin_key_file;  ///< --admin-key-file / $LEASEHOLD_ADMIN_KEY_FILE: used instead of key_file
  std::uint64_t timeout_ms = 0;  ///< 0: not given; resolve() sets lockd_timeout_ms_default
};
inline constexpr const char* kAdminKeyFileEnv = "LEASEHOLD_ADMIN_KEY_FILE";
/// Adds --lockd, --key-file, --admin-key-file, --timeout-ms with their environment defaults.
void add_lockd_flags(CLI::App* sub, LockdFlags& flags);
/// Fills unset flags from the environment and the defaults.
void resolve(LockdFlags& flags);

/// An admin client to lockd (to every address of the --lockd list, resolved), or a Failure:
/// kUsage for a malformed address or an unusable key file (the key loader's message names the
/// file and the fix), kNotFound for a host name that does not resolve.
std::unique_ptr<lockd::AdminClient> connect_lockd(LockdFlags flags, Failure& failure);

/// The failure for an answer without a body: no answer before the deadline or a send that
/// failed (timeout, io_error) → kUnreachable ("lockd at ADDR did not answer ... is it running?
/// same key?"; when lockds answered but none leads, "no lockd among A, B leads: ..."; when the
/// kernel reported ICMP port unreachable, "nothing listens at ADDR"); no answer but a
/// key-rejected notice → kRefused ("lockd at ADDR rejected our key (key id N, reason): check the
/// key file / that the key was derived for this worker"); an Error
/// answer (refused) → kRefused (failure_of); a bad answer → kInternal.
Failure answer_failure(const lockd::Answer& answer, const LockdFlags& flags, std::string_view what);
/// The failure for a Deny: unknown_name → kNotFound, invalid_name → kUsage, else kRefused.
/// The message names the name, the refusal, the holder and the epoch.
Failure deny_failure(const wire::Deny& deny, std::string_view name);
/// The body of type T (a Grant, a NameInfo...) of lockd's answer to `verb` on `name`, or nullptr
/// with `failure` set: a Deny → deny_failure; no answer, an Error or another body →
/// answer_failure for `verb "name"`.
template <class T>
const T* answer_body(const lockd::Answer& answer, std::string_view verb, std::string_view name,
                     const LockdFlags& flags, Failure& failure) {
  if (const auto* d = answer.as<wire::Deny>()) {
    failure = deny_failure(*d, name);
    return nullptr;
  }
  const T* body = answer.as<T>();
  if (body == nullptr)
    failure = answer_failure(answer, flags, std::string(verb) + " \"" + std::string(name) + "\"");
  return body;
}

// ---- the supervisor's control socket -------------------------------------------------------

struct SupervisorFlags {
  std::string socket;
  std::uint64_t timeout_ms = kSupervisorTimeoutMsDefault;
};
void add_supervisor_flags(CLI::App* sub, SupervisorFlags& flags);
void resolve(SupervisorFlags& flags);

/// One request line, one answer line (control_call of supervisor/control.hpp: nothing is sent
/// to a server that is neither root nor this user). nullopt + failure when nobody listens on the
/// socket, the socket's server is not trusted, or it does not answer in time (kNoSupervisor,
/// naming the socket and, where there is one, the fix), for a malformed path (kUsage), or on a
/// garbled answer (kInternal). An answer with "ok":false is returned as is.
std::optional<nlohmann::json> supervisor_call(SupervisorFlags flags, const nlohmann::json& request,
                                              Failure& failure);
/// The failure of an {"ok":false} answer, by the ControlErrorClass of its code (control_error.hpp):
/// refused (held, refused, forbidden: another caller's sandbox, busy, table_full, ...) → kRefused
/// (with holder and epoch), not_found → kNotFound, usage → kUsage, unreachable → kUnreachable (the
/// supervisor could not reach lockd), no_supervisor (unauthorized: this user may not use the
/// socket) → kNoSupervisor, failure → kFailure naming the code. A code this build does not know
/// (a newer supervisor) → kFailure with the code's text.
Failure supervisor_failure(const nlohmann::json& answer, std::string_view what);
/// The ControlError of an {"ok":false} answer; nullopt for an ok answer, one without a string
/// "error", or a code this build does not know.
std::optional<ControlError> answer_error(const nlohmann::json& answer);
/// The worker id the supervisor at `socket` says it serves (its `status` op; "" when the answer
/// names none), or nullopt with `failure` set as supervisor_call sets it.
std::optional<std::string> supervisor_worker(const std::string& socket, Failure& failure);

// ---- arguments --------------------------------------------------------------------------------

/// kUsage with validate_name's message (which byte, where) when the name is malformed: for a
/// name that exists (show, release, revoke, transfer, logs, audit), so one stored before the
/// rule against a leading '-' can still be managed (after `--`).
bool check_name(std::string_view name, Failure& failure);
/// The same for a name about to be acquired (acquire, commit, run --name, name): also
/// validate_new_name's rule (no leading '-': it reads as a flag, and "-" as "none" in tables).
bool check_new_name(std::string_view name, Failure& failure);
/// Parses a sandbox id (UUID text); kUsage naming the text when malformed.
std::optional<SandboxId> parse_sandbox(std::string_view text, Failure& failure);

// ---- output -----------------------------------------------------------------------------------

/// "-" for a nil id, else the UUID text.
template <class Tag>
std::string id_text(const Id<Tag>& id) {
  return id.is_nil() ? std::string("-") : id.str();
}
nlohmann::json record_json(const wire::NameRecord& r, bool with_waiters);
/// A supervisor's answer as the CLI prints it with --json: without the control socket's
/// envelope ("v", "id", "ok"), and with its "valid_until_ms" (the lease's time left, ms) named
/// "ttl_left_ms" as in every other command's JSON. Other fields are kept as they are.
nlohmann::json output_json(const nlohmann::json& answer);
/// "5.2 s" / "830 ms".
std::string duration_text(std::int64_t ns);

// ---- programs -----------------------------------------------------------------------------------

/// This executable's path (/proc/self/exe; "" if unreadable).
std::string self_exe();
/// The first executable `name` in $PATH, /usr/sbin, /sbin ("" if none): the harness's.
using harness::find_program;
/// A leasehold service binary (leasehold-lockd / leasehold-supervisor): `flag` if given, else next
/// to this binary in its build tree (tools/../<module>/), in the same directory (installed), or on
/// $PATH ("" if none).
std::string locate_service(const std::string& flag, const std::string& program, const std::string& module);

}  // namespace leasehold::cli
