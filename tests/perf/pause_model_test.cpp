// Unit tests of the pause-probe model (perf/pause/pause_model.hpp) and its outputs
// (perf/pause/pause_report.hpp): budgets, the sweep, histograms, the sandbox log, the per-trial
// classification against DESIGN.md "Time", the sweep verdict, and the CSV/plot text.
#include "perf/pause/pause_model.hpp"
#include "perf/pause/pause_report.hpp"

#include <gtest/gtest.h>

namespace pp = leasehold::pause;

namespace {

constexpr std::int64_t kMs = 1'000'000;

pp::Timing timing() {
  pp::Timing t;
  t.ttl_ms = 1000;
  t.kill_after_ms = 600;
  t.heartbeat_interval_ms = 100;
  t.kill_latency_budget_ms = 50;
  t.wheel_granularity_ns = 1'000'000;
  t.clock_rate_bound = 1e-3;
  return t;
}

// A sandbox log with one validity interval [start, last] and a refusal right after it.
std::string log_text(std::int64_t start, std::int64_t last, std::int64_t refused, std::int64_t vu) {
  return "start t=" + std::to_string(start) + " slot=3 epoch=7 pid=42\n" + "valid t=" + std::to_string(start) +
         " vu=" + std::to_string(vu) + "\n" + "refused t=" + std::to_string(refused) + " last=" +
         std::to_string(last) + " vu=" + std::to_string(vu) + "\n";
}

// A worst-phase trial frozen at t=10 s, valid_until 10 ms later, lockd expiry 400 ms after that.
pp::TrialObservation base_observation(std::uint64_t pause_ms) {
  pp::TrialObservation o;
  o.pause_ms = pause_ms;
  o.phase = pp::Phase::worst;
  o.freeze_ns = 10'000 * kMs;
  o.frozen_ns = o.freeze_ns + kMs / 10;
  o.thaw_ns = o.freeze_ns + static_cast<std::int64_t>(pause_ms) * kMs;
  o.thawed_ns = o.thaw_ns + kMs / 10;
  o.valid_until_ns = o.freeze_ns + 10 * kMs;
  o.expiry_lo_ns = o.valid_until_ns + 400 * kMs;
  o.expiry_hi_ns = o.expiry_lo_ns + 1 * kMs;
  o.end_ns = o.thaw_ns + 600 * kMs;
  return o;
}

}  // namespace

TEST(PauseBudget, ConfiguredFollowsTheSafetyCondition) {
  // 1000 − (600·1.001 + 1 + 50) = 348.4 ms
  EXPECT_EQ(pp::configured_budget_ns(timing()), 348'400'000);
  pp::Timing unsafe = timing();
  unsafe.kill_after_ms = 990;
  EXPECT_LT(pp::configured_budget_ns(unsafe), 0);
}

TEST(PauseBudget, MeasuredReplacesGranularityAndKillBudget) {
  // 1000 − (600.6 + 0.2 + 3) = 396.2 ms
  EXPECT_EQ(pp::measured_budget_ns(timing(), 200'000, 3'000'000), 396'200'000);
}

TEST(PauseSweep, DefaultSpansZeroToTwiceTtl) {
  const auto s = pp::default_sweep_ms(1000, 4);
  ASSERT_EQ(s.size(), 5u);
  EXPECT_EQ(s.front(), 0u);
  EXPECT_EQ(s[1], 500u);
  EXPECT_EQ(s.back(), 2000u);
  EXPECT_TRUE(pp::default_sweep_ms(1000, 0).empty());
  EXPECT_TRUE(pp::default_sweep_ms(1000, pp::kStepsMax + 1).empty());
  EXPECT_EQ(pp::default_sweep_ms(3, 10).size(), 7u);  // 0..6 ms: duplicates collapse
}

TEST(PauseSweep, ParsesListsWithUnits) {
  std::string err;
  const auto p = pp::parse_pause_list("0, 250,500ms,1.5s", err);
  ASSERT_TRUE(p) << err;
  EXPECT_EQ(*p, (std::vector<std::uint64_t>{0, 250, 500, 1500}));
  EXPECT_FALSE(pp::parse_pause_list("10,,20", err));
  EXPECT_NE(err.find("empty"), std::string::npos);
  EXPECT_FALSE(pp::parse_pause_list("ten", err));
  EXPECT_NE(err.find("\"ten\""), std::string::npos);
  EXPECT_FALSE(pp::parse_pause_list("-5", err));
  EXPECT_FALSE(pp::parse_pause_list("4000s", err));
  EXPECT_NE(err.find("limit"), std::string::npos);
}

TEST(PauseHistogram, DeltaQuantileAndExactMax) {
  pp::HistogramSnapshot a, b;
  a.count = 10;
  a.max = 900;
  a.buckets[10] = 10;  // values in [512, 1023]
  b = a;
  b.count += 100;
  b.buckets[5] += 99;   // [16, 31]
  b.buckets[12] += 1;   // [2048, 4095]
  b.max = 3000;
  const auto d = pp::histogram_delta(a, b);
  EXPECT_EQ(d.count, 100u);
  EXPECT_EQ(d.buckets[10], 0u);
  EXPECT_EQ(d.max, 3000u);  // the max rose inside the window: exact
  EXPECT_EQ(pp::histogram_quantile_upper(d, 0.5), 31u);
  EXPECT_EQ(pp::histogram_quantile_upper(d, 0.99), 31u);
  EXPECT_EQ(pp::histogram_quantile_upper(d, 1.0), 3000u);  // capped by max
  // The max did not rise: the window's max is bounded by its top bucket.
  pp::HistogramSnapshot c = b;
  c.count += 1;
  c.buckets[3] += 1;
  const auto d2 = pp::histogram_delta(b, c);
  EXPECT_EQ(d2.max, 7u);
  pp::HistogramSnapshot total;
  pp::histogram_add(total, d);
  pp::histogram_add(total, d2);
  EXPECT_EQ(total.count, 101u);
  EXPECT_EQ(total.max, 3000u);
  EXPECT_EQ(pp::histogram_quantile_upper(pp::HistogramSnapshot{}, 0.99), 0u);
}

TEST(PauseSamples, NearestRank) {
  EXPECT_EQ(pp::sample_quantile({5, 1, 3}, 0.5), 3);
  EXPECT_EQ(pp::sample_quantile({5, 1, 3}, 0.99), 5);
  EXPECT_EQ(pp::sample_quantile({}, 0.99), 0);
}

TEST(PauseSandboxLog, ParsesIntervalsAndIgnoresATornLastLine) {
  std::string err;
  const std::string text = "start t=100 slot=3 epoch=7 pid=42\nvalid t=100 vu=500\nrefused t=501 last=499 vu=500\n"
                           "valid t=700 vu=1500\nrefu";
  const auto log = pp::parse_sandbox_log(text, err);
  ASSERT_TRUE(log) << err;
  EXPECT_EQ(log->slot, 3u);
  EXPECT_EQ(log->epoch, 7u);
  ASSERT_EQ(log->intervals.size(), 2u);
  EXPECT_EQ(log->intervals[0].last_ns, 499);
  EXPECT_FALSE(log->intervals[0].open);
  EXPECT_TRUE(log->intervals[1].open);
  EXPECT_TRUE(pp::accepted_within(*log, 450, 460, 0));
  EXPECT_FALSE(pp::accepted_within(*log, 500, 699, 0));
  EXPECT_TRUE(pp::accepted_within(*log, 5000, 6000, 5500));  // open until the death at 5500
  EXPECT_FALSE(pp::accepted_within(*log, 5600, 6000, 5500));
  EXPECT_EQ(pp::last_accept_before(*log, 600), 499);
}

TEST(PauseSandboxLog, TheLastAcceptRecordClosesAnOpenInterval) {
  std::string err;
  auto log = pp::parse_sandbox_log("start t=100 slot=1 epoch=1\nvalid t=100 vu=500\n", err);
  ASSERT_TRUE(log) << err;
  // Killed at 900 without logging its refusal: it last accepted at 499, before valid_until.
  EXPECT_TRUE(pp::accepted_within(*log, 500, 900, 900));
  EXPECT_FALSE(pp::close_open_interval(*log, 50));  // before the interval began: refused
  ASSERT_TRUE(pp::close_open_interval(*log, 499));
  EXPECT_FALSE(log->intervals.back().open);
  EXPECT_FALSE(pp::accepted_within(*log, 500, 900, 900));
  EXPECT_TRUE(pp::accepted_within(*log, 400, 900, 900));
}

TEST(PauseSandboxLog, RejectsMalformedLines) {
  std::string err;
  EXPECT_FALSE(pp::parse_sandbox_log("valid t=1 vu=2\n", err));
  EXPECT_NE(err.find("before the start"), std::string::npos);
  EXPECT_FALSE(pp::parse_sandbox_log("start t=1 slot=1 epoch=1\nbogus t=3\n", err));
  EXPECT_NE(err.find("line 2"), std::string::npos);
  EXPECT_FALSE(pp::parse_sandbox_log("", err));
  const auto late = pp::parse_sandbox_log("start t=1 slot=1 epoch=1\nvalid t=2 vu=9\nlate t=12 vu=9\n", err);
  ASSERT_TRUE(late) << err;
  EXPECT_EQ(late->late_accepts, 1u);
  EXPECT_EQ(late->late_accept_max_ns, 3);
}

TEST(PauseClassify, KilledBeforeExpiryUnderTheBudget) {
  pp::TrialObservation o = base_observation(100);  // 100 ms < 348.4 ms budget
  o.death_ns = o.thaw_ns + 2 * kMs;
  o.grant_send_ns = o.death_ns + 5 * kMs;  // the name came free after the death (release)
  o.grant_recv_ns = o.grant_send_ns + kMs / 5;
  o.kills_deadline = 1;
  std::string err;
  const auto log = pp::parse_sandbox_log(log_text(1000 * kMs, o.valid_until_ns - kMs / 2, o.valid_until_ns, o.valid_until_ns), err);
  ASSERT_TRUE(log) << err;
  const pp::TrialResult r = pp::classify(o, &*log, timing());
  EXPECT_TRUE(r.under_budget);
  EXPECT_EQ(r.outcome, pp::Outcome::killed_before_expiry);
  EXPECT_EQ(r.killed_by, "kill-switch");
  EXPECT_TRUE(r.killed_before_expiry);
  ASSERT_TRUE(r.margin_ns);
  EXPECT_EQ(*r.margin_ns, o.expiry_lo_ns - o.death_ns);
  EXPECT_FALSE(r.violation);
  ASSERT_TRUE(r.recovery_ns);
  EXPECT_EQ(*r.recovery_ns, 2 * kMs);
  ASSERT_TRUE(r.kill_latency_ns);
  EXPECT_EQ(*r.kill_latency_ns, 2 * kMs - kMs / 10);  // from the confirmed thaw
  ASSERT_TRUE(r.refusal_lag_ns);
  EXPECT_EQ(*r.refusal_lag_ns, 0);
  EXPECT_TRUE(r.side_effects_refused);
  EXPECT_TRUE(r.ok);
}

TEST(PauseClassify, ViolationPastTheBudgetIsBoundedByRecovery) {
  pp::TrialObservation o = base_observation(600);  // past the budget, past the expiry
  o.grant_send_ns = o.expiry_lo_ns + 1 * kMs;
  o.grant_recv_ns = o.grant_send_ns + kMs / 5;
  o.death_ns = o.thaw_ns + 3 * kMs;
  o.recovery_answers = 1;
  std::string err;
  const auto log = pp::parse_sandbox_log(log_text(1000 * kMs, o.valid_until_ns - kMs, o.valid_until_ns + kMs / 2, o.valid_until_ns), err);
  ASSERT_TRUE(log) << err;
  const pp::TrialResult r = pp::classify(o, &*log, timing());
  EXPECT_FALSE(r.under_budget);
  EXPECT_EQ(r.outcome, pp::Outcome::violation);
  EXPECT_EQ(r.killed_by, "recovery");
  EXPECT_TRUE(r.violation);
  EXPECT_EQ(r.window_ns, o.death_ns - o.grant_send_ns);
  ASSERT_TRUE(r.margin_ns);
  EXPECT_LT(*r.margin_ns, 0);
  ASSERT_TRUE(r.window_bound_ns);  // pause − (ttl − kill_after) + recovery = 600 − 400 + 3
  EXPECT_EQ(*r.window_bound_ns, 203 * kMs);
  EXPECT_LE(r.window_ns, *r.window_bound_ns);
  EXPECT_TRUE(r.side_effects_refused);
  EXPECT_TRUE(r.ok);  // past the budget, recovery ended it
}

TEST(PauseClassify, TheEarliestObservationOfTheDeathCounts) {
  // The supervisor confirmed the death at thaw + 1.5 ms and released the name; the probe's own
  // pidfd watch woke 17 ms later on a busy host. The grant in between is not a violation.
  pp::TrialObservation o = base_observation(650);
  o.sup_confirmed_ns = o.thaw_ns + 3 * kMs / 2;
  o.death_ns = o.thaw_ns + 18 * kMs;
  o.grant_send_ns = o.thaw_ns + 5 * kMs;
  o.grant_recv_ns = o.thaw_ns + 7 * kMs;
  o.kills_deadline = 1;
  EXPECT_EQ(pp::effective_death_ns(o), o.sup_confirmed_ns);
  const pp::TrialResult r = pp::classify(o, nullptr, timing());
  EXPECT_FALSE(r.violation);
  EXPECT_EQ(r.outcome, pp::Outcome::killed_before_expiry);
  ASSERT_TRUE(r.recovery_ns);
  EXPECT_EQ(*r.recovery_ns, 3 * kMs / 2);
  o.sup_confirmed_ns = 0;  // without the supervisor's record, the pidfd time is all there is
  EXPECT_TRUE(pp::classify(o, nullptr, timing()).violation);
}

TEST(PauseClassify, AKillBeforeTheFreezeTookHoldIsMarked) {
  pp::TrialObservation o = base_observation(900);
  o.death_ns = o.freeze_ns - kMs;  // the kill-switch won the race against a late freeze
  const pp::TrialResult r = pp::classify(o, nullptr, timing());
  EXPECT_EQ(r.outcome, pp::Outcome::killed_before_expiry);
  EXPECT_TRUE(r.pause_missed);
  const pp::SweepVerdict v = pp::sweep_verdict({o}, {r}, timing());
  EXPECT_FALSE(v.safe_pause_max_ms);  // it says nothing about a 900 ms pause
}

TEST(PauseClassify, ViolationUnderTheBudgetFails) {
  pp::TrialObservation o = base_observation(100);
  o.grant_send_ns = o.freeze_ns + 50 * kMs;
  o.grant_recv_ns = o.grant_send_ns + kMs;
  o.death_ns = o.thaw_ns + kMs;
  const pp::TrialResult r = pp::classify(o, nullptr, timing());
  EXPECT_TRUE(r.violation);
  EXPECT_TRUE(r.under_budget);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.note.find("under the pause budget"), std::string::npos);
}

TEST(PauseClassify, AnAcceptedCheckInTheWindowFails) {
  pp::TrialObservation o = base_observation(600);
  o.grant_send_ns = o.expiry_lo_ns + kMs;
  o.grant_recv_ns = o.grant_send_ns + kMs;
  o.death_ns = o.thaw_ns + kMs;
  std::string err;
  // The sandbox kept accepting until its death: its check ignored valid_until.
  const auto log = pp::parse_sandbox_log("start t=" + std::to_string(1000 * kMs) + " slot=1 epoch=1\nvalid t=" +
                                             std::to_string(1000 * kMs) + " vu=1\n", err);
  ASSERT_TRUE(log) << err;
  const pp::TrialResult r = pp::classify(o, &*log, timing());
  EXPECT_FALSE(r.side_effects_refused);
  EXPECT_FALSE(r.ok);
}

TEST(PauseClassify, KeptAndUnboundedAndError) {
  pp::TrialObservation kept = base_observation(0);
  kept.refreshed_ns = kept.thaw_ns + 20 * kMs;
  const pp::TrialResult k = pp::classify(kept, nullptr, timing());
  EXPECT_EQ(k.outcome, pp::Outcome::kept);
  EXPECT_FALSE(k.killed);
  EXPECT_TRUE(k.ok);

  pp::TrialObservation alive = base_observation(900);
  alive.grant_send_ns = alive.expiry_lo_ns;
  alive.grant_recv_ns = alive.expiry_lo_ns + kMs;
  const pp::TrialResult u = pp::classify(alive, nullptr, timing());
  EXPECT_EQ(u.outcome, pp::Outcome::unbounded);
  EXPECT_EQ(u.window_ns, alive.end_ns - alive.grant_send_ns);
  EXPECT_FALSE(u.ok);

  pp::TrialObservation bad;
  bad.error = "freeze: permission denied";
  const pp::TrialResult e = pp::classify(bad, nullptr, timing());
  EXPECT_EQ(e.outcome, pp::Outcome::error);
  EXPECT_EQ(e.note, bad.error);
}

TEST(PauseVerdict, FailsOnlyForViolationsUnderTheBudget) {
  const pp::Timing t = timing();
  std::vector<pp::TrialObservation> obs;
  std::vector<pp::TrialResult> res;
  for (std::uint64_t p : {0u, 100u, 600u}) {
    pp::TrialObservation o = base_observation(p);
    if (p == 600) {
      o.grant_send_ns = o.expiry_lo_ns;
      o.grant_recv_ns = o.expiry_lo_ns + kMs;
      o.death_ns = o.thaw_ns + 2 * kMs;
    } else {
      o.death_ns = std::max(o.thaw_ns, o.valid_until_ns) + kMs;
    }
    obs.push_back(o);
    res.push_back(pp::classify(o, nullptr, t));
  }
  pp::SweepVerdict v = pp::sweep_verdict(obs, res, t);
  EXPECT_TRUE(v.ok) << v.line;
  EXPECT_EQ(v.violations, 1u);
  EXPECT_EQ(v.violations_under_budget, 0u);
  ASSERT_TRUE(v.window_max_ns);
  EXPECT_EQ(*v.window_max_ns, obs[2].death_ns - obs[2].grant_send_ns);
  EXPECT_EQ(v.safe_pause_max_ms.value_or(0), 100u);
  EXPECT_EQ(v.violating_pause_min_ms.value_or(0), 600u);
  EXPECT_EQ(v.line.rfind("PASS", 0), 0u);

  obs[1].grant_send_ns = obs[1].freeze_ns;
  obs[1].grant_recv_ns = obs[1].freeze_ns + kMs;
  res[1] = pp::classify(obs[1], nullptr, t);
  v = pp::sweep_verdict(obs, res, t);
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.violations_under_budget, 1u);
  EXPECT_EQ(v.line.rfind("FAIL", 0), 0u);
}

TEST(PauseReport, CsvHasTheColumnsAndOneRowPerTrial) {
  pp::SweepReport rep;
  rep.timing = timing();
  pp::TrialObservation o = base_observation(100);
  o.death_ns = o.thaw_ns + kMs;
  rep.observations = {o, base_observation(0)};
  rep.observations[1].error = "run: held, by x";
  for (const auto& ob : rep.observations) rep.results.push_back(pp::classify(ob, nullptr, rep.timing));
  const std::string csv = pp::to_csv(rep);
  std::vector<std::string> lines;
  for (std::size_t p = 0, n; (n = csv.find('\n', p)) != std::string::npos; p = n + 1) lines.push_back(csv.substr(p, n - p));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].rfind("pause_ms,phase,outcome,outcome_code,", 0), 0u);
  EXPECT_EQ(pp::csv_columns()[pp::kColPause - 1], "pause_ms");
  EXPECT_EQ(pp::csv_columns()[pp::kColOutcomeCode - 1], "outcome_code");
  EXPECT_EQ(pp::csv_columns()[pp::kColMargin - 1], "margin_ms");
  EXPECT_EQ(pp::csv_columns()[pp::kColWindow - 1], "window_ms");
  EXPECT_EQ(lines[1].rfind("100,worst,killed-before-expiry,1,1,1,", 0), 0u) << lines[1];
  EXPECT_NE(lines[2].find("\"run: held, by x\""), std::string::npos) << lines[2];  // quoted: it has a comma
  const auto cells = std::count(lines[1].begin(), lines[1].end(), ',');
  EXPECT_EQ(static_cast<std::size_t>(cells) + 1, pp::csv_columns().size());
}

TEST(PauseReport, PlotsDrawTheConfiguredBudget) {
  pp::SweepReport rep;
  rep.timing = timing();
  pp::TrialObservation o = base_observation(600);
  o.grant_send_ns = o.expiry_lo_ns;
  o.grant_recv_ns = o.expiry_lo_ns + kMs;
  o.death_ns = o.thaw_ns + kMs;
  rep.observations = {o};
  rep.results = {pp::classify(o, nullptr, rep.timing)};
  const std::string gp = pp::gnuplot_script(rep, "/tmp/x.csv", "/tmp/x.png");
  EXPECT_NE(gp.find("set arrow 1 from 348.4"), std::string::npos) << gp;
  EXPECT_NE(gp.find("set output '/tmp/x.png'"), std::string::npos);
  EXPECT_NE(gp.find("axes x1y2"), std::string::npos);
  const std::string svg = pp::svg_plot(rep);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("configured budget 348.4 ms"), std::string::npos);
  EXPECT_NE(svg.find("#d62728"), std::string::npos);  // the violation point
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}
