/* cnn_replica: MNIST-replica's between-graph replicated training (examples/mnist_replica.c,
 * every flag and mode of it: asynchronous with ps tasks, --sync_replicas, --all_reduce,
 * checkpoints, recovery, --num_gpus) with a small LeNet-style convolutional network instead of
 * the MLP: x [?, 784] seen as 28x28x1 images; conv 5x5 -> 16, ReLU, max pool 2x2; conv 5x5 ->
 * 32, ReLU, max pool 2x2; dense 128, ReLU; dropout 0.25 while training; dense 10 logits
 * (examples/common/mlp_model.c, cnn_build_net). Adam at 0.001, decaying by 0.95 every 500
 * global steps (tf.train.exponential_decay); 4000 global steps by default. On Fashion-MNIST it
 * reaches about 0.90 to 0.91 test accuracy (the MLP: about 0.86).
 *   build/bin/dg-launch --ps 1 --workers 2 -- build/bin/cnn_replica
 *   build/bin/dg-launch --ps 1 --workers 2 -- build/bin/cnn_replica --sync_replicas
 * A saved graph (--save_graph) and the chief's checkpoint serve examples/inference.c, which
 * feeds the graph's "training" placeholder false. */
#include "replica.h"

int main(int argc, char **argv) { return mnist_replica_main(argc, argv, "cnn_replica", true, 4000, 0.001); }
