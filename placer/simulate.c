/* The step simulator of the automatic placer. A placement problem holds the nodes as index
 * arrays (edges by output, each op's time on each device type, each link); a simulation runs
 * one step of it as placed: each device has one compute stream that runs ops in the order they
 * became ready (or the devices of a type in one task share the streams the cost model gives
 * them, an op taking the first one free: a process's CPUs share its inter-op threads; with the
 * executor's policy given, dg_cost_model_set_handoff, those streams are its threads: roots on
 * the first, an op kept by the thread that made it ready unless handed over, a handed op waiting
 * for a sleeping thread to wake); each
 * direction of a device pair has one channel that carries one tensor after another (a tensor
 * crosses to a device once, however many ops there read it). Events are
 * taken in time order from a binary heap, ties in the order they were made, so a simulation is
 * deterministic and O((ops + edges) log ops). Memory by liveness is a sweep over the
 * simulation's times afterwards (placer_sim_peak_memory). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base_impl.h"
#include "distgraph/device_name.h"
#include "graph_impl.h"
#include "placer_impl.h"

void placer_problem_clear(placer_problem *p) {
    free(p->dev_type);
    free(p->cost);
    free(p->out_start);
    free(p->gid_bytes);
    free(p->succ_start);
    free(p->succ);
    free(p->succ_gid);
    free(p->pred_start);
    free(p->pred);
    free(p->pred_gid);
    free(p->n_in);
    free(p->persist);
    free(p->static_bytes);
    free(p->lat);
    free(p->inv_bw);
    free(p->copy);
    free(p->stream_first);
    free(p->stream_count);
    free(p->topo);
    free(p->pool);
    free(p->handoff);
    free(p->wake);
    memset(p, 0, sizeof *p);
}

static void shape_str(dg_shape s, char *buf, size_t cap) {
    if (s.rank < 0) {
        snprintf(buf, cap, "unknown rank");
        return;
    }
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < s.rank && o < cap; i++) {
        if (s.dims[i] < 0) o += (size_t)snprintf(buf + o, cap - o, "%s?", i ? ", " : "");
        else o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)s.dims[i]);
    }
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

static bool unknown_size(const dg_node *n, int64_t unknown_dim, dg_status *st) {
    // Name the first output or input whose size is unknown.
    for (int i = 0; i < n->n_outputs; i++)
        if (placer_output_bytes(n, i, unknown_dim) < 0) {
            char sh[128];
            shape_str(n->out_shapes[i], sh, sizeof sh);
            dg_status_setf(st, DG_INVALID_ARGUMENT,
                           "automatic placement: node \"%s\" (%s) output %d has shape %s: its size is "
                           "unknown (give the shape, or an unknown_dim to stand for unknown dimensions)",
                           n->name, n->op->name, i, sh);
            return false;
        }
    for (int i = 0; i < n->n_inputs; i++) {
        const dg_node *src = n->inputs[i].node;
        if (placer_output_bytes(src, n->inputs[i].index, unknown_dim) < 0) {
            char sh[128];
            shape_str(src->out_shapes[n->inputs[i].index], sh, sizeof sh);
            dg_status_setf(st, DG_INVALID_ARGUMENT,
                           "automatic placement: node \"%s\" (%s) input %d (\"%s\") has shape %s: its size is "
                           "unknown (give the shape, or an unknown_dim to stand for unknown dimensions)",
                           n->name, n->op->name, i, src->name, sh);
            return false;
        }
    }
    dg_status_setf(st, DG_INVALID_ARGUMENT, "automatic placement: node \"%s\" (%s): a size its cost needs is unknown",
                   n->name, n->op->name);
    return false;
}

#define ALLOC(ptr, count)                                                                      \
    do {                                                                                       \
        size_t n_ = (size_t)(count) + 1;                                                       \
        (ptr) = calloc(n_, sizeof *(ptr));                                                     \
        if (!(ptr)) {                                                                          \
            base_oom(st, "automatic placement", n_ * sizeof *(ptr));                           \
            goto fail;                                                                         \
        }                                                                                      \
    } while (0)

// Input i of nd (data inputs, then control inputs) as an edge from node *u's output *gid (a
// control input: u's control "output"); false when its source is not among the nodes.
static bool input_edge(const placer_problem *p, dg_node *const *nodes, const int *local, int max_id, const dg_node *nd,
                       int i, int *u, int *gid) {
    dg_node *src = i < nd->n_inputs ? nd->inputs[i].node : nd->ctrl_inputs[i - nd->n_inputs];
    if (src->id > max_id || local[src->id] < 0 || nodes[local[src->id]] != src) return false;
    *u = local[src->id];
    *gid = i < nd->n_inputs ? p->out_start[*u] + nd->inputs[i].index : p->out_start[*u + 1] - 1;
    return true;
}

bool placer_problem_build(placer_problem *p, dg_node *const *nodes, int n, const char *const *devices, int n_dev,
                          const dg_cost_model *m, int64_t unknown_dim, dg_status *st) {
    memset(p, 0, sizeof *p);
    int *local = NULL, *fill = NULL, *queue = NULL;
    dg_device_name *names = NULL;   // the devices, parsed once
    p->n = n;
    p->n_dev = n_dev;
    p->nodes = nodes;
    p->devices = devices;
    p->n_types = m->n_types;
    int max_id = -1;
    for (int i = 0; i < n; i++)
        if (nodes[i]->id > max_id) max_id = nodes[i]->id;
    ALLOC(local, max_id + 1);
    for (int i = 0; i <= max_id; i++) local[i] = -1;
    for (int i = 0; i < n; i++) local[nodes[i]->id] = i;
    ALLOC(p->dev_type, n_dev);
    ALLOC(names, n_dev);
    for (int d = 0; d < n_dev; d++) {
        if (!dg_device_name_parse(devices[d], &names[d], st)) {
            dg_status_prepend(st, "automatic placement: device %d", d);
            goto fail;
        }
        p->dev_type[d] = (int)(placer_device_perf(m, names[d].type) - m->perf);
    }
    // Streams: one per device, or, for a type whose devices in a task share n streams, those n
    // slots for every such device of the task (found again by an earlier device of the same
    // task and type).
    ALLOC(p->stream_first, n_dev);
    ALLOC(p->stream_count, n_dev);
    p->n_slots = 0;
    for (int d = 0; d < n_dev; d++) {
        int t = p->dev_type[d], k = m->task_streams[t];
        p->stream_first[d] = -1;
        for (int e = 0; k > 0 && e < d && p->stream_first[d] < 0; e++)
            if (p->dev_type[e] == t && dg_device_name_same_task(&names[d], &names[e])) {
                p->stream_first[d] = p->stream_first[e];
                p->stream_count[d] = p->stream_count[e];
            }
        if (p->stream_first[d] < 0) {
            p->stream_first[d] = p->n_slots;
            p->stream_count[d] = k > 0 ? k : 1;
            p->n_slots += p->stream_count[d];
        }
    }
    // The executor's threads: devices whose streams a task's devices share, when the model says
    // how the executor hands ops out.
    ALLOC(p->pool, n_dev);
    ALLOC(p->wake, n_dev);
    for (int d = 0; d < n_dev; d++) {
        p->pool[d] = m->handoff && m->task_streams[p->dev_type[d]] > 0;
        p->wake[d] = p->pool[d] ? m->wake_s[p->dev_type[d]] : 0;
    }
    // Ops' times per device type.
    ALLOC(p->cost, (size_t)n * (size_t)m->n_types);
    ALLOC(p->out_start, n + 1);
    for (int i = 0; i < n; i++) {
        dg_node *nd = nodes[i];
        double f, b;
        bool sized = true;
        for (int k = 0; k < nd->n_outputs && sized; k++) sized = placer_output_bytes(nd, k, unknown_dim) >= 0;
        if (!sized || !placer_op_work(nd, unknown_dim, &f, &b)) {
            unknown_size(nd, unknown_dim, st);
            goto fail;
        }
        for (int t = 0; t < m->n_types; t++)
            p->cost[(size_t)i * m->n_types + t] = placer_op_seconds(m, nd, m->types[t], unknown_dim, NULL, NULL);
        p->out_start[i + 1] = p->out_start[i] + nd->n_outputs + 1;
    }
    int n_gid = p->out_start[n];
    ALLOC(p->gid_bytes, n_gid);
    ALLOC(p->persist, n);
    ALLOC(p->static_bytes, n);
    for (int i = 0; i < n; i++) {
        dg_node *nd = nodes[i];
        for (int k = 0; k < nd->n_outputs; k++) {
            int64_t b = placer_output_bytes(nd, k, unknown_dim);
            if (b < 0) {
                unknown_size(nd, unknown_dim, st);
                goto fail;
            }
            p->gid_bytes[p->out_start[i] + k] = b;
            // An op that updates a variable in place (Assign*, Apply*) hands back its buffer.
            if (graph_num_ref_inputs(nd) == 0) p->static_bytes[i] += b;
        }
        p->gid_bytes[p->out_start[i + 1] - 1] = 4;
        if (strcmp(nd->op->name, "VariableV2") == 0) p->persist[i] = p->static_bytes[i];
    }
    // Edges: counted, then filled, by output (so a node's out-edges come sorted by output).
    ALLOC(p->succ_start, n_gid + 1);
    ALLOC(p->pred_start, n + 1);
    ALLOC(p->n_in, n);
    int64_t n_edges = 0;
    for (int v = 0; v < n; v++) {
        dg_node *nd = nodes[v];
        for (int i = 0, u, gid; i < nd->n_inputs + nd->n_ctrl; i++) {
            if (!input_edge(p, nodes, local, max_id, nd, i, &u, &gid)) continue;
            p->succ_start[gid + 1]++;
            p->pred_start[v + 1]++;
            n_edges++;
        }
    }
    if (n_edges > INT32_MAX) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "automatic placement: %lld edges, more than it takes",
                       (long long)n_edges);
        goto fail;
    }
    for (int g = 0; g < n_gid; g++) p->succ_start[g + 1] += p->succ_start[g];
    for (int v = 0; v < n; v++) p->pred_start[v + 1] += p->pred_start[v];
    ALLOC(p->succ, n_edges);
    ALLOC(p->succ_gid, n_edges);
    ALLOC(p->pred, n_edges);
    ALLOC(p->pred_gid, n_edges);
    ALLOC(fill, n_gid);
    for (int v = 0; v < n; v++) {
        dg_node *nd = nodes[v];
        for (int i = 0, u, gid; i < nd->n_inputs + nd->n_ctrl; i++) {
            if (!input_edge(p, nodes, local, max_id, nd, i, &u, &gid)) continue;
            int e = p->succ_start[gid] + fill[gid]++;
            p->succ[e] = v;
            p->succ_gid[e] = gid;
            int pe = p->pred_start[v] + p->n_in[v]++;
            p->pred[pe] = u;
            p->pred_gid[pe] = gid;
        }
    }
    ALLOC(p->handoff, n);
    int pool_dev = -1;   // which ops the executor hands over, asked of the first pooled device's type
    for (int d = 0; d < n_dev && pool_dev < 0; d++)
        if (p->pool[d]) pool_dev = d;
    for (int v = 0; v < n; v++)
        p->handoff[v] = pool_dev >= 0 && m->handoff(m->handoff_ctx, nodes[v], names[pool_dev].type);
    // A topological order: ready nodes first in, first out, from the lowest index.
    ALLOC(p->topo, n);
    ALLOC(queue, n);
    int head = 0, tail = 0;
    for (int v = 0; v < n; v++) {
        fill[v] = p->n_in[v];
        if (fill[v] == 0) queue[tail++] = v;
    }
    while (head < tail) {
        int u = queue[head];
        p->topo[head++] = u;
        for (int e = p->succ_start[p->out_start[u]]; e < p->succ_start[p->out_start[u + 1]]; e++)
            if (--fill[p->succ[e]] == 0) queue[tail++] = p->succ[e];
    }
    if (tail < n) {
        int v;
        for (v = 0; v < n && fill[v] == 0; v++) {}
        dg_status_setf(st, DG_INVALID_ARGUMENT, "automatic placement: node \"%s\" (%s) is on a cycle",
                       nodes[v]->name, nodes[v]->op->name);
        goto fail;
    }
    // Links.
    ALLOC(p->lat, (size_t)n_dev * n_dev);
    ALLOC(p->inv_bw, (size_t)n_dev * n_dev);
    ALLOC(p->copy, (size_t)n_dev * n_dev);
    for (int a = 0; a < n_dev; a++)
        for (int b = 0; b < n_dev; b++) {
            if (a == b) continue;
            dg_link_perf lk = placer_link(m, devices[a], devices[b]);
            p->lat[(size_t)a * n_dev + b] = lk.latency_s;
            p->inv_bw[(size_t)a * n_dev + b] = 1.0 / lk.bytes_per_s;
            // Between the CPUs of two tasks the bytes are copied by those CPUs: the sender's
            // and the receiver's streams are busy for the transfer's bandwidth time.
            if (strcasecmp(names[a].type, "CPU") == 0 && strcasecmp(names[b].type, "CPU") == 0 &&
                !dg_device_name_same_task(&names[a], &names[b]))
                p->copy[(size_t)a * n_dev + b] = p->inv_bw[(size_t)a * n_dev + b];
        }
    free(local);
    free(fill);
    free(queue);
    free(names);
    return true;
fail:
    free(local);
    free(fill);
    free(queue);
    free(names);
    placer_problem_clear(p);
    return false;
}

void placer_static_usage(const placer_problem *p, const int *dev, int64_t *used, int *stamp) {
    for (int d = 0; d < p->n_dev; d++) {
        used[d] = 0;
        stamp[d] = -1;
    }
    for (int u = 0; u < p->n; u++) {
        int du = dev[u];
        used[du] += p->static_bytes[u];
        for (int gid = p->out_start[u]; gid < p->out_start[u + 1]; gid++)
            for (int e = p->succ_start[gid]; e < p->succ_start[gid + 1]; e++) {
                int dv = dev[p->succ[e]];
                if (dv == du || stamp[dv] == gid) continue;
                stamp[dv] = gid;
                used[dv] += p->gid_bytes[gid];
            }
    }
}

// ---- simulation ----

void placer_sim_clear(placer_sim *s) {
    free(s->start);
    free(s->finish);
    free(s->crit);
    free(s->blocker);
    free(s->slot_last);
    free(s->pending);
    free(s->slot_free);
    free(s->slot_of);
    free(s->chan_free);
    free(s->busy);
    free(s->stamp_gid);
    free(s->stamp_xfer);
    free(s->xfers);
    free(s->edge_xfer);
    free(s->heap);
    memset(s, 0, sizeof *s);
}

enum { EV_FINISH = 0, EV_ARRIVE = 1 };

static bool ev_less(const struct placer_event *a, const struct placer_event *b) {
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

static void heap_push(placer_sim *s, struct placer_event ev) {
    base_reserve((void **)&s->heap, sizeof *s->heap, s->n_heap, &s->cap_heap, 1);
    int i = s->n_heap++;
    while (i > 0) {
        int parent = (i - 1) / 2;
        if (!ev_less(&ev, &s->heap[parent])) break;
        s->heap[i] = s->heap[parent];
        i = parent;
    }
    s->heap[i] = ev;
}

static struct placer_event heap_pop(placer_sim *s) {
    struct placer_event top = s->heap[0], last = s->heap[--s->n_heap];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= s->n_heap) break;
        if (c + 1 < s->n_heap && ev_less(&s->heap[c + 1], &s->heap[c])) c++;
        if (!ev_less(&s->heap[c], &last)) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (s->n_heap > 0) s->heap[i] = last;
    return top;
}

// The first of device d's streams to be free.
static int first_free_slot(const placer_problem *p, const placer_sim *s, int d) {
    int best = p->stream_first[d];
    for (int i = best + 1; i < p->stream_first[d] + p->stream_count[d]; i++)
        if (s->slot_free[i] < s->slot_free[best]) best = i;
    return best;
}

// Work of c seconds on device d, ready at t: on the first of its streams to be free. Returns
// when it starts.
static double stream_take(const placer_problem *p, placer_sim *s, int d, double t, double c) {
    int best = first_free_slot(p, s, d);
    double st = t > s->slot_free[best] ? t : s->slot_free[best];
    s->slot_free[best] = st + c;
    s->slot_last[best] = -1;   // a copy, no op: an op that waits for it has no blocker
    s->busy[d] += c;
    return st;
}

// Op v, ready at t, on a stream of its device: pin >= 0 is the slot of the thread that made it
// ready and runs it itself, pin < 0 the first stream free. handed: on the executor's threads
// (p->pool), a thread that sleeps when the op is handed to it wakes first.
static void run_op(const placer_problem *p, const int *dev, placer_sim *s, int v, double t, int crit, int pin,
                   bool handed, int64_t *seq) {
    int d = dev[v];
    double c = p->cost[(size_t)v * p->n_types + p->dev_type[d]];
    int slot = pin >= 0 ? pin : first_free_slot(p, s, d);
    double free_at = s->slot_free[slot];
    // Asleep: free before t, or at t and not the thread that made the op ready (which, done at
    // t, looks for work without sleeping).
    if (handed && p->pool[d] && (free_at < t || (free_at == t && (crit < 0 || s->slot_of[crit] != slot))))
        t += p->wake[d];
    double st = t > free_at ? t : free_at;
    s->slot_free[slot] = st + c;
    s->busy[d] += c;
    s->blocker[v] = st > t ? s->slot_last[slot] : -1;
    s->slot_last[slot] = v;
    s->slot_of[v] = slot;
    s->start[v] = st;
    s->finish[v] = st + c;
    s->crit[v] = crit;
    heap_push(s, (struct placer_event){st + c, (*seq)++, EV_FINISH, v});
}

static bool sim_alloc(const placer_problem *p, placer_sim *s) {
    if (s->start) return true;
    size_t n = (size_t)p->n + 1, nd = (size_t)p->n_dev + 1;
    s->start = malloc(n * sizeof *s->start);
    s->finish = malloc(n * sizeof *s->finish);
    s->crit = malloc(n * sizeof *s->crit);
    s->blocker = malloc(n * sizeof *s->blocker);
    s->slot_last = malloc(((size_t)p->n_slots + 1) * sizeof *s->slot_last);
    s->pending = malloc(n * sizeof *s->pending);
    s->slot_free = malloc(((size_t)p->n_slots + 1) * sizeof *s->slot_free);
    s->slot_of = malloc(n * sizeof *s->slot_of);
    s->chan_free = malloc(nd * nd * sizeof *s->chan_free);
    s->busy = malloc(nd * sizeof *s->busy);
    s->stamp_gid = malloc(nd * sizeof *s->stamp_gid);
    s->stamp_xfer = malloc(nd * sizeof *s->stamp_xfer);
    s->edge_xfer = malloc(((size_t)p->succ_start[p->out_start[p->n]] + 1) * sizeof *s->edge_xfer);
    if (!s->start || !s->finish || !s->crit || !s->blocker || !s->slot_last || !s->pending || !s->slot_free ||
        !s->slot_of || !s->chan_free ||
        !s->busy || !s->stamp_gid || !s->stamp_xfer || !s->edge_xfer) {
        placer_sim_clear(s);
        return false;
    }
    return true;
}

double placer_simulate(const placer_problem *p, const int *dev, placer_sim *s) {
    return placer_simulate_bounded(p, dev, s, INFINITY);
}

double placer_simulate_bounded(const placer_problem *p, const int *dev, placer_sim *s, double bound) {
    if (!sim_alloc(p, s)) return -1;
    double t0 = base_now_s();
    int nd = p->n_dev;
    for (int d = 0; d < nd; d++) {
        s->busy[d] = 0;
        s->stamp_gid[d] = -1;
    }
    for (int i = 0; i < p->n_slots; i++) {
        s->slot_free[i] = 0;
        s->slot_last[i] = -1;
    }
    for (int i = 0; i < nd * nd; i++) s->chan_free[i] = 0;
    s->n_xfers = 0;
    s->n_heap = 0;
    int64_t seq = 0;
    for (int v = 0; v < p->n; v++) s->pending[v] = p->n_in[v];
    for (int k = 0; k < p->n; k++) {
        int v = p->topo[k];
        // The executor's roots all start on the thread that runs the step.
        if (p->n_in[v] == 0) run_op(p, dev, s, v, 0, -1, p->pool[dev[v]] ? p->stream_first[dev[v]] : -1, false, &seq);
    }
    int done = 0;
    double end = 0;
    s->last = -1;
    while (s->n_heap > 0) {
        struct placer_event ev = heap_pop(s);
        if (ev.t > bound) {   // the step ends later still: stop here
            s->step_s = ev.t;
            s->runs++;
            s->ops_run += done;
            s->run_s += base_now_s() - t0;
            return ev.t;
        }
        if (ev.kind == EV_FINISH) {
            int u = ev.id, du = dev[u];
            int kept = 0;   // ops u made ready on its device so far
            done++;
            if (ev.t >= end) {
                end = ev.t;
                s->last = u;
            }
            for (int gid = p->out_start[u]; gid < p->out_start[u + 1]; gid++)
                for (int e = p->succ_start[gid]; e < p->succ_start[gid + 1]; e++) {
                    int v = p->succ[e], dv = dev[v];
                    if (dv == du) {
                        s->edge_xfer[e] = -1;
                        if (--s->pending[v] == 0) {
                            // The executor's thread keeps the first op u made ready and every one
                            // it would not hand over; the others go to the first thread free.
                            bool keep = p->pool[du] && (kept++ == 0 || !p->handoff[v]);
                            run_op(p, dev, s, v, ev.t, u, keep ? s->slot_of[u] : -1, p->pool[du] && !keep, &seq);
                        }
                        continue;
                    }
                    if (s->stamp_gid[dv] == gid) {
                        s->edge_xfer[e] = s->stamp_xfer[dv];
                        continue;
                    }
                    size_t ch = (size_t)du * nd + dv;
                    double st = ev.t > s->chan_free[ch] ? ev.t : s->chan_free[ch];
                    double occ = (double)p->gid_bytes[gid] * p->inv_bw[ch];
                    if (p->copy[ch] > 0) {   // the sender's CPU copies it out
                        double c = (double)p->gid_bytes[gid] * p->copy[ch];
                        st = stream_take(p, s, du, st, c);
                    }
                    s->chan_free[ch] = st + occ;
                    base_reserve((void **)&s->xfers, sizeof *s->xfers, s->n_xfers, &s->cap_xfers, 1);
                    int x = s->n_xfers++;
                    s->xfers[x] = (struct placer_xfer){gid, u, dv, st, st + occ, st + occ + p->lat[ch]};
                    s->stamp_gid[dv] = gid;
                    s->stamp_xfer[dv] = x;
                    s->edge_xfer[e] = x;
                    heap_push(s, (struct placer_event){s->xfers[x].arrive, seq++, EV_ARRIVE, x});
                }
        } else {
            struct placer_xfer *x = &s->xfers[ev.id];
            int gid = x->gid, src = x->src, dst = x->dst;
            double ready = ev.t;
            size_t ch = (size_t)dev[src] * nd + dst;
            if (p->copy[ch] > 0) {   // the receiver's CPU copies it in
                double c = (double)p->gid_bytes[gid] * p->copy[ch];
                ready = stream_take(p, s, dst, ev.t, c) + c;
            }
            for (int e = p->succ_start[gid]; e < p->succ_start[gid + 1]; e++) {
                int v = p->succ[e];
                if (dev[v] == dst && --s->pending[v] == 0) run_op(p, dev, s, v, ready, src, -1, true, &seq);
            }
        }
    }
    s->step_s = end;
    s->runs++;
    s->ops_run += done;
    s->run_s += base_now_s() - t0;
    return done == p->n ? end : -1;
}

// ---- memory by liveness ----

typedef struct mem_event {
    double t;
    int64_t delta;
    int dev;
} mem_event;

static int mem_event_cmp(const void *a, const void *b) {
    const mem_event *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    // Frees before allocations at the same time: an op's input goes as its reader ends.
    if ((x->delta < 0) != (y->delta < 0)) return x->delta < 0 ? -1 : 1;
    return x->dev - y->dev;
}

bool placer_sim_peak_memory(const placer_problem *p, const int *dev, placer_sim *s, int64_t *peak, dg_status *st) {
    int n_gid = p->out_start[p->n];
    size_t cap = 2 * ((size_t)n_gid + (size_t)s->n_xfers) + 1;
    mem_event *ev = malloc(cap * sizeof *ev);
    double *x_free = malloc(((size_t)s->n_xfers + 1) * sizeof *x_free);
    int64_t *cur = calloc((size_t)p->n_dev + 1, sizeof *cur);
    if (!ev || !x_free || !cur) {
        free(ev);
        free(x_free);
        free(cur);
        return base_oom(st, "automatic placement memory", cap * sizeof *ev);
    }
    size_t k = 0;
    for (int d = 0; d < p->n_dev; d++) peak[d] = 0;
    for (int x = 0; x < s->n_xfers; x++) x_free[x] = s->xfers[x].arrive;
    for (int u = 0; u < p->n; u++) {
        int du = dev[u];
        cur[du] += p->persist[u];
        // A variable's output is the variable; an in-place update's is the variable's buffer:
        // neither is allocated again here, but copies of them elsewhere live until read.
        bool in_place = p->persist[u] > 0 || graph_num_ref_inputs(p->nodes[u]) > 0;
        for (int gid = p->out_start[u]; gid < p->out_start[u + 1] - 1; gid++) {
            double free_t = s->finish[u];
            for (int e = p->succ_start[gid]; e < p->succ_start[gid + 1]; e++) {
                int v = p->succ[e], x = s->edge_xfer[e];
                if (x < 0) {
                    if (s->finish[v] > free_t) free_t = s->finish[v];
                } else {
                    if (s->xfers[x].end > free_t) free_t = s->xfers[x].end;
                    if (s->finish[v] > x_free[x]) x_free[x] = s->finish[v];
                }
            }
            if (p->gid_bytes[gid] == 0 || in_place) continue;
            ev[k++] = (mem_event){s->start[u], p->gid_bytes[gid], du};
            ev[k++] = (mem_event){free_t, -p->gid_bytes[gid], du};
        }
    }
    for (int x = 0; x < s->n_xfers; x++) {
        int64_t b = p->gid_bytes[s->xfers[x].gid];
        ev[k++] = (mem_event){s->xfers[x].start, b, s->xfers[x].dst};
        ev[k++] = (mem_event){x_free[x], -b, s->xfers[x].dst};
    }
    qsort(ev, k, sizeof *ev, mem_event_cmp);
    for (int d = 0; d < p->n_dev; d++) peak[d] = cur[d];
    for (size_t i = 0; i < k; i++) {
        cur[ev[i].dev] += ev[i].delta;
        if (cur[ev[i].dev] > peak[ev[i].dev]) peak[ev[i].dev] = cur[ev[i].dev];
    }
    free(ev);
    free(x_free);
    free(cur);
    return true;
}
