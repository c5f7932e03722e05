# perf_handover_smoke: leasehold-handover-bench for 2 rounds per mode (a few seconds), checked on
# what it reports, never on its timings:
#   - every mode ran every round;
#   - in every round the next holder's write was accepted at a higher epoch than the holder's,
#     and each round's holder comes after the previous round's next holder (epochs only grow);
#   - the resource's audit: exclusive, nothing rejected, two accepted writes per round.
# Run as: cmake -DBENCH=<leasehold-handover-bench> -DROUNDS=2 -P smoke_test.cmake
# Prints "handover smoke skipped: ..." (the test is then skipped) where the bench cannot run
# (not root, no io_uring).
if(NOT BENCH)
  message(FATAL_ERROR "-DBENCH=<path of leasehold-handover-bench> is required")
endif()
if(NOT ROUNDS)
  set(ROUNDS 2)
endif()
execute_process(COMMAND ${BENCH} --rounds ${ROUNDS} --json
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 300)
if(rc EQUAL 77)
  # cmake -P cannot exit 77 (before CMake 3.29): the test's SKIP_REGULAR_EXPRESSION matches this.
  message("handover smoke skipped: ${err}")
  return()
endif()
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "leasehold-handover-bench exited ${rc}:\n${err}\n${out}")
endif()

string(JSON ok GET "${out}" ok)
if(NOT ok)
  message(FATAL_ERROR "the bench reported ok=false:\n${out}")
endif()
string(JSON modes LENGTH "${out}" modes)
if(NOT modes EQUAL 3)
  message(FATAL_ERROR "want 3 modes (fifo, poll 10 ms, poll 100 ms), got ${modes}")
endif()
math(EXPR last_mode "${modes} - 1")
math(EXPR last_round "${ROUNDS} - 1")
set(checked 0)
foreach(m RANGE ${last_mode})
  string(JSON mode GET "${out}" modes ${m} mode)
  string(JSON n LENGTH "${out}" modes ${m} rounds)
  if(NOT n EQUAL ROUNDS)
    message(FATAL_ERROR "${mode}: ${n} rounds, want ${ROUNDS}")
  endif()
  set(previous 0)
  foreach(i RANGE ${last_round})
    string(JSON held GET "${out}" modes ${m} rounds ${i} held_epoch)
    string(JSON next GET "${out}" modes ${m} rounds ${i} next_epoch)
    if(NOT next GREATER held)
      message(FATAL_ERROR "${mode} round ${i}: the next holder wrote at epoch ${next}, not above the holder's ${held}")
    endif()
    if(NOT held GREATER previous)
      message(FATAL_ERROR "${mode} round ${i}: the holder's epoch ${held} is not above the previous round's ${previous}")
    endif()
    set(previous ${next})
    math(EXPR checked "${checked} + 1")
  endforeach()
endforeach()

string(JSON exclusive GET "${out}" audit exclusive)
string(JSON rejected GET "${out}" audit rejected)
string(JSON accepted GET "${out}" audit accepted)
math(EXPR want_accepted "2 * ${checked}")
if(NOT exclusive OR NOT rejected EQUAL 0 OR NOT accepted EQUAL want_accepted)
  message(FATAL_ERROR "the resource's audit: exclusive=${exclusive} rejected=${rejected} accepted=${accepted} "
                      "(want exclusive, 0 rejected, ${want_accepted} accepted)")
endif()
message("ok: ${checked} hand-overs, each accepted at a higher epoch; audit exclusive, ${accepted} writes accepted")
