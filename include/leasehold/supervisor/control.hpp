// leasehold/supervisor: the local control socket (DESIGN.md "The supervisor").
//
// A unix stream socket; every caller is checked with SO_PEERCRED (root, the supervisor's own
// uid, or a member of the configured group). Requests and answers are newline-delimited JSON
// objects, one per line, each carrying the protocol version:
//
//   → {"v":1,"id":7,"op":"run","name":"agent-1","argv":["/bin/sleep","60"],
//      "env":{"PATH":"/usr/bin:/bin"},"cwd":"/","ttl_ms":10000}
//   ← {"v":1,"id":7,"ok":true,"sandbox":"<uuid>","slot":3,"epoch":42,"pid":1234,
//      "name":"agent-1","valid_until_ms":6995}
//   ← {"v":1,"id":7,"ok":false,"error":"held","message":"...","holder":"<uuid>","epoch":41}
//
// `id` is optional and echoed verbatim (any JSON value). Operations:
//   run            {name?, argv, env?, cwd?, ttl_ms?}  acquire the name (if any), then spawn
//   name           {sandbox, name, ttl_ms?}            name a running unnamed sandbox
//   expect-commit  {name, sandbox, epoch, argv, env?, cwd?}  2-phase: commit a name a control
//                  plane acquired (Acquiring) through this worker's next heartbeat; spawn on success
//   release        {name, grace_ms?}                  stop the holder, release the name
//   kill           {sandbox, grace_ms?}               stop a sandbox (named or not); grace_ms:
//                                                     SIGTERM first, cgroup.kill after at most that
//                                                     long (capped by --stop-grace-ms, its default)
//   list           {}                                 sandboxes
//   status         {}                                 worker, modes, budgets, counters
//   logs           {sandbox} or {name}, bytes?        sandbox, log, output (the last `bytes`,
//                                                     default and at most kControlLogBytesMax),
//                                                     truncated, running
//   wait           {sandbox}                          answered when the sandbox is gone: its
//                                                     exit_status, exit_code, reason; also for one
//                                                     gone recently (the `logs` record). At most
//                                                     kControlWaitsMax at once (kControlWaitsPerUidMax
//                                                     per uid other than root)
// Error codes: the ControlError texts (control_error.hpp), among them unauthorized (the caller
// may not use this socket at all: not root, the supervisor's uid or a member of its --group) and
// forbidden (the sandbox is another caller's: only its owner and root may act on it).
//
// Bounds: kControlClientsMax connections (kControlClientsPerUidMax per --group uid, and
// kControlClientsReserved of them for root and the supervisor's user), kControlLineBytesMax per line, one request in
// progress per connection (later lines wait), kControlOutBytesMax of unsent answers, a partial
// line older than kControlLineTimeoutMs closes the connection, and so does kControlIdleTimeoutMs
// without a request (or a new connection arriving while all kControlClientsMax are taken: the
// least recently active idle one goes; only when none is idle is the newcomer refused "busy").
#pragma once

#include "leasehold/lease/result.hpp"
#include "leasehold/lease/types.hpp"
#include "leasehold/supervisor/control_error.hpp"
#include "leasehold/supervisor/ports.hpp"

#include <nlohmann/json.hpp>

#include <sys/socket.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace leasehold {

inline constexpr int kControlProtocolVersion = 1;
inline constexpr std::size_t kControlLineBytesMax = 64 * 1024;
inline constexpr std::size_t kControlClientsMax = 64;
/// Connections of callers other than root and the supervisor's own user (members of --group):
/// at most kControlClientsPerUidMax of one uid, and at most kControlClientsMax −
/// kControlClientsReserved of all such uids together, so that one member cannot take every
/// connection (with partial lines, which are never idle) and root always finds one.
inline constexpr std::size_t kControlClientsPerUidMax = 16;
inline constexpr std::size_t kControlClientsReserved = 16;
inline constexpr std::size_t kControlOutBytesMax = 16 * 1024 * 1024;
inline constexpr std::uint64_t kControlLineTimeoutMs = 5'000;
/// A connection with nothing in progress (no partial line, no request, no unsent answer) is
/// closed after this long, and the least recently active such connection makes room when a
/// new one arrives at kControlClientsMax: idle or leaked clients cannot lock others out.
inline constexpr std::uint64_t kControlIdleTimeoutMs = 60'000;
inline constexpr std::size_t kControlArgvMax = 1024;
/// Most bytes of a sandbox's output one `logs` answer carries (its tail).
inline constexpr std::uint64_t kControlLogBytesMax = 1u << 20;
inline constexpr std::size_t kControlEnvMax = 1024;
/// `wait` requests answered later, at most, in total and per caller uid other than root: a
/// waiting connection is busy (never idle, never evicted), so waits alone must not take all
/// kControlClientsMax connections.
inline constexpr std::size_t kControlWaitsMax = kControlClientsMax / 2;
inline constexpr std::size_t kControlWaitsPerUidMax = 8;
/// Of kControlWaitsMax, this many are kept for root and the supervisor's own user: callers of
/// other uids (members of --group) together wait on at most kControlWaitsMax − this.
inline constexpr std::size_t kControlWaitsReserved = 8;
/// A line a request with `"queue": true` may get before its answer: `"progress"` and no `"ok"`
/// (control_call skips such lines; docs/PROTOCOL.md "A run that waits for its name").
bool is_control_progress(const nlohmann::json& line);

enum class ControlOp : std::uint8_t { run, name, expect_commit, release, kill, list, status, logs, wait };
std::string_view to_string(ControlOp op) noexcept;

/// A parsed, validated control request. Fields not used by `op` stay empty.
struct ControlRequest {
  ControlOp op = ControlOp::status;
  nlohmann::json id;                     ///< echoed in the answer (null when absent)
  std::optional<std::string> name;       ///< run (optional), name, expect-commit, release
  std::vector<std::string> argv;         ///< run, expect-commit; argv[0] is the program
  std::vector<std::string> env;          ///< "KEY=VALUE" entries
  std::string cwd = "/";
  std::optional<std::uint64_t> ttl_ms;   ///< run, name
  /// run with a name: a held name is waited for in lockd's FIFO of waiters (wire::Wait)
  /// instead of refused; answered once the sandbox runs under it, or after
  /// queue_timeout_ms (nullopt: no limit) with `timeout`.
  bool queue = false;
  std::optional<std::uint64_t> queue_timeout_ms;
  /// run: the client will `wait` for the sandbox's exit (`run --wait`): refused `busy` before
  /// anything starts when the caller could not wait now (the bounds of `wait`).
  bool attach = false;
  std::optional<SandboxId> sandbox;      ///< name, expect-commit, kill, wait, logs (or `name`)
  /// release, kill: how long the sandbox may take to exit after SIGTERM before cgroup.kill
  /// (nullopt: the supervisor's --stop-grace-ms; larger values are capped by it).
  std::optional<std::uint64_t> grace_ms;
  std::uint64_t bytes = 0;               ///< logs: tail length; 0 = kControlLogBytesMax
  Epoch epoch = 0;                       ///< expect-commit
  /// Who sent it (SO_PEERCRED at connect), set by ControlServer; (uid_t)-1 when unknown. A
  /// sandbox runs as its non-root caller's uid and gid (supervisor/spawn.hpp "Isolation").
  uid_t caller_uid = static_cast<uid_t>(-1);
  gid_t caller_gid = static_cast<gid_t>(-1);
};

/// Either a request or an error answer (code + message) to send back.
struct ControlParse {
  std::optional<ControlRequest> request;
  ControlError error = ControlError::internal;  ///< why there is no request (unused when there is one)
  std::string message;  ///< what is wrong, naming the field
  nlohmann::json id;    ///< the request's id if it could be read
};

/// Parses one line (without the newline). Never throws.
ControlParse parse_control_request(std::string_view line);

/// An answer line (with newline) for success: {"v":1,"id":..,"ok":true, ...fields}.
std::string control_ok(const nlohmann::json& id, nlohmann::json fields = nlohmann::json::object());
/// An error answer line: {"v":1,"id":..,"ok":false,"error":code,"message":..., ...extra}.
std::string control_error(const nlohmann::json& id, ControlError code, std::string_view message,
                          nlohmann::json extra = nlohmann::json::object());

/// Who may connect (SO_PEERCRED): uid 0, `owner_uid`, or a member of `group_gid` (primary or
/// supplementary, from SO_PEERGROUPS: the credentials of the connecting process itself, never
/// read from /proc/<pid> of a pid that may have been reused).
struct ControlAccess {
  uid_t owner_uid = 0;
  std::optional<gid_t> group_gid;
};
/// Resolves a group name. Errors: not_found for an unknown group, or getgrnam_r's errno
/// (errc_of_errno); the message names the group.
Result<gid_t> resolve_group(const std::string& name);

/// The control socket server. Not thread-safe: owned by the io thread, driven by readiness
/// (the owner polls `watch_fds()` and calls `on_ready`).
class ControlServer final : public ControlPort {
 public:
  /// Called for every parsed request; the handler answers with `reply` now or later.
  using Handler = std::function<void(ControlClientId, ControlRequest)>;
  /// Called when a connection closes (the peer hung up, an error, eviction): an answer still
  /// owed to it (a `wait`) is dropped.
  using CloseHandler = std::function<void(ControlClientId)>;

  ControlServer(ControlAccess access, Handler handler);
  ~ControlServer();
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  /// Creates the parent directory (0755 root-owned, or 0700), removes a stale socket file (one
  /// nobody listens on), binds, chmods 0660 with the group (0600 without), listens.
  /// Errors, the message naming the path and the cause: invalid_argument (path empty or too
  /// long, not a socket, the directory not a directory), permission_denied (a directory of
  /// another owner or a wider mode), busy (another supervisor is listening there), or the errno
  /// of the failed step (errc_of_errno).
  Status open(const std::string& path);
  void close_all();
  void set_close_handler(CloseHandler h) { on_close_ = std::move(h); }

  struct Watch {
    int fd;
    short events;  ///< POLLIN and/or POLLOUT
  };
  /// The fds to poll now (the listening socket first).
  std::vector<Watch> watch_fds() const;
  /// Handles readiness of `fd` (revents from poll). `now_ms` drives the line timeout.
  void on_ready(int fd, short revents, std::uint64_t now_ms);
  /// Closes connections whose partial line is older than kControlLineTimeoutMs.
  void tick(std::uint64_t now_ms);

  /// Sends an answer line (from control_ok / control_error) to a client; dropped if the client
  /// is gone. Unblocks the client's next request.
  void reply(ControlClientId client, const std::string& line) override;
  /// A progress line before the answer: written now, the request stays in progress.
  void progress(ControlClientId client, const std::string& line) override;
  /// The client's end is closed (a peek reads end of file or an error) or it was dropped.
  bool client_gone(ControlClientId client) const override;

  int listen_fd() const noexcept { return listen_fd_; }
  std::size_t clients() const noexcept { return clients_.size(); }
  const std::string& path() const noexcept { return path_; }
  /// Counters for `status`.
  std::uint64_t rejected_unauthorized() const noexcept { return rejected_unauthorized_; }
  std::uint64_t rejected_busy() const noexcept { return rejected_busy_; }
  std::uint64_t closed_idle() const noexcept { return closed_idle_; }
  /// Connections whose peer had closed before its requests were read: not carried out.
  std::uint64_t dropped_closed() const noexcept { return dropped_closed_; }
  std::uint64_t bad_requests() const noexcept { return bad_requests_; }

 private:
  struct Client {
    ControlClientId id = 0;
    int fd = -1;
    std::string in;
    std::string out;
    bool busy = false;         // a request is being handled
    bool closing = false;      // close once `out` is flushed
    std::uint64_t partial_since_ms = 0;
    std::uint64_t active_ms = 0;  // last accept, read or answer
    uid_t uid = static_cast<uid_t>(-1);  // SO_PEERCRED at accept
    gid_t gid = static_cast<gid_t>(-1);
    bool idle() const noexcept { return in.empty() && out.empty() && !busy && !closing; }
  };
  void accept_ready();
  /// Closes the least recently active idle connection of a uid `of` accepts (any when empty),
  /// if there is one (with an "idle" error line).
  bool evict_idle(const std::function<bool(uid_t)>& of = {});
  /// Root and the supervisor's own user: never counted against the per-uid bounds.
  bool privileged(uid_t uid) const noexcept { return uid == 0 || uid == access_.owner_uid; }
  /// Why a connection of `uid` cannot be accepted now, after closing an idle one to make room
  /// where it can; "" when it can.
  std::string admit(uid_t uid);
  void read_ready(Client& c, std::uint64_t now_ms);
  void write_ready(Client& c);
  void dispatch(Client& c, std::uint64_t now_ms);
  void send_and_close(Client& c, const std::string& line);
  void drop(int fd);
  /// The caller's credentials when it may connect; permission_denied saying who it is otherwise,
  /// or the errno of reading its credentials or groups.
  Result<ucred> authorized(int fd) const;

  ControlAccess access_;
  Handler handler_;
  CloseHandler on_close_;
  std::string path_;
  int listen_fd_ = -1;
  ControlClientId next_id_ = 1;
  std::map<int, Client> clients_;  // by fd
  std::uint64_t rejected_unauthorized_ = 0;
  std::uint64_t rejected_busy_ = 0;
  std::uint64_t closed_idle_ = 0;
  std::uint64_t dropped_closed_ = 0;
  std::uint64_t bad_requests_ = 0;
  ControlClientId dispatching_ = 0;  // reply() to the client being dispatched must not recurse
};

// ---- the client side (the CLI, tests) ----------------------------------------------------------

/// Longest answer line a client reads from the control socket.
inline constexpr std::size_t kControlAnswerBytesMax = 16 * 1024 * 1024;

/// Why connecting to or calling the control socket failed; the CLI maps each to an exit code.
enum class ControlCallError : std::uint8_t {
  none,
  bad_path,        ///< the path is empty or longer than sun_path
  no_server,       ///< nobody listens there (ENOENT, ECONNREFUSED, ENOTDIR)
  not_permitted,   ///< connect(2) was refused (EACCES, EPERM): the socket's mode or group
  connect_failed,  ///< another connect(2) error
  foreign_server,  ///< the server is neither root nor this user: nothing was sent to it
  no_answer,       ///< no answer line within the timeout
  closed,          ///< the server closed the connection without an answer
  garbled,         ///< the answer is not a control answer (a JSON object with "ok"), or too long
  internal,        ///< socket(2) or getsockopt(2) failed
};

struct ControlCallFailure {
  ControlCallError error = ControlCallError::none;
  std::string message;  ///< names the socket and the cause (and, for foreign_server, both uids)
  bool failed() const noexcept { return error != ControlCallError::none; }
};
/// A failure as a Status: bad_path invalid_argument, no_server not_found, not_permitted and
/// foreign_server permission_denied, no_answer timeout, garbled corrupt, the others io_error.
/// Must be failed().
Status control_call_status(const ControlCallFailure& failure);

/// A connected control socket whose server passed the check of control_connect. Owns the fd.
class ControlConnection {
 public:
  ControlConnection() = default;
  ControlConnection(int fd, ucred server) noexcept : fd_(fd), server_(server) {}
  ControlConnection(ControlConnection&& o) noexcept : fd_(o.fd_), server_(o.server_) { o.fd_ = -1; }
  ControlConnection& operator=(ControlConnection&& o) noexcept;
  ControlConnection(const ControlConnection&) = delete;
  ControlConnection& operator=(const ControlConnection&) = delete;
  ~ControlConnection();
  explicit operator bool() const noexcept { return fd_ >= 0; }
  int fd() const noexcept { return fd_; }
  /// The server's credentials (SO_PEERCRED of a listening socket: the process that called listen).
  const ucred& server() const noexcept { return server_; }
  /// Gives up ownership of the fd (the caller closes it).
  int release() noexcept {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
  ucred server_{};
};

/// The uids whose control socket server this process trusts with a request (a command line and
/// an environment): root, and this process's own euid (a per-user supervisor).
bool trusted_control_server(uid_t server_uid) noexcept;

/// Connects to the control socket at `socket_path` and checks who serves it (SO_PEERCRED)
/// before anything is sent: a server that is neither root nor this process's euid is refused
/// (foreign_server, naming the socket, the server's uid and pid, and the uids expected). An
/// empty connection with `failure` set otherwise. Ablation for the attack tests only
/// (LEASEHOLD_ABLATE contains "unchecked-control-server"): the server's uid is not checked.
ControlConnection control_connect(const std::string& socket_path, ControlCallFailure& failure);

/// A blocking client for the control socket (the CLI, tests): control_connect, then one request
/// line out, one answer line in (at most kControlAnswerBytesMax, within `timeout_ms`). An answer
/// that a server sent before it closed (a refusal such as "busy") is read even if the send
/// failed. Returns the answer (a JSON object with "ok"), or nullopt with `failure` set.
std::optional<nlohmann::json> control_call(const std::string& socket_path, const nlohmann::json& request,
                                           std::uint64_t timeout_ms, ControlCallFailure& failure);
/// The same, with the failure as a Status (control_call_status): the message as
/// ControlCallFailure's.
Result<nlohmann::json> control_call(const std::string& socket_path, const nlohmann::json& request,
                                    std::uint64_t timeout_ms);

}  // namespace leasehold
