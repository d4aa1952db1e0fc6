// A hand-written AVX-512 LayerNorm over 197 short rows on one core, to hold tvmfuse's kernel
// against: #18's LayerNorm sweep line (70% of the family's best at 197 x 77) needs 1.62 us on Zen 4.
//
//     gcc -O3 -march=native -funroll-loops -DNC=77 -o /tmp/ln77 benchmarks/layer_norm_bound.c -lm
//     /tmp/ln77
//
// Two versions, checked against each other: `per_row` is tvmfuse's shape (a row's sums in two
// vector accumulators, its lanes folded, the mean, the variance over x - mean, then the row
// normalized); `transposed` takes 16 rows at a time and reduces their 16 partial-sum vectors to
// one vector of 16 row sums with shuffle butterflies (30 shuffles and 15 adds for 16 rows, where
// folding each row's lanes takes 4 shuffles and 4 adds a row), the mean and the variance then
// computed for the 16 rows as vectors. Times are the best of 100 x 2000 calls on one thread.
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <time.h>
#include <string.h>

#define ROWS 197
#ifndef NC
#define NC 77
#endif
#define N NC
static float *X, *Y, *G, *B;

static double now(void){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+t.tv_nsec*1e-9;}

static inline __m512 load(const float *p, int c, __mmask16 tail) {
  return (c + 16 <= N) ? _mm512_loadu_ps(p + c) : _mm512_maskz_loadu_ps(tail, p + c);
}

static float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

// one row at a time, 4 rows interleaved by the compiler's unrolling (like ROW_GROUP)
static void per_row(void) {
  int steps = (N + 15) / 16;
  __mmask16 tail = (N % 16) ? (__mmask16)((1u << (N % 16)) - 1) : 0xffff;
  float inv = 1.0f / N;
  for (int r = 0; r < ROWS; r++) {
    const float *x = X + (size_t)r * N; float *y = Y + (size_t)r * N;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    for (int s = 0; s < steps; s++) { __m512 v = load(x, s * 16, tail); if (s & 1) a1 = _mm512_add_ps(a1, v); else a0 = _mm512_add_ps(a0, v); }
    float mean = hsum(_mm512_add_ps(a0, a1)) * inv;
    __m512 m = _mm512_set1_ps(mean);
    a0 = _mm512_setzero_ps(); a1 = _mm512_setzero_ps();
    for (int s = 0; s < steps; s++) {
      __m512 d = _mm512_sub_ps(load(x, s * 16, tail), m);
      if (s + 1 == steps && N % 16) d = _mm512_maskz_mov_ps(tail, d);
      if (s & 1) a1 = _mm512_fmadd_ps(d, d, a1); else a0 = _mm512_fmadd_ps(d, d, a0);
    }
    float rstd = 1.0f / sqrtf(hsum(_mm512_add_ps(a0, a1)) * inv + 1e-5f);
    __m512 rs = _mm512_set1_ps(rstd);
    for (int s = 0; s < steps; s++) {
      int c = s * 16;
      __m512 v = _mm512_mul_ps(_mm512_sub_ps(load(x, c, tail), m), rs);
      v = _mm512_fmadd_ps(v, load(G, c, tail), load(B, c, tail));
      if (c + 16 <= N) _mm512_storeu_ps(y + c, v); else _mm512_mask_storeu_ps(y + c, tail, v);
    }
  }
}

// 16 row sums of a[0..15] -> one vector, lane 4k+j = row k+4j
static inline __m512 transpose_sum(__m512 *a) {
  __m512 b[8], c[4], d[2];
  for (int i = 0; i < 8; i++)
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2*i], a[2*i+1], 0x44), _mm512_shuffle_f32x4(a[2*i], a[2*i+1], 0xEE));
  for (int i = 0; i < 4; i++)
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2*i], b[2*i+1], 0x88), _mm512_shuffle_f32x4(b[2*i], b[2*i+1], 0xDD));
  for (int i = 0; i < 2; i++)
    d[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(c[2*i]), _mm512_castps_pd(c[2*i+1]))),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(c[2*i]), _mm512_castps_pd(c[2*i+1]))));
  return _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));
}

static void group16(int r0, int steps, __mmask16 tail, float inv) {
  __m512 acc[16];
  float means[16] __attribute__((aligned(64))), rstds[16] __attribute__((aligned(64)));
  for (int r = 0; r < 16; r++) {
    const float *x = X + (size_t)(r0 + r) * N;
    __m512 a = load(x, 0, tail);
    for (int s = 1; s < steps; s++) a = _mm512_add_ps(a, load(x, s * 16, tail));
    acc[r] = a;
  }
  __m512 mean = _mm512_mul_ps(transpose_sum(acc), _mm512_set1_ps(inv));
  _mm512_store_ps(means, mean);
  for (int r = 0; r < 16; r++) {
    const float *x = X + (size_t)(r0 + r) * N;
    __m512 m = _mm512_set1_ps(means[4 * (r % 4) + r / 4]);
    __m512 a = _mm512_setzero_ps();
    for (int s = 0; s < steps; s++) {
      __m512 d = _mm512_sub_ps(load(x, s * 16, tail), m);
      if (s + 1 == steps && N % 16) d = _mm512_maskz_mov_ps(tail, d);
      a = _mm512_fmadd_ps(d, d, a);
    }
    acc[r] = a;
  }
  __m512 var = _mm512_fmadd_ps(transpose_sum(acc), _mm512_set1_ps(inv), _mm512_set1_ps(1e-5f));
  _mm512_store_ps(rstds, _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_sqrt_ps(var)));
  for (int r = 0; r < 16; r++) {
    const float *x = X + (size_t)(r0 + r) * N; float *y = Y + (size_t)(r0 + r) * N;
    int l = 4 * (r % 4) + r / 4;
    __m512 m = _mm512_set1_ps(means[l]), rs = _mm512_set1_ps(rstds[l]);
    for (int s = 0; s < steps; s++) {
      int c = s * 16;
      __m512 v = _mm512_mul_ps(_mm512_sub_ps(load(x, c, tail), m), rs);
      v = _mm512_fmadd_ps(v, load(G, c, tail), load(B, c, tail));
      if (c + 16 <= N) _mm512_storeu_ps(y + c, v); else _mm512_mask_storeu_ps(y + c, tail, v);
    }
  }
}

static void transposed(void) {
  int steps = (N + 15) / 16;
  __mmask16 tail = (N % 16) ? (__mmask16)((1u << (N % 16)) - 1) : 0xffff;
  float inv = 1.0f / N;
  int r0 = 0;
  for (; r0 + 16 <= ROWS; r0 += 16) group16(r0, steps, tail, inv);
  // last rows: the group over the last 16 rows again (recomputes some rows; same results)
  if (r0 < ROWS) group16(ROWS - 16, steps, tail, inv);
}

static double bench(void (*f)(void)) {
  double best = 1e9;
  for (int k = 0; k < 50; k++) {
    double t = now();
    for (int i = 0; i < 2000; i++) f();
    t = (now() - t) / 2000;
    if (t < best) best = t;
  }
  return best;
}

int main(int argc, char **argv) {

  X = aligned_alloc(64, ROWS * N * 4 + 64); Y = aligned_alloc(64, ROWS * N * 4 + 64);
  G = aligned_alloc(64, N * 4 + 64); B = aligned_alloc(64, N * 4 + 64);
  for (int i = 0; i < ROWS * N; i++) X[i] = (float)rand() / RAND_MAX * 2 - 1 + (i % N == 3 ? 5 : 0);
  for (int i = 0; i < N; i++) { G[i] = 0.5f + (float)i / N; B[i] = (float)(i % 7) / 7; }
  per_row();
  float *ref = malloc(ROWS * N * 4); memcpy(ref, Y, ROWS * N * 4);
  memset(Y, 0, ROWS * N * 4);
  transposed();
  double err = 0; for (int i = 0; i < ROWS * N; i++) err = fmax(err, fabs(Y[i] - ref[i]));
  double a = bench(per_row), b = bench(transposed);
  a = fmin(a, bench(per_row)); b = fmin(b, bench(transposed));
  printf("N=%d per_row %.2f us  transposed %.2f us  (max diff %.1e)\n", N, a * 1e6, b * 1e6, err);
  return 0;
}
