// Skips a test, with the probe's cause and fix, where io_uring is unavailable.
#pragma once

#include "leasehold/io/probe.hpp"

#include <gtest/gtest.h>

#define LEASEHOLD_REQUIRE_IO_URING()                                            \
  do {                                                                          \
    if (std::string why = ::leasehold::io_uring_unavailable_reason(); !why.empty()) \
      GTEST_SKIP() << why;                                                      \
  } while (0)
