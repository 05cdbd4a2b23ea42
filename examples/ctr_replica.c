/* ctr_replica: a click-through-rate model with an embedding table sharded over the ps tasks,
 * trained asynchronously by between-graph replication (what parameter servers are for).
 *
 * Data come from a known model, so the best reachable loss and AUC are known: each example
 * has --fields categorical features, field f taking value v in [0, --values_per_field) (small
 * values more often), with a true weight theta(f, v) ~ N(0, 0.6^2); the click probability is
 * sigmoid(-1.2 + sum_f theta(f, v_f)). Each (field, value) is hashed to a row of one table of
 * --table_rows rows x --embedding_dim (by default 10^6 x 16, 64 MB), split into --shards parts
 * (default: one per ps task) by the fixed-size partitioner; the replica device setter puts the
 * parts on the ps tasks in turn. The model: the fields' embeddings (a sharded lookup, "mod" or
 * "div"), concatenated, a dense layer of 32 ReLU units, one logit; sigmoid cross-entropy;
 * Adagrad, whose update of the table is sparse: each step computes, sends and updates only the
 * rows its batch looks up. Worker i draws its own example stream (seed + i); worker 0 is the
 * chief and, after training, scores a fixed test set and prints the loss and AUC beside the
 * generating model's.
 *   build/bin/dg-launch --ps 2 --workers 2 -- build/bin/ctr_replica
 * --report_bytes_step N: at its Nth step each worker records the step's transfers (a step
 * trace) and prints the bytes sent each way beside the rows the batch touched, as a JSON line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "distgraph/distgraph.h"
#include "distgraph/partitioned.h"
#include "flags.h"

static const char *prog = "ctr_replica";

static int fail(dg_status *st, const char *what) {
    fprintf(stderr, "%s: %s: %s: %s\n", prog, what, dg_code_name(dg_status_code(st)), dg_status_message(st));
    return 1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// ---- the generating model ----

static uint64_t mix(uint64_t x) {   // splitmix64's finaliser
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static double unit(uint64_t h) { return ((double)(h >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

typedef struct ctr_data {
    int64_t fields, values, rows;
    uint64_t seed;   // of the generating model, shared by every task
} ctr_data;

// theta(f, v): a fixed N(0, 0.6^2) draw (Box-Muller on two hashes).
static double theta(const ctr_data *d, int64_t f, int64_t v) {
    uint64_t h = mix(d->seed ^ mix((uint64_t)f * 0x100000001b3ull ^ (uint64_t)v));
    return 0.6 * sqrt(-2 * log(unit(h))) * cos(6.283185307179586 * unit(mix(h)));
}

static int64_t row_of(const ctr_data *d, int64_t f, int64_t v) {
    return (int64_t)(mix(mix(d->seed + 1) ^ ((uint64_t)f << 40) ^ (uint64_t)v) % (uint64_t)d->rows);
}

// One example from the stream state *s: its rows (fields of them), label and true probability.
static void draw(const ctr_data *d, uint64_t *s, int64_t *rows, float *label, double *p_true) {
    double logit = -1.2;
    for (int64_t f = 0; f < d->fields; f++) {
        double u = unit(mix((*s)++));
        int64_t v = (int64_t)(u * u * (double)d->values);   // small values more often
        if (v >= d->values) v = d->values - 1;
        rows[f] = row_of(d, f, v);
        logit += theta(d, f, v);
    }
    *p_true = 1 / (1 + exp(-logit));
    *label = unit(mix((*s)++)) < *p_true ? 1.0f : 0.0f;
}

// ---- evaluation ----

typedef struct scored {
    double score;
    float label;
} scored;

static int by_score(const void *a, const void *b) {
    double x = ((const scored *)a)->score, y = ((const scored *)b)->score;
    return (x > y) - (x < y);
}

// The area under the ROC curve: the chance a positive outscores a negative (ties count half),
// from the ranks of the positives.
static double auc(scored *e, int64_t n) {
    qsort(e, (size_t)n, sizeof *e, by_score);
    double pos = 0, rank_sum = 0;
    for (int64_t i = 0; i < n;) {
        int64_t j = i;
        while (j < n && e[j].score == e[i].score) j++;
        double avg_rank = (double)(i + j + 1) / 2;   // ranks i+1 .. j
        for (int64_t k = i; k < j; k++)
            if (e[k].label > 0.5f) {
                pos++;
                rank_sum += avg_rank;
            }
        i = j;
    }
    double neg = (double)n - pos;
    return pos > 0 && neg > 0 ? (rank_sum - pos * (pos + 1) / 2) / (pos * neg) : NAN;
}

static double log_loss(double p, float label) {
    const double eps = 1e-12;
    p = p < eps ? eps : p > 1 - eps ? 1 - eps : p;
    return label > 0.5f ? -log(p) : -log(1 - p);
}

// ---- the model ----

typedef struct ctr_model {
    dg_output ids, labels, logits, loss, global_step;
    dg_node *train, *init;
    dg_partitioned_variable table;
} ctr_model;

static bool build(dg_graph *g, const ctr_data *d, int64_t dim, int64_t shards, dg_partition_strategy strategy,
                  double lr, int64_t seed, ctr_model *m, dg_status *st) {
    m->ids = dg_placeholder(g, "ids", DG_INT64, dg_shape2(-1, d->fields));
    m->labels = dg_placeholder(g, "labels", DG_FLOAT32, dg_shape1(-1));
    m->table = dg_partitioned_variable_new(g, "embedding", DG_FLOAT32, dg_shape2(d->rows, dim),
                                           dg_init_truncated_normal(0, 0.05, seed), dg_fixed_size_partitioner(shards));
    if (m->table.n < 1) return dg_graph_check(g, st);
    dg_output emb = dg_embedding_lookup_sharded(g, "lookup", m->table.parts, m->table.n, m->ids, strategy);
    int64_t flat[2] = {-1, d->fields * dim}, vec[1] = {-1};
    dg_output x = dg_reshape(g, NULL, emb, flat, 2);
    dg_output h = dg_dense(g, "hidden", x, 32, DG_ACT_RELU, dg_init_glorot_uniform(seed + 1));
    m->logits = dg_reshape(g, "logit", dg_dense(g, "out", h, 1, DG_ACT_NONE, dg_init_glorot_uniform(seed + 2)), vec, 1);
    m->loss = dg_mean(g, "loss", dg_sigmoid_cross_entropy_with_logits(g, NULL, m->labels, m->logits), NULL, 0, false);
    m->global_step = dg_global_step(g);
    dg_optimizer opt = dg_adagrad(g, lr, 0.1);
    m->train = dg_optimizer_minimize(&opt, m->loss, m->global_step);
    m->init = dg_global_variables_initializer(g);
    return dg_graph_check(g, st);
}

// Test loss and AUC of the model and of the generating model on n examples of seed test_seed.
// dump (may be NULL): one line per example, "label model_probability true_probability".
static bool evaluate(dg_session *s, const ctr_model *m, const ctr_data *d, int64_t n, uint64_t test_seed, FILE *dump,
                     double *loss, double *model_auc, double *true_loss, double *true_auc, dg_status *st) {
    const int64_t chunk = 1000;
    scored *mine = malloc((size_t)n * sizeof *mine), *best = malloc((size_t)n * sizeof *best);
    int64_t *ids = malloc((size_t)(chunk * d->fields) * sizeof *ids);
    bool ok = mine && best && ids;
    uint64_t stream = mix(test_seed);
    *loss = *true_loss = 0;
    for (int64_t off = 0; ok && off < n; off += chunk) {
        int64_t b = n - off < chunk ? n - off : chunk;
        for (int64_t i = 0; i < b; i++) {
            double p;
            draw(d, &stream, ids + i * d->fields, &mine[off + i].label, &p);
            best[off + i] = (scored){p, mine[off + i].label};
            *true_loss += log_loss(p, mine[off + i].label);
        }
        dg_tensor *it = dg_tensor_wrap(DG_INT64, dg_shape2(b, d->fields), ids, (size_t)(b * d->fields) * sizeof *ids,
                                       NULL, NULL, st);
        dg_tensor *out = NULL;
        ok = it && dg_session_run(s, &m->ids, &it, 1, &m->logits, &out, 1, NULL, 0, st);
        for (int64_t i = 0; ok && i < b; i++) {
            double p = 1 / (1 + exp(-(double)dg_tensor_f32(out)[i]));
            mine[off + i].score = p;
            *loss += log_loss(p, mine[off + i].label);
            if (dump) fprintf(dump, "%.0f %.9g %.9g\n", mine[off + i].label, p, best[off + i].score);
        }
        dg_tensor_unref(out);
        dg_tensor_unref(it);
    }
    if (ok) {
        *loss /= (double)n;
        *true_loss /= (double)n;
        *model_auc = auc(mine, n);
        *true_auc = auc(best, n);
    }
    free(mine);
    free(best);
    free(ids);
    return ok;
}

// Bytes each way in one traced step, by whether the receiver is a ps task.
static void transfer_bytes(const dg_step_trace *t, uint64_t *to_ps, uint64_t *from_ps) {
    *to_ps = *from_ps = 0;
    for (int i = 0; i < dg_step_trace_num_events(t); i++) {
        const dg_trace_event *e = dg_step_trace_event(t, i);
        if (e->kind != DG_TRACE_TRANSFER) continue;
        if (strstr(e->task, "/job:ps/"))
            *to_ps += e->bytes;
        else if (strstr(e->peer, "/job:ps/"))
            *from_ps += e->bytes;
    }
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const char *job_name = "", *ps_hosts = "", *worker_hosts = "", *strategy_s = "div", *checkpoint_path = "";
    const char *predictions = "";
    int64_t task_index = -1, train_steps = 15000, batch_size = 256, table_rows = 1000000, dim = 16, fields = 8;
    int64_t values = 1000, shards = 0, test_examples = 20000, seed = 1, data_seed = 7, log_every = 500;
    int64_t report_bytes_step = 0, save_checkpoint_steps = 0;
    double lr = 0.1;
    bool quiet = false;
    flag_def defs[] = {
        {"job_name", FLAG_STRING, &job_name, "ps or worker"},
        {"task_index", FLAG_INT, &task_index, "index of this task in its job"},
        {"ps_hosts", FLAG_STRING, &ps_hosts, "comma list of host:port"},
        {"worker_hosts", FLAG_STRING, &worker_hosts, "comma list of host:port"},
        {"train_steps", FLAG_INT, &train_steps, "global steps to train (default 15000)"},
        {"batch_size", FLAG_INT, &batch_size, "examples per step (default 256)"},
        {"table_rows", FLAG_INT, &table_rows, "rows of the embedding table (default 1000000)"},
        {"embedding_dim", FLAG_INT, &dim, "embedding width (default 16)"},
        {"fields", FLAG_INT, &fields, "categorical features per example (default 8)"},
        {"values_per_field", FLAG_INT, &values, "distinct values of each field (default 1000)"},
        {"shards", FLAG_INT, &shards, "parts of the table (default: the number of ps tasks)"},
        {"partition_strategy", FLAG_STRING, &strategy_s, "mod or div (default div)"},
        {"learning_rate", FLAG_DOUBLE, &lr, "Adagrad learning rate (default 0.1)"},
        {"test_examples", FLAG_INT, &test_examples, "examples the chief scores after training (default 20000)"},
        {"seed", FLAG_INT, &seed, "initialisation seed; worker i's examples use seed + i (default 1)"},
        {"data_seed", FLAG_INT, &data_seed, "seed of the generating model (default 7)"},
        {"log_every", FLAG_INT, &log_every, "progress line every N local steps (default 500)"},
        {"report_bytes_step", FLAG_INT, &report_bytes_step,
         "trace this local step and print the bytes it sent each way (default 0: none)"},
        {"checkpoint_path", FLAG_STRING, &checkpoint_path, "SQLite checkpoint file of the chief (default: none)"},
        {"save_checkpoint_steps", FLAG_INT, &save_checkpoint_steps,
         "chief: checkpoint every N global steps (default 0: at the end only)"},
        {"predictions", FLAG_STRING, &predictions,
         "chief: write each test example's label, the model's and the generating model's probability to this file"},
        {"quiet", FLAG_BOOL, &quiet, "no server log lines"},
    };
    bool help;
    if (!flags_parse(argc, argv, defs, sizeof defs / sizeof defs[0], "usage: ctr_replica [flags]", &help)) return 2;
    if (help) return 0;
    dg_partition_strategy strategy = strcmp(strategy_s, "mod") == 0 ? DG_PARTITION_MOD : DG_PARTITION_DIV;
    if (train_steps < 0 || batch_size < 1 || batch_size > 1000000 || table_rows < 1 || dim < 1 || fields < 1 ||
        fields > 1000 || values < 1 || shards < 0 || shards > DG_MAX_PARTITIONS || test_examples < 2 ||
        log_every < 1 || report_bytes_step < 0 || save_checkpoint_steps < 0 ||
        (strcmp(strategy_s, "mod") != 0 && strcmp(strategy_s, "div") != 0)) {
        fprintf(stderr, "%s: a flag is out of range (see --help)\n", prog);
        return 2;
    }
    dg_status *st = dg_status_new();
    dg_cluster *cluster = dg_cluster_from_flags(ps_hosts, worker_hosts, st);
    if (!cluster) return fail(st, "cluster (give --ps_hosts and --worker_hosts)");
    if (strcmp(job_name, "ps") != 0 && strcmp(job_name, "worker") != 0) {
        fprintf(stderr, "%s: --job_name must be ps or worker\n", prog);
        return 2;
    }
    int n_ps = dg_cluster_num_tasks(cluster, "ps"), n_workers = dg_cluster_num_tasks(cluster, "worker");
    if (task_index < 0 || task_index >= dg_cluster_num_tasks(cluster, job_name)) {
        fprintf(stderr, "%s: --task_index must be 0 to %d\n", prog, dg_cluster_num_tasks(cluster, job_name) - 1);
        return 2;
    }
    if (n_ps < 1) {
        fprintf(stderr, "%s: needs at least one ps task (--ps_hosts)\n", prog);
        return 2;
    }
    if (shards == 0) shards = n_ps;
    dg_server_options so = dg_server_options_default();
    so.quiet = quiet;
    dg_server *server = dg_server_new(cluster, job_name, (int)task_index, &so, st);
    if (!server) return fail(st, "starting the server");
    if (strcmp(job_name, "ps") == 0) {
        dg_server_join(server, true, st);
        dg_server_free(&server);
        dg_cluster_free(&cluster);
        dg_status_free(&st);
        return 0;
    }
    int rc = 1;
    ctr_data data = {fields, values, table_rows, (uint64_t)data_seed};
    dg_graph *g = dg_graph_new();
    dg_monitored_session *ms = NULL;
    dg_session_hook *stop = NULL;
    int64_t *ids = malloc((size_t)(batch_size * fields) * sizeof *ids), *sorted = NULL;
    float *labels = malloc((size_t)batch_size * sizeof *labels);
    dg_tensor *it = NULL, *lt = NULL;
    char worker_device[128];
    snprintf(worker_device, sizeof worker_device, "/job:worker/task:%lld", (long long)task_index);
    dg_replica_device_setter_options ro = dg_replica_device_setter_options_default();
    ro.cluster = cluster;
    ro.worker_device = worker_device;
    dg_device_fn *setter = dg_replica_device_setter_new(&ro, st);
    if (!setter || !ids || !labels) {
        fail(st, "replica device setter");
        goto out;
    }
    dg_graph_push_device_fn(g, setter);
    ctr_model m;
    memset(&m, 0, sizeof m);
    bool built = build(g, &data, dim, shards, strategy, lr, seed, &m, st);
    dg_graph_pop_device_fn(g);
    if (!built) {
        fail(st, "building the model");
        goto out;
    }
    if (!(stop = dg_stop_at_last_step_hook_new(train_steps, st))) {
        fail(st, "stop hook");
        goto out;
    }
    dg_session_options sopt = dg_session_options_default();
    sopt.inter_op_threads = 1;
    dg_mts_options mo = dg_mts_options_default();
    mo.session_options = &sopt;
    mo.master = dg_server_target(server);
    mo.is_chief = task_index == 0;
    mo.checkpoint_path = *checkpoint_path && task_index == 0 ? checkpoint_path : NULL;
    mo.save_checkpoint_steps = save_checkpoint_steps;
    mo.hooks = &stop;
    mo.n_hooks = 1;
    if (!(ms = dg_monitored_session_new(g, &mo, st))) {
        fail(st, "creating the monitored session");
        goto out;
    }
    printf("Worker %lld: table %lld x %lld in %d parts (", (long long)task_index, (long long)table_rows,
           (long long)dim, m.table.n);
    for (int k = 0; k < m.table.n; k++)
        printf("%s%s", k ? ", " : "", dg_node_assigned_device(m.table.parts[k].node));
    printf("), %s lookup\n", strategy_s);
    fflush(stdout);
    it = dg_tensor_wrap(DG_INT64, dg_shape2(batch_size, fields), ids, (size_t)(batch_size * fields) * sizeof *ids,
                        NULL, NULL, st);
    lt = dg_tensor_wrap(DG_FLOAT32, dg_shape1(batch_size), labels, (size_t)batch_size * sizeof *labels, NULL, NULL, st);
    if (!it || !lt) {
        fail(st, "batch buffers");
        goto out;
    }
    dg_output feeds[2] = {m.ids, m.labels};
    dg_tensor *vals[2] = {it, lt};
    uint64_t stream = mix((uint64_t)(seed + task_index) * 0x2545f4914f6cdd1dull);
    int64_t local = 0, global_step = 0;
    double t0 = now_s(), loss_sum = 0;
    int64_t loss_n = 0;
    while (!dg_monitored_session_should_stop(ms)) {
        for (int64_t i = 0; i < batch_size; i++) {
            double p;
            draw(&data, &stream, ids + i * fields, &labels[i], &p);
        }
        dg_output fetches[2] = {m.global_step, m.loss};
        dg_tensor *out[2] = {NULL, NULL};
        if (local + 1 == report_bytes_step) {
            // One step through the raw session, traced: the bytes each transfer carried.
            dg_step_trace *trace = NULL;
            dg_run_options rop = {.trace = true};
            if (!dg_session_run_with_options(dg_monitored_session_session(ms), &rop, feeds, vals, 2, fetches, out, 2,
                                             &m.train, 1, &trace, st)) {
                dg_step_trace_free(&trace);
                fail(st, "traced step");
                goto out;
            }
            uint64_t to_ps, from_ps;
            transfer_bytes(trace, &to_ps, &from_ps);
            dg_step_trace_free(&trace);
            sorted = malloc((size_t)(batch_size * fields) * sizeof *sorted);
            if (!sorted) abort();
            memcpy(sorted, ids, (size_t)(batch_size * fields) * sizeof *sorted);
            qsort(sorted, (size_t)(batch_size * fields), sizeof *sorted, cmp_i64);
            int64_t unique = 0;
            for (int64_t i = 0; i < batch_size * fields; i++) unique += i == 0 || sorted[i] != sorted[i - 1];
            int64_t row_bytes = dim * 4;
            printf("{\"bench\": \"ctr_bytes\", \"worker\": %lld, \"ps_tasks\": %d, \"table_rows\": %lld, "
                   "\"ids\": %lld, \"rows_touched\": %lld, \"row_bytes\": %lld, \"worker_to_ps_bytes\": %llu, "
                   "\"ps_to_worker_bytes\": %llu, \"worker_to_ps_per_row\": %.3f, \"ps_to_worker_per_row\": %.3f}\n",
                   (long long)task_index, n_ps, (long long)table_rows, (long long)(batch_size * fields),
                   (long long)unique, (long long)row_bytes, (unsigned long long)to_ps, (unsigned long long)from_ps,
                   (double)to_ps / (double)(unique * row_bytes), (double)from_ps / (double)(unique * row_bytes));
        } else if (!dg_monitored_session_run(ms, feeds, vals, 2, fetches, out, 2, &m.train, 1, st)) {
            fail(st, "training step");
            goto out;
        }
        global_step = dg_tensor_i64(out[0])[0];
        double l = dg_tensor_f32(out[1])[0];
        dg_tensor_unref(out[0]);
        dg_tensor_unref(out[1]);
        if (!isfinite(l)) {
            fprintf(stderr, "%s: the loss is %g at global step %lld\n", prog, l, (long long)global_step);
            goto out;
        }
        loss_sum += l;
        loss_n++;
        if (++local % log_every == 0) {
            printf("Worker %lld: local step %lld (global step %lld): mean training loss %.4f\n", (long long)task_index,
                   (long long)local, (long long)global_step, loss_sum / (double)loss_n);
            fflush(stdout);
            loss_sum = 0;
            loss_n = 0;
        }
    }
    double elapsed = now_s() - t0;
    printf("Worker %lld: %lld local steps in %.2f s: %.1f steps/s (global step %lld)\n", (long long)task_index,
           (long long)local, elapsed, (double)local / elapsed, (long long)global_step);
    if (task_index == 0) {
        double loss, a, tl, ta;
        FILE *pf = *predictions ? fopen(predictions, "w") : NULL;
        if (*predictions && !pf) {
            fprintf(stderr, "%s: --predictions %s: cannot write it\n", prog, predictions);
            goto out;
        }
        bool evaluated = evaluate(dg_monitored_session_session(ms), &m, &data, test_examples, (uint64_t)data_seed + 99,
                                  pf, &loss, &a, &tl, &ta, st);
        if (pf && fclose(pf) != 0 && evaluated) {
            fprintf(stderr, "%s: --predictions %s: write failed\n", prog, predictions);
            goto out;
        }
        if (!evaluated) {
            fail(st, "evaluating");
            goto out;
        }
        printf("Test loss %.5f (generating model %.5f, ratio %.4f), AUC %.5f (generating model %.5f, gap %.5f) on %lld "
               "examples\n", loss, tl, loss / tl, a, ta, ta - a, (long long)test_examples);
    }
    fflush(stdout);
    if (!dg_monitored_session_close(ms, st)) {
        fail(st, "closing the monitored session");
        goto out;
    }
    rc = 0;
out:
    (void)n_workers;
    dg_tensor_unref(it);
    dg_tensor_unref(lt);
    free(ids);
    free(sorted);
    free(labels);
    dg_monitored_session_free(&ms);
    dg_session_hook_free(&stop);
    dg_graph_free(&g);
    dg_device_fn_free(&setter);
    dg_server_free(&server);
    dg_cluster_free(&cluster);
    dg_status_free(&st);
    return rc;
}
