#include "distgraph/version.h"

const char *dg_version(void) { return DG_VERSION_STRING; }
