/* The automatic placer. Over a placement problem (simulate.c) and the colocation groups of the
 * placer (placer_groups_build), three list placers after Baechi (Jeon et al., SoCC 2020), each
 * keeping every device's static bytes under its cap:
 * - m-TOPO: groups in topological order fill one device up to an equal share of the bytes,
 *   then the next;
 * - m-ETF: ops taken in the order their inputs become ready, each on the device where it can
 *   start earliest (its inputs' transfers counted);
 * - m-SCT: m-ETF, except that an op that is the favourite child of its parent (the child its
 *   largest output goes to) stays on the parent's device unless it would start later there by
 *   more than the transfer it saves. Baechi picks favourite children by a linear program; this
 *   picks by bytes.
 * Then chains (contiguous runs of the step's groups cut where the fewest bytes cross) and
 * gradients grouped with the ops they differentiate, as starts for the automatic placer, which
 * simulates those, the three and METIS's cuts (metis_place.c), keeps the fastest that fits the
 * caps, and spends its time budget on moves kept only when the simulated step gets shorter:
 * first of whole clusters (METIS's parts of the groups, two per device: a layer's ops tied by
 * the weights they all read), then of one colocation group at a time, taken from the simulated
 * step's critical path (each op back to what it waited for last: its stream, or an input). It
 * is never slower than the best of them. The state the placers share is in placer_state.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base_impl.h"
#include "graph_impl.h"
#include "placer_impl.h"

dg_auto_place_options dg_auto_place_options_default(void) {
    dg_auto_place_options o;
    memset(&o, 0, sizeof o);
    o.placer = DG_AUTO_PLACER_AUTO;
    o.seed = 1;
    o.placement = dg_placement_options_default();
    return o;
}

const char *dg_auto_placer_name(dg_auto_placer p) {
    switch (p) {
    case DG_AUTO_PLACER_AUTO: return "auto";
    case DG_AUTO_PLACER_M_TOPO: return "m-topo";
    case DG_AUTO_PLACER_M_ETF: return "m-etf";
    case DG_AUTO_PLACER_M_SCT: return "m-sct";
    case DG_AUTO_PLACER_METIS: return "metis";
    }
    return "unknown";
}

void dg_step_estimate_clear(dg_step_estimate *e) {
    if (!e) return;
    free(e->busy_s);
    free(e->peak_bytes);
    free(e->static_bytes);
    memset(e, 0, sizeof *e);
}

void dg_auto_place_report_clear(dg_auto_place_report *r) {
    if (!r) return;
    dg_step_estimate_clear(&r->estimate);
    memset(r, 0, sizeof *r);
}

// ---- m-TOPO ----

// follow: gradient ops not grouped with the op they differentiate (sums of gradients, their
// seeds) go where their largest input is, when it has room, instead of the device being filled.
static bool place_topo(placer_state *a, bool follow, dg_status *st) {
    const placer_problem *p = a->p;
    int nd = p->n_dev;
    int64_t total = 0;
    for (int g = 0; g < a->pg->n_groups; g++) total += a->group_bytes[g];
    int64_t share = total / nd + 1;
    int cur = 0;
    placer_reset(a);
    for (int k = 0; k < p->n; k++) {
        int v = p->topo[k], g = a->pg->group_of[v];
        if (a->gdev[g] >= 0 || placer_is_lazy(a, v)) {
            if (a->gdev[g] >= 0) {
                placer_pull_inputs(a, v, a->gdev[g]);
                placer_charge_inputs(a, v, a->gdev[g]);
            }
            continue;
        }
        int chosen = -1;
        if (follow && strncmp(p->nodes[v]->name, "gradients", 9) == 0) {
            int64_t best = -1;
            for (int e = p->pred_start[v]; e < p->pred_start[v + 1]; e++) {
                int du = a->dev[p->pred[e]];
                if (du >= 0 && p->gid_bytes[p->pred_gid[e]] > best && placer_allowed(a, g, du) &&
                    placer_room_for(a, v, du)) {
                    best = p->gid_bytes[p->pred_gid[e]];
                    chosen = du;
                }
            }
            if (chosen >= 0) {
                placer_put_charged(a, g, chosen);
                placer_pull_inputs(a, v, chosen);
                placer_charge_inputs(a, v, chosen);
                continue;
            }
        }
        // Under the share, from the device being filled on; then anywhere under the caps.
        for (int j = 0; j < nd && chosen < 0; j++) {
            int d = (cur + j) % nd;
            int64_t cap = a->caps && a->caps[d] > 0 && a->caps[d] < share ? a->caps[d] : share;
            if (placer_allowed(a, g, d) && a->used[d] + placer_need_bytes(a, v, d) <= cap) chosen = d;
        }
        for (int j = 0; j < nd && chosen < 0; j++) {
            int d = (cur + j) % nd;
            if (placer_allowed(a, g, d) && placer_room_for(a, v, d)) chosen = d;
        }
        if (chosen < 0) return placer_no_room(a, v, st);
        bool cur_full = chosen != cur && placer_allowed(a, g, cur) && a->used[cur] + placer_need_bytes(a, v, cur) > share;
        placer_put_charged(a, g, chosen);
        placer_pull_inputs(a, v, chosen);
        placer_charge_inputs(a, v, chosen);
        if (chosen == cur && a->used[cur] >= share && cur < nd - 1) cur++;
        else if (cur_full && cur < nd - 1) cur++;
    }
    return placer_place_leftovers(a, st);
}

// ---- chains: contiguous runs with the fewest bytes between them ----

typedef struct pos_item {
    int64_t key;
    int g;
} pos_item;

static int pos_cmp(const void *x, const void *y) {
    const pos_item *a = x, *b = y;
    if (a->key != b->key) return a->key < b->key ? -1 : 1;
    return a->g - b->g;
}

// Groups in the order the step first needs them (a node with inputs at its rank, in build or
// topological order, one without at its first reader's) cut into at most one run per device, each run's bytes
// under cap_factor times its device's cap (no cap: one run), where the runs' boundaries carry
// the fewest bytes (a dynamic program with a sliding-window minimum, O(groups x devices)); run
// j goes to device j. Gradient ops not grouped with what they differentiate then go beside
// their largest input. What an expert does to a chain of layers, without the layers' names.
static bool place_chain(placer_state *a, double cap_factor, bool by_build, dg_status *st) {
    const placer_problem *p = a->p;
    int n = p->n, nd = p->n_dev, ng = a->pg->n_groups;
    bool ok = false;
    int *rank = malloc(((size_t)n + 1) * sizeof *rank), *pos_of = malloc(((size_t)ng + 1) * sizeof *pos_of);
    pos_item *order = malloc(((size_t)ng + 1) * sizeof *order);
    double *cut = calloc((size_t)ng + 2, sizeof *cut);
    int64_t *prefix = calloc((size_t)ng + 2, sizeof *prefix);
    double *dp = malloc(((size_t)ng + 1) * 2 * sizeof *dp);
    int *from = malloc(((size_t)ng + 1) * (size_t)(nd + 1) * sizeof *from);
    int *deque = malloc(((size_t)ng + 1) * sizeof *deque);
    bool *follower = calloc((size_t)ng + 1, sizeof *follower);
    if (!rank || !pos_of || !order || !cut || !prefix || !dp || !from || !deque || !follower) {
        base_oom(st, "automatic placement", (size_t)ng * (size_t)(nd + 1) * sizeof *from);
        goto out;
    }
    placer_reset(a);
    // by_build: the order the nodes were given in (a graph's build order: layer after layer as
    // the program wrote them), else a topological order (ready first).
    for (int k = 0; k < n; k++) rank[by_build ? k : p->topo[k]] = k;
    for (int g = 0; g < ng; g++) {
        order[g] = (pos_item){INT64_MAX, g};
        follower[g] = true;
    }
    for (int v = 0; v < n; v++) {
        int64_t key = rank[v];
        if (p->n_in[v] == 0) {
            key = INT64_MAX;
            for (int e = p->succ_start[p->out_start[v]]; e < p->succ_start[p->out_start[v + 1]]; e++)
                if (rank[p->succ[e]] < key) key = rank[p->succ[e]];
            if (key == INT64_MAX) key = rank[v];
        }
        int g = a->pg->group_of[v];
        if (key < order[g].key) order[g].key = key;
        if (strncmp(p->nodes[v]->name, "gradients", 9) != 0 || a->pg->pinned[g]) follower[g] = false;
    }
    // Followers (groups of unpaired gradient ops only) are left out of the runs.
    int m = 0;
    for (int g = 0; g < ng; g++)
        if (!follower[g]) order[m++] = order[g];
    qsort(order, (size_t)m, sizeof *order, pos_cmp);
    for (int g = 0; g < ng; g++) pos_of[g] = -1;
    for (int i = 0; i < m; i++) pos_of[order[i].g] = i;
    if (m == 0) {   // nothing but followers: beside their inputs, or anywhere
        ok = placer_place_leftovers(a, st);
        goto out;
    }
    for (int i = 0; i < m; i++) prefix[i + 1] = prefix[i] + a->group_bytes[order[i].g];
    // cut[b]: bytes of tensors made before boundary b (between positions b-1 and b) and read at
    // or after it: each output adds its bytes to boundaries (its position, its last reader's].
    for (int u = 0; u < n; u++) {
        int pu = pos_of[a->pg->group_of[u]];
        if (pu < 0) continue;
        for (int gid = p->out_start[u]; gid < p->out_start[u + 1]; gid++) {
            int last = -1;
            for (int e = p->succ_start[gid]; e < p->succ_start[gid + 1]; e++) {
                int pv = pos_of[a->pg->group_of[p->succ[e]]];
                if (pv > last) last = pv;
            }
            if (last > pu) {
                cut[pu + 1] += (double)p->gid_bytes[gid];
                cut[last + 1] -= (double)p->gid_bytes[gid];
            }
        }
    }
    for (int b = 1; b <= m; b++) cut[b] += cut[b - 1];
    // dp over runs: best[j][i] = the least cut bytes of the first i positions in j runs.
    int64_t cap = INT64_MAX;
    for (int d = 0; a->caps && d < nd; d++)
        if (a->caps[d] > 0 && (int64_t)((double)a->caps[d] * cap_factor) < cap) cap = (int64_t)((double)a->caps[d] * cap_factor);
    double *prev = dp, *cur = dp + m + 1;
    for (int i = 0; i <= m; i++) prev[i] = i == 0 ? 0 : INFINITY;
    int runs = -1;
    for (int j = 1; j <= nd && runs < 0; j++) {
        int head = 0, tail = 0, lo = 0;
        cur[0] = INFINITY;
        for (int i = 1; i <= m; i++) {
            // Candidate starts t of the last run (positions t..i-1), cost prev[t] + cut[t].
            int t = i - 1;
            if (isfinite(prev[t])) {
                double c = prev[t] + (t > 0 ? cut[t] : 0);
                while (tail > head && prev[deque[tail - 1]] + (deque[tail - 1] > 0 ? cut[deque[tail - 1]] : 0) >= c) tail--;
                deque[tail++] = t;
            }
            while (prefix[i] - prefix[lo] > cap) lo++;
            while (tail > head && deque[head] < lo) head++;
            cur[i] = tail > head ? prev[deque[head]] + (deque[head] > 0 ? cut[deque[head]] : 0) : INFINITY;
            from[(size_t)i * (nd + 1) + j] = tail > head ? deque[head] : -1;
        }
        if (isfinite(cur[m])) runs = j;
        double *tmp = prev;
        prev = cur;
        cur = tmp;
    }
    if (runs < 0) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "automatic placement: no %d runs of the step's ops fit the caps", nd);
        goto out;
    }
    // Back through the runs: run j (1-based) gets device j-1 where its groups may go.
    for (int j = runs, i = m; j >= 1; j--) {
        int t = from[(size_t)i * (nd + 1) + j];
        for (int q = t; q < i; q++) {
            int g = order[q].g, d = j - 1;
            if (placer_allowed(a, g, d)) placer_put(a, g, d);
        }
        i = t;
    }
    // Followers beside their largest placed input.
    for (int k = 0; k < n; k++) {
        int v = p->topo[k], g = a->pg->group_of[v];
        if (!follower[g] || a->gdev[g] >= 0) continue;
        int best = -1;
        int64_t bb = -1;
        for (int e = p->pred_start[v]; e < p->pred_start[v + 1]; e++) {
            int du = a->dev[p->pred[e]];
            if (du >= 0 && p->gid_bytes[p->pred_gid[e]] > bb && placer_allowed(a, g, du)) {
                bb = p->gid_bytes[p->pred_gid[e]];
                best = du;
            }
        }
        if (best >= 0) placer_put(a, g, best);
    }
    ok = placer_place_leftovers(a, st);
out:
    free(rank);
    free(pos_of);
    free(order);
    free(cut);
    free(prefix);
    free(dp);
    free(from);
    free(deque);
    free(follower);
    return ok;
}

// ---- m-ETF and m-SCT ----

typedef struct ready_item {
    double t;
    int rank, v;
} ready_item;

static bool ready_less(const ready_item *x, const ready_item *y) {
    return x->t < y->t || (x->t == y->t && x->rank < y->rank);
}

static void ready_push(ready_item *h, int *n, ready_item it) {
    int i = (*n)++;
    while (i > 0) {
        int parent = (i - 1) / 2;
        if (!ready_less(&it, &h[parent])) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = it;
}

static ready_item ready_pop(ready_item *h, int *n) {
    ready_item top = h[0], last = h[--*n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && ready_less(&h[c + 1], &h[c])) c++;
        if (!ready_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

// When v can start on d: the device free, and every input there.
static double start_on(const placer_state *a, const double *finish, const double *dev_free, int v, int d) {
    const placer_problem *p = a->p;
    double t = dev_free[d];
    for (int e = p->pred_start[v]; e < p->pred_start[v + 1]; e++) {
        int u = p->pred[e], du = a->dev[u];
        double arr = finish[u];
        if (du >= 0 && du != d) {
            size_t ch = (size_t)du * p->n_dev + d;
            arr += p->lat[ch] + (double)p->gid_bytes[p->pred_gid[e]] * p->inv_bw[ch];
        }
        if (arr > t) t = arr;
    }
    return t;
}

static bool place_etf(placer_state *a, bool sct, dg_status *st) {
    const placer_problem *p = a->p;
    int n = p->n, nd = p->n_dev;
    bool ok = false;
    double *finish = calloc((size_t)n + 1, sizeof *finish);
    double *dev_free = calloc((size_t)nd + 1, sizeof *dev_free);
    int *pending = malloc(((size_t)n + 1) * sizeof *pending);
    int *rank = malloc(((size_t)n + 1) * sizeof *rank);
    int *fav_parent = malloc(((size_t)n + 1) * sizeof *fav_parent);
    ready_item *heap = malloc(((size_t)n + 1) * sizeof *heap);
    int n_heap = 0;
    if (!finish || !dev_free || !pending || !rank || !fav_parent || !heap) {
        base_oom(st, "automatic placement", (size_t)n * sizeof *heap);
        goto out;
    }
    placer_reset(a);
    for (int k = 0; k < n; k++) rank[p->topo[k]] = k;
    for (int v = 0; v < n; v++) fav_parent[v] = -1;
    if (sct) {
        // Each op's favourite child: the reader of its most bytes; a child keeps the parent
        // that sends it the most of those that chose it.
        int64_t *fav_bytes = calloc((size_t)n + 1, sizeof *fav_bytes);
        if (!fav_bytes) {
            base_oom(st, "automatic placement", (size_t)n * sizeof *fav_bytes);
            goto out;
        }
        for (int u = 0; u < n; u++) {
            int best = -1;
            int64_t bb = -1;
            for (int e = p->succ_start[p->out_start[u]]; e < p->succ_start[p->out_start[u + 1]]; e++)
                if (p->gid_bytes[p->succ_gid[e]] > bb) {
                    bb = p->gid_bytes[p->succ_gid[e]];
                    best = p->succ[e];
                }
            if (best >= 0 && bb > fav_bytes[best]) {
                fav_bytes[best] = bb;
                fav_parent[best] = u;
            }
        }
        free(fav_bytes);
    }
    for (int v = 0; v < n; v++) {
        pending[v] = p->n_in[v];
        if (pending[v] == 0) ready_push(heap, &n_heap, (ready_item){0, rank[v], v});
    }
    while (n_heap > 0) {
        int v = ready_pop(heap, &n_heap).v;
        int g = a->pg->group_of[v];
        int best = -1;
        double best_t = INFINITY;
        if (placer_is_lazy(a, v)) {
            finish[v] = 0;
            for (int e = p->succ_start[p->out_start[v]]; e < p->succ_start[p->out_start[v + 1]]; e++)
                if (--pending[p->succ[e]] == 0) ready_push(heap, &n_heap, (ready_item){0, rank[p->succ[e]], p->succ[e]});
            continue;
        }
        if (a->gdev[g] >= 0) {
            best = a->gdev[g];
            best_t = start_on(a, finish, dev_free, v, best);
        } else {
            for (int d = 0; d < nd; d++) {
                if (!placer_allowed(a, g, d) || !placer_room_for(a, v, d)) continue;
                double t = start_on(a, finish, dev_free, v, d);
                double c = p->cost[(size_t)v * p->n_types + p->dev_type[d]];
                double bc = best >= 0 ? p->cost[(size_t)v * p->n_types + p->dev_type[best]] : 0;
                if (t < best_t || (t == best_t && t + c < best_t + bc)) {
                    best = d;
                    best_t = t;
                }
            }
            if (best < 0) {
                placer_no_room(a, v, st);
                goto out;
            }
            int fp = fav_parent[v];
            if (fp >= 0 && a->dev[fp] >= 0 && a->dev[fp] != best && placer_allowed(a, g, a->dev[fp]) &&
                placer_room_for(a, v, a->dev[fp])) {
                int d = a->dev[fp];
                size_t ch = (size_t)d * nd + best;
                int64_t bytes = 0;
                for (int e = p->pred_start[v]; e < p->pred_start[v + 1]; e++)
                    if (p->pred[e] == fp && p->gid_bytes[p->pred_gid[e]] > bytes) bytes = p->gid_bytes[p->pred_gid[e]];
                double saved = p->lat[ch] + (double)bytes * p->inv_bw[ch];
                double t = start_on(a, finish, dev_free, v, d);
                if (t <= best_t + saved) {
                    best = d;
                    best_t = t;
                }
            }
            placer_put_charged(a, g, best);
        }
        placer_pull_inputs(a, v, best);
        placer_charge_inputs(a, v, best);
        finish[v] = best_t + p->cost[(size_t)v * p->n_types + p->dev_type[best]];
        dev_free[best] = finish[v];
        for (int e = p->succ_start[p->out_start[v]]; e < p->succ_start[p->out_start[v + 1]]; e++) {
            int w = p->succ[e];
            if (--pending[w] == 0) {
                double t = 0;
                for (int f = p->pred_start[w]; f < p->pred_start[w + 1]; f++)
                    if (finish[p->pred[f]] > t) t = finish[p->pred[f]];
                ready_push(heap, &n_heap, (ready_item){t, rank[w], w});
            }
        }
    }
    ok = placer_place_leftovers(a, st);
out:
    free(finish);
    free(dev_free);
    free(pending);
    free(rank);
    free(fav_parent);
    free(heap);
    return ok;
}

// ---- refinement under the simulator ----

static uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

// The first device over its cap with these bytes, or -1.
static int over_cap_device(const placer_state *a, const int64_t *usage) {
    for (int d = 0; a->caps && d < a->p->n_dev; d++)
        if (a->caps[d] > 0 && usage[d] > a->caps[d]) return d;
    return -1;
}

static bool over_caps(const placer_state *a, const int64_t *usage) { return over_cap_device(a, usage) >= 0; }

static void move_group(placer_state *a, int g, int d) {
    a->used[a->gdev[g]] -= a->group_bytes[g];
    placer_put(a, g, d);
}

// Moves groups of the critical path while the simulated step gets shorter, until the
// deadline or until many moves in a row did not help. Returns the moves kept.
static int refine(placer_state *a, placer_sim *sim, double *step, double deadline, uint64_t seed) {
    const placer_problem *p = a->p;
    int nd = p->n_dev, kept = 0, misses = 0;
    uint64_t rng = seed ? seed : 1;
    int *path = malloc(((size_t)p->n + 1) * sizeof *path), *toward = malloc(((size_t)p->n + 1) * sizeof *toward);
    int *stamp = malloc(((size_t)nd + 1) * sizeof *stamp);
    int64_t *usage = malloc(((size_t)nd + 1) * sizeof *usage);
    if (!path || !toward || !stamp || !usage) {
        free(path);
        free(toward);
        free(stamp);
        free(usage);
        return 0;
    }
    int n_path = 0, idlest = 0;
    bool stale = true;
    while (base_now_s() < deadline && misses < 400 + nd * 50) {
        if (stale) {
            // From the placement kept (sim holds its run): back through what each op waited for
            // last, its stream (the op before it there) or else the input that came last; for
            // each, the device of that input; and the device with the least work.
            n_path = 0;
            for (int v = sim->last; v >= 0 && n_path < p->n;) {
                toward[n_path] = sim->crit[v] >= 0 ? a->dev[sim->crit[v]] : -1;
                path[n_path++] = v;
                v = sim->blocker[v] >= 0 ? sim->blocker[v] : sim->crit[v];
            }
            idlest = 0;
            for (int d = 1; d < nd; d++)
                if (sim->busy[d] < sim->busy[idlest]) idlest = d;
            stale = false;
        }
        if (n_path == 0) break;
        int i = (int)(rng_next(&rng) % (uint64_t)n_path), v = path[i];
        int g = a->pg->group_of[v], from = a->gdev[g];
        // Towards the device of the input that held it up, to the device with the least work,
        // or to any other.
        int to, how = (int)(rng_next(&rng) % 3);
        if (how == 0 && toward[i] >= 0 && toward[i] != from) to = toward[i];
        else if (how == 1 && idlest != from) to = idlest;
        else to = (int)(rng_next(&rng) % (uint64_t)nd);
        if (to == from || !placer_allowed(a, g, to)) {
            misses++;
            continue;
        }
        a->used[from] -= a->group_bytes[g];
        bool room = placer_fits(a, g, to);
        a->used[from] += a->group_bytes[g];
        if (!room) {
            misses++;
            continue;
        }
        move_group(a, g, to);
        // The exact bytes, copies received included, must stay under the caps.
        placer_static_usage(p, a->dev, usage, stamp);
        if (over_caps(a, usage)) {
            move_group(a, g, from);
            misses++;
            continue;
        }
        double t = placer_simulate_bounded(p, a->dev, sim, *step);
        if (t >= 0 && t < *step * (1 - 1e-9)) {
            *step = t;
            kept++;
            misses = 0;
            stale = true;
        } else {
            move_group(a, g, from);
            misses++;
        }
    }
    // The simulation's times and the bytes must be those of the placement kept.
    placer_simulate(p, a->dev, sim);
    placer_static_usage(p, a->dev, a->used, stamp);
    free(path);
    free(toward);
    free(stamp);
    free(usage);
    return kept;
}

// The device holding the most of n groups.
static int majority(const placer_state *a, const int *groups, int n, int *cnt) {
    int nd = a->p->n_dev, best = -1;
    for (int d = 0; d < nd; d++) cnt[d] = 0;
    for (int i = 0; i < n; i++)
        if (a->gdev[groups[i]] >= 0) cnt[a->gdev[groups[i]]]++;
    for (int d = 0; d < nd; d++)
        if (best < 0 || cnt[d] > cnt[best]) best = d;
    return best;
}

// The groups of n that may go to d go there (old: where each was, when given). Returns how
// many moved.
static int move_groups(placer_state *a, const int *groups, int n, int d, int *old) {
    int moved = 0;
    for (int i = 0; i < n; i++) {
        if (old) old[i] = a->gdev[groups[i]];
        if (a->gdev[groups[i]] != d && placer_allowed(a, groups[i], d)) {
            move_group(a, groups[i], d);
            moved++;
        }
    }
    return moved;
}

static void restore_groups(placer_state *a, const int *groups, int n, const int *old) {
    for (int i = 0; i < n; i++)
        if (a->gdev[groups[i]] != old[i]) move_group(a, groups[i], old[i]);
}

// The simulated step of a's placement, stopped past bound; INFINITY over a cap.
static double try_placement(const placer_state *a, placer_sim *sim, double bound, int64_t *usage, int *stamp) {
    placer_static_usage(a->p, a->dev, usage, stamp);
    if (over_caps(a, usage)) return INFINITY;
    double t = placer_simulate_bounded(a->p, a->dev, sim, bound);
    return t >= 0 ? t : INFINITY;
}

int placer_cluster_refine(placer_state *a, placer_state *by, int k, placer_sim *sim, double *step, double deadline,
                          uint64_t seed) {
    const placer_problem *p = a->p;
    int nd = p->n_dev, ng = a->pg->n_groups, kept = 0, filled = 0;
    // At most one part for each of by's groups the step has.
    for (int g = 0; g < by->pg->n_groups; g++) filled += by->member_start[g + 1] > by->member_start[g];
    if (k > filled) k = filled;
    if (k < 2 || nd < 2) return 0;
    int *bpart = malloc(((size_t)by->pg->n_groups + 1) * sizeof *bpart);
    int *cl = malloc(((size_t)ng + 1) * sizeof *cl);
    int *cstart = calloc((size_t)k + 2, sizeof *cstart), *cgroups = malloc(((size_t)ng + 1) * sizeof *cgroups);
    int *old = malloc(((size_t)ng + 1) * sizeof *old), *order = malloc(((size_t)k + 1) * sizeof *order);
    int *stamp = malloc(((size_t)nd + 1) * sizeof *stamp), *cnt = malloc(((size_t)nd + 1) * sizeof *cnt);
    int *old2 = malloc(((size_t)ng + 1) * sizeof *old2), *cmaj = malloc(((size_t)k + 1) * sizeof *cmaj);
    int64_t *usage = malloc(((size_t)nd + 1) * sizeof *usage);
    uint64_t rng = seed ? seed : 1;
    if (!bpart || !cl || !cstart || !cgroups || !old || !order || !stamp || !usage || !cnt || !old2 || !cmaj) goto out;
    if (!placer_metis_parts(by, k, 1.5, seed, bpart, NULL)) goto out;
    for (int g = 0; g < ng; g++) cl[g] = -1;
    for (int v = 0; v < p->n; v++) cl[a->pg->group_of[v]] = bpart[by->pg->group_of[v]];
    for (int g = 0; g < ng; g++)
        if (cl[g] >= 0) cstart[cl[g] + 1]++;
    for (int c = 0; c < k; c++) cstart[c + 1] += cstart[c];
    {
        int *fill = calloc((size_t)k + 1, sizeof *fill);
        if (!fill) goto out;
        for (int g = 0; g < ng; g++)
            if (cl[g] >= 0) cgroups[cstart[cl[g]] + fill[cl[g]]++] = g;
        free(fill);
    }
    for (int c = 0; c < k; c++) order[c] = c;
    for (bool changed = true; changed && base_now_s() < deadline;) {
        changed = false;
        for (int i = k - 1; i > 0; i--) {
            int j = (int)(rng_next(&rng) % (uint64_t)(i + 1)), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        for (int oi = 0; oi < k && base_now_s() < deadline; oi++) {
            int c = order[oi], best_d = -1, best_c2 = -1;
            const int *cg = cgroups + cstart[c];
            int cn = cstart[c + 1] - cstart[c];
            double best_t = *step * (1 - 1e-9);
            int home = majority(a, cg, cn, cnt);
            bool have_maj = false;   // cmaj: where each cluster mostly is, found at the first swap
            for (int d = 0; d < nd && base_now_s() < deadline; d++) {
                if (move_groups(a, cg, cn, d, old) == 0) continue;
                double t = try_placement(a, sim, best_t, usage, stamp);
                if (t < best_t) {
                    best_t = t;
                    best_d = d;
                    best_c2 = -1;
                } else if (isinf(t)) {
                    // No room on d: try swapping with each cluster that is mostly there (the tries
                    // put every group back, so where they are holds for c's tries).
                    if (!have_maj)
                        for (int c2 = 0; c2 < k; c2++)
                            cmaj[c2] = c2 == c ? home : majority(a, cgroups + cstart[c2], cstart[c2 + 1] - cstart[c2], cnt);
                    have_maj = true;
                    for (int c2 = 0; c2 < k && base_now_s() < deadline; c2++) {
                        const int *g2 = cgroups + cstart[c2];
                        int n2 = cstart[c2 + 1] - cstart[c2];
                        if (c2 == c || cmaj[c2] != d) continue;
                        move_groups(a, g2, n2, home, old2);
                        t = try_placement(a, sim, best_t, usage, stamp);
                        if (t < best_t) {
                            best_t = t;
                            best_d = d;
                            best_c2 = c2;
                        }
                        restore_groups(a, g2, n2, old2);
                    }
                }
                restore_groups(a, cg, cn, old);
            }
            if (best_d >= 0) {
                if (best_c2 >= 0)
                    move_groups(a, cgroups + cstart[best_c2], cstart[best_c2 + 1] - cstart[best_c2], home, NULL);
                move_groups(a, cg, cn, best_d, NULL);
                *step = best_t;
                kept++;
                changed = true;
            }
        }
    }
    placer_simulate(p, a->dev, sim);
    placer_static_usage(p, a->dev, a->used, stamp);
out:
    free(bpart);
    free(cl);
    free(cstart);
    free(cgroups);
    free(old);
    free(order);
    free(stamp);
    free(usage);
    free(cnt);
    free(old2);
    free(cmaj);
    return kept;
}

// The longest path of op times through the step, each op on the fastest device type, with no
// transfer: no placement's step is shorter.
static double critical_path(const placer_problem *p) {
    double *done = calloc((size_t)p->n + 1, sizeof *done), best = 0;
    if (!done) return 0;
    for (int k = 0; k < p->n; k++) {
        int v = p->topo[k];
        double start = 0, c = INFINITY;
        for (int e = p->pred_start[v]; e < p->pred_start[v + 1]; e++)
            if (done[p->pred[e]] > start) start = done[p->pred[e]];
        for (int d = 0; d < p->n_dev; d++) {
            double x = p->cost[(size_t)v * p->n_types + p->dev_type[d]];
            if (x < c) c = x;
        }
        done[v] = start + c;
        if (done[v] > best) best = done[v];
    }
    free(done);
    return best;
}

static int uf_find(int *parent, int x) {
    while (parent[x] != x) {
        parent[x] = parent[parent[x]];
        x = parent[x];
    }
    return x;
}

// The op a gradient op differentiates, by the names TensorFlow's gradients give
// ("gradients/<op>_grad/...", "gradients_3/<scope>/<op>_grad/..."): the index of <op> among
// the problem's nodes, or -1.
static int forward_op(const placer_problem *p, const graph_strmap *names, const char *name) {
    if (strncmp(name, "gradients", 9) != 0) return -1;
    const char *slash = strchr(name, '/');
    const char *grad = slash ? strstr(slash, "_grad/") : NULL;
    if (!grad || grad - slash - 1 <= 0 || grad - slash - 1 >= 1024) return -1;
    char fwd[1024];
    memcpy(fwd, slash + 1, (size_t)(grad - slash - 1));
    fwd[grad - slash - 1] = 0;
    void *v = graph_strmap_get(names, fwd);
    (void)p;
    return v ? (int)(intptr_t)v - 1 : -1;
}

// Groups in is grouped further: each gradient op's group with its forward op's, where the two
// may share a device. out gets the merged groups (allowed devices: both groups'; pinned:
// either). An expert's gradients-beside-their-ops, found without scopes.
static bool pair_gradients(const placer_problem *p, const placer_groups *in, placer_groups *out, dg_status *st) {
    memset(out, 0, sizeof *out);
    int ng = in->n_groups, nd = in->n_devices;
    int *parent = malloc(((size_t)ng + 1) * sizeof *parent), *num = malloc(((size_t)ng + 1) * sizeof *num);
    uint8_t *allow = malloc(((size_t)ng + 1) * (size_t)nd);
    graph_strmap names = {0};
    bool ok = parent && num && allow;
    for (int v = 0; ok && v < p->n; v++) ok = graph_strmap_put(&names, p->nodes[v]->name, (void *)(intptr_t)(v + 1));
    if (!ok) {
        base_oom(st, "automatic placement", (size_t)ng * sizeof *parent);
        goto out;
    }
    memcpy(allow, in->allowed, (size_t)ng * (size_t)nd);
    for (int g = 0; g < ng; g++) parent[g] = g;
    for (int v = 0; v < p->n; v++) {
        int f = forward_op(p, &names, p->nodes[v]->name);
        if (f < 0) continue;
        int a = uf_find(parent, in->group_of[v]), b = uf_find(parent, in->group_of[f]);
        if (a == b) continue;
        bool common = false;
        for (int d = 0; d < nd && !common; d++) common = allow[(size_t)a * nd + d] && allow[(size_t)b * nd + d];
        if (!common) continue;
        for (int d = 0; d < nd; d++) allow[(size_t)b * nd + d] &= allow[(size_t)a * nd + d];
        parent[a] = b;
    }
    int n_out = 0;
    for (int g = 0; g < ng; g++) num[g] = uf_find(parent, g) == g ? n_out++ : -1;
    out->n_nodes = in->n_nodes;
    out->n_groups = n_out;
    out->n_devices = nd;
    out->group_of = malloc(((size_t)in->n_nodes + 1) * sizeof *out->group_of);
    out->allowed = calloc(((size_t)n_out + 1) * (size_t)nd, 1);
    out->first = malloc(((size_t)n_out + 1) * sizeof *out->first);
    out->pinned = calloc((size_t)n_out + 1, sizeof *out->pinned);
    if (!out->group_of || !out->allowed || !out->first || !out->pinned) {
        placer_groups_clear(out);
        ok = base_oom(st, "automatic placement", (size_t)in->n_nodes * sizeof *out->group_of);
        goto out;
    }
    for (int v = 0; v < in->n_nodes; v++) out->group_of[v] = num[uf_find(parent, in->group_of[v])];
    for (int g = 0; g < ng; g++) {
        int r = num[uf_find(parent, g)];
        out->pinned[r] = out->pinned[r] || in->pinned[g];
        if (num[g] >= 0) memcpy(out->allowed + (size_t)r * nd, allow + (size_t)g * nd, (size_t)nd);
    }
    for (int r = 0; r < n_out; r++) {
        out->first[r] = -1;
        for (int d = 0; d < nd && out->first[r] < 0; d++)
            if (out->allowed[(size_t)r * nd + d]) out->first[r] = d;
    }
out:
    free(parent);
    free(num);
    free(allow);
    graph_strmap_clear(&names);
    return ok;
}

// ---- public calls ----

static bool fill_estimate(const placer_problem *p, const int *dev, placer_sim *sim, dg_step_estimate *est,
                          dg_status *st) {
    memset(est, 0, sizeof *est);
    est->n_devices = p->n_dev;
    est->busy_s = calloc((size_t)p->n_dev + 1, sizeof *est->busy_s);
    est->peak_bytes = calloc((size_t)p->n_dev + 1, sizeof *est->peak_bytes);
    est->static_bytes = calloc((size_t)p->n_dev + 1, sizeof *est->static_bytes);
    if (!est->busy_s || !est->peak_bytes || !est->static_bytes) {
        dg_step_estimate_clear(est);
        return base_oom(st, "step estimate", (size_t)p->n_dev * 8);
    }
    est->step_s = sim->step_s;
    est->n_ops = p->n;
    for (int d = 0; d < p->n_dev; d++) est->busy_s[d] = sim->busy[d];
    int *stamp = malloc(((size_t)p->n_dev + 1) * sizeof *stamp);
    if (!stamp) {
        dg_step_estimate_clear(est);
        return base_oom(st, "step estimate", (size_t)p->n_dev * sizeof *stamp);
    }
    placer_static_usage(p, dev, est->static_bytes, stamp);
    free(stamp);
    for (int x = 0; x < sim->n_xfers; x++) est->transfer_bytes += p->gid_bytes[sim->xfers[x].gid];
    est->n_transfers = sim->n_xfers;
    if (!placer_sim_peak_memory(p, dev, sim, est->peak_bytes, st)) {
        dg_step_estimate_clear(est);
        return false;
    }
    return true;
}

bool dg_simulate_step(dg_node *const *nodes, int n_nodes, const char *const *devices, int n_devices,
                      const dg_cost_model *m_in, dg_step_estimate *est, dg_status *st) {
    dg_status_reset(st);
    memset(est, 0, sizeof *est);
    dg_cost_model *own = m_in ? NULL : dg_cost_model_new();
    const dg_cost_model *m = m_in ? m_in : own;
    placer_problem p;
    placer_sim sim;
    memset(&sim, 0, sizeof sim);
    graph_strmap index = {0};
    int *dev = NULL;
    bool ok = false;
    if (!m) return base_oom(st, "cost model", sizeof(dg_cost_model));
    if (!placer_problem_build(&p, nodes, n_nodes, devices, n_devices, m, 0, st)) goto out_model;
    dev = malloc(((size_t)n_nodes + 1) * sizeof *dev);
    if (!dev) {
        base_oom(st, "simulation", (size_t)n_nodes * sizeof *dev);
        goto out;
    }
    for (int d = 0; d < n_devices; d++) graph_strmap_put(&index, devices[d], (void *)(intptr_t)(d + 1));
    for (int i = 0; i < n_nodes; i++) {
        const char *a = nodes[i]->assigned_device;
        void *v = a ? graph_strmap_get(&index, a) : NULL;
        if (!v) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "simulation: node \"%s\" (%s) is %s%s%s", nodes[i]->name,
                           nodes[i]->op->name, a ? "on device \"" : "not placed", a ? a : "",
                           a ? "\", which is not among the devices given" : "");
            goto out;
        }
        dev[i] = (int)(intptr_t)v - 1;
    }
    if (placer_simulate(&p, dev, &sim) < 0) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "simulation: out of memory");
        goto out;
    }
    ok = fill_estimate(&p, dev, &sim, est, st);
out:
    free(dev);
    graph_strmap_clear(&index);
    placer_sim_clear(&sim);
    placer_problem_clear(&p);
out_model:
    dg_cost_model_free(&own);
    return ok;
}

// Groups with a member already placed may take only that device (where they still may).
static void keep_assigned(placer_groups *pg, dg_node *const *nodes, int n, const char *const *devices, int n_dev) {
    graph_strmap index = {0};
    for (int d = 0; d < n_dev; d++) graph_strmap_put(&index, devices[d], (void *)(intptr_t)(d + 1));
    for (int i = 0; i < n; i++) {
        const char *a = nodes[i]->assigned_device;
        void *v = a && a[0] ? graph_strmap_get(&index, a) : NULL;
        if (!v) continue;
        int d = (int)(intptr_t)v - 1, g = pg->group_of[i];
        uint8_t *allow = pg->allowed + (size_t)g * n_dev;
        if (!allow[d]) continue;
        memset(allow, 0, (size_t)n_dev);
        allow[d] = 1;
        pg->first[g] = d;
        pg->pinned[g] = true;
    }
    graph_strmap_clear(&index);
}

// ---- the step's nodes, and the rest ----

typedef struct step_nodes {
    int n;
    dg_node **nodes;    // the step's nodes, in the order given
    int *group_of;      // their groups
    int *index;         // per node given: its index among the step's, -1 outside the step
    int *dev_all;       // per node given: its device at the end
} step_nodes;

static void step_nodes_clear(step_nodes *s) {
    free(s->nodes);
    free(s->group_of);
    free(s->index);
    free(s->dev_all);
    memset(s, 0, sizeof *s);
}

// Without targets the step is every node but the variables' initializers: a variable's
// initializing Assign, what only initializers read, and readers of nothing else (the init
// NoOp). Marks those -1 in s->index.
static bool drop_initializers(step_nodes *s, dg_node *const *nodes, int n, const int *local, int max_id,
                              dg_status *st) {
    int *readers = calloc((size_t)n + 1, sizeof *readers), *init_readers = calloc((size_t)n + 1, sizeof *init_readers);
    int *order = malloc(((size_t)n + 1) * sizeof *order);
    bool *init = calloc((size_t)n + 1, sizeof *init), *var_init = calloc((size_t)n + 1, sizeof *var_init);
    bool ok = readers && init_readers && order && init && var_init;
    if (!ok) base_oom(st, "automatic placement", (size_t)n * sizeof *readers);
#define EACH_INPUT(x, u_index, body)                                                            \
    for (int k_ = 0; k_ < (x)->n_inputs + (x)->n_ctrl; k_++) {                                  \
        dg_node *u_ = k_ < (x)->n_inputs ? (x)->inputs[k_].node : (x)->ctrl_inputs[k_ - (x)->n_inputs]; \
        int u_index = u_->id <= max_id ? local[u_->id] : -1;                                    \
        if (u_index < 0 || nodes[u_index] != u_) continue;                                      \
        body;                                                                                   \
    }
    for (int i = 0; ok && i < n; i++) {
        dg_node *x = nodes[i];
        EACH_INPUT(x, u, readers[u]++);
        if (x->var_initializer) {
            int a = x->var_initializer->id <= max_id ? local[x->var_initializer->id] : -1;
            if (a >= 0 && nodes[a] == x->var_initializer) var_init[a] = true;
        }
    }
    // Readers before what they read: the latest node first (ids are in build order).
    int m = 0;
    for (int id = max_id; ok && id >= 0; id--)
        if (local[id] >= 0) order[m++] = local[id];
    for (int k = 0; ok && k < m; k++) {
        int i = order[k];
        init[i] = var_init[i] || (readers[i] > 0 && init_readers[i] == readers[i]);
        if (init[i]) EACH_INPUT(nodes[i], u, init_readers[u]++);
    }
    for (int i = 0; ok && i < n; i++) {
        if (init[i] || readers[i] > 0) continue;
        bool all = nodes[i]->n_inputs + nodes[i]->n_ctrl > 0;
        EACH_INPUT(nodes[i], u, all = all && init[u]);
        init[i] = all;
    }
#undef EACH_INPUT
    for (int i = 0; ok && i < n; i++)
        if (init[i]) s->index[i] = -1;
    free(readers);
    free(init_readers);
    free(order);
    free(init);
    free(var_init);
    return ok;
}

// The nodes targets need (inputs and control inputs, transitively, within the nodes given);
// without targets, every node but the initializers.
static bool step_nodes_find(step_nodes *s, dg_node *const *nodes, int n, const int *group_of,
                            const dg_node *const *targets, int n_targets, dg_status *st) {
    memset(s, 0, sizeof *s);
    int max_id = -1;
    for (int i = 0; i < n; i++)
        if (nodes[i]->id > max_id) max_id = nodes[i]->id;
    int *local = malloc(((size_t)max_id + 2) * sizeof *local);
    int *stack = malloc(((size_t)n + 1) * sizeof *stack);
    s->nodes = malloc(((size_t)n + 1) * sizeof *s->nodes);
    s->group_of = malloc(((size_t)n + 1) * sizeof *s->group_of);
    s->index = malloc(((size_t)n + 1) * sizeof *s->index);
    s->dev_all = malloc(((size_t)n + 1) * sizeof *s->dev_all);
    bool ok = false;
    if (!local || !stack || !s->nodes || !s->group_of || !s->index || !s->dev_all) {
        base_oom(st, "automatic placement", (size_t)n * sizeof *stack);
        goto out;
    }
    for (int i = 0; i <= max_id; i++) local[i] = -1;
    for (int i = 0; i < n; i++) {
        local[nodes[i]->id] = i;
        s->index[i] = n_targets > 0 ? -1 : 0;
        s->dev_all[i] = -1;
    }
    if (n_targets == 0 && !drop_initializers(s, nodes, n, local, max_id, st)) goto out;
    if (n_targets > 0) {
        int top = 0;
        for (int t = 0; t < n_targets; t++) {
            const dg_node *x = targets[t];
            int i = x && x->id <= max_id ? local[x->id] : -1;
            if (i < 0 || nodes[i] != x) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "automatic placement: target %d (%s) is not among the nodes "
                               "to place", t, x ? x->name : "null");
                goto out;
            }
            if (s->index[i] < 0) {
                s->index[i] = 0;
                stack[top++] = i;
            }
        }
        while (top > 0) {
            dg_node *x = nodes[stack[--top]];
            for (int k = 0; k < x->n_inputs + x->n_ctrl; k++) {
                dg_node *u = k < x->n_inputs ? x->inputs[k].node : x->ctrl_inputs[k - x->n_inputs];
                int j = u->id <= max_id ? local[u->id] : -1;
                if (j >= 0 && nodes[j] == u && s->index[j] < 0) {
                    s->index[j] = 0;
                    stack[top++] = j;
                }
            }
        }
    }
    for (int i = 0; i < n; i++) {
        if (s->index[i] < 0) continue;
        s->index[i] = s->n;
        s->group_of[s->n] = group_of[i];
        s->nodes[s->n++] = nodes[i];
    }
    ok = true;
out:
    free(local);
    free(stack);
    if (!ok) step_nodes_clear(s);
    return ok;
}

// Devices of every node given: the step's as placed; the rest (initializers and what else the
// step does not run) with their group where it has a device, else beside a reader that has one
// (readers first: latest node first), else beside an input, else on the least filled device
// they may take. Outside the caps: they do not run in the step.
static bool place_rest(step_nodes *s, dg_node *const *nodes, int n, const placer_groups *pg, int *gdev,
                       const placer_state *a, dg_status *st) {
    int max_id = -1;
    for (int i = 0; i < n; i++)
        if (nodes[i]->id > max_id) max_id = nodes[i]->id;
    int *by_id = malloc(((size_t)max_id + 2) * sizeof *by_id);
    if (!by_id) return base_oom(st, "automatic placement", (size_t)max_id * sizeof *by_id);
    for (int i = 0; i <= max_id; i++) by_id[i] = -1;
    for (int i = 0; i < n; i++) by_id[nodes[i]->id] = i;
    for (int i = 0; i < n; i++) {
        if (s->index[i] >= 0) s->dev_all[i] = a->dev[s->index[i]];
        else if (gdev[pg->group_of[i]] >= 0) s->dev_all[i] = gdev[pg->group_of[i]];
    }
    // Readers to inputs, latest first; then inputs to readers.
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k <= max_id; k++) {
            int id = pass == 0 ? max_id - k : k, i = by_id[id];
            if (i < 0) continue;
            dg_node *x = nodes[i];
            for (int j = 0; j < x->n_inputs + x->n_ctrl; j++) {
                dg_node *u = j < x->n_inputs ? x->inputs[j].node : x->ctrl_inputs[j - x->n_inputs];
                int ui = u->id <= max_id ? by_id[u->id] : -1;
                if (ui < 0 || nodes[ui] != u) continue;
                int from = pass == 0 ? i : ui, to = pass == 0 ? ui : i;
                int d = s->dev_all[from], g = pg->group_of[to];
                if (d < 0 || s->dev_all[to] >= 0 || gdev[g] >= 0 || !pg->allowed[(size_t)g * pg->n_devices + d]) continue;
                gdev[g] = d;
                s->dev_all[to] = d;
            }
            // A group member given a device gives it to its group's other members below.
        }
    for (int i = 0; i < n; i++) {
        int g = pg->group_of[i];
        if (gdev[g] < 0) {
            int best = -1;
            for (int d = 0; d < pg->n_devices; d++)
                if (pg->allowed[(size_t)g * pg->n_devices + d] && (best < 0 || a->used[d] < a->used[best])) best = d;
            gdev[g] = best;
        }
        s->dev_all[i] = gdev[g];
    }
    free(by_id);
    return true;
}

bool dg_auto_place_nodes(dg_node *const *nodes, int n_nodes, const char *const *devices, int n_devices,
                         const dg_auto_place_options *opts_in, dg_auto_place_report *report, dg_status *st) {
    dg_status_reset(st);
    double t0 = base_now_s();
    if (report) memset(report, 0, sizeof *report);
    dg_auto_place_options opts = opts_in ? *opts_in : dg_auto_place_options_default();
    if ((int)opts.placer < 0 || (int)opts.placer > 4) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "automatic placement: no placer %d", (int)opts.placer);
        return false;
    }
    if (n_devices <= 0 || !devices) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "automatic placement: no devices to place on");
        return false;
    }
    if (opts.n_targets < 0 || (opts.n_targets > 0 && !opts.targets)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "automatic placement: %d targets%s", opts.n_targets,
                       opts.n_targets > 0 ? " and no array of them" : "");
        return false;
    }
    if (opts.unknown_dim < 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "automatic placement: unknown_dim must be at least 0, got %lld",
                       (long long)opts.unknown_dim);
        return false;
    }
    for (int d = 0; opts.memory_caps && d < n_devices; d++)
        if (opts.memory_caps[d] < 0) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "automatic placement: the memory cap of %s is negative (%lld)",
                           devices[d], (long long)opts.memory_caps[d]);
            return false;
        }
    dg_cost_model *own = opts.cost ? NULL : dg_cost_model_new();
    const dg_cost_model *m = opts.cost ? opts.cost : own;
    if (!m) return base_oom(st, "cost model", sizeof(dg_cost_model));
    placer_groups pg;
    placer_problem p;
    placer_sim sim;
    memset(&pg, 0, sizeof pg);
    memset(&p, 0, sizeof p);
    memset(&sim, 0, sizeof sim);
    placer_state a;
    memset(&a, 0, sizeof a);
    int *best_dev = NULL, *cand_dev = NULL, *stamp = NULL;
    int64_t *usage = NULL;
    bool ok = false;
    placer_state paired;     // AUTO: the state over groups with gradients beside their ops
    placer_groups paired_pg;
    memset(&paired, 0, sizeof paired);
    memset(&paired_pg, 0, sizeof paired_pg);
    step_nodes sn;
    memset(&sn, 0, sizeof sn);
    placer_groups spg;   // the groups of the step's nodes (numbered as pg's)
    if (!placer_groups_build(nodes, n_nodes, devices, n_devices, &opts.placement, &pg, st)) goto out;
    if (opts.keep_assigned) keep_assigned(&pg, nodes, n_nodes, devices, n_devices);
    if (!step_nodes_find(&sn, nodes, n_nodes, pg.group_of, opts.targets, opts.n_targets, st)) goto out;
    int n_step = sn.n;
    spg = pg;
    spg.group_of = sn.group_of;
    spg.n_nodes = n_step;
    if (!placer_problem_build(&p, sn.nodes, n_step, devices, n_devices, m, opts.unknown_dim, st)) goto out;
    if (!placer_state_init(&a, &p, &spg, opts.memory_caps, st)) goto out;
    best_dev = malloc(((size_t)n_step + 1) * sizeof *best_dev);
    cand_dev = malloc(((size_t)n_step + 1) * sizeof *cand_dev);
    usage = malloc(((size_t)n_devices + 1) * sizeof *usage);
    stamp = malloc(((size_t)n_devices + 1) * sizeof *stamp);
    if (!best_dev || !cand_dev || !usage || !stamp) {
        base_oom(st, "automatic placement", (size_t)n_nodes * 8);
        goto out;
    }
    // AUTO also tries m-TOPO and chains with each gradient op grouped with the op it differentiates,
    // and cuts those groups into the clusters it moves.
    if (opts.placer == DG_AUTO_PLACER_AUTO) {
        if (!pair_gradients(&p, &spg, &paired_pg, st) || !placer_state_init(&paired, &p, &paired_pg, opts.memory_caps, st))
            goto out;
    }
    double best_step = INFINITY;
    dg_auto_placer best_kind = DG_AUTO_PLACER_M_TOPO;
    // The candidates: each list placer once; METIS for a few part counts (from the fewest
    // devices whose caps hold the bytes to all of them) and two compute balances.
    typedef struct cand {
        dg_auto_placer kind;
        int parts;
        double ub;
        bool paired;   // over the groups with gradients beside their ops
    } cand;
    cand cands[40];
    int n_cands = 0, first_optional = 40;
    // By graph size, the whole placement takes 40 us a node, 0.8 s to 8 s.
    double target_s = fmin(8.0, fmax(0.8, 40e-6 * n_step));
    for (int k = DG_AUTO_PLACER_M_TOPO; k <= DG_AUTO_PLACER_M_SCT; k++)
        if (opts.placer == DG_AUTO_PLACER_AUTO || (int)opts.placer == k) cands[n_cands++] = (cand){(dg_auto_placer)k, 0, 0, false};
    if (opts.placer == DG_AUTO_PLACER_AUTO) {
        cands[n_cands++] = (cand){DG_AUTO_PLACER_M_TOPO, 0, 0, true};
        // Chains (reported as m-TOPO, their kin): runs under 90% and 75% of the caps, in
        // topological order (parts -1) and in build order (-2).
        for (int order = -1; order >= -2; order--) {
            cands[n_cands++] = (cand){DG_AUTO_PLACER_M_TOPO, order, 0.9, true};
            cands[n_cands++] = (cand){DG_AUTO_PLACER_M_TOPO, order, 0.75, true};
        }
    }
    if ((opts.placer == DG_AUTO_PLACER_AUTO || opts.placer == DG_AUTO_PLACER_METIS) && n_devices >= 2) {
        int max_k = n_devices < 64 ? n_devices : 64, ks[4], n_ks = 0;
        int64_t total = 0;
        for (int g = 0; g < pg.n_groups; g++) total += a.group_bytes[g];
        int min_k = 2;
        while (min_k < max_k && opts.memory_caps && opts.memory_caps[0] > 0 &&
               (double)total / min_k > 0.9 * (double)opts.memory_caps[0])
            min_k++;
        int want[4] = {min_k, min_k + 1, (min_k + max_k) / 2, max_k};
        for (int i = 0; i < 4; i++) {
            bool dup = want[i] > max_k;
            for (int j = 0; j < n_ks && !dup; j++) dup = ks[j] == want[i];
            if (!dup) ks[n_ks++] = want[i];
        }
        for (int i = 0; i < n_ks; i++) cands[n_cands++] = (cand){DG_AUTO_PLACER_METIS, ks[i], 1.1, false};
        // The looser balance last: by graph size, once a candidate fits, they run only while
        // the placement has used less than 40% of its time (the moves need the rest).
        if (opts.placer == DG_AUTO_PLACER_AUTO) {
            first_optional = n_cands;
            for (int i = 0; i < n_ks; i++) cands[n_cands++] = (cand){DG_AUTO_PLACER_METIS, ks[i], 2.0, false};
        }
    }
    bool have_err = false;
    // DG_AUTO_PLACE_VERBOSE=1: each candidate's prediction on standard error.
    const char *verbose_env = getenv("DG_AUTO_PLACE_VERBOSE");
    bool verbose = verbose_env && verbose_env[0] && strcmp(verbose_env, "0") != 0;
    for (int c = 0; c < n_cands; c++) {
        int k = (int)cands[c].kind;
        if (c >= first_optional && opts.time_budget_s == 0 && isfinite(best_step) &&
            base_now_s() - t0 > 0.4 * target_s) {
            if (verbose)
                fprintf(stderr,
                        "automatic placement: candidate %s (%d parts, balance %.2f) skipped: %.3f s of %.3f s taken\n",
                        dg_auto_placer_name((dg_auto_placer)k), cands[c].parts, cands[c].ub, base_now_s() - t0,
                        target_s);
            continue;
        }
        // The first placer that fails says why; a later one's success clears it.
        dg_status *kst = have_err ? NULL : st;
        placer_state *s = cands[c].paired ? &paired : &a;
        double tc = base_now_s();
        bool placed = k == DG_AUTO_PLACER_M_TOPO && cands[c].parts < 0 ? place_chain(s, cands[c].ub, cands[c].parts == -2, kst)
                      : k == DG_AUTO_PLACER_M_TOPO ? place_topo(s, cands[c].paired, kst)
                      : k == DG_AUTO_PLACER_METIS ? placer_metis(s, cands[c].parts, cands[c].ub, opts.seed, kst)
                                                  : place_etf(s, k == DG_AUTO_PLACER_M_SCT, kst);
        if (!placed) {
            if (verbose)
                fprintf(stderr, "automatic placement: candidate %s%s failed%s%s\n", dg_auto_placer_name((dg_auto_placer)k),
                        cands[c].paired ? " (gradients beside their ops)" : "", kst ? ": " : "", kst ? dg_status_message(kst) : "");
            have_err = true;
            continue;
        }
        memcpy(cand_dev, s->dev, (size_t)n_step * sizeof *cand_dev);
        // Copies of received tensors count too: a placement over a cap with them is dropped.
        placer_static_usage(&p, cand_dev, usage, stamp);
        int over = over_cap_device(&a, usage);
        if (over >= 0) {
            if (!have_err)
                dg_status_setf(st, DG_RESOURCE_EXHAUSTED,
                               "automatic placement: %s's placement puts %lld bytes on %s (with the copies of "
                               "tensors it receives), over its cap of %lld",
                               dg_auto_placer_name((dg_auto_placer)k), (long long)usage[over], devices[over],
                               (long long)opts.memory_caps[over]);
            have_err = true;
            continue;
        }
        double t = placer_simulate(&p, cand_dev, &sim);
        if (verbose)
            fprintf(stderr,
                    "automatic placement: candidate %s%s%s (%d parts, balance %.2f): predicted step %.3f ms (%.3f s)\n",
                    dg_auto_placer_name((dg_auto_placer)k), cands[c].paired ? ", gradients beside their ops" : "",
                    cands[c].parts == -1 ? ", chain in topological order" : cands[c].parts == -2 ? ", chain in build order" : "",
                    cands[c].parts > 0 ? cands[c].parts : 0, cands[c].ub, t * 1e3, base_now_s() - tc);
        if (t < 0) {
            dg_status_set(st, DG_RESOURCE_EXHAUSTED, "automatic placement: out of memory simulating");
            goto out;
        }
        if (report && (report->candidate_step_s[k] == 0 || t < report->candidate_step_s[k])) report->candidate_step_s[k] = t;
        if (t < best_step) {
            best_step = t;
            best_kind = (dg_auto_placer)k;
            memcpy(best_dev, cand_dev, (size_t)n_step * sizeof *best_dev);
        }
    }
    if (!isfinite(best_step)) {
        if (dg_status_ok(st))
            dg_status_set(st, DG_INVALID_ARGUMENT, "automatic placement: no candidate has a finite predicted step "
                                                   "(check the cost model's figures)");
        goto out;
    }
    dg_status_reset(st);
    if (report) report->critical_path_s = critical_path(&p);
    // Start again from the best: its groups, its devices' bytes.
    placer_reset(&a);
    for (int v = 0; v < n_step; v++) {
        int g = spg.group_of[v];
        if (a.gdev[g] < 0) placer_put(&a, g, best_dev[v]);
    }
    placer_static_usage(&p, a.dev, a.used, stamp);
    placer_simulate(&p, a.dev, &sim);
    int moves = 0;
    if (opts.placer == DG_AUTO_PLACER_AUTO && opts.time_budget_s >= 0) {
        // By graph size: the whole placement takes 40 us a node (0.8 s to 8 s), the refinement
        // at least 0.2 s of it.
        double now = base_now_s(), budget = opts.time_budget_s;
        if (budget == 0) budget = fmax(0.2, target_s - (now - t0));
        double step = best_step;
        // Whole clusters first (up to three quarters of the budget), then single groups.
        if (n_devices >= 2 && paired.pg) {
            int k = 2 * n_devices < 64 ? 2 * n_devices : 64;   // two parts a device
            double s0 = step;
            int cm = placer_cluster_refine(&a, &paired, k, &sim, &step, now + budget * 0.75, opts.seed);
            if (verbose)
                fprintf(stderr,
                        "automatic placement: %d moves of up to %d clusters: %.3f ms to %.3f ms in %.3f s (after %.3f s, "
                        "budget %.3f s)\n",
                        cm, k, s0 * 1e3, step * 1e3, base_now_s() - now, now - t0, budget);
            moves += cm;
        }
        moves += refine(&a, &sim, &step, now + budget, opts.seed);
        best_step = step;
    }
    if (verbose) {
        double tot = 0;
        for (int v = 0; v < n_step; v++) tot += p.cost[(size_t)v * p.n_types + p.dev_type[0]];
        fprintf(stderr, "automatic placement: work %.3f ms, step %.3f ms, busy", tot * 1e3, best_step * 1e3);
        for (int d = 0; d < n_devices; d++) fprintf(stderr, " %.2f", sim.busy[d] * 1e3);
        fprintf(stderr, "\n");
    }
    if (verbose && verbose_env[0] == '2')
        for (int v = 0; v < n_step; v++)
            if (p.persist[v] > 0)
                fprintf(stderr, "automatic placement: variable %s (%lld bytes) on device %d\n", p.nodes[v]->name,
                        (long long)p.persist[v], a.dev[v]);
    if (!place_rest(&sn, nodes, n_nodes, &pg, a.gdev, &a, st)) goto out;
    // The report before the devices: a failure leaves the nodes as they were.
    if (report) {
        report->chosen = opts.placer == DG_AUTO_PLACER_AUTO && moves > 0 ? DG_AUTO_PLACER_AUTO : best_kind;
        report->predicted_step_s = best_step;
        report->n_moves = moves;
        report->n_simulations = sim.runs;
        report->simulated_ops_per_s = sim.run_s > 0 ? (double)sim.ops_run / sim.run_s : 0;
        if (!fill_estimate(&p, a.dev, &sim, &report->estimate, st)) goto out;
    }
    for (int i = 0; i < n_nodes; i++) {
        const char *d = devices[sn.dev_all[i]];
        if (!nodes[i]->assigned_device || strcmp(nodes[i]->assigned_device, d) != 0)
            graph_set_assigned_device(nodes[i], d);
    }
    if (report) report->seconds = base_now_s() - t0;
    ok = true;
out:
    placer_state_clear(&a);
    placer_state_clear(&paired);
    placer_groups_clear(&paired_pg);
    free(best_dev);
    free(cand_dev);
    free(usage);
    free(stamp);
    step_nodes_clear(&sn);
    placer_sim_clear(&sim);
    placer_problem_clear(&p);
    placer_groups_clear(&pg);
    dg_cost_model_free(&own);
    return ok;
}

bool dg_auto_place(dg_graph *g, const char *const *devices, int n_devices, const dg_auto_place_options *opts,
                   dg_auto_place_report *report, dg_status *st) {
    dg_status_reset(st);
    if (!g) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "automatic placement: no graph");
        return false;
    }
    int n = dg_graph_num_nodes(g);
    dg_node **nodes = malloc(((size_t)n + 1) * sizeof *nodes);
    if (!nodes) return base_oom(st, "automatic placement", (size_t)n * sizeof *nodes);
    for (int i = 0; i < n; i++) nodes[i] = dg_graph_node(g, i);
    bool ok = dg_auto_place_nodes(nodes, n, devices, n_devices, opts, report, st);
    free(nodes);
    return ok;
}
