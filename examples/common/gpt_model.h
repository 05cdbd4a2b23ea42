/* A byte-level GPT (GPT-2's architecture, nanoGPT's configurations) built from distgraph's ops,
 * and the text it trains on: the fortunes of Debian's `fortunes` package. gpt_replica.c trains
 * it across a cluster; bench/peers/ builds the same model in PyTorch. */
#ifndef DG_GPT_MODEL_H
#define DG_GPT_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "distgraph/distgraph.h"

typedef struct gpt_config {
    int64_t vocab;        // 256: bytes
    int64_t n_layer, n_head, n_embd;
    int64_t block_size;   // the context: every sequence is this long
    double dropout;       // after the embeddings, each attention projection and each MLP
    // The token embedding as a partitioned variable of this many parts ("wte/part_<i>", rows
    // split as TensorFlow's fixed-size partitioner does; a replica device setter spreads them
    // over the ps tasks); 0 or 1: one variable "wte". Tied either way: the output projection
    // is the concatenation of the parts, so each part's gradient is its rows' sparse gradient
    // from the lookup plus its slice of the projection's dense one.
    int wte_parts;
} gpt_config;

// nanoGPT's CPU configuration (4 layers, 4 heads, width 128, context 64, dropout 0) and its
// GPU one (6, 6, 384, 256, dropout 0.2).
gpt_config gpt_config_cpu(void);
gpt_config gpt_config_gpu(void);

typedef struct gpt_model {
    dg_output idx;        // int32 [?, block_size]: the input bytes
    dg_output targets;    // int32 [?, block_size]: the next byte of each position
    dg_output training;   // bool scalar: dropout on
    dg_output logits;     // float32 [? * block_size, vocab]
    dg_output loss;       // the mean cross entropy over every position
    dg_output global_step;
} gpt_model;

// Builds the network: token and position embeddings, n_layer pre-norm blocks (LayerNorm,
// causal multi-head attention through dg_attention, a residual; LayerNorm, a 4x MLP with the
// erf GELU, a residual), a final LayerNorm and logits through the token embedding again (tied,
// as GPT-2). Weights N(0, 0.02), the residual projections N(0, 0.02 / sqrt(2 n_layer)), biases
// 0, LayerNorm scales 1. Variables are named as gpt_variable_names lists them. Returns
// dg_graph_ok(g).
bool gpt_build(dg_graph *g, const gpt_config *c, int64_t seed, gpt_model *m);

// The network cut into pipeline stages (distgraph/pipeline.h, docs/PIPELINES.md): stage k of S
// holds blocks [k L / S, (k + 1) L / S); stage 0 also the embeddings, the last stage the final
// LayerNorm, the tied output projection and the loss. The activations [? * T, C] and the
// targets travel from stage to stage. Variables are named as gpt_build names them, with the same
// initial values for the same seed.
typedef struct gpt_pipeline_arg {
    gpt_config c;
    int64_t seed;
    int n_stages;
    dg_output training;
    // Tensor parallelism inside each stage: its blocks split over devices 0 .. tp - 1 of
    // tp_device_type ("CPU" or "GPU") of the stage's task (as gpt_build_tensor_parallel splits
    // them); 0 or 1: not split. The caller sets tp and tp_device_type before gpt_build_pipeline,
    // which fills the rest.
    int tp;
    const char *tp_device_type;
    const char *const *devices;   // the pipeline's stage devices (tasks), n_devices of them
    int n_devices;
} gpt_pipeline_arg;
// The stage function (arg: a gpt_pipeline_arg).
int gpt_pipeline_stage(dg_graph *g, int stage, int mb, const dg_output *in, int n_in, dg_output *out, int cap,
                       void *arg);
// The placeholders of gpt_build and the pipeline of o (its devices, chunks, micro-batches and
// schedule; the stage function is gpt_pipeline_stage over *arg, which must outlive the build):
// m->loss is the pipeline's mean loss, m->logits stays null; *p gets the variables and their
// accumulated gradients. Every stage needs at least one block; the token embedding is one
// variable. groups > 1: data parallelism across that many pipelines, o->devices holding each
// group's devices in turn (groups x n_devices): group i trains on the i-th part of the batch
// with group 0's variables, and p's gradients are the groups' mean. With arg->tp > 1 each
// stage's blocks are split over that many devices of its task (the stages' devices must be
// tasks; no dropout; the variables are gpt_build_tensor_parallel's shards). false with st set.
bool gpt_build_pipeline(dg_graph *g, const gpt_config *c, int64_t seed, const dg_pipeline_options *o, int groups,
                        gpt_pipeline_arg *arg, gpt_model *m, dg_pipeline *p, dg_status *st);

// The network with each block's matrices split over n devices of one task
// (distgraph/tensor_parallel.h): attention by heads, the MLP by hidden units, a LocalAllReduce
// after each (two a block forward, two backward); the embeddings and the head on devices[0], the
// layer norms and residuals on every device. Shards are "h<l>/attn/kernel/part_<r>" and the like
// (checkpoints are not the unsplit model's); with n = 1 the single shard is drawn as gpt_build
// draws the whole matrix. No dropout. Returns dg_graph_ok(g).
bool gpt_build_tensor_parallel(dg_graph *g, const gpt_config *c, int64_t seed, const char *const *devices, int n,
                               gpt_model *m);

// The decoder for sampling (gpt_sample): one new position at a time with a key/value cache
// kept by the caller. Feeds: the token and its position (int32 [1]) and, per layer, the cached
// keys and values of the positions before it (float32 [1, n_head, P, n_embd / n_head], P >= 0);
// fetches: the next byte's logits [1, vocab] and, per layer, the new position's key and value
// ([1, n_head, 1, head width]) to append to the cache. The variables are the training graph's,
// by name (restored from its checkpoint, or shared when built into the training graph).
#define GPT_MAX_LAYERS 64
typedef struct gpt_decoder {
    dg_output tok, pos;
    dg_output past_k[GPT_MAX_LAYERS], past_v[GPT_MAX_LAYERS];
    dg_output new_k[GPT_MAX_LAYERS], new_v[GPT_MAX_LAYERS];
    dg_output logits;
} gpt_decoder;
bool gpt_build_decoder(dg_graph *g, const gpt_config *c, gpt_decoder *d);

// The text: the concatenation of the fortune files (names without a dot, sorted), split into
// train (the first 90%) and validation bytes.
typedef struct gpt_text {
    uint8_t *bytes;
    int64_t n, n_train;   // bytes in all, of them for training
    uint64_t rng;         // the training windows' stream
} gpt_text;

#define GPT_DEFAULT_DATA_DIR "/usr/share/games/fortunes"

// The next draw of a xorshift64* stream (the training windows', gpt_sample's).
uint64_t gpt_next_u64(uint64_t *s);
// Loads dir's fortunes; seed starts the stream of training windows. false with st set.
bool gpt_text_load(const char *dir, uint64_t seed, gpt_text *t, dg_status *st);
void gpt_text_free(gpt_text *t);
// A training batch: batch windows of block_size + 1 bytes at random offsets of the training
// part; x the first block_size bytes of each, y the last.
void gpt_text_batch(gpt_text *t, int64_t batch, int64_t block_size, int32_t *x, int32_t *y);
// The fixed validation windows: n of them, evenly spaced over the validation part.
int64_t gpt_text_val_offset(const gpt_text *t, int64_t k, int64_t n, int64_t block_size);

// The mean loss over the n fixed validation windows, evaluated batch at a time (dropout off).
bool gpt_validation_loss(dg_session *s, const gpt_model *m, const gpt_text *t, int64_t n_windows, int64_t batch,
                         int64_t block_size, double *loss, dg_status *st);

#endif
