/* gpt_replica: a byte-level GPT (examples/common/gpt_model.h) trained on the fortunes of
 * Debian's `fortunes` package, with every mode of mnist_replica (examples/mnist_replica.c says
 * more): one process (--ps_hosts "" and one worker), asynchronous with parameter servers,
 * --sync_replicas or --all_reduce, checkpoints, --logdir, --trace_step.
 *
 * The default model is nanoGPT's CPU configuration: 4 layers, 4 heads, width 128, context 64,
 * batch 12, dropout 0; AdamW at 1e-3 (betas 0.9 and 0.99, weight decay 0.1 on the matrices),
 * 100 warmup steps then cosine decay to 1e-4 at the last step, gradients clipped at global norm
 * 1.0. --gpu_config selects the GPU configuration (6 layers, 6 heads, width 384, context 256,
 * dropout 0.2; give it --batch_size 64). Progress lines give each step's loss; the end gives the validation
 * loss, the mean over --eval_windows fixed windows of the last 10% of the text.
 * With --pipeline_stages P the model is cut into P stages (docs/PIPELINES.md): the worker runs the
 * first and is the client, ps task k runs stage k + 1, and each global batch runs as
 * --micro_batches micro-batches under --schedule (gpipe, 1f1b, interleaved with --chunks stages
 * per process, zb-h1), optionally recomputing activations (--recompute):
 *   build/bin/dg-launch --ps 1 --workers 1 -- build/bin/gpt_replica --pipeline_stages 2 --micro_batches 4
 * With --train_records the training windows come through a dataset (docs/DATASETS.md, "The
 * examples"): files cut into records of context + 1 bytes (the text's training part, written by
 * `gpt_replica write_train_text --out FILE`), each worker its shard, shuffled, repeated; the
 * chief's checkpoints keep the input's position.
 *   build/bin/gpt_replica --worker_hosts localhost:2223 --job_name worker --task_index 0
 *   build/bin/dg-launch --ps 0 --workers 2 -- build/bin/gpt_replica --all_reduce */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distgraph/partitioned.h"
#include "gpt_model.h"
#include "mlp_model.h"   // model_training_value
#include "replica.h"
#include "replica_input.h"

typedef struct gpt_state {
    const char *data_dir;
    bool gpu_config;
    int64_t n_layer, n_head, n_embd, block_size, warmup_steps, eval_windows, batch, lr_end_step, wte_parts;
    double dropout, weight_decay, min_lr, beta2, grad_clip;
    gpt_config cfg;
    gpt_text text;
    gpt_model m;
    gpt_model eval;              // with a pipeline: the plain forward pass, for the validation loss
    bool has_eval;
    int32_t *x, *y;
    dg_tensor *xt, *yt, *on;
    const char *train_records;   // --train_records ("": windows drawn from the text in memory)
    int64_t pipeline_stages, micro_batches, chunks;   // --pipeline_stages 0: no pipeline
    int64_t pipeline_groups;                          // data parallelism across pipelines
    int64_t tensor_parallel;                          // 0: off; N: the blocks split over N devices
    const char *tp_device_type;
    bool tp_tasks;                                    // shard r on task r (worker, ps 0, ps 1, ...)
    const char *schedule;
    bool recompute;
    dg_pipeline pipe;
    gpt_pipeline_arg pipe_arg;
    char stage_dev[64][64];      // with a pipeline: process k's task, group by group
    int64_t shuffle_buffer, seed;
    replica_input in;
} gpt_state;

static bool check_flags(void *state, int64_t batch_size) {
    gpt_state *s = state;
    // -1 (--n_layer, --dropout) or 0 (the others): the configuration's value.
    if (s->n_layer < -1 || s->n_head < 0 || s->n_embd < 0 || s->block_size < 0 ||
        !(s->dropout == -1 || (s->dropout >= 0 && s->dropout < 1)) || s->wte_parts < 0 ||
        s->wte_parts > DG_MAX_PARTITIONS) {
        fprintf(stderr, "gpt_replica: --n_layer, --n_head, --n_embd and --block_size must be >= 0 (0: the "
                        "configuration's), --dropout in [0, 1), --wte_parts in 0..%d\n", DG_MAX_PARTITIONS);
        return false;
    }
    s->cfg = s->gpu_config ? gpt_config_gpu() : gpt_config_cpu();
    if (s->n_layer >= 0) s->cfg.n_layer = s->n_layer;
    if (s->n_head > 0) s->cfg.n_head = s->n_head;
    if (s->n_embd > 0) s->cfg.n_embd = s->n_embd;
    if (s->block_size > 0) s->cfg.block_size = s->block_size;
    if (s->dropout >= 0) s->cfg.dropout = s->dropout;
    s->cfg.wte_parts = (int)s->wte_parts;
    s->batch = batch_size;
    dg_pipeline_schedule sch;
    if (s->pipeline_stages < 0 || s->pipeline_stages > 64 || s->micro_batches < 1 || s->chunks < 0 ||
        s->pipeline_groups < 1 || s->pipeline_groups > 16 || s->pipeline_stages * s->pipeline_groups > 64 ||
        !dg_pipeline_schedule_parse(s->schedule, &sch)) {
        fprintf(stderr, "gpt_replica: --pipeline_stages in 0..64, --pipeline_groups in 1..16 (at most 64 processes in "
                        "all), --micro_batches >= 1, --chunks >= 0, --schedule one of gpipe, 1f1b, interleaved, zb-h1\n");
        return false;
    }
    if (s->tp_tasks && s->tensor_parallel < 2) {
        fprintf(stderr, "gpt_replica: --tp_tasks needs --tensor_parallel N of 2 or more (a shard on each of N tasks)\n");
        return false;
    }
    if (s->tensor_parallel < 0 || s->tensor_parallel > 64 || (s->tp_tasks && s->pipeline_stages > 0) ||
        (strcmp(s->tp_device_type, "CPU") != 0 && strcmp(s->tp_device_type, "GPU") != 0)) {
        fprintf(stderr, "gpt_replica: --tensor_parallel in 0..64 (--tp_tasks not with --pipeline_stages); "
                        "--tp_device_type CPU or GPU\n");
        return false;
    }
    int64_t per = s->micro_batches * s->pipeline_groups;
    if (s->pipeline_stages > 0 && (batch_size % per != 0 || s->eval_windows % per != 0)) {
        fprintf(stderr, "gpt_replica: --batch_size %lld and --eval_windows %lld must be multiples of --micro_batches "
                        "times --pipeline_groups (%lld)\n", (long long)batch_size, (long long)s->eval_windows,
                (long long)per);
        return false;
    }
    if (s->pipeline_stages > 0 && *s->train_records) {
        fprintf(stderr, "gpt_replica: --pipeline_stages reads its windows from the text in memory, not "
                        "--train_records\n");
        return false;
    }
    if (s->cfg.n_embd % s->cfg.n_head != 0 || !(s->weight_decay >= 0 && s->weight_decay < 1e30) ||
        s->warmup_steps < 0 || s->lr_end_step < 0 || s->eval_windows < 1 || !(s->min_lr >= 0 && s->min_lr < 1e30) ||
        !(s->beta2 > 0 && s->beta2 < 1) || !(s->grad_clip >= 0 && s->grad_clip < 1e30) || s->shuffle_buffer < 1) {
        fprintf(stderr, "gpt_replica: bad model flags: --n_embd must be a multiple of --n_head; --weight_decay, "
                        "--warmup_steps, --lr_end_step, --min_lr and --grad_clip finite and >= 0; --beta2 in (0, 1); "
                        "--eval_windows and --shuffle_buffer >= 1\n");
        return false;
    }
    return true;
}

static bool load(void *state, int64_t seed, dg_status *st) {
    gpt_state *s = state;
    s->seed = seed;   // --seed + the task: the shuffle's seed with --train_records
    if (!gpt_text_load(s->data_dir, (uint64_t)seed, &s->text, st)) return false;
    int64_t T = s->cfg.block_size, train = s->text.n_train, val = s->text.n - s->text.n_train;
    if (train < T + 2 || val < T + 1) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "a context of %lld bytes (--block_size) needs at least %lld training "
                       "and %lld validation bytes; %s gives %lld and %lld", (long long)T, (long long)(T + 2),
                       (long long)(T + 1), s->data_dir, (long long)train, (long long)val);
        gpt_text_free(&s->text);
        return false;
    }
    return true;
}

static bool build(void *state, dg_graph *g, double lr, int64_t seed, int64_t train_steps, replica_net *net,
                  dg_status *st) {
    gpt_state *s = state;
    char (*devs)[64] = s->stage_dev;
    const char *dev[64];
    if (s->pipeline_stages > 0) {
        // Stage 0 on the worker (the client), stage k on ps task k - 1; with the interleaved
        // schedule each process holds --chunks stages. With --pipeline_groups G, group i's
        // stage k runs on process i P + k of the same order.
        dg_pipeline_schedule sch = DG_PIPELINE_1F1B;
        (void)dg_pipeline_schedule_parse(s->schedule, &sch);
        int n_proc = (int)(s->pipeline_stages * s->pipeline_groups);
        // Without ps tasks (--all_reduce, or one worker alone) the stages run on this worker's
        // CPUs (--virtual_cpus P-1): with --all_reduce a pipeline in each worker, the workers
        // data-parallel.
        bool in_worker = !net->variables_on_ps;
        if (in_worker && (s->pipeline_groups > 1 || s->tensor_parallel > 0)) {
            dg_status_set(st, DG_INVALID_ARGUMENT, "--pipeline_stages without ps tasks puts the stages on this worker's "
                          "CPUs: not with --pipeline_groups or --tensor_parallel (their stages are tasks)");
            return false;
        }
        for (int k = 0; k < n_proc; k++) {
            if (in_worker) snprintf(devs[k], sizeof devs[k], "%s/device:CPU:%d", net->task_device, k);
            else if (k == 0) snprintf(devs[k], sizeof devs[k], "/job:worker/task:0");
            else snprintf(devs[k], sizeof devs[k], "/job:ps/task:%d", k - 1);
            dev[k] = devs[k];
        }
        dg_pipeline_options po = dg_pipeline_options_default();
        po.devices = dev;
        po.n_devices = (int)s->pipeline_stages;
        po.schedule = sch;
        po.chunks = sch == DG_PIPELINE_INTERLEAVED_1F1B ? (s->chunks > 0 ? (int)s->chunks : 2) : 1;
        po.micro_batches = (int)s->micro_batches;
        po.recompute = s->recompute;
        if (net->want_loss_scale) {
            // --mixed_precision fp16: every micro-batch's loss times the scale (and the forced-
            // overflow factor); replica.c unscales the gradients and skips non-finite steps.
            if (!dg_loss_scale_make(g, dg_global_step(g), NULL, &net->ls)) return dg_graph_check(g, st);
            po.loss_scale = dg_mul(g, "pipeline_loss_scale", net->ls.scale, net->loss_factor);
        }
        // --tensor_parallel N: each stage's blocks split over N devices of its process.
        s->pipe_arg.tp = (int)s->tensor_parallel;
        s->pipe_arg.tp_device_type = s->tp_device_type;
        if (!gpt_build_pipeline(g, &s->cfg, seed, &po, (int)s->pipeline_groups, &s->pipe_arg, &s->m, &s->pipe, st))
            return false;
        // The validation loss through the plain forward pass over the same variables (on the
        // worker, reading each stage's): the pipeline's loss alone would also run the backward
        // pieces its schedule orders before later forwards. Its products run in float32: with
        // --mixed_precision they would read the pipeline's casts of the variables, which wait on
        // the schedule's earlier pieces (a stage's first forward is not its device's first
        // piece in the interleaved schedule), and so on a training batch.
        dg_dtype mp = dg_graph_mixed_precision(g);
        if (!dg_graph_set_mixed_precision(g, DG_INVALID_DTYPE, st)) return false;
        bool built;
        if (s->tensor_parallel > 1) {   // the stages' shards, read by the same split on the worker's devices
            char evn[64][64];
            const char *evd[64];
            for (int r = 0; r < s->tensor_parallel; r++) {
                snprintf(evn[r], sizeof evn[r], "/job:worker/task:0/device:%s:%d", s->tp_device_type, r);
                evd[r] = evn[r];
            }
            built = gpt_build_tensor_parallel(g, &s->cfg, seed, evd, (int)s->tensor_parallel, &s->eval);
        } else {
            built = gpt_build(g, &s->cfg, seed, &s->eval);
        }
        if (!dg_graph_set_mixed_precision(g, mp, st)) return false;
        if (!built) return dg_graph_check(g, st);
        s->has_eval = true;
        // Which task runs which stage: an error names the task.
        for (int gi = 0; gi < s->pipeline_groups; gi++) {
            if (s->pipeline_groups > 1) printf("Pipeline group %d of %lld: ", gi, (long long)s->pipeline_groups);
            printf("Pipeline of %d stages, %lld micro-batches, %s:", s->pipe.n_stages, (long long)s->micro_batches,
                   dg_pipeline_schedule_name(sch));
            for (int k = 0; k < s->pipe.n_stages; k++)
                printf(" stage %d on %s%s", k, dev[gi * po.n_devices + k % po.n_devices],
                       k + 1 < s->pipe.n_stages ? "," : "\n");
        }
        fflush(stdout);
    } else if (s->tensor_parallel > 0) {
        // This worker's devices: /device:CPU:0 .. N-1 (--virtual_cpus N-1) or its GPUs. With
        // --all_reduce each worker is one tensor-parallel group, and the groups train as data
        // parallel replicas (Megatron's 2-D layout).
        // With --tp_tasks, shard r on task r instead (the worker, then ps task r - 1), each
        // shard's variables with it: the ps tasks then hold shards, not the variables.
        if (net->variables_on_ps && !s->tp_tasks) {
            dg_status_set(st, DG_INVALID_ARGUMENT, "--tensor_parallel keeps each shard on this worker's devices: run "
                          "it alone, with --all_reduce (data parallel groups), or with --tp_tasks (a shard on each "
                          "task, the worker and N-1 ps tasks)");
            return false;
        }
        if (s->tp_tasks && (!net->variables_on_ps || strcmp(net->task_device, "/job:worker/task:0") != 0)) {
            dg_status_set(st, DG_INVALID_ARGUMENT, "--tp_tasks puts shard r on task r: one worker and N-1 ps tasks "
                          "(--ps_hosts), without --all_reduce");
            return false;
        }
        for (int r = 0; r < s->tensor_parallel; r++) {
            if (!s->tp_tasks) snprintf(devs[r], sizeof devs[r], "%s/device:%s:%d", net->task_device, s->tp_device_type, r);
            else if (r == 0) snprintf(devs[r], sizeof devs[r], "/job:worker/task:0/device:%s:0", s->tp_device_type);
            else snprintf(devs[r], sizeof devs[r], "/job:ps/task:%d/device:%s:0", r - 1, s->tp_device_type);
            dev[r] = devs[r];
        }
        if (!gpt_build_tensor_parallel(g, &s->cfg, seed, dev, (int)s->tensor_parallel, &s->m))
            return dg_graph_check(g, st);
        printf("Tensor parallel over %lld devices:", (long long)s->tensor_parallel);
        for (int r = 0; r < s->tensor_parallel; r++) printf(" %s%s", dev[r], r + 1 < s->tensor_parallel ? "," : "\n");
        fflush(stdout);
    } else if (!gpt_build(g, &s->cfg, seed, &s->m)) {
        return dg_graph_check(g, st);
    }
    net->loss = s->m.loss;
    net->global_step = s->m.global_step;
    net->log_loss = true;
    net->opt = dg_adamw(g, lr, s->weight_decay);
    net->opt.beta2 = s->beta2;
    net->opt.global_clipnorm = s->grad_clip;
    int64_t decay = (s->lr_end_step > 0 ? s->lr_end_step : train_steps) - s->warmup_steps;
    net->opt.learning_rate_tensor = dg_warmup_cosine_decay(g, "lr_schedule", s->m.global_step, lr, s->warmup_steps,
                                                           decay > 0 ? decay : 1, s->min_lr < lr ? s->min_lr : lr);
    if (s->pipeline_stages > 0) {   // the pipeline's accumulated gradients, applied once a step by replica.c
        net->grads = s->pipe.grads;
        net->vars = s->pipe.vars;
        net->n_grads = s->pipe.n_vars;
    }
    return dg_graph_check(g, st);
}

// A record of context + 1 bytes -> the context (int32 [T]) and its next bytes (int32 [T]): the
// idx and targets of the model. ctx: the gpt_state (the context length).
static bool window(void *ctx, const dg_element *in, dg_element *out, dg_status *st) {
    int64_t T = ((const gpt_state *)ctx)->cfg.block_size;
    const dg_tensor *rec = in->components[0];
    if ((int64_t)dg_tensor_nbytes(rec) != T + 1) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "a record of %zu bytes, not %lld", dg_tensor_nbytes(rec),
                       (long long)(T + 1));
        return false;
    }
    const unsigned char *b = dg_tensor_data(rec);
    dg_tensor *x = dg_tensor_new(DG_INT32, dg_shape1(T), st), *y = x ? dg_tensor_new(DG_INT32, dg_shape1(T), st) : NULL;
    if (!y) {
        dg_tensor_unref(x);
        return false;
    }
    int32_t *xv = dg_tensor_i32(x), *yv = dg_tensor_i32(y);
    for (int64_t i = 0; i < T; i++) {
        xv[i] = b[i];
        yv[i] = b[i + 1];
    }
    out->components[0] = x;
    out->components[1] = y;
    out->n = 2;
    return true;
}

// With --train_records: the files cut into records of block_size + 1 bytes (a file's last
// partial record is skipped and counted: dg_iterator_skipped) -> this worker's shard -> shuffle
// -> repeat -> windows on 2 threads -> batch -> prefetch. The records do not overlap: each epoch
// sees the same windows (at multiples of block_size + 1 in each file) in another order, where
// the arrays' batches take windows at any offset.
static bool after_session(void *state, dg_monitored_session *ms, int64_t task, int n_workers,
                          const char *checkpoint_path, dg_status *st) {
    gpt_state *s = state;
    if (!*s->train_records) return true;
    char **files;
    int n_files;
    if (!replica_input_files(s->train_records, NULL, &files, &n_files, st)) return false;
    dg_file_source_options fo = dg_file_source_options_default();
    fo.skip_corrupt = true;
    dg_dataset *ds = dg_dataset_fixed_records((const char *const *)files, n_files, s->cfg.block_size + 1, 0, 0, &fo, st);
    replica_input_files_free(files, n_files);
    ds = dg_dataset_shard(ds, n_workers, task, st);
    ds = dg_dataset_shuffle(ds, s->shuffle_buffer, (uint64_t)s->seed, st);
    ds = dg_dataset_repeat(ds, -1, st);
    ds = dg_dataset_map(ds, window, s, 2, st);
    ds = dg_dataset_batch(ds, s->batch, true, st);
    ds = dg_dataset_prefetch(ds, DG_PREFETCH_AUTO, st);
    s->in.task = task;
    if (!replica_input_start(&s->in, ds, ms, checkpoint_path, st)) {
        dg_status_prepend(st, "--train_records %s", s->train_records);
        return false;
    }
    return true;
}

static int next_batch(void *state, dg_output *feeds, dg_tensor **vals, int cap, dg_status *st) {
    gpt_state *s = state;
    if (cap < 3) {
        dg_status_set(st, DG_INTERNAL, "gpt_replica: room for 3 feeds needed");
        return -1;
    }
    int64_t T = s->cfg.block_size, n = s->batch * T;
    if (*s->train_records) {
        if (!s->on && !(s->on = model_training_value(true, st))) return -1;
        if (!replica_input_next(&s->in, st)) return -1;
        feeds[0] = s->m.idx;
        feeds[1] = s->m.targets;
        feeds[2] = s->m.training;
        vals[2] = s->on;
        return dg_element_feed(&s->in.batch, feeds, 2, vals, st) ? 3 : -1;
    }
    if (!s->xt) {
        s->x = malloc((size_t)n * sizeof *s->x);
        s->y = malloc((size_t)n * sizeof *s->y);
        if (!s->x || !s->y) {
            dg_status_set(st, DG_RESOURCE_EXHAUSTED, "gpt_replica: the batch buffers");
            return -1;
        }
        s->xt = dg_tensor_wrap(DG_INT32, dg_shape2(s->batch, T), s->x, (size_t)n * sizeof *s->x, NULL, NULL, st);
        s->yt = s->xt ? dg_tensor_wrap(DG_INT32, dg_shape2(s->batch, T), s->y, (size_t)n * sizeof *s->y, NULL, NULL, st)
                      : NULL;
        if (!s->yt || !(s->on = model_training_value(true, st))) return -1;
    }
    gpt_text_batch(&s->text, s->batch, T, s->x, s->y);
    feeds[0] = s->m.idx;
    feeds[1] = s->m.targets;
    feeds[2] = s->m.training;
    vals[0] = s->xt;
    vals[1] = s->yt;
    vals[2] = s->on;
    return 3;
}

// A failed step of a pipeline: which stage's task it was (the error names the task). With
// pipeline groups, each group's stages in turn (their tasks differ).
static void explain_failure(void *state, dg_status *st) {
    gpt_state *s = state;
    if (s->pipeline_stages <= 0) return;
    if (s->pipeline_groups <= 1) {
        (void)dg_pipeline_name_stage(&s->pipe, st);
        return;
    }
    char *devs[64];
    int S = s->pipe.n_stages, P = (int)s->pipeline_stages;
    for (int gi = 0; gi < s->pipeline_groups && S <= 64; gi++) {
        for (int k = 0; k < S; k++) devs[k] = s->stage_dev[gi * P + k % P];
        dg_pipeline one = {.n_stages = S, .stage_devices = devs};
        if (dg_pipeline_name_stage(&one, st)) {
            dg_status_prepend(st, "pipeline group %d", gi);
            return;
        }
    }
}

static bool evaluate(void *state, dg_session *sess, int64_t task, int64_t global_step, dg_status *st) {
    gpt_state *s = state;
    double loss;
    if (!gpt_validation_loss(sess, s->has_eval ? &s->eval : &s->m, &s->text, s->eval_windows, s->batch, s->cfg.block_size, &loss, st))
        return false;
    printf("After %lld training step(s), validation loss = %.6f (worker %lld, %lld windows of %lld bytes)\n",
           (long long)global_step, loss, (long long)task, (long long)s->eval_windows, (long long)s->cfg.block_size);
    if (s->pipeline_stages > 0) {   // this process runs stage 0; dg-inspect server gives the others'
        int64_t live, peak;
        dg_tensor_memory(&live, &peak);
        printf("Pipeline stage 0: tensor memory peak %.3f MiB, %.3f MiB alive after training\n", peak / 1048576.0,
               live / 1048576.0);
    }
    replica_input_report(&s->in);
    return true;
}

static void free_state(void *state) {
    gpt_state *s = state;
    dg_tensor_unref(s->xt);
    dg_tensor_unref(s->yt);
    dg_tensor_unref(s->on);
    free(s->x);
    free(s->y);
    gpt_text_free(&s->text);
    replica_input_free(&s->in);
    dg_pipeline_free(&s->pipe);
}

// gpt_replica write_train_text --out FILE [--data_dir DIR]: the training part of the text (the
// first 90% of the fortunes, the bytes the arrays' batches draw from) into FILE, for
// --train_records; the validation part stays out of it.
static int write_train_text(int argc, char **argv) {
    const char *data_dir = GPT_DEFAULT_DATA_DIR, *out = "";
    const flag_def flags[] = {
        {"data_dir", FLAG_STRING, &data_dir, "the fortune files (default " GPT_DEFAULT_DATA_DIR ")"},
        {"out", FLAG_STRING, &out, "the file to write"},
    };
    bool help;
    if (!flags_parse(argc, argv, flags, 2, "usage: gpt_replica write_train_text --out FILE [--data_dir DIR]", &help))
        return 2;
    if (help) return 0;
    if (!*out) {
        fprintf(stderr, "gpt_replica write_train_text: --out FILE is needed\n");
        return 2;
    }
    dg_status *st = dg_status_new();
    gpt_text t;
    int rc = 1;
    if (!gpt_text_load(data_dir, 1, &t, st)) {
        fprintf(stderr, "gpt_replica write_train_text: %s\n", dg_status_message(st));
    } else {
        FILE *f = fopen(out, "wb");
        bool ok = f && fwrite(t.bytes, 1, (size_t)t.n_train, f) == (size_t)t.n_train;
        if (f && fclose(f) != 0) ok = false;
        if (ok) {
            printf("%s: %lld training bytes of %lld\n", out, (long long)t.n_train, (long long)t.n);
            rc = 0;
        } else {
            fprintf(stderr, "gpt_replica write_train_text: %s: %s\n", out, strerror(errno));
        }
        gpt_text_free(&t);
    }
    dg_status_free(&st);
    return rc;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "write_train_text") == 0) return write_train_text(argc - 1, argv + 1);
    gpt_state s;
    memset(&s, 0, sizeof s);
    s.data_dir = GPT_DEFAULT_DATA_DIR;
    s.n_layer = -1;
    s.dropout = -1;
    s.weight_decay = 0.1;
    s.warmup_steps = 100;
    s.min_lr = 1e-4;
    s.beta2 = 0.99;
    s.grad_clip = 1.0;
    s.eval_windows = 200;
    s.train_records = "";
    s.shuffle_buffer = 10000;
    s.micro_batches = 1;
    s.pipeline_groups = 1;
    s.tp_device_type = "CPU";
    s.schedule = "1f1b";
    const flag_def flags[] = {
        {"data_dir", FLAG_STRING, &s.data_dir, "the fortune files (default " GPT_DEFAULT_DATA_DIR ")"},
        {"gpu_config", FLAG_BOOL, &s.gpu_config,
         "the GPU configuration: 6 layers, 6 heads, width 384, context 256, dropout 0.2 (use --batch_size 64)"},
        {"n_layer", FLAG_INT, &s.n_layer, "transformer blocks (default: the configuration's)"},
        {"n_head", FLAG_INT, &s.n_head, "attention heads (default: the configuration's)"},
        {"n_embd", FLAG_INT, &s.n_embd, "width (default: the configuration's)"},
        {"block_size", FLAG_INT, &s.block_size, "context in bytes (default: the configuration's)"},
        {"dropout", FLAG_DOUBLE, &s.dropout, "dropout rate (default: the configuration's)"},
        {"wte_parts", FLAG_INT, &s.wte_parts,
         "the token embedding (tied to the output projection) as a partitioned variable of N parts, spread over the "
         "ps tasks (default 0: one variable)"},
        {"weight_decay", FLAG_DOUBLE, &s.weight_decay, "AdamW's decoupled weight decay, matrices only (default 0.1)"},
        {"warmup_steps", FLAG_INT, &s.warmup_steps, "linear warmup of the learning rate (default 100)"},
        {"min_lr", FLAG_DOUBLE, &s.min_lr, "the learning rate at the cosine decay's end (default 1e-4)"},
        {"lr_end_step", FLAG_INT, &s.lr_end_step,
         "the global step the cosine decay ends at (default: --train_steps; to train the first steps of a longer run)"},
        {"beta2", FLAG_DOUBLE, &s.beta2, "AdamW's beta2 (default 0.99)"},
        {"grad_clip", FLAG_DOUBLE, &s.grad_clip, "clip the gradients at this global norm, 0: none (default 1.0)"},
        {"eval_windows", FLAG_INT, &s.eval_windows, "validation windows at the end (default 200)"},
        {"train_records", FLAG_STRING, &s.train_records,
         "train on windows read through a dataset: these files (a directory's files or a glob pattern; `gpt_replica "
         "write_train_text --out FILE` writes the text's training part) cut into records of context + 1 bytes, each "
         "worker its shard, shuffled; the chief's checkpoints keep its input position (docs/DATASETS.md)"},
        {"shuffle_buffer", FLAG_INT, &s.shuffle_buffer, "with --train_records: the shuffle buffer in windows (default 10000)"},
        {"pipeline_stages", FLAG_INT, &s.pipeline_stages,
         "cut the model into this many pipeline stages: the worker runs stage 0, ps task k stage k + 1 (run with "
         "--ps P-1 --workers 1); without ps tasks the stages run on the worker's CPUs (--virtual_cpus P-1), with "
         "--all_reduce a pipeline in each worker (default 0: no pipeline; docs/PIPELINES.md)"},
        {"micro_batches", FLAG_INT, &s.micro_batches,
         "with --pipeline_stages: micro-batches a global batch runs as (default 1: the naive split)"},
        {"schedule", FLAG_STRING, &s.schedule, "with --pipeline_stages: gpipe, 1f1b, interleaved or zb-h1 (default 1f1b)"},
        {"chunks", FLAG_INT, &s.chunks, "with --schedule interleaved: stages per process (default 2)"},
        {"pipeline_groups", FLAG_INT, &s.pipeline_groups,
         "with --pipeline_stages P: data parallelism across G pipelines of P processes each (--ps G*P-1 --workers 1), "
         "each on its part of the batch, sharing the first group's variables (default 1)"},
        {"recompute", FLAG_BOOL, &s.recompute,
         "with --pipeline_stages: recompute each stage's activations in its backward pass instead of keeping them"},
        {"tensor_parallel", FLAG_INT, &s.tensor_parallel,
         "split each block's matrices over N devices of the worker (attention by heads, the MLP by hidden units; "
         "CPU devices need --virtual_cpus N-1; default 0: not split); with --pipeline_stages, each stage's blocks "
         "over N devices of its process"},
        {"tp_device_type", FLAG_STRING, &s.tp_device_type, "with --tensor_parallel: CPU (default) or GPU"},
        {"tp_tasks", FLAG_BOOL, &s.tp_tasks,
         "with --tensor_parallel N: shard r on task r (the worker, then ps task r - 1; N-1 ps tasks), its partial "
         "sums gathered on the worker"},
        {"print_batch_hash", FLAG_BOOL, &s.in.print_hash,
         "with --train_records: print a hash of each training batch (to compare the batches of two runs)"},
    };
    replica_model m = {
        .name = "gpt_replica",
        .usage = "usage: gpt_replica [flags]\n       gpt_replica write_train_text --out FILE [--data_dir DIR]", .what = "gpt_replica", .train_steps = 2000,
        .batch_size = 12, .learning_rate = 1e-3,
        .lr_help = "AdamW's peak learning rate, after the warmup (default 0.001)", .flags = flags,
        .n_flags = (int)(sizeof flags / sizeof flags[0]), .state = &s, .check_flags = check_flags, .load = load,
        .build = build, .next_batch = next_batch, .evaluate = evaluate, .after_session = after_session,
        .explain_failure = explain_failure, .free = free_state,
    };
    return replica_main(argc, argv, &m);
}
