/* Stateful libFuzzer target for a whole server (runtime/server, runtime/master, the transport
 * under them): one real server runs in this process for the whole run (dg_server_new on
 * 127.0.0.1), and each input is a sequence of messages sent to it from a ZeroMQ DEALER socket of
 * the input's own, as any peer could send them. Most messages are headers built with
 * rt_header_encode from fields the input chooses (so they decode, and reach the handlers of
 * every message type: PING .. SERVER_STATUS, TENSOR_CHUNK included), some are raw bytes. Handles
 * that the server's answers give out (registered graphs, sessions) can be named by later
 * messages of the same input.
 *
 * Properties, beyond "no crash, no undefined behaviour, no leak at exit":
 *   - after each input the server still answers a PING within 10 s (a server that stops
 *     answering is a failure, as is one that takes over a minute for one input);
 *   - after the input's cleanup (what a well-behaved master does: deregister its graphs, abort
 *     and end its steps, RESET, which closes the sessions), the server holds no registered graph,
 *     no session and no running step (SERVER_STATUS), within 10 s: nothing an input does
 *     leaves state behind that its peer cannot remove;
 *   - the heap does not grow without bound over the run (checked every 256 inputs).
 *
 * Input: items, each starting with a byte op (at most MAX_ITEMS items):
 *   op & 7 in 0..4  a request built from fields (see read_request below)
 *               5   raw bytes: a header (u16 length) and up to 3 frames (u16 length each)
 *               6   wait up to (u8 % 16) ms for answers
 *               7   a new socket (a new peer) in place of the input's
 * DG_FUZZ_WRITE_SEEDS=DIR writes the seed inputs of tests/fuzz/corpus/server (and a few graph
 * files for fuzz_graph_load) into DIR and exits. DG_FUZZ_VERBOSE=1 lets the server log and
 * prints every answer.
 * Built by hand or by run_fuzz.sh server SECONDS, not by CMake: see README.md here. */
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sanitizer/allocator_interface.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "distgraph/distgraph.h"
#include "distgraph/serialize.h"
#include "shm_impl.h"
#include "wire_impl.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_ITEMS 48
#define MAX_STR 255
#define MAX_NAMES 8
#define MAX_TENSORS 3
#define MAX_LEARNED 16
#define MAX_STEPS 64
#define MAX_PENDING 128
#define MAX_FRAME_BYTES ((size_t)1 << 20)
#define ANSWER_MS 10000
#define HEAP_LIMIT ((size_t)1536 << 20)

static dg_server *server;
static char endpoint[64];
static void *zctx;
static rt_shm_pool *pool;
static unsigned char *zeros;   // MAX_FRAME_BYTES + 1
static bool verbose;           // DG_FUZZ_VERBOSE: the server logs, answers are printed

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

// A server that stops answering: with DG_FUZZ_STACKS=1 (and gdb installed), every thread's
// stack goes to stderr first, which tells where it is stuck.
// The first line of /proc/self/task/<tid>/<file> into buf ("" when unreadable).
static void proc_line(const char *tid, const char *file, char *buf, size_t cap) {
    char path[300];
    snprintf(path, sizeof path, "/proc/self/task/%s/%s", tid, file);
    buf[0] = 0;
    FILE *f = fopen(path, "re");
    if (!f) return;
    if (!fgets(buf, (int)cap, f)) buf[0] = 0;
    fclose(f);
}

// Each thread's name, scheduler state and /proc schedstat (ns on a CPU, ns runnable waiting
// for one, times run): a thread runnable but never run shows its wait growing.
static void thread_states(void) {
    DIR *d = opendir("/proc/self/task");
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9') continue;
        char comm[64], stat[512], sched[128];
        proc_line(de->d_name, "comm", comm, sizeof comm);
        proc_line(de->d_name, "stat", stat, sizeof stat);
        proc_line(de->d_name, "schedstat", sched, sizeof sched);
        comm[strcspn(comm, "\n")] = 0;
        sched[strcspn(sched, "\n")] = 0;
        const char *st = strrchr(stat, ')');
        fprintf(stderr, "fuzz_server: thread %s %-16s state %c schedstat %s\n", de->d_name, comm,
                st && st[1] && st[2] ? st[2] : '?', sched);
    }
    if (d) closedir(d);
}

static void probe_fresh_socket(void);

static void hang(const char *what) {
    fprintf(stderr, "fuzz_server: %s\n", what);
    if (getenv("DG_FUZZ_STACKS")) {
        thread_states();
        usleep(200000);
        thread_states();
        probe_fresh_socket();
        char cmd[128];
        snprintf(cmd, sizeof cmd, "gdb -p %d -batch -ex 'thread apply all bt' 1>&2", (int)getpid());
        if (system(cmd) != 0) fprintf(stderr, "fuzz_server: %s failed\n", cmd);
    }
    abort();
}

// ---- the input's grammar: read (fuzzing) and written (seeds) in the same order ----

typedef struct reader {
    const uint8_t *p, *end;
} reader;

static uint64_t take(reader *r, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)(r->p < r->end ? *r->p++ : 0) << (8 * i);
    return v;
}

// A string: a length byte and that many bytes; a NUL ends it early (headers carry C strings).
static void take_str(reader *r, char *out) {
    size_t n = (size_t)take(r, 1);
    for (size_t i = 0; i < n; i++) out[i] = (char)take(r, 1);
    out[n] = 0;
}

typedef struct tensor_spec {
    uint8_t dtype_sel, rank;
    uint16_t dims[4];
    uint8_t mode;            // % 4: 0 bytes from the input, 1 zeros, 2 one byte too many, 3 shared memory
    size_t n_content;        // mode 0: bytes of content that follow in the input (the rest zeros)
    const uint8_t *content;
} tensor_spec;

// Request fields. Flags f: bit 0 one-way (id 0); bit 1 step as 8 raw bytes, else 1 + (u8 % 4);
// bit 2 handle as 8 raw bytes, else the learned handle number u8 (0 when none; a request that
// may name a handle first waits up to 1 s for the answers that give handles out); bit 3 key;
// bit 4 names (u8 count % 9, each a string) and n_feeds (u8 % (count + 1)); bit 5 tensors (u8
// count % 4, each: dtype u8 (float32, float64, int32, uint8, int64, bool), rank u8 % 5, dims
// u16 each, mode u8, for mode 0 the bytes); bit 6 blob (u16 length, bytes); bit 7 code (u8 %
// 17) and message. TENSOR_CHUNK adds xfer (u8) and offset and total (u8 MiB and u16 bytes each);
// its tensor's frame is the piece at the offset, not the whole tensor.
typedef struct request {
    uint8_t type_sel, flags;
    uint64_t step_raw;
    uint8_t step_small;
    uint64_t handle_raw;
    uint8_t handle_sel;
    char key[MAX_STR + 1];
    uint8_t n_names, nf_sel;
    char names[MAX_NAMES][MAX_STR + 1];
    uint8_t n_tensors;
    tensor_spec ts[MAX_TENSORS];
    uint16_t blob_len;
    const uint8_t *blob;
    uint8_t code;
    char msg[MAX_STR + 1];
    uint8_t xfer, off_mib, total_mib;
    uint16_t off_bytes, total_bytes;
} request;

static const dg_dtype dtypes[] = {DG_FLOAT32, DG_FLOAT64, DG_INT32, DG_UINT8, DG_INT64, DG_BOOL};

static int req_type(const request *q) { return 1 + q->type_sel % RT_TYPE_MAX; }

static uint64_t spec_nbytes(const tensor_spec *t) {
    uint64_t n = dg_dtype_size(dtypes[t->dtype_sel % 6]);
    for (int k = 0; k < t->rank % 5; k++) n *= t->dims[k];
    return n;
}

static void read_request(reader *r, request *q) {
    memset(q, 0, sizeof *q);
    q->type_sel = (uint8_t)take(r, 1);
    q->flags = (uint8_t)take(r, 1);
    if (q->flags & 2) q->step_raw = take(r, 8);
    else q->step_small = (uint8_t)take(r, 1);
    if (q->flags & 4) q->handle_raw = take(r, 8);
    else q->handle_sel = (uint8_t)take(r, 1);
    if (q->flags & 8) take_str(r, q->key);
    if (q->flags & 16) {
        q->n_names = (uint8_t)(take(r, 1) % (MAX_NAMES + 1));
        for (int i = 0; i < q->n_names; i++) take_str(r, q->names[i]);
        q->nf_sel = (uint8_t)take(r, 1);
    }
    if (q->flags & 32) {
        q->n_tensors = (uint8_t)(take(r, 1) % (MAX_TENSORS + 1));
        for (int i = 0; i < q->n_tensors; i++) {
            tensor_spec *t = &q->ts[i];
            t->dtype_sel = (uint8_t)take(r, 1);
            t->rank = (uint8_t)(take(r, 1) % 5);
            for (int k = 0; k < t->rank; k++) t->dims[k] = (uint16_t)take(r, 2);
            t->mode = (uint8_t)take(r, 1);
            if (t->mode % 4 == 0) {
                uint64_t want = spec_nbytes(t) < 4096 ? spec_nbytes(t) : 4096;
                t->content = r->p;
                t->n_content = (size_t)(want < (uint64_t)(r->end - r->p) ? want : (uint64_t)(r->end - r->p));
                r->p += t->n_content;
            }
        }
    }
    if (q->flags & 64) {
        q->blob_len = (uint16_t)take(r, 2);
        if (q->blob_len > r->end - r->p) q->blob_len = (uint16_t)(r->end - r->p);
        q->blob = r->p;
        r->p += q->blob_len;
    }
    if (q->flags & 128) {
        q->code = (uint8_t)(take(r, 1) % 17);
        take_str(r, q->msg);
    }
    if (req_type(q) == RT_TENSOR_CHUNK) {
        q->xfer = (uint8_t)take(r, 1);
        q->off_mib = (uint8_t)take(r, 1);
        q->off_bytes = (uint16_t)take(r, 2);
        q->total_mib = (uint8_t)take(r, 1);
        q->total_bytes = (uint16_t)take(r, 2);
    }
}

// The writer of seeds: the same fields in the same order.
typedef struct writer {
    uint8_t *buf;
    size_t len, cap;
} writer;

static void put(writer *w, uint64_t v, int n) {
    if (w->len + (size_t)n > w->cap) {
        w->cap = (w->len + (size_t)n) * 2 + 256;
        w->buf = realloc(w->buf, w->cap);
        if (!w->buf) abort();
    }
    for (int i = 0; i < n; i++) w->buf[w->len++] = (uint8_t)(v >> (8 * i));
}

static void put_bytes(writer *w, const void *p, size_t n) {
    for (size_t i = 0; i < n; i++) put(w, ((const uint8_t *)p)[i], 1);
}

static void put_str(writer *w, const char *s) {
    size_t n = strlen(s);
    if (n > MAX_STR) abort();
    put(w, n, 1);
    put_bytes(w, s, n);
}

static void write_request(writer *w, const request *q) {
    put(w, q->type_sel, 1);
    put(w, q->flags, 1);
    if (q->flags & 2) put(w, q->step_raw, 8);
    else put(w, q->step_small, 1);
    if (q->flags & 4) put(w, q->handle_raw, 8);
    else put(w, q->handle_sel, 1);
    if (q->flags & 8) put_str(w, q->key);
    if (q->flags & 16) {
        put(w, q->n_names, 1);
        for (int i = 0; i < q->n_names; i++) put_str(w, q->names[i]);
        put(w, q->nf_sel, 1);
    }
    if (q->flags & 32) {
        put(w, q->n_tensors, 1);
        for (int i = 0; i < q->n_tensors; i++) {
            const tensor_spec *t = &q->ts[i];
            put(w, t->dtype_sel, 1);
            put(w, t->rank, 1);
            for (int k = 0; k < t->rank; k++) put(w, t->dims[k], 2);
            put(w, t->mode, 1);
            if (t->mode % 4 == 0) put_bytes(w, t->content, t->n_content);
        }
    }
    if (q->flags & 64) {
        put(w, q->blob_len, 2);
        put_bytes(w, q->blob, q->blob_len);
    }
    if (q->flags & 128) {
        put(w, q->code, 1);
        put_str(w, q->msg);
    }
    if (req_type(q) == RT_TENSOR_CHUNK) {
        put(w, q->xfer, 1);
        put(w, q->off_mib, 1);
        put(w, q->off_bytes, 2);
        put(w, q->total_mib, 1);
        put(w, q->total_bytes, 2);
    }
}

// ---- one input's conversation with the server ----

typedef struct pending_req {
    uint64_t id;
    int type;
} pending_req;

typedef struct session {
    void *sock;
    uint64_t next_id;
    int64_t learned[MAX_LEARNED];   // handles from answers, in order
    int n_learned;
    int64_t steps[MAX_STEPS];       // step ids named by anything sent
    int n_steps;
    pending_req pending[MAX_PENDING];
    int n_pending;
    unsigned char descs[RT_SHM_SLOTS][RT_SHM_DESC_BYTES];   // shared-memory frames sent
    size_t desc_len[RT_SHM_SLOTS];
    int n_descs;
} session;

static void *new_socket(void) {
    void *so = zmq_socket(zctx, ZMQ_DEALER);
    int zero = 0;
    if (!so) abort();
    zmq_setsockopt(so, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(so, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(so, ZMQ_RCVHWM, &zero, sizeof zero);
    if (zmq_connect(so, endpoint) != 0) abort();
    return so;
}

static void note_step(session *s, int64_t step) {
    for (int i = 0; i < s->n_steps; i++)
        if (s->steps[i] == step) return;
    if (s->n_steps < MAX_STEPS) s->steps[s->n_steps++] = step;
}

// What was sent, as the server will read it: its id (for the answer) and its step.
static void note_sent(session *s, const void *hdr, size_t len) {
    rt_header h;
    dg_status *st = dg_status_new();
    if (rt_header_decode(hdr, len, &h, st)) {
        if (h.step_id) note_step(s, h.step_id);
        if (h.id && s->n_pending < MAX_PENDING) s->pending[s->n_pending++] = (pending_req){h.id, h.type};
    }
    rt_header_clear(&h);
    dg_status_free(&st);
}

static void send_frames(session *s, const void *hdr, size_t hdr_len, const void *const *frames, const size_t *lens,
                        int n) {
    note_sent(s, hdr, hdr_len);
    if (zmq_send(s->sock, hdr, hdr_len, n > 0 ? ZMQ_SNDMORE : 0) < 0) abort();
    for (int i = 0; i < n; i++)
        if (zmq_send(s->sock, frames[i], lens[i], i + 1 < n ? ZMQ_SNDMORE : 0) < 0) abort();
}

static void send_header(session *s, rt_header *h) {
    size_t len;
    char *buf = rt_header_encode(h, &len);
    send_frames(s, buf, len, NULL, NULL, 0);
    free(buf);
    rt_header_clear(h);
}

// Reads answers for up to wait_ms (0: only those already here). Learns handles; returns the
// answer to request `id` (decoded into *out, which the caller clears) when it comes.
static bool read_answers(session *s, int64_t wait_ms, uint64_t id, rt_header *out) {
    int64_t deadline = now_ms() + wait_ms;
    for (;;) {
        zmq_pollitem_t it = {s->sock, 0, ZMQ_POLLIN, 0};
        int64_t left = deadline - now_ms();
        if (zmq_poll(&it, 1, left > 0 ? (long)left : 0) <= 0) return false;
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, s->sock, 0) < 0) abort();
        bool more = zmq_msg_more(&m);
        rt_header h;
        dg_status *st = dg_status_new();
        bool ok = rt_header_decode(zmq_msg_data(&m), zmq_msg_size(&m), &h, st);
        dg_status_free(&st);
        zmq_msg_close(&m);
        while (more) {
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, s->sock, 0) < 0) abort();
            more = zmq_msg_more(&m);
            zmq_msg_close(&m);
        }
        if (!ok || h.type != RT_RESPONSE) {
            // A server answers only with RESPONSE headers it encoded itself.
            fprintf(stderr, "fuzz_server: an answer that is not a RESPONSE header\n");
            abort();
        }
        if (verbose)
            fprintf(stderr, "fuzz_server: answer to %llu: %s%s%s%s\n", (unsigned long long)h.id,
                    dg_code_name((dg_code)h.code), h.message ? " " : "", h.message ? h.message : "",
                    h.handle ? " (a handle)" : "");
        for (int i = 0; i < s->n_pending; i++)
            if (s->pending[i].id == h.id) {
                if (h.handle && h.code == DG_OK && s->n_learned < MAX_LEARNED) s->learned[s->n_learned++] = h.handle;
                s->pending[i] = s->pending[--s->n_pending];
                break;
            }
        if (id && h.id == id) {
            *out = h;
            return true;
        }
        rt_header_clear(&h);
    }
}

// Waits (up to wait_ms) for the answers that make state: registered graphs and sessions.
static void settle(session *s, int64_t wait_ms) {
    int64_t deadline = now_ms() + wait_ms;
    for (;;) {
        bool waiting = false;
        for (int i = 0; i < s->n_pending; i++) {
            int t = s->pending[i].type;
            waiting |= t == RT_REGISTER_GRAPH || t == RT_CREATE_SESSION || t == RT_EXTEND_SESSION;
        }
        if (!waiting || now_ms() >= deadline) return;
        read_answers(s, 10, 0, NULL);
    }
}

// Sends a request and waits for its answer (into *resp, cleared by the caller). false when
// none came within wait_ms.
static bool call(session *s, rt_header *h, int64_t wait_ms, rt_header *resp) {
    h->id = ++s->next_id | ((uint64_t)1 << 62);   // apart from the input's own ids
    uint64_t id = h->id;
    send_header(s, h);
    return read_answers(s, wait_ms, id, resp);
}

// Does the server answer a PING from a new peer (a new socket, its own connection)?
static void probe_fresh_socket(void) {
    session *t = calloc(1, sizeof *t);
    if (!t) return;
    t->sock = new_socket();
    rt_header h, resp;
    rt_header_init(&h, RT_PING);
    bool ok = call(t, &h, 3000, &resp);
    fprintf(stderr, "fuzz_server: a PING from a new socket: %s\n", ok ? "answered" : "no answer in 3 s");
    if (ok) rt_header_clear(&resp);
    zmq_close(t->sock);
    free(t);
}

static void send_request(session *s, const request *q) {
    rt_header h;
    rt_header_init(&h, req_type(q));
    h.from = strdup("/job:fuzz/replica:0/task:0");
    if (!(q->flags & 1)) h.id = ++s->next_id;
    h.step_id = (q->flags & 2) ? (int64_t)q->step_raw : 1 + q->step_small % 4;
    if (q->flags & 4) {
        h.handle = (int64_t)q->handle_raw;
    } else {
        // A handle given out by an answer still on its way is worth waiting for.
        if (h.type != RT_REGISTER_GRAPH && h.type != RT_CREATE_SESSION && h.type != RT_TENSOR &&
            h.type != RT_TENSOR_CHUNK && h.type != RT_PING)
            settle(s, 1000);
        h.handle = s->n_learned ? s->learned[q->handle_sel % s->n_learned] : 0;
    }
    if (q->flags & 8) h.key = strdup(q->key);
    for (int i = 0; i < q->n_names; i++) rt_header_add_name(&h, q->names[i]);
    h.n_feeds = q->nf_sel % (q->n_names + 1);
    if (q->flags & 64) rt_header_set_blob(&h, q->blob, q->blob_len);
    if (q->flags & 128) {
        h.code = q->code;
        rt_header_set_message(&h, q->msg);
    }
    uint64_t piece_off = 0, piece_total = 0;
    if (h.type == RT_TENSOR_CHUNK) {
        h.xfer = q->xfer;
        h.offset = piece_off = ((uint64_t)q->off_mib << 20) + q->off_bytes;
        h.total = piece_total = ((uint64_t)q->total_mib << 20) + q->total_bytes;
    }
    // Tensor descriptions and their frames.
    const void *frames[MAX_TENSORS];
    size_t lens[MAX_TENSORS];
    unsigned char desc[MAX_TENSORS][RT_SHM_DESC_BYTES];
    unsigned char *owned[MAX_TENSORS] = {NULL};
    if (q->n_tensors) {
        h.tensors = calloc(q->n_tensors, sizeof *h.tensors);
        if (!h.tensors) abort();
    }
    for (int i = 0; i < q->n_tensors; i++) {
        const tensor_spec *t = &q->ts[i];
        rt_tensor_desc *d = &h.tensors[h.n_tensors++];
        d->dtype = dtypes[t->dtype_sel % 6];
        d->shape = dg_shape_scalar();
        d->shape.rank = t->rank;
        for (int k = 0; k < t->rank; k++) d->shape.dims[k] = t->dims[k];
        d->nbytes = spec_nbytes(t);
        uint64_t want = d->nbytes;
        if (h.type == RT_TENSOR_CHUNK)   // the piece at the offset, as a sender cuts it
            want = piece_off < piece_total ? (piece_total - piece_off < RT_CHUNK_BYTES ? piece_total - piece_off
                                                                                       : RT_CHUNK_BYTES)
                                           : 0;
        int mode = t->mode % 4;
        frames[i] = zeros;
        lens[i] = 0;
        if (want > MAX_FRAME_BYTES) continue;   // an empty frame: too short, refused
        lens[i] = (size_t)want;
        if (mode == 0 && t->n_content) {
            owned[i] = calloc(1, (size_t)want + 1);
            if (!owned[i]) abort();
            memcpy(owned[i], t->content, t->n_content < want ? t->n_content : (size_t)want);
            frames[i] = owned[i];
        } else if (mode == 2) {
            lens[i] = (size_t)want + 1;
        } else if (mode == 3 && want >= RT_SHM_MIN_BYTES && want <= RT_SHM_SLOT_BYTES && s->n_descs < RT_SHM_SLOTS &&
                   rt_shm_put(pool, zeros, (size_t)want, desc[i])) {
            memcpy(s->descs[s->n_descs], desc[i], RT_SHM_DESC_BYTES);
            s->desc_len[s->n_descs++] = (size_t)want;
            frames[i] = desc[i];
            lens[i] = RT_SHM_DESC_BYTES;
        }
    }
    size_t len;
    char *buf = rt_header_encode(&h, &len);
    send_frames(s, buf, len, frames, lens, q->n_tensors);
    free(buf);
    rt_header_clear(&h);
    for (int i = 0; i < q->n_tensors; i++) free(owned[i]);
}

static void send_raw(session *s, reader *r) {
    size_t hl = (size_t)(take(r, 2) % 4097);
    uint8_t *hb = calloc(1, hl + 1);
    if (!hb) abort();
    for (size_t i = 0; i < hl; i++) hb[i] = (uint8_t)take(r, 1);
    int n = (int)(take(r, 1) % 4);
    uint8_t *fb[3] = {NULL};
    const void *frames[3];
    size_t lens[3];
    for (int f = 0; f < n; f++) {
        lens[f] = (size_t)(take(r, 2) % 4097);
        fb[f] = calloc(1, lens[f] + 1);
        if (!fb[f]) abort();
        for (size_t i = 0; i < lens[f]; i++) fb[f][i] = (uint8_t)take(r, 1);
        frames[f] = fb[f];
    }
    send_frames(s, hb, hl, frames, lens, n);
    free(hb);
    for (int f = 0; f < n; f++) free(fb[f]);
}

// The counters SERVER_STATUS reports, by name; -1 when absent.
static int64_t counter(const rt_header *h, const char *name) {
    size_t n = strlen(name);
    for (int i = 0; i < h->n_names; i++)
        if (strncmp(h->names[i], name, n) == 0 && h->names[i][n] == '=') return strtoll(h->names[i] + n + 1, NULL, 10);
    return -1;
}

// What a master does when it is done, then the checks: the server answers, and holds nothing.
static void cleanup_and_check(session *s) {
    settle(s, 3000);
    for (int i = 0; i < s->n_learned; i++) {
        rt_header h;
        rt_header_init(&h, RT_DEREGISTER_GRAPH);
        h.handle = s->learned[i];
        send_header(s, &h);
    }
    for (int i = 0; i < s->n_steps; i++) {
        rt_header h;
        rt_header_init(&h, RT_ABORT_STEP);
        h.step_id = s->steps[i];
        send_header(s, &h);
        rt_header_init(&h, RT_END_STEP);
        h.step_id = s->steps[i];
        send_header(s, &h);
    }
    rt_header h, resp;
    rt_header_init(&h, RT_RESET);
    if (call(s, &h, ANSWER_MS, &resp)) rt_header_clear(&resp);
    rt_header_init(&h, RT_PING);
    if (!call(s, &h, ANSWER_MS, &resp)) hang("the server did not answer a PING within 10 s after the input");
    rt_header_clear(&resp);
    // Steps end and sessions close asynchronously: ask until nothing is left, for a while.
    int64_t deadline = now_ms() + ANSWER_MS;
    for (int k = 0;; k++) {
        rt_header_init(&h, RT_SERVER_STATUS);
        if (!call(s, &h, ANSWER_MS, &resp)) hang("the server did not answer SERVER_STATUS within 10 s");
        int64_t graphs = counter(&resp, "registered_graphs"), sessions = counter(&resp, "master_sessions"),
                steps = counter(&resp, "running_steps");
        rt_header_clear(&resp);
        if (graphs == 0 && sessions == 0 && steps == 0) break;
        if (now_ms() > deadline) {
            char what[200];
            snprintf(what, sizeof what, "state left behind by the input: registered_graphs=%lld master_sessions=%lld "
                     "running_steps=%lld", (long long)graphs, (long long)sessions, (long long)steps);
            hang(what);
        }
        struct timespec ts = {0, (k < 10 ? 1 : 20) * 1000000L};
        nanosleep(&ts, NULL);
    }
    // Slots the server did not take (malformed messages) are ours to free.
    for (int i = 0; i < s->n_descs; i++) {
        void *bytes, *slot;
        dg_status *st = dg_status_new();
        if (rt_shm_get(s->descs[i], s->desc_len[i], &bytes, &slot, st)) rt_shm_release(slot);
        dg_status_free(&st);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static session s;
    static uint64_t runs;
    uint64_t next_id = s.next_id;
    memset(&s, 0, sizeof s);
    s.next_id = next_id;   // ids keep counting: a late answer never matches a new request
    s.sock = new_socket();
    int64_t start = now_ms();
    reader r = {data, data + size};
    for (int n = 0; n < MAX_ITEMS && r.p < r.end; n++) {
        uint8_t op = (uint8_t)take(&r, 1);
        switch (op & 7) {
        case 5: send_raw(&s, &r); break;
        case 6: read_answers(&s, (int64_t)(take(&r, 1) % 16), 0, NULL); break;
        case 7:
            settle(&s, 1000);
            zmq_close(s.sock);
            s.sock = new_socket();
            break;
        default: {
            request q;
            read_request(&r, &q);
            send_request(&s, &q);
            break;
        }
        }
        read_answers(&s, 0, 0, NULL);
    }
    cleanup_and_check(&s);
    zmq_close(s.sock);
    s.sock = NULL;
    if (now_ms() - start > 60000) {
        fprintf(stderr, "fuzz_server: one input took %lld ms\n", (long long)(now_ms() - start));
        abort();
    }
    if ((++runs & 255) == 0) {
        size_t heap = __sanitizer_get_current_allocated_bytes();
        if (verbose) fprintf(stderr, "fuzz_server: %llu inputs, heap %zu bytes\n",
                                              (unsigned long long)runs, heap);
        if (heap > HEAP_LIMIT) {
            fprintf(stderr, "fuzz_server: the heap holds %zu bytes after %llu inputs\n", heap, (unsigned long long)runs);
            abort();
        }
    }
    return 0;
}

// ---- setup ----

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        abort();
    close(fd);
    return ntohs(a.sin_port);
}

static void shutdown_server(void) {
    // Freed, so that LeakSanitizer's report at exit names what was lost, not what the server holds.
    dg_server_free(&server);
    if (zctx) zmq_ctx_term(zctx);
    rt_shm_pool_free(&pool);
    free(zeros);
}

static void write_seeds(const char *dir);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *seeds = getenv("DG_FUZZ_WRITE_SEEDS");
    if (seeds) {
        write_seeds(seeds);
        exit(0);
    }
    dg_status *st = dg_status_new();
    dg_server_options o = dg_server_options_default();
    verbose = getenv("DG_FUZZ_VERBOSE") != NULL;
    o.quiet = !verbose;
    o.service_threads = 2;
    o.master_threads = 4;
    o.client_lease_ms = 2000;
    o.rpc_timeout_ms = 5000;
    o.busy_poll_us = -1;
    dg_set_malloc_tuning(false);
    for (int attempt = 0; !server && attempt < 20; attempt++) {
        char addr[64];
        snprintf(addr, sizeof addr, "127.0.0.1:%d", free_port());
        dg_cluster *c = dg_cluster_new();
        if (!dg_cluster_add_task(c, "worker", 0, addr, st)) abort();
        dg_status_reset(st);
        server = dg_server_new(c, "worker", 0, &o, st);
        dg_cluster_free(&c);
        if (server) snprintf(endpoint, sizeof endpoint, "tcp://%s", addr);
    }
    pool = rt_shm_pool_new(st);
    zctx = zmq_ctx_new();
    zeros = calloc(1, MAX_FRAME_BYTES + 1);
    if (!server || !pool || !zctx || !zeros) {
        fprintf(stderr, "fuzz_server: cannot start: %s\n", dg_status_message(st));
        abort();
    }
    dg_status_free(&st);
    atexit(shutdown_server);
    return 0;
}

// ---- seeds ----

#define TASK "/job:worker/replica:0/task:0"

static void save(const char *dir, const char *name, const void *buf, size_t len) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "fuzz_server: cannot write %s\n", path);
        exit(1);
    }
}

static void check(bool ok, dg_status *st) {
    if (ok) return;
    fprintf(stderr, "fuzz_server: building a seed: %s\n", dg_status_message(st));
    exit(1);
}

// A partition as a master registers it: x (float32 [2]) comes from the client's CPU:1 in a
// _Recv, w (a variable) is initialized, y = x * 2 + w is sent back. *key gets the
// rendezvous key the partition waits for x under.
static char *partition_blob(size_t *len, char *key, size_t key_cap) {
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    dg_graph_push_device(g, TASK "/device:CPU:1");
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape1(2));
    dg_graph_pop_device(g);
    dg_graph_push_device(g, TASK "/device:CPU:0");
    dg_output w = dg_variable(g, "fuzz_w", DG_FLOAT32, dg_shape1(2), dg_init_ones());
    dg_tensor *two = dg_tensor_scalar_f32(2);
    // Each step initializes w; y reads the value the initializer assigned (a variable's node
    // gives the value it holds when it runs, which may be before the initializer).
    dg_output winit = {dg_variable_initializer(w), 0};
    dg_output y = dg_add(g, "y", dg_mul(g, NULL, x, dg_const(g, "two", two)), winit);
    dg_tensor_unref(two);
    dg_graph_pop_device(g);
    check(dg_graph_check(g, st), st);
    int n = dg_graph_num_nodes(g);
    dg_node **nodes = malloc((size_t)n * sizeof *nodes);
    for (int i = 0; i < n; i++) nodes[i] = dg_graph_node(g, i);
    const char *devices[] = {TASK "/device:CPU:0", TASK "/device:CPU:1"};
    dg_placement_options po = dg_placement_options_default();
    check(dg_place(nodes, n, devices, 2, &po, st), st);
    dg_output fetch_at;
    dg_partitions *p = dg_partition_ex(nodes, n, &x, 1, &y, 1, TASK "/device:CPU:1", 1, &fetch_at, st);
    check(p != NULL, st);
    char *buf = NULL;
    for (int i = 0; i < dg_partitions_count(p); i++) {
        if (strcmp(dg_partitions_device(p, i), TASK "/device:CPU:0") != 0) continue;
        dg_graph *pg = dg_partitions_graph(p, i);
        for (int k = 0; k < dg_graph_num_nodes(pg); k++) {
            dg_node *nd = dg_graph_node(pg, k);
            if (strcmp(dg_node_op_type(nd), "_Recv") != 0) continue;
            int64_t inc = 1;
            dg_node_attr_int(nd, "send_device_incarnation", &inc);
            snprintf(key, key_cap, "%s;%016llx;%s;%s;0:0", dg_node_attr_string(nd, "send_device"),
                     (unsigned long long)inc, dg_node_attr_string(nd, "recv_device"),
                     dg_node_attr_string(nd, "tensor_name"));
        }
        check(dg_graph_to_msgpack(pg, &buf, len, st), st);
    }
    if (!buf) exit(1);
    dg_partitions_free(&p);
    free(nodes);
    dg_graph_free(&g);
    dg_status_free(&st);
    return buf;
}

// A client's graph for a remote session: x fed, v a variable, y = x + v fetched, "init" and
// "train" (v += x) as targets.
static char *session_blob(size_t *len) {
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape1(2));
    dg_output v = dg_variable(g, "fuzz_v", DG_FLOAT32, dg_shape1(2), dg_init_zeros());
    dg_add(g, "y", x, v);
    dg_assign_add(g, "train", v, x);
    dg_global_variables_initializer(g);
    char *buf = NULL;
    check(dg_graph_to_msgpack(g, &buf, len, st), st);
    dg_graph_free(&g);
    dg_status_free(&st);
    return buf;
}

static request req(int type, uint8_t flags) {
    request q;
    memset(&q, 0, sizeof q);
    q.type_sel = (uint8_t)(type - 1);
    q.flags = flags;
    return q;
}

static void item(writer *w, const request *q) {
    put(w, 0, 1);
    write_request(w, q);
}

static void wait_item(writer *w, int ms) {
    put(w, 6, 1);
    put(w, (uint64_t)ms, 1);
}

static tensor_spec float2(const float *v) {
    tensor_spec t = {0, 1, {2, 0, 0, 0}, 0, sizeof(float) * 2, (const uint8_t *)v};
    return t;
}

static void write_seeds(const char *dir) {
    char sdir[512], gdir[512];
    snprintf(sdir, sizeof sdir, "%s/server", dir);
    snprintf(gdir, sizeof gdir, "%s/graph_load", dir);
    mkdir(dir, 0755);
    mkdir(sdir, 0755);
    mkdir(gdir, 0755);
    static const float two[2] = {1.5f, -2.0f};
    char key[512];
    size_t plen, slen;
    char *pblob = partition_blob(&plen, key, sizeof key);
    char *sblob = session_blob(&slen);
    save(gdir, "partition.graph", pblob, plen);
    save(gdir, "session.graph", sblob, slen);
    writer w = {0};
    request q;

    // The I/O thread's requests.
    q = req(RT_PING, 32);
    q.n_tensors = 1;
    q.ts[0] = float2(two);
    item(&w, &q);
    item(&w, (q = req(RT_LIST_DEVICES, 0), &q));
    item(&w, (q = req(RT_SERVER_STATUS, 0), &q));
    wait_item(&w, 5);
    save(sdir, "ping_devices_status", w.buf, w.len);
    w.len = 0;

    // A worker's life: register, run a step fed by a TENSOR, read the variable, deregister.
    item(&w, (q = req(RT_REGISTER_GRAPH, 64), q.blob = (const uint8_t *)pblob, q.blob_len = (uint16_t)plen, &q));
    wait_item(&w, 15);
    q = req(RT_RUN_GRAPH, 0);
    item(&w, &q);
    q = req(RT_TENSOR, 1 | 8 | 32);
    snprintf(q.key, sizeof q.key, "%s", key);
    q.n_tensors = 1;
    q.ts[0] = float2(two);
    item(&w, &q);
    wait_item(&w, 10);
    q = req(RT_GET_VARIABLES, 16);
    q.n_names = 1;
    snprintf(q.names[0], sizeof q.names[0], "fuzz_w");
    item(&w, &q);
    item(&w, (q = req(RT_DEREGISTER_GRAPH, 0), &q));
    wait_item(&w, 5);
    save(sdir, "register_run_tensor", w.buf, w.len);
    w.len = 0;

    // A remote client's session: create, run (init, then a step with a feed), keepalive,
    // extend, close.
    q = req(RT_CREATE_SESSION, 16 | 64);
    q.n_names = 1;
    snprintf(q.names[0], sizeof q.names[0], "inter_op_threads=1");
    q.blob = (const uint8_t *)sblob;
    q.blob_len = (uint16_t)slen;
    item(&w, &q);
    wait_item(&w, 15);
    q = req(RT_RUN_STEP, 16);
    q.n_names = 1;
    snprintf(q.names[0], sizeof q.names[0], "^init");
    item(&w, &q);
    q = req(RT_RUN_STEP, 16 | 32);
    q.n_names = 3;
    snprintf(q.names[0], sizeof q.names[0], "x:0");
    snprintf(q.names[1], sizeof q.names[1], "y:0");
    snprintf(q.names[2], sizeof q.names[2], "^train");
    q.nf_sel = 1;
    q.n_tensors = 1;
    q.ts[0] = float2(two);
    item(&w, &q);
    wait_item(&w, 15);
    item(&w, (q = req(RT_KEEPALIVE, 0), &q));
    item(&w, (q = req(RT_EXTEND_SESSION, 64), q.blob = (const uint8_t *)sblob, q.blob_len = (uint16_t)slen, &q));
    wait_item(&w, 10);
    item(&w, (q = req(RT_CLOSE_SESSION, 0), &q));
    wait_item(&w, 5);
    save(sdir, "session_lifecycle", w.buf, w.len);
    w.len = 0;

    // A 5 MiB push in chunks, as a sender cuts it: pieces through shared memory, then the
    // partition runs for that step, then the step is aborted and ended.
    for (int k = 0; k < 5; k++) {
        q = req(RT_TENSOR_CHUNK, 1 | 8 | 32);
        snprintf(q.key, sizeof q.key, "%s", key);
        q.n_tensors = 1;
        q.ts[0] = (tensor_spec){3, 2, {160, 32768, 0, 0}, 3, 0, NULL};   // uint8 [160, 32768]
        q.xfer = 1;
        q.off_mib = (uint8_t)k;
        q.total_mib = 5;
        item(&w, &q);
    }
    q = req(RT_ABORT_STEP, 1 | 128);
    q.code = DG_ABORTED;
    snprintf(q.msg, sizeof q.msg, "fuzz");
    item(&w, &q);
    item(&w, (q = req(RT_END_STEP, 1), &q));
    wait_item(&w, 5);
    save(sdir, "chunks_abort_end", w.buf, w.len);
    w.len = 0;

    // Bad ones: a header that is not msgpack, a frame that disagrees with its header, a graph
    // placed elsewhere, a RESPONSE sent to a server, RESET.
    put(&w, 5, 1);
    put(&w, 3, 2);
    put_bytes(&w, "\xc1\x00\xff", 3);
    put(&w, 0, 1);
    q = req(RT_PING, 32);
    q.n_tensors = 1;
    q.ts[0] = float2(two);
    q.ts[0].mode = 2;
    item(&w, &q);
    item(&w, (q = req(RT_REGISTER_GRAPH, 64), q.blob = (const uint8_t *)sblob, q.blob_len = (uint16_t)slen, &q));
    item(&w, (q = req(RT_RESPONSE, 0), &q));
    item(&w, (q = req(RT_RESET, 0), &q));
    wait_item(&w, 10);
    save(sdir, "malformed_and_reset", w.buf, w.len);
    free(w.buf);
    free(pblob);
    free(sblob);
    fprintf(stderr, "fuzz_server: seeds written to %s and %s\n", sdir, gdir);
}
