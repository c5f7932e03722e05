# Tests of leasehold-supervisor's own parts (supervisor/daemon.cmake).
leasehold_test(supervisor_config_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/config_test.cpp
               LIBS leasehold_supervisor)
target_compile_definitions(supervisor_config_test PRIVATE LEASEHOLD_SOURCE_DIR="${PROJECT_SOURCE_DIR}")  # packaging/
leasehold_test(supervisor_heartbeat_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/heartbeat_test.cpp
               LIBS leasehold_supervisor)
leasehold_test(supervisor_sandbox_table_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/sandbox_table_test.cpp
               LIBS leasehold_supervisor)
leasehold_test(supervisor_control_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/control_test.cpp
               LIBS leasehold_supervisor LABELS concurrent)

# Process tests: leasehold-supervisor against a real leasehold-lockd on loopback. The sandbox
# they run (lease_probe) logs every change of its own check_deadline answer.
if(TARGET leasehold-lockd AND TARGET leasehold-supervisor AND TARGET leasehold_lockd)
  add_executable(leasehold_lease_probe ${CMAKE_CURRENT_LIST_DIR}/lease_probe.cpp)
  leasehold_target(leasehold_lease_probe)
  target_link_libraries(leasehold_lease_probe PRIVATE leasehold_shm)
  leasehold_test(supervisor_daemon_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/daemon_test.cpp
                 LIBS leasehold_supervisor leasehold_lockd leasehold_harness)
  add_dependencies(supervisor_daemon_test leasehold-lockd leasehold-supervisor leasehold_lease_probe)
  target_compile_definitions(supervisor_daemon_test PRIVATE
    LEASEHOLD_LOCKD_BINARY="$<TARGET_FILE:leasehold-lockd>"
    LEASEHOLD_SUPERVISOR_BINARY="$<TARGET_FILE:leasehold-supervisor>"
    LEASEHOLD_PROBE_BINARY="$<TARGET_FILE:leasehold_lease_probe>")
  # The commit-before-spawn ablation, run against a real lockd (PreemptibleCommitsOnly...).
  add_dependencies(supervisor_daemon_test leasehold-supervisor-ablate-commit-before-spawn)
  target_compile_definitions(supervisor_daemon_test PRIVATE
    LEASEHOLD_SUPERVISOR_ABLATE_COMMIT_BEFORE_SPAWN_BINARY="$<TARGET_FILE:leasehold-supervisor-ablate-commit-before-spawn>")
  # Supervisors against a lockd cluster on a real etcd (started by the test, skipped where etcd
  # is not installed): named sandboxes writing to a fenced resource (the CLI's agent) survive
  # failovers and etcd faults.
  if(TARGET leasehold)
    leasehold_test(supervisor_failover_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/failover_test.cpp
                   LIBS leasehold_supervisor leasehold_lockd leasehold_resource leasehold_harness
                        leasehold_harness_etcd LABELS etcd)
    add_dependencies(supervisor_failover_test leasehold-lockd leasehold-supervisor leasehold)
    target_compile_definitions(supervisor_failover_test PRIVATE
      LEASEHOLD_LOCKD_BINARY="$<TARGET_FILE:leasehold-lockd>"
      LEASEHOLD_SUPERVISOR_BINARY="$<TARGET_FILE:leasehold-supervisor>"
      LEASEHOLD_CLI_BINARY="$<TARGET_FILE:leasehold>")
    # Supervisors against a lockd cluster of two shards on a real etcd: routing by name,
    # a heartbeat batch per shard, one shard failing over alone, the CLI listing every shard.
    leasehold_test(supervisor_shards_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/shards_test.cpp
                   LIBS leasehold_supervisor leasehold_lockd leasehold_etcd leasehold_harness leasehold_harness_etcd
                   LABELS etcd)
    add_dependencies(supervisor_shards_test leasehold-lockd leasehold-supervisor leasehold)
    target_compile_definitions(supervisor_shards_test PRIVATE
      LEASEHOLD_LOCKD_BINARY="$<TARGET_FILE:leasehold-lockd>"
      LEASEHOLD_SUPERVISOR_BINARY="$<TARGET_FILE:leasehold-supervisor>"
      LEASEHOLD_CLI_BINARY="$<TARGET_FILE:leasehold>")
  endif()
  # `leasehold revoke --wait` against the real services.
  if(TARGET leasehold)
    add_dependencies(supervisor_daemon_test leasehold)
    target_compile_definitions(supervisor_daemon_test PRIVATE LEASEHOLD_CLI_BINARY="$<TARGET_FILE:leasehold>")
  endif()
endif()

# The simulator ablations in scripted scenarios: the defended build must stay safe, each ablated
# build must break the scenario (tests/supervisor/sim_ablation_test.cpp).
leasehold_test(supervisor_sim_ablation_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/sim_ablation_test.cpp
               LIBS leasehold_supervisor)
leasehold_test(supervisor_sim_ablation_kill_from_answer_test
               SOURCES ${CMAKE_CURRENT_LIST_DIR}/sim_ablation_test.cpp
               LIBS leasehold_supervisor_ablate_kill_from_answer)
target_compile_definitions(supervisor_sim_ablation_kill_from_answer_test PRIVATE LEASEHOLD_TEST_ABLATED=1)

# The sandbox logic with fake ports (supervisor/supervisor_core.cpp).
leasehold_test(supervisor_core_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/supervisor_core_test.cpp
               LIBS leasehold_supervisor)
# LockdLink following a replicated lockd's leader, against fake lockd sockets on one loop.
leasehold_test(supervisor_lockd_link_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/lockd_link_test.cpp
               LIBS leasehold_supervisor)

# The service conventions (systemd notifications, SIGHUP's log level, the config file) on the
# real supervisor and lockd.
if(TARGET leasehold-lockd AND TARGET leasehold-supervisor)
  leasehold_test(supervisor_service_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/service_test.cpp
                 LIBS leasehold_supervisor leasehold_harness)
  leasehold_tree_headers(supervisor_service_test tests)
  add_dependencies(supervisor_service_test leasehold-lockd leasehold-supervisor)
  target_compile_definitions(supervisor_service_test PRIVATE
    LEASEHOLD_LOCKD_BINARY="$<TARGET_FILE:leasehold-lockd>"
    LEASEHOLD_SUPERVISOR_BINARY="$<TARGET_FILE:leasehold-supervisor>")
endif()
