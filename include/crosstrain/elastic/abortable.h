// A communicator whose waits can be ended from outside: every wait also watches `ended`, and once it names a
// successor generation the wait throws GenerationEnded instead of blocking until the (long) back-end timeout.
// Gloo cannot cancel an operation in flight, so the abandoned operation keeps its buffers: the caller keeps the
// communicator (and the tensors it was given) alive after that, and drops the generation's objects together.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "crosstrain/comm/communicator.h"

namespace crosstrain::elastic {

// Returns the generation that replaces this one, or 0 while it lasts.
using EndedFn = std::function<int64_t()>;

std::unique_ptr<comm::Communicator> make_abortable(std::unique_ptr<comm::Communicator> inner, EndedFn ended);

}  // namespace crosstrain::elastic
