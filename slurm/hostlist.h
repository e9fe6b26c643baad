// Slurm hostlist expressions, expanded as `scontrol show hostnames` does:
// comma lists ("a,b"), numeric ranges in brackets with zero padding
// ("node[01-03]"), several ranges and single numbers in one bracket
// ("n[1,3-5]"), and several bracket groups in one name ("r[1-2]n[1-2]", the
// cartesian product, leftmost group slowest).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem::slurm {

// Throws tandem::Error naming the expression on a malformed one.
std::vector<std::string> expand_hostlist(std::string_view expression);

}  // namespace tandem::slurm
