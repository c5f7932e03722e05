# io/wire.cmake: the wire protocol library (codec, HMAC-SHA256 authentication, replay window and
# response cache). No liburing: it is fuzzed and benchmarked on its own.
include_guard(GLOBAL)

add_library(leasehold_wire STATIC
  ${CMAKE_CURRENT_LIST_DIR}/codec.cpp
  ${CMAKE_CURRENT_LIST_DIR}/auth.cpp
  ${CMAKE_CURRENT_LIST_DIR}/replay.cpp
)
leasehold_target(leasehold_wire)
target_link_libraries(leasehold_wire PUBLIC leasehold_lease PkgConfig::LIBCRYPTO)
