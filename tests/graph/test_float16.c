/* The 16-bit floats (bfloat16 and float16): the conversions of graph/tensor.c against references
 * computed here from the formats' definitions (each 16-bit pattern decoded with ldexp; the
 * nearest pattern found by comparing distances in float64, ties to the even pattern, a value
 * past the largest finite one rounding as if the exponent went on, so to infinity from the
 * midpoint up), the Cast kernel between them and the other dtypes, the dtypes through
 * checkpoints, and the errors: a 16-bit feed to a float32 placeholder, an op that does not
 * compute in them, a checkpoint of another dtype. MatMul in them: tests/executor/test_gemm16.c. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

// The value of a 16-bit pattern with `frac` fraction bits and an exponent bias of `bias`;
// all-ones exponents are infinity or NaN.
static double decode(uint16_t b, int exp_bits, int frac) {
    int bias = (1 << (exp_bits - 1)) - 1;
    int e = (b >> frac) & ((1 << exp_bits) - 1);
    uint32_t m = b & ((1u << frac) - 1);
    double sign = (b & 0x8000) ? -1 : 1;
    if (e == (1 << exp_bits) - 1) return m ? NAN : sign * INFINITY;
    if (e == 0) return sign * ldexp((double)m, 1 - bias - frac);
    return sign * ldexp((double)((1u << frac) | m), e - bias - frac);
}

static double bf16_ref(uint16_t b) { return decode(b, 8, 7); }
static double f16_ref(uint16_t b) { return decode(b, 5, 10); }

// The nearest pattern to x (not NaN) of a format: positive patterns are ordered like their
// values, so a binary search over 0 .. inf_bits finds the two around |x|; the infinity
// pattern stands for the value the next exponent would give (2 * the largest finite's binade).
static uint16_t nearest(double x, double (*dec)(uint16_t), uint16_t inf_bits, double inf_as) {
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs(x);
    uint16_t lo = 0, hi = inf_bits;   // value(lo) <= a < value(hi), or a >= inf_as
    if (a >= inf_as) return sign | inf_bits;
    while (hi - lo > 1) {
        uint16_t mid = (uint16_t)((lo + hi) / 2);
        if (dec(mid) <= a) lo = mid;
        else hi = mid;
    }
    double vl = dec(lo), vh = hi == inf_bits ? inf_as : dec(hi);
    double dl = a - vl, dh = vh - a;
    uint16_t r = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);
    return sign | r;
}

static uint16_t bf16_nearest(double x) { return nearest(x, bf16_ref, 0x7f80, ldexp(1, 128)); }
static uint16_t f16_nearest(double x) { return nearest(x, f16_ref, 0x7c00, 65536); }

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// Floats that probe the rounding: random bit patterns (every exponent), values near each
// format's ties, its largest finite values and overflow thresholds, subnormals, zeros.
static float probe(int64_t i, uint64_t *seed) {
    static const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, 65536.0f,
                                    6.1035156e-5f, 5.9604645e-8f, 2.9802322e-8f, 2.9802326e-8f, 8.940697e-8f,
                                    3.3895314e38f, 3.3961776e38f, FLT_MAX, FLT_MIN, 1e-40f, INFINITY, -INFINITY};
    int64_t ns = (int64_t)(sizeof special / sizeof *special);
    if (i < ns) return special[i];
    uint32_t u = (uint32_t)(dg_test_uniform(seed, 0, 4294967296.0));
    switch (i % 4) {
    case 0: return from_bits(u);                                  // anything (NaN included)
    case 1: return from_bits((u & 0x8000ffffu) | 0x3f800000u);    // around 1: the 16 dropped bits
    case 2: return from_bits((u & 0xffff0000u) | 0x8000u);        // a bfloat16 tie
    default:   // a float16 tie between normal values (2^-14 .. 2^12), or near one below them
        return from_bits((u & 0x80000000u) | (u & 0x007fe000u) | 0x1000u | (((u >> 23) % 40 + 100) << 23));
    }
}

static void test_conversions(void **state) {
    (void)state;
    // Every pattern to float and back.
    for (uint32_t b = 0; b < 65536; b++) {
        float fb = dg_bfloat16_to_float((uint16_t)b), fh = dg_float16_to_float((uint16_t)b);
        double rb = bf16_ref((uint16_t)b), rh = f16_ref((uint16_t)b);
        if (isnan(rb)) {
            assert_true(isnan(fb));
            uint16_t back = dg_float_to_bfloat16(fb);
            assert_true(isnan(bf16_ref(back)) && (back & 0x8000) == (b & 0x8000) && (back & 0x40));
        } else {
            assert_true((double)fb == rb && !signbit(fb) == !signbit(rb));
            assert_int_equal(dg_float_to_bfloat16(fb), b);
        }
        if (isnan(rh)) {
            assert_true(isnan(fh));
            uint16_t back = dg_float_to_float16(fh);
            assert_true(isnan(f16_ref(back)) && (back & 0x8000) == (b & 0x8000) && (back & 0x200));
        } else {
            assert_true((double)fh == rh && !signbit(fh) == !signbit(rh));
            assert_int_equal(dg_float_to_float16(fh), b);
        }
    }
    // Floats to the nearest pattern.
    uint64_t seed = 3;
    int64_t ties_b = 0, ties_h = 0;
    for (int64_t i = 0; i < 400000; i++) {
        float x = probe(i, &seed);
        uint16_t b = dg_float_to_bfloat16(x), h = dg_float_to_float16(x);
        if (isnan(x)) {
            assert_true(isnan(bf16_ref(b)) && isnan(f16_ref(h)));
            continue;
        }
        uint16_t wb = bf16_nearest(x), wh = f16_nearest(x);
        if (b != wb || h != wh)
            fail_msg("%.9g: bfloat16 %04x, want %04x; float16 %04x, want %04x", (double)x, b, wb, h, wh);
        ties_b += fabs((double)x - bf16_ref(wb)) == fabs((double)x - bf16_ref(wb ^ 1));
        ties_h += !isinf(f16_ref(wh)) && fabs((double)x - f16_ref(wh)) == fabs((double)x - f16_ref(wh ^ 1));
    }
    assert_true(ties_b > 10000 && ties_h > 10000);   // the tie probes did reach ties
}

static dg_tensor *tensor_f32(const float *v, int64_t n) {
    dg_status *st = dg_status_new();
    dg_tensor *t = dg_tensor_from_data(DG_FLOAT32, dg_shape1(n), v, st);
    assert_ok(st);
    dg_status_free(&st);
    return t;
}

// Cast between the 16-bit floats and float32, float64, int32 and each other, in a session.
static void test_cast(void **state) {
    (void)state;
    enum { N = 4099 };
    float v[N];
    uint64_t seed = 9;
    for (int i = 0; i < N; i++) v[i] = probe(i, &seed);
    for (int i = 0; i < N; i++)
        if (i % 7 == 3) v[i] = (float)(int)dg_test_uniform(&seed, -70000, 70000);   // integers, some past float16
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape1(N)), xi = dg_placeholder(g, "xi", DG_INT32, dg_shape1(N));
    dg_output xd = dg_cast(g, "xd", x, DG_FLOAT64);
    dg_output b = dg_cast(g, "b", x, DG_BFLOAT16), h = dg_cast(g, "h", x, DG_FLOAT16);
    dg_output all[] = {
        b,
        h,
        dg_cast(g, "bd", xd, DG_BFLOAT16),
        dg_cast(g, "hi", xi, DG_FLOAT16),
        dg_cast(g, "hb", b, DG_FLOAT16),    // bfloat16 -> float16
        dg_cast(g, "bf", h, DG_FLOAT32),    // float16 -> float32
        dg_cast(g, "b2", b, DG_BFLOAT16),   // the same type: a copy
    };
    dg_session *s = dg_session_new(g, "local", NULL, st);
    assert_ok(st);
    int32_t iv[N];
    for (int i = 0; i < N; i++) iv[i] = (int32_t)dg_test_uniform(&seed, -70000, 70000);
    dg_tensor *xv = tensor_f32(v, N), *r[7] = {0};
    dg_tensor *ivt = dg_tensor_from_data(DG_INT32, dg_shape1(N), iv, st);
    dg_output feeds[] = {x, xi};
    dg_tensor *vals[] = {xv, ivt};
    assert_true(dg_session_run(s, feeds, vals, 2, all, r, 7, NULL, 0, st));
    assert_ok(st);
    assert_int_equal(dg_tensor_dtype(r[0]), DG_BFLOAT16);
    assert_int_equal(dg_tensor_dtype(r[4]), DG_FLOAT16);
    const uint16_t *rb = dg_tensor_data(r[0]), *rh = dg_tensor_data(r[1]), *bd = dg_tensor_data(r[2]),
                   *hi = dg_tensor_data(r[3]), *hb = dg_tensor_data(r[4]), *bb = dg_tensor_data(r[6]);
    const float *bf = dg_tensor_f32(r[5]);
    for (int i = 0; i < N; i++) {
        if (isnan(v[i])) {
            assert_true(isnan(bf16_ref(rb[i])) && isnan(f16_ref(rh[i])) && isnan(bf[i]) && isnan(f16_ref(hb[i])));
            continue;
        }
        if (i % 7 == 3) assert_true(v[i] == truncf(v[i]));
        assert_int_equal(rb[i], bf16_nearest(v[i]));
        assert_int_equal(rh[i], f16_nearest(v[i]));
        // float64 holds the float32 exactly; a float32 denormal comes back through float32
        // arithmetic, which kernels run with denormals flushed to zero (not under valgrind,
        // which does not flush).
        if (fabsf(v[i]) < FLT_MIN) assert_true((bd[i] & 0x7fff) == 0 || bd[i] == bf16_nearest(v[i]));
        else assert_int_equal(bd[i], bf16_nearest(v[i]));
        assert_int_equal(hb[i], f16_nearest(bf16_ref(rb[i])));
        assert_true((double)bf[i] == f16_ref(rh[i]));
        assert_int_equal(bb[i], rb[i]);
    }
    for (int i = 0; i < N; i++) assert_int_equal(hi[i], f16_nearest((double)iv[i]));
    for (int i = 0; i < 7; i++) dg_tensor_unref(r[i]);
    dg_tensor_unref(xv);
    dg_tensor_unref(ivt);
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
}

// A bfloat16 value fed where float32 is expected; an Add of bfloat16 (elementwise ops do not
// compute in them yet): errors naming the dtypes.
static void test_errors(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape1(2));
    dg_output y = dg_identity(g, "y", x);
    dg_session *s = dg_session_new(g, "local", NULL, st);
    assert_ok(st);
    uint16_t bits[2] = {dg_float_to_bfloat16(1.5f), dg_float_to_bfloat16(-2.0f)};
    dg_tensor *bv = dg_tensor_from_data(DG_BFLOAT16, dg_shape1(2), bits, st), *out = NULL;
    assert_ok(st);
    assert_false(dg_session_run(s, &x, &bv, 1, &y, &out, 1, NULL, 0, st));
    assert_status(st, DG_INVALID_ARGUMENT, "feed for \"x:0\": expected float32, got bfloat16");
    assert_null(out);
    dg_session_free(&s);
    dg_graph_free(&g);

    dg_status_reset(st);
    g = dg_graph_new();
    dg_output a = dg_placeholder(g, "a", DG_BFLOAT16, dg_shape2(2, 2));
    dg_exp(g, "e", a);   // no 16-bit kernel (Add has one: test_amp_rewrite)
    assert_false(dg_graph_check(g, st));
    assert_status(st, DG_INVALID_ARGUMENT, "must be float32 or float64, got bfloat16");
    dg_graph_free(&g);
    dg_tensor_unref(bv);
    dg_status_free(&st);
}

// A float16 variable saved and restored bit for bit through the saver; restored into a float32
// variable of the same name: an error naming the variable and both dtypes, or, with
// dg_saver_set_convert_dtypes, the values converted.
static void test_checkpoint(void **state) {
    (void)state;
    dg_test_tmpdir td;   // the store and its -wal and -shm files go with the directory
    dg_test_tmpdir_make(&td, "dg_float16");
    const char *path = td.path;
    dg_status *st = dg_status_new();
    uint16_t bits[3] = {dg_float_to_float16(0.1f), dg_float_to_float16(-65504.0f), 0x7e00};
    for (int pass = 0; pass < 4; pass++) {
        dg_dtype dt = pass >= 2 ? DG_FLOAT32 : DG_FLOAT16;
        dg_graph *g = dg_graph_new();
        dg_output v = dg_variable(g, "w", dt, dg_shape1(3), dg_init_zeros());
        dg_output init = dg_placeholder(g, "init", dt, dg_shape1(3));
        dg_output set = dg_assign(g, "set", v, init);
        dg_saver *sv = dg_saver_new(g, st);
        assert_ok(st);
        dg_session *s = dg_session_new(g, "local", NULL, st);
        dg_checkpoint_store *cs = dg_checkpoint_store_new(path, true, st);
        assert_ok(st);
        if (pass == 0) {
            dg_tensor *iv = dg_tensor_from_data(DG_FLOAT16, dg_shape1(3), bits, st);
            assert_true(dg_session_run(s, &init, &iv, 1, NULL, NULL, 0, &set.node, 1, st));
            assert_true(dg_saver_save(sv, s, cs, 7, 0, NULL, st));
            assert_ok(st);
            dg_tensor_unref(iv);
        } else if (pass == 1) {
            assert_true(dg_saver_restore(sv, s, cs, -1, NULL, st));
            dg_tensor *out = NULL;
            assert_true(dg_session_run(s, NULL, NULL, 0, &v, &out, 1, NULL, 0, st));
            assert_int_equal(dg_tensor_dtype(out), DG_FLOAT16);
            assert_memory_equal(dg_tensor_data(out), bits, sizeof bits);
            dg_tensor_unref(out);
        } else if (pass == 2) {
            assert_false(dg_saver_restore(sv, s, cs, -1, NULL, st));
            assert_status(st, DG_INVALID_ARGUMENT, "w (graph float32 [3], checkpoint float16 [3])");
        } else {   // asked to convert: float16 to float32 is exact, NaN stays NaN
            dg_saver_set_convert_dtypes(sv, true);
            assert_true(dg_saver_restore(sv, s, cs, -1, NULL, st));
            assert_ok(st);
            dg_tensor *out = NULL;
            assert_true(dg_session_run(s, NULL, NULL, 0, &v, &out, 1, NULL, 0, st));
            const float *f = dg_tensor_f32(out);
            assert_non_null(f);
            assert_true(f[0] == dg_float16_to_float(bits[0]) && f[1] == -65504.0f && isnan(f[2]));
            dg_tensor_unref(out);
        }
        dg_checkpoint_store_free(&cs);
        dg_session_free(&s);
        dg_saver_free(&sv);
        dg_graph_free(&g);
        dg_status_reset(st);
    }
    dg_test_tmpdir_remove(&td);
    dg_status_free(&st);
}

// A partitioned variable (3 parts) saved in float32 and restored into float16 parts, and into a
// whole float16 variable of the same full name: refused without conversion (naming the dtypes),
// converted to nearest with dg_saver_set_convert_dtypes, row for row.
static void test_checkpoint_parts_converted(void **state) {
    (void)state;
    dg_test_tmpdir td;
    dg_test_tmpdir_make(&td, "dg_float16_parts");
    dg_status *st = dg_status_new();
    float full[8 * 2];
    for (int i = 0; i < 16; i++) full[i] = 0.1f * (float)i - 0.55f;
    dg_checkpoint_store *cs = dg_checkpoint_store_new(td.path, true, st);
    assert_ok(st);
    for (int pass = 0; pass < 4; pass++) {
        dg_dtype dt = pass == 0 ? DG_FLOAT32 : DG_FLOAT16;
        dg_graph *g = dg_graph_new();
        dg_output var;   // pass 3: the whole table as one variable
        dg_partitioned_variable pv = {0};
        if (pass < 3) {
            dg_tensor *init = dg_tensor_from_data(DG_FLOAT32, dg_shape2(8, 2), full, st);
            pv = dg_partitioned_variable_new(g, "t", dt, dg_shape2(8, 2),
                                             pass == 0 ? dg_init_tensor(init) : dg_init_zeros(),
                                             dg_fixed_size_partitioner(3));
            dg_tensor_unref(init);
            assert_int_equal(pv.n, 3);
        } else {
            var = dg_variable(g, "t", dt, dg_shape2(8, 2), dg_init_zeros());
        }
        dg_node *init = dg_global_variables_initializer(g);
        dg_saver *sv = dg_saver_new(g, st);
        dg_session *s = dg_session_new(g, "local", NULL, st);
        assert_ok(st);
        assert_true(dg_session_run_target(s, init, st));
        if (pass == 0) {
            assert_true(dg_saver_save(sv, s, cs, 1, 0, NULL, st));
        } else if (pass == 1) {
            assert_false(dg_saver_restore(sv, s, cs, -1, NULL, st));
            assert_status(st, DG_INVALID_ARGUMENT, "float32");
            assert_status(st, DG_INVALID_ARGUMENT, "float16");
        } else {
            dg_saver_set_convert_dtypes(sv, true);
            assert_true(dg_saver_restore(sv, s, cs, -1, NULL, st));
            assert_ok(st);
            int n_parts = pass == 2 ? 3 : 1;
            int64_t row = 0;
            for (int p = 0; p < n_parts; p++) {
                dg_output v = pass == 2 ? pv.parts[p] : var;
                dg_tensor *out = NULL;
                assert_true(dg_session_run(s, NULL, NULL, 0, &v, &out, 1, NULL, 0, st));
                assert_int_equal(dg_tensor_dtype(out), DG_FLOAT16);
                const uint16_t *h = dg_tensor_data(out);
                for (int64_t e = 0; e < dg_tensor_num_elements(out); e++)
                    assert_int_equal(h[e], dg_float_to_float16(full[row * 2 + e]));
                row += dg_tensor_num_elements(out) / 2;
                dg_tensor_unref(out);
            }
            assert_int_equal(row, 8);
        }
        dg_session_free(&s);
        dg_saver_free(&sv);
        dg_graph_free(&g);
        dg_status_reset(st);
    }
    dg_checkpoint_store_free(&cs);
    dg_test_tmpdir_remove(&td);
    dg_status_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conversions),
        cmocka_unit_test(test_cast),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_checkpoint),
        cmocka_unit_test(test_checkpoint_parts_converted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
