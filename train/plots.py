"""matplotlib for the training program and the experiments: drawn to files only."""

NOT_INSTALLED = "matplotlib is not installed (pip install -e \".[viz]\")"


def pyplot():
    """matplotlib.pyplot with the file-only Agg backend, or None when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt
