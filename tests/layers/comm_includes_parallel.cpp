// Compiled with the comm layer's include directories, this must fail: comm may not see parallel/ (a layer above).
#include "crosstrain/parallel/schedule.h"
