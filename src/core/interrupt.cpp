#include "crosstrain/core/interrupt.h"

#include <csignal>

namespace crosstrain {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;

void on_interrupt(int signal) { g_interrupted = signal; }

}  // namespace

void catch_interrupt() {
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  // SA_RESETHAND: the second Ctrl-C gets the default action; SA_RESTART: reads and waits carry on.
  sa.sa_flags = SA_RESETHAND | SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  // The same for SIGTERM, what batch systems send before they kill (Slurm waits KillWait, 30 s by default).
  sigaction(SIGTERM, &sa, nullptr);
}

bool interrupt_requested() { return g_interrupted != 0; }

int interrupt_signal() { return g_interrupted; }

}  // namespace crosstrain
