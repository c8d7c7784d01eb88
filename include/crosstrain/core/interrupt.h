// Ctrl-C as a request, not a kill: the first SIGINT only raises a flag that the training loop reads between
// steps, so every rank stops after the same whole step and nothing is left half-written. The handler
// uninstalls itself, so a second Ctrl-C ends the process at once.
//
// The flag is the process's one piece of global mutable state: a signal handler can reach nothing else.
#pragma once

namespace crosstrain {

// Installs the SIGINT handler (idempotent).
void catch_interrupt();
// Whether a SIGINT arrived since catch_interrupt().
bool interrupt_requested();

}  // namespace crosstrain
