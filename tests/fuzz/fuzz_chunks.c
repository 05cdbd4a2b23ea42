/* libFuzzer target for chunk assembly (runtime/transport/transport.c, take_chunk): a peer
 * sends TENSOR_CHUNK messages (transfer id, offset, total, the whole tensor's description, one
 * frame of bytes or a shared-memory descriptor) and the receiving transport assembles them and
 * delivers the tensor as one TENSOR. Each input is a sequence of messages from up to two
 * peers, sent over real ZeroMQ DEALER sockets to a real transport (made for the input and freed
 * after it, so every input starts from nothing and LeakSanitizer sees what one leaves behind).
 *
 * Properties, beyond "no crash and no leak":
 *   - the transport answers a PING from each peer after its chunks (it is still serving);
 *   - every delivered tensor is a TENSOR of one tensor whose size, dtype and shape are those its
 *     chunks described, and each of its bytes is the byte its peer sent for that position of that
 *     transfer (never a hole, another transfer's, another peer's or stray memory);
 *   - a clean transfer (below: what a sender does) is delivered; no transfer id gives more
 *     tensors than its chunks' bytes make up;
 *   - the receiver frees every shared-memory slot it resolved for a clean transfer, and frees no
 *     slot it was never sent.
 * Which other chunks the receiver refuses is up to its rules (docs/PROTOCOL.md section 6); the
 * target does not encode them.
 *
 * Input: messages, each starting with a byte op; bit 7 picks the peer, op & 7 the kind:
 *   0..4  a chunk: bytes a, b, then what they ask for (see chunk() below)
 *   5     raw bytes as a header (u8 length) and up to 2 frames (u8 length each); headers that
 *         decode as TENSOR or TENSOR_CHUNK are not sent (their bytes could not be checked)
 *   6     a barrier: PING round trip on that peer
 *   7     a chunk that continues the peer's last transfer where its last chunk ended
 * Built by hand or by run_fuzz.sh chunks SECONDS, not by CMake: see README.md here. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "distgraph/distgraph.h"
#include "shm_impl.h"
#include "transport_impl.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_MSGS 64
#define MAX_SENT_BYTES ((size_t)8 << 20)     // bytes of frames per input (shm ones excepted)
#define MAX_MESSAGE_BYTES ((uint64_t)2 << 30)   // the transport's default max_message_bytes
#define BARRIER_MS 10000

static void *zctx;   // the peers' sockets' context, made and ended per input
static rt_shm_pool *pool;
static unsigned char *chunk_buf;   // RT_CHUNK_BYTES + 2 bytes of scratch for a frame

// The bytes a peer sends for position pos of transfer xfer: a sequence of prime period (so a
// piece put a whole number of chunks away from its place does not match), shifted per peer and
// transfer, read from a table so that megabytes of it cost a memcpy.
#define PERIOD 65521u
static unsigned char *table;   // PERIOD + RT_CHUNK_BYTES + 2 bytes

static size_t shift_of(int peer, uint64_t xfer) { return (size_t)((xfer * 4099u + (uint64_t)peer * 32771u) % PERIOD); }

static const unsigned char *pattern_at(int peer, uint64_t xfer, uint64_t pos) {
    return table + (pos + shift_of(peer, xfer)) % PERIOD;
}

// ---- what the transport delivers (its handler runs on the transport's I/O thread) ----

typedef struct delivery {
    rt_header *h;
    dg_tensor **ts;
    int n;
} delivery;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static rt_transport *cur_tp;
static delivery got[4 * MAX_MSGS];
static int n_got;

static void handle(void *ctx, rt_peer *peer, rt_header *h, dg_tensor **ts, int n) {
    pthread_mutex_lock(&mu);
    rt_transport *tp = cur_tp;
    if (h->type == RT_PING) {
        pthread_mutex_unlock(&mu);
        rt_reply(tp, peer, h, ts, n);   // takes its own references
        for (int i = 0; i < n; i++) dg_tensor_unref(ts[i]);
        free(ts);
        return;
    }
    if (h->type == RT_TENSOR && n_got < (int)(sizeof got / sizeof got[0])) {
        got[n_got++] = (delivery){h, ts, n};
        h = NULL;
        ts = NULL;
        n = 0;
    } else if (h->type == RT_TENSOR) {
        abort();   // more deliveries than messages sent
    }
    pthread_mutex_unlock(&mu);
    if (h) {
        rt_header_clear(h);
        free(h);
    }
    for (int i = 0; i < n; i++) dg_tensor_unref(ts[i]);
    free(ts);
    rt_peer_free(peer);
}

// ---- what a correct receiver must do, whatever else its rules refuse ----
// A peer's chunks that follow each other as a sender cuts them (a transfer id new to the peer,
// offset 0, then each chunk where the last ended, RT_CHUNK_BYTES each but the last, one frame,
// the same description, a tensor of more than four chunks and at most max_message_bytes, no
// other chunk of that peer in between) are a clean transfer: it must be delivered. Anything
// else may be refused (the rules of docs/PROTOCOL.md section 6 say what); but nothing may be
// delivered that was not sent: no more tensors of a transfer id than its chunks' bytes make up,
// and no byte that was not sent.

typedef struct xfer_model {
    int peer;
    uint64_t xfer;
    uint64_t bytes_sent;    // chunk bytes of this transfer id sent by the peer
    bool foreign_bytes;     // some were not the pattern (a descriptor taken for bytes)
    int clean_done;         // clean transfers completed: deliveries owed
} xfer_model;

typedef struct clean_run {  // the peer's clean transfer under way, if any
    bool active;
    uint64_t xfer, next;
    rt_tensor_desc desc;
} clean_run;

typedef struct input_state {
    xfer_model x[2 * MAX_MSGS];
    int n_x;
    clean_run run[2];
    int last_x[2];          // the model index of each peer's last transfer, -1: none
    uint64_t next_off[2];   // where that transfer's last chunk ended
    rt_tensor_desc last_desc[2];
    void *sock[2];
    uint64_t next_id;
    int n_desc;             // descriptors of our slots put in chunks
    unsigned char descs[MAX_MSGS][RT_SHM_DESC_BYTES];
    size_t desc_len[MAX_MSGS];
    bool desc_sent[MAX_MSGS];   // in a message with one frame (the receiver may resolve it)
    bool desc_owed[MAX_MSGS];   // in a clean transfer: the receiver must resolve and free it
    size_t sent_bytes;
} input_state;

static xfer_model *model_of(input_state *s, int peer, uint64_t xfer) {
    for (int i = 0; i < s->n_x; i++)
        if (s->x[i].peer == peer && s->x[i].xfer == xfer) return &s->x[i];
    xfer_model *m = &s->x[s->n_x++];
    memset(m, 0, sizeof *m);
    m->peer = peer;
    m->xfer = xfer;
    return m;
}

static bool same_desc(const rt_tensor_desc *a, const rt_tensor_desc *b) {
    return a->dtype == b->dtype && a->nbytes == b->nbytes && dg_shape_equal(&a->shape, &b->shape);
}

// A chunk whose header decoded as h goes out with n_frames frames of len bytes each (the
// pattern, or foreign bytes), or (is_shm) a descriptor standing for desc_len bytes, 0 for a
// descriptor of no slot. Returns whether it belongs to a clean transfer.
static bool model_chunk(input_state *s, int peer, const rt_header *h, int n_frames, size_t len, bool is_shm,
                        size_t desc_len, bool pattern_bytes) {
    uint64_t want = h->offset < h->total ? (h->total - h->offset < RT_CHUNK_BYTES ? h->total - h->offset
                                                                                  : RT_CHUNK_BYTES)
                                         : 0;
    // What the receiver may take for the chunk's bytes.
    if (is_shm && !(want >= RT_SHM_MIN_BYTES)) {
        len = RT_SHM_DESC_BYTES;   // not read as a descriptor: the 40 bytes are the chunk
        pattern_bytes = false;
    } else if (is_shm) {
        len = desc_len ? desc_len : RT_SHM_DESC_BYTES;
        pattern_bytes = desc_len != 0;
    }
    bool fresh = true;   // a transfer id this peer has not used (a sender's ids count up)
    for (int i = 0; i < s->n_x; i++) fresh &= !(s->x[i].peer == peer && s->x[i].xfer == h->xfer);
    xfer_model *m = model_of(s, peer, h->xfer);
    m->bytes_sent += (uint64_t)len * (uint64_t)n_frames;
    if (!pattern_bytes && n_frames > 0) m->foreign_bytes = true;
    bool well = n_frames == 1 && h->n_tensors == 1 && h->tensors[0].nbytes == h->total &&
                h->total > 4 * RT_CHUNK_BYTES && h->total <= MAX_MESSAGE_BYTES && len == want && pattern_bytes;
    clean_run *r = &s->run[peer];
    if (well && r->active && r->xfer == h->xfer && r->next == h->offset && same_desc(&r->desc, &h->tensors[0])) {
        r->next += len;
    } else if (well && h->offset == 0 && fresh) {
        *r = (clean_run){true, h->xfer, len, h->tensors[0]};
    } else {
        r->active = false;
        return false;
    }
    if (r->next == h->total) {
        m->clean_done++;
        r->active = false;
    }
    return true;
}

// ---- sending ----

typedef struct reader {
    const uint8_t *p, *end;
} reader;

static uint64_t take(reader *r, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)(r->p < r->end ? *r->p++ : 0) << (8 * i);
    return v;
}

static void *peer_socket(input_state *s, int peer) {
    if (s->sock[peer]) return s->sock[peer];
    void *so = zmq_socket(zctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(so, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(so, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(so, ZMQ_RCVHWM, &zero, sizeof zero);
    if (zmq_connect(so, rt_transport_endpoint(cur_tp)) != 0) abort();
    s->sock[peer] = so;
    return so;
}

static void send_msg(input_state *s, int peer, const void *hdr, size_t hdr_len, const void *const *frames,
                     const size_t *lens, int n) {
    void *so = peer_socket(s, peer);
    if (zmq_send(so, hdr, hdr_len, n > 0 ? ZMQ_SNDMORE : 0) < 0) abort();
    for (int i = 0; i < n; i++)
        if (zmq_send(so, frames[i], lens[i], i + 1 < n ? ZMQ_SNDMORE : 0) < 0) abort();
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

// PING on the peer's socket and wait for its answer: the transport handles a peer's messages
// in order, so everything sent before has been taken in. A transport that does not answer
// within BARRIER_MS has stopped serving.
static void barrier(input_state *s, int peer) {
    if (!s->sock[peer]) return;
    rt_header h;
    rt_header_init(&h, RT_PING);
    int64_t deadline = now_ms() + BARRIER_MS, resend = 0;
    for (;;) {
        // Again each second: a peer that left its answers unread may lose some (the
        // transport's reply queue is bounded), and that is no failure.
        if (now_ms() >= resend) {
            h.id = ++s->next_id;
            size_t len;
            char *buf = rt_header_encode(&h, &len);
            send_msg(s, peer, buf, len, NULL, NULL, 0);
            free(buf);
            resend = now_ms() + 1000;
        }
        zmq_pollitem_t it = {s->sock[peer], 0, ZMQ_POLLIN, 0};
        long left = (long)(deadline - now_ms());
        if (left <= 0) {
            fprintf(stderr, "fuzz_chunks: the transport did not answer a PING within %d ms\n", BARRIER_MS);
            abort();
        }
        if (zmq_poll(&it, 1, left < 100 ? left : 100) <= 0) continue;
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, s->sock[peer], 0) < 0) abort();
        bool more = zmq_msg_more(&m);
        rt_header r;
        dg_status *st = dg_status_new();
        bool mine = rt_header_decode(zmq_msg_data(&m), zmq_msg_size(&m), &r, st) && r.type == RT_RESPONSE &&
                    r.id == h.id;
        rt_header_clear(&r);
        dg_status_free(&st);
        zmq_msg_close(&m);
        while (more) {   // a response's frames, if any
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, s->sock[peer], 0) < 0) abort();
            more = zmq_msg_more(&m);
            zmq_msg_close(&m);
        }
        if (mine) return;
    }
}

// A chunk message. Byte a: bits 0-1 transfer id (0..3), bit 2 a 64-bit id from the input
// instead; bits 3-5 the total (0: u16, 1: u32, 2: 5 MiB, 3: u64 from the input, 4: 4 MiB and a
// u16 more, 5..7: the peer's last total, else a u16); bits 6-7 the description (0: uint8
// [total], 1: float32 [total / 4], 2: uint8 [2, total / 2], 3: what the input says). Byte b:
// bits 0-1 the offset (0: where the peer's last chunk of this transfer ended, 1: u16, 2: k MiB
// with k a u8, 3: u64); bits 2-3 the length (0: to the next 1 MiB boundary or the end, as a
// sender cuts, 1: u16, 2: 0, 3: one more than 0 gives); bits 4-5 the frames (0, 1: one; 2: none;
// 3: two); bit 6 the bytes go through shared memory when 64 KiB..1 MiB; bit 7 the frame is 40
// bytes from the input behind the descriptor magic. Op 7 continues the peer's last transfer:
// same id and description, the next offset, the length a sender cuts (only bits 6 and 7
// of b count).
static void chunk(input_state *s, reader *r, int peer, bool continues) {
    uint8_t a = (uint8_t)take(r, 1), b = (uint8_t)take(r, 1);
    const xfer_model *last = s->last_x[peer] >= 0 ? &s->x[s->last_x[peer]] : NULL;
    uint64_t xfer, total, off;
    rt_tensor_desc d;
    memset(&d, 0, sizeof d);
    if (continues && last) {
        xfer = last->xfer;
        d = s->last_desc[peer];
        total = d.nbytes;
        off = s->next_off[peer];
        b &= (uint8_t)~0x3c;   // the length a sender cuts, one frame
    } else {
        xfer = (a & 4) ? take(r, 8) : (a & 3);
        switch ((a >> 3) & 7) {
        case 0: total = take(r, 2); break;
        case 1: total = take(r, 4); break;
        case 2: total = (uint64_t)5 << 20; break;
        case 3: total = take(r, 8); break;
        case 4: total = 4 * RT_CHUNK_BYTES + take(r, 2); break;
        default: total = last ? s->last_desc[peer].nbytes : take(r, 2); break;
        }
        const uint64_t dim_max = ((uint64_t)1 << 40) - 1;
        d.nbytes = total;
        switch (a >> 6) {
        case 0: d.dtype = DG_UINT8; d.shape = dg_shape1((int64_t)(total & dim_max)); break;
        case 1: d.dtype = DG_FLOAT32; d.shape = dg_shape1((int64_t)((total / 4) & dim_max)); break;
        case 2: d.dtype = DG_UINT8; d.shape = dg_shape2(2, (int64_t)((total / 2) & dim_max)); break;
        default:
            d.dtype = (dg_dtype)take(r, 1);
            d.shape = dg_shape1((int64_t)take(r, 2));
            d.nbytes = take(r, 1) & 1 ? total : total + 1;
            break;
        }
        switch (b & 3) {
        case 0: off = last && last->xfer == xfer ? s->next_off[peer] : 0; break;
        case 1: off = take(r, 2); break;
        case 2: off = take(r, 1) * (uint64_t)RT_CHUNK_BYTES; break;
        default: off = take(r, 8); break;
        }
    }
    uint64_t cut = off < total ? (total - off < RT_CHUNK_BYTES ? total - off : RT_CHUNK_BYTES) : 0;
    size_t len;
    switch ((b >> 2) & 3) {
    case 0: len = (size_t)cut; break;
    case 1: len = (size_t)take(r, 2); break;
    case 2: len = 0; break;
    default: len = (size_t)cut + 1; break;
    }
    if (len > RT_CHUNK_BYTES + 1) len = RT_CHUNK_BYTES + 1;
    int n_frames = ((b >> 4) & 3) == 2 ? 0 : ((b >> 4) & 3) == 3 ? 2 : 1;
    bool want_shm = (b >> 6) & 1, fake_desc = b >> 7;

    rt_header h;
    rt_header_init(&h, RT_TENSOR_CHUNK);
    h.step_id = 1;
    h.key = strdup(peer ? "p1" : "p0");
    h.xfer = xfer;
    h.offset = off;
    h.total = total;
    h.tensors = malloc(sizeof *h.tensors);
    if (!h.key || !h.tensors) abort();
    h.tensors[0] = d;
    h.n_tensors = 1;
    size_t hl;
    char *hb = rt_header_encode(&h, &hl);
    rt_header_clear(&h);

    // The frame: the pattern of this transfer at its offset, a descriptor of a slot holding
    // it, or 40 bytes of the input behind the magic.
    unsigned char desc[RT_SHM_DESC_BYTES];
    bool is_shm = false;
    size_t desc_len = 0;
    int slot_index = -1;
    if (fake_desc) {
        memcpy(desc, RT_SHM_MAGIC, 8);
        for (int i = 8; i < RT_SHM_DESC_BYTES; i++) desc[i] = (unsigned char)take(r, 1);
        desc[15] |= 0x80;   // a region number no pool takes: it cannot name a slot of ours
        is_shm = true;
    } else if (!want_shm || len < RT_SHM_MIN_BYTES || len > RT_SHM_SLOT_BYTES) {
        if (s->sent_bytes + len * (size_t)n_frames > MAX_SENT_BYTES) {   // keeps inputs fast
            free(hb);
            return;
        }
        s->sent_bytes += len * (size_t)n_frames;
        memcpy(chunk_buf, pattern_at(peer, xfer, off), len);
    } else {
        memcpy(chunk_buf, pattern_at(peer, xfer, off), len);
        if (s->n_desc == MAX_MSGS || !rt_shm_put(pool, chunk_buf, len, desc)) abort();
        is_shm = true;
        desc_len = len;
        slot_index = s->n_desc++;
        memcpy(s->descs[slot_index], desc, sizeof desc);
        s->desc_len[slot_index] = len;
        s->desc_sent[slot_index] = n_frames == 1;
    }
    const void *frames[2];
    size_t lens[2];
    for (int i = 0; i < n_frames; i++) {
        frames[i] = is_shm ? (const void *)desc : chunk_buf;
        lens[i] = is_shm ? sizeof desc : len;
    }

    // The receiver sees the header through the same decoder; one that does not decode never
    // reaches the chunk code.
    rt_header dh;
    dg_status *st = dg_status_new();
    if (rt_header_decode(hb, hl, &dh, st) && dh.type == RT_TENSOR_CHUNK) {
        bool clean = model_chunk(s, peer, &dh, n_frames, len, is_shm, desc_len, true);
        if (clean && slot_index >= 0) s->desc_owed[slot_index] = true;
        s->last_x[peer] = (int)(model_of(s, peer, xfer) - s->x);
        s->last_desc[peer] = d;
        s->next_off[peer] = off + len;
    }
    rt_header_clear(&dh);
    dg_status_free(&st);
    send_msg(s, peer, hb, hl, frames, lens, n_frames);
    free(hb);
}

static void raw(input_state *s, reader *r, int peer) {
    size_t hl = (size_t)take(r, 1);
    unsigned char hb[256], fb[2][256];
    for (size_t i = 0; i < hl; i++) hb[i] = (unsigned char)take(r, 1);
    int n = (int)(take(r, 1) % 3);
    const void *frames[2] = {fb[0], fb[1]};
    size_t lens[2];
    for (int f = 0; f < n; f++) {
        lens[f] = (size_t)take(r, 1);
        for (size_t i = 0; i < lens[f]; i++) fb[f][i] = (unsigned char)take(r, 1);
    }
    rt_header h;
    dg_status *st = dg_status_new();
    bool skip = rt_header_decode(hb, hl, &h, st) && (h.type == RT_TENSOR || h.type == RT_TENSOR_CHUNK);
    rt_header_clear(&h);
    dg_status_free(&st);
    if (!skip) send_msg(s, peer, hb, hl, frames, lens, n);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    dg_status *st = dg_status_new();
    pool = rt_shm_pool_new(st);
    chunk_buf = malloc(RT_CHUNK_BYTES + 2);
    table = malloc(PERIOD + RT_CHUNK_BYTES + 2);
    if (!pool || !chunk_buf || !table) {
        fprintf(stderr, "fuzz_chunks: %s\n", dg_status_message(st));
        abort();
    }
    for (size_t i = 0; i < PERIOD + RT_CHUNK_BYTES + 2; i++)
        table[i] = (unsigned char)((i % PERIOD) * 131u + ((i % PERIOD) >> 8) + 1u);
    dg_status_free(&st);
    return 0;
}

// A delivered tensor: one of a transfer its peer sent, of the size, dtype and shape its
// chunks described, holding the bytes sent for it.
static void check_delivery(input_state *s, const delivery *g, int *seen) {
    const rt_header *h = g->h;
    if (g->n != 1 || !h->key || h->n_tensors != 1 || (strcmp(h->key, "p0") != 0 && strcmp(h->key, "p1") != 0))
        abort();
    int peer = h->key[1] - '0';
    const dg_tensor *t = g->ts[0];
    if (dg_tensor_nbytes(t) != h->total || dg_tensor_dtype(t) != h->tensors[0].dtype ||
        h->tensors[0].nbytes != h->total || !dg_shape_equal(dg_tensor_shape(t), &h->tensors[0].shape))
        abort();
    xfer_model *m = NULL;
    for (int i = 0; i < s->n_x && !m; i++)
        if (s->x[i].peer == peer && s->x[i].xfer == h->xfer) m = &s->x[i];
    if (!m) abort();   // a transfer nobody sent
    seen[m - s->x]++;
    const unsigned char *b = dg_tensor_data(t);
    for (uint64_t at = 0; at < h->total && !m->foreign_bytes; at += RT_CHUNK_BYTES) {
        size_t n = h->total - at < RT_CHUNK_BYTES ? (size_t)(h->total - at) : RT_CHUNK_BYTES;
        const unsigned char *want = pattern_at(peer, h->xfer, at);
        if (memcmp(b + at, want, n) == 0) continue;
        size_t i = 0;
        while (b[at + i] == want[i]) i++;
        fprintf(stderr, "fuzz_chunks: transfer %llu of peer %d, %llu bytes: byte %llu is %u, sent %u\n",
                (unsigned long long)h->xfer, peer, (unsigned long long)h->total, (unsigned long long)(at + i),
                b[at + i], want[i]);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static input_state s;
    memset(&s, 0, sizeof s);
    s.last_x[0] = s.last_x[1] = -1;
    rt_transport_options o;
    memset(&o, 0, sizeof o);
    o.bind = "tcp://127.0.0.1:*";
    o.name = "/job:fuzz/replica:0/task:0";
    o.quiet = getenv("DG_FUZZ_VERBOSE") == NULL;
    o.busy_poll_us = -1;
    o.liveness_timeout_ms = -1;
    dg_status *st = dg_status_new();
    rt_transport *tp = rt_transport_new(&o, handle, NULL, st);
    if (!tp) {
        fprintf(stderr, "fuzz_chunks: %s\n", dg_status_message(st));
        abort();
    }
    // A context per input: ending it waits until ZeroMQ has freed what the sockets held, so
    // an input's allocations are all undone when it returns (no leak check runs for nothing).
    zctx = zmq_ctx_new();
    if (!zctx) abort();
    pthread_mutex_lock(&mu);
    n_got = 0;
    cur_tp = tp;
    pthread_mutex_unlock(&mu);

    reader r = {data, data + size};
    for (int n = 0; n < MAX_MSGS && r.p < r.end; n++) {
        uint8_t op = (uint8_t)take(&r, 1);
        int peer = op >> 7;
        switch (op & 7) {
        case 5: raw(&s, &r, peer); break;
        case 6: barrier(&s, peer); break;
        case 7: chunk(&s, &r, peer, true); break;
        default: chunk(&s, &r, peer, false); break;
        }
    }
    barrier(&s, 0);
    barrier(&s, 1);

    // Deliveries: every clean transfer once; none beyond the bytes sent for its transfer id.
    pthread_mutex_lock(&mu);
    int seen[2 * MAX_MSGS] = {0};
    uint64_t delivered[2 * MAX_MSGS] = {0};
    for (int i = 0; i < n_got; i++) {
        check_delivery(&s, &got[i], seen);
        for (int k = 0; k < s.n_x; k++)
            if (s.x[k].peer == got[i].h->key[1] - '0' && s.x[k].xfer == got[i].h->xfer) delivered[k] += got[i].h->total;
    }
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < s.n_x; i++)
        if (seen[i] < s.x[i].clean_done || delivered[i] > s.x[i].bytes_sent) {
            fprintf(stderr, "fuzz_chunks: transfer %llu of peer %d: delivered %d times (%llu bytes), %d clean "
                    "transfers sent (%llu bytes in chunks)\n", (unsigned long long)s.x[i].xfer, s.x[i].peer, seen[i],
                    (unsigned long long)delivered[i], s.x[i].clean_done, (unsigned long long)s.x[i].bytes_sent);
            abort();
        }
    // Slots: the receiver freed those of clean transfers, and none it was never sent. What
    // it still holds is freed here.
    for (int i = s.n_desc - 1; i >= 0; i--) {
        // A slot put again later was free then: this descriptor's bytes were let go.
        bool reused = false;
        for (int k = i + 1; k < s.n_desc; k++)
            reused |= memcmp(s.descs[k] + 32, s.descs[i] + 32, 4) == 0;
        void *bytes, *slot;
        bool held = !reused && rt_shm_get(s.descs[i], s.desc_len[i], &bytes, &slot, st);
        dg_status_reset(st);
        if ((held && s.desc_owed[i]) || (!held && !s.desc_sent[i])) {
            fprintf(stderr, "fuzz_chunks: shared-memory descriptor %d (%s a message, %s a clean transfer) is %s\n",
                    i, s.desc_sent[i] ? "in" : "not in", s.desc_owed[i] ? "in" : "not in",
                    held ? "still held" : "freed");
            abort();
        }
        if (held) rt_shm_release(slot);
    }
    if (rt_shm_pool_in_use(pool) != 0) abort();

    for (int p = 0; p < 2; p++)
        if (s.sock[p]) zmq_close(s.sock[p]);
    rt_transport_free(&tp);   // its handler may run until then (PINGs still queued)
    pthread_mutex_lock(&mu);
    cur_tp = NULL;
    pthread_mutex_unlock(&mu);
    zmq_ctx_term(zctx);
    zctx = NULL;
    for (int i = 0; i < n_got; i++) {
        rt_header_clear(got[i].h);
        free(got[i].h);
        for (int k = 0; k < got[i].n; k++) dg_tensor_unref(got[i].ts[k]);
        free(got[i].ts);
    }
    n_got = 0;
    dg_status_free(&st);
    return 0;
}
