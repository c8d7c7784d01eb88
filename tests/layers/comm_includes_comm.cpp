// The control: with the same include directories, comm's own headers and those of the layers below it (store,
// core) are found.
#include "crosstrain/comm/diagnostics/flight_recorder.h"
#include "crosstrain/core/error.h"
#include "crosstrain/store/protocol.h"
