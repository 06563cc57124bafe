"""The daemon's unix socket against other local users: a folder that lets another user take the
socket's place is refused (at ``--check`` and at the start, before anything is made), a group
that may write it is warned about, another user's socket or file at the listen path is never
removed or replaced, the socket's mode is never set through a link, and a stopping daemon removes
only its own socket. Another user's files and folders are ours given to ``nobody`` (root only)."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
from pathlib import Path

import pytest

from cuzk_mp.daemon import transport
from cuzk_mp.daemon.access import config_warnings
from cuzk_mp.daemon.cli import check_writable_places
from cuzk_mp.daemon.server import Daemon
from cuzk_mp.daemon.transport import bind_unix, listen, parse_address, socket_place
from cuzk_mp.errors import ConfigError
from tests.fake_engine import FakeEngine, make_config

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")


def _folder(parent: Path, name: str, mode: int) -> Path:
    folder = parent / name
    folder.mkdir()
    folder.chmod(mode)
    return folder


async def _noop(comm: object) -> None:
    return None


def test_a_folder_every_user_may_write_without_the_sticky_bit_is_refused(short_tmp: Path) -> None:
    """In a 0777 folder any user may rename the daemon's socket away and put one of their own in
    its place; the same folder with the sticky bit (as /tmp) lets them do neither."""
    shared = _folder(short_tmp, "shared", 0o777)
    for path in (shared / "d.sock", shared / "deeper" / "d.sock"):
        refusal, _ = socket_place(str(path))
        assert refusal is not None and f"{shared} is writable by every user (mode 0777, no sticky bit)" in refusal
        assert "/run/cuzk-mp" in refusal
        with pytest.raises(ConfigError, match="writable by every user"):
            bind_unix(str(path), 0o600)
        assert not path.exists() and not path.parent.joinpath("d.sock.lock").exists()
    sticky = _folder(short_tmp, "sticky", 0o1777)
    assert socket_place(str(sticky / "d.sock")) == (None, None)
    bind_unix(str(sticky / "d.sock"), 0o600).close()


def test_check_and_the_start_refuse_such_a_folder_before_making_anything(short_tmp: Path) -> None:
    shared = _folder(short_tmp, "shared", 0o777)
    cfg = make_config(short_tmp, listen=f"unix://{shared}/d.sock")
    with pytest.raises(ConfigError, match=f"daemon.listen = 'unix://{shared}/d.sock': {shared} is writable"):
        check_writable_places(cfg)
    status = make_config(short_tmp, status_listen=f"unix://{shared}/s.sock")
    with pytest.raises(ConfigError, match="daemon.status_listen"):
        check_writable_places(status)
    started: list[object] = []

    def factory(*a: object) -> FakeEngine:
        started.append(a)
        return FakeEngine(*a)

    async def main() -> None:
        d = Daemon(cfg, engine_factory=factory)
        with pytest.raises(ConfigError, match="writable by every user"):
            await d.start()

    asyncio.run(main())
    assert started == [] and list(shared.iterdir()) == []  # not even the lock file
    assert not (short_tmp / "cache" / "journal.sqlite").exists()


def test_a_group_writable_folder_is_warned_about(short_tmp: Path) -> None:
    group = _folder(short_tmp, "group", 0o770)
    os.chown(group, -1, os.getegid() + 1 if os.geteuid() == 0 else os.getegid())
    cfg = make_config(short_tmp, listen=f"unix://{group}/d.sock")
    warned = [w for w in config_warnings(cfg) if "daemon.listen" in w]
    if os.geteuid() == 0:
        assert len(warned) == 1 and f"{group} is writable by group {os.getegid() + 1}" in warned[0]
    check_writable_places(cfg)  # a warning, not a refusal


@as_root
def test_a_folder_of_another_user_is_refused(short_tmp: Path) -> None:
    theirs = _folder(short_tmp, "theirs", 0o755)
    os.chown(theirs, NOBODY, NOBODY)
    refusal, _ = socket_place(str(theirs / "d.sock"))
    assert refusal is not None and f"{theirs} belongs to another user (uid {NOBODY})" in refusal
    link = short_tmp / "link"  # a link on the way that another user owns (and may point elsewhere)
    link.symlink_to(_folder(short_tmp, "mine", 0o755))
    os.lchown(link, NOBODY, NOBODY)
    refusal, _ = socket_place(str(link / "d.sock"))
    assert refusal is not None and f"{link} belongs to another user" in refusal


@as_root
def test_another_users_socket_at_the_listen_path_is_never_removed(short_tmp: Path) -> None:
    """In a sticky shared folder another user binds the listen path first (and goes away): the
    daemon refuses it, naming the uid, and leaves it; a stale socket of this user is replaced."""
    shared = _folder(short_tmp, "tmp", 0o1777)
    path = shared / "d.sock"

    squat = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    squat.bind(str(path))
    squat.close()  # no listener: stale, as a dead daemon's would be
    os.lchown(path, NOBODY, NOBODY)  # the socket of user nobody
    with pytest.raises(ConfigError, match=f"is a socket of another user \\(uid {NOBODY}\\).*refusing to replace it"):
        bind_unix(str(path), 0o600)
    assert stat.S_ISSOCK(path.lstat().st_mode) and path.lstat().st_uid == NOBODY
    path.unlink()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()
    bind_unix(str(path), 0o600).close()  # this user's own stale socket: replaced


@as_root
def test_check_refuses_another_users_socket_at_a_listen_path(short_tmp: Path) -> None:
    """``daemon --check`` (check_writable_places) refuses what the start would: another user's
    socket at the listen or status path, named with its uid, and leaves it where it is."""
    shared = _folder(short_tmp, "tmp", 0o1777)
    for key in ("listen", "status_listen"):
        path = shared / f"{key}.sock"
        squat = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        squat.bind(str(path))
        squat.close()
        os.lchown(path, NOBODY, NOBODY)
        other = {"listen": f"unix://{shared}/other.sock"} if key == "status_listen" else {}
        cfg = make_config(short_tmp, **{key: f"unix://{path}", **other})
        with pytest.raises(ConfigError, match=f"daemon\\.{key}: .*is a socket of another user \\(uid {NOBODY}\\)"):
            check_writable_places(cfg)
        assert path.lstat().st_uid == NOBODY


def test_check_warns_of_a_process_listening_on_the_socket_now(short_tmp: Path) -> None:
    """A socket of this user with a listener (a daemon running on this config) is a warning at
    ``--check`` (its start would be refused while it runs), not a refusal; a stale one is neither."""
    folder = _folder(short_tmp, "run", 0o755)
    path = folder / "d.sock"
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(str(path))
    live.listen(1)
    try:
        cfg = make_config(short_tmp, listen=f"unix://{path}")
        check_writable_places(cfg)
        warned = [w for w in config_warnings(cfg) if "listens on this socket now" in w]
        assert len(warned) == 1 and str(path) in warned[0]
        with pytest.raises(ConfigError, match="another process is already listening"):
            bind_unix(str(path), 0o600)
    finally:
        live.close()
    assert not [w for w in config_warnings(cfg) if "listens on this socket now" in w]  # stale now
    bind_unix(str(path), 0o600).close()  # and replaced at the start


def test_the_mode_is_never_set_through_a_link(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between the bind and the chmod, the temporary name is swapped for a link to another file (as
    a user who may write the folder could): the bind is refused and the file keeps its mode."""
    victim = short_tmp / "victim.txt"
    victim.write_text("secret\n")
    victim.chmod(0o600)
    real_socket = socket.socket

    class Swapped(real_socket):  # type: ignore[misc, valid-type]
        def bind(self, address: object) -> None:
            super().bind(address)
            os.unlink(str(address))
            os.symlink(victim, str(address))

    monkeypatch.setattr(transport.socket, "socket", Swapped)
    with pytest.raises(ConfigError, match="replaced while the daemon bound it"):
        bind_unix(str(short_tmp / "d.sock"), 0o666)
    monkeypatch.undo()
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert not (short_tmp / "d.sock").exists() and [p.name for p in short_tmp.iterdir()] == ["victim.txt"]


def test_a_stopping_daemon_removes_only_its_own_socket(short_tmp: Path) -> None:
    """Whatever stands at the socket's name when the listener closes is removed only if it is
    still this user's socket: a file put there meanwhile stays."""
    addr = parse_address(f"unix://{short_tmp}/d.sock")

    async def main() -> None:
        listener = await listen(addr, _noop, max_frame_bytes=1 << 16)
        os.unlink(addr.path)
        Path(addr.path).write_text("not ours to remove\n")
        await listener.close()
        assert Path(addr.path).read_text() == "not ours to remove\n"
        os.unlink(addr.path)
        listener = await listen(addr, _noop, max_frame_bytes=1 << 16)
        await listener.close()
        assert not Path(addr.path).exists()

    asyncio.run(main())


def _path_of(folder: Path, n: int) -> str:
    """A socket path of ``n`` bytes in ``folder``."""
    name = "s" * (n - len(os.fsencode(folder)) - 1)
    assert name, f"{folder} is too long for the test"
    return f"{folder}/{name}"


def test_a_listen_path_too_long_for_the_bind_is_refused_by_the_check(short_tmp: Path) -> None:
    """A unix socket's path holds 107 bytes, and the daemon binds its socket first under a name 17 bytes
    longer (then renames it into place): a listen path of 91..107 bytes passed the config and --check,
    and the start failed after the engine's with "AF_UNIX path too long". It is refused by --check and
    first thing at the start, saying the limit; one of 90 bytes serves."""
    too_long = _path_of(short_tmp, 100)
    cfg = make_config(short_tmp, listen=f"unix://{too_long}")
    expected = rf"daemon.listen = 'unix://{too_long}': a path of 100 bytes, more than the 90 .*temporary name"
    with pytest.raises(ConfigError, match=expected):
        check_writable_places(cfg)

    async def main() -> None:
        with pytest.raises(ConfigError, match=expected):
            await Daemon(cfg, engine_factory=FakeEngine).start()
        listener = await listen(parse_address(f"unix://{_path_of(short_tmp, 90)}"), _noop, max_frame_bytes=1 << 16)
        await listener.close()

    asyncio.run(main())
    assert sorted(p.name for p in short_tmp.iterdir()) == []  # not even the lock file


def test_a_warm_daemons_socket_too_long_for_the_bind_is_refused_before_its_start(
        short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm daemons' socket path is checked against what the daemon can bind (it took any up to
    104 bytes, whose daemon then failed to start), naming $XDG_RUNTIME_DIR as the way out."""
    from cuzk_mp.daemon import warm
    from tests.helpers import SNARKJS_FILES

    runtime = short_tmp / "r"
    runtime.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    spec = warm.WarmSpec(SNARKJS_FILES / "mul.zkey")
    sock_bytes = len(os.fsencode(warm.warm_dir())) + len(f"/{warm.warm_id(spec)}.sock")
    longer = short_tmp / ("r" * (95 - sock_bytes + 1))  # a socket path of 95 bytes
    longer.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(longer))
    with pytest.raises(ConfigError, match=r"too long for a unix socket \(95 bytes, at most 90\)"):
        warm.ensure(spec, timeout_s=60)
