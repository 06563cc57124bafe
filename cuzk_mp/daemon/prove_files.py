"""One snarkjs-style proof through a daemon: a witness (or input JSON) file in, proof.json and
public.json out.

Why: ``groth16 prove|fullprove --connect`` and ``--keep-warm`` hand a one-shot command's work to a
resident daemon, so the calling process only reads one file, waits and writes two: no numpy, no
curve arithmetic, no accelerator start (~0.2 s a process, perf/results/daemon-latency-gpu-2^16-h200.json).
This module owns that exchange; the command line decides which daemon (cuzk_mp.cli, and
:mod:`.warm` for the warm ones). Errors keep the one-shot command's meaning: the daemon's InputError
comes back as an InputError naming the caller's file (the daemon knows it only as its job's
partition 0), a failed job as a ProofError, and a daemon out of reach as :class:`Unreachable`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cuzk_mp.daemon import protocol as P
from cuzk_mp.daemon.client import REQUEST_CARRIES, Client, name_input_file, partition_from_file, read_request_file
from cuzk_mp.daemon.transport import DEFAULT_MAX_FRAME, CommClosedError, FrameTooLarge, NotTheProtocol
from cuzk_mp.errors import AuthError, InputError, ProofError, error_from_kind
from cuzk_mp.formats.atomic import write_json_files


class Unreachable(Exception):
    """The daemon did not answer or went away mid-call (nothing was written)."""


def witness_partition(wtns: Path) -> P.PartitionIn:
    """The job partition of a .wtns file (InputError for another suffix: a daemon takes .wtns), read no
    further than one request carries."""
    if wtns.suffix != ".wtns":
        raise InputError(f"{wtns}: a daemon proves from a .wtns witness")
    return partition_from_file(wtns)


_PROVE_WITHOUT = "; prove it without --connect or --keep-warm"
_WAY_OUT = REQUEST_CARRIES + _PROVE_WITHOUT


def input_partition(input_json: Path, max_bytes: int = DEFAULT_MAX_FRAME) -> P.PartitionIn:
    """The job partition of a circuit input (JSON, whatever the file's name): the daemon's wasm
    computes the witness. A file over ``max_bytes``, more than one request can carry (a one-shot
    process reads larger ones), is refused naming the way out, after reading at most
    ``max_bytes`` + 1 of it (a file of any size, a FIFO) and before a daemon is started for it."""
    data = read_request_file(input_json, max_bytes, binary=False, way_out=_PROVE_WITHOUT)
    return P.PartitionIn(kind="json", data=data)


def prove_to_files(addr: str, token: str, circuit: str | None, zkey: Path, source: Path, part: P.PartitionIn,
                   proof: Path, public: Path, request_id: str = "") -> tuple[str, str]:
    """Have the daemon at ``addr`` prove ``part`` (read from ``source``) with its circuit ``circuit``,
    or the one whose key file is ``zkey`` (:func:`circuit_of_key`); write ``proof`` and ``public``
    atomically. Returns (the daemon's circuit id, its job id). A caller that may send the same
    proof again (after losing the daemon) gives the same ``request_id``: the daemon, restarted
    from its journal, answers with that job instead of proving it twice."""
    try:
        client = Client(addr, token=token)
    except OSError as unreachable:
        raise Unreachable(f"cannot reach the daemon at {addr}: {unreachable}") from None
    try:
        with client:
            cid = circuit or circuit_of_key(client, zkey, addr)
            try:
                reply = client.prove(cid, [part], request_id=request_id)
            except InputError as refused:  # the daemon's check at submit names the job's field: name the file
                if isinstance(refused, AuthError):
                    raise
                if isinstance(refused, FrameTooLarge):  # the request: a job's one-partition reply always fits
                    raise InputError(f"{source}: {len(part.data)} bytes and the request's envelope, more than "
                                     f"the {client.max_frame_bytes} bytes {_WAY_OUT}") from None
                raise InputError(name_input_file(str(refused), [source]) or f"{source}: {refused}") from None
    except NotTheProtocol as http:
        raise Unreachable(f"cannot reach the daemon at {addr}: {http}") from None
    except (CommClosedError, ConnectionError, TimeoutError) as lost:
        raise Unreachable(f"lost the daemon at {addr}: {lost}") from None
    if reply.state != "done":
        why = error_from_kind(reply.error_kind or "", reply.error or f"job {reply.job_id} {reply.state}")
        if isinstance(why, InputError):
            raise type(why)(f"{source}: {why}")
        raise ProofError(f"the daemon's job {reply.job_id} {reply.state}: {why}")
    done = reply.partitions[0]
    write_json_files([(proof, done.proof), (public, done.public)])
    return cid, reply.job_id


def circuit_of_key(client: Client, zkey: Path, addr: str) -> str:
    """The daemon's circuit whose configured ``zkey`` is the file ``zkey`` (InputError if none).

    The match is the file's identity (:func:`os.path.samefile`: the same device and inode, however
    the path is spelt: relative, through a symlink), not its name or its contents: a copy of the
    key is another file, one the daemon never read, and hashing a key of several GiB here would
    cost more than the proof. The status document names files by their last component only
    unless its ``detail`` is asked for (:mod:`cuzk_mp.daemon.access`), so the key paths come from
    ``status(detail=True)``; a daemon with tokens gives the detail to an admin token only (one
    without tokens to every caller), and for any other token --connect stops with an AuthError
    saying so (exit 2) rather than guess from a bare file name, which another circuit's key may
    share. The paths are compared on this machine: a daemon on another host matches a key only
    through a file system both see at the same path."""
    try:
        circuits: dict[str, Any] = client.status(detail=True)["daemon"]["circuits"]
    except AuthError as refused:
        raise AuthError(f"--connect finds the circuit by its key file, and the daemon at {addr} shows key "
                        f"files to an admin token only ({refused}); pass an admin token with --token or "
                        "$CUZK_MP_TOKEN, or name the circuit: cuzk-mp client prove --circuit ID") from None
    for cid, c in sorted(circuits.items()):
        try:
            if c.get("zkey") and os.path.samefile(c["zkey"], zkey):
                return str(cid)
        except OSError:  # the daemon's key path is no file here
            continue
    keys = ", ".join(f"{cid}: {c.get('zkey') or 'synthetic'}" for cid, c in sorted(circuits.items()))
    raise InputError(f"the daemon at {addr} has no circuit with the key {zkey} (its circuits: {keys or 'none'})")
