# tests/io/bridge.cmake: every wire message type over real loopback UDP through the io_uring
# loop with authentication on (DESIGN.md "The wire protocol"). The codec, HMAC and receiver
# (leasehold_wire) meet the loop and request client (leasehold_io) in the supervisor's
# LockdLink, so the test links leasehold_supervisor. Single-threaded: no `concurrent` label.
include_guard(GLOBAL)

if(TARGET leasehold_supervisor)
  leasehold_test(io_wire_bridge_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/wire_bridge_test.cpp
                 LIBS leasehold_supervisor leasehold_wire leasehold_io)
endif()
