/* fr_t: an element of Fr (BLS12-381 scalar field, 255 bits) in Montgomery form.
 *
 * Storage is 8 x 32-bit words; load/store move 4 little-endian uint64 limbs, the
 * layout of the (n, 4) uint64 Fr arrays everywhere in cuzk-mp. from_mont()
 * turns a Montgomery value into standard form (what MSM scalars are) and
 * to_mont() the reverse. Same API as fp_t (see fp.cuh).
 */
#pragma once
#include "fields.cuh"

typedef mont_t<fr_field> fr_t;
