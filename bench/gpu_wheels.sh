#!/usr/bin/env bash
# The wheels bench/gpu_check.sh installs on a lent GPU machine, which has Python 3.12 and a
# CUDA torch but no network: this project's dependencies for CPython 3.12 on x86-64 Linux,
# fetched here into .whl/ (ignored by git). Carry .whl with the run.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
PY="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
# this project's dependencies but torch (the machine has its CUDA build), the test runner and
# NVML's bindings, with what they need in turn, as binary wheels for that Python
"$PY" - > /tmp/gpu-reqs.txt <<'PY'
import tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
extra = ["pytest>=8", "pytest-asyncio>=0.23", "pytest-timeout>=2.3", "nvidia-ml-py>=12"]
print("\n".join(d for d in deps + extra if not d.startswith("torch")))
PY
"$PY" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl -r /tmp/gpu-reqs.txt
# what the machine's image already holds (/work/.library/device/KINDS.md, 2026-11): not carried,
# so that the wheels stay well under the 64 MiB a run may carry
for present in numpy matplotlib pillow fonttools kiwisolver contourpy cycler pyparsing \
    python_dateutil six packaging pygments setuptools pyyaml PyYAML pytest pluggy iniconfig \
    rich markdown_it_py mdurl httpx httpcore h11 anyio idna certifi sniffio typer click \
    shellingham prometheus_client fsspec nvidia_ml_py typing_extensions pytest_timeout; do
  rm -f .whl/"$present"-*.whl
done
du -sh .whl
