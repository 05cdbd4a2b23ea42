/* Line charts of value against step (dg-inspect plot): an 800x480 chart with axes at "nice"
 * ticks, one line per series in the tab10 palette, a legend when there are several, and a
 * note line. Written as SVG by hand (text stays text, each line a <polyline> carrying its
 * tag) or as PNG through cairo. */
#ifndef DG_INSPECT_CHART_H
#define DG_INSPECT_CHART_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#define CHART_W 800
#define CHART_H 480
#define CHART_MAX_TICKS 32

typedef struct chart_series {
    const char *tag;   // borrowed
    int n;             // finite points, by increasing step
    double *x, *y;     // n each: step and value; owned by whoever filled them
    int n_nonfinite;   // points left out
} chart_series;

typedef struct chart_axis {
    double lo, hi;     // data values at the plot area's edges
    double tick[CHART_MAX_TICKS];
    int n_ticks;
    double tick_step;
} chart_axis;

typedef struct chart {
    double left, top, right, bottom;   // the plot area, in pixels
    chart_axis x, y;                   // x: steps (whole-number ticks), y: values
    char title[512], y_label[256], note[512];   // note: "" for none
    const chart_series *series;        // borrowed
    int n_series;
} chart;

// Sets up c to draw the n_series series (at least one finite point among them): the plot
// area, and axes that cover every point with room around them. Borrows series, title, y_label
// and note (copied, cut to fit) until c is no longer used.
void chart_init(chart *c, const chart_series *series, int n_series, const char *title, const char *y_label,
                const char *note);
// Writes c as an SVG document; false when writing failed.
bool chart_write_svg(FILE *f, const chart *c);
// Writes c as an 8-bit RGB PNG; false when drawing or writing failed, with cairo's reason in
// err (cap bytes).
bool chart_write_png(FILE *f, const chart *c, char *err, size_t cap);

#endif
