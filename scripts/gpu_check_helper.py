"""The Python half of scripts/gpu_check.sh (standard library only: it runs before anything is installed).

    python scripts/gpu_check_helper.py install WHEELS SITE OUT/install.json
        install the pins of scripts/gpu_wheels.txt that the interpreter lacks (missing, or older than the pin)
        from the wheel folder WHEELS into SITE (pip --no-index --target; without pip, the wheels are unpacked)
    python scripts/gpu_check_helper.py pytest-json LOG JUNIT OUT/tests.json RC SECONDS
        the CUDA tests' outcomes as JSON: from the junit XML when pytest finished, else from its -v log
        (a run cut off by its timeout still reports the tests it got through)
    python scripts/gpu_check_helper.py part OUT/summary.json NAME RC SECONDS TIMEOUT JSON_FILE
        record one part's exit status and time in the summary (rewritten after each part)
    python scripts/gpu_check_helper.py summary OUT/summary.json
        print the summary, a line per part
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def write_json(path: str | Path, data) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def pins() -> list[tuple[str, str]]:
    out = []
    for line in (ROOT / "scripts" / "gpu_wheels.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            out.append((name.strip(), version.strip()))
    return out


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0])[:4])


def wheel_for(wheels: Path, name: str, version: str) -> Path | None:
    stem = re.sub(r"[-_.]+", "_", name).lower()
    for path in sorted(wheels.glob("*.whl")):
        dist, ver = path.name.split("-")[:2]
        if re.sub(r"[-_.]+", "_", dist).lower() == stem and ver == version:
            return path
    return None


def install(wheels: str, site: str, report: str) -> int:
    wheels_dir, site_dir = Path(wheels), Path(site)
    # what the interpreter has without SITE: PYTHONPATH may already name SITE (then its contents would count)
    site_abs = str(site_dir.resolve())
    paths = [p for p in sys.path if p and Path(p).resolve().as_posix() != Path(site_abs).as_posix()]
    have = {}
    for dist in md.distributions(path=paths):
        name = re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower()
        have.setdefault(name, dist.version)
    data = {"python": sys.version.split()[0], "executable": sys.executable, "wheels": wheels, "site": site,
            "present": {}, "installed": [], "missing_wheels": [], "method": None, "ok": False}
    if sys.version_info[:2] != (3, 12):
        data["warning"] = (f"the wheels are built for CPython 3.12; this is {data['python']} (pydantic-core, pyyaml "
                           f"and hypothesis will not load if installed)")
    need = []
    for name, version in pins():
        key = re.sub(r"[-_.]+", "-", name).lower()
        current = have.get(key)
        if current is not None and version_key(current) >= version_key(version):
            data["present"][name] = current
            continue
        wheel = wheel_for(wheels_dir, name, version)
        if wheel is None:
            data["missing_wheels"].append(f"{name}=={version}")
        else:
            need.append((name, version, wheel, current))
    if need:
        site_dir.mkdir(parents=True, exist_ok=True)
        pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True)
        if pip.returncode == 0:
            data["method"] = "pip install --no-index --no-deps --target"
            cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--upgrade",
                   "--disable-pip-version-check", "--find-links", str(wheels_dir), "--target", str(site_dir)]
            res = subprocess.run(cmd + [f"{n}=={v}" for n, v, _, _ in need], capture_output=True, text=True)
            data["pip_rc"] = res.returncode
            if res.returncode != 0:
                data["pip_stderr"] = res.stderr[-3000:]
        if pip.returncode != 0 or data.get("pip_rc"):
            data["method"] = "unpacked (zipfile): pip " + ("failed" if pip.returncode == 0 else "is not installed")
            for _, _, wheel, _ in need:
                with zipfile.ZipFile(wheel) as zf:
                    zf.extractall(site_dir)
        data["installed"] = [{"name": n, "version": v, "was": cur} for n, v, _, cur in need]
    # does what the tests need import now (a fresh interpreter, SITE first on the path as gpu_check.sh puts it)?
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([site_abs, str(ROOT), os.environ.get("PYTHONPATH", "")]))
    probe = "import pydantic, click, yaml, tqdm, pytest, hypothesis, pdsr_sdk.scoring, pdsr_sdk.gae; print('ok')"
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    data["ok"] = res.returncode == 0
    if not data["ok"]:
        data["import_error"] = res.stderr[-3000:]
    write_json(report, data)
    print(f"install: python {data['python']}; present {len(data['present'])}, installed {len(data['installed'])} "
          f"({data['method'] or 'nothing to install'}), missing wheels {data['missing_wheels'] or 'none'}; "
          f"imports {'ok' if data['ok'] else 'FAIL: ' + res.stderr.strip().splitlines()[-1] if res.stderr else 'FAIL'}")
    if data.get("warning"):
        print(f"install: warning: {data['warning']}")
    return 0 if data["ok"] else 1


OUTCOME = re.compile(r"^(?P<id>\S+::\S.*?) (?P<outcome>PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
SUMMARY = re.compile(r"^(?P<outcome>FAILED|ERROR|SKIPPED|XFAIL|XPASS) (?P<rest>.*)$")


def pytest_json(log: str, junit: str, report: str, rc: str, seconds: str) -> int:
    text = Path(log).read_text(errors="replace") if Path(log).exists() else ""
    tests: dict[str, dict] = {}
    source = "-v log"
    if Path(junit).exists() and Path(junit).stat().st_size:
        import xml.etree.ElementTree as ET

        try:
            root = ET.parse(junit).getroot()
            source = "junit xml"
            for case in root.iter("testcase"):
                cls, name = case.get("classname", ""), case.get("name", "")
                outcome, message = "passed", None
                for tag in ("failure", "error", "skipped"):
                    el = case.find(tag)
                    if el is not None:
                        outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                        message = (el.get("message") or "")[:2000]
                        if tag != "skipped" and el.text:
                            message = f"{message}\n{el.text[-4000:]}"
                        break
                test_id = f"{cls.replace('.', '/')}.py::{name}" if cls else name
                tests[test_id] = {"outcome": outcome, "time_s": float(case.get("time", 0) or 0), "message": message}
        except ET.ParseError:
            source, tests = "-v log (junit xml unreadable)", {}
    if not tests:
        for line in text.splitlines():
            m = OUTCOME.match(line.strip())
            if m:
                tests[m["id"]] = {"outcome": m["outcome"].lower(), "message": None}
        for line in text.splitlines():     # the -rA summary's reasons, when pytest got that far
            m = SUMMARY.match(line.strip())
            if m:
                test_id, _, reason = m["rest"].partition(" - ")
                if test_id in tests:
                    tests[test_id]["message"] = reason[:2000]
    counts: dict[str, int] = {}
    for t in tests.values():
        counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
    collection_errors = [line.strip() for line in text.splitlines() if line.startswith("ERROR ") and "::" not in line]
    tail = re.findall(r"^=+ (.*(?:passed|failed|skipped|error|deselected|no tests ran).*) =+$", text, re.M)
    data = {"part": "tests", "selection": "pytest -m cuda", "rc": int(rc), "seconds": float(seconds),
            "timed_out": int(rc) in (124, 137), "complete": int(rc) not in (124, 137), "source": source,
            "counts": counts,
            "pytest_summary": tail[-1] if tail else None, "collection_errors": collection_errors,
            "failed": {k: v for k, v in tests.items() if v["outcome"] in ("failed", "error")},
            "tests": {k: v["outcome"] for k, v in tests.items()}}
    write_json(report, data)
    print(f"tests: {counts or 'none reported'}{'; TIMED OUT' if data['timed_out'] else ''}"
          f"{f'; {len(collection_errors)} collection errors' if collection_errors else ''} ({source})")
    return 0


def part(summary: str, name: str, rc: str, seconds: str, timeout: str, json_file: str) -> int:
    data = json.loads(Path(summary).read_text()) if Path(summary).exists() else {"parts": {}}
    entry = {"rc": int(rc), "seconds": float(seconds), "timeout_s": float(timeout),
             "timed_out": int(rc) in (124, 137), "json": json_file if Path(json_file).exists() else None}
    if entry["json"]:
        try:
            got = json.loads(Path(json_file).read_text())
            entry["complete"] = got.get("complete")
            entry["skipped"] = got.get("skipped")
        except (ValueError, AttributeError):
            entry["json_unreadable"] = True
    data["parts"][name] = entry
    write_json(summary, data)
    return 0


def summary(path: str) -> int:
    if not Path(path).exists():
        print("  (no part ran)")
        return 0
    for name, e in json.loads(Path(path).read_text())["parts"].items():
        print(f"  {name:<7} rc {e['rc']:>3}  {e['seconds']:>5.0f}s of {e['timeout_s']:.0f}s"
              f"{'  TIMED OUT' if e['timed_out'] else ''}"
              f"{'  skipped: ' + str(e['skipped']) if e.get('skipped') else ''}"
              f"{'  (no JSON)' if not e.get('json') else ''}")
    return 0


def main(argv: list[str]) -> int:
    commands = {"install": (install, 3), "pytest-json": (pytest_json, 5), "part": (part, 6), "summary": (summary, 1)}
    if not argv or argv[0] not in commands or len(argv) - 1 != commands[argv[0]][1]:
        print(__doc__, file=sys.stderr)
        return 2
    fn, _ = commands[argv[0]]
    return fn(*argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
