/* Scalar side of the MSM: 0/1/other classification and signed-digit (Booth) keys.
 *
 * Scalars are (m, 4) uint64, standard form, little-endian limbs, < 2^255 (every
 * canonical Fr element is). A c-bit window w covers bits [w c, w c + c); its
 * signed digit is  d_w = raw_w + t_w - 2^c t_(w+1),  t_w = bit (w c - 1), t_0 = 0,
 * so d_w is in [-2^(c-1), 2^(c-1)] and depends only on the c + 1 bits starting at
 * bit w c - 1 (no carry chain between windows). sum_w d_w 2^(w c) = s as long as
 * the top window's t is 0, i.e. W c >= 256 with bit 255 clear (the host picks
 * W = ceil(256 / c), and msm_classify flags any scalar with bit 255 set).
 *
 * Sort keys (the host sorts the keys of a batch of windows at once; cfg = c | wb << 8).
 * The m scalars may be the vectors of several MSMs over the same points, `per` scalars
 * each (a batch of proofs: scalar i belongs to MSM j = i / per, point i - j per); each
 * MSM has its own bucket sets (j = 0 and per = m for a single MSM):
 *   wb = 0, one bucket set per window and MSM:
 *     key = (j nw + wl) << c | (|d| - 1) << 1 | (d < 0);  bucket key >> 1
 *     (= (j nw + wl) 2^(c-1) + |d| - 1);
 *   wb > 0, precomputed multiples 2^(c w) P of every point (all windows of an MSM share ONE
 *   bucket set, the window only picks the multiple):
 *     key = (j 2^(c-1) + |d| - 1) << (1 + wb) | wl << 1 | (d < 0);  bucket key >> (1 + wb).
 * Either way the keys of one bucket sort together, and a zero digit gets MSM_KEY_NONE,
 * which sorts after every real key. The accumulation finds an entry's scalar and point
 * from its position in the key array (msm_entry_row), not from the key.
 */
#pragma once
#include "../common/types.cuh"

#define MSM_KEY_NONE 0xffffffffu
#define MSM_BUCKET_NONE 0x7fffffffu /* MSM_KEY_NONE >> 1: never a real bucket id */

FF_INLINE uint32_t msm_cfg_c(uint32_t cfg) { return cfg & 0xff; }
FF_INLINE uint32_t msm_cfg_wb(uint32_t cfg) { return (cfg >> 8) & 0xff; }
FF_INLINE uint32_t msm_key_bucket(uint32_t key, uint32_t cfg) { return key >> (1 + msm_cfg_wb(cfg)); }
/* The key of digit +-mag of MSM j (of a batch) in local window wl of nw. */
FF_INLINE uint32_t msm_key(uint32_t j, uint32_t nw, uint32_t wl, uint32_t mag, uint32_t neg, uint32_t cfg) {
    uint32_t wb = msm_cfg_wb(cfg), c = msm_cfg_c(cfg);
    return wb ? (((j << (c - 1)) + mag - 1) << (1 + wb)) | (wl << 1) | neg
              : ((j * nw + wl) << c) | ((mag - 1) << 1) | neg;
}

/* The point row of the entry at key position p = wl m + i (m scalars in all, `per` per MSM
 * of a batch): row wl stride + tail_idx[i] (an index list: a single MSM), else wl stride +
 * (i mod per). stride = 0 without precomputed multiples. */
FF_INLINE uint64_t msm_entry_row(uint64_t p, uint64_t m, uint64_t per, uint64_t stride, const int64_t* tail_idx) {
    uint64_t wl = p / m, i = p - wl * m;
    return wl * stride + (tail_idx ? (uint64_t)tail_idx[i] : (per == m ? i : i % per));
}

/* s[limb] of a scalar held in registers (limb < 4), by selects: indexing the array with a
 * runtime limb would put the scalar in local memory (a stack copy, reloaded every window). */
FF_INLINE uint64_t msm_scalar_limb(const uint64_t* s, uint32_t limb) {
    uint64_t v = s[0];
    v = limb == 1 ? s[1] : v;
    v = limb == 2 ? s[2] : v;
    return limb == 3 ? s[3] : v;
}

/* Bits [pos, pos + len) of a 256-bit scalar in registers (len <= 32; bits past 255 read as 0). */
FF_INLINE uint32_t msm_scalar_bits(const uint64_t* s, uint32_t pos, uint32_t len) {
    uint32_t limb = pos >> 6, off = pos & 63;
    if (limb >= 4) return 0;
    uint64_t v = msm_scalar_limb(s, limb) >> off;
    if (off + len > 64 && limb < 3) v |= msm_scalar_limb(s, limb + 1) << (64 - off);
    return (uint32_t)(v & ((1ull << len) - 1));
}

/* 0 = zero, 1 = one, 2 = anything else; sets *flag when bit 255 is set (the digit
 * recoding needs s < 2^255). Every writer stores the same value: no atomic needed. */
FF_INLINE void msm_classify_one(uint64_t i, const uint64_t* scalars, uint8_t* cls, uint32_t* flag) {
    const uint64_t* s = scalars + 4 * i;
    uint64_t s0 = s[0], hi = s[1] | s[2] | s[3];
    if (s[3] >> 63) *flag = 1u;
    cls[i] = hi ? 2 : (s0 == 0 ? 0 : (s0 == 1 ? 1 : 2));
}

/* Keys of scalar i (scalars[idx[i]] when idx is given) for windows w0 .. w0 + nw - 1,
 * written to keys[wl * m + i]; scalar i belongs to MSM i / per of the batch. */
FF_INLINE void msm_digits_one(uint64_t i, const uint64_t* scalars, const int64_t* idx, uint32_t* keys,
                              uint64_t m, uint32_t w0, uint32_t nw, uint32_t cfg, uint64_t per) {
    uint32_t c = msm_cfg_c(cfg);
    uint32_t j = per == m ? 0 : (uint32_t)(i / per);
    uint64_t row = idx ? (uint64_t)idx[i] : i;
    uint64_t s[4];
#pragma unroll
    for (int k = 0; k < 4; k++) s[k] = scalars[4 * row + k];
#pragma unroll 1
    for (uint32_t wl = 0; wl < nw; wl++) {
        uint32_t w = w0 + wl;
        /* v = bits [w c - 1, w c + c): bit 0 is t_w, bits 1..c are raw_w */
        uint32_t v = w == 0 ? msm_scalar_bits(s, 0, c) << 1 : msm_scalar_bits(s, w * c - 1, c + 1);
        int32_t d = (int32_t)(v >> 1) + (int32_t)(v & 1) - (int32_t)(((v >> c) & 1) << c);
        uint32_t key = MSM_KEY_NONE;
        if (d != 0) {
            key = msm_key(j, nw, wl, (uint32_t)(d < 0 ? -d : d), (uint32_t)(d < 0), cfg);
        }
        keys[(uint64_t)wl * m + i] = key;
    }
}
