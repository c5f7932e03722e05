// Unit tests of the pause-probe model (include/leasehold/pause/model.hpp) and its outputs
// (include/leasehold/pause/report.hpp): budgets, the sweep, histograms, the sandbox log, the per-trial
// classification against DESIGN.md "Time", the sweep verdict, and the CSV/plot text.
#include "leasehold/pause/model.hpp"
#include "leasehold/pause/report.hpp"

#include <gtest/gtest.h>

namespace pp = leasehold::pause;
using leasehold::Errc;
using leasehold::Status;

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
  const auto p = pp::parse_pause_list("0, 250,500ms,1.5s");
  ASSERT_TRUE(p) << p.message();
  EXPECT_EQ(*p, (std::vector<std::uint64_t>{0, 250, 500, 1500}));
  // Each refusal is invalid_argument, naming the bad element.
  auto refused = [](std::string_view text, std::string_view says) {
    const auto r = pp::parse_pause_list(text);
    EXPECT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.code(), Errc::invalid_argument) << text;
    EXPECT_NE(r.message().find(says), std::string::npos) << r.message();
  };
  refused("10,,20", "empty pause length in \"10,,20\"");
  refused("ten", "\"ten\"");
  refused("-5", "\"-5\" is not a non-negative number");
  refused("4000s", "above the limit");
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
  const std::string text = "start t=100 slot=3 epoch=7 pid=42\nvalid t=100 vu=500\nrefused t=501 last=499 vu=500\n"
                           "valid t=700 vu=1500\nrefu";
  const auto log = pp::parse_sandbox_log(text);
  ASSERT_TRUE(log) << log.message();
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
  auto log = pp::parse_sandbox_log("start t=100 slot=1 epoch=1\nvalid t=100 vu=500\n");
  ASSERT_TRUE(log) << log.message();
  // Killed at 900 without logging its refusal: it last accepted at 499, before valid_until.
  EXPECT_TRUE(pp::accepted_within(*log, 500, 900, 900));
  EXPECT_FALSE(pp::close_open_interval(*log, 50));  // before the interval began: refused
  ASSERT_TRUE(pp::close_open_interval(*log, 499));
  EXPECT_FALSE(log->intervals.back().open);
  EXPECT_FALSE(pp::accepted_within(*log, 500, 900, 900));
  EXPECT_TRUE(pp::accepted_within(*log, 400, 900, 900));
}

TEST(PauseSandboxLog, RejectsMalformedLines) {
  const auto before = pp::parse_sandbox_log("valid t=1 vu=2\n");
  EXPECT_EQ(before.code(), Errc::corrupt);
  EXPECT_NE(before.message().find("line 1: before the start line"), std::string::npos) << before.message();
  const auto bogus = pp::parse_sandbox_log("start t=1 slot=1 epoch=1\nbogus t=3\n");
  EXPECT_EQ(bogus.code(), Errc::corrupt);
  EXPECT_NE(bogus.message().find("line 2: unknown line kind"), std::string::npos) << bogus.message();
  EXPECT_EQ(pp::parse_sandbox_log("").message(), "sandbox log has no start line");
  const auto late = pp::parse_sandbox_log("start t=1 slot=1 epoch=1\nvalid t=2 vu=9\nlate t=12 vu=9\n");
  ASSERT_TRUE(late) << late.message();
  EXPECT_EQ(late->late_accepts, 1u);
  EXPECT_EQ(late->late_accept_max_ns, 3);
}

TEST(PauseClassify, KilledBeforeExpiryUnderTheBudget) {
  pp::TrialObservation o = base_observation(100);  // 100 ms < 348.4 ms budget
  o.death_ns = o.thaw_ns + 2 * kMs;
  o.grant_send_ns = o.death_ns + 5 * kMs;  // the name came free after the death (release)
  o.grant_recv_ns = o.grant_send_ns + kMs / 5;
  o.kills_deadline = 1;
  const auto log = pp::parse_sandbox_log(log_text(1000 * kMs, o.valid_until_ns - kMs / 2, o.valid_until_ns, o.valid_until_ns));
  ASSERT_TRUE(log) << log.message();
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
  const auto log = pp::parse_sandbox_log(log_text(1000 * kMs, o.valid_until_ns - kMs, o.valid_until_ns + kMs / 2, o.valid_until_ns));
  ASSERT_TRUE(log) << log.message();
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
  // Past lockd's expiry (freeze + 410 ms), but no other holder got in first.
  EXPECT_EQ(r.outcome, pp::Outcome::killed_after_expiry);
  EXPECT_FALSE(r.killed_before_expiry);
  ASSERT_TRUE(r.margin_ns);
  EXPECT_EQ(*r.margin_ns, o.expiry_lo_ns - o.sup_confirmed_ns);
  EXPECT_LT(*r.margin_ns, 0);
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

// A sweep whose every trial was an error measured nothing: its line says FAIL, as its exit
// status does (once it said PASS and exited 1).
TEST(PauseClassify, ASweepOfErrorsOnlyFailsAndOneMeasuredPauseBesideAnErrorPasses) {
  pp::TrialObservation o = base_observation(100);
  pp::TrialResult err;
  err.outcome = pp::Outcome::error;
  pp::SweepVerdict v = pp::sweep_verdict({o}, {err}, timing());
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.line.rfind("FAIL: 0 pause(s) measured", 0), 0u) << v.line;
  EXPECT_NE(v.line.find("errors: 1"), std::string::npos) << v.line;
  EXPECT_FALSE(pp::sweep_verdict({}, {}, timing()).ok);

  pp::TrialResult kept;  // a pause the lease survived: refreshed after it, nothing to kill
  kept.outcome = pp::Outcome::kept;
  kept.side_effects_refused = true;
  v = pp::sweep_verdict({o, o}, {kept, err}, timing());
  EXPECT_TRUE(v.ok) << v.line;
  EXPECT_EQ(v.line.rfind("PASS: 1 pause(s) measured", 0), 0u) << v.line;
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
  // The sandbox kept accepting until its death: its check ignored valid_until.
  const auto log = pp::parse_sandbox_log("start t=" + std::to_string(1000 * kMs) + " slot=1 epoch=1\nvalid t=" +
                                             std::to_string(1000 * kMs) + " vu=1\n");
  ASSERT_TRUE(log) << log.message();
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

// The plot's script: a series (and a legend entry) only for outcomes that occurred, the window's
// right axis with its zero level with the margin's, a note at a trial that lost heartbeat
// answers, the TTL and budget in the title, the legend right of the plot (clear of the x label).
TEST(PauseReport, ThePlotDrawsOnlyWhatOccurredOnAxesWithAlignedZeros) {
  auto range = [](const std::string& gp, const std::string& axis) {
    const std::size_t at = gp.find("set " + axis + " [");
    EXPECT_NE(at, std::string::npos) << axis << "\n" << gp;
    if (at == std::string::npos) return std::pair<double, double>{0, 0};
    const std::size_t open = gp.find('[', at), colon = gp.find(':', open), close = gp.find(']', colon);
    return std::pair<double, double>{std::stod(gp.substr(open + 1, colon - open - 1)),
                                     std::stod(gp.substr(colon + 1, close - colon - 1))};
  };
  pp::SweepReport rep;
  rep.timing = timing();
  pp::TrialObservation killed = base_observation(100);
  pp::TrialResult kr;
  kr.outcome = pp::Outcome::killed_before_expiry;
  kr.margin_ns = 50 * kMs;
  pp::TrialObservation overlap = base_observation(600);
  overlap.recovery_answers = 3;
  pp::TrialResult vr;
  vr.outcome = pp::Outcome::violation;
  vr.violation = true;
  vr.margin_ns = -20 * kMs;
  vr.window_ns = 30 * kMs;
  rep.observations = {killed, overlap};
  rep.results = {kr, vr};
  const std::string gp = pp::gnuplot_script(rep, "pause-probe.csv", "pause-probe.png");
  EXPECT_NE(gp.find("ttl 1000 ms, kill_after 600 ms, pause budget 348.4 ms"), std::string::npos) << gp;
  EXPECT_NE(gp.find("title 'killed before lockd expiry"), std::string::npos) << gp;
  EXPECT_NE(gp.find("title 'violation: another holder"), std::string::npos) << gp;
  EXPECT_NE(gp.find("title 'violation window, right axis'"), std::string::npos) << gp;
  EXPECT_EQ(gp.find("title 'kept"), std::string::npos) << gp;            // no kept trial
  EXPECT_EQ(gp.find("title 'killed after"), std::string::npos) << gp;     // none after expiry
  EXPECT_NE(gp.find("set key outside right"), std::string::npos) << gp;
  EXPECT_NE(gp.find("'3 hb lost' at 600, -20"), std::string::npos) << gp;
  const auto y = range(gp, "yrange"), y2 = range(gp, "y2range");
  ASSERT_LT(y.first, 0);
  ASSERT_GT(y.second, 0);
  EXPECT_NEAR(y.first / y.second, y2.first / y2.second, 1e-9) << gp;  // 0 at one height on both axes
  EXPECT_GE(y2.second, 30.0);                                          // the window fits its axis

  // Without a violation there is one quantity and one y axis.
  rep.observations = {killed};
  rep.results = {kr};
  const std::string one = pp::gnuplot_script(rep, "pause-probe.csv", "pause-probe.png");
  EXPECT_EQ(one.find("y2"), std::string::npos) << one;
  EXPECT_EQ(one.find("hb lost"), std::string::npos) << one;
}

TEST(PauseClassify, ADeathWithoutAnyAnswerFromLockdIsAnError) {
  // Neither Show nor the contender got an answer from lockd (wrong address or key): nothing
  // says whether the death came before lockd's expiry.
  pp::TrialObservation o = base_observation(3000);
  o.expiry_lo_ns = 0;
  o.expiry_hi_ns = 0;
  o.death_ns = o.thaw_ns + 2 * kMs;
  o.kills_deadline = 1;
  pp::TrialResult r = pp::classify(o, nullptr, timing());
  EXPECT_EQ(r.outcome, pp::Outcome::error);
  EXPECT_FALSE(r.killed_before_expiry);
  EXPECT_FALSE(r.margin_ns);
  EXPECT_NE(r.note.find("lockd's side is unknown"), std::string::npos) << r.note;
  const pp::SweepVerdict v = pp::sweep_verdict({o}, {r}, timing());
  EXPECT_EQ(v.errors, 1u);
  EXPECT_FALSE(v.safe_pause_max_ms);

  // A Deny sent after the death: lockd still held the name then, so the death came first.
  o.last_deny_send_ns = o.death_ns + kMs;
  r = pp::classify(o, nullptr, timing());
  EXPECT_EQ(r.outcome, pp::Outcome::killed_before_expiry);
  EXPECT_TRUE(r.killed_before_expiry);
  EXPECT_FALSE(r.margin_ns);  // the expiry itself is still unknown
  // A Deny only before the death proves nothing about the expiry after it.
  o.last_deny_send_ns = o.death_ns - kMs;
  EXPECT_EQ(pp::classify(o, nullptr, timing()).outcome, pp::Outcome::error);
}

TEST(PauseClassify, KilledAfterTheExpiryWithoutAnotherHolderHasItsOwnOutcome) {
  pp::TrialObservation o = base_observation(600);  // expiry at freeze + 410 ms, thaw at + 600 ms
  o.death_ns = o.thaw_ns + 2 * kMs;
  o.kills_deadline = 1;
  const pp::TrialResult r = pp::classify(o, nullptr, timing());
  EXPECT_EQ(r.outcome, pp::Outcome::killed_after_expiry);
  EXPECT_EQ(pp::to_string(r.outcome), "killed-after-expiry");
  EXPECT_FALSE(r.violation);
  EXPECT_FALSE(r.killed_before_expiry);
  ASSERT_TRUE(r.margin_ns);
  EXPECT_EQ(*r.margin_ns, o.expiry_lo_ns - o.death_ns);  // -192 ms
  EXPECT_EQ(*r.margin_ns, -192 * kMs);

  pp::SweepReport rep;
  rep.timing = timing();
  rep.observations = {o};
  rep.results = {r};
  const std::string csv = pp::to_csv(rep);
  const std::string row = csv.substr(csv.find('\n') + 1);
  // outcome, code 5, past the budget, killed, by the kill-switch, not before expiry, margin.
  EXPECT_EQ(row.rfind("600,worst,killed-after-expiry,5,0,1,kill-switch,0,-192.000,", 0), 0u) << row;
  EXPECT_NE(pp::to_table(rep).find("after expiry"), std::string::npos);
  const std::string gp = pp::gnuplot_script(rep, "/tmp/x.csv", "/tmp/x.png");
  EXPECT_NE(gp.find("$4==5 ? $9"), std::string::npos) << gp;   // its own series
  EXPECT_EQ(gp.find("$4==1 ? $9"), std::string::npos);         // not drawn as "before expiry"
  const std::string svg = pp::svg_plot(rep);
  EXPECT_NE(svg.find("fill=\"#ff7f0e\""), std::string::npos);
  EXPECT_EQ(svg.find("fill=\"#1f77b4\""), std::string::npos);
}

TEST(PauseClassify, ALateThawIsReportedAndJudgedWithTheMeasuredPause) {
  // 250 ms asked (under the 348.4 ms budget), but the thaw came 502.6 ms after the freeze.
  pp::TrialObservation o = base_observation(250);
  o.thaw_ns = o.freeze_ns + 502'600'000;
  o.thawed_ns = o.thaw_ns + kMs / 10;
  o.death_ns = o.thaw_ns + kMs;
  ASSERT_TRUE(pp::measured_pause_ns(o));
  EXPECT_EQ(*pp::measured_pause_ns(o), 502'600'000);
  EXPECT_TRUE(pp::pause_differs(o));
  EXPECT_EQ(pp::effective_pause_ns(o), 502'600'000);
  const pp::TrialResult r = pp::classify(o, nullptr, timing());
  EXPECT_FALSE(r.under_budget);
  EXPECT_EQ(r.pause_ns, 502'600'000);
  pp::SweepReport rep;
  rep.timing = timing();
  rep.observations = {o};
  rep.results = {r};
  EXPECT_NE(pp::to_table(rep).find("250 ms (ran 502.6 ms)"), std::string::npos) << pp::to_table(rep);
  const auto row = pp::csv_row(o, r);
  EXPECT_EQ(row[0], "250");
  EXPECT_EQ(row[static_cast<std::size_t>(pp::kColPaused - 1)], "502.600");
  EXPECT_EQ(pp::csv_columns()[static_cast<std::size_t>(pp::kColPaused - 1)], "paused_ms");
  EXPECT_EQ(pp::sweep_verdict({o}, {r}, timing()).safe_pause_max_ms.value_or(0), 503u);

  // Within kPauseToleranceNs the requested pause stands.
  o.thaw_ns = o.freeze_ns + 250'400'000;
  EXPECT_FALSE(pp::pause_differs(o));
  EXPECT_EQ(pp::effective_pause_ns(o), 250 * kMs);
  EXPECT_TRUE(pp::classify(o, nullptr, timing()).under_budget);
}

TEST(PauseVerdict, AnInterruptedSweepIsNeverOk) {
  pp::TrialObservation o = base_observation(100);
  o.death_ns = o.thaw_ns + kMs;
  const std::vector<pp::TrialObservation> obs = {o, o};
  const std::vector<pp::TrialResult> res = {pp::classify(o, nullptr, timing()), pp::classify(o, nullptr, timing())};
  const pp::SweepVerdict done = pp::sweep_verdict(obs, res, timing());
  ASSERT_TRUE(done.ok);
  const pp::SweepVerdict v = pp::interrupted_verdict(done, 5);
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.line.rfind("INTERRUPTED after 2 of 5 trial(s): 2 pause(s) measured", 0), 0u) << v.line;
  EXPECT_EQ(v.line.find("PASS"), std::string::npos);
  pp::SweepReport rep;
  rep.timing = timing();
  rep.verdict = v;
  EXPECT_FALSE(pp::to_json(rep).at("verdict").at("ok").get<bool>());
}

TEST(PauseReport, JsonTrialFieldsAreTyped) {
  pp::SweepReport rep;
  rep.timing = timing();
  pp::TrialObservation killed = base_observation(100);
  killed.death_ns = killed.thaw_ns + 2 * kMs;
  killed.kills_deadline = 1;
  pp::TrialObservation failed = base_observation(0);
  failed.error = "run: refused";
  rep.observations = {killed, failed};
  for (const auto& ob : rep.observations) rep.results.push_back(pp::classify(ob, nullptr, rep.timing));
  const nlohmann::json j = pp::to_json(rep);
  const auto& t = j.at("trials").at(0);
  EXPECT_TRUE(t.at("pause_ms").is_number_integer());
  EXPECT_EQ(t.at("pause_ms").get<int>(), 100);
  EXPECT_EQ(t.at("outcome"), "killed-before-expiry");
  EXPECT_EQ(t.at("outcome_code").get<int>(), 1);
  EXPECT_EQ(t.at("under_budget"), true);
  EXPECT_EQ(t.at("killed"), true);
  EXPECT_EQ(t.at("killed_by"), "kill-switch");
  EXPECT_EQ(t.at("killed_before_expiry"), true);
  EXPECT_EQ(t.at("violation"), false);
  EXPECT_TRUE(t.at("window_ms").is_null());
  EXPECT_TRUE(t.at("window_bound_ms").is_null());
  EXPECT_DOUBLE_EQ(t.at("margin_ms").get<double>(), 308.0);  // expiry +410 ms, death +102 ms
  EXPECT_DOUBLE_EQ(t.at("recovery_ms").get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(t.at("kill_latency_ms").get<double>(), 1.9);
  EXPECT_DOUBLE_EQ(t.at("valid_until_ms").get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(t.at("paused_ms").get<double>(), 100.0);
  EXPECT_TRUE(t.at("grant_ms").is_null());
  EXPECT_EQ(t.at("side_effects_refused"), true);
  EXPECT_EQ(t.at("note"), "");
  const auto& e = j.at("trials").at(1);
  EXPECT_EQ(e.at("outcome"), "error");
  EXPECT_EQ(e.at("killed"), false);
  EXPECT_TRUE(e.at("killed_by").is_null());
  EXPECT_TRUE(e.at("killed_before_expiry").is_null());
  EXPECT_TRUE(e.at("side_effects_refused").is_null());
  EXPECT_EQ(e.at("note"), "run: refused");
  // The CSV keeps its text form.
  EXPECT_EQ(pp::csv_row(killed, rep.results[0])[static_cast<std::size_t>(pp::kColMargin - 1)], "308.000");
}

TEST(PauseMeasured, TheMissingBudgetSaysWhy) {
  const pp::Timing t = timing();
  pp::MeasuredTiming m;
  m.rt_lateness.count = 100;
  m.rt_lateness.buckets[17] = 100;
  m.rt_lateness.max = 100'000;
  // Two kills seen by the probe after the thaw request but before it saw the thaw confirmed.
  for (int i = 0; i < 2; ++i) {
    pp::TrialObservation o = base_observation(600);
    o.thawed_ns = o.thaw_ns + 5 * kMs;
    o.death_ns = o.thaw_ns + 2 * kMs;
    o.kills_deadline = 1;
    const pp::TrialResult r = pp::classify(o, nullptr, t);
    ASSERT_TRUE(r.killed);
    EXPECT_FALSE(r.kill_latency_ns);
    pp::add_kill_latency(m, o, r);
  }
  pp::TrialObservation kept = base_observation(0);
  kept.refreshed_ns = kept.thaw_ns + kMs;
  pp::add_kill_latency(m, kept, pp::classify(kept, nullptr, t));  // not killed: not counted
  pp::finish_measured(m, t);
  EXPECT_FALSE(m.budget_max_ns);
  EXPECT_EQ(m.killed_trials, 2u);
  EXPECT_EQ(m.killed_before_thaw_seen, 2u);
  const Status missing = pp::measured_budget_status(m);
  EXPECT_EQ(missing.code(), Errc::not_found);
  const std::string& why = missing.message();
  EXPECT_NE(why.find("none of the 2 killed trial(s) gave a kill latency"), std::string::npos) << why;
  EXPECT_NE(why.find("2 died before the probe saw the thaw confirmed"), std::string::npos) << why;
  EXPECT_EQ(why.find("lateness"), std::string::npos) << why;  // those samples exist
  pp::SweepReport rep;
  rep.timing = t;
  rep.measured = m;
  EXPECT_NE(pp::budget_text(rep).find("measured pause budget    - (none of the 2"), std::string::npos);

  // One trial that gives a sample: the budget is there and nothing is missing.
  pp::TrialObservation o = base_observation(600);
  o.death_ns = o.thawed_ns + 3 * kMs;
  o.kills_deadline = 1;
  pp::add_kill_latency(m, o, pp::classify(o, nullptr, t));
  pp::finish_measured(m, t);
  ASSERT_EQ(m.kill_latencies_ns.size(), 1u);
  EXPECT_EQ(m.kill_latencies_ns[0], 3 * kMs);
  ASSERT_TRUE(m.budget_max_ns);
  EXPECT_TRUE(pp::measured_budget_status(m).ok()) << pp::measured_budget_status(m).message();

  pp::MeasuredTiming empty;
  pp::finish_measured(empty, t);
  EXPECT_EQ(pp::measured_budget_status(empty).message(),
            "no rt wake-up lateness sample outside the freezes; no trial needed a kill, so there is no kill latency");
}
