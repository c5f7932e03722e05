# Tests of the io_uring loop, its probe and the request client (leasehold_io).
leasehold_test(io_probe_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/probe_test.cpp LIBS leasehold_io)
leasehold_test(io_loop_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/loop_test.cpp LIBS leasehold_io
               leasehold_harness)  # harness: pidfd_open
leasehold_test(io_loop_wake_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/loop_wake_test.cpp
               LIBS leasehold_io LABELS concurrent)
leasehold_test(io_client_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/client_test.cpp LIBS leasehold_io
               LABELS concurrent)  # the blocking tests talk to a server thread
leasehold_test(io_loop_alloc_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/loop_alloc_test.cpp LIBS leasehold_io)
leasehold_test(io_udp_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/udp_test.cpp LIBS leasehold_io)
leasehold_test(io_clock_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/clock_test.cpp LIBS leasehold_io)
leasehold_test(io_log_writer_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/log_writer_test.cpp LIBS leasehold_io LABELS concurrent)
leasehold_test(io_address_list_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/address_list_test.cpp LIBS leasehold_io)
# The daemons' log line format and their shared flags and config file.
leasehold_test(io_event_log_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/event_log_test.cpp
               LIBS leasehold_io nlohmann_json::nlohmann_json)
leasehold_test(io_daemon_options_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/daemon_options_test.cpp
               LIBS leasehold_io CLI11::CLI11)
