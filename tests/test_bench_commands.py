"""Every bench script's ``--help``, and the bench command lines the docs (README.md, docs/*.md; not docs/notes/,
which is history) and the scripts' own --help give: each script's --help exits 0 and gives every option a line of
help, and each ``bench/<name>.py ...`` a doc or a --help names has only that script's options, with values its
parser takes (CI runs no benchmark, so a renamed flag would otherwise rot on the page unseen)."""

from __future__ import annotations

import argparse
import re
import sys

import pytest

from support import ROOT, load_bench

SCRIPTS = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if '__name__ == "__main__"' in p.read_text())
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
COMMAND = re.compile(r"\bbench/(\w+)\.py((?: [^|]*)?)")


class _Parser(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


def parser_of(name: str, monkeypatch) -> argparse.ArgumentParser:
    """The parser ``bench/<name>.py`` builds, caught where it would parse the command line (nothing after runs)."""
    module = load_bench(name)

    def caught(self, *_, **__):
        raise _Parser(self)

    monkeypatch.setattr(sys, "argv", [f"{name}.py"])
    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", caught)
        with pytest.raises(_Parser) as got:
            module.parse_args([]) if hasattr(module, "parse_args") else module.main()
    return got.value.parser


def bench_commands(text: str) -> list[tuple[int, str, list[str], bool]]:
    """``(line, script, words, names_only)`` of each ``bench/<name>.py ...`` on a code line of a doc (indented, or in
    a fenced block; continuation lines joined) or in inline code with words after it (a bare `bench/<name>.py` is a
    mention; inline code may run on to the next line); the brackets of an optional flag (``[--kv-on-update keep]``)
    are not the command's, and ``$T`` is what ``T=`` on a line before set. Two more forms are the script's a
    section's heading names (``## `bench/<name>.py`: ...``) or the command line's: inline code that starts with a
    flag and has more words (a smoke run's ``--groups 8 --repeats 2``), and the flags of a command line's shell
    comment (``# --quick: a smoke run``). Those in a comment, and inline flags with a placeholder value (``--trainer-s
    T``), are checked by name only (``names_only``)."""
    out, env, fenced, section, carry = [], {}, False, None, ""
    for number, line in enumerate(text.replace("\\\n", " ").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if m := re.match(r"\s*([A-Z]+)=(\S+)\s*$", line):
            env[m.group(1)] = m.group(2)
        code = fenced or line.startswith("    ")
        if not fenced and line.startswith("#"):
            heading = re.match(r"#+ `bench/(\w+)\.py`", line)
            section = heading.group(1) if heading else None
        if code:
            command, _, comment = line.partition(" # ")
            spans = [command]
        else:
            line, comment = f"{carry} {line}" if carry and line.strip() else line, ""
            carry = line[line.rfind("`"):] if line.count("`") % 2 else ""
            spans = re.findall(r"`([^`]*)`", line)
        for span in spans:
            found = False
            for match in COMMAND.finditer(span):
                rest = re.sub(r"\$([A-Z]+)", lambda v: env.get(v.group(1), v.group(0)), match.group(2))
                words = rest.replace("[", " ").replace("]", " ").split()
                if code or words:
                    out.append((number, match.group(1), words, False))
                    found = True
            if found and FLAG.search(comment):
                out.append((number, out[-1][1], FLAG.findall(comment), True))
            words = span.split()
            # one flag alone is often another tool's (pdsr rollout's `--seed` in recurrence.py's section)
            if not code and section and span.startswith("--") and len(words) > 1:
                out.append((number, section, words, any(re.fullmatch(r"[A-Z]+", w) for w in words)))
    return out


def problems(doc_text: str, parsers: dict[str, argparse.ArgumentParser], capsys) -> list[str]:
    """One line per command that names a flag its script lacks or a value its parser refuses (a file the command
    names that is not here, e.g. a data set or a placeholder such as DIR, is not the doc's fault)."""
    found = []
    for number, script, words, names_only in bench_commands(doc_text):
        if script not in parsers:
            found.append(f"{number}: bench/{script}.py is no script")
            continue
        parser = parsers[script]
        gone = [f for f in FLAG.findall(" ".join(words)) if f not in parser._option_string_actions]
        if gone:
            found.append(f"{number}: bench/{script}.py has no {', '.join(gone)}")
            continue
        if names_only:
            continue
        try:
            parser.parse_args(words)
        except SystemExit:
            err = capsys.readouterr().err.strip().splitlines()[-1]
            if "no such file" not in err:
                found.append(f"{number}: bench/{script}.py {' '.join(words)}: {err}")
    return found


@pytest.fixture(scope="module")
def parsers():
    with pytest.MonkeyPatch.context() as monkeypatch:
        return {name: parser_of(name, monkeypatch) for name in SCRIPTS}


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_exits_0_and_describes_every_option(name, parsers, capsys):
    parser = parsers[name]
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["--help"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("usage:")
    bare = [a.option_strings[0] if a.option_strings else a.dest for a in parser._actions
            if not (a.help or "").strip()]
    assert not bare, f"bench/{name}.py: options without a help line: {', '.join(bare)}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_bench_command_a_doc_gives_parses(doc, parsers, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)   # the commands run from the repository's root (bench/data/... paths)
    found = problems(doc.read_text(), parsers, capsys)
    assert not found, f"{doc.name}:\n" + "\n".join(found)


def test_every_bench_command_a_help_gives_parses(parsers, capsys, monkeypatch):
    """The examples each script's --help gives (its docstring's indented lines) too."""
    monkeypatch.chdir(ROOT)
    found = [f"bench/{name}.py --help, line {line}" for name, parser in parsers.items()
             for line in problems(parser.description or "", parsers, capsys)]
    assert not found, "\n".join(found)


def test_the_command_check_finds_a_gone_flag_a_bad_value_and_a_gone_script(parsers, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    text = ("    .venv/bin/python bench/gae.py --quick --no-such-flag\n"
            "`bench/policies.py --batches 0`, `bench/multi_turn.py --groups 8 [--max-num-seqs 64]`, "
            "`bench/recurrence.py`\n    K=0\n"
            "    .venv/bin/python bench/rules.py --steps $K --per-seed   # --gone: a comment's flags are checked too\n"
            "`bench/" "gone.py --x`, and bench/partial.py --repeats x outside code\n"
            "    .venv/bin/python bench/partial.py \\\n        --repeats x\n"
            "## `bench/gae.py`: a section's script\n"
            "`--shapes 0x10` a smoke run, `--quick` alone maybe another tool's, `--threads N`, `bench/spec.py\n"
            "--no-such`, inline code run on to the next line\n"
            "    .venv/bin/python bench/gae.py   # --loop-repeats 2, or --nope\n")
    commands = bench_commands(text)
    assert [(n, s, only) for n, s, _, only in commands] == [
        (1, "gae", False), (2, "policies", False), (2, "multi_turn", False), (4, "rules", False), (4, "rules", True),
        (5, "gone", False), (6, "partial", False), (8, "gae", False), (8, "gae", True), (9, "spec", False),
        (10, "gae", False), (10, "gae", True)]
    assert commands[2][2] == ["--groups", "8", "--max-num-seqs", "64"] and commands[3][2] == ["--steps", "0",
                                                                                              "--per-seed"]
    assert commands[11][2] == ["--loop-repeats", "--nope"]
    found = problems(text, parsers, capsys)
    assert found == ["1: bench/gae.py has no --no-such-flag",
                     "2: bench/policies.py --batches 0: policies.py: error: argument --batches: 0 is below 1",
                     "4: bench/rules.py --steps 0 --per-seed: rules.py: error: argument --steps: 0 is below 1",
                     "4: bench/rules.py has no --gone",
                     "5: bench/" "gone.py is no script",
                     "6: bench/partial.py --repeats x: partial.py: error: argument --repeats: 'x' is not a whole "
                     "number",
                     "8: bench/gae.py --shapes 0x10: gae.py: error: argument --shapes: '0x10' is not BxT with B, T >= "
                     "1 (e.g. 64x32768)",
                     "9: bench/spec.py has no --no-such",
                     "10: bench/gae.py has no --nope"]
