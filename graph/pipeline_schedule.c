/* The pipeline's schedules: each device's order of forward and backward pieces (GPipe, 1F1B,
 * Megatron's interleaved 1F1B, ZB-H1) and a simulation of an order with pieces of fixed times,
 * which checks that it finishes, measures its bubble, and places ZB-H1's weight-gradient parts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base_impl.h"
#include "pipeline_impl.h"

#define MAX_DEVICES 1024
#define MAX_CHUNKS 64
#define MAX_MICRO_BATCHES 65536
#define MAX_UNITS (1 << 22)

bool dg_pipeline_schedule_parse(const char *s, dg_pipeline_schedule *out) {
    static const struct {
        const char *name;
        dg_pipeline_schedule v;
    } names[] = {{"gpipe", DG_PIPELINE_GPIPE},       {"1f1b", DG_PIPELINE_1F1B},   {"interleaved", DG_PIPELINE_INTERLEAVED_1F1B},
                 {"interleaved-1f1b", DG_PIPELINE_INTERLEAVED_1F1B}, {"zb-h1", DG_PIPELINE_ZB_H1},
                 {"zbh1", DG_PIPELINE_ZB_H1},         {"zb_h1", DG_PIPELINE_ZB_H1}};
    for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].v;
            return true;
        }
    return false;
}

const char *dg_pipeline_schedule_name(dg_pipeline_schedule s) {
    switch (s) {
    case DG_PIPELINE_GPIPE: return "gpipe";
    case DG_PIPELINE_1F1B: return "1f1b";
    case DG_PIPELINE_INTERLEAVED_1F1B: return "interleaved";
    case DG_PIPELINE_ZB_H1: return "zb-h1";
    }
    return "unknown";
}

void pipe_plan_free(pipe_plan *p) {
    if (!p) return;
    for (int d = 0; p->order && d < p->n_devices; d++) free(p->order[d]);
    free(p->order);
    free(p->n_order);
    memset(p, 0, sizeof *p);
}

static void put(pipe_plan *p, int d, int phase, int stage, int mb) {
    p->order[d][p->n_order[d]++] = (pipe_unit){phase, stage, mb};
}

// The simulation's state: when each piece finished (< 0: not yet), each device's clock, busy
// time, micro-batches in flight.
typedef struct sim {
    const pipe_plan *p;
    const double *t;
    double *done;
    double *clock, *busy;
    int *pos, *in_flight, peak;
} sim;

static int unit_id(const pipe_plan *p, int phase, int stage, int mb) {
    return (phase * p->n_stages + stage) * p->m + mb;
}

static double duration(const sim *s, int phase) {
    if (phase == PIPE_F) return s->t[PIPE_F];
    if (phase == PIPE_W) return s->t[PIPE_W];
    return s->p->split ? s->t[PIPE_B] : s->t[PIPE_B] + s->t[PIPE_W];
}

// When u can start on device d: the device's clock or its inputs' finish, whichever is later;
// INFINITY while an input is not done.
static double ready_at(const sim *s, int d, pipe_unit u) {
    const pipe_plan *p = s->p;
    double at = s->clock[d], dep[2];
    int n = 0;
    if (u.phase == PIPE_F) {
        if (u.stage > 0) dep[n++] = s->done[unit_id(p, PIPE_F, u.stage - 1, u.mb)];
    } else if (u.phase == PIPE_B) {
        dep[n++] = s->done[unit_id(p, PIPE_F, u.stage, u.mb)];
        if (u.stage < p->n_stages - 1) dep[n++] = s->done[unit_id(p, PIPE_B, u.stage + 1, u.mb)];
    } else {
        dep[n++] = s->done[unit_id(p, PIPE_B, u.stage, u.mb)];
    }
    for (int i = 0; i < n; i++) {
        if (dep[i] < 0) return INFINITY;
        if (dep[i] > at) at = dep[i];
    }
    return at;
}

static void run_unit(sim *s, int d, pipe_unit u, double start) {
    double end = start + duration(s, u.phase);
    s->done[unit_id(s->p, u.phase, u.stage, u.mb)] = end;
    s->clock[d] = end;
    s->busy[d] += end - start;
    if (u.phase == PIPE_F) {
        if (++s->in_flight[d] > s->peak) s->peak = s->in_flight[d];
    } else if (u.phase == PIPE_W || !s->p->split) {
        s->in_flight[d]--;
    }
}

static bool sim_init(sim *s, const pipe_plan *p, const double *t) {
    memset(s, 0, sizeof *s);
    s->p = p;
    s->t = t;
    size_t units = (size_t)3 * (size_t)p->n_stages * (size_t)p->m;
    s->done = malloc(units * sizeof *s->done);
    s->clock = calloc((size_t)p->n_devices, sizeof *s->clock);
    s->busy = calloc((size_t)p->n_devices, sizeof *s->busy);
    s->pos = calloc((size_t)p->n_devices, sizeof *s->pos);
    s->in_flight = calloc((size_t)p->n_devices, sizeof *s->in_flight);
    if (!s->done || !s->clock || !s->busy || !s->pos || !s->in_flight) return false;
    for (size_t i = 0; i < units; i++) s->done[i] = -1;
    return true;
}

static void sim_free(sim *s) {
    free(s->done);
    free(s->clock);
    free(s->busy);
    free(s->pos);
    free(s->in_flight);
}

static void sim_estimate(const sim *s, dg_pipeline_estimate *e) {
    double span = 0, idle = 0;
    for (int d = 0; d < s->p->n_devices; d++)
        if (s->clock[d] > span) span = s->clock[d];
    for (int d = 0; d < s->p->n_devices; d++) idle += span > 0 ? 1 - s->busy[d] / span : 0;
    e->step = span;
    e->bubble = idle / s->p->n_devices;
    e->peak_in_flight = s->peak;
}

bool pipe_plan_simulate(const pipe_plan *p, const double t[3], dg_pipeline_estimate *e) {
    sim s;
    bool ok = sim_init(&s, p, t);
    // Each device runs its order; a device whose next piece waits for another's lets that one go
    // first. Done when no device can move: finished only when every order is used up.
    for (bool moved = ok; moved;) {
        moved = false;
        for (int d = 0; d < p->n_devices; d++)
            while (s.pos[d] < p->n_order[d]) {
                pipe_unit u = p->order[d][s.pos[d]];
                double at = ready_at(&s, d, u);
                if (isinf(at)) break;
                run_unit(&s, d, u, at);
                s.pos[d]++;
                moved = true;
            }
    }
    for (int d = 0; ok && d < p->n_devices; d++)
        if (s.pos[d] < p->n_order[d]) ok = false;
    if (ok && e) sim_estimate(&s, e);
    sim_free(&s);
    return ok;
}

// 1F1B's order of forward and backward pieces for stage d of p stages: p - 1 - d forwards
// ahead, then one forward and one backward in turn, then the backwards left.
static void one_f_one_b(pipe_unit *o, int *n, int d, int stages, int m) {
    int warm = stages - 1 - d < m ? stages - 1 - d : m;
    *n = 0;
    for (int i = 0; i < warm; i++) o[(*n)++] = (pipe_unit){PIPE_F, d, i};
    for (int j = 0; j < m - warm; j++) {
        o[(*n)++] = (pipe_unit){PIPE_F, d, warm + j};
        o[(*n)++] = (pipe_unit){PIPE_B, d, j};
    }
    for (int j = m - warm; j < m; j++) o[(*n)++] = (pipe_unit){PIPE_B, d, j};
}

// ZB-H1: each device runs 1F1B's forwards and input-gradient parts in 1F1B's order and keeps
// the weight-gradient parts waiting: it runs one when its next piece must wait for another
// device, or when more than d of them wait (device d: the last stage keeps the most, whose
// idle time at the end is the longest). The order is what a simulation with times t does.
static bool zb_h1(pipe_plan *p, const double *t) {
    int D = p->n_devices, m = p->m;
    pipe_unit **fb = calloc((size_t)D, sizeof *fb);
    int *n_fb = calloc((size_t)D, sizeof *n_fb), *waiting = calloc((size_t)D, sizeof *waiting);
    int *next_w = calloc((size_t)D, sizeof *next_w);
    sim s = {0};
    bool ok = fb && n_fb && waiting && next_w && sim_init(&s, p, t);
    for (int d = 0; ok && d < D; d++) {
        if (!(fb[d] = malloc((size_t)2 * (size_t)m * sizeof *fb[d]))) ok = false;
        else one_f_one_b(fb[d], &n_fb[d], d, D, m);
    }
    while (ok) {
        int best_d = -1;
        double best_at = INFINITY;
        pipe_unit best = {0, 0, 0};
        for (int d = 0; d < D; d++) {
            bool has_next = s.pos[d] < n_fb[d];
            double at = has_next ? ready_at(&s, d, fb[d][s.pos[d]]) : INFINITY;
            pipe_unit u;
            double when;
            if (waiting[d] > 0 && (waiting[d] > d || !has_next || at > s.clock[d])) {
                u = (pipe_unit){PIPE_W, d, next_w[d]};
                when = s.clock[d];
            } else if (!isinf(at)) {
                u = fb[d][s.pos[d]];
                when = at;
            } else {
                continue;
            }
            if (when < best_at) {
                best_at = when;
                best_d = d;
                best = u;
            }
        }
        if (best_d < 0) break;
        run_unit(&s, best_d, best, best_at);
        put(p, best_d, best.phase, best.stage, best.mb);
        if (best.phase == PIPE_W) {
            waiting[best_d]--;
            next_w[best_d]++;
        } else {
            s.pos[best_d]++;
            if (best.phase == PIPE_B) waiting[best_d]++;
        }
    }
    for (int d = 0; ok && d < D; d++)
        if (p->n_order[d] != 3 * m) ok = false;
    if (fb)
        for (int d = 0; d < D; d++) free(fb[d]);
    free(fb);
    free(n_fb);
    free(waiting);
    free(next_w);
    if (s.p) sim_free(&s);
    return ok;
}

bool pipe_plan_make(dg_pipeline_schedule sch, int n_devices, int chunks, int m, const double t[3], pipe_plan *p,
                    dg_status *st) {
    memset(p, 0, sizeof *p);
    if (n_devices < 1 || n_devices > MAX_DEVICES)
        return dg_status_setf(st, DG_INVALID_ARGUMENT, "pipeline: %d devices, not 1 to %d", n_devices, MAX_DEVICES), false;
    if (m < 1 || m > MAX_MICRO_BATCHES)
        return dg_status_setf(st, DG_INVALID_ARGUMENT, "pipeline: %d micro-batches, not 1 to %d", m, MAX_MICRO_BATCHES),
               false;
    if (sch != DG_PIPELINE_GPIPE && sch != DG_PIPELINE_1F1B && sch != DG_PIPELINE_INTERLEAVED_1F1B &&
        sch != DG_PIPELINE_ZB_H1)
        return dg_status_setf(st, DG_INVALID_ARGUMENT, "pipeline: unknown schedule %d", (int)sch), false;
    if (chunks < 1 || chunks > MAX_CHUNKS || (chunks > 1 && sch != DG_PIPELINE_INTERLEAVED_1F1B))
        return dg_status_setf(st, DG_INVALID_ARGUMENT, "pipeline: %d chunks per device: 1, or 2 to %d with the "
                              "interleaved schedule", chunks, MAX_CHUNKS), false;
    if (sch == DG_PIPELINE_INTERLEAVED_1F1B && m % n_devices != 0)
        return dg_status_setf(st, DG_INVALID_ARGUMENT, "pipeline: the interleaved schedule runs micro-batches in "
                              "groups of the devices: %d micro-batches over %d devices", m, n_devices), false;
    for (int i = 0; i < 3; i++)
        if (!(t[i] >= 0 && t[i] <= 1e9))
            return dg_status_setf(st, DG_INVALID_ARGUMENT, "pipeline: the piece times must be in [0, 1e9]"), false;
    if ((int64_t)3 * n_devices * chunks * m > MAX_UNITS)
        return dg_status_setf(st, DG_INVALID_ARGUMENT, "pipeline: %d stages of %d micro-batches: more than %d pieces",
                              n_devices * chunks, m, MAX_UNITS), false;
    p->n_devices = n_devices;
    p->chunks = chunks;
    p->n_stages = n_devices * chunks;
    p->m = m;
    p->split = sch == DG_PIPELINE_ZB_H1;
    p->order = calloc((size_t)n_devices, sizeof *p->order);
    p->n_order = calloc((size_t)n_devices, sizeof *p->n_order);
    bool ok = p->order && p->n_order;
    for (int d = 0; ok && d < n_devices; d++)
        if (!(p->order[d] = malloc((size_t)3 * (size_t)chunks * (size_t)m * sizeof *p->order[d]))) ok = false;
    if (!ok) {
        pipe_plan_free(p);
        return dg_status_set(st, DG_RESOURCE_EXHAUSTED, "pipeline: no memory for the schedule"), false;
    }
    const int D = n_devices, v = chunks;
    for (int d = 0; d < D && sch != DG_PIPELINE_ZB_H1; d++) {
        if (sch == DG_PIPELINE_GPIPE) {
            for (int i = 0; i < m; i++) put(p, d, PIPE_F, d, i);
            for (int i = 0; i < m; i++) put(p, d, PIPE_B, d, i);
        } else if (sch == DG_PIPELINE_1F1B || v == 1) {
            one_f_one_b(p->order[d], &p->n_order[d], d, D, m);
        } else {
            // Megatron's order: the k-th forward of a device is micro-batch (k / (D v)) D + k % D
            // of chunk (k / D) % v, the k-th backward the same micro-batch of chunk v - 1 - that;
            // (D - d - 1) 2 + (v - 1) D forwards ahead, then one forward and one backward in turn.
            int total = m * v, warm = (D - d - 1) * 2 + (v - 1) * D, fk = 0, bk = 0;
            if (warm > total) warm = total;
#define MB(k) (((k) / (D * v)) * D + (k) % D)
            for (; fk < warm; fk++) put(p, d, PIPE_F, ((fk / D) % v) * D + d, MB(fk));
            while (fk < total) {
                put(p, d, PIPE_F, ((fk / D) % v) * D + d, MB(fk));
                fk++;
                put(p, d, PIPE_B, (v - 1 - (bk / D) % v) * D + d, MB(bk));
                bk++;
            }
            for (; bk < total; bk++) put(p, d, PIPE_B, (v - 1 - (bk / D) % v) * D + d, MB(bk));
#undef MB
        }
    }
    if (sch == DG_PIPELINE_ZB_H1) ok = zb_h1(p, t);
    if (ok) ok = pipe_plan_simulate(p, t, NULL);
    if (!ok) {
        pipe_plan_free(p);
        return dg_status_setf(st, DG_INTERNAL, "pipeline: the %s schedule of %d micro-batches over %d devices does not "
                              "finish", dg_pipeline_schedule_name(sch), m, n_devices), false;
    }
    return true;
}

bool dg_pipeline_simulate(dg_pipeline_schedule s, int n_devices, int chunks, int micro_batches, double t_forward,
                          double t_backward, double t_weight, dg_pipeline_estimate *e, dg_status *st) {
    dg_status_reset(st);
    memset(e, 0, sizeof *e);
    const double t[3] = {t_forward, t_backward, t_weight};
    pipe_plan p;
    if (!pipe_plan_make(s, n_devices, chunks, micro_batches, t, &p, st)) return false;
    bool ok = pipe_plan_simulate(&p, t, e);
    pipe_plan_free(&p);
    return ok;
}
