/* GELU and its gradient over arrays, for the Gelu and GeluGrad kernels of kernels_math.c: erf
 * form x Phi(x) (Phi' = exp(-x^2 / 2) / sqrt(2 pi)) or tanh form 0.5 x (1 + tanh(u)),
 * u = sqrt(2 / pi) (x + 0.044715 x^3). The tanh form, and everything float64, is computed in
 * float64 (rounded once for float32; glibc's vector erf, exp and tanh, see below).
 *
 * The erf form of float32 tensors, the transformer's hot one, is computed in float32 by loops
 * the compiler vectorizes (16 lanes with AVX-512), through the complementary error function so
 * that the negative tail keeps its relative precision (1 + erf(x / sqrt 2) cancels there):
 *   z = |x| / sqrt 2, Phi(x) = erfc(z) / 2 for x < 0 and 1 - erfc(z) / 2 otherwise,
 *   erfc(z) = exp(-z^2) t Q(t), t = 1 / (1 + z / 2),
 * Q a degree-10 polynomial fitted for this file (weighted least squares toward the largest
 * relative error, z in [0, 9.5]: 3.2e-9 in float64, about 3e-7 evaluated in float32), exp by
 * 2^k times a degree-7 Taylor polynomial on |r| <= ln 2 / 2 (1.2e-8); z^2's rounding adds a
 * relative error of about z^2 6e-8 in the tail (4e-7 at x = -3.7, where Phi is 1e-4). No call
 * in the loops (fmaf and floorf would be calls in the baseline x86-64 clone), so that they
 * vectorize in every clone. Below x = -13 Phi is under float32's smallest normal and is taken as 0.
 * glibc's vector erfcf took 2.8 ns an element here, these loops about half a nanosecond. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_impl.h"

#if defined(__x86_64__) && defined(__GLIBC__) && !defined(__clang__) && \
    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
__attribute__((simd("notinbranch"))) double erf(double);
__attribute__((simd("notinbranch"))) double exp(double);
__attribute__((simd("notinbranch"))) double tanh(double);
#endif

#define SQRT_2_OVER_PI 0.7978845608028654
#define INV_SQRT_2 0.7071067811865476
#define INV_SQRT_2PI 0.3989422804014327

static inline double gelu(double x) { return 0.5 * x * (1.0 + erf(x * INV_SQRT_2)); }
static inline double gelu_grad(double x) {
    return 0.5 * (1.0 + erf(x * INV_SQRT_2)) + x * INV_SQRT_2PI * exp(-0.5 * x * x);
}
// exp(v) for v in [-87, 0] (the caller clamps), float32: v = k ln 2 + r, 2^k by the exponent bits.
static inline float exp_neg_f32(float v) {
    float kf = (v * 1.44269504f + 12582912.f) - 12582912.f;   // round to nearest: 1.5 * 2^23
    float r = (v - kf * 0.693145752f) - kf * 1.42860677e-6f;   // ln 2 in two parts
    float p = 1.f / 5040;
    p = p * r + 1.f / 720;
    p = p * r + 1.f / 120;
    p = p * r + 1.f / 24;
    p = p * r + 1.f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.f;
    p = p * r + 1.f;
    int32_t bits = ((int32_t)kf + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

// Phi(x) and exp(-x^2 / 2), float32 (the header says how).
static inline float phi_f32(float x, float *gauss) {
    float z = fabsf(x) * (float)INV_SQRT_2;
    z = z < 9.5f ? z : 9.5f;   // NaN too: the caller's x carries it
    float zz = z * z, v = -zz > -87.f ? -zz : -87.f;
    float e = exp_neg_f32(v);
    e = z < 9.2f ? e : 0.f;
    float t = 1.f / (1.f + 0.5f * z);
    float q = 0.0342538841f;
    q = q * t - 0.182016775f;
    q = q * t + 0.357860029f;
    q = q * t - 0.254119784f;
    q = q * t - 0.0559631959f;
    q = q * t + 0.0570368767f;
    q = q * t + 0.0456526354f;
    q = q * t + 0.188193098f;
    q = q * t + 0.244717792f;
    q = q * t + 0.282298952f;
    q = q * t + 0.282086492f;
    float lower = 0.5f * e * t * q, upper = 1.f - lower;   // both computed: a select, no branch
    *gauss = e;
    return x < 0 ? lower : upper;
}
static inline float gelu_f32(float x) {
    float g;
    return x * phi_f32(x, &g);
}
static inline float gelu_grad_f32(float x) {
    float g, p = phi_f32(x, &g);
    return p + x * (float)INV_SQRT_2PI * g;
}
static inline double gelu_tanh(double x) { return 0.5 * x * (1.0 + tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))); }
static inline double gelu_tanh_grad(double x) {
    double t = tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x * x);
}

CPU_CLONES void cpu_gelu_f32(const float *x, float *y, int64_t n, bool tanh_form) {
    if (tanh_form)
        for (int64_t i = 0; i < n; i++) y[i] = (float)gelu_tanh((double)x[i]);
    else {
#pragma GCC unroll 4
        for (int64_t i = 0; i < n; i++) y[i] = gelu_f32(x[i]);
    }
}

CPU_CLONES void cpu_gelu_f64(const double *x, double *y, int64_t n, bool tanh_form) {
    if (tanh_form)
        for (int64_t i = 0; i < n; i++) y[i] = gelu_tanh(x[i]);
    else
        for (int64_t i = 0; i < n; i++) y[i] = gelu(x[i]);
}

CPU_CLONES void cpu_gelu_grad_f32(const float *dy, const float *x, float *dx, int64_t n, bool tanh_form) {
    if (tanh_form)
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * (float)gelu_tanh_grad((double)x[i]);
    else {
#pragma GCC unroll 4
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * gelu_grad_f32(x[i]);
    }
}

CPU_CLONES void cpu_gelu_grad_f64(const double *dy, const double *x, double *dx, int64_t n, bool tanh_form) {
    if (tanh_form)
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * gelu_tanh_grad(x[i]);
    else
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * gelu_grad(x[i]);
}
