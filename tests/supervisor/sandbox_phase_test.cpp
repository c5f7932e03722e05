// Tests of the sandbox phase table (supervisor/sandbox_phase.hpp): the legal transitions, the
// IsRunning answer per phase, the list state per phase, and that an illegal transition aborts.
#include "leasehold/supervisor/sandbox_phase.hpp"

#include <gtest/gtest.h>

#include <set>
#include <utility>

namespace leasehold {
namespace {

using P = SandboxPhase;

constexpr P kAll[] = {P::reserved, P::acquiring, P::gated,   P::aborted, P::aborting,
                      P::committing, P::running, P::killing, P::exited};

TEST(SandboxPhase, TransitionsAreExactlyTheDocumentedOnes) {
  const std::set<std::pair<P, P>> legal = {
      {P::reserved, P::acquiring},  {P::reserved, P::gated},      {P::reserved, P::running},
      {P::reserved, P::committing}, {P::acquiring, P::gated},     {P::acquiring, P::running},
      {P::acquiring, P::committing}, {P::gated, P::running},      {P::gated, P::committing},
      {P::gated, P::aborted},       {P::aborted, P::aborting},    {P::aborted, P::exited},
      {P::aborting, P::exited},     {P::committing, P::running},  {P::committing, P::killing},
      {P::committing, P::exited},   {P::running, P::committing},  {P::running, P::killing},
      {P::running, P::exited},      {P::killing, P::exited},
  };
  for (P from : kAll)
    for (P to : kAll)
      EXPECT_EQ(may_advance(from, to), legal.contains({from, to})) << to_string(from) << " -> " << to_string(to);
}

TEST(SandboxPhase, IsRunningAnswersRunningOnlyOnceTheCommandMayHaveRun) {
  for (P p : kAll) {
    const bool want = p == P::committing || p == P::running || p == P::killing;
    EXPECT_EQ(answers_running(p), want) << to_string(p);
    // Never both: a sandbox that has not started (or has exited) is never "running".
    if (never_started(p) || p == P::exited) {
      EXPECT_FALSE(answers_running(p)) << to_string(p);
    }
  }
}

TEST(SandboxPhase, ListStatesKeepTheControlSocketsNames) {
  EXPECT_STREQ(phase_row(P::reserved).list_state, "acquiring");
  EXPECT_STREQ(phase_row(P::acquiring).list_state, "acquiring");
  EXPECT_STREQ(phase_row(P::gated).list_state, "acquiring");
  EXPECT_STREQ(phase_row(P::aborted).list_state, "acquiring");
  EXPECT_STREQ(phase_row(P::aborting).list_state, "acquiring");
  EXPECT_STREQ(phase_row(P::committing).list_state, "committing");
  EXPECT_STREQ(phase_row(P::running).list_state, "running");
  EXPECT_STREQ(phase_row(P::killing).list_state, "killing");
  EXPECT_STREQ(phase_row(P::exited).list_state, "exited");
}

TEST(SandboxPhase, PredicatesPartitionThePhases) {
  for (P p : kAll) {
    EXPECT_EQ(before_spawn(p), p == P::reserved || p == P::acquiring) << to_string(p);
    EXPECT_EQ(runs_unkilled(p), p == P::running || p == P::committing) << to_string(p);
    EXPECT_EQ(kill_asked(p), p == P::aborting || p == P::killing) << to_string(p);
    EXPECT_EQ(kill_asked_or_gone(p), kill_asked(p) || p == P::exited) << to_string(p);
    // Every phase is exactly one of: not started, running unkilled, killing, exited.
    const int kinds = int{never_started(p)} + int{runs_unkilled(p)} + int{p == P::killing} + int{p == P::exited};
    EXPECT_EQ(kinds, 1) << to_string(p);
  }
}

TEST(SandboxPhase, AdvanceMovesAlongALegalPath) {
  P p = P::reserved;
  for (P to : {P::acquiring, P::gated, P::committing, P::running, P::committing, P::killing, P::exited}) {
    advance(p, to);
    EXPECT_EQ(p, to);
  }
}

TEST(SandboxPhaseDeathTest, IllegalTransitionAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // A sandbox that never started must not be reported killing (IsRunning would say "running").
  EXPECT_DEATH({ P p = P::acquiring; advance(p, P::killing); }, "illegal sandbox phase transition acquiring -> killing");
  // An exited sandbox never comes back.
  EXPECT_DEATH({ P p = P::exited; advance(p, P::running); }, "illegal sandbox phase transition exited -> running");
  // An aborted start never runs its command.
  EXPECT_DEATH({ P p = P::aborted; advance(p, P::running); }, "illegal sandbox phase transition aborted -> running");
  // The abort goes through LEASEHOLD_ASSERT: file:line and the broken invariant follow.
  EXPECT_DEATH({ P p = P::exited; advance(p, P::gated); },
               "exited -> gated(.|\n)*sandbox_phase.hpp:[0-9]+: LEASEHOLD_ASSERT\\(may_advance\\(phase, to\\)\\) failed");
}

}  // namespace
}  // namespace leasehold
