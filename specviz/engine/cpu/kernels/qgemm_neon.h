/* qgemm.c on AArch64 (included by it there only): the activations' quantisation, the group dot
   (dotprod's vdotq_s32, or i8mm's vmmlaq_s32 for two activation rows at once), and the AVX float
   operations that the layer code below the GEMM uses, each with x86's exact semantics on two NEON
   halves, so that one source computes the same bits on both.

   The same integers and the same float operations as the x86 variants (qgemm.c, "the GEMM"): each
   block's integer dot is exact, weighted by the block's sub-scale in int32, and per super-block
   converted to float and added with one fused multiply-add by (D * the activation row's scale);
   the sub-minimums likewise. Only where the integers are summed differs, and integer sums do not
   depend on their order. tests/test_qgemm_arm.py proves it under qemu (bits, never speed). */
#include <arm_neon.h>

#ifndef __ARM_FEATURE_DOTPROD
#error "the Arm kernel needs dotprod (-march=armv8.2-a+dotprod)"
#endif
#ifdef __ARM_FEATURE_MATMUL_INT8
#define KERNEL_ISA "neon-i8mm"
#else
#define KERNEL_ISA "neon-dotprod"
#endif
#define VNNI_XU 0

/* ------------------------------------------------ x86's float vectors of 8, as two NEON halves */
typedef struct { float32x4_t l, h; } __m256;
typedef struct { int32x4_t l, h; } __m256i;
#define _MM_FROUND_TO_NEAREST_INT 0x00
#define _MM_FROUND_NO_EXC 0x08
#define F8(EXPR_L, EXPR_H) ((__m256){EXPR_L, EXPR_H})
#define F8_LANEWISE(NAME, OP) \
    INLINE __m256 NAME(__m256 a, __m256 b) { return F8(OP(a.l, b.l), OP(a.h, b.h)); }
F8_LANEWISE(_mm256_add_ps, vaddq_f32)
F8_LANEWISE(_mm256_sub_ps, vsubq_f32)
F8_LANEWISE(_mm256_mul_ps, vmulq_f32)
F8_LANEWISE(_mm256_div_ps, vdivq_f32)

/* MAXPS / MINPS: the second operand unless the first is greater (less): a NaN gives the second */
INLINE float32x4_t max_x86(float32x4_t a, float32x4_t b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }
INLINE float32x4_t min_x86(float32x4_t a, float32x4_t b) { return vbslq_f32(vcltq_f32(a, b), a, b); }
F8_LANEWISE(_mm256_max_ps, max_x86)
F8_LANEWISE(_mm256_min_ps, min_x86)

INLINE __m256 _mm256_setzero_ps(void) { return F8(vdupq_n_f32(0.f), vdupq_n_f32(0.f)); }
INLINE __m256 _mm256_set1_ps(float a) { return F8(vdupq_n_f32(a), vdupq_n_f32(a)); }
INLINE __m256 _mm256_loadu_ps(const float *p) { return F8(vld1q_f32(p), vld1q_f32(p + 4)); }
INLINE void _mm256_storeu_ps(float *p, __m256 a) { vst1q_f32(p, a.l); vst1q_f32(p + 4, a.h); }
INLINE float _mm256_cvtss_f32(__m256 a) { return vgetq_lane_f32(a.l, 0); }
/* a * b + c and -(a * b) + c, each rounded once (VFMADD / VFNMADD) */
INLINE __m256 _mm256_fmadd_ps(__m256 a, __m256 b, __m256 c) { return F8(vfmaq_f32(c.l, a.l, b.l), vfmaq_f32(c.h, a.h, b.h)); }
INLINE __m256 _mm256_fnmadd_ps(__m256 a, __m256 b, __m256 c) { return F8(vfmsq_f32(c.l, a.l, b.l), vfmsq_f32(c.h, a.h, b.h)); }
/* only round-to-nearest-even is used */
INLINE __m256 _mm256_round_ps(__m256 a, int mode) { (void)mode; return F8(vrndnq_f32(a.l), vrndnq_f32(a.h)); }

/* CVTPS2DQ: nearest even; NaN and anything outside int32 give INT32_MIN (NEON would saturate) */
INLINE int32x4_t cvt_x86(float32x4_t a) {
    return vbslq_s32(vcaltq_f32(a, vdupq_n_f32(2147483648.f)), vcvtnq_s32_f32(a), vdupq_n_s32(INT32_MIN));
}
INLINE __m256i _mm256_cvtps_epi32(__m256 a) { return (__m256i){cvt_x86(a.l), cvt_x86(a.h)}; }
INLINE __m256i _mm256_set1_epi32(int a) { return (__m256i){vdupq_n_s32(a), vdupq_n_s32(a)}; }
INLINE __m256i _mm256_add_epi32(__m256i a, __m256i b) { return (__m256i){vaddq_s32(a.l, b.l), vaddq_s32(a.h, b.h)}; }
#define _mm256_slli_epi32(a, n) ((__m256i){vshlq_n_s32((a).l, n), vshlq_n_s32((a).h, n)})
INLINE __m256 _mm256_castsi256_ps(__m256i a) { return F8(vreinterpretq_f32_s32(a.l), vreinterpretq_f32_s32(a.h)); }

/* qgemm.c's hsum on x86: (l + h), then (s0 + s2) + (s1 + s3) */
static inline float hsum(__m256 v) {
    const float32x4_t s = vaddq_f32(v.l, v.h);
    const float32x2_t t = vadd_f32(vget_low_f32(s), vget_high_f32(s));
    return vget_lane_f32(t, 0) + vget_lane_f32(t, 1);
}

/* ------------------------------------------------ activations, as qgemm.c's quantize_rows on x86 */
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
        float32x4_t am = vdupq_n_f32(0.f);
        for (int j = 0; j < ns * QK; j += 4) /* |v|, a NaN passed over: all >= 0, any order gives the max */
            am = max_x86(vabsq_f32(vld1q_f32(v + j)), am);
        const float amax = vmaxvq_f32(am), d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
        for (int b = 0; b < SB; b++) {
            if (b >= ns) { bs[b] = 0; continue; }
            int32x4_t c[8], sum = vdupq_n_s32(0);
            for (int t = 0; t < 8; t++) {
                c[t] = cvt_x86(vrndnq_f32(vmulq_n_f32(vld1q_f32(v + b * QK + 4 * t), id)));
                sum = vaddq_s32(sum, c[t]); /* wraps as x86's does: the low 16 bits are the same */
            }
            for (int t = 0; t < 8; t += 4) /* saturated to int16, then int8: x86's packs */
                vst1q_s8(q + b * QK + 4 * t,
                         vcombine_s8(vqmovn_s16(vcombine_s16(vqmovn_s32(c[t]), vqmovn_s32(c[t + 1]))),
                                     vqmovn_s16(vcombine_s16(vqmovn_s32(c[t + 2]), vqmovn_s32(c[t + 3])))));
            bs[b] = (int16_t)vaddvq_s32(sum);
        }
        xd[(size_t)sb * Mp + row] = d;
    }
}

/* ------------------------------------------------ the group dot
   A group's 64-byte chunk is four 16-byte quarters: quarter E is weight rows 4E .. 4E + 3, a NEON
   vector whose 32-bit lanes are those rows. A pass takes QW quarters (all four for one activation
   row, one for many), so that its accumulators stay in the 32 registers; a later pass re-reads its
   quarter of each code line from cache. */

/* The sub-minimums' integer sum for quarter E of super-block S and one activation row:
   m[i] = sum_b t[b][4E + i] * bs[b] (tmin: [4 block pairs][16 rows][2]). */
INLINE int32x4_t min_dot(const int8_t *tm, int E, const int16_t *bs) {
    int32x4_t lo = vdupq_n_s32(0), hi = lo;
    for (int j = 0; j < 4; j++) {
        const int16x8_t T = vmovl_s8(vld1_s8(tm + 32 * j + 8 * E)); /* rows 4E.., each (t_2j, t_2j+1) */
        const int16x4_t B = vreinterpret_s16_s32(vdup_n_s32(load4(bs + 2 * j)));
        lo = vmlal_s16(lo, vget_low_s16(T), B);
        hi = vmlal_s16(hi, vget_high_s16(T), B);
    }
    return vpaddq_s32(lo, hi);
}

/* Quarter E's four sub-scales as int32 lanes. */
INLINE int32x4_t sub4(const uint8_t *sub, int b, int E) {
    const uint8x8_t s = vreinterpret_u8_u32(vdup_n_u32((uint32_t)load4(sub + b * GR + 4 * E)));
    return vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(s))));
}

/* The integer dot of one activation block x (32 codes) with quarter E of block b's weight rows. */
INLINE int32x4_t block_sdot(const uint8_t *cb, int bits, int E, const int8_t *x) {
    const int8x16_t x0 = vld1q_s8(x), x1 = vld1q_s8(x + 16);
    int32x4_t p = vdupq_n_s32(0);
    if (bits == 4) { /* chunk q: low nibbles with x[8q .. 8q + 3] (lane 2q), high with lane 2q + 1 */
        const uint8x16_t m4 = vdupq_n_u8(0x0F);
        uint8x16_t w[4];
        for (int q = 0; q < 4; q++) w[q] = vld1q_u8(cb + 64 * q + 16 * E);
#define NIB(q, X, L) p = vdotq_laneq_s32(p, vreinterpretq_s8_u8(vandq_u8(w[q], m4)), X, L); \
                     p = vdotq_laneq_s32(p, vreinterpretq_s8_u8(vshrq_n_u8(w[q], 4)), X, L + 1);
        NIB(0, x0, 0) NIB(1, x0, 2) NIB(2, x1, 0) NIB(3, x1, 2)
#undef NIB
    } else { /* chunk q: 4 signed codes a row with x[4q .. 4q + 3] */
#define SD(q, X, L) p = vdotq_laneq_s32(p, vld1q_s8((const int8_t *)cb + 64 * q + 16 * E), X, L);
        SD(0, x0, 0) SD(1, x0, 1) SD(2, x0, 2) SD(3, x0, 3) SD(4, x1, 0) SD(5, x1, 1) SD(6, x1, 2) SD(7, x1, 3)
#undef SD
    }
    return p;
}

/* Store out (lanes: weight rows 4E ..) to y's row, those below nv. */
INLINE void store4(float *y, float32x4_t out, int E, int nv) {
    const int left = nv - 4 * E;
    if (left >= 4) vst1q_f32(y + 4 * E, out);
    else {
        float t[4];
        vst1q_f32(t, out);
        for (int i = 0; i < left; i++) y[4 * E + i] = t[i];
    }
}

/* Group g's 16 weight rows against R activation rows (dotprod): y[r * ys + i] for i < nv. */
INLINE void group_sdot(const uint8_t *codes, const uint8_t *sub, const int8_t *tmin, const float *wd,
                       const float *wm, int nb, int bits, const int8_t *xq, const float *xd, const int16_t *xs,
                       int K, int Mp, int R, float *y, size_t ys, int nv, int pf) {
    const int nsb = (nb + SB - 1) / SB, QW = R == 1 ? 4 : R <= 3 ? 2 : 1;
    const size_t bb = bits == 4 ? 256 : 512;
    for (int e0 = 0; e0 < 4; e0 += QW) {
        float32x4_t facc[4][RT], macc[4][RT];
        for (int e = 0; e < QW; e++)
            for (int r = 0; r < R; r++) facc[e][r] = macc[e][r] = vdupq_n_f32(0.f);
        for (int S = 0; S < nsb; S++) {
            const int b0 = S * SB, ns = nb - b0 < SB ? nb - b0 : SB;
            int32x4_t acc[4][RT];
            for (int e = 0; e < QW; e++)
                for (int r = 0; r < R; r++) acc[e][r] = vdupq_n_s32(0);
            for (int b = b0; b < b0 + ns; b++) {
                const uint8_t *cb = codes + (size_t)b * bb;
                if (e0 == 0)
                    for (size_t o = 0; o < bb; o += 64) __builtin_prefetch(cb + o + pf);
                for (int e = 0; e < QW; e++) {
                    const int32x4_t sv = sub4(sub, b, e0 + e);
                    for (int r = 0; r < R; r++)
                        acc[e][r] = vmlaq_s32(acc[e][r], block_sdot(cb, bits, e0 + e, xq + (size_t)r * K + (size_t)b * QK), sv);
                }
            }
            for (int e = 0; e < QW; e++) {
                const int E = e0 + e;
                const float32x4_t wdv = vld1q_f32(wd + S * GR + 4 * E);
                for (int r = 0; r < R; r++)
                    facc[e][r] = vfmaq_f32(facc[e][r], vcvtq_f32_s32(acc[e][r]), vmulq_n_f32(wdv, xd[(size_t)S * Mp + r]));
                if (bits == 4) {
                    const float32x4_t wmv = vld1q_f32(wm + S * GR + 4 * E);
                    for (int r = 0; r < R; r++) {
                        const int32x4_t m = min_dot(tmin + (size_t)S * 128, E, xs + ((size_t)S * Mp + r) * SB);
                        macc[e][r] = vfmaq_f32(macc[e][r], vcvtq_f32_s32(m), vmulq_n_f32(wmv, xd[(size_t)S * Mp + r]));
                    }
                }
            }
        }
        for (int e = 0; e < QW; e++)
            for (int r = 0; r < R; r++) store4(y + r * ys, vaddq_f32(facc[e][r], macc[e][r]), e0 + e, nv);
    }
}

#ifdef __ARM_FEATURE_MATMUL_INT8
/* i8mm: vmmlaq_s32 multiplies a 2x8 int8 tile (two activation rows' 8 codes) by a 2x8 one (two
   weight rows' 8 codes), giving the 2x2 int32 dots [r.i, r.i', s.i, s.i']. Quarter E's vector
   holds rows 4E .. 4E + 3: zipped (32-bit lanes) into the pairs (4E, 4E + 1) and (4E + 2, 4E + 3),
   8 consecutive weights a row. An odd last row is paired with itself, its copy not stored. */

/* Activation rows r, s's block as the four 2x8 tiles of weights 8p .. 8p + 7. */
INLINE void act_tiles(const int8_t *xr, const int8_t *xs_, int8x16_t a[4]) {
    const int64x2_t r0 = vreinterpretq_s64_s8(vld1q_s8(xr)), r1 = vreinterpretq_s64_s8(vld1q_s8(xr + 16));
    const int64x2_t s0 = vreinterpretq_s64_s8(vld1q_s8(xs_)), s1 = vreinterpretq_s64_s8(vld1q_s8(xs_ + 16));
    a[0] = vreinterpretq_s8_s64(vzip1q_s64(r0, s0)); a[1] = vreinterpretq_s8_s64(vzip2q_s64(r0, s0));
    a[2] = vreinterpretq_s8_s64(vzip1q_s64(r1, s1)); a[3] = vreinterpretq_s8_s64(vzip2q_s64(r1, s1));
}

/* Quarter E's weight tiles for block cb: w[p][0] rows (4E, 4E + 1), w[p][1] rows (4E + 2, 4E + 3). */
INLINE void weight_tiles(const uint8_t *cb, int bits, int E, int8x16_t w[4][2]) {
    if (bits == 4) { /* chunk p: a row's low nibbles are weights 8p .. 8p + 3, its high ones the next 4 */
        const uint8x16_t m4 = vdupq_n_u8(0x0F);
        for (int p = 0; p < 4; p++) {
            const uint8x16_t raw = vld1q_u8(cb + 64 * p + 16 * E);
            const int32x4_t lo = vreinterpretq_s32_u8(vandq_u8(raw, m4)), hi = vreinterpretq_s32_u8(vshrq_n_u8(raw, 4));
            w[p][0] = vreinterpretq_s8_s32(vzip1q_s32(lo, hi));
            w[p][1] = vreinterpretq_s8_s32(vzip2q_s32(lo, hi));
        }
    } else { /* chunks 2p and 2p + 1: a row's 4 codes each */
        for (int p = 0; p < 4; p++) {
            const int32x4_t u = vreinterpretq_s32_u8(vld1q_u8(cb + 128 * p + 16 * E));
            const int32x4_t v = vreinterpretq_s32_u8(vld1q_u8(cb + 128 * p + 64 + 16 * E));
            w[p][0] = vreinterpretq_s8_s32(vzip1q_s32(u, v));
            w[p][1] = vreinterpretq_s8_s32(vzip2q_s32(u, v));
        }
    }
}

/* lanes (i, i') for row r then row s: the quarter's scale pair times each row's scale */
INLINE float32x4_t pair_scale(float32x2_t w, float dr, float ds) {
    return vcombine_f32(vmul_n_f32(w, dr), vmul_n_f32(w, ds));
}

INLINE void store_pair(float *y, size_t ys, int r, int s, int col, float32x4_t out, int nv) {
    float t[4];
    vst1q_f32(t, out);
    for (int i = 0; i < 2 && col + i < nv; i++) {
        y[r * ys + col + i] = t[i];
        if (s != r) y[s * ys + col + i] = t[2 + i];
    }
}

/* Group g's 16 weight rows against R >= 2 activation rows, two at a time (i8mm). */
INLINE void group_mmla(const uint8_t *codes, const uint8_t *sub, const int8_t *tmin, const float *wd,
                       const float *wm, int nb, int bits, const int8_t *xq, const float *xd, const int16_t *xs,
                       int K, int Mp, int R, float *y, size_t ys, int nv, int pf) {
    const int nsb = (nb + SB - 1) / SB, P = (R + 1) / 2;
    const size_t bb = bits == 4 ? 256 : 512;
    for (int E = 0; E < 4; E++) {
        float32x4_t facc[RT / 2][2], macc[RT / 2][2];
        for (int p = 0; p < P; p++) facc[p][0] = facc[p][1] = macc[p][0] = macc[p][1] = vdupq_n_f32(0.f);
        for (int S = 0; S < nsb; S++) {
            const int b0 = S * SB, ns = nb - b0 < SB ? nb - b0 : SB;
            int32x4_t acc[RT / 2][2];
            for (int p = 0; p < P; p++) acc[p][0] = acc[p][1] = vdupq_n_s32(0);
            for (int b = b0; b < b0 + ns; b++) {
                const uint8_t *cb = codes + (size_t)b * bb;
                if (E == 0)
                    for (size_t o = 0; o < bb; o += 64) __builtin_prefetch(cb + o + pf);
                int8x16_t w[4][2];
                weight_tiles(cb, bits, E, w);
                const int32x4_t sv = sub4(sub, b, E);
                const int32x4_t s01 = vcombine_s32(vget_low_s32(sv), vget_low_s32(sv));
                const int32x4_t s23 = vcombine_s32(vget_high_s32(sv), vget_high_s32(sv));
                for (int p = 0; p < P; p++) {
                    const int r = 2 * p, s = r + 1 < R ? r + 1 : r;
                    int8x16_t a[4];
                    act_tiles(xq + (size_t)r * K + (size_t)b * QK, xq + (size_t)s * K + (size_t)b * QK, a);
                    int32x4_t t0 = vdupq_n_s32(0), t1 = t0;
                    for (int k = 0; k < 4; k++) {
                        t0 = vmmlaq_s32(t0, a[k], w[k][0]);
                        t1 = vmmlaq_s32(t1, a[k], w[k][1]);
                    }
                    acc[p][0] = vmlaq_s32(acc[p][0], t0, s01);
                    acc[p][1] = vmlaq_s32(acc[p][1], t1, s23);
                }
            }
            const float32x4_t wdv = vld1q_f32(wd + S * GR + 4 * E);
            const float32x4_t wmv = bits == 4 ? vld1q_f32(wm + S * GR + 4 * E) : vdupq_n_f32(0.f);
            for (int p = 0; p < P; p++) {
                const int r = 2 * p, s = r + 1 < R ? r + 1 : r;
                const float dr = xd[(size_t)S * Mp + r], ds = xd[(size_t)S * Mp + s];
                facc[p][0] = vfmaq_f32(facc[p][0], vcvtq_f32_s32(acc[p][0]), pair_scale(vget_low_f32(wdv), dr, ds));
                facc[p][1] = vfmaq_f32(facc[p][1], vcvtq_f32_s32(acc[p][1]), pair_scale(vget_high_f32(wdv), dr, ds));
                if (bits == 4) {
                    const int64x2_t mr = vreinterpretq_s64_s32(min_dot(tmin + (size_t)S * 128, E, xs + ((size_t)S * Mp + r) * SB));
                    const int64x2_t ms = vreinterpretq_s64_s32(min_dot(tmin + (size_t)S * 128, E, xs + ((size_t)S * Mp + s) * SB));
                    macc[p][0] = vfmaq_f32(macc[p][0], vcvtq_f32_s32(vreinterpretq_s32_s64(vzip1q_s64(mr, ms))),
                                           pair_scale(vget_low_f32(wmv), dr, ds));
                    macc[p][1] = vfmaq_f32(macc[p][1], vcvtq_f32_s32(vreinterpretq_s32_s64(vzip2q_s64(mr, ms))),
                                           pair_scale(vget_high_f32(wmv), dr, ds));
                }
            }
        }
        for (int p = 0; p < P; p++) {
            const int r = 2 * p, s = r + 1 < R ? r + 1 : r;
            store_pair(y, ys, r, s, 4 * E, vaddq_f32(facc[p][0], macc[p][0]), nv);
            store_pair(y, ys, r, s, 4 * E + 2, vaddq_f32(facc[p][1], macc[p][1]), nv);
        }
    }
}
#endif

/* qgemm.c's group_dot: one activation row by dotprod, several by i8mm where the build has it. */
INLINE void group_dot(const uint8_t *codes, const uint8_t *sub, const int8_t *tmin, const float *wd,
                      const float *wm, int nb, int bits, const int8_t *xq, const uint8_t *xu, const float *xd,
                      const int16_t *xs, int K, int Mp, int R, float *y, size_t ys, int nv, int pf) {
    (void)xu;
#ifdef __ARM_FEATURE_MATMUL_INT8
    if (R >= 2) {
        group_mmla(codes, sub, tmin, wd, wm, nb, bits, xq, xd, xs, K, Mp, R, y, ys, nv, pf);
        return;
    }
#endif
    group_sdot(codes, sub, tmin, wd, wm, nb, bits, xq, xd, xs, K, Mp, R, y, ys, nv, pf);
}

/* How this build runs its threads: OpenMP, or one thread where the compiler had none. */
const char *kernel_threads(void) {
#ifdef _OPENMP
    return "OpenMP";
#else
    return "one thread";
#endif
}
