// leasehold/pause: what `leasehold pause-probe` writes — the terminal table, the CSV, the
// JSON summary, and the plot (a gnuplot script for PNG, or a self-drawn SVG when gnuplot is
// missing). Pure text generation (no I/O), header-only like model.hpp, so the tests check
// the exact columns and the plot's content.
//
// Every time in the CSV is in ms relative to the trial's freeze request (negative = before it);
// an empty cell means "did not happen / not applicable". Columns: see kCsvColumns.
#pragma once

#include "leasehold/pause/model.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

namespace leasehold::pause {

/// The measured side of the budget (model.hpp: B_meas).
struct MeasuredTiming {
  HistogramSnapshot rt_lateness;    ///< rt wake-up lateness, outside the probe's freezes
  HistogramSnapshot heartbeat_rtt;  ///< heartbeat RTT, outside the probe's freezes
  std::vector<std::int64_t> kill_latencies_ns;  ///< per killed trial (TrialResult::kill_latency_ns)
  /// Killed trials (errors aside), and those without a kill latency, by why: the death came
  /// before the freeze took hold, while the supervisor was frozen, or after the thaw request but
  /// before the probe saw the thaw confirmed (a probe thread running late sees it late).
  std::size_t killed_trials = 0, killed_before_freeze = 0, killed_while_frozen = 0,
              killed_before_thaw_seen = 0;
  std::uint64_t lateness_p99_ns = 0, lateness_max_ns = 0;
  std::int64_t kill_latency_p99_ns = 0, kill_latency_max_ns = 0;
  std::optional<std::int64_t> budget_p99_ns, budget_max_ns;
};

/// Adds one trial's kill latency to `m`, or counts why it gives none (see MeasuredTiming).
inline void add_kill_latency(MeasuredTiming& m, const TrialObservation& o, const TrialResult& r) {
  if (r.outcome == Outcome::error || !r.killed) return;
  ++m.killed_trials;
  const std::int64_t death = effective_death_ns(o);
  if (r.pause_missed || (o.frozen_ns != 0 && death <= o.frozen_ns)) {
    ++m.killed_before_freeze;
  } else if (o.thaw_ns != 0 && death < o.thaw_ns) {
    ++m.killed_while_frozen;
  } else if (!r.kill_latency_ns) {
    ++m.killed_before_thaw_seen;
  } else {
    m.kill_latencies_ns.push_back(*r.kill_latency_ns);
  }
}

/// Fills the quantiles and B_meas from the raw measurements.
inline void finish_measured(MeasuredTiming& m, const Timing& t) {
  m.lateness_p99_ns = histogram_quantile_upper(m.rt_lateness, 0.99);
  m.lateness_max_ns = m.rt_lateness.max;
  m.kill_latency_p99_ns = sample_quantile(m.kill_latencies_ns, 0.99);
  m.kill_latency_max_ns = sample_quantile(m.kill_latencies_ns, 1.0);
  if (m.rt_lateness.count == 0 || m.kill_latencies_ns.empty()) return;
  m.budget_p99_ns = measured_budget_ns(t, m.lateness_p99_ns, static_cast<std::uint64_t>(std::max<std::int64_t>(0, m.kill_latency_p99_ns)));
  m.budget_max_ns = measured_budget_ns(t, m.lateness_max_ns, static_cast<std::uint64_t>(std::max<std::int64_t>(0, m.kill_latency_max_ns)));
}

/// Ok when there is a measured budget; otherwise not_found, the message saying which inputs are
/// missing, with the counts behind them.
inline Status measured_budget_status(const MeasuredTiming& m) {
  if (m.budget_p99_ns && m.budget_max_ns) return {};
  std::string why;
  if (m.rt_lateness.count == 0) why = "no rt wake-up lateness sample outside the freezes";
  if (m.kill_latencies_ns.empty()) {
    if (!why.empty()) why += "; ";
    if (m.killed_trials == 0) {
      why += "no trial needed a kill, so there is no kill latency";
    } else {
      why += "none of the " + std::to_string(m.killed_trials) + " killed trial(s) gave a kill latency:";
      std::string parts;
      auto part = [&](std::size_t n, const char* what) {
        if (n != 0) parts += (parts.empty() ? " " : ", ") + std::to_string(n) + " " + what;
      };
      part(m.killed_before_freeze, "died before the freeze took hold");
      part(m.killed_while_frozen, "died while the supervisor was frozen");
      part(m.killed_before_thaw_seen,
           "died before the probe saw the thaw confirmed (a probe running late sees the thaw late: "
           "raise --observer-priority)");
      why += parts;
    }
  }
  return Status{Errc::not_found, why};
}

/// Everything one sweep produced.
struct SweepReport {
  Timing timing;
  std::string mode;        ///< "standalone" | "external"
  std::string freeze;      ///< "cgroup" | "sigstop", and why
  std::string freeze_why;
  Phase phase = Phase::worst;
  std::string stress;      ///< "" = none, else the stress-ng command line
  std::vector<TrialObservation> observations;
  std::vector<TrialResult> results;
  MeasuredTiming measured;
  SweepVerdict verdict;
};

/// The CSV's columns, in order.
inline const std::vector<std::string>& csv_columns() {
  static const std::vector<std::string> cols = {
      "pause_ms", "phase", "outcome", "outcome_code", "under_budget", "killed", "killed_by",
      "killed_before_expiry", "margin_ms", "violation", "window_ms", "window_bound_ms",
      "recovery_ms", "kill_latency_ms", "side_effects_refused", "refusal_lag_ms",
      "valid_until_ms", "expiry_ms", "grant_ms", "death_ms", "thaw_ms", "sup_kill_ms", "paused_ms", "note"};
  return cols;
}
/// 1-based column numbers the plot uses (kept in step with csv_columns()).
inline constexpr int kColPause = 1, kColOutcomeCode = 4, kColMargin = 9, kColWindow = 11, kColPaused = 23;

namespace detail {
inline std::string ms3(std::int64_t ns) {
  char b[40];
  std::snprintf(b, sizeof b, "%.3f", static_cast<double>(ns) / 1e6);
  return b;
}
inline std::string ms1(std::int64_t ns) {
  char b[40];
  std::snprintf(b, sizeof b, "%.1f", static_cast<double>(ns) / 1e6);
  return b;
}
inline std::string csv_cell(std::string s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c == '\n' ? ' ' : c;
  }
  return out + "\"";
}
}  // namespace detail

/// A duration in ns, written in ms (3 decimals in the CSV, a number rounded to µs in JSON).
struct DurationCell {
  std::int64_t ns = 0;
};
/// One cell of a trial row: missing (CSV "", JSON null), a flag (CSV 1/0, JSON bool), a count,
/// a duration, or text.
using Cell = std::variant<std::monostate, bool, std::int64_t, DurationCell, std::string>;

inline std::string csv_text(const Cell& c) {
  if (const auto* b = std::get_if<bool>(&c)) return *b ? "1" : "0";
  if (const auto* i = std::get_if<std::int64_t>(&c)) return std::to_string(*i);
  if (const auto* d = std::get_if<DurationCell>(&c)) return detail::ms3(d->ns);
  if (const auto* s = std::get_if<std::string>(&c)) return *s;
  return "";
}

inline nlohmann::json json_value(const Cell& c) {
  if (const auto* b = std::get_if<bool>(&c)) return *b;
  if (const auto* i = std::get_if<std::int64_t>(&c)) return *i;
  if (const auto* d = std::get_if<DurationCell>(&c))
    return static_cast<double>(std::llround(static_cast<double>(d->ns) / 1e3)) / 1e3;
  if (const auto* s = std::get_if<std::string>(&c)) return *s;
  return nullptr;
}

/// One trial as cells, in csv_columns() order. Times are relative to the freeze request.
inline std::vector<Cell> trial_cells(const TrialObservation& o, const TrialResult& r) {
  auto dur = [](const std::optional<std::int64_t>& v) -> Cell {
    if (v) return DurationCell{*v};
    return std::monostate{};
  };
  const std::int64_t base = o.freeze_ns;
  auto rel = [base](std::int64_t t) -> Cell {
    if (t == 0 || base == 0) return std::monostate{};
    return DurationCell{t - base};
  };
  const bool error = r.outcome == Outcome::error;
  return {static_cast<std::int64_t>(o.pause_ms),
          std::string(to_string(o.phase)),
          std::string(to_string(r.outcome)),
          static_cast<std::int64_t>(r.outcome),
          r.under_budget,
          r.killed,
          r.killed_by.empty() ? Cell{} : Cell{r.killed_by},
          r.killed ? Cell{r.killed_before_expiry} : Cell{},
          dur(r.margin_ns),
          r.violation,
          r.violation ? Cell{DurationCell{r.window_ns}} : Cell{},
          r.violation ? dur(r.window_bound_ns) : Cell{},
          dur(r.recovery_ns),
          dur(r.kill_latency_ns),
          error ? Cell{} : Cell{r.side_effects_refused},
          dur(r.refusal_lag_ns),
          rel(o.valid_until_ns),
          rel(o.expiry_lo_ns),
          rel(o.grant_send_ns),
          rel(effective_death_ns(o)),
          rel(o.thaw_ns),
          rel(o.sup_confirmed_ns),
          dur(measured_pause_ns(o)),
          r.note};
}

inline std::vector<std::string> csv_row(const TrialObservation& o, const TrialResult& r) {
  std::vector<std::string> out;
  for (const Cell& c : trial_cells(o, r)) out.push_back(csv_text(c));
  return out;
}

inline std::string to_csv(const SweepReport& rep) {
  std::string out;
  const auto& cols = csv_columns();
  for (std::size_t i = 0; i < cols.size(); ++i) out += (i ? "," : "") + cols[i];
  out += '\n';
  for (std::size_t i = 0; i < rep.results.size(); ++i) {
    const auto row = csv_row(rep.observations[i], rep.results[i]);
    for (std::size_t c = 0; c < row.size(); ++c) out += (c ? "," : "") + detail::csv_cell(row[c]);
    out += '\n';
  }
  return out;
}

/// A duration for progress lines and the summary: "12.3 ms" (`ns` in nanoseconds, one decimal).
inline std::string ms_text(std::int64_t ns) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f ms", static_cast<double>(ns) / 1e6);
  return b;
}

/// One trial's result as the probe's progress line says it: the outcome, then the margin, the
/// violation window, the recovery, an accepted side effect and the note where there are any
/// ("killed-in-time, margin 480.2 ms, recovery 3.1 ms").
inline std::string trial_summary(const TrialResult& res) {
  std::string line = std::string(to_string(res.outcome));
  if (res.margin_ns) line += ", margin " + ms_text(*res.margin_ns);
  if (res.violation) line += ", window " + ms_text(res.window_ns);
  if (res.recovery_ns) line += ", recovery " + ms_text(*res.recovery_ns);
  if (!res.side_effects_refused) line += ", SIDE EFFECT ACCEPTED";
  if (!res.note.empty()) line += " (" + res.note + ")";
  return line;
}

/// The lines after the budget text: the observed threshold (longest pause without a violation,
/// shortest with one) and how far the largest window lies past the budget, where there are any.
inline std::string threshold_text(const SweepReport& rep) {
  std::string text;
  const SweepVerdict& v = rep.verdict;
  if (v.safe_pause_max_ms || v.violating_pause_min_ms) {
    text += "observed threshold       longest pause without a violation " +
            (v.safe_pause_max_ms ? std::to_string(*v.safe_pause_max_ms) + " ms" : std::string("-")) +
            ", shortest with one " +
            (v.violating_pause_min_ms ? std::to_string(*v.violating_pause_min_ms) + " ms" : std::string("-")) + "\n";
  }
  if (v.window_excess_max_ns) {
    const std::int64_t c = *v.window_excess_max_ns;
    text += "window past the budget   <= (pause - budget) " + std::string(c < 0 ? "- " : "+ ") + ms_text(c < 0 ? -c : c) +
            " (largest window " + ms_text(v.window_max_ns.value_or(0)) + ")\n";
  }
  return text;
}

/// The terminal table, one row per pause.
inline std::string to_table(const SweepReport& rep) {
  using namespace detail;
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"pause", "budget", "outcome", "kill-switch", "margin", "violation", "window",
                  "recovery", "refused", "note"});
  for (std::size_t i = 0; i < rep.results.size(); ++i) {
    const auto& o = rep.observations[i];
    const auto& r = rep.results[i];
    std::string ks = !r.killed ? "not needed" : r.killed_before_expiry ? "before expiry" : "after expiry";
    if (r.killed && r.killed_by == "recovery") ks = "recovery";
    std::string pause = std::to_string(o.pause_ms) + " ms";
    if (pause_differs(o)) pause += " (ran " + ms1(*measured_pause_ns(o)) + " ms)";
    rows.push_back({pause, r.under_budget ? "under" : "past",
                    std::string(to_string(r.outcome)), r.outcome == Outcome::error ? "-" : ks,
                    r.margin_ns ? ms1(*r.margin_ns) + " ms" : "-",
                    r.violation ? "YES" : "no",
                    r.violation ? ms1(r.window_ns) + " ms" : "-",
                    r.recovery_ns ? ms1(*r.recovery_ns) + " ms" : "-",
                    r.outcome == Outcome::error ? "-" : r.side_effects_refused ? "yes" : "NO",
                    r.note});
  }
  std::vector<std::size_t> width(rows[0].size(), 0);
  for (const auto& row : rows)
    for (std::size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(width[c] - row[c].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

/// The budget lines: configured, and measured (p99 and max) with its terms spelled out.
inline std::string budget_text(const SweepReport& rep) {
  using namespace detail;
  const Timing& t = rep.timing;
  const MeasuredTiming& m = rep.measured;
  std::string s;
  s += "configured pause budget  " + ms1(configured_budget_ns(t)) + " ms = ttl " + std::to_string(t.ttl_ms) +
       " - (kill_after " + std::to_string(t.kill_after_ms) + "*(1+" + [&] {
         char b[32];
         std::snprintf(b, sizeof b, "%g", t.clock_rate_bound);
         return std::string(b);
       }() + ") + wheel granularity " + ms3(static_cast<std::int64_t>(t.wheel_granularity_ns)) +
       " + kill latency budget " + std::to_string(t.kill_latency_budget_ms) + ") ms\n";
  if (m.budget_p99_ns && m.budget_max_ns) {
    s += "measured pause budget    " + ms1(*m.budget_p99_ns) + " ms (p99: lateness " +
         ms3(static_cast<std::int64_t>(m.lateness_p99_ns)) + " ms, kill latency " + ms3(m.kill_latency_p99_ns) +
         " ms)   " + ms1(*m.budget_max_ns) + " ms (max: lateness " +
         ms3(static_cast<std::int64_t>(m.lateness_max_ns)) + " ms, kill latency " + ms3(m.kill_latency_max_ns) +
         " ms)\n";
  } else {
    s += "measured pause budget    - (" + measured_budget_status(m).message() + ")\n";
  }
  s += "rt wake-up lateness      " + std::to_string(m.rt_lateness.count) + " ticks outside freezes, p50 <= " +
       ms3(static_cast<std::int64_t>(histogram_quantile_upper(m.rt_lateness, 0.5))) + " ms, p99 <= " +
       ms3(static_cast<std::int64_t>(m.lateness_p99_ns)) + " ms, max " + ms3(static_cast<std::int64_t>(m.lateness_max_ns)) + " ms\n";
  s += "heartbeat RTT            " + std::to_string(m.heartbeat_rtt.count) + " answers outside freezes, p50 <= " +
       ms3(static_cast<std::int64_t>(histogram_quantile_upper(m.heartbeat_rtt, 0.5))) + " ms, p99 <= " +
       ms3(static_cast<std::int64_t>(histogram_quantile_upper(m.heartbeat_rtt, 0.99))) + " ms, max " +
       ms3(static_cast<std::int64_t>(m.heartbeat_rtt.max)) + " ms\n";
  return s;
}

inline nlohmann::json histogram_json(const HistogramSnapshot& h) {
  return {{"count", h.count},
          {"p50_ns_le", histogram_quantile_upper(h, 0.5)},
          {"p99_ns_le", histogram_quantile_upper(h, 0.99)},
          {"max_ns", h.max},
          {"mean_ns", h.count ? h.sum / h.count : 0}};
}

/// The JSON summary: configuration, budgets, per-trial rows (as in the CSV, plus absolute ns),
/// and the verdict.
inline nlohmann::json to_json(const SweepReport& rep) {
  using nlohmann::json;
  const Timing& t = rep.timing;
  const MeasuredTiming& m = rep.measured;
  json j;
  j["mode"] = rep.mode;
  j["freeze"] = rep.freeze;
  j["freeze_why"] = rep.freeze_why;
  j["phase"] = std::string(to_string(rep.phase));
  j["stress"] = rep.stress;
  j["timing"] = {{"ttl_ms", t.ttl_ms}, {"kill_after_ms", t.kill_after_ms},
                 {"heartbeat_interval_ms", t.heartbeat_interval_ms},
                 {"kill_latency_budget_ms", t.kill_latency_budget_ms},
                 {"wheel_granularity_ns", t.wheel_granularity_ns}, {"clock_rate_bound", t.clock_rate_bound}};
  j["budget"] = {
      {"configured_ms", static_cast<double>(configured_budget_ns(t)) / 1e6},
      {"configured_formula", "ttl - (kill_after*(1+rho) + wheel_granularity + kill_latency_budget)"},
      {"measured_p99_ms", m.budget_p99_ns ? json(static_cast<double>(*m.budget_p99_ns) / 1e6) : json(nullptr)},
      {"measured_max_ms", m.budget_max_ns ? json(static_cast<double>(*m.budget_max_ns) / 1e6) : json(nullptr)},
      {"measured_formula", "ttl - (kill_after*(1+rho) + rt_lateness_q + kill_latency_q), q = p99 | max"},
      {"rt_lateness", histogram_json(m.rt_lateness)},
      {"heartbeat_rtt", histogram_json(m.heartbeat_rtt)},
      {"kill_latency_p99_ns", m.kill_latency_p99_ns},
      {"kill_latency_max_ns", m.kill_latency_max_ns},
      {"kill_latency_samples", m.kill_latencies_ns.size()},
      {"killed_trials", m.killed_trials},
      {"measured_missing", m.budget_p99_ns && m.budget_max_ns ? json(nullptr) : json(measured_budget_status(m).message())}};
  json trials = json::array();
  const auto& cols = csv_columns();
  for (std::size_t i = 0; i < rep.results.size(); ++i) {
    const auto& o = rep.observations[i];
    const auto row = trial_cells(o, rep.results[i]);
    json tr;
    for (std::size_t c = 0; c < cols.size(); ++c) tr[cols[c]] = json_value(row[c]);
    tr["ns"] = {{"cut", o.cut_ns}, {"freeze", o.freeze_ns}, {"frozen", o.frozen_ns}, {"thaw", o.thaw_ns},
                {"thawed", o.thawed_ns}, {"valid_until", o.valid_until_ns}, {"expiry_lo", o.expiry_lo_ns},
                {"expiry_hi", o.expiry_hi_ns}, {"grant_send", o.grant_send_ns}, {"grant_recv", o.grant_recv_ns},
                {"last_deny_send", o.last_deny_send_ns}, {"death", effective_death_ns(o)}, {"death_pidfd", o.death_ns}, {"revoked", o.revoked_ns},
                {"refreshed", o.refreshed_ns}, {"sup_confirmed", o.sup_confirmed_ns}, {"end", o.end_ns}};
    trials.push_back(std::move(tr));
  }
  j["trials"] = std::move(trials);
  const SweepVerdict& v = rep.verdict;
  auto opt = [](const std::optional<std::int64_t>& x) {
    return x ? json(static_cast<double>(*x) / 1e6) : json(nullptr);
  };
  j["verdict"] = {{"ok", v.ok}, {"line", v.line}, {"trials", v.trials}, {"errors", v.errors},
                  {"violations", v.violations}, {"violations_under_budget", v.violations_under_budget},
                  {"unbounded", v.unbounded}, {"side_effects_accepted", v.side_effects_accepted},
                  {"window_max_ms", opt(v.window_max_ns)}, {"recovery_max_ms", opt(v.recovery_max_ns)},
                  {"window_minus_excess_max_ms", opt(v.window_excess_max_ns)},
                  {"safe_pause_max_ms", v.safe_pause_max_ms ? json(*v.safe_pause_max_ms) : json(nullptr)},
                  {"violating_pause_min_ms", v.violating_pause_min_ms ? json(*v.violating_pause_min_ms) : json(nullptr)}};
  return j;
}

namespace detail {
inline std::string gp_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}
}  // namespace detail

/// A gnuplot script that reads `csv_path` and writes `png_path` (pngcairo), both named as the
/// script should name them: relative to the directory gnuplot runs in (harness/pause_output.cpp
/// runs it in the output directory), so the script holds no absolute path. It draws the margin
/// against the pause length per outcome (a series, and its legend entry, only for outcomes that
/// occurred), the violation windows on a right axis of their own (only when there was a
/// violation; its zero level with the margin's zero), the configured (solid) and measured
/// (dashed) pause budgets as vertical lines, and a note at each trial that lost heartbeat answers.
/// The legend sits right of the plot, clear of the x label; the title carries the TTL and budget.
inline std::string gnuplot_script(const SweepReport& rep, const std::string& csv_path,
                                  const std::string& png_path) {
  using detail::gp_quote;
  const double budget = static_cast<double>(configured_budget_ns(rep.timing)) / 1e6;
  std::ostringstream s;
  s << "# leasehold pause-probe: outcome and margin against the supervisor pause length.\n"
    << "set terminal pngcairo noenhanced size 1300,700 font ',10'\n"
    << "set output " << gp_quote(png_path) << "\n"
    << "set datafile separator ','\n"
    << "set title " << gp_quote("leasehold pause-probe: ttl " + std::to_string(rep.timing.ttl_ms) +
                                " ms, kill_after " + std::to_string(rep.timing.kill_after_ms) +
                                " ms, pause budget " + detail::ms1(configured_budget_ns(rep.timing)) +
                                " ms; phase " + std::string(to_string(rep.phase)) + ", freeze " + rep.freeze +
                                (rep.stress.empty() ? "" : ", under stress")) << "\n"
    << "set xlabel 'supervisor pause (ms)'\n"
    << "set ylabel 'margin = lockd expiry - sandbox death (ms)'\n"
    << "set grid\nset xzeroaxis lt -1\n"
    << "set key outside right top vertical Left reverse\n";
  // What occurred: a series per outcome class, the axes' extent.
  bool kept = false, before = false, after = false, violation = false, window = false;
  double ymin = 0, ymax = 0, wmax = 0;
  std::uint64_t xmax = 1;
  for (std::size_t i = 0; i < rep.results.size() && i < rep.observations.size(); ++i) {
    const TrialResult& r = rep.results[i];
    kept = kept || r.outcome == Outcome::kept;
    if (r.margin_ns) {
      const double m = static_cast<double>(*r.margin_ns) / 1e6;
      ymin = std::min(ymin, m);
      ymax = std::max(ymax, m);
      before = before || r.outcome == Outcome::killed_before_expiry;
      after = after || r.outcome == Outcome::killed_after_expiry;
      violation = violation || r.violation;
    }
    if (r.violation) {
      window = true;
      wmax = std::max(wmax, static_cast<double>(r.window_ns) / 1e6);
    }
    xmax = std::max(xmax, static_cast<std::uint64_t>(
                              std::max<std::int64_t>(0, effective_pause_ns(rep.observations[i])) / 1'000'000 + 1));
  }
  xmax = std::max<std::uint64_t>(xmax, static_cast<std::uint64_t>(std::max(0.0, budget)) + 1);
  s << "set xrange [" << -static_cast<double>(xmax) * 0.03 << ":" << static_cast<double>(xmax) * 1.03 << "]\n";
  const double pad = std::max(1.0, (ymax - ymin) * 0.08);
  ymin -= pad;
  ymax += pad;
  char range[96];
  std::snprintf(range, sizeof range, "set yrange [%.9g:%.9g]\n", ymin, ymax);
  s << range;
  if (window) {
    // The window's axis scaled so that its 0 is level with the margin's 0 (ymin < 0 < ymax).
    const double k = std::max(wmax, 1.0) * 1.1 / ymax;
    std::snprintf(range, sizeof range, "set y2range [%.9g:%.9g]\n", ymin * k, ymax * k);
    // Ticks from 0 up only (a window is never negative), about four, at a 1-2-5 step.
    const double raw = ymax * k / 4, decade = std::pow(10.0, std::floor(std::log10(raw)));
    const double step = raw / decade < 2 ? decade : raw / decade < 5 ? 2 * decade : 5 * decade;
    s << "set y2label 'mutex-violation window (ms)'\nset ytics nomirror\nset y2tics 0, " << step << "\n" << range;
  }
  s << "set arrow 1 from " << budget << ", graph 0 to " << budget << ", graph 1 nohead lw 2 lc rgb '#333333'\n"
    << "set label 1 " << gp_quote(" configured budget " + detail::ms1(configured_budget_ns(rep.timing)) + " ms")
    << " at " << budget << ", graph 0.96 left\n";
  if (rep.measured.budget_max_ns) {
    const double mb = static_cast<double>(*rep.measured.budget_max_ns) / 1e6;
    s << "set arrow 2 from " << mb << ", graph 0 to " << mb << ", graph 1 nohead lw 2 dt 2 lc rgb '#9467bd'\n"
      << "set label 2 " << gp_quote(" measured budget (max) " + detail::ms1(*rep.measured.budget_max_ns) + " ms")
      << " at " << mb << ", graph 0.90 left tc rgb '#9467bd'\n";
  }
  // A note at each trial whose heartbeat answers were lost (the probe's cut, or the network).
  int label = 10;
  bool lost_notes = false;
  for (std::size_t i = 0; i < rep.results.size() && i < rep.observations.size(); ++i) {
    const TrialObservation& o = rep.observations[i];
    if (o.recovery_answers == 0 || !o.error.empty()) continue;
    const TrialResult& r = rep.results[i];
    const double x = static_cast<double>(std::max<std::int64_t>(0, effective_pause_ns(o))) / 1e6;
    const double y = r.margin_ns ? static_cast<double>(*r.margin_ns) / 1e6 : 0.0;
    s << "set label " << label++ << " " << gp_quote(std::to_string(o.recovery_answers) + " hb lost") << " at " << x
      << ", " << y << " offset 1,1 font ',8' tc rgb '#555555'\n";
    lost_notes = true;
  }
  if (lost_notes)
    s << "set label 3 'n hb lost: heartbeat answers lost or unknown in that trial' at graph 0.01, graph 0.03 left "
         "font ',8' tc rgb '#555555'\n";
  const std::string f = gp_quote(csv_path);
  const int oc = kColOutcomeCode, mg = kColMargin, w = kColWindow;
  // x: the pause the trial stands for (effective_pause_ns): the measured one when it differs.
  char x[128];
  std::snprintf(x, sizeof x, "(abs($%d-$%d) > %g ? $%d : $%d)", kColPaused, kColPause,
                static_cast<double>(kPauseToleranceNs) / 1e6, kColPaused, kColPause);
  const std::string p = x;
  std::vector<std::string> series;
  if (window)  // the bars first, so the markers stay on top
    series.push_back(f + " every ::1 using " + p + ":(($" + std::to_string(oc) + "==2 || $" + std::to_string(oc) +
                     "==3) ? $" + std::to_string(w) +
                     " : 1/0) axes x1y2 with impulses lw 6 lc rgb '#ff9896' title 'violation window, right axis'");
  auto points = [&](const std::string& when, int column, const std::string& style, const std::string& title) {
    series.push_back(f + " every ::1 using " + p + ":(" + when + " ? " +
                     (column == 0 ? std::string("0") : "$" + std::to_string(column)) + " : 1/0) with points " +
                     style + " title " + gp_quote(title));
  };
  const std::string code = "$" + std::to_string(oc);
  if (kept) points(code + "==0", 0, "pt 6 ps 1.6 lc rgb '#2ca02c'", "kept: lease refreshed, no kill needed (drawn at 0)");
  if (before) points(code + "==1", mg, "pt 7 ps 1.6 lc rgb '#1f77b4'", "killed before lockd expiry (margin > 0)");
  if (after)
    points(code + "==5", mg, "pt 9 ps 1.6 lc rgb '#ff7f0e'", "killed after lockd expiry, no other holder granted (margin < 0)");
  if (violation)
    points("(" + code + "==2 || " + code + "==3)", mg, "pt 5 ps 1.6 lc rgb '#d62728'",
           "violation: another holder acquired first (margin < 0)");
  if (series.empty()) {  // no trial with an outcome to draw: an empty frame, not a gnuplot error
    s << "set label 4 'no trial with a drawable outcome (see the table)' at graph 0.5, graph 0.5 center\n"
      << "plot 1/0 notitle\n";
    return s.str();
  }
  s << "plot ";
  for (std::size_t i = 0; i < series.size(); ++i) s << (i == 0 ? "" : ", \\\n     ") << series[i];
  s << "\n";
  return s.str();
}

/// The same plot as an SVG document, for hosts without gnuplot.
inline std::string svg_plot(const SweepReport& rep) {
  const double W = 1000, H = 600, L = 90, R = 90, T = 50, B = 80;
  double xmax = 1, ymin = 0, ymax = 1, wmax = 1;
  const double budget = static_cast<double>(configured_budget_ns(rep.timing)) / 1e6;
  xmax = std::max(xmax, budget);
  for (std::size_t i = 0; i < rep.results.size(); ++i) {
    xmax = std::max(xmax, static_cast<double>(effective_pause_ns(rep.observations[i])) / 1e6);
    if (rep.results[i].margin_ns) {
      const double m = static_cast<double>(*rep.results[i].margin_ns) / 1e6;
      ymin = std::min(ymin, m);
      ymax = std::max(ymax, m);
    }
    if (rep.results[i].violation) wmax = std::max(wmax, static_cast<double>(rep.results[i].window_ns) / 1e6);
  }
  xmax *= 1.05;
  const double pad = (ymax - ymin) * 0.08;
  ymin -= pad;
  ymax += pad;
  auto X = [&](double v) { return L + (W - L - R) * v / xmax; };
  auto Y = [&](double v) { return T + (H - T - B) * (ymax - v) / (ymax - ymin); };
  // The window's axis shares the margin's zero level (as in the gnuplot script): 0..wmax*1.1 spans
  // 0..ymax.
  const double k = wmax * 1.1 / ymax;
  auto Y2 = [&](double v) { return Y(v / k); };
  std::ostringstream s;
  char b[256];
  s << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << W / 2 << "\" y=\"25\" text-anchor=\"middle\" font-size=\"14\">leasehold pause-probe: ttl "
    << rep.timing.ttl_ms << " ms, kill_after " << rep.timing.kill_after_ms << " ms, pause budget "
    << detail::ms1(configured_budget_ns(rep.timing)) << " ms; phase " << to_string(rep.phase) << "</text>\n";
  std::snprintf(b, sizeof b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"black\"/>\n",
                L, T, W - L - R, H - T - B);
  s << b;
  for (int i = 0; i <= 5; ++i) {  // ticks
    const double xv = xmax * i / 5, yv = ymin + (ymax - ymin) * i / 5, wv = wmax * 1.1 * i / 5;
    std::snprintf(b, sizeof b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.0f</text>\n", X(xv), H - B + 18, xv);
    s << b;
    std::snprintf(b, sizeof b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.0f</text>\n", L - 6, Y(yv) + 4, yv);
    s << b;
    std::snprintf(b, sizeof b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"start\" fill=\"#d62728\">%.0f</text>\n", W - R + 6, Y2(wv) + 4, wv);
    s << b;
  }
  std::snprintf(b, sizeof b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#888\"/>\n", L, Y(0), W - R, Y(0));
  s << b;
  std::snprintf(b, sizeof b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\" stroke-width=\"2\"/>\n"
                "<text x=\"%.1f\" y=\"%.1f\">configured budget %.1f ms</text>\n",
                X(budget), T, X(budget), H - B, X(budget) + 4, T + 14, budget);
  s << b;
  if (rep.measured.budget_max_ns) {
    const double mb = static_cast<double>(*rep.measured.budget_max_ns) / 1e6;
    std::snprintf(b, sizeof b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#9467bd\" stroke-width=\"2\" stroke-dasharray=\"6,4\"/>\n"
                  "<text x=\"%.1f\" y=\"%.1f\" fill=\"#9467bd\">measured budget (max) %.1f ms</text>\n",
                  X(mb), T, X(mb), H - B, X(mb) + 4, T + 30, mb);
    s << b;
  }
  for (std::size_t i = 0; i < rep.results.size(); ++i) {
    const auto& r = rep.results[i];
    const double x = X(static_cast<double>(effective_pause_ns(rep.observations[i])) / 1e6);
    if (r.violation) {
      std::snprintf(b, sizeof b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ff9896\" stroke-width=\"6\"/>\n",
                    x, Y2(0), x, Y2(static_cast<double>(r.window_ns) / 1e6));
      s << b;
    }
    if (r.outcome == Outcome::kept) {
      std::snprintf(b, sizeof b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"none\" stroke=\"#2ca02c\" stroke-width=\"2\"/>\n", x, Y(0));
      s << b;
    } else if (r.margin_ns) {
      const char* color = r.violation                                    ? "#d62728"
                          : r.outcome == Outcome::killed_after_expiry ? "#ff7f0e"
                                                                      : "#1f77b4";
      std::snprintf(b, sizeof b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"%s\"/>\n", x,
                    Y(static_cast<double>(*r.margin_ns) / 1e6), color);
      s << b;
    }
  }
  std::snprintf(b, sizeof b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">supervisor pause (ms)</text>\n", L + (W - L - R) / 2, H - B + 40);
  s << b;
  std::snprintf(b, sizeof b, "<text transform=\"translate(22,%.1f) rotate(-90)\" text-anchor=\"middle\">margin = lockd expiry - sandbox death (ms)</text>\n", T + (H - T - B) / 2);
  s << b;
  std::snprintf(b, sizeof b, "<text transform=\"translate(%.1f,%.1f) rotate(90)\" text-anchor=\"middle\" fill=\"#d62728\">violation window (ms)</text>\n", W - 20, T + (H - T - B) / 2);
  s << b;
  std::snprintf(b, sizeof b, "<text x=\"%.1f\" y=\"%.1f\">green ring: kept (no kill needed); blue: killed before lockd expiry; orange: killed after it, no other holder; red: violation (bar: window)</text>\n", L, H - 14);
  s << b;
  s << "</svg>\n";
  return s.str();
}

}  // namespace leasehold::pause
