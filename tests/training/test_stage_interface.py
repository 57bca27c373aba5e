"""One interface for every stage (train/stages.py): outside the one place that picks the stage
from --stage and --data (stages.load; config.py checks the flags of each), no code in train/
asks which stage runs."""
import re
from pathlib import Path

import pytest

TRAIN = Path(__file__).resolve().parents[2] / "train"
PICKS = {"stages.py", "config.py"}      # stages.load picks the stage; config.py checks each stage's flags

ASKING = [
    (r"\bargs\.stage\b", "reads --stage"),
    (r"\b(hasattr|getattr)\(\s*(self\.)?(dataset|data|stage)\b", "asks the data (or the stage) what it has"),
    (r"\b(hasattr|getattr)\(\s*args\s*,\s*[\"'](stage|rl_|dpo_|mix_)", "asks the flags which stage runs"),
    (r"\b(dataset|data)\.name\s*[!=]=", "tells the stages apart by the data's name"),
    (r"[\"']\w*(accuracy|_dpo_loss|_drift)[\"']\s+(not\s+)?in\b", "tells the stages apart by a metric's name"),
    (r"\bisinstance\([^)]*(Dataset|Questions|RL|DPO|SFT|Lesson|LanguageModel)\b", "tells the stages apart by type"),
]


def offending_lines():
    found = []
    for path in sorted(TRAIN.glob("*.py")):            # the training program (not experiments/, its users)
        if path.name in PICKS:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            for pattern, what in ASKING:
                if re.search(pattern, code):
                    found.append(f"{path.relative_to(TRAIN.parent)}:{number}: {what}: {line.strip()}")
    return found


def test_no_code_in_train_asks_which_stage_runs():
    assert offending_lines() == []


@pytest.mark.parametrize("line", [
    'if args.stage == "dpo":', 'self.loss_fn = getattr(dataset, "loss_fn", lm_loss)', 'if hasattr(self.dataset, "evaluate"):',
    'if dataset.name == "coref":', 'if "sampled_accuracy" in summary:', 'if "heldout_accuracy" in summary:',
])
def test_the_check_finds_what_it_looks_for(line):
    assert any(re.search(pattern, line) for pattern, _ in ASKING)


def test_every_stage_gives_the_loop_the_same_methods():
    from train import stages
    from train.dpo import DPO
    from train.rl import RL
    asked = ("prepare", "rows_per_item", "tokens_per_row", "describe", "get_batch", "loss", "step_metrics", "stalled",
             "progress", "evaluate", "score", "diverged", "eval_line", "best_words", "sample_ids", "summary",
             "report", "done_line")
    for stage in (stages.LanguageModel, stages.Lesson, stages.SFT, DPO, RL):
        assert all(callable(getattr(stage, name, None)) for name in asked), stage
