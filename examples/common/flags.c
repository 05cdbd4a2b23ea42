#include "flags.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <distgraph/distgraph.h>

// The program's name for messages: the last part of argv[0].
static const char *prog_name(const char *argv0) {
    const char *slash = argv0 ? strrchr(argv0, '/') : NULL;
    return slash ? slash + 1 : argv0 ? argv0 : "program";
}

// --help: on stdout, every flag with its default (the value it holds before parsing, unless
// its help text already says it), then the exit statuses shared by the examples.
static void print_usage(FILE *f, const char *usage, const flag_def *defs, int n) {
    fprintf(f, "%s\nflags:\n", usage);
    for (int i = 0; i < n; i++) {
        const flag_def *d = &defs[i];
        char def[96] = "";
        if (!strstr(d->help, "default")) {
            switch (d->kind) {
            case FLAG_INT: snprintf(def, sizeof def, " (default %lld)", (long long)*(int64_t *)d->target); break;
            case FLAG_DOUBLE: snprintf(def, sizeof def, " (default %g)", *(double *)d->target); break;
            case FLAG_STRING:
                if (**(const char **)d->target) snprintf(def, sizeof def, " (default \"%.60s\")", *(const char **)d->target);
                break;
            case FLAG_BOOL: snprintf(def, sizeof def, " (default %s)", *(bool *)d->target ? "true" : "false"); break;
            }
        }
        fprintf(f, "  --%-22s %s%s\n", d->name, d->help, def);
    }
    fprintf(f, "  --%-22s %s\n  --%-22s %s\n", "help", "this text", "version", "the distgraph version");
    fprintf(f, "\nExit status: 0 on success, 1 when the run fails (the message says why), 2 for bad flags or\n"
               "input (a flag, a cluster, a task that does not exist).\n");
}

bool flags_parse(int argc, char **argv, const flag_def *defs, int n_defs, const char *usage, bool *help) {
    *help = false;
    const char *prog = prog_name(argc > 0 ? argv[0] : NULL);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            print_usage(stdout, usage, defs, n_defs);
            *help = true;
            return true;
        }
        if (strcmp(a, "--version") == 0) {
            printf("%s (distgraph) %s\n", prog, dg_version());
            *help = true;
            return true;
        }
        if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "%s: unexpected argument \"%s\" (flags are --name=value or --name value; see --help)\n",
                    prog, a);
            return false;
        }
        a += 2;
        const char *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const flag_def *d = NULL;
        for (int k = 0; k < n_defs; k++)
            if (strlen(defs[k].name) == len && strncmp(defs[k].name, a, len) == 0) d = &defs[k];
        if (!d) {
            fprintf(stderr, "%s: unknown flag --%.*s (see --help)\n", prog, (int)len, a);
            return false;
        }
        const char *val = eq ? eq + 1 : NULL;
        if (!val && d->kind != FLAG_BOOL) {
            if (i + 1 >= argc) {
                fprintf(stderr, "%s: flag --%s needs a value\n", prog, d->name);
                return false;
            }
            val = argv[++i];
        }
        char *end = NULL;
        errno = 0;
        switch (d->kind) {
        case FLAG_INT: {
            long long v = strtoll(val, &end, 10);
            if (!*val || *end || errno) {
                fprintf(stderr, "%s: flag --%s: \"%s\" is not an integer\n", prog, d->name, val);
                return false;
            }
            *(int64_t *)d->target = v;
            break;
        }
        case FLAG_DOUBLE: {
            double v = strtod(val, &end);
            if (!*val || *end || errno) {
                fprintf(stderr, "%s: flag --%s: \"%s\" is not a number\n", prog, d->name, val);
                return false;
            }
            *(double *)d->target = v;
            break;
        }
        case FLAG_STRING: *(const char **)d->target = val; break;
        case FLAG_BOOL:
            if (!val || strcmp(val, "true") == 0 || strcmp(val, "1") == 0) *(bool *)d->target = true;
            else if (strcmp(val, "false") == 0 || strcmp(val, "0") == 0) *(bool *)d->target = false;
            else {
                fprintf(stderr, "%s: flag --%s: \"%s\" is not true or false\n", prog, d->name, val);
                return false;
            }
            break;
        }
    }
    return true;
}
