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
#include "distgraph/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_server dg_server;

typedef struct dg_server_options {
    int64_t rpc_timeout_ms;        // deadline of each remote call (default 30000)
    // A remote call unanswered for a second makes the server PING that task; when a PING
    // gets no answer within this many ms, every call waiting on the task fails UNAVAILABLE
    // at once, however long its own deadline (a dead ps ends waiting steps in seconds).
    // 0: 5000; negative: no probes.
    int64_t liveness_timeout_ms;
    const char *curve_public_key;  // CurveZMQ cluster key pair (Z85); both or neither
    const char *curve_secret_key;
    // CurveZMQ with a key pair per member, from a key directory (docs/SECURITY.md, "Keys"):
    // this task's pair is DIR/<host>_<port>.key (its cluster address), it admits exactly the
    // public keys in DIR, and finds each task it calls by address there. NULL: the
    // environment's DG_KEY_DIR when set. Not together with curve_*_key.
    const char *key_dir;
    bool quiet;                    // no log lines
    int service_threads;           // threads running registered graphs (default 4)
    // Extra CPU devices of the task (/device:CPU:1 ... n), as dg_session_options' for a local
    // session: the shards of tensor-parallel layers, say, on one host's cores (0 to 64; default 0).
    int n_virtual_cpus;
    // After each message the server's I/O thread, and a thread waiting for an answer to a
    // synchronous call, poll for this many microseconds more (yielding the CPU in between)
    // before they sleep. Where waking a sleeping thread is slow (virtual machines) this halves
    // a small round trip and speeds up training steps; it costs at most that much CPU time
    // after each burst of messages. 0: 150; negative: off. DG_BUSY_POLL_US in the
    // environment, when set, overrides it (0 or less: off). Neither polls while the
    // process's kernels compute on every CPU it may run on.
    int64_t busy_poll_us;
    // Master service: a remote client's session whose client has not been heard from for this
    // many ms (clients send a keepalive every second) is closed: its running step is aborted on
    // every task and its partitions are deregistered. 0: 5000.
    int64_t client_lease_ms;
    // Master service: threads running remote clients' steps (a step holds one while it runs).
    // 0: 16.
    int master_threads;
    // Limits against peers that misbehave (docs/PROTOCOL.md, "Limits"; docs/SECURITY.md).
    // Each hit is logged (at most once a second per kind) and counted (dg_server_stats).
    // Connections accepted at once; beyond it the connection idle longest is closed. The
    // server raises its soft descriptor limit to the hard one, and the cap is kept below what
    // that limit leaves. 0: 4096.
    int max_connections;
    // Bytes of chunked transfers (tensors over 4 MiB) being received, all peers together;
    // memory is committed only as chunks arrive. 0: 4 GiB.
    int64_t max_inflight_bytes;
    // Largest frame (a graph, a feed, a tensor of 4 MiB or less) taken from a peer in one
    // message: ZeroMQ closes the connection of a peer that sends a larger one before it holds
    // it. Tensors over 4 MiB travel in chunks and are bounded by max_inflight_bytes instead.
    // Calls from this process with a larger frame fail INVALID_ARGUMENT before they are sent.
    // A remote session's feeds over 4 MiB go ahead in chunks, so they are not bounded by it;
    // a graph sent to a remote master is.
    // 0: 32 MiB.
    int64_t max_message_bytes;
    // A chunked transfer with no new chunk for this many ms is dropped. 0: 30000.
    int64_t transfer_timeout_ms;
    // Replies queued for one peer that does not read them; beyond it they are dropped. 0: 64.
    int reply_queue_messages;
    // Protected mode: a server that would listen beyond loopback (127.0.0.0/8, ::1, localhost;
    // see bind_address) refuses to start without CurveZMQ keys, since anyone who reaches the
    // port could run graphs and rewrite variables (docs/SECURITY.md). true serves such an
    // address without authentication anyway: for a network only trusted machines reach.
    bool allow_unauthenticated;
    // The address to listen on (an IP address or interface; "0.0.0.0" or "*": every
    // interface), on the port of the task's cluster address. NULL: a loopback cluster address
    // as it is, any other on every interface, as TensorFlow's servers do (the cluster may name
    // this host by a name that resolves elsewhere: a Kubernetes service, NAT). Borrowed for
    // dg_server_new.
    const char *bind_address;
    // A graph registered by a master whose connection has closed (a worker program killed
    // without deregistering) is freed after this many ms unless that master runs it again
    // first (its connection came back). Steps it had running here are aborted at once, and
    // values that have waited this long for a step that never started here are dropped.
    // Checked when a peer leaves and when the counters are asked for. 0: 60000.
    int64_t orphan_timeout_ms;
    // Largest PING payload echoed (PINGs are liveness probes; larger echoes are for
    // benchmarks, runtime/server/ping_impl.h); a larger one
    // is answered RESOURCE_EXHAUSTED. 0: 64 KiB; negative: no limit.
    int64_t max_ping_echo_bytes;
} dg_server_options;

dg_server_options dg_server_options_default(void);

// A process-wide setting, so not a server option: whether the first server of the process
// keeps glibc from handing freed tensor buffers straight back to the kernel (mallopt: mmap
// threshold 32 MiB, trim threshold 512 MiB; a second after a peer leaves, its memory is
// still given back). Received pieces are fresh buffers, and with glibc's defaults each one
// page-faults in again, which costs about half of the all-reduce bandwidth. Default true;
// false (before the first dg_server_new) leaves malloc alone.
void dg_set_malloc_tuning(bool enabled);

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
// Sets the members of job's elastic collective groups on this task (DG_COLLECTIVE_ELASTIC,
// distgraph/collective.h) for epoch: tasks of job in rank order, 1 to 1024 of them, no repeats.
// The collectives this task runs from now on run among them, numbered within the epoch; every
// member must be given the same epoch and members before it runs a collective of the epoch.
// An epoch older than the one in force is FAILED_PRECONDITION, a task the cluster lacks
// INVALID_ARGUMENT. Thread-safe; a collective running now finishes among its old members.
bool dg_server_set_collective_members(dg_server *s, const char *job, int64_t epoch, const int *tasks, int n,
                                      dg_status *st);
// Blocks until dg_server_stop() (what a ps task does). With handle_signals, SIGINT and
// SIGTERM also stop it.
bool dg_server_join(dg_server *s, bool handle_signals, dg_status *st);
void dg_server_stop(dg_server *s);
// What a server holds, as dg_server_query_stats reports it.
typedef struct dg_server_stats {
    int64_t registered_graphs;   // partitions registered by masters (worker service)
    int64_t master_sessions;     // remote clients' sessions open on its master service
    int64_t running_steps;       // RUN_GRAPH steps running now
    int64_t graphs_orphaned;     // graphs freed because the master that registered them left
    int64_t values_expired;      // values dropped after waiting orphan_timeout_ms for a step never run
    int64_t abort_marks;         // steps marked aborted (ABORT_STEP) and not yet ended, at most 100000
    // Connections and limits (dg_server_options):
    int64_t connections;         // accepted connections open now
    int64_t max_connections;     // the cap in force
    int64_t connections_closed;  // closed to stay under the cap
    int64_t accept_failures;     // accepts that failed (out of descriptors)
    int64_t inflight_bytes;      // committed to chunked transfers being received
    int64_t transfers_refused;   // chunks refused (malformed, out of order, over the byte limit)
    int64_t transfers_expired;   // chunked transfers dropped after transfer_timeout_ms
    int64_t transfers_abandoned; // ... dropped because their sender left or began another
    int64_t replies_dropped;     // replies to peers that did not read them
    int64_t requests_refused;    // requests refused for a limit (max_ping_echo_bytes)
    int64_t bad_messages;        // messages dropped or answered with an error
    // Tensor frames that went through shared memory (peers on this host) instead of TCP:
    int64_t shm_frames_sent;
    int64_t shm_frames_received;
} dg_server_stats;
// Asks the task at target ("dg://host:port" or "host:port") for its counters, from any process,
// waiting up to timeout_ms. curve keys as for dg_session_options (NULL: none).
bool dg_server_query_stats(const char *target, const char *curve_public_key, const char *curve_secret_key,
                           int64_t timeout_ms, dg_server_stats *out, dg_status *st);
// Every counter the task reports, by name, in its order: those of dg_server_stats and any a
// newer server adds (this version: "local_channels", remote sessions stepping through shared
// memory now, and "local_channel_steps", steps they ran; docs/PROTOCOL.md, SERVER_STATUS).
// Same arguments as dg_server_query_stats. On success *names (words of [a-z0-9_]; anything
// else the server sends is skipped) and *values are new arrays of *n entries: free them with
// dg_server_counters_free.
bool dg_server_query_counters(const char *target, const char *curve_public_key, const char *curve_secret_key,
                              int64_t timeout_ms, char ***names, int64_t **values, int *n, dg_status *st);
void dg_server_counters_free(char **names, int64_t *values, int n);
// Key directories (docs/SECURITY.md, "Keys"). Writes a fresh CurveZMQ key pair as
// DIR/<name>.key (mode 0600) and DIR/<name>.pub, creating DIR (mode 0700) when missing; refuses
// to overwrite (ALREADY_EXISTS). name: letters, digits, '_', '-', '.'.
bool dg_key_generate(const char *dir, const char *name, dg_status *st);
// The key name of the task serving address ("host:port", "dg://host:port"): "host_port".
void dg_key_name(const char *address, char *out, size_t cap);
// Generates a CurveZMQ key pair for a cluster (Z85 strings, 41 bytes each with the NUL).
bool dg_curve_keypair(char public_key[41], char secret_key[41], dg_status *st);

#ifdef __cplusplus
}
#endif
#endif
