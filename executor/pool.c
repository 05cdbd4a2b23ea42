/* A fixed thread pool. Idle workers block on a condition variable: on a 2-core machine a
 * spinning pool steals the cycles the caller's thread needs. */
#include <pthread.h>
#include <stdlib.h>

#include "exec_pool_impl.h"

typedef struct task {
    exec_task_fn fn;
    void *arg;
    int a;
} task;

struct exec_pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    task *q;            // ring buffer
    size_t head, count, cap;
    bool stop;
    pthread_t *threads;
    int n_threads;
};

static void *worker(void *arg) {
    exec_pool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->count && !p->stop) pthread_cond_wait(&p->cv, &p->mu);
        if (!p->count && p->stop) break;
        task t = p->q[p->head];
        p->head = (p->head + 1) % p->cap;
        p->count--;
        pthread_mutex_unlock(&p->mu);
        t.fn(t.arg, t.a);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

exec_pool *exec_pool_new(int n_threads, dg_status *st) {
    exec_pool *p = calloc(1, sizeof *p);
    if (!p) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "thread pool: out of memory");
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->cap = 256;
    p->q = malloc(p->cap * sizeof *p->q);
    p->threads = calloc((size_t)(n_threads > 0 ? n_threads : 1), sizeof *p->threads);
    if (!p->q || !p->threads) {
        exec_pool_free(&p);
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "thread pool: out of memory");
        return NULL;
    }
    for (int i = 0; i < n_threads; i++) {
        if (pthread_create(&p->threads[i], NULL, worker, p) != 0) {
            exec_pool_free(&p);
            dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "thread pool: cannot start thread %d", i);
            return NULL;
        }
        p->n_threads++;
    }
    return p;
}

void exec_pool_free(exec_pool **pp) {
    if (!pp || !*pp) return;
    exec_pool *p = *pp;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->q);
    free(p->threads);
    free(p);
    *pp = NULL;
}

int exec_pool_size(const exec_pool *p) { return p ? p->n_threads : 0; }

void exec_pool_submit(exec_pool *p, exec_task_fn fn, void *arg, int a) {
    pthread_mutex_lock(&p->mu);
    if (p->count == p->cap) {
        size_t ncap = p->cap * 2;
        task *nq = malloc(ncap * sizeof *nq);
        if (!nq) abort();
        for (size_t i = 0; i < p->count; i++) nq[i] = p->q[(p->head + i) % p->cap];
        free(p->q);
        p->q = nq;
        p->head = 0;
        p->cap = ncap;
    }
    p->q[(p->head + p->count) % p->cap] = (task){fn, arg, a};
    p->count++;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

bool exec_pool_take(exec_pool *p, exec_task_fn fn, void *arg, int *a) {
    pthread_mutex_lock(&p->mu);
    bool found = false;
    for (size_t i = 0; i < p->count && !found; i++) {
        size_t at = (p->head + i) % p->cap;
        if (p->q[at].fn != fn || p->q[at].arg != arg) continue;
        *a = p->q[at].a;
        // Close the gap: the tasks queued after it move up one place, in order.
        for (size_t j = i; j + 1 < p->count; j++)
            p->q[(p->head + j) % p->cap] = p->q[(p->head + j + 1) % p->cap];
        p->count--;
        found = true;
    }
    pthread_mutex_unlock(&p->mu);
    return found;
}
