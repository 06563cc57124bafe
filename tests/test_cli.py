"""The ``cuzk-mp`` command line as a user meets it: aliases, default names, global options,
the version, and every way out ending in a one-line message and a documented exit code.

Proofs here are of the 2^10 porep-like synthetic circuit with a development key, made through
the CLI itself; the snarkjs side of the aliases is in tests/test_cli_snarkjs.py.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import pytest

import cuzk_mp
from cuzk_mp import cli, errors
from cuzk_mp.algebra.field import R_MOD
from cuzk_mp.paths import default_cache_dir
from tests.helpers import circom_generator, small_circom_key

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def run_cli(*args: object, cwd: Path | None = None, env: dict[str, str] | None = None,
            module: str = "cuzk_mp") -> subprocess.CompletedProcess[str]:
    """``python -m cuzk_mp ARGS`` in a subprocess, as a user runs it."""
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=cwd or REPO, env={**ENV, **(env or {})})


def assert_message(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    """Exit ``code``, no traceback, and the needles in the (short) stderr."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)


@pytest.fixture(scope="module")
def circuit(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A 2^10 porep-like circuit, its witness, a dev key, its vk and a proof, made through the CLI."""
    d = tmp_path_factory.mktemp("cli")
    assert cli.main(["circuit", "porep-like", "--log-n", "10", str(d)]) == 0
    files = {"r1cs": d / "porep-like-10.r1cs", "wtns": d / "porep-like-10.wtns", "zkey": d / "c.zkey",
             "vk": d / "vk.json", "proof": d / "proof.json", "public": d / "public.json"}
    assert cli.main(["setup", "--backend", "cpu", str(files["r1cs"]), str(files["zkey"])]) == 0
    assert cli.main(["zkev", str(files["zkey"]), str(files["vk"])]) == 0
    assert cli.main(["g16p", str(files["zkey"]), str(files["wtns"]), str(files["proof"]), str(files["public"]),
                     "--backend", "cpu"]) == 0
    return files


# --- parsing ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("alias", "words"), [(v.alias, v.words) for v in cli.SNARKJS_VERBS])
def test_alias_parses_as_its_long_form(alias: str, words: tuple[str, ...]) -> None:
    parser = cli.build_parser()
    long_form = vars(parser.parse_args([*words, "x1", "x2"]))
    short = vars(parser.parse_args([alias, "x1", "x2"]))
    assert short["func"] is long_form["func"]
    for key in ("command", "verb1", "verb2"):
        short.pop(key, None)
        long_form.pop(key, None)
    assert short == long_form


def test_snarkjs_default_file_names() -> None:
    """The names snarkjs 0.7.6's cli.js substitutes for missing arguments."""
    p = cli.build_parser()

    def names(*argv: str) -> list[str]:
        ns = p.parse_args(list(argv))
        return [str(getattr(ns, k)) for k in ("input", "wasm", "zkey", "wtns", "vk", "proof", "public")
                if hasattr(ns, k)]

    assert names("g16p") == ["circuit_final.zkey", "witness.wtns", "proof.json", "public.json"]
    assert names("groth16", "fullprove") == ["input.json", "circuit.wasm", "circuit_final.zkey", "proof.json",
                                             "public.json"]
    assert names("g16v") == ["verification_key.json", "proof.json", "public.json"]
    assert names("zkev") == ["circuit_final.zkey", "circuit_vk.json"]
    assert names("wc") == ["input.json", "circuit.wasm", "witness.wtns"]
    assert names("g16p", "my.zkey") == ["my.zkey", "witness.wtns", "proof.json", "public.json"]
    assert names("g16i") == names("g16f") and names("zpw") == names("g16p")  # snarkjs's other short names
    for verb in (["g16p"], ["g16v"], ["zkev"], ["wc"], ["zkey", "export", "verificationkey"]):  # snarkjs's option
        assert p.parse_args([*verb, "--protocol", "groth16"]).protocol == "groth16", verb
    with pytest.raises(SystemExit):
        p.parse_args(["g16f", "--protocol", "plonk"])


def test_options_between_positionals() -> None:
    """A verb's options may stand between its file arguments (snarkjs's parser allows it); the
    files keep their places, and an extra file is still a usage error."""
    p = cli.build_parser()
    ns = p.parse_args(["g16p", "k.zkey", "w.wtns", "--backend", "cpu", "p.json", "--r1cs", "c.r1cs", "q.json"])
    assert [str(ns.zkey), str(ns.wtns), str(ns.proof), str(ns.public)] == ["k.zkey", "w.wtns", "p.json", "q.json"]
    assert (ns.backend, str(ns.r1cs)) == ("cpu", "c.r1cs")
    ns = p.parse_args(["groth16", "fullprove", "in.json", "--no-verify", "c.wasm", "k.zkey"])
    assert ([str(ns.input), str(ns.wasm), str(ns.zkey), str(ns.proof)], ns.no_verify) == (
        ["in.json", "c.wasm", "k.zkey", "proof.json"], True)
    with pytest.raises(SystemExit):
        p.parse_args(["g16p", "k.zkey", "w.wtns", "--backend", "cpu", "p.json", "q.json", "extra"])


@pytest.mark.parametrize("argv", [
    ["g16p", "", "w.wtns"], ["g16p", "k.zkey", "w.wtns", "p.json", ""], ["g16p", "--r1cs", ""], ["zkev", "k.zkey", ""],
    ["wc", "c.wasm", ""], ["g16v", "vk.json", "", "proof.json"], ["setup", "c.r1cs", ""],
    ["circuit", "porep-like", "--log-n", "10", ""],
])
def test_an_empty_file_name_is_a_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """An empty argument (an unset shell variable: ``g16p "$KEY" ...``) is refused by name, where it
    was the current folder: ".: cannot read: Is a directory", or ``circuit`` writing there."""
    with pytest.raises(SystemExit) as ended:
        cli.build_parser().parse_args(argv)
    assert ended.value.code == 2
    assert "an empty file name (an unset variable?)" in capsys.readouterr().err


def test_a_nul_byte_in_a_file_name_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """No path holds a NUL byte: one given to :func:`cuzk_mp.cli.main` in-process (no command line
    can carry it) is a usage error naming the argument, where it was an internal error (exit 70,
    "embedded null byte") from the first open."""
    assert cli.main(["g16p", "k.zkey", "w\0.wtns"]) == 2
    assert "argument wtns: 'w\\x00.wtns': a NUL byte in a file name" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["g16p", "-", "w.wtns"], "argument zkey: - (standard input) is not accepted for the proving key: give a path"),
    (["g16p", "k.zkey", "-"], "argument wtns: - (standard input) is not accepted for the witness: give a path"),
    (["g16p", "--r1cs", "-"], "argument --r1cs: - (standard input) is not accepted for the circuit: give a path"),
    (["g16p", "k.zkey", "w.wtns", "-"], "argument proof: - (standard output) is not accepted for the proof: give a "
     "path (/dev/stdout writes to standard output)"),
    (["g16f", "-"], "argument input: - (standard input) is not accepted for the circuit input: give a path "
     "(/dev/stdin reads standard input)"),
    (["g16v", "vk.json", "-"], "argument public: - (standard input) is not accepted for the public signals"),
    (["wc", "c.wasm", "in.json", "-"], "argument wtns: - (standard output) is not accepted for the witness: give "
     "a path (/dev/stdout writes to standard output)"),
    (["setup", "c.r1cs", "-"], "argument zkey: - (standard output) is not accepted for the proving key: give a "
     "path\n"),
    (["circuit", "porep-like", "--log-n", "10", "-"], "argument out_dir: - (standard output) is not accepted for "
     "the folder: give a path"),
])
def test_a_dash_is_refused_naming_what_it_stands_for(argv: list[str], message: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``-`` is no file here, as in snarkjs, whose verbs open a file named "-": it was read as one
    ("-: cannot read") or, as an output, a file named "-" was written in the working folder. It is
    refused by the argument it stands for, with the path that reads or writes the standard stream
    where the verb takes one (a JSON file, a witness written in place)."""
    with pytest.raises(SystemExit) as ended:
        cli.build_parser().parse_args(argv)
    assert ended.value.code == 2
    assert message in capsys.readouterr().err

@pytest.mark.parametrize(("argv", "message"), [
    (["daemon", "--config", "-"], "argument --config: - (standard input) is not accepted for the config file"),
    (["daemon", "--config", "CFG/"], "argument --config: CFG/: names a folder, but CFG is a file"),
    (["client", "prove", "--circuit", "c", "--out", "o", "-"], "- (standard input) is not accepted for the input"),
    (["client", "prove", "--circuit", "c", "--out", "-"], "- (standard output) is not accepted for the folder"),
    (["bench", "--json", "r.json/"], "argument --json: r.json/: names a folder, but the result is a file"),
    (["bench", "--wtns", "CFG/"], "argument --wtns: CFG/: names a folder, but CFG is a file"),
    (["fleet", "status", "--config", "CFG/"], "argument --config: CFG/: names a folder, but CFG is a file"),
    (["fleet", "status", "--config", "-"], "argument --config: - (standard input) is not accepted for the config "
     "file"),
])
def test_the_engines_verbs_refuse_a_dash_and_a_files_trailing_slash(argv: list[str], message: str, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The engine's verbs take their files as the one-shot verbs do (:class:`cuzk_mp.cli.FileArg`): a
    ``-`` and a file's name with a trailing slash are refused naming the argument, where the slash
    was dropped (the config read, the result written) and ``-`` was a file of that name."""
    cfg = tmp_path / "d.toml"
    cfg.write_text("")
    argv = [a.replace("CFG", str(cfg)) for a in argv]
    with pytest.raises(SystemExit) as ended:
        cli.build_parser().parse_args(argv)
    assert ended.value.code == 2
    assert message.replace("CFG", str(cfg)) in capsys.readouterr().err
    folder = cli.build_parser().parse_args(["client", "prove", "--circuit", "c", "--out", f"{tmp_path}/"])
    assert folder.out == tmp_path  # a folder argument may end in a slash


def test_the_shm_probe_refuses_a_trailing_slash_on_its_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m cuzk_mp.pipeline.shmprobe --json r.json/`` wrote r.json (the slash dropped); it is refused
    before the probe runs, as the verbs' files are."""
    from cuzk_mp.pipeline import shmprobe

    with pytest.raises(SystemExit) as ended:
        shmprobe.main(["--json", f"{tmp_path}/r.json/"])
    assert ended.value.code == 2
    assert f"argument --json: {tmp_path}/r.json/: names a folder, but the probe's JSON is a file" \
        in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []

@pytest.mark.parametrize("argv", [
    ["g16p", "--r1cs=~/c.r1cs"], ["daemon", "--config=~/d.toml"], ["bench", "--cache=~/cache"],
    ["circuit", "porep-like", "--log-n", "10", "~/out"],
])
def test_a_tilde_the_shell_left_is_refused_naming_the_home_path(argv: list[str], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """No shell expands the ``~`` of ``--r1cs=~/c.r1cs`` (nor a quoted one): the path named a folder
    "~" in the working folder, "no such file" for an input and, for a folder that is made where
    missing (``circuit``'s, ``bench --cache``), a folder named "~" made there. Where no "~" is
    there, it is refused, naming the path that was meant; a "~" folder that is there is taken."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ended:
        cli.build_parser().parse_args(argv)
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert "~/" in err and f"the shell did not expand its ~: give {tmp_path / 'home'}/" in err, err
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "~").mkdir()
    cli.build_parser().parse_args(argv)  # a folder of that name: the path is what it says


def test_a_dash_output_writes_no_file_named_dash(circuit: dict[str, Path], tmp_path: Path) -> None:
    """``g16p KEY WTNS - public.json`` proves nothing and writes nothing, where it wrote a file "-"."""
    proc = run_cli("g16p", circuit["zkey"], circuit["wtns"], "-", "q.json", "--backend", "cpu", cwd=tmp_path)
    assert_message(proc, 2, "- (standard output) is not accepted for the proof")
    assert list(tmp_path.iterdir()) == []


def test_a_trailing_slash_on_a_file_is_refused(circuit: dict[str, Path], tmp_path: Path) -> None:
    """``KEY.zkey/`` names a folder (POSIX: ENOTDIR on a file), and ``proof.json/`` too: refused naming
    the argument as given, before any work, where the slash was dropped (the key read, the proof
    written to proof.json). A folder given with its slash is named as a folder, as without it."""
    zkey, wtns = circuit["zkey"], circuit["wtns"]
    assert_message(run_cli("g16p", f"{zkey}/", wtns, tmp_path / "p.json", tmp_path / "q.json"), 2,
                   f"argument zkey: {zkey}/: names a folder, but {zkey} is a file")
    assert_message(run_cli("g16p", zkey, wtns, f"{tmp_path / 'p.json'}/", tmp_path / "q.json", "--backend", "cpu"), 2,
                   f"argument proof: {tmp_path / 'p.json'}/: names a folder, but the proof is a file")
    (tmp_path / "q.json").write_text("old")
    assert_message(run_cli("g16p", zkey, wtns, tmp_path / "p.json", f"{tmp_path / 'q.json'}/", "--backend", "cpu"), 2,
                   f"argument public: {tmp_path / 'q.json'}/: names a folder, but {tmp_path / 'q.json'} is a file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.json"] and (tmp_path / "q.json").read_text() == "old"
    for argv in (["g16p", f"{zkey}/."], ["g16p", "--r1cs", f"{circuit['r1cs']}//"], ["setup", "c.r1cs", "k.zkey/"]):
        with pytest.raises(SystemExit):
            cli.build_parser().parse_args(argv)
    assert_message(run_cli("zkev", f"{tmp_path}/", tmp_path / "vk.json"), 2, f"{tmp_path}: cannot read: Is a directory")
    ns = cli.build_parser().parse_args(["circuit", "porep-like", "--log-n", "10", f"{tmp_path}/"])
    assert ns.out_dir == tmp_path  # a folder argument may end in a slash



@pytest.mark.parametrize("argv", [
    ["g16p", "--", "-k.zkey", "-w.wtns", "-p.json", "-q.json"],
    ["g16p", "--backend", "cpu", "--", "-k.zkey", "-w.wtns", "-p.json", "-q.json"],
    ["groth16", "prove", "--backend=cpu", "--", "-k.zkey", "-w.wtns", "-p.json", "-q.json"],
    ["g16p", "./-k.zkey", "--backend", "cpu", "--", "-w.wtns", "-p.json", "-q.json"],
])
def test_files_after_a_double_dash_may_start_with_a_dash(argv: list[str]) -> None:
    """``--`` ends the options, as in any POSIX command: a script's ``cuzk-mp g16p -- "$KEY" ...``
    takes file names that start with a dash, whether or not a file or an option precedes it."""
    ns = cli.build_parser().parse_args(argv)
    assert [str(ns.zkey), str(ns.wtns), str(ns.proof), str(ns.public)] == ["-k.zkey", "-w.wtns", "-p.json",
                                                                            "-q.json"]
    assert ns.backend == ("cpu" if "cpu" in " ".join(argv) else "auto")


@pytest.mark.parametrize(("argv", "front"), [
    (["g16v", "a", "b", "c", "-v"], ["-v"]),
    (["g16v", "--log-level", "debug", "a"], ["--log-level", "debug"]),
    (["client", "status", "--log-level=info", "-vv"], ["--log-level=info", "-vv"]),
    (["g16v", "--verbose", "a", "--", "-v"], ["--verbose"]),
])
def test_global_options_move_to_the_front(argv: list[str], front: list[str]) -> None:
    moved = cli.global_options_first(argv)
    assert moved[: len(front)] == front
    assert sorted(moved) == sorted(argv)
    if "--" in argv:
        assert moved[-2:] == ["--", "-v"]  # nothing after -- moves


@pytest.mark.parametrize(("argv", "level"), [
    (["g16v", "x"], "WARNING"), (["g16v", "x", "-v"], "INFO"), (["-vv", "g16v", "x"], "DEBUG"),
    (["g16v", "x", "--log-level", "error", "-v"], "ERROR"), (["setup", "a", "b"], "INFO"),
    (["setup", "a", "b", "--log-level=WARNING"], "WARNING"),
])
def test_log_level_from_anywhere(argv: list[str], level: str) -> None:
    args = cli.build_parser().parse_args(cli.global_options_first(argv))
    try:
        assert cli._configure_logging(args) == level
        assert logging.getLogger().getEffectiveLevel() == getattr(logging, level)
    finally:
        logging.getLogger().setLevel(logging.WARNING)


def test_bad_log_level_is_a_message() -> None:
    for argv in (["groth16", "verify", "--log-level", "loud"], ["--log-level=0", "g16v"]):
        proc = run_cli(*argv)
        assert_message(proc, 2, "is not a log level", "DEBUG, INFO, WARNING, ERROR, CRITICAL")
        assert len(proc.stderr.strip().splitlines()) == 2  # usage + the message


def test_an_unknown_log_format_or_library_level_is_warned_about(circuit: dict[str, Path]) -> None:
    proc = run_cli("g16v", circuit["vk"], circuit["public"], circuit["proof"],
                   env={"CUZK_MP_LOG_FORMAT": "xml", "CUZK_MP_LIBRARY_LOG_LEVEL": "loud"})
    assert_message(proc, 0, "CUZK_MP_LOG_FORMAT=xml is not one of text, json: text lines are written",
                   "CUZK_MP_LIBRARY_LOG_LEVEL=loud is not a log level")
    assert proc.stdout.strip() == "OK!"


def test_version_is_the_distribution_version() -> None:
    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"cuzk-mp {cuzk_mp.__version__}"
    assert metadata.version("cuzk-mp") == cuzk_mp.__version__


def test_every_command_renders_its_help() -> None:
    """``cuzk-mp ... --help`` at every level: argparse expands ``%`` in help strings, so one stray
    percent sign breaks that command's help (and only at run time)."""
    from cuzk_mp.cli import build_parser

    def walk(p: argparse.ArgumentParser, path: str) -> int:
        assert p.format_help(), path
        n = 1
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    n += walk(sub, f"{path} {name}")
        return n

    assert walk(build_parser(), "cuzk-mp") > 20


def _leaf_parsers(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.ArgumentParser]]:
    """``(command words, parser)`` of every verb under ``parser`` that takes no further verb."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [(path, parser)]
    out = []
    for name, sub in subs[0].choices.items():
        out += _leaf_parsers(sub, f"{path} {name}")
    return out


# Where the README tells of each command (its options are named in that section).
README_SECTIONS = {"groth16": "## Proving like snarkjs", "zkey": "## Proving like snarkjs",
                   "wtns": "## Proving like snarkjs", "setup": "## Proving like snarkjs",
                   "circuit": "## Proving like snarkjs", "shm": "## Proving like snarkjs",
                   "bench": "## Benchmarking", "daemon": "## The proving daemon", "client": "## The proving daemon",
                   "fleet": "## The proving daemon"}


def _readme_section(heading: str) -> str:
    readme = (REPO / "README.md").read_text()
    text = readme[readme.index(heading):]
    return text[:text.index("\n## ", 1)]


def test_every_command_has_a_readme_section() -> None:
    """A new top-level command gets a place in the README (and in :data:`README_SECTIONS`); the
    snarkjs aliases are the long forms' parsers again."""
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    aliases = {v.alias for v in cli.SNARKJS_VERBS} | {a for v in cli.SNARKJS_VERBS for a in v.more_aliases}
    assert set(sub.choices) - aliases == set(README_SECTIONS)


@pytest.mark.parametrize("command", sorted(README_SECTIONS))
def test_every_option_has_help_and_a_place_in_the_readme(command: str) -> None:
    """Each argument of every verb of ``command`` says what it is in ``--help``, and each option is
    named in the README's section of that command."""
    text = _readme_section(README_SECTIONS[command])
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for verb, parser in _leaf_parsers(sub.choices[command], command):
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            name = max(action.option_strings, key=len) if action.option_strings else action.dest
            assert action.help, f"{verb} {name}: no help text"
            if action.option_strings:
                assert re.search(rf"{re.escape(name)}\b(?!-)", text), \
                    f"{verb} {name}: not in {README_SECTIONS[command]}"


def test_the_global_options_are_in_the_readme() -> None:
    text = _readme_section("## Proving like snarkjs")
    for action in cli.build_parser()._actions:
        if action.option_strings and not isinstance(action, argparse._HelpAction):
            for option in action.option_strings:
                assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text), f"{option}: not in the README"


def test_help_documents_the_exit_codes() -> None:
    proc = run_cli("--help")
    assert proc.returncode == 0
    readme = (REPO / "README.md").read_text()
    for code, what in cli.EXIT_CODES:
        assert re.search(rf"^\s+{code}\s+{re.escape(what)}$", proc.stdout, re.M), (code, proc.stdout)
        assert re.search(rf"^\| {code} \| ", readme, re.M), f"README lacks exit code {code}"


def test_bench_cache_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CUZK_MP_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cli.build_parser().parse_args(["bench"]).cache == tmp_path / "cuzk-mp"


def test_default_cache_dir() -> None:
    home = {"HOME": "/home/u"}
    assert default_cache_dir(home) == Path("/home/u/.cache/cuzk-mp")
    assert default_cache_dir({**home, "XDG_CACHE_HOME": "/xdg"}) == Path("/xdg/cuzk-mp")
    assert default_cache_dir({**home, "XDG_CACHE_HOME": "relative"}) == Path("/home/u/.cache/cuzk-mp")
    assert default_cache_dir({**home, "XDG_CACHE_HOME": "/xdg", "CUZK_MP_CACHE": "/var/lib/c"}) == Path("/var/lib/c")
    assert default_cache_dir({**home, "CUZK_MP_CACHE": "~/k"}) == Path("~/k").expanduser()
    assert default_cache_dir({**home, "CUZK_MP_CACHE": ""}) == Path("/home/u/.cache/cuzk-mp")


# --- proving through the aliases ----------------------------------------------------------------

def test_prove_keeps_the_keys_rows_for_the_next_proof(circuit: dict[str, Path], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """g16p leaves the key's coded rows beside it (the fixture's proof made them) and the next proof
    maps them; with --r1cs the rows include C and a broken witness is named by its constraint; with
    no writable place for them the proof builds them for itself."""
    from cuzk_mp.formats.wtns import read_wtns, write_wtns

    assert Path(f"{circuit['zkey']}.synth-ab").is_file()
    out = [tmp_path / "p.json", tmp_path / "s.json"]
    assert cli.main(["g16p", str(circuit["zkey"]), str(circuit["wtns"]), *map(str, out), "--backend", "cpu",
                     "--r1cs", str(circuit["r1cs"])]) == 0
    assert Path(f"{circuit['zkey']}.synth-abc").is_file()
    w = read_wtns(circuit["wtns"])
    w[1:] = w[1:][::-1].copy()  # the wires reversed: constraints fail
    write_wtns(tmp_path / "bad.wtns", w)
    assert_message(run_cli("g16p", circuit["zkey"], tmp_path / "bad.wtns", *out, "--backend", "cpu",
                           "--r1cs", circuit["r1cs"]), 2, "constraint")
    from cuzk_mp.errors import CuzkError
    from cuzk_mp.groth16 import synthesis

    def nowhere(*args: object, **kwargs: object) -> None:
        raise CuzkError("no writable place for the circuit-data cache")

    monkeypatch.setattr(synthesis, "open_or_build", nowhere)
    out[1].unlink()
    assert cli.main(["g16p", str(circuit["zkey"]), str(circuit["wtns"]), *map(str, out), "--backend", "cpu"]) == 0
    assert json.loads(out[1].read_text()) == json.loads(circuit["public"].read_text())


def test_default_names_in_the_working_folder(circuit: dict[str, Path], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Prove, export and verify with no file arguments, as a snarkjs user does."""
    (tmp_path / "circuit_final.zkey").symlink_to(circuit["zkey"])
    (tmp_path / "witness.wtns").symlink_to(circuit["wtns"])
    monkeypatch.chdir(tmp_path)
    assert cli.main(["g16p", "--backend", "cpu"]) == 0
    assert cli.main(["zkev"]) == 0
    assert json.loads((tmp_path / "circuit_vk.json").read_text()) == json.loads(circuit["vk"].read_text())
    (tmp_path / "verification_key.json").symlink_to(tmp_path / "circuit_vk.json")
    proc = run_cli("g16v", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "OK!", proc.stderr
    assert json.loads((tmp_path / "public.json").read_text()) == json.loads(circuit["public"].read_text())


def test_tampered_proof_exits_1(circuit: dict[str, Path], tmp_path: Path) -> None:
    public = json.loads(circuit["public"].read_text())
    public[0] = str(int(public[0]) + 1)
    (tmp_path / "public.json").write_text(json.dumps(public))
    proc = run_cli("groth16", "verify", circuit["vk"], tmp_path / "public.json", circuit["proof"])
    assert proc.returncode == 1 and proc.stdout.startswith("Invalid proof"), proc.stdout + proc.stderr
    good = run_cli("g16v", circuit["vk"], circuit["public"], circuit["proof"], "-v")
    assert good.returncode == 0 and good.stdout.strip() == "OK!"
    # the same value + r, or negative: a well-formed claim that fails, as snarkjs says ("not valid")
    for changed in (str(int(json.loads(circuit["public"].read_text())[0]) + R_MOD), "-1"):
        (tmp_path / "public.json").write_text(json.dumps([changed, *public[1:]]))
        proc = run_cli("g16v", circuit["vk"], tmp_path / "public.json", circuit["proof"])
        assert proc.returncode == 1 and proc.stdout.startswith("Invalid proof: public signal 0 is not a field "
                                                               "element"), proc.stdout + proc.stderr
    # a number snarkjs's JSON.parse would round: refused as a file, naming the fix
    (tmp_path / "public.json").write_text("[" + ", ".join(json.loads(circuit["public"].read_text())) + "]")
    assert int(json.loads(circuit["public"].read_text())[0]) > 2**53  # field-sized: a double rounds it
    proc = run_cli("g16v", circuit["vk"], tmp_path / "public.json", circuit["proof"])
    assert proc.returncode == 2 and "not exact as a JavaScript number" in proc.stderr, proc.stdout + proc.stderr


# --- every way out: a message and a documented exit code ---------------------------------------

def _replace_verify(monkeypatch: pytest.MonkeyPatch, func: Callable[[argparse.Namespace], int]) -> None:
    """``g16v`` runs ``func`` instead of the verifier."""
    verbs = tuple(dataclasses.replace(v, func=func) if v.alias == "g16v" else v for v in cli.SNARKJS_VERBS)
    monkeypatch.setattr(cli, "SNARKJS_VERBS", verbs)


def test_input_errors_exit_2(circuit: dict[str, Path], tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.zkey"
    garbage.write_bytes(b"not a zkey at all, just some bytes")
    assert_message(run_cli("g16p", tmp_path / "missing.zkey", circuit["wtns"], tmp_path / "p.json",
                           tmp_path / "q.json"), 2, "missing.zkey")
    assert_message(run_cli("g16p", garbage, circuit["wtns"], tmp_path / "p.json", tmp_path / "q.json"), 2,
                   "garbage.zkey")
    assert_message(run_cli("g16p", circuit["zkey"], circuit["r1cs"], tmp_path / "p.json", tmp_path / "q.json"),
                   2, "porep-like-10.r1cs")  # an .r1cs given as the witness
    assert_message(run_cli("g16p", tmp_path, circuit["wtns"]), 2, str(tmp_path))  # a folder as the key
    assert_message(run_cli("g16v", circuit["vk"], circuit["zkey"], circuit["proof"]), 2, "c.zkey")
    assert_message(run_cli("setup", circuit["wtns"], tmp_path / "k.zkey"), 2, "porep-like-10.wtns")
    assert_message(run_cli("zkev", circuit["zkey"], tmp_path / "no" / "such" / "dir" / "vk.json"), 2, "vk.json")
    assert_message(run_cli("no-such-verb"), 2, "invalid choice")
    assert not list(tmp_path.glob("*.json"))



def test_files_in_the_wrong_order_are_named_for_what_they_are(circuit: dict[str, Path], tmp_path: Path) -> None:
    """snarkjs's orders (verify: VK PUBLIC PROOF; prove: ZKEY WTNS) are easy to swap: the file in
    another's place is named, and so is what it is."""
    assert_message(run_cli("g16v", circuit["vk"], circuit["proof"], circuit["public"]), 2,
                   "proof.json: a proof, not public signals (are the files in the right order?)")
    assert_message(run_cli("g16v", circuit["zkey"], circuit["public"], circuit["proof"]), 2,
                   "c.zkey: not JSON text but a .zkey file")
    assert_message(run_cli("g16p", circuit["wtns"], circuit["zkey"], tmp_path / "p.json", tmp_path / "q.json"), 2,
                   "porep-like-10.wtns: wrong magic b'wtns': not a .zkey file but a .wtns file")
    assert not list(tmp_path.glob("*.json"))

def test_outputs_never_replace_inputs(circuit: dict[str, Path], tmp_path: Path) -> None:
    """An output path naming an input (even through a link) or another output is refused before any
    work, and the input is untouched; an output that cannot be written is named as given."""
    key_bytes = circuit["zkey"].stat().st_size
    link = tmp_path / "key-link.zkey"
    link.symlink_to(circuit["zkey"])
    assert_message(run_cli("g16p", circuit["zkey"], circuit["wtns"], link, tmp_path / "q.json"), 2,
                   "the proof output would replace the zkey input")
    assert_message(run_cli("g16p", circuit["zkey"], circuit["wtns"], tmp_path / "p.json", circuit["wtns"]), 2,
                   "the public output would replace the wtns input")
    assert_message(run_cli("g16p", circuit["zkey"], circuit["wtns"], tmp_path / "same.json", tmp_path / "same.json"),
                   2, "given as both the proof and the public output")
    assert_message(run_cli("zkev", circuit["zkey"], circuit["zkey"]), 2, "the vk output would replace the zkey input")
    assert_message(run_cli("setup", circuit["r1cs"], circuit["r1cs"]), 2,
                   "the zkey output would replace the r1cs input")
    (tmp_path / "in").mkdir()
    inputs = tmp_path / "in" / "input.json"
    inputs.write_text("{}")
    assert_message(run_cli("wc", tmp_path / "c.wasm", inputs, inputs), 2,
                   "input.json: the wtns output would replace the input: give another path")
    assert inputs.read_text() == "{}"
    assert circuit["zkey"].stat().st_size == key_bytes
    assert_message(run_cli("zkev", circuit["zkey"], tmp_path), 2, f"error: {tmp_path}: cannot write it: is a folder")
    assert not list(tmp_path.glob("*.json")) and not list(tmp_path.glob(".cuzk-mp-*"))


@pytest.mark.parametrize("args", [
    ("g16p", "IN", "WTNS", "p.json", "q.json"), ("g16p", "ZKEY", "IN", "p.json", "q.json"),
    ("g16p", "ZKEY", "WTNS", "p.json", "q.json", "--r1cs", "IN"), ("zkev", "IN", "vk.json"),
    ("setup", "IN", "k.zkey", "--backend", "cpu"),
])
@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_a_binary_input_that_is_no_regular_file_is_named_at_once(args: tuple[str, ...], kind: str,
                                                                  tmp_path: Path) -> None:
    """A .zkey, .wtns or .r1cs is read where it lies (mapped, or read at its sections' offsets), so a
    FIFO, a pipe or a device cannot be one: refused at once, saying what it is (exit 2), where a FIFO
    that no process writes held the command for ever and a pipe or /dev/zero was "0 bytes"."""
    zkey, _ = small_circom_key(tmp_path)
    src = tmp_path / "in.bin"
    if kind == "fifo":
        os.mkfifo(src)
    else:
        src = Path(kind)
    files = {"IN": src, "ZKEY": zkey, "WTNS": REPO / "tests" / "data_formats" / "mul.wtns"}
    argv = [sys.executable, "-m", "cuzk_mp", args[0], *(str(files[a]) if a in files else str(tmp_path / a) if "." in a
                                                       else a for a in args[1:])]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=REPO, env=ENV)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(args)} with a {kind} as an input did not end")
    what = "a FIFO (a named pipe)" if kind == "fifo" else "a character device"
    assert_message(proc, 2, f"{src}: cannot read it in place: {what}, not a regular file")
    assert not list(tmp_path.glob("*.json")) and not list(tmp_path.glob("k.zkey"))


@pytest.mark.parametrize("verb", ["wc", "g16f"])
def test_an_input_from_a_pipe_is_read_no_further_than_its_limit(verb: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """An input JSON that is a pipe (``<(gen)``, /dev/stdin, a FIFO) has no size to check before its
    read: the read stops past the limit and the file is refused naming it (exit 2), where reading to
    the end would take whatever the writer sends, until the host's memory runs out."""
    from cuzk_mp.circuits import circom

    monkeypatch.setattr(circom, "MAX_INPUT_BYTES", 1000)
    zkey, _ = small_circom_key(tmp_path)  # fullprove reads its key and compiles its wasm first
    wasm = circom_generator(tmp_path, "c")
    r, w = os.pipe()
    os.write(w, b" " * 4096)  # more than the limit, and a writer that is not done (its end stays open)
    src = f"/dev/fd/{r}"
    argv = (["wc", str(wasm), src, str(tmp_path / "w.wtns")] if verb == "wc" else
            ["g16f", src, str(wasm), str(zkey), str(tmp_path / "p.json"),
             str(tmp_path / "s.json"), "--backend", "cpu"])
    codes: list[int] = []
    verb_run = threading.Thread(target=lambda: codes.append(cli.main(argv)), daemon=True)
    verb_run.start()
    verb_run.join(20)
    stopped = not verb_run.is_alive()
    os.close(w)  # lets a read to the end finish
    verb_run.join(60)
    os.close(r)
    assert stopped and codes == [2], codes
    err = capsys.readouterr().err
    assert f"{src}: more than the limit of 1000 bytes of input JSON" in err, err
    assert not list(tmp_path.glob("*.json")) and not list(tmp_path.glob("*.wtns"))


def test_a_key_cut_short_while_a_proof_reads_it_says_where_the_bus_error_came_from(tmp_path: Path) -> None:
    """A .zkey is mapped, never copied (keys reach ~100 GB): one cut short in place while a one-shot
    ``groth16 prove`` reads it (``cp new.zkey key.zkey`` over it) kills the process with SIGBUS, the
    kernel's answer to a read of a mapped page past the file's end. The process says so first, with
    the Python stack that read it, where it died with a bare "Bus error". The key is read first on the
    verb's own thread here: where two threads fault at once (the CPU backend converts G2 on its pool
    beside G1), the second fault may end the process before the first one's dump is written."""
    zkey, _ = small_circom_key(tmp_path)
    wtns = REPO / "tests" / "data_formats" / "mul.wtns"
    # the key cut short under its mapping, then read on this thread before the prover starts its pool
    script = ("import sys; from cuzk_mp import cli; from cuzk_mp.groth16 import prover; real = prover.prove\n"
              "def prove(backend, zkey, *args, **kwargs):\n"
              f"    open({str(zkey)!r}, 'r+b').truncate(64)\n"
              "    int(zkey.h.reshape(-1)[-1])\n"
              "    return real(backend, zkey, *args, **kwargs)\n"
              "prover.prove = prove; sys.argv[1:] = ['g16p', *sys.argv[1:]]; cli.run()\n")
    env = {k: v for k, v in ENV.items() if k != "PYTHONFAULTHANDLER"}
    proc = subprocess.run([sys.executable, "-c", script, str(zkey), str(wtns), str(tmp_path / "p.json"),
                           str(tmp_path / "q.json"), "--backend", "cpu"], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=env)
    assert proc.returncode == -signal.SIGBUS, (proc.returncode, proc.stderr[-2000:])
    assert "Fatal Python error: Bus error" in proc.stderr, proc.stderr[-2000:]
    assert re.search(r'File "[^"]*cuzk_mp/cli_verbs\.py", line \d+', proc.stderr), proc.stderr[-2000:]  # the verb
    assert not list(tmp_path.glob("*.json"))


@pytest.mark.parametrize("verb", ["g16p", "g16f", "zkev", "wc", "setup"])
def test_an_output_in_a_folder_that_cannot_take_it_is_refused_before_any_work(verb: str, tmp_path: Path) -> None:
    """An output whose folder is missing or is a file is refused first, naming it and why (exit 2),
    where a proof (minutes at 2^27), a key export or a witness was made and then could not be
    written. The inputs here are bad: had they been read first, they would have been named."""
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"not any file a verb reads")
    for out, why in ((tmp_path / "none" / "out", f"no such folder: {tmp_path / 'none'}"),
                     (garbage / "out", f"{garbage} is not a folder")):
        args = {"g16p": [garbage, garbage, out, tmp_path / "q.json", "--backend", "cpu"],
                "g16f": [garbage, garbage, garbage, tmp_path / "p.json", out, "--backend", "cpu"],
                "zkev": [garbage, out], "wc": [garbage, garbage, out], "setup": [garbage, out, "--backend", "cpu"]}
        assert_message(run_cli(verb, *args[verb]), 2, f"{out}: cannot write it: {why}")
    assert [p.name for p in tmp_path.iterdir()] == ["garbage"]


def test_an_output_written_in_place_may_be_given_twice(tmp_path: Path) -> None:
    """A device or a pipe is written in place, never replaced, so a proof and its public signals
    may both go to it, as snarkjs allows: /dev/null twice (a benchmark's script) discards both,
    /dev/stdout twice prints the proof, then the public signals. Two regular files of one path
    stay refused: the second would replace the first."""
    zkey, _ = small_circom_key(tmp_path)
    wtns = REPO / "tests" / "data_formats" / "mul.wtns"
    proc = run_cli("g16p", zkey, wtns, "/dev/null", "/dev/null", "--backend", "cpu")
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    proc = run_cli("g16p", zkey, wtns, "/dev/stdout", "/dev/stdout", "--backend", "cpu")
    assert proc.returncode == 0, proc.stderr
    decoder = json.JSONDecoder()
    proof, end = decoder.raw_decode(proc.stdout)
    public, _ = decoder.raw_decode(proc.stdout[end:])
    assert set(proof) >= {"pi_a", "pi_b", "pi_c"} and isinstance(public, list), proc.stdout
    assert_message(run_cli("g16p", zkey, wtns, tmp_path / "same.json", tmp_path / "same.json", "--backend", "cpu"),
                   2, "given as both the proof and the public output")


def test_a_folder_that_is_a_link_to_nowhere_is_bad_input(tmp_path: Path) -> None:
    """``circuit``'s folder (or a folder above it) a symbolic link whose target is missing: exit 2
    naming the link and where it leads, as for any folder that cannot be made (it was exit 1,
    "File exists", from the folder's creation)."""
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    for out in (tmp_path / "link", tmp_path / "link" / "sub"):
        assert_message(run_cli("circuit", "porep-like", "--log-n", "10", out), 2,
                       f"{tmp_path / 'link'} is a symbolic link that leads nowhere ({tmp_path / 'gone'})")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link"]


def test_a_wasm_that_cannot_be_read_is_bad_input_and_a_piped_one_is_read(tmp_path: Path) -> None:
    """The witness generator is a file like the others: one that cannot be opened for any reason (a
    loop of links, a name too long) is bad input naming it (exit 2; it was exit 1 for all but a
    missing file and a folder), and one given through a pipe (``<(cat c.wasm)``) is read once,
    as a file is (its second read found nothing: "not a valid wasm module ... not valid utf-8")."""
    from cuzk_mp.formats.wtns import read_wtns

    inputs = tmp_path / "input.json"
    inputs.write_text("{}")
    loop = tmp_path / "loop.wasm"
    loop.symlink_to(loop)
    assert_message(run_cli("wc", loop, inputs, tmp_path / "w.wtns"), 2,
                   f"{loop}: cannot read: Too many levels of symbolic links")
    long_name = tmp_path / ("x" * 300 + ".wasm")
    assert_message(run_cli("wc", long_name, inputs, tmp_path / "w.wtns"), 2,
                   f"{long_name}: cannot read: File name too long")
    wasm = circom_generator(tmp_path, "c")
    r, w = os.pipe()
    os.write(w, wasm.read_bytes())
    os.close(w)
    try:
        assert cli.main(["wc", f"/dev/fd/{r}", str(inputs), str(tmp_path / "w.wtns")]) == 0
    finally:
        os.close(r)
    assert read_wtns(tmp_path / "w.wtns").shape[0] == 1  # the generator's witness: the constant 1 alone


def test_small_json_files_are_read_in_memory_of_their_size(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The files of ``groth16 verify`` (a few KB) are read in memory of about their size, not in a
    buffer of the 1 GiB limit that Python sets aside whole for ``read(limit + 1)``: a process under
    an address-space limit (``ulimit -v 1000000``) refused a 4 KB key as "out of host memory" (exit 4).
    The same read serves an input JSON, given as a file or a pipe."""
    import tracemalloc

    from cuzk_mp.circuits.circom import load_input_json

    data = REPO / "tests" / "data_formats"
    tracemalloc.start()
    try:
        assert cli.main(["g16v", str(data / "verification_key.json"), str(data / "public.json"),
                         str(data / "proof.json")]) == 0
        r, w = os.pipe()
        os.write(w, b'{"a": "3", "b": "11"}')
        os.close(w)
        try:
            assert load_input_json(f"/dev/fd/{r}") == {"a": "3", "b": "11"}
        finally:
            os.close(r)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert capsys.readouterr().out == "OK!\n"
    assert peak < 64 << 20, f"{peak >> 20} MiB"


def test_a_folder_name_too_long_is_bad_input(tmp_path: Path) -> None:
    """``circuit``'s folder with a name longer than the file system takes: exit 2 naming it and
    why (it was exit 1: the check of the folder itself failed on the name)."""
    out = tmp_path / ("x" * 300)
    assert_message(run_cli("circuit", "porep-like", "--log-n", "10", out), 2,
                   f"{out} cannot be a folder: File name too long")
    assert not list(tmp_path.iterdir())


def test_a_key_whose_cache_name_is_too_long_still_proves(tmp_path: Path) -> None:
    """A key of a 250-character name is a file like any other, but ``NAME.synth-ab`` beside it is
    past the file system's 255: the proof goes on with its rows built in memory, as where no cache
    can be written (it ended with exit 1, "File name too long", before any proof)."""
    zkey, _ = small_circom_key(tmp_path, "k" * 245)
    wtns = REPO / "tests" / "data_formats" / "mul.wtns"
    proc = run_cli("g16p", zkey, wtns, tmp_path / "p.json", tmp_path / "q.json", "--backend", "cpu",
                   env={"CUZK_MP_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "q.json").read_text()) == json.loads(
        (REPO / "tests" / "data_formats" / "public.json").read_text())


def test_circuit_on_a_full_disk_leaves_neither_file(tmp_path: Path) -> None:
    """``circuit`` writes its .r1cs and its .wtns both or neither: on a file system with room for the
    .r1cs alone (a private tmpfs, in a mount namespace of its own), the .wtns's refusal (exit 2,
    naming it) takes the new .r1cs away too, where it was left without its witness. Skipped, saying
    so, where no mount namespace can be made."""
    from tests.helpers import on_small_tmpfs

    full = tmp_path / "full"
    full.mkdir()
    room = 211016 // 4096 * 4096 + 3 * 4096  # porep-like-10.r1cs's pages and a few: not its 32 KB .wtns
    proc = on_small_tmpfs(full, room, f"{sys.executable} -m cuzk_mp circuit porep-like --log-n 10 {full}; code=$?; "
                          f"ls -A {full}; exit $code")
    assert_message(proc, 2, "porep-like-10.wtns: cannot write it: No space left on device")
    assert proc.stdout == "", proc.stdout  # the files left in the folder: none


def test_a_closed_stdout_or_stderr_changes_no_exit_code(tmp_path: Path) -> None:
    """A command started with its stdout or stderr closed (``>&-``, ``2>&-``: a daemon manager's or a
    cron job's) answers with its exit code as any other: 0 for a valid proof, 2 for a missing file,
    never a traceback and exit 1 from the flush of a stream Python left as None."""
    data = REPO / "tests" / "data_formats"
    verify = f"{sys.executable} -m cuzk_mp g16v {data / 'verification_key.json'} {data / 'public.json'} " \
             f"{data / 'proof.json'}"
    missing = f"{sys.executable} -m cuzk_mp g16p {tmp_path / 'none.zkey'} {data / 'mul.wtns'}"
    for line, code in ((f"{verify} >&-", 0), (f"{verify} 2>&-", 0), (f"{missing} >&-", 2), (f"{missing} 2>&-", 2)):
        proc = subprocess.run(["sh", "-c", line], env=ENV, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert proc.returncode == code and "Traceback" not in proc.stderr, (line, proc.returncode, proc.stderr)


def test_a_stdout_that_cannot_be_written_is_an_output_error(tmp_path: Path) -> None:
    """``groth16 verify > result.txt`` on a full disk: its verdict cannot be written, which is exit 2
    (an output that cannot be written, named "stdout"), never exit 1, the answer for an invalid
    proof. The same for the paths ``circuit`` prints. Skipped where there is no /dev/full."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    data = REPO / "tests" / "data_formats"
    with open("/dev/full", "w") as full:
        verify = subprocess.run([sys.executable, "-m", "cuzk_mp", "g16v", str(data / "verification_key.json"),
                                 str(data / "public.json"), str(data / "proof.json")], stdout=full,
                                stderr=subprocess.PIPE, text=True, env=ENV, cwd=REPO, timeout=120)
        circuit = subprocess.run([sys.executable, "-m", "cuzk_mp", "circuit", "porep-like", "--log-n", "10",
                                  str(tmp_path)], stdout=full, stderr=subprocess.PIPE, text=True, env=ENV,
                                 cwd=REPO, timeout=120)
    for proc in (verify, circuit):
        assert_message(proc, 2, "error: stdout: cannot write it: No space left on device")


def test_a_witness_goes_through_a_pipe_whole(tmp_path: Path) -> None:
    """``wc c.wasm input.json /dev/stdout | gzip > w.wtns.gz``: a .wtns is written in place to a pipe
    as to a file, the same bytes (its sections' sizes are known before their bytes: nothing is
    patched afterwards, which a pipe cannot take; it ended with exit 2, "Illegal seek", after a
    header that said 0 bytes had gone down the pipe)."""
    wasm = circom_generator(tmp_path, "c", inputs=2)
    inputs = tmp_path / "input.json"
    inputs.write_text('{"a": ["3", "11"]}')
    assert cli.main(["wc", str(wasm), str(inputs), str(tmp_path / "w.wtns")]) == 0
    proc = subprocess.run([sys.executable, "-m", "cuzk_mp", "wc", str(wasm), str(inputs), "/dev/stdout"],
                          capture_output=True, env=ENV, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (tmp_path / "w.wtns").read_bytes()


def test_a_working_folder_that_is_gone_names_the_file(tmp_path: Path) -> None:
    """Run from a folder removed under it (a script's temporary folder cleaned away), ``g16p`` with
    snarkjs's default (relative) names names the file it cannot read (exit 2), where the check of
    its outputs against its inputs asked for the working folder and the message was "None: No such
    file or directory"."""
    gone = tmp_path / "gone"
    gone.mkdir()
    script = f"cd {gone} && rmdir {gone} && exec {sys.executable} -m cuzk_mp g16p --backend cpu"
    env = {**ENV, "PYTHONPATH": str(REPO)}  # no empty entry: the interpreter's start would look at the gone folder
    proc = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert_message(proc, 2, "circuit_final.zkey: cannot read: No such file or directory")
    assert "None" not in proc.stderr, proc.stderr


def test_unreachable_daemon_exits_3(tmp_path: Path) -> None:
    assert_message(run_cli("client", "status", "--connect", f"unix://{tmp_path}/none.sock"), 3, "none.sock")


def test_prove_connect_finds_the_circuit_by_its_key_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``groth16 prove --connect``: the daemon's circuit is the one whose zkey is this very file (through a
    symlink too; a copy is another file), read from the status detail, which a daemon with tokens gives an
    admin token only; the client process imports no numpy. The daemon here runs the engine double (its
    proofs are generator points): tests/test_daemon_circom.py proves for real and verifies with snarkjs."""
    from cuzk_mp.daemon import budget
    from cuzk_mp.daemon.server import Daemon
    from cuzk_mp.pipeline.memory import estimated_circuit_size
    from tests.fake_engine import PROOF, run_daemon
    from tests.helpers import REFUSE_NUMPY

    small_circom_key(tmp_path)  # what the engine double proves never reads them
    small_circom_key(tmp_path, "copy")
    (tmp_path / "link.zkey").symlink_to(tmp_path / "c.zkey")
    (tmp_path / "w.wtns").write_bytes(b"wtns" + bytes(60))
    monkeypatch.setattr(budget, "circuit_size", lambda spec, backend="cpu": estimated_circuit_size(1 << 10, 1 << 10))
    client_token, admin_token = "client-token-000000001", "admin-token-0000000002"
    proof, public = tmp_path / "proof.json", tmp_path / "public.json"
    no_numpy = REFUSE_NUMPY + "from cuzk_mp.cli import main\nsys.exit(main(sys.argv[1:]))\n"

    def prove(addr: str, token: str, key: str, *more: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", no_numpy, "groth16", "prove", "--connect", addr, "--token",
                               token, *more, str(tmp_path / key), str(tmp_path / "w.wtns"), str(proof), str(public)],
                              capture_output=True, text=True, timeout=300, cwd=REPO, env=ENV)

    async def body(d: Daemon, addr: str) -> None:
        assert_message(await asyncio.to_thread(prove, addr, client_token, "c.zkey"), 2, "admin token",
                       "client prove --circuit")
        assert not proof.exists()
        assert_message(await asyncio.to_thread(prove, addr, admin_token, "copy.zkey"), 2,
                       "has no circuit with the key", str(tmp_path / "c.zkey"))
        assert_message(await asyncio.to_thread(prove, addr, admin_token, "c.zkey", "--backend", "cpu"), 2,
                       "leave out --backend")
        assert_message(await asyncio.to_thread(prove, addr, admin_token, "link.zkey"), 0)
        assert json.loads(proof.read_text()) == PROOF and json.loads(public.read_text()) == ["0", "0"]

    run_daemon(tmp_path, body, circuits={"circ": {"zkey": str(tmp_path / "c.zkey"), "r1cs": str(tmp_path / "c.r1cs")}},
               tokens=[client_token], admin_tokens=[admin_token])
    assert_message(prove(f"unix://{tmp_path}/d.sock", admin_token, "c.zkey"), 3, "cannot reach the daemon")


class _CupyOutOfMemory(MemoryError):
    """What CuPy raises when the device has no room (cupy.cuda.memory.OutOfMemoryError, a MemoryError)."""


_CupyOutOfMemory.__module__ = "cupy.cuda.memory"


def test_out_of_device_memory_is_a_resource_error_in_a_pipeline_too() -> None:
    assert errors.error_kind(_CupyOutOfMemory("no room")) == "ResourceError"
    assert errors.error_kind(MemoryError()) == "InternalError"  # the host's: a process that ran out


@pytest.mark.parametrize(("exc", "code", "needle"), [
    (errors.FormatError("k.zkey", "header", "bad"), 2, "k.zkey, section header: bad"),
    (errors.UnsatisfiedWitness(7, "constraint 7 fails"), 2, "constraint 7 fails"),
    (errors.ConfigError("[srs] x: bad"), 2, "[srs] x"),
    (errors.VerificationFailed("did not verify"), 1, "VerificationFailed: did not verify"),
    (errors.GpuDead("device 0 lost"), 1, "GpuDead: device 0 lost"),
    (errors.Cancelled("job j"), 1, "Cancelled"),
    (errors.ResourceError("shm: 3 GiB short"), 4, "3 GiB short"),
    (MemoryError(), 4, "out of host memory"),
    (_CupyOutOfMemory("Out of memory allocating 2,048 bytes"), 4, "out of GPU memory: Out of memory allocating"),
    (FileNotFoundError(2, "No such file or directory", "in.json"), 2, "in.json: No such file or directory"),
    (FileNotFoundError(2, "No such file or directory"), 2, "error: No such file or directory"),  # os.getcwd()'s
    (PermissionError(13, "Permission denied", "/etc/k"), 2, "/etc/k: Permission denied"),
    (OSError(28, "No space left on device", "out.zkey"), 1, "out.zkey: No space left on device"),
    (KeyboardInterrupt(), 130, "interrupted"),
    (errors.HungUp(), 129, "hung up (SIGHUP)"),
    (TypeError("unexpected"), 70, "internal error: TypeError: unexpected"),
])
def test_every_error_has_a_code_and_one_line(exc: BaseException, code: int, needle: str,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    def boom(args: argparse.Namespace) -> int:
        raise exc

    _replace_verify(monkeypatch, boom)
    assert cli.main(["g16v", "a", "b", "c"]) == code
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert code in dict(cli.EXIT_CODES)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_the_last_line_is_one_line_in_the_log_format(fmt: str, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A message of several lines (a database's "cannot connect ..." and its tab-indented hint) still
    ends the command with one line; where the logs are JSON lines, one more like them, with the exit code."""
    def boom(args: argparse.Namespace) -> int:
        logging.getLogger("cuzk_mp.test").warning("a log line first")
        raise errors.ResourceError('fleet: cannot connect to "db:5432": connection refused\n'
                                   "\tIs the server running on that host?\n")

    _replace_verify(monkeypatch, boom)
    monkeypatch.setenv("CUZK_MP_LOG_FORMAT", fmt)
    root = logging.getLogger()
    handlers = list(root.handlers)
    try:
        assert cli.main(["g16v"]) == cli.EXIT_RESOURCES
    finally:
        root.handlers[:] = handlers  # not a JSON handler left for the tests after this one
    logged, last = capsys.readouterr().err.splitlines()
    message = 'not enough resources: fleet: cannot connect to "db:5432": connection refused Is the server running ' \
              "on that host?"
    if fmt == "text":
        assert last == f"cuzk-mp: {message}"
        return
    first, end = json.loads(logged), json.loads(last)
    assert set(first) < set(end) and end["exit_code"] == cli.EXIT_RESOURCES and "exit_code" not in first
    assert (end["level"], end["process"], end["logger"], end["msg"]) == ("error", "cuzk-mp", "cuzk_mp.cli", message)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_file_name_with_a_line_break_is_shown_escaped_in_the_last_line(
        fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A file name with a line break in it (``vk<LF>x.json``) was folded with the message's own line
    breaks into ``vk x.json``: the name of another file. A name given on the command line that holds a
    control character is shown as Python writes the string (quoted, ``\\n`` for the line break), in the
    text line and in the JSON one; the message's own line breaks are still folded."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUZK_MP_LOG_FORMAT", fmt)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    root = logging.getLogger()
    handlers = list(root.handlers)
    try:
        assert cli.main(["g16v", "vk\nx.json", "p.json", "q.json"]) == cli.EXIT_INPUT
    finally:
        root.handlers[:] = handlers
    (last,) = capsys.readouterr().err.splitlines()
    text = json.loads(last)["msg"] if fmt == "json" else last
    assert "error: 'vk\\nx.json': cannot read: No such file or directory" in text, text
    assert "vk x.json" not in text


def test_a_usage_error_is_one_json_line_where_the_logs_are_json(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """argparse's refusals too: with CUZK_MP_LOG_FORMAT=json the command ends with one JSON line (exit 2,
    no usage text); without it, argparse's usage and message as always."""
    monkeypatch.setenv("CUZK_MP_LOG_FORMAT", "json")
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # a fresh process's: none configured before parsing
    for argv, says in ((["client", "submit", "--circuit", "x", "--partitions", "0"], "is not a partition count"),
                       (["daemon"], "the following arguments are required: --config"),
                       (["g16v", "--no-such-option"], "unrecognized arguments: --no-such-option")):
        assert cli.main(argv) == 2
        (line,) = capsys.readouterr().err.splitlines()
        end = json.loads(line)
        assert end["exit_code"] == 2 and end["level"] == "error" and says in end["msg"], end
    monkeypatch.delenv("CUZK_MP_LOG_FORMAT")
    assert cli.main(["daemon"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: cuzk-mp daemon") and "error: the following arguments are required" in err


def test_a_client_verb_ends_with_one_json_line_where_the_logs_are_json(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CUZK_MP_LOG_FORMAT", "json")
    root = logging.getLogger()
    handlers = list(root.handlers)
    try:
        assert cli.main(["client", "status", "--connect", f"unix://{tmp_path}/none.sock"]) == cli.EXIT_UNREACHABLE
    finally:
        root.handlers[:] = handlers
    [line] = capsys.readouterr().err.splitlines()
    end = json.loads(line)
    assert end["exit_code"] == cli.EXIT_UNREACHABLE and end["logger"] == "cuzk_mp.daemon.cli"
    assert end["msg"].startswith(f"cannot reach the daemon at unix://{tmp_path}/none.sock: ")


def test_internal_error_traceback_only_at_debug(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    def boom(args: argparse.Namespace) -> int:
        raise ZeroDivisionError("a bug")

    _replace_verify(monkeypatch, boom)
    try:
        assert cli.main(["g16v", "--log-level", "DEBUG"]) == cli.EXIT_INTERNAL
    finally:
        logging.getLogger().setLevel(logging.WARNING)
    err = capsys.readouterr().err
    assert "Traceback" in err and "ZeroDivisionError: a bug" in err
    assert err.strip().splitlines()[-1].startswith("cuzk-mp: internal error: ZeroDivisionError")


def test_python_dash_m_cuzk_mp_with_spawned_workers(tmp_path: Path) -> None:
    """``python -m cuzk_mp`` as the parent of spawned workers: the guard keeps the children from
    running the command again (a bench with one synthesis worker and one prover process)."""
    proc = run_cli("bench", "--backend", "cpu", "--log-n", "10", "--partitions", "2", "--jobs", "1",
                   "--in-flight", "1", "--partition-workers", "1", "--gpu-workers", "1", "--quiet",
                   "--cache", tmp_path / "keys", "--json", tmp_path / "b.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "usage: cuzk-mp" not in proc.stderr
    result = json.loads((tmp_path / "b.json").read_text())
    assert result, result


def _started_as_under_a_terminal(args: list[str], **kwargs: object) -> subprocess.Popen[str]:
    """A command started with SIGHUP at its default, as from a terminal, whatever the test runner
    inherited: under ``nohup`` SIGHUP is ignored, and a command keeps an ignored SIGHUP (as it must:
    :func:`test_a_hangup_keeps_its_ignored_disposition`), so a test of what a hang-up does would
    see it go on."""
    before = signal.signal(signal.SIGHUP, signal.SIG_DFL)  # what the child inherits at its start
    try:
        return subprocess.Popen(args, env=ENV, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                **kwargs)
    finally:
        signal.signal(signal.SIGHUP, before)


@pytest.mark.parametrize(("sig", "code", "says"), [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                                   (signal.SIGHUP, 129, "hung up (SIGHUP)")])
def test_sigterm_stops_a_one_shot_command_and_cleans_up(sig: signal.Signals, code: int, says: str,
                                                        tmp_path: Path) -> None:
    """SIGTERM while `setup` writes its key: exit 143, one line saying so, no temporary file left
    (the same cleanup as SIGINT's). SIGHUP (the terminal closed) the same, exit 129.

    The signal goes out once the key's temporary file is seen; on a loaded machine the watcher may
    see it so late that the setup has renamed its key and exited before the signal was sent (exit 0,
    the key in place): such a try says nothing about the signal and is made again, up to three
    times. A command that ignored the signal would end the same way every time, and fails."""
    assert cli.main(["circuit", "porep-like", "--log-n", "16", str(tmp_path)]) == 0
    inputs = ["porep-like-16.r1cs", "porep-like-16.wtns"]
    for _ in range(3):
        proc = _started_as_under_a_terminal([sys.executable, "-m", "cuzk_mp", "setup", "--backend", "cpu",
                                             str(tmp_path / "porep-like-16.r1cs"), str(tmp_path / "k.zkey")])
        deadline = time.monotonic() + 120
        while not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]:  # it has begun writing
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.01)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        if proc.returncode == 0 and "cuzk-mp: " not in err and (tmp_path / "k.zkey").exists():
            (tmp_path / "k.zkey").unlink()  # done before the signal was sent: try again
            continue
        break
    assert proc.returncode == code and f"cuzk-mp: {says}" in err, (proc.returncode, err)
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == inputs


@pytest.mark.parametrize(("exc", "code", "says"), [(KeyboardInterrupt(), 130, "interrupted"),
                                                   (errors.Terminated(), 143, "terminated (SIGTERM)"),
                                                   (errors.HungUp(), 129, "hung up (SIGHUP)")])
@pytest.mark.parametrize("step", ["build_parser", "_configure_logging"])
def test_a_signal_as_the_command_starts_ends_it_with_its_code_and_one_line(
        exc: BaseException, code: int, says: str, step: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A stop that comes while the command starts, before its verb runs (an engine verb's parser
    imports numpy: a supervisor's SIGTERM right after a start lands there), ends it as anywhere
    else: its exit code and one line, no traceback."""
    def interrupted(*args: object, **kwargs: object) -> None:
        raise exc

    monkeypatch.setattr(cli, step, interrupted)
    try:
        assert cli.main(["client", "status"]) == code
    except KeyboardInterrupt as escaped:  # would end the test run itself
        pytest.fail(f"{escaped!r} escaped main()")
    err = capsys.readouterr().err
    assert err == f"cuzk-mp: {says}\n", err


def test_a_hangup_keeps_its_ignored_disposition(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``nohup`` (SIGHUP ignored) a command keeps running when its terminal closes; otherwise
    SIGHUP stops it as SIGTERM does."""
    for before, after in ((signal.SIG_IGN, signal.SIG_IGN), (signal.SIG_DFL, cli._hang_up)):
        monkeypatch.setattr(signal, "getsignal", lambda signum, before=before: before)
        installed: dict[int, object] = {}
        monkeypatch.setattr(signal, "signal", lambda signum, handler: installed.__setitem__(signum, handler))
        cli.stop_on_signals()
        assert installed.get(signal.SIGHUP, signal.SIG_IGN) == after
        assert installed[signal.SIGTERM] == cli._terminate


def test_a_closed_terminal_stops_a_bench_and_its_engine_leaving_nothing_behind(tmp_path: Path) -> None:
    """SIGHUP to the whole process group (the terminal a ``bench`` runs in closed) while its ring is
    in use: the children leave the decision to the engine, which stops them and removes its ring;
    exit 129, one line saying so, no process left."""
    import psutil

    from cuzk_mp.pipeline.shm_names import cleanup_stale, live_segments, shm_entries

    proc = _started_as_under_a_terminal([sys.executable, "-m", "cuzk_mp", "bench", "--backend", "cpu", "--log-n", "10",
                                         "--partitions", "4", "--jobs", "500", "--partition-workers", "1",
                                         "--ring-slots", "2", "--synthesis-threads", "1", "--quiet", "--cache",
                                         str(tmp_path / "keys")], start_new_session=True)
    prefix = f"cuzk-bench-{proc.pid}"
    try:
        deadline = time.monotonic() + 120
        while live_segments(prefix) == 0:  # partitions travel through the ring
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        children = psutil.Process(proc.pid).children(recursive=True)
        os.killpg(proc.pid, signal.SIGHUP)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 129 and "cuzk-mp: hung up (SIGHUP)" in err, (proc.returncode, err)
        assert "Traceback" not in err
        assert shm_entries(prefix) == []
        psutil.wait_procs(children, timeout=10)
        assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        cleanup_stale(prefix)


@pytest.mark.parametrize(("exc", "code", "what"), [(KeyboardInterrupt(), 130, "interrupted"),
                                                    (errors.Terminated(), 143, "terminated (SIGTERM)"),
                                                    (errors.HungUp(), 129, "hung up (SIGHUP)")])
def test_an_interrupted_client_prove_names_the_job_that_goes_on(exc: BaseException, code: int, what: str,
                                                                 tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C (or SIGTERM) while `client prove` waits stops the client, not the daemon's job: the last
    line names the job and how to await or cancel it (its request id, made before it was sent)."""
    from cuzk_mp.daemon import client as client_mod

    class Waiting:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def __enter__(self) -> Waiting:
            return self

        def __exit__(self, *exc_info: object) -> None:
            pass

        def prove(self, *args: object, **kwargs: object) -> None:
            raise exc

        def submit(self, *args: object, **kwargs: object) -> None:
            raise exc

        def status(self, *args: object, **kwargs: object) -> None:
            raise exc

    monkeypatch.setattr(client_mod, "Client", Waiting)
    assert cli.main(["client", "prove", "--circuit", "c", "--partitions", "2", "--request-id", "job-7",
                     "--out", str(tmp_path), "--connect", "unix:///nowhere.sock"]) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and what in err and "goes on as job job-7" in err, err
    assert "cuzk-mp client await job-7" in err and "cuzk-mp client cancel job-7" in err
    assert cli.main(["client", "status", "--connect", "unix:///nowhere.sock"]) == code  # no job: as before
    assert "goes on" not in capsys.readouterr().err


@pytest.mark.parametrize("verb", ["prove", "await"])
@pytest.mark.parametrize("place", ["a file", "under a file", "a dangling symlink"])
def test_client_out_that_cannot_be_a_folder_is_refused_before_the_job(verb: str, place: str, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """``client prove|await --out DIR`` where DIR cannot be a folder (a file in the way, a path under a
    file, a symlink that leads nowhere) is refused before the daemon is asked anything (exit 2, the
    folder and why named): the whole job was proved first, then its files could not be written, with
    "File exists" for a file or a dangling symlink in the way."""
    from cuzk_mp.daemon import client as client_mod

    asked: list[str] = []

    class Daemon:
        def __init__(self, *args: object, **kwargs: object) -> None:
            asked.append("connect")

    monkeypatch.setattr(client_mod, "Client", Daemon)
    (tmp_path / "afile").write_text("")
    out = {"a file": tmp_path / "afile", "under a file": tmp_path / "afile" / "proofs",
           "a dangling symlink": tmp_path / "link"}[place]
    if place == "a dangling symlink":
        out.symlink_to(tmp_path / "gone" / "proofs")
    why = "is a symbolic link that leads nowhere" if place == "a dangling symlink" else "afile is not a folder"
    job = ["--circuit", "c", "--partitions", "1"] if verb == "prove" else ["job-7"]
    assert cli.main(["client", verb, *job, "--out", str(out), "--connect", "unix:///nowhere.sock"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out}: cannot write it: " in err and why in err, err
    assert asked == []


# Environment variables that are no user's knob: the level a command passes to its own child
# processes, and the install script's stand-in for the driver's version file (its tests set it).
INTERNAL_ENV = {"CUZK_MP_LOG_LEVEL", "CUZK_MP_NVIDIA_PROC"}


def test_every_environment_variable_is_in_the_readme() -> None:
    """Each ``CUZK_*`` variable the package or its scripts read is named in the README."""
    names: set[str] = set()
    for path in [*(REPO / "cuzk_mp").rglob("*.py"), *(REPO / "scripts").iterdir()]:
        if path.is_file():
            names |= set(re.findall(r"\b(CUZK_[A-Z0-9_]*[A-Z0-9])(?![A-Za-z0-9_*])", path.read_text(errors="replace")))
    readme = (REPO / "README.md").read_text()
    missing = sorted(n for n in names - INTERNAL_ENV if not re.search(rf"\b{n}(?![A-Za-z0-9_])", readme))
    assert not missing, f"not in the README: {missing}"


@pytest.mark.parametrize(("argv", "message"), [
    (["--host-budget", "-1GiB"], r"--host-budget: a size cannot be negative \('-1GiB'\)"),
    (["--host-budget=-1GiB"], r"--host-budget: a size cannot be negative \('-1GiB'\)"),
    (["--host-budget", "-512"], r"--host-budget: a size cannot be negative \('-512'\)"),
    (["--start-timeout", "-1e3"], r"--start-timeout must be a number of seconds in .*, got -1000\.0"),
    (["--start-timeout", "-.5"], r"--start-timeout must be a number of seconds in .*, got -0\.5"),
    (["--jobs", "-1"], r"--jobs must be 1\.\.100000, got -1"),
])
def test_a_negative_value_reaches_the_options_own_check(argv: list[str], message: str) -> None:
    """A value that starts like a negative number is the option's value, written with = or not, and the
    option's own check names it (argparse took only "-1" and "-1.5" so: "-1GiB" after an option
    was "expected one argument", naming no value)."""
    from cuzk_mp.pipeline import benchoptions

    args = cli.build_parser().parse_args(["bench", "--backend", "cpu", *argv])
    with pytest.raises(errors.InputError, match=message):
        benchoptions.fill_defaults(args, "cpu")


def test_a_negative_keep_warm_is_named() -> None:
    from cuzk_mp import cli_verbs

    args = cli.build_parser().parse_args(["g16p", "k.zkey", "w.wtns", "--keep-warm", "-1e3"])
    with pytest.raises(errors.InputError, match=r"--keep-warm -1000: a number of seconds in \(0, "):
        cli_verbs._through_a_daemon(args)


@pytest.mark.parametrize("preset", [None, "4"])
def test_the_command_starts_no_blas_thread_pool_unless_asked(preset: str | None) -> None:
    """numpy's OpenBLAS starts a thread per core at import, which nothing of cuzk-mp uses: the command sets
    OPENBLAS_NUM_THREADS to 1 before numpy loads (its engine's workers inherit it), and keeps a caller's own."""
    script = ("import os, sys; from cuzk_mp import cli\n"
              "sys.argv[1:] = ['--version']\n"
              "try:\n    cli.run()\nexcept SystemExit:\n    pass\n"
              "import numpy  # noqa\n"
              "print(len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS'))\n")
    env = {k: v for k, v in ENV.items() if k != "OPENBLAS_NUM_THREADS"}
    if preset is not None:
        env["OPENBLAS_NUM_THREADS"] = preset
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    threads, value = proc.stdout.splitlines()[-1].split()
    assert value == (preset or "1")
    if preset is None:
        assert threads == "1"  # numpy loaded, no thread beside the main one
