// The CLI's reading of a supervisor's error answer (tools/cmd_common.cpp supervisor_failure):
// the refusal in "reason" is read back through the one table of refusal texts. And of lockd's
// missing answers (answer_failure).
#include "tools/cmd_common.hpp"

#include "leasehold/lockd/config.hpp"

#include <gtest/gtest.h>

#include <string>

namespace leasehold::cli {
namespace {

nlohmann::json refused_answer(nlohmann::json reason) {
  return {{"ok", false}, {"error", "refused"}, {"message", "lockd refused the acquire"}, {"reason", std::move(reason)}};
}

constexpr std::string_view kLockDelayHint = "grantable once the old holder's kill is confirmed";

TEST(SupervisorFailure, ALockDelayRefusalSaysWhenTheNameIsGrantable) {
  const Failure f = supervisor_failure(refused_answer(std::string(to_string(Refusal::lock_delay))), "run");
  EXPECT_EQ(f.code, kRefused);
  EXPECT_TRUE(f.message.starts_with("run: lockd refused the acquire")) << f.message;
  EXPECT_NE(f.message.find(kLockDelayHint), std::string::npos) << f.message;
}

// Another refusal, text that is no refusal, a reason that is not text, or none at all: no hint,
// and no exception from the JSON.
TEST(SupervisorFailure, OtherReasonsGetNoLockDelayHint) {
  for (const nlohmann::json& reason : {nlohmann::json(std::string(to_string(Refusal::held))), nlohmann::json("lock_delay "),
                                       nlohmann::json("LOCK_DELAY"), nlohmann::json(7), nlohmann::json(nullptr)}) {
    const Failure f = supervisor_failure(refused_answer(reason), "run");
    EXPECT_EQ(f.code, kRefused) << reason.dump();
    EXPECT_EQ(f.message.find(kLockDelayHint), std::string::npos) << reason.dump() << ": " << f.message;
  }
  nlohmann::json none = refused_answer("x");
  none.erase("reason");
  EXPECT_EQ(supervisor_failure(none, "run").message, "run: lockd refused the acquire");
}

// Every lockd answered, but none leads (a replicated lockd in an election): unreachable, with
// the admin client's account of each, not the "is it running, same key?" guess of a silence.
// A command given a replicated lockd's addresses must outlast a failover: its default timeout
// is above the cluster's failover bound (a leader killed mid-command is replaced within it).
TEST(LockdTimeout, TheDefaultOutlastsAFailoverWhenSeveralAddressesAreGiven) {
  const std::uint64_t bound = lockd::failover_bound_ms(lockd::LockdConfig{});
  LockdFlags cluster;
  cluster.lockd = "127.0.0.1:7401,127.0.0.1:7402,127.0.0.1:7403";
  resolve(cluster);
  EXPECT_EQ(cluster.timeout_ms, bound + kLockdTimeoutMsDefault);
  EXPECT_GT(cluster.timeout_ms, bound);
  EXPECT_EQ(cluster.timeout_ms, 5'000u);  // at lockd's defaults: a 2 s lease, a 3 s bound
  LockdFlags one;
  one.lockd = "127.0.0.1:7400";
  resolve(one);
  EXPECT_EQ(one.timeout_ms, kLockdTimeoutMsDefault);
  LockdFlags given;
  given.lockd = cluster.lockd;
  given.timeout_ms = 700;  // --timeout-ms wins
  resolve(given);
  EXPECT_EQ(given.timeout_ms, 700u);
}

TEST(LockdFailure, NoLeaderSaysSoAndNotThatLockdIsSilent) {
  lockd::Answer a;
  a.status = Status{Errc::timeout, "no lockd among 10.0.0.1:7400, 10.0.0.2:7400 leads: 10.0.0.1:7400: not_leader, "
                                   "no leader known (within 2000 ms (9 attempts))"};
  a.no_leader = true;
  LockdFlags flags;
  flags.lockd = "10.0.0.1:7400,10.0.0.2:7400";
  flags.key_file = "/nonexistent/key";
  const Failure f = answer_failure(a, flags, "show \"orders\"");
  EXPECT_EQ(f.code, kUnreachable);
  EXPECT_TRUE(f.message.starts_with("show \"orders\": no lockd among 10.0.0.1:7400, 10.0.0.2:7400 leads: ")) << f.message;
  EXPECT_NE(f.message.find("an election takes a few seconds"), std::string::npos) << f.message;
  EXPECT_EQ(f.message.find("is unreachable: no answer"), std::string::npos) << f.message;
  a.no_leader = false;  // silence: the old message
  EXPECT_NE(answer_failure(a, flags, "show").message.find("lockd at 10.0.0.1:7400,10.0.0.2:7400 is unreachable"),
            std::string::npos);
}

}  // namespace
}  // namespace leasehold::cli
