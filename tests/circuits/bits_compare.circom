pragma circom 2.0.0;

// Shape (b): bit decompositions, comparators and range checks (field-independent circomlib
// templates only: Num2Bits(n < 255), LessThan(n <= 252), Bits2Num).
// For K pairs (x, y) of N-bit numbers, with public bounds [lower, upper):
//   in_range[i] = lower <= x_i < upper,  x_lt_y[i] = x_i < y_i,
//   popcount = number of 1-bits over all x_i,  packed = the low bits of all x_i as one number.
// Every private number is range-checked by Num2Bits(N): a value >= 2^N fails witness
// generation with circom's "Assert Failed ... Num2Bits" error (used by the error tests).
include "circomlib/circuits/bitify.circom";
include "circomlib/circuits/comparators.circom";

template BitsCompare(N, K) {
    signal input lower;
    signal input upper;
    signal input pairs[K][2];
    signal output in_range[K];
    signal output x_lt_y[K];
    signal output popcount;
    signal output packed;

    component bounds[2];
    bounds[0] = Num2Bits(N);
    bounds[0].in <== lower;
    bounds[1] = Num2Bits(N);
    bounds[1].in <== upper;

    component xbits[K];
    component ybits[K];
    component above[K];
    component below[K];
    component less[K];
    component low = Bits2Num(K);
    var ones = 0;
    for (var i = 0; i < K; i++) {
        xbits[i] = Num2Bits(N);
        xbits[i].in <== pairs[i][0];
        ybits[i] = Num2Bits(N);
        ybits[i].in <== pairs[i][1];
        for (var j = 0; j < N; j++) {
            ones += xbits[i].out[j];
        }
        low.in[i] <== xbits[i].out[0];

        above[i] = GreaterEqThan(N);
        above[i].in[0] <== pairs[i][0];
        above[i].in[1] <== lower;
        below[i] = LessThan(N);
        below[i].in[0] <== pairs[i][0];
        below[i].in[1] <== upper;
        in_range[i] <== above[i].out * below[i].out;

        less[i] = LessThan(N);
        less[i].in[0] <== pairs[i][0];
        less[i].in[1] <== pairs[i][1];
        x_lt_y[i] <== less[i].out;
    }
    popcount <== ones;
    packed <== low.out;
}

component main {public [lower, upper]} = BitsCompare(32, 4);
