// Slurm's warnings: USR1 (`--signal=B:USR1@T`) before a time limit or a
// preemption, TERM on scancel or a requeue. They may come at any moment,
// start-up included: they are held from before any shared library starts
// (the executable's preinit array, main.cpp: once the dynamic loader
// has mapped the libraries, 25-70 ms after exec on the test machine) and caught
// from main's first instruction. A signal that arrives before the job's
// loops run is remembered, and the loops drain as soon as they start
// (rank 0 stops admitting and commits).
#pragma once

#include <atomic>

namespace tandem::launcher {

// The last USR1/TERM received (0: none). Set by the handler; read by the
// role loops (rank 0's router, the HTTP server).
extern std::atomic<int> g_stop_signal;

// Blocks USR1 and TERM: one that comes stays pending until catch_stop_signals.
// Before any library's constructor, which may install handlers of its own.
void hold_stop_signals();

// Catches USR1 and TERM into g_stop_signal, then unblocks them (a held one
// is delivered now). First thing in main.
void catch_stop_signals();

// For commands that do not drain (all but run and serve): USR1 and TERM get
// their default action back, and one that came meanwhile is raised again,
// so it ends the process as it would have.
void release_stop_signals();

}  // namespace tandem::launcher
