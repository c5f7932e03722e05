// lockd flags: defaults are valid; each invalid combination is refused with a reason.
#include "lockd/config.hpp"

#include <CLI/CLI.hpp>
#include <gtest/gtest.h>

namespace leasehold::lockd {
namespace {

// Parses `args` (without the program name) and returns validate()'s verdict, or the CLI11 error.
std::string parse(std::vector<std::string> args, LockdConfig* out = nullptr) {
  CLI::App app("lockd");
  LockdConfig cfg;
  add_lockd_flags(app, cfg);
  std::vector<const char*> argv{"leasehold-lockd"};
  for (auto& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    return std::string("parse: ") + e.what();
  }
  if (out != nullptr) *out = cfg;
  return validate(cfg);
}

TEST(LockdConfig, DefaultsWithKeyAreValid) {
  LockdConfig cfg;
  EXPECT_EQ(parse({"--key-file", "/etc/hostname"}, &cfg), "");
  EXPECT_EQ(cfg.listen, "127.0.0.1:7400");
  EXPECT_EQ(cfg.ttl_ms, 10'000u);
  EXPECT_EQ(cfg.mode, LockMode::lease);
}

TEST(LockdConfig, KeyFileRequired) {
  EXPECT_NE(parse({}).find("--key-file is required"), std::string::npos);
}

TEST(LockdConfig, GenerateKeyNeedsNothingElse) {
  LockdConfig cfg;
  EXPECT_EQ(parse({"--generate-key", "/tmp/k"}, &cfg), "");
  EXPECT_EQ(cfg.generate_key_path.value_or(""), "/tmp/k");
}

TEST(LockdConfig, RefusesBadCombinations) {
  const std::string k = "/etc/hostname";
  EXPECT_NE(parse({"--key-file", k, "--ttl-ms", "0"}).find("--ttl-ms must be at least 1"), std::string::npos);
  EXPECT_NE(parse({"--key-file", k, "--ttl-ms", "3600001"}).find("exceeds"), std::string::npos);
  EXPECT_NE(parse({"--key-file", k, "--acquiring-ttl-ms", "0"}).find("--acquiring-ttl-ms"), std::string::npos);
  EXPECT_NE(parse({"--key-file", k, "--acquiring-ttl-ms", "300001"}).find("not preemptible"), std::string::npos);
  EXPECT_NE(parse({"--key-file", k, "--lock-delay-ms", "60000", "--ttl-ms", "100000"}).find("one minute"),
            std::string::npos);
  EXPECT_NE(parse({"--key-file", k, "--lock-delay-ms", "10000", "--ttl-ms", "10000"}).find("below --ttl-ms"),
            std::string::npos);
  EXPECT_NE(parse({"--key-file", k, "--worker-ttl-ms", "500"}).find("preemptible only"), std::string::npos);
  EXPECT_EQ(parse({"--key-file", k, "--mode", "preemptible", "--worker-ttl-ms", "500"}), "");
  EXPECT_NE(parse({"--key-file", k, "--mode", "preemptible", "--worker-ttl-ms", "0"}).find("at least 1"),
            std::string::npos);
  EXPECT_NE(parse({"--key-file", k, "--mode", "exclusive"}).find("parse:"), std::string::npos);
  EXPECT_NE(parse({"--key-file", k, "--max-names", "0"}).find("--max-names"), std::string::npos);
  EXPECT_NE(parse({"--key-file", k, "--listen", "localhost:7400"}).find("numeric"), std::string::npos);
  EXPECT_NE(parse({"--key-file", k, "--listen", "127.0.0.1:70000"}).find("numeric"), std::string::npos);
  EXPECT_EQ(parse({"--key-file", k, "--listen", "[::1]:0"}), "");
}

TEST(LockdConfig, ReservationTtlDefaultsToAFewLeaseTtlsAndIsBounded) {
  const std::string k = "/etc/hostname";
  LockdConfig cfg;
  EXPECT_EQ(parse({"--key-file", k, "--ttl-ms", "2000"}, &cfg), "");
  EXPECT_EQ(cfg.effective_reservation_ttl_ms(), 3 * 2000u);
  EXPECT_EQ(parse({"--key-file", k, "--reservation-ttl-ms", "750"}, &cfg), "");
  EXPECT_EQ(cfg.effective_reservation_ttl_ms(), 750u);
  EXPECT_NE(parse({"--key-file", k, "--reservation-ttl-ms", "0"}).find("--reservation-ttl-ms must be at least 1"),
            std::string::npos);
  EXPECT_NE(parse({"--key-file", k, "--reservation-ttl-ms", "86400001"}).find("exceeds 86400000"),
            std::string::npos);
  EXPECT_NE(parse({"--key-file", k, "--reservation-ttl-ms", "soon"}).find("parse:"), std::string::npos);
}

TEST(LockdConfig, HelpNamesUnits) {
  CLI::App app("lockd");
  LockdConfig cfg;
  add_lockd_flags(app, cfg);
  const std::string help = app.help();
  for (const char* flag : {"--ttl-ms", "--acquiring-ttl-ms", "--lock-delay-ms", "--worker-ttl-ms",
                           "--reservation-ttl-ms"})
    EXPECT_NE(help.find(flag), std::string::npos) << flag;
  EXPECT_NE(help.find("milliseconds"), std::string::npos);
}

}  // namespace
}  // namespace leasehold::lockd
