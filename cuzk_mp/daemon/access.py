"""Who may do what: client tokens, the identity each gives, and what each caller may see.

Tokens are optional shared secrets in the config (``[daemon] tokens`` and ``admin_tokens``).
Without any, the daemon is single-tenant: every caller is an administrator (the unix socket's
mode, or a loopback address, is then the only gate; the config refuses a TCP listener reachable
from other hosts without tokens). With tokens, every request must carry one (``token`` in the
message; the client's ``--token`` flag or ``$CUZK_MP_TOKEN``), compared in constant time, and:

* each client token is one **identity**: a job is recorded (and journaled) under the identity
  that submitted it, and a client sees, awaits and cancels only its own jobs (another client's
  job id is "unknown", exactly like one that never existed) and lists only its own jobs in the
  status document;
* an admin token sees and cancels every job, may preload and evict keys, and may ask for the
  status document's ``detail``;
* a client token's job may ask a priority no more urgent than ``[daemon] max_client_priority``
  (:func:`check_priority`), or than its circuit's own (what it gets by asking none), so that one
  client cannot put its jobs ahead of every other client's; an admin token asks any. A job asking
  more is refused (AuthError, naming the cap and its key), never run at another priority than the
  one asked.

Whatever the tokens, the status document hides paths and process ids unless ``detail`` is asked
for (:func:`status_view`): paths become their last component and pids ``null``. A unix socket is
only as private as its folder: one in a folder that another user owns, or may write without the
sticky bit, is refused (:func:`check_socket_places`), since that user could put a socket of their
own in its place and receive every client's token and inputs.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cuzk_mp.daemon.transport import Address, foreign_file, socket_in_use, socket_place
from cuzk_mp.errors import AuthError, ConfigError
from cuzk_mp.pipeline.types import Priority

if TYPE_CHECKING:
    from cuzk_mp.daemon.config import DaemonConfig

PID_KEYS = frozenset({"pid", "owner_pid", "ppid", "pids"})
_SCALARS = frozenset({int, float, bool, type(None)})
# An absolute path inside any text (a whole value or quoted in an error message).
_PATH = re.compile(r"(?<![\w.])/(?:[^\s/'\",;:]+/)+")


@dataclass(frozen=True)
class Identity:
    """A caller: ``owner`` is what its jobs are recorded under; ``admin`` sees everything."""

    owner: str
    admin: bool

    @property
    def only(self) -> str | None:
        """The owner whose jobs this caller is limited to (None: every job)."""
        return None if self.admin else self.owner


OPEN = Identity(owner="", admin=True)


def owner_of(token: str) -> str:
    """The identity of a token as it is stored: a hash, never the secret itself."""
    return "client-" + hashlib.sha256(token.encode()).hexdigest()[:16]


class Access:
    """The configured tokens; :meth:`identify` turns a request's token into an Identity."""

    def __init__(self, tokens: tuple[str, ...] = (), admin_tokens: tuple[str, ...] = ()) -> None:
        self.required = bool(tokens or admin_tokens)
        self._known = [(t.encode(), Identity(owner_of(t), False)) for t in tokens]
        self._known += [(t.encode(), Identity(owner_of(t), True)) for t in admin_tokens]

    def identify(self, token: str) -> Identity:
        """The caller behind ``token`` (AuthError if tokens are required and it is not one).

        Every configured token is compared, each in constant time, whichever matches.
        """
        if not self.required:
            return OPEN
        given = token.encode()
        found = None
        for secret, ident in self._known:
            if hmac.compare_digest(given, secret):
                found = ident
        if found is None:
            raise AuthError("this daemon requires a token: pass --token or set $CUZK_MP_TOKEN"
                            if not token else "the token is not one this daemon knows")
        return found

    @staticmethod
    def need_admin(ident: Identity, what: str) -> None:
        """AuthError unless ``ident`` may do ``what`` (an operator's action)."""
        if not ident.admin:
            raise AuthError(f"{what} needs an admin token")


def check_priority(ident: Identity, asked: Priority, default: Priority, cap: Priority) -> None:
    """AuthError if ``ident`` may not run a job at ``asked``: a client (not an admin) asks at most
    the more urgent of ``cap`` (``[daemon] max_client_priority``) and its circuit's ``default``.

    The job is refused rather than run at the cap: a client that asked CRITICAL and got NORMAL
    would wait behind jobs it believes it precedes, with nothing telling it why.
    """
    most = min(cap, default)  # lower runs first
    if ident.admin or asked >= most:
        return
    own = f" or its circuit's own {default.name}" if default < cap else ""
    raise AuthError(f"priority {asked.name} is more urgent than a client of this daemon may ask: at most "
                    f"{cap.name} ([daemon] max_client_priority = \"{cap.name}\"){own}; ask {most.name} or "
                    "less, leave the priority out (the circuit's own), or use an admin token")


def redact_text(text: str) -> str:
    """``text`` with every absolute path reduced to its last component."""
    return _PATH.sub("", text) if "/" in text else text


def status_view(doc: Mapping[str, Any], ident: Identity, detail: bool,
                owner_of_job: Callable[[str], str | None]) -> dict[str, Any]:
    """The status document as ``ident`` may see it.

    ``detail`` keeps paths and pids (AuthError for a non-admin caller when tokens are in use);
    a non-admin caller's lists of jobs keep only its own, and references to other jobs (ring
    slots) become ``null``. ``owner_of_job`` gives a job id's owner (None if unknown).
    """
    if detail and not ident.admin:
        raise AuthError("the status detail (paths and process ids) needs an admin token")

    def mine(job_id: Any) -> bool:
        return ident.admin or (isinstance(job_id, str) and owner_of_job(job_id) == ident.owner)

    def walk(value: Any) -> Any:
        kind = type(value)
        if kind is str:
            return redact_text(value) if not detail else value
        if kind in _SCALARS:
            return value
        if kind is dict or isinstance(value, Mapping):
            out = {}
            for k, v in value.items():
                hidden = (not detail and k in PID_KEYS) or (k == "job" and type(v) is str and not mine(v))
                out[k] = None if hidden else walk(v)
            return out
        if kind is list or kind is tuple:
            return [walk(v) for v in value
                    if not (type(v) is dict and "job_id" in v and not mine(v["job_id"]))]
        return value

    view = walk(doc)
    view["detail"] = detail
    return view


def _unix_listeners(cfg: DaemonConfig) -> list[tuple[str, Address]]:
    """The config's unix socket listeners, by their key."""
    return [(k, a) for k, a in (("listen", cfg.listen), ("status_listen", cfg.status_listen))
            if a is not None and a.kind == "unix"]


def check_socket_places(cfg: DaemonConfig) -> None:
    """ConfigError naming the key of a unix listener whose folder lets another user take its socket's
    place (:func:`~.transport.socket_place`): checked by ``--check`` and first thing at the start."""
    for key, addr in _unix_listeners(cfg):
        refusal, _ = socket_place(addr.path)
        if refusal is not None:
            raise ConfigError(f"{cfg.path or 'config'}: daemon.{key} = {str(addr)!r}: {refusal}")


def config_warnings(cfg: DaemonConfig) -> list[str]:
    """What in a valid config weakens access (``daemon --check`` prints these, the daemon logs
    them at start). A TCP listener beyond loopback without tokens is not here: the config
    refuses it outright."""
    out = []
    unix = [k for k, _ in _unix_listeners(cfg)]
    for key, addr in _unix_listeners(cfg):
        _, weak = socket_place(addr.path)
        if weak is not None:
            out.append(f"daemon.{key} = {str(addr)!r}: {weak}; put it in a folder only this user (or root) may "
                       "write, e.g. /run/cuzk-mp")
        if foreign_file(addr.path) is None and socket_in_use(addr.path):
            out.append(f"daemon.{key} = {str(addr)!r}: a process listens on this socket now (a running daemon?): "
                       "a start is refused while it does")
    if unix and cfg.socket_mode & 0o002:
        out.append(f"daemon.socket_mode = {cfg.socket_mode:04o} makes the unix socket of daemon."
                   f"{' and daemon.'.join(unix)} world-writable: every local user can connect"
                   + ("" if cfg.tokens or cfg.admin_tokens else " and submit, see and cancel every job")
                   + "; use 0600 or 0660 with a group")
    if not cfg.tokens and cfg.max_client_priority is not Priority.CRITICAL:
        out.append(f"daemon.max_client_priority = \"{cfg.max_client_priority.name}\" without daemon.tokens: "
                   "it caps nothing, as only a client token's jobs are capped (admin tokens, and every caller "
                   "of a daemon without tokens, ask any priority)")
    if not (cfg.tokens or cfg.admin_tokens):
        tcp = [k for k, a in (("listen", cfg.listen),) if a is not None and a.kind == "tcp"]
        if tcp:
            out.append(f"daemon.listen = {str(cfg.listen)!r} without tokens: every local user (any process "
                       "of this machine) may submit, see and cancel every job, and preload or evict keys; set "
                       "daemon.tokens / daemon.admin_tokens, or listen on a unix socket (mode 0600)")
    if cfg.tokens or cfg.admin_tokens:
        for key, addr in (("listen", cfg.listen), ("status_listen", cfg.status_listen)):
            if addr is not None and not addr.loopback:
                out.append(f"daemon.{key} = {str(addr)!r} is reachable from other hosts and tokens "
                           "cross the network in clear text: keep it on a private network or "
                           "behind a TLS tunnel")
        if cfg.tokens and cfg.max_client_priority is Priority.CRITICAL:
            out.append("daemon.max_client_priority = \"CRITICAL\" (the default): every client token may submit "
                       "jobs at priority CRITICAL, ahead of every other client's; set it to \"NORMAL\" (or "
                       "\"HIGH\") to keep the more urgent priorities for admin tokens")
        if cfg.path is not None and cfg.path.exists() and cfg.path.stat().st_mode & 0o004:
            out.append(f"{cfg.path} holds tokens and every user can read it: chmod o-r it")
    return out
