/* The resource manager: variables by name, shared by every graph run on one device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base_impl.h"
#include "exec_resources_impl.h"
#include "strmap_impl.h"
#include "tensor_impl.h"

typedef struct exec_object {
    struct exec_object *next;
    char *kind, *name;
    void *obj;
    void (*destroy)(void *obj);
} exec_object;

struct exec_resources {
    pthread_mutex_t mu;
    graph_strmap by_name;
    exec_variable **vars;
    int n, cap;
    exec_object *objects;   // few: a list
};

exec_resources *exec_resources_new(void) {
    exec_resources *rm = calloc(1, sizeof *rm);
    if (!rm) return NULL;
    pthread_mutex_init(&rm->mu, NULL);
    return rm;
}

void exec_resources_free(exec_resources **rmp) {
    if (!rmp || !*rmp) return;
    exec_resources *rm = *rmp;
    for (int i = 0; i < rm->n; i++) {
        exec_variable *v = rm->vars[i];
        dg_tensor_unref(v->value);
        pthread_mutex_destroy(&v->mu);
        free(v->name);
        free(v);
    }
    free(rm->vars);
    for (exec_object *o = rm->objects, *next; o; o = next) {
        next = o->next;
        if (o->destroy) o->destroy(o->obj);
        free(o->kind);
        free(o->name);
        free(o);
    }
    graph_strmap_clear(&rm->by_name);
    pthread_mutex_destroy(&rm->mu);
    free(rm);
    *rmp = NULL;
}

exec_variable *exec_resources_find(exec_resources *rm, const char *name) {
    pthread_mutex_lock(&rm->mu);
    exec_variable *v = graph_strmap_get(&rm->by_name, name);
    pthread_mutex_unlock(&rm->mu);
    return v;
}

exec_variable *exec_resources_variable(exec_resources *rm, const char *name, dg_dtype dtype,
                                       dg_shape shape, dg_status *st) {
    pthread_mutex_lock(&rm->mu);
    exec_variable *v = graph_strmap_get(&rm->by_name, name);
    if (v) {
        pthread_mutex_unlock(&rm->mu);
        if (v->dtype != dtype || !dg_shape_equal(&v->shape, &shape)) {
            char a[128], b[128];
            dg_status_setf(st, DG_INVALID_ARGUMENT,
                           "variable \"%s\" exists as %s %s, a graph declares it %s %s", name,
                           dg_dtype_name(v->dtype), dg_shape_str(&v->shape, a, sizeof a),
                           dg_dtype_name(dtype), dg_shape_str(&shape, b, sizeof b));
            return NULL;
        }
        return v;
    }
    v = calloc(1, sizeof *v);
    if (!v || !(v->name = strdup(name))) {
        free(v);
        pthread_mutex_unlock(&rm->mu);
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "variable \"%s\": out of memory", name);
        return NULL;
    }
    pthread_mutex_init(&v->mu, NULL);
    v->dtype = dtype;
    v->shape = shape;
    BASE_PUSH(rm->vars, rm->n, rm->cap, v);
    graph_strmap_put(&rm->by_name, v->name, v);
    pthread_mutex_unlock(&rm->mu);
    return v;
}

int exec_resources_num_variables(exec_resources *rm) {
    pthread_mutex_lock(&rm->mu);
    int n = rm->n;
    pthread_mutex_unlock(&rm->mu);
    return n;
}

exec_variable *exec_resources_variable_at(exec_resources *rm, int i) {
    pthread_mutex_lock(&rm->mu);
    exec_variable *v = i >= 0 && i < rm->n ? rm->vars[i] : NULL;
    pthread_mutex_unlock(&rm->mu);
    return v;
}

void exec_resources_reset(exec_resources *rm) {
    pthread_mutex_lock(&rm->mu);
    for (int i = 0; i < rm->n; i++) exec_variable_set(rm->vars[i], NULL);
    pthread_mutex_unlock(&rm->mu);
}

dg_tensor *exec_variable_get(exec_variable *v) {
    pthread_mutex_lock(&v->mu);
    dg_tensor *t = dg_tensor_ref(v->value);
    pthread_mutex_unlock(&v->mu);
    return t;
}

bool exec_variable_check_shape(const exec_variable *v, const dg_tensor *val, dg_status *st) {
    if (dg_shape_equal(&val->shape, &v->shape)) return true;
    char a[128], b[128];
    dg_status_setf(st, DG_INVALID_ARGUMENT, "assigning shape %s to variable \"%s\" of shape %s",
                   dg_shape_str(&val->shape, a, sizeof a), v->name, dg_shape_str(&v->shape, b, sizeof b));
    return false;
}

void exec_variable_set(exec_variable *v, dg_tensor *t) {
    dg_tensor_ref(t);
    pthread_mutex_lock(&v->mu);
    dg_tensor *old = v->value;
    v->value = t;
    pthread_mutex_unlock(&v->mu);
    dg_tensor_unref(old);
}

void *exec_resources_object(exec_resources *rm, const char *kind, const char *name,
                            void *(*create)(void *arg, dg_status *st), void *arg,
                            void (*destroy)(void *obj), dg_status *st) {
    pthread_mutex_lock(&rm->mu);
    for (exec_object *o = rm->objects; o; o = o->next)
        if (strcmp(o->kind, kind) == 0 && strcmp(o->name, name) == 0) {
            pthread_mutex_unlock(&rm->mu);
            return o->obj;
        }
    exec_object *o = calloc(1, sizeof *o);
    if (!o || !(o->kind = strdup(kind)) || !(o->name = strdup(name))) {
        if (o) free(o->kind);
        free(o);
        pthread_mutex_unlock(&rm->mu);
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "%s \"%s\": out of memory", kind, name);
        return NULL;
    }
    // Created under the lock, so two graphs asking at once get the same object.
    o->obj = create(arg, st);
    if (!o->obj) {
        free(o->kind);
        free(o->name);
        free(o);
        pthread_mutex_unlock(&rm->mu);
        if (dg_status_code(st) == DG_OK) dg_status_setf(st, DG_INTERNAL, "%s \"%s\" could not be made", kind, name);
        return NULL;
    }
    o->destroy = destroy;
    o->next = rm->objects;
    rm->objects = o;
    pthread_mutex_unlock(&rm->mu);
    return o->obj;
}
