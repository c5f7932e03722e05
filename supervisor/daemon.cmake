# leasehold-supervisor, the per-worker daemon (DESIGN.md "The supervisor"): configuration and
# the start-up safety check, the control socket, the heartbeat schedule (library
# leasehold_supervisor), and the program that assembles them with the shm table, the io_uring
# loop and the rt thread of supervisor/core.cmake.
add_library(leasehold_supervisor STATIC
  ${CMAKE_CURRENT_LIST_DIR}/config.cpp
  ${CMAKE_CURRENT_LIST_DIR}/control.cpp
  ${CMAKE_CURRENT_LIST_DIR}/heartbeat.cpp
  ${CMAKE_CURRENT_LIST_DIR}/lockd_link.cpp
  ${CMAKE_CURRENT_LIST_DIR}/supervisor.cpp
)
leasehold_target(leasehold_supervisor)
target_link_libraries(leasehold_supervisor PUBLIC leasehold_lease leasehold_wire leasehold_io
                      leasehold_shm leasehold_supervisor_core CLI11::CLI11 nlohmann_json::nlohmann_json Threads::Threads)

add_executable(leasehold-supervisor ${CMAKE_CURRENT_LIST_DIR}/main.cpp)
leasehold_target(leasehold-supervisor)
target_link_libraries(leasehold-supervisor PRIVATE leasehold_supervisor)
leasehold_link_allocator(leasehold-supervisor)
install(TARGETS leasehold-supervisor RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
