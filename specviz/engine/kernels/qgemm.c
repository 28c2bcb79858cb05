/* Block-quantised GEMM for CPU decoding steps: y[m, n] = sum_k x[m, k] w[n, k].

   Weights in super-blocks of 8 blocks of 32, as GGUF's Q4_K: 4-bit codes q with w = D*s*q + Mn*t
   (s an 8-bit sub-scale, t an 8-bit sub-minimum per block, D and Mn per super-block), or 8-bit
   codes with w = D*s*q. Activations: each row quantised per super-block to int8 (one scale,
   amax/127) inside the call, row by row, so a row's bits never depend on the other rows. The
   dot of one row with one weight row is summed in the same order for any number of rows: a
   verify forward gives each token exactly its single-step logits.

   Why hand-written: on an AVX2 EPYC torch's only int4 CPU kernel computes at ~4 GB/s of ~17
   (docs/every_cpu.md); this is the integer-dot layout llama.cpp decodes with (maddubs on
   u8 x s8), one weight read per call whatever the number of rows. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define QK 32 /* weights per block */
#define SB 8  /* blocks per super-block */
#define RT 8  /* rows per pass over a weight row (the row stays in L1 for the next pass) */
/* Code bytes read ahead of the one in use (a software prefetch per 32-byte run). The hardware
   prefetcher alone left a 1.5B step's kernels at 64.5 ms (median of 12, 0.98 GB); 512 to 6144
   bytes ahead all gave 57.5-59.1 (2026-11-25, AVX2 EPYC, 2 threads) */
#define PF 1536
#define INLINE static inline __attribute__((always_inline))

static inline float hsum128(__m128 s) {
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float hsum(__m256 v) {
    return hsum128(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
}

/* x [M, K] float -> per row and super-block of up to 256 values: xq int8 [M, K], one scale
   xd [M, nsb] (amax/127), and the sum of each 32-block's codes xs [M, nsb*8] int16 (zero-padded
   past the last block). Row by row: a row's codes never depend on another row. */
static void quantize_rows(const float *x, int M, int K, int8_t *xq, float *xd, int16_t *xs, int nt) {
    const int nb = K / QK, nsb = (nb + SB - 1) / SB;
#pragma omp parallel for num_threads(nt) schedule(static) if (M * nsb > 64)
    for (int i = 0; i < M * nsb; i++) {
        const int row = i / nsb, sb = i % nsb, b0 = sb * SB, ns = nb - b0 < SB ? nb - b0 : SB;
        const float *v = x + (size_t)row * K + (size_t)b0 * QK;
        int8_t *q = xq + (size_t)row * K + (size_t)b0 * QK;
        float amax = 0.f;
        for (int j = 0; j < ns * QK; j++) amax = fmaxf(amax, fabsf(v[j]));
        const float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
        for (int b = 0; b < SB; b++) {
            int sum = 0;
            if (b < ns)
                for (int j = 0; j < QK; j++) {
                    const int c = (int)nearbyintf(v[b * QK + j] * id);
                    q[b * QK + j] = (int8_t)c;
                    sum += c;
                }
            xs[(size_t)row * nsb * SB + b0 + b] = (int16_t)sum;
        }
        xd[(size_t)row * nsb + sb] = d;
    }
}

/* Word j of v broadcast to every word: a block's sub-scale in one shuffle, where a scalar load
   and a broadcast per block stood before (with the pair layout below, a 1.5B step's kernels
   66.3 -> 63.8 ms, 2026-11-25, docs/every_cpu.md). */
INLINE __m256i word(__m256i v, int j) {
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)(0x0100 + 0x0202 * j)));
}

/* A super-block's 8-bit sub-scales (sgn 0: unsigned) or sub-minimums (sgn 1: signed) as 8 words
   (rows padded to whole super-blocks with zeros, qgemm.py's _padded). */
INLINE __m128i words8(const void *p, int sgn) {
    const __m128i raw = _mm_loadl_epi64((const __m128i *)p);
    return sgn ? _mm_cvtepi8_epi16(raw) : _mm_cvtepu8_epi16(raw);
}

/* One weight row against R activation rows. Per super-block (8 blocks of 32): the blocks'
   integer dots are weighted by their 8-bit sub-scales inside the integer pipeline (maddubs, then
   madd with the sub-scale), so the float work (convert, scale, add) is once per 256 weights
   and row, not per 32: with an fp16 scale per 32-block (Q4_1) a 5-row gate/up ran in 3.64 ms,
   now 2.43-2.84 (docs/every_cpu.md).
   bits 4: w = D*s_b*q + Mn*t_b (q 0..15), codes of blocks 2p and 2p+1 in one 32-byte run (low and
   high nibbles, as GGUF's Q4_K: one load and two masks give both); bits 8: w = D*s_b*q (q -127..127).
   Integer sums are exact; every float sum's order is fixed by the super-block index alone, never
   by R: row-exact. */
INLINE void rows_dot(const uint8_t *codes, const uint8_t *sub, const int8_t *tmin, const float *wd,
                     const float *wm, int nb, int bits, const int8_t *xq, const float *xd,
                     const int16_t *xs, int K, int R, float *y, size_t ys) {
    const int nsb = (nb + SB - 1) / SB;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 facc[RT];
    __m128 macc[RT];
    for (int r = 0; r < R; r++) { facc[r] = _mm256_setzero_ps(); macc[r] = _mm_setzero_ps(); }
    for (int S = 0; S < nsb; S++) {
        const int b0 = S * SB, ns = nb - b0 < SB ? nb - b0 : SB;
        const __m256i sc = _mm256_broadcastsi128_si256(words8(sub + b0, 0));
        __m256i iacc[RT];
        for (int r = 0; r < R; r++) iacc[r] = _mm256_setzero_si256();
        if (bits == 4) {
            for (int j = 0; j < ns; j += 2) {
                _mm_prefetch((const char *)(codes + (size_t)(b0 + j) * 16 + PF), _MM_HINT_T0);
                const __m256i raw = _mm256_loadu_si256((const __m256i *)(codes + (size_t)(b0 + j) * 16));
                const __m256i u0 = _mm256_and_si256(raw, m4), s0 = word(sc, j);
                if (j + 1 < ns) {
                    const __m256i u1 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4), s1 = word(sc, j + 1);
                    for (int r = 0; r < R; r++) {
                        const int8_t *x = xq + (size_t)r * K + (size_t)(b0 + j) * QK;
                        const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(u0, _mm256_loadu_si256((const __m256i *)x)), s0);
                        const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(u1, _mm256_loadu_si256((const __m256i *)(x + QK))), s1);
                        iacc[r] = _mm256_add_epi32(iacc[r], _mm256_add_epi32(p0, p1));
                    }
                } else { /* an odd last block: its run's high nibbles are empty */
                    for (int r = 0; r < R; r++) {
                        const __m256i v = _mm256_loadu_si256((const __m256i *)(xq + (size_t)r * K + (size_t)(b0 + j) * QK));
                        iacc[r] = _mm256_add_epi32(iacc[r], _mm256_madd_epi16(_mm256_maddubs_epi16(u0, v), s0));
                    }
                }
            }
        } else {
            for (int j = 0; j < ns; j++) {
                _mm_prefetch((const char *)(codes + (size_t)(b0 + j) * QK + PF), _MM_HINT_T0);
                const __m256i w8 = _mm256_loadu_si256((const __m256i *)(codes + (size_t)(b0 + j) * QK));
                const __m256i u = _mm256_sign_epi8(w8, w8), sv = word(sc, j);
                for (int r = 0; r < R; r++) {
                    const __m256i v = _mm256_sign_epi8(
                        _mm256_loadu_si256((const __m256i *)(xq + (size_t)r * K + (size_t)(b0 + j) * QK)), w8);
                    iacc[r] = _mm256_add_epi32(iacc[r], _mm256_madd_epi16(_mm256_maddubs_epi16(u, v), sv));
                }
            }
        }
        const __m128i tv = bits == 4 ? words8(tmin + b0, 1) : _mm_setzero_si128();
        for (int r = 0; r < R; r++) {
            const float dx = xd[(size_t)r * nsb + S];
            facc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[r]), _mm256_set1_ps(wd[S] * dx), facc[r]);
            if (bits == 4) {
                const __m128i bs = _mm_loadu_si128((const __m128i *)(xs + (size_t)r * nsb * SB + b0));
                macc[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_madd_epi16(tv, bs)), _mm_set1_ps(wm[S] * dx), macc[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) y[r * ys] = hsum(facc[r]) + hsum128(macc[r]);
}

#define TILE(BITS, R) rows_dot(codes + (size_t)n * rb, sub + (size_t)n * nsb * SB, \
                               tmin ? tmin + (size_t)n * nsb * SB : 0, wd + (size_t)n * nsb, \
                               wm ? wm + (size_t)n * nsb : 0, nb, BITS, xq + (size_t)m0 * K, \
                               xd + (size_t)m0 * nsb, xs + (size_t)m0 * nsb * SB, K, R, \
                               y + (size_t)m0 * N + n, N)

/* y [M, N] = activation rows (xq, xd, xs from quantize_rows) against N weight rows: codes,
   sub-scales sub [N, nsb*8] uint8, sub-minimums tmin [N, nsb*8] int8 (bits 4; NULL for 8), super-block
   scales wd and wm [N, nsb] float (wm NULL for 8). */
static void gemm_blocks(const uint8_t *codes, const uint8_t *sub, const int8_t *tmin, const float *wd,
                 const float *wm, int bits, int N, int K, const int8_t *xq, const float *xd,
                 const int16_t *xs, int M, float *y, int nt) {
    const int nb = K / QK, nsb = (nb + SB - 1) / SB;
    const size_t rb = bits == 4 ? (size_t)(nb + 1) / 2 * 32 : (size_t)nb * QK; /* code bytes a row */
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++) {
        for (int m0 = 0; m0 < M; m0 += RT) {
            const int R = M - m0 < RT ? M - m0 : RT;
            if (bits == 4) {
                switch (R) { case 8: TILE(4, 8); break; case 7: TILE(4, 7); break; case 6: TILE(4, 6); break;
                             case 5: TILE(4, 5); break; case 4: TILE(4, 4); break; case 3: TILE(4, 3); break;
                             case 2: TILE(4, 2); break; default: TILE(4, 1); }
            } else {
                switch (R) { case 8: TILE(8, 8); break; case 7: TILE(8, 7); break; case 6: TILE(8, 6); break;
                             case 5: TILE(8, 5); break; case 4: TILE(8, 4); break; case 3: TILE(8, 3); break;
                             case 2: TILE(8, 2); break; default: TILE(8, 1); }
            }
        }
    }
}

/* One call per forward: x's rows quantised into scratch of the calling thread (grown, never
   shared between threads), then multiplied. Why one call: a Linear's Python side (allocating
   the scratch tensors, reading their addresses, a second foreign call) cost ~40 µs of the ~55 a
   small call took, ~5 ms of a 1.5B step's 113 calls (2026-11-25, AVX2 EPYC). */
int block_mm(const float *x, int M, int K, const uint8_t *codes, const uint8_t *sub, const int8_t *tmin,
             const float *wd, const float *wm, int bits, int N, float *y, int nt) {
    static __thread int8_t *xq;
    static __thread float *xd;
    static __thread int16_t *xs;
    static __thread size_t capq, caps;
    const size_t nq = (size_t)M * K, ns = (size_t)M * ((K / QK + SB - 1) / SB);
    if (nq > capq) { free(xq); xq = malloc(nq); capq = xq ? nq : 0; }
    if (ns > caps) {
        free(xd); free(xs);
        xd = malloc(ns * sizeof(float));
        xs = malloc(ns * SB * sizeof(int16_t));
        caps = xd && xs ? ns : 0;
    }
    if (!capq || !caps) return -1; /* out of memory: the caller raises */
    quantize_rows(x, M, K, xq, xd, xs, nt);
    gemm_blocks(codes, sub, tmin, wd, wm, bits, N, K, xq, xd, xs, M, y, nt);
    return 0;
}

/* y = x * (1 / sqrt(mean(x^2) + eps)) * w, row by row: the Llama family's RMSNorm in one call where
   aten makes six (pow, mean, add, rsqrt, mul, mul). A row's sum never depends on M: row-exact. */
void rms_norm(const float *x, const float *w, float eps, int M, int K, float *y) {
    for (int m = 0; m < M; m++) {
        const float *v = x + (size_t)m * K;
        float *o = y + (size_t)m * K;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        int k = 0;
        for (; k + 16 <= K; k += 16) {
            const __m256 l0 = _mm256_loadu_ps(v + k), l1 = _mm256_loadu_ps(v + k + 8);
            a0 = _mm256_fmadd_ps(l0, l0, a0);
            a1 = _mm256_fmadd_ps(l1, l1, a1);
        }
        float ss = hsum(_mm256_add_ps(a0, a1));
        for (; k < K; k++) ss += v[k] * v[k];
        const float r = 1.f / sqrtf(ss / (float)K + eps);
        const __m256 rv = _mm256_set1_ps(r);
        for (k = 0; k + 8 <= K; k += 8)
            _mm256_storeu_ps(o + k, _mm256_mul_ps(_mm256_loadu_ps(w + k), _mm256_mul_ps(_mm256_loadu_ps(v + k), rv)));
        for (; k < K; k++) o[k] = w[k] * (v[k] * r);
    }
}
