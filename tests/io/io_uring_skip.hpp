// Skips a test, with the probe's cause and fix, where io_uring is unavailable.
#pragma once

#include "leasehold/io/probe.hpp"

#include <gtest/gtest.h>

#define LEASEHOLD_REQUIRE_IO_URING()                                            \
  do {                                                                          \
    if (const ::leasehold::Status why = ::leasehold::io_uring_usable(); !why.ok()) \
      GTEST_SKIP() << why.message();                                            \
  } while (0)
