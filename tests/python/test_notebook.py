"""docs/examples/quickstart.ipynb runs top to bottom in a fresh Jupyter kernel without errors and prints
what it promises (errors against the reference, the scheme table, the plot, bit-identical reload).

Needs nbclient, nbformat, ipykernel and matplotlib (pyproject [test]). ipykernel provides the
"python3" kernel spec; if it is not registered, it is installed for this interpreter (--user).
"""
import pathlib
import subprocess
import sys

import jupyter_client.kernelspec
import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow   # subprocesses / torch / mpirun: native level only, not in `test.sh quick`

NOTEBOOK = pathlib.Path(__file__).resolve().parents[2] / "docs" / "examples" / "quickstart.ipynb"


def ensure_python3_kernel():
    if "python3" not in jupyter_client.kernelspec.find_kernel_specs():
        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--user", "--name", "python3"],
                       check=True, capture_output=True, timeout=120)


def cell_text(cell):
    """All text a code cell printed or returned."""
    parts = []
    for o in cell.get("outputs", []):
        if o.output_type == "stream":
            parts.append(o.text)
        elif o.output_type in ("execute_result", "display_data"):
            parts.append(o.get("data", {}).get("text/plain", ""))
    return "".join(parts)


def test_committed_notebook_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, "clear the notebook's outputs before committing"


def test_quickstart_notebook_runs(tmp_path):
    ensure_python3_kernel()
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # raises CellExecutionError (with the cell's traceback) if any cell fails
    NotebookClient(nb, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(tmp_path)}}).execute()

    code = [c for c in nb.cells if c.cell_type == "code"]
    for c in code:
        for o in c.outputs:
            assert o.output_type != "error", f"{o.get('ename')}: {o.get('evalue')}"
    text = "\n".join(cell_text(c) for c in code)

    for needle in ("MoELayer(E=8, H=256, I=128, top_k=2, activation=silu)",
                   "int4_w4a8 (group 32, activations per token)",
                   "int8_w8a8 (group 32, activation blocks of 32)",   # GGUF Q8_0: ggml's Q8_0 activation blocks
                   "safetensors int4_w4a8 layer: relative L2 error vs layer.reference(x) = ",
                   "GGUF Q8_0 int8_w8a8 layer: relative L2 error vs layer.reference(x) = ",
                   "identical to MoELayer.from_float(int4_w4a8, group 32): True",
                   "memory-mapped layer output bit-identical to the loaded layer: True"):
        assert needle in text, f"notebook output lacks {needle!r}"
    for scheme in ("int4_w4a8 g32", "int8_w8a8", "fp8_w8a16", "bf16"):
        assert any(line.startswith(scheme + " ") for line in text.splitlines()), f"no table row for {scheme}"
    # the reported errors are small, and ordered as the schemes' precision says
    errs = {}
    for line in text.splitlines():
        if "relative L2 error vs layer.reference(x) = " in line:
            assert float(line.rsplit("= ", 1)[1]) < 0.05, line
        for scheme in ("int4_w4a8 g32", "int8_w8a8", "fp8_w8a16", "bf16"):
            if line.startswith(scheme + " "):
                errs[scheme] = float(line.split()[-3])
    assert errs["bf16"] < errs["int8_w8a8"] < errs["int4_w4a8 g32"] < 0.3, errs
    assert errs["bf16"] < errs["fp8_w8a16"] < errs["int4_w4a8 g32"], errs
    # the bar chart was rendered inline
    assert any("image/png" in o.get("data", {}) for c in code for o in c.outputs), "no plot in the outputs"
    # everything was written to the notebook's own temporary directory, which it removed
    assert not any(tmp_path.iterdir()), f"notebook wrote into its working directory: {list(tmp_path.iterdir())}"
