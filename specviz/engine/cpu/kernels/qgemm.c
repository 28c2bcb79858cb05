/* Block-quantised GEMM for CPU decoding steps: y[m, n] = sum_k x[m, k] w[n, k].

   Weights in super-blocks of 8 blocks of 32, as GGUF's Q4_K: 4-bit codes q with w = D*s*q + Mn*t
   (s an 8-bit sub-scale, t an 8-bit sub-minimum per block, D and Mn per super-block), or 8-bit
   codes with w = D*s*q. Activations: each row quantised per super-block to int8 (one scale,
   amax/127) inside the call, row by row, so a row's bits never depend on the other rows. The
   dot of one row with one weight row is summed in the same order for any number of rows: a
   verify forward gives each token exactly its single-step logits.

   Why hand-written: torch's int4 CPU kernel reads well below the memory's speed
   (docs/why.md#qgemm-hand-written); this is llama.cpp's integer-dot layout, weight rows
   interleaved so that extra activation rows cost little, one weight read per call. One source,
   five builds (qgemm.py's ISAS, engine/cpu/arm.py's VARIANTS): AVX2, AVX-VNNI and AVX-512 VNNI on
   x86; NEON with dotprod, or with dotprod and i8mm, on Arm (kernels/qgemm_neon.h), each picked by
   its flags, all the same bits.

   Below the GEMM: the pieces of a Llama-family layer between its matmuls (RMSNorm, row-wise
   attention, the SiLU gate) and the whole layer built from them (engine/cpu/kernel_layer.py). */
#ifndef __aarch64__
#include <immintrin.h>
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define QK 32 /* weights per block */
#define SB 8  /* blocks per super-block */
/* Activation rows a pass over a weight group (the group stays in L1 for the next pass): an int32
   accumulator a row, 16 of AVX-512's 32 vector registers; 8 on AVX2, where 4 made a 5-row verify
   two passes (docs/why.md#qgemm-rt). */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define RT 16
#else
#define RT 8
#endif
/* Code bytes read ahead of the one in use (a software prefetch per 64-byte line): PF_FAR for a
   step or verify, whose rows take longer per line; PF for a prompt, which re-reads weight chunks
   per row tile (docs/why.md#qgemm-pf). */
#define PF 1536
#define PF_FAR 32768
/* Weight rows a chunk when a call has more rows than a tile (a prompt; docs/why.md#qgemm-nc). */
#define NC 256
#define INLINE static inline __attribute__((always_inline))

#ifndef __aarch64__ /* Arm: kernels/qgemm_neon.h's, after GR */
static inline float hsum128(__m128 s) {
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float hsum(__m256 v) {
    return hsum128(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
}

/* The 4 / 8 int32 lanes of v summed (exact). */
INLINE int isum4(__m128i v) {
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(v, _mm_shuffle_epi32(v, 0xB1)));
}

INLINE int isum8(__m256i v) {
    return isum4(_mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}

static inline float hsum_max(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

/* x [M, K] float -> per row and super-block of up to 256 values: xq int8 [M, K], one scale
   (amax/127) and the sum of each 32-block's codes, stored super-block-major for the GEMM's
   row tiles: xd [nsb, Mp] float and xs [nsb, Mp, 8] int16 (Mp = M rounded up to RT; padding rows
   and blocks past the last are zero). Row by row: a row's codes never depend on another row. */
static void quantize_rows(const float *x, int M, int Mp, int K, int8_t *xq, float *xd, int16_t *xs, int nt) {
    const int nb = K / QK, nsb = (nb + SB - 1) / SB;
#pragma omp parallel for num_threads(nt) schedule(static) if (M * nsb > 64)
    for (int i = 0; i < Mp * nsb; i++) {
        const int row = i / nsb, sb = i % nsb, b0 = sb * SB, ns = nb - b0 < SB ? nb - b0 : SB;
        int16_t *bs = xs + ((size_t)sb * Mp + row) * SB;
        if (row >= M) {
            for (int b = 0; b < SB; b++) bs[b] = 0;
            xd[(size_t)sb * Mp + row] = 0.f;
            continue;
        }
        const float *v = x + (size_t)row * K + (size_t)b0 * QK;
        int8_t *q = xq + (size_t)row * K + (size_t)b0 * QK;
        const __m256 sign = _mm256_set1_ps(-0.f);
        __m256 am = _mm256_setzero_ps();
        for (int j = 0; j < ns * QK; j += 8) /* |v| first: a NaN is passed over, as fmaxf does */
            am = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(v + j)), am);
        const float amax = hsum_max(am), d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
        const __m256 idv = _mm256_set1_ps(id);
        for (int b = 0; b < SB; b++) {
            if (b >= ns) { bs[b] = 0; continue; }
            __m256i c[4];
            for (int t = 0; t < 4; t++) /* round half to even, as nearbyintf in the default mode */
                c[t] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(v + b * QK + 8 * t), idv),
                                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
            _mm256_storeu_si256((__m256i *)(q + b * QK),
                                _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
            bs[b] = (int16_t)isum8(_mm256_add_epi32(_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3])));
        }
        xd[(size_t)sb * Mp + row] = d;
    }
}
#endif

/* ------------------------------------------------------------------ the GEMM
   Weight rows in groups of GR = 16, interleaved (qgemm.py's _interleave): lane i of a 64-byte chunk
   (4 bytes) is weight row i, so a vector's 32-bit lanes are output columns. A row's sums never
   cross lanes (no horizontal sums), and each activation row is read as 4-byte broadcasts (an
   operand of the multiply itself on AVX-512), not reloaded for every weight row. A group holds, per
   block b of 32 weights:
   - bits 4: four chunks of 8 weights, 64 bytes each: row i's 4 bytes at 4i, byte t = q[8c + t] |
     q[8c + 4 + t] << 4 (low nibbles: weights 0-3 of the chunk, high: 4-7);
   - bits 8: eight chunks of 4 weights, 64 bytes each: row i's 4 signed codes at 4i;
   - sub [nsb*8 blocks][16 rows] uint8; per super-block S: tmin [4 block pairs][16 rows][2] int8
     (bits 4), wd and wm [16 rows] float.
   Per block and activation row the integer dot is summed exactly in an int32 lane, weighted by the
   block's sub-scale, and per super-block converted to float once: every variant sums the same
   integers and does the same float operations, so every variant's output is the same bits, and a
   row's bits never depend on the other rows (row-exact). */
#define GR 16

INLINE int32_t load4(const void *p) { int32_t v; __builtin_memcpy(&v, p, 4); return v; }

#if defined(__aarch64__)
#include "qgemm_neon.h"
#elif defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* AVX-512 VNNI: a chunk is one zmm; vpdpbusd multiplies and sums 4 bytes a lane. */
#define KERNEL_ISA "avx512vnni"
#define VNNI_XU 1 /* 8-bit codes take the activations + 128 (xu) as vpdpbusd's unsigned side */

INLINE __m512i bc4(const void *p) { return _mm512_set1_epi32(load4(p)); }

/* Group g's 16 weight rows against R activation rows: y[r * ys + i] for i < nv. */
INLINE void group_dot(const uint8_t *codes, const uint8_t *sub, const int8_t *tmin, const float *wd,
                      const float *wm, int nb, int bits, const int8_t *xq, const uint8_t *xu, const float *xd,
                      const int16_t *xs, int K, int Mp, int R, float *y, size_t ys, int nv, int pf) {
    const int nsb = (nb + SB - 1) / SB;
    const __m512i z = _mm512_setzero_si512(), m4 = _mm512_set1_epi8(0x0F), h80 = _mm512_set1_epi8((char)0x80);
    __m512 facc[RT], macc[RT];
    for (int r = 0; r < R; r++) facc[r] = macc[r] = _mm512_setzero_ps();
    for (int S = 0; S < nsb; S++) {
        const int b0 = S * SB, ns = nb - b0 < SB ? nb - b0 : SB;
        __m512i acc[RT];
        for (int r = 0; r < R; r++) acc[r] = z;
        for (int b = b0; b < b0 + ns; b++) {
            const __m512i sv = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sub + b * GR)));
            if (bits == 4) {
                const uint8_t *c = codes + (size_t)b * 256;
                __m512i lo[4], hi[4];
                for (int q = 0; q < 4; q++) {
                    _mm_prefetch((const char *)c + 64 * q + pf, _MM_HINT_T0);
                    const __m512i raw = _mm512_loadu_si512(c + 64 * q);
                    lo[q] = _mm512_and_si512(raw, m4);
                    hi[q] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
                }
                for (int r = 0; r < R; r++) {
                    const int8_t *x = xq + (size_t)r * K + (size_t)b * QK;
                    __m512i t = z;
                    for (int q = 0; q < 4; q++)
                        t = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(t, lo[q], bc4(x + 8 * q)), hi[q], bc4(x + 8 * q + 4));
                    acc[r] = _mm512_add_epi32(acc[r], _mm512_mullo_epi32(t, sv));
                }
            } else { /* signed codes: activations + 128 as the unsigned side, minus 128 * the codes' sum */
                const uint8_t *c = codes + (size_t)b * 512;
                __m512i w[8], corr = z;
                for (int q = 0; q < 8; q++) {
                    _mm_prefetch((const char *)c + 64 * q + pf, _MM_HINT_T0);
                    w[q] = _mm512_loadu_si512(c + 64 * q);
                    corr = _mm512_dpbusd_epi32(corr, h80, w[q]);
                }
                for (int r = 0; r < R; r++) {
                    const uint8_t *x = xu + (size_t)r * K + (size_t)b * QK;
                    __m512i t = z;
                    for (int q = 0; q < 8; q++) t = _mm512_dpbusd_epi32(t, bc4(x + 4 * q), w[q]);
                    acc[r] = _mm512_add_epi32(acc[r], _mm512_mullo_epi32(_mm512_sub_epi32(t, corr), sv));
                }
            }
        }
        /* converted, scaled by D * the activation row's scale, added: once per super-block */
        const __m512 wdv = _mm512_loadu_ps(wd + S * GR);
        for (int r = 0; r < R; r++)
            facc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r]), _mm512_mul_ps(wdv, _mm512_set1_ps(xd[(size_t)S * Mp + r])), facc[r]);
        if (bits == 4) { /* the sub-minimums: sum_b t_b * (the row's block code sums), a pair of blocks a step */
            const int8_t *tm = tmin + (size_t)S * 128;
            __m512i T[4];
            for (int j = 0; j < 4; j++) T[j] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(tm + 32 * j)));
            const __m512 wmv = _mm512_loadu_ps(wm + S * GR);
            for (int r = 0; r < R; r++) {
                const int16_t *bs = xs + ((size_t)S * Mp + r) * SB;
                __m512i m = z;
                for (int j = 0; j < 4; j++) m = _mm512_dpwssd_epi32(m, T[j], bc4(bs + 2 * j));
                macc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m), _mm512_mul_ps(wmv, _mm512_set1_ps(xd[(size_t)S * Mp + r])), macc[r]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        _mm512_mask_storeu_ps(y + r * ys, (__mmask16)((1u << nv) - 1), _mm512_add_ps(facc[r], macc[r]));
}
#else
/* AVX2 and AVX-VNNI: a chunk is two 32-byte halves (rows 0-7, rows 8-15). */
#ifdef __AVXVNNI__
#define KERNEL_ISA "avxvnni"
#define VNNI_XU 1
#else
#define KERNEL_ISA "avx2"
#define VNNI_XU 0
#endif

INLINE __m256i bc4(const void *p) { return _mm256_broadcastd_epi32(_mm_loadu_si32(p)); }

INLINE __m256i dpw(__m256i acc, __m256i a, __m256i b) { /* int16 pairs' products summed into int32 */
#ifdef __AVXVNNI__
    return _mm256_dpwssd_avx_epi32(acc, a, b);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

/* Group g's 16 weight rows against R activation rows, as two halves e (rows 8e .. 8e + 7) in one
   pass: each code line is read once. The half count is a constant, so the accumulators stay in
   registers (docs/why.md#qgemm-halves). */
INLINE void group_dot(const uint8_t *codes, const uint8_t *sub, const int8_t *tmin, const float *wd,
                      const float *wm, int nb, int bits, const int8_t *xq, const uint8_t *xu, const float *xd,
                      const int16_t *xs, int K, int Mp, int R, float *y, size_t ys, int nv, int pf) {
    const int nsb = (nb + SB - 1) / SB;
    const __m256i z = _mm256_setzero_si256(), m4 = _mm256_set1_epi8(0x0F);
    __m256 facc[2][RT], macc[2][RT];
    for (int e = 0; e < 2; e++)
        for (int r = 0; r < R; r++) facc[e][r] = macc[e][r] = _mm256_setzero_ps();
    for (int S = 0; S < nsb; S++) {
        const int b0 = S * SB, ns = nb - b0 < SB ? nb - b0 : SB;
        __m256i acc[2][RT];
        for (int e = 0; e < 2; e++)
            for (int r = 0; r < R; r++) acc[e][r] = z;
        for (int b = b0; b < b0 + ns; b++)
            for (int e = 0; e < 2; e++) {
#ifndef __AVXVNNI__
                /* each half broadcasts its own activations (docs/why.md#qgemm-broadcast) */
                __asm__ volatile("" ::: "memory");
#endif
                const __m256i sv = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sub + b * GR + 8 * e)));
                /* chunk by chunk, each row's partial sums of the block kept in registers */
                __m256i part[RT];
                for (int r = 0; r < R; r++) part[r] = z;
                if (bits == 4) {
                    const uint8_t *c = codes + (size_t)b * 256 + 32 * e;
                    for (int q = 0; q < 4; q++) {
                        if (e == 0) _mm_prefetch((const char *)c + 64 * q + pf, _MM_HINT_T0);
                        const __m256i raw = _mm256_loadu_si256((const __m256i *)(c + 64 * q));
                        const __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
                        for (int r = 0; r < R; r++) {
                            const int8_t *x = xq + (size_t)r * K + (size_t)b * QK + 8 * q;
#ifdef __AVXVNNI__
                            part[r] = _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(part[r], lo, bc4(x)), hi, bc4(x + 4));
#else /* int16 sums of the block's eight products a word (at most 16 * 15 * 127) */
                            part[r] = _mm256_add_epi16(part[r], _mm256_add_epi16(_mm256_maddubs_epi16(lo, bc4(x)),
                                                                                 _mm256_maddubs_epi16(hi, bc4(x + 4))));
#endif
                        }
                    }
                    for (int r = 0; r < R; r++)
#ifdef __AVXVNNI__
                        acc[e][r] = _mm256_add_epi32(acc[e][r], _mm256_mullo_epi32(part[r], sv));
#else /* one multiply-add by the sub-scale */
                        acc[e][r] = _mm256_add_epi32(acc[e][r], _mm256_madd_epi16(part[r], _mm256_or_si256(sv, _mm256_slli_epi32(sv, 16))));
#endif
                } else {
                    const uint8_t *c = codes + (size_t)b * 512 + 32 * e;
#if VNNI_XU
                    __m256i corr = z;
#else
                    const __m256i sw = _mm256_or_si256(sv, _mm256_slli_epi32(sv, 16)); /* (s, s) word pairs */
#endif
                    for (int q = 0; q < 8; q++) {
                        if (e == 0) _mm_prefetch((const char *)c + 64 * q + pf, _MM_HINT_T0);
                        const __m256i w = _mm256_loadu_si256((const __m256i *)(c + 64 * q));
#if VNNI_XU /* the activations + 128 against signed codes, minus 128 * the codes' sum */
                        corr = _mm256_dpbusd_avx_epi32(corr, _mm256_set1_epi8((char)0x80), w);
                        for (int r = 0; r < R; r++)
                            part[r] = _mm256_dpbusd_avx_epi32(part[r], bc4(xu + (size_t)r * K + (size_t)b * QK + 4 * q), w);
#else /* |w| times x with w's sign: pairs at most 2 * 127 * 127 */
                        const __m256i u = _mm256_sign_epi8(w, w);
                        for (int r = 0; r < R; r++)
                            part[r] = dpw(part[r], _mm256_maddubs_epi16(u, _mm256_sign_epi8(bc4(xq + (size_t)r * K + (size_t)b * QK + 4 * q), w)), sw);
#endif
                    }
                    for (int r = 0; r < R; r++)
#if VNNI_XU
                        acc[e][r] = _mm256_add_epi32(acc[e][r], _mm256_mullo_epi32(_mm256_sub_epi32(part[r], corr), sv));
#else
                        acc[e][r] = _mm256_add_epi32(acc[e][r], part[r]);
#endif
                }
            }
        for (int e = 0; e < 2; e++) {
            const __m256 wdv = _mm256_loadu_ps(wd + S * GR + 8 * e);
            for (int r = 0; r < R; r++)
                facc[e][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[e][r]), _mm256_mul_ps(wdv, _mm256_set1_ps(xd[(size_t)S * Mp + r])), facc[e][r]);
            if (bits == 4) {
                const int8_t *tm = tmin + (size_t)S * 128 + 16 * e;
                __m256i T[4];
                for (int j = 0; j < 4; j++) T[j] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(tm + 32 * j)));
                const __m256 wmv = _mm256_loadu_ps(wm + S * GR + 8 * e);
                for (int r = 0; r < R; r++) {
                    const int16_t *bs = xs + ((size_t)S * Mp + r) * SB;
                    __m256i m = z;
                    for (int j = 0; j < 4; j++) m = dpw(m, T[j], bc4(bs + 2 * j));
                    macc[e][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(wmv, _mm256_set1_ps(xd[(size_t)S * Mp + r])), macc[e][r]);
                }
            }
        }
    }
    for (int e = 0; e < 2; e++) {
        const int left = nv - 8 * e;
        for (int r = 0; r < R; r++) {
            const __m256 o = _mm256_add_ps(facc[e][r], macc[e][r]);
            if (left >= 8) _mm256_storeu_ps(y + r * ys + 8 * e, o);
            else {
                float t[8];
                _mm256_storeu_ps(t, o);
                for (int i = 0; i < left; i++) y[r * ys + 8 * e + i] = t[i];
            }
        }
    }
}
#endif

#define TILE(BITS, R) group_dot(codes + (size_t)g * gb, sub + (size_t)g * nsb * SB * GR, \
                                tmin ? tmin + (size_t)g * nsb * 128 : 0, wd + (size_t)g * nsb * GR, \
                                wm ? wm + (size_t)g * nsb * GR : 0, nb, BITS, xq + (size_t)m0 * K, \
                                xu ? xu + (size_t)m0 * K : 0, \
                                xd + m0, xs + (size_t)m0 * SB, K, Mp, R, y + (size_t)m0 * N + (size_t)g * GR, N, \
                                N - g * GR < GR ? N - g * GR : GR, pf)

/* Group g against activation rows m0 .. m0 + R - 1 (R <= RT, a constant in each case). */
INLINE void tile(const uint8_t *codes, const uint8_t *sub, const int8_t *tmin, const float *wd,
                 const float *wm, int bits, int N, int K, int nb, int nsb, size_t gb, const int8_t *xq, const uint8_t *xu,
                 const float *xd, const int16_t *xs, int Mp, float *y, int g, int m0, int R, int pf) {
#if RT > 8
#define WIDE(BITS) case 16: TILE(BITS, 16); break; case 15: TILE(BITS, 15); break; case 14: TILE(BITS, 14); break; \
    case 13: TILE(BITS, 13); break; case 12: TILE(BITS, 12); break; case 11: TILE(BITS, 11); break; \
    case 10: TILE(BITS, 10); break; case 9: TILE(BITS, 9); break;
#else
#define WIDE(BITS)
#endif
#define CASES(BITS) switch (R) { WIDE(BITS) case 8: TILE(BITS, 8); break; \
    case 7: TILE(BITS, 7); break; case 6: TILE(BITS, 6); break; case 5: TILE(BITS, 5); break; \
    case 4: TILE(BITS, 4); break; case 3: TILE(BITS, 3); break; case 2: TILE(BITS, 2); break; \
    default: TILE(BITS, 1); }
    if (bits == 4) CASES(4) else CASES(8)
#undef CASES
#undef WIDE
}

/* y [M, N] = activation rows (xq, xd, xs from quantize_rows) against N weight rows in groups of GR
   (the layout above). */
static void gemm_blocks(const uint8_t *codes, const uint8_t *sub, const int8_t *tmin, const float *wd,
                 const float *wm, int bits, int N, int K, const int8_t *xq, const uint8_t *xu, const float *xd,
                 const int16_t *xs, int M, float *y, int nt) {
    const int nb = K / QK, nsb = (nb + SB - 1) / SB, Mp = (M + RT - 1) / RT * RT, ng = (N + GR - 1) / GR;
    const size_t gb = (size_t)nb * (bits == 4 ? 256 : 512); /* code bytes a group */
    /* One tile or less (a step, a verify): every weight row against it, one weight read per call.
       More (a prompt): weight rows in chunks of NC, each chunk against every row tile, so a tile's
       activation codes stay near the core across the chunk. */
    /* Rows handed out in shrinking runs (guided), chunks one at a time (dynamic): even static halves
       left one thread waiting (docs/why.md#qgemm-schedule). */
    if (M <= RT) {
#pragma omp parallel for num_threads(nt) schedule(guided, 1)
        for (int g = 0; g < ng; g++) tile(codes, sub, tmin, wd, wm, bits, N, K, nb, nsb, gb, xq, xu, xd, xs, Mp, y, g, 0, M, PF_FAR);
        return;
    }
    const int nch = (ng + NC / GR - 1) / (NC / GR), cw = (ng + nch - 1) / nch;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int c = 0; c < nch; c++) /* chunks of <= NC weight rows */
        for (int m0 = 0; m0 < M; m0 += RT)
            for (int g = c * cw; g < ng && g < (c + 1) * cw; g++)
                tile(codes, sub, tmin, wd, wm, bits, N, K, nb, nsb, gb, xq, xu, xd, xs, Mp, y, g, m0,
                     M - m0 < RT ? M - m0 : RT, PF);
}

/* One call per forward: x's rows quantised into scratch of the calling thread (grown, never
   shared between threads), then multiplied; a second call's Python side cost most of a small
   call (docs/why.md#qgemm-one-call). */
int block_mm(const float *x, int M, int K, const uint8_t *codes, const uint8_t *sub, const int8_t *tmin,
             const float *wd, const float *wm, int bits, int N, float *y, int nt) {
    static __thread int8_t *xq;
    static __thread float *xd;
    static __thread int16_t *xs;
    static __thread size_t capq, caps;
    const int Mp = (M + RT - 1) / RT * RT;
    const size_t nq = (size_t)M * K, ns = (size_t)Mp * ((K / QK + SB - 1) / SB);
    if (nq > capq) { free(xq); xq = malloc(nq); capq = xq ? nq : 0; }
    if (ns > caps) {
        free(xd); free(xs);
        xd = malloc(ns * sizeof(float));
        xs = malloc(ns * SB * sizeof(int16_t));
        caps = xd && xs ? ns : 0;
    }
    if (!capq || !caps) return -1; /* out of memory: the caller raises */
    quantize_rows(x, M, Mp, K, xq, xd, xs, nt);
    const uint8_t *u = 0;
#if VNNI_XU
    if (bits == 8) { /* the activations + 128, vpdpbusd's unsigned side for signed codes */
        static __thread uint8_t *xu;
        static __thread size_t capu;
        if (nq > capu) { free(xu); xu = malloc(nq); capu = xu ? nq : 0; }
        if (!capu) return -1;
        for (size_t i = 0; i < nq; i++) xu[i] = (uint8_t)xq[i] ^ 0x80;
        u = xu;
    }
#endif
    gemm_blocks(codes, sub, tmin, wd, wm, bits, N, K, xq, u, xd, xs, M, y, nt);
    return 0;
}

/* Rows split between threads only where a call has many (a prompt): each row's arithmetic is the same
   whichever thread runs it. Why: alone, one thread ran a prompt's norms, rotary, SiLU and residual
   adds while the other waited (docs/why.md#qgemm-rows). */
#define ROWS_PAR(M, W) ((size_t)(M) * (size_t)(W) > 65536 && (M) > 1)

/* y = x * (1 / sqrt(mean(x^2) + eps)) * w, row by row: the Llama family's RMSNorm in one call where
   aten makes six (pow, mean, add, rsqrt, mul, mul). A row's sum never depends on M: row-exact. */
static void rms_rows(const float *x, const float *w, float eps, int M, int K, float *y, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static) if (ROWS_PAR(M, K))
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

void rms_norm(const float *x, const float *w, float eps, int M, int K, float *y) { rms_rows(x, w, eps, M, K, y, 1); }

/* e^x for 8 floats (Cephes' polynomial on x - n ln2, scaled by 2^n; |error| ~2 ulp, 0 below
   e^-87.3). Deterministic: the same bits whatever the caller, unlike aten's, which differs
   between its SIMD width builds. */
static inline __m256 exp256(__m256 x) {
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f)), _mm256_set1_ps(-87.3365478515625f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500E-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

static inline float exp1(float x) {
    return _mm256_cvtss_f32(exp256(_mm256_set1_ps(x)));
}

/* y [M, I] = silu(g) * u for rows gu [M, 2I] = [g | u]: the family's gated MLP activation in one
   call where aten makes four (split, silu, mul and an allocation each). */
static void silu_rows(const float *gu, int M, int I, float *y, int nt) {
    const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
#pragma omp parallel for num_threads(nt) schedule(static) if (ROWS_PAR(M, I))
    for (int m = 0; m < M; m++) {
        const float *g = gu + (size_t)m * 2 * I, *u = g + I;
        float *o = y + (size_t)m * I;
        int i = 0;
        for (; i + 8 <= I; i += 8) {
            const __m256 x = _mm256_loadu_ps(g + i);
            const __m256 s = _mm256_div_ps(x, _mm256_add_ps(one, exp256(_mm256_sub_ps(zero, x))));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
        }
        for (; i < I; i++) o[i] = g[i] / (1.f + exp1(-g[i])) * u[i];
    }
}

void silu_mul(const float *gu, int M, int I, float *y) { silu_rows(gu, M, I, y, 1); }

#define KT 64 /* keys a tile: a kv head's tile of keys (64 x d floats) stays in L1 for its group's heads */
#define GMAX 16 /* query heads sharing a kv head, at most (larger groups: SDPA) */
#define ROWWISE_MAX 32 /* rows of a tree forward, at most (engine/cpu/rowwise_attention.py's ROWWISE_MAX) */

/* Where key j of a row sits in the cache: j itself below base (a causal prefix), else idx[j - base]
   (a tree's ancestors, in cache order). A chain row has base = L. */
typedef struct { int base; const int *idx; } keys_t;

INLINE long kpos(keys_t m, int j) { return j < m.base ? j : m.idx[j - m.base]; }

/* q·k_j * scale for keys j0..j1 of one query head into s (four keys a pass, four independent
   sums; each key's dot is the same 8-wide sum whatever its place, so it never depends on L, nor
   on where in the cache the key sits). */
static void scores(const float *q, const float *k, long ks, keys_t m, int j0, int j1, int d, float scale, float *s) {
    int j = j0;
    for (; j + 4 <= j1; j += 4) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        const float *k0 = k + kpos(m, j) * ks, *k1 = k + kpos(m, j + 1) * ks;
        const float *k2 = k + kpos(m, j + 2) * ks, *k3 = k + kpos(m, j + 3) * ks;
        for (int i = 0; i < d; i += 8) {
            const __m256 x = _mm256_loadu_ps(q + i);
            a0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k0 + i), a0);
            a1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k1 + i), a1);
            a2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k2 + i), a2);
            a3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k3 + i), a3);
        }
        s[j] = hsum(a0) * scale; s[j + 1] = hsum(a1) * scale;
        s[j + 2] = hsum(a2) * scale; s[j + 3] = hsum(a3) * scale;
    }
    for (; j < j1; j++) {
        __m256 a0 = _mm256_setzero_ps();
        const float *k0 = k + kpos(m, j) * ks;
        for (int i = 0; i < d; i += 8)
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k0 + i), a0);
        s[j] = hsum(a0) * scale;
    }
}

/* s[0..L) -> e^(s - max), returns their sum (8 lanes, then the tail, in a fixed order). */
static float softmax_num(float *s, int L) {
    float mx = s[0];
    for (int j = 1; j < L; j++) mx = s[j] > mx ? s[j] : mx;
    const __m256 m8 = _mm256_set1_ps(mx);
    __m256 sv = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= L; j += 8) {
        const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), m8));
        _mm256_storeu_ps(s + j, e);
        sv = _mm256_add_ps(sv, e);
    }
    float sum = hsum(sv);
    for (; j < L; j++) { s[j] = exp1(s[j] - mx); sum += s[j]; }
    return sum;
}

/* o += sum over keys j0..j1 of p_j v_j, each output lane summed in key order (o read and written
   back per tile: the same sums as one pass). */
static void weigh(const float *p, const float *v, long vs, keys_t m, int j0, int j1, int d, float *o) {
    int c = 0;
    for (; c + 64 <= d; c += 64) { /* eight independent sums */
        __m256 acc[8];
        for (int t = 0; t < 8; t++) acc[t] = _mm256_loadu_ps(o + c + 8 * t);
        for (int j = j0; j < j1; j++) {
            const __m256 e = _mm256_set1_ps(p[j]);
            const float *vj = v + kpos(m, j) * vs + c;
            for (int t = 0; t < 8; t++) acc[t] = _mm256_fmadd_ps(e, _mm256_loadu_ps(vj + 8 * t), acc[t]);
        }
        for (int t = 0; t < 8; t++) _mm256_storeu_ps(o + c + 8 * t, acc[t]);
    }
    for (; c < d; c += 8) {
        __m256 acc = _mm256_loadu_ps(o + c);
        for (int j = j0; j < j1; j++) acc = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(v + kpos(m, j) * vs + c), acc);
        _mm256_storeu_ps(o + c, acc);
    }
}

/* The G query heads of one kv head, one row, against its first L keys, tile by tile so each key
   and value row is read from memory once for the group. s: scratch for G x L scores. */
static void attend_group(const float *q, long qh, const float *k, const float *v, long ks, long vs, int G,
                         int L, keys_t m, int d, float scale, float *s, float *o) {
    for (int i = 0; i < G * d; i++) o[i] = 0.f;
    if (L <= 0) return;
    for (int j0 = 0; j0 < L; j0 += KT) {
        const int j1 = j0 + KT < L ? j0 + KT : L;
        for (int h = 0; h < G; h++) scores(q + h * qh, k, ks, m, j0, j1, d, scale, s + (size_t)h * L);
    }
    float inv[GMAX];
    for (int h = 0; h < G; h++) inv[h] = 1.f / softmax_num(s + (size_t)h * L, L);
    for (int j0 = 0; j0 < L; j0 += KT) {
        const int j1 = j0 + KT < L ? j0 + KT : L;
        for (int h = 0; h < G; h++) weigh(s + (size_t)h * L, v, vs, m, j0, j1, d, o + (size_t)h * d);
    }
    for (int h = 0; h < G; h++) {
        const __m256 iv = _mm256_set1_ps(inv[h]);
        for (int c = 0; c < d; c += 8) _mm256_storeu_ps(o + h * d + c, _mm256_mul_ps(_mm256_loadu_ps(o + h * d + c), iv));
    }
}

/* Row-wise attention: out [n, hq, d] (contiguous) with row r's query head h (q + r*qr + h*qh)
   attending to the first ends[r] keys of kv head g = h / (hq / hkv) (k + g*kh + j*kr, v alike).
   d % 8 == 0, hq / hkv <= GMAX. Each (row, head) is computed alone, so a row's output is the same
   whatever the other rows: a verify forward's rows are a one-token step's bits. A tree's rows
   (base, xidx not NULL): row r sees keys 0 .. base[r] - 1, then the ends[r] - base[r] positions
   next in xidx (its ancestors, in cache order): the keys a chain along its path holds, in the same
   order, so the same bits. Returns -1 if out of scratch memory. */
int attend_rows(const float *q, long qr, long qh, const float *k, long kr, long kh, const float *v, long vr,
                long vh, const int *ends, const int *base, const int *xidx, int n, int hq, int hkv, int d,
                float scale, float *out, int nt) {
    int lmax = 1, bad = 0, off[ROWWISE_MAX + 1];
    if (base && n > ROWWISE_MAX) return -1;
    for (int r = 0; r < n; r++) lmax = ends[r] > lmax ? ends[r] : lmax;
    if (base)
        for (int r = 0, o = 0; r < n; r++) { off[r] = o; o += ends[r] - base[r]; }
    const int G = hq / hkv;
    const long work = (long)n * hq * lmax * d;
#pragma omp parallel num_threads(nt) if (work > 65536) reduction(| : bad)
    {
        float *s = malloc((size_t)G * lmax * sizeof(float));
        if (!s) bad = 1;
#pragma omp for schedule(static)
        for (int t = 0; t < n * hkv; t++) {
            const int r = t / hkv, g = t % hkv;
            const keys_t m = {base ? base[r] : ends[r], base ? xidx + off[r] : 0};
            if (s) attend_group(q + r * qr + g * G * qh, qh, k + g * kh, v + g * vh, kr, vr, G, ends[r], m, d, scale,
                                s, out + ((size_t)r * hq + g * G) * d);
        }
        free(s);
    }
    return bad ? -1 : 0;
}

/* ------------------------------------------------------------------ a whole decoder layer
   The Llama family's layer for n rows in two calls around the KV cache's update (the cache stays
   Python's: transformers' DynamicCache or our StaticKV). Each piece is the same C code, in the
   same order, as the module path (KernelRMSNorm, BlockLinear, attend_rows, silu_mul) and the
   elementwise steps are the same single IEEE operations as aten's (the file is built with
   -ffp-contract=off, so no multiply and add are fused): bit for bit the module path's result. */

typedef struct { /* one BlockLinear's packed buffers */
    const uint8_t *codes, *sub;
    const int8_t *tmin;
    const float *wd, *wm, *bias;
    int bits, n, k;
} lin_t;

typedef struct {
    const float *ln1, *ln2; /* the two RMSNorm weights */
    float eps1, eps2, scale;
    lin_t qkv, o, gu, down;
    int hq, hkv, d, inter;
} layer_t;

static int linear(const lin_t *w, const float *x, int M, float *y, int nt) {
    if (block_mm(x, M, w->k, w->codes, w->sub, w->tmin, w->wd, w->wm, w->bits, w->n, y, nt)) return -1;
    if (w->bias)
        for (int m = 0; m < M; m++)
            for (int i = 0; i < w->n; i++) y[(size_t)m * w->n + i] += w->bias[i];
    return 0;
}

/* qkv [n, (hq + 2 hkv) d] = the layer's rotated q and k and its v for rows h [n, hidden]:
   norm, projection (+ bias), then rotary on q and k with cos, sin [n, d]:
   x*cos + rotate_half(x)*sin, rotate_half(x) = (-x[d/2:], x[:d/2]). */
int layer_pre(const layer_t *L, const float *h, int n, const float *cos, const float *sin, float *qkv, int nt) {
    const int hidden = L->qkv.k, d = L->d, half = d / 2, w = L->qkv.n;
    float *x = malloc((size_t)n * hidden * sizeof(float));
    if (!x) return -1;
    rms_rows(h, L->ln1, L->eps1, n, hidden, x, nt);
    const int bad = linear(&L->qkv, x, n, qkv, nt);
    free(x);
    if (bad) return -1;
#pragma omp parallel for num_threads(nt) schedule(static) if (ROWS_PAR(n, w))
    for (int r = 0; r < n; r++)
        for (int hd = 0; hd < L->hq + L->hkv; hd++) {
            float *v = qkv + (size_t)r * w + (size_t)hd * d, t[512];
            const float *c = cos + (size_t)r * d, *s = sin + (size_t)r * d;
            for (int i = 0; i < half; i++) t[i] = v[i] * c[i] + (-v[i + half]) * s[i];
            for (int i = half; i < d; i++) t[i] = v[i] * c[i] + v[i - half] * s[i];
            for (int i = 0; i < d; i++) v[i] = t[i];
        }
    return 0;
}

/* h += o, n values (a prompt's split between threads). */
static void add_rows(float *h, const float *o, size_t n, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static) if (ROWS_PAR(n, 1))
    for (size_t i = 0; i < n; i++) h[i] = h[i] + o[i];
}

/* h [n, hidden] += the layer's attention output and then its MLP's, in place: q from layer_pre's
   qkv, keys and values the cache's (strides as attend_rows), row r seeing ends[r] keys. */
int layer_post(const layer_t *L, float *h, int n, const float *qkv, const float *k, long kr, long kh,
               const float *v, long vr, long vh, const int *ends, const int *base, const int *xidx, int nt) {
    const int hidden = L->o.n, hd = L->hq * L->d, w = L->qkv.n, I = L->inter;
    float *a = malloc((size_t)n * hd * sizeof(float)), *o = malloc((size_t)n * hidden * sizeof(float));
    float *gu = malloc((size_t)n * 2 * I * sizeof(float)), *act = malloc((size_t)n * I * sizeof(float));
    int bad = !a || !o || !gu || !act;
    if (!bad) bad = attend_rows(qkv, w, L->d, k, kr, kh, v, vr, vh, ends, base, xidx, n, L->hq, L->hkv, L->d,
                                L->scale, a, nt);
    if (!bad) bad = linear(&L->o, a, n, o, nt);
    if (!bad) {
        add_rows(h, o, (size_t)n * hidden, nt);
        rms_rows(h, L->ln2, L->eps2, n, hidden, o, nt);
        bad = linear(&L->gu, o, n, gu, nt);
    }
    if (!bad) {
        silu_rows(gu, n, I, act, nt);
        bad = linear(&L->down, act, n, o, nt);
    }
    if (!bad) add_rows(h, o, (size_t)n * hidden, nt);
    free(a); free(o); free(gu); free(act);
    return bad ? -1 : 0;
}

/* Every layer of one forward in one call, each as layer_pre, its n new keys and values copied into
   the cache at positions p .. p+n-1, then layer_post with row r seeing p + r + 1 keys (a tree's
   rows: tends[r] keys, base and xidx as attend_rows). Layer i's
   keys are kb[i] + g*kh + j*kr for kv head g and position j (values vb[i], same strides), with
   room for p + n positions. Why: Python between a layer's calls cost more than the layer's
   attention (docs/why.md#qgemm-layers). */
int layers_forward(const layer_t *Ls, int nl, float *h, int n, const float *cos, const float *sin,
                   float *const *kb, float *const *vb, long kr, long kh, int p, const int *tends,
                   const int *base, const int *xidx, int nt) {
    int bad = 0, wmax = 0;
    for (int i = 0; i < nl; i++) wmax = Ls[i].qkv.n > wmax ? Ls[i].qkv.n : wmax;
    float *qkv = malloc((size_t)n * wmax * sizeof(float));
    int *ends = malloc((size_t)n * sizeof(int));
    if (!qkv || !ends) bad = 1;
    for (int r = 0; !bad && r < n; r++) ends[r] = tends ? tends[r] : p + r + 1; /* a tree's rows: their own */
    for (int i = 0; !bad && i < nl; i++) {
        const layer_t *L = Ls + i;
        const int d = L->d, w = L->qkv.n;
        if ((bad = layer_pre(L, h, n, cos, sin, qkv, nt))) break;
        for (int r = 0; r < n; r++)
            for (int g = 0; g < L->hkv; g++) {
                const float *src = qkv + (size_t)r * w + (size_t)(L->hq + g) * d;
                float *kd = kb[i] + g * kh + (long)(p + r) * kr, *vd = vb[i] + g * kh + (long)(p + r) * kr;
                for (int c = 0; c < d; c++) { kd[c] = src[c]; vd[c] = src[(size_t)L->hkv * d + c]; }
            }
        bad = layer_post(L, h, n, qkv, kb[i], kr, kh, vb[i], kr, kh, ends, base, xidx, nt);
    }
    free(qkv); free(ends);
    return bad ? -1 : 0;
}

/* Which variant this build is, and its structs' sizes (qgemm.py checks them against its ctypes
   mirrors at load: a field added on one side only would read the wrong memory). */
const char *kernel_isa(void) { return KERNEL_ISA; }
int struct_size(int which) { return which == 0 ? (int)sizeof(lin_t) : (int)sizeof(layer_t); }
