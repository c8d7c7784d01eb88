// Ctrl-C (or a batch system's SIGTERM) as a request, not a kill: the first SIGINT or SIGTERM only raises a flag
// that the training loop reads between steps, so every rank stops after the same whole step and nothing is left
// half-written. The SIGINT handler uninstalls itself, so a second Ctrl-C ends the process at once; SIGTERM stays
// a request (a rank under Slurm gets it twice: from Slurm and from its launcher).
//
// The flag is the process's one piece of global mutable state: a signal handler can reach nothing else.
#pragma once

namespace crosstrain {

// Installs the SIGINT and SIGTERM handler (idempotent).
void catch_interrupt();
// Whether a SIGINT or SIGTERM arrived since catch_interrupt().
bool interrupt_requested();
// The signal that arrived (SIGINT or SIGTERM), 0 before one did.
int interrupt_signal();

}  // namespace crosstrain
