/* The replica device setter against TensorFlow's own answers: tests/tf_conformance/
 * device_setter.tsv, written by gen_device_tables.py from training.device_setter's
 * replica_device_setter (and tf.contrib's GreedyLoadBalancingStrategy with a table of loads).
 * Each "setter" row makes a setter, each "op" row asks it for the device of a node of the given
 * op type whose current device is given, as TensorFlow's device function was asked for a
 * NodeDef. Rows tagged with a reason are deliberate differences (docs/TF_COMPAT.md). */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CELLS 12

static int n_failures;

static void mismatch(int line, const char *what, const char *want, const char *got) {
    if (++n_failures <= 60)
        print_error("device_setter.tsv:%d %s: TensorFlow says \"%s\", distgraph \"%s\"\n", line, what,
                    want, got);
}


// The load of the op being placed, set from its row before the setter is asked.
static double row_load;

static bool load_from_row(void *ctx, const dg_node *op, double *load, dg_status *st) {
    (void)ctx;
    (void)op;
    (void)st;
    *load = row_load;
    return true;
}

// One node per op type of the table, in a graph of its own.
typedef struct nodes {
    dg_graph *g;
    const char *types[6];
    dg_node *node[6];
} nodes;

static void nodes_make(nodes *n) {
    dg_graph *g = dg_graph_new();
    n->g = g;
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape1(2));
    const char *types[] = {"VariableV2", "Placeholder", "Const", "Identity", "NoOp", "Add"};
    dg_node *node[] = {dg_variable(g, "v", DG_FLOAT32, dg_shape1(2), dg_init_zeros()).node, x.node,
                       dg_scalar(g, "c", DG_FLOAT32, 1).node, dg_identity(g, "i", x).node,
                       dg_no_op(g, "n"), dg_add(g, "a", x, x).node};
    assert_true(dg_graph_ok(g));
    for (int i = 0; i < 6; i++) {
        n->types[i] = types[i];
        n->node[i] = node[i];
        assert_string_equal(dg_node_op_type(node[i]), types[i]);
    }
}

static const dg_node *node_of(const nodes *n, const char *type) {
    for (int i = 0; i < 6; i++)
        if (strcmp(n->types[i], type) == 0) return n->node[i];
    fail_msg("no node of op type %s", type);
    return NULL;
}

typedef struct setter_row {
    char id[64];
    dg_device_fn *fn;      // NULL: not made
    bool made;             // distgraph made it
    bool skip_ops;         // a deliberate difference in the options: op rows are not checked
    char *ps_ops_buf;
    const char *ps_ops[32];
} setter_row;

static void setter_drop(setter_row *s) {
    dg_device_fn_free(&s->fn);
    free(s->ps_ops_buf);
    s->ps_ops_buf = NULL;
}

// setter id ps_tasks ps_device worker_device merge cluster ps_ops strategy
static void setter_make(setter_row *s, char **c, int n_cells, int line, dg_status *st) {
    assert_int_equal(n_cells, 9);
    setter_drop(s);
    snprintf(s->id, sizeof s->id, "%s", c[1]);
    dg_replica_device_setter_options o = dg_replica_device_setter_options_default();
    o.ps_tasks = atoi(c[2]);
    o.ps_device = dg_test_tsv_unescape(c[3]);
    o.worker_device = dg_test_tsv_unescape(c[4]);
    o.merge_devices = strcmp(c[5], "1") == 0;
    dg_cluster *cluster = NULL;
    if (strcmp(c[6], "-") != 0) {
        cluster = dg_cluster_from_json(c[6], st);
        if (!cluster) fail_msg("device_setter.tsv:%d: cluster %s: %s", line, c[6], dg_status_message(st));
        o.cluster = cluster;
    }
    if (strcmp(c[7], "<standard>") != 0) {
        int n = 0;
        if (strcmp(c[7], "<none>") != 0) {
            s->ps_ops_buf = strdup(c[7]);
            for (char *tok = strtok(s->ps_ops_buf, ","); tok && n < 32; tok = strtok(NULL, ","))
                s->ps_ops[n++] = tok;
        }
        o.ps_ops = s->ps_ops;
        o.n_ps_ops = n;
    }
    if (strcmp(c[8], "greedy") == 0) {
        o.strategy = DG_PS_GREEDY;
        o.load_fn = load_from_row;
    } else {
        assert_string_equal(c[8], "round_robin");
    }
    s->fn = dg_replica_device_setter_new(&o, st);
    s->made = s->fn != NULL;
    if (!s->made) assert_int_equal(dg_status_code(st), DG_INVALID_ARGUMENT);
    dg_cluster_free(&cluster);
}

static void test_setter_table(void **state) {
    (void)state;
    const char *root = getenv("DG_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/tf_conformance/device_setter.tsv", root ? root : ".");
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s (set DG_SOURCE_DIR to the source tree)", path);
    dg_status *st = dg_status_new();
    nodes ns;
    nodes_make(&ns);
    setter_row s;
    memset(&s, 0, sizeof s);
    char *buf = NULL;
    size_t cap = 0;
    int line = 0, n_ops = 0, n_setters = 0, n_diff = 0;
    bool saw_standard = false;
    while (getline(&buf, &cap, f) >= 0) {
        line++;
        char *c[MAX_CELLS];
        if (strncmp(buf, "# standard_ps_ops ", 18) == 0) {
            // TensorFlow's STANDARD_PS_OPS, in order.
            char *list = buf + 18;
            list[strcspn(list, "\r\n")] = '\0';
            int n = 0;
            const char *const *ops = dg_standard_ps_ops(&n);
            int k = 0;
            for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ","), k++)
                if (k >= n || strcmp(ops[k], tok) != 0)
                    mismatch(line, "STANDARD_PS_OPS", tok, k < n ? ops[k] : "(none)");
            if (k != n) mismatch(line, "STANDARD_PS_OPS count", "", "");
            saw_standard = true;
            continue;
        }
        if (buf[0] == '#') continue;
        int n_cells = dg_test_tsv_split(buf, c, MAX_CELLS);
        if (strcmp(c[0], "setter") == 0) {
            setter_make(&s, c, n_cells, line, st);
            n_setters++;
        } else if (strcmp(c[0], "made") == 0) {
            assert_int_equal(n_cells, 4);
            assert_string_equal(c[1], s.id);
            if (strcmp(c[3], "neg_ps_tasks") == 0) {
                // distgraph refuses a negative task count, which TensorFlow takes.
                if (s.made) mismatch(line, "made (tagged neg_ps_tasks)", c[2], "1");
                else assert_status(st, DG_INVALID_ARGUMENT, "ps_tasks must be >= 0");
                s.skip_ops = true;
                n_diff++;
            } else {
                assert_string_equal(c[3], "-");
                s.skip_ops = false;
                if (s.made != (strcmp(c[2], "1") == 0)) mismatch(line, "made", c[2], s.made ? "1" : "0");
                if (!s.made) s.skip_ops = true;
            }
        } else {
            assert_string_equal(c[0], "op");
            assert_int_equal(n_cells, 7);
            assert_string_equal(c[1], s.id);
            if (s.skip_ops) continue;
            const char *cur = dg_test_tsv_unescape(c[3]);
            const char *want = dg_test_tsv_unescape(c[5]);
            row_load = strcmp(c[4], "-") == 0 ? 0 : strtod(c[4], NULL);
            char out[DG_DEVICE_NAME_MAX] = "";
            char got[DG_DEVICE_NAME_MAX + 8];
            const dg_node *node = node_of(&ns, c[2]);
            if (s.fn->choose(s.fn->ctx, node, cur, out, sizeof out, st)) {
                snprintf(got, sizeof got, "%s", out);
            } else {
                assert_int_equal(dg_status_code(st), DG_INVALID_ARGUMENT);
                assert_non_null(strstr(dg_status_message(st), "replica_device_setter"));
                snprintf(got, sizeof got, "ERROR");
            }
            char what[256];
            snprintf(what, sizeof what, "setter %s, %s on \"%s\"", s.id, c[2], cur);
            if (strncmp(c[6], "sparse_ps:", 10) == 0) {
                // distgraph maps strategy slots to the ps job's real task indices.
                const char *dg_want = dg_test_tsv_unescape(c[6] + 10);
                if (strcmp(got, dg_want) != 0 || strcmp(got, want) == 0) mismatch(line, what, dg_want, got);
                n_diff++;
            } else {
                assert_string_equal(c[6], "-");
                if (strcmp(got, want) != 0) mismatch(line, what, want, got);
            }
            n_ops++;
        }
    }
    setter_drop(&s);
    free(buf);
    fclose(f);
    dg_graph_free(&ns.g);
    dg_status_free(&st);
    print_message("device_setter.tsv: %d setters, %d ops, %d deliberate differences, %d mismatches\n",
                  n_setters, n_ops, n_diff, n_failures);
    assert_true(saw_standard);
    assert_true(n_ops > 600);
    assert_int_equal(n_failures, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_setter_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
