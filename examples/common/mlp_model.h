/* The classic MNIST-replica model (784 -> hidden ReLU -> 10, softmax cross entropy, Adam),
 * shared by the examples and benchmarks so they train exactly the same graph. */
#ifndef DG_MLP_MODEL_H
#define DG_MLP_MODEL_H

#include "distgraph/distgraph.h"

typedef struct mlp_model {
    dg_output x;          // float32 [?, pixels]
    dg_output y_;         // int64 [?]
    dg_output logits;     // float32 [?, 10]
    dg_output loss;       // mean cross entropy
    dg_output accuracy;   // fraction of argmax(logits) == y_
    dg_output global_step;
    dg_output training;   // bool scalar: dropout on (the CNN's; null output for the MLP)
    dg_output learning_rate;   // the CNN's decaying schedule (null output: a constant)
    dg_node *train;       // one Adam step, increments global_step
    dg_node *init;        // runs every initializer
} mlp_model;

// Builds the network without its training: placeholders, variables, logits, loss, accuracy
// and the global step (train and init stay NULL). Returns dg_graph_ok(g).
bool mlp_build_net(dg_graph *g, int64_t pixels, int64_t hidden, int64_t seed, mlp_model *m);

// Builds the model into g under whatever device scopes or functions are pushed.
// Returns false with st set (the graph's sticky error) on failure.
bool mlp_build(dg_graph *g, int64_t pixels, int64_t hidden, double learning_rate, int64_t seed,
               mlp_model *m, dg_status *st);

// The CNN of cnn_replica (cnn_model.c): x [?, 784] seen as 28x28x1 images; conv 5x5 -> 16
// ReLU, max pool 2x2, conv 5x5 -> 32 ReLU, max pool 2x2, dense 128 ReLU, dropout 0.25 (when
// m->training is fed true), dense 10; Glorot uniform kernels, zero biases. The learning rate
// (m->learning_rate) decays as lr * 0.95^(global_step / 500). Same fields as the MLP, whose
// training code (mnist_replica's) it shares.
bool cnn_build_net(dg_graph *g, double learning_rate, int64_t seed, mlp_model *m);

// The optimizer of either model: Adam at its learning rate (the schedule when it has one).
dg_optimizer model_adam(dg_graph *g, const mlp_model *m, double learning_rate);

// A bool scalar tensor to feed m->training. Returns: new; NULL with st set.
dg_tensor *model_training_value(bool on, dg_status *st);

// Evaluates loss and accuracy over n examples in batches of `batch` (dropout off).
bool mlp_evaluate(dg_session *s, const mlp_model *m, const float *images, const int64_t *labels,
                  int64_t n, int64_t dim, int64_t batch, double *loss, double *acc, dg_status *st);

#endif
