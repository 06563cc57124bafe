"""The files the journal opens at start (itself, its ``-wal``, ``-shm`` and ``-journal`` beside it, its ``.id``) are
regular files or absent: anything else there (a FIFO, a folder, a device) refuses the start naming the
file and what it is, without waiting on it; the write-ahead log is read a frame at a time, whatever
its size. Each start is run in a child process with a timeout, so a start that hangs fails the test."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from cuzk_mp.daemon.journal import Journal, JournalDamaged
from cuzk_mp.daemon.journal_wal import wal_damage
from cuzk_mp.errors import ConfigError
from tests.helpers import ENV, PY, REPO, config_text
from tests.test_journal_integrity import _crash_image, _fill

# Journal.open in a child process (its address space bounded: /dev/zero read to its end fails there, not
# here); it prints the exception's type and message, or "opened".
_OPEN = """
import json, resource, sys
from pathlib import Path
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from cuzk_mp.daemon.journal import Journal
try:
    Journal.open(Path(sys.argv[1])).close()
    print(json.dumps(["opened", ""]))
except BaseException as e:
    print(json.dumps([type(e).__name__, str(e)]))
"""
START_TIMEOUT_S = 60


def _open_in_child(path: Path) -> tuple[str, str]:
    """(exception type, message) of Journal.open(path) in a child process; the test fails where it
    does not end within START_TIMEOUT_S (a start that waits on a FIFO)."""
    try:
        proc = subprocess.run([sys.executable, "-c", _OPEN, str(path)], env=ENV, cwd=REPO, capture_output=True,
                              text=True, timeout=START_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"Journal.open({path}) did not end within {START_TIMEOUT_S} s")
    kind, message = json.loads(proc.stdout.strip().splitlines()[-1])
    return kind, message


def _journal_with_jobs(path: Path) -> None:
    """A closed journal holding two queued jobs, with its .id."""
    _fill(path, 2).close()


def _put(kind: str, at: Path) -> None:
    if kind == "fifo":
        os.mkfifo(at)
    elif kind == "folder":
        at.mkdir()
    else:  # a device of its own (as /dev/zero: read to its end, it never ends), changed by nothing else
        try:
            os.mknod(at, 0o600 | stat.S_IFCHR, os.makedev(1, 5))
            os.close(os.open(at, os.O_RDONLY))
        except PermissionError:
            pytest.skip("making or opening a device node needs root and a file system that allows devices")


@pytest.mark.parametrize("suffix", ["", "-wal", "-shm", "-journal", ".id"])
@pytest.mark.parametrize("kind, what", [("fifo", "a FIFO (a named pipe), not a regular file"),
                                        ("folder", "Is a directory"),
                                        ("device", "a character device, not a regular file")])
def test_a_start_file_that_is_no_regular_file_refuses_the_start_at_once(
        tmp_path: Path, suffix: str, kind: str, what: str) -> None:
    """A FIFO at the journal's -wal or .id held the start for ever (read to learn whether the WAL is
    damaged, or which journal was here); /dev/zero there was read until memory ran out; a folder was
    an IsADirectoryError, and SQLite, at the journal or its -shm, said "disk I/O error" (a full disk to
    the message); SQLite itself waited for ever on a FIFO at the -journal, which it reads where it is
    there. Now a ConfigError names the file and what it is, and leaves everything as it was."""
    path = tmp_path / "journal.sqlite"
    _journal_with_jobs(path)
    thing = Path(f"{path}{suffix}")
    if thing.exists():
        thing.unlink()
    _put(kind, thing)
    kind_seen, message = _open_in_child(path)
    assert kind_seen == "ConfigError", (kind_seen, message)
    assert f"{thing}: " in message and what in message, message
    assert os.path.lexists(thing) and (thing.is_dir() if kind == "folder" else not thing.is_file())
    if suffix:  # with the thing gone, the journal opens with its jobs
        thing.rmdir() if kind == "folder" else thing.unlink()
        j = Journal.open(path)
        assert [e.job_id for e in j.load()] == ["job-0", "job-1"]
        j.close()


@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
def test_a_link_at_the_wal_or_shm_is_refused_and_its_target_left_alone(tmp_path: Path, suffix: str) -> None:
    """SQLite opens the -wal, -shm and -journal without following a link, and said only "unable to open
    database file"; the start made the target of a link at the -wal or -shm, any file this user may
    change, 0600 first. Now the link is refused, named, and its target keeps its mode."""
    path = tmp_path / "journal.sqlite"
    _journal_with_jobs(path)
    target = tmp_path / "elsewhere.txt"
    target.write_text("someone's file")
    target.chmod(0o644)
    link = Path(f"{path}{suffix}")
    if link.exists():
        link.unlink()
    link.symlink_to(target)
    kind_seen, message = _open_in_child(path)
    assert kind_seen == "ConfigError" and f"{link}: a symbolic link" in message, (kind_seen, message)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644 and target.read_text() == "someone's file"


def test_the_daemon_refuses_a_fifo_at_the_journals_wal_with_exit_2(tmp_path: Path) -> None:
    """``cuzk-mp daemon`` with a FIFO at its journal's -wal: --check and the start end with exit 2 naming
    the FIFO (the start hung, before its socket was made)."""
    cfg = tmp_path / "cuzk.toml"
    cfg.write_text(config_text(tmp_path, tmp_path / "keys", prefix="cuzk-jf-test"))
    _journal_with_jobs(tmp_path / "journal.sqlite")
    wal = tmp_path / "journal.sqlite-wal"
    os.mkfifo(wal)
    _check_and_start_refuse(cfg, wal, "a FIFO (a named pipe), not a regular file")
    assert not (tmp_path / "cuzk.sock").exists() and not (tmp_path / "keys").exists()


def _check_and_start_refuse(cfg: Path, thing: Path, what: str) -> None:
    """``cuzk-mp daemon --check`` and the start with ``cfg`` each end with exit 2, naming ``thing`` and
    ``what`` is wrong with it, no traceback; the test fails where either does not end in time."""
    for check in (["--check"], []):
        try:
            proc = subprocess.run([*PY, "daemon", "--config", str(cfg), *check], env=ENV, capture_output=True,
                                  text=True, timeout=START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"cuzk-mp daemon {' '.join(check)} did not end within {START_TIMEOUT_S} s")
        assert proc.returncode == 2, (check, proc.returncode, proc.stderr)
        assert f"{thing}: " in proc.stderr and what in proc.stderr, (check, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_an_id_that_is_no_text_is_another_journals(tmp_path: Path) -> None:
    """A .id of bytes that are no UTF-8 (garbled) is an id that is not this journal's, as any other
    wrong id: the start refuses naming it, where it ended with a UnicodeDecodeError (exit 70)."""
    path = tmp_path / "journal.sqlite"
    _journal_with_jobs(path)
    Path(f"{path}.id").write_bytes(b"\xff\xfe\x00garbled\n")
    with pytest.raises(JournalDamaged, match="another journal was put in its place"):
        Journal.open(path)


def test_a_large_wal_is_read_a_frame_at_a_time(tmp_path: Path) -> None:
    """wal_damage reads frames one at a time: a WAL of 64 MiB (sparse: no disk) costs it well under a
    MiB of memory; it read the whole file into memory, which a WAL of several GiB (a long run between
    checkpoints) may not have."""
    wal = tmp_path / "journal.sqlite-wal"
    with open(wal, "wb") as f:
        f.truncate(64 << 20)
    tracemalloc.start()
    try:
        assert wal_damage(wal) is None  # no header, no committed frame: nothing SQLite could drop
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak


def test_through_a_link_the_wal_beside_the_journals_file_is_the_one_checked(tmp_path: Path) -> None:
    """A journal path that is a link (to a journal on another disk): SQLite keeps the -wal and -shm beside
    the file the link leads to, not beside the link. A damaged WAL there opened silently, SQLite dropping
    the committed jobs after the damage (the WAL beside the link, which SQLite never reads, was the one
    checked), and a FIFO there was not refused. Both are now found where SQLite reads them."""
    live = tmp_path / "live" / "journal.sqlite"
    live.parent.mkdir()
    j = _fill(live, 20)
    try:
        image = _crash_image(live, tmp_path / "disk")
    finally:
        j.close()
    wal = Path(f"{image}-wal")
    data = bytearray(wal.read_bytes())
    data[32 + 3 * (24 + 4096) + 24 + 200] ^= 0x5A  # a byte of the fourth frame's page
    wal.write_bytes(data)
    link = tmp_path / "journal.sqlite"
    link.symlink_to(image)
    with pytest.raises(JournalDamaged, match="write-ahead log is damaged") as info:
        Journal.open(link)
    assert str(wal) in str(info.value)
    assert wal.read_bytes() == data  # the evidence is kept
    wal.unlink()
    os.mkfifo(wal)
    kind_seen, message = _open_in_child(link)
    assert kind_seen == "ConfigError" and f"{wal}: " in message and "a FIFO" in message, (kind_seen, message)


def test_the_folder_a_journal_link_leads_to_must_be_writable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite makes the -wal and -shm beside the file a journal link leads to: that folder must be one the
    daemon may write, as the journal's own folder must (--check said OK of a link into a read-only folder,
    and the start failed with SQLite's "attempt to write a readonly database" as a ResourceError, exit 4,
    "free the disk", which systemd retries for ever). A read-only folder is simulated (root may write any
    folder of a writable file system): os.access says no for it, as it does on a read-only file system."""
    from cuzk_mp.daemon.cli import check_writable_places
    from cuzk_mp.daemon.config import resolve

    real = tmp_path / "ro" / "journal.sqlite"
    real.parent.mkdir()
    _journal_with_jobs(real)
    for side in real.parent.glob("journal.sqlite-*"):
        side.unlink()
    link = tmp_path / "journal.sqlite"
    link.symlink_to(real)
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: Path(p) != real.parent and access(p, mode, **kw))
    expected = rf"daemon\.journal: {real.parent} cannot be written \(SQLite makes the journal's -wal and -shm there\)"
    cfg = resolve({"daemon": {"journal": str(link)}, "srs": {"param_cache": str(tmp_path / "cache")}}, base=tmp_path)
    with pytest.raises(ConfigError, match=expected):
        check_writable_places(cfg)
    with pytest.raises(ConfigError, match=expected):
        Journal.open(link)


@pytest.mark.parametrize("kind", ["fifo", "folder", "link"])
@pytest.mark.parametrize("where", ["journal", "linked journal", "socket"])
def test_the_daemon_refuses_a_lock_file_that_is_no_regular_file_with_exit_2(
        tmp_path: Path, kind: str, where: str) -> None:
    """``cuzk-mp daemon`` with a FIFO, a folder or a link at its journal's lock file (``<journal>.lock``;
    for a journal path that is a link, the lock beside the file it leads to as well) or at its unix
    socket's (``<socket>.lock``): --check said OK (exit 0), and only the start refused it (for a folder
    with a bare "Is a directory"). Now both end with exit 2 naming the lock file and what it is, as for
    the journal's other start files, and leave it there."""
    cfg = tmp_path / "cuzk.toml"
    cfg.write_text(config_text(tmp_path, tmp_path / "keys", prefix="cuzk-jf-test"))
    journal = tmp_path / "journal.sqlite"
    if where == "linked journal":
        real = tmp_path / "disk" / "journal.sqlite"
        real.parent.mkdir()
        _journal_with_jobs(real)
        journal.symlink_to(real)
        lock = Path(f"{real}.lock")
    else:
        _journal_with_jobs(journal)
        lock = Path(f"{journal}.lock") if where == "journal" else tmp_path / "cuzk.sock.lock"
    if kind == "link":
        lock.symlink_to(tmp_path / "elsewhere")
    else:
        _put(kind, lock)
    what = {"folder": "Is a directory", "fifo": "a FIFO (a named pipe), not a regular file",
            "link": "a symbolic link where the daemon keeps its lock file"}[kind]
    _check_and_start_refuse(cfg, lock, what)
    assert os.path.lexists(lock) and (lock.is_dir() if kind == "folder" else not lock.is_file())
    assert not (tmp_path / "elsewhere").exists()
    assert not (tmp_path / "cuzk.sock").exists() and not (tmp_path / "keys").exists()

