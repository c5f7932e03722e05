# leasehold-supervisor, the per-worker daemon (DESIGN.md "The supervisor"): configuration and
# the start-up safety check, the control socket, the heartbeat schedule (library
# leasehold_supervisor), and the program that assembles them with the shm table, the io_uring
# loop and the rt thread of supervisor/core.cmake.
add_library(leasehold_supervisor STATIC
  ${CMAKE_CURRENT_LIST_DIR}/config.cpp
  ${CMAKE_CURRENT_LIST_DIR}/control.cpp
  ${CMAKE_CURRENT_LIST_DIR}/heartbeat.cpp
)
leasehold_target(leasehold_supervisor)
target_link_libraries(leasehold_supervisor PUBLIC leasehold_lease CLI11::CLI11
                      nlohmann_json::nlohmann_json Threads::Threads)
