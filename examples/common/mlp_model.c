#include "mlp_model.h"

#include <math.h>
#include <string.h>

bool mlp_build_net(dg_graph *g, int64_t pixels, int64_t hidden, int64_t seed, mlp_model *m) {
    memset(m, 0, sizeof *m);
    m->x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(-1, pixels));
    m->y_ = dg_placeholder(g, "y_", DG_INT64, dg_shape1(-1));
    dg_output hid_w = dg_variable(g, "hid_w", DG_FLOAT32, dg_shape2(pixels, hidden),
                                  dg_init_truncated_normal(0, 1.0 / sqrt((double)pixels), seed));
    dg_output hid_b = dg_variable(g, "hid_b", DG_FLOAT32, dg_shape1(hidden), dg_init_zeros());
    dg_output sm_w = dg_variable(g, "sm_w", DG_FLOAT32, dg_shape2(hidden, 10),
                                 dg_init_truncated_normal(0, 1.0 / sqrt((double)hidden), seed + 1));
    dg_output sm_b = dg_variable(g, "sm_b", DG_FLOAT32, dg_shape1(10), dg_init_zeros());
    dg_output hid = dg_relu(g, "hid", dg_bias_add(g, "hid_lin", dg_matmul(g, NULL, m->x, hid_w, false, false), hid_b));
    m->logits = dg_bias_add(g, "logits", dg_matmul(g, NULL, hid, sm_w, false, false), sm_b);
    m->loss = dg_sparse_softmax_cross_entropy(g, "cross_entropy", m->logits, m->y_);
    m->global_step = dg_global_step(g);
    dg_output correct = dg_equal(g, "correct", dg_argmax(g, NULL, m->logits, 1), m->y_);
    m->accuracy = dg_mean(g, "accuracy", dg_cast(g, NULL, correct, DG_FLOAT32), NULL, 0, false);
    return dg_graph_ok(g);
}

dg_optimizer model_adam(dg_graph *g, const mlp_model *m, double lr) {
    dg_optimizer opt = dg_adam(g, lr);
    if (m->learning_rate.node) opt.learning_rate_tensor = m->learning_rate;
    return opt;
}

bool cnn_build_net(dg_graph *g, double lr, int64_t seed, mlp_model *m) {
    memset(m, 0, sizeof *m);
    m->x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(-1, 784));
    m->y_ = dg_placeholder(g, "y_", DG_INT64, dg_shape1(-1));
    m->training = dg_placeholder(g, "training", DG_BOOL, dg_shape_scalar());
    int64_t img[4] = {-1, 28, 28, 1};
    dg_output h = dg_reshape(g, "images", m->x, img, 4);
    h = dg_conv2d_layer(g, "conv1", h, 16, 5, 5, 1, DG_PADDING_SAME, DG_ACT_RELU, dg_init_glorot_uniform(seed));
    h = dg_max_pool(g, "pool1", h, 2, 2, 2, 2, DG_PADDING_VALID);
    h = dg_conv2d_layer(g, "conv2", h, 32, 5, 5, 1, DG_PADDING_SAME, DG_ACT_RELU, dg_init_glorot_uniform(seed + 1));
    h = dg_max_pool(g, "pool2", h, 2, 2, 2, 2, DG_PADDING_VALID);
    h = dg_dense(g, "dense", dg_flatten(g, NULL, h), 128, DG_ACT_RELU, dg_init_glorot_uniform(seed + 2));
    h = dg_dropout(g, "dropout", h, 0.25, m->training, seed + 3);
    m->logits = dg_dense(g, "logits", h, 10, DG_ACT_NONE, dg_init_glorot_uniform(seed + 4));
    m->loss = dg_sparse_softmax_cross_entropy(g, "cross_entropy", m->logits, m->y_);
    m->global_step = dg_global_step(g);
    m->learning_rate = dg_exponential_decay(g, lr, m->global_step, 500, 0.95);
    dg_output correct = dg_equal(g, "correct", dg_argmax(g, NULL, m->logits, 1), m->y_);
    m->accuracy = dg_mean(g, "accuracy", dg_cast(g, NULL, correct, DG_FLOAT32), NULL, 0, false);
    return dg_graph_ok(g);
}

bool mlp_build(dg_graph *g, int64_t pixels, int64_t hidden, double lr, int64_t seed, mlp_model *m,
               dg_status *st) {
    mlp_build_net(g, pixels, hidden, seed, m);
    dg_optimizer opt = dg_adam(g, lr);
    m->train = dg_optimizer_minimize(&opt, m->loss, m->global_step);
    m->init = dg_global_variables_initializer(g);
    return dg_graph_check(g, st);
}

dg_tensor *model_training_value(bool on, dg_status *st) {
    dg_tensor *t = dg_tensor_new(DG_BOOL, dg_shape_scalar(), st);
    if (t) *(uint8_t *)dg_tensor_data(t) = on;
    return t;
}

bool mlp_evaluate(dg_session *s, const mlp_model *m, const float *images, const int64_t *labels,
                  int64_t n, int64_t dim, int64_t batch, double *loss, double *acc, dg_status *st) {
    double sum_loss = 0, sum_acc = 0;
    for (int64_t off = 0; off < n; off += batch) {
        int64_t b = n - off < batch ? n - off : batch;
        dg_tensor *xt = dg_tensor_wrap(DG_FLOAT32, dg_shape2(b, dim), (void *)(images + off * dim),
                                       (size_t)(b * dim) * sizeof(float), NULL, NULL, st);
        dg_tensor *yt = dg_tensor_wrap(DG_INT64, dg_shape1(b), (void *)(labels + off),
                                       (size_t)b * sizeof(int64_t), NULL, NULL, st);
        if (!xt || !yt) {
            dg_tensor_unref(xt);
            dg_tensor_unref(yt);
            return false;
        }
        dg_tensor *off_t = m->training.node ? model_training_value(false, st) : NULL;
        dg_output feeds[3] = {m->x, m->y_, m->training};
        dg_tensor *vals[3] = {xt, yt, off_t};
        dg_output fetches[2] = {m->loss, m->accuracy};
        dg_tensor *out[2] = {NULL, NULL};
        bool ok = dg_session_run(s, feeds, vals, off_t ? 3 : 2, fetches, out, 2, NULL, 0, st);
        dg_tensor_unref(xt);
        dg_tensor_unref(yt);
        dg_tensor_unref(off_t);
        if (!ok) return false;
        sum_loss += dg_tensor_f32(out[0])[0] * (double)b;
        sum_acc += dg_tensor_f32(out[1])[0] * (double)b;
        dg_tensor_unref(out[0]);
        dg_tensor_unref(out[1]);
    }
    *loss = sum_loss / (double)n;
    *acc = sum_acc / (double)n;
    return true;
}
