#include "leasehold/supervisor/control.hpp"

#include "leasehold/lease/clock.hpp"

#include "leasehold/supervisor/config.hpp"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <algorithm>

namespace leasehold {
namespace {

std::string octal(unsigned mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", mode & 07777);
  return buf;
}

using nlohmann::json;

std::string errno_text(int e) { return std::string(std::strerror(e)); }

/// CLOCK_BOOTTIME now, in whole ms: the clock of the control socket's idle and request timeouts.
std::uint64_t boottime_ms() noexcept { return static_cast<std::uint64_t>(boottime_ns()) / 1'000'000; }

struct FieldError {
  std::string message;
};

// Typed field readers: each names the field in its error.
std::string get_string(const json& j, const char* field, std::size_t max_bytes) {
  const auto& v = j.at(field);
  if (!v.is_string()) throw FieldError{std::string("field \"") + field + "\" must be a string"};
  std::string s = v.get<std::string>();
  if (s.size() > max_bytes)
    throw FieldError{std::string("field \"") + field + "\" is longer than " +
                     std::to_string(max_bytes) + " bytes"};
  return s;
}

std::uint64_t get_u64(const json& j, const char* field) {
  const auto& v = j.at(field);
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<std::int64_t>() >= 0))
    throw FieldError{std::string("field \"") + field + "\" must be a non-negative integer"};
  return v.get<std::uint64_t>();
}

SandboxId get_sandbox(const json& j, const char* field) {
  const std::string s = get_string(j, field, 64);
  auto id = SandboxId::parse(s);
  if (!id || id->is_nil())
    throw FieldError{std::string("field \"") + field + "\" is not a sandbox id (UUID): \"" + s + "\""};
  return *id;
}

std::string get_name(const json& j, const char* field) {
  const std::string s = get_string(j, field, 4096);
  const Status why = validate_name(s);
  if (!why.ok()) throw FieldError{std::string("field \"") + field + "\": " + why.message()};
  return s;
}

/// A name to acquire (run, name): validate_new_name's rule too.
std::string get_new_name(const json& j, const char* field) {
  const std::string s = get_name(j, field);
  const Status why = validate_new_name(s);
  if (!why.ok()) throw FieldError{std::string("field \"") + field + "\": " + why.message()};
  return s;
}

void read_command(const json& j, ControlRequest& r) {
  if (!j.contains("argv")) throw FieldError{"field \"argv\" is required (the command to run)"};
  const auto& argv = j.at("argv");
  if (!argv.is_array() || argv.empty())
    throw FieldError{"field \"argv\" must be a non-empty array of strings"};
  if (argv.size() > kControlArgvMax)
    throw FieldError{"field \"argv\" has " + std::to_string(argv.size()) + " entries; the limit is " +
                     std::to_string(kControlArgvMax)};
  for (const auto& a : argv) {
    if (!a.is_string()) throw FieldError{"field \"argv\" must contain only strings"};
    std::string s = a.get<std::string>();
    if (s.find('\0') != std::string::npos) throw FieldError{"field \"argv\" contains a NUL byte"};
    r.argv.push_back(std::move(s));
  }
  if (r.argv.front().empty()) throw FieldError{"field \"argv\": argv[0] (the program) is empty"};
  if (j.contains("env")) {
    const auto& env = j.at("env");
    if (env.size() > kControlEnvMax)
      throw FieldError{"field \"env\" has " + std::to_string(env.size()) + " entries; the limit is " +
                       std::to_string(kControlEnvMax)};
    if (env.is_object()) {
      for (const auto& [k, v] : env.items()) {
        if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos)
          throw FieldError{"field \"env\": bad variable name \"" + k + "\""};
        if (!v.is_string()) throw FieldError{"field \"env\": value of \"" + k + "\" must be a string"};
        std::string value = v.get<std::string>();
        if (value.find('\0') != std::string::npos)
          throw FieldError{"field \"env\": value of \"" + k + "\" contains a NUL byte"};
        r.env.push_back(k + "=" + value);
      }
    } else if (env.is_array()) {
      for (const auto& e : env) {
        if (!e.is_string()) throw FieldError{"field \"env\" must contain only \"KEY=VALUE\" strings"};
        std::string s = e.get<std::string>();
        const auto eq = s.find('=');
        if (eq == std::string::npos || eq == 0 || s.find('\0') != std::string::npos)
          throw FieldError{"field \"env\": \"" + s + "\" is not KEY=VALUE"};
        r.env.push_back(std::move(s));
      }
    } else {
      throw FieldError{"field \"env\" must be an object {\"KEY\":\"VALUE\"} or an array of \"KEY=VALUE\""};
    }
  }
  if (j.contains("cwd")) {
    r.cwd = get_string(j, "cwd", 4096);
    if (r.cwd.empty() || r.cwd.front() != '/') throw FieldError{"field \"cwd\" must be an absolute path"};
  }
}

std::optional<ControlOp> op_of(std::string_view s) {
  if (s == "run") return ControlOp::run;
  if (s == "name") return ControlOp::name;
  if (s == "expect-commit") return ControlOp::expect_commit;
  if (s == "release") return ControlOp::release;
  if (s == "kill") return ControlOp::kill;
  if (s == "list") return ControlOp::list;
  if (s == "status") return ControlOp::status;
  if (s == "logs") return ControlOp::logs;
  if (s == "wait") return ControlOp::wait;
  return std::nullopt;
}

}  // namespace

std::string_view to_string(ControlOp op) noexcept {
  switch (op) {
    case ControlOp::run: return "run";
    case ControlOp::name: return "name";
    case ControlOp::expect_commit: return "expect-commit";
    case ControlOp::release: return "release";
    case ControlOp::kill: return "kill";
    case ControlOp::list: return "list";
    case ControlOp::status: return "status";
    case ControlOp::logs: return "logs";
    case ControlOp::wait: return "wait";
  }
  return "?";
}

ControlParse parse_control_request(std::string_view line) {
  ControlParse p;
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    p.error = ControlError::bad_json;
    p.message = "the request is not valid JSON (one JSON object per line)";
    return p;
  }
  if (!j.is_object()) {
    p.error = ControlError::bad_json;
    p.message = "the request must be a JSON object";
    return p;
  }
  if (j.contains("id")) p.id = j.at("id");
  if (!j.contains("v") || !j.at("v").is_number_integer()) {
    p.error = ControlError::bad_version;
    p.message = "field \"v\" (protocol version, integer) is required; this supervisor speaks v" +
                std::to_string(kControlProtocolVersion);
    return p;
  }
  if (j.at("v").get<std::int64_t>() != kControlProtocolVersion) {
    p.error = ControlError::bad_version;
    p.message = "protocol version " + j.at("v").dump() + " is not supported; this supervisor speaks v" +
                std::to_string(kControlProtocolVersion);
    return p;
  }
  if (!j.contains("op") || !j.at("op").is_string()) {
    p.error = ControlError::bad_request;
    p.message = "field \"op\" (string) is required: run, name, expect-commit, release, kill, list, status, logs, wait";
    return p;
  }
  const std::string op_text = j.at("op").get<std::string>();
  const auto op = op_of(op_text);
  if (!op) {
    p.error = ControlError::unknown_op;
    p.message = "unknown op \"" + op_text.substr(0, 64) +
                "\"; known: run, name, expect-commit, release, kill, list, status, logs, wait";
    return p;
  }
  ControlRequest r;
  r.op = *op;
  r.id = p.id;
  try {
    switch (r.op) {
      case ControlOp::run:
        if (j.contains("name") && !j.at("name").is_null()) r.name = get_new_name(j, "name");
        read_command(j, r);
        if (j.contains("ttl_ms")) r.ttl_ms = get_u64(j, "ttl_ms");
        if (j.contains("queue")) {
          if (!j.at("queue").is_boolean()) throw FieldError{"field \"queue\" must be true or false"};
          r.queue = j.at("queue").get<bool>();
        }
        if (j.contains("queue_timeout_ms")) r.queue_timeout_ms = get_u64(j, "queue_timeout_ms");
        if (j.contains("attach")) {
          if (!j.at("attach").is_boolean()) throw FieldError{"field \"attach\" must be true or false"};
          r.attach = j.at("attach").get<bool>();
        }
        if (r.queue && !r.name) throw FieldError{"field \"queue\" needs a \"name\" to wait for"};
        if (r.queue_timeout_ms && !r.queue) throw FieldError{"field \"queue_timeout_ms\" needs \"queue\": true"};
        break;
      case ControlOp::name:
        if (!j.contains("sandbox")) throw FieldError{"field \"sandbox\" is required"};
        if (!j.contains("name")) throw FieldError{"field \"name\" is required"};
        r.sandbox = get_sandbox(j, "sandbox");
        r.name = get_new_name(j, "name");
        if (j.contains("ttl_ms")) r.ttl_ms = get_u64(j, "ttl_ms");
        break;
      case ControlOp::expect_commit:
        if (!j.contains("sandbox")) throw FieldError{"field \"sandbox\" is required"};
        if (!j.contains("name")) throw FieldError{"field \"name\" is required"};
        if (!j.contains("epoch")) throw FieldError{"field \"epoch\" is required"};
        r.sandbox = get_sandbox(j, "sandbox");
        r.name = get_name(j, "name");
        r.epoch = get_u64(j, "epoch");
        if (r.epoch == 0) throw FieldError{"field \"epoch\" must be > 0 (the epoch of the Acquiring grant)"};
        read_command(j, r);
        break;
      case ControlOp::release:
        if (!j.contains("name")) throw FieldError{"field \"name\" is required"};
        r.name = get_name(j, "name");
        if (j.contains("grace_ms")) r.grace_ms = get_u64(j, "grace_ms");
        break;
      case ControlOp::kill:
        if (!j.contains("sandbox")) throw FieldError{"field \"sandbox\" is required"};
        r.sandbox = get_sandbox(j, "sandbox");
        if (j.contains("grace_ms")) r.grace_ms = get_u64(j, "grace_ms");
        break;
      case ControlOp::wait:
        if (!j.contains("sandbox")) throw FieldError{"field \"sandbox\" is required"};
        r.sandbox = get_sandbox(j, "sandbox");
        break;
      case ControlOp::logs:
        if (j.contains("sandbox") == j.contains("name")) throw FieldError{"one of \"sandbox\" and \"name\" is required"};
        if (j.contains("sandbox")) r.sandbox = get_sandbox(j, "sandbox");
        else r.name = get_name(j, "name");
        if (j.contains("bytes")) {
          r.bytes = get_u64(j, "bytes");
          if (r.bytes == 0 || r.bytes > kControlLogBytesMax)
            throw FieldError{"field \"bytes\" must be in 1.." + std::to_string(kControlLogBytesMax)};
        }
        break;
      case ControlOp::list:
      case ControlOp::status:
        break;
    }
  } catch (const FieldError& e) {
    p.error = ControlError::bad_request;
    p.message = std::string(to_string(r.op)) + ": " + e.message;
    return p;
  } catch (const std::exception& e) {
    p.error = ControlError::bad_request;
    p.message = std::string(to_string(r.op)) + ": " + e.what();
    return p;
  }
  p.request = std::move(r);
  return p;
}

std::string control_ok(const json& id, json fields) {
  json j = json::object();
  j["v"] = kControlProtocolVersion;
  j["id"] = id;
  j["ok"] = true;
  for (auto& [k, v] : fields.items()) j[k] = v;
  return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string control_error(const json& id, ControlError code, std::string_view message, json extra) {
  json j = json::object();
  j["v"] = kControlProtocolVersion;
  j["id"] = id;
  j["ok"] = false;
  j["error"] = std::string(to_string(code));
  j["message"] = std::string(message);
  for (auto& [k, v] : extra.items()) j[k] = v;
  return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

Result<gid_t> resolve_group(const std::string& name) {
  std::vector<char> buf(16384);
  group g{};
  group* out = nullptr;
  const int rc = getgrnam_r(name.c_str(), &g, buf.data(), buf.size(), &out);
  if (rc != 0) return Status::from_errno(rc, "unknown group \"" + name + "\"");
  if (out == nullptr) return Status{Errc::not_found, "unknown group \"" + name + "\""};
  return out->gr_gid;
}

// ---------------------------------------------------------------------------------------------

ControlServer::ControlServer(ControlAccess access, Handler handler)
    : access_(access), handler_(std::move(handler)) {}

ControlServer::~ControlServer() { close_all(); }

void ControlServer::close_all() {
  for (auto& [fd, c] : clients_) ::close(fd);
  clients_.clear();
  if (listen_fd_ >= 0) {
    ::close(listen_fd_);
    listen_fd_ = -1;
    if (!path_.empty()) ::unlink(path_.c_str());
  }
}

Status ControlServer::open(const std::string& path) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path))
    return Status::invalid("control socket path \"" + path + "\" is empty or longer than " +
                           std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  // Parent directory: create one level if missing.
  const auto slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    const std::string dir = path.substr(0, slash);
    struct stat st{};
    const mode_t mode = access_.group_gid ? 0750 : 0700;
    const bool created = ::stat(dir.c_str(), &st) != 0;
    if (created) {
      if (::mkdir(dir.c_str(), geteuid() == 0 ? 0755 : mode) != 0 && errno != EEXIST)
        return Status::from_errno(errno, "cannot create the control socket directory " + dir);
      if (access_.group_gid && ::chown(dir.c_str(), static_cast<uid_t>(-1), *access_.group_gid) != 0)
        return Status::from_errno(errno, "cannot chgrp " + dir);
    }
    // A non-root supervisor's own directory (the default one, or one it just created) must be
    // its own and closed to others: whoever else could write it could replace the socket.
    if (geteuid() != 0 && (created || dir == runtime_dir())) {
      if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
        return Status::invalid("control socket directory " + dir + " is not a directory");
      if (st.st_uid != geteuid() || (st.st_mode & 07777 & ~mode) != 0)
        return Status{Errc::permission_denied,
                      "control socket directory " + dir + " is owned by uid " + std::to_string(st.st_uid) +
                          " with mode " + octal(st.st_mode & 07777) + ": it must be this user's (uid " +
                          std::to_string(geteuid()) + ") with mode " + octal(mode) + " or stricter; fix: chmod " +
                          octal(mode) + " " + dir};
    }
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  addr.sun_family = AF_UNIX;
  // A socket file already there: refuse if someone listens on it, else it is stale.
  struct stat st{};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return Status::invalid("control socket path " + path + " exists and is not a socket");
    const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe >= 0) {
      const int rc = ::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
      ::close(probe);
      if (rc == 0)
        return Status{Errc::busy, "another process is listening on the control socket " + path +
                                      " (is a supervisor already running? use --control-socket)"};
    }
    ::unlink(path.c_str());
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Status::from_errno(errno, "control socket " + path + ": socket(AF_UNIX)");
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const int e = errno;
    ::close(fd);
    return Status::from_errno(e, "cannot bind the control socket " + path);
  }
  const mode_t mode = access_.group_gid ? 0660 : 0600;
  if (access_.group_gid && ::chown(path.c_str(), static_cast<uid_t>(-1), *access_.group_gid) != 0) {
    const int e = errno;
    ::close(fd);
    ::unlink(path.c_str());
    return Status::from_errno(e, "cannot chgrp the control socket " + path);
  }
  ::chmod(path.c_str(), mode);
  if (::listen(fd, static_cast<int>(kControlClientsMax)) != 0) {
    const int e = errno;
    ::close(fd);
    ::unlink(path.c_str());
    return Status::from_errno(e, "listen on " + path);
  }
  listen_fd_ = fd;
  path_ = path;
  return {};
}

std::vector<ControlServer::Watch> ControlServer::watch_fds() const {
  std::vector<Watch> w;
  if (listen_fd_ < 0) return w;
  w.push_back({listen_fd_, POLLIN});
  for (const auto& [fd, c] : clients_) {
    short ev = 0;
    if (!c.closing) ev |= POLLIN;
    if (!c.out.empty()) ev |= POLLOUT;
    w.push_back({fd, ev});
  }
  return w;
}

Result<ucred> ControlServer::authorized(int fd) const {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    return Status::from_errno(errno, "cannot read the caller's credentials (SO_PEERCRED)");
  if (cred.uid == 0 || cred.uid == access_.owner_uid) return cred;
  if (access_.group_gid) {
    if (cred.gid == *access_.group_gid) return cred;
    // Supplementary groups of the connecting process, from the socket (Linux 4.13); never
    // from /proc/<pid>/status, whose pid may belong to another process by now.
    std::vector<gid_t> groups(64);
    for (;;) {
      socklen_t bytes = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
      if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &bytes) == 0) {
        groups.resize(bytes / sizeof(gid_t));
        break;
      }
      if (errno == ERANGE && groups.size() < 65536) {
        groups.resize(std::max<std::size_t>(bytes / sizeof(gid_t), groups.size() * 2));
        continue;
      }
      return Status::from_errno(errno, "cannot read the caller's groups (SO_PEERGROUPS)");
    }
    for (gid_t g : groups)
      if (g == *access_.group_gid) return cred;
  }
  return Status{Errc::permission_denied, "uid " + std::to_string(cred.uid) + " (pid " + std::to_string(cred.pid) +
                                             ") is not root, the supervisor's user, or a member of the allowed group"};
}

void ControlServer::accept_ready() {
  for (int i = 0; i < static_cast<int>(kControlClientsMax); ++i) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN, or a transient error: poll again later
    const Result<ucred> caller = authorized(fd);
    if (!caller) {
      ++rejected_unauthorized_;
      const std::string line = control_error(nullptr, ControlError::unauthorized, caller.message());
      [[maybe_unused]] const ssize_t n = ::send(fd, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      ::close(fd);
      continue;
    }
    if (const std::string why = admit(caller->uid); !why.empty()) {
      ++rejected_busy_;
      const std::string line = control_error(nullptr, ControlError::busy, why);
      [[maybe_unused]] const ssize_t n = ::send(fd, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      ::close(fd);
      continue;
    }
    Client c;
    c.id = next_id_++;
    c.fd = fd;
    c.active_ms = boottime_ms();
    c.uid = caller->uid;
    c.gid = caller->gid;
    clients_.emplace(fd, std::move(c));
  }
}

std::string ControlServer::admit(uid_t uid) {
  // The LEASEHOLD_ABLATE switch of the attack test: without the per-uid bounds, one member of
  // --group holding partial lines on every connection locks root out.
  if (!privileged(uid) && !ablated("control-uid-cap")) {
    std::size_t mine = 0, members = 0;
    for (const auto& [fd, c] : clients_) {
      if (privileged(c.uid)) continue;
      ++members;
      mine += c.uid == uid;
    }
    if (mine >= kControlClientsPerUidMax && !evict_idle([uid](uid_t u) { return u == uid; }))
      return "too many control connections of uid " + std::to_string(uid) + " (limit " +
             std::to_string(kControlClientsPerUidMax) + " per uid other than root's and the supervisor's)";
    if (mine < kControlClientsPerUidMax && members >= kControlClientsMax - kControlClientsReserved &&
        !evict_idle([this](uid_t u) { return !privileged(u); }))
      return "too many control connections of --group members (limit " +
             std::to_string(kControlClientsMax - kControlClientsReserved) + "; the other " +
             std::to_string(kControlClientsReserved) + " are kept for root and the supervisor's user)";
  }
  if (clients_.size() >= kControlClientsMax && !evict_idle())
    return "too many control connections (limit " + std::to_string(kControlClientsMax) + ")";
  return {};
}

bool ControlServer::evict_idle(const std::function<bool(uid_t)>& of) {
  Client* oldest = nullptr;
  for (auto& [fd, c] : clients_)
    if (c.idle() && (!of || of(c.uid)) && (oldest == nullptr || c.active_ms < oldest->active_ms)) oldest = &c;
  if (oldest == nullptr) return false;
  ++closed_idle_;
  const std::string line = control_error(nullptr, ControlError::idle, "idle connection closed to make room for another");
  [[maybe_unused]] const ssize_t n = ::send(oldest->fd, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  drop(oldest->fd);
  return true;
}

void ControlServer::on_ready(int fd, short revents, std::uint64_t now_ms) {
  if (fd == listen_fd_) {
    accept_ready();
    return;
  }
  auto it = clients_.find(fd);
  if (it == clients_.end()) return;
  Client& c = it->second;
  if (revents & POLLOUT) write_ready(c);
  if (!clients_.contains(fd)) return;
  if (revents & (POLLIN | POLLHUP | POLLERR)) read_ready(c, now_ms);
}

void ControlServer::drop(int fd) {
  auto it = clients_.find(fd);
  if (it == clients_.end()) return;
  const ControlClientId id = it->second.id;
  const bool owed = it->second.busy;
  ::close(fd);
  clients_.erase(it);
  if (owed && on_close_) on_close_(id);
}

void ControlServer::send_and_close(Client& c, const std::string& line) {
  c.out += line;
  c.closing = true;
  c.in.clear();
  write_ready(c);
}

void ControlServer::read_ready(Client& c, std::uint64_t now_ms) {
  char buf[16384];
  const int fd = c.fd;
  // Read what is there first: if the peer has already closed, its requests are not carried out
  // (a client that gave up on a frozen supervisor must not find its sandbox started later).
  bool eof = false;
  for (int round = 0; round < 64; ++round) {  // bounded work per readiness event
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) {
      eof = true;
      break;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      drop(fd);
      return;
    }
    if (c.closing) continue;  // discard input after a fatal error
    c.active_ms = now_ms;
    if (c.in.empty()) c.partial_since_ms = now_ms;
    c.in.append(buf, static_cast<std::size_t>(n));
    if (c.in.size() > kControlLineBytesMax * 4) break;
  }
  if (eof) {  // answers in flight are dropped too
    ++dropped_closed_;
    drop(fd);
    return;
  }
  if (c.closing) return;
  dispatch(c, now_ms);
  auto it = clients_.find(fd);
  if (it == clients_.end()) return;
  Client& live = it->second;
  if (live.closing) return;
  const auto nl = live.in.find('\n');
  if (nl == std::string::npos ? live.in.size() > kControlLineBytesMax : nl > kControlLineBytesMax) {
    ++bad_requests_;
    send_and_close(live, control_error(nullptr, ControlError::too_long,
                                       "request line longer than " + std::to_string(kControlLineBytesMax) +
                                           " bytes; connection closed"));
    return;
  }
  if (live.in.size() > kControlLineBytesMax * 4) {
    ++bad_requests_;
    send_and_close(live, control_error(nullptr, ControlError::too_long, "too many pipelined requests; connection closed"));
  }
}

void ControlServer::dispatch(Client& c, std::uint64_t now_ms) {
  while (!c.busy && !c.closing) {
    const auto nl = c.in.find('\n');
    if (nl == std::string::npos) return;
    if (nl > kControlLineBytesMax) return;  // read_ready refuses it
    std::string line = c.in.substr(0, nl);
    c.in.erase(0, nl + 1);
    if (!c.in.empty()) c.partial_since_ms = now_ms;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;  // blank line
    ControlParse p = parse_control_request(line);
    if (!p.request) {
      ++bad_requests_;
      const int fd = c.fd;
      c.out += control_error(p.id, p.error, p.message);
      write_ready(c);
      if (!clients_.contains(fd)) return;
      continue;
    }
    c.busy = true;
    p.request->caller_uid = c.uid;
    p.request->caller_gid = c.gid;
    const ControlClientId id = c.id;
    const int fd = c.fd;
    const ControlClientId outer = dispatching_;
    dispatching_ = id;
    handler_(id, std::move(*p.request));  // may call reply() synchronously
    dispatching_ = outer;
    if (!clients_.contains(fd)) return;  // reply() dropped it
    // The loop goes on only if the handler already answered (c.busy cleared by reply()).
  }
}

void ControlServer::write_ready(Client& c) {
  const int fd = c.fd;
  while (!c.out.empty()) {
    const ssize_t n = ::send(fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      drop(fd);
      return;
    }
    c.out.erase(0, static_cast<std::size_t>(n));
  }
  if (c.closing) drop(fd);
}

void ControlServer::reply(ControlClientId client, const std::string& line) {
  for (auto& [fd, c] : clients_) {
    if (c.id != client) continue;
    c.busy = false;
    c.active_ms = boottime_ms();
    if (c.out.size() + line.size() > kControlOutBytesMax) {
      drop(fd);  // a reader that never reads
      return;
    }
    c.out += line;
    const int keep_fd = fd;
    write_ready(c);
    auto it = clients_.find(keep_fd);
    if (it != clients_.end() && dispatching_ != client) dispatch(it->second, boottime_ms());
    return;
  }
}

bool ControlServer::client_gone(ControlClientId client) const {
  for (const auto& [fd, c] : clients_) {
    if (c.id != client) continue;
    // POLLRDHUP: the peer's end is closed even while bytes it sent are still unread.
    pollfd p{fd, static_cast<short>(POLLIN | POLLRDHUP), 0};
    if (::poll(&p, 1, 0) < 0) return false;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
  }
  return true;
}

void ControlServer::progress(ControlClientId client, const std::string& line) {
  for (auto& [fd, c] : clients_) {
    if (c.id != client) continue;
    if (c.out.size() + line.size() > kControlOutBytesMax) return;  // the answer matters, not this
    c.out += line;
    write_ready(c);
    return;
  }
}

void ControlServer::tick(std::uint64_t now_ms) {
  std::vector<int> expired;
  for (auto& [fd, c] : clients_)
    if (!c.in.empty() && !c.busy && !c.closing && now_ms - c.partial_since_ms > kControlLineTimeoutMs)
      expired.push_back(fd);
  for (int fd : expired) {
    ++bad_requests_;
    send_and_close(clients_.at(fd),
                   control_error(nullptr, ControlError::timeout,
                                 "incomplete request line for more than " +
                                     std::to_string(kControlLineTimeoutMs) + " ms; connection closed"));
  }
  expired.clear();
  for (auto& [fd, c] : clients_)
    if (c.idle() && now_ms - c.active_ms > kControlIdleTimeoutMs) expired.push_back(fd);
  for (int fd : expired) {
    ++closed_idle_;
    send_and_close(clients_.at(fd), control_error(nullptr, ControlError::idle,
                                                  "no request for " + std::to_string(kControlIdleTimeoutMs) +
                                                      " ms; connection closed"));
  }
}

// ---------------------------------------------------------------------------------------------

ControlConnection& ControlConnection::operator=(ControlConnection&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    server_ = o.server_;
    o.fd_ = -1;
  }
  return *this;
}

ControlConnection::~ControlConnection() {
  if (fd_ >= 0) ::close(fd_);
}

bool trusted_control_server(uid_t server_uid) noexcept { return server_uid == 0 || server_uid == ::geteuid(); }

ControlConnection control_connect(const std::string& socket_path, ControlCallFailure& failure) {
  sockaddr_un addr{};
  if (socket_path.empty() || socket_path.size() >= sizeof(addr.sun_path)) {
    failure = {ControlCallError::bad_path, "control socket path \"" + socket_path + "\" is empty or longer than " +
                                               std::to_string(sizeof(addr.sun_path) - 1) + " bytes"};
    return {};
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    failure = {ControlCallError::internal, "socket(AF_UNIX): " + errno_text(errno)};
    return {};
  }
  ControlConnection conn(fd, ucred{});
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    const int e = errno;
    if (e == ENOENT || e == ECONNREFUSED || e == ENOTDIR)
      failure = {ControlCallError::no_server, "no supervisor is running at " + socket_path + " (" + errno_text(e) + ")"};
    else if (e == EACCES || e == EPERM)
      failure = {ControlCallError::not_permitted, "not allowed to connect to the supervisor at " + socket_path + " (" +
                                                      errno_text(e) + "): run as root or as a member of its --group"};
    else
      failure = {ControlCallError::connect_failed,
                 "cannot connect to the supervisor at " + socket_path + ": " + errno_text(e)};
    return {};
  }
  // A request carries a command line and an environment: only a server run by root or by our
  // own uid gets one (SO_PEERCRED of a listening socket: who called listen). Another user who
  // could bind the path (a directory it may write, a socket it replaced) learns nothing.
  ucred server{};
  socklen_t len = sizeof server;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &server, &len) != 0) {
    failure = {ControlCallError::internal,
               "cannot read the credentials of the server at " + socket_path + ": " + errno_text(errno)};
    return {};
  }
  if (!trusted_control_server(server.uid) && !ablated("unchecked-control-server")) {
    const uid_t me = ::geteuid();
    failure = {ControlCallError::foreign_server,
               "the control socket " + socket_path + " is served by uid " + std::to_string(server.uid) + " (pid " +
                   std::to_string(server.pid) + "), expected root (uid 0)" +
                   (me != 0 ? " or this user (uid " + std::to_string(me) + ")" : std::string()) +
                   ": refusing to send it a command line and environment (is --supervisor the right socket? a "
                   "supervisor's socket directory must be writable only by its owner)"};
    return {};
  }
  return ControlConnection(conn.release(), server);
}

std::optional<json> control_call(const std::string& socket_path, const json& request, std::uint64_t timeout_ms,
                                 ControlCallFailure& failure) {
  const ControlConnection conn = control_connect(socket_path, failure);
  if (!conn) return std::nullopt;
  const int fd = conn.fd();
  const std::string line = request.dump() + "\n";
  int send_errno = 0;  // a supervisor that refuses the connection (busy) answers, then closes
  for (std::size_t sent = 0; sent < line.size();) {
    const ssize_t n = ::send(fd, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      send_errno = n < 0 ? errno : EPIPE;  // read its answer, if it left one, before giving up
      break;
    }
    sent += static_cast<std::size_t>(n);
  }
  const std::uint64_t deadline = boottime_ms() + timeout_ms;
  std::string in;
  for (;;) {
    if (const auto nl = in.find('\n'); nl != std::string::npos) {
      json j = json::parse(in.substr(0, nl), nullptr, false);
      in.erase(0, nl + 1);
      if (!j.is_discarded() && is_control_progress(j)) continue;  // a queued run's place: not its answer
      if (j.is_discarded() || !j.is_object() || !j.contains("ok")) {
        failure = {ControlCallError::garbled,
                   "the supervisor at " + socket_path + " answered something that is not a control answer"};
        return std::nullopt;
      }
      return j;
    }
    if (in.size() > kControlAnswerBytesMax) {
      failure = {ControlCallError::garbled,
                 "the supervisor's answer is longer than " + std::to_string(kControlAnswerBytesMax) + " bytes"};
      return std::nullopt;
    }
    const std::uint64_t now = boottime_ms();
    if (now >= deadline) {
      failure = {ControlCallError::no_answer,
                 "the supervisor at " + socket_path + " did not answer within " + std::to_string(timeout_ms) +
                     " ms (a request it had already read may still complete: see `leasehold sandboxes`)"};
      return std::nullopt;
    }
    pollfd p{fd, POLLIN, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::min<std::uint64_t>(deadline - now, 1000)));
    if (rc <= 0) continue;
    char buf[65536];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = n < 0 ? errno : send_errno;
      failure = {ControlCallError::closed, "the supervisor at " + socket_path + " closed the connection " +
                                               (e != 0 ? "(" + errno_text(e) + ")" : std::string("without answering"))};
      return std::nullopt;
    }
    in.append(buf, static_cast<std::size_t>(n));
  }
}

bool is_control_progress(const json& line) {
  return line.is_object() && line.contains("progress") && !line.contains("ok");
}

Status control_call_status(const ControlCallFailure& failure) {
  LEASEHOLD_ASSERT(failure.failed());
  Errc code = Errc::io_error;
  switch (failure.error) {
    case ControlCallError::bad_path: code = Errc::invalid_argument; break;
    case ControlCallError::no_server: code = Errc::not_found; break;
    case ControlCallError::not_permitted:
    case ControlCallError::foreign_server: code = Errc::permission_denied; break;
    case ControlCallError::no_answer: code = Errc::timeout; break;
    case ControlCallError::garbled: code = Errc::corrupt; break;
    case ControlCallError::none:
    case ControlCallError::connect_failed:
    case ControlCallError::closed:
    case ControlCallError::internal: code = Errc::io_error; break;
  }
  return Status{code, failure.message.empty() ? std::string("control call failed") : failure.message};
}

Result<json> control_call(const std::string& socket_path, const json& request, std::uint64_t timeout_ms) {
  ControlCallFailure failure;
  auto answer = control_call(socket_path, request, timeout_ms, failure);
  if (!answer) return control_call_status(failure);
  return std::move(*answer);
}

}  // namespace leasehold
