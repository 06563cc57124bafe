pragma circom 2.0.0;

// Only public signals: 10 public inputs, 10 outputs and no private wire at all, so the key's C
// section is empty (nVars = nPublic + 1). nConstraints + nPublic + 1 = 10 + 20 + 1 = 31: one below
// a power of two (domain 2^5).
template PublicOnly(n) {
    signal input x[n];
    signal output y[n];
    for (var i = 0; i < n; i++) {
        y[i] <== x[i] * x[i];
    }
}

component main {public [x]} = PublicOnly(10);
