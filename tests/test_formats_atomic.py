"""Output files (cuzk_mp.formats.atomic): what each kind of output path gets.

Oracles: the file system itself (``os.stat``, ``os.readlink``), the bytes read back, and a reader
process on a FIFO; the errors' messages name the path the caller gave.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import threading
from pathlib import Path

import pytest

from cuzk_mp.errors import InputError, OutputError
from cuzk_mp.formats.atomic import atomic_output, write_json, write_json_files


def leftovers(folder: Path) -> list[Path]:
    return sorted(folder.glob(".cuzk-mp-*"))


def test_a_new_file_and_a_replaced_one(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    write_json(path, [1])
    assert path.read_text() == "[\n 1\n]"
    path.chmod(0o600)  # a private file stays private when it is replaced
    write_json(path, {"a": "2"})
    assert path.read_text() == '{\n "a": "2"\n}'
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not leftovers(tmp_path)


def test_a_link_is_written_through(tmp_path: Path) -> None:
    target, link = tmp_path / "real.json", tmp_path / "link.json"
    target.write_text("old")
    link.symlink_to(target.name)
    write_json(link, [2])
    assert link.is_symlink() and os.readlink(link) == target.name
    assert target.read_text() == "[\n 2\n]"
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to("made.json")  # as `echo > dangling` does: the file it names is made
    write_json(dangling, [3])
    assert dangling.is_symlink() and (tmp_path / "made.json").read_text() == "[\n 3\n]"
    assert not leftovers(tmp_path)


def test_a_fifo_is_written_in_place(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_json(fifo, {"x": "1"})
    reader.join(timeout=30)
    assert got == [b'{\n "x": "1"\n}']
    assert stat.S_ISFIFO(fifo.stat().st_mode)  # still a FIFO, not a regular file put in its place
    assert not leftovers(tmp_path)


def test_a_pair_of_fifos_is_written_in_order(tmp_path: Path) -> None:
    """A reader that reads the proof's pipe to its end, then the public signals' (snarkjs's order):
    each output is written whole and closed before the next opens, so neither side waits forever."""
    proof, public, regular = tmp_path / "proof.fifo", tmp_path / "public.fifo", tmp_path / "vk.json"
    os.mkfifo(proof)
    os.mkfifo(public)
    got: list[bytes] = []

    def read_in_order() -> None:
        got.append(proof.read_bytes())
        got.append(public.read_bytes())

    reader = threading.Thread(target=read_in_order, daemon=True)
    reader.start()
    writer = threading.Thread(target=write_json_files, args=([(proof, ["p"]), (public, ["s"]), (regular, ["v"])],),
                              daemon=True)
    writer.start()
    writer.join(timeout=20)
    reader.join(timeout=20)
    assert not writer.is_alive() and not reader.is_alive(), "writer and reader wait on each other"
    assert got == [b'[\n "p"\n]', b'[\n "s"\n]'] and regular.read_text() == '[\n "v"\n]'


def test_a_full_device_is_an_output_error_and_stays_a_device() -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with pytest.raises(OutputError, match="^/dev/full: cannot write it: No space left on device"):
        write_json("/dev/full", [1])
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_errors_name_the_path_given(tmp_path: Path) -> None:
    folder = tmp_path / "adir"
    folder.mkdir()
    with pytest.raises(OutputError, match=f"^{folder}: cannot write it: is a folder$"):
        write_json(folder, [1])
    under_a_file = tmp_path / "afile"
    under_a_file.write_text("")
    with pytest.raises(OutputError, match=f"^{under_a_file}/x.json: cannot write it: Not a directory$"):
        write_json(under_a_file / "x.json", [1])
    with pytest.raises(OutputError, match=f"^{tmp_path}/no/x.json: cannot write it: No such file or directory$"):
        write_json(tmp_path / "no" / "x.json", [1])
    assert isinstance(OutputError("p", "why"), InputError)  # exit code 2 at the command line
    assert not leftovers(tmp_path)


def test_a_name_at_the_length_limit(tmp_path: Path) -> None:
    path = tmp_path / ("p" * 250 + ".json")
    write_json(path, [1])
    assert path.read_text() == "[\n 1\n]"


def test_several_files_all_or_none(tmp_path: Path) -> None:
    proof, public = tmp_path / "proof.json", tmp_path / "no" / "public.json"
    with pytest.raises(OutputError, match="public.json"):
        write_json_files([(proof, [1]), (public, [2])])
    assert not proof.exists() and not leftovers(tmp_path)
    public = tmp_path / "public.json"
    write_json_files([(proof, [1]), (public, [2])])
    assert proof.read_text() == "[\n 1\n]" and public.read_text() == "[\n 2\n]"


def test_the_callers_own_errors_pass_through(tmp_path: Path) -> None:
    """An OSError of another file, raised while the output is written, is the caller's: not an
    OutputError of the output; the output is not made."""
    out = tmp_path / "out.bin"
    with pytest.raises(FileNotFoundError) as info, atomic_output(out) as f:
        f.write(b"begun")
        (tmp_path / "missing-input").read_bytes()
    assert not isinstance(info.value, OutputError)
    assert not out.exists() and not leftovers(tmp_path)


def test_an_open_descriptor_is_written_in_place(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """/dev/fd/N (and /dev/stdout, a link to /proc/self/fd/1): the file behind the descriptor gets
    the bytes appended (a shell's `>> log` stays a log), and keeps its inode; a pipe's reader
    gets them; no link or file is replaced."""
    log = tmp_path / "log.txt"
    log.write_text("before\n")
    inode = log.stat().st_ino
    with open(log, "ab") as held:
        write_json(f"/dev/fd/{held.fileno()}", [1])
    assert log.read_text() == "before\n[\n 1\n]" and log.stat().st_ino == inode
    r, w = os.pipe()
    try:
        write_json(f"/dev/fd/{w}", {"y": "2"})
        os.close(w)
        w = -1
        assert os.read(r, 1000) == b'{\n "y": "2"\n}'
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
    stdout_was_link = os.path.islink("/dev/stdout")
    capfd.readouterr()
    write_json("/dev/stdout", [3])
    assert capfd.readouterr().out == "[\n 3\n]"
    assert os.path.islink("/dev/stdout") == stdout_was_link  # written through, never replaced
    assert not leftovers(tmp_path)


def test_two_writers_of_one_pair_leave_one_writers_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer stalled between its two renames: a second writer of the same pair waits for it, so the
    pair left is one writer's (never A's proof beside B's public signals)."""
    import threading
    import time

    from cuzk_mp.formats import atomic

    proof, public = tmp_path / "proof.json", tmp_path / "public.json"
    real_replace = os.replace
    first_rename = threading.Event()

    def slow_replace(src: str, dst: str) -> None:
        real_replace(src, dst)
        if threading.current_thread().name == "A" and not first_rename.is_set():
            first_rename.set()
            time.sleep(0.5)  # A stalls between its renames

    monkeypatch.setattr(atomic.os, "replace", slow_replace)
    a = threading.Thread(target=atomic.write_json_files, args=([(proof, {"w": "A"}), (public, ["A"])],), name="A")
    a.start()
    assert first_rename.wait(5)
    atomic.write_json_files([(proof, {"w": "B"}), (public, ["B"])])  # waits for A's second rename
    a.join()
    pair = (json.loads(proof.read_text())["w"], json.loads(public.read_text())[0])
    assert pair == ("B", "B"), pair


def test_a_pair_is_whole_on_disk_before_either_is_renamed(tmp_path: Path) -> None:
    """A full disk (or a file size limit) often refuses a file's bytes only when they leave the
    process's buffer, at its close: the second file of a pair must not be renamed into place before
    the first one's bytes are known to be written, else a new public.json is left beside no proof,
    or beside the proof of another run. Here the proof is refused at its flush (RLIMIT_FSIZE)."""
    import resource
    import signal

    proof, public = tmp_path / "proof.json", tmp_path / "public.json"
    write_json_files([(proof, ["old proof"]), (public, ["old public"])])
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an EFBIG error, not the process killed
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, hard))
        with pytest.raises(OutputError, match=f"^{proof}: cannot write it: File too large$"):
            write_json_files([(proof, ["x" * 4000]), (public, ["new public"])])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    assert json.loads(proof.read_text()) == ["old proof"]
    assert json.loads(public.read_text()) == ["old public"]
    assert not leftovers(tmp_path)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_between_the_renames_of_a_pair_leaves_the_new_pair(sig: signal.Signals, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C (or the SIGTERM a one-shot command turns into the same stop) as the first file of a
    pair is renamed into place: the second is renamed too before the stop is raised, so the pair
    left is the new one, never a new public.json beside the proof of another run."""
    from cuzk_mp import cli
    from cuzk_mp.formats import atomic

    previous = signal.signal(signal.SIGTERM, cli._terminate)
    proof, public = tmp_path / "proof.json", tmp_path / "public.json"
    try:
        write_json_files([(proof, {"run": 1}), (public, ["1"])])
        real_replace = os.replace
        renames: list[str] = []

        def replace_then_stop(src: str, dst: str) -> None:
            real_replace(src, dst)
            renames.append(dst)
            if len(renames) == 1:
                os.kill(os.getpid(), sig)  # the stop comes right after the first rename

        monkeypatch.setattr(atomic.os, "replace", replace_then_stop)
        with pytest.raises(KeyboardInterrupt):
            write_json_files([(proof, {"run": 2}), (public, ["2"])])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert (json.loads(proof.read_text()), json.loads(public.read_text())) == ({"run": 2}, ["2"])
    assert not leftovers(tmp_path)
