/* mont_t<F>: a prime field element in Montgomery form on N 32-bit words.
 *
 * One template serves Fq (N = 12) and Fr (N = 8); the field is a traits type F
 * with N, M0 = -p^-1 mod 2^32 and word accessors mod(i)/one(i)/rr(i)/pm2(i) over
 * the generated tables of bls12_381.cuh (constant indices fold to immediates). The Montgomery radix is R = 2^(32 N), the same as the zkey's
 * 64-bit-limb form (2^384 for Fq, 2^256 for Fr), so load/store are bit copies of
 * the zkey words.
 *
 * Multiplication is CIOS with the even/odd split of the partial products
 * (the technique of sppark's mont_t, written here from its description):
 * a_j * b_i for even j lands on words {j, j+1} of one accumulator and for odd j
 * on words {j-1, j} of a second accumulator that stands one word higher, so each
 * accumulator takes a whole row of products in ONE unbroken mad.lo.cc/madc.hi.cc
 * carry chain. The two accumulators swap roles every step (the one-word shift of
 * CIOS becomes a relabelling), which is why the b loop steps by 2 (N is even).
 * Cost: 2 N^2 IMADs for a*b plus 2 N^2 for m*p plus ~3 N adds
 * (Fq: ~600 integer instructions).
 *
 * Bounds (why no carry is lost): with a < p and any b, the CIOS value before each
 * one-word shift is V < 2^33 p; the low accumulator X holds V mod 2^(32N) with
 * its carries folded into the high one, so the high one holds < V / 2^32 < 2p,
 * which fits N words for both fields (Fq has 3 spare bits, Fr has 1).
 * Inputs must be canonical (< p); every result is canonical.
 */
#pragma once
#include "../common/ptx.cuh"

template <class F>
struct mont_t {
    static constexpr int N = F::N;
    uint32_t l[N];  /* little-endian words, Montgomery form */

    /* ------------------------------------------------------------ construction */
    FF_INLINE static mont_t zero() {
        mont_t r;
#pragma unroll
        for (int i = 0; i < N; i++) r.l[i] = 0;
        return r;
    }
    FF_INLINE static mont_t one() {
        mont_t r;
#pragma unroll
        for (int i = 0; i < N; i++) r.l[i] = F::one(i);
        return r;
    }
    /* N/2 little-endian uint64 limbs (the zkey / numpy layout); 8-byte aligned. */
    FF_INLINE static mont_t load(const uint64_t* p) {
        mont_t r;
#pragma unroll
        for (int i = 0; i < N / 2; i++) {
            uint64_t w = p[i];
            r.l[2 * i] = (uint32_t)w;
            r.l[2 * i + 1] = (uint32_t)(w >> 32);
        }
        return r;
    }
    FF_INLINE void store(uint64_t* p) const {
#pragma unroll
        for (int i = 0; i < N / 2; i++) p[i] = ((uint64_t)l[2 * i + 1] << 32) | l[2 * i];
    }

    /* ------------------------------------------------------------ predicates */
    FF_INLINE bool is_zero() const {
        uint32_t acc = 0;
#pragma unroll
        for (int i = 0; i < N; i++) acc |= l[i];
        return acc == 0;
    }
    FF_INLINE bool operator==(const mont_t& b) const {
        uint32_t acc = 0;
#pragma unroll
        for (int i = 0; i < N; i++) acc |= l[i] ^ b.l[i];
        return acc == 0;
    }
    FF_INLINE bool operator!=(const mont_t& b) const { return !(*this == b); }

    /* ------------------------------------------------------------ add / sub */
    /* p as words in registers (compile-time constants after unrolling: IMAD immediates). */
    FF_INLINE static void load_mod(uint32_t* P) {
#pragma unroll
        for (int i = 0; i < N; i++) P[i] = F::mod(i);
    }
    /* r -= p when r >= p (r < 2p): one borrow chain, then a word-wise select. */
    FF_INLINE static void final_sub(uint32_t* r) {
        uint32_t P[N];
        load_mod(P);
        uint32_t t[N];
        ptx::cc_t cc;
        t[0] = ptx::sub_cc(r[0], P[0], cc);
#pragma unroll
        for (int i = 1; i < N; i++) t[i] = ptx::subc_cc(r[i], P[i], cc);
        uint32_t borrow = ptx::subc(0, 0, cc);  /* 0xffffffff when r < p */
#pragma unroll
        for (int i = 0; i < N; i++) r[i] = borrow ? r[i] : t[i];
    }
    FF_INLINE mont_t operator+(const mont_t& b) const {
        mont_t r;
        ptx::cc_t cc;
        r.l[0] = ptx::add_cc(l[0], b.l[0], cc);
#pragma unroll
        for (int i = 1; i < N - 1; i++) r.l[i] = ptx::addc_cc(l[i], b.l[i], cc);
        r.l[N - 1] = ptx::addc(l[N - 1], b.l[N - 1], cc);  /* a + b < 2p < 2^(32N) */
        final_sub(r.l);
        return r;
    }
    FF_INLINE mont_t operator-(const mont_t& b) const {
        uint32_t P[N];
        load_mod(P);
        mont_t r;
        ptx::cc_t cc;
        r.l[0] = ptx::sub_cc(l[0], b.l[0], cc);
#pragma unroll
        for (int i = 1; i < N; i++) r.l[i] = ptx::subc_cc(l[i], b.l[i], cc);
        uint32_t mask = ptx::subc(0, 0, cc);  /* all ones when a < b: add p back */
        r.l[0] = ptx::add_cc(r.l[0], P[0] & mask, cc);
#pragma unroll
        for (int i = 1; i < N - 1; i++) r.l[i] = ptx::addc_cc(r.l[i], P[i] & mask, cc);
        r.l[N - 1] = ptx::addc(r.l[N - 1], P[N - 1] & mask, cc);
        return r;
    }
    FF_INLINE mont_t dbl() const { return *this + *this; }
    FF_INLINE mont_t neg() const {
        uint32_t P[N];
        load_mod(P);
        uint32_t mask = is_zero() ? 0u : 0xffffffffu;  /* -0 = 0, not p */
        mont_t r;
        ptx::cc_t cc;
        r.l[0] = ptx::sub_cc(P[0], l[0], cc);
#pragma unroll
        for (int i = 1; i < N; i++) r.l[i] = ptx::subc_cc(P[i], l[i], cc);
#pragma unroll
        for (int i = 0; i < N; i++) r.l[i] &= mask;
        return r;
    }

    /* ------------------------------------------------------------ multiply */
    /* acc[j], acc[j+1] = a[j] * bi for even j (no chain: the products do not overlap). */
    FF_INLINE static void mul_n(uint32_t* acc, const uint32_t* a, uint32_t bi) {
#pragma unroll
        for (int j = 0; j < N; j += 2) {
            acc[j] = ptx::mul_lo(a[j], bi);
            acc[j + 1] = ptx::mul_hi(a[j], bi);
        }
    }
    /* acc += sum_{even j} a[j] * bi * 2^(32 j) in one chain; the carry out is left in cc. */
    FF_INLINE static void cmad_n(uint32_t* acc, const uint32_t* a, uint32_t bi, ptx::cc_t& cc) {
        acc[0] = ptx::mad_lo_cc(a[0], bi, acc[0], cc);
        acc[1] = ptx::madc_hi_cc(a[0], bi, acc[1], cc);
#pragma unroll
        for (int j = 2; j < N; j += 2) {
            acc[j] = ptx::madc_lo_cc(a[j], bi, acc[j], cc);
            acc[j + 1] = ptx::madc_hi_cc(a[j], bi, acc[j + 1], cc);
        }
    }
    /* acc = (acc >> 64) + sum_{even j} a[j] * bi * 2^(32 j), continuing the caller's chain. */
    FF_INLINE static void madc_n_rshift(uint32_t* acc, const uint32_t* a, uint32_t bi, ptx::cc_t& cc) {
#pragma unroll
        for (int j = 0; j < N - 2; j += 2) {
            acc[j] = ptx::madc_lo_cc(a[j], bi, acc[j + 2], cc);
            acc[j + 1] = ptx::madc_hi_cc(a[j], bi, acc[j + 3], cc);
        }
        acc[N - 2] = ptx::madc_lo_cc(a[N - 2], bi, 0, cc);
        acc[N - 1] = ptx::madc_hi(a[N - 2], bi, 0, cc);  /* no carry out: bounds above */
    }
    /* One CIOS step: lo = low accumulator (word 0 of the running value), hi = the one
     * standing a word higher. Adds a * bi (and c * di when c is given: mul_add), then
     * m * p with m = lo[0] * M0, zeroing lo[0]. A chain's carry out of hi is 0 and one out
     * of lo lands on hi[N - 1] without overflow: the value lo + hi 2^32 stays below
     * 2^(32N + 32) (the bounds above, with 3p for two products). */
    FF_INLINE static void mad_n_redc(uint32_t* lo, uint32_t* hi, const uint32_t* a, uint32_t bi,
                                     bool first, const uint32_t* c = nullptr, uint32_t di = 0) {
        uint32_t P[N];
        load_mod(P);
        ptx::cc_t cc;
        if (first) {
            mul_n(hi, a + 1, bi);
            mul_n(lo, a, bi);
        } else {
            /* hi held the previous low accumulator: its word 1 is now word 0 of the value. */
            lo[0] = ptx::add_cc(lo[0], hi[1], cc);
            madc_n_rshift(hi, a + 1, bi, cc);
            cmad_n(lo, a, bi, cc);
            hi[N - 1] = ptx::addc(hi[N - 1], 0, cc);
        }
        if (c != nullptr) {
            cmad_n(hi, c + 1, di, cc);
            cmad_n(lo, c, di, cc);
            hi[N - 1] = ptx::addc(hi[N - 1], 0, cc);
        }
        uint32_t m = lo[0] * F::M0;
        cmad_n(hi, P + 1, m, cc);
        cmad_n(lo, P, m, cc);
        hi[N - 1] = ptx::addc(hi[N - 1], 0, cc);
    }
    /* The product every caller uses: CIOS. (One Karatsuba level with a word-by-word reduction,
     * 264 instead of 300 32-bit products an Fq product, measured 16 % slower in the G1 MSM on the
     * H200: its extra additions and moves land on the IMAD pipe too; perf/gpu_msm_notes.md.) */
    FF_INLINE mont_t operator*(const mont_t& b) const { return mul_cios(b); }
    FF_INLINE mont_t mul_cios(const mont_t& b) const {
        uint32_t even[N], odd[N];
#pragma unroll
        for (int i = 0; i < N; i += 2) {
            mad_n_redc(even, odd, l, b.l[i], i == 0);
            mad_n_redc(odd, even, l, b.l[i + 1], false);
        }
        return fold(even, odd);
    }
    /* (a b + c d) R^-1 for canonical a and c, any b and d, with ONE reduction: each CIOS step
     * adds a * b_i and c * d_i before its m * p. 3 N^2 + N products instead of 4 N^2 + 2N for
     * two products (Fq: 444 against 600), and one final subtraction: the running value stays
     * below 3p + 1, which fits N words only where 3p < R (Fq: p < 2^381; not Fr, whose
     * 3r > 2^256), and the result below p + 2 p^2 / R < 2p. Why: the curve formulas' Y3 = R (Q - X3) - Y1 PPP is one of these with
     * c = -Y1 (Matter Labs' reduce(a b) - reduce(c d) = reduce(a b - c d)). */
    FF_INLINE static mont_t mul_add(const mont_t& a, const mont_t& b, const mont_t& c, const mont_t& d) {
        static_assert(N == 12, "mul_add needs 3p < R: Fq only");
        uint32_t even[N], odd[N];
#pragma unroll
        for (int i = 0; i < N; i += 2) {
            mad_n_redc(even, odd, a.l, b.l[i], i == 0, c.l, d.l[i]);
            mad_n_redc(odd, even, a.l, b.l[i + 1], false, c.l, d.l[i + 1]);
        }
        return fold(even, odd);
    }
    /* The CIOS tail: value = odd + even * 2^32 with odd[0] == 0, so the result is
     * even + (odd >> 32) < 2p; one final subtraction makes it canonical. */
    FF_INLINE static mont_t fold(const uint32_t* even, const uint32_t* odd) {
        ptx::cc_t cc;
        mont_t r;
        r.l[0] = ptx::add_cc(even[0], odd[1], cc);
#pragma unroll
        for (int i = 1; i < N - 1; i++) r.l[i] = ptx::addc_cc(even[i], odd[i + 1], cc);
        r.l[N - 1] = ptx::addc(even[N - 1], 0, cc);
        final_sub(r.l);
        return r;
    }
    /* ------------------------------------------------------------ square */
    /* One row of cross products a[i] * a[j], j = j0, j0 + 2, ... < K, added into acc at
     * position i + j: the pairs {i+j, i+j+1} do not overlap, so it is ONE chain; its carry
     * lands on a word that holds at most an earlier row's carry (see sqr_wide). */
    template <int K>
    FF_INLINE static void sqr_row(uint32_t* acc, const uint32_t* a, int i, int j0) {
        ptx::cc_t cc;
        int p = i + j0;
        acc[p] = ptx::mad_lo_cc(a[i], a[j0], acc[p], cc);
        acc[p + 1] = ptx::madc_hi_cc(a[i], a[j0], acc[p + 1], cc);
#pragma unroll
        for (int j = j0 + 2; j < K; j += 2) {
            p = i + j;
            acc[p] = ptx::madc_lo_cc(a[i], a[j], acc[p], cc);
            acc[p + 1] = ptx::madc_hi_cc(a[i], a[j], acc[p + 1], cc);
        }
        acc[p + 2] = ptx::addc(acc[p + 2], 0, cc);
    }
    /* w (2K words) = a^2 for a K-word a: cross products once (odd offsets j - i in one
     * accumulator, even ones in another, so every row is one carry chain), doubled, plus the
     * squares a[i]^2. K(K-1)/2 + K products instead of K^2. Row tops: a row's carry word is
     * at most 2K-1 and was written before only by the previous row's carry, so it cannot
     * overflow. */
    template <int K = N>
    FF_INLINE static void sqr_wide(uint32_t* w, const uint32_t* a) {
        uint32_t odd[2 * K], even[2 * K];
#pragma unroll
        for (int k = 0; k < 2 * K; k++) odd[k] = even[k] = 0;
#pragma unroll
        for (int i = 0; i < K - 1; i++) {
            sqr_row<K>(odd, a, i, i + 1);
            if (i + 2 < K) sqr_row<K>(even, a, i, i + 2);
        }
        ptx::cc_t cc;
        uint32_t s[2 * K];  /* cross-product sum < 2^(64K - 1) */
        s[0] = ptx::add_cc(odd[0], even[0], cc);
#pragma unroll
        for (int k = 1; k < 2 * K - 1; k++) s[k] = ptx::addc_cc(odd[k], even[k], cc);
        s[2 * K - 1] = ptx::addc(odd[2 * K - 1], even[2 * K - 1], cc);
        w[0] = s[0] << 1;
#pragma unroll
        for (int k = 1; k < 2 * K; k++) w[k] = (s[k] << 1) | (s[k - 1] >> 31);
        w[0] = ptx::mad_lo_cc(a[0], a[0], w[0], cc);
        w[1] = ptx::madc_hi_cc(a[0], a[0], w[1], cc);
#pragma unroll
        for (int i = 1; i < K - 1; i++) {
            w[2 * i] = ptx::madc_lo_cc(a[i], a[i], w[2 * i], cc);
            w[2 * i + 1] = ptx::madc_hi_cc(a[i], a[i], w[2 * i + 1], cc);
        }
        w[2 * K - 2] = ptx::madc_lo_cc(a[K - 1], a[K - 1], w[2 * K - 2], cc);
        w[2 * K - 1] = ptx::madc_hi(a[K - 1], a[K - 1], w[2 * K - 1], cc);
    }
    /* One Montgomery reduction step on the even/odd accumulators (as mad_n_redc without the
     * a * b row): the one-word shift of hi is fused into the m * p_odd chain. */
    FF_INLINE static void redc_step(uint32_t* lo, uint32_t* hi, const uint32_t* P, bool first) {
        ptx::cc_t cc;
        if (first) {
            uint32_t m = lo[0] * F::M0;
            mul_n(hi, P + 1, m);
            cmad_n(lo, P, m, cc);
        } else {
            uint32_t m = (lo[0] + hi[1]) * F::M0;  /* word 0 of the value, before the chain */
            lo[0] = ptx::add_cc(lo[0], hi[1], cc);
            madc_n_rshift(hi, P + 1, m, cc);
            cmad_n(lo, P, m, cc);
        }
        hi[N - 1] = ptx::addc(hi[N - 1], 0, cc);
    }
    /* a^2 R^-1 = REDC(w_lo) + w_hi with w = a^2: REDC(w_lo) <= p and w_hi < p - 1, so the
     * sum is < 2p and one final subtraction makes it canonical. */
    FF_INLINE mont_t sqr() const {
        uint32_t w[2 * N];
        sqr_wide(w, l);
        return redc_wide(w);
    }

    /* w R^-1 mod p for a 2N-word w < p R (high half below p): REDC of the low half plus
     * the high half; the sum is < 2p and one final subtraction makes it canonical.
     * Shared by sqr() and the lazy Fq2 product (ff/fp2_lazy.cuh). Clobbers w. */
    FF_INLINE static mont_t redc_wide(uint32_t* w) {
        uint32_t P[N], odd[N];
        load_mod(P);
#pragma unroll
        for (int i = 0; i < N; i += 2) {
            redc_step(w, odd, P, i == 0);  /* w[0..N) is the low accumulator ("even") */
            redc_step(odd, w, P, false);
        }
        ptx::cc_t cc;
        mont_t r;
        r.l[0] = ptx::add_cc(w[0], odd[1], cc);
#pragma unroll
        for (int i = 1; i < N - 1; i++) r.l[i] = ptx::addc_cc(w[i], odd[i + 1], cc);
        r.l[N - 1] = ptx::addc(w[N - 1], 0, cc);
        r.l[0] = ptx::add_cc(r.l[0], w[N], cc);
#pragma unroll
        for (int i = 1; i < N - 1; i++) r.l[i] = ptx::addc_cc(r.l[i], w[N + i], cc);
        r.l[N - 1] = ptx::addc(r.l[N - 1], w[2 * N - 1], cc);
        final_sub(r.l);
        return r;
    }

    /* ------------------------------------------------------------ wide products */
    /* w (2K words) = a * b for K-word a, b (K even), schoolbook. Product a[j] b[i] lands on
     * words {i+j, i+j+1}: those with i + j even go to accumulator A at that index, the others
     * to B one word lower (B stands a word higher), so every pair starts on an even index
     * (an aligned register pair for IMAD.WIDE; a split by the parity of j alone costs ~600
     * MOVs per Fq2 product) and each row is one carry chain in A and one in B. Row i's carry
     * lands on a word that only an earlier row's carry touched, and neither accumulator
     * exceeds a * b < 2^(64K), so the last rows carry nothing out. */
    template <int K>
    FF_INLINE static void mul_wide(uint32_t* w, const uint32_t* a, const uint32_t* b) {
        uint32_t A[2 * K], B[2 * K];
#pragma unroll
        for (int j = 0; j < K; j += 2) {  /* row 0: plain products */
            A[j] = ptx::mul_lo(a[j], b[0]);
            A[j + 1] = ptx::mul_hi(a[j], b[0]);
            B[j] = ptx::mul_lo(a[j + 1], b[0]);
            B[j + 1] = ptx::mul_hi(a[j + 1], b[0]);
        }
#pragma unroll
        for (int k = K; k < 2 * K; k++) A[k] = B[k] = 0;
#pragma unroll
        for (int i = 1; i < K; i++) {
#pragma unroll
            for (int into_b = 0; into_b < 2; into_b++) {
                uint32_t* acc = into_b ? B : A;
                /* j runs over the parity that makes i + j even (A) or odd (B) */
                int j0 = (i & 1) ^ into_b, sh = into_b;
                ptx::cc_t cc;
                int p = i + j0 - sh;
                acc[p] = ptx::mad_lo_cc(a[j0], b[i], acc[p], cc);
                acc[p + 1] = ptx::madc_hi_cc(a[j0], b[i], acc[p + 1], cc);
#pragma unroll
                for (int j = j0 + 2; j < K; j += 2) {
                    p = i + j - sh;
                    acc[p] = ptx::madc_lo_cc(a[j], b[i], acc[p], cc);
                    acc[p + 1] = ptx::madc_hi_cc(a[j], b[i], acc[p + 1], cc);
                }
                if (p + 2 < 2 * K) acc[p + 2] = ptx::addc(acc[p + 2], 0, cc);
            }
        }
        ptx::cc_t cc;
        w[0] = A[0];
        w[1] = ptx::add_cc(A[1], B[0], cc);
#pragma unroll
        for (int k = 2; k < 2 * K - 1; k++) w[k] = ptx::addc_cc(A[k], B[k - 1], cc);
        w[2 * K - 1] = ptx::addc(A[2 * K - 1], B[2 * K - 2], cc);
    }

    FF_INLINE mont_t& operator+=(const mont_t& b) { return *this = *this + b; }
    FF_INLINE mont_t& operator-=(const mont_t& b) { return *this = *this - b; }
    FF_INLINE mont_t& operator*=(const mont_t& b) { return *this = *this * b; }

    /* ------------------------------------------------------------ conversions */
    /* x * R^2 * R^-1: standard form in, Montgomery form out. */
    FF_INLINE mont_t to_mont() const {
        mont_t rr;
#pragma unroll
        for (int i = 0; i < N; i++) rr.l[i] = F::rr(i);
        return *this * rr;
    }
    /* x * 1 * R^-1: Montgomery form in, standard form out. */
    FF_INLINE mont_t from_mont() const {
        mont_t u = zero();
        u.l[0] = 1;
        return u * *this;  /* a = 1 (canonical), b = this: any b is fine */
    }

    /* a^e for a small exponent (square-and-multiply, MSB first). */
    FF_INLINE mont_t pow_u32(uint32_t e) const {
        mont_t r = one();
#pragma unroll 1
        for (int bit = 31; bit >= 0; bit--) {
            r = r.sqr();
            if ((e >> bit) & 1) r = r * *this;
        }
        return r;
    }
    /* a^(p-2) = a^-1 (Fermat); 0 maps to 0. ~1.5 log2(p) multiplies: for rare use. */
    FF_INLINE mont_t inv() const {
        mont_t r = one();
#pragma unroll 1
        for (int w = N - 1; w >= 0; w--) {
            uint32_t ew = F::pm2(w);
#pragma unroll 1
            for (int bit = 31; bit >= 0; bit--) {
                r = r.sqr();
                if ((ew >> bit) & 1) r = r * *this;
            }
        }
        return r;
    }
};
