/* The training program shared by mnist_replica and cnn_replica (replica.c). */
#ifndef DG_REPLICA_H
#define DG_REPLICA_H

#include <stdbool.h>
#include <stdint.h>

typedef struct replica_program {
    const char *name;       // in messages
    const char *usage;      // the first line of --help
    bool cnn;               // the CNN of cnn_model (else the MLP)
    int64_t train_steps;    // defaults of the flags
    double learning_rate;
} replica_program;

// Runs one task (ps or worker) of the program with its command line; returns the exit status.
int replica_main(int argc, char **argv, const replica_program *p);

#endif
