/* A placer's state (placer_impl.h): where each group went, the bytes each device holds
 * (received copies included), and the moves every placer makes with them: a group put on a
 * device with the copies it reads, variables and constants pulled beside their first reader,
 * groups left over, and the status for a group no device has room for. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base_impl.h"
#include "graph_impl.h"
#include "placer_impl.h"

void placer_state_clear(placer_state *a) {
    free(a->group_bytes);
    free(a->member_start);
    free(a->members);
    free(a->used);
    free(a->gdev);
    free(a->dev);
    free(a->recv);
    free(a->gid_mark);
    if (a->metis) {
        free(a->metis->xadj);
        free(a->metis->adj);
        free(a->metis->adjw);
        free(a->metis->vw);
        free(a->metis);
    }
    memset(a, 0, sizeof *a);
}

// A state over problem p with groups pg: each group's bytes and members.
bool placer_state_init(placer_state *a, const placer_problem *p, const placer_groups *pg, const int64_t *caps,
                       dg_status *st) {
    memset(a, 0, sizeof *a);
    a->p = p;
    a->pg = pg;
    a->caps = caps;
    int ng = pg->n_groups, n = p->n;
    a->group_bytes = calloc((size_t)ng + 1, sizeof *a->group_bytes);
    a->member_start = calloc((size_t)ng + 2, sizeof *a->member_start);
    a->members = malloc(((size_t)n + 1) * sizeof *a->members);
    a->used = calloc((size_t)p->n_dev + 1, sizeof *a->used);
    a->gdev = malloc(((size_t)ng + 1) * sizeof *a->gdev);
    a->dev = malloc(((size_t)n + 1) * sizeof *a->dev);
    a->recv = calloc((size_t)p->out_start[n] + 1, sizeof *a->recv);
    a->gid_mark = calloc((size_t)p->out_start[n] + 1, sizeof *a->gid_mark);
    int *fill = calloc((size_t)ng + 1, sizeof *fill);
    if (!a->group_bytes || !a->member_start || !a->members || !a->used || !a->gdev || !a->dev || !a->recv ||
        !a->gid_mark || !fill) {
        free(fill);
        placer_state_clear(a);
        return base_oom(st, "automatic placement", (size_t)n * 8);
    }
    for (int v = 0; v < n; v++) {
        a->group_bytes[pg->group_of[v]] += p->static_bytes[v];
        a->member_start[pg->group_of[v] + 1]++;
    }
    for (int g = 0; g < ng; g++) a->member_start[g + 1] += a->member_start[g];
    for (int v = 0; v < n; v++) {
        int g = pg->group_of[v];
        a->members[a->member_start[g] + fill[g]++] = v;
    }
    free(fill);
    return true;
}

bool placer_fits(const placer_state *a, int g, int d) {
    int64_t cap = a->caps ? a->caps[d] : 0;
    return cap <= 0 || a->used[d] + a->group_bytes[g] <= cap;
}

bool placer_allowed(const placer_state *a, int g, int d) { return a->pg->allowed[(size_t)g * a->p->n_dev + d] != 0; }

void placer_put(placer_state *a, int g, int d) {
    a->gdev[g] = d;
    a->used[d] += a->group_bytes[g];
    for (int k = a->member_start[g]; k < a->member_start[g + 1]; k++) a->dev[a->members[k]] = d;
}

void placer_reset(placer_state *a) {
    for (int d = 0; d < a->p->n_dev; d++) a->used[d] = 0;
    memset(a->recv, 0, ((size_t)a->p->out_start[a->p->n] + 1) * sizeof *a->recv);
    for (int g = 0; g < a->pg->n_groups; g++) a->gdev[g] = -1;
    for (int i = 0; i < a->p->n; i++) a->dev[i] = -1;
}

// Free ops without inputs (variables, constants, placeholders) that asked for no device wait
// for their first reader: their group goes where it goes (a variable beside the op that reads
// it first).
bool placer_is_lazy(const placer_state *a, int v) {
    int g = a->pg->group_of[v];
    return a->p->n_in[v] == 0 && a->gdev[g] < 0 && !a->pg->pinned[g] && placer_op_is_free(a->p->nodes[v]);
}

// Bytes of v's inputs on other devices that d has no copy of yet (beyond 64 devices copies are
// not told apart: charged each time, an overestimate).
static int64_t recv_bytes(const placer_state *a, int v, int d, bool charge) {
    const placer_problem *p = a->p;
    int64_t b = 0;
    for (int e = p->pred_start[v]; e < p->pred_start[v + 1]; e++) {
        int du = a->dev[p->pred[e]], gid = p->pred_gid[e];
        if (du < 0 || du == d) continue;
        uint64_t bit = d < 64 ? (uint64_t)1 << d : 0;
        if (bit && (a->recv[gid] & bit)) continue;
        b += p->gid_bytes[gid];
        if (charge) a->recv[gid] |= bit;
    }
    return b;
}

// After v went to d: d holds copies of its inputs from elsewhere.
void placer_charge_inputs(placer_state *a, int v, int d) { a->used[d] += recv_bytes(a, v, d, true); }

// The copies device d would hold of what group g's members read from outside the group, from
// producers not on d (placed elsewhere, or not yet placed: a reservation, so that members
// placed with the group later stay under the cap). charge: mark them held on d.
static int64_t group_inputs(placer_state *a, int g, int d, bool charge) {
    const placer_problem *p = a->p;
    int mark = ++a->gid_mark_next;
    int64_t b = 0;
    uint64_t bit = d < 64 ? (uint64_t)1 << d : 0;
    for (int k = a->member_start[g]; k < a->member_start[g + 1]; k++) {
        int v = a->members[k];
        for (int e = p->pred_start[v]; e < p->pred_start[v + 1]; e++) {
            int u = p->pred[e], gid = p->pred_gid[e];
            if (a->pg->group_of[u] == g || a->dev[u] == d || a->gid_mark[gid] == mark) continue;
            if (placer_is_lazy(a, u)) continue;   // it will be pulled beside its reader
            if (bit && (a->recv[gid] & bit)) continue;
            a->gid_mark[gid] = mark;
            b += p->gid_bytes[gid];
            if (charge) a->recv[gid] |= bit;
        }
    }
    return b;
}

// A group not placed yet on d: its bytes and the copies it reads (d -1: its bytes).
static int64_t group_need(placer_state *a, int g, int d) {
    return a->group_bytes[g] + (d >= 0 ? group_inputs(a, g, d, false) : 0);
}

// The bytes device d takes if v goes there: its group's and the copies its group reads (if the
// group is not placed), the same for its waiting inputs' groups, or the copies of its inputs
// from elsewhere (if its group is placed).
int64_t placer_need_bytes(const placer_state *a_in, int v, int d) {
    placer_state *a = (placer_state *)a_in;   // only the scratch marks change
    const placer_problem *p = a->p;
    int g = a->pg->group_of[v];
    int64_t b = a->gdev[g] < 0 ? group_need(a, g, d) : 0;
    for (int e = p->pred_start[v]; e < p->pred_start[v + 1]; e++) {
        int gu = a->pg->group_of[p->pred[e]];
        if (a->gdev[gu] >= 0 || gu == g) continue;
        bool seen = false;
        for (int f = p->pred_start[v]; f < e && !seen; f++) seen = a->pg->group_of[p->pred[f]] == gu;
        if (!seen) b += group_need(a, gu, d);
    }
    return b + (d >= 0 && a->gdev[g] >= 0 ? recv_bytes(a, v, d, false) : 0);
}

// Places group g on d with the copies it reads.
void placer_put_charged(placer_state *a, int g, int d) {
    a->used[d] += group_inputs(a, g, d, true);
    placer_put(a, g, d);
}

bool placer_room_for(const placer_state *a, int v, int d) {
    int64_t cap = a->caps ? a->caps[d] : 0;
    return cap <= 0 || a->used[d] + placer_need_bytes(a, v, d) <= cap;
}

// After v went to d: its waiting inputs' groups go there too where they may (else wait on).
void placer_pull_inputs(placer_state *a, int v, int d) {
    for (int e = a->p->pred_start[v]; e < a->p->pred_start[v + 1]; e++) {
        int gu = a->pg->group_of[a->p->pred[e]];
        if (a->gdev[gu] >= 0 || !placer_allowed(a, gu, d)) continue;
        int64_t cap = a->caps ? a->caps[d] : 0;
        if (cap <= 0 || a->used[d] + group_need(a, gu, d) <= cap) placer_put_charged(a, gu, d);
    }
}


// Groups no reader pulled: each on the allowed device with the fewest bytes that has room.
bool placer_place_leftovers(placer_state *a, dg_status *st) {
    for (int v = 0; v < a->p->n; v++) {
        int g = a->pg->group_of[v];
        if (a->gdev[g] >= 0) continue;
        int best = -1;
        for (int d = 0; d < a->p->n_dev; d++)
            if (placer_allowed(a, g, d) && placer_fits(a, g, d) && (best < 0 || a->used[d] < a->used[best])) best = d;
        if (best < 0) return placer_no_room(a, v, st);
        placer_put(a, g, best);
    }
    return true;
}

bool placer_no_room(const placer_state *a, int v, dg_status *st) {
    const dg_node *n = a->p->nodes[v];
    int g = a->pg->group_of[v];
    char room[512];
    size_t o = 0;
    room[0] = 0;
    for (int d = 0; d < a->p->n_dev && o < sizeof room; d++) {
        if (!placer_allowed(a, g, d)) continue;
        int64_t cap = a->caps ? a->caps[d] : 0;
        o += (size_t)snprintf(room + o, sizeof room - o, "%s%s %lld of %lld bytes used", o ? "; " : "",
                              a->p->devices[d], (long long)a->used[d], (long long)cap);
    }
    int64_t with_inputs = placer_need_bytes(a, v, -1);
    char inputs[96] = "";
    if (a->gdev[g] < 0 && with_inputs > a->group_bytes[g])
        snprintf(inputs, sizeof inputs, ", %lld with the variables and constants it reads first",
                 (long long)with_inputs);
    dg_status_setf(st, DG_RESOURCE_EXHAUSTED,
                   "automatic placement: no device may take node \"%s\" (%s) under the memory caps: its "
                   "colocation group holds %lld bytes%s (%s)",
                   n->name, n->op->name, (long long)a->group_bytes[g], inputs, room);
    return false;
}
