/* Models to place (docs/PLACEMENT.md): an Inception-v3-like CNN (modules of four branches and a
 * concatenation), a GNMT-like LSTM encoder-decoder with attention (unrolled), and a GPT-like
 * transformer, each with its loss, gradients and an optimizer. A model is cut into units (the
 * CNN's stem, modules and head; GNMT's layers, attention and softmax; the transformer's
 * embedding, blocks and head): given unit_device, each unit's ops ask for that device and the
 * gradients run beside them (the layer-wise placement an expert writes); without it, no op asks
 * for any device. Shapes are all known (the batch is fixed). */
#ifndef DG_PLACE_MODELS_H
#define DG_PLACE_MODELS_H

#include <stdbool.h>
#include <stdint.h>

#include "distgraph/distgraph.h"

typedef enum place_model_kind { PLACE_INCEPTION = 0, PLACE_GNMT = 1, PLACE_TRANSFORMER = 2 } place_model_kind;

typedef struct place_model_config {
    place_model_kind kind;
    int64_t batch;
    // Inception: modules, image side, channels in; GNMT: layers (encoder and decoder each),
    // sequence length, vocabulary, units; transformer: blocks, sequence length, vocabulary,
    // width (heads: width / 64).
    int64_t layers, length, vocab, units;
} place_model_config;

// Baechi's configurations: Inception-v3-like (11 modules, 35x35, batch 32), GNMT (4 layers,
// length 40, vocabulary 30,000, 512 units, batch 128), transformer (12 blocks, length 512,
// vocabulary 32,000, width 768, batch 8).
place_model_config place_model_default(place_model_kind kind);
const char *place_model_name(place_model_kind kind);
// Units a model is cut into.
int place_model_units(const place_model_config *c);
// The unit an expert would give device u of n_devices for unit i of n (layer-wise: units in
// order, in equal runs; GNMT as Baechi's expert: encoder and decoder layer l on device l, the
// attention and softmax with the last layer).
int place_model_expert_device(const place_model_config *c, int unit, int n_devices);

// Builds the model into g. unit_device(ctx, unit) gives each unit's device (NULL: none asked
// for). Returns the train op (momentum SGD) and sets *loss; NULL (and the graph's status) on
// error.
dg_node *place_model_build(dg_graph *g, const place_model_config *c, const char *(*unit_device)(void *ctx, int unit),
                           void *ctx, dg_output *loss);
// The nodes a run of the targets needs (inputs and control inputs, transitively), in the
// graph's order. Returns: new array (free()), *n set.
dg_node **place_model_step_nodes(dg_graph *g, dg_node *const *targets, int n_targets, int *n);

#endif
