# leasehold-supervisor, the per-worker daemon (DESIGN.md "The supervisor"): configuration and
# the start-up safety check, the control socket, the heartbeat schedule, the production ports
# (OsSandboxHost, RtThreadPort; library leasehold_supervisor), and the program that assembles
# them with the shm table, the io_uring loop and the rt thread of supervisor/core.cmake.
# The sources no simulator ablation changes (no #if LEASEHOLD_SIM_ABLATE_<X>): compiled once, in
# leasehold_supervisor_objects, for the library and every ablated build of it below.
add_library(leasehold_supervisor_objects OBJECT
  ${CMAKE_CURRENT_LIST_DIR}/config.cpp
  ${CMAKE_CURRENT_LIST_DIR}/control.cpp
  ${CMAKE_CURRENT_LIST_DIR}/lockd_link.cpp
  ${CMAKE_CURRENT_LIST_DIR}/os_sandbox_host.cpp
  ${CMAKE_CURRENT_LIST_DIR}/rt_thread_port.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sandbox_table.cpp
  ${CMAKE_CURRENT_LIST_DIR}/status.cpp
  ${CMAKE_CURRENT_LIST_DIR}/supervisor.cpp
)
set(LEASEHOLD_SUPERVISOR_DEPS leasehold_lease leasehold_wire leasehold_io leasehold_shm
    leasehold_supervisor_core leasehold_metrics CLI11::CLI11 nlohmann_json::nlohmann_json Threads::Threads)
leasehold_target(leasehold_supervisor_objects)
leasehold_module(leasehold_supervisor_objects supervisor)
target_link_libraries(leasehold_supervisor_objects PUBLIC ${LEASEHOLD_SUPERVISOR_DEPS})
# leasehold_supervisor_library(<target> [EXCLUDE_FROM_ALL]): the library, from those objects and
# the sources an ablation changes (compiled per library).
function(leasehold_supervisor_library tgt)
  add_library(${tgt} STATIC ${ARGN}
              ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/heartbeat.cpp
              ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/supervisor_core.cpp
              $<TARGET_OBJECTS:leasehold_supervisor_objects>)
  leasehold_target(${tgt})
  leasehold_module(${tgt} supervisor)
  target_link_libraries(${tgt} PUBLIC ${LEASEHOLD_SUPERVISOR_DEPS})
endfunction()
leasehold_supervisor_library(leasehold_supervisor)

add_executable(leasehold-supervisor ${CMAKE_CURRENT_LIST_DIR}/main.cpp)
leasehold_target(leasehold-supervisor)
leasehold_version(leasehold-supervisor)
target_link_libraries(leasehold-supervisor PRIVATE leasehold_supervisor leasehold_metrics_http)
leasehold_link_allocator(leasehold-supervisor)
install(TARGETS leasehold-supervisor RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT supervisor)

# Simulator ablations: leasehold_supervisor built again with one LEASEHOLD_SIM_ABLATE_<X> set,
# which puts back a known bug class in the real code path (see the #if in the sources). Only the
# simulator and the tests link these (EXCLUDE_FROM_ALL, never installed); leasehold-supervisor and
# leasehold_supervisor never contain them.
#   leasehold_supervisor_ablate_kill_from_answer  the kill-switch deadline measured from the
#                                                     answer's arrival, not the request's send
#   leasehold_supervisor_ablate_commit_before_spawn   preemptible mode: Commit sent on the
#                                                     Acquiring grant, the sandbox spawned only on
#                                                     the Held answer (executable
#                                                     leasehold-supervisor-ablate-commit-before-spawn)
#   leasehold_supervisor_ablate_short_grant           a grant's time left ignored: the lease counts
#                                                     from the send with the full TTL
#   leasehold_supervisor_ablate_confirm_before_exit   a revocation's kill confirmed to lockd when the
#                                                     kill is asked, before the sandbox is dead
function(leasehold_supervisor_ablation suffix define)
  leasehold_supervisor_library(leasehold_supervisor_ablate_${suffix} EXCLUDE_FROM_ALL)
  target_compile_definitions(leasehold_supervisor_ablate_${suffix} PUBLIC ${define}=1)
endfunction()
leasehold_supervisor_ablation(kill_from_answer LEASEHOLD_SIM_ABLATE_KILL_FROM_ANSWER)
leasehold_supervisor_ablation(commit_before_spawn LEASEHOLD_SIM_ABLATE_COMMIT_BEFORE_SPAWN)
leasehold_supervisor_ablation(short_grant LEASEHOLD_SIM_ABLATE_SHORT_GRANT)
leasehold_supervisor_ablation(confirm_before_exit LEASEHOLD_SIM_ABLATE_CONFIRM_BEFORE_EXIT)
add_executable(leasehold-supervisor-ablate-commit-before-spawn EXCLUDE_FROM_ALL ${CMAKE_CURRENT_LIST_DIR}/main.cpp)
leasehold_target(leasehold-supervisor-ablate-commit-before-spawn)
leasehold_version(leasehold-supervisor-ablate-commit-before-spawn)
target_link_libraries(leasehold-supervisor-ablate-commit-before-spawn PRIVATE leasehold_supervisor_ablate_commit_before_spawn
                      leasehold_metrics_http)
