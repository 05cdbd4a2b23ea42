/* dg-inspect server: a running task's counters (registered partitions, remote sessions,
 * running steps, transport limits hit, local channels), asked over the wire with
 * dg_server_query_counters: every counter the server reports, in its order. */
#include "inspect.h"

int inspect_cmd_server(const inspect_options *o) {
    dg_status *st = dg_status_new();
    char **names = NULL;
    int64_t *values = NULL;
    int n = 0, rc = 1;
    if (!dg_server_query_counters(o->file, NULL, NULL, 5000, &names, &values, &n, st)) {
        inspect_die_status("asking the server", st);
    } else {
        if (o->json) printf("{\"target\": \"%s\"", o->file);
        for (int i = 0; i < n; i++)
            printf(o->json ? ", \"%s\": %lld" : "%s %lld\n", names[i], (long long)values[i]);
        if (o->json) printf("}\n");
        dg_server_counters_free(names, values, n);
        rc = 0;
    }
    dg_status_free(&st);
    return rc;
}
