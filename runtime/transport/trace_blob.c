/* The blob of a step's trace notes (trace_blob_impl.h), as a task sends it with its answer. */
#include <msgpack.h>
#include <string.h>

#include "trace_blob_impl.h"

static void pack_str(msgpack_packer *pk, const char *s) {
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

char *rt_trace_blob_encode(const dg_trace_event *ev, int n, int64_t shift, const rt_trace_task *tasks, int n_tasks,
                           int64_t recv_ns, int64_t reply_ns, size_t *len) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 4);
    pack_str(&pk, "recv");
    msgpack_pack_int64(&pk, recv_ns);
    pack_str(&pk, "reply");
    msgpack_pack_int64(&pk, reply_ns);
    pack_str(&pk, "ev");
    msgpack_pack_array(&pk, (size_t)n);
    for (int i = 0; i < n; i++) {
        const dg_trace_event *e = &ev[i];
        msgpack_pack_array(&pk, 10);
        msgpack_pack_int(&pk, (int)e->kind);
        pack_str(&pk, e->name);
        pack_str(&pk, e->op);
        pack_str(&pk, e->task);
        pack_str(&pk, e->device);
        pack_str(&pk, e->peer);
        msgpack_pack_int64(&pk, e->start_ns + shift);
        msgpack_pack_int64(&pk, e->end_ns + shift);
        msgpack_pack_uint64(&pk, e->bytes);
        msgpack_pack_int(&pk, e->thread);
    }
    pack_str(&pk, "tasks");
    msgpack_pack_array(&pk, (size_t)n_tasks);
    for (int i = 0; i < n_tasks; i++) {
        msgpack_pack_array(&pk, 3);
        pack_str(&pk, tasks[i].name);
        msgpack_pack_int64(&pk, tasks[i].offset_ns);
        msgpack_pack_int64(&pk, tasks[i].uncertainty_ns);
    }
    *len = sb.size;
    return sb.data;
}

char *rt_trace_blob_encode_notes(const exec_trace *t, int64_t recv_ns, int64_t reply_ns, size_t *len) {
    return rt_trace_blob_encode(exec_trace_events(t), exec_trace_num_events(t), 0, NULL, 0, recv_ns, reply_ns, len);
}
