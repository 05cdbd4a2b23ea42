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

bool mlp_build(dg_graph *g, int64_t pixels, int64_t hidden, double lr, int64_t seed, mlp_model *m,
               dg_status *st) {
    mlp_build_net(g, pixels, hidden, seed, m);
    dg_optimizer opt = dg_adam(g, lr);
    m->train = dg_optimizer_minimize(&opt, m->loss, m->global_step);
    m->init = dg_global_variables_initializer(g);
    return dg_graph_check(g, st);
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
        dg_output feeds[2] = {m->x, m->y_};
        dg_tensor *vals[2] = {xt, yt};
        dg_output fetches[2] = {m->loss, m->accuracy};
        dg_tensor *out[2] = {NULL, NULL};
        bool ok = dg_session_run(s, feeds, vals, 2, fetches, out, 2, NULL, 0, st);
        dg_tensor_unref(xt);
        dg_tensor_unref(yt);
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
