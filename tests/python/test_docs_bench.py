"""docs/bench/ holds only the logs the docs cite, one folder per host (docs/bench/README.md): every
`docs/bench/<path>` named in the repo's docs, scripts and sources exists, every file under docs/bench/ is named
somewhere outside docs/bench/ (a host folder's README.md and lscpu.txt excepted), and every host folder says what
host it is. Pure file reads."""
import os
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "docs" / "bench"
THIS = pathlib.Path(__file__).resolve()
# Folders never scanned: build trees, VCS, bench outputs, caches, virtual environments.
SKIP_DIRS = {".git", "node_modules", "__pycache__", ".pytest_cache", ".hypothesis", "bench_out", "amx_out"}
SKIP_PATHS = {ROOT / "bench" / "out", BENCH}
CODE_SUFFIXES = {".py", ".sh", ".cpp", ".cc", ".h", ".hpp", ".cmake", ".def", ".toml"}
CITE = re.compile(r"docs/bench/([A-Za-z0-9_./-]+)")
EXEMPT = {"README.md", "lscpu.txt"}   # in each host folder, and docs/bench/README.md


def skipped_dir(d: pathlib.Path) -> bool:
    n = d.name
    return (n in SKIP_DIRS or n == "build" or n.startswith("build-") or n.endswith(".egg-info")
            or n.startswith(".venv") or d in SKIP_PATHS)


def scanned_files():
    """Every *.md in the repo, and code / scripts (comments, docstrings, defaults) that may name a log."""
    for dirpath, dirnames, filenames in os.walk(ROOT):
        d = pathlib.Path(dirpath)
        dirnames[:] = sorted(n for n in dirnames if not skipped_dir(d / n))
        top = d.relative_to(ROOT).parts[:1]
        for n in sorted(filenames):
            p = d / n
            if p.resolve() == THIS:
                continue
            if (p.suffix == ".md" or n == "CMakeLists.txt" or top in {("scripts",), ("cpp",)}
                    or (p.suffix in CODE_SUFFIXES and top in {("bench",), ("moe_cpu",), ("tests",), ("bindings",),
                                                              ("cmake",)})):
                yield p


def citations():
    """{cited path relative to docs/bench: [files naming it]}"""
    cited = {}
    for p in scanned_files():
        try:
            text = p.read_text(errors="replace")
        except OSError:
            continue
        for m in CITE.finditer(text):
            rel = m.group(1).rstrip(".,;:)`'\"").rstrip("/")
            if rel:
                cited.setdefault(rel, []).append(str(p.relative_to(ROOT)))
    return cited


def bench_files():
    return sorted(str(p.relative_to(BENCH)) for p in BENCH.rglob("*") if p.is_file())


def host_folders():
    return sorted(p for p in BENCH.iterdir() if p.is_dir())


def test_citation_scan_finds_known_citations():
    """Not vacuous: the scan reads docs/performance.md and sees the logs it names."""
    perf = ROOT / "docs" / "performance.md"
    assert perf in set(scanned_files())
    found = {m.group(1).rstrip(".,;:)`'\"") for m in CITE.finditer(perf.read_text())}
    assert len(found) >= 10, found
    from_perf = {rel for rel, who in citations().items() if "docs/performance.md" in who}
    assert from_perf >= found and any(rel.endswith(".log") for rel in from_perf)


def test_every_cited_path_exists():
    missing = {rel: who for rel, who in citations().items() if not (BENCH / rel).exists()}
    assert not missing, f"cited under docs/bench/ but absent: {missing}"


def test_every_log_is_cited():
    cited = set(citations())
    exempt = {"README.md"} | {f"{d.name}/{n}" for d in host_folders() for n in EXEMPT}
    uncited = [f for f in bench_files() if f not in exempt and f not in cited]
    assert not uncited, (f"under docs/bench/ but cited by no doc or script outside it (cite it by its full path, "
                         f"or remove it): {uncited}")


def test_host_folders_describe_their_host():
    folders = host_folders()
    assert folders
    for d in folders:
        readme = d / "README.md"
        assert readme.is_file(), f"{d.relative_to(ROOT)}: no README.md"
        text = readme.read_text()
        first = text.splitlines()[0] if text else ""
        assert first.strip(), f"{readme.relative_to(ROOT)}: the first line names the host"
        if "lscpu: not captured" not in text:
            assert (d / "lscpu.txt").is_file(), f"{d.relative_to(ROOT)}: no lscpu.txt and no 'lscpu: not captured'"


def test_no_loose_files():
    loose = sorted(p.name for p in BENCH.iterdir() if p.is_file() and p.name != "README.md")
    assert not loose, f"files directly in docs/bench/ (each goes into its host's folder): {loose}"
    assert (BENCH / "README.md").is_file()
