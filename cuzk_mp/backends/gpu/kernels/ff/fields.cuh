/* Field traits of BLS12-381 for mont_t: Fq (12 words) and Fr (8 words).
 *
 * The word tables come from the generated bls12_381.cuh; each accessor builds a
 * local array from the macro list, so a constant index folds to an immediate.
 */
#pragma once
#include "bls12_381.cuh"
#include "mont.cuh"

#define FF_WORD_TABLE(fn, LIST, n)                                    \
    FF_INLINE static uint32_t fn(int i) {                               \
        const uint32_t t[n] = {LIST};                                   \
        return t[i];                                                    \
    }

struct fq_field {
    static constexpr int N = FQ_NWORDS;
    static constexpr uint32_t M0 = FQ_M0;
    FF_WORD_TABLE(mod, FQ_MOD, FQ_NWORDS)
    FF_WORD_TABLE(one, FQ_ONE, FQ_NWORDS)
    FF_WORD_TABLE(rr, FQ_RR, FQ_NWORDS)
    FF_WORD_TABLE(pm2, FQ_PM2, FQ_NWORDS)
};

struct fr_field {
    static constexpr int N = FR_NWORDS;
    static constexpr uint32_t M0 = FR_M0;
    FF_WORD_TABLE(mod, FR_MOD, FR_NWORDS)
    FF_WORD_TABLE(one, FR_ONE, FR_NWORDS)
    FF_WORD_TABLE(rr, FR_RR, FR_NWORDS)
    FF_WORD_TABLE(pm2, FR_PM2, FR_NWORDS)
};

#undef FF_WORD_TABLE
