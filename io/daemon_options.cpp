#include "leasehold/io/daemon_options.hpp"

#include <CLI/CLI.hpp>

#include <cctype>
#include <string_view>

namespace leasehold {

void add_log_flags(CLI::App& app, LogOptions& out) {
  app.add_option("--log-format", "log line format on stderr: logfmt | json (default: logfmt); each line has "
                                 "time (RFC 3339 UTC, ms), ts_boot_ns (CLOCK_BOOTTIME) and level")
      ->check(CLI::IsMember({"logfmt", "json"}))
      ->each([&out](const std::string& v) { out.format = parse_log_format(v).value_or(LogFormat::logfmt); });
  app.add_option("--log-level", "lowest level logged: debug | info | warn | error (default: info); "
                                "re-read from the config file on SIGHUP")
      ->check(CLI::IsMember({"debug", "info", "warn", "error"}))
      ->each([&out](const std::string& v) { out.level = parse_log_level(v).value_or(LogLevel::info); });
}

void add_config_file(CLI::App& app, const std::string& default_path) {
  CLI::Option* config = app.set_config(
      "--config", default_path,
      "TOML config file of flag-name = value lines (every long flag is a key, e.g. ttl-ms = 10000); flags on the "
      "command line override it. Default: " + default_path + ", read when it exists (the start line's config= "
      "says which file was read); --no-config reads none");
  // An empty name would read no file without saying so (CLI11 skips it): --no-config says that.
  config->check(
      [](const std::string& v) { return v.empty() ? std::string("empty: name a file, or give --no-config to read none") : std::string(); },
      "FILE");
  // Before the file is read (trigger_on_parse: while the command line is parsed), so the default
  // file is not even looked at: what tests and hand runs that must not pick up /etc give.
  app.add_flag_callback("--no-config", [config] { config->default_str(""); },
                        "read no config file, not even the default " + default_path)
      ->trigger_on_parse()
      ->configurable(false)
      ->excludes(config);
  app.allow_config_extras(CLI::config_extras_mode::error);
}

std::string config_file_read(const CLI::App& app) {
  // CLI11 records the default file as the option's result once it has read it.
  const CLI::Option* config = app.get_config_ptr();
  if (config == nullptr || config->count() == 0) return "none";
  try {
    const std::string path = config->as<std::string>();
    return path.empty() ? "none" : path;
  } catch (const CLI::Error&) {
    return "none";
  }
}

void add_metrics_flags(CLI::App& app, std::string& listen, std::string& allow, int conventional_port) {
  app.add_option("--metrics-listen", listen,
                 "serve Prometheus /metrics and /healthz over HTTP on ADDR:PORT (conventionally port " +
                     std::to_string(conventional_port) +
                     "; port 0 picks a free port, printed as 'metrics http://ADDR:PORT/metrics' on stdout); "
                     "default: off (the flag, or the config key, absent)")
      // Off is the flag left out: an empty value (a template's `metrics-listen = ""`, an unset
      // shell variable) is a mistake, not a way to turn the endpoint off without a word.
      ->check([](const std::string& v) {
        return v.empty() ? std::string("empty: give ADDR:PORT, or leave it out for no HTTP endpoint") : std::string();
      });
  app.add_option("--metrics-allow", allow,
                 "with --metrics-listen: only peers in these networks, CIDR[,CIDR...] (e.g. 10.0.0.0/8,127.0.0.1); a "
                 "connection from any other address is closed at once; default: every peer")
      ->check([](const std::string& v) {
        return v.empty() ? std::string("empty: give CIDR[,CIDR...], or leave it out to admit every peer") : std::string();
      });
}

namespace {

bool given_on_command_line(std::string_view flag, int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--") break;
    if (a == flag || (a.size() > flag.size() && a.substr(0, flag.size()) == flag && a[flag.size()] == '='))
      return true;
  }
  return false;
}

}  // namespace

std::string config_file_error(const CLI::App& app, const CLI::ParseError& e, int argc, const char* const* argv) {
  const CLI::Option* config = app.get_config_ptr();
  if (config == nullptr) return {};
  std::string path;
  try {
    path = config->as<std::string>();
  } catch (const CLI::Error&) {  // --config "" itself: its value fails its check again here
  }
  const std::string what = e.what();
  const std::string name = e.get_name();
  if (name == "FileError") return "config file " + path + ": cannot read it: " + what;
  if (name == "ConfigError") {
    constexpr std::string_view kExtras = "INI was not able to parse ";
    if (what.rfind(kExtras, 0) == 0) {
      std::string key = what.substr(kExtras.size());
      if (key.size() > 3 && key.compare(key.size() - 3, 3, ".++") == 0)
        return "config file " + path + ": section [" + key.substr(0, key.size() - 3) +
               "]: sections are not used, every key is a top-level flag name";
      return "config file " + path + ": unknown key \"" + key + "\" (keys are the long flag names without --, see --help)";
    }
    return "config file " + path + ": " + what;
  }
  if (name == "ConversionError" || name == "ValidationError") {
    // "--ttl-ms: ..." or "Could not convert: --ttl-ms = abc": the flag the value was for.
    const std::size_t at = what.find("--");
    if (at == std::string::npos) return {};
    std::size_t end = at + 2;
    while (end < what.size() && (std::isalnum(static_cast<unsigned char>(what[end])) != 0 || what[end] == '-')) ++end;
    const std::string flag = what.substr(at, end - at);
    if (given_on_command_line(flag, argc, argv)) return {};
    return "config file " + path + ": key \"" + flag.substr(2) + "\": " + what;
  }
  return {};
}

}  // namespace leasehold
