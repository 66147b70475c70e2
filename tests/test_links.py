"""Every link and every repository path the docs, code and tests mention resolves.

The rules, kept simple on purpose:

"Tracked" means what ``git ls-files`` lists, plus new files git does not ignore.

1. Markdown links. In every tracked ``*.md`` file, outside code (fenced blocks and inline), each
   ``[text](target)`` whose target is not a URL (``scheme:``) is resolved against the file's own folder
   and must name a tracked file or folder. A ``#anchor`` (alone: this file; or after a ``.md`` path) must
   be the slug of an ATX heading (``# ...``) of that file, by GitHub's rules: the heading's text with
   links reduced to their text, lower-cased, every character that is not a letter, digit, space, ``-``
   or ``_`` dropped, spaces made ``-``; a repeated slug gets ``-1``, ``-2``, ...
2. Repository paths. In every tracked text file (not data such as ``*.jsonl`` or ``*.parquet``), each mention
   that starts at a word boundary with ``docs/``, ``tests/``, ``bench/``, ``examples/``, ``policies/``,
   ``schemas/``, ``scripts/`` or ``pdsr_sdk/`` and ends in a file name of the kind each folder holds
   (``docs/<page>.md``, ``tests/<...>.py``, ``bench/<...>.py``, ``bench/data/<...>`` and ``examples/<...>`` (any file
   or folder), ``policies/<name>.yaml``, ``schemas/<name>.json``, ``scripts/<name>.sh``, ``pdsr_sdk/<...>.py``,
   ``pdsr_cli/<...>.py``)
   must exist from the repository's root. A mention with a placeholder (``<``, ``{``) is skipped; one
   with ``*`` is a glob and must match something. A path that ``pdsr_sdk/`` or another folder name
   merely ends (``my_pkg/tests/x.py``) is not a mention: the character before it must not be a letter,
   digit, ``_``, ``.``, ``/`` or ``-``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from support import ROOT

LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^()\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
PATH = re.compile(
    r"(?<![\w./-])("
    r"docs/[\w./<>{}*-]*?\.md"
    r"|tests/[\w./<>{}*-]*?\.py"
    r"|bench/data/[\w./<>{}*-]*[\w*>}]"
    r"|bench/[\w./<>{}*-]*?\.py"
    r"|examples/[\w./<>{}*-]*[\w/*>}]"
    r"|policies/[\w.<>{}*-]*?\.yaml"
    r"|schemas/[\w.<>{}*-]*?\.json"
    r"|scripts/[\w.<>{}*-]*?\.sh"
    r"|pdsr_sdk/[\w./<>{}*-]*?\.py"
    r"|pdsr_cli/[\w./<>{}*-]*?\.py"
    r")(?![\w/-])"
)
DATA_SUFFIXES = {".jsonl", ".parquet", ".png", ".jpg", ".gz", ".arrow"}


def tracked(root: Path) -> list[Path]:
    """The repository's files: tracked, and new ones git does not ignore (so a page counts before `git add`)."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, text=True, check=True)
    return sorted({root / name for name in out.stdout.split("\0") if name})


def slug(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """The lines of a markdown file outside fenced code blocks, numbered from 1."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(path.read_text()):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def broken_links(root: Path, files: list[Path]) -> list[str]:
    names = {p.relative_to(root).as_posix() for p in files}
    folders = {Path(n).parent.as_posix() for n in names} | {
        parent.as_posix() for n in names for parent in Path(n).parents}
    problems = []
    for md in (p for p in files if p.suffix == ".md" and p.exists()):
        for number, line in prose_lines(md.read_text()):
            line = re.sub(r"`[^`]*`", "", line)               # inline code is not a link
            for match in (*LINK.finditer(line), *IMAGE.finditer(line)):
                target = match.group(1)
                if re.match(r"^[a-zA-Z][\w+.-]*:", target):   # http:, https:, mailto: ...
                    continue
                where = f"{md.relative_to(root)}:{number}: {target}"
                path_part, _, anchor = target.partition("#")
                dest = (md.parent / path_part).resolve() if path_part else md.resolve()
                try:
                    rel = dest.relative_to(root.resolve()).as_posix()
                except ValueError:
                    problems.append(f"{where} (outside the repository)")
                    continue
                if rel not in names and rel.rstrip("/") not in folders:
                    problems.append(f"{where} (no such file)")
                    continue
                if anchor and (not rel.endswith(".md") or anchor not in anchors(dest)):
                    problems.append(f"{where} (no heading with that anchor)")
    return problems


def broken_paths(root: Path, files: list[Path]) -> list[str]:
    problems = []
    for path in files:
        if path.suffix in DATA_SUFFIXES or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for match in PATH.finditer(line):
                mention = match.group(1).rstrip("/.")
                if "<" in mention or "{" in mention:
                    continue
                found = any(root.glob(mention)) if "*" in mention else (root / mention).exists()
                if not found:
                    problems.append(f"{path.relative_to(root)}:{number}: {mention}")
    return problems


def test_every_markdown_link_resolves():
    problems = broken_links(ROOT, tracked(ROOT))
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_every_repository_path_mentioned_exists():
    problems = broken_paths(ROOT, tracked(ROOT))
    assert not problems, "paths that do not exist:\n" + "\n".join(problems)


def test_the_checks_find_what_is_broken(tmp_path):
    """The rules fail on a missing file, a missing anchor and a moved test, and pass what resolves."""
    (tmp_path / "guide").mkdir()
    (tmp_path / "tests" / "gae").mkdir(parents=True)
    (tmp_path / "tests" / "gae" / "test_gae.py").write_text("")
    (tmp_path / "guide" / "page.md").write_text("# A page\n\n## Two `words`, here\n")
    gone, moved, data = "docs/" + "gone.md", "tests/" + "test_gae.py", "bench/data/" + "gone.jsonl"
    (tmp_path / "README.md").write_text(
        "# Read me\n[ok](guide/page.md) [ok](guide/page.md#two-words-here) [bad](guide/page.md#nowhere)\n"
        "[ok](#read-me) [ok](guide/)\n"
        f"[bad]({gone}) see `{moved}` and `tests/gae/test_gae.py`, `docs/<name>.md`, `tests/*/test_*.py`, {data}\n"
        "```\n[in code](nowhere.md)\n```\n")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    files = tracked(tmp_path)
    links = broken_links(tmp_path, files)
    assert [line.split(": ", 1)[1] for line in links] == [
        "guide/page.md#nowhere (no heading with that anchor)", f"{gone} (no such file)"]
    assert [line.split(": ", 1)[1] for line in broken_paths(tmp_path, files)] == [gone, moved, data]
