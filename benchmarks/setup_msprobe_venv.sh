#!/usr/bin/env bash
# Create (idempotently) a separate virtual environment holding msprobe 8.1.2
# (PyPI package "mindstudio-probe"), used only as a reference/baseline for rlprobe
# benchmarks. It is never a dependency of rlprobe itself.
#
#   bash benchmarks/setup_msprobe_venv.sh            # -> <repo>/.venv-msprobe
#   MSPROBE_VENV=/some/path bash benchmarks/setup_msprobe_venv.sh
#
# torch is pinned to 2.13.0: on this workplace's machines pip takes a CPU build of
# it from a local wheel directory. Never let pip resolve a bare/newer "torch": that
# pulls a multi-GB CUDA build. numpy<2 is what msprobe 8.1.2 expects.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MSPROBE_VENV:-$REPO_ROOT/.venv-msprobe}"
PYTHON="${PYTHON:-python3}"
PY="$VENV/bin/python"

check() {
    "$PY" - <<'PY' 2>/dev/null
import importlib.metadata as md
assert md.version("mindstudio-probe") == "8.1.2", md.version("mindstudio-probe")
import torch
assert torch.__version__.split("+")[0] == "2.13.0", torch.__version__
from msprobe.core import SingleSave, SingleComparator  # noqa: F401
from msprobe.core.grad_probe.grad_compare import GradComparator  # noqa: F401
PY
}

if [ -x "$PY" ] && check; then
    echo "msprobe venv already OK: $VENV"
    exit 0
fi

if [ ! -x "$PY" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/pip" install --quiet torch==2.13.0 'numpy<2' mindstudio-probe==8.1.2

if ! check; then
    echo "msprobe venv at $VENV failed its import check" >&2
    "$PY" -c "from msprobe.core import SingleSave, SingleComparator" || true
    exit 1
fi
echo "msprobe venv ready: $VENV ($("$PY" -c 'import torch; print("torch", torch.__version__)'))"
