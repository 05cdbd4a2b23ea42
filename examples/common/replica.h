/* The training program shared by the replica examples (replica.c): mnist_replica and
 * cnn_replica (mnist_replica_model.c) and gpt_replica (gpt_replica.c). replica.c does the
 * cluster, the server, the strategy (asynchronous ps, --sync_replicas, --all_reduce), the
 * monitored session and its hooks, and the training loop; a replica_model says what is trained:
 * its flags, its data, its network, its batches and its evaluation. */
#ifndef DG_REPLICA_H
#define DG_REPLICA_H

#include <stdbool.h>
#include <stdint.h>

#include "distgraph/distgraph.h"
#include "flags.h"

// What a model's build gives replica.c.
typedef struct replica_net {
    dg_output loss;          // the scalar to minimize (also the "loss" summary)
    dg_output global_step;
    dg_optimizer opt;        // its optimizer (the strategy wraps it)
    bool log_loss;           // the progress lines give the step's loss
    // A model that computes its own gradients (a pipeline over the ps tasks: gpt_replica
    // --pipeline_stages) sets them here, n_grads > 0 (borrowed, alive until the graph is run):
    // replica.c applies them with opt, with one worker and no strategy, or with --all_reduce (a
    // pipeline in each worker: the gradients averaged over the workers, then applied);
    // --sync_replicas and --elastic are refused, and so is --all_reduce with fp16. Under --mixed_precision fp16 replica.c sets
    // want_loss_scale and loss_factor (the forced-overflow factor, a float32 placeholder) before
    // the build; such a model then makes ls (dg_loss_scale_make, the default options) and scales
    // its losses by ls.scale times loss_factor, and replica.c applies the gradients through
    // dg_optimizer_apply_gradients_with_loss_scale.
    const dg_output *grads, *vars;
    int n_grads;
    bool want_loss_scale;
    dg_output loss_factor;
    dg_loss_scale ls;
    // Set before the model's build: this worker's task ("/job:worker/task:N"), for a model that
    // places its own devices (gpt_replica --tensor_parallel: the task's CPUs or GPUs), and
    // whether the replica device setter puts the variables on ps tasks.
    const char *task_device;
    bool variables_on_ps;
} replica_net;

typedef struct replica_model {
    const char *name;        // the program, in messages
    const char *usage;       // the first line of --help
    const char *what;        // in "... runs only ps and worker tasks", e.g. "MNIST-replica"
    int64_t train_steps;     // defaults of the flags
    int64_t batch_size;
    double learning_rate;
    const char *lr_help;     // --learning_rate's help
    const flag_def *flags;   // the model's own flags (targets in its state), n_flags of them
    int n_flags;
    void *state;
    // Checks the model's flags once parsed (batch_size included). false: the message is printed.
    bool (*check_flags)(void *state, int64_t batch_size);
    // Loads the data of this worker, its batches shuffled by seed. false with st set.
    bool (*load)(void *state, int64_t seed, dg_status *st);
    // Builds the network and its optimizer into g (the device scope or function is pushed), for
    // train_steps global steps (a schedule's length).
    bool (*build)(void *state, dg_graph *g, double learning_rate, int64_t seed, int64_t train_steps, replica_net *net,
                  dg_status *st);
    // The next training batch: its feeds and values (owned by the model, at most cap), returns
    // how many; -1 with st set on failure.
    int (*next_batch)(void *state, dg_output *feeds, dg_tensor **vals, int cap, dg_status *st);
    // Optional (NULL: none): called once on a worker, right after its monitored session ms
    // exists (the chief has restored or initialized the variables), with this worker's index, the
    // cluster's number of workers and --checkpoint_path ("" when none): where a model that reads
    // its batches through a dataset makes its iterator, takes its worker's shard, attaches it to
    // the chief's saver and restores its position (examples/common/replica_input.h). false with
    // st set.
    bool (*after_session)(void *state, dg_monitored_session *ms, int64_t task, int n_workers,
                          const char *checkpoint_path, dg_status *st);
    // Optional (NULL: none): a failed training step's status, to say more of it before it is
    // printed (gpt_replica names the pipeline stage whose task failed).
    void (*explain_failure)(void *state, dg_status *st);
    // After training, on this worker: evaluates and prints the result lines.
    bool (*evaluate)(void *state, dg_session *s, int64_t task, int64_t global_step, dg_status *st);
    void (*free)(void *state);   // the data and buffers (the graph is freed by replica.c)
} replica_model;

// Runs one task (ps or worker) of the program with its command line; returns the exit status.
int replica_main(int argc, char **argv, const replica_model *m);

// mnist_replica and cnn_replica (mnist_replica_model.c): the MLP or the CNN on Fashion-MNIST.
int mnist_replica_main(int argc, char **argv, const char *name, bool cnn, int64_t train_steps, double learning_rate);

#endif
