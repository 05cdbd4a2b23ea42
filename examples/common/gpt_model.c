/* The byte-level GPT of gpt_model.h and its text. */
#include "gpt_model.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "distgraph/embedding.h"
#include "distgraph/partitioned.h"
#include "distgraph/tensor_parallel.h"
#include "mlp_model.h"   // model_training_value

gpt_config gpt_config_cpu(void) { return (gpt_config){256, 4, 4, 128, 64, 0.0, 0}; }
gpt_config gpt_config_gpu(void) { return (gpt_config){256, 6, 6, 384, 256, 0.2, 0}; }

// The variable of that full name: the graph's own when it has one (the decoder shares the
// training graph's), else a new one. Names are given whole (no name scope is pushed while the
// model is built), so the training graph and gpt_sample's decoder name them alike.
static dg_output var(dg_graph *g, const char *name, dg_shape shape, dg_initializer init) {
    dg_node *n = dg_graph_find(g, name);
    if (n && strcmp(dg_node_op_type(n), "VariableV2") == 0) return (dg_output){n, 0};
    // By its name alone whatever name scope is in force (a pipeline's stages build under one).
    return dg_get_variable(g, name, DG_FLOAT32, shape, init);
}

static dg_output weight(dg_graph *g, const char *name, int64_t rows, int64_t cols, double stddev, int64_t seed) {
    return var(g, name, dg_shape2(rows, cols), dg_init_random_normal(0, stddev, seed));
}

// The token embedding, made or found by name: the whole table [vocab, C] (the parts
// concatenated when partitioned), and in parts[0..*n) the variables a lookup reads.
static dg_output token_table(dg_graph *g, const gpt_config *c, double stddev, int64_t seed, dg_output *parts, int *n) {
    if (c->wte_parts <= 1) {
        *n = 1;
        return parts[0] = weight(g, "wte", c->vocab, c->n_embd, stddev, seed);
    }
    if (c->wte_parts > DG_MAX_PARTITIONS) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "gpt: %d parts of the token embedding, at most %d", c->wte_parts,
                           DG_MAX_PARTITIONS);
        *n = 0;
        return (dg_output){NULL, 0};
    }
    dg_node *first = dg_graph_find(g, "wte/part_0");
    if (first) {   // the decoder in the training graph: the same parts
        *n = 0;
        for (int i = 0; i < c->wte_parts; i++) {
            char name[32];
            snprintf(name, sizeof name, "wte/part_%d", i);
            dg_node *v = dg_graph_find(g, name);
            if (!v) break;
            parts[(*n)++] = (dg_output){v, 0};
        }
    } else {
        dg_partitioned_variable pv = dg_partitioned_variable_new(g, "wte", DG_FLOAT32, dg_shape2(c->vocab, c->n_embd),
                                                                 dg_init_random_normal(0, stddev, seed),
                                                                 dg_fixed_size_partitioner(c->wte_parts));
        *n = pv.n;
        for (int i = 0; i < pv.n; i++) parts[i] = pv.parts[i];
    }
    if (*n != c->wte_parts) {
        if (dg_graph_ok(g))
            dg_graph_set_error(g, DG_INVALID_ARGUMENT, "gpt: the token embedding has %d parts, not %d", *n, c->wte_parts);
        return (dg_output){NULL, 0};
    }
    return dg_concat(g, NULL, parts, *n, 0);
}

static dg_output vec(dg_graph *g, const char *name, int64_t n, double v) {
    return var(g, name, dg_shape1(n), v == 0 ? dg_init_zeros() : dg_init_constant(v));
}

// x [rows, in] @ w [in, out] + b, with variables "<layer>/<name>/w" and "<layer>/<name>/b".
static dg_output linear(dg_graph *g, const char *layer, const char *name, dg_output x, int64_t in, int64_t out,
                        double stddev, int64_t seed) {
    char w[96], b[96];
    snprintf(w, sizeof w, "%s%s%s/w", layer, *layer ? "/" : "", name);
    snprintf(b, sizeof b, "%s%s%s/b", layer, *layer ? "/" : "", name);
    return dg_bias_add(g, NULL, dg_matmul(g, NULL, x, weight(g, w, in, out, stddev, seed), false, false),
                       vec(g, b, out, 0));
}

static dg_output layer_norm(dg_graph *g, const char *layer, const char *name, dg_output x, int64_t C) {
    char ga[96], be[96];
    snprintf(ga, sizeof ga, "%s%s%s/gamma", layer, *layer ? "/" : "", name);
    snprintf(be, sizeof be, "%s%s%s/beta", layer, *layer ? "/" : "", name);
    return dg_layer_norm(g, NULL, x, vec(g, ga, C, 1), vec(g, be, C, 0), 1e-5);
}

// The MLP half of block l on x [rows, C], with its residual.
static dg_output mlp_half(dg_graph *g, const char *layer, dg_output x, const gpt_config *c, dg_output training,
                          int64_t s, double std, double proj_std);

// [rows = B * T, C] -> [B, H, T, C / H], and back.
static dg_output heads(dg_graph *g, dg_output x, const gpt_config *c) {
    const int64_t dims[4] = {-1, c->block_size, c->n_head, c->n_embd / c->n_head}, perm[4] = {0, 2, 1, 3};
    return dg_transpose(g, NULL, dg_reshape(g, NULL, x, dims, 4), perm, 4);
}

static dg_output merge_heads(dg_graph *g, dg_output x, const gpt_config *c) {
    const int64_t dims[2] = {-1, c->n_embd}, perm[4] = {0, 2, 1, 3};
    return dg_reshape(g, NULL, dg_transpose(g, NULL, x, perm, 4), dims, 2);
}

static dg_output dropout(dg_graph *g, dg_output x, const gpt_config *c, dg_output training, int64_t seed) {
    return c->dropout > 0 ? dg_dropout(g, NULL, x, c->dropout, training, seed) : x;
}

static bool check_config(dg_graph *g, const gpt_config *c) {
    if (c->n_head < 1 || c->n_embd % c->n_head != 0 || c->n_layer < 0 || c->block_size < 1 || c->vocab < 1) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "gpt: n_embd %lld must be a multiple of n_head %lld, "
                           "block_size and vocab >= 1", (long long)c->n_embd, (long long)c->n_head);
        return false;
    }
    return true;
}

static double proj_stddev(const gpt_config *c) { return 0.02 / sqrt(2.0 * (double)(c->n_layer > 0 ? c->n_layer : 1)); }

// Token and position embeddings of idx [?, T]: rows [? * T, C], dropped out.
static dg_output embed(dg_graph *g, const gpt_config *c, int64_t seed, dg_output idx, dg_output training) {
    const int64_t T = c->block_size, C = c->n_embd, rows[1] = {-1};
    dg_output parts[DG_MAX_PARTITIONS];
    int n_parts = 0;
    dg_output wte = token_table(g, c, 0.02, seed, parts, &n_parts), wpe = weight(g, "wpe", T, C, 0.02, seed + 1);
    if (!dg_graph_ok(g)) return (dg_output){NULL, 0};
    // Token rows [B * T, C] plus each position's row (broadcast over the batch).
    const int64_t btc[3] = {-1, T, C}, bt_c[2] = {-1, C};
    dg_output ids = dg_reshape(g, NULL, idx, rows, 1);
    dg_output tok = n_parts > 1 ? dg_embedding_lookup_sharded(g, "tok_emb", parts, n_parts, ids, DG_PARTITION_DIV)
                                : dg_embedding_lookup(g, "tok_emb", wte, ids);
    dg_output x = dg_reshape(g, NULL, dg_add(g, "emb", dg_reshape(g, NULL, tok, btc, 3), wpe), bt_c, 2);
    return dropout(g, x, c, training, seed + 2);
}

// Block l on x [rows, C]: attention and the MLP, each with its residual.
static dg_output block(dg_graph *g, const gpt_config *c, int64_t l, dg_output x, dg_output training, int64_t seed) {
    const int64_t C = c->n_embd;
    const double std = 0.02, proj_std = proj_stddev(c);
    char layer[32];
    snprintf(layer, sizeof layer, "h%lld", (long long)l);
    int64_t s = seed + 10 * (l + 1);
    // Attention: q, k, v from one projection, split, per head; causal; projected back.
    dg_output qkv = linear(g, layer, "attn", layer_norm(g, layer, "ln_1", x, C), C, 3 * C, std, s);
    dg_output part[3];
    dg_split(g, NULL, qkv, 1, 3, part);
    dg_output a = dg_attention(g, NULL, heads(g, part[0], c), heads(g, part[1], c), heads(g, part[2], c), true, 0);
    a = linear(g, layer, "attn_proj", merge_heads(g, a, c), C, C, proj_std, s + 1);
    x = dg_add(g, NULL, x, dropout(g, a, c, training, s + 2));
    return mlp_half(g, layer, x, c, training, s, std, proj_std);
}

// The final LayerNorm, the logits through the token embedding again (tied, as GPT-2) and the
// mean cross entropy against targets [?, T].
static dg_output head(dg_graph *g, const gpt_config *c, int64_t seed, dg_output x, dg_output targets, dg_output *logits) {
    const int64_t rows[1] = {-1};
    dg_output parts[DG_MAX_PARTITIONS];
    int n_parts = 0;
    dg_output wte = token_table(g, c, 0.02, seed, parts, &n_parts);
    x = layer_norm(g, "", "ln_f", x, c->n_embd);
    *logits = dg_matmul(g, "logits", x, wte, false, true);
    return dg_sparse_softmax_cross_entropy(g, "loss", *logits, dg_reshape(g, NULL, targets, rows, 1));
}

bool gpt_build(dg_graph *g, const gpt_config *c, int64_t seed, gpt_model *m) {
    memset(m, 0, sizeof *m);
    if (!check_config(g, c)) return false;
    const int64_t T = c->block_size;
    m->idx = dg_placeholder(g, "idx", DG_INT32, dg_shape2(-1, T));
    m->targets = dg_placeholder(g, "targets", DG_INT32, dg_shape2(-1, T));
    m->training = dg_placeholder(g, "training", DG_BOOL, dg_shape_scalar());
    dg_output x = embed(g, c, seed, m->idx, m->training);
    if (!dg_graph_ok(g)) return false;
    for (int64_t l = 0; l < c->n_layer; l++) x = block(g, c, l, x, m->training, seed);
    m->loss = head(g, c, seed, x, m->targets, &m->logits);
    m->global_step = dg_global_step(g);
    return dg_graph_ok(g);
}

// Pushes device dev alone (the scopes and functions in force no longer apply); pop with off_device.
static void on_device(dg_graph *g, const char *dev) {
    dg_graph_push_device(g, "");
    dg_graph_push_device(g, dev);
}

static void off_device(dg_graph *g) {
    dg_graph_pop_device(g);
    dg_graph_pop_device(g);
}

// Whether c can be split over n devices; the graph's sticky error names what is wrong.
static bool tp_check(dg_graph *g, const gpt_config *c, int n) {
    if (n < 1 || n > 64 || c->n_head % n != 0 || c->dropout != 0 || c->wte_parts > 1) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "gpt tensor parallel: %d devices must divide the %lld heads; no "
                           "dropout (the copies would drop different units); the token embedding in one part",
                           n, (long long)c->n_head);
        return false;
    }
    return true;
}

// Blocks [l0, l1) with their matrices split over the n devices (x on any device; the layer
// norms and residuals computed on each, the same values everywhere). Returns the blocks'
// output on devices[0].
static dg_output tp_blocks(dg_graph *g, const gpt_config *c, int64_t seed, const char *const *devices, int n,
                           int64_t l0, int64_t l1, dg_output x) {
    const int64_t T = c->block_size, C = c->n_embd;
    const double std = 0.02, proj_std = proj_stddev(c);
    dg_tp_group grp = {devices, n};
    dg_output xs[64], h[64], y[64];
    for (int r = 0; r < n; r++) xs[r] = x;
    for (int64_t l = l0; l < l1 && dg_graph_ok(g); l++) {
        char layer[32];
        snprintf(layer, sizeof layer, "h%lld", (long long)l);
        int64_t s = seed + 10 * (l + 1);
        for (int r = 0; r < n; r++) {
            on_device(g, devices[r]);
            h[r] = layer_norm(g, layer, "ln_1", xs[r], C);
            off_device(g);
        }
        dg_tp_attention(g, layer, &grp, h, T, C, c->n_head, true, dg_init_random_normal(0, std, s),
                        dg_init_random_normal(0, proj_std, s + 1), y);
        for (int r = 0; r < n && dg_graph_ok(g); r++) {
            on_device(g, devices[r]);
            xs[r] = dg_add(g, NULL, xs[r], y[r]);
            h[r] = layer_norm(g, layer, "ln_2", xs[r], C);
            off_device(g);
        }
        dg_tp_mlp(g, layer, &grp, h, C, 4 * C, dg_init_random_normal(0, std, s + 3),
                  dg_init_random_normal(0, proj_std, s + 4), y);
        for (int r = 0; r < n && dg_graph_ok(g); r++) {
            on_device(g, devices[r]);
            xs[r] = dg_add(g, NULL, xs[r], y[r]);
            off_device(g);
        }
    }
    return xs[0];
}

bool gpt_build_tensor_parallel(dg_graph *g, const gpt_config *c, int64_t seed, const char *const *devices, int n,
                               gpt_model *m) {
    memset(m, 0, sizeof *m);
    if (!check_config(g, c) || !tp_check(g, c, n)) return false;
    const int64_t T = c->block_size;
    m->idx = dg_placeholder(g, "idx", DG_INT32, dg_shape2(-1, T));
    m->targets = dg_placeholder(g, "targets", DG_INT32, dg_shape2(-1, T));
    m->training = dg_placeholder(g, "training", DG_BOOL, dg_shape_scalar());
    // The embeddings and the head on the first device; the blocks' matrices split over all of
    // them.
    on_device(g, devices[0]);
    dg_output x = embed(g, c, seed, m->idx, m->training);
    off_device(g);
    if (!dg_graph_ok(g)) return false;
    x = tp_blocks(g, c, seed, devices, n, 0, c->n_layer, x);
    if (!dg_graph_ok(g)) return false;
    on_device(g, devices[0]);
    m->loss = head(g, c, seed, x, m->targets, &m->logits);
    off_device(g);
    m->global_step = dg_global_step(g);
    return dg_graph_ok(g);
}

// The blocks of stage k of S: [k L / S, (k + 1) L / S).
static int64_t first_block(const gpt_config *c, int k, int S) { return (int64_t)k * c->n_layer / S; }

int gpt_pipeline_stage(dg_graph *g, int stage, int mb, const dg_output *in, int n_in, dg_output *out, int cap,
                       void *arg) {
    (void)mb;
    const gpt_pipeline_arg *a = arg;
    const gpt_config *c = &a->c;
    if (n_in != 2 || cap < 2) {
        dg_graph_set_error(g, DG_INTERNAL, "gpt stage %d: %d inputs, not the activations and the targets", stage, n_in);
        return -1;
    }
    dg_output x = stage == 0 ? embed(g, c, a->seed, in[0], a->training) : in[0];
    int64_t l0 = first_block(c, stage, a->n_stages), l1 = first_block(c, stage + 1, a->n_stages);
    if (a->tp > 1) {
        // The stage's blocks split over devices 0 .. tp - 1 of its task (the pipeline's device
        // for the stage, a task: gpt_build_pipeline checks).
        char names[64][192];
        const char *devs[64];
        const char *task = a->devices[stage % a->n_devices];
        for (int r = 0; r < a->tp; r++) {
            snprintf(names[r], sizeof names[r], "%s/device:%s:%d", task, a->tp_device_type, r);
            devs[r] = names[r];
        }
        x = tp_blocks(g, c, a->seed, devs, a->tp, l0, l1, x);
    } else {
        for (int64_t l = l0; l < l1; l++) x = block(g, c, l, x, a->training, a->seed);
    }
    if (stage == a->n_stages - 1) {
        dg_output logits;
        out[0] = head(g, c, a->seed, x, in[1], &logits);
        return dg_graph_ok(g) ? 1 : -1;
    }
    out[0] = x;
    out[1] = in[1];   // the targets travel with the activations to the last stage
    return dg_graph_ok(g) ? 2 : -1;
}

// The mean over the groups' pipelines of each variable's gradient (the groups read the same
// variables, made by group 0's stages), on the variable's device, into p; frees the groups'.
static bool average_groups(dg_graph *g, dg_pipeline *pg, int groups, dg_pipeline *p, dg_status *st) {
    p->vars = malloc((size_t)(pg[0].n_vars + 1) * sizeof *p->vars);
    p->grads = malloc((size_t)(pg[0].n_vars + 1) * sizeof *p->grads);
    dg_output *terms = malloc((size_t)groups * sizeof *terms);
    bool ok = p->vars && p->grads && terms;
    if (!ok) dg_status_set(st, DG_RESOURCE_EXHAUSTED, "gpt pipeline groups: out of memory");
    for (int i = 0; ok && i < pg[0].n_vars; i++) {
        int n = 0;
        for (int gi = 0; gi < groups; gi++)
            for (int j = 0; j < pg[gi].n_vars; j++)
                if (pg[gi].vars[j].node == pg[0].vars[i].node) terms[n++] = pg[gi].grads[j];
        on_device(g, dg_node_requested_device(pg[0].vars[i].node));
        p->vars[i] = pg[0].vars[i];
        p->grads[i] = dg_mul(g, NULL, dg_add_n(g, NULL, terms, n), dg_scalar(g, NULL, DG_FLOAT32, 1.0 / groups));
        off_device(g);
    }
    if (ok) {
        p->n_vars = pg[0].n_vars;
        p->n_stages = pg[0].n_stages;
    }
    free(terms);
    for (int gi = 0; gi < groups; gi++) dg_pipeline_free(&pg[gi]);
    return ok && dg_graph_check(g, st);
}

bool gpt_build_pipeline(dg_graph *g, const gpt_config *c, int64_t seed, const dg_pipeline_options *o, int groups,
                        gpt_pipeline_arg *arg, gpt_model *m, dg_pipeline *p, dg_status *st) {
    memset(m, 0, sizeof *m);
    memset(p, 0, sizeof *p);
    if (!check_config(g, c)) return dg_graph_check(g, st);
    const int S = o->n_devices * (o->chunks > 0 ? o->chunks : 1);
    if (c->wte_parts > 1 || S < 1 || S > c->n_layer || groups < 1 || groups > 16) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "gpt pipeline: %d stages of %lld blocks (at least one block a stage), "
                       "1 to 16 groups, and the token embedding in one part", S, (long long)c->n_layer);
        return false;
    }
    int tp = arg->tp > 1 ? arg->tp : 1;
    const char *tp_type = arg->tp_device_type && *arg->tp_device_type ? arg->tp_device_type : "CPU";
    if (tp > 1) {
        if (!tp_check(g, c, tp)) return dg_graph_check(g, st);
        // Each stage's shards are devices of its task: the stages' devices must be tasks.
        for (int k = 0; k < o->n_devices * groups; k++)
            if (strstr(o->devices[k], "/device:") || strstr(o->devices[k], "/cpu:") || strstr(o->devices[k], "/gpu:")) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "gpt pipeline: with tensor parallelism inside the stages, "
                               "each stage runs on a task (\"/job:ps/task:0\"), not on the device \"%s\"", o->devices[k]);
                return false;
            }
    }
    const int64_t T = c->block_size;
    m->idx = dg_placeholder(g, "idx", DG_INT32, dg_shape2(-1, T));
    m->targets = dg_placeholder(g, "targets", DG_INT32, dg_shape2(-1, T));
    m->training = dg_placeholder(g, "training", DG_BOOL, dg_shape_scalar());
    *arg = (gpt_pipeline_arg){*c, seed, S, m->training, tp, tp_type, o->devices, o->n_devices};
    dg_pipeline_options po = *o;
    po.stage_fn = gpt_pipeline_stage;
    po.arg = arg;
    dg_output batch[2] = {m->idx, m->targets};
    if (groups == 1) {
        if (!dg_pipeline_build(g, &po, batch, 2, p, st)) return false;
        m->loss = p->loss;
    } else {
        // Data parallelism across groups: group i gets the i-th part of the batch and its own
        // devices (o->devices holds every group's, group by group); the groups share group 0's
        // variables, and their gradients are averaged where each variable lives.
        dg_output idx[16], tgt[16], losses[16];
        dg_pipeline pg[16];
        gpt_pipeline_arg group_arg[16];   // each group's stage devices (the build reads them)
        memset(pg, 0, sizeof pg);
        dg_split(g, "group_idx", m->idx, 0, groups, idx);
        dg_split(g, "group_targets", m->targets, 0, groups, tgt);
        bool ok = dg_graph_check(g, st);
        for (int gi = 0; ok && gi < groups; gi++) {
            char name[32];
            snprintf(name, sizeof name, gi == 0 ? "pipeline" : "pipeline_g%d", gi);
            po.name = name;
            po.devices = o->devices + (size_t)gi * (size_t)o->n_devices;
            group_arg[gi] = *arg;
            group_arg[gi].devices = po.devices;
            po.arg = &group_arg[gi];
            dg_output b[2] = {idx[gi], tgt[gi]};
            ok = dg_pipeline_build(g, &po, b, 2, &pg[gi], st);
            losses[gi] = pg[gi].loss;
        }
        if (!ok) {
            for (int gi = 0; gi < groups; gi++) dg_pipeline_free(&pg[gi]);
            return false;
        }
        m->loss = dg_mul(g, "loss", dg_add_n(g, NULL, losses, groups), dg_scalar(g, NULL, DG_FLOAT32, 1.0 / groups));
        if (!average_groups(g, pg, groups, p, st)) {
            dg_pipeline_free(p);
            return false;
        }
    }
    m->global_step = dg_global_step(g);
    return dg_graph_check(g, st);
}

static dg_output mlp_half(dg_graph *g, const char *layer, dg_output x, const gpt_config *c, dg_output training,
                          int64_t s, double std, double proj_std) {
    const int64_t C = c->n_embd;
    dg_output h = dg_gelu(g, NULL, linear(g, layer, "fc", layer_norm(g, layer, "ln_2", x, C), C, 4 * C, std, s + 3), false);
    h = linear(g, layer, "mlp_proj", h, 4 * C, C, proj_std, s + 4);
    return dg_add(g, NULL, x, dropout(g, h, c, training, s + 5));
}

bool gpt_build_decoder(dg_graph *g, const gpt_config *c, gpt_decoder *d) {
    memset(d, 0, sizeof *d);
    if (c->n_head < 1 || c->n_embd % c->n_head != 0 || c->n_layer < 0 || c->n_layer > GPT_MAX_LAYERS ||
        c->block_size < 1 || c->vocab < 1) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "gpt decoder: n_embd %lld must be a multiple of n_head %lld, "
                           "n_layer at most %d", (long long)c->n_embd, (long long)c->n_head, GPT_MAX_LAYERS);
        return false;
    }
    const int64_t C = c->n_embd, H = c->n_head, Dh = C / H, T = c->block_size;
    const int64_t one_c[2] = {1, C}, heads1[4] = {1, H, 1, Dh};
    d->tok = dg_placeholder(g, "decode_token", DG_INT32, dg_shape1(1));
    d->pos = dg_placeholder(g, "decode_position", DG_INT32, dg_shape1(1));
    dg_output off = dg_scalar(g, NULL, DG_BOOL, 0);   // dropout off
    dg_output parts[DG_MAX_PARTITIONS];
    int n_parts = 0;
    dg_output wte = token_table(g, c, 0.02, 0, parts, &n_parts), wpe = weight(g, "wpe", T, C, 0.02, 0);
    if (!dg_graph_ok(g)) return false;
    dg_output x = dg_add(g, NULL, dg_gather(g, NULL, wte, d->tok), dg_gather(g, NULL, wpe, d->pos));   // [1, C]
    for (int64_t l = 0; l < c->n_layer; l++) {
        char layer[32], pk[48], pv[48];
        snprintf(layer, sizeof layer, "h%lld", (long long)l);
        snprintf(pk, sizeof pk, "decode_past_k%lld", (long long)l);
        snprintf(pv, sizeof pv, "decode_past_v%lld", (long long)l);
        d->past_k[l] = dg_placeholder(g, pk, DG_FLOAT32, dg_shape_make(4, (const int64_t[]){1, H, -1, Dh}));
        d->past_v[l] = dg_placeholder(g, pv, DG_FLOAT32, dg_shape_make(4, (const int64_t[]){1, H, -1, Dh}));
        dg_output qkv = linear(g, layer, "attn", layer_norm(g, layer, "ln_1", x, C), C, 3 * C, 0.02, 0);
        dg_output part[3];
        dg_split(g, NULL, qkv, 1, 3, part);
        // One position: [1, C] is [1, H, 1, Dh] as it lies (each head's Dh values together).
        dg_output q = dg_reshape(g, NULL, part[0], heads1, 4);
        d->new_k[l] = dg_reshape(g, NULL, part[1], heads1, 4);
        d->new_v[l] = dg_reshape(g, NULL, part[2], heads1, 4);
        dg_output ks[2] = {d->past_k[l], d->new_k[l]}, vs[2] = {d->past_v[l], d->new_v[l]};
        // The new position sees every cached one and itself.
        dg_output a = dg_attention(g, NULL, q, dg_concat(g, NULL, ks, 2, 2), dg_concat(g, NULL, vs, 2, 2), false, 0);
        a = linear(g, layer, "attn_proj", dg_reshape(g, NULL, a, one_c, 2), C, C, 0.02, 0);
        x = mlp_half(g, layer, dg_add(g, NULL, x, a), c, off, 0, 0.02, 0.02);
    }
    x = layer_norm(g, "", "ln_f", x, C);
    d->logits = dg_matmul(g, "decode_logits", x, wte, false, true);
    return dg_graph_ok(g);
}

// ---- the text ----

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

bool gpt_text_load(const char *dir, uint64_t seed, gpt_text *t, dg_status *st) {
    memset(t, 0, sizeof *t);
    DIR *d = opendir(dir);
    if (!d) {
        dg_status_setf(st, DG_NOT_FOUND, "%s: %s (Debian's fortunes package: apt-get install fortunes)", dir,
                       strerror(errno));
        return false;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strchr(e->d_name, '.')) continue;   // ".", "..", the .dat indexes, the .u8 links
        char path[4096];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;   // fortunes-off's off/, say
        if (n == cap && !(names = realloc(names, (cap = cap ? 2 * cap : 64) * sizeof *names))) abort();
        if (!(names[n++] = strdup(e->d_name))) abort();
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    size_t len = 0, tcap = 0;
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        FILE *f = fopen(path, "rb");
        if (!f) {
            dg_status_setf(st, DG_NOT_FOUND, "%s: %s", path, strerror(errno));
            ok = false;
            break;
        }
        uint8_t buf[65536];
        size_t r;
        while ((r = fread(buf, 1, sizeof buf, f)) > 0) {
            if (len + r > tcap && !(t->bytes = realloc(t->bytes, tcap = 2 * (len + r)))) abort();
            memcpy(t->bytes + len, buf, r);
            len += r;
        }
        if (ferror(f)) {
            dg_status_setf(st, DG_DATA_LOSS, "%s: a read failed", path);
            ok = false;
        }
        fclose(f);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    if (ok && len < 1000) {
        dg_status_setf(st, DG_NOT_FOUND, "%s: %zu bytes of fortunes in %zu files: too little to train on", dir, len, n);
        ok = false;
    }
    if (!ok) {
        gpt_text_free(t);
        return false;
    }
    t->n = (int64_t)len;
    t->n_train = (int64_t)len * 9 / 10;
    t->rng = seed * 0x9E3779B97F4A7C15ull + 1;
    return true;
}

void gpt_text_free(gpt_text *t) {
    free(t->bytes);
    memset(t, 0, sizeof *t);
}

uint64_t gpt_next_u64(uint64_t *s) {   // xorshift64*
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

void gpt_text_batch(gpt_text *t, int64_t batch, int64_t T, int32_t *x, int32_t *y) {
    uint64_t span = (uint64_t)(t->n_train - T - 1);
    for (int64_t b = 0; b < batch; b++) {
        int64_t off = (int64_t)(gpt_next_u64(&t->rng) % span);
        for (int64_t i = 0; i < T; i++) {
            x[b * T + i] = t->bytes[off + i];
            y[b * T + i] = t->bytes[off + i + 1];
        }
    }
}

int64_t gpt_text_val_offset(const gpt_text *t, int64_t k, int64_t n, int64_t T) {
    int64_t span = t->n - t->n_train - T - 1;
    return t->n_train + (n > 1 ? k * span / (n - 1) : 0);
}

bool gpt_validation_loss(dg_session *s, const gpt_model *m, const gpt_text *t, int64_t n_windows, int64_t batch,
                         int64_t T, double *loss, dg_status *st) {
    int32_t *x = malloc((size_t)(batch * T) * sizeof *x), *y = malloc((size_t)(batch * T) * sizeof *y);
    dg_tensor *off = model_training_value(false, st);
    bool ok = x && y && off;
    if (!x || !y) dg_status_set(st, DG_RESOURCE_EXHAUSTED, "gpt: the validation batch buffers");
    double sum = 0;
    for (int64_t k0 = 0; ok && k0 < n_windows; k0 += batch) {
        int64_t b = n_windows - k0 < batch ? n_windows - k0 : batch;
        for (int64_t j = 0; j < b; j++) {
            int64_t o = gpt_text_val_offset(t, k0 + j, n_windows, T);
            for (int64_t i = 0; i < T; i++) {
                x[j * T + i] = t->bytes[o + i];
                y[j * T + i] = t->bytes[o + i + 1];
            }
        }
        dg_tensor *xt = dg_tensor_from_data(DG_INT32, dg_shape2(b, T), x, st);
        dg_tensor *yt = xt ? dg_tensor_from_data(DG_INT32, dg_shape2(b, T), y, st) : NULL, *out = NULL;
        dg_output feeds[3] = {m->idx, m->targets, m->training};
        dg_tensor *vals[3] = {xt, yt, off};
        ok = yt && dg_session_run(s, feeds, vals, 3, &m->loss, &out, 1, NULL, 0, st);
        if (ok) sum += dg_tensor_f32(out)[0] * (double)b;
        dg_tensor_unref(out);
        dg_tensor_unref(xt);
        dg_tensor_unref(yt);
    }
    free(x);
    free(y);
    dg_tensor_unref(off);
    if (ok) *loss = sum / (double)n_windows;
    return ok;
}
