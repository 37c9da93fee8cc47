"""The one package: the repository's folders become ``unicron``'s subpackages through the build
(``package-dir`` in pyproject.toml), with no link in the tree, and the wheel holds ``unicron``
alone — no test double, no top-level ``shared`` or ``services`` in a user's environment."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _package_dirs() -> dict[str, Path]:
    """Every package the mapped folders hold, by its dotted name under ``unicron``."""
    found: dict[str, Path] = {}
    for name, folder in SETUPTOOLS["package-dir"].items():
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            rest = init.parent.relative_to(ROOT / folder).parts
            found[".".join((name, *rest))] = init.parent
    return found


def test_the_tree_holds_no_symbolic_link() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.strip()}")
    links = [
        line.split("\t")[-1] for line in listed.stdout.splitlines() if line.startswith("120000")
    ]
    assert links == [], f"committed symbolic links: {links}"


def test_every_package_folder_is_listed_and_every_listed_package_exists() -> None:
    on_disk = set(_package_dirs())
    listed = set(SETUPTOOLS["packages"])
    assert on_disk - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert listed - on_disk == set(), "these are listed in pyproject.toml but have no __init__.py"


def test_the_dockerfile_copies_every_mapped_folder() -> None:
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    copies = re.findall(r"^COPY\s+(\S+)\s+(\S+)\s*$", dockerfile, re.MULTILINE)
    copied = {src.rstrip("/") for src, dest in copies if dest.rstrip("/") in (src, f"./{src}")}
    for name, folder in SETUPTOOLS["package-dir"].items():
        assert folder in copied, f"deploy/Dockerfile does not COPY {folder}/ ({name})"


def test_the_wheel_holds_only_the_unicron_package(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("unicron-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert {t for t in tops if not t.startswith("unicron-")} == {"unicron"}
    assert "unicron/shared/bus/bus.py" in names and "unicron/trainer/run.py" in names
    assert not [n for n in names if "memorybus" in n or "/tests/" in n], "a test double shipped"
    packages = {str(Path(n).parent).replace("/", ".") for n in names if n.endswith("__init__.py")}
    assert packages == set(_package_dirs())
