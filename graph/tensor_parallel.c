/* Tensor-parallel layers (distgraph/tensor_parallel.h): shards of a layer's matrices on the
 * devices of a group, partial results summed by LocalAllReduce within a task, or gathered and
 * added on the group's first device when the group spans tasks. */
#include <stdio.h>
#include <string.h>

#include "distgraph/collective.h"
#include "distgraph/device_name.h"
#include "distgraph/status.h"
#include "distgraph/tensor_parallel.h"

#define MAX_RANKS 64

static bool check_group(dg_graph *g, const char *what, const char *name, const dg_tp_group *grp, const dg_output *xs,
                        const dg_output *ys) {
    if (!dg_graph_ok(g)) return false;
    if (!name || !grp || !grp->devices || grp->n < 1 || grp->n > MAX_RANKS || !xs || !ys) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "%s \"%s\": needs a name, a group of 1 to %d devices, inputs and "
                           "room for the outputs", what, name ? name : "(null)", MAX_RANKS);
        return false;
    }
    for (int r = 0; r < grp->n; r++)
        if (!grp->devices[r] || !xs[r].node) {
            dg_graph_set_error(g, DG_INVALID_ARGUMENT, "%s \"%s\": device or input %d is missing", what, name, r);
            return false;
        }
    return true;
}

static bool divides(dg_graph *g, const char *what, const char *name, const char *dim, int64_t v, int n) {
    if (v >= 1 && v % n == 0) return true;
    dg_graph_set_error(g, DG_INVALID_ARGUMENT, "%s \"%s\": %s %lld does not divide into %d parts", what, name, dim,
                       (long long)v, n);
    return false;
}

// The variable "<name>/<what>" (part r, or the whole when r < 0) on the device, made or found.
static dg_output shard(dg_graph *g, const char *name, const char *what, int r, const char *device, dg_shape shape,
                       dg_initializer init) {
    char full[512];
    if (r >= 0) snprintf(full, sizeof full, "%s/%s/part_%d", name, what, r);
    else snprintf(full, sizeof full, "%s/%s", name, what);
    dg_node *n = dg_graph_find(g, full);
    if (n && strcmp(dg_node_op_type(n), "VariableV2") == 0) return (dg_output){n, 0};
    // Each part its own draw: a fixed seed moves on by the part (seed 0 draws per node anyway).
    if (init.seed != 0 && r > 0) init.seed += 7919 * r;
    dg_graph_push_device(g, "");
    dg_graph_push_device(g, device);
    dg_output v = dg_get_variable(g, full, DG_FLOAT32, shape, init);
    dg_graph_pop_device(g);
    dg_graph_pop_device(g);
    return v;
}

// Pushes device r of the group (its own, whatever scopes are in force) and a name scope.
static void enter(dg_graph *g, const dg_tp_group *grp, int r, const char *name) {
    dg_graph_push_device(g, "");
    dg_graph_push_device(g, grp->devices[r]);
    dg_graph_push_name_scope(g, name);
}

static void leave(dg_graph *g) {
    dg_graph_pop_name_scope(g);
    dg_graph_pop_device(g);
    dg_graph_pop_device(g);
}

// Whether the group's devices name one task (job, replica and task alike; a field left out
// matches only itself left out).
static bool one_task(dg_graph *g, const dg_tp_group *grp) {
    dg_device_name first, d;
    dg_status *st = dg_status_new();
    bool one = st && dg_device_spec_from_string(grp->devices[0], &first, st);
    for (int r = 1; one && r < grp->n; r++) {
        if (!dg_device_spec_from_string(grp->devices[r], &d, st)) {
            one = false;
            break;
        }
        one = d.has_job == first.has_job && (!d.has_job || strcmp(d.job, first.job) == 0) &&
              d.has_replica == first.has_replica && (!d.has_replica || d.replica == first.replica) &&
              d.has_task == first.has_task && (!d.has_task || d.task == first.task);
    }
    if (st && !dg_status_ok(st)) dg_graph_set_error(g, DG_INVALID_ARGUMENT, "tensor parallel: %s", dg_status_message(st));
    dg_status_free(&st);
    return one;
}

// sum[r] on device r = the sum of partial over the group. On one task, LocalAllReduce (the
// devices of a process exchange through its memory); across tasks, the partials go to device
// 0, are added there in device order, and each device reads the sum (the placer's Send and Recv
// between tasks). Either way every device gets the same bits, and the gradient of each partial
// is the sum of the gradients of every device's copy.
static bool sum_over_group(dg_graph *g, const char *name, const dg_tp_group *grp, const dg_output *partial,
                           dg_output *sum) {
    if (grp->n == 1 || one_task(g, grp))
        return dg_graph_ok(g) && dg_local_all_reduce(g, name, partial, grp->devices, grp->n, DG_REDUCE_SUM, sum);
    if (!dg_graph_ok(g)) return false;
    enter(g, grp, 0, name);
    dg_output total = dg_add_n(g, "sum", partial, grp->n);
    for (int r = 0; r < grp->n; r++) {   // in the same name scope, each on its device
        char copy[32];
        snprintf(copy, sizeof copy, "copy_%d", r);
        dg_graph_push_device(g, "");
        dg_graph_push_device(g, grp->devices[r]);
        sum[r] = dg_identity(g, copy, total);
        dg_graph_pop_device(g);
        dg_graph_pop_device(g);
    }
    leave(g);
    return dg_graph_ok(g);
}

bool dg_tp_column_linear(dg_graph *g, const char *name, const dg_tp_group *grp, const dg_output *xs, int64_t in,
                         int64_t out, dg_initializer init, dg_output *ys) {
    if (!check_group(g, "column-parallel linear", name, grp, xs, ys) ||
        !divides(g, "column-parallel linear", name, "out", out, grp->n))
        return false;
    for (int r = 0; r < grp->n; r++) {
        dg_output w = shard(g, name, "kernel", r, grp->devices[r], dg_shape2(in, out / grp->n), init);
        dg_output b = shard(g, name, "bias", r, grp->devices[r], dg_shape1(out / grp->n), dg_init_zeros());
        enter(g, grp, r, name);
        ys[r] = dg_bias_add(g, NULL, dg_matmul(g, NULL, xs[r], w, false, false), b);
        leave(g);
    }
    return dg_graph_ok(g);
}

bool dg_tp_row_linear(dg_graph *g, const char *name, const dg_tp_group *grp, const dg_output *xs, int64_t in,
                      int64_t out, dg_initializer init, dg_output *ys) {
    if (!check_group(g, "row-parallel linear", name, grp, xs, ys) ||
        !divides(g, "row-parallel linear", name, "in", in, grp->n))
        return false;
    dg_output partial[MAX_RANKS], sum[MAX_RANKS];
    for (int r = 0; r < grp->n; r++) {
        dg_output w = shard(g, name, "kernel", r, grp->devices[r], dg_shape2(in / grp->n, out), init);
        enter(g, grp, r, name);
        partial[r] = dg_matmul(g, NULL, xs[r], w, false, false);
        leave(g);
    }
    dg_output b = shard(g, name, "bias", -1, grp->devices[0], dg_shape1(out), dg_init_zeros());
    char ar[512];
    snprintf(ar, sizeof ar, "%s/all_reduce", name);
    if (!sum_over_group(g, ar, grp, partial, sum)) return false;
    for (int r = 0; r < grp->n; r++) {
        enter(g, grp, r, name);
        ys[r] = dg_bias_add(g, NULL, sum[r], b);
        leave(g);
    }
    return dg_graph_ok(g);
}

bool dg_tp_attention(dg_graph *g, const char *name, const dg_tp_group *grp, const dg_output *xs, int64_t T,
                     int64_t C, int64_t n_head, bool causal, dg_initializer init, dg_initializer init_proj,
                     dg_output *ys) {
    if (!check_group(g, "tensor-parallel attention", name, grp, xs, ys) ||
        !divides(g, "tensor-parallel attention", name, "n_head", n_head, grp->n) ||
        !divides(g, "tensor-parallel attention", name, "C over the heads", C, (int)n_head) || T < 1)
        return false;
    const int n = grp->n;
    const int64_t hr = n_head / n, dh = C / n_head;   // heads and head width of one device
    char qkv_name[512], proj_name[512];
    snprintf(qkv_name, sizeof qkv_name, "%s/attn", name);
    snprintf(proj_name, sizeof proj_name, "%s/attn_proj", name);
    dg_output qkv[MAX_RANKS], merged[MAX_RANKS];
    if (!dg_tp_column_linear(g, qkv_name, grp, xs, C, 3 * C, init, qkv)) return false;
    const int64_t split[4] = {-1, T, hr, dh}, perm[4] = {0, 2, 1, 3}, rows[2] = {-1, hr * dh};
    for (int r = 0; r < n; r++) {
        enter(g, grp, r, name);
        dg_output part[3], h[3];
        dg_split(g, NULL, qkv[r], 1, 3, part);   // this device's q, k and v columns
        for (int i = 0; i < 3; i++) h[i] = dg_transpose(g, NULL, dg_reshape(g, NULL, part[i], split, 4), perm, 4);
        dg_output a = dg_attention(g, NULL, h[0], h[1], h[2], causal, 0);
        merged[r] = dg_reshape(g, NULL, dg_transpose(g, NULL, a, perm, 4), rows, 2);
        leave(g);
    }
    return dg_graph_ok(g) && dg_tp_row_linear(g, proj_name, grp, merged, C, C, init_proj, ys);
}

bool dg_tp_mlp(dg_graph *g, const char *name, const dg_tp_group *grp, const dg_output *xs, int64_t C, int64_t hidden,
               dg_initializer init, dg_initializer init_proj, dg_output *ys) {
    if (!check_group(g, "tensor-parallel MLP", name, grp, xs, ys)) return false;
    char fc[512], proj[512];
    snprintf(fc, sizeof fc, "%s/fc", name);
    snprintf(proj, sizeof proj, "%s/mlp_proj", name);
    dg_output h[MAX_RANKS];
    if (!dg_tp_column_linear(g, fc, grp, xs, C, hidden, init, h)) return false;
    for (int r = 0; r < grp->n; r++) {
        enter(g, grp, r, name);
        h[r] = dg_gelu(g, NULL, h[r], false);
        leave(g);
    }
    return dg_graph_ok(g) && dg_tp_row_linear(g, proj, grp, h, hidden, C, init_proj, ys);
}
