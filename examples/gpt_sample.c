/* gpt_sample: writes text with the GPT gpt_replica trained, from its checkpoint. The decoder
 * (examples/common/gpt_model.h) takes one byte at a time with a key/value cache kept here, so
 * that N new bytes cost N steps of one position each: the prompt is read in byte by byte, then
 * each new byte is drawn from the logits divided by --temperature, among the --top_k likeliest.
 * When the context (the model's block size) is full, the cache restarts from the last half of
 * it. Prints the prompt and the new text, then (to stderr) the speed.
 *   build/bin/gpt_replica --worker_hosts localhost:2223 --job_name worker --task_index 0 \
 *       --checkpoint_path gpt.db
 *   build/bin/gpt_sample --checkpoint gpt.db --prompt "Q: " --tokens 300 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "distgraph/checkpoint.h"
#include "distgraph/distgraph.h"
#include "flags.h"
#include "gpt_model.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// A byte drawn from softmax(logits / temperature) over the top_k likeliest (0: all); the
// likeliest when temperature is 0.
static int draw(const float *logits, int V, double temperature, int top_k, uint64_t *rng) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (temperature <= 0) return best;
    float cut = -INFINITY;   // the k-th largest logit
    if (top_k > 0 && top_k < V) {
        float *sorted = malloc((size_t)V * sizeof *sorted);
        if (!sorted) return best;
        memcpy(sorted, logits, (size_t)V * sizeof *sorted);
        for (int i = 0; i < top_k; i++) {   // a partial selection sort: top_k is small
            int m = i;
            for (int j = i + 1; j < V; j++)
                if (sorted[j] > sorted[m]) m = j;
            float t = sorted[i];
            sorted[i] = sorted[m];
            sorted[m] = t;
        }
        cut = sorted[top_k - 1];
        free(sorted);
    }
    double sum = 0, p[1024];
    for (int i = 0; i < V; i++) sum += p[i] = logits[i] >= cut ? exp(((double)logits[i] - logits[best]) / temperature) : 0;
    double u = (double)(gpt_next_u64(rng) >> 11) / 9007199254740992.0 * sum;
    for (int i = 0; i < V; i++)
        if ((u -= p[i]) < 0) return i;
    return best;
}

typedef struct cache {
    int64_t L, H, Dh, T, len;   // len: positions held
    float *k, *v;               // [L][H][T][Dh]
} cache;

// The cached keys (or values) of layer l as a [1, H, len, Dh] tensor.
static dg_tensor *cached(const cache *c, const float *base, int64_t l, dg_status *st) {
    const int64_t dims[4] = {1, c->H, c->len, c->Dh};
    dg_tensor *t = dg_tensor_new(DG_FLOAT32, dg_shape_make(4, dims), st);
    if (!t) return NULL;
    float *o = dg_tensor_f32(t);
    for (int64_t h = 0; h < c->H; h++)
        memcpy(o + h * c->len * c->Dh, base + ((l * c->H + h) * c->T) * c->Dh, (size_t)(c->len * c->Dh) * sizeof *o);
    return t;
}

// Runs the decoder on byte at position c->len, appends its keys and values, and gives the next
// byte's logits (V floats).
static bool decode(dg_session *s, const gpt_decoder *d, cache *c, int byte, float *logits, int V, dg_status *st) {
    int L = (int)c->L, nf = 0, n_out = 1 + 2 * L;
    dg_output feeds[2 + 2 * GPT_MAX_LAYERS], fetches[1 + 2 * GPT_MAX_LAYERS];
    dg_tensor *vals[2 + 2 * GPT_MAX_LAYERS] = {NULL}, *out[1 + 2 * GPT_MAX_LAYERS] = {NULL};
    int32_t tok = byte, pos = (int32_t)c->len;
    feeds[nf] = d->tok;
    vals[nf++] = dg_tensor_from_data(DG_INT32, dg_shape1(1), &tok, st);
    feeds[nf] = d->pos;
    vals[nf++] = dg_tensor_from_data(DG_INT32, dg_shape1(1), &pos, st);
    fetches[0] = d->logits;
    for (int l = 0; l < L; l++) {
        feeds[nf] = d->past_k[l];
        vals[nf++] = cached(c, c->k, l, st);
        feeds[nf] = d->past_v[l];
        vals[nf++] = cached(c, c->v, l, st);
        fetches[1 + 2 * l] = d->new_k[l];
        fetches[2 + 2 * l] = d->new_v[l];
    }
    bool ok = true;
    for (int i = 0; i < nf; i++) ok = ok && vals[i];
    ok = ok && dg_session_run(s, feeds, vals, nf, fetches, out, n_out, NULL, 0, st);
    if (ok) {
        memcpy(logits, dg_tensor_f32(out[0]), (size_t)V * sizeof *logits);
        for (int l = 0; l < L; l++)
            for (int64_t h = 0; h < c->H; h++) {
                size_t at = (size_t)(((l * c->H + h) * c->T + c->len) * c->Dh);
                memcpy(c->k + at, dg_tensor_f32(out[1 + 2 * l]) + h * c->Dh, (size_t)c->Dh * sizeof(float));
                memcpy(c->v + at, dg_tensor_f32(out[2 + 2 * l]) + h * c->Dh, (size_t)c->Dh * sizeof(float));
            }
        c->len++;
    }
    for (int i = 0; i < nf; i++) dg_tensor_unref(vals[i]);
    for (int i = 0; i < n_out; i++) dg_tensor_unref(out[i]);
    return ok;
}

int main(int argc, char **argv) {
    const char *ckpt = "", *prompt = "\n";
    int64_t tokens = 200, top_k = 40, seed = 1, step = -1, n_layer = -1, n_head = 0, n_embd = 0, block_size = 0;
    double temperature = 0.8;
    bool gpu_config = false;
    flag_def defs[] = {
        {"checkpoint", FLAG_STRING, &ckpt, "gpt_replica's checkpoint file (--checkpoint_path)"},
        {"step", FLAG_INT, &step, "the checkpoint's global step (-1: the newest)"},
        {"prompt", FLAG_STRING, &prompt, "the text to continue (default a newline)"},
        {"tokens", FLAG_INT, &tokens, "bytes to write (default 200)"},
        {"temperature", FLAG_DOUBLE, &temperature, "divides the logits; 0: always the likeliest byte (default 0.8)"},
        {"top_k", FLAG_INT, &top_k, "draw among the k likeliest bytes, 0: all (default 40)"},
        {"seed", FLAG_INT, &seed, "the draws' seed (default 1)"},
        {"gpu_config", FLAG_BOOL, &gpu_config, "the model was trained with gpt_replica --gpu_config"},
        {"n_layer", FLAG_INT, &n_layer, "as given to gpt_replica (default: the configuration's)"},
        {"n_head", FLAG_INT, &n_head, "as given to gpt_replica"},
        {"n_embd", FLAG_INT, &n_embd, "as given to gpt_replica"},
        {"block_size", FLAG_INT, &block_size, "as given to gpt_replica"},
    };
    bool help;
    if (!flags_parse(argc, argv, defs, sizeof defs / sizeof defs[0], "usage: gpt_sample --checkpoint FILE [flags]", &help))
        return 2;
    if (help) return 0;
    gpt_config c = gpu_config ? gpt_config_gpu() : gpt_config_cpu();
    if (n_layer >= 0) c.n_layer = n_layer;
    if (n_head > 0) c.n_head = n_head;
    if (n_embd > 0) c.n_embd = n_embd;
    if (block_size > 0) c.block_size = block_size;
    if (!*ckpt || tokens < 0 || top_k < 0 || !(temperature >= 0) || c.block_size < 2 || c.n_layer > GPT_MAX_LAYERS ||
        c.vocab > 1024) {
        fprintf(stderr, "gpt_sample: needs --checkpoint; --tokens, --top_k and --temperature >= 0; see --help\n");
        return 2;
    }
    int rc = 1;
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    dg_output vars[512], vals_ph[512];
    dg_node *assigns[512];
    const char *names[512];
    dg_tensor *values[512] = {NULL};
    dg_checkpoint_slice regions[512];
    int n_vars = 0;
    dg_checkpoint_store *store = NULL;
    dg_session *s = NULL;
    gpt_decoder d;
    cache kv = {c.n_layer, c.n_head, c.n_embd / (c.n_head ? c.n_head : 1), c.block_size, 0, NULL, NULL};
    size_t cells = (size_t)(kv.L * kv.H * kv.T * kv.Dh);
    kv.k = calloc(cells ? cells : 1, sizeof(float));
    kv.v = calloc(cells ? cells : 1, sizeof(float));
    float logits[1024];
    int64_t restored = -1;
    if (!kv.k || !kv.v) {
        fprintf(stderr, "gpt_sample: the cache: out of memory\n");
        goto out;
    }
    if (!gpt_build_decoder(g, &c, &d) || !dg_graph_check(g, st)) {
        fprintf(stderr, "gpt_sample: building the decoder: %s\n", dg_status_message(dg_graph_status(g)));
        goto out;
    }
    // The decoder's variables from the checkpoint (which also holds the optimizer's slots and
    // the global step, not wanted here), each through an Assign fed its value.
    n_vars = dg_graph_collection_size(g, DG_GLOBAL_VARIABLES);
    if (n_vars > 512) {
        fprintf(stderr, "gpt_sample: %d variables: at most 512\n", n_vars);
        goto out;
    }
    // Each variable is read as the whole region of its name, so a token embedding saved in parts
    // (gpt_replica --wte_parts) is assembled from them.
    for (int i = 0; i < n_vars; i++) {
        vars[i] = (dg_output){dg_graph_collection_get(g, DG_GLOBAL_VARIABLES, i), 0};
        names[i] = dg_node_name(vars[i].node);
        vals_ph[i] = dg_placeholder(g, NULL, DG_FLOAT32, dg_output_shape(vars[i]));
        assigns[i] = dg_assign(g, NULL, vars[i], vals_ph[i]).node;
        regions[i] = (dg_checkpoint_slice){.full_name = names[i], .full_shape = dg_output_shape(vars[i])};
        if (!(values[i] = dg_tensor_new(DG_FLOAT32, dg_output_shape(vars[i]), st))) goto out;
    }
    if (!dg_graph_check(g, st) || !(store = dg_checkpoint_store_new(ckpt, false, st)) ||
        !dg_checkpoint_restore_slices(store, step, names, regions, values, n_vars, &restored, st) ||
        !(s = dg_session_new(g, "local", NULL, st)) ||
        !dg_session_run(s, vals_ph, values, n_vars, NULL, NULL, 0, assigns, n_vars, st)) {
        fprintf(stderr, "gpt_sample: %s: %s: %s (the model flags must be gpt_replica's)\n", ckpt,
                dg_code_name(dg_status_code(st)), dg_status_message(st));
        goto out;
    }
    uint64_t rng = (uint64_t)seed * 0x9E3779B97F4A7C15ull + 1;
    if (!*prompt) prompt = "\n";   // a context needs one byte to start from
    size_t plen = strlen(prompt);
    // The last bytes of the context, to read in again when it is full.
    unsigned char *hist = malloc((size_t)c.block_size);
    int64_t n_hist = 0;
    if (!hist) goto out;
    fwrite(prompt, 1, plen, stdout);
    double t0 = now_s();
    int64_t steps = 0;
    bool ok = true;
    int next = -1;
    // Every prompt byte, then each new byte but the last, goes through the decoder once.
    size_t n_steps = plen + (size_t)tokens - (tokens > 0 ? 1 : 0);
    for (size_t i = 0; ok && i < n_steps; i++) {
        int byte = i < plen ? (unsigned char)prompt[i] : next;
        if (kv.len == c.block_size) {   // full: keep the last half, read it in again
            int64_t keep = c.block_size / 2;
            memmove(hist, hist + n_hist - keep, (size_t)keep);
            n_hist = keep;
            kv.len = 0;
            for (int64_t j = 0; ok && j < keep; j++, steps++) ok = decode(s, &d, &kv, hist[j], logits, (int)c.vocab, st);
        }
        if (!ok) break;
        ok = decode(s, &d, &kv, byte, logits, (int)c.vocab, st);
        steps++;
        if (n_hist == c.block_size) {
            memmove(hist, hist + 1, (size_t)(n_hist - 1));
            n_hist--;
        }
        hist[n_hist++] = (unsigned char)byte;
        next = draw(logits, (int)c.vocab, temperature, (int)top_k, &rng);
        if (i + 1 >= plen) fputc(next, stdout);
    }
    free(hist);
    fputc('\n', stdout);
    fflush(stdout);
    if (!ok) {
        fprintf(stderr, "gpt_sample: decoding: %s: %s\n", dg_code_name(dg_status_code(st)), dg_status_message(st));
        goto out;
    }
    double dt = now_s() - t0;
    fprintf(stderr, "gpt_sample: checkpoint of global step %lld; %lld new bytes, %lld decoder steps in %.3f s "
                    "(%.1f steps/s)\n", (long long)restored, (long long)tokens, (long long)steps, dt,
            (double)steps / (dt > 0 ? dt : 1e-9));
    rc = 0;
out:
    dg_session_free(&s);
    dg_checkpoint_store_free(&store);
    for (int i = 0; i < n_vars; i++) dg_tensor_unref(values[i]);
    dg_graph_free(&g);
    free(kv.k);
    free(kv.v);
    dg_status_free(&st);
    return rc;
}
