#include "crosstrain/core/interrupt.h"

#include <csignal>

namespace crosstrain {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;

void on_interrupt(int) { g_interrupted = 1; }

}  // namespace

void catch_interrupt() {
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  // SA_RESETHAND: the second Ctrl-C gets the default action; SA_RESTART: reads and waits carry on.
  sa.sa_flags = SA_RESETHAND | SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
}

bool interrupt_requested() { return g_interrupted != 0; }

}  // namespace crosstrain
