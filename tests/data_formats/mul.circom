pragma circom 2.0.0;

// Tiny fixture circuit: 1 public output, 2 public inputs, 1 private input.
template Mul() {
    signal input a;
    signal input b;
    signal input c;
    signal output out;
    signal t;
    signal u;
    t <== a * b;
    u <== t * c + 3 * a - b;
    out <== u * u + 7;
}

component main {public [a, b]} = Mul();
