# io/loop.cmake: the io_uring event loop, its start-up probe, UDP helpers and the request
# client (library leasehold_io). Independent of the codec (leasehold_wire): the client takes
# a request-id extractor from whoever owns the message format.
include_guard(GLOBAL)

add_library(leasehold_io STATIC
  ${CMAKE_CURRENT_LIST_DIR}/udp.cpp
  ${CMAKE_CURRENT_LIST_DIR}/address_list.cpp
  ${CMAKE_CURRENT_LIST_DIR}/probe.cpp
  ${CMAKE_CURRENT_LIST_DIR}/loop.cpp
  ${CMAKE_CURRENT_LIST_DIR}/client.cpp
  ${CMAKE_CURRENT_LIST_DIR}/log_writer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/event_log.cpp
  ${CMAKE_CURRENT_LIST_DIR}/daemon_options.cpp
  ${CMAKE_CURRENT_LIST_DIR}/service_notify.cpp
)
leasehold_target(leasehold_io)
leasehold_module(leasehold_io io)
target_link_libraries(leasehold_io PUBLIC leasehold_wire PkgConfig::URING Threads::Threads PRIVATE CLI11::CLI11 PkgConfig::LIBSYSTEMD)
