pragma circom 2.0.0;

// Shape (c): one SHA-256 compression (circomlib Sha256 over a 55-byte message = 440 bits,
// which pads to exactly one 512-bit block), about 30k constraints: the largest test circuit.
// Private input: the message bytes (each range-checked by Num2Bits(8), bits fed MSB first);
// public outputs: the digest as two 128-bit numbers (big-endian halves), so a test can
// compare them with hashlib.sha256.
include "circomlib/circuits/sha256/sha256.circom";
include "circomlib/circuits/bitify.circom";

template Sha256Block(NBYTES) {
    signal input msg[NBYTES];
    signal output digest_hi;
    signal output digest_lo;

    component bytes[NBYTES];
    component sha = Sha256(NBYTES * 8);
    for (var i = 0; i < NBYTES; i++) {
        bytes[i] = Num2Bits(8);
        bytes[i].in <== msg[i];
        for (var j = 0; j < 8; j++) {
            sha.in[i * 8 + j] <== bytes[i].out[7 - j];
        }
    }

    component hi = Bits2Num(128);
    component lo = Bits2Num(128);
    for (var k = 0; k < 128; k++) {
        hi.in[k] <== sha.out[127 - k];
        lo.in[k] <== sha.out[255 - k];
    }
    digest_hi <== hi.out;
    digest_lo <== lo.out;
}

component main = Sha256Block(55);
