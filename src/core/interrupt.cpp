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
  // SIGTERM is what batch systems send before they kill (Slurm waits KillWait, 30 s by default). It stays caught:
  // Slurm signals every process of a step, so a rank gets it from Slurm and again from its launcher, and the
  // second copy must not kill it before it saved. The batch system's SIGKILL is the backstop.
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
}

bool interrupt_requested() { return g_interrupted != 0; }

int interrupt_signal() { return g_interrupted; }

}  // namespace crosstrain
