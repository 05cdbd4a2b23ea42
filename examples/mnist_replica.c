/* mnist_replica: between-graph replicated training with parameter servers, as TensorFlow's
 * mnist_replica.py. Each worker process builds the model under the replica device setter
 * (variables on the ps tasks, compute on its own task), worker 0 (the chief) initializes the
 * variables, the others wait for it, and all train asynchronously until the global step
 * reaches --train_steps. The ps tasks only serve. Training runs under the monitored session:
 * with --checkpoint_path the chief saves checkpoints (every --save_checkpoint_steps and at the
 * end) and restores the newest one when started again, and every worker recreates its session
 * when a ps or worker restarts (the chief then restores the newest checkpoint).
 * With --sync_replicas the workers train synchronously (TensorFlow's SyncReplicasOptimizer):
 * each step averages --replicas_to_aggregate gradients (default: every worker's; fewer makes
 * the slowest workers backups), the chief applies them, and training ends at --train_steps
 * exactly; a step missing gradients for --sync_timeout_ms fails naming the missing workers.
 * With --all_reduce there is no ps (TensorFlow's MultiWorkerMirroredStrategy): every worker
 * holds the variables, one all-reduce averages the gradients each step, and all apply the same
 * update; worker 0 checkpoints, and broadcasts its values after every session creation.
 * --num_gpus N pins worker i's compute to its GPU i % N (soft placement falls back to the CPU).
 * With --existing_servers the program starts no server: the cluster's tasks are standing
 * dg-server processes, and each worker program trains through the master service of its own
 * worker task (dg://its worker host), as TensorFlow's mnist_replica.py --existing_servers.
 *   build/bin/dg-launch --ps 1 --workers 2 -- build/bin/mnist_replica --train_steps 2000
 *   build/bin/dg-launch --ps 1 --workers 2 -- build/bin/mnist_replica --sync_replicas */
#include "replica.h"

int main(int argc, char **argv) { return mnist_replica_main(argc, argv, "mnist_replica", false, 2000, 0.01); }
