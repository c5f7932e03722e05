// The control socket: request parsing, and the server's bounds against bad input.
#include "leasehold/supervisor/control.hpp"
#include "leasehold/supervisor/config.hpp"
#include "leasehold/lease/clock.hpp"

#include <gtest/gtest.h>

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

namespace leasehold {
namespace {

using nlohmann::json;

TEST(ControlParse, RunWithNameArgvEnv) {
  const ControlParse p = parse_control_request(
      R"({"v":1,"id":7,"op":"run","name":"agent-1","argv":["/bin/sleep","5"],"env":{"A":"b"},"ttl_ms":900})");
  ASSERT_TRUE(p.request) << p.message;
  EXPECT_EQ(p.request->op, ControlOp::run);
  EXPECT_EQ(p.request->id, 7);
  EXPECT_EQ(*p.request->name, "agent-1");
  ASSERT_EQ(p.request->argv.size(), 2u);
  EXPECT_EQ(p.request->argv[1], "5");
  ASSERT_EQ(p.request->env.size(), 1u);
  EXPECT_EQ(p.request->env[0], "A=b");
  EXPECT_EQ(*p.request->ttl_ms, 900u);
  EXPECT_EQ(p.request->cwd, "/");
}

TEST(ControlParse, RunWithoutNameIsUnnamed) {
  const ControlParse p = parse_control_request(R"({"v":1,"op":"run","argv":["true"],"env":["X=1"]})");
  ASSERT_TRUE(p.request) << p.message;
  EXPECT_FALSE(p.request->name.has_value());
  EXPECT_EQ(p.request->env.at(0), "X=1");
  EXPECT_TRUE(p.request->id.is_null());
}

TEST(ControlParse, AQueuedRunNeedsANameAndATimeoutNeedsTheQueue) {
  const ControlParse ok =
      parse_control_request(R"({"v":1,"op":"run","name":"n","argv":["true"],"queue":true,"queue_timeout_ms":500})");
  ASSERT_TRUE(ok.request) << ok.message;
  EXPECT_TRUE(ok.request->queue);
  EXPECT_EQ(ok.request->queue_timeout_ms, std::optional<std::uint64_t>(500));
  const ControlParse unnamed = parse_control_request(R"({"v":1,"op":"run","argv":["true"],"queue":true})");
  EXPECT_FALSE(unnamed.request);
  EXPECT_NE(unnamed.message.find("\"queue\" needs a \"name\""), std::string::npos) << unnamed.message;
  const ControlParse lone = parse_control_request(R"({"v":1,"op":"run","name":"n","argv":["true"],"queue_timeout_ms":5})");
  EXPECT_FALSE(lone.request);
  EXPECT_NE(lone.message.find("needs \"queue\": true"), std::string::npos) << lone.message;
  const ControlParse not_bool = parse_control_request(R"({"v":1,"op":"run","name":"n","argv":["true"],"queue":1})");
  EXPECT_FALSE(not_bool.request);
  EXPECT_EQ(not_bool.error, ControlError::bad_request);
}

TEST(ControlParse, ExpectCommitNeedsSandboxEpochAndCommand) {
  const ControlParse ok = parse_control_request(
      R"({"v":1,"op":"expect-commit","name":"n","sandbox":"0f8fad5b-d9cb-469f-a165-70867728950e","epoch":4,"argv":["true"]})");
  ASSERT_TRUE(ok.request) << ok.message;
  EXPECT_EQ(ok.request->epoch, 4u);
  EXPECT_EQ(ok.request->sandbox->str(), "0f8fad5b-d9cb-469f-a165-70867728950e");
  const ControlParse no_epoch = parse_control_request(
      R"({"v":1,"op":"expect-commit","name":"n","sandbox":"0f8fad5b-d9cb-469f-a165-70867728950e","argv":["true"]})");
  EXPECT_FALSE(no_epoch.request);
  EXPECT_EQ(no_epoch.error, ControlError::bad_request);
  EXPECT_NE(no_epoch.message.find("\"epoch\""), std::string::npos);
}

TEST(ControlParse, WaitTakesASandboxAndStopsTakeAGrace) {
  const ControlParse w = parse_control_request(R"({"v":1,"op":"wait","sandbox":"0f8fad5b-d9cb-469f-a165-70867728950e"})");
  ASSERT_TRUE(w.request) << w.message;
  EXPECT_EQ(w.request->op, ControlOp::wait);
  EXPECT_EQ(w.request->sandbox->str(), "0f8fad5b-d9cb-469f-a165-70867728950e");
  const ControlParse r = parse_control_request(R"({"v":1,"op":"release","name":"n","grace_ms":250})");
  ASSERT_TRUE(r.request) << r.message;
  EXPECT_EQ(r.request->grace_ms, std::optional<std::uint64_t>(250));
  const ControlParse k = parse_control_request(R"({"v":1,"op":"kill","sandbox":"0f8fad5b-d9cb-469f-a165-70867728950e"})");
  ASSERT_TRUE(k.request) << k.message;
  EXPECT_FALSE(k.request->grace_ms.has_value()) << "absent: the supervisor's --stop-grace-ms";
}

TEST(ControlParse, ErrorsNameTheProblem) {
  struct Case {
    const char* line;
    ControlError code;
    const char* needle;
  } cases[] = {
      {"{not json", ControlError::bad_json, "not valid JSON"},
      {"[1,2]", ControlError::bad_json, "JSON object"},
      {R"({"op":"list"})", ControlError::bad_version, "\"v\""},
      {R"({"v":2,"op":"list"})", ControlError::bad_version, "version 2"},
      {R"({"v":1})", ControlError::bad_request, "\"op\""},
      {R"({"v":1,"op":"explode"})", ControlError::unknown_op, "explode"},
      {R"({"v":1,"op":"run"})", ControlError::bad_request, "\"argv\""},
      {R"({"v":1,"op":"run","argv":[]})", ControlError::bad_request, "non-empty"},
      {R"({"v":1,"op":"run","argv":[1]})", ControlError::bad_request, "only strings"},
      {R"({"v":1,"op":"run","argv":["x"],"name":"bad name!"})", ControlError::bad_request, "name"},
      {R"({"v":1,"op":"run","argv":["x"],"env":{"A":1}})", ControlError::bad_request, "\"A\""},
      {R"({"v":1,"op":"run","argv":["x"],"env":["NOEQUALS"]})", ControlError::bad_request, "KEY=VALUE"},
      {R"({"v":1,"op":"run","argv":["x"],"cwd":"rel"})", ControlError::bad_request, "absolute"},
      {R"({"v":1,"op":"run","argv":["x"],"ttl_ms":-5})", ControlError::bad_request, "ttl_ms"},
      {R"({"v":1,"op":"name","sandbox":"zz","name":"a"})", ControlError::bad_request, "sandbox id"},
      {R"({"v":1,"op":"release"})", ControlError::bad_request, "\"name\""},
      {R"({"v":1,"op":"kill","sandbox":"00000000-0000-0000-0000-000000000000"})", ControlError::bad_request, "sandbox id"},
      {R"({"v":1,"op":"wait"})", ControlError::bad_request, "wait: field \"sandbox\" is required"},
      {R"({"v":1,"op":"wait","sandbox":"zz"})", ControlError::bad_request, "sandbox id"},
      {R"({"v":1,"op":"release","name":"a","grace_ms":-1})", ControlError::bad_request, "\"grace_ms\" must be a non-negative"},
      {R"({"v":1,"op":"kill","sandbox":"0f8fad5b-d9cb-469f-a165-70867728950e","grace_ms":"2s"})",
       ControlError::bad_request, "grace_ms"},
  };
  for (const auto& c : cases) {
    const ControlParse p = parse_control_request(c.line);
    EXPECT_FALSE(p.request) << c.line;
    EXPECT_EQ(p.error, c.code) << c.line << " -> " << to_string(p.error) << ": " << p.message;
    EXPECT_NE(p.message.find(c.needle), std::string::npos) << c.line << " -> " << p.message;
  }
}

TEST(ControlParse, AnswersCarryVersionAndId) {
  const json ok = json::parse(control_ok(json("abc"), {{"slot", 3}}));
  EXPECT_EQ(ok["v"], kControlProtocolVersion);
  EXPECT_EQ(ok["id"], "abc");
  EXPECT_EQ(ok["ok"], true);
  EXPECT_EQ(ok["slot"], 3);
  const json err = json::parse(control_error(5, ControlError::held, "taken", {{"epoch", 9}}));
  EXPECT_EQ(err["ok"], false);
  EXPECT_EQ(err["error"], "held");
  EXPECT_EQ(err["epoch"], 9);
}

// --- the server over a real unix socket ---------------------------------------------------------

std::string temp_socket_path(const char* tag) {
  return "/tmp/leasehold-ctl-" + std::to_string(getpid()) + "-" + tag + ".sock";
}

// A client connection to the control socket at `path` (-1 and a test failure if refused).
int connect_unix(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << path;
  return fd;
}

std::uint64_t now_ms() { return static_cast<std::uint64_t>(boottime_ns()) / 1'000'000; }

// Runs the server's poll loop on a thread; answers every request with its op name.
class ServerFixture : public ::testing::Test {
 protected:
  void start(const char* tag) {
    start(tag, [this](ControlClientId c, ControlRequest r) {
      ++handled_;
      server_->reply(c, control_ok(r.id, {{"op", std::string(to_string(r.op))}}));
    });
  }
  void start(const char* tag, std::function<void(ControlClientId, ControlRequest)> handler) {
    path_ = temp_socket_path(tag);
    server_ = std::make_unique<ControlServer>(ControlAccess{getuid(), std::nullopt}, std::move(handler));
    ASSERT_TRUE(server_->open(path_).ok());
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        auto w = server_->watch_fds();
        std::vector<pollfd> fds;
        for (auto& x : w) fds.push_back({x.fd, x.events, 0});
        ::poll(fds.data(), fds.size(), 20);
        for (auto& f : fds)
          if (f.revents) server_->on_ready(f.fd, f.revents, now_ms());
        server_->tick(now_ms());
      }
    });
  }
  void TearDown() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    server_.reset();
    EXPECT_FALSE(std::filesystem::exists(path_)) << "socket file left behind";
  }
  json call(const json& req) {
    auto a = control_call(path_, req, 3000);
    EXPECT_TRUE(a.ok()) << a.message();
    return a.ok() ? *a : json();
  }
  // Sends raw bytes, returns the first answer line (or "" on close/timeout).
  std::string raw(const std::string& bytes, int wait_ms = 3000) {
    const int fd = connect_unix(path_);
    std::size_t off = 0;
    while (off < bytes.size()) {
      const ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n <= 0) break;
      off += static_cast<std::size_t>(n);
    }
    std::string in;
    const std::uint64_t deadline = now_ms() + static_cast<std::uint64_t>(wait_ms);
    while (in.find('\n') == std::string::npos && now_ms() < deadline) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      in.append(buf, static_cast<std::size_t>(n));
    }
    ::close(fd);
    return in.substr(0, in.find('\n'));
  }

  std::string path_;
  std::unique_ptr<ControlServer> server_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int> handled_{0};
};

TEST_F(ServerFixture, AnswersAndEchoesTheId) {
  start("ok");
  const json a = call({{"v", 1}, {"id", 42}, {"op", "status"}});
  EXPECT_EQ(a["ok"], true);
  EXPECT_EQ(a["id"], 42);
  EXPECT_EQ(a["op"], "status");
  EXPECT_EQ(handled_.load(), 1);
}

// A progress line before the answer (a queued run's place) is passed over by control_call.
TEST_F(ServerFixture, ProgressLinesComeBeforeTheAnswerAndAreNotTakenForIt) {
  start("progress", [this](ControlClientId c, ControlRequest r) {
    server_->progress(c, json({{"v", 1}, {"id", r.id}, {"progress", "queued"}, {"position", 2}}).dump() + "\n");
    server_->reply(c, control_ok(r.id, {{"op", std::string(to_string(r.op))}}));
  });
  const json a = call({{"v", 1}, {"id", 5}, {"op", "list"}});
  EXPECT_EQ(a["ok"], true) << a.dump();
  EXPECT_EQ(a["op"], "list");
  EXPECT_EQ(json::parse(raw(R"({"v":1,"id":6,"op":"list"})" "\n"))["progress"], "queued");  // the first line on the wire
}

TEST_F(ServerFixture, GarbageUnknownAndOversizeGetClearErrors) {
  start("bad");
  json a = json::parse(raw("this is not json\n"));
  EXPECT_EQ(a["error"], "bad_json");
  a = json::parse(raw(R"({"v":1,"id":"x","op":"reboot"})" "\n"));
  EXPECT_EQ(a["error"], "unknown_op");
  EXPECT_EQ(a["id"], "x");
  a = json::parse(raw(std::string(kControlLineBytesMax + 10, 'a')));
  EXPECT_EQ(a["error"], "too_long");
  EXPECT_EQ(handled_.load(), 0);
  // The server is still healthy.
  EXPECT_EQ(call({{"v", 1}, {"op", "list"}})["ok"], true);
  EXPECT_EQ(server_->bad_requests(), 3u);
}

TEST_F(ServerFixture, PipelinedRequestsAreAnsweredInOrder) {
  start("pipe");
  const int fd = connect_unix(path_);
  ASSERT_GE(fd, 0);
  std::string batch;
  for (int i = 0; i < 50; ++i) batch += json({{"v", 1}, {"id", i}, {"op", "list"}}).dump() + "\n";
  ASSERT_EQ(::send(fd, batch.data(), batch.size(), 0), static_cast<ssize_t>(batch.size()));
  std::string in;
  int lines = 0;
  const std::uint64_t deadline = now_ms() + 3000;
  while (lines < 50 && now_ms() < deadline) {
    char buf[4096];
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    in.append(buf, static_cast<std::size_t>(n));
    std::size_t nl;
    while ((nl = in.find('\n')) != std::string::npos) {
      EXPECT_EQ(json::parse(in.substr(0, nl))["id"], lines);
      in.erase(0, nl + 1);
      ++lines;
    }
  }
  ::close(fd);
  EXPECT_EQ(lines, 50);
}

TEST_F(ServerFixture, StalledPartialLineTimesOut) {
  start("slow");
  const json a = json::parse(raw(R"({"v":1,"op":)", static_cast<int>(kControlLineTimeoutMs) + 2000));
  EXPECT_EQ(a["error"], "timeout");
}

TEST_F(ServerFixture, IdleConnectionsCannotLockOthersOut) {
  start("idle");
  auto connect_idle = [&] { return connect_unix(path_); };
  std::vector<int> idle;
  idle.push_back(connect_idle());
  ::usleep(50'000);  // the first is the least recently active
  for (std::size_t i = 1; i < kControlClientsMax; ++i) idle.push_back(connect_idle());
  ::usleep(100'000);
  // All slots are taken by clients that never send: a real request still gets through...
  const json a = call({{"v", 1}, {"op", "list"}});
  EXPECT_EQ(a["ok"], true) << a.dump();
  EXPECT_EQ(server_->closed_idle(), 1u);
  EXPECT_EQ(server_->rejected_busy(), 0u);
  // ...and the oldest idle one was told why it was closed.
  pollfd p{idle[0], POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 2000), 1);
  char buf[512] = {};
  const ssize_t n = ::recv(idle[0], buf, sizeof buf - 1, 0);
  ASSERT_GT(n, 0);
  EXPECT_EQ(json::parse(std::string(buf, static_cast<std::size_t>(n)))["error"], "idle");
  for (int fd : idle) ::close(fd);
}

TEST(ControlServer, RequestsOfAClientThatAlreadyLeftAreNotCarriedOut) {
  // A client that gave up (its timeout passed while the supervisor was frozen) and closed: its
  // request, still in the socket buffer, must not start anything when the supervisor resumes.
  const std::string path = temp_socket_path("gone");
  int handled = 0;
  ControlServer s(ControlAccess{getuid(), std::nullopt}, [&](ControlClientId c, ControlRequest r) {
    ++handled;
    s.reply(c, control_ok(r.id, {}));
  });
  ASSERT_TRUE(s.open(path).ok());
  auto connect_and_send = [&] {
    const int fd = connect_unix(path);
    const std::string line = json({{"v", 1}, {"op", "list"}}).dump() + "\n";
    EXPECT_EQ(::send(fd, line.data(), line.size(), 0), static_cast<ssize_t>(line.size()));
    return fd;
  };
  // The server is "frozen": it runs only when this test calls on_ready.
  auto serve = [&] {
    for (int round = 0; round < 3; ++round)
      for (const auto& w : s.watch_fds()) s.on_ready(w.fd, POLLIN, now_ms());
  };
  const int gone = connect_and_send();
  ::close(gone);
  serve();
  EXPECT_EQ(handled, 0);
  EXPECT_EQ(s.dropped_closed(), 1u);
  // Control: a client that is still there is served.
  const int here = connect_and_send();
  serve();
  EXPECT_EQ(handled, 1);
  ::close(here);
  s.close_all();
}

// A connection closed while its request is still being served (a `wait`) is reported, so the
// answer owed to it is dropped; one closed with nothing owed is not.
TEST(ControlServer, AClientClosingWhileItsRequestIsServedIsReported) {
  const std::string path = temp_socket_path("owed");
  std::vector<ControlClientId> closed;
  ControlClientId waiting = 0;
  ControlServer s(ControlAccess{getuid(), std::nullopt}, [&](ControlClientId c, ControlRequest r) {
    if (r.op == ControlOp::wait) waiting = c;  // answered later: never, here
    else s.reply(c, control_ok(r.id, {}));
  });
  s.set_close_handler([&](ControlClientId c) { closed.push_back(c); });
  ASSERT_TRUE(s.open(path).ok());
  auto serve = [&] {
    for (int round = 0; round < 3; ++round)
      for (const auto& w : s.watch_fds()) s.on_ready(w.fd, POLLIN, now_ms());
  };
  auto send = [&](const json& req) {
    const int fd = connect_unix(path);
    const std::string line = req.dump() + "\n";
    EXPECT_EQ(::send(fd, line.data(), line.size(), 0), static_cast<ssize_t>(line.size()));
    return fd;
  };
  const int listing = send({{"v", 1}, {"op", "list"}});
  const int waiter = send({{"v", 1}, {"op", "wait"}, {"sandbox", "0f8fad5b-d9cb-469f-a165-70867728950e"}});
  serve();
  ASSERT_NE(waiting, 0u);
  ::close(listing);
  serve();
  EXPECT_TRUE(closed.empty()) << "nothing was owed to the listing client";
  ::close(waiter);
  serve();
  EXPECT_EQ(closed, std::vector<ControlClientId>{waiting});
  s.close_all();
}

// client_gone tells a closed client before the server has read its close (an answer computed
// while the loop was busy must not count on on_client_closed having run), and not a live one,
// nor one with a further request pending.
TEST(ControlServer, AClosedClientIsGoneBeforeItsCloseIsRead) {
  const std::string path = temp_socket_path("gone");
  ControlClientId waiting = 0;
  ControlServer s(ControlAccess{getuid(), std::nullopt}, [&](ControlClientId c, ControlRequest) { waiting = c; });
  ASSERT_TRUE(s.open(path).ok());
  const int fd = connect_unix(path);
  const std::string line = json{{"v", 1}, {"op", "wait"}, {"sandbox", "0f8fad5b-d9cb-469f-a165-70867728950e"}}.dump() + "\n";
  ASSERT_EQ(::send(fd, line.data(), line.size(), 0), static_cast<ssize_t>(line.size()));
  for (int round = 0; round < 3; ++round)
    for (const auto& w : s.watch_fds()) s.on_ready(w.fd, POLLIN, now_ms());
  ASSERT_NE(waiting, 0u);
  EXPECT_FALSE(s.client_gone(waiting));
  ASSERT_EQ(::send(fd, "{", 1, 0), 1);  // a partial next line: still there
  EXPECT_FALSE(s.client_gone(waiting));
  ::close(fd);
  EXPECT_TRUE(s.client_gone(waiting)) << "closed, though the server has not read the close";
  EXPECT_TRUE(s.client_gone(waiting + 1000)) << "a client it never had";
  s.close_all();
}

TEST(ControlServer, RefusesASecondServerOnTheSamePath) {
  const std::string path = temp_socket_path("dup");
  ControlServer a(ControlAccess{getuid(), std::nullopt}, [](ControlClientId, ControlRequest) {});
  ASSERT_TRUE(a.open(path).ok());
  ControlServer b(ControlAccess{getuid(), std::nullopt}, [](ControlClientId, ControlRequest) {});
  const Status err = b.open(path);
  EXPECT_EQ(err.code(), Errc::busy);
  EXPECT_NE(err.message().find("already running"), std::string::npos) << err.message();
  a.close_all();
  // A stale socket file (nobody listening) is replaced.
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ::close(fd);
  const Status replaced = b.open(path);
  EXPECT_TRUE(replaced.ok()) << replaced.message();
  b.close_all();
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(ControlServer, RejectsAnUnauthorizedPeer) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to connect as another uid";
  const std::string path = temp_socket_path("auth");
  int handled = 0;
  ControlServer s(ControlAccess{0, std::nullopt}, [&](ControlClientId, ControlRequest) { ++handled; });
  ASSERT_TRUE(s.open(path).ok());
  ::chmod(path.c_str(), 0666);  // the file mode is not the guard; SO_PEERCRED is
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Only async-signal-safe calls from here on.
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) _exit(10);
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path.c_str(), path.size());
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) _exit(11);
    const char req[] = "{\"v\":1,\"op\":\"list\"}\n";
    [[maybe_unused]] ssize_t w = ::send(fd, req, sizeof req - 1, MSG_NOSIGNAL);
    char buf[512] = {};
    std::size_t got = 0;
    for (int i = 0; i < 100 && got < sizeof buf - 1; ++i) {
      const ssize_t n = ::recv(fd, buf + got, sizeof buf - 1 - got, 0);
      if (n <= 0) break;
      got += static_cast<std::size_t>(n);
    }
    _exit(std::strstr(buf, "\"unauthorized\"") != nullptr ? 0 : 12);
  }
  int status = 0;
  const std::uint64_t deadline = now_ms() + 5000;
  while (::waitpid(child, &status, WNOHANG) == 0 && now_ms() < deadline) {
    auto w = s.watch_fds();
    std::vector<pollfd> fds;
    for (auto& x : w) fds.push_back({x.fd, x.events, 0});
    ::poll(fds.data(), fds.size(), 20);
    for (auto& f : fds)
      if (f.revents) s.on_ready(f.fd, f.revents, now_ms());
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(handled, 0);
  EXPECT_EQ(s.rejected_unauthorized(), 1u);
  s.close_all();
}

// A member of --group opens every connection it can and keeps a partial line on each (never
// idle, so never evicted): it gets kControlClientsPerUidMax of them, and root's request is still
// answered. With the bound ablated, the member holds all kControlClientsMax and root is refused.
void member_floods_connections(bool defended) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to connect as another uid";
  constexpr gid_t kGroup = 4242;
  constexpr uid_t kMember = 4243;
  if (defended) ::unsetenv("LEASEHOLD_ABLATE");
  else ::setenv("LEASEHOLD_ABLATE", "control-uid-cap", 1);
  const std::string path = temp_socket_path(defended ? "flood" : "flood-ab");
  ControlServer s(ControlAccess{0, kGroup}, [&](ControlClientId c, ControlRequest r) {
    s.reply(c, control_ok(r.id, {{"op", std::string(to_string(r.op))}}));
  });
  ASSERT_TRUE(s.open(path).ok());
  ::chmod(path.c_str(), 0666);
  int report[2], hold[2];
  ASSERT_EQ(::pipe(report), 0);
  ASSERT_EQ(::pipe(hold), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Only async-signal-safe calls from here on.
    ::close(hold[1]);
    ::close(report[0]);
    if (::setgid(kGroup) != 0 || ::setuid(kMember) != 0) _exit(10);
    int fds[kControlClientsMax + 8];
    for (int& fd : fds) {
      fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
      sockaddr_un a{};
      a.sun_family = AF_UNIX;
      std::memcpy(a.sun_path, path.c_str(), path.size());
      if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) _exit(11);
      [[maybe_unused]] ssize_t w = ::send(fd, "{\"v\":1,", 7, MSG_NOSIGNAL);
    }
    ::usleep(500'000);  // the server accepts and refuses meanwhile
    unsigned char held = 0;
    for (int fd : fds) {
      char buf[256];
      held += ::recv(fd, buf, sizeof buf, MSG_DONTWAIT) < 0 && errno == EAGAIN;  // no "busy" line, not closed
    }
    [[maybe_unused]] ssize_t w = ::write(report[1], &held, 1);
    char c;
    [[maybe_unused]] ssize_t r = ::read(hold[0], &c, 1);  // keeps every connection until told
    _exit(0);
  }
  ::close(report[1]);
  ::close(hold[0]);
  std::atomic<bool> stop{false};
  std::thread loop([&] {
    while (!stop.load()) {
      auto w = s.watch_fds();
      std::vector<pollfd> fds;
      for (auto& x : w) fds.push_back({x.fd, x.events, 0});
      ::poll(fds.data(), fds.size(), 10);
      for (auto& f : fds)
        if (f.revents) s.on_ready(f.fd, f.revents, now_ms());
      s.tick(now_ms());
    }
  });
  unsigned char held = 0;
  ASSERT_EQ(::read(report[0], &held, 1), 1);
  const auto root = control_call(path, {{"v", 1}, {"op", "status"}}, 2000);
  ::close(hold[1]);
  int status = 0;
  ::waitpid(child, &status, 0);
  stop = true;
  loop.join();
  s.close_all();
  ::close(report[0]);
  ::unsetenv("LEASEHOLD_ABLATE");
  if (defended) {
    EXPECT_EQ(held, kControlClientsPerUidMax);
    ASSERT_TRUE(root.ok()) << root.message();
    EXPECT_EQ((*root)["ok"], true) << root->dump();
    // Refused, or closed as idle when a later one arrived before its partial line.
    EXPECT_EQ(s.rejected_busy() + s.closed_idle(), kControlClientsMax + 8 - kControlClientsPerUidMax);
  } else {
    EXPECT_EQ(held, kControlClientsMax);
    const bool refused = !root.ok() || (*root)["error"] == "busy";
    EXPECT_TRUE(refused) << (root.ok() ? root->dump() : root.message());
  }
}

TEST(ControlServer, AGroupMemberCannotTakeEveryConnection) { member_floods_connections(true); }
TEST(ControlServer, AGroupMemberTakesEveryConnectionWithThePerUidBoundAblated) { member_floods_connections(false); }

// The CLI side: a request carries a command line and an environment, so control_call sends it
// only to a server run by root or by the caller's own uid. Here a server of uid 65534 listens on
// a socket anyone may connect to; root's control_call refuses before sending a byte.
TEST(ControlCall, RefusesAServerOfAnotherUid) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a server as another uid";
  char tmpl[] = "/tmp/lh-ctl-uid-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  const std::string path = dir + "/foreign.sock";
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Only async-signal-safe calls from here on. Exit status: bytes received (capped), 100+ on error.
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) _exit(110);
    const int lfd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path.c_str(), path.size());
    if (::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(lfd, 4) != 0) _exit(111);
    ::chmod(path.c_str(), 0666);
    [[maybe_unused]] ssize_t w = ::write(ready[1], "r", 1);
    const int cfd = ::accept(lfd, nullptr, nullptr);
    if (cfd < 0) _exit(112);
    char buf[64];
    ssize_t total = 0;
    for (ssize_t n; (n = ::recv(cfd, buf, sizeof buf, 0)) > 0;) total += n;
    _exit(total > 99 ? 99 : static_cast<int>(total));
  }
  ::close(ready[1]);
  char r = 0;
  ASSERT_EQ(::read(ready[0], &r, 1), 1);
  ::close(ready[0]);
  const auto answer = control_call(path, {{"v", 1}, {"op", "run"}, {"argv", {"cat", "/etc/shadow"}},
                                          {"env", {{"SECRET", "x"}}}},
                                   5000);
  EXPECT_EQ(answer.code(), Errc::permission_denied);
  const std::string& error = answer.message();
  EXPECT_NE(error.find("served by uid 65534"), std::string::npos) << error;
  EXPECT_NE(error.find("refusing to send"), std::string::npos) << error;
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "bytes the foreign server received";
  std::filesystem::remove_all(dir);
}

// A non-root supervisor's default socket directory is $HOME/.leasehold (not /tmp) and must be
// its own with mode 0700: one that others may write is refused, naming the fix.
TEST(ControlServer, ANonRootServerRefusesADefaultDirectoryOthersMayWrite) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to act as another uid";
  char tmpl[] = "/tmp/lh-ctl-home-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string home = tmpl;
  ASSERT_EQ(::chown(home.c_str(), 65534, 65534), 0);
  ASSERT_EQ(::mkdir((home + "/.leasehold").c_str(), 0777), 0);
  ASSERT_EQ(::chmod((home + "/.leasehold").c_str(), 0777), 0);
  ASSERT_EQ(::chown((home + "/.leasehold").c_str(), 65534, 65534), 0);
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(out[0]);
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) _exit(10);
    ::unsetenv("XDG_RUNTIME_DIR");
    ::setenv("HOME", home.c_str(), 1);
    std::string text = runtime_dir() + "\n";
    {
      ControlServer s(ControlAccess{65534, std::nullopt}, [](ControlClientId, ControlRequest) {});
      text += s.open(runtime_dir() + "/supervisor.sock").message() + "\n";
    }
    ::chmod((home + "/.leasehold").c_str(), 0700);
    {
      ControlServer s(ControlAccess{65534, std::nullopt}, [](ControlClientId, ControlRequest) {});
      text += "fixed:" + s.open(runtime_dir() + "/supervisor.sock").message() + "\n";
      s.close_all();
    }
    [[maybe_unused]] ssize_t w = ::write(out[1], text.data(), text.size());
    _exit(0);
  }
  ::close(out[1]);
  std::string text;
  char buf[1024];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(n));
  ::close(out[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_EQ(text.rfind(home + "/.leasehold\n", 0), 0u) << text;
  EXPECT_NE(text.find("mode 0777"), std::string::npos) << text;
  EXPECT_NE(text.find("fix: chmod 0700 " + home + "/.leasehold"), std::string::npos) << text;
  EXPECT_NE(text.find("fixed:\n"), std::string::npos) << "a 0700 directory of its own is accepted: " << text;
  std::filesystem::remove_all(home);
}

}  // namespace
}  // namespace leasehold
