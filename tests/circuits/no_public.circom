pragma circom 2.0.0;

// No public signal at all (nPublic = 0: no public input, no output): the verification key's IC is
// one point and public.json is []. nConstraints + nPublic + 1 = 1 + 0 + 1 = 2: exactly a power of
// two, the smallest domain (2^1).
template NoPublic() {
    signal input a;
    signal input b;
    signal c;
    c <== a * b;
}

component main = NoPublic();
