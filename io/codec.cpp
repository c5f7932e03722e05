// The wire codec (io/protocol.hpp). Implementation follows.
#include "io/auth.hpp"
#include "io/protocol.hpp"
#include "io/replay.hpp"
