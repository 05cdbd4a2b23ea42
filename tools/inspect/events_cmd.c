/* dg-inspect events: every event of a TensorBoard event file, one a line (or a JSON object a
 * line), read with dg_event_file_read, which checks both checksums of every record. */
#include "inspect.h"

static bool print_event(void *ctx, const dg_event *e) {
    const inspect_options *o = ctx;
    if (o->json)
        printf("{\"wall_time\": %.6f, \"step\": %lld, \"kind\": \"%s\", \"tag\": \"%s\", \"value\": %.9g}\n",
               e->wall_time, (long long)e->step, e->kind, e->tag, e->value);
    else
        printf("%.6f %8lld %-12s %-32s %.9g\n", e->wall_time, (long long)e->step, e->kind, e->tag, e->value);
    return true;
}

int inspect_cmd_events(const inspect_options *o) {
    dg_status *st = dg_status_new();
    int64_t n = 0;
    if (!o->json) printf("%-17s %8s %-12s %-32s %s\n", "wall time", "step", "kind", "tag", "value");
    bool ok = dg_event_file_read(o->file, print_event, (void *)o, &n, st);
    if (!ok) fprintf(stderr, "dg-inspect: %s: %s (after %lld good events)\n", dg_code_name(dg_status_code(st)),
                     dg_status_message(st), (long long)n);
    dg_status_free(&st);
    return ok ? 0 : 1;
}
