/* libFuzzer target for the reader of a remote session's local channel
 * (runtime/master/fast_channel.c, fc_take): what the master reads from the shared-memory
 * region a client of the same user writes, which a hostile process of that user can scribble
 * on. An input is the request half as a writer leaves it:
 *   bytes 0..7   the length the region's header declares (little-endian); with the top bit
 *                set, the real length of the rest of the input instead
 *   the rest     the half's bytes from its start: the msgpack header's length (8 bytes), the
 *                header, then per tensor [u64 length][bytes] padded to 8
 * fc_take must either give a header and as many tensors as the header describes, each of the
 * dtype, shape and byte count its description says, every frame within the declared length
 * and an inline tensor's bytes those of its frame (walked again here from the input), or
 * refuse with a status (not OK) and no tensors. Nothing crashes and nothing outside the half is read (AddressSanitizer watches the
 * copies out; the half is a mapping of 4 MiB, so a read past it leaves the region). Tensor
 * frames that look like shared-memory descriptors reach rt_shm_tensor, which refuses regions
 * that do not exist.
 * Built by run_fuzz.sh channel SECONDS, not by CMake: see README.md here. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "distgraph/distgraph.h"
#include "fast_channel_impl.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static fc_region *writer, *reader;   // the client's mapping and the master's, of one region

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    dg_status *st = dg_status_new();
    writer = fc_create(st);
    reader = writer ? fc_attach(fc_name(writer), st) : NULL;
    if (!reader) abort();
    fc_unlink(writer);
    dg_status_free(&st);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 8) return 0;
    uint64_t declared;
    memcpy(&declared, data, 8);
    if (declared >> 63) declared = size - 8;
    fc_put_raw(writer, FC_REQUEST, data + 8, size - 8, declared);
    dg_status *st = dg_status_new();
    rt_header h;
    dg_tensor **ts = (dg_tensor **)(uintptr_t)1;   // must be reset by fc_take
    int n = -1;
    if (fc_take(reader, FC_REQUEST, &h, &ts, &n, st)) {
        if (dg_status_code(st) != DG_OK || n != h.n_tensors || (n > 0 && !ts)) abort();
        // Walked again here, from the input: every frame lies within the declared length, and
        // an inline tensor holds exactly its frame's bytes.
        const uint8_t *m = data + 8;
        uint64_t have = size - 8, hlen, off;
        if (declared < 8 || declared > have + FC_HALF_BYTES) abort();
        hlen = 0;
        if (have >= 8) memcpy(&hlen, m, 8);
        off = 8 + ((hlen + 7) & ~(uint64_t)7);
        for (int i = 0; have >= 8 && i < n; i++) {
            uint64_t flen;
            if (off + 8 > declared || off + 8 > have) break;   // past the input: stale bytes of the half
            memcpy(&flen, m + off, 8);
            off += 8;
            if (flen > declared || off + flen > declared) abort();   // read past the message
            if (flen == h.tensors[i].nbytes && off + flen <= have && flen &&
                memcmp(dg_tensor_data(ts[i]), m + off, flen) != 0)
                abort();
            off += (flen + 7) & ~(uint64_t)7;
        }
        for (int i = 0; i < n; i++) {
            const rt_tensor_desc *d = &h.tensors[i];
            if (!ts[i] || dg_tensor_dtype(ts[i]) != d->dtype || dg_tensor_nbytes(ts[i]) != d->nbytes) abort();
            if (!dg_shape_equal(dg_tensor_shape(ts[i]), &d->shape)) abort();
            const unsigned char *b = dg_tensor_data(ts[i]);   // every byte readable
            unsigned sum = 0;
            for (uint64_t k = 0; k < d->nbytes; k++) sum += b[k];
            (void)sum;
            dg_tensor_unref(ts[i]);
        }
        free(ts);
        rt_header_clear(&h);
    } else if (dg_status_code(st) == DG_OK || ts || n != 0) {
        abort();
    }
    dg_status_free(&st);
    return 0;
}
