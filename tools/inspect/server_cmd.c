/* dg-inspect server: a running task's counters (registered partitions, remote sessions,
 * running steps, transport limits hit), asked over the wire with dg_server_query_stats. */
#include "inspect.h"

int inspect_cmd_server(const inspect_options *o) {
    dg_status *st = dg_status_new();
    dg_server_stats s;
    int rc = 1;
    if (!dg_server_query_stats(o->file, NULL, NULL, 5000, &s, st)) {
        inspect_die_status("asking the server", st);
    } else {
        const struct { const char *name; int64_t v; } f[] = {
            {"registered_graphs", s.registered_graphs}, {"master_sessions", s.master_sessions},
            {"running_steps", s.running_steps}, {"graphs_orphaned", s.graphs_orphaned},
            {"values_expired", s.values_expired}, {"abort_marks", s.abort_marks}, {"connections", s.connections},
            {"max_connections", s.max_connections}, {"connections_closed", s.connections_closed},
            {"accept_failures", s.accept_failures}, {"inflight_bytes", s.inflight_bytes},
            {"transfers_refused", s.transfers_refused}, {"transfers_expired", s.transfers_expired},
            {"transfers_abandoned", s.transfers_abandoned}, {"replies_dropped", s.replies_dropped},
            {"requests_refused", s.requests_refused},
            {"bad_messages", s.bad_messages}, {"shm_frames_sent", s.shm_frames_sent},
            {"shm_frames_received", s.shm_frames_received},
        };
        size_t n = sizeof f / sizeof f[0];
        if (o->json) printf("{\"target\": \"%s\"", o->file);
        for (size_t i = 0; i < n; i++)
            printf(o->json ? ", \"%s\": %lld" : "%s %lld\n", f[i].name, (long long)f[i].v);
        if (o->json) printf("}\n");
        rc = 0;
    }
    dg_status_free(&st);
    return rc;
}
