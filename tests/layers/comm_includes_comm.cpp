// The control: with the same include directories, comm's own headers and core's (below it) are found.
#include "crosstrain/comm/store_protocol.h"
#include "crosstrain/core/error.h"
