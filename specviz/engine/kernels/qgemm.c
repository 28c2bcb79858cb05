/* Block-quantised GEMM for CPU decoding steps: y[m, n] = sum_k x[m, k] w[n, k].

   Weights: the numbers of ggml's Q4_1 blocks (32 weights: fp16 scale d, fp16 minimum m, 16 bytes
   of nibbles, w = d*q + m) or Q8_0 blocks (fp16 scale d, 32 int8, w = d*q), the codes and the
   scales in separate arrays (scales of 8 blocks load as one vector). Activations: each row quantised
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

#define RT 4 /* rows per pass over a weight row (the row stays in L1 for the next pass) */
#define INLINE static inline __attribute__((always_inline))

INLINE __m256i nibbles(const uint8_t *qs) { /* 16 bytes -> 32 codes 0..15: low nibbles, then high */
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0F));
}

INLINE __m256 dot_u8s8(__m256i u, const int8_t *x) { /* 32 products u*x summed pairwise to 8 floats */
    const __m256i v = _mm256_loadu_si256((const __m256i *)x);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u, v), _mm256_set1_epi16(1)));
}

/* One weight row (nb blocks) against R activation rows. Scales are loaded 8 blocks at a time
   (fp16 -> fp32 in one instruction) and multiplied by the rows' scales as vectors: per 32-block
   scalar work kept the first version of this loop compute-bound at ~5 GB/s. The order of every
   sum is fixed by the block index alone, never by R: row-exact. bits 4: w = d*q + m; 8: w = d*q. */
INLINE void rows_dot(const uint8_t *qs, const uint16_t *wd, const uint16_t *wm, int nb, int bits,
                     const int8_t *xq, const float *xd, const float *xs, int R, float *y, size_t ys) {
    __m256 acc[RT][2], macc[RT];
    float tail[RT];
    const size_t bb = bits == 4 ? 16 : 32; /* bytes of codes per block */
    for (int r = 0; r < R; r++) { acc[r][0] = acc[r][1] = macc[r] = _mm256_setzero_ps(); tail[r] = 0.f; }
    int b = 0;
    for (; b + 8 <= nb; b += 8) {
        float dd[RT][8] __attribute__((aligned(32)));
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wd + b)));
        for (int r = 0; r < R; r++)
            _mm256_store_ps(dd[r], _mm256_mul_ps(dw, _mm256_loadu_ps(xd + (size_t)r * nb + b)));
        if (bits == 4) {
            const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wm + b)));
            for (int r = 0; r < R; r++)
                macc[r] = _mm256_fmadd_ps(mw, _mm256_loadu_ps(xs + (size_t)r * nb + b), macc[r]);
        }
        for (int j = 0; j < 8; j++) {
            const uint8_t *q = qs + (b + j) * bb;
            __m256i u, w8 = _mm256_setzero_si256();
            if (bits == 4) u = nibbles(q);
            else { w8 = _mm256_loadu_si256((const __m256i *)q); u = _mm256_sign_epi8(w8, w8); }
            for (int r = 0; r < R; r++) {
                const int8_t *x = xq + ((size_t)r * nb + b + j) * QK;
                __m256 p;
                if (bits == 4) p = dot_u8s8(u, x);
                else {
                    const __m256i v = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)x), w8);
                    p = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u, v), _mm256_set1_epi16(1)));
                }
                acc[r][j & 1] = _mm256_fmadd_ps(p, _mm256_broadcast_ss(&dd[r][j]), acc[r][j & 1]);
            }
        }
    }
    for (; b < nb; b++) { /* the last nb % 8 blocks, scales one at a time */
        const uint8_t *q = qs + b * bb;
        __m256i u, w8 = _mm256_setzero_si256();
        if (bits == 4) u = nibbles(q);
        else { w8 = _mm256_loadu_si256((const __m256i *)q); u = _mm256_sign_epi8(w8, w8); }
        for (int r = 0; r < R; r++) {
            const size_t xi = (size_t)r * nb + b;
            __m256 p;
            if (bits == 4) p = dot_u8s8(u, xq + xi * QK);
            else {
                const __m256i v = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(xq + xi * QK)), w8);
                p = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u, v), _mm256_set1_epi16(1)));
            }
            acc[r][b & 1] = _mm256_fmadd_ps(p, _mm256_set1_ps(h2f(wd[b]) * xd[xi]), acc[r][b & 1]);
            if (bits == 4) tail[r] += h2f(wm[b]) * xs[xi];
        }
    }
    for (int r = 0; r < R; r++)
        y[r * ys] = hsum(_mm256_add_ps(acc[r][0], acc[r][1])) + hsum(macc[r]) + tail[r];
}

#define TILE(BITS, R) rows_dot(qs + (size_t)n * nb * bb, wd + (size_t)n * nb, wm ? wm + (size_t)n * nb : 0, \
                               nb, BITS, xq + (size_t)m0 * K, xd + (size_t)m0 * nb, xs + (size_t)m0 * nb, R, \
                               y + (size_t)m0 * N + n, N)

/* y [M, N] = rows of (xq, xd, xs) against N weight rows: codes qs, fp16 scales wd [N, K/32],
   fp16 minimums wm (Q4_1; NULL for Q8_0). bits: 4 or 8. */
void gemm_blocks(const uint8_t *qs, const uint16_t *wd, const uint16_t *wm, int bits, int N, int K,
                 const int8_t *xq, const float *xd, const float *xs, int M, float *y, int nt) {
    const int nb = K / QK;
    const size_t bb = bits == 4 ? 16 : 32;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++) {
        for (int m0 = 0; m0 < M; m0 += RT) {
            const int R = M - m0 < RT ? M - m0 : RT;
            if (bits == 4) {
                switch (R) { case 4: TILE(4, 4); break; case 3: TILE(4, 3); break;
                             case 2: TILE(4, 2); break; default: TILE(4, 1); }
            } else {
                switch (R) { case 4: TILE(8, 4); break; case 3: TILE(8, 3); break;
                             case 2: TILE(8, 2); break; default: TILE(8, 1); }
            }
        }
    }
}
