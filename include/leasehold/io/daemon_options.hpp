// leasehold/io: the command-line conventions both daemons share: the log flags and the config
// file (README "Running as a service").
//
// The config file is CLI11's: a TOML file of `flag-name = value` lines (`ttl-ms = 10000`,
// `key-file = ["a.key", "b.key"]`, `bwrap = true`), one key per long flag, so every flag is a
// config key without code of its own. A flag on the command line overrides the file. The
// default file (/etc/leasehold/<daemon>.toml) may be missing; a file given with --config must
// exist; --no-config reads none (tests and hand runs that must not pick up the host's file); an
// unknown key, a [section] or a bad value is an error naming the file and the key. The daemons
// log the file they read in their start line (config=PATH or config=none).
#pragma once

#include "leasehold/io/event_log.hpp"

#include <string>

namespace CLI {
class App;
class ParseError;
}  // namespace CLI

namespace leasehold {

/// Where a daemon's config file is when --config is not given (FHS: /etc/leasehold/).
inline constexpr const char* kLockdConfigDefault = "/etc/leasehold/lockd.toml";
inline constexpr const char* kSupervisorConfigDefault = "/etc/leasehold/supervisor.toml";

struct LogOptions {
  LogFormat format = LogFormat::logfmt;
  LogLevel level = LogLevel::info;
};

/// --log-format logfmt|json and --log-level debug|info|warn|error, into `out`.
void add_log_flags(CLI::App& app, LogOptions& out);

/// --config FILE, default `default_path` (read when it exists); unknown keys in it are errors.
/// --no-config reads no file at all; an empty --config is an error.
void add_config_file(CLI::App& app, const std::string& default_path);

/// After a successful parse: the config file that was read (given, or the default because it
/// exists), or "none". For the daemon's start line (config=...).
std::string config_file_read(const CLI::App& app);

/// --metrics-listen ADDR:PORT into `listen` and --metrics-allow CIDR[,CIDR...] into `allow`:
/// absent means no endpoint (every peer); an empty value (on the command line or in the file)
/// is an error naming the flag. Their syntax is checked where the endpoint starts.
void add_metrics_flags(CLI::App& app, std::string& listen, std::string& allow, int conventional_port);

/// The message for a failed parse when the config file caused it ("config file F: key K: ..."):
/// an unreadable file, an unknown key or section, or a bad value of a key the command line did
/// not give. Empty when the error is the command line's (CLI::App::exit then prints it).
std::string config_file_error(const CLI::App& app, const CLI::ParseError& e, int argc, const char* const* argv);

}  // namespace leasehold
