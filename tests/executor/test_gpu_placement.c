/* Placement with GPU kernels registered: what the memory rule lets the placer put on a GPU
 * (executor/cuda/kernels/gpu_impl.h), and how a training graph is cut between CPU:0 and
 * GPU:0. Placement needs no GPU, so this runs wherever CUDA is built; without CUDA the test
 * exits 77 (skipped). */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef DG_WITH_CUDA
#include "exec_kernel_registry_impl.h"

static const char *const devices[] = {"/job:localhost/replica:0/task:0/device:CPU:0",
                                      "/job:localhost/replica:0/task:0/device:GPU:0"};

static bool on_gpu(const dg_node *n) {
    const char *d = dg_node_assigned_device(n);
    return d && strstr(d, "/device:GPU:0") != NULL;
}

static void place_all(dg_graph *g, bool soft, dg_status *st) {
    int n = dg_graph_num_nodes(g);
    dg_node **nodes = malloc((size_t)n * sizeof *nodes);
    assert_non_null(nodes);
    for (int i = 0; i < n; i++) nodes[i] = dg_graph_node(g, i);
    dg_placement_options po = dg_placement_options_default();
    po.allow_soft_placement = soft;
    po.supports = exec_kernel_supports;
    dg_place(nodes, n, devices, 2, &po, st);
    free(nodes);
}

// Every op of the foundation with float inputs and float outputs has a GPU kernel for both
// float dtypes; ops with other outputs have none (they stay on the CPU).
static void test_kernel_coverage(void **state) {
    (void)state;
    static const char *const float_ops[] = {
        "MatMul", "Add", "Sub", "Mul", "Div", "Maximum", "Minimum", "ReluGrad", "SigmoidGrad",
        "TanhGrad", "SqrtGrad", "Relu", "Sigmoid", "Tanh", "Exp", "Log", "Square", "Sqrt", "Neg",
        "BiasAdd", "BiasAddGrad", "AddN", "ClipByValue", "ClipByValueGrad", "Cast", "Softmax",
        "LogSoftmax", "SoftmaxGrad", "LogSoftmaxGrad", "SoftmaxCrossEntropyWithLogits",
        "SparseSoftmaxCrossEntropyWithLogits", "Sum", "Mean", "Max", "SumGrad", "MaxGrad",
        "SumToShape", "BroadcastTo", "Reshape", "Shape", "ZerosLike", "OnesLike", "Concat",
        "Split", "Slice", "SliceGrad", "Const", "Identity", "VariableV2", "Assign", "AssignAdd",
        "AssignSub", "IsVariableInitialized", "RandomUniform", "RandomStandardNormal",
        "TruncatedNormal", "ApplyGradientDescent", "ApplyMomentum", "ApplyAdam", "_Send", "_Recv",
        "LocalAllReduce", "Rsqrt", "RsqrtGrad", "Erf", "Gelu", "GeluGrad", "LayerNorm", "LayerNormGrad", "BatchMatMulV2",
        "ScaledDotProductAttention", "ScaledDotProductAttentionGrad", "Sin", "Cos"};
    int missing = 0;
    for (size_t i = 0; i < sizeof float_ops / sizeof float_ops[0]; i++)
        for (dg_dtype t = DG_FLOAT32; t <= DG_FLOAT64; t++)
            if (!exec_kernel_find(float_ops[i], "GPU", t)) {
                fprintf(stderr, "no GPU kernel for %s (%s)\n", float_ops[i], dg_dtype_name(t));
                missing++;
            }
    assert_int_equal(missing, 0);
    // The 16-bit floats: the products, Cast and the ops that move values; nothing that
    // computes elementwise yet.
    static const char *const half_ops[] = {"MatMul", "BatchMatMulV2", "Cast", "Const", "Identity", "StopGradient",
                                           "Placeholder", "Reshape", "Shape", "_Send", "_Recv"};
    for (size_t i = 0; i < sizeof half_ops / sizeof half_ops[0]; i++)
        for (int h = 0; h < 2; h++) {
            dg_dtype t = h ? DG_FLOAT16 : DG_BFLOAT16;
            if (!exec_kernel_find(half_ops[i], "GPU", t)) {
                fprintf(stderr, "no GPU kernel for %s (%s)\n", half_ops[i], dg_dtype_name(t));
                missing++;
            }
        }
    assert_int_equal(missing, 0);
    assert_null(exec_kernel_find("Relu", "GPU", DG_BFLOAT16));
    assert_null(exec_kernel_find("VariableV2", "GPU", DG_FLOAT16));
    // Fill's kernel is chosen by its dims' dtype.
    assert_non_null(exec_kernel_find("Fill", "GPU", DG_INT32));
    assert_null(exec_kernel_find("ArgMax", "GPU", DG_FLOAT32));
    assert_null(exec_kernel_find("Equal", "GPU", DG_FLOAT32));
    assert_null(exec_kernel_find("CollectiveAllReduce", "GPU", DG_FLOAT32));
    // The embedding and sparse ops: chosen by their float table, DynamicStitch by its int32
    // indices; the ops that route and split ids have none.
    static const char *const sparse_ops[] = {"Gather", "UnsortedSegmentSum", "ScatterAdd",
                                             "ScatterSub", "ScatterUpdate", "SparseApplyAdagrad",
                                             "SparseApplyAdam"};
    for (size_t i = 0; i < sizeof sparse_ops / sizeof sparse_ops[0]; i++)
        for (dg_dtype t = DG_FLOAT32; t <= DG_FLOAT64; t++) {
            assert_non_null(exec_kernel_find(sparse_ops[i], "GPU", t));
            assert_null(exec_kernel_find(sparse_ops[i], "GPU", DG_INT32));
        }
    assert_non_null(exec_kernel_find("DynamicStitch", "GPU", DG_INT32));
    assert_null(exec_kernel_find("DynamicPartition", "GPU", DG_INVALID_DTYPE));
    assert_null(exec_kernel_find("EmbeddingPartitionIds", "GPU", DG_INVALID_DTYPE));
}

// The memory rule decides placement: float ops go to the GPU, ops with integer or bool
// outputs stay on the CPU under soft placement and fail without it, Shape and an int32 Const
// feeding a Reshape stay with the GPU (their outputs are host memory there).
static void test_memory_rule(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    dg_graph_push_device(g, "/gpu:0");
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(4, 3));
    dg_output y = dg_relu(g, "y", x);
    dg_output sh = dg_shape_of(g, "sh", y);
    int64_t dims[] = {12};
    dg_output r = dg_reshape(g, "r", y, dims, 1);
    dg_output am = dg_argmax(g, "am", y, 1);
    dg_output c = dg_cast(g, "c", y, DG_INT32);
    dg_output e = dg_equal(g, "e", y, x);
    dg_graph_pop_device(g);
    assert_ok(dg_graph_status(g));
    place_all(g, true, st);
    assert_ok(st);
    assert_true(on_gpu(x.node));
    assert_true(on_gpu(y.node));
    assert_true(on_gpu(sh.node));
    assert_true(on_gpu(r.node));
    // Reshape's shape input (an int32 Const) is placed with it: host memory on the GPU.
    assert_true(on_gpu(dg_node_input(r.node, 1).node));
    assert_false(on_gpu(am.node));
    assert_false(on_gpu(c.node));
    assert_false(on_gpu(e.node));
    dg_graph_free(&g);

    // Without soft placement an integer op requested on the GPU is an error naming it.
    g = dg_graph_new();
    dg_graph_push_device(g, "/gpu:0");
    x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(4, 3));
    dg_argmax(g, "am", x, 1);
    dg_graph_pop_device(g);
    place_all(g, false, st);
    assert_false(dg_status_ok(st));
    assert_non_null(strstr(dg_status_message(st), "am"));
    dg_graph_free(&g);
    dg_status_free(&st);
}

// bfloat16 and float16 live in device memory too: a product in 16 bits between its casts is
// placed on the GPU whole; a 16-bit op with no GPU kernel (Relu) stays on the CPU under soft
// placement.
static void test_memory_rule_16bit(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    for (int h = 0; h < 2; h++) {
        dg_dtype t = h ? DG_FLOAT16 : DG_BFLOAT16;
        dg_graph *g = dg_graph_new();
        dg_graph_push_device(g, "/gpu:0");
        dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(4, 3));
        dg_output w = dg_placeholder(g, "w", DG_FLOAT32, dg_shape2(3, 5));
        dg_output xh = dg_cast(g, "xh", x, t), wh = dg_cast(g, "wh", w, t);
        dg_output y = dg_matmul(g, "y", xh, wh, false, false);
        dg_output back = dg_cast(g, "back", y, DG_FLOAT32);
        dg_output r = dg_relu(g, "r", y);
        dg_graph_pop_device(g);
        assert_ok(dg_graph_status(g));
        place_all(g, true, st);
        assert_ok(st);
        assert_true(on_gpu(xh.node));
        assert_true(on_gpu(wh.node));
        assert_true(on_gpu(y.node));
        assert_true(on_gpu(back.node));
        assert_false(on_gpu(r.node));
        // A kernel chosen by an int or bool input 0 computes in float32 or float64 only: its
        // 16-bit node is not the GPU's (Select by its bool condition, Fill by its int dims).
        dg_output cond = dg_placeholder(g, "cond", DG_BOOL, dg_shape2(4, 5));
        dg_output sel = dg_where(g, "sel", cond, y, y);
        dg_output fill = dg_fill(g, "fill", dg_const_i64s(g, NULL, (int64_t[]){2, 2}, 2), dg_scalar(g, NULL, t, 1.5));
        assert_ok(dg_graph_status(g));
        assert_non_null(exec_kernel_find("Select", "GPU", DG_BOOL));
        assert_false(exec_kernel_supports(NULL, sel.node, "GPU"));
        if (exec_kernel_find("Fill", "GPU", DG_INT64)) assert_false(exec_kernel_supports(NULL, fill.node, "GPU"));
        assert_true(exec_kernel_supports(NULL, y.node, "GPU"));
        dg_graph_free(&g);
    }
    dg_status_free(&st);
}

// An MLP trained with Adam under /gpu:0: the model, its gradients and its updates are on the
// GPU; the global step (int64) and the accuracy (ArgMax, Equal, Cast) are on the CPU. Cut with
// CPU:0 as the client (as a local session does with a GPU), feeds and fetches stay on the CPU
// and every cross edge is a Send/Recv pair.
static void test_training_graph(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    dg_output gs = dg_global_step(g);
    dg_graph_push_device(g, "/gpu:0");
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(8, 4));
    dg_output labels = dg_placeholder(g, "labels", DG_INT32, dg_shape1(8));
    dg_output w = dg_variable(g, "w", DG_FLOAT32, dg_shape2(4, 3), dg_init_truncated_normal(0, 0.1, 1));
    dg_output b = dg_variable(g, "b", DG_FLOAT32, dg_shape1(3), dg_init_zeros());
    dg_output logits = dg_bias_add(g, "logits", dg_matmul(g, "mm", x, w, false, false), b);
    dg_output loss = dg_sparse_softmax_cross_entropy(g, "loss", logits, labels);
    dg_optimizer opt = dg_adam(g, 0.01);
    dg_node *train = dg_optimizer_minimize(&opt, loss, gs);
    dg_output pred = dg_argmax(g, "pred", logits, 1);
    dg_graph_pop_device(g);
    assert_non_null(train);
    dg_node *init = dg_global_variables_initializer(g);
    assert_non_null(init);
    assert_ok(dg_graph_status(g));
    place_all(g, true, st);
    assert_ok(st);
    int n = dg_graph_num_nodes(g), n_gpu = 0;
    for (int i = 0; i < n; i++) {
        dg_node *nd = dg_graph_node(g, i);
        const char *op = dg_node_op_type(nd);
        if (strcmp(op, "MatMul") == 0 || strcmp(op, "ApplyAdam") == 0 ||
            strcmp(op, "BiasAddGrad") == 0 || strcmp(op, "SparseSoftmaxCrossEntropyWithLogits") == 0) {
            if (!on_gpu(nd)) fprintf(stderr, "%s (%s) is on %s\n", dg_node_name(nd), op, dg_node_assigned_device(nd));
            assert_true(on_gpu(nd));
        }
        n_gpu += on_gpu(nd);
    }
    assert_true(on_gpu(w.node));
    assert_true(on_gpu(b.node));
    assert_false(on_gpu(gs.node));
    assert_false(on_gpu(pred.node));
    assert_true(n_gpu > n / 2);

    // As a session does: the run is pruned at the fed outputs, so the Placeholders stay out.
    dg_node **nodes = malloc((size_t)n * sizeof *nodes);
    assert_non_null(nodes);
    int n_run = 0;
    for (int i = 0; i < n; i++)
        if (dg_graph_node(g, i) != x.node && dg_graph_node(g, i) != labels.node)
            nodes[n_run++] = dg_graph_node(g, i);
    dg_output feeds[] = {x, labels};
    dg_output fetches[] = {loss, pred};
    dg_output fetch_at[2];
    dg_partitions *parts = dg_partition_ex(nodes, n_run, feeds, 2, fetches, 2, devices[0], 1, fetch_at, st);
    assert_ok(st);
    assert_non_null(parts);
    assert_int_equal(dg_partitions_count(parts), 2);
    int sends = 0, recvs = 0;
    for (int p = 0; p < 2; p++) {
        dg_graph *pg = dg_partitions_graph(parts, p);
        bool gpu_part = strstr(dg_partitions_device(parts, p), "GPU") != NULL;
        for (int i = 0; i < dg_graph_num_nodes(pg); i++) {
            const char *op = dg_node_op_type(dg_graph_node(pg, i));
            if (strcmp(op, "_Send") == 0) sends++;
            if (strcmp(op, "_Recv") == 0) recvs++;
            // Feeds are read on the CPU: no Placeholder is left in the GPU's partition, and no
            // GPU node reads a fed (host) value directly: it arrives through a _Recv.
            if (gpu_part) {
                dg_node *nd = dg_graph_node(pg, i);
                assert_string_not_equal(op, "Placeholder");
                for (int k = 0; k < dg_node_num_inputs(nd); k++) {
                    dg_node *src = dg_node_input(nd, k).node;
                    assert_ptr_not_equal(src, x.node);
                    assert_ptr_not_equal(src, labels.node);
                }
            }
        }
    }
    assert_true(sends > 0);
    assert_int_equal(sends, recvs);
    // Fetches are read in the client's (CPU) partition.
    for (int i = 0; i < 2; i++) assert_null(strstr(dg_node_assigned_device(fetch_at[i].node), "GPU"));
    dg_partitions_free(&parts);
    free(nodes);
    dg_graph_free(&g);
    dg_status_free(&st);
}

// A sharded embedding lookup trained with Adam under /gpu:0: the tables, their gathers, the
// stitch and the sparse updates are on the GPU; the routing of the ids (EmbeddingPartitionIds,
// DynamicPartition: int outputs, no GPU kernel) on the CPU under soft placement, and without
// soft placement it is an error naming the routing node.
static void test_sharded_embedding(void **state) {
    (void)state;
    for (int soft = 1; soft >= 0; soft--) {
        dg_status *st = dg_status_new();
        dg_graph *g = dg_graph_new();
        dg_graph_push_device(g, "/gpu:0");
        dg_output parts[2] = {dg_variable(g, "p0", DG_FLOAT32, dg_shape2(3, 4), dg_init_zeros()),
                              dg_variable(g, "p1", DG_FLOAT32, dg_shape2(2, 4), dg_init_zeros())};
        dg_output ids = dg_placeholder(g, "ids", DG_INT64, dg_shape1(-1));
        dg_output rows = dg_embedding_lookup_sharded(g, "emb", parts, 2, ids, DG_PARTITION_MOD);
        dg_output loss = dg_sum(g, "loss", dg_square(g, NULL, rows), NULL, 0, false);
        dg_optimizer opt = dg_adam(g, 0.01);
        dg_node *train = dg_optimizer_minimize(&opt, loss, (dg_output){NULL, 0});
        dg_graph_pop_device(g);
        assert_non_null(train);
        assert_ok(dg_graph_status(g));
        place_all(g, soft, st);
        if (!soft) {
            assert_false(dg_status_ok(st));
            assert_non_null(strstr(dg_status_message(st), "emb/partition_ids"));
        } else {
            assert_ok(st);
            int n_gather = 0, n_stitch = 0, n_adam = 0, n_route = 0;
            for (int i = 0; i < dg_graph_num_nodes(g); i++) {
                dg_node *nd = dg_graph_node(g, i);
                const char *op = dg_node_op_type(nd);
                bool gpu = strcmp(op, "Gather") == 0 || strcmp(op, "DynamicStitch") == 0 ||
                           strcmp(op, "SparseApplyAdam") == 0;
                bool cpu = strcmp(op, "DynamicPartition") == 0 ||
                           strcmp(op, "EmbeddingPartitionIds") == 0;
                if ((gpu && !on_gpu(nd)) || (cpu && on_gpu(nd)))
                    fail_msg("%s (%s) is on %s", dg_node_name(nd), op, dg_node_assigned_device(nd));
                n_gather += strcmp(op, "Gather") == 0;
                n_stitch += strcmp(op, "DynamicStitch") == 0;
                n_adam += strcmp(op, "SparseApplyAdam") == 0;
                n_route += cpu;
            }
            assert_int_equal(n_gather, 4);   // the lookups, and the stitch's gradient
            assert_true(n_stitch >= 1);
            assert_int_equal(n_adam, 2);
            assert_int_equal(n_route, 3);
            assert_true(on_gpu(parts[0].node) && on_gpu(parts[1].node));
        }
        dg_graph_free(&g);
        dg_status_free(&st);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernel_coverage),
        cmocka_unit_test(test_memory_rule),
        cmocka_unit_test(test_memory_rule_16bit),
        cmocka_unit_test(test_training_graph),
        cmocka_unit_test(test_sharded_embedding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void) {
    printf("skipped: built without CUDA (no GPU kernels registered)\n");
    return 77;
}
#endif
