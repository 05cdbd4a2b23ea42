/* libFuzzer target for the message-header decoder (runtime/wire.c). Any bytes must give
 * either a header that encodes and decodes again to the same fields, or a cleared header and
 * an INVALID_ARGUMENT / UNIMPLEMENTED status whose message starts with "header: ".
 * Built by hand, not by CMake: see README.md here, or run_fuzz.sh wire SECONDS. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "distgraph/distgraph.h"
#include "wire_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool same_str(const char *a, const char *b) {
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

// Fields that rt_header_encode writes must survive encode + decode.
static void check_round_trip(const rt_header *h) {
    size_t len = 0;
    char *buf = rt_header_encode(h, &len);
    rt_header g;
    dg_status *st = dg_status_new();
    if (!rt_header_decode(buf, len, &g, st)) abort();
    if (g.version != h->version || g.type != h->type || g.id != h->id || g.code != h->code ||
        g.step_id != h->step_id || g.handle != h->handle || g.n_feeds != h->n_feeds ||
        g.deadline_ms != h->deadline_ms || !same_str(g.message, h->message) ||
        !same_str(g.key, h->key) || !same_str(g.from, h->from) || g.n_names != h->n_names ||
        g.n_tensors != h->n_tensors || (g.blob == NULL) != (h->blob == NULL) ||
        g.blob_len != h->blob_len)
        abort();
    if (h->blob_len && memcmp(g.blob, h->blob, h->blob_len) != 0) abort();
    for (int i = 0; i < h->n_names; i++)
        if (strcmp(g.names[i], h->names[i]) != 0) abort();
    for (int i = 0; i < h->n_tensors; i++) {
        const rt_tensor_desc *a = &g.tensors[i], *b = &h->tensors[i];
        if (a->dtype != b->dtype || a->nbytes != b->nbytes || !dg_shape_equal(&a->shape, &b->shape))
            abort();
    }
    if (h->type == RT_TENSOR_CHUNK && (g.xfer != h->xfer || g.offset != h->offset || g.total != h->total))
        abort();
    rt_header_clear(&g);
    dg_status_free(&st);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dg_status *st = dg_status_new();
    rt_header h;
    if (rt_header_decode(data, size, &h, st)) {
        if (!dg_status_ok(st) || h.version != RT_PROTOCOL_VERSION || h.type < 1 || h.type > RT_TYPE_MAX ||
            h.n_feeds < 0 || h.n_feeds > h.n_names || h.n_names < 0 || h.n_tensors < 0)
            abort();
        for (int i = 0; i < h.n_tensors; i++) {
            const rt_tensor_desc *d = &h.tensors[i];
            int64_t n = dg_shape_num_elements(&d->shape);
            if (!dg_dtype_is_valid(d->dtype) || d->shape.rank < 0 || d->shape.rank > DG_MAX_RANK || n < 0 ||
                (uint64_t)n * dg_dtype_size(d->dtype) != d->nbytes)
                abort();
        }
        for (int i = 0; i < h.n_names; i++)
            if (!h.names[i]) abort();
        check_round_trip(&h);
        rt_header_clear(&h);
    } else {
        dg_code c = dg_status_code(st);
        if (c != DG_INVALID_ARGUMENT && c != DG_UNIMPLEMENTED) abort();
        if (strncmp(dg_status_message(st), "header: ", 8) != 0) abort();
        static const rt_header zero;
        if (memcmp(&h, &zero, sizeof h) != 0) abort();   // cleared on failure
    }
    dg_status_free(&st);
    return 0;
}
