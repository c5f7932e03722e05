// lockd flags: defaults are valid; each invalid combination is refused with a reason.
#include "leasehold/lockd/config.hpp"

#include <CLI/CLI.hpp>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

namespace leasehold::lockd {
namespace {

// Parses `args` (without the program name) and returns validate()'s verdict, or the CLI11 error.
std::string parse(std::vector<std::string> args, LockdConfig* out = nullptr) {
  CLI::App app("lockd");
  LockdConfig cfg;
  add_lockd_flags(app, cfg);
  std::vector<const char*> argv{"leasehold-lockd"};
  // The flags given, never the host's /etc/leasehold/lockd.toml, unless a test names a file.
  if (std::find(args.begin(), args.end(), "--config") == args.end()) argv.push_back("--no-config");
  for (auto& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    return std::string("parse: ") + e.what();
  }
  if (out != nullptr) *out = cfg;
  return validate(cfg).message();
}

TEST(LockdConfig, DefaultsWithKeyAreValid) {
  LockdConfig cfg;
  EXPECT_EQ(parse({"--key-file", "/etc/hostname"}, &cfg), "");
  EXPECT_EQ(cfg.listen, "127.0.0.1:7400");
  EXPECT_EQ(cfg.ttl_ms, 10'000u);
  EXPECT_EQ(cfg.mode, LockMode::lease);
}

TEST(LockdConfig, TheShippedExampleConfigFileIsValid) {
  // packaging/lockd.toml, what /etc/leasehold/lockd.toml starts as: it parses, and as a service
  // the store is in the state directory, while the command line keeps its relative default.
  LockdConfig cfg;
  EXPECT_EQ(parse({"--config", LEASEHOLD_SOURCE_DIR "/packaging/lockd.toml"}, &cfg), "");
  EXPECT_EQ(cfg.store_path, "/var/lib/leasehold/lockd.db");
  EXPECT_EQ(cfg.key_files, std::vector<std::string>{"/etc/leasehold/cluster.key"});
  EXPECT_EQ(cfg.ttl_ms, 10'000u);
  EXPECT_EQ(cfg.log.level, LogLevel::info);
  LockdConfig plain;
  EXPECT_EQ(parse({"--key-file", "/etc/hostname", "--config", "/nonexistent/default-only.toml"}, &plain).rfind("parse: ", 0),
            0u)
      << "a config file given by name must exist";
  EXPECT_EQ(parse({"--key-file", "/etc/hostname", "--log-level", "warn", "--log-format", "json"}, &plain), "");
  EXPECT_EQ(plain.store_path, "lockd.db");
  EXPECT_EQ(plain.log.level, LogLevel::warn);
  EXPECT_EQ(plain.log.format, LogFormat::json);
}

// Off is the flag left out: an empty --metrics-listen is refused, naming the flag.
TEST(LockdConfig, AnEmptyMetricsListenIsRefused) {
  EXPECT_EQ(parse({"--key-file", "/etc/hostname", "--metrics-listen", ""}),
            "parse: --metrics-listen: empty: give ADDR:PORT, or leave it out for no HTTP endpoint");
  EXPECT_EQ(parse({"--key-file", "/etc/hostname", "--metrics-allow", ""}),
            "parse: --metrics-allow: empty: give CIDR[,CIDR...], or leave it out to admit every peer");
  LockdConfig cfg;
  EXPECT_EQ(parse({"--key-file", "/etc/hostname", "--metrics-listen", "127.0.0.1:0", "--metrics-allow", "10.0.0.0/8"}, &cfg), "");
  EXPECT_EQ(cfg.metrics_listen, "127.0.0.1:0");
  EXPECT_EQ(cfg.metrics_allow, "10.0.0.0/8");
}

TEST(LockdConfig, KeyFileRequired) {
  EXPECT_NE(parse({}).find("--key-file or --key-dir is required"), std::string::npos);
}

TEST(LockdConfig, GenerateKeyNeedsNothingElse) {
  LockdConfig cfg;
  EXPECT_EQ(parse({"--generate-key", "/tmp/k"}, &cfg), "");
  EXPECT_EQ(cfg.generate_key_path.value_or(""), "/tmp/k");
}

TEST(LockdConfig, GenerateKeyTakesOutAndDeriveTakesOneClusterKey) {
  LockdConfig cfg;
  EXPECT_EQ(parse({"--generate-key", "--out", "/tmp/k"}, &cfg), "");
  EXPECT_EQ(cfg.generate_key_path.value_or("unset"), "");
  EXPECT_EQ(cfg.derive_out, "/tmp/k");
  EXPECT_NE(parse({"--generate-key"}).find("--generate-key needs a PATH, or --out PATH"), std::string::npos);
  EXPECT_NE(parse({"--generate-key", "/tmp/a", "--out", "/tmp/b"}).find("name two files"), std::string::npos);
  EXPECT_NE(parse({"--derive-worker-key", "--worker-id", "00000000-0000-0000-0000-000000000001", "--key-file",
                   "/tmp/a", "--key-file", "/tmp/b", "--out", "/tmp/w"})
                .find("needs one --key-file"),
            std::string::npos);
  LockdConfig two;
  EXPECT_EQ(parse({"--key-file", "/tmp/a", "--key-file", "/tmp/b"}, &two), "");
  EXPECT_EQ(two.key_files.size(), 2u);
  LockdConfig dir;
  EXPECT_EQ(parse({"--key-dir", "/tmp/keys"}, &dir), "");  // a key directory alone is enough
}

// A tag made with cluster key N itself carries key id N | 0x8000, so a cluster key's id is
// 1..32767; an admin key's id may be any of 1..65535.
TEST(LockdConfig, GenerateKeyIdRangeIsTheKindsRange) {
  LockdConfig cfg;
  EXPECT_EQ(parse({"--generate-key", "/tmp/k", "--key-id", "32767"}, &cfg), "");
  EXPECT_EQ(cfg.key_id, 32767);
  const std::string high = parse({"--generate-key", "/tmp/k", "--key-id", "32768"});
  EXPECT_NE(high.find("--key-id 32768 is out of range for a cluster key: 1..32767"), std::string::npos) << high;
  EXPECT_NE(parse({"--generate-key", "/tmp/k", "--kind", "cluster", "--key-id", "65535"}).find("1..32767"),
            std::string::npos);
  EXPECT_EQ(parse({"--generate-key", "/tmp/k", "--kind", "admin", "--key-id", "65535"}, &cfg), "");
  EXPECT_EQ(cfg.key_id, 65535);
  EXPECT_NE(parse({"--generate-key", "/tmp/k", "--key-id", "0"}).find("parse: "), std::string::npos);
  EXPECT_NE(parse({"--generate-key", "/tmp/k", "--key-id", "65536"}).find("parse: "), std::string::npos);
}

TEST(LockdConfig, LoadKeysRefusesAKeyDirectoryOthersCanWriteAndWorkerKeys) {
  char tmpl[] = "/tmp/lockd-keys-XXXXXX";
  const std::string d = ::mkdtemp(tmpl);
  ASSERT_EQ(wire::generate_key_file(d + "/cluster-1.key", wire::KeyKind::cluster, 1).message(), "");
  ASSERT_EQ(wire::generate_key_file(d + "/admin-9.key", wire::KeyKind::admin, 9).message(), "");
  LockdConfig cfg;
  cfg.key_dir = d;
  const auto keys = load_keys(cfg);
  ASSERT_TRUE(keys.ok()) << keys.message();
  ASSERT_EQ(keys->size(), 2u);
  ::chmod(d.c_str(), 0777);
  const auto open_dir = load_keys(cfg);
  EXPECT_EQ(open_dir.code(), Errc::permission_denied);
  EXPECT_NE(open_dir.message().find("is writable by others"), std::string::npos) << open_dir.message();
  ::chmod(d.c_str(), 0700);
  auto cluster = wire::load_key_file(d + "/cluster-1.key");
  ASSERT_TRUE(cluster) << cluster.message();
  ASSERT_EQ(wire::write_key_file(d + "/w.key", wire::derive_worker_key(*cluster, WorkerId{1, 2})).message(), "");
  const auto worker_key = load_keys(cfg);
  EXPECT_EQ(worker_key.code(), Errc::invalid_argument);
  EXPECT_NE(worker_key.message().find("a worker key belongs to its supervisor"), std::string::npos) << worker_key.message();
  ::unlink((d + "/w.key").c_str());
  cfg.key_files = {d + "/cluster-1.key"};  // the same key twice: one id, two keys
  const auto twice = load_keys(cfg);
  EXPECT_EQ(twice.code(), Errc::exists);
  EXPECT_NE(twice.message().find("used by two keys"), std::string::npos) << twice.message();
  std::filesystem::remove_all(d);
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

TEST(LockdConfig, AnEtcdStoreNeedsASharedSigningKeyAReachableAddressAndATtlAboveTheFailoverBound) {
  const std::string k = "/etc/hostname";
  const std::string etcd = "etcd://127.0.0.1:2379,127.0.0.1:22379/lh";
  const std::string sk = "/etc/hostname";  // validate() checks presence; the load checks the file
  LockdConfig cfg;
  EXPECT_EQ(parse({"--key-file", k, "--store", etcd, "--signing-key-file", sk}, &cfg), "");
  EXPECT_TRUE(uses_etcd(cfg));
  EXPECT_EQ(failover_bound_ms(cfg), 3000u);  // a 2 s leadership lease + 1 s to elect and load
  EXPECT_NE(parse({"--key-file", k, "--store", etcd}).find("needs --signing-key-file"), std::string::npos);
  EXPECT_NE(parse({"--key-file", k, "--store", "etcd://", "--signing-key-file", sk}).find("no etcd endpoint"),
            std::string::npos);
  EXPECT_NE(parse({"--key-file", k, "--store", "etcd://h1,h2:2379", "--signing-key-file", sk}).find("\"h1\" has no valid :PORT"),
            std::string::npos);
  EXPECT_NE(parse({"--key-file", k, "--store", "etcd://h:2379/", "--signing-key-file", sk}).find("empty key prefix"),
            std::string::npos);
  EXPECT_NE(parse({"--key-file", k, "--store", etcd, "--signing-key-file", sk, "--listen", "0.0.0.0:7400"})
                .find("give --advertise"),
            std::string::npos);
  EXPECT_EQ(parse({"--key-file", k, "--store", etcd, "--signing-key-file", sk, "--listen", "0.0.0.0:7400",
                   "--advertise", "10.0.0.5:7400"}),
            "");
  EXPECT_NE(parse({"--key-file", k, "--store", etcd, "--signing-key-file", sk, "--advertise", "0.0.0.0:7400"})
                .find("clients can reach"),
            std::string::npos);
  EXPECT_NE(parse({"--key-file", k, "--store", etcd, "--signing-key-file", sk, "--ttl-ms", "3000"})
                .find("above the failover bound 3000 ms"),
            std::string::npos);
  EXPECT_EQ(parse({"--key-file", k, "--store", etcd, "--signing-key-file", sk, "--ttl-ms", "3001"}), "");
  EXPECT_NE(parse({"--key-file", k, "--store", etcd, "--signing-key-file", sk, "--leader-lease-s", "0"})
                .find("--leader-lease-s 0 must be in 1..60"),
            std::string::npos);
  EXPECT_NE(parse({"--key-file", k, "--advertise", "127.0.0.1:7400"}).find("etcd store only"), std::string::npos);
  // A mistyped etcd URL is not taken for a SQLite file name (a second, standalone table).
  for (const char* typo : {"etcd:127.0.0.1:2379", "ETCD://127.0.0.1:2379", "etcd:/127.0.0.1:2379", "http://h:1"})
    EXPECT_NE(parse({"--key-file", k, "--store", typo, "--signing-key-file", sk}).find("looks like a URL"),
              std::string::npos)
        << typo;
  EXPECT_EQ(parse({"--key-file", k, "--store", "./etcd:127.0.0.1:2379"}), "");
}

TEST(LockdConfig, AShardIsOneOfTheClustersShardsOnAnEtcdStoreInLeaseMode) {
  const std::string k = "/etc/hostname";
  const std::string etcd = "etcd://127.0.0.1:2379";
  LockdConfig cfg;
  EXPECT_EQ(parse({"--key-file", k, "--store", etcd, "--signing-key-file", k}, &cfg), "");
  EXPECT_EQ(cfg.shard, 0u);  // one shard by default: the cluster as it was
  EXPECT_EQ(cfg.shards, 1u);
  EXPECT_EQ(parse({"--key-file", k, "--store", etcd, "--signing-key-file", k, "--shard", "3", "--shards", "4"}, &cfg),
            "");
  EXPECT_EQ(cfg.shard, 3u);
  EXPECT_EQ(cfg.shards, 4u);
  EXPECT_EQ(parse({"--key-file", k, "--store", etcd, "--signing-key-file", k, "--shards", "1024"}), "");
  EXPECT_EQ(parse({"--key-file", k, "--store", etcd, "--signing-key-file", k, "--shard", "4", "--shards", "4"}),
            "--shard 4 is not a shard of a cluster of --shards 4 (shards are numbered 0..3)");
  EXPECT_EQ(parse({"--key-file", k, "--store", etcd, "--signing-key-file", k, "--shards", "0"}),
            "--shards 0 must be in 1..1024");
  EXPECT_EQ(parse({"--key-file", k, "--store", etcd, "--signing-key-file", k, "--shards", "1025"}),
            "--shards 1025 must be in 1..1024");
  EXPECT_EQ(parse({"--key-file", k, "--shards", "2"}),
            "--shard and --shards apply to an etcd store only (--store etcd://...): a SQLite store is one lockd, "
            "one shard");
  EXPECT_EQ(parse({"--key-file", k, "--shard", "1"}),
            "--shard and --shards apply to an etcd store only (--store etcd://...): a SQLite store is one lockd, "
            "one shard");
  EXPECT_EQ(parse({"--key-file", k, "--store", etcd, "--signing-key-file", k, "--shards", "2", "--mode", "preemptible"}),
            "--mode preemptible runs on one shard only (--shards 1): worker liveness is kept by one leader");
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
