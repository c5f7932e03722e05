// The daemons' shared command-line conventions (io/daemon_options.hpp): a TOML config file whose
// keys are the long flag names, flags overriding it, and errors that name the file and the key.
#include "leasehold/io/daemon_options.hpp"

#include <CLI/CLI.hpp>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace leasehold {
namespace {

namespace fs = std::filesystem;

struct Parsed {
  std::uint64_t ttl_ms = 10'000;
  std::vector<std::string> key_files;
  bool bwrap = false;
  LogOptions log;
  std::string metrics_listen;
  std::string metrics_allow;
  std::string config_read;  ///< config_file_read after a successful parse
  std::optional<std::string> error;  ///< config_file_error's message, or "cli: ..." for the command line's
};

Parsed parse(const std::string& default_config, std::vector<std::string> args) {
  CLI::App app{"test"};
  Parsed p;
  add_config_file(app, default_config);
  add_log_flags(app, p.log);
  app.add_option("--ttl-ms", p.ttl_ms);
  app.add_option("--key-file", p.key_files);
  app.add_flag("--bwrap", p.bwrap);
  add_metrics_flags(app, p.metrics_listen, p.metrics_allow, 9740);
  std::vector<const char*> argv = {"daemon"};
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), const_cast<char**>(argv.data()));
    p.config_read = config_file_read(app);
  } catch (const CLI::ParseError& e) {
    const std::string why = config_file_error(app, e, static_cast<int>(argv.size()), argv.data());
    p.error = why.empty() ? "cli: " + std::string(e.what()) : why;
  }
  return p;
}

class DaemonOptions : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/daemon-options-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  fs::path dir_;
};

TEST_F(DaemonOptions, AMissingDefaultFileIsFine) {
  const Parsed p = parse((dir_ / "absent.toml").string(), {});
  ASSERT_FALSE(p.error) << *p.error;
  EXPECT_EQ(p.ttl_ms, 10'000u);
  EXPECT_EQ(p.log.level, LogLevel::info);
  EXPECT_EQ(p.log.format, LogFormat::logfmt);
}

TEST_F(DaemonOptions, EveryFlagIsAKeyAndTheCommandLineWins) {
  const std::string cfg = file("d.toml",
                               "# comment\nttl-ms = 7000\nkey-file = [\"a.key\", \"b.key\"]\nbwrap = true\n"
                               "log-level = \"warn\"\nlog-format = \"json\"\n");
  Parsed p = parse(cfg, {});  // as the default file
  ASSERT_FALSE(p.error) << *p.error;
  EXPECT_EQ(p.ttl_ms, 7000u);
  EXPECT_EQ(p.key_files, (std::vector<std::string>{"a.key", "b.key"}));
  EXPECT_TRUE(p.bwrap);
  EXPECT_EQ(p.log.level, LogLevel::warn);
  EXPECT_EQ(p.log.format, LogFormat::json);
  p = parse((dir_ / "absent.toml").string(), {"--config", cfg, "--ttl-ms", "9000", "--log-level", "debug"});
  ASSERT_FALSE(p.error) << *p.error;
  EXPECT_EQ(p.ttl_ms, 9000u);
  EXPECT_EQ(p.log.level, LogLevel::debug);
  EXPECT_EQ(p.log.format, LogFormat::json);
}

TEST_F(DaemonOptions, AMissingGivenFileIsAnErrorNamingIt) {
  const std::string missing = (dir_ / "nope.toml").string();
  const Parsed p = parse((dir_ / "absent.toml").string(), {"--config", missing});
  ASSERT_TRUE(p.error);
  EXPECT_EQ(p.error->rfind("config file " + missing + ": cannot read it", 0), 0u) << *p.error;
}

TEST_F(DaemonOptions, AnUnknownKeyOrASectionIsAnErrorNamingFileAndKey) {
  const std::string cfg = file("u.toml", "ttl-ms = 5\nttl_ms = 6\n");
  Parsed p = parse((dir_ / "absent.toml").string(), {"--config", cfg});
  ASSERT_TRUE(p.error);
  EXPECT_EQ(*p.error, "config file " + cfg + ": unknown key \"ttl_ms\" (keys are the long flag names without --, see --help)");
  const std::string sec = file("s.toml", "[lockd]\nttl-ms = 5\n");
  p = parse(sec, {});
  ASSERT_TRUE(p.error);
  EXPECT_NE(p.error->find("config file " + sec + ": section [lockd]"), std::string::npos) << *p.error;
}

TEST_F(DaemonOptions, ABadValueInTheFileNamesFileAndKey) {
  const std::string cfg = file("b.toml", "ttl-ms = \"soon\"\n");
  Parsed p = parse((dir_ / "absent.toml").string(), {"--config", cfg});
  ASSERT_TRUE(p.error);
  EXPECT_EQ(p.error->rfind("config file " + cfg + ": key \"ttl-ms\": ", 0), 0u) << *p.error;
  const std::string lvl = file("l.toml", "log-level = \"loud\"\n");
  p = parse((dir_ / "absent.toml").string(), {"--config", lvl});
  ASSERT_TRUE(p.error);
  EXPECT_EQ(p.error->rfind("config file " + lvl + ": key \"log-level\": ", 0), 0u) << *p.error;
  // The same bad value on the command line is the command line's error, not the file's.
  p = parse((dir_ / "absent.toml").string(), {"--log-level", "loud"});
  ASSERT_TRUE(p.error);
  EXPECT_EQ(p.error->rfind("cli: ", 0), 0u) << *p.error;
}

// Off is the flag left out; an empty value is a mistake (an unset variable, a template's
// placeholder), refused naming the flag, or the file and the key.
TEST_F(DaemonOptions, AnEmptyMetricsListenIsAnErrorNamingTheFlag) {
  const std::string absent = (dir_ / "absent.toml").string();
  Parsed p = parse(absent, {"--metrics-listen", ""});
  ASSERT_TRUE(p.error);
  EXPECT_EQ(*p.error, "cli: --metrics-listen: empty: give ADDR:PORT, or leave it out for no HTTP endpoint");
  const std::string cfg = file("m.toml", "metrics-listen = \"\"\n");
  p = parse(absent, {"--config", cfg});
  ASSERT_TRUE(p.error);
  EXPECT_EQ(*p.error, "config file " + cfg + ": key \"metrics-listen\": --metrics-listen: empty: give ADDR:PORT, or "
                      "leave it out for no HTTP endpoint");
  p = parse(absent, {});
  ASSERT_FALSE(p.error) << *p.error;
  EXPECT_EQ(p.metrics_listen, "");
  p = parse(absent, {"--metrics-listen", "127.0.0.1:0"});
  ASSERT_FALSE(p.error) << *p.error;
  EXPECT_EQ(p.metrics_listen, "127.0.0.1:0");
}

// The file that was read is known (for the start line), and --no-config reads none, not even a
// default file that exists: what a run that must not pick up the host's /etc/leasehold gives.
TEST_F(DaemonOptions, TheFileReadIsKnownAndNoConfigReadsNone) {
  const std::string def = file("default.toml", "ttl-ms = 7000\n");
  Parsed p = parse(def, {});
  ASSERT_FALSE(p.error) << *p.error;
  EXPECT_EQ(p.config_read, def);
  EXPECT_EQ(p.ttl_ms, 7000u);
  p = parse(def, {"--no-config"});
  ASSERT_FALSE(p.error) << *p.error;
  EXPECT_EQ(p.config_read, "none");
  EXPECT_EQ(p.ttl_ms, 10'000u);
  p = parse((dir_ / "absent.toml").string(), {});
  ASSERT_FALSE(p.error) << *p.error;
  EXPECT_EQ(p.config_read, "none");
  const std::string given = file("given.toml", "ttl-ms = 8000\n");
  p = parse(def, {"--config", given});
  ASSERT_FALSE(p.error) << *p.error;
  EXPECT_EQ(p.config_read, given);
  EXPECT_EQ(p.ttl_ms, 8000u);
  // An empty name is not a quiet way to read none, and --no-config with a file is a contradiction.
  p = parse(def, {"--config", ""});
  ASSERT_TRUE(p.error);
  EXPECT_NE(p.error->find("--config: empty: name a file, or give --no-config to read none"), std::string::npos) << *p.error;
  p = parse(def, {"--no-config", "--config", given});
  ASSERT_TRUE(p.error);
  EXPECT_NE(p.error->find("excludes"), std::string::npos) << *p.error;
}

}  // namespace
}  // namespace leasehold
