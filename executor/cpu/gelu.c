/* GELU and its gradient over arrays, for the Gelu and GeluGrad kernels of kernels_math.c:
 * computed in float64 and rounded once for float32, erf form x Phi(x) (Phi' = exp(-x^2 / 2) /
 * sqrt(2 pi)) or tanh form 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3).
 *
 * glibc's libmvec (2.35 on) has vector versions of erf, exp and tanh, but <math.h> declares
 * them only under -ffast-math. Declared here, in this file alone, they let the loops below run
 * 4 or 8 lanes at a time: the scalar erf takes about 40 ns on this project's machines, the
 * vector one under 5. libmvec's results may differ from the scalar functions' by a few units in
 * float64's last place, far below float32's rounding; the Erf op (kernels_math.c) keeps the
 * scalar erf. GCC only (clang has no simd attribute of this form): elsewhere the loops stay
 * scalar. */
#include <math.h>
#include <stdint.h>

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
static inline double gelu_tanh(double x) { return 0.5 * x * (1.0 + tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))); }
static inline double gelu_tanh_grad(double x) {
    double t = tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x * x);
}

CPU_CLONES void cpu_gelu_f32(const float *x, float *y, int64_t n, bool tanh_form) {
    if (tanh_form)
        for (int64_t i = 0; i < n; i++) y[i] = (float)gelu_tanh((double)x[i]);
    else
        for (int64_t i = 0; i < n; i++) y[i] = (float)gelu((double)x[i]);
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
    else
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * (float)gelu_grad((double)x[i]);
}

CPU_CLONES void cpu_gelu_grad_f64(const double *dy, const double *x, double *dx, int64_t n, bool tanh_form) {
    if (tanh_form)
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * gelu_tanh_grad(x[i]);
    else
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * gelu_grad(x[i]);
}
