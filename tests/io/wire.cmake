# tests/io/wire.cmake: unit tests of the wire protocol library (leasehold_wire).
include_guard(GLOBAL)

leasehold_test(io_wire_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/wire_codec_test.cpp
          ${CMAKE_CURRENT_LIST_DIR}/wire_auth_test.cpp
          ${CMAKE_CURRENT_LIST_DIR}/wire_replay_test.cpp
  LIBS leasehold_wire leasehold_io)  # leasehold_io: the clock the replay tests read

leasehold_test(io_token_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/token_test.cpp
  LIBS leasehold_wire)
