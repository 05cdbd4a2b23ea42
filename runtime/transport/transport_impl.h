/* The transport: ZeroMQ with msgpack headers and raw tensor frames (docs/PROTOCOL.md).
 * One I/O thread per transport owns every socket: the ROUTER bound at the task's address,
 * and one DEALER per peer it calls. Other threads hand it work through a locked queue and an
 * eventfd. Handlers and response callbacks run on the I/O thread and must not block. */
#ifndef DG_TRANSPORT_IMPL_H
#define DG_TRANSPORT_IMPL_H

#include <sys/types.h>

#include "wire_impl.h"

typedef struct rt_transport rt_transport;

// Who sent a request, for the reply. Owned by whoever holds it; free with rt_peer_free.
typedef struct rt_peer rt_peer;
void rt_peer_free(rt_peer *p);
// A copy (new; free with rt_peer_free), and whether two name the same peer connection.
rt_peer *rt_peer_copy(const rt_peer *p);
bool rt_peer_equal(const rt_peer *a, const rt_peer *b);

typedef struct rt_transport_options {
    const char *bind;              // "tcp://host:port" to serve on, NULL for a client only
    const char *name;              // for logs, e.g. "/job:ps/task:0"
    // Largest tensor a chunked transfer may announce, and largest frame a DEALER takes in a
    // reply. 0: 2 GiB.
    size_t max_message_bytes;
    // Largest frame (header or tensor) the bound ROUTER takes from a peer: ZeroMQ drops the
    // connection of a peer that sends more, before holding it. Tensors over 4 MiB travel in
    // chunks, so only a call's own frames (a graph, a feed) come near it; rt_call refuses a
    // call with a frame over its own limit. 0: RT_DEFAULT_MAX_FRAME_BYTES.
    size_t max_frame_bytes;
    // CurveZMQ: with both keys set (Z85, 40 characters), every socket encrypts. Without
    // keys: the key pair is this member's own; the ROUTER admits only the keyring's members
    // and a DEALER takes the key of the task it connects to from the keyring (by address).
    // Without a keyring: one key pair for the whole cluster, which every peer must hold.
    const char *curve_public_key;
    const char *curve_secret_key;
    const struct rt_keyring *keys;   // borrowed; outlives the transport
    bool quiet;                    // no log lines on stderr
    // Liveness: a call unanswered for a second makes the transport PING that endpoint (once
    // a second); when a PING gets no answer within liveness_timeout_ms, every call waiting on
    // that endpoint fails UNAVAILABLE at once, however long its own deadline. 0: 5000; < 0:
    // no probes (calls wait for their deadlines).
    int64_t liveness_timeout_ms;
    // Tensor frames of 64 KiB to 1 MiB sent to a peer on this host (a loopback or ipc
    // endpoint) travel through shared memory (runtime/shm_impl.h) unless this is set, the
    // environment has DG_SHM=0, or CurveZMQ is on (shared memory is not encrypted).
    bool no_shm;
    // Busy polling: after any event, the I/O thread polls its sockets again for this many
    // microseconds (yielding the CPU between polls) before it sleeps, and rt_call_sync polls
    // for its answer as long before it waits on a condition variable. Where waking a sleeping
    // thread is slow (virtual machines), this cuts a small round trip by half; the cost is at
    // most this much CPU time after each burst of traffic. 0: RT_DEFAULT_BUSY_POLL_US;
    // negative: off. The environment's DG_BUSY_POLL_US, when set, overrides (0 or less: off).
    int64_t busy_poll_us;
    // Limits of a bound transport (docs/PROTOCOL.md, "Limits"); each hit is counted in
    // rt_transport_stats and logged (at most once a second per kind).
    // Connections accepted at once: beyond it, the connection idle longest is closed to make
    // room (a client that connects and sends nothing cannot hold the server's descriptors).
    // 0: RT_DEFAULT_MAX_CONNECTIONS, lowered to fit the process's descriptor limit.
    int max_connections;
    // Bytes committed to chunked transfers being assembled, all peers together; a chunk that
    // would go beyond it ends its transfer. 0: RT_DEFAULT_MAX_INFLIGHT_BYTES.
    int64_t max_inflight_bytes;
    // A chunked transfer with no new chunk for this long is dropped. 0: RT_DEFAULT_TRANSFER_TIMEOUT_MS.
    int64_t transfer_timeout_ms;
    // Replies waiting to be taken by one peer that does not read them (ZeroMQ's high-water
    // mark of a peer's outgoing queue, in messages); beyond it replies to that peer are
    // dropped. 0: RT_DEFAULT_REPLY_QUEUE.
    int reply_queue_messages;
    // The process's M_TRIM_THRESHOLD (mallopt), when it has raised it: a second after a peer
    // leaves, the transport lowers it for a moment to give back the memory that peer's
    // messages left free in ZeroMQ's arena (trim_if_due). 0: the transport only malloc_trims.
    size_t trim_threshold;
    // Called on the I/O thread when the connection of a peer that has sent requests closes
    // (the peer exited, or its connection broke: a new one gets a new rt_peer). Borrowed peer.
    void (*on_peer_gone)(void *ctx, const rt_peer *peer);
    // Called on the I/O thread when an outgoing connection to endpoint ("tcp://host:port") is
    // made (its handshake succeeded) and when it closes after that (the peer exited, or the
    // connection broke; ZeroMQ connects again by itself). NULL: not told.
    void (*on_endpoint_up)(void *ctx, const char *endpoint);
    void (*on_endpoint_down)(void *ctx, const char *endpoint);
} rt_transport_options;

#define RT_DEFAULT_BUSY_POLL_US 150
// The time slice the I/O threads ask the scheduler for (io_slice.c), 0: the kernel's default;
// DG_IO_SLICE_US in the environment sets it (100 measured best on pipelines). Off by default:
// with it on, the fuzzed server (ASan, Linux 6.18) twice went 10 s without answering, every
// thread idle, which it never did with it off (docs/PROTOCOL.md).
#define RT_DEFAULT_IO_SLICE_US 0
#define RT_DEFAULT_MAX_CONNECTIONS 4096
#define RT_DEFAULT_MAX_INFLIGHT_BYTES ((int64_t)4 << 30)
#define RT_DEFAULT_TRANSFER_TIMEOUT_MS 30000
#define RT_DEFAULT_REPLY_QUEUE 64
#define RT_DEFAULT_MAX_FRAME_BYTES ((size_t)32 << 20)
// Values sent together to one task go in one message up to this many bytes.
#define RT_GROUP_BYTES ((size_t)16 << 20)

// A request arrived. h and tensors are handed over (free h with rt_header_clear + free,
// unref the tensors, free the array, rt_peer_free the peer, or pass them on).
typedef void (*rt_handler)(void *ctx, rt_peer *peer, rt_header *h, dg_tensor **tensors, int n);
// A response arrived (st OK) or the call failed (st says why; h NULL). Same ownership.
typedef void (*rt_response_cb)(void *arg, const dg_status *st, rt_header *h, dg_tensor **tensors,
                               int n);

rt_transport *rt_transport_new(const rt_transport_options *opts, rt_handler handler, void *ctx,
                               dg_status *st);
void rt_transport_free(rt_transport **t);
// The endpoint actually bound ("tcp://127.0.0.1:40123" for port 0). Returns: borrowed.
const char *rt_transport_endpoint(const rt_transport *t);

// Sends a request to endpoint; cb runs once with the response or the failure (deadline,
// unreachable peer). Consumes h (heap, from malloc) and takes references to tensors.
// Thread-safe.
void rt_call(rt_transport *t, const char *endpoint, rt_header *h, dg_tensor *const *tensors,
             int n, int64_t timeout_ms, rt_response_cb cb, void *arg);
// rt_call and wait. On success *resp (new, caller clears and frees) and *out tensors
// (new array, caller unrefs and frees).
bool rt_call_sync(rt_transport *t, const char *endpoint, rt_header *h, dg_tensor *const *tensors,
                  int n, int64_t timeout_ms, rt_header **resp, dg_tensor ***out, int *n_out,
                  dg_status *st);
// One-way push (no response). Large tensors go in 1 MiB chunks. Consumes h.
void rt_push(rt_transport *t, const char *endpoint, rt_header *h, dg_tensor *const *tensors, int n);
// Replies to a request. Consumes peer and h. Thread-safe.
void rt_reply(rt_transport *t, rt_peer *peer, rt_header *h, dg_tensor *const *tensors, int n);
// Replies with an error status.
void rt_reply_error(rt_transport *t, rt_peer *peer, uint64_t id, const dg_status *st);

// The busy-polling window in force (options and DG_BUSY_POLL_US), in microseconds; 0: off.
int64_t rt_transport_busy_poll_us(const rt_transport *t);

// io_slice.c: asks the scheduler for a time slice of slice_us for thread tid (0: the calling
// thread), keeping its policy and nice value; false where the thread is not SCHED_OTHER or the
// call failed (kernels before 6.12 accept it and ignore the slice). rt_io_threads_slice: for
// the calling thread and every ZeroMQ I/O thread of the process ("ZMQbg/IO/<n>"); returns how
// many threads took it; nothing for slice_us <= 0.
bool rt_io_thread_slice(pid_t tid, int64_t slice_us);
int rt_io_threads_slice(int64_t slice_us);
// The slice t's I/O threads asked for (0: none) and how many took it, once the I/O thread
// has started (-1 before).
int64_t rt_transport_io_slice_us(const rt_transport *t);
int rt_transport_io_sliced(const rt_transport *t);

// Counters for tests and logs.
typedef struct rt_transport_stats {
    uint64_t bad_messages;    // dropped or answered with an error
    uint64_t refused_peers;   // failed CurveZMQ handshakes
    uint64_t shm_frames_sent;       // tensor frames sent through shared memory
    uint64_t shm_frames_received;   // ... and received
    uint64_t tensor_bytes_sent;     // tensor payload bytes sent to peers, by either path
    // Limits (bound transports):
    int64_t connections;            // accepted connections open now
    int max_connections;            // the cap in force (after the descriptor limit)
    uint64_t connections_closed;    // closed by the server to stay under the cap
    uint64_t accept_failures;       // accepts that failed (descriptor limit reached)
    int64_t inflight_bytes;         // committed to chunked transfers now
    uint64_t transfers_refused;     // chunks refused: out of order, malformed, over the byte limit
    uint64_t transfers_expired;     // chunked transfers dropped: no chunk within the time-out
    uint64_t transfers_abandoned;   // ... dropped: the peer left, or began another one first
    uint64_t replies_dropped;       // replies to peers whose queue was full
    uint64_t requests_refused;      // requests a handler refused for a limit (rt_transport_refused)
} rt_transport_stats;
rt_transport_stats rt_transport_get_stats(rt_transport *t);
// A handler refused a request for one of its limits: counted in requests_refused and logged
// (at most once a second). On the I/O thread only (where handlers run).
void rt_transport_refused(rt_transport *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// "tcp://host:port" for a task address "host:port", "dg://host:port" or "tcp://host:port"
// (the port a number in 1..65535). Returns: new, caller frees with free(); NULL with st set
// (INVALID_ARGUMENT quoting the address).
char *rt_endpoint_of(const char *address, dg_status *st);

// A fresh CurveZMQ key pair (Z85, 41 bytes each with the NUL).
bool rt_curve_keypair(char *public_key, char *secret_key, dg_status *st);

#endif
