# supervisor/core.cmake: the supervisor's network-free core (DESIGN.md "The supervisor"):
# the deadline wheel, cgroup v2 discovery and leaves, spawn, the kill-switch and the rt thread.
# The daemon (daemon.cmake) links leasehold_supervisor_core.
add_library(leasehold_supervisor_core STATIC
  ${CMAKE_CURRENT_LIST_DIR}/deadline_wheel.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cgroup.cpp
  ${CMAKE_CURRENT_LIST_DIR}/spawn.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kill_switch.cpp
  ${CMAKE_CURRENT_LIST_DIR}/rt_core.cpp
  ${CMAKE_CURRENT_LIST_DIR}/rt_thread.cpp
  ${CMAKE_CURRENT_LIST_DIR}/output_pump.cpp
)
leasehold_target(leasehold_supervisor_core)
leasehold_module(leasehold_supervisor_core supervisor)
target_link_libraries(leasehold_supervisor_core PUBLIC leasehold_lease Boost::headers Threads::Threads
                      PRIVATE PkgConfig::LIBSECCOMP)
