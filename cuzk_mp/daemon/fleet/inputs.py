"""Job inputs outside the database: a reference (path or URL) plus the sha256 of the bytes.

Witness inputs can be hundreds of megabytes per job, so the shared queue carries only where they
are and what they hash to. The box that accepts a submit stores the bytes (content-addressed,
written atomically into a directory every box can read at the same path: :func:`store_inputs`, or in
two steps, the long write by :func:`stage_inputs` and the quick rename by :meth:`StagedInputs.place`);
the box that claims the job reads them back (:func:`load_inputs`), and the sha256 check turns a
truncated copy, a stale mount or a swapped file into a clear InputError instead of a wrong proof.

References are absolute paths, ``file://`` URLs or ``http(s)://`` URLs (read with a timeout and
a size bound). Stored inputs are removed once no job names them and nobody stored them again for
the retention time (a re-store refreshes the file's mtime): each is first taken from its name by
:func:`set_aside_stale`, then unlinked; the partial files of stores that never ended go with
:func:`remove_stale_inputs`, and the files of prunes that never ended with :func:`remove_leftover_asides`.

The shared folder carries a marker, :data:`MARKER_NAME`, holding the id the fleet's database records
for it (:func:`write_marker`, :func:`share_problem`): a box on which the share is not mounted sees an
empty local folder where every file is "missing", and without the marker it could not tell that from
a job whose inputs are really gone; it would fail every job it claims.
Nothing here knows about the queue.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import re
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

from cuzk_mp.errors import InputError, ResourceError
from cuzk_mp.formats.atomic import read_id_file

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
URL_SCHEMES = ("file", "http", "https")
DEFAULT_MAX_INPUT_BYTES = 4 << 30
READ_CHUNK = 1 << 20
INPUTS_SUFFIX = ".inputs"
INCOMING_PREFIX = ".incoming-"  # a store in progress (renamed to its .inputs name once written)
ASIDE_PREFIX = ".cuzk-aside-"  # a stored file a prune took from its name, ``<prefix><box>-<random>``
# How long after it was set aside a file counts as left over by a prune that never ended (its box killed
# between the rename and the unlink): far longer than any prune's rename, commit and unlink take.
LEFTOVER_ASIDE_S = 3600.0
MARKER_NAME = ".cuzk-fleet-inputs"  # the shared folder's marker: the id cuzk_fleet_meta records for it
MARKER_MAX_BYTES = 256  # the most of a marker that is read: its id is 32 hex digits and a newline


class ShareUnavailable(ResourceError):
    """The shared inputs folder is not the fleet's on this box (not mounted, unreadable): the job is
    not at fault and goes back to the queue for a box that sees the share."""


@dataclass(frozen=True)
class InputsRef:
    """Where a job's inputs are and the sha256 (hex) of their bytes."""

    ref: str
    sha256: str
    size: int


def check_ref(ref: str, sha256: str) -> None:
    """InputError unless ``ref`` is an absolute path or a file/http(s) URL and ``sha256`` is hex."""
    if not SHA256_RE.match(sha256):
        raise InputError(f"inputs_sha256: expected 64 lowercase hex digits, got {sha256!r}")
    if not ref.isprintable():
        raise InputError(f"inputs_ref: must be printable, got {ref[:200]!r}")
    if ref.startswith("/"):
        return
    scheme = urllib.parse.urlsplit(ref).scheme
    if scheme not in URL_SCHEMES:
        raise InputError(f"inputs_ref: expected an absolute path or a {'/'.join(URL_SCHEMES)} URL, "
                         f"got {ref[:200]!r}")


def inputs_ref(data: bytes, directory: Path) -> InputsRef:
    """Where :func:`store_inputs` keeps ``data``: ``<directory>/<sha256>.inputs`` (nothing written).

    ``directory`` is made absolute but its symlinks are kept: the reference must name the folder as
    every box reads it (``[fleet] inputs_dir``), not where a link leads on this box alone."""
    digest = hashlib.sha256(data).hexdigest()
    return InputsRef(str(directory.absolute() / f"{digest}{INPUTS_SUFFIX}"), digest, len(data))


def stored_digest(path: Path) -> str | None:
    """The sha256 a stored inputs file is named by (None for any other file: a partial store)."""
    digest = path.name.removesuffix(INPUTS_SUFFIX)
    return digest if path.name.endswith(INPUTS_SUFFIX) and SHA256_RE.match(digest) else None


def store_inputs(data: bytes, directory: Path, ref: InputsRef | None = None) -> InputsRef:
    """Write ``data`` as ``<directory>/<sha256>.inputs`` (atomically; kept if already there, its
    mtime refreshed so that :func:`remove_stale_inputs` leaves it for the retention time); ``ref``:
    :func:`inputs_ref` of it, where the caller has it (the digest is not computed again)."""
    ref = ref or inputs_ref(data, directory)
    while True:  # a second round only where the file was removed as stale between the look and the refresh
        staged = stage_inputs(data, directory, ref)
        try:
            if staged.place():
                return ref
        finally:
            staged.discard()


@dataclass
class StagedInputs:
    """Inputs on their way into the shared folder (:func:`stage_inputs`): their bytes written beside
    their place (``temp``), or None where the file was there already. :meth:`place` puts them in place
    with one rename or one mtime refresh, quick enough for a submit to do under its inputs' lock,
    inside its transaction, while the long write happened before it, outside."""

    ref: InputsRef
    temp: Path | None

    def place(self) -> bool:
        """Rename the bytes into place, or refresh the mtime of the file that was there; False (nothing
        done) where that file was removed since it was found (pruned as stale): stage again."""
        path = Path(self.ref.ref)
        if self.temp is not None:
            os.replace(self.temp, path)
            self.temp = None
            return True
        try:
            os.utime(path)
        except OSError as e:
            if isinstance(e, FileNotFoundError) or e.errno == errno.ESTALE:  # ESTALE: an NFS handle of it
                return False
            raise
        return True

    def discard(self) -> None:
        """Remove the bytes written for a place they never took (the submit was refused)."""
        if self.temp is not None:
            self.temp.unlink(missing_ok=True)
            self.temp = None


def stage_inputs(data: bytes, directory: Path, ref: InputsRef) -> StagedInputs:
    """Write ``data`` into a temporary beside ``ref``'s file unless that file is there already (of
    its size); :meth:`StagedInputs.place` puts it in place."""
    directory.mkdir(parents=True, exist_ok=True)
    path = Path(ref.ref)
    with contextlib.suppress(FileNotFoundError):  # absent, or removed as stale a moment ago
        if path.stat().st_size == len(data):
            return StagedInputs(ref, None)
    return StagedInputs(ref, _write_temp(path, data))


def _replace(path: Path, data: bytes) -> None:
    """Write ``data`` as ``path`` whole: into a temporary of its folder (:func:`_write_temp`), renamed
    over it."""
    tmp = _write_temp(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _write_temp(path: Path, data: bytes) -> Path:
    """``data`` in a new temporary of ``path``'s folder (``INCOMING_PREFIX``: one that a box killed
    meanwhile leaves is removed by :func:`remove_stale_inputs`)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=INCOMING_PREFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def write_marker(directory: Path, share_id: str) -> None:
    """Write the shared folder's marker holding ``share_id`` (atomically; the folder made if absent)."""
    directory.mkdir(parents=True, exist_ok=True)
    _replace(directory / MARKER_NAME, (share_id + "\n").encode())


def read_marker(directory: Path) -> str | None:
    """The id in the folder's marker; None if there is none (OSError if the folder cannot be read,
    InputError naming the marker where it is no regular file: :func:`~cuzk_mp.formats.atomic.read_id_file`)."""
    return read_id_file(directory / MARKER_NAME, MARKER_MAX_BYTES)


def share_problem(directory: Path, share_id: str) -> str | None:
    """Why ``directory`` is not the fleet's shared inputs folder on this box, in one line; None if it is."""
    try:
        found = read_marker(directory)
    except (OSError, InputError) as e:  # a stale NFS handle, an I/O error, no permission; a FIFO, a device
        return f"[fleet] inputs_dir {directory}: cannot read its {MARKER_NAME}: {e}"
    if found is None:
        return (f"[fleet] inputs_dir {directory}: no {MARKER_NAME} in it, so it is not the fleet's shared "
                "folder on this box (the share is not mounted?)")
    if found != share_id:
        return (f"[fleet] inputs_dir {directory}: its {MARKER_NAME} holds {found[:64]!r}, the fleet's database "
                f"{share_id!r}: the folder of another fleet")
    return None


def stale_cutoff(directory: Path, older_than_s: float) -> float:
    """The mtime before which a file of ``directory`` was last written ``older_than_s`` seconds ago,
    on the folder's own clock: a shared folder's mtimes are its file server's, which this box's clock
    may be hours off. That clock is read as the mtime of a probe file made there and removed at once
    (a partial store's name); this box's clock where none can be made (nothing could be removed
    either)."""
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=f"{INCOMING_PREFIX}clock-")
    except OSError:
        return time.time() - older_than_s
    try:
        return os.fstat(fd).st_mtime - older_than_s
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe)


def stale_inputs(directory: Path, cutoff: float) -> list[Path]:
    """Stored inputs in ``directory`` not stored (or stored again) since ``cutoff`` (an mtime:
    :func:`stale_cutoff`), and the partial files of stores that never ended (a box killed or powered
    off while it wrote)."""
    try:
        entries = [*directory.glob(f"*{INPUTS_SUFFIX}"), *directory.glob(f"{INCOMING_PREFIX}*")]
    except OSError:
        return []
    out = []
    for path in entries:
        with contextlib.suppress(OSError):
            if (path.name.startswith(INCOMING_PREFIX) or stored_digest(path)) and path.stat().st_mtime < cutoff:
                out.append(path)
    return out


def set_aside_stale(path: Path, cutoff: float, owner: str) -> Path | None:
    """Take a stale stored inputs file from its name, unless stored again meanwhile: one rename to a
    new name in its folder, of ``owner`` (the pruning box) and this attempt alone; where it went, None
    if it was kept or is gone. Unlink it after, or :func:`put_back` it.

    The name is no stored file's nor a partial store's, so no other prune lists it
    (:func:`stale_inputs`): a prune whose transaction fails puts the file back, and another box's
    prune in the moment between must not take it (a job may have been queued with it meanwhile).
    Only :func:`remove_leftover_asides` removes such a file, long after."""
    aside = path.with_name(f"{ASIDE_PREFIX}{owner}-{uuid.uuid4().hex}")
    try:
        if path.stat().st_mtime >= cutoff:  # stored again since it was found stale
            return None
        os.rename(path, aside)
    except OSError:
        return None
    return aside


def remove_leftover_asides(directory: Path, cutoff: float) -> int:
    """Remove the files prunes set aside (:func:`set_aside_stale`) and never unlinked nor put back (the
    pruning box was killed between), set aside before ``cutoff`` (their ctime, which the rename set, on
    the folder's clock: a prune's own file is unlinked or put back within moments); how many went.
    No job reads them: a job reads its inputs by their stored name, which such a file left."""
    removed = 0
    try:
        entries = list(directory.glob(f"{ASIDE_PREFIX}*"))
    except OSError:
        return 0
    for path in entries:
        with contextlib.suppress(OSError):
            if path.stat().st_ctime < cutoff:
                path.unlink()
                removed += 1
    return removed


def put_back(aside: Path, path: Path) -> None:
    """Return a file :func:`set_aside_stale` took from ``path`` (any file there since holds the same
    bytes: the name is their sha256)."""
    os.replace(aside, path)


def remove_stale_inputs(paths: list[Path], cutoff: float) -> int:
    """Remove these stored inputs (those no job names) unless stored again since ``cutoff``
    (:func:`stale_cutoff`); how many went."""
    removed = 0
    for path in paths:
        with contextlib.suppress(OSError):
            if path.stat().st_mtime < cutoff:  # a submit that stored the same bytes since keeps them
                path.unlink()
                removed += 1
    return removed


def _open(ref: str, timeout_s: float) -> io.BufferedIOBase:
    """A binary file object for the reference (a local file or an HTTP response)."""
    parts = urllib.parse.urlsplit(ref)
    if ref.startswith("/") or parts.scheme == "file":
        path = ref if ref.startswith("/") else urllib.request.url2pathname(parts.path)
        try:
            return open(path, "rb")
        except FileNotFoundError:
            raise InputError(f"inputs_ref: no such file: {path}") from None
        except OSError as e:
            raise ResourceError(f"inputs_ref: cannot read {path}: {e}") from None
    try:
        response: io.BufferedIOBase = urllib.request.urlopen(ref, timeout=timeout_s)
        return response
    except urllib.error.HTTPError as e:
        raise InputError(f"inputs_ref: {ref[:200]} answered HTTP {e.code}") from None
    except (urllib.error.URLError, OSError) as e:
        raise ResourceError(f"inputs_ref: cannot fetch {ref[:200]}: {e}") from None


def load_inputs(ref: str, sha256: str, *, max_bytes: int = DEFAULT_MAX_INPUT_BYTES,
                timeout_s: float = 60.0) -> bytes:
    """The bytes behind ``ref``, checked against ``sha256`` (InputError on a mismatch or if larger
    than ``max_bytes``; ResourceError if the storage cannot be reached)."""
    check_ref(ref, sha256)
    h = hashlib.sha256()
    chunks: list[bytes] = []
    size = 0
    with _open(ref, timeout_s) as f:
        while chunk := f.read(READ_CHUNK):
            size += len(chunk)
            if size > max_bytes:
                raise InputError(f"inputs_ref: {ref[:200]} is larger than {max_bytes} bytes")
            h.update(chunk)
            chunks.append(chunk)
    if h.hexdigest() != sha256:
        raise InputError(f"inputs_ref: {ref[:200]} has sha256 {h.hexdigest()}, the job says {sha256} "
                         "(the file changed or was truncated)")
    return b"".join(chunks)
