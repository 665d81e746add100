/* consumer.c : a program that uses an installed flashc, built by tests/install/run.sh
 * against the installed tree (CMake's find_package, pkg-config; shared and static).
 *
 * It checks that the library it runs with is the header's version, then runs one
 * fp32 forward on the CPU whose answer is known: every key row is the same, so
 * each query attends uniformly and out = the mean of the v rows, with
 * lse = q.k / sqrt(D) + log(Sk). Prints "consumer: flashc VERSION ok" and exits 0,
 * or says what differs and exits 1. It needs nothing but libc and flashc (no libm),
 * so that a link that works says the flashc target or .pc brought all it needs. */
#include <stdio.h>

#include <flashc.h>

enum { B = 1, SQ = 3, SK = 5, H = 2, D = 16 };
#define SCALE 0.25                 /* 1 / sqrt(D) */
#define LOG_SK 1.6094379124341003  /* log(SK) */

/* |x - want| relative to max(1, |want|) */
static double fc_rel_err(double x, double want) {
    double e = x > want ? x - want : want - x, m = want > 0 ? want : -want;
    return m > 1 ? e / m : e;
}

int main(void) {
    if (flashc_version_number() != FLASHC_VERSION_NUMBER) {
        fprintf(stderr, "consumer: library %s (%u), header %d\n", flashc_version(),
                flashc_version_number(), FLASHC_VERSION_NUMBER);
        return 1;
    }

    // (B, S, H, D) each; k: one row repeated, v: distinct rows
    static float q[B][SQ][H][D], k[B][SK][H][D], v[B][SK][H][D], out[B][SQ][H][D];
    static float lse[B][H][SQ];
    for (int i = 0; i < SQ; i++)
        for (int h = 0; h < H; h++)
            for (int d = 0; d < D; d++) q[0][i][h][d] = 0.25f * (float)(i - d) + 0.1f * (float)h;
    for (int j = 0; j < SK; j++)
        for (int h = 0; h < H; h++)
            for (int d = 0; d < D; d++) {
                k[0][j][h][d] = 0.5f - 0.125f * (float)d;
                v[0][j][h][d] = (float)(j * j) - 0.5f * (float)(d + h);
            }

    int64_t qs[4] = {B, SQ, H, D}, ks[4] = {B, SK, H, D}, ls[3] = {B, H, SQ};
    flashc_fwd_args a = FLASHC_ARGS_INIT;
    a.q = flashc_tensor_contiguous(q, FLASHC_DTYPE_FP32, 4, qs, FLASHC_DEVICE_CPU);
    a.k = flashc_tensor_contiguous(k, FLASHC_DTYPE_FP32, 4, ks, FLASHC_DEVICE_CPU);
    a.v = flashc_tensor_contiguous(v, FLASHC_DTYPE_FP32, 4, ks, FLASHC_DEVICE_CPU);
    a.out = flashc_tensor_contiguous(out, FLASHC_DTYPE_FP32, 4, qs, FLASHC_DEVICE_CPU);
    a.softmax_lse = flashc_tensor_contiguous(lse, FLASHC_DTYPE_FP32, 3, ls, FLASHC_DEVICE_CPU);
    flashc_params p = FLASHC_PARAMS_INIT;
    // workspace NULL, 0: the library allocates what it needs for the call
    flashc_status s = flashc_fwd(&a, &p, NULL, 0);
    if (s != FLASHC_OK) {
        fprintf(stderr, "consumer: flashc_fwd: %s: %s\n", flashc_status_string(s),
                flashc_last_error());
        return 1;
    }

    double err = 0;
    for (int i = 0; i < SQ; i++)
        for (int h = 0; h < H; h++) {
            double dot = 0;
            for (int d = 0; d < D; d++) {
                double mean = 0;
                for (int j = 0; j < SK; j++) mean += v[0][j][h][d] / SK;
                double e = fc_rel_err(out[0][i][h][d], mean);
                err = e > err ? e : err;
                dot += (double)q[0][i][h][d] * k[0][0][h][d];
            }
            double e = fc_rel_err(lse[0][h][i], dot * SCALE + LOG_SK);
            err = e > err ? e : err;
        }
    if (!(err <= 1e-5)) {
        fprintf(stderr, "consumer: max relative error %g against the known answer\n", err);
        return 1;
    }
    printf("consumer: flashc %s ok\n", flashc_version());
    return 0;
}
