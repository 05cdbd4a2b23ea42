/* Executor internals: kernel registry, resource manager (variables), thread pool, and the
 * executor that runs one device's subgraph for a step. Device types and their registry are in
 * device.h (included here); the calls kernels make on their context in kernel_context.c. */
#ifndef DG_EXEC_IMPL_H
#define DG_EXEC_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "device.h"
#include "distgraph/trace.h"
#include "graph_impl.h"

typedef struct exec_trace exec_trace;   // a task's notes of a traced step (below)

// ---- resources: state that outlives steps and sessions, shared by name ----
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

// ---- kernels ----
typedef struct exec_step exec_step;

// Identifies one node's run in one step, for kernels that finish later (async kernels).
typedef struct exec_async_handle {
    exec_step *step;
    int node;
} exec_async_handle;

typedef struct exec_ctx {
    dg_tensor **inputs;     // borrowed, n_inputs
    int n_inputs;
    dg_tensor **outputs;    // the step's value slots for this node's outputs
    bool *owned;            // per output: allocated by exec_alloc_output
    int n_outputs;
    const dg_node *node;
    exec_step *step;
    dg_status *st;          // per-step scratch status for kernel errors
} exec_ctx;

typedef struct exec_env {
    exec_resources *rm;     // borrowed
    const char *device;     // canonical device name
    int intra_op_threads;
} exec_env;

typedef struct exec_kernel_def {
    const char *op;
    const char *device_type;   // its device type's name (exec_device_type.name)
    uint32_t dtype_mask;       // bit (1u << dtype) of supported dtypes of the op's type dtype
    // Reads attributes once per graph; returns the kernel's state (may be (void*)1 when it
    // needs none) or NULL with st set.
    void *(*create)(const dg_node *n, const exec_env *env, dg_status *st);
    // Computes one step. Returns false after setting ctx->st.
    bool (*compute)(void *state, exec_ctx *ctx);
    void (*destroy)(void *state);
    bool expensive;       // worth handing to another thread; also set for kernels that block
                          // their thread (collectives): never run on an I/O thread
    bool output_is_ref;   // outputs alias a variable's buffer: copy on fetch
    bool takes_uninit;    // input 0 may be an uninitialised variable (NULL tensor)
    // Async kernels (compute NULL): start the work and return; whoever finishes it calls
    // exec_async_done exactly once. ctx is valid only during the call.
    void (*start_async)(void *state, exec_ctx *ctx, exec_async_handle h);
    // The kernel keeps outputs whose dtype its device's memory does not hold in host memory, so
    // the node may run on a device that holds only floats (the GPU: its device type's supports,
    // executor/cuda/kernels/gpu_impl.h). Without it such a kernel is offered to the placer only
    // for nodes whose outputs are all floats.
    bool host_outputs;
} exec_kernel_def;

// Kernel fusion when an executable is compiled (fusion.c): nodes is the list to run, where
// each made node stands for the chain of nodes that ends in stands_for (whose outputs it
// computes; the chain's other nodes are left out). All arrays owned.
typedef struct exec_fused {
    dg_node **nodes;
    int n;
    dg_node **made;
    dg_node **stands_for;
    int n_made;
} exec_fused;
// False (out emptied) only when out of memory. default_type: the device type of nodes that
// name none.
bool exec_fuse(dg_node *const *nodes, int n, const dg_output *feeds, int n_feeds, const dg_output *fetches,
               int n_fetches, const char *default_type, exec_fused *out);
void exec_fused_free(exec_fused *f);
// False when DG_FUSION=0 is in the environment.
bool exec_fusion_enabled(void);

// Completes an async kernel: out (consumed; NULL on error) becomes output 0; st (NULL: OK)
// fails the step. May be called from any thread, also from inside start_async.
void exec_async_done(exec_async_handle h, dg_tensor *out, const dg_status *st);

// ---- rendezvous: Send/Recv hand-off by (step id, key) ----
typedef struct exec_rendezvous exec_rendezvous;
// Called once with the tensor (a reference the callee owns) or with an error status.
typedef void (*exec_recv_cb)(void *arg, int node, dg_tensor *t, const dg_status *st);
exec_rendezvous *exec_rendezvous_new(void);
void exec_rendezvous_free(exec_rendezvous **r);
// Decides where a sent value goes: returns 1 when it sent it to another task, 0 when the
// value is for this task, -1 on failure (st set).
typedef int (*exec_route_fn)(void *ctx, int64_t step_id, const char *key, dg_tensor *t,
                             dg_status *st);
// Sends what the router held back for a step (called when an executor runs out of ready
// nodes, so values leave together rather than one message each).
typedef void (*exec_flush_fn)(void *ctx, int64_t step_id);
void exec_rendezvous_set_router(exec_rendezvous *r, exec_route_fn fn, exec_flush_fn flush, void *ctx);
void exec_rendezvous_flush(exec_rendezvous *r, int64_t step_id);
// Puts a value into this task's table (values arriving from other tasks come in here).
bool exec_rendezvous_deliver(exec_rendezvous *r, int64_t step_id, const char *key, dg_tensor *t,
                             dg_status *st);
// Routes (see exec_rendezvous_set_router) or delivers. Takes a new reference to t. Fails if
// the step was aborted or the key was already sent.
bool exec_rendezvous_send(exec_rendezvous *r, int64_t step_id, const char *key, dg_tensor *t,
                          dg_status *st);
// cb runs now if the value is there (or the step aborted), else when it is sent.
void exec_rendezvous_recv_async(exec_rendezvous *r, int64_t step_id, const char *key,
                                exec_recv_cb cb, void *arg, int node);
// Fails the step's waiting and future receivers with ABORTED carrying why.
void exec_rendezvous_abort(exec_rendezvous *r, int64_t step_id, const dg_status *why);
// Fails every waiting and future receiver (shutdown).
void exec_rendezvous_close(exec_rendezvous *r, const dg_status *why);
// Notes the step's transfers in t (t NULL: stops): values this task hands to the router for
// another task (EXEC_TRACE_SENT) and values arriving from others (exec_rendezvous_note_arrival).
// t is borrowed until the call with NULL returns. At most 64 steps are traced at once (more are
// not noted).
void exec_rendezvous_trace(exec_rendezvous *r, int64_t step_id, exec_trace *t);
// A value from another task arrived for step_id (the transport calls it before delivering).
void exec_rendezvous_note_arrival(exec_rendezvous *r, int64_t step_id, const char *key, uint64_t bytes);
// Drops whatever the step left behind.
void exec_rendezvous_end_step(exec_rendezvous *r, int64_t step_id);
// Abort marks held (a hash set by step id; past 100000 the oldest are dropped).
int exec_rendezvous_num_abort_marks(exec_rendezvous *r);
// Drops the values that have waited older_than_ms or more for their receiver, of the steps
// running (may be NULL) says are not running here: a step whose master died before starting
// it never takes them. Those steps are marked aborted (a late start fails at once). running is
// called without the rendezvous's lock held. Returns the number of values dropped.
int exec_rendezvous_drop_stale(exec_rendezvous *r, int64_t older_than_ms, bool (*running)(void *ctx, int64_t step_id),
                               void *ctx);

#define DT_BIT(t) (1u << (t))
#define DT_FLOATS (DT_BIT(DG_FLOAT32) | DT_BIT(DG_FLOAT64))
#define DT_NUMERIC (DT_FLOATS | DT_BIT(DG_INT32) | DT_BIT(DG_INT64))
#define DT_ALL (DT_NUMERIC | DT_BIT(DG_BOOL) | DT_BIT(DG_UINT8))
// The 16-bit floats, and every dtype: kernels that move, store or convert values whatever
// they are take DT_STORAGE; kernels that compute list the 16-bit floats where they take them.
#define DT_FLOAT16S (DT_BIT(DG_BFLOAT16) | DT_BIT(DG_FLOAT16))
#define DT_STORAGE (DT_ALL | DT_FLOAT16S)

// The dtype a kernel is chosen by: input 0's, or output 0's for ops without inputs.
dg_dtype exec_kernel_dtype(const dg_node *n);
// The kernel for (op, device type, dtype), or NULL.
const exec_kernel_def *exec_kernel_find(const char *op, const char *device_type, dg_dtype t);
// Adds kernels to the registry; a device type's register_kernels calls it (the registry
// calls those once, on the first lookup). defs is borrowed for the life of the process.
void exec_register_kernels(const exec_kernel_def *defs, int n);
// Kernels registered (after the device types have registered theirs).
int exec_num_kernels(void);
// Kernels run with denormal floats flushed to zero and read as zero (x86's FTZ and DAZ), as
// TensorFlow runs its CPU kernels: arithmetic on a denormal costs about a hundred cycles on
// x86, and Adam's moments of a weight whose gradient stays zero (a border pixel of MNIST)
// decay into them within a few hundred steps, which made ApplyAdam a third of a training
// step. exec_fp_enter sets the mode on this thread and returns the one to restore with
// exec_fp_leave (a caller's own thread keeps its mode outside the kernels).
#if defined(__SSE2__)
#include <xmmintrin.h>
static inline unsigned exec_fp_enter(void) {
    unsigned old = _mm_getcsr();
    _mm_setcsr(old | 0x8040);   // FTZ (bit 15) and DAZ (bit 6)
    return old;
}
static inline void exec_fp_leave(unsigned old) { _mm_setcsr(old); }
#else
static inline unsigned exec_fp_enter(void) { return 0; }
static inline void exec_fp_leave(unsigned old) { (void)old; }
#endif
// The CPU device type's register_kernels (executor/cpu/cpu_register.c).
void exec_cpu_register(void);
// The threads one large CPU GEMM is split over, process-wide: n, or for n <= 0 the cores this
// process may use (executor/cpu/gemm.c).
void exec_cpu_set_threads(int n);
// The CPU, its vector instructions, what runs the GEMM and its threads, in one line
// (dg_cpu_summary). Returns: borrowed, valid on this thread until its next call.
const char *exec_cpu_summary(void);
// Prints "distgraph: cpu: " and exec_cpu_summary() to stderr, once per process.
void exec_cpu_announce(void);
// A placer callback: is there a kernel for n on device_type, and does the type take n
// (exec_device_type.supports)?
bool exec_kernel_supports(void *ctx, const dg_node *n, const char *device_type);

// ---- what kernels call on their context (kernel_context.c) ----
// An output tensor of the given dtype and shape in host memory, reusing the slot's buffer from
// the last step when it is free. Returns: borrowed, held by the step; NULL with ctx->st set on
// failure.
dg_tensor *exec_alloc_output(exec_ctx *ctx, int i, dg_dtype dtype, dg_shape shape);
// The two halves of it, for devices with memory of their own. exec_reuse_output: the tensor
// in output slot i when it can take dtype and shape in place (allocated by the slot, held by
// nobody else, same dtype and byte count, in the memory mem names: dg_tensor.mem), reshaped;
// otherwise the slot is emptied and NULL returned.
// exec_adopt_output: puts t, newly made for slot i, in it and returns it; NULL t (making it
// failed) prefixes "output i" to the status.
dg_tensor *exec_reuse_output(exec_ctx *ctx, int i, dg_dtype dtype, dg_shape shape, tensor_mem mem);
dg_tensor *exec_adopt_output(exec_ctx *ctx, int i, dg_tensor *t);
// Sets output i to t (takes a new reference), e.g. forwarding an input.
void exec_set_output(exec_ctx *ctx, int i, dg_tensor *t);
// Sets an error on the kernel context naming the node. Returns false.
bool exec_fail(exec_ctx *ctx, dg_code code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

// ---- random streams for kernels (philox.c) ----
// A seeded random stream for a kernel (Philox 4x32-10).
typedef struct exec_philox {
    uint32_t key[2];
    uint32_t ctr[4];
    uint32_t buf[4];
    int avail;
} exec_philox;
void exec_philox_init(exec_philox *p, uint64_t seed, uint64_t seed2);
// The stream of a random node: its "seed" and "seed2" attributes (0 when absent).
void exec_philox_init_node(exec_philox *p, const dg_node *n);
uint32_t exec_philox_next(exec_philox *p);
// Uniform in [0, 1) with 24 (float) or 53 (double) bits.
float exec_philox_uniform_f(exec_philox *p);
double exec_philox_uniform_d(exec_philox *p);
double exec_philox_normal(exec_philox *p);

// ---- thread pool: workers sleep on a condition variable, never spin ----
typedef struct exec_pool exec_pool;
typedef void (*exec_task_fn)(void *arg, int a);
exec_pool *exec_pool_new(int n_threads, dg_status *st);
void exec_pool_free(exec_pool **p);
int exec_pool_size(const exec_pool *p);
// Queues fn(arg, a). Never blocks.
void exec_pool_submit(exec_pool *p, exec_task_fn fn, void *arg, int a);

// ---- step traces: what one task notes during a traced step (distgraph/trace.h) ----
// Events with times on this process's monotonic clock (exec_trace_now_ns). Besides the public
// kinds, a task notes the two halves of a transfer, paired by the master (step_trace.c).
#define EXEC_TRACE_SENT 16      // name: rendezvous key; start: handed to the transport
#define EXEC_TRACE_ARRIVED 17   // name: rendezvous key; start: arrived from another task
// Returns: new, caller frees with exec_trace_free(); NULL when out of memory.
exec_trace *exec_trace_new(void);
void exec_trace_free(exec_trace **t);
int64_t exec_trace_now_ns(void);
// This thread's number in the process (1, 2, ... in order of first use).
int exec_trace_thread(void);
// Appends e, copying its strings (NULL ones become ""). Thread-safe; out of memory drops it.
void exec_trace_add(exec_trace *t, const dg_trace_event *e);
int exec_trace_num_events(const exec_trace *t);
// Returns: borrowed, valid until the next add or the free.
const dg_trace_event *exec_trace_events(const exec_trace *t);

// ---- executor ----
typedef struct exec_graph exec_graph;

typedef struct exec_step_options {
    int64_t step_id;
    exec_rendezvous *rendezvous;   // for _Send/_Recv kernels; borrowed
    int64_t timeout_ms;     // 0: none
    exec_trace *trace;      // NULL: not traced; else each node's run is noted there (borrowed)
} exec_step_options;

// Compiles nodes (any order; their inputs outside the set must be fed) into an executable.
// Each node runs on its assigned device (env->device when it has none): kernels are looked
// up by that device's type, so the partitions of several devices can share one executable. feeds are outputs whose values the caller supplies; fetches are outputs
// returned after each run. Kernels are created once here. Returns: new, caller frees with
// exec_graph_free(); NULL on error (unknown kernel, a cycle, a missing input).
exec_graph *exec_graph_new(dg_node *const *nodes, int n_nodes, const dg_output *feeds, int n_feeds,
                           const dg_output *fetches, int n_fetches, const exec_env *env,
                           exec_pool *pool, dg_status *st);
void exec_graph_free(exec_graph **eg);
// Runs one step. feed_values[i] is borrowed; fetched[i] receives a new reference (caller
// unrefs). On failure no fetched tensor is set.
bool exec_graph_run(exec_graph *eg, dg_tensor *const *feed_values, dg_tensor **fetched,
                    const exec_step_options *opts, dg_status *st);
// Starts a step and returns without waiting: done(arg, st) runs exactly once, when every node
// has finished, on whichever thread finishes the last one (st NULL on success; borrowed for
// the call). The step's nodes run on the calling thread until they wait for an asynchronous
// kernel; its completion runs what it made ready on the completing thread when the graph is
// light (exec_graph_is_light), else on the pool. For graphs without feeds and fetches (a
// task's registered partitions); returns false (st set, done not called) otherwise.
typedef void (*exec_done_fn)(void *arg, const dg_status *st);
bool exec_graph_start(exec_graph *eg, const exec_step_options *opts, exec_done_fn done, void *arg,
                      dg_status *st);
// No expensive kernel and at most about a million output elements (by static shapes): cheap
// enough to run on an I/O thread.
bool exec_graph_is_light(const exec_graph *eg);
int exec_graph_num_nodes(const exec_graph *eg);
int exec_graph_num_fetches(const exec_graph *eg);
// Options the step was run with (kernels such as _Send/_Recv read it).
const exec_step_options *exec_step_opts(const exec_step *s);

// ---- cancellation of waiting kernels (by step, through the rendezvous) ----
// Kernels that wait for something other than a rendezvous value (a sync-replicas take or
// dequeue) register here so that an aborted step (ABORT_STEP, a failed node, a missed deadline)
// or a closed rendezvous (server shutdown) ends their wait. fn is called at most once, on the
// aborting thread, with the cause; it must not block.
typedef void (*exec_cancel_fn)(void *arg, const dg_status *why);
// Registers fn for step_id. Returns a token (> 0) for exec_rendezvous_forget_cancel; 0 when the
// step is already aborted or the rendezvous closed (then fn is not registered and why, which
// may be NULL, receives the cause) or on out of memory (why gets RESOURCE_EXHAUSTED).
int64_t exec_rendezvous_on_cancel(exec_rendezvous *r, int64_t step_id, exec_cancel_fn fn, void *arg,
                                  dg_status *why);
// Unregisters token. Returns true when fn will not be called; false when it has been or is
// being called (or token is 0 or unknown). Never waits.
bool exec_rendezvous_forget_cancel(exec_rendezvous *r, int64_t token);

#endif
