/* Conformance of cluster specs and TF_CONFIG with TensorFlow: every row of the tables under
 * tests/tf_conformance/ (cluster_*.jsonl, tf_config_*.jsonl) holds an input and TensorFlow's
 * answer, recorded by gen_cluster_tables.py from TensorFlow itself; distgraph must give the same
 * value, or fail with the status code the table maps TensorFlow's exception to. A row with a
 * "dg" entry is a deliberate difference (its tag names the section of docs/TF_COMPAT.md) and is
 * held to distgraph's documented answer instead. All mismatches are listed before the test
 * fails. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_impl.h"

static int n_mismatch;
static int n_checked;

#define MISMATCH(id, ...)                                   \
    do {                                                    \
        n_mismatch++;                                       \
        if (n_mismatch <= 200) {                            \
            fprintf(stderr, "MISMATCH %s: ", (id));         \
            fprintf(stderr, __VA_ARGS__);                   \
            fputc('\n', stderr);                            \
        }                                                   \
    } while (0)

// ---- tables ----

typedef struct table {
    cluster_json **rows;
    size_t n;
} table;

static void load_table(const char *name, table *t) {
    const char *src = getenv("DG_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/tf_conformance/%s", src ? src : ".", name);
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s (is DG_SOURCE_DIR set?)", path);
    t->rows = NULL;
    t->n = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    dg_status *st = dg_status_new();
    while ((len = getline(&line, &cap, f)) > 0) {
        if (len <= 1) continue;
        cluster_json *row = cluster_json_parse(line, (size_t)len, name, st);
        if (!row) fail_msg("%s: row %zu: %s", name, t->n + 1, dg_status_message(st));
        t->rows = realloc(t->rows, (t->n + 1) * sizeof *t->rows);
        t->rows[t->n++] = row;
    }
    free(line);
    fclose(f);
    dg_status_free(&st);
}

static void free_table(table *t) {
    for (size_t i = 0; i < t->n; i++) cluster_json_free(&t->rows[i]);
    free(t->rows);
}

static const char *row_id(const cluster_json *row) {
    const cluster_json *id = cluster_json_get(row, "id");
    return id && id->kind == CLUSTER_JSON_STRING ? id->str : "?";
}

static const char *str_or_null(const cluster_json *v) {
    return v && v->kind == CLUSTER_JSON_STRING ? v->str : NULL;
}

static const char *dash(const char *s) { return s ? s : "-"; }

// A deliberate difference: {"tag": ..., "expect": ...}; NULL for none.
static const cluster_json *dg_diff(const cluster_json *row, const char **tag) {
    const cluster_json *d = cluster_json_get(row, "dg");
    *tag = d ? str_or_null(cluster_json_get(d, "tag")) : NULL;
    return d ? cluster_json_get(d, "expect") : NULL;
}

static bool is_error(const cluster_json *exp) { return exp && exp->kind == CLUSTER_JSON_OBJECT && cluster_json_get(exp, "code"); }

// The call failed; does its code match the expected error?
static void check_error(const char *id, const char *what, const cluster_json *exp, bool ok, const dg_status *st) {
    n_checked++;
    const char *code = str_or_null(cluster_json_get(exp, "code"));
    const char *type = str_or_null(cluster_json_get(exp, "error"));
    if (ok) {
        MISMATCH(id, "%s: succeeded, TensorFlow raises %s (%s)", what, type ? type : "?", code ? code : "?");
        return;
    }
    if (code && strcmp(code, dg_code_name(dg_status_code(st))) != 0)
        MISMATCH(id, "%s: %s (%s), TensorFlow raises %s, want %s", what, dg_code_name(dg_status_code(st)),
                 dg_status_message(st), type ? type : "?", code);
    // Every failure names its fault.
    if (strlen(dg_status_message(st)) < 8) MISMATCH(id, "%s: message \"%s\" says too little", what, dg_status_message(st));
}

static bool check_ok(const char *id, const char *what, bool ok, const dg_status *st) {
    n_checked++;
    if (!ok) MISMATCH(id, "%s: fails (%s: %s), TensorFlow succeeds", what, dg_code_name(dg_status_code(st)),
                      dg_status_message(st));
    return ok;
}

static void check_str(const char *id, const char *what, const char *got, const cluster_json *want) {
    n_checked++;
    if (!want || want->kind == CLUSTER_JSON_NULL) {
        if (got) MISMATCH(id, "%s: \"%s\", TensorFlow: None", what, got);
        return;
    }
    if (!got) {
        MISMATCH(id, "%s: None, TensorFlow: \"%s\"", what, want->str);
        return;
    }
    if (strlen(got) != want->str_len || memcmp(got, want->str, want->str_len) != 0)
        MISMATCH(id, "%s: \"%s\", TensorFlow: \"%s\"", what, got, want->str);
}

static void check_int(const char *id, const char *what, int64_t got, const cluster_json *want) {
    n_checked++;
    if (!want || want->kind != CLUSTER_JSON_NUMBER || !want->is_int || want->integer != got)
        MISMATCH(id, "%s: %lld, TensorFlow: %s", what, (long long)got, want && want->str ? want->str : "?");
}

// {"jobs": {name: [[index, address], ...]}} against c.
static void check_cluster(const char *id, const char *what, const dg_cluster *c, const cluster_json *want) {
    n_checked++;
    const cluster_json *jobs = cluster_json_get(want, "jobs");
    if (!jobs || jobs->kind != CLUSTER_JSON_OBJECT) fail_msg("%s: bad expected cluster", id);
    if (dg_cluster_num_jobs(c) != (int)jobs->n) {
        char *js = dg_cluster_to_json(c);
        MISMATCH(id, "%s: %d jobs (%s), TensorFlow %zu", what, dg_cluster_num_jobs(c), js, jobs->n);
        free(js);
        return;
    }
    for (size_t j = 0; j < jobs->n; j++) {
        const char *name = jobs->members[j].key;
        const cluster_json *tasks = jobs->members[j].value;
        if (!dg_cluster_has_job(c, name)) {
            MISMATCH(id, "%s: no job \"%s\"", what, name);
            continue;
        }
        if (dg_cluster_num_tasks(c, name) != (int)tasks->n) {
            MISMATCH(id, "%s: job \"%s\" has %d tasks, TensorFlow %zu", what, name, dg_cluster_num_tasks(c, name),
                     tasks->n);
            continue;
        }
        for (size_t t = 0; t < tasks->n; t++) {
            int index = (int)tasks->items[t]->items[0]->integer;
            const char *addr = dg_cluster_task_address(c, name, index, NULL);
            const cluster_json *want_addr = tasks->items[t]->items[1];
            if (!addr || strlen(addr) != want_addr->str_len || memcmp(addr, want_addr->str, want_addr->str_len) != 0)
                MISMATCH(id, "%s: job \"%s\" task %d at \"%s\", TensorFlow \"%s\"", what, name, index,
                         addr ? addr : "(none)", want_addr->str);
        }
    }
}

static bool same_cluster(const dg_cluster *a, const dg_cluster *b) {
    char *ja = dg_cluster_to_json(a), *jb = dg_cluster_to_json(b);
    bool same = ja && jb && strcmp(ja, jb) == 0;
    free(ja);
    free(jb);
    return same;
}

// The forms a cluster round-trips through: JSON always, the spec string where it can say it.
static void check_round_trips(const char *id, const dg_cluster *c) {
    dg_status *st = dg_status_new();
    n_checked++;
    char *js = dg_cluster_to_json(c);
    dg_cluster *back = js ? dg_cluster_from_json(js, st) : NULL;
    if (!back || !same_cluster(c, back))
        MISMATCH(id, "JSON round trip of %s: %s", js ? js : "(null)", dg_status_message(st));
    dg_cluster_free(&back);
    char *spec = dg_cluster_to_spec_string(c, st);
    if (spec) {
        back = dg_cluster_from_spec_string(spec, st);
        if (!back || !same_cluster(c, back))
            MISMATCH(id, "spec string round trip of %s via \"%s\": %s", js, spec, dg_status_message(st));
        dg_cluster_free(&back);
    } else if (dg_status_code(st) != DG_INVALID_ARGUMENT) {
        MISMATCH(id, "to_spec_string: %s", dg_status_message(st));
    }
    dg_cluster *copy = dg_cluster_copy(c);
    if (!copy || !same_cluster(c, copy)) MISMATCH(id, "copy differs");
    dg_cluster_free(&copy);
    free(spec);
    free(js);
    dg_status_free(&st);
}

// ---- 1. cluster specs from JSON ----

static void test_cluster_specs(void **state) {
    (void)state;
    table t;
    load_table("cluster_specs.jsonl", &t);
    assert_true(t.n >= 100);
    dg_status *st = dg_status_new();
    for (size_t i = 0; i < t.n; i++) {
        const cluster_json *row = t.rows[i];
        const char *id = row_id(row), *tag;
        const cluster_json *json = cluster_json_get(row, "json");
        const cluster_json *exp = cluster_json_get(row, "expect");
        const cluster_json *dexp = dg_diff(row, &tag);
        if (tag && is_error(dexp)) exp = dexp;
        dg_cluster *c = json->str_len == strlen(json->str) ? dg_cluster_from_json(json->str, st) : NULL;
        if (json->str_len != strlen(json->str)) dg_status_set(st, DG_INVALID_ARGUMENT, "NUL in the JSON text");
        if (is_error(exp)) {
            check_error(id, "ClusterSpec", exp, c != NULL, st);
            dg_cluster_free(&c);
            continue;
        }
        if (!check_ok(id, "ClusterSpec", c != NULL, st)) continue;
        check_cluster(id, "ClusterSpec", c, cluster_json_get(exp, "cluster"));
        const cluster_json *nt = cluster_json_get(exp, "num_tasks");
        for (size_t k = 0; k < nt->n; k++) {
            const char *job = nt->members[k].key;
            int n = dg_cluster_job_num_tasks(c, job, st);
            if (is_error(nt->members[k].value))
                check_error(id, "num_tasks", nt->members[k].value, n >= 0, st);
            else if (check_ok(id, "num_tasks", n >= 0, st))
                check_int(id, "num_tasks", n, nt->members[k].value);
        }
        const cluster_json *spans = cluster_json_get(exp, "spans");
        for (size_t k = 0; k < spans->n; k++) {
            int64_t n = dg_cluster_job_task_span(c, spans->members[k].key, st);
            if (is_error(spans->members[k].value))
                check_error(id, "len(job_tasks)", spans->members[k].value, n >= 0, st);
            else if (check_ok(id, "len(job_tasks)", n >= 0, st))
                check_int(id, "len(job_tasks)", n, spans->members[k].value);
        }
        const cluster_json *lookups = cluster_json_get(exp, "lookups");
        for (size_t k = 0; k < lookups->n; k++) {
            const cluster_json *l = lookups->items[k];
            const char *job = l->items[0]->str;
            if (l->items[1]->integer < INT32_MIN || l->items[1]->integer > INT32_MAX) continue;   // no C int
            int index = (int)l->items[1]->integer;
            const char *addr = dg_cluster_task_address(c, job, index, st);
            char what[200];
            snprintf(what, sizeof what, "task_address(\"%s\", %d)", job, index);
            if (is_error(l->items[2]))
                check_error(id, what, l->items[2], addr != NULL, st);
            else if (check_ok(id, what, addr != NULL, st))
                check_str(id, what, addr, l->items[2]);
        }
        const cluster_json *as_json = cluster_json_get(exp, "as_json");
        char *js = dg_cluster_to_json(c);
        if (tag && strcmp(tag, "negative-index-as-dict") == 0) {
            n_checked++;   // distgraph prints every task; the round trip below holds it
        } else if (is_error(as_json)) {
            MISMATCH(id, "as_dict() raises in TensorFlow, yet the row is not tagged");
        } else {
            check_str(id, "as_dict() as JSON", js, as_json);
        }
        free(js);
        check_round_trips(id, c);
        dg_cluster_free(&c);
    }
    dg_status_free(&st);
    free_table(&t);
}

// ---- 2. spec strings ----

static void test_spec_strings(void **state) {
    (void)state;
    table t;
    load_table("cluster_spec_strings.jsonl", &t);
    assert_true(t.n >= 30);
    dg_status *st = dg_status_new();
    for (size_t i = 0; i < t.n; i++) {
        const cluster_json *row = t.rows[i];
        const char *id = row_id(row), *tag;
        const cluster_json *exp = cluster_json_get(row, "expect");
        const cluster_json *dexp = dg_diff(row, &tag);
        if (tag) exp = dexp;
        dg_cluster *c = dg_cluster_from_spec_string(cluster_json_get(row, "spec")->str, st);
        if (is_error(exp)) {
            check_error(id, "parse_cluster_spec", exp, c != NULL, st);
        } else if (check_ok(id, "parse_cluster_spec", c != NULL, st)) {
            check_cluster(id, "parse_cluster_spec", c, cluster_json_get(exp, "cluster"));
            check_round_trips(id, c);
        }
        dg_cluster_free(&c);
    }
    dg_status_free(&st);
    free_table(&t);
}

// ---- 3. server definitions ----

static void test_server_defs(void **state) {
    (void)state;
    table t;
    load_table("cluster_server_defs.jsonl", &t);
    assert_true(t.n >= 50);
    dg_status *st = dg_status_new();
    for (size_t i = 0; i < t.n; i++) {
        const cluster_json *row = t.rows[i];
        const char *id = row_id(row);
        const cluster_json *exp = cluster_json_get(row, "expect");
        dg_cluster *c = dg_cluster_from_json(cluster_json_get(row, "cluster")->str, st);
        assert_non_null(c);
        dg_server_def_options o = dg_server_def_options_default();
        o.job_name = str_or_null(cluster_json_get(row, "job_name"));
        o.protocol = str_or_null(cluster_json_get(row, "protocol"));
        const cluster_json *ti = cluster_json_get(row, "task_index");
        if (ti->kind == CLUSTER_JSON_NUMBER) {
            if (ti->integer < INT32_MIN || ti->integer > INT32_MAX) {
                // The C type cannot hold it; TensorFlow refuses it (protobuf's int32) as well.
                n_checked++;
                if (!is_error(exp)) MISMATCH(id, "TensorFlow takes task index %s", ti->str);
                dg_cluster_free(&c);
                continue;
            }
            o.has_task_index = true;
            o.task_index = (int)ti->integer;
        }
        dg_server_def *d = dg_server_def_new(c, &o, st);
        if (is_error(exp)) {
            check_error(id, "ServerDef", exp, d != NULL, st);
        } else if (check_ok(id, "ServerDef", d != NULL, st)) {
            check_str(id, "job_name", dg_server_def_job_name(d), cluster_json_get(exp, "job_name"));
            check_int(id, "task_index", dg_server_def_task_index(d), cluster_json_get(exp, "task_index"));
            check_str(id, "protocol", dg_server_def_protocol(d), cluster_json_get(exp, "protocol"));
            check_cluster(id, "cluster", dg_server_def_cluster(d), cluster_json_get(exp, "cluster"));
        }
        dg_server_def_free(&d);
        dg_cluster_free(&c);
    }
    dg_status_free(&st);
    free_table(&t);
}

// ---- 4. multi_worker_util ----

static void check_value_or_error(const char *id, const char *what, const cluster_json *exp, bool ok,
                                 const dg_status *st, const cluster_json **value) {
    *value = NULL;
    if (is_error(exp)) {
        check_error(id, what, exp, ok, st);
    } else if (check_ok(id, what, ok, st)) {
        *value = cluster_json_get(exp, "value");
    }
}

static void test_multi_worker(void **state) {
    (void)state;
    table t;
    load_table("cluster_multi_worker.jsonl", &t);
    assert_true(t.n >= 200);
    dg_status *st = dg_status_new();
    for (size_t i = 0; i < t.n; i++) {
        const cluster_json *row = t.rows[i];
        const char *id = row_id(row);
        const cluster_json *exp = cluster_json_get(row, "expect");
        dg_cluster *c = dg_cluster_from_json(cluster_json_get(row, "cluster")->str, st);
        assert_non_null(c);
        const char *type = str_or_null(cluster_json_get(row, "task_type"));
        int64_t tid = cluster_json_get(row, "task_id")->integer;
        const cluster_json *v;

        bool ok = dg_multi_worker_validate(c, type, tid, st);
        check_value_or_error(id, "validate", cluster_json_get(exp, "validate"), ok, st, &v);

        bool chief = false;
        ok = dg_multi_worker_is_chief(c, type, tid, &chief, st);
        check_value_or_error(id, "is_chief", cluster_json_get(exp, "is_chief"), ok, st, &v);
        if (v && (v->kind != CLUSTER_JSON_BOOL || v->boolean != chief))
            MISMATCH(id, "is_chief: %d, TensorFlow %s", chief, v->kind == CLUSTER_JSON_BOOL && v->boolean ? "True" : "False");

        int n = dg_multi_worker_count(c, type, st);
        check_value_or_error(id, "worker_count", cluster_json_get(exp, "worker_count"), n >= 0, st, &v);
        if (v) check_int(id, "worker_count", n, v);

        int64_t cid = 0;
        ok = dg_multi_worker_id_in_cluster(c, type, tid, &cid, st);
        check_value_or_error(id, "id_in_cluster", cluster_json_get(exp, "id_in_cluster"), ok, st, &v);
        if (v) check_int(id, "id_in_cluster", cid, v);

        const char *leader = dg_multi_worker_collective_leader(c, type, tid, st);
        check_value_or_error(id, "collective_leader", cluster_json_get(exp, "collective_leader"), leader != NULL, st, &v);
        if (v) check_str(id, "collective_leader", leader, v);

        leader = dg_multi_worker_coordination_leader(c, st);
        check_value_or_error(id, "coordination_leader", cluster_json_get(exp, "coordination_leader"), leader != NULL,
                             st, &v);
        if (v) check_str(id, "coordination_leader", leader, v);

        check_int(id, "task_count", dg_cluster_num_tasks(c, type),
                  cluster_json_get(cluster_json_get(exp, "task_count"), "value"));
        dg_cluster_free(&c);
    }
    dg_status_free(&st);
    free_table(&t);
}

// ---- 5. TFConfigClusterResolver ----

// The row's TF_CONFIG: text, hex bytes, or NULL for unset. *has_nul when it cannot be a C
// string. Returns: new (free()) or NULL.
static char *row_tf_config(const cluster_json *row) {
    const cluster_json *hex = cluster_json_get(row, "tf_config_hex");
    if (hex) {
        size_t n = hex->str_len / 2;
        char *s = malloc(n + 1);
        for (size_t k = 0; k < n; k++) {
            unsigned b;
            sscanf(hex->str + 2 * k, "%2x", &b);
            s[k] = (char)b;
        }
        s[n] = '\0';
        return s;
    }
    const cluster_json *text = cluster_json_get(row, "tf_config");
    return text->kind == CLUSTER_JSON_STRING ? strdup(text->str) : NULL;
}

static void check_resolver_row(const cluster_json *row, dg_status *st) {
    const char *id = row_id(row), *tag;
    const cluster_json *exp = cluster_json_get(row, "expect");
    const cluster_json *dexp = dg_diff(row, &tag);
    char *text = row_tf_config(row);
    const cluster_json *ov = cluster_json_get(row, "override");
    dg_tf_resolver_options o = dg_tf_resolver_options_default();
    o.task_type = str_or_null(cluster_json_get(ov, "task_type"));
    o.rpc_layer = str_or_null(cluster_json_get(ov, "rpc_layer"));
    o.environment = str_or_null(cluster_json_get(ov, "environment"));
    if (cluster_json_get(ov, "task_id")) {
        o.has_task_id = true;
        o.task_id = cluster_json_get(ov, "task_id")->integer;
    }
    dg_tf_resolver *r = dg_tf_resolver_new(text, &o, st);
    free(text);
    if (tag && strcmp(tag, "duplicate-keys") == 0) {
        // A key given twice is refused with the text; a sparse index given twice (a cluster's
        // "1" and "01") by cluster_spec(), which is where it is read.
        dg_cluster *c = r ? dg_tf_resolver_cluster_spec(r, st) : NULL;
        check_error(id, r ? "cluster_spec()" : "TFConfigClusterResolver", dexp, c != NULL, st);
        dg_cluster_free(&c);
        dg_tf_resolver_free(&r);
        return;
    }
    if (!r) {
        // Not JSON: every property TensorFlow reads from TF_CONFIG raises.
        check_error(id, "TFConfigClusterResolver", cluster_json_get(exp, "cluster"), false, st);
        check_error(id, "task_type", cluster_json_get(exp, "task_type"), false, st);
        return;
    }
    const cluster_json *v;
    dg_cluster *c = dg_tf_resolver_cluster_spec(r, st);
    if (is_error(cluster_json_get(exp, "cluster")))
        check_error(id, "cluster_spec()", cluster_json_get(exp, "cluster"), c != NULL, st);
    else if (check_ok(id, "cluster_spec()", c != NULL, st))
        check_cluster(id, "cluster_spec()", c, cluster_json_get(exp, "cluster"));
    dg_cluster_free(&c);

    const char *type = NULL;
    bool ok = dg_tf_resolver_task_type(r, &type, st);
    check_value_or_error(id, "task_type", cluster_json_get(exp, "task_type"), ok, st, &v);
    if (ok && !is_error(cluster_json_get(exp, "task_type"))) check_str(id, "task_type", type, v);

    bool has_id = false;
    int64_t tid = 0;
    ok = dg_tf_resolver_task_id(r, &has_id, &tid, st);
    if (tag && strcmp(tag, "int64-index") == 0) {
        n_checked++;
        if (ok || dg_status_code(st) != DG_INVALID_ARGUMENT) MISMATCH(id, "task_id: want distgraph's int64 limit");
    } else {
        check_value_or_error(id, "task_id", cluster_json_get(exp, "task_id"), ok, st, &v);
        if (v && v->kind == CLUSTER_JSON_NULL) {
            if (has_id) MISMATCH(id, "task_id: %lld, TensorFlow None", (long long)tid);
        } else if (v) {
            if (!has_id) MISMATCH(id, "task_id: None, TensorFlow %s", v->str);
            else check_int(id, "task_id", tid, v);
        }
    }

    const char *rpc = NULL;
    ok = dg_tf_resolver_rpc_layer(r, &rpc, st);
    check_value_or_error(id, "rpc_layer", cluster_json_get(exp, "rpc_layer"), ok, st, &v);
    if (ok && !is_error(cluster_json_get(exp, "rpc_layer"))) check_str(id, "rpc_layer", rpc, v);
    check_str(id, "environment", dg_tf_resolver_environment(r),
              cluster_json_get(cluster_json_get(exp, "environment"), "value"));

    const cluster_json *masters = cluster_json_get(exp, "master");
    for (size_t k = 0; k < masters->n; k++) {
        const cluster_json *args = cluster_json_get(masters->items[k], "args");
        const cluster_json *mexp = cluster_json_get(masters->items[k], "expect");
        const cluster_json *a_tid = cluster_json_get(args, "task_id");
        char what[160];
        snprintf(what, sizeof what, "master(%s, %s, %s)", dash(str_or_null(cluster_json_get(args, "task_type"))),
                 a_tid ? a_tid->str : "-", dash(str_or_null(cluster_json_get(args, "rpc_layer"))));
        char *m = dg_tf_resolver_master(r, str_or_null(cluster_json_get(args, "task_type")), a_tid != NULL,
                                        a_tid ? a_tid->integer : 0, str_or_null(cluster_json_get(args, "rpc_layer")),
                                        st);
        check_value_or_error(id, what, mexp, m != NULL, st, &v);
        if (m && !is_error(mexp)) check_str(id, what, m, v);
        free(m);
    }

    const cluster_json *accels = cluster_json_get(exp, "num_accelerators");
    for (size_t k = 0; k < accels->n; k++) {
        const cluster_json *args = cluster_json_get(accels->items[k], "args");
        const cluster_json *aexp = cluster_json_get(accels->items[k], "expect");
        const cluster_json *devs =
            cluster_json_get(row, "device_sets")->items[cluster_json_get(args, "devices")->integer];
        const cluster_json *a_tid = cluster_json_get(args, "task_id");
        const char *names[32];
        for (size_t d = 0; d < devs->n && d < 32; d++) names[d] = devs->items[d]->str;
        dg_accelerator_count counts[16];
        char what[160];
        snprintf(what, sizeof what, "num_accelerators(%s, %s) of %zu devices",
                 dash(str_or_null(cluster_json_get(args, "task_type"))), a_tid ? a_tid->str : "-", devs->n);
        int n = dg_tf_resolver_num_accelerators(r, str_or_null(cluster_json_get(args, "task_type")), a_tid != NULL,
                                                a_tid ? a_tid->integer : 0, names, (int)devs->n, counts, 16, st);
        if (tag && strcmp(tag, "int64-index") == 0 && !a_tid) {
            n_checked++;   // distgraph's int64 limit: the task id the devices are filtered by is refused
            if (n >= 0 && !is_error(aexp)) MISMATCH(id, "%s: want distgraph's int64 limit", what);
            continue;
        }
        check_value_or_error(id, what, aexp, n >= 0, st, &v);
        if (!v) continue;
        n_checked++;
        if ((size_t)n != v->n) {
            MISMATCH(id, "%s: %d device types, TensorFlow %zu", what, n, v->n);
            continue;
        }
        for (int j = 0; j < n; j++)
            if (strcmp(counts[j].device_type, v->members[j].key) != 0 || counts[j].count != v->members[j].value->integer)
                MISMATCH(id, "%s: %s x%d, TensorFlow %s x%lld", what, counts[j].device_type, counts[j].count,
                         v->members[j].key, (long long)v->members[j].value->integer);
    }
    dg_tf_resolver_free(&r);
}

static void test_resolver(void **state) {
    (void)state;
    table t;
    load_table("tf_config_resolver.jsonl", &t);
    assert_true(t.n >= 100);
    dg_status *st = dg_status_new();
    for (size_t i = 0; i < t.n; i++) check_resolver_row(t.rows[i], st);
    dg_status_free(&st);
    free_table(&t);
}

// ---- 6. RunConfig ----

static void test_run_config(void **state) {
    (void)state;
    table t;
    load_table("tf_config_run_config.jsonl", &t);
    assert_true(t.n >= 60);
    dg_status *st = dg_status_new();
    for (size_t i = 0; i < t.n; i++) {
        const cluster_json *row = t.rows[i];
        const char *id = row_id(row), *tag;
        const cluster_json *exp = cluster_json_get(row, "expect");
        const cluster_json *dexp = dg_diff(row, &tag);
        if (tag) exp = dexp;
        dg_run_config rc;
        bool ok = dg_run_config_parse(str_or_null(cluster_json_get(row, "tf_config")), &rc, st);
        if (is_error(exp)) {
            check_error(id, "RunConfig", exp, ok, st);
            if (!ok && rc.cluster) MISMATCH(id, "a failed parse leaves a cluster");
        } else if (check_ok(id, "RunConfig", ok, st)) {
            check_cluster(id, "cluster_spec", rc.cluster, cluster_json_get(exp, "cluster"));
            check_str(id, "task_type", rc.task_type, cluster_json_get(exp, "task_type"));
            check_int(id, "task_id", rc.task_id, cluster_json_get(exp, "task_id"));
            n_checked++;
            if (rc.is_chief != cluster_json_get(exp, "is_chief")->boolean) MISMATCH(id, "is_chief: %d", rc.is_chief);
            check_str(id, "master", rc.master, cluster_json_get(exp, "master"));
            check_str(id, "evaluation_master", rc.evaluation_master, cluster_json_get(exp, "evaluation_master"));
            check_int(id, "num_ps_replicas", rc.num_ps_replicas, cluster_json_get(exp, "num_ps_replicas"));
            check_int(id, "num_worker_replicas", rc.num_worker_replicas, cluster_json_get(exp, "num_worker_replicas"));
            const cluster_json *gid = cluster_json_get(exp, "global_id_in_cluster");
            if (gid->kind == CLUSTER_JSON_NULL) {
                n_checked++;
                if (rc.has_global_id) MISMATCH(id, "global_id_in_cluster: %lld, TensorFlow None", (long long)rc.global_id_in_cluster);
            } else if (!rc.has_global_id) {
                MISMATCH(id, "global_id_in_cluster: None, TensorFlow %s", gid->str);
            } else {
                check_int(id, "global_id_in_cluster", rc.global_id_in_cluster, gid);
            }
            check_str(id, "model_dir", rc.model_dir, cluster_json_get(exp, "model_dir"));
        }
        dg_run_config_clear(&rc);
    }
    dg_status_free(&st);
    free_table(&t);
}

static int report(void **state) {
    (void)state;
    fprintf(stderr, "conformance: %d checks, %d mismatches\n", n_checked, n_mismatch);
    return 0;
}

static void test_no_mismatch(void **state) {
    (void)state;
    if (n_mismatch) fail_msg("%d of %d checks disagree with TensorFlow (listed above)", n_mismatch, n_checked);
    assert_true(n_checked > 3000);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cluster_specs), cmocka_unit_test(test_spec_strings),
        cmocka_unit_test(test_server_defs),   cmocka_unit_test(test_multi_worker),
        cmocka_unit_test(test_resolver),      cmocka_unit_test(test_run_config),
        cmocka_unit_test(test_no_mismatch),
    };
    return cmocka_run_group_tests(tests, NULL, report);
}
