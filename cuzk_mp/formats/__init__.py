"""snarkjs-compatible file formats: .r1cs, .wtns, .zkey (iden3 binfiles) and snarkjs JSON.

Readers validate at the entry and raise :class:`cuzk_mp.errors.FormatError`
naming the file, the section and what is wrong; writers stream big sections.
Byte layouts are cited section by section in each module (snarkjs's binary
file and JSON formats).

* :mod:`.binfile` -- the container: :class:`BinFile` (mmap, zero-copy section
  views) and :func:`write_binfile`;
* :mod:`.r1cs` -- :class:`R1CS`, :func:`read_r1cs`, :func:`write_r1cs`;
* :mod:`.wtns` -- :func:`read_wtns`, :func:`write_wtns`, :func:`wtns_bytes`;
* :mod:`.zkey` -- :class:`ZKey`, :func:`read_zkey`, :func:`write_zkey`,
  ``COEF_DTYPE``, :func:`coef_matrices`;
* :mod:`.snarkjs_json` -- :class:`Proof`, :class:`VerificationKey` and their
  JSON forms, public signals, :func:`read_json` / :func:`write_json`.

Submodules are imported on use (``from cuzk_mp.formats.zkey import read_zkey``),
so reading JSON does not compile the binary parsers' numba kernels.
"""
