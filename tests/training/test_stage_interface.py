"""One interface for every stage (train/stages.py): outside the one place that picks the stage
from --stage and --data (stages.load, stages.stage_class), no code in train/ asks which stage runs;
config.py checks a stage's flags by asking the stage."""
import re
from pathlib import Path

import pytest

TRAIN = Path(__file__).resolve().parents[2] / "train"
PICKS = {"stages.py"}                 # stages.load and stages.stage_class pick the stage

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


def test_each_stage_declares_its_flags():
    from train import stages
    from train.config import build_parser
    flags = {a.dest for a in build_parser()._actions}
    for name, stage in stages.named_stages().items():
        assert stage.name == name and stage.own_flags and set(stage.own_flags) <= flags
    for stage in (stages.LanguageModel, *stages.named_stages().values()):
        assert callable(stage.check_flags) and isinstance(stage.takes_val, bool)
        assert isinstance(stage.resume_needs_data, bool)


def test_config_checks_a_stages_flags_by_asking_the_stage(monkeypatch, capsys):
    """A stage's check_flags decides what its command needs, and its own flags are refused without
    it: config.py knows no stage by name."""
    from train import stages
    from train.config import parse_args
    from train.rl import RL

    class Picky(RL):
        name, own_flags = "picky", ("dpo_nll",)

        @classmethod
        def check_flags(cls, args):
            if args.learning_rate == 0.5:
                return []
            return [f"--stage picky: --learning_rate {args.learning_rate} is not 0.5"]
    monkeypatch.setattr(stages, "named_stages", lambda: {"picky": Picky})
    for argv, expected in ((["--stage", "picky", "--data", "x.txt"], "--stage picky: --learning_rate 0.001 is not 0.5"),
                           (["--data", "x.txt", "--dpo_nll", "1"], "--dpo_nll is a setting of --stage picky"),
                           (["--stage", "rl"], "expected picky, got 'rl'")):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert expected in capsys.readouterr().err
    args, _ = parse_args(["--stage", "picky", "--data", "x.txt", "--learning_rate", "0.5"])
    assert args.stage == "picky" and args.learning_rate == 0.5
