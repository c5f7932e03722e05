// The one simulator source built per variant (sim/CMakeLists.txt): the name of the ablation the
// variant links, "" for the production libraries.
#include "leasehold/sim/world.hpp"

namespace leasehold::sim {

std::string_view ablation_name() noexcept { return LEASEHOLD_SIM_ABLATION_NAME; }

}  // namespace leasehold::sim
