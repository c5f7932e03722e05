# Tests of the supervisor's network-free core (supervisor/core.cmake).
leasehold_test(supervisor_deadline_wheel_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/deadline_wheel_test.cpp
  LIBS leasehold_supervisor_core)
leasehold_test(supervisor_cgroup_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/cgroup_test.cpp
  LIBS leasehold_supervisor_core)
leasehold_test(supervisor_spawn_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/spawn_test.cpp
  LIBS leasehold_supervisor_core)
leasehold_test(supervisor_rt_thread_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/rt_thread_test.cpp
  LIBS leasehold_supervisor_core
  LABELS concurrent)
leasehold_test(supervisor_isolation_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/isolation_test.cpp
  LIBS leasehold_supervisor_core leasehold_shm)
leasehold_test(supervisor_output_pump_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/output_pump_test.cpp
  LIBS leasehold_supervisor_core leasehold_harness
  LABELS concurrent)
leasehold_test(supervisor_sandbox_phase_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/sandbox_phase_test.cpp
  LIBS leasehold_supervisor_core)
leasehold_test(supervisor_rt_core_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/rt_core_test.cpp
  LIBS leasehold_supervisor_core)
