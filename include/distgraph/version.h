/* distgraph's version: this header's numbers are the library's (CMakeLists.txt reads them),
 * and dg_version() says which library a program runs against, which may be newer than the
 * header it was built with. Versions follow semantic versioning from 1.0; before it, a minor
 * release may change the C interface, and the shared library's SONAME names the release series
 * that keeps it (libdistgraph.so.<DG_SOVERSION>). */
#ifndef DISTGRAPH_VERSION_H
#define DISTGRAPH_VERSION_H

#define DG_VERSION_MAJOR 0
#define DG_VERSION_MINOR 4
#define DG_VERSION_PATCH 0
#define DG_VERSION_STRING "0.4.0"
// The shared library's interface version: raised whenever a release breaks the C interface.
#define DG_SOVERSION 3

// The library's version, "MAJOR.MINOR.PATCH". Returns: borrowed, static.
const char *dg_version(void);

#endif
