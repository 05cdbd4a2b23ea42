/* The wire format (docs/PROTOCOL.md): a message is one msgpack header map followed by zero
 * or more raw tensor frames. rt_header is the decoded header; every field is validated by
 * rt_header_decode before anyone reads it. */
#ifndef DG_WIRE_IMPL_H
#define DG_WIRE_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "distgraph/tensor.h"

#define RT_PROTOCOL_VERSION 1
#define RT_MAX_HEADER_BYTES (256u << 20)   // graphs travel in the header
#define RT_MAX_NAMES 1000000
#define RT_MAX_TENSORS 100000
#define RT_MAX_STRING 65536
#define RT_CHUNK_BYTES ((size_t)1 << 20)   // tensors above 4 chunks travel in chunks

typedef enum rt_type {
    RT_RESPONSE = 1,
    RT_PING = 2,
    RT_LIST_DEVICES = 3,
    RT_REGISTER_GRAPH = 4,
    RT_DEREGISTER_GRAPH = 5,
    RT_RUN_GRAPH = 6,
    RT_TENSOR = 7,          // one-way push: a rendezvous value (frame follows)
    RT_TENSOR_CHUNK = 8,    // one-way push: part of a large rendezvous value
    RT_ABORT_STEP = 9,
    RT_END_STEP = 10,
    RT_GET_VARIABLES = 11,  // fetch variables by name from the task's resources
    // The master service (a client process talks to the master of a task):
    RT_CREATE_SESSION = 12, // blob: the graph; names: "option=value"; answer: handle
    RT_EXTEND_SESSION = 13, // handle; blob: the whole graph again, grown since
    RT_RUN_STEP = 14,       // handle; names: feeds, fetches ("node:index"), targets ("^node"); frames: feeds
    RT_CLOSE_SESSION = 15,  // handle
    RT_KEEPALIVE = 16,      // handle: the client is alive (NOT_FOUND once the session is gone)
    RT_RESET = 17,          // clears the task's variables and shared objects, closes its master sessions
    RT_SERVER_STATUS = 18,  // answer: names "key=value" (registered graphs, master sessions, ...)
    RT_ATTACH_CHANNEL = 19, // handle; key: a shared-memory region for the session's steps (fast_channel_impl.h)
    RT_TAKE_ANSWER = 20,    // handle: the answer of the last step run through the channel, parked
                            // because it did not fit there
    RT_TYPE_MAX = 20,
} rt_type;

typedef struct rt_tensor_desc {
    dg_dtype dtype;
    dg_shape shape;
    uint64_t nbytes;
} rt_tensor_desc;

typedef struct rt_header {
    int64_t version;
    int type;
    uint64_t id;            // request id; a response carries the request's
    int code;               // response status (dg_code)
    char *message;          // response error text
    int64_t step_id;
    int64_t handle;
    char *key;              // rendezvous key, or a name
    char *from;             // sender's task, for messages and logs
    char **names;
    int n_names;
    int64_t n_feeds;        // RUN_GRAPH: names[0, n_feeds) are feeds, the rest fetches
    rt_tensor_desc *tensors;
    int n_tensors;
    uint8_t *blob;
    size_t blob_len;
    uint64_t xfer, offset, total;   // TENSOR_CHUNK: transfer id, byte offset, total bytes
    int64_t deadline_ms;    // time the sender allows, 0: none
    uint64_t incarnation;   // RESPONSE: the responder's incarnation (random per transport), 0: none
    int64_t trace;          // RUN_GRAPH, RUN_STEP: 1 asks for a step trace (the answer's blob)
    int64_t parts;          // RUN_GRAPH: the partitions of this step the task runs (0 or 1: this
                            // one alone), so that it ends the step when the last is done
} rt_header;

// The most partitions of one step a RUN_GRAPH may announce for a task.
#define RT_MAX_STEP_PARTS 4096

void rt_header_init(rt_header *h, int type);
void rt_header_clear(rt_header *h);
// Appends a string to names (copied).
void rt_header_add_name(rt_header *h, const char *name);
// Appends a tensor description of t.
void rt_header_add_tensor(rt_header *h, const dg_tensor *t);
// Sets blob to a copy of data.
void rt_header_set_blob(rt_header *h, const void *data, size_t len);
void rt_header_set_message(rt_header *h, const char *msg);
// Encodes h as msgpack. Returns: new buffer (caller frees with free()) and its length.
char *rt_header_encode(const rt_header *h, size_t *len);
// Decodes and validates a header. On failure h is cleared and st names the field.
bool rt_header_decode(const void *buf, size_t len, rt_header *h, dg_status *st);
const char *rt_type_name(int type);
// Checks, before msgpack-c unpacks untrusted bytes, that every count they declare fits in the
// bytes there are (so unpacking allocates a small multiple of len). False with st set if not.
bool rt_msgpack_prescan(const void *buf, size_t len, dg_status *st);
// A msgpack integer that fits int64 into *v; false for anything else.
struct msgpack_object;
bool rt_msgpack_int(const struct msgpack_object *o, int64_t *v);
// Whether k is the string name.
bool rt_msgpack_key_is(const struct msgpack_object *k, const char *name);

#endif
