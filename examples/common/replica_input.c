/* The replica examples' input through a dataset (replica_input.h). */
#include "replica_input.h"

#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void push(char ***files, int *n, int *cap, const char *name) {
    if (*n == *cap && !(*files = realloc(*files, (size_t)(*cap = *cap ? 2 * *cap : 16) * sizeof **files))) abort();
    if (!((*files)[(*n)++] = strdup(name))) abort();
}

bool replica_input_files(const char *pattern, const char *suffix, char ***files, int *n_files, dg_status *st) {
    *files = NULL;
    *n_files = 0;
    int cap = 0;
    struct stat sb;
    if (stat(pattern, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        DIR *d = opendir(pattern);
        if (!d) {
            dg_status_setf(st, DG_NOT_FOUND, "%s: %s", pattern, strerror(errno));
            return false;
        }
        size_t ls = suffix ? strlen(suffix) : 0;
        struct dirent *e;
        while ((e = readdir(d))) {
            size_t ln = strlen(e->d_name);
            if (e->d_name[0] == '.' || (suffix && (ln < ls || strcmp(e->d_name + ln - ls, suffix) != 0))) continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", pattern, e->d_name);
            if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) push(files, n_files, &cap, path);
        }
        closedir(d);
        if (*n_files > 0) qsort(*files, (size_t)*n_files, sizeof **files, cmp_str);
    } else {
        glob_t g;
        if (glob(pattern, 0, NULL, &g) == 0) {   // glob sorts its matches
            for (size_t i = 0; i < g.gl_pathc; i++) push(files, n_files, &cap, g.gl_pathv[i]);
            globfree(&g);
        }
    }
    if (*n_files == 0) {
        dg_status_setf(st, DG_NOT_FOUND, "%s: no %s%s%s", pattern, suffix ? "*" : "", suffix ? suffix : "",
                       suffix ? " files (a directory or a pattern of dg-tfrecord's shards)" : "files");
        return false;
    }
    return true;
}

void replica_input_files_free(char **files, int n_files) {
    for (int i = 0; i < n_files; i++) free(files[i]);
    free(files);
}

bool replica_input_start(replica_input *in, dg_dataset *ds, dg_monitored_session *ms, const char *checkpoint_path,
                         dg_status *st) {
    in->ds = ds;
    if (!ds || !(in->it = dg_iterator_new(ds, st))) return false;
    // Only the chief saves checkpoints; the others' savers never write, so their position is
    // not kept: after a restart they start their shard again.
    if (!dg_monitored_session_is_chief(ms) || !checkpoint_path || !*checkpoint_path) return true;
    if (!dg_iterator_attach_saver(in->it, dg_monitored_session_saver(ms), REPLICA_INPUT_BLOB, st)) return false;
    int64_t step = dg_monitored_session_restored_step(ms);
    if (step < 0) return true;
    dg_checkpoint_store *store = dg_checkpoint_store_new(checkpoint_path, false, st);
    if (!store) return false;
    // The step the variables came from, not the newest: another process may have saved since.
    bool ok = dg_iterator_restore_checkpoint(in->it, store, step, REPLICA_INPUT_BLOB, st);
    dg_checkpoint_store_free(&store);
    if (ok) {
        printf("Worker %lld: input position restored from the checkpoint of global step %lld: batch %lld\n",
               (long long)in->task, (long long)step, (long long)dg_iterator_position(in->it));
    } else if (dg_status_code(st) == DG_NOT_FOUND) {
        // The checkpoint saved when the variables were first initialized precedes the iterator.
        printf("Worker %lld: the checkpoint of global step %lld holds no input position: the input starts at "
               "its beginning\n", (long long)in->task, (long long)step);
        dg_status_reset(st);
        ok = true;
    }
    fflush(stdout);
    return ok;
}

// FNV-1a over every component's bytes.
static uint64_t element_hash(const dg_element *e) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int c = 0; c < e->n; c++) {
        const unsigned char *p = dg_tensor_data(e->components[c]);
        size_t n = dg_tensor_nbytes(e->components[c]);
        for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    }
    return h;
}

bool replica_input_next(replica_input *in, dg_status *st) {
    double t0 = now_s();
    bool end = false;
    if (!dg_iterator_next(in->it, &in->batch, &end, st)) return false;
    if (end) {
        dg_status_set(st, DG_OUT_OF_RANGE, "the training input ended");
        return false;
    }
    double t1 = now_s();
    if (in->n_next == 0) {
        in->first_call_s = t0;
        in->first_wait_s = t1 - t0;
    } else {
        in->wait_s += t1 - t0;
    }
    in->last_call_s = t0;
    in->n_next++;
    if (in->print_hash)
        printf("Worker %lld: batch of local step %lld: hash %016llx\n", (long long)in->task, (long long)in->n_next,
               (unsigned long long)element_hash(&in->batch));
    return true;
}

void replica_input_report(const replica_input *in) {
    if (in->n_next < 2) return;
    // From the second batch on: the first one waits for the pipeline to fill (reported apart).
    int64_t n = in->n_next - 1;
    double wait_ms = in->wait_s / (double)n * 1e3, step_ms = (in->last_call_s - in->first_call_s) / (double)n * 1e3;
    printf("Worker %lld: input: %.3f ms waiting for the next batch per step, mean step %.3f ms (%.2f%% of the step; "
           "%lld steps after the first, whose batch took %.1f ms)\n", (long long)in->task, wait_ms, step_ms,
           step_ms > 0 ? 100.0 * wait_ms / step_ms : 0.0, (long long)n, in->first_wait_s * 1e3);
}

void replica_input_free(replica_input *in) {
    dg_element_clear(&in->batch);
    dg_iterator_free(&in->it);
    dg_dataset_free(&in->ds);
}
