// What this binary was built with, and what it finds at run time.
#pragma once

#include <string>

namespace tandem::launcher {

// Multi-line text for `tandem --version`: version, compiler, enabled optional
// backends and, where CUDA was built in, the devices visible now.
std::string build_info();

}  // namespace tandem::launcher
