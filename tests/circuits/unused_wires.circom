pragma circom 2.0.0;

// Compiled with --O0, which keeps what --O2 would simplify away: wires in no constraint and
// constraints whose A and B are empty. The public input p and the private input q appear in no
// constraint, and `free` is assigned but never constrained (its A, B and C columns are zero: points
// at infinity in the key); `s <== a + b` and `v <== u - s` are linear (A and B empty).
// nConstraints + nPublic + 1 = 5 + 3 + 1 = 9: one above a power of two (domain 2^4).
template UnusedWires() {
    signal input a;
    signal input b;
    signal input p;
    signal input q;
    signal output s;
    signal output m;
    signal free;
    signal t;
    signal u;
    signal v;
    free <-- a + q;
    s <== a + b;
    m <== a * b;
    t <== m * a;
    u <== t * b;
    v <== u - s;
}

component main {public [p]} = UnusedWires();
