/* Charts of value against step (chart.h). The axes (ticks at 1, 2 or 5 times a power of
 * ten) are computed once and drawn twice: as SVG written by hand, and as PNG drawn with cairo
 * (libcairo2), which replaced a rasteriser of our own (lines after Wu, a 5x7 bitmap font of
 * ASCII only, an unfiltered PNG encoder over zlib). Cairo is Debian's standard 2D library: it
 * anti-aliases lines and markers exactly, draws text in a real font found by fontconfig
 * (UTF-8 tags in the scripts the font covers) and measures it, and writes PNG through libpng;
 * each of those was code we had to keep correct. */
#include "chart.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cairo.h>

#include "inspect.h"

#define MARKER_MAX_POINTS 60   // series with at most this many points get a marker per point

static const uint32_t palette[] = {0x1f77b4, 0xff7f0e, 0x2ca02c, 0xd62728, 0x9467bd,
                                   0x8c564b, 0xe377c2, 0x7f7f7f, 0xbcbd22, 0x17becf};
#define N_COLORS ((int)(sizeof palette / sizeof palette[0]))

// 1, 2 or 5 times a power of ten, near range / target.
static double nice_step(double range, int target) {
    double raw = range / target, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
}

// Extends [lo, hi] to whole ticks. A single value gets room around it; steps (integral) get
// ticks at whole numbers only.
static void axis_make(chart_axis *a, double lo, double hi, bool integral) {
    if (!(hi > lo)) {
        double d = integral || lo == 0 ? 1 : fabs(lo) * 0.1;
        lo -= d;
        hi += d;
    } else if (!integral) {
        double pad = (hi - lo) * 0.05;
        lo -= pad;
        hi += pad;
    }
    double step = nice_step(hi - lo, 6);
    if (integral && step < 1) step = 1;
    if (isfinite(step) && step > 0 && isfinite(lo / step) && isfinite(hi / step) &&
        (hi - lo) / step < CHART_MAX_TICKS - 1) {
        a->lo = floor(lo / step) * step;
        a->hi = ceil(hi / step) * step;
    } else {   // ranges near the largest doubles: just the ends
        a->lo = lo;
        a->hi = hi;
        step = hi - lo;
    }
    a->tick_step = step;
    a->n_ticks = 0;
    for (int k = 0; k < CHART_MAX_TICKS; k++) {
        double v = a->lo + k * step;
        if (v > a->hi + step * 1e-6 || !isfinite(v)) break;
        a->tick[a->n_ticks++] = fabs(v) < step * 1e-9 ? 0 : v;
    }
}

static void tick_label(const chart_axis *a, double v, char *buf, size_t cap) {
    double big = fmax(fabs(a->lo), fabs(a->hi));
    if (big >= 1e6 || a->tick_step < 1e-4 || !isfinite(a->tick_step)) {
        snprintf(buf, cap, "%.4g", v);
    } else {
        int dec = a->tick_step >= 1 ? 0 : (int)ceil(-log10(a->tick_step) - 1e-9);
        snprintf(buf, cap, "%.*f", dec, v);
    }
}

static double chart_px(const chart *c, double x) {
    return c->left + (x - c->x.lo) / (c->x.hi - c->x.lo) * (c->right - c->left);
}

static double chart_py(const chart *c, double y) {
    return c->bottom - (y - c->y.lo) / (c->y.hi - c->y.lo) * (c->bottom - c->top);
}

// ---- SVG, written by hand ----
// Text stays text and every line is a <polyline class="series" data-tag="TAG">, so the file
// can be searched, styled and checked; cairo's SVG surface would write glyph outlines.

bool chart_write_svg(FILE *f, const chart *c) {
    const chart_series *sr = c->series;
    int n_series = c->n_series;
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n<title>", CHART_W, CHART_H, CHART_W,
            CHART_H);
    inspect_xml_str(f, c->title);
    fprintf(f, "</title>\n<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n", CHART_W, CHART_H);
    fprintf(f, "<g stroke=\"#e6e6e6\" stroke-width=\"1\">\n");
    for (int i = 0; i < c->x.n_ticks; i++) {
        double x = chart_px(c, c->x.tick[i]);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", x, c->top, x, c->bottom);
    }
    for (int i = 0; i < c->y.n_ticks; i++) {
        double y = chart_py(c, c->y.tick[i]);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", c->left, y, c->right, y);
    }
    fprintf(f, "</g>\n<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333\"/>\n",
            c->left, c->top, c->right - c->left, c->bottom - c->top);
    fprintf(f, "<g font-size=\"12\" fill=\"#333\">\n");
    for (int i = 0; i < c->x.n_ticks; i++) {
        char lab[64];
        double x = chart_px(c, c->x.tick[i]);
        tick_label(&c->x, c->x.tick[i], lab, sizeof lab);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>"
                   "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                x, c->bottom, x, c->bottom + 5, x, c->bottom + 19, lab);
    }
    for (int i = 0; i < c->y.n_ticks; i++) {
        char lab[64];
        double y = chart_py(c, c->y.tick[i]);
        tick_label(&c->y, c->y.tick[i], lab, sizeof lab);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>"
                   "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                c->left - 5, y, c->left, y, c->left - 8, y + 4, lab);
    }
    fprintf(f, "</g>\n<text x=\"%.1f\" y=\"%d\" font-size=\"13\" text-anchor=\"middle\" fill=\"#222\">step</text>\n",
            (c->left + c->right) / 2, CHART_H - 26);
    fprintf(f, "<text x=\"18\" y=\"%.1f\" font-size=\"13\" text-anchor=\"middle\" fill=\"#222\" "
               "transform=\"rotate(-90 18 %.1f)\">", (c->top + c->bottom) / 2, (c->top + c->bottom) / 2);
    inspect_xml_str(f, c->y_label);
    fprintf(f, "</text>\n<text x=\"%d\" y=\"28\" font-size=\"16\" font-weight=\"bold\" text-anchor=\"middle\" "
               "fill=\"#111\">", CHART_W / 2);
    inspect_xml_str(f, c->title);
    fprintf(f, "</text>\n");
    for (int k = 0; k < n_series; k++) {
        const chart_series *s = &sr[k];
        unsigned col = palette[k % N_COLORS];
        fprintf(f, "<g><title>");
        inspect_xml_str(f, s->tag);
        fprintf(f, "</title>\n<polyline class=\"series\" data-tag=\"");
        inspect_xml_str(f, s->tag);
        fprintf(f, "\" fill=\"none\" stroke=\"#%06x\" stroke-width=\"1.8\" stroke-linejoin=\"round\" points=\"", col);
        for (int i = 0; i < s->n; i++)
            fprintf(f, "%s%.2f,%.2f", i ? " " : "", chart_px(c, s->x[i]), chart_py(c, s->y[i]));
        fprintf(f, "\"/>\n");
        if (s->n <= MARKER_MAX_POINTS)
            for (int i = 0; i < s->n; i++)
                fprintf(f, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"%s\" fill=\"#%06x\"/>\n", chart_px(c, s->x[i]),
                        chart_py(c, s->y[i]), s->n == 1 ? "4" : "2.5", col);
        fprintf(f, "</g>\n");
    }
    if (n_series > 1) {
        size_t w_max = 0;
        for (int k = 0; k < n_series; k++) w_max = strlen(sr[k].tag) > w_max ? strlen(sr[k].tag) : w_max;
        double w = 40 + 7.0 * (double)w_max, x = c->right - 10 - w, y = c->top + 10;
        fprintf(f, "<g class=\"legend\" font-size=\"12\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%d\" "
                   "fill=\"#ffffff\" fill-opacity=\"0.85\" stroke=\"#999\"/>\n", x, y, w, 8 + 18 * n_series);
        for (int k = 0; k < n_series; k++) {
            double ly = y + 13 + 18 * k;
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#%06x\" stroke-width=\"2.5\"/>"
                       "<text x=\"%.1f\" y=\"%.1f\" fill=\"#222\">", x + 8, ly, x + 28, ly, palette[k % N_COLORS],
                    x + 34, ly + 4);
            inspect_xml_str(f, sr[k].tag);
            fprintf(f, "</text>\n");
        }
        fprintf(f, "</g>\n");
    }
    if (c->note[0]) {
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" fill=\"#a00\">", c->left, CHART_H - 8);
        inspect_xml_str(f, c->note);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "</svg>\n");
    return !ferror(f);
}

void chart_init(chart *c, const chart_series *series, int n_series, const char *title, const char *y_label,
                const char *note) {
    memset(c, 0, sizeof *c);
    c->series = series;
    c->n_series = n_series;
    snprintf(c->title, sizeof c->title, "%s", title);
    snprintf(c->y_label, sizeof c->y_label, "%s", y_label);
    snprintf(c->note, sizeof c->note, "%s", note ? note : "");
    double x_lo = INFINITY, x_hi = -INFINITY, y_lo = INFINITY, y_hi = -INFINITY;
    for (int k = 0; k < n_series; k++)
        for (int i = 0; i < series[k].n; i++) {
            x_lo = fmin(x_lo, series[k].x[i]);
            x_hi = fmax(x_hi, series[k].x[i]);
            y_lo = fmin(y_lo, series[k].y[i]);
            y_hi = fmax(y_hi, series[k].y[i]);
        }
    c->left = 84;
    c->right = CHART_W - 24;
    c->top = 44;
    c->bottom = CHART_H - 66;
    axis_make(&c->x, x_lo, x_hi, true);
    axis_make(&c->y, y_lo, y_hi, false);
}

// ---- PNG, drawn with cairo ----
// The same geometry as the SVG: coordinates, sizes and colours match it, so both formats show
// the same chart. Text is set in "DejaVu Sans" (Debian's default fonts), else whatever sans
// face fontconfig offers. Cairo's simple text API is enough for one-line labels; it does no
// font fallback, so characters the face lacks (CJK in DejaVu) draw as boxes. Pango would fall
// back, at the price of another library (the SVG writes bytes beyond ASCII as '?').

static void set_rgb(cairo_t *cr, uint32_t rgb) {
    cairo_set_source_rgb(cr, ((rgb >> 16) & 0xff) / 255.0, ((rgb >> 8) & 0xff) / 255.0, (rgb & 0xff) / 255.0);
}

// Copies s into buf (cap bytes) with every byte that does not start a valid UTF-8 sequence
// replaced by '?': cairo refuses invalid UTF-8 by putting the whole drawing in an error state.
static const char *valid_utf8(const char *s, char *buf, size_t cap) {
    size_t k = 0;
    const unsigned char *p = (const unsigned char *)s;
    while (*p && k + 5 < cap) {
        int len = *p < 0x80 ? 1 : (*p & 0xe0) == 0xc0 ? 2 : (*p & 0xf0) == 0xe0 ? 3 : (*p & 0xf8) == 0xf0 ? 4 : 0;
        uint32_t cp = len == 1 ? *p : len == 2 ? *p & 0x1fu : len == 3 ? *p & 0x0fu : *p & 0x07u;
        for (int i = 1; i < len; i++) {
            if ((p[i] & 0xc0) != 0x80) {
                len = 0;
                break;
            }
            cp = cp << 6 | (p[i] & 0x3fu);
        }
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};   // shorter forms are overlong
        if (len == 0 || cp < min_cp[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
            buf[k++] = '?';
            p++;
            continue;
        }
        memcpy(buf + k, p, (size_t)len);
        k += (size_t)len;
        p += len;
    }
    buf[k] = '\0';
    return buf;
}

// Draws s at size px with its baseline at y; align 0: starting at x, 1: centred on x, 2:
// ending at x. Returns the text's width.
static double text_at(cairo_t *cr, double x, double y, const char *s, double px, bool bold, int align) {
    char buf[1024];
    valid_utf8(s, buf, sizeof buf);
    cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL,
                           bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, px);
    cairo_text_extents_t e;
    cairo_text_extents(cr, buf, &e);
    cairo_move_to(cr, x - (align == 1 ? e.x_advance / 2 : align == 2 ? e.x_advance : 0), y);
    cairo_show_text(cr, buf);
    return e.x_advance;
}

static double text_width(cairo_t *cr, const char *s, double px) {
    char buf[1024];
    cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, px);
    cairo_text_extents_t e;
    cairo_text_extents(cr, valid_utf8(s, buf, sizeof buf), &e);
    return e.x_advance;
}

// A one-pixel line between pixel centres (x, y rounded), so it covers whole pixels.
static void hairline(cairo_t *cr, double x0, double y0, double x1, double y1, uint32_t rgb) {
    cairo_move_to(cr, floor(x0) + 0.5, floor(y0) + 0.5);
    cairo_line_to(cr, floor(x1) + 0.5, floor(y1) + 0.5);
    cairo_set_line_width(cr, 1);
    set_rgb(cr, rgb);
    cairo_stroke(cr);
}

static void draw_chart(cairo_t *cr, const chart *c) {
    set_rgb(cr, 0xffffff);
    cairo_paint(cr);
    for (int i = 0; i < c->x.n_ticks; i++) {
        double x = chart_px(c, c->x.tick[i]);
        hairline(cr, x, c->top, x, c->bottom, 0xe6e6e6);
    }
    for (int i = 0; i < c->y.n_ticks; i++) {
        double y = chart_py(c, c->y.tick[i]);
        hairline(cr, c->left, y, c->right, y, 0xe6e6e6);
    }
    cairo_rectangle(cr, floor(c->left) + 0.5, floor(c->top) + 0.5, floor(c->right) - floor(c->left),
                    floor(c->bottom) - floor(c->top));
    set_rgb(cr, 0x333333);
    cairo_set_line_width(cr, 1);
    cairo_stroke(cr);
    char lab[64];
    for (int i = 0; i < c->x.n_ticks; i++) {
        double x = chart_px(c, c->x.tick[i]);
        hairline(cr, x, c->bottom, x, c->bottom + 5, 0x333333);
        tick_label(&c->x, c->x.tick[i], lab, sizeof lab);
        text_at(cr, x, c->bottom + 19, lab, 12, false, 1);
    }
    for (int i = 0; i < c->y.n_ticks; i++) {
        double y = chart_py(c, c->y.tick[i]);
        hairline(cr, c->left - 5, y, c->left, y, 0x333333);
        tick_label(&c->y, c->y.tick[i], lab, sizeof lab);
        text_at(cr, c->left - 8, y + 4, lab, 12, false, 2);
    }
    set_rgb(cr, 0x222222);
    text_at(cr, (c->left + c->right) / 2, CHART_H - 26, "step", 13, false, 1);
    cairo_save(cr);
    cairo_translate(cr, 18, (c->top + c->bottom) / 2);
    cairo_rotate(cr, -M_PI / 2);
    text_at(cr, 0, 0, c->y_label, 13, false, 1);
    cairo_restore(cr);
    set_rgb(cr, 0x111111);
    text_at(cr, CHART_W / 2.0, 28, c->title, 16, true, 1);
    // Lines and markers last, over the grid; every point lies inside the plot area.
    cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
    cairo_set_line_cap(cr, CAIRO_LINE_CAP_ROUND);
    for (int k = 0; k < c->n_series; k++) {
        const chart_series *s = &c->series[k];
        set_rgb(cr, palette[k % N_COLORS]);
        cairo_new_path(cr);   // text leaves a current point, which a first line_to would join
        for (int i = 0; i < s->n; i++) cairo_line_to(cr, chart_px(c, s->x[i]), chart_py(c, s->y[i]));
        cairo_set_line_width(cr, 1.8);
        cairo_stroke(cr);
        if (s->n <= MARKER_MAX_POINTS)
            for (int i = 0; i < s->n; i++) {
                cairo_new_sub_path(cr);
                cairo_arc(cr, chart_px(c, s->x[i]), chart_py(c, s->y[i]), s->n == 1 ? 4 : 2.5, 0, 2 * M_PI);
                cairo_fill(cr);
            }
    }
    if (c->n_series > 1) {
        double w_max = 0;
        for (int k = 0; k < c->n_series; k++) w_max = fmax(w_max, text_width(cr, c->series[k].tag, 12));
        double w = 44 + ceil(w_max), x = c->right - 10 - w, y = c->top + 10, h = 8 + 18 * c->n_series;
        cairo_rectangle(cr, floor(x) + 0.5, floor(y) + 0.5, ceil(w), h);
        cairo_set_source_rgba(cr, 1, 1, 1, 0.85);
        cairo_fill_preserve(cr);
        set_rgb(cr, 0x999999);
        cairo_set_line_width(cr, 1);
        cairo_stroke(cr);
        for (int k = 0; k < c->n_series; k++) {
            double ly = y + 13 + 18 * k;
            set_rgb(cr, palette[k % N_COLORS]);
            cairo_new_path(cr);
            cairo_move_to(cr, x + 8, ly);
            cairo_line_to(cr, x + 28, ly);
            cairo_set_line_width(cr, 2.5);
            cairo_stroke(cr);
            set_rgb(cr, 0x222222);
            text_at(cr, x + 34, ly + 4, c->series[k].tag, 12, false, 0);
        }
    }
    if (c->note[0]) {
        set_rgb(cr, 0xaa0000);
        text_at(cr, c->left, CHART_H - 8, c->note, 11, false, 0);
    }
}

static cairo_status_t write_to_file(void *closure, const unsigned char *data, unsigned int length) {
    return fwrite(data, 1, length, closure) == length ? CAIRO_STATUS_SUCCESS : CAIRO_STATUS_WRITE_ERROR;
}

bool chart_write_png(FILE *f, const chart *c, char *err, size_t cap) {
    // RGB24: an opaque image, which cairo writes as an 8-bit RGB PNG (no alpha channel).
    cairo_surface_t *surface = cairo_image_surface_create(CAIRO_FORMAT_RGB24, CHART_W, CHART_H);
    cairo_t *cr = cairo_create(surface);   // on a failed surface: a context in its error state
    draw_chart(cr, c);
    // Cairo's errors are sticky: the first failing call leaves its status, later calls do nothing.
    cairo_status_t status = cairo_status(cr);
    if (status == CAIRO_STATUS_SUCCESS) {
        cairo_surface_flush(surface);
        status = cairo_surface_write_to_png_stream(surface, write_to_file, f);
    }
    cairo_destroy(cr);
    cairo_surface_destroy(surface);
    if (status != CAIRO_STATUS_SUCCESS) {
        snprintf(err, cap, "cairo: %s", cairo_status_to_string(status));
        return false;
    }
    if (ferror(f)) {
        snprintf(err, cap, "write error");
        return false;
    }
    return true;
}
