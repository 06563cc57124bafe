/* fp_t: an element of Fq (BLS12-381 base field, 381 bits) in Montgomery form.
 *
 * Storage is 12 x 32-bit words (PTX carry chains; see mont.cuh for the multiply
 * and why the 32-bit form was chosen). load/store move 6 little-endian uint64
 * limbs, the zkey coordinate layout, so a point array uploaded from a zkey is
 * read as is. API (all __host__ __device__ inline): zero() one() load() store()
 * + - * sqr() dbl() neg() is_zero() == != += -= *= inv() to_mont() from_mont().
 */
#pragma once
#include "fields.cuh"

typedef mont_t<fq_field> fp_t;
