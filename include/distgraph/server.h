/* Servers: one per task of a cluster. A server binds its cluster address and runs the task's
 * worker service (registered graph partitions, variables shared by name across sessions of
 * different clients, the task's rendezvous) and master service (sessions with target
 * dg_server_target(server) place and partition over the whole cluster). Every remote call
 * has a deadline, so a dead peer turns into UNAVAILABLE naming the task, never a hang. */
#ifndef DISTGRAPH_SERVER_H
#define DISTGRAPH_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include "distgraph/cluster.h"
#include "distgraph/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_server dg_server;

typedef struct dg_server_options {
    int64_t rpc_timeout_ms;        // deadline of each remote call (default 30000)
    const char *curve_public_key;  // CurveZMQ cluster key pair (Z85); both or neither
    const char *curve_secret_key;
    bool quiet;                    // no log lines
    int service_threads;           // threads running registered graphs (default 4)
} dg_server_options;

dg_server_options dg_server_options_default(void);

// Starts the task `job`/`task` of cluster c: binds its address (from c) and starts serving.
// Borrows c for the call (copies it). opts may be NULL. Returns: new, caller frees with
// dg_server_free(); NULL with st set (e.g. UNAVAILABLE when the address is taken).
dg_server *dg_server_new(const dg_cluster *c, const char *job, int task, const dg_server_options *opts,
                         dg_status *st);
// Stops serving and frees; sessions on it must be freed first.
void dg_server_free(dg_server **s);
// "dg://host:port" of this server, the target for dg_session_new. Returns: borrowed, valid
// until dg_server_free().
const char *dg_server_target(const dg_server *s);
// This task's canonical name, "/job:ps/replica:0/task:0". Returns: borrowed.
const char *dg_server_task_name(const dg_server *s);
// Blocks until dg_server_stop() (what a ps task does). With handle_signals, SIGINT and
// SIGTERM also stop it.
bool dg_server_join(dg_server *s, bool handle_signals, dg_status *st);
void dg_server_stop(dg_server *s);
// Generates a CurveZMQ key pair for a cluster (Z85 strings, 41 bytes each with the NUL).
bool dg_curve_keypair(char public_key[41], char secret_key[41], dg_status *st);

#ifdef __cplusplus
}
#endif
#endif
