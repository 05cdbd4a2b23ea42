/* Tensor parallelism as Megatron-LM does it (Shoeybi et al., 2019): the matrices of a layer split
 * over a group of devices, each device computing with its shard, the partial results summed: by
 * a LocalAllReduce (distgraph/collective.h) when the devices are one task's, and when they span
 * tasks by an AddN on the group's first device that every device then reads (the placer's Send
 * and Recv between the tasks; the same bits everywhere). A column-parallel linear needs no
 * communication forward; a row-parallel one sums its partial products; attention is split by
 * heads (a column-parallel q, k, v projection, each device its heads, a row-parallel output
 * projection) and the MLP by its hidden units (column-parallel, GELU, row-parallel): two
 * all-reduces forward per transformer block and, through the LocalAllReduce's gradient (the same
 * reduction of the output gradients), two backward. docs/PIPELINES.md, "Tensor parallelism".
 *
 * Inputs and outputs are one per device: xs[r] and ys[r] live on devices[r]; a layer's input
 * must hold the same values on every device (the output of a row-parallel layer does). Shards
 * are variables "<name>/kernel/part_<r>" and "<name>/bias/part_<r>" (found by name when they exist,
 * else made by dg_get_variable on their device; a random initializer's fixed seed moves on by
 * 7919 per part, so that parts differ). */
#ifndef DISTGRAPH_TENSOR_PARALLEL_H
#define DISTGRAPH_TENSOR_PARALLEL_H

#include <stdbool.h>
#include <stdint.h>

#include "distgraph/graph.h"
#include "distgraph/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

// The devices a layer is split over, in rank order (at most 64): of one task, or of several.
typedef struct dg_tp_group {
    const char *const *devices;
    int n;
} dg_tp_group;

// y = x W + b with W [in, out] split by columns: on device r, ys[r] = xs[r] W_r + b_r, W_r
// "<name>/kernel/part_<r>" [in, out / n] (init), b_r "<name>/bias/part_<r>" [out / n] (zeros).
// ys[r] holds columns [r out/n, (r + 1) out/n) of y. out must divide by n. false with the graph's
// sticky status set.
bool dg_tp_column_linear(dg_graph *g, const char *name, const dg_tp_group *grp, const dg_output *xs, int64_t in,
                         int64_t out, dg_initializer init, dg_output *ys);
// y = x W + b with W [in, out] split by rows: xs[r] holds columns [r in/n, (r + 1) in/n) of x
// (a column-parallel layer's output), W_r "<name>/kernel/part_<r>" [in / n, out]; the partial
// products are summed (one LocalAllReduce within a task), and b ("<name>/bias" [out], zeros, on devices[0])
// added on every device: ys[r] is all of y on device r.
bool dg_tp_row_linear(dg_graph *g, const char *name, const dg_tp_group *grp, const dg_output *xs, int64_t in,
                      int64_t out, dg_initializer init, dg_output *ys);
// Multi-head attention over rows [batch * T, C] split by heads: "<name>/attn", a column-parallel
// projection whose part r holds the q, k and v columns of heads [r H/n, (r + 1) H/n) (q's,
// then k's, then v's), scaled dot-product attention over those heads (causal when asked), and
// "<name>/attn_proj", the row-parallel output projection (init_proj). n_head must divide by n.
bool dg_tp_attention(dg_graph *g, const char *name, const dg_tp_group *grp, const dg_output *xs, int64_t T,
                     int64_t C, int64_t n_head, bool causal, dg_initializer init, dg_initializer init_proj,
                     dg_output *ys);
// The transformer MLP: "<name>/fc" column-parallel [C, hidden], GELU (erf), "<name>/mlp_proj"
// row-parallel [hidden, C] (init_proj). hidden must divide by n.
bool dg_tp_mlp(dg_graph *g, const char *name, const dg_tp_group *grp, const dg_output *xs, int64_t C, int64_t hidden,
               dg_initializer init, dg_initializer init_proj, dg_output *ys);

#ifdef __cplusplus
}
#endif
#endif
