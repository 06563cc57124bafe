pragma circom 2.0.0;

// Smallest useful circuit: one private factor pair, one public product.
// Fast smoke test for witness generation and the prove/verify round trip.
template Multiplier() {
    signal input a;
    signal input b;
    signal output c;
    c <== a * b;
}

component main = Multiplier();
