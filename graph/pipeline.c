/* Pipeline parallelism as graph construction (distgraph/pipeline.h): every stage's forward
 * pass built once per micro-batch, its backward pass by dg_gradients from the next stage's input
 * gradients, the gradients summed over micro-batches, and the schedule kept by control
 * dependencies between the pieces each device runs. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base_impl.h"
#include "distgraph/device_name.h"
#include "distgraph/ops.h"
#include "distgraph/train.h"
#include "graph_impl.h"
#include "pipeline_impl.h"
#include "status_impl.h"

#define MAX_STAGE_OUTPUTS 64
#define MAX_BATCH_INPUTS 64

dg_pipeline_options dg_pipeline_options_default(void) {
    return (dg_pipeline_options){.name = "pipeline", .chunks = 1, .micro_batches = 1, .schedule = DG_PIPELINE_1F1B};
}

void dg_pipeline_free(dg_pipeline *p) {
    if (!p) return;
    free(p->vars);
    free(p->grads);
    for (int k = 0; p->stage_devices && k < p->n_stages; k++) free(p->stage_devices[k]);
    free(p->stage_devices);
    memset(p, 0, sizeof *p);
}

// The last position in msg where the task of device dev is named ("/job:J/task:T" or
// "/job:J/replica:R/task:T", T not followed by a digit); -1 when it is not.
static long last_mention(const char *msg, const char *dev) {
    dg_device_name d;
    dg_status st = DG_STATUS_INIT;
    bool ok = dg_device_name_parse(dev, &d, &st);
    status_impl_clear(&st);
    if (!ok || !d.has_job || !d.has_task) return -1;
    long last = -1;
    char pat[2][DG_DEVICE_NAME_MAX + 64];
    snprintf(pat[0], sizeof pat[0], "/job:%s/task:%d", d.job, d.task);
    snprintf(pat[1], sizeof pat[1], "/job:%s/replica:%d/task:%d", d.job, d.has_replica ? d.replica : 0, d.task);
    for (int i = 0; i < 2; i++)
        for (const char *p = strstr(msg, pat[i]); p; p = strstr(p + 1, pat[i])) {
            char next = p[strlen(pat[i])];
            if ((next < '0' || next > '9') && p - msg > last) last = (long)(p - msg);
        }
    return last;
}

bool dg_pipeline_name_stage(const dg_pipeline *p, dg_status *st) {
    if (!p || !st || dg_status_ok(st) || !p->stage_devices) return false;
    const char *msg = dg_status_message(st);
    long best = -1;
    for (int k = 0; k < p->n_stages; k++) {
        long at = last_mention(msg, p->stage_devices[k]);
        if (at > best) best = at;
    }
    if (best < 0) return false;
    // An error path over a short message: each stage's mention found again, not kept.
    char names[256] = "";
    int n = 0, first = -1;
    for (int k = 0; k < p->n_stages; k++)
        if (last_mention(msg, p->stage_devices[k]) == best) {
            size_t len = strlen(names);
            snprintf(names + len, sizeof names - len, "%s%d", n ? ", " : "", k);
            if (first < 0) first = k;
            n++;
        }
    dg_status_prepend(st, "pipeline stage%s %s (on %s)", n > 1 ? "s" : "", names, p->stage_devices[first]);
    return true;
}

// The nodes of one piece, ascending (the order they were made in: a topological order).
typedef struct piece {
    int *ids;
    int n, cap;
} piece;

// One stage for one micro-batch: its inputs (stage > 0: the StopGradient nodes the previous
// stage's outputs enter by), its outputs, the gradients of its inputs (what the previous stage's
// backward starts from) and the nodes of its pieces.
typedef struct cell {
    dg_output in[MAX_STAGE_OUTPUTS], out[MAX_STAGE_OUTPUTS], d_in[MAX_STAGE_OUTPUTS];
    int n_in, n_out;
    int fwd_lo, fwd_hi;   // the forward's nodes: [fwd_lo, fwd_hi)
    piece part[3];        // PIPE_F, PIPE_B, PIPE_W
} cell;

typedef struct builder {
    dg_graph *g;
    const dg_pipeline_options *o;
    dg_status *st;
    pipe_plan plan;
    int S, m;
    cell *cells;          // cells[stage * m + mb]
    dg_output *slices;    // slices[j * m + mb]: batch input j's micro-batch mb
    int n_batch;
    int *stage_outputs;   // each stage's output count (-1: not built yet)
    dg_node **vars;       // the trainable variables read, in the order first read
    dg_output *acc;       // each one's gradient so far
    int n_vars, cap_vars;
} builder;

static bool fail(builder *b, dg_code code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool fail(builder *b, dg_code code, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (dg_graph_ok(b->g)) dg_graph_set_error(b->g, code, "%s: %s", b->o->name, msg);
    return false;
}

static bool piece_add(piece *p, int id) {
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 64;
        int *ids = realloc(p->ids, (size_t)cap * sizeof *ids);
        if (!ids) return false;
        p->ids = ids;
        p->cap = cap;
    }
    p->ids[p->n++] = id;
    return true;
}

static void push_stage(builder *b, int stage, int mb, const char *what) {
    char scope[600];
    snprintf(scope, sizeof scope, "%s/s%d/mb%d/%s", b->o->name, stage, mb, what);
    dg_graph_push_device(b->g, "");   // the caller's device scopes and functions no longer apply
    dg_graph_push_device(b->g, b->o->devices[stage % b->o->n_devices]);
    graph_push_absolute_scope(b->g, scope);
}

static void pop_stage(builder *b) {
    dg_graph_pop_name_scope(b->g);
    dg_graph_pop_device(b->g);
    dg_graph_pop_device(b->g);
}

static bool is_trainable(dg_graph *g, dg_node *v) {
    int n = dg_graph_collection_size(g, DG_TRAINABLE_VARIABLES);
    for (int i = 0; i < n; i++)
        if (dg_graph_collection_get(g, DG_TRAINABLE_VARIABLES, i) == v) return true;
    return false;
}

// The trainable variables the nodes [lo, hi) read, each once, into vs (at most cap): directly,
// or through a cast. Under dg_graph_set_mixed_precision a variable's 16-bit cast is made once,
// by the first micro-batch whose stage reads it, and the later micro-batches' products read
// that cast: the variable is theirs too, and their gradients reach it through the cast.
static int read_variables(builder *b, int lo, int hi, dg_output *vs, int cap) {
    int n = 0;
    for (int id = lo; id < hi; id++) {
        dg_node *nd = dg_graph_node(b->g, id);
        for (int k = 0; k < nd->n_inputs; k++) {
            dg_node *v = dg_node_input(nd, k).node;
            if (strcmp(dg_node_op_type(v), "Cast") == 0 && v->n_inputs == 1) v = dg_node_input(v, 0).node;
            if (strcmp(dg_node_op_type(v), "VariableV2") != 0 || !is_trainable(b->g, v)) continue;
            bool seen = false;
            for (int j = 0; j < n && !seen; j++) seen = vs[j].node == v;
            if (seen) continue;
            if (n == cap) return -1;
            vs[n++] = (dg_output){v, 0};
        }
    }
    return n;
}

// Calls the stage function for (stage, mb) in the scope "what"; the nodes it made are
// [*lo, *hi). Returns its output count, -1 on failure.
static int call_stage(builder *b, int stage, int mb, const char *what, const dg_output *in, int n_in, dg_output *out,
                      int *lo, int *hi) {
    dg_graph *g = b->g;
    push_stage(b, stage, mb, what);
    bool reuse = b->stage_outputs[stage] >= 0;   // not the stage's first call: its variables exist
    if (reuse) graph_push_variable_reuse(g);
    *lo = dg_graph_num_nodes(g);
    int n = b->o->stage_fn(g, stage, mb, in, n_in, out, MAX_STAGE_OUTPUTS, b->o->arg);
    *hi = dg_graph_num_nodes(g);
    if (reuse) dg_graph_pop_variable_scope(g);
    pop_stage(b);
    if (!dg_graph_ok(g)) return -1;
    if (n < 0 || n > MAX_STAGE_OUTPUTS)
        return fail(b, DG_INVALID_ARGUMENT, "stage %d (micro-batch %d) returned %d outputs, not 0 to %d", stage, mb, n,
                    MAX_STAGE_OUTPUTS), -1;
    if (b->stage_outputs[stage] >= 0 && n != b->stage_outputs[stage])
        return fail(b, DG_INVALID_ARGUMENT, "stage %d returned %d outputs for micro-batch %d and %d before", stage, n, mb,
                    b->stage_outputs[stage]), -1;
    for (int j = 0; j < n; j++)
        if (!out[j].node)
            return fail(b, DG_INVALID_ARGUMENT, "stage %d (micro-batch %d): output %d is the null output", stage, mb, j),
                   -1;
    if (stage == b->S - 1) {
        dg_shape s = n > 0 ? dg_output_shape(out[0]) : dg_shape_scalar();
        dg_dtype t = n > 0 ? dg_output_dtype(out[0]) : DG_INT32;
        if (n < 1 || s.rank != 0 ||
            (t != DG_FLOAT32 && t != DG_FLOAT64 && t != DG_FLOAT16 && t != DG_BFLOAT16))
            return fail(b, DG_INVALID_ARGUMENT, "the last stage's first output must be the loss, a float scalar "
                        "(micro-batch %d)", mb), -1;
    }
    b->stage_outputs[stage] = n;
    return n;
}

// Marks in mark (indexed by id - lo) the nodes among [lo, hi) that stack's nodes depend on
// through their inputs (and control inputs, with ctrl), those nodes included. Empties stack.
static bool mark_ancestors(dg_graph *g, int lo, int hi, piece *stack, bool ctrl, unsigned char *mark) {
    bool ok = true;
    while (ok && stack->n > 0) {
        int x = stack->ids[--stack->n];
        if (x < lo || x >= hi || mark[x - lo]) continue;
        mark[x - lo] = 1;
        dg_node *xn = dg_graph_node(g, x);
        for (int k = 0; k < xn->n_inputs && ok; k++) ok = piece_add(stack, xn->inputs[k].node->id);
        for (int k = 0; ctrl && k < xn->n_ctrl && ok; k++) ok = piece_add(stack, xn->ctrl_inputs[k]->id);
    }
    stack->n = 0;
    return ok;
}

// Marks in skip (indexed by id - lo) the variables made among [lo, hi) and their
// initializers: they run in the initializing step, never in a piece.
static bool skip_variables(dg_graph *g, int lo, int hi, unsigned char *skip) {
    piece stack = {0};
    bool ok = true;
    for (int id = lo; id < hi && ok; id++) {
        dg_node *nd = dg_graph_node(g, id);
        if (strcmp(nd->op->name, "VariableV2") != 0) continue;
        skip[id - lo] = 1;
        if (nd->var_initializer) ok = piece_add(&stack, nd->var_initializer->id);
        ok = ok && mark_ancestors(g, lo, hi, &stack, false, skip);
    }
    free(stack.ids);
    return ok;
}

static int var_index(builder *b, dg_node *v);

static bool forward(builder *b, int stage, int mb) {
    cell *c = &b->cells[stage * b->m + mb];
    dg_output in[MAX_STAGE_OUTPUTS];
    int n_in = 0;
    int lo = dg_graph_num_nodes(b->g);
    if (stage == 0) {
        for (int j = 0; j < b->n_batch; j++) in[n_in++] = b->slices[j * b->m + mb];
    } else {
        // The previous stage's outputs enter through StopGradient nodes on this stage's device:
        // this stage's backward pass stops at them (their gradients go back to the previous
        // stage), and the transfer between the two devices ends there.
        const cell *prev = &b->cells[(stage - 1) * b->m + mb];
        push_stage(b, stage, mb, "fwd");
        for (int j = 0; j < prev->n_out; j++) in[n_in++] = dg_stop_gradient(b->g, "input", prev->out[j]);
        pop_stage(b);
        if (!dg_graph_ok(b->g)) return false;
    }
    memcpy(c->in, in, (size_t)n_in * sizeof *in);
    c->n_in = n_in;
    int flo, fhi;
    c->n_out = call_stage(b, stage, mb, "fwd", in, n_in, c->out, &flo, &fhi);
    if (c->n_out < 0) return false;
    c->fwd_lo = flo;
    c->fwd_hi = fhi;
    // The variables in the order the stages first read them: the order of dg_pipeline.vars.
    dg_output vs[512];
    int n_v = read_variables(b, flo, fhi, vs, 512);
    if (n_v < 0) return fail(b, DG_UNIMPLEMENTED, "stage %d reads more than 512 trainable variables", stage);
    for (int j = 0; j < n_v; j++)
        if (var_index(b, vs[j].node) < 0) return fail(b, DG_RESOURCE_EXHAUSTED, "out of memory");
    int hi = dg_graph_num_nodes(b->g);
    unsigned char *skip = calloc((size_t)(hi - lo) + 1, 1);
    bool ok = skip && skip_variables(b->g, lo, hi, skip);
    for (int id = lo; id < hi && ok; id++)
        if (!skip[id - lo]) ok = piece_add(&c->part[PIPE_F], id);
    free(skip);
    return ok || fail(b, DG_RESOURCE_EXHAUSTED, "out of memory");
}

static int var_index(builder *b, dg_node *v) {
    for (int i = 0; i < b->n_vars; i++)
        if (b->vars[i] == v) return i;
    if (b->n_vars == b->cap_vars) {
        int cap = b->cap_vars ? 2 * b->cap_vars : 32;
        dg_node **vs = realloc(b->vars, (size_t)cap * sizeof *vs);
        if (vs) b->vars = vs;
        dg_output *acc = vs ? realloc(b->acc, (size_t)cap * sizeof *acc) : NULL;
        if (!acc) return -1;
        b->acc = acc;
        b->cap_vars = cap;
    }
    b->vars[b->n_vars] = v;
    b->acc[b->n_vars] = (dg_output){NULL, 0};
    return b->n_vars++;
}

// Adds grad to the sum of variable v's gradients, on v's device.
static bool accumulate(builder *b, dg_node *v, dg_output grad) {
    int i = var_index(b, v);
    if (i < 0) return fail(b, DG_RESOURCE_EXHAUSTED, "out of memory");
    if (!b->acc[i].node) {
        b->acc[i] = grad;
        return true;
    }
    char scope[600];
    snprintf(scope, sizeof scope, "%s/accumulate", b->o->name);
    dg_graph_push_device(b->g, "");
    dg_graph_push_device(b->g, dg_node_requested_device(v));
    graph_push_absolute_scope(b->g, scope);
    b->acc[i] = dg_add(b->g, NULL, b->acc[i], grad);
    dg_graph_pop_name_scope(b->g);
    dg_graph_pop_device(b->g);
    dg_graph_pop_device(b->g);
    return dg_graph_ok(b->g);
}

static bool backward(builder *b, int stage, int mb) {
    dg_graph *g = b->g;
    cell *c = &b->cells[stage * b->m + mb];
    dg_output ys[MAX_STAGE_OUTPUTS], grad_ys[MAX_STAGE_OUTPUTS], out[MAX_STAGE_OUTPUTS];
    int n_ys = 0, lo = dg_graph_num_nodes(g), flo = c->fwd_lo, fhi = c->fwd_hi;
    const dg_output *y = c->out;
    if (b->o->recompute) {
        // The forward again from the stage's inputs: its activations live from here to the
        // gradients, not from the forward pass on.
        if (call_stage(b, stage, mb, "recompute", c->in, c->n_in, out, &flo, &fhi) < 0) return false;
        y = out;
    }
    push_stage(b, stage, mb, "bwd");
    if (stage == b->S - 1) {
        // Each micro-batch's loss weighs 1/m in the mean the pipeline minimizes (times the loss
        // scale, with one).
        ys[n_ys] = y[0];
        dg_dtype lt = dg_output_dtype(y[0]);
        dg_output w = dg_scalar(g, "micro_batch_weight", lt, 1.0 / b->m);
        if (b->o->loss_scale.node) {
            dg_output sc = b->o->loss_scale;
            w = dg_mul(g, "scaled_weight", w, dg_output_dtype(sc) == lt ? sc : dg_cast(g, NULL, sc, lt));
        }
        grad_ys[n_ys++] = w;
    } else {
        const cell *next = &b->cells[(stage + 1) * b->m + mb];
        for (int j = 0; j < c->n_out; j++)
            if (next->d_in[j].node) {
                ys[n_ys] = y[j];
                grad_ys[n_ys++] = next->d_in[j];
            }
    }
    dg_output xs[MAX_STAGE_OUTPUTS + 512], dx[MAX_STAGE_OUTPUTS + 512];
    int n_xs = stage > 0 ? c->n_in : 0;
    memcpy(xs, c->in, (size_t)n_xs * sizeof *xs);
    int n_v = read_variables(b, flo, fhi, xs + n_xs, 512);
    if (n_v < 0) {
        pop_stage(b);
        return fail(b, DG_UNIMPLEMENTED, "stage %d reads more than 512 trainable variables", stage);
    }
    n_xs += n_v;
    // Each op's gradient where the op ran (its stage's device, or the device within the stage's
    // task that a split layer put it on: tensor parallelism inside a stage).
    const dg_gradients_options go = {.colocate_gradients_with_ops = true};
    bool ok = n_ys == 0 || n_xs == 0 || dg_gradients_ex(g, ys, n_ys, xs, n_xs, grad_ys, &go, dx);
    pop_stage(b);
    if (!ok || !dg_graph_ok(g)) return false;
    int n_in = stage > 0 ? c->n_in : 0;
    for (int j = 0; j < c->n_in; j++) c->d_in[j] = j < n_in && n_ys > 0 && n_xs > 0 ? dx[j] : (dg_output){NULL, 0};
    int hi = dg_graph_num_nodes(g);
    // The backward's pieces: with ZB-H1 the input-gradient part B is what the input gradients
    // need; the weight-gradient part W is the rest. Otherwise B is all of it.
    bool split = b->plan.split;
    unsigned char *mark = calloc((size_t)(hi - lo) + 1, 1);
    piece stack = {0};
    bool mem = mark != NULL;
    for (int j = 0; j < n_in && split && mem; j++)
        if (c->d_in[j].node) mem = piece_add(&stack, c->d_in[j].node->id);
    mem = mem && mark_ancestors(g, lo, hi, &stack, true, mark);
    for (int id = lo; id < hi && mem; id++) mem = piece_add(&c->part[!split || mark[id - lo] ? PIPE_B : PIPE_W], id);
    free(stack.ids);
    free(mark);
    if (!mem) return fail(b, DG_RESOURCE_EXHAUSTED, "out of memory");
    if (n_ys == 0 || n_xs == 0) return true;
    for (int j = n_in; j < n_xs; j++)
        if (dx[j].node && !accumulate(b, xs[j].node, dx[j])) return false;
    return true;
}

// Makes each device run its pieces in the plan's order: a piece's nodes that would start first
// (those with no input from a node of the piece that waits already; constants too, not
// placeholders) wait for a NoOp that waits for the device's previous piece's last nodes.
static bool order_pieces(builder *b, int *owner, unsigned char *active, unsigned char *consumed) {
    dg_graph *g = b->g;
    const pipe_plan *p = &b->plan;
    static const char *const what[3] = {"fwd_done", "bwd_done", "wgrad_done"};
    int serial = 0;
    for (int d = 0; d < p->n_devices; d++) {
        dg_node *prev = NULL;
        for (int u = 0; u < p->n_order[d]; u++) {
            pipe_unit un = p->order[d][u];
            const piece *pc = &b->cells[un.stage * b->m + un.mb].part[un.phase];
            serial++;
            for (int k = 0; k < pc->n; k++) owner[pc->ids[k]] = serial;
            for (int k = 0; k < pc->n; k++) {
                int id = pc->ids[k];
                dg_node *nd = dg_graph_node(g, id);
                bool covered = false;
                for (int q = 0; q < nd->n_inputs && !covered; q++) {
                    int src = nd->inputs[q].node->id;
                    covered = owner[src] == serial && active[src];
                }
                active[id] = covered || strcmp(nd->op->name, "Placeholder") != 0;
                consumed[id] = 0;
                if (active[id] && !covered && prev) dg_node_add_control_input(nd, prev);
            }
            int n_sinks = 0;
            for (int k = 0; k < pc->n; k++) {
                dg_node *nd = dg_graph_node(g, pc->ids[k]);
                if (!active[pc->ids[k]]) continue;
                for (int q = 0; q < nd->n_inputs; q++) {
                    int src = nd->inputs[q].node->id;
                    if (owner[src] == serial) consumed[src] = 1;
                }
            }
            for (int k = 0; k < pc->n; k++) n_sinks += active[pc->ids[k]] && !consumed[pc->ids[k]];
            if (n_sinks == 0) continue;   // nothing runs in this piece: the next waits for the one before
            push_stage(b, un.stage, un.mb, what[un.phase]);
            dg_node *done = dg_no_op(g, "done");
            pop_stage(b);
            if (!done) return false;
            for (int k = 0; k < pc->n; k++)
                if (active[pc->ids[k]] && !consumed[pc->ids[k]])
                    dg_node_add_control_input(done, dg_graph_node(g, pc->ids[k]));
            prev = done;
        }
    }
    return dg_graph_ok(g);
}

static bool valid_scope(const char *s) {
    if (!s || !*s || *s == '/' || strstr(s, "//") || s[strlen(s) - 1] == '/') return false;
    for (; *s; s++)
        if (!(('a' <= *s && *s <= 'z') || ('A' <= *s && *s <= 'Z') || ('0' <= *s && *s <= '9') || *s == '_' ||
              *s == '.' || *s == '-' || *s == '/'))
            return false;
    return true;
}

static bool check_options(builder *b, const dg_output *batch, int n_batch) {
    const dg_pipeline_options *o = b->o;
    if (!o->stage_fn) return fail(b, DG_INVALID_ARGUMENT, "no stage function");
    if (!o->devices || o->n_devices < 1) return fail(b, DG_INVALID_ARGUMENT, "no devices for the stages");
    for (int d = 0; d < o->n_devices; d++)
        if (!o->devices[d]) return fail(b, DG_INVALID_ARGUMENT, "device %d is NULL", d);
    if (n_batch < 1 || n_batch > MAX_BATCH_INPUTS || !batch)
        return fail(b, DG_INVALID_ARGUMENT, "%d batch inputs, not 1 to %d", n_batch, MAX_BATCH_INPUTS);
    for (int j = 0; j < n_batch; j++) {
        if (!batch[j].node) return fail(b, DG_INVALID_ARGUMENT, "batch input %d is the null output", j);
        dg_shape s = dg_output_shape(batch[j]);
        if (s.rank == 0) return fail(b, DG_INVALID_ARGUMENT, "batch input %d is a scalar: nothing to split", j);
        if (s.rank > 0 && s.dims[0] >= 0 && s.dims[0] % o->micro_batches != 0)
            return fail(b, DG_INVALID_ARGUMENT, "batch input %d has %lld rows, not a multiple of %d micro-batches", j,
                        (long long)s.dims[0], o->micro_batches);
    }
    if (o->loss_scale.node &&
        (!dg_dtype_is_float(dg_output_dtype(o->loss_scale)) || dg_output_shape(o->loss_scale).rank != 0))
        return fail(b, DG_INVALID_ARGUMENT, "loss_scale is %s of rank %d, not a float scalar",
                    dg_dtype_name(dg_output_dtype(o->loss_scale)), dg_output_shape(o->loss_scale).rank);
    const double t[3] = {o->t_forward > 0 ? o->t_forward : 1, o->t_backward > 0 ? o->t_backward : 1,
                         o->t_weight > 0 ? o->t_weight : 1};
    if (!pipe_plan_make(o->schedule, o->n_devices, o->chunks, o->micro_batches, t, &b->plan, b->st)) {
        dg_graph_set_error(b->g, dg_status_code(b->st), "%s: %s", o->name, dg_status_message(b->st));
        return false;
    }
    return true;
}

// Splits each batch input into m micro-batches (where the caller's scopes say).
static bool split_batch(builder *b, const dg_output *batch) {
    char scope[600];
    snprintf(scope, sizeof scope, "%s/micro_batches", b->o->name);
    graph_push_absolute_scope(b->g, scope);
    for (int j = 0; j < b->n_batch; j++) {
        if (b->m == 1)
            b->slices[j] = batch[j];
        else
            dg_split(b->g, NULL, batch[j], 0, b->m, b->slices + (size_t)j * b->m);
    }
    dg_graph_pop_name_scope(b->g);
    return dg_graph_ok(b->g);
}

// The mean of the micro-batches' losses, on the last stage's device.
static dg_output mean_loss(builder *b) {
    dg_graph *g = b->g;
    int last = b->S - 1;
    if (b->m == 1) return b->cells[last * b->m].out[0];
    dg_output *l = malloc((size_t)b->m * sizeof *l);
    if (!l) return fail(b, DG_RESOURCE_EXHAUSTED, "out of memory"), (dg_output){NULL, 0};
    for (int i = 0; i < b->m; i++) l[i] = b->cells[last * b->m + i].out[0];
    char scope[600];
    snprintf(scope, sizeof scope, "%s/loss", b->o->name);
    dg_graph_push_device(g, "");
    dg_graph_push_device(g, b->o->devices[last % b->o->n_devices]);
    graph_push_absolute_scope(g, scope);
    dg_output sum = dg_add_n(g, NULL, l, b->m);
    dg_output loss = dg_mul(g, "mean", sum, dg_scalar(g, NULL, dg_output_dtype(l[0]), 1.0 / b->m));
    dg_graph_pop_name_scope(g);
    dg_graph_pop_device(g);
    dg_graph_pop_device(g);
    free(l);
    return loss;
}

bool dg_pipeline_build(dg_graph *g, const dg_pipeline_options *o, const dg_output *batch, int n_batch, dg_pipeline *p,
                       dg_status *st) {
    dg_status_reset(st);
    memset(p, 0, sizeof *p);
    if (!g || !o) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "pipeline: no graph or no options");
        return false;
    }
    dg_pipeline_options opts = *o;
    if (!opts.name) opts.name = "pipeline";
    builder b = {.g = g, .o = &opts, .st = st, .m = opts.micro_batches, .n_batch = n_batch};
    if (!dg_graph_ok(g)) return dg_graph_check(g, st);
    if (!valid_scope(opts.name)) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "pipeline: \"%s\" is not a valid name", opts.name);
        return dg_graph_check(g, st);
    }
    if (!check_options(&b, batch, n_batch)) return dg_graph_check(g, st);
    b.S = b.plan.n_stages;
    size_t n_cells = (size_t)b.S * (size_t)b.m;
    b.cells = calloc(n_cells, sizeof *b.cells);
    b.slices = calloc((size_t)n_batch * (size_t)b.m, sizeof *b.slices);
    b.stage_outputs = malloc((size_t)b.S * sizeof *b.stage_outputs);
    bool ok = b.cells && b.slices && b.stage_outputs;
    if (!ok) fail(&b, DG_RESOURCE_EXHAUSTED, "out of memory for %zu stage cells", n_cells);
    for (int k = 0; ok && k < b.S; k++) b.stage_outputs[k] = -1;
    ok = ok && split_batch(&b, batch);
    // The forward passes, then the backward passes from the last stage down.
    for (int k = 0; ok && k < b.S; k++)
        for (int i = 0; ok && i < b.m; i++) ok = forward(&b, k, i);
    for (int k = b.S - 1; ok && k >= 0; k--)
        for (int i = 0; ok && i < b.m; i++) ok = backward(&b, k, i);
    if (ok) p->loss = mean_loss(&b);
    ok = ok && dg_graph_ok(g);
    if (ok) {
        int n = dg_graph_num_nodes(g) + 1;
        int *owner = calloc((size_t)n, sizeof *owner);
        unsigned char *active = calloc((size_t)n, 1), *consumed = calloc((size_t)n, 1);
        ok = owner && active && consumed ? order_pieces(&b, owner, active, consumed)
                                         : fail(&b, DG_RESOURCE_EXHAUSTED, "out of memory");
        free(owner);
        free(active);
        free(consumed);
    }
    if (ok) {
        p->vars = malloc((size_t)(b.n_vars ? b.n_vars : 1) * sizeof *p->vars);
        p->grads = malloc((size_t)(b.n_vars ? b.n_vars : 1) * sizeof *p->grads);
        if (!p->vars || !p->grads) {
            ok = fail(&b, DG_RESOURCE_EXHAUSTED, "out of memory");
        } else {
            for (int i = 0; i < b.n_vars; i++) {
                p->vars[i] = (dg_output){b.vars[i], 0};
                p->grads[i] = b.acc[i];
            }
            p->n_vars = b.n_vars;
            p->n_stages = b.S;
            if (!(p->stage_devices = calloc((size_t)b.S, sizeof *p->stage_devices))) abort();
            for (int k = 0; k < b.S; k++)
                if (!(p->stage_devices[k] = strdup(o->devices[k % o->n_devices]))) abort();
        }
    }
    for (size_t c = 0; b.cells && c < n_cells; c++)
        for (int q = 0; q < 3; q++) free(b.cells[c].part[q].ids);
    free(b.cells);
    free(b.slices);
    free(b.stage_outputs);
    free(b.vars);
    free(b.acc);
    pipe_plan_free(&b.plan);
    if (!ok || !dg_graph_ok(g)) {
        dg_pipeline_free(p);
        if (dg_graph_ok(g)) dg_graph_set_error(g, DG_INTERNAL, "pipeline: not built");
        return dg_graph_check(g, st);
    }
    return true;
}
