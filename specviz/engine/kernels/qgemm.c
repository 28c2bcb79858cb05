/* Block-quantised GEMM for CPU decoding steps: y[m, n] = sum_k x[m, k] w[n, k].

   Weights: ggml's Q4_1 blocks (32 weights: fp16 scale d, fp16 min m, 16 bytes of nibbles,
   w = d*q + m) or Q8_0 blocks (fp16 scale d, 32 int8, w = d*q). Activations: each row quantised
   per 32-block to int8 (Q8: scale = amax/127), row by row, so a row's bits never depend on the
   other rows of the call. The dot of one row with one weight row is summed in the same order for
   any number of rows: a verify forward gives each token exactly its single-step logits.

   Why hand-written: on an AVX2 EPYC torch's only int4 CPU kernel computes at ~4 GB/s of ~17
   (docs/every_cpu.md); this is the integer-dot layout llama.cpp decodes with (maddubs on
   u8 x s8), one weight read per call whatever the number of rows. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define QK 32

typedef struct { uint16_t d, m; uint8_t qs[QK / 2]; } block_q4_1;   /* 20 bytes */
typedef struct { uint16_t d; int8_t qs[QK]; } block_q8_0;           /* 34 bytes */

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* x [M, K] float -> xq [M, K] int8, xd [M, K/32] scales, xs [M, K/32] = scale * sum(q). */
void quantize_rows(const float *x, int M, int K, int8_t *xq, float *xd, float *xs, int nt) {
    const int nb = K / QK;
#pragma omp parallel for num_threads(nt) schedule(static) if (M * nb > 512)
    for (int i = 0; i < M * nb; i++) {
        const float *v = x + (size_t)i * QK;
        float amax = 0.f;
        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(v[j]));
        const float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
        int sum = 0;
        for (int j = 0; j < QK; j++) {
            const int q = (int)nearbyintf(v[j] * id);
            xq[(size_t)i * QK + j] = (int8_t)q;
            sum += q;
        }
        xd[i] = d;
        xs[i] = d * (float)sum;
    }
}

#define RT 4 /* rows per pass over a weight row (kept in L1 for the next pass) */

void gemm_q4_1(const block_q4_1 *w, int N, int K, const int8_t *xq, const float *xd,
               const float *xs, int M, float *y, int nt) {
    const int nb = K / QK;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++) {
        const block_q4_1 *wr = w + (size_t)n * nb;
        for (int m0 = 0; m0 < M; m0 += RT) {
            const int mr = M - m0 < RT ? M - m0 : RT;
            __m256 acc[RT][2];
            float mins[RT];
            for (int r = 0; r < RT; r++) { acc[r][0] = acc[r][1] = _mm256_setzero_ps(); mins[r] = 0.f; }
            for (int b = 0; b < nb; b++) {
                const float d = h2f(wr[b].d), mn = h2f(wr[b].m);
                const __m128i raw = _mm_loadu_si128((const __m128i *)wr[b].qs);
                const __m256i q = _mm256_and_si256(
                    _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0F));
                for (int r = 0; r < mr; r++) {
                    const size_t xi = (size_t)(m0 + r) * nb + b;
                    const __m256i x = _mm256_loadu_si256((const __m256i *)(xq + xi * QK));
                    const __m256 p = _mm256_cvtepi32_ps(
                        _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), _mm256_set1_epi16(1)));
                    acc[r][b & 1] = _mm256_fmadd_ps(p, _mm256_set1_ps(d * xd[xi]), acc[r][b & 1]);
                    mins[r] += mn * xs[xi];
                }
            }
            for (int r = 0; r < mr; r++)
                y[(size_t)(m0 + r) * N + n] = hsum(_mm256_add_ps(acc[r][0], acc[r][1])) + mins[r];
        }
    }
}

void gemm_q8_0(const block_q8_0 *w, int N, int K, const int8_t *xq, const float *xd,
               int M, float *y, int nt) {
    const int nb = K / QK;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++) {
        const block_q8_0 *wr = w + (size_t)n * nb;
        for (int m0 = 0; m0 < M; m0 += RT) {
            const int mr = M - m0 < RT ? M - m0 : RT;
            __m256 acc[RT][2];
            for (int r = 0; r < RT; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
            for (int b = 0; b < nb; b++) {
                const float d = h2f(wr[b].d);
                const __m256i w8 = _mm256_loadu_si256((const __m256i *)wr[b].qs);
                const __m256i aw = _mm256_sign_epi8(w8, w8);
                for (int r = 0; r < mr; r++) {
                    const size_t xi = (size_t)(m0 + r) * nb + b;
                    const __m256i x = _mm256_loadu_si256((const __m256i *)(xq + xi * QK));
                    const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(
                        _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w8)), _mm256_set1_epi16(1)));
                    acc[r][b & 1] = _mm256_fmadd_ps(p, _mm256_set1_ps(d * xd[xi]), acc[r][b & 1]);
                }
            }
            for (int r = 0; r < mr; r++)
                y[(size_t)(m0 + r) * N + n] = hsum(_mm256_add_ps(acc[r][0], acc[r][1]));
        }
    }
}
