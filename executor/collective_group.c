/* A task's collective groups: elastic memberships, lost tasks and the executions that wait on
 * them (exec_collective_group_impl.h). One mutex guards it all; the lists are short (the
 * groups of one job, the tasks of one cluster, the collectives running now). */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base_impl.h"
#include "exec_collective_group_impl.h"

typedef struct membership {
    char *job;
    int64_t epoch;
    int n;
    int *tasks;
} membership;

typedef struct lost_task {
    char *job;
    int task;
    char *why;
} lost_task;

typedef struct watch {
    int64_t token;
    char *job;
    int n;
    int *tasks;
    void (*on_lost)(void *arg);
    void *arg;
} watch;

struct exec_coll_groups {
    pthread_mutex_t mu;
    atomic_int n_lost;   // read without the lock by exec_coll_task_seen
    membership *views;
    int n_views, cap_views;
    lost_task *lost;
    int cap_lost;
    watch *watches;
    int n_watches, cap_watches;
    int64_t next_token;
};

static void *groups_create(void *arg, dg_status *st) {
    (void)arg;
    exec_coll_groups *g = calloc(1, sizeof *g);
    if (!g) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "collective groups: out of memory");
        return NULL;
    }
    pthread_mutex_init(&g->mu, NULL);
    return g;
}

static void groups_destroy(void *obj) {
    exec_coll_groups *g = obj;
    for (int i = 0; i < g->n_views; i++) {
        free(g->views[i].job);
        free(g->views[i].tasks);
    }
    for (int i = 0; i < atomic_load(&g->n_lost); i++) {
        free(g->lost[i].job);
        free(g->lost[i].why);
    }
    for (int i = 0; i < g->n_watches; i++) {
        free(g->watches[i].job);
        free(g->watches[i].tasks);
    }
    free(g->views);
    free(g->lost);
    free(g->watches);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

exec_coll_groups *exec_coll_groups_of(exec_resources *rm, dg_status *st) {
    return exec_resources_object(rm, "collective_groups", "task", groups_create, NULL, groups_destroy, st);
}

static membership *view_of(exec_coll_groups *g, const char *job) {
    for (int i = 0; i < g->n_views; i++)
        if (strcmp(g->views[i].job, job) == 0) return &g->views[i];
    return NULL;
}

static int lost_index(exec_coll_groups *g, const char *job, int task) {
    int n = atomic_load(&g->n_lost);
    for (int i = 0; i < n; i++)
        if (g->lost[i].task == task && strcmp(g->lost[i].job, job) == 0) return i;
    return -1;
}

static void unmark(exec_coll_groups *g, int i) {
    int n = atomic_load(&g->n_lost);
    free(g->lost[i].job);
    free(g->lost[i].why);
    g->lost[i] = g->lost[n - 1];
    atomic_store(&g->n_lost, n - 1);
}

static char *dup_or_abort(const char *s) {
    char *d = strdup(s);
    if (!d) abort();
    return d;
}

bool exec_coll_set_members(exec_coll_groups *g, const char *job, int64_t epoch, const int *tasks, int n,
                           dg_status *st) {
    if (!job || !*job || n < 1 || n > EXEC_COLL_MAX_MEMBERS || !tasks || epoch < 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "collective group of job \"%s\": needs 1 to %d members and an epoch >= 0 (got %d members, "
                       "epoch %" PRId64 ")",
                       job ? job : "", EXEC_COLL_MAX_MEMBERS, n, epoch);
        return false;
    }
    for (int i = 0; i < n; i++) {
        if (tasks[i] < 0) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "collective group of job \"%s\": member %d is task %d", job, i,
                           tasks[i]);
            return false;
        }
        for (int j = 0; j < i; j++)
            if (tasks[j] == tasks[i]) {
                dg_status_setf(st, DG_INVALID_ARGUMENT,
                               "collective group of job \"%s\": task %d is named twice (members %d and %d)", job,
                               tasks[i], j, i);
                return false;
            }
    }
    int *copy = malloc((size_t)n * sizeof *copy);
    if (!copy) return base_oom(st, "collective group members", (size_t)n * sizeof *copy);
    memcpy(copy, tasks, (size_t)n * sizeof *copy);
    pthread_mutex_lock(&g->mu);
    membership *v = view_of(g, job);
    if (v && epoch < v->epoch) {
        pthread_mutex_unlock(&g->mu);
        free(copy);
        dg_status_setf(st, DG_FAILED_PRECONDITION,
                       "collective group of job \"%s\": epoch %" PRId64 " is older than the epoch %" PRId64 " in force",
                       job, epoch, v->epoch);
        return false;
    }
    if (v && epoch == v->epoch && (v->n != n || memcmp(v->tasks, tasks, (size_t)n * sizeof *tasks) != 0)) {
        pthread_mutex_unlock(&g->mu);
        free(copy);
        dg_status_setf(st, DG_FAILED_PRECONDITION,
                       "collective group of job \"%s\": epoch %" PRId64 " was set before with other members", job,
                       epoch);
        return false;
    }
    if (!v) {
        BASE_PUSH(g->views, g->n_views, g->cap_views, ((membership){.job = dup_or_abort(job)}));
        v = &g->views[g->n_views - 1];
    }
    free(v->tasks);
    v->tasks = copy;
    v->n = n;
    v->epoch = epoch;
    for (int i = 0; i < n; i++) {
        int li = lost_index(g, job, tasks[i]);
        if (li >= 0) unmark(g, li);
    }
    pthread_mutex_unlock(&g->mu);
    return true;
}

bool exec_coll_members(exec_coll_groups *g, const char *job, int64_t *epoch, int *tasks, int cap, int *n) {
    pthread_mutex_lock(&g->mu);
    membership *v = view_of(g, job);
    if (v) {
        *epoch = v->epoch;
        *n = v->n;
        memcpy(tasks, v->tasks, (size_t)(v->n < cap ? v->n : cap) * sizeof *tasks);
    }
    pthread_mutex_unlock(&g->mu);
    return v != NULL;
}

// Under g->mu.
static bool none_lost(exec_coll_groups *g, const char *job, const int *tasks, int n, dg_status *st) {
    for (int i = 0; i < n; i++) {
        int li = lost_index(g, job, tasks[i]);
        if (li >= 0) {
            if (st) dg_status_setf(st, DG_UNAVAILABLE, "member /job:%s/task:%d is lost: %s", job, tasks[i], g->lost[li].why);
            return false;
        }
    }
    return true;
}

bool exec_coll_none_lost(exec_coll_groups *g, const char *job, const int *tasks, int n, dg_status *st) {
    if (atomic_load(&g->n_lost) == 0) return true;
    pthread_mutex_lock(&g->mu);
    bool ok = none_lost(g, job, tasks, n, st);
    pthread_mutex_unlock(&g->mu);
    return ok;
}

int64_t exec_coll_watch(exec_coll_groups *g, const char *job, const int *tasks, int n, void (*on_lost)(void *arg),
                        void *arg) {
    int *copy = malloc((size_t)(n > 0 ? n : 1) * sizeof *copy);
    if (!copy) abort();
    memcpy(copy, tasks, (size_t)n * sizeof *copy);
    pthread_mutex_lock(&g->mu);
    int64_t token = ++g->next_token;
    BASE_PUSH(g->watches, g->n_watches, g->cap_watches,
              ((watch){.token = token, .job = dup_or_abort(job), .n = n, .tasks = copy, .on_lost = on_lost, .arg = arg}));
    pthread_mutex_unlock(&g->mu);
    return token;
}

void exec_coll_unwatch(exec_coll_groups *g, int64_t token) {
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < g->n_watches; i++)
        if (g->watches[i].token == token) {
            free(g->watches[i].job);
            free(g->watches[i].tasks);
            g->watches[i] = g->watches[--g->n_watches];
            break;
        }
    pthread_mutex_unlock(&g->mu);
}

void exec_coll_task_lost(exec_coll_groups *g, const char *job, int task, const char *why) {
    pthread_mutex_lock(&g->mu);
    int li = lost_index(g, job, task);
    if (li >= 0) {
        free(g->lost[li].why);
        g->lost[li].why = dup_or_abort(why);
    } else {
        int n = atomic_load(&g->n_lost);
        base_reserve((void **)&g->lost, sizeof *g->lost, n, &g->cap_lost, 1);
        g->lost[n] = (lost_task){.job = dup_or_abort(job), .task = task, .why = dup_or_abort(why)};
        atomic_store(&g->n_lost, n + 1);
    }
    // Under the lock, so that no execution is told after it unwatched (on_lost only wakes it).
    for (int i = 0; i < g->n_watches; i++) {
        watch *w = &g->watches[i];
        if (strcmp(w->job, job) != 0) continue;
        for (int j = 0; j < w->n; j++)
            if (w->tasks[j] == task) {
                w->on_lost(w->arg);
                break;
            }
    }
    pthread_mutex_unlock(&g->mu);
}

void exec_coll_task_seen(exec_coll_groups *g, const char *job, int task) {
    if (atomic_load(&g->n_lost) == 0) return;
    pthread_mutex_lock(&g->mu);
    int li = lost_index(g, job, task);
    if (li >= 0) unmark(g, li);
    pthread_mutex_unlock(&g->mu);
}

int exec_coll_num_lost(exec_coll_groups *g) { return atomic_load(&g->n_lost); }

int exec_coll_lost_tasks(exec_coll_groups *g, const char *job, int *tasks, int cap) {
    int n = 0;
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < atomic_load(&g->n_lost); i++)
        if (strcmp(g->lost[i].job, job) == 0) {
            if (n < cap) tasks[n] = g->lost[i].task;
            n++;
        }
    pthread_mutex_unlock(&g->mu);
    return n;
}
