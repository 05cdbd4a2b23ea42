/* The stages that run threads (distgraph/dataset.h): the parallel map and prefetch.
 *
 * Map: the consumer's thread pulls inputs into a ring of twice `parallelism` slots and hands
 * them to `parallelism` worker threads; outputs leave in the ring's order, so the order is the
 * input's whatever finishes first. The ring is twice the workers so that they have work queued
 * while the consumer waits for the head; a worker wakes the consumer only when it completes the
 * head slot (the one the consumer waits for), or every slot while a save waits; a head no
 * worker has taken yet the consumer runs itself instead of sleeping. Only the
 * consumer's thread touches the input, so saving waits for the slots in flight to finish and
 * writes their results, followed by the input's state (which is already past them).
 *
 * Prefetch: one producer thread pulls the input into a buffer. To save, the consumer pauses
 * the producer between two of its pulls (`busy` false), writes the buffer and then the input's
 * state while the producer waits, and lets it go on. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base_impl.h"
#include "data_impl.h"

static void free_plain(dg_dataset *ds) { free(ds->params); }

// Errors kept in a state: the code and the message.
static void put_status(data_wr *w, const dg_status *s) {
    data_put_u64(w, (uint64_t)dg_status_code(s));
    data_put_str(w, dg_status_message(s));
}
static bool get_status(data_rd *r, dg_status *into, dg_status *st) {
    uint64_t code;
    const unsigned char *p;
    size_t n;
    if (!data_get_u64(r, &code, st) || !data_get_bytes(r, &p, &n, st)) return false;
    if (code > DG_UNAUTHENTICATED) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "iterator state: status code %llu", (unsigned long long)code);
        return false;
    }
    dg_status_setf(into, (dg_code)code, "%.*s", (int)(n > 4096 ? 4096 : n), (const char *)p);
    if (code == DG_OK) dg_status_reset(into);
    return true;
}

// ---- map ----

typedef struct map_params {
    dg_map_fn fn;
    void *ctx;
    int parallelism;
} map_params;

enum { SLOT_EMPTY, SLOT_PENDING, SLOT_RUNNING, SLOT_DONE };

typedef struct map_slot {
    dg_element in, out;
    dg_status *st;       // the function's error, or the input's (then in is empty)
    int64_t index;       // the element's number, for messages
    int state;
} map_slot;

typedef struct map_iter {
    data_iter base;
    const dg_dataset *ds;
    const map_params *p;
    data_iter *input;
    bool input_done;
    int64_t n_in;            // elements taken from the input
    map_slot *ring;          // n_slots slots; [head, head + count) are in use
    int n_slots;             // 2 * parallelism with worker threads, 1 without
    int head, count;
    bool saving;             // map_save waits for every slot: workers wake it on each
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    pthread_t *threads;
    int n_threads;
    bool stop;
} map_iter;

static void run_slot(const map_params *p, map_slot *s) {
    if (!p->fn(p->ctx, &s->in, &s->out, s->st)) {
        dg_element_clear(&s->out);
        if (dg_status_ok(s->st)) dg_status_set(s->st, DG_UNKNOWN, "the function failed without a message");
        dg_status_prepend(s->st, "map (element %lld)", (long long)s->index);
    }
    dg_element_clear(&s->in);
}

static void *map_worker(void *arg) {
    map_iter *it = arg;
    const int S = it->n_slots;
    pthread_mutex_lock(&it->mu);
    for (;;) {
        map_slot *s = NULL;
        for (int k = 0; k < it->count && !s; k++) {
            map_slot *c = &it->ring[(it->head + k) % S];
            if (c->state == SLOT_PENDING) s = c;
        }
        if (!s) {
            if (it->stop) break;
            pthread_cond_wait(&it->work, &it->mu);
            continue;
        }
        s->state = SLOT_RUNNING;
        pthread_mutex_unlock(&it->mu);
        run_slot(it->p, s);
        pthread_mutex_lock(&it->mu);
        s->state = SLOT_DONE;
        // Only the consumer waits on done: for the head slot, or for all of them in a save.
        if (s == &it->ring[it->head] || it->saving) pthread_cond_signal(&it->done);
    }
    pthread_mutex_unlock(&it->mu);
    return NULL;
}

static bool start_workers(map_iter *it, dg_status *st) {
    if (it->threads || it->p->parallelism == 1) return true;
    it->threads = calloc((size_t)it->p->parallelism, sizeof *it->threads);
    if (!it->threads) return base_oom(st, "map threads", sizeof *it->threads);
    for (int i = 0; i < it->p->parallelism; i++) {
        if (pthread_create(&it->threads[i], NULL, map_worker, it) != 0) {
            if (it->n_threads > 0) return true;   // fewer threads: the same results, later
            dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "map: cannot start a thread");
            return false;
        }
        it->n_threads++;
    }
    return true;
}

static int map_next(data_iter *base, dg_element *out, dg_status *st) {
    map_iter *it = (map_iter *)base;
    const int S = it->n_slots;
    if (!start_workers(it, st)) return -1;
    // Pull inputs into free slots; only this thread touches the input and adds slots.
    while (it->count < S && !it->input_done) {
        map_slot *s = &it->ring[(it->head + it->count) % S];
        s->in.n = s->out.n = 0;
        dg_status_reset(s->st);
        int r = it->input->ops->next(it->input, &s->in, s->st);
        if (r == 0) {
            it->input_done = true;
            break;
        }
        s->index = it->n_in++;
        if (r < 0) {
            // The input's error leaves in its turn, after the elements before it.
            it->input_done = true;
            dg_element_clear(&s->in);
        }
        pthread_mutex_lock(&it->mu);
        s->state = r < 0 ? SLOT_DONE : SLOT_PENDING;
        it->count++;
        pthread_cond_signal(&it->work);
        pthread_mutex_unlock(&it->mu);
        if (r > 0 && it->n_threads == 0) {
            run_slot(it->p, s);
            s->state = SLOT_DONE;
        }
    }
    if (it->count == 0) return 0;
    map_slot *s = &it->ring[it->head];
    pthread_mutex_lock(&it->mu);
    while (s->state != SLOT_DONE) {
        if (s->state == SLOT_PENDING) {
            // No worker has taken the head yet: running it here costs less than sleeping
            // until a worker has, and the order stays the ring's.
            s->state = SLOT_RUNNING;
            pthread_mutex_unlock(&it->mu);
            run_slot(it->p, s);
            pthread_mutex_lock(&it->mu);
            s->state = SLOT_DONE;
            break;
        }
        pthread_cond_wait(&it->done, &it->mu);
    }
    s->state = SLOT_EMPTY;
    it->head = (it->head + 1) % S;
    it->count--;
    pthread_mutex_unlock(&it->mu);
    if (!dg_status_ok(s->st)) {
        dg_status_copy(st, s->st);
        dg_element_clear(&s->out);
        return -1;
    }
    data_element_move(out, &s->out);
    return 1;
}

static bool map_save(data_iter *base, data_wr *w, dg_status *st) {
    map_iter *it = (map_iter *)base;
    const int S = it->n_slots;
    pthread_mutex_lock(&it->mu);
    it->saving = true;
    for (int k = 0; k < it->count; k++)
        while (it->ring[(it->head + k) % S].state != SLOT_DONE) pthread_cond_wait(&it->done, &it->mu);
    it->saving = false;
    pthread_mutex_unlock(&it->mu);
    data_put_u64(w, it->input_done);
    data_put_i64(w, it->n_in);
    data_put_u64(w, (uint64_t)it->count);
    for (int k = 0; k < it->count; k++) {
        const map_slot *s = &it->ring[(it->head + k) % S];
        data_put_i64(w, s->index);
        put_status(w, s->st);
        if (!data_put_element(w, &s->out)) return data_wr_oom(w, "map state", st);
    }
    return it->input->ops->save(it->input, w, st);
}

static bool map_restore(data_iter *base, data_rd *r, dg_status *st) {
    map_iter *it = (map_iter *)base;
    uint64_t done, count;
    if (!data_get_u64(r, &done, st) || !data_get_i64(r, &it->n_in, st) || !data_get_u64(r, &count, st)) return false;
    if (count > (uint64_t)it->n_slots) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "iterator state: %llu map results for a parallelism of %d (%d slots)",
                       (unsigned long long)count, it->p->parallelism, it->n_slots);
        return false;
    }
    it->input_done = done != 0;
    for (uint64_t k = 0; k < count; k++) {
        map_slot *s = &it->ring[k];
        if (!data_get_i64(r, &s->index, st) || !get_status(r, s->st, st) || !data_get_element(r, &s->out, st))
            return false;
        s->state = SLOT_DONE;
        it->count++;
    }
    return it->input->ops->restore(it->input, r, st);
}

static void map_free(data_iter *base) {
    map_iter *it = (map_iter *)base;
    pthread_mutex_lock(&it->mu);
    it->stop = true;
    pthread_cond_broadcast(&it->work);
    pthread_mutex_unlock(&it->mu);
    // Workers run what is pending, then see stop and leave; the slots are freed after the join.
    for (int i = 0; i < it->n_threads; i++) pthread_join(it->threads[i], NULL);
    free(it->threads);
    for (int i = 0; it->ring && i < it->n_slots; i++) {
        dg_element_clear(&it->ring[i].in);
        dg_element_clear(&it->ring[i].out);
        dg_status_free(&it->ring[i].st);
    }
    free(it->ring);
    pthread_mutex_destroy(&it->mu);
    pthread_cond_destroy(&it->work);
    pthread_cond_destroy(&it->done);
    data_iter_free(it->input);
    free(it);
}

static const data_iter_ops map_ops = {map_next, map_save, map_restore, map_free};

static data_iter *map_make(const dg_dataset *ds, data_ctx *ctx, int64_t epoch, dg_status *st) {
    const map_params *p = ds->params;
    map_iter *it = calloc(1, sizeof *it);
    if (!it) {
        base_oom(st, "map", sizeof *it);
        return NULL;
    }
    it->base.ops = &map_ops;
    it->base.ctx = ctx;
    it->ds = ds;
    it->p = p;
    pthread_mutex_init(&it->mu, NULL);
    pthread_cond_init(&it->work, NULL);
    pthread_cond_init(&it->done, NULL);
    it->n_slots = p->parallelism == 1 ? 1 : 2 * p->parallelism;
    it->ring = calloc((size_t)it->n_slots, sizeof *it->ring);
    bool ok = it->ring != NULL;
    for (int i = 0; ok && i < it->n_slots; i++) ok = (it->ring[i].st = dg_status_new()) != NULL;
    if (!ok) {
        map_free(&it->base);
        base_oom(st, "map", (size_t)it->n_slots * sizeof(map_slot));
        return NULL;
    }
    it->input = data_make_input(ds, ctx, epoch, st);
    if (!it->input) {
        map_free(&it->base);
        return NULL;
    }
    return &it->base;
}

#define MAX_PARALLELISM 256

dg_dataset *dg_dataset_map(dg_dataset *input, dg_map_fn fn, void *ctx, int parallelism, dg_status *st) {
    dg_status_reset(st);
    if (!input || !fn || parallelism < 1 || parallelism > MAX_PARALLELISM) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "map: %s (parallelism %d: 1 to %d)",
                       !input ? "input dataset is NULL" : !fn ? "fn is NULL" : "bad parallelism", parallelism,
                       MAX_PARALLELISM);
        dg_dataset_free(&input);
        return NULL;
    }
    map_params *p = calloc(1, sizeof *p);
    if (!p) {
        dg_dataset_free(&input);
        base_oom(st, "map", sizeof *p);
        return NULL;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->parallelism = parallelism;
    dg_dataset *ds = data_dataset_new(input, p, free_plain, map_make, st);
    if (!ds) {
        free(p);
        return NULL;
    }
    // The parallelism is not part of the description: a state saved with one parallelism
    // restores into another only when it holds no more results than the new ring has slots.
    snprintf(ds->desc, sizeof ds->desc, "map");
    return ds;
}

// ---- prefetch ----

typedef struct prefetch_iter {
    data_iter base;
    data_iter *input;
    int cap;
    dg_element *buf;          // ring of cap elements, [head, head + count)
    int head, count;
    bool done;                // the input ended (or failed: err)
    dg_status *err;
    bool busy, paused, stop, started;
    pthread_mutex_t mu;
    pthread_cond_t produce, consume;
    pthread_t thread;
} prefetch_iter;

static void *prefetch_run(void *arg) {
    prefetch_iter *it = arg;
    dg_status *st = dg_status_new();
    dg_element e = {0};
    pthread_mutex_lock(&it->mu);
    for (;;) {
        while (!it->stop && (it->done || it->paused || it->count == it->cap)) pthread_cond_wait(&it->produce, &it->mu);
        if (it->stop) break;
        it->busy = true;
        pthread_mutex_unlock(&it->mu);
        int r = it->input->ops->next(it->input, &e, st);
        pthread_mutex_lock(&it->mu);
        it->busy = false;
        if (r > 0) {
            it->buf[(it->head + it->count) % it->cap] = e;
            e.n = 0;
            it->count++;
        } else {
            it->done = true;
            if (r < 0) dg_status_copy(it->err, st);
            dg_element_clear(&e);   // a part the input made before failing
        }
        pthread_cond_broadcast(&it->consume);
    }
    pthread_mutex_unlock(&it->mu);
    dg_element_clear(&e);
    dg_status_free(&st);
    return NULL;
}

static int prefetch_next(data_iter *base, dg_element *out, dg_status *st) {
    prefetch_iter *it = (prefetch_iter *)base;
    if (!it->started && !it->done) {
        if (pthread_create(&it->thread, NULL, prefetch_run, it) != 0) {
            dg_status_set(st, DG_RESOURCE_EXHAUSTED, "prefetch: cannot start its thread");
            return -1;
        }
        it->started = true;
    }
    pthread_mutex_lock(&it->mu);
    while (it->count == 0 && !it->done) pthread_cond_wait(&it->consume, &it->mu);
    int r;
    if (it->count > 0) {
        *out = it->buf[it->head];
        it->buf[it->head].n = 0;
        it->head = (it->head + 1) % it->cap;
        it->count--;
        pthread_cond_signal(&it->produce);
        r = 1;
    } else if (!dg_status_ok(it->err)) {
        dg_status_copy(st, it->err);
        r = -1;
    } else {
        r = 0;
    }
    pthread_mutex_unlock(&it->mu);
    return r;
}

static bool prefetch_save(data_iter *base, data_wr *w, dg_status *st) {
    prefetch_iter *it = (prefetch_iter *)base;
    pthread_mutex_lock(&it->mu);
    it->paused = true;
    while (it->busy) pthread_cond_wait(&it->consume, &it->mu);
    data_put_u64(w, it->done);
    put_status(w, it->err);
    data_put_u64(w, (uint64_t)it->count);
    bool ok = true;
    for (int k = 0; k < it->count && ok; k++) ok = data_put_element(w, &it->buf[(it->head + k) % it->cap]);
    if (!ok) data_wr_oom(w, "prefetch state", st);
    // The producer waits (paused) while its input is written.
    ok = ok && it->input->ops->save(it->input, w, st);
    it->paused = false;
    pthread_cond_broadcast(&it->produce);
    pthread_mutex_unlock(&it->mu);
    return ok;
}

static bool prefetch_restore(data_iter *base, data_rd *r, dg_status *st) {
    prefetch_iter *it = (prefetch_iter *)base;
    uint64_t done, count;
    if (!data_get_u64(r, &done, st) || !get_status(r, it->err, st) || !data_get_u64(r, &count, st)) return false;
    if (count > (uint64_t)it->cap) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "iterator state: %llu prefetched elements for a buffer of %d",
                       (unsigned long long)count, it->cap);
        return false;
    }
    it->done = done != 0;
    for (uint64_t k = 0; k < count; k++) {
        if (!data_get_element(r, &it->buf[k], st)) return false;
        it->count++;
    }
    return it->input->ops->restore(it->input, r, st);
}

static void prefetch_free(data_iter *base) {
    prefetch_iter *it = (prefetch_iter *)base;
    if (it->started) {
        pthread_mutex_lock(&it->mu);
        it->stop = true;
        pthread_cond_broadcast(&it->produce);
        pthread_mutex_unlock(&it->mu);
        pthread_join(it->thread, NULL);
    }
    for (int i = 0; it->buf && i < it->cap; i++) dg_element_clear(&it->buf[i]);
    free(it->buf);
    dg_status_free(&it->err);
    pthread_mutex_destroy(&it->mu);
    pthread_cond_destroy(&it->produce);
    pthread_cond_destroy(&it->consume);
    data_iter_free(it->input);
    free(it);
}

static const data_iter_ops prefetch_ops = {prefetch_next, prefetch_save, prefetch_restore, prefetch_free};

static data_iter *prefetch_make(const dg_dataset *ds, data_ctx *ctx, int64_t epoch, dg_status *st) {
    prefetch_iter *it = calloc(1, sizeof *it);
    if (!it) {
        base_oom(st, "prefetch", sizeof *it);
        return NULL;
    }
    it->base.ops = &prefetch_ops;
    it->base.ctx = ctx;
    it->cap = *(const int *)ds->params;
    pthread_mutex_init(&it->mu, NULL);
    pthread_cond_init(&it->produce, NULL);
    pthread_cond_init(&it->consume, NULL);
    it->buf = calloc((size_t)it->cap, sizeof *it->buf);
    it->err = dg_status_new();
    if (!it->buf || !it->err) {
        prefetch_free(&it->base);
        base_oom(st, "prefetch", (size_t)it->cap * sizeof(dg_element));
        return NULL;
    }
    it->input = data_make_input(ds, ctx, epoch, st);
    if (!it->input) {
        prefetch_free(&it->base);
        return NULL;
    }
    return &it->base;
}

#define PREFETCH_AUTO_ELEMENTS 2
#define MAX_PREFETCH 4096

dg_dataset *dg_dataset_prefetch(dg_dataset *input, int buffer_size, dg_status *st) {
    dg_status_reset(st);
    if (!input || buffer_size < 0 || buffer_size > MAX_PREFETCH) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "prefetch: %s (buffer_size %d: 0 for auto, up to %d)",
                       !input ? "input dataset is NULL" : "bad buffer_size", buffer_size, MAX_PREFETCH);
        dg_dataset_free(&input);
        return NULL;
    }
    int *p = malloc(sizeof *p);
    if (!p) {
        dg_dataset_free(&input);
        base_oom(st, "prefetch", sizeof *p);
        return NULL;
    }
    *p = buffer_size == DG_PREFETCH_AUTO ? PREFETCH_AUTO_ELEMENTS : buffer_size;
    dg_dataset *ds = data_dataset_new(input, p, free_plain, prefetch_make, st);
    if (!ds) {
        free(p);
        return NULL;
    }
    snprintf(ds->desc, sizeof ds->desc, "prefetch(%d)", *p);
    return ds;
}
