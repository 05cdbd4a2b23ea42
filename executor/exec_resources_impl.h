/* The resource manager (resources.c): state that outlives steps and sessions, shared by name
 * by every graph run on one device: variables, and named objects of other kinds (an
 * accumulator, a queue, a collective's state). */
#ifndef DG_EXEC_RESOURCES_IMPL_H
#define DG_EXEC_RESOURCES_IMPL_H

#include <pthread.h>
#include <stdbool.h>

#include "distgraph/status.h"
#include "distgraph/tensor.h"

typedef struct exec_variable {
    pthread_mutex_t mu;
    char *name;          // owned
    dg_tensor *value;    // NULL until initialised; one reference held
    dg_dtype dtype;
    dg_shape shape;
} exec_variable;

typedef struct exec_resources exec_resources;

// Returns: new, caller frees with exec_resources_free().
exec_resources *exec_resources_new(void);
void exec_resources_free(exec_resources **rm);
// The variable named name, created (uninitialised) if absent. A variable that exists with
// another dtype or shape is INVALID_ARGUMENT. Returns: borrowed, valid until the resources
// are freed; NULL on error.
exec_variable *exec_resources_variable(exec_resources *rm, const char *name, dg_dtype dtype,
                                       dg_shape shape, dg_status *st);
// The variable named name or NULL. Returns: borrowed.
exec_variable *exec_resources_find(exec_resources *rm, const char *name);
// Number of variables and the i-th (creation order). Returns: borrowed.
int exec_resources_num_variables(exec_resources *rm);
exec_variable *exec_resources_variable_at(exec_resources *rm, int i);
// A named object other than a variable (an accumulator, a queue, a collective's state), made
// by create(arg, st) the first time (kind, name) is asked for and kept until the resources
// are freed, when destroy(obj) runs. Objects of different kinds may share a name. Returns:
// borrowed; NULL with st set when create fails.
void *exec_resources_object(exec_resources *rm, const char *kind, const char *name,
                            void *(*create)(void *arg, dg_status *st), void *arg,
                            void (*destroy)(void *obj), dg_status *st);
// Drops every variable's value (back to uninitialised).
void exec_resources_reset(exec_resources *rm);
// The current value of v with a new reference, or NULL if uninitialised.
dg_tensor *exec_variable_get(exec_variable *v);
// Replaces v's value (takes a new reference to t).
void exec_variable_set(exec_variable *v, dg_tensor *t);
// Whether val has v's shape; if not, INVALID_ARGUMENT naming both shapes and the variable.
bool exec_variable_check_shape(const exec_variable *v, const dg_tensor *val, dg_status *st);

#endif
