// harness/deployment.cpp: keys, lockd and supervisors below one directory
// (include/leasehold/harness/deployment.hpp).
#include "leasehold/harness/deployment.hpp"

#include "leasehold/supervisor/control.hpp"

#include <utility>

namespace leasehold::harness {

Deployment::Deployment(fs::path dir) : dir_(std::move(dir)) {}

Deployment::~Deployment() {
  stop_supervisors();
  stop_lockd();
}

Status Deployment::make_cluster_key() {
  const std::string path = cluster_key_file().string();
  if (Status err = wire::generate_key_file(path); !err.ok()) return err;
  auto loaded = wire::load_key_file(path);
  if (!loaded) return loaded.status();
  key_ = *loaded;
  return {};
}

Status Deployment::make_worker_key(const std::string& file, const WorkerId& worker) {
  if (!key_) return Status{Errc::not_found, "no cluster key to derive the worker key " + (dir_ / file).string() + " from"};
  return wire::write_key_file((dir_ / file).string(), wire::derive_worker_key(*key_, worker));
}

Started Deployment::start_lockd(const LockdSpec& spec, const std::function<void()>& tick) {
  Spawn s;
  // --no-config: a deployment is the flags it is given, never the host's /etc/leasehold file.
  s.argv = {spec.bin, "--no-config", "--listen", spec.listen, "--store", (dir_ / "lockd.db").string(), "--key-file",
            cluster_key_file().string()};
  if (spec.ttl_ms != 0) s.argv.insert(s.argv.end(), {"--ttl-ms", std::to_string(spec.ttl_ms)});
  s.argv.insert(s.argv.end(), spec.extra_args.begin(), spec.extra_args.end());
  s.stdout_path = dir_ / "lockd.log";
  s.stderr_path = s.stdout_path;
  s.label = "leasehold-lockd";
  if (const Status started = lockd_.start(s); !started.ok()) return {Started::Kind::cannot_start, started.message()};
  const Result<std::string> line = wait_for_log_line(s.stdout_path, "listening ", spec.ready_timeout, lockd_, tick);
  if (!line) return {Started::Kind::not_ready, line.message()};
  lockd_text_ = line->substr(line->find("listening ") + 10);
  const auto addr = SocketAddress::parse(lockd_text_);
  if (!addr) return {Started::Kind::bad_output, "lockd printed an address that does not parse: " + *line};
  lockd_addr_ = *addr;
  return {};
}

Started Deployment::start_supervisor(const SupervisorSpec& spec, std::size_t* index,
                                     const std::function<void()>& tick) {
  Spawn s;
  s.argv = {spec.bin, "--no-config", "--lockd", spec.lockd.empty() ? lockd_text_ : spec.lockd, "--key-file", spec.key_file.string()};
  const auto flag = [&s](const char* name, std::uint64_t ms) {
    if (ms != 0) s.argv.insert(s.argv.end(), {name, std::to_string(ms)});
  };
  flag("--ttl-ms", spec.ttl_ms);
  flag("--kill-after-ms", spec.kill_after_ms);
  flag("--heartbeat-interval-ms", spec.heartbeat_interval_ms);
  s.argv.insert(s.argv.end(), spec.extra_args.begin(), spec.extra_args.end());
  if (!spec.control_socket.empty()) s.argv.insert(s.argv.end(), {"--control-socket", spec.control_socket.string()});
  if (!spec.shm.empty()) s.argv.insert(s.argv.end(), {"--shm", spec.shm.string()});
  s.stdout_path = spec.log;
  s.stderr_path = spec.log;
  s.netns = spec.netns;
  s.label = spec.label;
  auto p = std::make_unique<Process>();
  if (const Status started = p->start(s); !started.ok()) return {Started::Kind::cannot_start, started.message()};
  supervisors_.push_back(std::move(p));
  if (index != nullptr) *index = supervisors_.size() - 1;
  if (const Result<std::string> ready = wait_for_log_line(spec.log, "ready", spec.ready_timeout, *supervisors_.back(), tick);
      !ready)
    return {Started::Kind::not_ready, ready.message()};
  return {};
}

Result<nlohmann::json> Deployment::request(const fs::path& socket, nlohmann::json req, milliseconds timeout) {
  req["v"] = 1;
  return control_call(socket.string(), req, static_cast<std::uint64_t>(timeout.count()));
}

void Deployment::stop_supervisors(milliseconds grace) {
  for (auto it = supervisors_.rbegin(); it != supervisors_.rend(); ++it) (*it)->terminate(grace);
}

void Deployment::stop_lockd(milliseconds grace) { lockd_.terminate(grace); }

}  // namespace leasehold::harness
