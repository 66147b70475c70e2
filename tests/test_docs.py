"""What the user docs (README.md, docs/*.md, examples/*.py; not docs/notes/, which is history) name exists, as named.

- A ``pdsr CMD ... --flag`` on one line of a doc (in a code block or inline code, continuation lines joined; not
  inside a shell's ``$(...)``, another program's command line) names an option of that command.
- Each ``pdsr ...`` example in a command's ``--help`` shows on one line of the rendered help (so it runs when
  copied), names no path above the working directory, and its flags are options of its command.
- A signature of a ``RolloutSession`` method in the SDK's pages, docs/sdk*.md (``step(prompts=(), *, n=None,
  ...)``), has the method's parameters with their defaults: all of them, unless it ends in ``...``.
- The tables of docs/configuration.md name every key of each rollout config section and of v3's settings, and
  each default they write beside a key is the config model's (the other commands' tables: tests/test_docs_tables.py).
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import PurePath

import pytest
import yaml

from support import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").glob("*.py"))]
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def cli_options() -> dict[str, set[str]]:
    """Every command's options: ``{"pdsr simulate": {"--trace", ...}, "pdsr trace synth": {...}, ...}``."""
    import click

    from pdsr_cli.main import cli

    out: dict[str, set[str]] = {}

    def walk(cmd, path):
        out[" ".join(path)] = {o for p in cmd.params if isinstance(p, click.Option) for o in p.opts + p.secondary_opts}
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(None):
                walk(cmd.get_command(None, name), [*path, name])

    walk(cli, ["pdsr"])
    return out


def unknown_flags(text: str, commands: dict[str, set[str]]) -> list[str]:
    """``pdsr CMD`` followed by flags an option of CMD does not name, one problem a line."""
    problems = []
    for number, line in enumerate(text.replace("\\\n", " ").splitlines(), 1):
        line = re.sub(r"\$\([^()]*\)", "", line)                 # $(python x.py --flag): not pdsr's flags
        for match in re.finditer(r"\bpdsr((?: [a-z][a-z0-9]*)+)([^`|\n]*)", line):
            words = match.group(1).split()
            for k in range(min(len(words), 2), 0, -1):   # the longest command the words name
                command = " ".join(["pdsr", *words[:k]])
                if command in commands:
                    break
            else:
                continue
            rest = " ".join(words[k:]) + match.group(2)
            rest = rest.split(" # ")[0]                       # a shell comment is prose
            problems += [f"{number}: {command} {flag}" for flag in FLAG.findall(rest) if flag not in commands[command]]
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_cli_flag_a_doc_names_exists(doc):
    problems = unknown_flags(doc.read_text(), cli_options())
    assert not problems, f"{doc.name}: flags no such option:\n" + "\n".join(problems)


def test_the_flag_check_finds_a_flag_that_is_gone():
    commands = cli_options()
    text = ("`pdsr simulate --trace t.jsonl --no-such-flag`\n"
            "pdsr trace synth --groups 8 \\\n    --gone\n"
            "pdsr simulate --steps 2   # then --anything in a comment\n"
            'pdsr rollout --system-prompt "$(python examples/agent_tools.py --system)" --no-such-flag\n')
    assert unknown_flags(text, commands) == ["1: pdsr simulate --no-such-flag", "2: pdsr trace synth --gone",
                                             "4: pdsr rollout --no-such-flag"]


# -- --help: the examples each command's help gives -----------------------------------------------------------

EXAMPLE = re.compile(r"^\s*(?:\w+:\s+)?(pdsr(?: [a-z][a-z0-9]*)+(?:\s[^\n]*)?)$", re.M)   # not prose: "pdsr x's"


def help_pages(root) -> dict[str, tuple[str, str]]:
    """``{"pdsr gae": (its docstring, its --help as rendered on an 80-column terminal)}`` for every command."""
    import click

    out = {}

    def walk(cmd, parent, name):
        ctx = click.Context(cmd, info_name=name, parent=parent, terminal_width=80, max_content_width=80)
        out[ctx.command_path] = (cmd.help or "", cmd.get_help(ctx))
        if isinstance(cmd, click.Group):
            for sub in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, sub), ctx, sub)

    walk(root, None, "pdsr")
    return out


def help_example_problems(docstring: str, rendered: str, commands: dict[str, set[str]]) -> list[str]:
    """A ``pdsr ...`` example line of the docstring that the rendered help wraps (copied, it no longer runs:
    put it in a ``\\b`` block), one that names a path above the working directory (a machine's layout), or a
    flag its command does not have."""
    shown = {" ".join(line.split()) for line in rendered.splitlines()}
    problems = []
    for example in EXAMPLE.findall(docstring):
        example = " ".join(example.split())
        if not any(line.endswith(example) for line in shown):
            problems.append(f"wrapped: {example}")
        if re.search(r"(?<![\w.])\.\./", example):
            problems.append(f"a path outside the working directory: {example}")
    problems += [f"no such flag: {p.split(': ', 1)[1]}" for p in unknown_flags(rendered, commands)]
    return problems


def test_every_help_example_renders_whole_and_names_real_flags():
    from pdsr_cli.main import cli

    commands = cli_options()
    pages = help_pages(cli)
    assert {"pdsr rollout", "pdsr gae", "pdsr trace synth", "pdsr simulate calibrate"} <= set(pages)
    problems = [f"{name}: {p}" for name, (doc, rendered) in pages.items()
                for p in help_example_problems(doc, rendered, commands)]
    assert not problems, "--help:\n" + "\n".join(problems)


def test_the_help_check_finds_a_wrapped_example_a_machine_path_and_a_gone_flag():
    import click

    commands = cli_options()
    example = "pdsr gae --data rollouts.parquet --out rollouts_gae.parquet --gamma 1.0 --lam 0.95"

    def problems(doc):
        cmd = click.Command("gae", help=doc)
        return help_example_problems(doc, cmd.get_help(click.Context(cmd, info_name="pdsr gae", terminal_width=80)),
                                     commands)

    assert problems(f"Add advantages.\n\nExample: {example}\n") == [f"wrapped: {example}"]
    assert problems(f"Add advantages.\n\n\b\nExample:\n  {example}\n") == []
    assert problems("Then:  pdsr gae --data ../shared/data/x.parquet --out y.parquet\n") == [
        "a path outside the working directory: pdsr gae --data ../shared/data/x.parquet --out y.parquet"]
    assert problems("\b\nExample:\n  pdsr gae --data x.parquet --gone\n") == ["no such flag: pdsr gae --gone"]


# -- docs/sdk*.md: RolloutSession's signatures ------------------------------------------------------------------

SIGNATURE = re.compile(r"`(?:await )?(?:s\.|session\.)?(RolloutSession|[a-z_]+)\(([^()`]*(?:\([^()`]*\)[^()`]*)*)\)"
                       r"(?: -> \w+)?`")


def documented_signatures(text: str) -> list[tuple[str, str]]:
    """``(name, params)`` of each inline-code signature of a RolloutSession method (or the class) with parameters."""
    from pdsr_sdk import RolloutSession

    out = []
    for name, params in SIGNATURE.findall(text):
        if name != "RolloutSession" and not callable(getattr(RolloutSession, name, None)):
            continue
        entries = [e.strip() for e in params.split(",")]
        if entries[0] in ("", "...") or not all(re.fullmatch(r"\w+(=.+)?|\*|\.\.\.", e) for e in entries):
            continue   # a call (``step(..., wait_for_update=True)``, ``pause("keep")``), not a signature
        out.append((name, params))
    return out


def signature_problems(name: str, params: str) -> list[str]:
    """Parameters (and their defaults) the doc's ``params`` gives otherwise than the code."""
    from pdsr_sdk import RolloutSession

    target = RolloutSession.__init__ if name == "RolloutSession" else getattr(RolloutSession, name)
    real = {p.name: p for p in inspect.signature(target).parameters.values() if p.name != "self"}
    partial = params.rstrip().endswith("...")
    documented = [p.strip() for p in params.split(",") if p.strip() not in ("", "*", "...")]
    problems = []
    seen = set()
    for entry in documented:
        pname, _, default = entry.partition("=")
        pname = pname.strip()
        seen.add(pname)
        if pname not in real:
            problems.append(f"{name}: no parameter {pname!r}")
        elif default and real[pname].default is not inspect.Parameter.empty:
            if ast.literal_eval(default.strip()) != real[pname].default:
                problems.append(f"{name}: {pname} defaults to {real[pname].default!r}, not {default.strip()}")
    if not partial and "*" in [p.strip() for p in params.split(",")]:   # a whole signature, not a call
        missing = [p for p in real if p not in seen]
        if missing:
            problems.append(f"{name}: the doc leaves out {', '.join(missing)} (end the list with ... if on purpose)")
    return problems


def test_rollout_session_signatures_in_docs_sdk_md_are_the_codes():
    pages = sorted((ROOT / "docs").glob("sdk*.md"))   # sdk.md and the pages split from it (weights, partial, ...)
    assert {"sdk.md", "sdk-weights.md"} <= {page.name for page in pages}
    for page in pages:
        found = documented_signatures(page.read_text())
        problems = [p for name, params in found for p in signature_problems(name, params)]
        assert not problems, f"docs/{page.name}:\n" + "\n".join(problems)
    found = documented_signatures((ROOT / "docs" / "sdk.md").read_text())
    assert {"RolloutSession", "step", "update_weights", "pause", "sleep"} <= {name for name, _ in found}
    found = documented_signatures((ROOT / "docs" / "sdk-weights.md").read_text())
    assert {"update_weights", "pause", "sleep"} <= {name for name, _ in found}


def test_the_signature_check_finds_a_parameter_left_out_or_misdefaulted():
    assert signature_problems("update_weights", "weights, *, version=None, bucket_bytes=None") == []
    assert signature_problems("update_weights", "weights, *, version=3, bucket_bytes=None") == [
        "update_weights: version defaults to None, not 3"]
    assert signature_problems("update_weights", "weights") == []          # no `*`: it need not be whole
    assert documented_signatures('`s.pause("keep")` `step(..., last=True)` `s.sleep(level=1)` `s.wake()`') == [
        ("sleep", "level=1")]
    assert signature_problems("step", "prompts=(), *, n=None") == [
        "step: the doc leaves out last, wait_for_update, agent (end the list with ... if on purpose)"]
    assert signature_problems("step", "prompts=(), *, n=None, ...") == []


# -- docs/configuration.md: defaults ----------------------------------------------------------------------------

def v3_table_defaults(text: str) -> dict[str, str]:
    """``{"migration.quantile": "0.9", ...}`` from the v3 settings table: each `` `key` (default) ``."""
    out = {}
    section = text[text.index("### v3's settings"):text.index("## Renamed keys")]
    for row in re.findall(r"^\| `(\w+)` \|[^|]*\|(.*)\|$", section, re.M):
        for key, default in re.findall(r"`(\w+)` \(([^)]*)\)", row[1]):
            out[f"{row[0]}.{key}"] = default
    return out


def test_v3_settings_defaults_in_docs_configuration_md_are_the_codes():
    from pdsr_sdk.policies.v3.settings import V3Settings

    table = v3_table_defaults((ROOT / "docs" / "configuration.md").read_text())
    assert len(table) >= 20
    settings = V3Settings().model_dump()
    # every key of every rule's section is in the table (with its default)
    problems = [f"{section}.{key}: not in the table" for section, keys in settings.items() if isinstance(keys, dict)
                for key in keys if f"{section}.{key}" not in table]
    for dotted, default in table.items():
        section, key = dotted.split(".")
        if key not in settings.get(section, {}):
            problems.append(f"{dotted}: no such setting")
            continue
        value = settings[section][key]
        written = None if default.split(":")[0] == "none" else default.strip("`")
        if written is None or isinstance(value, str):
            ok = value == written
        else:
            ok = float(written) == value
        if not ok:
            problems.append(f"{dotted}: the code's default is {value!r}, the table says {default}")
    assert not problems, "docs/configuration.md:\n" + "\n".join(problems)


def key_table(text: str) -> dict[str, str]:
    """The top-level key table of docs/configuration.md: ``{key: its row's text}``, each key of the first column."""
    section = text[text.index("The top-level keys"):]
    section = section[:section.index("\n\n", section.index("|"))]
    out = {}
    for first, what in re.findall(r"^\| ([^|]*) \| (.*) \|$", section, re.M):
        for key in re.findall(r"`(\w+)`", first):
            out[key] = what
    return out


def test_every_rollout_config_key_is_in_docs_configuration_md():
    from pdsr_sdk import RolloutConfig

    table = key_table((ROOT / "docs" / "configuration.md").read_text())
    assert sorted(set(RolloutConfig.model_fields) - set(table)) == []
    assert sorted(set(table) - set(RolloutConfig.model_fields)) == []
    # every key of each section (a sub-model: data, sampling, engines, ray, ...) is named in its row (a key added
    # to the model, agent.max_env_turns, output.flush_groups, was left out), and a default written beside one,
    # `key` (default), is the model's
    problems = []
    sections = {name: model for name, field in RolloutConfig.model_fields.items()
                if (model := config_model_in(field.annotation)) is not None}
    assert {"data", "sampling", "engines", "segments", "agent", "output", "ray", "filter_groups"} <= set(sections)
    for section, model in sections.items():
        problems += [f"{section}.{key}: not in the table"
                     for key in sorted(set(model.model_fields) - set(re.findall(r"`(\w+)`", table[section])))]
        for key, default in re.findall(r"`(\w+)` \((`?[\w./-]+`?)[,);:]", table[section]):   # `key` (default
            if key not in model.model_fields:
                problems.append(f"{section}.{key}: no such key")
                continue
            value = model.model_fields[key].get_default(call_default_factory=True)
            value = str(value) if isinstance(value, PurePath) else value
            written = None if default in ("none", "null") else yaml.safe_load(default.strip("`"))
            if written != value:
                problems.append(f"{section}.{key}: the code's default is {value!r}, the table says {default}")
    assert not problems, "docs/configuration.md:\n" + "\n".join(problems)


def config_model_in(annotation):
    """The pydantic model in a field's type (``X``, ``X | None``, ``list[X] | None``), or None."""
    if hasattr(annotation, "model_fields"):
        return annotation
    return next((m for a in getattr(annotation, "__args__", ()) if (m := config_model_in(a)) is not None), None)


# -- config examples ----------------------------------------------------------------------------------------------

def config_examples() -> list[tuple[str, str, str]]:
    """Every YAML block of the docs that starts ``# NAME.yaml - pdsr COMMAND --config NAME.yaml``:
    ``(page, command, text)``."""
    found = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), flags=re.S):
            head = re.match(r"# \S+\.yaml - pdsr (\w+) --config", block)
            if head:
                found.append((page.name, head.group(1), block))
    return found


def test_every_config_example_in_the_docs_is_valid(tmp_path):
    """Each documented config file validates as its command's config, with no warning (no old spelling)."""
    import warnings

    from pdsr_sdk.config import load_config
    from pdsr_sdk.rollout.config import RolloutConfig
    from pdsr_sdk.sim.config import SimulateConfig

    models = {"rollout": RolloutConfig, "simulate": SimulateConfig}
    examples = config_examples()
    assert {command for _, command, _ in examples} == set(models)
    for page, command, text in examples:
        path = tmp_path / "example.yaml"
        path.write_text(text)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            load_config(models[command], path)
