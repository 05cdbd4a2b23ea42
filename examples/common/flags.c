#include "flags.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_usage(const char *usage, const flag_def *defs, int n) {
    fprintf(stderr, "%s\nflags:\n", usage);
    for (int i = 0; i < n; i++) fprintf(stderr, "  --%-22s %s\n", defs[i].name, defs[i].help);
}

bool flags_parse(int argc, char **argv, const flag_def *defs, int n_defs, const char *usage, bool *help) {
    *help = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            print_usage(usage, defs, n_defs);
            *help = true;
            return true;
        }
        if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "unexpected argument \"%s\"\n", a);
            print_usage(usage, defs, n_defs);
            return false;
        }
        a += 2;
        const char *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const flag_def *d = NULL;
        for (int k = 0; k < n_defs; k++)
            if (strlen(defs[k].name) == len && strncmp(defs[k].name, a, len) == 0) d = &defs[k];
        if (!d) {
            fprintf(stderr, "unknown flag \"--%.*s\"\n", (int)len, a);
            print_usage(usage, defs, n_defs);
            return false;
        }
        const char *val = eq ? eq + 1 : NULL;
        if (!val && d->kind != FLAG_BOOL) {
            if (i + 1 >= argc) {
                fprintf(stderr, "flag --%s needs a value\n", d->name);
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
                fprintf(stderr, "flag --%s: \"%s\" is not an integer\n", d->name, val);
                return false;
            }
            *(int64_t *)d->target = v;
            break;
        }
        case FLAG_DOUBLE: {
            double v = strtod(val, &end);
            if (!*val || *end || errno) {
                fprintf(stderr, "flag --%s: \"%s\" is not a number\n", d->name, val);
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
                fprintf(stderr, "flag --%s: \"%s\" is not true or false\n", d->name, val);
                return false;
            }
            break;
        }
    }
    return true;
}
