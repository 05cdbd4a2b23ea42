/* A placer over METIS (Debian's libmetis, Karypis and Kumar's multilevel k-way partitioner):
 * colocation groups as vertices weighted by their compute time and their bytes, tensors between
 * groups as edges weighted by their bytes; METIS cuts the fewest bytes it can while keeping both
 * weights balanced. Parts become devices (those that suit the most pinned groups), then groups a
 * device may not take, or over its cap, move to a device that may. Used as a baseline and as a
 * start for the automatic placer's refinement. METIS is written again nowhere here: partitioning
 * well is its whole craft. */
#include <metis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base_impl.h"
#include "graph_impl.h"
#include "placer_impl.h"

typedef struct gedge {
    int a, b;
    int64_t w;
} gedge;

static int gedge_cmp(const void *x, const void *y) {
    const gedge *p = x, *q = y;
    if (p->a != q->a) return p->a < q->a ? -1 : 1;
    return p->b < q->b ? -1 : p->b > q->b;
}

// The groups as METIS's graph, built once per state (placer_state.metis) and kept for every
// later cut of the same groups.
static placer_metis_graph *metis_graph(placer_state *a, dg_status *st) {
    if (a->metis) return a->metis;
    const placer_problem *p = a->p;
    const placer_groups *pg = a->pg;
    int ng = pg->n_groups;
    placer_metis_graph *mg = calloc(1, sizeof *mg);
    // Group edges: each tensor once per reading group, both directions, merged.
    size_t cap_e = 2 * (size_t)p->succ_start[p->out_start[p->n]] + 1;
    gedge *ge = malloc(cap_e * sizeof *ge);
    double *gtime = calloc((size_t)ng + 1, sizeof *gtime);
    int *last_gid = malloc(((size_t)ng + 1) * sizeof *last_gid);
    idx_t *xadj = calloc((size_t)ng + 1, sizeof *xadj), *vw = malloc(2 * ((size_t)ng + 1) * sizeof *vw);
    idx_t *adj = NULL, *adjw = NULL;
    if (!mg || !ge || !xadj || !vw || !gtime || !last_gid) {
        base_oom(st, "METIS placement", cap_e * sizeof *ge);
        goto fail;
    }
    size_t ne = 0;
    for (int g = 0; g < ng; g++) last_gid[g] = -1;
    for (int u = 0; u < p->n; u++) {
        int gu = pg->group_of[u];
        for (int gid = p->out_start[u]; gid < p->out_start[u + 1]; gid++)
            for (int e = p->succ_start[gid]; e < p->succ_start[gid + 1]; e++) {
                int gv = pg->group_of[p->succ[e]];
                if (gv == gu || last_gid[gv] == gid) continue;
                last_gid[gv] = gid;
                int64_t w = p->gid_bytes[gid] / 1024 + 1;
                ge[ne++] = (gedge){gu, gv, w};
                ge[ne++] = (gedge){gv, gu, w};
            }
    }
    qsort(ge, ne, sizeof *ge, gedge_cmp);
    size_t m = 0;
    for (size_t i = 0; i < ne; i++) {
        if (m > 0 && ge[m - 1].a == ge[i].a && ge[m - 1].b == ge[i].b) ge[m - 1].w += ge[i].w;
        else ge[m++] = ge[i];
    }
    adj = malloc((m + 1) * sizeof *adj);
    adjw = malloc((m + 1) * sizeof *adjw);
    if (!adj || !adjw) {
        base_oom(st, "METIS placement", m * sizeof *adj);
        goto fail;
    }
    // Weights fit METIS's 32-bit integers: edges scaled so their sum stays under 2^30.
    double escale = 1;
    {
        double sum = 0;
        for (size_t i = 0; i < m; i++) sum += (double)ge[i].w;
        if (sum > 1e9) escale = 1e9 / sum;
    }
    for (size_t i = 0; i < m; i++) {
        xadj[ge[i].a + 1]++;
        adj[i] = ge[i].b;
        int64_t w = (int64_t)((double)ge[i].w * escale);
        adjw[i] = (idx_t)(w > 0 ? w : 1);
    }
    for (int g = 0; g < ng; g++) xadj[g + 1] += xadj[g];
    // Vertex weights: compute (on the first device's type) and bytes, each scaled to 10^7 in all.
    double ttot = 0, btot = 0;
    for (int v = 0; v < p->n; v++) {
        double t = p->cost[(size_t)v * p->n_types + p->dev_type[0]];
        gtime[pg->group_of[v]] += t;
        ttot += t;
    }
    for (int g = 0; g < ng; g++) btot += (double)a->group_bytes[g];
    for (int g = 0; g < ng; g++) {
        vw[2 * g] = (idx_t)(1 + (ttot > 0 ? gtime[g] / ttot * 1e7 : 0));
        vw[2 * g + 1] = (idx_t)(1 + (btot > 0 ? (double)a->group_bytes[g] / btot * 1e7 : 0));
    }
    *mg = (placer_metis_graph){xadj, adj, adjw, vw, btot};
    free(ge);
    free(gtime);
    free(last_gid);
    a->metis = mg;
    return mg;
fail:
    free(ge);
    free(gtime);
    free(last_gid);
    free(xadj);
    free(vw);
    free(adj);
    free(adjw);
    free(mg);
    return NULL;
}

bool placer_metis_parts(placer_state *a, int k, double ub_compute, uint64_t seed, int *part, dg_status *st) {
    int ng = a->pg->n_groups, nd = a->p->n_dev;
    if (k < 2 || k > 64 || k > ng) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "METIS placement: %d parts of %d groups (2 to 64, at most the groups)",
                       k, ng);
        return false;
    }
    placer_metis_graph *mg = metis_graph(a, st);
    if (!mg) return false;
    idx_t *ipart = malloc(((size_t)ng + 1) * sizeof *ipart);
    if (!ipart) return base_oom(st, "METIS placement", (size_t)ng * sizeof *ipart);
    bool ok = false;
    double btot = mg->btot;
    // Bytes may go up to the smallest cap: that is METIS's imbalance for them.
    real_t ub[2];
    ub[0] = (real_t)ub_compute;
    double mem_ub = 1.5;
    if (a->caps) {
        int64_t min_cap = 0;
        for (int d = 0; d < nd; d++)
            if (a->caps[d] > 0 && (min_cap == 0 || a->caps[d] < min_cap)) min_cap = a->caps[d];
        if (min_cap > 0) mem_ub = (double)min_cap / (btot / k);
    }
    if (btot <= 0) mem_ub = 1.5;
    if (mem_ub < 1.001) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "METIS placement: %d parts of %.0f bytes each exceed the caps", k,
                       btot / k);
        goto out;
    }
    ub[1] = (real_t)(mem_ub * 0.98);
    idx_t nv = ng, ncon = 2, nparts = k, objval = 0;
    idx_t opts[METIS_NOPTIONS];
    METIS_SetDefaultOptions(opts);
    opts[METIS_OPTION_SEED] = (idx_t)(seed & 0x7fffffff);
    opts[METIS_OPTION_NUMBERING] = 0;
    int rc = METIS_PartGraphKway(&nv, &ncon, (idx_t *)mg->xadj, (idx_t *)mg->adj, (idx_t *)mg->vw, NULL,
                                 (idx_t *)mg->adjw, &nparts, NULL, ub, opts, &objval, ipart);
    if (rc != METIS_OK) {
        dg_status_setf(st, DG_INTERNAL, "METIS placement: METIS_PartGraphKway returned %d", rc);
        goto out;
    }
    for (int g = 0; g < ng; g++) part[g] = (int)ipart[g];
    ok = true;
out:
    free(ipart);
    return ok;
}

bool placer_metis(placer_state *a, int k, double ub_compute, uint64_t seed, dg_status *st) {
    const placer_problem *p = a->p;
    const placer_groups *pg = a->pg;
    int ng = pg->n_groups, nd = p->n_dev;
    bool ok = false;
    if (k < 2 || k > nd || k > 64) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "METIS placement: %d parts for %d devices (2 to 64)", k, nd);
        return false;
    }
    int *part = malloc(((size_t)ng + 1) * sizeof *part);
    if (!part) return base_oom(st, "METIS placement", (size_t)ng * sizeof *part);
    if (!placer_metis_parts(a, k, ub_compute, seed, part, st)) goto out;
    // Parts to devices: the largest part first, each to the free device the fewest of its
    // groups are barred from.
    {
        int map[64];
        double psize[64] = {0};
        bool *taken = calloc((size_t)nd + 1, sizeof *taken);
        int64_t *bad = calloc((size_t)k * (size_t)nd, sizeof *bad);
        if (!bad || !taken) {
            free(bad);
            free(taken);
            base_oom(st, "METIS placement", (size_t)k * (size_t)nd * sizeof *bad);
            goto out;
        }
        const idx_t *vw = a->metis->vw;   // each group's compute weight as METIS saw it
        for (int g = 0; g < ng; g++) {
            psize[part[g]] += (double)vw[2 * g];
            for (int d = 0; d < nd; d++) bad[(size_t)part[g] * nd + d] += !placer_allowed(a, g, d);
        }
        for (int i = 0; i < k; i++) map[i] = -1;
        for (int round = 0; round < k; round++) {
            int bp = -1;
            for (int q = 0; q < k; q++)
                if (map[q] < 0 && (bp < 0 || psize[q] > psize[bp])) bp = q;
            int bd = -1;
            for (int d = 0; d < nd; d++)
                if (!taken[d] && (bd < 0 || bad[(size_t)bp * nd + d] < bad[(size_t)bp * nd + bd])) bd = d;
            map[bp] = bd;
            taken[bd] = true;
        }
        free(bad);
        free(taken);
        placer_reset(a);
        // Groups where their part's device may take them; the rest after.
        for (int g = 0; g < ng; g++) {
            int d = map[part[g]];
            if (placer_allowed(a, g, d) && placer_fits(a, g, d)) placer_put(a, g, d);
        }
    }
    ok = placer_place_leftovers(a, st);
out:
    free(part);
    return ok;
}
