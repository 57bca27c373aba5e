"""docs/tour.ipynb runs from top to bottom, and is kept in git without outputs."""
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "docs" / "tour.ipynb"


def test_the_notebook_is_stored_without_outputs():
    nbformat = pytest.importorskip("nbformat", reason="pip install -e '.[test]'")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert len(nb.cells) >= 15 and code
    assert all(not c.outputs and c.execution_count is None for c in code), "clear the outputs before committing"


def test_the_notebook_runs():
    nbformat = pytest.importorskip("nbformat", reason="pip install -e '.[test]'")
    nbclient = pytest.importorskip("nbclient", reason="pip install -e '.[test]'")
    pytest.importorskip("ipykernel", reason="pip install -e '.[test]' (a Python kernel runs the notebook)")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "gradcheck: True  gradgradcheck: True" in text
    assert "detect_anomaly: Log forward" in text
    assert "Linear" in text and "perplexity" in text            # the profile table
    assert "because it was too tired . it = animal <eos>" in text   # the trained model resolves "it"
    assert "because it was too wide . it = street <eos>" in text
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 4            # the neuron, the head, the GPT's graph, the heatmaps
