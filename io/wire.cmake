# io/wire.cmake: the wire protocol library (codec, HMAC-SHA256 authentication, replay window and
# response cache). No liburing: it is fuzzed and benchmarked on its own.
include_guard(GLOBAL)

set(LEASEHOLD_WIRE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/codec.cpp
  ${CMAKE_CURRENT_LIST_DIR}/auth.cpp
  ${CMAKE_CURRENT_LIST_DIR}/replay.cpp
  ${CMAKE_CURRENT_LIST_DIR}/token.cpp
)
add_library(leasehold_wire STATIC ${LEASEHOLD_WIRE_SOURCES})
leasehold_target(leasehold_wire)
target_link_libraries(leasehold_wire PUBLIC leasehold_lease PkgConfig::LIBCRYPTO)

# The libFuzzer target for the decoder (clang, `cmake --preset fuzz`, scripts/fuzz.sh).
if(LEASEHOLD_FUZZ)
  add_subdirectory(${PROJECT_SOURCE_DIR}/fuzz ${PROJECT_BINARY_DIR}/fuzz)
endif()
