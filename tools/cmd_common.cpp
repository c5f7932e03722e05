// leasehold CLI: shared flags, clients and error mapping (see cmd_common.hpp). Registers no
// subcommand.
#include "tools/cmd_common.hpp"

#include "leasehold/wire/auth.hpp"
#include "leasehold/io/address_list.hpp"
#include "leasehold/io/udp.hpp"
#include "leasehold/lockd/config.hpp"
#include "leasehold/supervisor/config.hpp"
#include "leasehold/supervisor/control.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace leasehold::cli {

namespace {
bool g_json_errors = false;
}  // namespace

void set_json_errors(bool on) noexcept { g_json_errors = on; }
bool json_errors() noexcept { return g_json_errors; }

bool wants_json(int argc, const char* const* argv) noexcept {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--") return false;
    if (a == "--json") return true;
  }
  return false;
}

std::string_view error_word(int code) noexcept {
  switch (code) {
    case kOk: return "ok";
    case kFailure: return "failure";
    case kUsage: return "usage";
    case kRefused: return "refused";
    case kNotFound: return "not_found";
    case kUnreachable: return "unreachable";
    case kTableError: return "table_error";
    case kNoSupervisor: return "no_supervisor";
    default: return "internal";
  }
}

nlohmann::json error_json(const Failure& f) {
  nlohmann::json j = {{"error", std::string(error_word(f.code))}, {"exit_code", f.code}, {"message", f.message}};
  if (f.detail.is_object())
    for (const auto& [k, v] : f.detail.items())
      if (!j.contains(k)) j[k] = v;
  return j;
}

void note(std::string_view command, const Failure& f) {
  std::fprintf(stderr, "leasehold%s%.*s: %s\n", command.empty() ? "" : " ", static_cast<int>(command.size()),
               command.data(), f.message.c_str());
}

int report(std::string_view command, const Failure& f) {
  note(command, f);
  if (g_json_errors) {
    std::printf("%s\n", error_json(f).dump().c_str());
    std::fflush(stdout);
  }
  return f.code;
}

namespace {
std::string env_or(const char* var, const char* fallback) {
  const char* v = std::getenv(var);
  return v != nullptr && *v != '\0' ? std::string(v) : std::string(fallback);
}
}  // namespace

// ---- lockd ----------------------------------------------------------------------------------

void add_lockd_flags(CLI::App* sub, LockdFlags& f) {
  sub->add_option("--lockd", f.lockd,
                  std::string("lockd address HOST:PORT (UDP; a host name or a numeric address), or a replicated "
                              "lockd's comma-separated list A,B,C, whose leader is followed (env ") +
                      kLockdEnv + ", default " + kLockdDefault + ")");
  sub->add_option("--key-file", f.key_file,
                  std::string("key file, mode 0600: a worker key (act as that worker) or the cluster key (env ") +
                      kKeyFileEnv + ", default " + kKeyFileDefault + ")");
  sub->add_option("--admin-key-file", f.admin_key_file,
                  std::string("admin key file, mode 0600 (lockd --admin-key-file): revoke, transfer, reassign, "
                              "names and show of any name; used instead of --key-file (env ") +
                      kAdminKeyFileEnv + ")");
  sub->add_option("--timeout-ms", f.timeout_ms,
                  "give up on lockd after this many milliseconds (retries inside it; default " +
                      std::to_string(lockd_timeout_ms_default(1)) + " for one --lockd address, " +
                      std::to_string(lockd_timeout_ms_default(2)) +
                      " for several: a replicated lockd's default failover bound plus " +
                      std::to_string(kLockdTimeoutMsDefault) + ")")
      ->check(CLI::Range(1, 600'000));
}

std::uint64_t lockd_timeout_ms_default(std::size_t addresses) {
  if (addresses <= 1) return kLockdTimeoutMsDefault;
  return lockd::failover_bound_ms(lockd::LockdConfig{}) + kLockdTimeoutMsDefault;
}

void resolve(LockdFlags& f) {
  if (f.lockd.empty()) f.lockd = env_or(kLockdEnv, kLockdDefault);
  if (f.key_file.empty()) f.key_file = env_or(kKeyFileEnv, kKeyFileDefault);
  if (f.admin_key_file.empty()) f.admin_key_file = env_or(kAdminKeyFileEnv, "");
  if (f.timeout_ms == 0)
    f.timeout_ms = lockd_timeout_ms_default(1 + static_cast<std::size_t>(std::count(f.lockd.begin(), f.lockd.end(), ',')));
}

std::unique_ptr<lockd::AdminClient> connect_lockd(LockdFlags flags, Failure& failure) {
  resolve(flags);
  Result<std::vector<SocketAddress>> addrs = resolve_address_list(flags.lockd);
  if (!addrs) {
    failure = addrs.code() == Errc::not_found ? Failure{kNotFound, "lockd address " + addrs.message()}
                                              : Failure{kUsage, "malformed lockd address " + addrs.message()};
    return nullptr;
  }
  const bool admin = !flags.admin_key_file.empty();
  wire::KeyLoad key = wire::load_key_file(admin ? flags.admin_key_file : flags.key_file);
  if (!key) {
    failure = {kUsage, key.message() + (admin ? " (set --admin-key-file or " + std::string(kAdminKeyFileEnv) + ")"
                                          : " (set --key-file or " + std::string(kKeyFileEnv) + ")")};
    return nullptr;
  }
  if (admin && key->kind != wire::KeyKind::admin) {
    failure = {kUsage, "--admin-key-file " + flags.admin_key_file + " holds a " +
                           std::string(wire::to_string(key->kind)) +
                           " key, not an admin key (make one with leasehold-lockd --generate-key PATH --kind admin "
                           "--key-id N, and start lockd with --admin-key-file PATH)"};
    return nullptr;
  }
  try {
    return std::make_unique<lockd::AdminClient>(std::move(addrs).value(), *key, WorkerId{},
                                                static_cast<std::int64_t>(flags.timeout_ms) * 1'000'000);
  } catch (const std::exception& e) {
    failure = {kUnreachable, std::string("cannot talk to lockd at ") + flags.lockd + ": " + e.what()};
    return nullptr;
  }
}

Failure failure_of(const Status& status, std::string_view what) {
  std::string m = what.empty() ? status.message() : std::string(what) + ": " + status.message();
  switch (status.code()) {
    case Errc::ok: return {kInternal, std::string(what) + ": failure_of() of a success"};
    case Errc::invalid_argument:
    case Errc::permission_denied:
    case Errc::exists:
    case Errc::corrupt:
    case Errc::unsupported: return {kUsage, std::move(m)};
    case Errc::not_found: return {kNotFound, std::move(m)};
    case Errc::busy:
    case Errc::refused: return {kRefused, std::move(m)};
    case Errc::timeout: return {kUnreachable, std::move(m)};
    case Errc::io_error: return {kFailure, std::move(m)};
  }
  return {kInternal, std::move(m)};
}

Failure answer_failure(const lockd::Answer& answer, const LockdFlags& flags, std::string_view what) {
  LockdFlags f = flags;
  resolve(f);
  const std::string w(what);
  if (answer.no_leader)  // lockds answered, so they run and know the key: none of them leads
    return {kUnreachable, w + ": " + answer.message() +
                              ". A lockd answers not_leader while it does not lead; an election takes a few "
                              "seconds (--timeout-ms waits longer), and a leader outside --lockd is not followed"};
  if (answer.key_rejected) {
    // lockd runs and answered, unauthenticated, that it does not accept this key: a refusal
    // (the permission class), not an unreachable lockd.
    const std::string& file = f.admin_key_file.empty() ? f.key_file : f.admin_key_file;
    const wire::KeyLoad key = wire::load_key_file(file);
    // The key id as the file names it (a cluster key used directly carries id | 0x8000 on the wire).
    const std::uint16_t id = key ? key->key_id : static_cast<std::uint16_t>(answer.key_rejected->key_id & 0x7fff);
    return {kRefused,
            w + ": lockd at " + answer.rejected_by + " rejected our key (key id " + std::to_string(id) + ", " +
                std::string(wire::to_string(answer.key_rejected->reason)) + "): check the key file " + file +
                (key ? " (" + wire::key_text(*key) + ")" : std::string()) +
                " / that the key was derived for this worker from a cluster key lockd has loaded (" +
                (answer.key_rejected->reason == wire::KeyRejectReason::unknown_key
                     ? "unknown_key: lockd has no key of that key id; a rotation may have removed it"
                     : "bad_mac: lockd has that key id, but the tag does not verify: another key") +
                ")",
            nlohmann::json{{"reason", "key_rejected"},
                           {"key_id", id},
                           {"key_reject_reason", std::string(wire::to_string(answer.key_rejected->reason))},
                           {"lockd", answer.rejected_by}}};
  }
  if (answer.nothing_listens)
    return {kUnreachable, w + ": nothing listens at " + f.lockd + ": ICMP port unreachable, no answer within " +
                              std::to_string(f.timeout_ms) + " ms (" + std::to_string(answer.attempts) +
                              " attempts). Is leasehold-lockd running there, and on that port (--listen)?",
            nlohmann::json{{"reason", "nothing_listens"}}};
  if (answer.code() == Errc::timeout || answer.code() == Errc::io_error) {
    const std::string& file = f.admin_key_file.empty() ? f.key_file : f.admin_key_file;
    const wire::KeyLoad key = wire::load_key_file(file);
    const std::string which = key ? wire::key_text(*key) : std::string("unreadable");
    return {kUnreachable, w + ": lockd at " + f.lockd + " is unreachable: no answer within " +
                              std::to_string(f.timeout_ms) + " ms (" +
                              std::to_string(answer.attempts) +
                              " attempts). Is leasehold-lockd running there, and does it have the key of " +
                              file + " (" + which + ")? lockd answers a wrong key with a key-rejected "
                              "notice (rate-limited to one a second), which may have been suppressed or lost."};
  }
  if (answer.code() == Errc::refused) return failure_of(answer.status, what);
  if (!answer.ok()) return {kInternal, w + ": " + answer.message()};  // a bad answer, an unencodable request
  return {kInternal, w + ": unexpected answer from lockd (" +
                         std::string(wire::to_string(wire::type_of(answer.body))) + ")"};
}

Failure deny_failure(const wire::Deny& d, std::string_view name) {
  const std::string n = "\"" + std::string(name) + "\"";
  switch (d.refusal) {
    case Refusal::unknown_name:
      return {kNotFound, "unknown name " + n + ": lockd has no record of it (never acquired, released, "
                         "or its lease expired; `leasehold names` lists the known ones)"};
    case Refusal::invalid_name:
      return {kUsage, "malformed name " + n + ": " + validate_new_name(name).message()};
    case Refusal::forbidden:
      // lockd tells nothing of a name that is not the key's: no state or epoch to print.
      return {kRefused, n + " refused by lockd: forbidden: this key may not do that: a worker key acts only on "
                            "names its own sandboxes hold (or that are bound or reserved to its worker) and "
                            "cannot revoke, transfer, reassign or list; an admin key sends no worker "
                            "messages (acquire, commit, release)"};
    case Refusal::table_full:
      return {kRefused, n + " refused by lockd: table_full: lockd's name table (--max-names) or worker "
                            "table (--max-workers) is full"};
    default:
      break;
  }
  std::string m = n + " refused by lockd: " + std::string(to_string(d.refusal)) + " (state " +
                  std::string(leasehold::to_string(d.state)) + ", epoch " + std::to_string(d.epoch);
  if (!d.holder.is_nil()) m += ", holder " + d.holder.str();
  if (!d.worker.is_nil()) m += ", worker " + d.worker.str();
  m += ")";
  return {kRefused, m};
}

// ---- supervisor -----------------------------------------------------------------------------

void add_supervisor_flags(CLI::App* sub, SupervisorFlags& f) {
  sub->add_option("--supervisor", f.socket,
                  std::string("the local supervisor's control socket (env ") + kSupervisorEnv +
                      ", default " + default_control_socket_path() + ")");
  sub->add_option("--timeout-ms", f.timeout_ms, "give up on the supervisor after this many milliseconds")
      ->check(CLI::Range(1, 600'000));
}

void resolve(SupervisorFlags& f) {
  if (f.socket.empty()) f.socket = env_or(kSupervisorEnv, default_control_socket_path().c_str());
}

std::optional<nlohmann::json> supervisor_call(SupervisorFlags flags, const nlohmann::json& request,
                                              Failure& failure) {
  resolve(flags);
  ControlCallFailure why;
  auto answer = control_call(flags.socket, request, flags.timeout_ms, why);
  if (answer) return answer;
  const std::string start_hint =
      " (start leasehold-supervisor, or point --supervisor / " + std::string(kSupervisorEnv) +
      " at its --control-socket)";
  switch (why.error) {
    case ControlCallError::bad_path: failure = {kUsage, why.message}; break;
    case ControlCallError::no_server:
    case ControlCallError::connect_failed: failure = {kNoSupervisor, why.message + start_hint}; break;
    case ControlCallError::garbled:
    case ControlCallError::internal:
    case ControlCallError::none: failure = {kInternal, why.message}; break;
    // A supervisor runs there, but this user may not use it: a refusal (as the supervisor's
    // own "unauthorized"), not a missing supervisor - starting one would not help.
    case ControlCallError::not_permitted: failure = {kRefused, "permission denied: " + why.message}; break;
    default: failure = {kNoSupervisor, why.message}; break;  // foreign, silent, closed
  }
  return std::nullopt;
}

std::optional<std::string> supervisor_worker(const std::string& socket, Failure& failure) {
  SupervisorFlags flags;
  flags.socket = socket;
  const auto status = supervisor_call(flags, {{"v", 1}, {"op", "status"}}, failure);
  if (!status) return std::nullopt;
  return status->value("worker", std::string());
}

std::optional<ControlError> answer_error(const nlohmann::json& a) {
  if (!a.is_object() || a.value("ok", false) || !a.contains("error") || !a["error"].is_string()) return std::nullopt;
  return control_error_of(a["error"].get<std::string>());
}

Failure supervisor_failure(const nlohmann::json& a, std::string_view what) {
  const std::string code = a.contains("error") && a["error"].is_string() ? a["error"].get<std::string>() : "internal";
  std::string msg = std::string(what) + ": " + a.value("message", std::string("(no message)"));
  // Name the holder and epoch unless the message already does.
  if (a.contains("holder") && a["holder"].is_string() &&
      msg.find(a["holder"].get<std::string>()) == std::string::npos) {
    const std::string holder = a["holder"].get<std::string>();
    const bool nobody = holder.empty() || holder == SandboxId{}.str();  // e.g. a lock-delay: no holder
    if (!nobody) {
      msg += " [holder " + holder;
      if (a.contains("epoch") && a["epoch"].is_number()) msg += ", epoch " + std::to_string(a["epoch"].get<std::uint64_t>());
      msg += "]";
    } else if (a.contains("epoch") && a["epoch"].is_number()) {
      msg += " [epoch " + std::to_string(a["epoch"].get<std::uint64_t>()) + "]";
    }
  }
  const bool lock_delay = a.contains("reason") && a["reason"].is_string() &&
                          refusal_of(a["reason"].get<std::string>()) == Refusal::lock_delay;
  if (lock_delay)
    msg += " (the name is grantable once the old holder's kill is confirmed or its lease would have expired; "
           "`leasehold show` with an admin key says when)";
  // With --json: the supervisor's own code and what it said of the holder.
  nlohmann::json detail = {{"reason", code}};
  for (const char* field : {"holder", "epoch"})
    if (a.contains(field)) detail[field] = a[field];
  const std::optional<ControlError> known = control_error_of(code);
  if (!known) return {kFailure, msg + " (error \"" + code + "\", a code this leasehold does not know)", detail};
  switch (class_of(*known)) {
    case ControlErrorClass::refused: return {kRefused, msg, detail};
    case ControlErrorClass::no_supervisor: return {kNoSupervisor, msg, detail};
    case ControlErrorClass::not_found: return {kNotFound, msg, detail};
    case ControlErrorClass::usage: return {kUsage, msg, detail};
    case ControlErrorClass::unreachable: return {kUnreachable, msg + " (the supervisor could not reach lockd)", detail};
    case ControlErrorClass::failure: break;
  }
  return {kFailure, msg + " (" + code + ")", detail};
}

// ---- arguments ----------------------------------------------------------------------------------

namespace {
bool check_name_by(const Status& why, std::string_view name, Failure& failure) {
  if (why.ok()) return true;
  failure = {kUsage, "malformed name \"" + std::string(name) + "\": " + why.message()};
  return false;
}
}  // namespace

bool check_name(std::string_view name, Failure& failure) { return check_name_by(validate_name(name), name, failure); }

bool check_new_name(std::string_view name, Failure& failure) {
  return check_name_by(validate_new_name(name), name, failure);
}

std::optional<SandboxId> parse_sandbox(std::string_view text, Failure& failure) {
  auto id = SandboxId::parse(text);
  if (!id || id->is_nil()) {
    failure = {kUsage, "malformed sandbox id \"" + std::string(text) +
                           "\": expected a UUID such as 0f8fad5b-d9cb-469f-a165-70867728950e"};
    return std::nullopt;
  }
  return id;
}

// ---- output -------------------------------------------------------------------------------------

nlohmann::json record_json(const wire::NameRecord& r, bool with_waiters) {
  nlohmann::json j = {{"name", r.name},
                      {"name_id", r.name_id.str()},
                      {"state", std::string(leasehold::to_string(r.state))},
                      {"epoch", r.epoch}};
  // null: no TTL (preemptible mode, where worker liveness keeps the lease)
  j["ttl_left_ms"] = r.ttl_left_ms == wire::kNoExpiryMs ? nlohmann::json(nullptr) : nlohmann::json(r.ttl_left_ms);
  j["holder"] = r.holder.is_nil() ? nlohmann::json(nullptr) : nlohmann::json(r.holder.str());
  j["worker"] = r.worker.is_nil() ? nlohmann::json(nullptr) : nlohmann::json(r.worker.str());
  j["reserved_for"] = r.reserved_for.is_nil() ? nlohmann::json(nullptr) : nlohmann::json(r.reserved_for.str());
  // null: not reserved, or the reservation's TTL has not started (a lock-delay is pending)
  j["reservation_left_ms"] = r.reserved_for.is_nil() || r.reservation_left_ms == wire::kNoExpiryMs
                                 ? nlohmann::json(nullptr)
                                 : nlohmann::json(r.reservation_left_ms);
  j["revoke_pending"] = r.revoke_pending;
  j["revoked_epoch"] = r.revoke_pending ? nlohmann::json(r.revoked_epoch) : nlohmann::json(nullptr);
  j["revoke_ended"] = r.revoke_ended == wire::RevokeEnd::none ? nlohmann::json(nullptr)
                                                                : nlohmann::json(std::string(wire::to_string(r.revoke_ended)));
  // null: lockd did not report its waiters (it predates their listing)
  j["waiters"] = with_waiters ? nlohmann::json(r.waiters) : nlohmann::json(nullptr);
  return j;
}

nlohmann::json output_json(const nlohmann::json& answer) {
  if (!answer.is_object()) return answer;
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [k, v] : answer.items()) {
    if (k == "v" || k == "id" || k == "ok") continue;
    out[k == "valid_until_ms" ? std::string("ttl_left_ms") : k] = v;
  }
  return out;
}

std::string duration_text(std::int64_t ns) {
  char buf[64];
  if (ns < 0) {
    std::snprintf(buf, sizeof buf, "-%s", duration_text(-ns).c_str());
  } else if (ns >= 10'000'000'000) {
    std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(ns) / 1e9);
  } else if (ns >= 1'000'000) {
    std::snprintf(buf, sizeof buf, "%.0f ms", static_cast<double>(ns) / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f us", static_cast<double>(ns) / 1e3);
  }
  return buf;
}

// ---- programs -----------------------------------------------------------------------------------

std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n <= 0 ? std::string() : std::string(buf, static_cast<std::size_t>(n));
}

std::string locate_service(const std::string& flag, const std::string& program, const std::string& module) {
  if (!flag.empty()) return flag;
  const std::string self = self_exe();
  const std::string dir = self.substr(0, self.rfind('/') == std::string::npos ? 0 : self.rfind('/'));
  for (const std::string& p : {dir + "/../" + module + "/" + program, dir + "/" + program}) {
    char real[4096];
    if (::access(p.c_str(), X_OK) == 0) return ::realpath(p.c_str(), real) != nullptr ? std::string(real) : p;
  }
  return find_program(program);
}

}  // namespace leasehold::cli
