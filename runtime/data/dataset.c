/* Datasets and iterators (distgraph/dataset.h): the chain of descriptions, the public
 * iterator over the chain of stage iterators, the state's framing and the encoding of
 * elements in it, feeding a session from an element, and the iterator's state in checkpoints.
 * The saved state is "DGIT", a format version, the CRC-32C of the rest, then the chain's
 * descriptions (a restore into another pipeline is refused by name), whether the iterator
 * ended, each stage's own state from the top down (data_impl.h), and last the counters: the
 * stages' states wait for the threads of map and prefetch stages, whose sources count skipped
 * records meanwhile. */
#include <stdlib.h>
#include <string.h>

#include "base_impl.h"
#include "crc32c_impl.h"
#include "data_impl.h"
#include "training_impl.h"

#define STATE_MAGIC "DGIT"
#define STATE_VERSION 2       // 2: counters after the stages, file sizes in file sources' states
#define STATE_HEAD_BYTES 12   // magic, version (u32), CRC-32C of the rest (u32)

// ---- state encoding ----

static void put_raw(data_wr *w, const void *p, size_t n) {
    if (w->failed) return;
    if (n > (size_t)INT32_MAX - (size_t)w->len ||
        !BASE_GROW(w->buf, w->len, w->cap, (int)n, "iterator state", NULL)) {
        w->failed = true;
        w->need = (size_t)w->len + n;
        return;
    }
    if (n) memcpy(w->buf + w->len, p, n);
    w->len += (int)n;
}

bool data_wr_oom(const data_wr *w, const char *what, dg_status *st) { return base_oom(st, what, w->need); }

void data_put_u64(data_wr *w, uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
    put_raw(w, b, 8);
}
void data_put_i64(data_wr *w, int64_t v) { data_put_u64(w, (uint64_t)v); }
void data_put_bytes(data_wr *w, const void *p, size_t n) {
    data_put_u64(w, n);
    put_raw(w, p, n);
}
void data_put_str(data_wr *w, const char *s) { data_put_bytes(w, s, strlen(s)); }

bool data_put_element(data_wr *w, const dg_element *e) {
    data_put_u64(w, (uint64_t)e->n);
    for (int i = 0; i < e->n; i++) {
        const dg_tensor *t = e->components[i];
        const dg_shape *sh = dg_tensor_shape(t);
        data_put_u64(w, (uint64_t)dg_tensor_dtype(t));
        data_put_u64(w, (uint64_t)sh->rank);
        for (int d = 0; d < sh->rank; d++) data_put_i64(w, sh->dims[d]);
        data_put_bytes(w, dg_tensor_data(t), dg_tensor_nbytes(t));
    }
    return !w->failed;
}

static bool short_state(data_rd *r, const char *what, dg_status *st) {
    dg_status_setf(st, DG_INVALID_ARGUMENT, "iterator state: %s at byte %zu: past the end (%zu bytes)", what, r->off,
                   r->len);
    return false;
}

bool data_get_u64(data_rd *r, uint64_t *v, dg_status *st) {
    if (r->len - r->off < 8) return short_state(r, "integer", st);
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--) x = x << 8 | r->p[r->off + (size_t)i];
    r->off += 8;
    *v = x;
    return true;
}
bool data_get_i64(data_rd *r, int64_t *v, dg_status *st) {
    uint64_t u;
    if (!data_get_u64(r, &u, st)) return false;
    *v = (int64_t)u;
    return true;
}
bool data_get_bytes(data_rd *r, const unsigned char **p, size_t *n, dg_status *st) {
    uint64_t len;
    if (!data_get_u64(r, &len, st)) return false;
    if (len > r->len - r->off) return short_state(r, "bytes", st);
    *p = r->p + r->off;
    *n = (size_t)len;
    r->off += (size_t)len;
    return true;
}
bool data_expect_str(data_rd *r, const char *want, dg_status *st) {
    const unsigned char *p;
    size_t n;
    if (!data_get_bytes(r, &p, &n, st)) return false;
    if (n != strlen(want) || memcmp(p, want, n) != 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "iterator state: saved for the stage \"%.*s\", restored into \"%s\"",
                       (int)(n > 200 ? 200 : n), (const char *)p, want);
        return false;
    }
    return true;
}

bool data_get_element(data_rd *r, dg_element *e, dg_status *st) {
    uint64_t n;
    if (!data_get_u64(r, &n, st)) return false;
    if (n > DG_ELEMENT_MAX_COMPONENTS) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "iterator state: an element of %llu components", (unsigned long long)n);
        return false;
    }
    e->n = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t dtype, rank;
        int64_t dims[DG_MAX_RANK];
        if (!data_get_u64(r, &dtype, st) || !data_get_u64(r, &rank, st)) goto fail;
        if (dtype > 1000 || !dg_dtype_is_valid((dg_dtype)dtype) || rank > DG_MAX_RANK) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "iterator state: a tensor of dtype %llu and rank %llu",
                           (unsigned long long)dtype, (unsigned long long)rank);
            goto fail;
        }
        for (uint64_t d = 0; d < rank; d++)
            if (!data_get_i64(r, &dims[d], st)) goto fail;
        const unsigned char *p;
        size_t nb;
        if (!data_get_bytes(r, &p, &nb, st)) goto fail;
        dg_shape sh = dg_shape_make((int)rank, dims);
        int64_t ne = 1;
        bool fits = true;
        for (uint64_t d = 0; d < rank && fits; d++) {
            if (dims[d] < 0 || (dims[d] > 0 && ne > INT64_MAX / dims[d])) fits = false;
            else ne *= dims[d];
        }
        if (!fits || (uint64_t)ne > nb || (size_t)ne * dg_dtype_size((dg_dtype)dtype) != nb) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "iterator state: a tensor of %zu bytes does not match its shape", nb);
            goto fail;
        }
        dg_tensor *t = dg_tensor_from_data((dg_dtype)dtype, sh, p, st);
        if (!t) goto fail;
        e->components[e->n++] = t;
    }
    return true;
fail:
    dg_element_clear(e);
    return false;
}

// ---- elements ----

void dg_element_clear(dg_element *e) {
    if (!e) return;
    for (int i = 0; i < e->n && i < DG_ELEMENT_MAX_COMPONENTS; i++) dg_tensor_unref(e->components[i]);
    e->n = 0;
}

void data_element_move(dg_element *dst, dg_element *src) {
    dg_element_clear(dst);
    *dst = *src;
    src->n = 0;
}

bool dg_element_feed(const dg_element *e, const dg_output *feeds, int n, dg_tensor **feed_values, dg_status *st) {
    dg_status_reset(st);
    if (!e || (n && (!feeds || !feed_values)) || n < 0) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "element feed: NULL element, feeds or values");
        return false;
    }
    if (e->n != n) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "element feed: the element has %d components, %d placeholders given",
                       e->n, n);
        return false;
    }
    for (int i = 0; i < n; i++) {
        const dg_tensor *t = e->components[i];
        const char *name = feeds[i].node ? dg_node_name(feeds[i].node) : "(null)";
        if (!feeds[i].node) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "element feed: placeholder %d is NULL", i);
            return false;
        }
        dg_dtype want = dg_output_dtype(feeds[i]);
        dg_shape ws = dg_output_shape(feeds[i]);
        char a[96], b[96];
        if (want != dg_tensor_dtype(t)) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "element feed: component %d is %s, placeholder \"%s\" takes %s", i,
                           dg_dtype_name(dg_tensor_dtype(t)), name, dg_dtype_name(want));
            return false;
        }
        if (!dg_shape_compatible(&ws, dg_tensor_shape(t))) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "element feed: component %d has shape %s, placeholder \"%s\" takes %s",
                           i, dg_shape_str(dg_tensor_shape(t), a, sizeof a), name, dg_shape_str(&ws, b, sizeof b));
            return false;
        }
        feed_values[i] = e->components[i];
    }
    return true;
}

// ---- descriptions ----

dg_dataset *data_dataset_new(dg_dataset *input, void *params, void (*free_params)(dg_dataset *),
                             data_iter *(*make)(const dg_dataset *, data_ctx *, int64_t, dg_status *),
                             dg_status *st) {
    dg_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) {
        dg_dataset_free(&input);
        base_oom(st, "dataset", sizeof *ds);
        return NULL;
    }
    ds->input = input;
    ds->params = params;
    ds->free_params = free_params;
    ds->make = make;
    return ds;
}

data_iter *data_make_input(const dg_dataset *ds, data_ctx *ctx, int64_t epoch, dg_status *st) {
    return ds->input->make(ds->input, ctx, epoch, st);
}

void dg_dataset_free(dg_dataset **dsp) {
    if (!dsp || !*dsp) return;
    dg_dataset *ds = *dsp;
    dg_dataset_free(&ds->input);
    if (ds->free_params) ds->free_params(ds);
    free(ds);
    *dsp = NULL;
}

// ---- iterators ----

// An attachment to a saver (dg_iterator_attach_saver): the saver's blob context. The iterator
// owns it; the saver borrows it until it lets go (removed or freed), which clears sv, so
// whichever of the two is freed first leaves the other nothing dangling.
typedef struct iterator_link {
    dg_iterator *it;
    dg_saver *sv;   // NULL once the saver let go
    char name[256];
} iterator_link;

struct dg_iterator {
    const dg_dataset *ds;   // borrowed
    data_ctx ctx;
    data_iter *root;
    int64_t position;       // elements handed out
    bool ended;
    dg_status *error;       // the error that ended the iterator; OK while none
    iterator_link **links;  // dg_iterator_attach_saver, owned
    int n_links, cap_links;
};

// The chain's descriptions, top down, separated by " <- ".
static void chain_desc(const dg_dataset *ds, data_wr *w) {
    for (; ds; ds = ds->input) {
        put_raw(w, ds->desc, strlen(ds->desc));
        if (ds->input) put_raw(w, " <- ", 4);
    }
}

dg_iterator *dg_iterator_new(const dg_dataset *ds, dg_status *st) {
    dg_status_reset(st);
    if (!ds) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "iterator: dataset is NULL");
        return NULL;
    }
    dg_iterator *it = calloc(1, sizeof *it);
    if (!it) {
        base_oom(st, "iterator", sizeof *it);
        return NULL;
    }
    it->ds = ds;
    it->error = dg_status_new();
    it->root = ds->make(ds, &it->ctx, 0, st);
    if (!it->root) {
        dg_status_prepend(st, "iterator");
        dg_iterator_free(&it);
        return NULL;
    }
    return it;
}

void dg_iterator_free(dg_iterator **itp) {
    if (!itp || !*itp) return;
    dg_iterator *it = *itp;
    // Out of the savers first: a save after this would read a freed iterator.
    for (int i = 0; i < it->n_links; i++) {
        iterator_link *l = it->links[i];
        if (l->sv) dg_saver_remove_blob(l->sv, l->name, NULL);
        free(l);
    }
    free(it->links);
    data_iter_free(it->root);
    dg_status_free(&it->error);
    free(it);
    *itp = NULL;
}

bool dg_iterator_next(dg_iterator *it, dg_element *out, bool *end_of_sequence, dg_status *st) {
    dg_status_reset(st);
    if (!it || !out || !end_of_sequence) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "iterator next: NULL iterator, element or end flag");
        return false;
    }
    dg_element_clear(out);
    *end_of_sequence = false;
    if (!dg_status_ok(it->error)) {
        dg_status_copy(st, it->error);
        return false;
    }
    if (it->ended) {
        *end_of_sequence = true;
        return true;
    }
    int r = it->root->ops->next(it->root, out, st);
    if (r < 0) {
        dg_element_clear(out);
        dg_status_copy(it->error, st);
        return false;
    }
    if (r == 0) {
        it->ended = true;
        *end_of_sequence = true;
        return true;
    }
    it->position++;
    return true;
}

int64_t dg_iterator_position(const dg_iterator *it) { return it ? it->position : 0; }
int64_t dg_iterator_skipped(const dg_iterator *it) { return it ? (int64_t)atomic_load(&it->ctx.n_skipped) : 0; }

bool dg_iterator_save(dg_iterator *it, unsigned char **bytes, size_t *n_bytes, dg_status *st) {
    dg_status_reset(st);
    if (!it || !bytes || !n_bytes) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "iterator save: NULL iterator or output");
        return false;
    }
    if (!dg_status_ok(it->error)) {
        dg_status_copy(st, it->error);
        dg_status_prepend(st, "iterator save: the iterator ended with an error");
        return false;
    }
    data_wr w = {0};
    put_raw(&w, STATE_MAGIC, 4);
    data_wr chain = {0};
    chain_desc(it->ds, &chain);
    put_raw(&w, "\0\0\0\0\0\0\0\0", 8);   // version and CRC, filled below
    data_put_bytes(&w, chain.buf, (size_t)chain.len);
    if (chain.failed) w.failed = true;
    free(chain.buf);
    data_put_u64(&w, it->ended);
    if (!it->ended && !it->root->ops->save(it->root, &w, st)) {
        free(w.buf);
        dg_status_prepend(st, "iterator save");
        return false;
    }
    // The counters after the stages: saving a prefetch stage pauses its producer, whose
    // source may skip records until then; those skips are in the state written above.
    data_put_i64(&w, it->position);
    data_put_i64(&w, (int64_t)atomic_load(&it->ctx.n_skipped));
    if (w.failed) {
        bool r = data_wr_oom(&w, "iterator save", st);
        free(w.buf);
        return r;
    }
    uint32_t v = STATE_VERSION, crc = data_crc32c(0, w.buf + STATE_HEAD_BYTES, w.len - STATE_HEAD_BYTES);
    for (int i = 0; i < 4; i++) {
        w.buf[4 + i] = (unsigned char)(v >> (8 * i));
        w.buf[8 + i] = (unsigned char)(crc >> (8 * i));
    }
    *bytes = w.buf;
    *n_bytes = (size_t)w.len;
    return true;
}

static bool restore_into(dg_iterator *it, const unsigned char *b, size_t n, dg_status *st) {
    if (n < STATE_HEAD_BYTES || memcmp(b, STATE_MAGIC, 4) != 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "iterator state: not an iterator state (%zu bytes, no \"DGIT\" magic)", n);
        return false;
    }
    uint32_t v = 0, crc = 0;
    for (int i = 3; i >= 0; i--) {
        v = v << 8 | b[4 + i];
        crc = crc << 8 | b[8 + i];
    }
    if (v != STATE_VERSION) {
        dg_status_setf(st, DG_FAILED_PRECONDITION, "iterator state: format version %u, this library reads %d", v,
                       STATE_VERSION);
        return false;
    }
    if (data_crc32c(0, b + STATE_HEAD_BYTES, n - STATE_HEAD_BYTES) != crc) {
        dg_status_setf(st, DG_DATA_LOSS, "iterator state: CRC-32C mismatch over %zu bytes", n);
        return false;
    }
    data_rd r = {.p = b, .len = n, .off = STATE_HEAD_BYTES};
    data_wr chain = {0};
    chain_desc(it->ds, &chain);
    put_raw(&chain, "", 1);
    bool ok = !chain.failed && data_expect_str(&r, (const char *)chain.buf, st);
    free(chain.buf);
    if (!ok) return false;
    int64_t pos, skipped;
    uint64_t ended;
    if (!data_get_u64(&r, &ended, st)) return false;
    if (!ended && !it->root->ops->restore(it->root, &r, st)) return false;
    if (!data_get_i64(&r, &pos, st) || !data_get_i64(&r, &skipped, st)) return false;
    if (r.off != r.len) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "iterator state: %zu bytes left over after the last stage",
                       r.len - r.off);
        return false;
    }
    it->position = pos;
    atomic_store(&it->ctx.n_skipped, skipped);
    it->ended = ended != 0;
    return true;
}

// A fresh chain at the start (stages restore only before their first element); a chain that
// cannot be made ends the iterator with that error.
static bool remake_chain(dg_iterator *it, dg_status *st) {
    data_iter_free(it->root);
    it->position = 0;
    it->ended = false;
    atomic_store(&it->ctx.n_skipped, 0);
    dg_status_reset(it->error);
    it->root = it->ds->make(it->ds, &it->ctx, 0, st);
    if (!it->root) dg_status_copy(it->error, st);
    return it->root != NULL;
}

bool dg_iterator_restore(dg_iterator *it, const void *bytes, size_t n_bytes, dg_status *st) {
    dg_status_reset(st);
    if (!it || (!bytes && n_bytes)) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "iterator restore: NULL iterator or bytes");
        return false;
    }
    if (!remake_chain(it, st)) {
        dg_status_prepend(st, "iterator restore");
        return false;
    }
    if (restore_into(it, bytes, n_bytes, st)) return true;
    // A failed restore leaves the iterator at the start (or ended by the error of remaking it).
    dg_status *ignored = dg_status_new();
    remake_chain(it, ignored);
    dg_status_free(&ignored);
    return false;
}

// ---- checkpoints ----

static bool save_blob(void *ctx, unsigned char **bytes, size_t *n_bytes, dg_status *st) {
    return dg_iterator_save(((iterator_link *)ctx)->it, bytes, n_bytes, st);
}

static void release_link(void *ctx) { ((iterator_link *)ctx)->sv = NULL; }

// The saver restored variables (a restart, or a monitored session's recovery): the iterator goes
// where it was when they were saved, or back to its start when that checkpoint precedes it.
static bool restore_blob(void *ctx, const void *bytes, size_t n_bytes, dg_status *st) {
    dg_iterator *it = ((iterator_link *)ctx)->it;
    if (bytes) return dg_iterator_restore(it, bytes, n_bytes, st);
    if (remake_chain(it, st)) return true;
    dg_status_prepend(st, "iterator rewind");
    return false;
}

bool dg_iterator_attach_saver(dg_iterator *it, dg_saver *sv, const char *name, dg_status *st) {
    dg_status_reset(st);
    if (!it || !sv || !name || strlen(name) > 255) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "iterator attach: NULL iterator, saver or name, or a name over 255 bytes");
        return false;
    }
    iterator_link *l = calloc(1, sizeof *l);
    if (!l) return base_oom(st, "iterator attach", sizeof *l);
    l->it = it;
    l->sv = sv;
    memcpy(l->name, name, strlen(name) + 1);
    if (!training_saver_add_blob(sv, name, save_blob, restore_blob, l, release_link, st)) {
        free(l);
        return false;
    }
    BASE_PUSH(it->links, it->n_links, it->cap_links, l);
    return true;
}

bool dg_iterator_restore_checkpoint(dg_iterator *it, dg_checkpoint_store *store, int64_t step, const char *name,
                                    dg_status *st) {
    dg_status_reset(st);
    if (!it || !store || !name) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "iterator restore: NULL iterator, store or name");
        return false;
    }
    void *bytes = NULL;
    size_t n = 0;
    if (!dg_checkpoint_read_blob(store, step, name, &bytes, &n, NULL, st)) return false;
    bool ok = dg_iterator_restore(it, bytes, n, st);
    if (!ok) dg_status_prepend(st, "iterator restore from \"%s\"", name);
    free(bytes);
    return ok;
}
