pragma circom 2.0.0;

// Shape (a): a chain of hashes with public outputs.
// digest = MiMC7 applied N times, each step absorbing one private salt under a public key;
// commitment = Poseidon(digest, seed, key).
// circomlib's MiMC7/Poseidon constants are BN254's; over BLS12-381 they are still
// permutations (x^7, x^5 are bijective on F_r), so the circuit is well-formed, just not a
// standard BLS12-381 hash instance (see snarkjs-formats.md, "circomlib over BLS12-381").
include "circomlib/circuits/mimc.circom";
include "circomlib/circuits/poseidon.circom";

template MimcChain(N) {
    signal input key;
    signal input seed;
    signal input salt[N];
    signal output digest;
    signal output commitment;

    component step[N];
    signal acc[N + 1];
    acc[0] <== seed;
    for (var i = 0; i < N; i++) {
        step[i] = MiMC7(91);
        step[i].x_in <== acc[i] + salt[i];
        step[i].k <== key;
        acc[i + 1] <== step[i].out;
    }
    digest <== acc[N];

    component commit = Poseidon(3);
    commit.inputs[0] <== digest;
    commit.inputs[1] <== seed;
    commit.inputs[2] <== key;
    commitment <== commit.out;
}

component main {public [key]} = MimcChain(2);
