/* dg-ckpt-writer: the writer and the checker of tests/integration/checkpoint_crash.sh.
 *   dg-ckpt-writer PATH [--steps N] [--max_to_keep K]
 *       saves steps latest+1, latest+2, ... into the checkpoint file PATH (created if missing),
 *       forever or N times, keeping the newest K (default 3); prints "saved step S" after
 *       each save returns.
 *   dg-ckpt-writer --verify PATH
 *       restores every checkpoint in PATH, newest first, and compares every byte with what
 *       the writer stores for that step; prints "verified step S (N checkpoints)" for the
 *       newest. Exit 0: all exact; 1: a mismatch or an error; 3: no checkpoint in the file.
 * The value of every variable is a function of (step, name, index), so the checker needs
 * nothing but the step. Uses the public API only. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <distgraph/distgraph.h>

typedef struct var_spec {
    const char *name;
    dg_dtype dtype;
    int rank;
    int64_t dims[3];
} var_spec;

// Every dtype, a scalar, an empty tensor and one of 4 MiB.
static const var_spec vars[] = {
    {"global_step", DG_INT64, 0, {0}},
    {"dense/kernel", DG_FLOAT32, 2, {1024, 1024}},
    {"dense/bias", DG_FLOAT64, 1, {1000}},
    {"embed/ids", DG_INT32, 3, {7, 11, 13}},
    {"mask", DG_BOOL, 1, {33}},
    {"pixels", DG_UINT8, 2, {3, 5}},
    {"counts", DG_INT64, 1, {0}},
    {"lr", DG_FLOAT32, 0, {0}},
};
#define N_VARS ((int)(sizeof vars / sizeof vars[0]))

static uint64_t mix(uint64_t x) {   // splitmix64's finaliser
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;   // FNV-1a
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

// The bytes variable v holds at step: 8 bytes per hash, bools reduced to 0/1, and the scalar
// global_step holds the step itself.
static void fill(const var_spec *v, int64_t step, unsigned char *buf, size_t n) {
    if (strcmp(v->name, "global_step") == 0) {
        memcpy(buf, &step, sizeof step);
        return;
    }
    uint64_t seed = mix((uint64_t)step) ^ name_hash(v->name);
    for (size_t i = 0; i < n; i += 8) {
        uint64_t w = mix(seed + i / 8);
        size_t k = n - i < 8 ? n - i : 8;
        memcpy(buf + i, &w, k);
    }
    if (v->dtype == DG_BOOL)
        for (size_t i = 0; i < n; i++) buf[i] &= 1;
}

static dg_shape shape_of(const var_spec *v) { return dg_shape_make(v->rank, v->dims); }

static int run_writer(const char *path, int64_t n_steps, int max_to_keep) {
    dg_status *st = dg_status_new();
    dg_tensor *t[N_VARS] = {0};
    const char *names[N_VARS];
    int rc = 1;
    dg_checkpoint_store *s = dg_checkpoint_store_new(path, true, st);
    if (!s) goto done;
    int64_t step = dg_checkpoint_latest_step(s, st);
    if (!dg_status_ok(st)) goto done;
    for (int i = 0; i < N_VARS; i++) {
        names[i] = vars[i].name;
        if (!(t[i] = dg_tensor_new(vars[i].dtype, shape_of(&vars[i]), st))) goto done;
    }
    for (int64_t k = 0; n_steps < 0 || k < n_steps; k++) {
        step = step < 0 ? 1 : step + 1;
        for (int i = 0; i < N_VARS; i++)
            fill(&vars[i], step, dg_tensor_data(t[i]), dg_tensor_nbytes(t[i]));
        if (!dg_checkpoint_save(s, step, names, t, N_VARS, max_to_keep, st)) goto done;
        printf("saved step %lld\n", (long long)step);
        fflush(stdout);
    }
    rc = 0;
done:
    if (rc) fprintf(stderr, "dg-ckpt-writer: %s\n", dg_status_message(st));
    for (int i = 0; i < N_VARS; i++) dg_tensor_unref(t[i]);
    dg_checkpoint_store_free(&s);
    dg_status_free(&st);
    return rc;
}

// Restores step and compares dtype, shape and every byte of every variable.
static bool verify_step(dg_checkpoint_store *s, int64_t step, dg_status *st) {
    const char *names[N_VARS];
    dg_tensor *t[N_VARS] = {0};
    unsigned char *want = NULL;
    bool ok = false;
    int64_t got_step = -1;
    for (int i = 0; i < N_VARS; i++) names[i] = vars[i].name;
    if (!dg_checkpoint_restore(s, step, names, N_VARS, t, &got_step, st)) goto done;
    if (got_step != step) {
        dg_status_setf(st, DG_INTERNAL, "asked for step %lld, restored %lld", (long long)step,
                       (long long)got_step);
        goto done;
    }
    for (int i = 0; i < N_VARS; i++) {
        dg_shape sh = shape_of(&vars[i]);
        size_t n = dg_tensor_nbytes(t[i]);
        if (dg_tensor_dtype(t[i]) != vars[i].dtype || !dg_shape_equal(dg_tensor_shape(t[i]), &sh)) {
            dg_status_setf(st, DG_INTERNAL, "step %lld: \"%s\" has another dtype or shape",
                           (long long)step, vars[i].name);
            goto done;
        }
        free(want);
        if (!(want = malloc(n ? n : 1))) {
            dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "%zu bytes", n);
            goto done;
        }
        fill(&vars[i], step, want, n);
        if (n && memcmp(want, dg_tensor_data(t[i]), n) != 0) {
            size_t at = 0;
            while (want[at] == ((unsigned char *)dg_tensor_data(t[i]))[at]) at++;
            dg_status_setf(st, DG_DATA_LOSS, "step %lld: \"%s\" differs first at byte %zu of %zu",
                           (long long)step, vars[i].name, at, n);
            goto done;
        }
    }
    ok = true;
done:
    free(want);
    for (int i = 0; i < N_VARS; i++) dg_tensor_unref(t[i]);
    return ok;
}

static int run_verify(const char *path) {
    dg_status *st = dg_status_new();
    int64_t *steps = NULL;
    int rc = 1;
    dg_checkpoint_store *s = dg_checkpoint_store_new(path, false, st);
    if (!s) goto done;
    int n = dg_checkpoint_list(s, &steps, st);
    if (n < 0) goto done;
    if (n == 0) {
        printf("no checkpoint\n");
        rc = 3;
        goto done;
    }
    int64_t latest = dg_checkpoint_latest_step(s, st);
    if (latest != steps[n - 1]) {
        dg_status_setf(st, DG_INTERNAL, "latest step %lld is not the last listed, %lld",
                       (long long)latest, (long long)steps[n - 1]);
        goto done;
    }
    for (int i = n - 1; i >= 0; i--)
        if (!verify_step(s, steps[i], st)) goto done;
    printf("verified step %lld (%d checkpoints)\n", (long long)latest, n);
    rc = 0;
done:
    if (rc == 1) fprintf(stderr, "dg-ckpt-writer --verify: %s\n", dg_status_message(st));
    free(steps);
    dg_checkpoint_store_free(&s);
    dg_status_free(&st);
    return rc;
}

int main(int argc, char **argv) {
    const char *path = NULL;
    bool verify = false;
    int64_t n_steps = -1;
    int max_to_keep = 3;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--verify") == 0) {
            verify = true;
        } else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
            n_steps = strtoll(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--max_to_keep") == 0 && i + 1 < argc) {
            max_to_keep = atoi(argv[++i]);
        } else if (argv[i][0] != '-' && !path) {
            path = argv[i];
        } else {
            path = NULL;
            break;
        }
    }
    if (!path) {
        fprintf(stderr, "usage: dg-ckpt-writer PATH [--steps N] [--max_to_keep K]\n"
                        "       dg-ckpt-writer --verify PATH\n");
        return 2;
    }
    return verify ? run_verify(path) : run_writer(path, n_steps, max_to_keep);
}
