/* A small --flag=value / --flag value parser for the examples and tools. */
#ifndef DG_FLAGS_H
#define DG_FLAGS_H

#include <stdbool.h>
#include <stdint.h>

typedef enum flag_kind { FLAG_INT, FLAG_DOUBLE, FLAG_STRING, FLAG_BOOL } flag_kind;

typedef struct flag_def {
    const char *name;     // without dashes
    flag_kind kind;
    void *target;         // int64_t*, double*, const char**, bool*
    const char *help;
} flag_def;

// Parses argv. On an unknown flag or a bad value prints the problem to stderr (one line,
// naming the program) and returns false: exit 2. --help prints the usage with every flag's
// default (its value before parsing) to stdout, --version the distgraph version; both set
// *help: exit 0.
bool flags_parse(int argc, char **argv, const flag_def *defs, int n_defs, const char *usage, bool *help);

#endif
