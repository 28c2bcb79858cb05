/* The kernel's bits on any build (tests/test_qgemm_arm.py): x86 natively, Arm under qemu-aarch64.

   Built as one program with the kernel's own source (qgemm.c, the variant's flags), it runs
   block_mm on random packed weights (4-bit and 8-bit codes, any byte a code can be) and random
   activation rows, and checks every output against a scalar reference of the kernel's integer and
   float steps, bit for bit; then the layer pieces (RMSNorm, SiLU gate, row-wise attention, chains
   and trees) and two whole decoder layers (layers_forward). One line a case: its shape, "ref ok"
   or where it differs, and a hash of the output bytes, which the test compares between builds
   (x86 variants and Arm variants must print the same lines). Timings: none; emulation proves
   bits, not speed. */
#include <stdio.h>
#include <string.h>

#include "qgemm.c"

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint32_t next32(void) { /* xorshift64* */
    rng ^= rng >> 12; rng ^= rng << 25; rng ^= rng >> 27;
    return (uint32_t)((rng * 2685821657736338717ull) >> 32);
}

static float unif(void) { return (float)(next32() >> 8) / 16777216.f * 2.f - 1.f; } /* [-1, 1) */

static uint64_t fnv(const void *p, size_t n, uint64_t h) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* ------------------------------------------------------------ the scalar reference of block_mm */
static int32_t cvt_ref(float p) { /* CVTPS2DQ of an integral value */
    return fabsf(p) < 2147483648.f ? (int32_t)p : INT32_MIN;
}

static int8_t sat8(int32_t v) {
    v = v < -32768 ? -32768 : v > 32767 ? 32767 : v; /* packs to int16, then to int8 */
    return (int8_t)(v < -128 ? -128 : v > 127 ? 127 : v);
}

/* Row r's codes q [K], scales d [nsb] and block sums bs [nsb * 8]. */
static void quantize_ref(const float *x, int K, int8_t *q, float *d, int16_t *bs) {
    const int nb = K / QK, nsb = (nb + SB - 1) / SB;
    for (int S = 0; S < nsb; S++) {
        const int b0 = S * SB, ns = nb - b0 < SB ? nb - b0 : SB;
        float amax = 0.f;
        for (int j = 0; j < ns * QK; j++) {
            const float a = fabsf(x[b0 * QK + j]);
            amax = a > amax ? a : amax;
        }
        const float dd = amax / 127.f, id = dd > 0.f ? 1.f / dd : 0.f;
        d[S] = dd;
        for (int b = 0; b < SB; b++) {
            uint32_t sum = 0;
            for (int j = 0; b < ns && j < QK; j++) {
                const int32_t c = cvt_ref(nearbyintf(x[(b0 + b) * QK + j] * id));
                q[(b0 + b) * QK + j] = sat8(c);
                sum += (uint32_t)c;
            }
            bs[S * SB + b] = (int16_t)sum;
        }
    }
}

typedef struct {
    uint8_t *codes, *sub;
    int8_t *tmin;
    float *wd, *wm;
    int bits, n, k;
} packed_t;

/* Weight row n's code j of block b, from the interleaved layout (qgemm.c, "the GEMM"). */
static int code(const packed_t *w, int n, int b, int j) {
    const int nb = w->k / QK, g = n / GR, i = n % GR;
    const uint8_t *c = w->codes + (size_t)g * nb * (w->bits == 4 ? 256 : 512);
    if (w->bits == 8) return (int8_t)c[(size_t)b * 512 + (j / 4) * 64 + 4 * i + j % 4];
    const int ch = j / 8, t = j % 8;
    const uint8_t byte = c[(size_t)b * 256 + ch * 64 + 4 * i + t % 4];
    return t < 4 ? byte & 15 : byte >> 4;
}

static float dot_ref(const packed_t *w, int n, const int8_t *q, const float *d, const int16_t *bs) {
    const int nb = w->k / QK, nsb = (nb + SB - 1) / SB, g = n / GR, i = n % GR;
    float facc = 0.f, macc = 0.f;
    for (int S = 0; S < nsb; S++) {
        const int b0 = S * SB, ns = nb - b0 < SB ? nb - b0 : SB;
        int64_t acc = 0, m = 0;
        for (int b = b0; b < b0 + ns; b++) {
            int64_t dot = 0;
            for (int j = 0; j < QK; j++) dot += (int64_t)code(w, n, b, j) * q[b * QK + j];
            acc += dot * w->sub[(size_t)g * nsb * SB * GR + (size_t)b * GR + i];
            if (w->bits == 4)
                m += (int64_t)w->tmin[(size_t)g * nsb * 128 + (size_t)S * 128 + 32 * ((b - b0) / 2) + 2 * i + (b - b0) % 2]
                     * bs[S * SB + b - b0];
        }
        if (acc != (int32_t)acc || m != (int32_t)m) { fprintf(stderr, "int32 overflow\n"); exit(2); }
        const size_t o = (size_t)g * nsb * GR + (size_t)S * GR + i;
        facc = fmaf((float)(int32_t)acc, w->wd[o] * d[S], facc);
        if (w->bits == 4) macc = fmaf((float)(int32_t)m, w->wm[o] * d[S], macc);
    }
    return facc + macc;
}

/* Random packed weights: any byte a packer can write (8-bit codes -127..127). */
static packed_t random_weights(int bits, int n, int k) {
    const int nb = k / QK, nsb = (nb + SB - 1) / SB, ng = (n + GR - 1) / GR;
    const size_t nc = (size_t)ng * nb * (bits == 4 ? 256 : 512);
    packed_t w = {malloc(nc), malloc((size_t)ng * nsb * SB * GR), malloc((size_t)ng * nsb * 128),
                  malloc((size_t)ng * nsb * GR * 4), malloc((size_t)ng * nsb * GR * 4), bits, n, k};
    for (size_t i = 0; i < nc; i++) w.codes[i] = bits == 4 ? (uint8_t)next32() : (uint8_t)(int8_t)(next32() % 255 - 127);
    for (size_t i = 0; i < (size_t)ng * nsb * SB * GR; i++) w.sub[i] = (uint8_t)next32();
    for (size_t i = 0; i < (size_t)ng * nsb * 128; i++) w.tmin[i] = (int8_t)(next32() % 255 - 127);
    for (size_t i = 0; i < (size_t)ng * nsb * GR; i++) {
        w.wd[i] = (1.f + unif()) * 1e-4f;
        w.wm[i] = (1.f + unif()) * 1e-3f;
    }
    return w;
}

static void free_weights(packed_t *w) { free(w->codes); free(w->sub); free(w->tmin); free(w->wd); free(w->wm); }

/* Activation rows of differing loudness: a quiet row, a loud one, one all zeros, spikes. */
static float *random_rows(int M, int K) {
    float *x = malloc((size_t)M * K * sizeof(float));
    for (int r = 0; r < M; r++) {
        const float scale = r % 5 == 1 ? 300.f : r % 5 == 3 ? 1e-3f : 1.f;
        for (int j = 0; j < K; j++) x[(size_t)r * K + j] = r % 7 == 6 ? 0.f : unif() * scale;
        if (r % 4 == 2) x[(size_t)r * K + (r * 37) % K] = 40.f * scale; /* one spike */
    }
    return x;
}

static int gemm_case(int bits, int M, int K, int N, int nt) {
    packed_t w = random_weights(bits, N, K);
    float *x = random_rows(M, K), *y = malloc((size_t)M * N * sizeof(float));
    const int nsb = (K / QK + SB - 1) / SB;
    int8_t *q = malloc(K);
    float *d = malloc(nsb * sizeof(float));
    int16_t *bs = malloc((size_t)nsb * SB * sizeof(int16_t));
    if (block_mm(x, M, K, w.codes, w.sub, bits == 4 ? w.tmin : 0, w.wd, bits == 4 ? w.wm : 0, bits, N, y, nt)) {
        printf("block_mm q%d M=%d K=%d N=%d: out of memory\n", bits, M, K, N);
        return 1;
    }
    long bad = 0, first = -1;
    for (int r = 0; r < M; r++) {
        quantize_ref(x + (size_t)r * K, K, q, d, bs);
        for (int n = 0; n < N; n++) {
            const float ref = dot_ref(&w, n, q, d, bs), got = y[(size_t)r * N + n];
            if (memcmp(&ref, &got, 4)) { if (first < 0) first = (long)r * N + n; bad++; }
        }
    }
    printf("block_mm q%d M=%d K=%d N=%d nt=%d: ", bits, M, K, N, nt);
    if (bad) printf("ref DIFFERS at %ld values (first: row %ld col %ld)", bad, first / N, first % N);
    else printf("ref ok");
    printf(" hash=%016llx\n", (unsigned long long)fnv(y, (size_t)M * N * sizeof(float), 0xcbf29ce484222325ull));
    free_weights(&w); free(x); free(y); free(q); free(d); free(bs);
    return bad != 0;
}

/* ------------------------------------------------------------ the layer pieces: hashes only */
static void layer_cases(void) {
    const int ks[] = {896, 1536, 100, 37};
    for (int c = 0; c < 4; c++) {
        const int K = ks[c], M = 6;
        float *x = random_rows(M, 2 * K), *w = random_rows(1, K), *y = malloc((size_t)M * 2 * K * sizeof(float));
        rms_norm(x, w, 1e-6f, M, K, y);
        printf("rms_norm M=%d K=%d hash=%016llx\n", M, K, (unsigned long long)fnv(y, (size_t)M * K * 4, 0xcbf29ce484222325ull));
        for (int i = 0; i < 2 * M * K; i++) x[i] *= 0.05f; /* gate values where e^-x is in range and out */
        x[3] = -200.f; x[5] = 200.f;
        silu_mul(x, M, K, y);
        printf("silu_mul M=%d I=%d hash=%016llx\n", M, K, (unsigned long long)fnv(y, (size_t)M * K * 4, 0xcbf29ce484222325ull));
        free(x); free(w); free(y);
    }
    /* the default pair's attention: 0.5B 14 heads / 2 kv heads of 64, 1.5B 12 / 2 of 128 */
    const int shapes[][3] = {{14, 2, 64}, {12, 2, 128}, {8, 8, 64}};
    for (int c = 0; c < 3; c++) {
        const int hq = shapes[c][0], hkv = shapes[c][1], d = shapes[c][2], L = 150, n = 6;
        float *q = random_rows(n * hq, d), *k = random_rows(hkv * L, d), *v = random_rows(hkv * L, d);
        float *out = malloc((size_t)n * hq * d * sizeof(float));
        int ends[6], base[6], xidx[32], o = 0;
        for (int r = 0; r < n; r++) ends[r] = L - n + 1 + r; /* a verify's chain rows */
        attend_rows(q, (long)hq * d, d, k, d, (long)L * d, v, d, (long)L * d, ends, 0, 0, n, hq, hkv, d,
                    0.125f, out, 2);
        printf("attend_rows chain hq=%d hkv=%d d=%d L=%d n=%d hash=%016llx\n", hq, hkv, d, L, n,
               (unsigned long long)fnv(out, (size_t)n * hq * d * 4, 0xcbf29ce484222325ull));
        for (int r = 0; r < n; r++) { /* a tree: a shared prefix, then each row's ancestors */
            base[r] = L - 10;
            ends[r] = base[r] + 1 + r % 3;
            for (int j = 0; j < ends[r] - base[r]; j++) xidx[o++] = L - 10 + (r + 3 * j) % 10;
        }
        attend_rows(q, (long)hq * d, d, k, d, (long)L * d, v, d, (long)L * d, ends, base, xidx, n, hq, hkv, d,
                    0.125f, out, 1);
        printf("attend_rows tree hq=%d hkv=%d d=%d n=%d hash=%016llx\n", hq, hkv, d, n,
               (unsigned long long)fnv(out, (size_t)n * hq * d * 4, 0xcbf29ce484222325ull));
        free(q); free(k); free(v); free(out);
    }
}

/* Two whole decoder layers (layers_forward: norms, projections with bias, rotary, the KV cache's
   update, attention, the gate): 3 rows after 5 cached positions, 4-bit codes. */
static lin_t as_lin(packed_t w, const float *bias) {
    return (lin_t){w.codes, w.sub, w.tmin, w.wd, w.wm, bias, w.bits, w.n, w.k};
}

static void layers_case(void) {
    enum { HID = 128, HQ = 4, HKV = 2, D = 32, INTER = 256, NL = 2, P = 5, N = 3, W = (HQ + 2 * HKV) * D };
    layer_t L[NL];
    packed_t ws[NL][4];
    float *norms = random_rows(2 * NL, HID), *bias = random_rows(1, W), *kb[NL], *vb[NL];
    for (int i = 0; i < NL; i++) {
        ws[i][0] = random_weights(4, W, HID); ws[i][1] = random_weights(4, HID, HQ * D);
        ws[i][2] = random_weights(4, 2 * INTER, HID); ws[i][3] = random_weights(4, HID, INTER);
        L[i] = (layer_t){norms + 2 * i * HID, norms + (2 * i + 1) * HID, 1e-6f, 1e-6f, 0.17677669f,
                         as_lin(ws[i][0], bias), as_lin(ws[i][1], 0), as_lin(ws[i][2], 0), as_lin(ws[i][3], 0),
                         HQ, HKV, D, INTER};
        kb[i] = random_rows(HKV * (P + N), D);
        vb[i] = random_rows(HKV * (P + N), D);
    }
    float *h = random_rows(N, HID), *cs = random_rows(2 * N, D);
    const int bad = layers_forward(L, NL, h, N, cs, cs + N * D, kb, vb, D, (long)(P + N) * D, P, 0, 0, 0, 2);
    uint64_t hash = fnv(h, (size_t)N * HID * 4, 0xcbf29ce484222325ull);
    for (int i = 0; i < NL; i++) hash = fnv(kb[i], (size_t)HKV * (P + N) * D * 4, fnv(vb[i], (size_t)HKV * (P + N) * D * 4, hash));
    printf("layers_forward layers=%d rows=%d after %d: %s h[0]=%g hash=%016llx\n", NL, N, P,
           bad ? "FAILED" : "ok", h[0], (unsigned long long)hash);
    for (int i = 0; i < NL; i++) {
        for (int j = 0; j < 4; j++) free_weights(&ws[i][j]);
        free(kb[i]); free(vb[i]);
    }
    free(norms); free(bias); free(h); free(cs);
}

int main(int argc, char **argv) {
    const int full = argc < 2 || strcmp(argv[1], "quick");
    int bad = 0;
#ifdef __aarch64__
    printf("kernel %s (%s)\n", kernel_isa(), kernel_threads());
#else
    printf("kernel %s\n", kernel_isa());
#endif
    for (int bits = 4; bits <= 8; bits += 4) {
        for (int M = 1; M <= 16; M++) bad += gemm_case(bits, M, 352, 37, 2); /* 11 blocks, a short group */
        bad += gemm_case(bits, 3, 320, 40, 1); /* 10 blocks: a full super-block and a short one */
        bad += gemm_case(bits, 20, 512, 40, 2); /* past a row tile */
        /* the default pair's shapes (0.5B and 1.5B hidden and MLP widths; output rows cut to a few
           groups: each group is the same code), a step, verifies, a prompt */
        const int shapes[][2] = {{896, 1152}, {4864, 96}, {1536, 208}, {8960, 48}};
        for (int s = 0; s < 4 && full; s++)
            for (int m = 0; m < 4; m++) {
                const int Ms[] = {1, 6, 9, 16};
                bad += gemm_case(bits, Ms[m], shapes[s][0], shapes[s][1], 2);
            }
        if (full) bad += gemm_case(bits, 40, 896, 272, 2); /* a prompt: weight chunks against row tiles */
    }
    layer_cases();
    layers_case();
    printf("%s\n", bad ? "FAILED" : "all block_mm outputs equal the reference");
    return bad != 0;
}
