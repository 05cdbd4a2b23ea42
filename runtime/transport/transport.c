/* ZeroMQ transport. Every socket belongs to the I/O thread; other threads queue commands.
 * Tensors leave without copies (zmq_msg_init_data holds a tensor reference until ZeroMQ is
 * done) and arrive without copies (the frame becomes the tensor's buffer), except chunked
 * pushes, which are assembled into one buffer as the chunks arrive. */
#include <arpa/inet.h>
#include <errno.h>
#include <malloc.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "base_impl.h"
#include "exec_executor_impl.h"
#include "keys_impl.h"
#include "shm_impl.h"
#include "status_impl.h"
#include "tensor_impl.h"
#include "transport_impl.h"

#define MAX_FRAMES (RT_MAX_TENSORS + 4)

struct rt_peer {
    size_t len;
    unsigned char id[256];
};

void rt_peer_free(rt_peer *p) { free(p); }

rt_peer *rt_peer_copy(const rt_peer *p) {
    rt_peer *c = malloc(sizeof *c);
    if (!c) abort();
    *c = *p;
    return c;
}

bool rt_peer_equal(const rt_peer *a, const rt_peer *b) {
    return a && b && a->len == b->len && memcmp(a->id, b->id, a->len) == 0;
}

typedef enum cmd_kind { CMD_CALL, CMD_PUSH, CMD_REPLY } cmd_kind;

typedef struct cmd {
    struct cmd *next;
    cmd_kind kind;
    char *endpoint;          // CALL, PUSH
    rt_peer *peer;           // REPLY
    char *header;            // encoded
    size_t header_len;
    dg_tensor **tensors;     // references held
    int n;
    uint64_t id;             // CALL
    int64_t timeout_ms;
    rt_response_cb cb;
    void *arg;
    bool chunked;            // PUSH of one large tensor
    bool small_push;         // PUSH of one tensor: may share a message with its neighbours
    rt_header *chunk_hdr;    // PUSH: the header to repeat per chunk, or to merge
    char *refused;           // CALL: why it is not sent (a frame over max_frame_bytes)
} cmd;

typedef struct pending {
    struct pending *next;
    uint64_t id;
    int64_t deadline;        // ms, monotonic
    int64_t sent_at;         // ms, monotonic
    bool probe;              // a liveness PING of the transport's own (no callback)
    uint64_t peer_inc;       // the endpoint's incarnation known when sent, 0: none yet
    int dealer;              // index in t->dealers of the socket it went out on
    char *endpoint;
    int type;
    rt_response_cb cb;
    void *arg;
} pending;

typedef struct dealer {
    char *endpoint;
    void *sock;
    uint64_t probe_id;       // the liveness PING in flight, 0: none
    int64_t next_probe_at;   // ms, monotonic: no new probe before
    uint64_t peer_inc;       // incarnation of the process answering there, 0: not seen yet
    bool local;              // on this host (loopback): big frames may go by shared memory
    unsigned reconnects;     // sockets replaced (reconnect_dealer): its calls were failed
    void *mon;               // the PAIR reading its handshake events (watch_socket), NULL: none
    bool up;                 // its connection finished its handshake
    unsigned cut_short;      // connections closed during the handshake in a row (CurveZMQ)
} dealer;

// A chunked transfer being put together. A sender's chunks come in order on one connection
// (rt_push sends them in one go), so a peer has at most one, and each chunk must be the next.
typedef struct assembly {
    struct assembly *next;
    unsigned char id[256];   // the peer's routing id
    size_t id_len;
    uint64_t xfer;
    dg_tensor *t;
    uint64_t received;       // bytes in, all before this offset
    int64_t charged;         // bytes counted against max_inflight_bytes (pages touched)
    int64_t last_ms;         // when its last chunk came (monotonic)
} assembly;

// An accepted connection of the ROUTER, known from the monitor's events.
typedef struct conn {
    bool open;
    signed char local;       // the peer is on this host: 1 yes, 0 no, -1 not known yet
    int64_t last_ms;         // accepted, or last message received on it (monotonic)
    bool closing;            // shut down by us, its DISCONNECTED event not seen yet
    // The descriptor was reused before the monitor said so (conn_heard): this many earlier
    // connections' DISCONNECTED and ACCEPTED events are still on their way, to be skipped.
    int stale_closes, stale_accepts;
    size_t id_len;           // the routing id of its messages (0: none yet)
    unsigned char id[256];
} conn;

// Kinds of limit hits, for logs at most once a second each.
enum { LIM_CONN, LIM_ACCEPT, LIM_EXPIRED, LIM_ABANDONED, LIM_REPLY, LIM_REQUEST, LIM_BAD, LIM_KINDS };

struct rt_transport {
    void *zctx;
    void *router;
    void *monitor;           // PAIR receiving the ROUTER's handshake events
    void *zap;               // REP answering ZAP requests (CurveZMQ)
    pthread_t zap_thread;
    bool has_zap;
    dealer *dealers;
    int n_dealers;
    int efd;
    pthread_t thread;
    bool running;
    pthread_mutex_t mu;
    cmd *head, *tail;
    bool stop;
    pending *pending;
    uint64_t next_id;        // under mu
    uint64_t incarnation;    // random, set once: answers carry it, so callers see a restart
    uint64_t next_xfer;
    assembly *assemblies;
    rt_handler handler;
    void *ctx;
    rt_transport_options opts;
    char name[128];
    char endpoint[256];
    char curve_pub[41], curve_sec[41];
    char dealer_error[512];  // why the last DEALER could not be made (I/O thread)
    bool curve;
    rt_transport_stats stats;
    rt_shm_pool *shm;        // the slots big frames to local peers go through (I/O thread)
    bool shm_off;            // CurveZMQ on, DG_SHM=0, or the pool could not be made
    zmq_msg_t **frames;      // MAX_FRAMES slots for the message being read (I/O thread only)
    int64_t busy_poll_ns;    // polling window after activity, 0: none (see busy_poll_us)
    int n_cpus;              // CPUs this process may run on (its affinity mask), at least 1
    int64_t io_slice_us;     // the I/O threads' time slice (io_slice.c), 0: the kernel's
    int io_sliced;           // threads that took it (the I/O thread and ZeroMQ's)
    int64_t slice_retry_ms;  // when to look for ZeroMQ's thread again (it names itself late), 0: no need
    int slice_tries;
    int64_t last_active_ns;  // when the I/O thread last had something to do (I/O thread)
    // Limits (I/O thread; the counters in stats are atomics read by others).
    conn *conns;             // accepted connections by descriptor (bound transports)
    int cap_conns;           // entries in conns
    int n_conns, n_closing;  // open, and of those shut down by us
    int max_conns;
    int bound_port;
    int64_t inflight;        // sum of the assemblies' charged bytes
    int64_t limit_logged_ms[LIM_KINDS];
    uint64_t limit_unlogged[LIM_KINDS];
    int limit_lines[LIM_KINDS];   // lines logged in the window that began at limit_logged_ms
    int64_t trim_at_ms;      // when to malloc_trim (a second after a peer left), 0: not due
    void *self_rx, *self_tx; // a socket pair of this context, for trim_if_due (see there)
    bool self_failed;        // ... which could not be made
};

static void tlog(rt_transport *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tlog(rt_transport *t, const char *fmt, ...) {
    if (t->opts.quiet) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "distgraph %s: %s\n", t->name, buf);
}

static void limit_hit(rt_transport *t, int kind, uint64_t *counter, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void free_tensor_hint(void *data, void *hint) {
    (void)data;
    dg_tensor_unref(hint);
}

// Receives one multipart message into frames (heap zmq_msg_t each). Returns the count, or
// -1 (and drains the rest) when there are too many frames.
static int recv_multipart(void *sock, zmq_msg_t **frames) {
    int n = 0;
    bool too_many = false;
    for (;;) {
        zmq_msg_t *m = malloc(sizeof *m);
        if (!m) abort();
        zmq_msg_init(m);
        if (zmq_msg_recv(m, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(m);
            free(m);
            break;
        }
        bool more = zmq_msg_more(m);
        if (n < MAX_FRAMES) frames[n++] = m;
        else {
            too_many = true;
            zmq_msg_close(m);
            free(m);
        }
        if (!more) break;
    }
    if (too_many) {
        for (int i = 0; i < n; i++) {
            zmq_msg_close(frames[i]);
            free(frames[i]);
        }
        return -1;
    }
    return n;
}

static void close_frames(zmq_msg_t **frames, int from, int n) {
    for (int i = from; i < n; i++) {
        if (!frames[i]) continue;
        zmq_msg_close(frames[i]);
        free(frames[i]);
        frames[i] = NULL;
    }
}

static void free_msg(void *data, size_t n, void *arg) {
    (void)data;
    (void)n;
    zmq_msg_close(arg);
    free(arg);
}

// Frame -> tensor of description d without copying when the buffer is aligned. Consumes m.
// local: the frame came from a peer on this host, whose shared-memory descriptors are read.
static dg_tensor *frame_tensor(rt_transport *t, zmq_msg_t *m, const rt_tensor_desc *d, bool local, dg_status *st) {
    size_t size = zmq_msg_size(m);
    if (local && rt_shm_is_desc(zmq_msg_data(m), size, d->nbytes)) {
        // The bytes are in the sender's shared memory: read in place, the slot freed with the tensor.
        dg_tensor *t_shm = rt_shm_tensor(zmq_msg_data(m), d->dtype, d->shape, d->nbytes, st);
        zmq_msg_close(m);
        free(m);
        if (t_shm) __atomic_add_fetch(&t->stats.shm_frames_received, 1, __ATOMIC_RELAXED);
        return t_shm;
    }
    if (size != d->nbytes) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "a tensor frame has %zu bytes, its header says %llu",
                       size, (unsigned long long)d->nbytes);
        zmq_msg_close(m);
        free(m);
        return NULL;
    }
    void *data = zmq_msg_data(m);
    // ZeroMQ's large messages start 8 bytes into their allocation: fine for every dtype.
    if (((uintptr_t)data & 7) != 0 || size < 64) {
        dg_tensor *copy = dg_tensor_from_data(d->dtype, d->shape, data, st);
        zmq_msg_close(m);
        free(m);
        return copy;
    }
    dg_tensor *wrapped = dg_tensor_wrap(d->dtype, d->shape, data, size, free_msg, m, st);
    if (!wrapped) {
        zmq_msg_close(m);
        free(m);
    }
    return wrapped;
}

// shm (NULL: none) carries tensor frames of RT_SHM_MIN_BYTES..RT_SHM_SLOT_BYTES to a peer on
// this host: the bytes go into a slot and a descriptor frame goes in their place.
// Never blocks (the I/O thread must not): returns false when the message could not be taken,
// which for a DEALER means it has no connection left (see dealer_send).
static bool send_frames(rt_transport *t, void *sock, const rt_peer *peer, const char *hdr,
                        size_t hdr_len, dg_tensor *const *tensors, int n, size_t slice_off,
                        size_t slice_len, rt_shm_pool *shm) {
    // A reply to a peer that has gone fails here (ROUTER_MANDATORY); sending the other frames
    // anyway would make each of them a routing id of its own, and leak it.
    if (peer && zmq_send(sock, peer->id, peer->len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
        if (zmq_errno() == EAGAIN)   // its queue is full: a peer that does not read its answers
            limit_hit(t, LIM_REPLY, &t->stats.replies_dropped,
                      "dropped a reply: the peer has %d unread replies queued (reply_queue_messages)",
                      t->opts.reply_queue_messages);
        return false;
    }
    zmq_msg_t m;
    zmq_msg_init_size(&m, hdr_len);
    memcpy(zmq_msg_data(&m), hdr, hdr_len);
    if (zmq_msg_send(&m, sock, (n > 0 ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m);
        return false;
    }
    for (int i = 0; i < n; i++) {
        dg_tensor *ten = tensors[i];
        char *data = ten->data;
        size_t len = ten->nbytes;
        if (slice_len) {
            data += slice_off;
            len = slice_len;
        }
        zmq_msg_t f;
        unsigned char desc[RT_SHM_DESC_BYTES];
        __atomic_add_fetch(&t->stats.tensor_bytes_sent, (uint64_t)len, __ATOMIC_RELAXED);
        if (len == 0) {
            zmq_msg_init(&f);
        } else if (shm && rt_shm_put(shm, data, len, desc)) {
            zmq_msg_init_size(&f, sizeof desc);
            memcpy(zmq_msg_data(&f), desc, sizeof desc);
            __atomic_add_fetch(&t->stats.shm_frames_sent, 1, __ATOMIC_RELAXED);
        } else {
            dg_tensor_ref(ten);
            zmq_msg_init_data(&f, data, len, free_tensor_hint, ten);
        }
        // Once the first part of a message is taken, ZeroMQ takes the rest.
        if (zmq_msg_send(&f, sock, (i + 1 < n ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f);   // drops the tensor reference taken above
            return true;
        }
    }
    return true;
}

// One event from a socket monitor's PAIR, without waiting: false when none is there. addr
// (cap bytes, may be NULL) gets the endpoint the event names, cut to fit.
static bool monitor_event(void *mon, uint16_t *event, uint32_t *value, char *addr, size_t cap) {
    zmq_msg_t ev, a;
    zmq_msg_init(&ev);
    if (zmq_msg_recv(&ev, mon, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&ev);
        return false;
    }
    zmq_msg_init(&a);
    if (zmq_msg_more(&ev)) zmq_msg_recv(&a, mon, 0);
    *event = 0;
    *value = 0;
    if (zmq_msg_size(&ev) >= 6) {
        memcpy(event, zmq_msg_data(&ev), sizeof *event);
        memcpy(value, (const char *)zmq_msg_data(&ev) + 2, sizeof *value);
    }
    if (addr && cap) {
        size_t n = zmq_msg_size(&a) < cap - 1 ? zmq_msg_size(&a) : cap - 1;
        memcpy(addr, zmq_msg_data(&a), n);
        addr[n] = 0;
    }
    zmq_msg_close(&ev);
    zmq_msg_close(&a);
    return true;
}

// A PAIR reading sock's handshake events (on_dealer_monitor), attached before it connects so
// that no event is missed: a refused handshake fails its calls at once, UNAUTHENTICATED,
// instead of leaving them to their deadlines. NULL when none could be made (they wait then).
static void *watch_socket(rt_transport *t, void *sock) {
    static atomic_uint serial;
    char ep[96];
    snprintf(ep, sizeof ep, "inproc://dealer-monitor-%p-%u", (void *)t, atomic_fetch_add(&serial, 1));
    int events = ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                 ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_DISCONNECTED;
    if (zmq_socket_monitor(sock, ep, events) != 0) return NULL;
    void *mon = zmq_socket(t->zctx, ZMQ_PAIR);
    int zero = 0;
    if (mon && (zmq_setsockopt(mon, ZMQ_RCVHWM, &zero, sizeof zero) != 0 || zmq_connect(mon, ep) != 0)) {
        zmq_close(mon);
        mon = NULL;
    }
    if (!mon) zmq_socket_monitor(sock, NULL, 0);
    return mon;
}

// A DEALER connected to endpoint, or NULL (logged); *mon: its handshake monitor (watch_socket).
static void *new_dealer_socket(rt_transport *t, const char *endpoint, void **mon) {
    *mon = NULL;
    void *s = zmq_socket(t->zctx, ZMQ_DEALER);
    if (!s) return NULL;
    int zero = 0, one = 1;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_IMMEDIATE, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_TCP_KEEPALIVE, &one, sizeof one);
    int64_t max = (int64_t)t->opts.max_message_bytes;
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &max, sizeof max);
    if (t->curve) {
        char server_key[RT_KEY_Z85];
        memcpy(server_key, t->curve_pub, sizeof server_key);   // one key pair for the cluster
        dg_status st = DG_STATUS_INIT;
        if (t->opts.keys && !rt_keyring_server_key(t->opts.keys, endpoint, server_key, &st)) {
            snprintf(t->dealer_error, sizeof t->dealer_error, "%s", dg_status_message(&st));
            tlog(t, "cannot connect to %s: %s", endpoint, t->dealer_error);
            status_impl_clear(&st);
            zmq_close(s);
            return NULL;
        }
        zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, server_key, 40);
        zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, t->curve_pub, 40);
        zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, t->curve_sec, 40);
    }
    *mon = watch_socket(t, s);
    if (zmq_connect(s, endpoint) != 0) {
        snprintf(t->dealer_error, sizeof t->dealer_error, "%s", zmq_strerror(zmq_errno()));
        tlog(t, "cannot connect to %s: %s", endpoint, t->dealer_error);
        if (*mon) {
            zmq_socket_monitor(s, NULL, 0);
            zmq_close(*mon);
            *mon = NULL;
        }
        zmq_close(s);
        return NULL;
    }
    return s;
}

// On the I/O thread: asks for the I/O threads' time slice (io_slice.c) for this thread and
// ZeroMQ's, until ZeroMQ's has taken it too (it starts with the context's first socket).
// ZeroMQ's thread names itself after it starts, so a look that finds only this thread is
// repeated every 50 ms, 100 times at most (slice_retry_ms, on the I/O loop).
static void slice_io_threads(rt_transport *t) {
    int have = __atomic_load_n(&t->io_sliced, __ATOMIC_ACQUIRE);
    t->slice_retry_ms = 0;
    if (t->io_slice_us <= 0 ? have >= 0 : have >= 2) return;
    have = rt_io_threads_slice(t->io_slice_us);
    __atomic_store_n(&t->io_sliced, have, __ATOMIC_RELEASE);
    if (t->io_slice_us > 0 && have < 2 && ++t->slice_tries < 100) t->slice_retry_ms = base_now_ms() + 50;
}

// The index of endpoint's DEALER in t->dealers (connected on first use; dealers are never
// removed, so indices stay valid), or -1.
static int dealer_index(rt_transport *t, const char *endpoint) {
    for (int i = 0; i < t->n_dealers; i++)
        if (strcmp(t->dealers[i].endpoint, endpoint) == 0) return i;
    void *mon;
    void *s = new_dealer_socket(t, endpoint, &mon);
    if (!s) return -1;
    if (t->n_dealers == 0) slice_io_threads(t);   // a client's first socket started ZeroMQ's thread
    dealer *nd = realloc(t->dealers, (size_t)(t->n_dealers + 1) * sizeof *nd);
    if (!nd) abort();
    t->dealers = nd;
    bool local = strncmp(endpoint, "tcp://127.", 10) == 0 || strncmp(endpoint, "tcp://localhost:", 16) == 0 ||
                 strncmp(endpoint, "tcp://[::1]:", 12) == 0 || strncmp(endpoint, "ipc://", 6) == 0;
    t->dealers[t->n_dealers] = (dealer){.endpoint = strdup(endpoint), .sock = s, .local = local, .mon = mon};
    return t->n_dealers++;
}

// The shared-memory pool for frames to dealer di: made on first use, NULL when the peer is
// not on this host or shared memory is off.
static rt_shm_pool *shm_for(rt_transport *t, int di) {
    if (di < 0 || !t->dealers[di].local || t->shm_off) return NULL;
    if (!t->shm) {
        dg_status st = DG_STATUS_INIT;
        if (!(t->shm = rt_shm_pool_new(&st))) {
            t->shm_off = true;
            tlog(t, "no shared memory for local peers (frames go over TCP): %s", dg_status_message(&st));
        }
        status_impl_clear(&st);
    }
    return t->shm;
}

static void fail_call(rt_response_cb cb, void *arg, dg_code code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void fail_call(rt_response_cb cb, void *arg, dg_code code, const char *fmt, ...) {
    dg_status st = DG_STATUS_INIT;
    va_list ap;
    va_start(ap, fmt);
    dg_status_vsetf(&st, code, fmt, ap);
    va_end(ap);
    cb(arg, &st, NULL, NULL, 0);
    status_impl_clear(&st);
}

static void free_cmd(cmd *c) {
    for (int i = 0; i < c->n; i++) dg_tensor_unref(c->tensors[i]);
    free(c->tensors);
    free(c->header);
    free(c->endpoint);
    free(c->refused);
    rt_peer_free(c->peer);
    if (c->chunk_hdr) {
        rt_header_clear(c->chunk_hdr);
        free(c->chunk_hdr);
    }
    free(c);
}

// Removes the calls waiting on dealer di (only those sent while its peer's incarnation was inc,
// unless inc is 0), failing each with code and "<endpoint> <why>"; its liveness probe goes too
// when drop_probe.
static void fail_pending_code(rt_transport *t, int di, uint64_t inc, bool drop_probe, dg_code code,
                              const char *why) {
    for (pending **pp = &t->pending; *pp;) {
        pending *p = *pp;
        if (p->dealer == di && (p->probe ? drop_probe : !inc || p->peer_inc == inc)) {
            *pp = p->next;
            if (!p->probe) fail_call(p->cb, p->arg, code, "%s %s", p->endpoint, why);
            free(p->endpoint);
            free(p);
        } else {
            pp = &p->next;
        }
    }
}

static void fail_pending(rt_transport *t, int di, uint64_t inc, bool drop_probe, const char *why) {
    fail_pending_code(t, di, inc, drop_probe, DG_UNAVAILABLE, why);
}

static void dealer_unwatch(dealer *d) {
    if (!d->mon) return;
    if (d->sock) zmq_socket_monitor(d->sock, NULL, 0);
    zmq_close(d->mon);
    d->mon = NULL;
}

// The peer at dealer di refused the handshake: why, for the calls waiting on it.
static void handshake_refused(rt_transport *t, int di, const char *why) {
    dealer *d = &t->dealers[di];
    tlog(t, "%s %s", d->endpoint, why);
    fail_pending_code(t, di, 0, true, DG_UNAUTHENTICATED, why);
    d->probe_id = 0;
}

// Reads dealer di's handshake events. A ZMTP mechanism mismatch is a server that wants
// CurveZMQ keys this process does not use (or one without keys, when this process has them);
// a ZAP refusal (HANDSHAKE_FAILED_AUTH) a server that does not admit this process's key; and
// with CurveZMQ, connections closed three times in a row before the handshake ends are a server that
// could not read our hello: the server key this process holds for it is not its key.
static void on_dealer_monitor(rt_transport *t, int di) {
    char name[128], why[768];
    uint16_t event;
    uint32_t value;
    for (int k = 0; k < 256 && t->dealers[di].mon && monitor_event(t->dealers[di].mon, &event, &value, NULL, 0);
         k++) {
        dealer *d = &t->dealers[di];
        rt_key_name_of(d->endpoint, name, sizeof name);
        why[0] = 0;
        switch (event) {
        case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
            d->up = true;
            d->cut_short = 0;
            if (t->opts.on_endpoint_up) t->opts.on_endpoint_up(t->ctx, d->endpoint);
            break;
        case ZMQ_EVENT_DISCONNECTED:
            if (d->up && t->opts.on_endpoint_down) t->opts.on_endpoint_down(t->ctx, d->endpoint);
            if (!d->up && t->curve && ++d->cut_short >= 3)
                snprintf(why, sizeof why,
                         "closed the connection during the CurveZMQ handshake (%u times in a row): the server key "
                         "this process holds for it (%s.pub in its key directory, or DG_CURVE_PUBLIC_KEY) is "
                         "not that server's key; use the key directory of the server's cluster",
                         d->cut_short, name);
            d->up = false;
            break;
        case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
            if (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
                snprintf(why, sizeof why,
                         t->curve ? "refused the handshake: it runs without authentication (started with "
                                    "--no_auth?) and this process uses CurveZMQ keys"
                                  : "refused the handshake: it admits only holders of its cluster's CurveZMQ keys "
                                    "and this process has none; set DG_KEY_DIR to the cluster's key directory "
                                    "(with %s.pub, the server's public key, and client.key) or "
                                    "DG_CURVE_PUBLIC_KEY and DG_CURVE_SECRET_KEY",
                         name);
            else
                snprintf(why, sizeof why, "refused the handshake (ZeroMQ protocol error 0x%x)%s", (unsigned)value,
                         t->curve ? ": does it use other cluster keys?" : "");
            break;
        case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
            snprintf(why, sizeof why,
                     "refused this process's CurveZMQ key (status %u): the server admits only the public keys "
                     "in its key directory; use that directory's client.key, or add this process's public key "
                     "there and restart the server",
                     (unsigned)value);
            break;
        case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            if (t->curve)
                // (A server without keys, too, when it notices the mismatch first.)
                snprintf(why, sizeof why,
                         "refused the CurveZMQ handshake: the server key this process holds for it (%s.pub in "
                         "its key directory, or DG_CURVE_PUBLIC_KEY) is not that server's key (use the key "
                         "directory of the server's cluster), or the server runs without authentication",
                         name);
            break;
        default: break;
        }
        if (why[0]) handshake_refused(t, di, why);
    }
}

// Dealer di lost its connection for good: ZeroMQ does not reconnect after a failed handshake
// (e.g. a CurveZMQ server refusing our keys) or a protocol error, and a DEALER with no
// connection refuses to send. Calls waiting on it can get no answer: they fail now. A fresh
// socket takes its place, so later calls try again. Returns the new socket, or NULL.
static void *reconnect_dealer(rt_transport *t, int di) {
    dealer *d = &t->dealers[di];
    tlog(t, "lost the connection to %s (refused by the peer: a failed handshake?); connecting again", d->endpoint);
    fail_pending(t, di, 0, true, "refused the connection (handshake failed: does it use other cluster keys?)");
    d->probe_id = 0;
    d->reconnects++;
    dealer_unwatch(d);
    zmq_close(d->sock);
    d->sock = new_dealer_socket(t, d->endpoint, &d->mon);
    d->up = false;
    d->cut_short = 0;
    return d->sock;
}

// Sends on dealer di without blocking: on a socket that lost its connection, once more on a
// fresh one. Returns whether the message went.
static bool dealer_send(rt_transport *t, int di, const char *hdr, size_t hdr_len, dg_tensor *const *tensors,
                        int n, size_t slice_off, size_t slice_len) {
    rt_shm_pool *shm = NULL;   // made only for a message with a frame it could carry
    for (int i = 0; i < n; i++) {
        size_t len = slice_len ? slice_len : tensors[i]->nbytes;
        if (len >= RT_SHM_MIN_BYTES && len <= RT_SHM_SLOT_BYTES) {
            shm = shm_for(t, di);
            break;
        }
    }
    if (t->dealers[di].sock &&
        send_frames(t, t->dealers[di].sock, NULL, hdr, hdr_len, tensors, n, slice_off, slice_len, shm))
        return true;
    return reconnect_dealer(t, di) &&
           send_frames(t, t->dealers[di].sock, NULL, hdr, hdr_len, tensors, n, slice_off, slice_len, shm);
}

static void run_cmd(rt_transport *t, cmd *c) {
    if (c->kind == CMD_REPLY) {
        send_frames(t, t->router, c->peer, c->header, c->header_len, c->tensors, c->n, 0, 0, NULL);
    } else {
        int di = c->refused ? -1 : dealer_index(t, c->endpoint);
        if (c->refused) {
            fail_call(c->cb, c->arg, DG_INVALID_ARGUMENT, "%s", c->refused);
        } else if (di < 0) {
            if (c->kind == CMD_CALL)
                fail_call(c->cb, c->arg, DG_UNAVAILABLE, "cannot connect to %s: %s", c->endpoint, t->dealer_error);
        } else if (c->kind == CMD_CALL) {
            // Sent before it is pending: a failed send must not fail it twice. Its answer is
            // read on this thread, later.
            if (!dealer_send(t, di, c->header, c->header_len, c->tensors, c->n, 0, 0)) {
                fail_call(c->cb, c->arg, DG_UNAVAILABLE, "cannot send to %s: no connection", c->endpoint);
                free_cmd(c);
                return;
            }
            pending *p = calloc(1, sizeof *p);
            if (!p) abort();
            p->id = c->id;
            p->sent_at = base_now_ms();
            p->deadline = c->timeout_ms > 0 ? p->sent_at + c->timeout_ms : INT64_MAX;
            p->endpoint = strdup(c->endpoint);
            p->dealer = di;
            p->peer_inc = t->dealers[di].peer_inc;
            p->cb = c->cb;
            p->arg = c->arg;
            p->next = t->pending;
            t->pending = p;
        } else if (c->chunked) {
            // One large tensor in RT_CHUNK_BYTES pieces, each a message of its own, so the
            // receiver assembles while the rest is still on the wire.
            dg_tensor *tt = c->tensors[0];
            rt_header *h = c->chunk_hdr;
            h->type = RT_TENSOR_CHUNK;
            h->xfer = ++t->next_xfer;
            h->total = tt->nbytes;
            for (size_t off = 0; off < tt->nbytes; off += RT_CHUNK_BYTES) {
                size_t len = tt->nbytes - off < RT_CHUNK_BYTES ? tt->nbytes - off : RT_CHUNK_BYTES;
                h->offset = off;
                size_t hl;
                char *hb = rt_header_encode(h, &hl);
                bool sent = dealer_send(t, di, hb, hl, c->tensors, 1, off, len);
                free(hb);
                if (!sent) break;   // the receiver drops the partial tensor; the step times out
            }
        } else {
            dealer_send(t, di, c->header, c->header_len, c->tensors, c->n, 0, 0);
        }
    }
    free_cmd(c);
}

// Sends a run of single-tensor pushes to the same endpoint for the same step as one
// message (one header, one frame per tensor): a step's Sends to a task usually come
// together, and each message costs several system calls and thread wake-ups.
// Returns the first command after the run.
static cmd *coalesce(rt_transport *t, cmd *first) {
    int count = 0;
    size_t bytes = 0;
    cmd *c = first;
    while (c && c->small_push && strcmp(c->endpoint, first->endpoint) == 0 &&
           c->chunk_hdr->step_id == first->chunk_hdr->step_id && count < 256 &&
           (count == 0 || bytes + c->tensors[0]->nbytes <= RT_GROUP_BYTES)) {
        bytes += c->tensors[0]->nbytes;
        count++;
        c = c->next;
    }
    cmd *rest = c;
    int di = dealer_index(t, first->endpoint);
    rt_header h;
    rt_header_init(&h, RT_TENSOR);
    h.step_id = first->chunk_hdr->step_id;
    h.from = first->chunk_hdr->from;
    dg_tensor **ts = malloc((size_t)count * sizeof *ts);
    if (!ts) abort();
    int k = 0;
    for (c = first; c != rest; c = c->next) {
        rt_header_add_name(&h, c->chunk_hdr->key);
        rt_header_add_tensor(&h, c->tensors[0]);
        ts[k++] = c->tensors[0];
    }
    if (di >= 0) {
        size_t len;
        char *buf = rt_header_encode(&h, &len);
        dealer_send(t, di, buf, len, ts, count, 0, 0);
        free(buf);
    }
    h.from = NULL;   // borrowed from the first command
    rt_header_clear(&h);
    free(ts);
    for (c = first; c != rest;) {
        cmd *next = c->next;
        free_cmd(c);
        c = next;
    }
    return rest;
}

// I/O thread. Logged as a limit hit is (a line a second at most): a peer sending garbage
// must not fill the log.
static void bad_message(rt_transport *t, const char *from, const dg_status *st) {
    limit_hit(t, LIM_BAD, &t->stats.bad_messages, "dropped a bad message%s%s: %s", from ? " from " : "",
              from ? from : "", dg_status_message(st));
}

// Validates frames against the header's tensor descriptions and turns them into tensors.
static dg_tensor **frames_to_tensors(rt_transport *t, rt_header *h, zmq_msg_t **frames, int n_frames,
                                     bool local, dg_status *st) {
    if (n_frames != h->n_tensors) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s message: header describes %d tensors, %d frames follow",
                       rt_type_name(h->type), h->n_tensors, n_frames);
        close_frames(frames, 0, n_frames);
        return NULL;
    }
    dg_tensor **ts = calloc((size_t)n_frames + 1, sizeof *ts);
    if (!ts) abort();
    for (int i = 0; i < n_frames; i++) {
        ts[i] = frame_tensor(t, frames[i], &h->tensors[i], local, st);
        frames[i] = NULL;   // consumed: owned by the tensor, or copied and closed
        if (!ts[i]) {
            dg_status_prepend(st, "%s message: tensor %d", rt_type_name(h->type), i);
            for (int j = 0; j < i; j++) dg_tensor_unref(ts[j]);
            close_frames(frames, i + 1, n_frames);
            free(ts);
            return NULL;
        }
    }
    return ts;
}

#define HUGE_PAGE_BYTES ((size_t)2 << 20)

static size_t mapped_bytes(size_t n) { return (n + HUGE_PAGE_BYTES - 1) & ~(HUGE_PAGE_BYTES - 1); }

static void unmap_buffer(void *data, size_t n_bytes, void *arg) {
    (void)arg;
    munmap(data, mapped_bytes(n_bytes));
}

// The buffer a chunked tensor is assembled in (always over 4 MiB): mapped directly with
// transparent huge pages requested, because filling fresh 4 KiB pages cost one page fault each
// (16384 for 64 MiB), a third of the receiver's time.
static dg_tensor *assembly_tensor(const rt_tensor_desc *d, dg_status *st) {
    size_t len = mapped_bytes(d->nbytes);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "TENSOR_CHUNK: cannot map %zu bytes for a tensor", len);
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    madvise(p, len, MADV_HUGEPAGE);
#endif
    dg_tensor *t = dg_tensor_wrap(d->dtype, d->shape, p, d->nbytes, unmap_buffer, NULL, st);
    if (!t) munmap(p, len);
    return t;
}

// Counts a limit hit in *counter and logs it, at most once a second per kind (saying how
// many more there were since the last line). I/O thread.
static void limit_hit(rt_transport *t, int kind, uint64_t *counter, const char *fmt, ...) {
    __atomic_add_fetch(counter, 1, __ATOMIC_RELAXED);
    int64_t now = base_now_ms();
    // A limit's line once a second; bad messages, each of which has its own reason, up to 50.
    int burst = kind == LIM_BAD ? 50 : 1;
    if (t->limit_logged_ms[kind] && now - t->limit_logged_ms[kind] < 1000) {
        if (t->limit_lines[kind] >= burst) {
            t->limit_unlogged[kind]++;
            return;
        }
    } else {
        t->limit_logged_ms[kind] = now;   // a new window
        t->limit_lines[kind] = 0;
    }
    t->limit_lines[kind]++;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (t->limit_unlogged[kind])
        tlog(t, "%s (and %llu more like it since the last such line)", buf, (unsigned long long)t->limit_unlogged[kind]);
    else
        tlog(t, "%s", buf);
    t->limit_unlogged[kind] = 0;
}

void rt_transport_refused(rt_transport *t, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    limit_hit(t, LIM_REQUEST, &t->stats.requests_refused, "refused a request: %s", buf);
}

static void set_inflight(rt_transport *t, int64_t delta) {
    t->inflight += delta;
    __atomic_store_n(&t->stats.inflight_bytes, t->inflight, __ATOMIC_RELAXED);
}

// Unlinks *pp and frees it with its buffer.
static void free_assembly(rt_transport *t, assembly **pp) {
    assembly *a = *pp;
    *pp = a->next;
    set_inflight(t, -a->charged);
    dg_tensor_unref(a->t);
    free(a);
}

// The link pointing at the transfer of the peer with routing id (id, len), or NULL.
static assembly **find_assembly(rt_transport *t, const unsigned char *id, size_t len) {
    for (assembly **pp = &t->assemblies; *pp; pp = &(*pp)->next)
        if ((*pp)->id_len == len && memcmp((*pp)->id, id, len) == 0) return pp;
    return NULL;
}

static int64_t max_inflight(const rt_transport *t) {
    return t->opts.max_inflight_bytes > 0 ? t->opts.max_inflight_bytes : RT_DEFAULT_MAX_INFLIGHT_BYTES;
}

static int64_t transfer_timeout_ms(const rt_transport *t) {
    return t->opts.transfer_timeout_ms > 0 ? t->opts.transfer_timeout_ms : RT_DEFAULT_TRANSFER_TIMEOUT_MS;
}

// A chunk that breaks the rules: dropped with the peer's transfer, counted and logged.
static void refuse_chunk(rt_transport *t, const rt_peer *peer, rt_header *h, zmq_msg_t **frames, int n_frames,
                         void *slot, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static void refuse_chunk(rt_transport *t, const rt_peer *peer, rt_header *h, zmq_msg_t **frames, int n_frames,
                         void *slot, const char *fmt, ...) {
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    assembly **pp = find_assembly(t, peer->id, peer->len);
    if (pp) free_assembly(t, pp);
    __atomic_add_fetch(&t->stats.transfers_refused, 1, __ATOMIC_RELAXED);
    dg_status st = DG_STATUS_INIT;
    dg_status_setf(&st, DG_INVALID_ARGUMENT, "TENSOR_CHUNK: %s", why);
    bad_message(t, h->from, &st);
    status_impl_clear(&st);
    rt_shm_release(slot);
    close_frames(frames, 0, n_frames);
    rt_header_clear(h);
    free(h);
}

// Takes one chunk of a chunked transfer. The rules (docs/PROTOCOL.md): a transfer is one
// tensor of more than 4 chunks; its chunks come in order, each RT_CHUNK_BYTES but the last, on
// one connection; a peer has one transfer at a time (a chunk of a new one ends the old one).
// Memory is committed only as bytes arrive (the buffer is mapped, not touched), and counted
// against max_inflight_bytes in the pages the bytes touch.
static void take_chunk(rt_transport *t, const rt_peer *peer, rt_header *h, zmq_msg_t **frames,
                       int n_frames, bool local) {
    dg_status st = DG_STATUS_INIT;
    uint64_t total = h->total, off = h->offset;
    if (n_frames != 1 || h->n_tensors != 1 || h->tensors[0].nbytes != total) {
        refuse_chunk(t, peer, h, frames, n_frames, NULL, "frame and header disagree");
        return;
    }
    if (total <= 4 * RT_CHUNK_BYTES || total > t->opts.max_message_bytes || off >= total ||
        off % RT_CHUNK_BYTES != 0) {
        refuse_chunk(t, peer, h, frames, n_frames, NULL,
                     "offset %llu of %llu bytes (a transfer is %zu to %zu bytes in chunks of %zu)",
                     (unsigned long long)off, (unsigned long long)total, 4 * RT_CHUNK_BYTES + 1,
                     t->opts.max_message_bytes, RT_CHUNK_BYTES);
        return;
    }
    size_t want = total - off < RT_CHUNK_BYTES ? total - off : RT_CHUNK_BYTES;
    // A chunk's bytes come in the frame, or (from a peer on this host) in a shared-memory slot
    // the frame describes.
    const void *bytes = zmq_msg_data(frames[0]);
    size_t len = zmq_msg_size(frames[0]);
    void *slot = NULL;
    if (local && rt_shm_is_desc(bytes, len, want)) {
        void *data = NULL;
        if (!rt_shm_get(bytes, want, &data, &slot, &st)) {
            refuse_chunk(t, peer, h, frames, n_frames, NULL, "%s", dg_status_message(&st));
            status_impl_clear(&st);
            return;
        }
        bytes = data;
        len = want;
        __atomic_add_fetch(&t->stats.shm_frames_received, 1, __ATOMIC_RELAXED);
    }
    if (len != want) {
        refuse_chunk(t, peer, h, frames, n_frames, slot, "%zu bytes at offset %llu, expected %zu", len,
                     (unsigned long long)off, want);
        return;
    }
    assembly **pp = find_assembly(t, peer->id, peer->len);
    if (pp && (*pp)->xfer != h->xfer) {
        limit_hit(t, LIM_ABANDONED, &t->stats.transfers_abandoned,
                  "dropped transfer %llu%s%s at %llu of %zu bytes: the peer began another",
                  (unsigned long long)(*pp)->xfer, h->from ? " from " : "", h->from ? h->from : "",
                  (unsigned long long)(*pp)->received, (*pp)->t->nbytes);
        free_assembly(t, pp);
        pp = NULL;
    }
    assembly *a = pp ? *pp : NULL;
    if (a && (a->t->nbytes != total || a->t->dtype != h->tensors[0].dtype ||
              !dg_shape_equal(&a->t->shape, &h->tensors[0].shape))) {
        refuse_chunk(t, peer, h, frames, n_frames, slot, "transfer %llu changed its tensor from %zu to %llu bytes",
                     (unsigned long long)h->xfer, a->t->nbytes, (unsigned long long)total);
        return;
    }
    uint64_t expect = a ? a->received : 0;
    if (off != expect) {
        refuse_chunk(t, peer, h, frames, n_frames, slot, "transfer %llu: chunk at offset %llu, expected %llu%s",
                     (unsigned long long)h->xfer, (unsigned long long)off, (unsigned long long)expect,
                     a ? "" : " (no such transfer: it ended or expired)");
        return;
    }
    // Pages touched once these bytes are in (huge pages: see assembly_tensor).
    int64_t charge = (int64_t)mapped_bytes(off + len);
    if (charge > (int64_t)mapped_bytes(total)) charge = (int64_t)mapped_bytes(total);
    int64_t more = charge - (a ? a->charged : 0);
    if (t->inflight + more > max_inflight(t)) {
        refuse_chunk(t, peer, h, frames, n_frames, slot,
                     "transfers in flight would hold %lld bytes, over the limit of %lld (max_inflight_bytes)",
                     (long long)(t->inflight + more), (long long)max_inflight(t));
        return;
    }
    if (!a) {
        a = calloc(1, sizeof *a);
        if (!a) abort();
        memcpy(a->id, peer->id, peer->len);
        a->id_len = peer->len;
        a->xfer = h->xfer;
        a->t = assembly_tensor(&h->tensors[0], &st);
        if (!a->t) {
            free(a);
            refuse_chunk(t, peer, h, frames, n_frames, slot, "%s", dg_status_message(&st));
            status_impl_clear(&st);
            return;
        }
        a->next = t->assemblies;
        t->assemblies = a;
        pp = &t->assemblies;
    }
    memcpy((char *)a->t->data + off, bytes, len);
    rt_shm_release(slot);
    close_frames(frames, 0, n_frames);
    a->received += len;
    a->last_ms = base_now_ms();
    set_inflight(t, more);
    a->charged = charge;
    if (a->received < total) {
        rt_header_clear(h);
        free(h);
        return;
    }
    // Complete: delivered as one TENSOR message.
    h->type = RT_TENSOR;
    dg_tensor **ts = malloc(sizeof *ts);
    if (!ts) abort();
    ts[0] = dg_tensor_ref(a->t);
    free_assembly(t, pp);
    rt_peer *pc = malloc(sizeof *pc);
    if (!pc) abort();
    *pc = *peer;
    t->handler(t->ctx, pc, h, ts, 1);
}

// Drops transfers that have waited too long for their next chunk. I/O thread.
static void expire_transfers(rt_transport *t, int64_t now) {
    for (assembly **pp = &t->assemblies; *pp;) {
        assembly *a = *pp;
        if (now - a->last_ms < transfer_timeout_ms(t)) {
            pp = &a->next;
            continue;
        }
        limit_hit(t, LIM_EXPIRED, &t->stats.transfers_expired,
                  "dropped transfer %llu at %llu of %zu bytes: no chunk for %lld ms (transfer_timeout_ms)",
                  (unsigned long long)a->xfer, (unsigned long long)a->received, a->t->nbytes,
                  (long long)(now - a->last_ms));
        free_assembly(t, pp);
    }
}

// ---- connections (bound transports) ----
// The ROUTER's connections are known from its monitor's events (accepted, disconnected, by
// descriptor) and from the descriptor each message arrives on (ZMQ_SRCFD), which also tells
// the routing id of the peer on it.

static conn *conn_of(rt_transport *t, int fd) {
    return fd >= 0 && fd < t->cap_conns && t->conns[fd].open ? &t->conns[fd] : NULL;
}

static void count_conns(rt_transport *t) {
    __atomic_store_n(&t->stats.connections, (int64_t)t->n_conns, __ATOMIC_RELAXED);
}

static void conn_opened(rt_transport *t, int fd) {
    if (fd < 0) return;
    if (fd >= t->cap_conns) {
        int cap = t->cap_conns ? t->cap_conns : 64;
        while (cap <= fd) cap *= 2;
        conn *nc = realloc(t->conns, (size_t)cap * sizeof *nc);
        if (!nc) abort();
        memset(nc + t->cap_conns, 0, (size_t)(cap - t->cap_conns) * sizeof *nc);
        t->conns = nc;
        t->cap_conns = cap;
    }
    conn *c = &t->conns[fd];
    if (!c->open) t->n_conns++;
    else if (c->closing) t->n_closing--;   // its close went unseen: the number was reused
    *c = (conn){.open = true, .local = -1, .last_ms = base_now_ms()};
    count_conns(t);
}

// The connection on fd is gone: so is the transfer its peer was sending.
static void conn_closed(rt_transport *t, int fd) {
    conn *c = conn_of(t, fd);
    if (!c) return;
    if (c->id_len) {
        assembly **pp = find_assembly(t, c->id, c->id_len);
        if (pp) {
            limit_hit(t, LIM_ABANDONED, &t->stats.transfers_abandoned,
                      "dropped transfer %llu at %llu of %zu bytes: the peer sending it left",
                      (unsigned long long)(*pp)->xfer, (unsigned long long)(*pp)->received, (*pp)->t->nbytes);
            free_assembly(t, pp);
        }
    }
    if (c->id_len && t->opts.on_peer_gone) {
        rt_peer gone;
        gone.len = c->id_len;
        memcpy(gone.id, c->id, c->id_len);
        t->opts.on_peer_gone(t->ctx, &gone);
    }
    if (c->closing) t->n_closing--;
    c->open = false;
    t->n_conns--;
    count_conns(t);
    t->trim_at_ms = base_now_ms() + 1000;
    rt_shm_sweep();   // the regions of a peer that has exited, if nothing holds them
}

// What a peer that left made this process allocate (its messages, queued and taken) is free
// but may stay in malloc's arenas: give it back to the system a second after the last peer
// left (ZeroMQ frees a connection's buffers on its own thread, after the event).
//
// malloc_trim returns the free memory inside every arena but not the free top of an arena
// other than the main one, and ZeroMQ's I/O thread, which allocates every received frame,
// has an arena of its own. Such a top shrinks only when a large block of that arena is freed
// while the top is over M_TRIM_THRESHOLD, which a server raises (dg_set_malloc_tuning) so that
// steps do not give pages back and fault them in again. So,
// with the threshold lowered for the moment, the transport frees a block of that arena: a
// 64 KiB frame it sends itself over a pair of sockets of its own context (an abstract-namespace
// IPC endpoint), which ZeroMQ's I/O thread receives into its arena. This thread's own arena
// (headers, copied frames) is trimmed the same way with a block of its own.
static zmq_msg_t *arena_block(rt_transport *t) {
    if (!t->self_rx && !t->self_failed) {
        char ep[96];
        snprintf(ep, sizeof ep, "ipc://@distgraph-arena-%d-%p", (int)getpid(), (void *)t);
        t->self_rx = zmq_socket(t->zctx, ZMQ_PAIR);
        t->self_tx = zmq_socket(t->zctx, ZMQ_PAIR);
        int zero = 0;
        int64_t max = 128 << 10;
        bool ok = t->self_rx && t->self_tx;
        if (ok) {
            zmq_setsockopt(t->self_rx, ZMQ_LINGER, &zero, sizeof zero);
            zmq_setsockopt(t->self_tx, ZMQ_LINGER, &zero, sizeof zero);
            zmq_setsockopt(t->self_rx, ZMQ_MAXMSGSIZE, &max, sizeof max);
            ok = zmq_bind(t->self_rx, ep) == 0 && zmq_connect(t->self_tx, ep) == 0;
        }
        if (!ok) {
            if (t->self_rx) zmq_close(t->self_rx);
            if (t->self_tx) zmq_close(t->self_tx);
            t->self_rx = t->self_tx = NULL;
            t->self_failed = true;   // trims still run, without this arena
        }
    }
    if (!t->self_rx) return NULL;
    zmq_msg_t m;
    if (zmq_msg_init_size(&m, 64 << 10) != 0) return NULL;
    memset(zmq_msg_data(&m), 0, 64 << 10);
    if (zmq_msg_send(&m, t->self_tx, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m);
        return NULL;
    }
    zmq_pollitem_t pi = {t->self_rx, 0, ZMQ_POLLIN, 0};
    zmq_msg_t *r = malloc(sizeof *r);
    if (!r) abort();
    zmq_msg_init(r);
    if (zmq_poll(&pi, 1, 200) == 1 && zmq_msg_recv(r, t->self_rx, ZMQ_DONTWAIT) >= 0) return r;
    zmq_msg_close(r);
    free(r);
    return NULL;
}

static void trim_if_due(rt_transport *t, int64_t now) {
    if (!t->trim_at_ms || now < t->trim_at_ms) return;
    if (t->opts.trim_threshold) {
        zmq_msg_t *block = arena_block(t);
        mallopt(M_TRIM_THRESHOLD, 128 << 10);
        if (block) {
            zmq_msg_close(block);
            free(block);
        }
        void *volatile own = malloc(256 << 10);   // the same for this thread's own arena
        free(own);
    }
    malloc_trim(0);
    if (t->opts.trim_threshold) mallopt(M_TRIM_THRESHOLD, (int)t->opts.trim_threshold);
    t->trim_at_ms = 0;
}

// Whether fd is a TCP socket on the port we listen on (an accepted connection, not a socket
// of our own to another task that has taken over a number whose close we have not seen yet).
static bool accepted_here(const rt_transport *t, int fd) {
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &len) != 0) return false;
    int port = a.ss_family == AF_INET    ? ntohs(((struct sockaddr_in *)&a)->sin_port)
               : a.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&a)->sin6_port)
                                         : -1;
    return port == t->bound_port;
}

// Closes the connection idle longest (ZeroMQ sees the shutdown and cleans up after it).
// Returns false when there is none to close.
static bool close_idlest(rt_transport *t, const char *why) {
    for (;;) {
        int best = -1;
        for (int fd = 0; fd < t->cap_conns; fd++) {
            const conn *c = &t->conns[fd];
            if (c->open && !c->closing && (best < 0 || c->last_ms < t->conns[best].last_ms)) best = fd;
        }
        if (best < 0) return false;
        conn *c = &t->conns[best];
        if (!accepted_here(t, best) || shutdown(best, SHUT_RDWR) != 0) {
            conn_closed(t, best);   // not ours any more: its close went unseen
            continue;
        }
        c->closing = true;
        t->n_closing++;
        limit_hit(t, LIM_CONN, &t->stats.connections_closed,
                  "closed a connection idle for %lld ms%s: %s", (long long)(base_now_ms() - c->last_ms),
                  c->id_len ? "" : " (it never sent a message)", why);
        return true;
    }
}

static void on_monitor(rt_transport *t) {
    char why[128], addr[256];
    uint16_t event;
    uint32_t value;
    for (int k = 0; k < 4096 && monitor_event(t->monitor, &event, &value, addr, sizeof addr); k++) {
        switch (event) {
        case ZMQ_EVENT_ACCEPTED: {
            conn *c = conn_of(t, (int)value);
            if (c && c->stale_accepts > 0) c->stale_accepts--;   // seen already (conn_heard)
            else conn_opened(t, (int)value);
            break;
        }
        case ZMQ_EVENT_DISCONNECTED:
        case ZMQ_EVENT_CLOSED: {
            conn *c = conn_of(t, (int)value);
            if (c && c->stale_closes > 0) c->stale_closes--;   // an earlier connection's
            else conn_closed(t, (int)value);
            break;
        }
        case ZMQ_EVENT_ACCEPT_FAILED:
            limit_hit(t, LIM_ACCEPT, &t->stats.accept_failures, "accepting a connection failed: %s",
                      strerror((int)value));
            // Out of descriptors: ZeroMQ tries again at once, and will until one is free.
            if ((value == EMFILE || value == ENFILE) && t->n_closing == 0)
                close_idlest(t, "out of file descriptors");
            break;
        case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
        case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            __atomic_add_fetch(&t->stats.refused_peers, 1, __ATOMIC_RELAXED);
            // The event names our own endpoint, not the peer's address.
            tlog(t, "refused a peer connecting to %s: handshake failed (%s)", addr,
                 t->opts.keys ? "it does not know this task's key" : "it does not hold the cluster key");
            break;
        default: break;
        }
    }
    snprintf(why, sizeof why, "over %d connections (max_connections)", t->max_conns);
    while (t->n_conns - t->n_closing > t->max_conns && close_idlest(t, why)) {}
}

// Whether the peer on fd is on this host (a loopback address, or a Unix socket).
static bool peer_on_this_host(int fd) {
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    if (fd < 0 || getpeername(fd, (struct sockaddr *)&a, &len) != 0) return false;
    if (a.ss_family == AF_UNIX) return true;
    if (a.ss_family == AF_INET) return (ntohl(((struct sockaddr_in *)&a)->sin_addr.s_addr) >> 24) == 127;
    if (a.ss_family == AF_INET6) {
        const struct in6_addr *v6 = &((struct sockaddr_in6 *)&a)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(v6) || (IN6_IS_ADDR_V4MAPPED(v6) && v6->s6_addr[12] == 127);
    }
    return false;
}

// A message came on descriptor fd from the peer with routing id (id, len). Returns whether
// that peer is on this host (its shared-memory descriptors are read; nobody else's are).
static bool conn_heard(rt_transport *t, int fd, const rt_peer *peer) {
    conn *c = conn_of(t, fd);
    if (!c) return peer_on_this_host(fd);   // its accept event is still on its way
    if (c->id_len && (c->id_len != peer->len || memcmp(c->id, peer->id, peer->len) != 0)) {
        // Another routing id on this descriptor: the connection we knew on it has left and a
        // new one took its number, and the monitor's events saying so (DISCONNECTED, then
        // ACCEPTED) come after this message. Close the old one now, so that its late
        // DISCONNECTED does not end the new peer's transfer, and skip both events.
        int closes = c->stale_closes + 1, accepts = c->stale_accepts + 1;
        conn_closed(t, fd);
        conn_opened(t, fd);
        c = conn_of(t, fd);
        c->stale_closes = closes;
        c->stale_accepts = accepts;
    }
    c->last_ms = base_now_ms();
    if (c->id_len != peer->len || memcmp(c->id, peer->id, peer->len) != 0) {
        memcpy(c->id, peer->id, peer->len);
        c->id_len = peer->len;
    }
    if (c->local < 0) c->local = peer_on_this_host(fd);
    return c->local;
}

static void on_router(rt_transport *t) {
    zmq_msg_t **frames = t->frames;
    int n = recv_multipart(t->router, frames);
    dg_status st = DG_STATUS_INIT;
    if (n < 0) {
        dg_status_set(&st, DG_INVALID_ARGUMENT, "too many frames");
        bad_message(t, NULL, &st);
    } else if (n < 2 || zmq_msg_size(frames[0]) > sizeof(((rt_peer *)0)->id)) {
        dg_status_set(&st, DG_INVALID_ARGUMENT, "no header frame");
        bad_message(t, NULL, &st);
        close_frames(frames, 0, n);
    } else {
        rt_peer peer;
        peer.len = zmq_msg_size(frames[0]);
        memcpy(peer.id, zmq_msg_data(frames[0]), peer.len);
        bool local = conn_heard(t, zmq_msg_get(frames[1], ZMQ_SRCFD), &peer);
        rt_header *h = malloc(sizeof *h);
        if (!h) abort();
        if (!rt_header_decode(zmq_msg_data(frames[1]), zmq_msg_size(frames[1]), h, &st)) {
            bad_message(t, NULL, &st);
            free(h);
            close_frames(frames, 0, n);
            // A reply is possible only when we can trust nothing: answer with id 0.
            rt_peer *p = malloc(sizeof *p);
            if (!p) abort();
            *p = peer;
            rt_reply_error(t, p, 0, &st);
        } else if (h->type == RT_TENSOR_CHUNK) {
            close_frames(frames, 0, 2);
            take_chunk(t, &peer, h, frames + 2, n - 2, local);
        } else {
            close_frames(frames, 0, 2);
            dg_tensor **ts = frames_to_tensors(t, h, frames + 2, n - 2, local, &st);
            if (!ts) {
                bad_message(t, h->from, &st);
                rt_peer *p = malloc(sizeof *p);
                if (!p) abort();
                *p = peer;
                if (h->type != RT_TENSOR) rt_reply_error(t, p, h->id, &st);
                else rt_peer_free(p);
                rt_header_clear(h);
                free(h);
            } else {
                rt_peer *p = malloc(sizeof *p);
                if (!p) abort();
                *p = peer;
                int nt = h->n_tensors;
                t->handler(t->ctx, p, h, ts, nt);
            }
        }
    }
    status_impl_clear(&st);
}

static void probe_answered(rt_transport *t, pending *p);
static void peer_incarnation(rt_transport *t, void *sock, uint64_t inc);

static void on_dealer(rt_transport *t, void *sock) {
    zmq_msg_t **frames = t->frames;
    int n = recv_multipart(sock, frames);
    dg_status st = DG_STATUS_INIT;
    rt_header *h = NULL;
    if (n < 1) {
        dg_status_set(&st, DG_INVALID_ARGUMENT, "empty or oversized response");
        bad_message(t, NULL, &st);
        goto out;
    }
    h = malloc(sizeof *h);
    if (!h) abort();
    if (!rt_header_decode(zmq_msg_data(frames[0]), zmq_msg_size(frames[0]), h, &st)) {
        bad_message(t, NULL, &st);
        free(h);
        h = NULL;
        close_frames(frames, 0, n);
        goto out;
    }
    close_frames(frames, 0, 1);
    if (h->incarnation) peer_incarnation(t, sock, h->incarnation);
    pending *p = NULL;
    for (pending **pp = &t->pending; *pp; pp = &(*pp)->next)
        if ((*pp)->id == h->id) {
            p = *pp;
            *pp = p->next;
            break;
        }
    if (!p || p->probe) {   // late or unknown (e.g. after its deadline): drop
        if (p) probe_answered(t, p);
        close_frames(frames, 1, n);
        rt_header_clear(h);
        free(h);
        goto out;
    }
    dg_tensor **ts = h->type == RT_RESPONSE
                         ? frames_to_tensors(t, h, frames + 1, n - 1, t->dealers[p->dealer].local, &st)
                         : NULL;
    if (h->type != RT_RESPONSE && dg_status_ok(&st))
        dg_status_setf(&st, DG_INVALID_ARGUMENT, "expected a RESPONSE, got %s", rt_type_name(h->type));
    if (!ts) {
        close_frames(frames, 1, n);
        bad_message(t, p->endpoint, &st);
        p->cb(p->arg, &st, NULL, NULL, 0);
        rt_header_clear(h);
        free(h);
    } else {
        p->cb(p->arg, &st, h, ts, h->n_tensors);
    }
    free(p->endpoint);
    free(p);
out:
    status_impl_clear(&st);
}

// ---- liveness probes ----
#define PROBE_AFTER_MS 1000      // a call unanswered this long makes its endpoint probed
#define PROBE_EVERY_MS 1000      // at most one probe per endpoint this often


static int64_t liveness_ms(const rt_transport *t) {
    return t->opts.liveness_timeout_ms == 0 ? 5000 : t->opts.liveness_timeout_ms;
}

// A probe's answer: the endpoint is alive; the next probe waits a while.
static void probe_answered(rt_transport *t, pending *p) {
    dealer *d = &t->dealers[p->dealer];
    if (d->probe_id == p->id) {
        d->probe_id = 0;
        d->next_probe_at = base_now_ms() + PROBE_EVERY_MS;
    }
    free(p->endpoint);
    free(p);
}

// Sends a PING to d on its own socket and waits for it like a call.
// Returns false when the probe could not go and the pending list changed (reconnect_dealer).
static bool send_probe(rt_transport *t, dealer *d, int64_t now) {
    rt_header h;
    rt_header_init(&h, RT_PING);
    pthread_mutex_lock(&t->mu);
    uint64_t id = h.id = ++t->next_id;
    pthread_mutex_unlock(&t->mu);
    size_t len;
    char *buf = rt_header_encode(&h, &len);
    rt_header_clear(&h);
    if (!buf) abort();
    int di = (int)(d - t->dealers);
    bool sent = dealer_send(t, di, buf, len, NULL, 0, 0, 0);
    free(buf);
    if (!sent) return false;
    pending *p = calloc(1, sizeof *p);
    if (!p) abort();
    p->id = id;
    p->probe = true;
    p->sent_at = now;
    p->deadline = now + liveness_ms(t);
    p->endpoint = strdup(d->endpoint);
    p->dealer = di;
    p->next = t->pending;
    t->pending = p;
    d->probe_id = p->id;
    return true;
}

// Fails every call waiting on dealer di: its probe went unanswered.
static void fail_endpoint(rt_transport *t, int di) {
    char why[128];
    snprintf(why, sizeof why, "stopped answering: no reply to a liveness probe within %lld ms",
             (long long)liveness_ms(t));
    fail_pending(t, di, 0, false, why);
}

// A response from the process at sock's endpoint carried incarnation inc. A new one means the
// task restarted: calls sent to the old process will never be answered, fail them now.
static void peer_incarnation(rt_transport *t, void *sock, uint64_t inc) {
    int di = -1;
    for (int i = 0; i < t->n_dealers && di < 0; i++)
        if (t->dealers[i].sock == sock) di = i;
    if (di < 0 || t->dealers[di].peer_inc == inc) return;
    dealer *d = &t->dealers[di];
    uint64_t old = d->peer_inc;
    d->peer_inc = inc;
    if (!old) return;
    tlog(t, "%s restarted (a new process answers there): failing the calls sent to the old one", d->endpoint);
    fail_pending(t, di, old, false, "restarted: the process this call went to is gone (a new one answers there)");
}

static void expire(rt_transport *t) {
    int64_t now = base_now_ms();
    if (t->assemblies) expire_transfers(t, now);
    trim_if_due(t, now);
    for (pending **pp = &t->pending; *pp;) {
        pending *p = *pp;
        if (p->deadline <= now) {
            *pp = p->next;
            if (p->probe) {
                dealer *d = &t->dealers[p->dealer];
                if (d->probe_id == p->id) d->probe_id = 0;
                tlog(t, "%s did not answer a liveness probe within %lld ms: failing the calls waiting on it",
                     p->endpoint, (long long)liveness_ms(t));
                int di = p->dealer;
                free(p->endpoint);
                free(p);
                fail_endpoint(t, di);
                pp = &t->pending;   // the list changed
                continue;
            }
            fail_call(p->cb, p->arg, DG_UNAVAILABLE, "%s did not answer within the deadline", p->endpoint);
            free(p->endpoint);
            free(p);
        } else {
            pp = &p->next;
        }
    }
    if (t->opts.liveness_timeout_ms < 0) return;
    // Probe the endpoints of calls that have waited long.
    for (pending *p = t->pending; p;) {
        dealer *d = &t->dealers[p->dealer];
        if (!p->probe && now - p->sent_at >= PROBE_AFTER_MS && !d->probe_id && now >= d->next_probe_at) {
            unsigned reconnects = d->reconnects;
            // A probe that found the connection lost (a refused handshake) made a new socket
            // and failed the calls of the old one, p among them: the list changed.
            if (!send_probe(t, d, now) || d->reconnects != reconnects) {
                p = t->pending;
                continue;
            }
        }
        p = p->next;
    }
}

// When the I/O thread must next look at its pending calls (deadlines and probes): ms from now,
// -1 for never.
static long next_wakeup(rt_transport *t) {
    if (!t->pending && !t->assemblies && !t->trim_at_ms && !t->slice_retry_ms) return -1;
    int64_t soonest = t->trim_at_ms ? t->trim_at_ms : INT64_MAX, now = base_now_ms();
    if (t->slice_retry_ms && t->slice_retry_ms < soonest) soonest = t->slice_retry_ms;
    for (const assembly *a = t->assemblies; a; a = a->next)
        if (a->last_ms + transfer_timeout_ms(t) < soonest) soonest = a->last_ms + transfer_timeout_ms(t);
    for (pending *p = t->pending; p; p = p->next) {
        if (p->deadline < soonest) soonest = p->deadline;
        if (!p->probe && t->opts.liveness_timeout_ms >= 0) {
            int64_t at = p->sent_at + PROBE_AFTER_MS;
            const dealer *d = &t->dealers[p->dealer];
            if (d->probe_id) continue;   // its probe's deadline is in the list
            if (d->next_probe_at > at) at = d->next_probe_at;
            if (at < soonest) soonest = at;
        }
    }
    return soonest == INT64_MAX ? -1 : (long)(soonest > now ? soonest - now : 0);
}

// The environment's name, when set, into *v: an integer of microseconds in [lo, hi]; anything
// else is INVALID_ARGUMENT naming the variable and its value (what: the range in words).
static bool env_us(const char *name, long long lo, long long hi, const char *what, int64_t *v, dg_status *st) {
    const char *s = getenv(name);
    if (!s || !*s) return true;
    char *end;
    long long x = strtoll(s, &end, 10);
    if (*end || x < lo || x > hi) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "transport: %s=\"%s\" is not a number of microseconds %s", name, s,
                       what);
        return false;
    }
    *v = x;
    return true;
}

// Whether a thread of this process may poll busily: fewer kernels compute in it than it has
// CPUs.
static bool may_spin(const rt_transport *t) { return exec_threads_computing() < t->n_cpus; }

static void *io_main(void *arg) {
    rt_transport *t = arg;
    slice_io_threads(t);
    zmq_pollitem_t *items = NULL;
    int cap = 0;
    for (;;) {
        int nd = t->n_dealers, n = 3 + 2 * nd;   // the dealers, then their monitors
        if (n > cap) {
            cap = n * 2;
            items = realloc(items, (size_t)cap * sizeof *items);
            if (!items) abort();
        }
        items[0] = (zmq_pollitem_t){NULL, t->efd, ZMQ_POLLIN, 0};
        items[1] = (zmq_pollitem_t){t->router, 0, t->router ? ZMQ_POLLIN : 0, 0};
        items[2] = (zmq_pollitem_t){t->monitor, 0, t->monitor ? ZMQ_POLLIN : 0, 0};
        for (int i = 0; i < nd; i++) {
            items[3 + i] = (zmq_pollitem_t){t->dealers[i].sock, 0, t->dealers[i].sock ? ZMQ_POLLIN : 0, 0};
            items[3 + nd + i] = (zmq_pollitem_t){t->dealers[i].mon, 0, t->dealers[i].mon ? ZMQ_POLLIN : 0, 0};
        }
        // Busy polling: for busy_poll_ns after the last event, look again (giving the CPU to
        // anyone else runnable in between) instead of sleeping; waking a sleeping thread costs
        // tens of microseconds on many virtual machines, a round trip pays it several times.
        // Not while this process's kernels hold every CPU it may use: the spin would take
        // their time, and the kernel's scheduler, charging this thread for it, would then let
        // it wait for the CPU on its next wake-up (milliseconds on Linux's EEVDF) when a
        // message arrives or must go out: a pipeline stage's activations, a gradient.
        int rc = zmq_poll(items, n, 0);
        if (rc == 0 && t->busy_poll_ns && may_spin(t)) {
            int64_t until = t->last_active_ns + t->busy_poll_ns;
            while (rc == 0 && base_now_ns() < until && may_spin(t)) {
                sched_yield();
                rc = zmq_poll(items, n, 0);
            }
        }
        if (rc == 0) rc = zmq_poll(items, n, next_wakeup(t));
        if (rc < 0 && zmq_errno() == ETERM) break;
        if (rc > 0 && t->busy_poll_ns) t->last_active_ns = base_now_ns();
        if (t->slice_retry_ms && base_now_ms() >= t->slice_retry_ms) slice_io_threads(t);
        if (items[0].revents & ZMQ_POLLIN) {
            uint64_t v;
            if (read(t->efd, &v, sizeof v) < 0) { /* spurious */ }
        }
        pthread_mutex_lock(&t->mu);
        cmd *list = t->head;
        t->head = t->tail = NULL;
        bool stop = t->stop;
        pthread_mutex_unlock(&t->mu);
        while (list) {
            cmd *next = list->next;
            if (list->small_push) next = coalesce(t, list);
            else run_cmd(t, list);
            list = next;
        }
        if (stop) break;
        if (t->router && (items[1].revents & ZMQ_POLLIN))
            for (int k = 0; k < 64; k++) {
                int ev = 0;
                size_t sz = sizeof ev;
                zmq_getsockopt(t->router, ZMQ_EVENTS, &ev, &sz);
                if (!(ev & ZMQ_POLLIN)) break;
                on_router(t);
            }
        if (t->monitor && (items[2].revents & ZMQ_POLLIN)) on_monitor(t);
        // (Commands above may have added dealers, or replaced a socket: only the nd polled,
        // and only where the socket polled is still theirs.)
        for (int i = 0; i < nd; i++)
            if ((items[3 + nd + i].revents & ZMQ_POLLIN) && t->dealers[i].mon == items[3 + nd + i].socket)
                on_dealer_monitor(t, i);
        for (int i = 0; i < nd; i++)
            if ((items[3 + i].revents & ZMQ_POLLIN) && t->dealers[i].sock == items[3 + i].socket)
                for (int k = 0; k < 64; k++) {
                    int ev = 0;
                    size_t sz = sizeof ev;
                    zmq_getsockopt(t->dealers[i].sock, ZMQ_EVENTS, &ev, &sz);
                    if (!(ev & ZMQ_POLLIN)) break;
                    on_dealer(t, t->dealers[i].sock);
                }
        expire(t);
    }
    // Fail whatever is still waiting.
    while (t->pending) {
        pending *p = t->pending;
        t->pending = p->next;
        if (!p->probe) fail_call(p->cb, p->arg, DG_CANCELLED, "the transport was shut down");
        free(p->endpoint);
        free(p);
    }
    free(items);
    return NULL;
}

// ZAP (ZeroMQ authentication): accept CURVE clients holding the cluster's public key.
static void *zap_main(void *arg) {
    rt_transport *t = arg;
    for (;;) {
        zmq_msg_t parts[7];
        int n = 0;
        bool more = true;
        while (more && n < 7) {
            zmq_msg_init(&parts[n]);
            if (zmq_msg_recv(&parts[n], t->zap, 0) < 0) {
                for (int i = 0; i <= n; i++) zmq_msg_close(&parts[i]);
                return NULL;
            }
            more = zmq_msg_more(&parts[n]);
            n++;
        }
        while (more) {   // drain unexpected extra frames
            zmq_msg_t x;
            zmq_msg_init(&x);
            if (zmq_msg_recv(&x, t->zap, 0) < 0) {
                zmq_msg_close(&x);
                break;
            }
            more = zmq_msg_more(&x);
            zmq_msg_close(&x);
        }
        bool ok = false;
        if (n == 7 && zmq_msg_size(&parts[5]) == 5 && memcmp(zmq_msg_data(&parts[5]), "CURVE", 5) == 0 &&
            zmq_msg_size(&parts[6]) == 32) {
            uint8_t want[32];
            if (t->opts.keys) ok = rt_keyring_allows(t->opts.keys, zmq_msg_data(&parts[6]));
            else if (zmq_z85_decode(want, t->curve_pub)) ok = memcmp(want, zmq_msg_data(&parts[6]), 32) == 0;
        }
        if (!ok) {
            __atomic_add_fetch(&t->stats.refused_peers, 1, __ATOMIC_RELAXED);
            tlog(t, "refused a peer at %.*s: %s", n > 3 ? (int)zmq_msg_size(&parts[3]) : 0,
                 n > 3 ? (const char *)zmq_msg_data(&parts[3]) : "",
                 t->opts.keys ? "its key is not in the key directory" : "it does not hold the cluster key");
        }
        const char *version = "1.0";
        zmq_send(t->zap, version, 3, ZMQ_SNDMORE);
        if (n > 1) zmq_send(t->zap, zmq_msg_data(&parts[1]), zmq_msg_size(&parts[1]), ZMQ_SNDMORE);
        else zmq_send(t->zap, "", 0, ZMQ_SNDMORE);
        zmq_send(t->zap, ok ? "200" : "400", 3, ZMQ_SNDMORE);
        zmq_send(t->zap, ok ? "OK" : "not a cluster member", ok ? 2 : 20, ZMQ_SNDMORE);
        zmq_send(t->zap, "", 0, ZMQ_SNDMORE);
        zmq_send(t->zap, "", 0, 0);
        for (int i = 0; i < n; i++) zmq_msg_close(&parts[i]);
    }
}

// The connection cap: asked (or the default), within what the descriptor limit leaves after
// the process's other descriptors (sockets to other tasks, files; a reserve of 64 and an
// eighth). A bound transport first raises the soft descriptor limit to the hard one (at most
// 1 << 20): a server with many clients needs them, and the soft limit is often 1024.
static int connection_cap(int asked) {
    int cap = asked > 0 ? asked : RT_DEFAULT_MAX_CONNECTIONS;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return cap;
    rlim_t want = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > ((rlim_t)1 << 20) ? (rlim_t)1 << 20 : rl.rlim_max;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
        struct rlimit raised = {want, rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &raised) == 0) rl.rlim_cur = want;
    }
    if (rl.rlim_cur == RLIM_INFINITY) return cap;
    long fit = (long)rl.rlim_cur - 64 - (long)(rl.rlim_cur / 8);
    if (fit < 16) fit = 16;
    return cap < fit ? cap : (int)fit;
}

rt_transport *rt_transport_new(const rt_transport_options *opts, rt_handler handler, void *ctx,
                               dg_status *st) {
    rt_transport *t = calloc(1, sizeof *t);
    if (!t) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "transport: out of memory");
        return NULL;
    }
    t->opts = *opts;
    if (!t->opts.max_message_bytes) t->opts.max_message_bytes = (size_t)2 << 30;
    if (!t->opts.max_frame_bytes) t->opts.max_frame_bytes = RT_DEFAULT_MAX_FRAME_BYTES;
    if (t->opts.max_inflight_bytes <= 0) t->opts.max_inflight_bytes = RT_DEFAULT_MAX_INFLIGHT_BYTES;
    if (t->opts.transfer_timeout_ms <= 0) t->opts.transfer_timeout_ms = RT_DEFAULT_TRANSFER_TIMEOUT_MS;
    if (t->opts.reply_queue_messages <= 0) t->opts.reply_queue_messages = RT_DEFAULT_REPLY_QUEUE;
    int64_t busy_us = t->opts.busy_poll_us == 0 ? RT_DEFAULT_BUSY_POLL_US : t->opts.busy_poll_us;
    t->io_slice_us = RT_DEFAULT_IO_SLICE_US;
    t->io_sliced = -1;
    if (!env_us("DG_BUSY_POLL_US", -1000000, 1000000, "(0 or negative: off)", &busy_us, st) ||
        !env_us("DG_IO_SLICE_US", 0, 100000, "from 0 (the kernel's default slice) to 100000", &t->io_slice_us, st)) {
        free(t);
        return NULL;
    }
    t->busy_poll_ns = busy_us > 0 ? (busy_us > 1000000 ? 1000000 : busy_us) * 1000 : 0;
    cpu_set_t cpus;
    t->n_cpus = sched_getaffinity(0, sizeof cpus, &cpus) == 0 && CPU_COUNT(&cpus) > 0 ? CPU_COUNT(&cpus) : 1;
    if (getrandom(&t->incarnation, sizeof t->incarnation, 0) != (ssize_t)sizeof t->incarnation)
        t->incarnation = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid();
    if (!t->incarnation) t->incarnation = 1;
    snprintf(t->name, sizeof t->name, "%s", opts->name ? opts->name : "client");
    t->opts.name = t->name;
    t->handler = handler;
    t->ctx = ctx;
    t->efd = -1;
    pthread_mutex_init(&t->mu, NULL);
    // Allocated once: 800 KB per message was a malloc and free on every receive.
    t->frames = malloc(MAX_FRAMES * sizeof *t->frames);
    if (!t->frames) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "transport: out of memory");
        goto fail;
    }
    if ((opts->curve_public_key && *opts->curve_public_key) || (opts->curve_secret_key && *opts->curve_secret_key)) {
        if (!opts->curve_public_key || !opts->curve_secret_key || strlen(opts->curve_public_key) != 40 ||
            strlen(opts->curve_secret_key) != 40) {
            dg_status_set(st, DG_INVALID_ARGUMENT, "transport: CurveZMQ keys must both be 40-character Z85 strings");
            goto fail;
        }
        t->curve = true;
        memcpy(t->curve_pub, opts->curve_public_key, 41);
        memcpy(t->curve_sec, opts->curve_secret_key, 41);
    }
    const char *shm_env = getenv("DG_SHM");
    t->shm_off = opts->no_shm || (shm_env && strcmp(shm_env, "0") == 0);
    t->zctx = zmq_ctx_new();
    t->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!t->zctx || t->efd < 0) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "transport: cannot create a ZeroMQ context or eventfd");
        goto fail;
    }
    if (t->curve) {
        t->zap = zmq_socket(t->zctx, ZMQ_REP);
        if (!t->zap || zmq_bind(t->zap, "inproc://zeromq.zap.01") != 0 ||
            pthread_create(&t->zap_thread, NULL, zap_main, t) != 0) {
            dg_status_set(st, DG_INTERNAL, "transport: cannot start the authentication handler");
            goto fail;
        }
        t->has_zap = true;
    }
    if (opts->bind) {
        t->router = zmq_socket(t->zctx, ZMQ_ROUTER);
        int zero = 0, one = 1;
        zmq_setsockopt(t->router, ZMQ_LINGER, &zero, sizeof zero);
        // Replies queue per peer up to reply_queue_messages, then are dropped (send_frames);
        // requests queue per peer up to ZeroMQ's default (1000), then that peer's connection
        // is read no further until the I/O thread catches up (TCP holds the sender back).
        zmq_setsockopt(t->router, ZMQ_SNDHWM, &t->opts.reply_queue_messages, sizeof(int));
        zmq_setsockopt(t->router, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
        int64_t max = (int64_t)t->opts.max_frame_bytes;
        zmq_setsockopt(t->router, ZMQ_MAXMSGSIZE, &max, sizeof max);
        if (t->curve) {
            zmq_setsockopt(t->router, ZMQ_CURVE_SERVER, &one, sizeof one);
            zmq_setsockopt(t->router, ZMQ_CURVE_SECRETKEY, t->curve_sec, 40);
            zmq_setsockopt(t->router, ZMQ_ZAP_DOMAIN, "distgraph", 9);
        }
        if (zmq_bind(t->router, opts->bind) != 0) {
            dg_status_setf(st, DG_UNAVAILABLE, "transport: cannot bind %s: %s", opts->bind,
                           zmq_strerror(zmq_errno()));
            goto fail;
        }
        size_t len = sizeof t->endpoint;
        zmq_getsockopt(t->router, ZMQ_LAST_ENDPOINT, t->endpoint, &len);
        const char *port = strrchr(t->endpoint, ':');
        t->bound_port = port ? atoi(port + 1) : -1;
        char mon[128];
        snprintf(mon, sizeof mon, "inproc://monitor-%p", (void *)t);
        // Connections come and go in the monitor's events (see on_monitor). Only CURVE
        // refusals count as refused: a peer without the key or with another server key fails
        // the handshake with a protocol error here, or, when it notices the mismatch first and
        // hangs up, as a handshake without detail; a ZAP refusal is counted by zap_main.
        // Without CURVE nobody is refused: a handshake cut short there is a peer leaving early.
        int events = ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_ACCEPT_FAILED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CLOSED;
        if (t->curve) events |= ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL;
        t->monitor = zmq_socket_monitor(t->router, mon, events) == 0 ? zmq_socket(t->zctx, ZMQ_PAIR) : NULL;
        // No high-water mark: a dropped event would leave a connection uncounted.
        if (t->monitor && (zmq_setsockopt(t->monitor, ZMQ_RCVHWM, &zero, sizeof zero) != 0 ||
                           zmq_connect(t->monitor, mon) != 0)) {
            zmq_close(t->monitor);
            t->monitor = NULL;
        }
        if (!t->monitor) {
            dg_status_set(st, DG_INTERNAL, "transport: cannot watch the connections of the bound socket");
            goto fail;
        }
        t->max_conns = connection_cap(t->opts.max_connections);
        __atomic_store_n(&t->stats.max_connections, t->max_conns, __ATOMIC_RELAXED);
        t->conns = calloc(64, sizeof *t->conns);
        if (!t->conns) abort();
        t->cap_conns = 64;
    }
    if (pthread_create(&t->thread, NULL, io_main, t) != 0) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "transport: cannot start the I/O thread");
        goto fail;
    }
    t->running = true;
    return t;
fail:
    rt_transport_free(&t);
    return NULL;
}

static void wake(rt_transport *t) {
    uint64_t one = 1;
    if (write(t->efd, &one, sizeof one) < 0) { /* the counter saturates: still readable */ }
}

void rt_transport_free(rt_transport **tp) {
    if (!tp || !*tp) return;
    rt_transport *t = *tp;
    if (t->running) {
        pthread_mutex_lock(&t->mu);
        t->stop = true;
        pthread_mutex_unlock(&t->mu);
        wake(t);
        pthread_join(t->thread, NULL);
    }
    // Commands queued after the stop.
    for (cmd *c = t->head, *next; c; c = next) {
        next = c->next;
        if (c->kind == CMD_CALL) fail_call(c->cb, c->arg, DG_CANCELLED, "the transport was shut down");
        free_cmd(c);
    }
    while (t->assemblies) free_assembly(t, &t->assemblies);
    if (t->self_rx) zmq_close(t->self_rx);
    if (t->self_tx) zmq_close(t->self_tx);
    free(t->conns);
    for (int i = 0; i < t->n_dealers; i++) {
        dealer_unwatch(&t->dealers[i]);
        if (t->dealers[i].sock) zmq_close(t->dealers[i].sock);
        free(t->dealers[i].endpoint);
    }
    free(t->dealers);
    if (t->monitor) zmq_close(t->monitor);
    if (t->router) zmq_close(t->router);
    // The ZAP thread may be blocked in a receive on its socket, and a ZeroMQ socket must not
    // be closed under another thread: shutting the context down makes that receive fail with
    // ETERM, the thread returns, and only then is its socket closed.
    if (t->has_zap) {
        zmq_ctx_shutdown(t->zctx);
        pthread_join(t->zap_thread, NULL);
    }
    if (t->zap) zmq_close(t->zap);
    if (t->zctx) zmq_ctx_term(t->zctx);
    if (t->efd >= 0) close(t->efd);
    free(t->frames);
    rt_shm_pool_free(&t->shm);
    pthread_mutex_destroy(&t->mu);
    free(t);
    *tp = NULL;
}

const char *rt_transport_endpoint(const rt_transport *t) { return t->endpoint; }

char *rt_endpoint_of(const char *address, dg_status *st) {
    const char *a = address;
    if (a && strncmp(a, "dg://", 5) == 0) a += 5;
    else if (a && strncmp(a, "tcp://", 6) == 0) a += 6;
    const char *colon = a ? strrchr(a, ':') : NULL;
    char *end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : 0;
    if (!a || !colon || colon == a || end == colon + 1 || *end || port < 1 || port > 65535) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "address \"%s\": expected \"host:port\" or \"dg://host:port\"",
                       address ? address : "");
        return NULL;
    }
    char *ep = NULL;
    if (asprintf(&ep, "tcp://%s", a) < 0) abort();
    return ep;
}

rt_transport_stats rt_transport_get_stats(rt_transport *t) {
    rt_transport_stats s;
    s.bad_messages = __atomic_load_n(&t->stats.bad_messages, __ATOMIC_RELAXED);
    s.refused_peers = __atomic_load_n(&t->stats.refused_peers, __ATOMIC_RELAXED);
    s.shm_frames_sent = __atomic_load_n(&t->stats.shm_frames_sent, __ATOMIC_RELAXED);
    s.shm_frames_received = __atomic_load_n(&t->stats.shm_frames_received, __ATOMIC_RELAXED);
    s.tensor_bytes_sent = __atomic_load_n(&t->stats.tensor_bytes_sent, __ATOMIC_RELAXED);
    s.connections = __atomic_load_n(&t->stats.connections, __ATOMIC_RELAXED);
    s.max_connections = __atomic_load_n(&t->stats.max_connections, __ATOMIC_RELAXED);
    s.connections_closed = __atomic_load_n(&t->stats.connections_closed, __ATOMIC_RELAXED);
    s.accept_failures = __atomic_load_n(&t->stats.accept_failures, __ATOMIC_RELAXED);
    s.inflight_bytes = __atomic_load_n(&t->stats.inflight_bytes, __ATOMIC_RELAXED);
    s.transfers_refused = __atomic_load_n(&t->stats.transfers_refused, __ATOMIC_RELAXED);
    s.transfers_expired = __atomic_load_n(&t->stats.transfers_expired, __ATOMIC_RELAXED);
    s.transfers_abandoned = __atomic_load_n(&t->stats.transfers_abandoned, __ATOMIC_RELAXED);
    s.replies_dropped = __atomic_load_n(&t->stats.replies_dropped, __ATOMIC_RELAXED);
    s.requests_refused = __atomic_load_n(&t->stats.requests_refused, __ATOMIC_RELAXED);
    return s;
}

static cmd *new_cmd(cmd_kind k, rt_header *h, dg_tensor *const *tensors, int n) {
    cmd *c = calloc(1, sizeof *c);
    if (!c) abort();
    c->kind = k;
    if (h) c->header = rt_header_encode(h, &c->header_len);
    if (n > 0) {
        c->tensors = malloc((size_t)n * sizeof *c->tensors);
        if (!c->tensors) abort();
        for (int i = 0; i < n; i++) c->tensors[i] = dg_tensor_ref(tensors[i]);
    }
    c->n = n;
    return c;
}

static void enqueue(rt_transport *t, cmd *c) {
    pthread_mutex_lock(&t->mu);
    bool was_empty = t->head == NULL;
    if (t->tail) t->tail->next = c;
    else t->head = c;
    t->tail = c;
    pthread_mutex_unlock(&t->mu);
    // The I/O thread takes the whole queue on each wake: only the first command needs one.
    if (was_empty) wake(t);
}

void rt_call(rt_transport *t, const char *endpoint, rt_header *h, dg_tensor *const *tensors, int n,
             int64_t timeout_ms, rt_response_cb cb, void *arg) {
    pthread_mutex_lock(&t->mu);
    h->id = ++t->next_id;
    pthread_mutex_unlock(&t->mu);
    if (!h->from) h->from = strdup(t->name);
    h->deadline_ms = timeout_ms;
    cmd *c = new_cmd(CMD_CALL, h, tensors, n);
    // A frame over the limit would make the receiver drop the connection unanswered (ZeroMQ's
    // ZMQ_MAXMSGSIZE): refused here instead, with the reason, on the I/O thread as any failure.
    size_t limit = t->opts.max_frame_bytes, big = c->header_len;
    int which = -1;
    for (int i = 0; i < n; i++)
        if (tensors[i]->nbytes > big) big = tensors[i]->nbytes, which = i;
    if (big > limit &&
        asprintf(&c->refused,
                 "%s to %s: %s of %zu bytes is over the %zu bytes a task takes in one frame "
                 "(dg_server_options.max_message_bytes, dg-server --max_message_mb; the same on "
                 "both sides)",
                 rt_type_name(h->type), endpoint, which < 0 ? "the header (graph)" : "a tensor", big, limit) < 0)
        abort();
    c->endpoint = strdup(endpoint);
    c->id = h->id;
    c->timeout_ms = timeout_ms;
    c->cb = cb;
    c->arg = arg;
    rt_header_clear(h);
    free(h);
    enqueue(t, c);
}

void rt_push(rt_transport *t, const char *endpoint, rt_header *h, dg_tensor *const *tensors, int n) {
    if (!h->from) h->from = strdup(t->name);
    cmd *c;
    if (n == 1 && tensors[0]->nbytes > 4 * RT_CHUNK_BYTES) {
        c = new_cmd(CMD_PUSH, NULL, tensors, n);
        c->chunked = true;
        c->chunk_hdr = h;   // encoded per chunk on the I/O thread
    } else if (n == 1 && h->type == RT_TENSOR && h->key) {
        c = new_cmd(CMD_PUSH, NULL, tensors, n);
        c->small_push = true;
        c->chunk_hdr = h;   // merged with its neighbours on the I/O thread
    } else {
        c = new_cmd(CMD_PUSH, h, tensors, n);
        rt_header_clear(h);
        free(h);
    }
    c->endpoint = strdup(endpoint);
    enqueue(t, c);
}

void rt_reply(rt_transport *t, rt_peer *peer, rt_header *h, dg_tensor *const *tensors, int n) {
    h->type = RT_RESPONSE;
    h->incarnation = t->incarnation;
    cmd *c = new_cmd(CMD_REPLY, h, tensors, n);
    c->peer = peer;
    rt_header_clear(h);
    free(h);
    // A handler answering on the I/O thread (PING, LIST_DEVICES, errors) sends at once: the
    // queue and the eventfd would only bring the same thread back here.
    if (t->running && pthread_equal(pthread_self(), t->thread)) run_cmd(t, c);
    else enqueue(t, c);
}

void rt_reply_error(rt_transport *t, rt_peer *peer, uint64_t id, const dg_status *st) {
    rt_header *h = malloc(sizeof *h);
    if (!h) abort();
    rt_header_init(h, RT_RESPONSE);
    h->id = id;
    h->code = dg_status_code(st) ? (int)dg_status_code(st) : DG_UNKNOWN;
    char msg[2048];
    snprintf(msg, sizeof msg, "%s: %s", t->name, dg_status_message(st));
    rt_header_set_message(h, msg);
    rt_reply(t, peer, h, NULL, 0);
}

// ---- synchronous calls ----
typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    dg_status st;
    rt_header *h;
    dg_tensor **ts;
    int n;
} waiter;

static void wake_waiter(void *arg, const dg_status *st, rt_header *h, dg_tensor **ts, int n) {
    waiter *w = arg;
    pthread_mutex_lock(&w->mu);
    if (st && dg_status_code(st) != DG_OK) dg_status_copy(&w->st, st);
    w->h = h;
    w->ts = ts;
    w->n = n;
    __atomic_store_n(&w->done, true, __ATOMIC_RELEASE);
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

int64_t rt_transport_busy_poll_us(const rt_transport *t) { return t->busy_poll_ns / 1000; }
int64_t rt_transport_io_slice_us(const rt_transport *t) { return t->io_slice_us; }
int rt_transport_io_sliced(const rt_transport *t) { return __atomic_load_n(&t->io_sliced, __ATOMIC_ACQUIRE); }

bool rt_call_sync(rt_transport *t, const char *endpoint, rt_header *h, dg_tensor *const *tensors,
                  int n, int64_t timeout_ms, rt_header **resp, dg_tensor ***out, int *n_out,
                  dg_status *st) {
    waiter w;
    memset(&w, 0, sizeof w);
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    rt_call(t, endpoint, h, tensors, n, timeout_ms, wake_waiter, &w);
    // The same busy polling as the I/O thread's: an answer within the window costs no wake-up.
    if (t->busy_poll_ns) {
        int64_t until = base_now_ns() + t->busy_poll_ns;
        while (!__atomic_load_n(&w.done, __ATOMIC_ACQUIRE) && base_now_ns() < until && may_spin(t)) sched_yield();
    }
    pthread_mutex_lock(&w.mu);
    while (!w.done) pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    bool ok = w.st.code == DG_OK;
    if (ok && w.h && w.h->code != DG_OK) {
        dg_status_set(st, (dg_code)w.h->code, w.h->message ? w.h->message : "remote error");
        ok = false;
    } else if (!ok) {
        dg_status_copy(st, &w.st);
    }
    status_impl_clear(&w.st);
    if (ok) {
        *resp = w.h;
        if (out) *out = w.ts;
        else {
            for (int i = 0; i < w.n; i++) dg_tensor_unref(w.ts[i]);
            free(w.ts);
        }
        if (n_out) *n_out = w.n;
    } else {
        if (w.h) {
            rt_header_clear(w.h);
            free(w.h);
        }
        for (int i = 0; i < w.n; i++) dg_tensor_unref(w.ts[i]);
        free(w.ts);
    }
    return ok;
}

bool rt_curve_keypair(char *pub, char *sec, dg_status *st) {
    if (zmq_curve_keypair(pub, sec) != 0) {
        dg_status_setf(st, DG_UNIMPLEMENTED, "CurveZMQ key pair: %s (libzmq built without CURVE?)",
                       zmq_strerror(zmq_errno()));
        return false;
    }
    return true;
}
