/* Slurm cluster resolution (cluster/slurm.c) as tables: node-list expansion, tasks per node and
 * the assignment of slots to jobs, after TensorFlow's SlurmClusterResolver, and bad input of
 * each kind answered with a status naming the fault. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

typedef struct list_case {
    const char *nodelist;
    const char *expect;   // hosts joined by ' ', or NULL for an error
    const char *needle;   // for an error: part of the message
} list_case;

static void test_expand_nodelist(void **state) {
    (void)state;
    const list_case cases[] = {
        {"node1", "node1", NULL},
        {"node[01-04,07]", "node01 node02 node03 node04 node07", NULL},
        {"n[1-2],m5,o[3-4,6,7-9]", "n1 n2 m5 o3 o4 o6 o7 o8 o9", NULL},   // TensorFlow's example
        {"tux[9-11]", "tux9 tux10 tux11", NULL},
        {"tux[009-011]", "tux009 tux010 tux011", NULL},
        {"rack[1-2]-node[1-2]", "rack1-node1 rack1-node2 rack2-node1 rack2-node2", NULL},
        {"gpu[3]", "gpu3", NULL},
        {"a.example.org,b.example.org", "a.example.org b.example.org", NULL},
        {"", NULL, "is empty"},
        {"node[", NULL, "'[' without ']'"},
        {"node[]", NULL, "empty range"},
        {"node[3-1]", NULL, "runs backwards"},
        {"node[a-b]", NULL, "numbers of at most 9 digits"},
        {"node[1-]", NULL, "a number after '-'"},
        {"node[1,]", NULL, "ends with ','"},
        {"a,,b", NULL, "empty host name"},
        {"node[0-99999999]", NULL, "more than 65536 hosts"},
        {"node]", NULL, "unexpected ']'"},
        {"node[1-2", NULL, "'[' without ']'"},
        {"node[1x2]", NULL, "unexpected 'x'"},
        {"no de", NULL, "unexpected ' '"},
    };
    dg_status *st = dg_status_new();
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const list_case *c = &cases[i];
        char **hosts = NULL;
        int n = dg_slurm_expand_nodelist(c->nodelist, &hosts, st);
        if (c->expect) {
            if (n < 0) fail_msg("\"%s\": %s", c->nodelist, dg_status_message(st));
            char joined[512] = "";
            for (int k = 0; k < n; k++) {
                if (k) strcat(joined, " ");
                strcat(joined, hosts[k]);
            }
            if (strcmp(joined, c->expect) != 0) fail_msg("\"%s\": got \"%s\", want \"%s\"", c->nodelist, joined, c->expect);
            assert_ok(st);
            dg_slurm_hosts_free(hosts, n);
        } else {
            if (n >= 0) fail_msg("\"%s\": expanded to %d hosts, expected an error", c->nodelist, n);
            assert_null(hosts);
            assert_int_equal(dg_status_code(st), DG_INVALID_ARGUMENT);
            if (!strstr(dg_status_message(st), c->needle) || !strstr(dg_status_message(st), "Slurm node list"))
                fail_msg("\"%s\": message \"%s\" lacks \"%s\"", c->nodelist, dg_status_message(st), c->needle);
        }
    }
    dg_status_free(&st);
}

typedef struct resolve_case {
    const char *nodelist, *per_node, *jobs;
    int tasks_per_node, port_base, rank;
    const char *cluster_json;   // expected dg_cluster_to_json, or NULL for an error
    const char *task;           // expected "type:index[*]" (* = chief)
    const char *needle;         // for an error
} resolve_case;

static void test_resolve(void **state) {
    (void)state;
    const resolve_case cases[] = {
        // Two nodes, two slots each; jobs in name order take slots in node order.
        {"node[1-2]", "2(x2)", "ps:1,worker:3", 0, 0, 0,
         "{\"ps\": [\"node1:8888\"], \"worker\": [\"node1:8889\", \"node2:8888\", \"node2:8889\"]}", "ps:0", NULL},
        {"node[1-2]", "2(x2)", "worker:3,ps:1", 0, 0, 2,
         "{\"ps\": [\"node1:8888\"], \"worker\": [\"node1:8889\", \"node2:8888\", \"node2:8889\"]}", "worker:1", NULL},
        {"node[1-2]", "2(x2)", "ps:1,worker:3", 0, 0, 1,
         "{\"ps\": [\"node1:8888\"], \"worker\": [\"node1:8889\", \"node2:8888\", \"node2:8889\"]}", "worker:0*", NULL},
        // Uneven nodes, a port base, fewer tasks than slots.
        {"a,b[7-8]", "3,1(x2)", "ps:2,worker:2", 0, 2222, 3,
         "{\"ps\": [\"a:2222\", \"a:2223\"], \"worker\": [\"a:2224\", \"b7:2222\"]}", "worker:1", NULL},
        // The tasks per node given as an option win over the allocation's.
        {"n[1-3]", "4(x3)", "ps:1,worker:2", 1, 0, 2,
         "{\"ps\": [\"n1:8888\"], \"worker\": [\"n2:8888\", \"n3:8888\"]}", "worker:1", NULL},
        {"n[1-3]", NULL, "ps:1,worker:2", 1, 0, 0,
         "{\"ps\": [\"n1:8888\"], \"worker\": [\"n2:8888\", \"n3:8888\"]}", "ps:0", NULL},
        // A chief job: the chief is the chief, worker 0 is not.
        {"c1,w[1-2]", "1(x3)", "chief:1,worker:2", 0, 0, 0,
         "{\"chief\": [\"c1:8888\"], \"worker\": [\"w1:8888\", \"w2:8888\"]}", "chief:0*", NULL},
        {"c1,w[1-2]", "1(x3)", "chief:1,worker:2", 0, 0, 1,
         "{\"chief\": [\"c1:8888\"], \"worker\": [\"w1:8888\", \"w2:8888\"]}", "worker:0", NULL},
        // Bad input.
        {"node[1-2]", "1(x2)", "ps:1,worker:2", 0, 0, 0, NULL, NULL, "ask for 3 tasks, the allocation has 2 slots"},
        {"node[1-2]", "2(x2)", "ps:1,worker:2", 0, 0, 3, NULL, NULL, "rank (SLURM_PROCID) 3 has no task"},
        {"node[1-2]", "2(x2)", "ps:1,worker:2", 0, 0, -1, NULL, NULL, "rank (SLURM_PROCID) -1 has no task"},
        {"node[1-2]", "2(x3)", "ps:1", 0, 0, 0, NULL, NULL, "describes 3 nodes, the node list \"node[1-2]\" has 2"},
        {"node[1-2]", "2(x", "ps:1", 0, 0, 0, NULL, NULL, "a repeat is written \"(xN)\""},
        {"node[1-2]", "(x2)", "ps:1", 0, 0, 0, NULL, NULL, "expected a count of 1 or more"},
        {"node[1-2]", "0,1", "ps:1", 0, 0, 0, NULL, NULL, "expected a count of 1 or more"},
        {"node[1-2]", "1,", "ps:1", 0, 0, 0, NULL, NULL, "ends with ','"},
        {"node[1-2]", "1x2", "ps:1", 0, 0, 0, NULL, NULL, "unexpected 'x'"},
        {"node[1-2]", NULL, "ps:1", 0, 0, 0, NULL, NULL, "tasks per node unknown"},
        {"node[1-2", "1(x2)", "ps:1", 0, 0, 0, NULL, NULL, "'[' without ']'"},
        {"n1", "2", "ps", 0, 0, 0, NULL, NULL, "\"ps\" is not JOB:COUNT"},
        {"n1", "2", "ps:0", 0, 0, 0, NULL, NULL, "the count of \"ps\" must be 1 to"},
        {"n1", "2", "ps:x", 0, 0, 0, NULL, NULL, "the count of \"ps\" must be 1 to"},
        {"n1", "2", "ps:1,ps:1", 0, 0, 0, NULL, NULL, "job \"ps\" is listed twice"},
        {"n1", "2", ":1", 0, 0, 0, NULL, NULL, "is not JOB:COUNT"},
        {"n1", "2", "ps:1,", 0, 0, 0, NULL, NULL, "ends with ','"},
        {"n1", "2", "", 0, 0, 0, NULL, NULL, "none given"},
        {"n1", "2", "ps:1", 0, 65535, 0, NULL, NULL, "run past port 65535"},
        {"n1", "2", "ps:1", 0, 70000, 0, NULL, NULL, "port base 70000 is not a port"},
    };
    dg_status *st = dg_status_new();
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const resolve_case *c = &cases[i];
        dg_slurm_options o = {.jobs = c->jobs, .port_base = c->port_base, .tasks_per_node = c->tasks_per_node};
        dg_tf_config cfg;
        bool ok = dg_slurm_resolve(&o, c->nodelist, c->per_node, c->rank, &cfg, st);
        if (c->cluster_json) {
            if (!ok) fail_msg("case %zu (%s / %s / %s): %s", i, c->nodelist, c->per_node ? c->per_node : "-", c->jobs,
                              dg_status_message(st));
            char *json = dg_cluster_to_json(cfg.cluster);
            if (strcmp(json, c->cluster_json) != 0) fail_msg("case %zu: cluster %s, want %s", i, json, c->cluster_json);
            free(json);
            char task[80];
            snprintf(task, sizeof task, "%s:%d%s", cfg.task_type, cfg.task_index, cfg.is_chief ? "*" : "");
            if (strcmp(task, c->task) != 0) fail_msg("case %zu: task %s, want %s", i, task, c->task);
            dg_tf_config_clear(&cfg);
        } else {
            if (ok) fail_msg("case %zu (%s / %s / %s): resolved, expected an error", i, c->nodelist,
                             c->per_node ? c->per_node : "-", c->jobs);
            assert_null(cfg.cluster);
            assert_int_equal(cfg.task_index, -1);
            assert_int_equal(dg_status_code(st), DG_INVALID_ARGUMENT);
            if (!strstr(dg_status_message(st), c->needle))
                fail_msg("case %zu: message \"%s\" lacks \"%s\"", i, dg_status_message(st), c->needle);
        }
    }
    dg_status_free(&st);
}

static void test_from_env(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_slurm_options o = {.jobs = "ps:1,worker:2"};
    dg_tf_config cfg;
    unsetenv("SLURM_STEP_NODELIST");
    unsetenv("SLURM_JOB_NODELIST");
    unsetenv("SLURM_PROCID");
    unsetenv("SLURM_STEP_TASKS_PER_NODE");
    assert_false(dg_slurm_from_env(&o, &cfg, st));
    assert_status(st, DG_NOT_FOUND, "not inside a Slurm job step");
    setenv("SLURM_JOB_NODELIST", "gpu[07-08]", 1);
    setenv("SLURM_TASKS_PER_NODE", "2,1", 1);
    setenv("SLURM_PROCID", "2", 1);
    assert_true(dg_slurm_from_env(&o, &cfg, st));
    assert_ok(st);
    assert_string_equal(cfg.task_type, "worker");
    assert_int_equal(cfg.task_index, 1);
    assert_string_equal(dg_cluster_task_address(cfg.cluster, "worker", 1, st), "gpu08:8888");
    dg_tf_config_clear(&cfg);
    // A step's own variables come first (srun inside a larger allocation).
    setenv("SLURM_STEP_NODELIST", "gpu08", 1);
    setenv("SLURM_STEP_TASKS_PER_NODE", "3", 1);
    assert_true(dg_slurm_from_env(&o, &cfg, st));
    assert_string_equal(dg_cluster_task_address(cfg.cluster, "ps", 0, st), "gpu08:8888");
    assert_string_equal(dg_cluster_task_address(cfg.cluster, "worker", 1, st), "gpu08:8890");
    dg_tf_config_clear(&cfg);
    setenv("SLURM_PROCID", "x", 1);
    assert_false(dg_slurm_from_env(&o, &cfg, st));
    assert_status(st, DG_INVALID_ARGUMENT, "SLURM_PROCID \"x\" is not a rank");
    unsetenv("SLURM_STEP_NODELIST");
    unsetenv("SLURM_STEP_TASKS_PER_NODE");
    unsetenv("SLURM_JOB_NODELIST");
    unsetenv("SLURM_TASKS_PER_NODE");
    unsetenv("SLURM_PROCID");
    dg_status_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expand_nodelist),
        cmocka_unit_test(test_resolve),
        cmocka_unit_test(test_from_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
