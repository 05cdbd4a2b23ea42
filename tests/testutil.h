/* Helpers shared by the cmocka unit tests. Include after <cmocka.h>'s prerequisites. */
#ifndef DG_TESTUTIL_H
#define DG_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "distgraph/distgraph.h"

// Fails the test with the status message when st is not OK.
#define assert_ok(st) dg_test_assert_ok((st), __FILE__, __LINE__)
// Fails unless st has `code` and its message contains `needle`.
#define assert_status(st, code, needle) \
    dg_test_assert_status((st), (code), (needle), __FILE__, __LINE__)

void dg_test_assert_ok(const dg_status *st, const char *file, int line);
void dg_test_assert_status(const dg_status *st, dg_code code, const char *needle,
                           const char *file, int line);
// A TCP port on 127.0.0.1 that was free a moment ago (the kernel's pick, handed back): free
// to bind, and nobody listens on it. Fails the test if the kernel gives none.
int dg_test_free_port(void);
// A local session over CPU:0 and n_devices - 1 virtual CPUs with inter_op_threads threads;
// fails the test if it cannot be made.
dg_session *dg_test_local_session(dg_graph *g, int n_devices, int inter_op_threads, dg_status *st);
// A deterministic uniform double in [lo, hi) from *state (xorshift).
double dg_test_uniform(uint64_t *state, double lo, double hi);

#endif
