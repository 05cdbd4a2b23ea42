/* The models of place_models.h. Weights are small random values: these graphs are for
 * placement and timing, trained only to show that a placed graph runs. */
#include "place_models.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

place_model_config place_model_default(place_model_kind kind) {
    place_model_config c = {kind, 0, 0, 0, 0, 0};
    switch (kind) {
    case PLACE_INCEPTION: c = (place_model_config){kind, 32, 11, 35, 0, 192}; break;
    case PLACE_GNMT: c = (place_model_config){kind, 128, 4, 40, 30000, 512}; break;
    case PLACE_TRANSFORMER: c = (place_model_config){kind, 8, 12, 512, 32000, 768}; break;
    }
    return c;
}

const char *place_model_name(place_model_kind kind) {
    return kind == PLACE_INCEPTION ? "inception" : kind == PLACE_GNMT ? "gnmt" : "transformer";
}

int place_model_units(const place_model_config *c) {
    switch (c->kind) {
    case PLACE_INCEPTION: return (int)c->layers + 2;        // stem, modules, head
    case PLACE_GNMT: return 2 * (int)c->layers + 1;         // encoder layers, decoder layers, softmax
    case PLACE_TRANSFORMER: return (int)c->layers + 2;      // embedding, blocks, head
    }
    return 1;
}

int place_model_expert_device(const place_model_config *c, int unit, int n_devices) {
    int n = place_model_units(c), L = (int)c->layers;
    if (c->kind == PLACE_GNMT) {
        // Encoder layer l and decoder layer l on device l (mod the devices); with at least
        // 2L devices the decoder's on the second half. Attention and softmax with the last.
        if (unit == n - 1) return n_devices - 1;
        int layer = unit % L;
        bool dec = unit >= L;
        if (n_devices >= 2 * L) return dec ? L + layer : layer;
        return layer * n_devices / L;
    }
    return unit * n_devices / n;
}

typedef struct builder {
    dg_graph *g;
    const char *(*dev)(void *, int);
    void *ctx;
    uint64_t seed;
} builder;

static void unit_begin(builder *b, int unit) {
    const char *d = b->dev ? b->dev(b->ctx, unit) : NULL;
    dg_graph_push_device(b->g, d ? d : "");
}

static void unit_end(builder *b) { dg_graph_pop_device(b->g); }

static dg_output weight(builder *b, const char *name, dg_shape s) {
    return dg_variable(b->g, name, DG_FLOAT32, s, dg_init_random_normal(0, 0.02, (int64_t)(b->seed++)));
}

static dg_output zeros(builder *b, const char *name, int64_t n) {
    return dg_variable(b->g, name, DG_FLOAT32, dg_shape1(n), dg_init_zeros());
}

// ---- Inception ----

static dg_output conv(builder *b, const char *scope, const char *name, dg_output x, int k, int64_t out) {
    char n[96];
    int64_t in = dg_output_shape(x).dims[3];
    int64_t fd[4] = {k, k, in, out};
    snprintf(n, sizeof n, "%s/%s/w", scope, name);
    dg_output w = weight(b, n, dg_shape_make(4, fd));
    snprintf(n, sizeof n, "%s/%s/b", scope, name);
    dg_output bias = zeros(b, n, out);
    return dg_relu(b->g, NULL, dg_bias_add(b->g, NULL, dg_conv2d(b->g, NULL, x, w, 1, 1, DG_PADDING_SAME), bias));
}

static dg_output inception(builder *b, const place_model_config *c, dg_output images, dg_output labels) {
    int u = 0;
    unit_begin(b, u++);
    dg_output x = conv(b, "stem", "conv", images, 3, c->units);
    unit_end(b);
    for (int64_t m = 0; m < c->layers; m++) {
        char s[32];
        snprintf(s, sizeof s, "mixed_%lld", (long long)m);
        unit_begin(b, u++);
        dg_output br[4];
        br[0] = conv(b, s, "b1x1", x, 1, 64);
        br[1] = conv(b, s, "b3x3", conv(b, s, "b3x3_reduce", x, 1, 48), 3, 64);
        br[2] = conv(b, s, "b3x3dbl_2", conv(b, s, "b3x3dbl_1", conv(b, s, "b3x3dbl_reduce", x, 1, 64), 3, 96), 3, 96);
        br[3] = conv(b, s, "pool_proj", dg_avg_pool(b->g, NULL, x, 3, 3, 1, 1, DG_PADDING_SAME), 1, 32);
        x = dg_concat(b->g, NULL, br, 4, 3);   // 256 channels
        unit_end(b);
    }
    unit_begin(b, u);
    const int64_t hw[2] = {1, 2};
    dg_output pooled = dg_mean(b->g, NULL, x, hw, 2, false);
    dg_output w = weight(b, "logits/w", dg_shape2(dg_output_shape(pooled).dims[1], 1000));
    dg_output logits = dg_bias_add(b->g, NULL, dg_matmul(b->g, NULL, pooled, w, false, false), zeros(b, "logits/b", 1000));
    dg_output loss = dg_mean(b->g, "loss", dg_sparse_softmax_cross_entropy(b->g, NULL, logits, labels), NULL, 0, false);
    unit_end(b);
    return loss;
}

// ---- GNMT ----

typedef struct lstm {
    dg_output w, bias;
} lstm;

static lstm lstm_new(builder *b, const char *name, int64_t in, int64_t units) {
    char n[64];
    lstm l;
    snprintf(n, sizeof n, "%s/kernel", name);
    l.w = weight(b, n, dg_shape2(in + units, 4 * units));
    snprintf(n, sizeof n, "%s/bias", name);
    l.bias = zeros(b, n, 4 * units);
    return l;
}

static void lstm_step(builder *b, const lstm *l, dg_output x, dg_output *h, dg_output *c) {
    dg_graph *g = b->g;
    dg_output xh[2] = {x, *h};
    dg_output z = dg_bias_add(g, NULL, dg_matmul(g, NULL, dg_concat(g, NULL, xh, 2, 1), l->w, false, false), l->bias);
    dg_output gate[4];
    dg_split(g, NULL, z, 1, 4, gate);
    dg_output i = dg_sigmoid(g, NULL, gate[0]), f = dg_sigmoid(g, NULL, gate[1]), o = dg_sigmoid(g, NULL, gate[3]);
    *c = dg_add(g, NULL, dg_mul(g, NULL, f, *c), dg_mul(g, NULL, i, dg_tanh(g, NULL, gate[2])));
    *h = dg_mul(g, NULL, o, dg_tanh(g, NULL, *c));
}

static dg_output gnmt(builder *b, const place_model_config *c) {
    dg_graph *g = b->g;
    int64_t B = c->batch, T = c->length, H = c->units, L = c->layers;
    dg_output src[4096], tgt[4096], lab[4096], top[4096];
    if (T > 4096) T = 4096;
    for (int64_t t = 0; t < T; t++) {
        char n[32];
        snprintf(n, sizeof n, "src_%lld", (long long)t);
        src[t] = dg_placeholder(g, n, DG_INT32, dg_shape1(B));
        snprintf(n, sizeof n, "tgt_%lld", (long long)t);
        tgt[t] = dg_placeholder(g, n, DG_INT32, dg_shape1(B));
        snprintf(n, sizeof n, "label_%lld", (long long)t);
        lab[t] = dg_placeholder(g, n, DG_INT32, dg_shape1(B));
    }
    dg_output zero = dg_placeholder(g, "zero_state", DG_FLOAT32, dg_shape2(B, H));
    // Encoder: layer by layer over time (unit l); its embedding with layer 0.
    dg_output in[4096];
    dg_output h[16], cs[16];
    if (L > 16) L = 16;
    for (int64_t l = 0; l < L; l++) {
        unit_begin(b, (int)l);
        char n[32];
        snprintf(n, sizeof n, "encoder/lstm_%lld", (long long)l);
        lstm cell = lstm_new(b, n, H, H);
        if (l == 0) {
            dg_output emb = weight(b, "encoder/embedding", dg_shape2(c->vocab, H));
            for (int64_t t = 0; t < T; t++) in[t] = dg_embedding_lookup(g, NULL, emb, src[t]);
        }
        h[l] = cs[l] = zero;
        for (int64_t t = 0; t < T; t++) {
            lstm_step(b, &cell, in[t], &h[l], &cs[l]);
            in[t] = h[l];
        }
        unit_end(b);
    }
    for (int64_t t = 0; t < T; t++) top[t] = in[t];
    // Decoder: layers L..2L-1, started from the encoder's final states; attention over the
    // encoder's top layer and the softmax in the last unit.
    unit_begin(b, (int)(2 * L));
    const int64_t bth[3] = {B, T, H};
    dg_output memory = dg_reshape(g, "attention/memory", dg_concat(g, NULL, top, (int)T, 1), bth, 3);
    dg_output w_att = weight(b, "attention/w", dg_shape2(2 * H, H));
    dg_output w_out = weight(b, "softmax/w", dg_shape2(H, c->vocab));
    dg_output b_out = zeros(b, "softmax/b", c->vocab);
    unit_end(b);
    dg_output dec_in[4096];
    for (int64_t l = 0; l < L; l++) {
        unit_begin(b, (int)(L + l));
        char n[32];
        snprintf(n, sizeof n, "decoder/lstm_%lld", (long long)l);
        lstm cell = lstm_new(b, n, H, H);
        if (l == 0) {
            dg_output emb = weight(b, "decoder/embedding", dg_shape2(c->vocab, H));
            for (int64_t t = 0; t < T; t++) dec_in[t] = dg_embedding_lookup(g, NULL, emb, tgt[t]);
        }
        dg_output hh = h[l], cc = cs[l];
        for (int64_t t = 0; t < T; t++) {
            lstm_step(b, &cell, dec_in[t], &hh, &cc);
            dec_in[t] = hh;
        }
        unit_end(b);
    }
    unit_begin(b, (int)(2 * L));
    const int64_t b1h[3] = {B, 1, H}, bh[2] = {B, H};
    dg_output losses[4096];
    for (int64_t t = 0; t < T; t++) {
        dg_output q = dg_reshape(g, NULL, dec_in[t], b1h, 3);
        dg_output score = dg_softmax(g, NULL, dg_batch_matmul(g, NULL, q, memory, false, true));
        dg_output ctx = dg_reshape(g, NULL, dg_batch_matmul(g, NULL, score, memory, false, false), bh, 2);
        dg_output hc[2] = {dec_in[t], ctx};
        dg_output att = dg_tanh(g, NULL, dg_matmul(g, NULL, dg_concat(g, NULL, hc, 2, 1), w_att, false, false));
        dg_output logits = dg_bias_add(g, NULL, dg_matmul(g, NULL, att, w_out, false, false), b_out);
        losses[t] = dg_mean(g, NULL, dg_sparse_softmax_cross_entropy(g, NULL, logits, lab[t]), NULL, 0, false);
    }
    dg_output loss = dg_add_n(g, "loss", losses, (int)T);
    unit_end(b);
    return loss;
}

// ---- transformer ----

static dg_output dense(builder *b, const char *scope, const char *name, dg_output x, int64_t out) {
    char n[96];
    int64_t in = dg_output_shape(x).dims[1];
    snprintf(n, sizeof n, "%s/%s/w", scope, name);
    dg_output w = weight(b, n, dg_shape2(in, out));
    snprintf(n, sizeof n, "%s/%s/b", scope, name);
    return dg_bias_add(b->g, NULL, dg_matmul(b->g, NULL, x, w, false, false), zeros(b, n, out));
}

static dg_output norm(builder *b, const char *scope, const char *name, dg_output x) {
    char n[96];
    int64_t C = dg_output_shape(x).dims[1];
    snprintf(n, sizeof n, "%s/%s/gamma", scope, name);
    dg_output gamma = dg_variable(b->g, n, DG_FLOAT32, dg_shape1(C), dg_init_ones());
    snprintf(n, sizeof n, "%s/%s/beta", scope, name);
    return dg_layer_norm(b->g, NULL, x, gamma, zeros(b, n, C), 1e-5);
}

static dg_output transformer(builder *b, const place_model_config *c) {
    dg_graph *g = b->g;
    int64_t B = c->batch, T = c->length, C = c->units, nh = C / 64 > 0 ? C / 64 : 1, L = c->layers;
    dg_output idx = dg_placeholder(g, "idx", DG_INT32, dg_shape1(B * T));
    dg_output targets = dg_placeholder(g, "targets", DG_INT32, dg_shape1(B * T));
    unit_begin(b, 0);
    dg_output wte = weight(b, "wte", dg_shape2(c->vocab, C));
    dg_output wpe = weight(b, "wpe", dg_shape2(T, C));
    const int64_t btc[3] = {B, T, C}, bt_c[2] = {B * T, C};
    dg_output x = dg_reshape(g, NULL, dg_add(g, NULL, dg_reshape(g, NULL, dg_embedding_lookup(g, NULL, wte, idx), btc, 3), wpe),
                             bt_c, 2);
    unit_end(b);
    const int64_t heads_shape[4] = {B, T, nh, C / nh}, perm[4] = {0, 2, 1, 3};
    for (int64_t l = 0; l < L; l++) {
        char s[32];
        snprintf(s, sizeof s, "h%lld", (long long)l);
        unit_begin(b, (int)(l + 1));
        dg_output qkv = dense(b, s, "attn", norm(b, s, "ln_1", x), 3 * C), part[3], hd[3];
        dg_split(g, NULL, qkv, 1, 3, part);
        for (int k = 0; k < 3; k++) hd[k] = dg_transpose(g, NULL, dg_reshape(g, NULL, part[k], heads_shape, 4), perm, 4);
        dg_output a = dg_attention(g, NULL, hd[0], hd[1], hd[2], true, 0);
        a = dg_reshape(g, NULL, dg_transpose(g, NULL, a, perm, 4), bt_c, 2);
        x = dg_add(g, NULL, x, dense(b, s, "attn_proj", a, C));
        dg_output m = dense(b, s, "mlp_proj", dg_gelu(g, NULL, dense(b, s, "mlp_fc", norm(b, s, "ln_2", x), 4 * C), false), C);
        x = dg_add(g, NULL, x, m);
        unit_end(b);
    }
    unit_begin(b, (int)(L + 1));
    dg_output logits = dense(b, "head", "lm", norm(b, "head", "ln_f", x), c->vocab);
    dg_output loss = dg_mean(g, "loss", dg_sparse_softmax_cross_entropy(g, NULL, logits, targets), NULL, 0, false);
    unit_end(b);
    return loss;
}

dg_node *place_model_build(dg_graph *g, const place_model_config *c, const char *(*unit_device)(void *ctx, int unit),
                           void *ctx, dg_output *loss_out) {
    builder b = {g, unit_device, ctx, 7};
    dg_output loss = {NULL, 0};
    if (c->kind == PLACE_INCEPTION) {
        int64_t d[4] = {c->batch, c->length, c->length, c->units};
        dg_output images = dg_placeholder(g, "images", DG_FLOAT32, dg_shape_make(4, d));
        dg_output labels = dg_placeholder(g, "labels", DG_INT32, dg_shape1(c->batch));
        loss = inception(&b, c, images, labels);
    } else if (c->kind == PLACE_GNMT) {
        loss = gnmt(&b, c);
    } else {
        loss = transformer(&b, c);
    }
    if (!dg_graph_ok(g)) return NULL;
    dg_optimizer opt = dg_momentum(g, 0.01, 0.9, false);
    opt.colocate_gradients_with_ops = true;
    dg_node *train = dg_optimizer_minimize(&opt, loss, (dg_output){NULL, 0});
    if (!train || !dg_graph_ok(g)) return NULL;
    if (loss_out) *loss_out = loss;
    return train;
}

static int ptr_cmp(const void *a, const void *b) {
    const dg_node *x = *(dg_node *const *)a, *y = *(dg_node *const *)b;
    return x < y ? -1 : x > y;
}

dg_node **place_model_step_nodes(dg_graph *g, dg_node *const *targets, int n_targets, int *n_out) {
    int n = dg_graph_num_nodes(g);
    dg_node **sorted = malloc((size_t)n * sizeof *sorted), **stack = malloc((size_t)n * sizeof *stack);
    char *seen = calloc((size_t)n, 1);
    for (int i = 0; i < n; i++) sorted[i] = dg_graph_node(g, i);
    qsort(sorted, (size_t)n, sizeof *sorted, ptr_cmp);
    int top = 0;
#define VISIT(node)                                                                              \
    do {                                                                                         \
        dg_node *key_ = (node);                                                                  \
        dg_node **at_ = bsearch(&key_, sorted, (size_t)n, sizeof *sorted, ptr_cmp);              \
        if (at_ && !seen[at_ - sorted]) {                                                        \
            seen[at_ - sorted] = 1;                                                              \
            stack[top++] = key_;                                                                 \
        }                                                                                        \
    } while (0)
    for (int t = 0; t < n_targets; t++) VISIT(targets[t]);
    while (top > 0) {
        dg_node *x = stack[--top];
        for (int i = 0; i < dg_node_num_inputs(x); i++) VISIT(dg_node_input(x, i).node);
        for (int i = 0; i < dg_node_num_control_inputs(x); i++) VISIT(dg_node_control_input(x, i));
    }
#undef VISIT
    int m = 0;
    for (int i = 0; i < n; i++) {
        dg_node *x = dg_graph_node(g, i);
        dg_node **at = bsearch(&x, sorted, (size_t)n, sizeof *sorted, ptr_cmp);
        if (seen[at - sorted]) stack[m++] = x;
    }
    free(sorted);
    free(seen);
    *n_out = m;
    return stack;
}
