// leasehold/harness: the link between workers and lockd, and cutting it
// (include/leasehold/harness/network.hpp).
#include "leasehold/harness/network.hpp"

#include "leasehold/harness/process.hpp"
#include "leasehold/harness/subnet.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace leasehold::harness {

namespace {
std::string ip_bin() {
  static const std::string p = find_program("ip");
  return p;
}
bool exists_netns(const std::string& name) { return ::access(("/run/netns/" + name).c_str(), F_OK) == 0; }
/// Serialises choosing and creating demo subnets between runs on this machine (root only:
/// namespaces need root anyway).
constexpr const char* kSubnetLockPath = "/run/leasehold-demo-net.lock";
/// Longest wait for that lock: another run holds it only while it makes its links.
constexpr std::uint64_t kSubnetLockWaitMs = 30'000;

/// The local UDP ports of the sockets a process holds (from /proc/<pid>/fd and /proc/net/udp*).
std::vector<std::uint16_t> udp_ports_of(pid_t pid) {
  std::vector<std::string> inodes;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      char target[256];
      const std::string p = dir + "/" + e->d_name;
      const ssize_t n = ::readlink(p.c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      target[n] = '\0';
      if (std::strncmp(target, "socket:[", 8) == 0) {
        std::string ino(target + 8);
        if (!ino.empty()) ino.pop_back();
        inodes.push_back(ino);
      }
    }
    ::closedir(d);
  }
  std::vector<std::uint16_t> ports;
  for (const char* table : {"/net/udp", "/net/udp6"}) {
    std::ifstream in("/proc/" + std::to_string(pid) + table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::stringstream ss(line);
      std::string sl, local, remote, st, queues, tr, retr, uid, timeout, inode;
      ss >> sl >> local >> remote >> st >> queues >> tr >> retr >> uid >> timeout >> inode;
      for (const auto& i : inodes) {
        if (i != inode) continue;
        const auto colon = local.rfind(':');
        if (colon != std::string::npos)
          ports.push_back(static_cast<std::uint16_t>(std::strtoul(local.c_str() + colon + 1, nullptr, 16)));
      }
    }
  }
  return ports;
}
}  // namespace

Status Network::setup(const std::string& want, const std::string& run_tag) {
  tag = run_tag;
  if (want != "auto" && want != "netns" && want != "loopback")
    return Status::invalid("--network must be auto, netns or loopback (got \"" + want + "\")");
  std::string reason;
  if (want == "loopback") {
    reason = "--network loopback was asked for";
  } else if (::geteuid() != 0) {
    reason = "network namespaces need root";
  } else if (ip_bin().empty()) {
    reason = "the `ip` program (iproute2) is not installed";
  } else {
    // Pick a /24 under 10.213.0.0/16 that no address or route here uses. Other runs of the
    // demo do the same at the same time, so the look and the making happen under one
    // machine-wide lock (released when `subnet_lock` closes, also if this process dies).
    const int subnet_lock = ::open(kSubnetLockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    const std::int64_t lock_until = now_ns() + static_cast<std::int64_t>(kSubnetLockWaitMs) * kNsPerMs;
    while (subnet_lock >= 0 && ::flock(subnet_lock, LOCK_EX | LOCK_NB) != 0 && now_ns() < lock_until) {
      if (tick) tick();  // (after the wait: go on unlocked; a clash is then merely unlikely)
      sleep_ms(10);
    }
    struct LockCloser {
      int fd;
      ~LockCloser() {
        if (fd >= 0) ::close(fd);
      }
    } closer{subnet_lock};
    std::string addrs, routes;
    run_command({ip_bin(), "-o", "-4", "addr", "show"}, &addrs);
    run_command({ip_bin(), "-4", "route", "show", "table", "all"}, &routes);
    const auto picked = pick_demo_subnet(addrs + "\n" + routes, static_cast<unsigned>(::getpid()) % kDemoSubnetCount);
    if (!picked) {
      reason = "every /24 of " + std::string(kDemoSubnetPrefix) + ".0.0/16 is in use here";
      if (want == "netns") return Status{Errc::unsupported, "network namespaces unavailable: " + reason};
    }
    const unsigned octet = picked.value_or(0);
    const std::string net = std::string(kDemoSubnetPrefix) + "." + std::to_string(octet) + ".";
    std::string out;
    bool ok = picked.has_value();
    for (int i = 0; i < 2 && ok; ++i) {
      netns[i] = "lhdemo-" + tag + "-w" + std::to_string(i + 1);
      host_if[i] = "lhd" + tag.substr(0, 8) + "h" + std::to_string(i + 1);
      const std::string peer = "lhd" + tag.substr(0, 8) + "n" + std::to_string(i + 1);
      host_ip[i] = net + std::to_string(4 * i + 1);
      worker_ip[i] = net + std::to_string(4 * i + 2);
      const std::vector<std::vector<std::string>> steps = {
          {ip_bin(), "netns", "add", netns[i]},
          {ip_bin(), "link", "add", host_if[i], "type", "veth", "peer", "name", peer, "netns", netns[i]},
          {ip_bin(), "addr", "add", host_ip[i] + "/30", "dev", host_if[i]},
          {ip_bin(), "link", "set", host_if[i], "up"},
          {ip_bin(), "-n", netns[i], "addr", "add", worker_ip[i] + "/30", "dev", peer},
          {ip_bin(), "-n", netns[i], "link", "set", peer, "up"},
          {ip_bin(), "-n", netns[i], "link", "set", "lo", "up"},
      };
      for (const auto& s : steps) {
        if (run_command(s, &out) != 0) {
          std::string cmd;
          for (const auto& a : s) cmd += (cmd.empty() ? "" : " ") + a;
          reason = "`" + cmd + "` failed: " + out;
          while (!reason.empty() && (reason.back() == '\n' || reason.back() == ' ')) reason.pop_back();
          ok = false;
          break;
        }
      }
    }
    if (ok) {
      mode = Mode::netns;
      why = "each worker in its own network namespace, linked to lockd's by a veth pair";
      return {};
    }
    teardown();  // whatever part was made
    if (want == "netns") return Status{Errc::unsupported, "network namespaces unavailable: " + reason};
  }
  mode = Mode::loopback;
  netns[0] = netns[1] = "";
  for (int i = 0; i < 2; ++i) host_ip[i] = "127.0.0.1";
  why = reason;
  if (::geteuid() == 0 && !find_program("nft").empty() &&
      run_command({find_program("nft"), "list", "tables"}) == 0) {
    filter = "nft";
  } else if (::geteuid() == 0 && !find_program("iptables").empty() &&
             run_command({find_program("iptables"), "-w", "-S", "INPUT"}) == 0) {
    filter = "iptables";
  }
  return {};
}

std::string Network::lockd_address(int i, std::uint16_t port) const {
  return host_ip[i] + ":" + std::to_string(port);
}

Status Network::cut_off(int i, pid_t supervisor_pid, std::uint16_t lockd_port) {
  std::string out;
  if (mode == Mode::netns) {
    if (run_command({ip_bin(), "link", "set", host_if[i], "down"}, &out) != 0)
      return Status{Errc::io_error, "ip link set " + host_if[i] + " down: " + out};
    cut[i] = true;
    return {};
  }
  if (filter.empty())
    return Status{Errc::unsupported, "cannot cut worker " + std::to_string(i + 1) +
           " off lockd: no network namespaces and no usable packet filter (nft or iptables, as root)"};
  const auto ports = udp_ports_of(supervisor_pid);
  if (ports.empty()) return Status{Errc::not_found, "cannot find the UDP port of supervisor pid " + std::to_string(supervisor_pid)};
  const std::string lp = std::to_string(lockd_port);
  if (filter == "nft") {
    const std::string nft = find_program("nft");
    const std::string table = "lhdemo_" + tag;
    if (run_command({nft, "add", "table", "inet", table}, &out) != 0) return Status{Errc::io_error, "nft add table: " + out};
    if (run_command({nft, "add", "chain", "inet", table, "in",
                     "{ type filter hook input priority -10 ; policy accept ; }"}, &out) != 0)
      return Status{Errc::io_error, "nft add chain: " + out};
    for (std::uint16_t p : ports) {
      const std::string sp = std::to_string(p);
      if (run_command({nft, "add", "rule", "inet", table, "in", "udp", "sport", sp, "udp", "dport", lp, "drop"}, &out) != 0 ||
          run_command({nft, "add", "rule", "inet", table, "in", "udp", "sport", lp, "udp", "dport", sp, "drop"}, &out) != 0)
        return Status{Errc::io_error, "nft add rule: " + out};
    }
  } else {
    const std::string ipt = find_program("iptables");
    for (std::uint16_t p : ports) {
      const std::string sp = std::to_string(p);
      for (const auto& [s, d] : {std::pair{sp, lp}, std::pair{lp, sp}}) {
        const std::string rule = "-p udp --sport " + s + " --dport " + d + " -j DROP";
        if (run_command({ipt, "-w", "-I", "INPUT", "-p", "udp", "--sport", s, "--dport", d, "-j", "DROP"}, &out) != 0)
          return Status{Errc::io_error, "iptables -I INPUT " + rule + ": " + out};
        filter_rules.push_back(s + " " + d);
      }
    }
  }
  cut[i] = true;
  return {};
}

Status Network::reconnect(int i) {
  if (!cut[i]) return {};
  std::string out;
  if (mode == Mode::netns) {
    if (run_command({ip_bin(), "link", "set", host_if[i], "up"}, &out) != 0)
      return Status{Errc::io_error, "ip link set " + host_if[i] + " up: " + out};
  } else if (filter == "nft") {
    if (run_command({find_program("nft"), "delete", "table", "inet", "lhdemo_" + tag}, &out) != 0)
      return Status{Errc::io_error, "nft delete table: " + out};
  } else {
    for (const auto& r : filter_rules) {
      const auto sp = r.find(' ');
      run_command({find_program("iptables"), "-w", "-D", "INPUT", "-p", "udp", "--sport", r.substr(0, sp),
                   "--dport", r.substr(sp + 1), "-j", "DROP"});
    }
    filter_rules.clear();
  }
  cut[i] = false;
  return {};
}

void Network::teardown() {
  for (int i = 0; i < 2; ++i) {
    if (cut[i]) (void)reconnect(i);  // best effort: the link and the namespace go next anyway
    if (!host_if[i].empty() && !ip_bin().empty()) run_command({ip_bin(), "link", "del", host_if[i]});
    if (!netns[i].empty() && exists_netns(netns[i])) run_command({ip_bin(), "netns", "del", netns[i]});
  }
}

std::string Network::describe() const {
  if (mode == Mode::netns)
    return "network namespaces " + netns[0] + " (" + worker_ip[0] + ") and " + netns[1] + " (" + worker_ip[1] +
           "), veth pairs to lockd at " + host_ip[0] + " / " + host_ip[1] + "; a cut sets the host-side link down";
  return "loopback, all processes in one network namespace; a cut drops the supervisor's datagrams with " +
         (filter.empty() ? std::string("- no packet filter available") : filter);
}

}  // namespace leasehold::harness
