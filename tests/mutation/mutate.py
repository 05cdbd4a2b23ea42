#!/usr/bin/env python3
"""Mutation checks: break the code on purpose and see that the suite notices.

Each mutant inserts a line or two at one anchor of one source file (the anchor must occur
exactly once, or the mutant is reported stale and the run fails), rebuilds the targets its
tests need in a scratch copy of the tree, and runs those tests with CTest. A mutant is caught
when at least one of them fails; one that every test passes has survived, and the run fails.
The source tree and its build/ are never touched.

    tests/mutation/mutate.py [--work DIR] [--report FILE] [--list] [NAME ...]

Prints one JSON line per mutant (name, file, tests run, the tests that failed, the first
failure line of each, seconds) and a summary line "mutants: N caught, N survived"; --report
also writes a Markdown table. docs/CONTRIBUTING.md says when to add a mutant.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

def after(anchor, text):
    """An edit: text inserted after anchor."""
    return (anchor, anchor + text)


def conv_nan(name, what, anchor, n, p):
    """A mutant of the direct convolution: after anchor, the float32 array p of n elements all NaN."""
    fill = "    for (int64_t mut_i = 0; mut_i < %s; mut_i++) %s[mut_i] = __builtin_nanf(\"\");\n" % (n, p)
    return {"name": name, "what": what, "file": "executor/cpu/conv_direct.c", "edits": [after(anchor, fill)],
            "tests": ["test_conv_direct", "test_fusion"]}


# The build targets a test needs beyond its own name (an integration test runs programs).
EXTRA_TARGETS = {"exp_regression": ["exp_regression", "dg-launch"], "allreduce_loss_scale": ["mnist_replica"],
                 "coordinator_strategy": ["strategies", "dg-server"]}


def build_targets(tests):
    return sorted({t for test in tests for t in EXTRA_TARGETS.get(test, [test])})


ADAM_ANCHOR = "        adam_f64(var->data, mt->data, vt->data, grad->data, n, lr_t, beta1, beta2, eps);\n"

MUTANTS = [
    {
        "name": "apply_adam_nan",
        "what": "ApplyAdam (CPU) writes NaN into every element of the variable",
        "file": "executor/cpu/kernels_state.c",
        "edits": [after(ADAM_ANCHOR,
                        "    for (int64_t mut_i = 0; mut_i < n; mut_i++) {\n"
                        "        if (var->dtype == DG_FLOAT32) ((float *)var->data)[mut_i] = __builtin_nanf(\"\");\n"
                        "        else ((double *)var->data)[mut_i] = __builtin_nan(\"\");\n"
                        "    }\n")],
        "tests": ["test_gradients"],
    },
    {
        "name": "apply_adam_1e9",
        "what": "ApplyAdam (CPU) writes 1e9 (a finite wrong value, the control for the NaN mutant)",
        "file": "executor/cpu/kernels_state.c",
        "edits": [after(ADAM_ANCHOR,
                        "    for (int64_t mut_i = 0; mut_i < n; mut_i++) {\n"
                        "        if (var->dtype == DG_FLOAT32) ((float *)var->data)[mut_i] = 1e9f;\n"
                        "        else ((double *)var->data)[mut_i] = 1e9;\n"
                        "    }\n")],
        "tests": ["test_gradients"],
    },
    conv_nan("conv_direct_fwd_nan", "the direct convolution's forward pass writes NaN everywhere",
             "    fwd_padded(xp, g->n, hp, wp, g->c, rlo, rhi, clo, chi, f, g->kh, g->kw, g->oh, g->ow, g->oc, ep, y);\n",
             "g->n * g->oh * g->ow * g->oc", "y"),
    conv_nan("conv_direct_bp_input_nan", "the direct convolution's input gradient writes NaN everywhere",
             "    fwd_padded(dyp, g->n, hp, wp, oc, rlo, rhi, clo, chi, fr, kh, kw, g->h, g->w, c, NULL, dx);\n",
             "g->n * g->h * g->w * c", "dx"),
    conv_nan("conv_direct_bp_filter_nan", "the direct convolution's filter gradient writes NaN everywhere",
             "    bpf_padded(xp, g->n, hp, wp, g->c, rlo, rhi, clo, chi, dy, g->kh, g->kw, g->oh, g->ow, g->oc, df);\n",
             "g->kh * g->kw * g->c * g->oc", "df"),
    {
        "name": "bfloat16_truncates",
        "what": "float32 to bfloat16 truncates instead of rounding to nearest",
        "file": "graph/tensor_impl.h",
        "edits": [("    u += 0x7fffu + ((u >> 16) & 1);\n", "")],
        "tests": ["test_float16"],
    },
    {
        "name": "float16_ties_away",
        "what": "float32 to float16 rounds ties up instead of to even",
        "file": "graph/tensor_impl.h",
        "edits": [("    m += 0xfffu + ((m >> 13) & 1);\n", "    m += 0x1000u;\n")],
        "tests": ["test_float16"],
    },
    {
        "name": "gemm16_drops_last_k",
        "what": "the 16-bit product through float32 leaves out the last term of each sum",
        "file": "executor/cpu/gemm16.c",
        "edits": [("        cpu_gemm(DG_FLOAT32, ta, tb, M, N, K, 1.0,", "        cpu_gemm(DG_FLOAT32, ta, tb, M, N, K - 1, 1.0,")],
        "tests": ["test_gemm16"],
    },
    {
        "name": "attention_split_skips_a_matrix",
        "what": "the attention split over threads leaves out the first matrix of every piece but the first",
        "file": "executor/cpu/kernels_transformer.c",
        "edits": [("    int64_t B = j->d->batches, b0 = B * i / n, b1 = B * (i + 1) / n;\n",
                   "    int64_t B = j->d->batches, b0 = B * i / n + (i > 0), b1 = B * (i + 1) / n;\n")],
        "tests": ["test_parallel_pieces"],
    },
    {
        "name": "loss_scale_never_skips",
        "what": "the loss scaler builds the updates without their gate: a step whose gradients overflow is applied",
        "file": "graph/train.c",
        "edits": [("        if (u && gate.node) graph_add_input(u, gate);", "        if (u && gate.node && false) graph_add_input(u, gate);")],
        "tests": ["test_loss_scale"],
    },
    {
        "name": "loss_scale_without_all_reduce",
        "what": "loss scaling under all-reduce checks each worker's own gradients and averages none, so a worker "
                "applies what another skipped and the copies of the model part",
        "file": "graph/train.c",
        "edits": [("    if (n > 0 && transform && !transform(ctx, g, grads, n)) n = -1;",
                   "    if (n > 0 && transform && false && !transform(ctx, g, grads, n)) n = -1;")],
        "tests": ["allreduce_loss_scale"],
    },
    {
        "name": "sync_loss_scale_not_checked",
        "what": "sync replicas with loss scaling apply the chief's averages unchecked and scaled, so an overflow "
                "reaches the variables",
        "file": "graph/sync_replicas.c",
        "edits": [("        dg_node *applied = sr->scaled ? graph_loss_scale_apply(",
                   "        dg_node *applied = false ? graph_loss_scale_apply(")],
        "tests": ["allreduce_loss_scale"],
    },
    {
        "name": "collective_failure_not_told",
        "what": "a member whose collective fails does not tell the others, so in a ring a member away from the "
                "lost one waits out the group's timeout",
        "file": "executor/cpu/kernels_collective.c",
        "edits": [("                if (m != k->rank) exec_rendezvous_abort_remote(run.rv, run.step_id, k->devices[m], ctx->st);",
                   "                if (m != k->rank && false) exec_rendezvous_abort_remote(run.rv, run.step_id, k->devices[m], ctx->st);")],
        "tests": ["test_collective"],
    },
    {
        "name": "tied_parts_lose_dense_gradient",
        "what": "the GPT's output projection through the partitioned token embedding passes no gradient, so each "
                "part trains on its lookup's sparse gradient alone",
        "file": "examples/common/gpt_model.c",
        "edits": [("    return dg_concat(g, NULL, parts, *n, 0);",
                   "    return dg_stop_gradient(g, NULL, dg_concat(g, NULL, parts, *n, 0));")],
        "tests": ["test_gpt_model"],
    },
    {
        "name": "live_cap_ignored",
        "what": "a take ignores the live worker count, so a lost worker holds every step for the take's deadline",
        "file": "executor/cpu/kernels_sync.c",
        "edits": [("    int need = a->live > 0 && a->live < w->num_required ? a->live : w->num_required;",
                   "    int need = w->num_required;")],
        "tests": ["test_sync_replicas"],
    },
    {
        "name": "sim_channels_never_busy",
        "what": "the step simulator lets every transfer start at once, as if a device pair's channel carried any number "
                "of tensors together",
        "file": "placer/simulate.c",
        "edits": [("                    double st = ev.t > s->chan_free[ch] ? ev.t : s->chan_free[ch];",
                   "                    double st = ev.t;")],
        "tests": ["test_auto_place"],
    },
    {
        "name": "auto_place_ignores_copies_in_caps",
        "what": "the automatic placer checks its candidates against the caps without the copies of the tensors each "
                "device receives",
        "file": "placer/simulate.c",
        "edits": [after("        int du = dev[u];\n        used[du] += p->static_bytes[u];\n", "        continue;\n")],
        "tests": ["test_auto_place"],
    },
    {
        "name": "sim_no_copy_between_tasks",
        "what": "the simulator lets the CPUs of two tasks exchange tensors without copying them",
        "file": "placer/simulate.c",
        "edits": [("                p->copy[(size_t)a * n_dev + b] = p->inv_bw[(size_t)a * n_dev + b];",
                   "                p->copy[(size_t)a * n_dev + b] = 0;")],
        "tests": ["test_auto_place"],
    },
    {
        "name": "refine_keeps_worse_moves",
        "what": "the refinement keeps every move, also those that make the simulated step longer",
        "file": "placer/auto_place.c",
        "edits": [("        if (t >= 0 && t < *step * (1 - 1e-9)) {", "        if (t >= 0) {")],
        "tests": ["test_auto_place"],
    },
    {
        "name": "cluster_moves_never_kept",
        "what": "the automatic placer's moves of whole clusters are tried and never kept",
        "file": "placer/auto_place.c",
        "edits": [("            if (best_d >= 0) {", "            if (best_d >= 0 && kept < 0) {")],
        "tests": ["test_auto_place"],
    },
    {
        "name": "cluster_swaps_never_tried",
        "what": "where a cap forbids moving a cluster, the automatic placer never tries swapping it with one there",
        "file": "placer/auto_place.c",
        "edits": [("                } else if (isinf(t)) {", "                } else if (isinf(t) && kept < 0) {")],
        "tests": ["test_auto_place"],
    },
    {
        "name": "wake_counts_busy_threads",
        "what": "the measured wake time also counts ops handed to a thread that was running another op meanwhile",
        "file": "runtime/master/step_trace.c",
        "edits": [("    if (lo == 0) return false;\n    const thread_run *r",
                   "    if (lo >= 0) return false;\n    const thread_run *r")],
        "tests": ["test_auto_place_session"],
    },
    {
        "name": "sim_no_blocker",
        "what": "the step simulator never records which op of its stream an op waited for, so the refinement's "
                "critical path follows inputs only",
        "file": "placer/simulate.c",
        "edits": [("    s->blocker[v] = st > t ? s->slot_last[slot] : -1;", "    s->blocker[v] = -1;")],
        "tests": ["test_auto_place"],
    },
    {
        "name": "pipeline_no_micro_batch_weight",
        "what": "a pipeline weighs each micro-batch's loss 1 instead of 1/m, so its gradients are m times the mean's",
        "file": "graph/pipeline.c",
        "edits": [("dg_scalar(g, \"micro_batch_weight\", lt, 1.0 / b->m);", "dg_scalar(g, \"micro_batch_weight\", lt, 1.0);")],
        "tests": ["test_pipeline"],
    },
    {
        "name": "pipeline_pieces_unordered",
        "what": "a pipeline's pieces do not wait for the device's previous piece: the schedule is not kept",
        "file": "graph/pipeline.c",
        "edits": [("                if (active[id] && !covered && prev) dg_node_add_control_input(nd, prev);",
                   "                (void)covered, (void)prev;")],
        "tests": ["test_pipeline"],
    },
    {
        "name": "pipeline_last_micro_batch_only",
        "what": "a pipeline keeps only the last micro-batch's gradient of each variable instead of the sum",
        "file": "graph/pipeline.c",
        "edits": [("    b->acc[i] = dg_add(b->g, NULL, b->acc[i], grad);", "    b->acc[i] = grad;")],
        "tests": ["test_pipeline"],
    },
    {
        "name": "zb_h1_never_defers",
        "what": "ZB-H1 runs each weight-gradient part right after its input-gradient part, as 1F1B does",
        "file": "graph/pipeline_schedule.c",
        "edits": [("            if (waiting[d] > 0 && (waiting[d] > d || !has_next || at > s.clock[d])) {",
                   "            if (waiting[d] > 0) {")],
        "tests": ["test_pipeline"],
    },
    {
        "name": "local_all_reduce_grad_own_only",
        "what": "the gradient of a LocalAllReduce gives each member its own output's gradient, not the group's sum",
        "file": "graph/gradients.c",
        "edits": [("            add_contrib(&grads[in.node->id][in.index], outs[r]);",
                   "            add_contrib(&grads[in.node->id][in.index], dys[r]);")],
        "tests": ["test_tensor_parallel"],
    },
    {
        "name": "saver_leaves_iterator",
        "what": "a saver's restore leaves an attached iterator where it is, so the batches after a recovery are not "
                "those after the checkpoint's step",
        "file": "runtime/training/saver.c",
        "edits": [("        if (!b->restore) continue;", "        if (b->restore) continue;")],
        "tests": ["test_dataset"],
    },
    {
        "name": "wire16_owner_keeps_float32",
        "what": "the ring all-reduce with bfloat16 on the wire leaves the owner's final value in float32 while the "
                "others receive it rounded, so the ranks end apart",
        "file": "executor/cpu/kernels_collective.c",
        "edits": [("                if (p == n - 2) round16((float *)(out + a), l / 4);\n", "")],
        "tests": ["test_collective"],
    },
    {
        "name": "coordinator_drops_lost_step",
        "what": "ps_coordinator's coordinator drops the step of a worker it lost instead of giving it back to the "
                "queue, so a job with a worker killed runs one step fewer than it asked",
        "file": "runtime/training/coordinator.c",
        "edits": [("            push(c, k, true);\n            c->rescheduled++;",
                   "            closure_free(k);\n            c->rescheduled++;")],
        "tests": ["coordinator_strategy"],
    },
    {
        "name": "coordinator_never_stops",
        "what": "ps_coordinator's run never requests the stop once it has scheduled the last step, so the training "
                "loop goes on past the session's last step",
        "file": "runtime/training/distribute.c",
        "edits": [("    if (last) dg_monitored_session_request_stop(ms);\n", "")],
        "tests": ["test_distribute"],
    },
    {
        "name": "elastic_survivors_not_first",
        "what": "the elastic coordinator ranks a new epoch's members by task only, so a joiner can be rank 0 and "
                "broadcast its fresh variables over the group's committed ones",
        "file": "executor/cpu/kernels_sync.c",
        "edits": [("            if (a && a->kind != ELASTIC_JOIN && !in_list(c->lost, c->n_lost, c->members[i]))",
                   "            if (a && false && !in_list(c->lost, c->n_lost, c->members[i]))")],
        "tests": ["test_elastic"],
    },
    {
        "name": "layer_norm_grad_drops_a_chunk",
        "what": "LayerNormGrad adds up the dgamma and dbeta sums of every chunk of rows but the last",
        "file": "executor/cpu/kernels_transformer.c",
        "edits": [("        for (int64_t k = 0; k < n_chunks; k++) {\n            sg += acc[k * 2 * C + c];",
                   "        for (int64_t k = 0; k < n_chunks - 1; k++) {\n            sg += acc[k * 2 * C + c];")],
        "tests": ["test_parallel_pieces"],
    },
    {
        "name": "conv_sparse_filter_drops_entry",
        "what": "the sparse filter gradient leaves out each image's last nonzero dy entry",
        "file": "executor/cpu/conv_direct.c",
        "edits": [("    start[oc] = k;\n", "    start[oc] = k - (k > 0);\n")],
        "tests": ["test_conv_direct"],
    },
    {
        "name": "conv_sparse_input_drops_entry",
        "what": "the sparse input gradient leaves out each image's last nonzero dy entry",
        "file": "executor/cpu/conv_direct.c",
        "edits": [("    start[pixels] = k;\n", "    start[pixels] = k - (k > 0);\n")],
        "tests": ["test_conv_direct"],
    },
    {
        "name": "gemm_sparse_ignores_infinity",
        "what": "a product from a mostly-zero A keeps its own result where B holds an infinity or a NaN",
        "file": "executor/cpu/gemm_sparse.c",
        "edits": [("    return !any;\n", "    return any || !any;\n")],
        "tests": ["test_cpu_gemm"],
    },
    {
        "name": "gemm_sparse_skips_empty_first_chunk",
        "what": "a row of C whose first chunk of A has no nonzeros keeps what C held there",
        "file": "executor/cpu/gemm_sparse.c",
        "edits": [("                if (lo == hi && k0 > 0) continue;\n", "                if (lo == hi) continue;\n")],
        "tests": ["test_cpu_gemm"],
    },
    {
        "name": "pipeline_mixed_precision_first_micro_batch_only",
        "what": "a pipeline's stage looks for the variables it reads only among its nodes' direct inputs, so under mixed precision the later micro-batches (which read the first one's casts) add nothing to the gradients",
        "file": "graph/pipeline.c",
        "edits": [("            if (strcmp(dg_node_op_type(v), \"Cast\") == 0 && v->n_inputs == 1) v = dg_node_input(v, 0).node;\n", "")],
        "tests": ["test_pipeline"],
    },
    {
        "name": "amp_deny_does_not_spread",
        "what": "the mixed-precision rewrite converts an infer-list op fed by a deny-list op (exp(x) + x w goes to bfloat16)",
        "file": "graph/mixed_precision.c",
        "edits": [("    if (n_deny > 0) return GRAPH_MIXED_DENY;   // an infer or clear op fed by a deny op\n", "")],
        "tests": ["test_amp_rewrite"],
    },
    {
        "name": "amp_unscale_in_float16",
        "what": "the loss scaler does not mark its unscaling multiply, so the float16 rewrite unscales the gradients in float16 and the small ones round to zero",
        "file": "graph/train.c",
        "edits": [("        if (grads[i].node) graph_set_attr_bool(grads[i].node, GRAPH_ATTR_KEEP_FLOAT32, true);\n", "")],
        "tests": ["test_amp_rewrite"],
    },
    {
        "name": "amp_later_nodes_see_16_bits",
        "what": "a node built after the mixed-precision rewrite reads a converted value's 16 bits, not its cast back (a float32 MatMul of it is refused)",
        "file": "graph/graph.c",
        "edits": [("        if (n->inputs[i].node->mixed == GRAPH_MIXED_LOW && dg_dtype_is_float16_family(dg_output_dtype(n->inputs[i]))) {\n",
                   "        if (n->inputs[i].node->mixed == GRAPH_MIXED_LOW && dg_dtype_is_float16_family(dg_output_dtype(n->inputs[i])) && 0) {\n")],
        "tests": ["test_amp_rewrite"],
    },
    {
        "name": "amp_statistics_cast",
        "what": "the mixed-precision rewrite casts LayerNorm's mean and rstd to 16 bits for a converted LayerNormGrad (and attention's lse), which its gradient must read in float32",
        "file": "graph/mixed_precision.c",
        "edits": [("        if (keeps_float32(n, i)) continue;\n", "        if (keeps_float32(n, i) && 0) continue;\n")],
        "tests": ["test_amp_rewrite"],
    },
    {
        "name": "amp_casts_after_readers",
        "what": "the mixed-precision rewrite leaves its casts at the end of the graph, after the nodes that read them, so ids are no longer a topological order (the partitioner copies nodes in id order)",
        "file": "graph/mixed_precision.c",
        "edits": [("        graph_reorder_tail(g, from, order);\n", "")],
        "tests": ["test_amp_rewrite"],
    },
    {
        "name": "tp_across_tasks_local_all_reduce",
        "what": "a tensor-parallel group spanning tasks sums its partial products with LocalAllReduce, which joins only one task's devices",
        "file": "graph/tensor_parallel.c",
        "edits": [("    if (grp->n == 1 || one_task(g, grp))\n", "    if (grp->n >= 1 || one_task(g, grp))\n")],
        "tests": ["test_tensor_parallel"],
    },
    {
        "name": "ring_all_reduce_nan",
        "what": "the ring all-reduce's owner of each segment writes NaN (all bits set) over its final value",
        "file": "executor/cpu/kernels_collective.c",
        "edits": [after("                combine(f64_end, a, l, out + a, in + a, t->data, p == n - 2 && k->mean ? n : 1);\n",
                        "                if (p == n - 2) memset(out + a, 0xff, l);\n")],
        "tests": ["test_collective"],
    },
    {
        "name": "batch_matmul_ignores_batch",
        "what": "BatchMatMulV2 (CPU) multiplies x's first matrix for every batch index: wrong where x has a "
                "batch of its own, right where it is broadcast",
        "file": "executor/cpu/cpu_register.c",
        "edits": [("    *xo = mx * p->M * p->K;\n", "    *xo = 0 * mx;\n")],
        "tests": ["test_gradients"],
    },
    {
        "name": "layer_norm_nan",
        "what": "LayerNorm (CPU) writes NaN over y",
        "file": "executor/cpu/kernels_transformer.c",
        "edits": [after("    ln_fwd_range(&j, 0, rows);\n",
                        "    for (int64_t mut_i = 0; mut_i < y->n_elements; mut_i++) {\n"
                        "        if (y->dtype == DG_FLOAT32) ((float *)y->data)[mut_i] = __builtin_nanf(\"\");\n"
                        "        else ((double *)y->data)[mut_i] = __builtin_nan(\"\");\n"
                        "    }\n")],
        "tests": ["test_gradients"],
    },
    {
        "name": "layer_norm_grad_nan",
        "what": "LayerNormGrad (CPU) writes NaN over dx",
        "file": "executor/cpu/kernels_transformer.c",
        "edits": [after("    free(acc);\n",
                        "    for (int64_t mut_i = 0; mut_i < dx->n_elements; mut_i++) {\n"
                        "        if (dx->dtype == DG_FLOAT32) ((float *)dx->data)[mut_i] = __builtin_nanf(\"\");\n"
                        "        else ((double *)dx->data)[mut_i] = __builtin_nan(\"\");\n"
                        "    }\n")],
        "tests": ["test_gradients"],
    },
    {
        "name": "gelu_tanh_for_erf",
        "what": "Gelu computes the tanh approximation where the exact (erf) form is asked for: off by up "
                "to 5e-4, finite everywhere",
        "file": "executor/cpu/gelu.c",
        "edits": [("static inline double gelu(double x) { return 0.5 * x * (1.0 + erf(x * INV_SQRT_2)); }\n",
                   "static inline double gelu_tanh(double x);\n"
                   "static inline double gelu(double x) { return gelu_tanh(x); }\n")],
        "tests": ["test_gradients"],
    },
    {
        "name": "attention_nan",
        "what": "ScaledDotProductAttention (CPU) writes NaN over its output",
        "file": "executor/cpu/kernels_transformer.c",
        "edits": [("    return true;\n}\n\nstatic bool attention_grad_compute(",
                   "    for (int64_t mut_i = 0; mut_i < out->n_elements; mut_i++) {\n"
                   "        if (out->dtype == DG_FLOAT32) ((float *)out->data)[mut_i] = __builtin_nanf(\"\");\n"
                   "        else ((double *)out->data)[mut_i] = __builtin_nan(\"\");\n"
                   "    }\n"
                   "    return true;\n}\n\nstatic bool attention_grad_compute(")],
        "tests": ["test_gradients"],
    },
    {
        "name": "attention_grad_nan",
        "what": "ScaledDotProductAttentionGrad (CPU) writes NaN over dk",
        "file": "executor/cpu/kernels_transformer.c",
        "edits": [("    return true;\n}\n\n#define K(",
                   "    for (int64_t mut_i = 0; mut_i < dk->n_elements; mut_i++) {\n"
                   "        if (dk->dtype == DG_FLOAT32) ((float *)dk->data)[mut_i] = __builtin_nanf(\"\");\n"
                   "        else ((double *)dk->data)[mut_i] = __builtin_nan(\"\");\n"
                   "    }\n"
                   "    return true;\n}\n\n#define K(")],
        "tests": ["test_gradients"],
    },
    {
        "name": "attention_causal_one_short",
        "what": "under the causal mask each query row sees one key fewer (not its own position)",
        "file": "executor/cpu/kernels_transformer.c",
        "edits": [("    int64_t lim = i + Tk - Tq + 1;\n", "    int64_t lim = i + Tk - Tq;\n")],
        "tests": ["test_gradients"],
    },
    {
        "name": "gelu_f32_coefficient",
        "what": "the float32 GELU's erfc polynomial has its constant term 1.4e-5 too large: Phi off by "
                "about 7e-6 near 0, finite everywhere",
        "file": "executor/cpu/gelu.c",
        "edits": [("    q = q * t + 0.282086492f;\n", "    q = q * t + 0.2821f;\n")],
        "tests": ["test_gradients"],
    },
    {
        "name": "attention_mask_ignored",
        "what": "the attention's forward pass ignores its mask (every pair the causal rule allows is seen)",
        "file": "executor/cpu/kernels_transformer.c",
        "edits": [("            if (d.mask) att_mask_scores(t, s, rb, kend, i0, &d, b);\n"
                   "            if (t == DG_FLOAT32) att_softmax_float(",
                   "            if (t == DG_FLOAT32) att_softmax_float(")],
        "tests": ["test_gradients"],
    },
    {
        "name": "gelu_grad_nan",
        "what": "GeluGrad (erf form) writes NaN",
        "file": "executor/cpu/gelu.c",
        "edits": [("static inline double gelu_grad(double x) {\n",
                   "static inline double gelu_grad(double x) {\n    if (x == x) return __builtin_nan(\"\");\n")],
        "tests": ["test_gradients"],
    },
    {
        "name": "gemm_split_skips_a_row",
        "what": "work split over threads (cpu_piece_range: GEMMs of every dtype, Gelu) starts every piece but "
                "the first one row, column or element late: one per piece keeps its old value",
        "file": "executor/cpu/gemm.c",
        "edits": [("    *lo = step * i;\n", "    *lo = step * i + (i > 0);\n")],
        "tests": ["test_cpu_gemm", "test_gemm16", "test_parallel_pieces"],
    },
    {
        "name": "exp_regression_diverges",
        "what": "exp_regression's learning rate 20 times too large: training diverges",
        "file": "examples/exp_regression.c",
        "edits": [("optimizer(gd, opt_name, lr)", "optimizer(gd, opt_name, lr * 20)"),
                  ("optimizer(gs, opt_name, lr)", "optimizer(gs, opt_name, lr * 20)")],
        "tests": ["exp_regression"],
    },
    {
        "name": "exp_regression_diverges_exit0",
        "what": "the same divergence with the chief's exit status forced to 0: only the script's own checks "
                "of the printed numbers can catch it",
        "file": "examples/exp_regression.c",
        "edits": [("optimizer(gd, opt_name, lr)", "optimizer(gd, opt_name, lr * 20)"),
                  ("optimizer(gs, opt_name, lr)", "optimizer(gs, opt_name, lr * 20)"),
                  ("            rc = 3;\n", "            rc = 0;\n")],
        "tests": ["exp_regression"],
    },
    {
        "name": "pipeline_loss_scale_ignored",
        "what": "a pipeline's micro-batch losses are not multiplied by its loss scale, so loss-scaled training divides unscaled gradients by the scale",
        "file": "graph/pipeline.c",
        "edits": [("        if (b->o->loss_scale.node) {\n            dg_output sc", "        if (false) {\n            dg_output sc")],
        "tests": ["test_pipeline"],
    },
    {
        "name": "pipeline_gradients_not_colocated",
        "what": "a pipeline's backward pass asks for the stage's device, not each op's, so the shards of a tensor-parallel stage compute their gradients on one device",
        "file": "graph/pipeline.c",
        "edits": [("{.colocate_gradients_with_ops = true}", "{.colocate_gradients_with_ops = false}")],
        "tests": ["test_gpt_model"],
    },
    {
        "name": "sim_thread_keeps_nothing",
        "what": "the simulator hands every op a thread made ready to the first thread free, as if the executor kept none itself",
        "file": "placer/simulate.c",
        "edits": [("bool keep = p->pool[du] && (kept++ == 0 || !p->handoff[v]);", "bool keep = (kept++, false);")],
        "tests": ["test_auto_place"],
    },
    {
        "name": "sim_no_wake_time",
        "what": "an op handed to a sleeping thread starts at once, without the thread's wake time",
        "file": "placer/simulate.c",
        "edits": [("        t += p->wake[d];", "        t += 0;")],
        "tests": ["test_auto_place"],
    },
    {
        "name": "cache_kept_after_last_session",
        "what": "the process's last master session is freed without giving the tensor cache back, so buffers freed as it closes stay held",
        "file": "runtime/master/master.c",
        "edits": [("    if (atomic_fetch_sub(&sessions_alive, 1) == 1) (void)dg_tensor_cache_release();\n",
                   "    atomic_fetch_sub(&sessions_alive, 1);\n")],
        "tests": ["test_server"],
    },
    {
        "name": "threads_computing_not_counted",
        "what": "a kernel entering its compute function is not counted, so the transport's I/O thread spins beside the kernels on a fully busy process",
        "file": "executor/executor.c",
        "edits": [("            exec_threads_computing_add(1);   // threads_computing.c\n", "")],
        "tests": ["test_threads_computing"],
    },
    {
        "name": "caller_never_takes_back",
        "what": "the caller of a step, idle, never takes back its nodes queued behind the pool's busy threads, so they wait while it sleeps",
        "file": "executor/executor.c",
        "edits": [("if (exec_pool_take(eg->pool, pool_task, s, &d)) {", "if (false && exec_pool_take(eg->pool, pool_task, s, &d)) {")],
        "tests": ["test_inter_op"],
    },
    {
        "name": "completion_behind_busy_drain",
        "what": "what a value arriving between two devices of the process makes ready waits in the caller's inbox while the caller computes something else",
        "file": "executor/executor.c",
        "edits": [("    if (eg->pool) {\n        // With inter-op threads, what the value made ready", "    if (false) {\n        // With inter-op threads, what the value made ready")],
        "tests": ["test_inter_op"],
    },
    {
        "name": "async_roots_under_the_drain",
        "what": "a step's asynchronous roots (a _Recv between two devices) wait on the caller's stack under the other roots' drain",
        "file": "executor/executor.c",
        "edits": [("        if (!eg->nodes[eg->roots[r]].def->start_async) s->ready[top++] = eg->roots[r];\n    for (int r = eg->n_roots - 1; r >= 0; r--)\n        if (eg->nodes[eg->roots[r]].def->start_async) s->ready[top++] = eg->roots[r];",
                   "        s->ready[top++] = eg->roots[r];")],
        "tests": ["test_inter_op"],
    },
    {
        "name": "tensor_cache_any_class",
        "what": "the tensor cache hands out the first cached buffer of any class, so a tensor can get a buffer smaller than it needs",
        "file": "graph/tensor_cache.c",
        "edits": [("        free_buffer *b = cache.lists[c];\n        if (b) {\n",
                   "        free_buffer *b = cache.lists[c];\n"
                   "        for (int mut_k = 0; !b && mut_k < N_CLASSES; mut_k++) if ((b = cache.lists[mut_k])) c = mut_k;\n        if (b) {\n")],
        "tests": ["test_tensor_cache"],
    },
    {
        "name": "virtual_cpu_not_listed",
        "what": "a session on a server does not list the task's devices when a node asks for its virtual CPU, and soft placement moves the node to CPU:0",
        "file": "runtime/master/master.c",
        "edits": [("        if (exec_device_name_is_accelerator(req)) return true;\n",
                   "        if (exec_device_name_is_accelerator(req)) return true;\n        continue;\n")],
        "tests": ["test_server"],
    },
    {
        "name": "split_step_ends_early",
        "what": "a task running two partitions of a step ends the step when the first is done, dropping the value it sent the other (the step fails at the deadline)",
        "file": "runtime/server/server.c",
        "edits": [("    if (j->split) {\n        pthread_mutex_lock(&s->mu);\n",
                   "    if (j->split && 0) {\n        pthread_mutex_lock(&s->mu);\n")],
        "tests": ["test_server"],
    },
]


def run(cmd, cwd=None, log=None, env=None):
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if log:
        with open(log, "a") as f:
            f.write("$ " + " ".join(cmd) + "\n" + p.stdout)
    return p.returncode, p.stdout


def copy_tree(src, dst):
    """The tree as git sees it (tracked, and untracked files not ignored), without build outputs."""
    rc, out = run(["git", "-C", src, "ls-files", "-co", "--exclude-standard", "-z"])
    if rc != 0:
        sys.exit("mutate: git ls-files failed in %s: %s" % (src, out))
    for rel in filter(None, out.split("\0")):
        s = os.path.join(src, rel)
        if not os.path.isfile(s):
            continue
        d = os.path.join(dst, rel)
        os.makedirs(os.path.dirname(d), exist_ok=True)
        shutil.copy2(s, d)


def first_failure(out):
    """What a failing CTest --output-on-failure log says first: the failed case and its message."""
    case = re.search(r"\[  FAILED  \] (\S+)", out)
    msg = None
    for pat in [r"^ERROR: (.*)$", r"^.*: element \d+ of \d+ .*$", r"^FAIL: .*$", r"^\[  ERROR   \] --- (?!\[)(.*)$",
                r"^.*error: Failure!.*$"]:
        m = re.search(pat, out, re.M)
        if m:
            msg = m.group(0).strip()
            break
    parts = [p for p in ((case.group(1) + ":") if case else None, msg) if p]
    return " ".join(parts)[:300]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", help="scratch directory (default: a new temporary one, removed after)")
    ap.add_argument("--report", help="also write a Markdown report here")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("names", nargs="*", help="mutants to run (default: all)")
    a = ap.parse_args()
    if a.list:
        for m in MUTANTS:
            print("%-28s %s (%s; caught by %s)" % (m["name"], m["what"], m["file"], ", ".join(m["tests"])))
        return 0
    chosen = [m for m in MUTANTS if not a.names or m["name"] in a.names]
    unknown = set(a.names) - {m["name"] for m in MUTANTS}
    if unknown:
        sys.exit("mutate: no mutant named %s (--list shows them)" % ", ".join(sorted(unknown)))

    src = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    work = a.work or tempfile.mkdtemp(prefix="dg-mutants-")
    tree, build, log = os.path.join(work, "src"), os.path.join(work, "build"), os.path.join(work, "build.log")
    t0 = time.time()
    print("mutate: copying the tree to %s" % tree, flush=True)
    if os.path.exists(tree):
        shutil.rmtree(tree)
    copy_tree(src, tree)
    env = dict(os.environ)
    if shutil.which("nvcc") is None and os.access("/usr/local/cuda/bin/nvcc", os.X_OK):
        env["PATH"] = env.get("PATH", "") + ":/usr/local/cuda/bin"
    # The CUDA device is not what these mutants break: built without it, the copy builds faster;
    # DG_SCRATCH_BUILD compiles the direct convolutions (a minute at -O3, rebuilt by three
    # mutants) without optimisation.
    rc, out = run(["cmake", "-S", tree, "-B", build, "-DCMAKE_BUILD_TYPE=RelWithDebInfo", "-DDG_WITH_CUDA=OFF",
                   "-DDG_SCRATCH_BUILD=ON"],
                  log=log, env=env)
    if rc != 0:
        sys.exit("mutate: configuring the copy failed (%s):\n%s" % (log, out[-2000:]))

    # The targets every chosen mutant's tests need, built once unmutated, and checked green:
    # a test that fails before any mutation proves nothing about a mutant.
    targets = sorted({t for m in chosen for t in m["tests"]})
    jobs = str(os.cpu_count() or 2)
    print("mutate: building %s" % " ".join(build_targets(targets)), flush=True)
    rc, out = run(["cmake", "--build", build, "-j", jobs, "--target"] + build_targets(targets), log=log, env=env)
    if rc != 0:
        sys.exit("mutate: building the unmutated copy failed (%s):\n%s" % (log, out[-3000:]))
    regex = "^(" + "|".join(targets) + ")$"
    rc, out = run(["ctest", "--test-dir", build, "-R", regex, "--output-on-failure", "--timeout", "600"], env=env)
    if rc != 0:
        sys.exit("mutate: the unmutated tests fail, so no mutant can be judged:\n%s" % out[-3000:])
    print("mutate: unmutated %s pass (%.0f s)" % (", ".join(targets), time.time() - t0), flush=True)

    results = []
    for m in chosen:
        t1 = time.time()
        path = os.path.join(tree, m["file"])
        with open(path) as f:
            orig = f.read()
        r = {"mutant": m["name"], "what": m["what"], "file": m["file"], "tests": m["tests"]}
        mutated, stale = orig, []
        for old, new in m["edits"]:
            if mutated.count(old) != 1:
                stale.append("%r found %d times" % (old.strip()[:60], mutated.count(old)))
            mutated = mutated.replace(old, new)
        if stale:
            r.update(result="stale", detail="; ".join(stale))
            results.append(r)
            print(json.dumps(r), flush=True)
            continue
        with open(path, "w") as f:
            f.write(mutated)
        try:
            rc, out = run(["cmake", "--build", build, "-j", jobs, "--target"] + build_targets(m["tests"]),
                          log=log, env=env)
            if rc != 0:
                r.update(result="build_failed", detail=out[-500:])
            else:
                failed, lines = [], {}
                for t in m["tests"]:
                    rc, out = run(["ctest", "--test-dir", build, "-R", "^%s$" % t, "--output-on-failure",
                                   "--timeout", "600"], env=env)
                    if rc != 0:
                        failed.append(t)
                        lines[t] = first_failure(out).replace(tree + "/", "")
                r.update(result="caught" if failed else "survived", caught_by=failed, first_failure=lines)
        finally:
            with open(path, "w") as f:
                f.write(orig)
        r["seconds"] = round(time.time() - t1, 1)
        results.append(r)
        print(json.dumps(r), flush=True)

    caught = sum(r["result"] == "caught" for r in results)
    bad = len(results) - caught
    summary = "mutants: %d caught, %d survived or stale (%.0f s)" % (caught, bad, time.time() - t0)
    if a.report:
        cpu = ""
        try:
            with open("/proc/cpuinfo") as f:
                cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
        except OSError:
            pass
        rev = run(["git", "-C", src, "rev-parse", "--short", "HEAD"])[1].strip()
        with open(a.report, "w") as f:
            f.write("# Mutation checks\n\n`tests/mutation/mutate.py` on %s (tree at %s, %s).\n\n" %
                    (time.strftime("%Y-%m-%d"), rev, cpu))
            f.write("| mutant | what it breaks | result | caught by | first failure |\n|---|---|---|---|---|\n")
            for r in results:
                ff = "; ".join("%s: %s" % (k, v) for k, v in r.get("first_failure", {}).items())
                f.write("| %s | %s (`%s`) | %s | %s | %s |\n" % (
                    r["mutant"], r["what"], r["file"], r["result"], ", ".join(r.get("caught_by", [])) or "-",
                    ff.replace("|", "\\|") or r.get("detail", "").replace("\n", " ")[:200]))
            f.write("\n%s\n" % summary)
    print(summary)
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
