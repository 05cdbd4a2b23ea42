/* Power-loss test for runtime/checkpoint.c, in the manner of SQLite's own crash tests. A
 * run opens a store, saves several checkpoints of five variables (a scalar to a 320 KiB
 * tensor that spans six 64 KiB pages, distinct bytes per save, one step saved twice, at most
 * 3 kept), closes, reopens and saves more. tests/runtime/powerloss_vfs.c counts its writes,
 * syncs and truncations and cuts the power after a chosen number of them; from then on every
 * I/O call fails. The test then writes what the disk could hold after the cut (the synced
 * content of the database, WAL and journal, plus a random subset of the unsynced writes in
 * 512-byte sectors; no -shm), opens it with the normal VFS through the public API and checks:
 * the file opens; it lists exactly the checkpoints the retention policy keeps after the saves
 * that returned true, or after those and the save in flight at the cut; every listed
 * checkpoint, the newest committed and the older kept ones, restores bit-exactly against
 * bytes the test keeps itself; and the recovered file takes a new save.
 *
 * DG_POWERLOSS_SEED=N replays a run (the seed picks the cuts and the surviving writes; every
 * run prints it), DG_POWERLOSS_CUTS=N sets the number of cuts (default 240).
 * docs/CHECKPOINT.md describes the model. */
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "powerloss_vfs.h"

#define N_VARS 5
#define N_SAVES 7
#define REOPEN_BEFORE 5        // the store is closed and opened again before this save
#define MAX_TO_KEEP 3
#define DEFAULT_CUTS 240       // about 3 s, 25 s under valgrind memcheck

static const char *const var_names[N_VARS] = {"global_step", "bias", "dense/kernel",
                                              "embedding", "bytes"};
// Save order; step 200 is saved twice, so a save that replaces a step is cut too.
static const int64_t save_steps[N_SAVES] = {100, 200, 300, 200, 400, 500, 600};

typedef struct fixture {
    char dir[64];
    char run_dir[80];        // where the saves run, through the shim
    char crash_dir[80];      // the state after the cut, opened with the normal VFS
    char run_path[96];
    char crash_path[96];
    // The values of every save, kept by the test: want[save][var] (bytes), and the tensors
    // handed to the saves, built from copies of them.
    unsigned char *want[N_SAVES][N_VARS];
    size_t want_bytes[N_VARS];
    dg_dtype dtypes[N_VARS];
    dg_shape shapes[N_VARS];
    dg_tensor *values[N_SAVES][N_VARS];
} fixture;

// What each cut is, for messages: set before the cut runs.
static char g_cut_text[256];

#define CHECK(cond, ...)                                              \
    do {                                                              \
        if (!(cond)) {                                                \
            print_error("%s: ", g_cut_text);                          \
            print_error(__VA_ARGS__);                                 \
            print_error("\n");                                        \
            fail();                                                   \
        }                                                             \
    } while (0)

static uint64_t mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// Removes every file in dir (the directories hold files only).
static void empty_dir(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    char p[512];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        assert_int_equal(unlink(p), 0);
    }
    closedir(d);
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    if (!f) return -1;
    snprintf(f->dir, sizeof f->dir, "/tmp/dg_ckpt_pl_XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    snprintf(f->run_dir, sizeof f->run_dir, "%s/run", f->dir);
    snprintf(f->crash_dir, sizeof f->crash_dir, "%s/crash", f->dir);
    if (mkdir(f->run_dir, 0700) || mkdir(f->crash_dir, 0700)) return -1;
    snprintf(f->run_path, sizeof f->run_path, "%s/ckpt.db", f->run_dir);
    snprintf(f->crash_path, sizeof f->crash_path, "%s/ckpt.db", f->crash_dir);

    const dg_dtype dtypes[N_VARS] = {DG_INT64, DG_FLOAT32, DG_FLOAT32, DG_FLOAT64, DG_UINT8};
    const dg_shape shapes[N_VARS] = {dg_shape_scalar(), dg_shape1(7), dg_shape2(256, 320),
                                     dg_shape2(33, 5), dg_shape1(1000)};
    dg_status *st = dg_status_new();
    if (!st) return -1;
    for (int v = 0; v < N_VARS; v++) {
        f->dtypes[v] = dtypes[v];
        f->shapes[v] = shapes[v];
        f->want_bytes[v] = (size_t)dg_shape_num_elements(&shapes[v]) * dg_dtype_size(dtypes[v]);
    }
    for (int i = 0; i < N_SAVES; i++) {
        for (int v = 0; v < N_VARS; v++) {
            size_t n = f->want_bytes[v];
            unsigned char *b = malloc(n);
            if (!b) return -1;
            // Random bytes: NaN payloads and negative zeros occur, so only memcmp will do.
            uint64_t x = mix(((uint64_t)i << 8) | (uint64_t)v);
            for (size_t k = 0; k < n; k++) {
                if (k % 8 == 0) x = mix(x);
                b[k] = (unsigned char)(x >> (8 * (k % 8)));
            }
            if (v == 0) memcpy(b, &save_steps[i], sizeof save_steps[i]);
            f->want[i][v] = b;
            f->values[i][v] = dg_tensor_from_data(dtypes[v], shapes[v], b, st);
            if (!f->values[i][v]) return -1;
        }
    }
    dg_status_free(&st);
    if (!plvfs_install()) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    plvfs_uninstall();
    for (int i = 0; i < N_SAVES; i++)
        for (int v = 0; v < N_VARS; v++) {
            dg_tensor_free(&f->values[i][v]);
            free(f->want[i][v]);
        }
    dg_test_rmtree(f->dir);
    free(f);
    return 0;
}

// Runs the saves against path through the shim and returns how many returned true before
// the first failure (after a cut the rest are not tried: the program would have died). With
// ops_after, records the shim's call count after each save returned.
static int run_saves(fixture *f, int64_t *ops_after, char *err, size_t err_cap) {
    dg_status *st = dg_status_new();
    dg_checkpoint_store *s = NULL;
    int n_ok = 0;
    for (int i = 0; i < N_SAVES; i++) {
        if (i == 0 || i == REOPEN_BEFORE) {
            dg_checkpoint_store_free(&s);
            if (!(s = dg_checkpoint_store_new(f->run_path, i == 0, st))) break;
        }
        if (!dg_checkpoint_save(s, save_steps[i], var_names, f->values[i], N_VARS, MAX_TO_KEEP,
                                st))
            break;
        n_ok++;
        if (ops_after) ops_after[i] = plvfs_n_ops();
    }
    dg_checkpoint_store_free(&s);
    if (err) snprintf(err, err_cap, "%s", dg_status_message(st));
    dg_status_free(&st);
    return n_ok;
}

// The saves (indices into save_steps) kept after the first n_saves saves, oldest first.
static int kept_after(int n_saves, int kept[N_SAVES]) {
    int n = 0;
    for (int i = 0; i < n_saves; i++) {
        int w = 0;
        for (int k = 0; k < n; k++)
            if (save_steps[kept[k]] != save_steps[i]) kept[w++] = kept[k];
        n = w;
        kept[n++] = i;
        if (n > MAX_TO_KEEP) {
            memmove(kept, kept + 1, (size_t)(n - 1) * sizeof *kept);
            n--;
        }
    }
    return n;
}

static bool steps_match(const int64_t *steps, int n_steps, const int *kept, int n_kept) {
    if (n_steps != n_kept) return false;
    for (int k = 0; k < n_kept; k++)
        if (steps[k] != save_steps[kept[k]]) return false;
    return true;
}

static void steps_text(const int64_t *steps, int n, char *buf, size_t cap) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < n && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%" PRId64, i ? " " : "", steps[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

// Whether the restored tensors hold exactly the values of save i.
static bool restores_as(const fixture *f, dg_tensor *const *out, int i) {
    for (int v = 0; v < N_VARS; v++) {
        if (!out[v] || dg_tensor_dtype(out[v]) != f->dtypes[v] ||
            !dg_shape_equal(dg_tensor_shape(out[v]), &f->shapes[v]) ||
            dg_tensor_nbytes(out[v]) != f->want_bytes[v] ||
            memcmp(dg_tensor_data(out[v]), f->want[i][v], f->want_bytes[v]) != 0)
            return false;
    }
    return true;
}

typedef struct verdict {
    bool has_in_flight;      // the save in flight at the cut is in the file
    int n_older;             // older committed checkpoints restored
} verdict;

// Opens the state left by the cut and checks it against the first n_ok saves (and the one
// in flight, which may or may not be there).
static verdict check_crash_state(fixture *f, int n_ok) {
    verdict vd = {0};
    dg_status *st = dg_status_new();
    // Before the first save returned, the file may hold a half-made schema or nothing: it must
    // still open as a store (create), as the program would do when it restarts.
    dg_checkpoint_store *s = dg_checkpoint_store_new(f->crash_path, n_ok == 0, st);
    CHECK(s, "the file does not open: %s", dg_status_message(st));

    int64_t *steps = NULL;
    int n_steps = dg_checkpoint_list(s, &steps, st);
    CHECK(n_steps >= 0, "listing fails: %s", dg_status_message(st));
    int kept_a[N_SAVES], kept_b[N_SAVES];
    int n_a = kept_after(n_ok, kept_a);
    int n_b = n_ok < N_SAVES ? kept_after(n_ok + 1, kept_b) : -1;
    bool is_a = steps_match(steps, n_steps, kept_a, n_a);
    bool is_b = n_b >= 0 && steps_match(steps, n_steps, kept_b, n_b);
    char got[128], want_a[128], want_b[128] = "-";
    int64_t sa[N_SAVES], sb[N_SAVES];
    for (int k = 0; k < n_a; k++) sa[k] = save_steps[kept_a[k]];
    for (int k = 0; k < n_b; k++) sb[k] = save_steps[kept_b[k]];
    steps_text(steps, n_steps, got, sizeof got);
    steps_text(sa, n_a, want_a, sizeof want_a);
    if (n_b >= 0) steps_text(sb, n_b, want_b, sizeof want_b);
    CHECK(is_a || is_b,
          "%d saves returned true; the file lists steps %s, expected %s (the committed saves) "
          "or %s (and the save in flight)",
          n_ok, got, want_a, want_b);
    vd.has_in_flight = !is_a;

    int64_t latest = dg_checkpoint_latest_step(s, st);
    CHECK(latest == (n_steps ? steps[n_steps - 1] : -1), "newest step %" PRId64 ", list %s",
          latest, got);

    // Every listed checkpoint restores exactly: the newest committed one, the older ones the
    // policy keeps, and the one in flight if it made it.
    for (int k = 0; k < n_steps; k++) {
        dg_tensor *out[N_VARS] = {0};
        int64_t restored = -1;
        bool ok = dg_checkpoint_restore(s, steps[k], var_names, N_VARS, out, &restored, st);
        CHECK(ok, "step %" PRId64 " is listed but does not restore: %s", steps[k],
              dg_status_message(st));
        CHECK(restored == steps[k], "asked for step %" PRId64 ", got %" PRId64, steps[k],
              restored);
        bool exact = (is_a && restores_as(f, out, kept_a[k])) ||
                     (is_b && restores_as(f, out, kept_b[k]));
        for (int v = 0; v < N_VARS; v++) dg_tensor_unref(out[v]);
        CHECK(exact, "step %" PRId64 " restores, but not to the bytes saved", steps[k]);
        int save = is_a ? kept_a[k] : kept_b[k];
        if (save < n_ok - 1) vd.n_older++;
    }
    if (n_ok > 0) {
        // The newest committed step is listed (with the bytes of the save in flight instead
        // when that one saved the same step again and made it).
        bool found = false;
        for (int k = 0; k < n_steps; k++) found |= steps[k] == save_steps[n_ok - 1];
        CHECK(found, "the last committed step %" PRId64 " is missing from %s",
              save_steps[n_ok - 1], got);
    }
    free(steps);

    // The recovered file takes the next save.
    dg_tensor *one[1] = {f->values[0][0]};
    bool saved = dg_checkpoint_save(s, 1000, var_names, one, 1, 0, st);
    CHECK(saved, "saving after recovery fails: %s", dg_status_message(st));
    dg_tensor *back[1] = {NULL};
    bool ok = dg_checkpoint_restore(s, -1, var_names, 1, back, NULL, st);
    CHECK(ok, "restoring the save after recovery fails: %s", dg_status_message(st));
    CHECK(memcmp(dg_tensor_data(back[0]), f->want[0][0], f->want_bytes[0]) == 0,
          "the save after recovery restores other bytes");
    dg_tensor_unref(back[0]);
    dg_checkpoint_store_free(&s);
    dg_status_free(&st);
    return vd;
}

static uint64_t env_u64(const char *name, uint64_t dflt) {
    const char *e = getenv(name);
    if (!e || !*e) return dflt;
    char *end = NULL;
    unsigned long long v = strtoull(e, &end, 10);
    return *end ? dflt : (uint64_t)v;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void test_power_loss_at_every_stage(void **state) {
    fixture *f = *state;
    double t0 = now_s();
    uint64_t seed = env_u64("DG_POWERLOSS_SEED", mix((uint64_t)time(NULL) ^ (uint64_t)getpid()));
    int n_cuts = (int)env_u64("DG_POWERLOSS_CUTS", DEFAULT_CUTS);
    printf("power-loss test: seed %" PRIu64 " (DG_POWERLOSS_SEED=%" PRIu64 " replays it), "
           "%d cuts\n", seed, seed, n_cuts);
    fflush(stdout);

    // An uncut run: every save succeeds, and it tells how many calls a whole run makes.
    char err[1024];
    int64_t ops_after[N_SAVES] = {0};
    snprintf(g_cut_text, sizeof g_cut_text, "uncut run (seed %" PRIu64 ")", seed);
    plvfs_reset(-1);
    plvfs_set_default(true);
    int n_ok = run_saves(f, ops_after, err, sizeof err);
    plvfs_set_default(false);
    CHECK(n_ok == N_SAVES, "only %d of %d saves succeed without a cut: %s", n_ok, N_SAVES, err);
    int64_t n_total = plvfs_n_ops();
    CHECK(n_total > 2 * N_SAVES, "a run makes only %" PRId64 " counted calls", n_total);
    char *kinds = malloc((size_t)n_total);
    assert_non_null(kinds);
    int n_syncs = 0;
    for (int64_t i = 0; i < n_total; i++) n_syncs += (kinds[i] = plvfs_op_kind(i)) == 's';
    printf("a run makes %" PRId64 " writes, syncs and truncations (%d syncs); saves return "
           "after", n_total, n_syncs);
    for (int i = 0; i < N_SAVES; i++) printf(" %" PRId64, ops_after[i]);
    printf("\n");
    fflush(stdout);

    int n_by_saves[N_SAVES + 1] = {0}, n_in_flight = 0, n_older = 0;
    int64_t n_pieces = 0, n_applied = 0;
    for (int c = 0; c < n_cuts; c++) {
        uint64_t cseed = mix(seed ^ mix((uint64_t)c + 1));
        // Cuts spread evenly over the run, each at a random call of its stretch.
        int64_t lo = (int64_t)c * n_total / n_cuts, hi = (int64_t)(c + 1) * n_total / n_cuts;
        int64_t cut = lo + (hi > lo ? (int64_t)(cseed % (uint64_t)(hi - lo)) : 0);
        // Every third cut fails an xSync (the first at or after lo): everything before it
        // was written and none of it is durable yet, the moment a commit is decided.
        if (c % 3 == 2) {
            int64_t j = lo;
            while (j < n_total && kinds[j] != 's') j++;
            if (j == n_total)
                for (j = lo; j > 0 && kinds[j] != 's'; j--) continue;
            cut = j;
        }
        // A quarter of the cuts keep only synced data, a quarter every write (a killed
        // process), the rest each unsynced sector with a probability of their own.
        double keep_prob = c % 4 == 0 ? 0.0
                           : c % 4 == 1 ? 1.0
                                        : (double)(mix(cseed) >> 11) * 0x1.0p-53;
        snprintf(g_cut_text, sizeof g_cut_text,
                 "cut %d of %d (seed %" PRIu64 "): power lost after %" PRId64 " of %" PRId64
                 " calls, unsynced sectors kept with p=%.3f",
                 c + 1, n_cuts, seed, cut, n_total, keep_prob);

        empty_dir(f->run_dir);
        empty_dir(f->crash_dir);
        plvfs_reset(cut);
        plvfs_set_default(true);
        n_ok = run_saves(f, NULL, err, sizeof err);
        plvfs_set_default(false);
        CHECK(plvfs_is_cut(), "the run ended (%d saves) before the cut", n_ok);
        CHECK(n_ok == N_SAVES || strstr(err, "I/O error") || strstr(err, "disk I/O"),
              "save %d failed with something other than the cut: %s", n_ok + 1, err);
        plvfs_crash_stats cs;
        CHECK(plvfs_write_crash_state(f->crash_dir, cseed, keep_prob, &cs),
              "writing the crash state failed");
        n_pieces += cs.n_pieces;
        n_applied += cs.n_applied;

        verdict vd = check_crash_state(f, n_ok);
        n_by_saves[n_ok]++;
        n_in_flight += vd.has_in_flight;
        n_older += vd.n_older;
    }
    plvfs_reset(-1);
    free(kinds);
    printf("%d cuts in %.1f s; cuts after 0..%d committed saves:", n_cuts, now_s() - t0,
           N_SAVES);
    for (int i = 0; i <= N_SAVES; i++) printf(" %d", n_by_saves[i]);
    printf("\nthe save in flight made it %d times; %d older checkpoints restored; %" PRId64
           " of %" PRId64 " unsynced sector pieces landed\n",
           n_in_flight, n_older, n_applied, n_pieces);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_power_loss_at_every_stage, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
