/* What one core of an AVX2 + FMA CPU can multiply-add per second: the
 * ceiling the training benchmark's figures are measured against
 * (docs/BENCHMARKS.md, the Zen 1 figures). Not part of any test. Run:
 *
 *   gcc -O3 -mavx2 -mfma ci/cpu_ceiling.c -o /tmp/cpu_ceiling && /tmp/cpu_ceiling
 *
 * Prints the 256-bit FMA rate (independent chains), register tiles of
 * several shapes with both operands in L1 (an MR x NR tile needs MR
 * broadcasts and NR / 8 loads per step for MR * NR / 8 FMAs), and the
 * 8-bit integer dot-product instructions: vpmaddubsw alone (16-bit sums,
 * which overflow unless few and small terms are added) and followed by
 * vpmaddwd, which widens its sums to 32 bits as any longer dot product
 * needs. The accumulators are separate variables, stored one by one at
 * the end: with an array of them gcc kept them in memory and stored every
 * one each step, which halved the rate. */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define K 576 /* SmolLM2's hidden size: one reduction */
static float A[K * 8] __attribute__((aligned(64)));
static float B[K * 24] __attribute__((aligned(64)));
static float O[128];
#define F(c, a, b) c = _mm256_fmadd_ps(a, b, c)
#define BC(i) _mm256_broadcast_ss(q + (i))
#define S(i, v) _mm256_storeu_ps(O + 8 * (i), v)
/* The operands come in as arguments: with the globals gcc saw that repeated
 * calls store the same values and skipped them. */

__attribute__((noinline)) static void tile8x8(const float *A, const float *B, float *O) {
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
    for (int p = 0; p < K; p++) {
        __m256 b = _mm256_loadu_ps(B + p * 8);
        const float *q = A + p * 8;
        F(c0, BC(0), b); F(c1, BC(1), b); F(c2, BC(2), b); F(c3, BC(3), b);
        F(c4, BC(4), b); F(c5, BC(5), b); F(c6, BC(6), b); F(c7, BC(7), b);
    }
    S(0, c0); S(1, c1); S(2, c2); S(3, c3); S(4, c4); S(5, c5); S(6, c6); S(7, c7);
}

__attribute__((noinline)) static void tile4x16(const float *A, const float *B, float *O) {
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
    for (int p = 0; p < K; p++) {
        __m256 b0 = _mm256_loadu_ps(B + p * 16), b1 = _mm256_loadu_ps(B + p * 16 + 8), x;
        const float *q = A + p * 4;
        x = BC(0); F(c0, x, b0); F(c1, x, b1);
        x = BC(1); F(c2, x, b0); F(c3, x, b1);
        x = BC(2); F(c4, x, b0); F(c5, x, b1);
        x = BC(3); F(c6, x, b0); F(c7, x, b1);
    }
    S(0, c0); S(1, c1); S(2, c2); S(3, c3); S(4, c4); S(5, c5); S(6, c6); S(7, c7);
}

__attribute__((noinline)) static void tile6x16(const float *A, const float *B, float *O) {
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0, c8 = c0, c9 = c0, c10 = c0, c11 = c0;
    for (int p = 0; p < K; p++) {
        __m256 b0 = _mm256_loadu_ps(B + p * 16), b1 = _mm256_loadu_ps(B + p * 16 + 8), x;
        const float *q = A + p * 6;
        x = BC(0); F(c0, x, b0); F(c1, x, b1);
        x = BC(1); F(c2, x, b0); F(c3, x, b1);
        x = BC(2); F(c4, x, b0); F(c5, x, b1);
        x = BC(3); F(c6, x, b0); F(c7, x, b1);
        x = BC(4); F(c8, x, b0); F(c9, x, b1);
        x = BC(5); F(c10, x, b0); F(c11, x, b1);
    }
    S(0, c0); S(1, c1); S(2, c2); S(3, c3); S(4, c4); S(5, c5);
    S(6, c6); S(7, c7); S(8, c8); S(9, c9); S(10, c10); S(11, c11);
}

static void tiles(void) {
    const int reps = 200000;
    struct { const char *name; void (*f)(const float *, const float *, float *); int outputs; } t[] = {
        {"8x8 ", tile8x8, 64}, {"4x16", tile4x16, 64}, {"6x16", tile6x16, 96}};
    for (int i = 0; i < 3; i++) {
        double s = now();
        for (int r = 0; r < reps; r++) t[i].f(A, B, O);
        s = now() - s;
        printf("tile %s, operands in L1: %5.1f GFLOP/s\n", t[i].name, 2.0 * K * t[i].outputs * reps / s * 1e-9);
    }
}

#define CHAINS 6
#define N 400000000L

static void fma_rate(float seed) {
    __m256 a[CHAINS], x[CHAINS], w = _mm256_set1_ps(seed * 0.5f);
    for (int i = 0; i < CHAINS; i++) { a[i] = _mm256_set1_ps(i); x[i] = _mm256_set1_ps(i * 0.1f + seed); }
    double s = now();
    for (long n = 0; n < N / CHAINS; n++) {
        for (int i = 0; i < CHAINS; i++) a[i] = _mm256_fmadd_ps(x[i], w, a[i]);
        w = _mm256_add_ps(w, x[0]);
    }
    s = now() - s;
    float sum = 0;
    for (int i = 0; i < CHAINS; i++) sum += a[i][0];
    printf("256-bit FMA: %.2f G/s = %5.1f GFLOP/s  [%g]\n", N / s * 1e-9, 16.0 * N / s * 1e-9, sum);
}

static void int8_rate(int seed, int widen) {
    __m256i a[CHAINS], x[CHAINS], w = _mm256_set1_epi8(seed), d = _mm256_set1_epi8(1), one = _mm256_set1_epi16(1);
    for (int i = 0; i < CHAINS; i++) { a[i] = _mm256_set1_epi32(i); x[i] = _mm256_set1_epi8(i + seed); }
    double s = now();
    for (long n = 0; n < N / CHAINS; n++) {
        for (int i = 0; i < CHAINS; i++) {
            __m256i m = _mm256_maddubs_epi16(x[i], w);
            a[i] = widen ? _mm256_add_epi32(a[i], _mm256_madd_epi16(m, one)) : _mm256_add_epi16(a[i], m);
        }
        w = _mm256_xor_si256(w, d); /* a new operand each step, so nothing is hoisted */
    }
    s = now() - s;
    int sum = 0;
    for (int i = 0; i < CHAINS; i++) sum += _mm256_extract_epi32(a[i], 0);
    printf("vpmaddubsw%s: %.2f G/s = %5.1f G int8 ops/s  [%d]\n", widen ? " + vpmaddwd (32-bit sums)" : " (16-bit sums)", N / s * 1e-9, 64.0 * N / s * 1e-9, sum);
}

int main(int argc, char **argv) {
    (void)argv;
    for (int i = 0; i < K * 8; i++) A[i] = i * 1e-4f;
    for (int i = 0; i < K * 24; i++) B[i] = i * 1e-5f;
    fma_rate((float)argc);
    tiles();
    int8_rate(argc, 0);
    int8_rate(argc, 1);
    return 0;
}
