"""python -m exercises: your progress through EXERCISES.md.

    python -m exercises                 one row per exercise: not started, failing (and why) or passing
    python -m exercises softmax adamw   those exercises, check by check, with the full messages
    python -m exercises --solutions     the same checks on the reference solutions (tests/support/exercise_solutions/)
"""
import argparse
import sys

from .checking.common import SOLUTIONS, load_solutions
from .checking.progress import BY_NAME, check_all

WIDTH = 150     # a table row's reason is cut here; name the exercise to read it whole


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def row_status(result):
    if result.status != "failing":
        return result.status
    return "failing: " + result.reason.splitlines()[0]


def table(results, folder):
    width = max(len(r.exercise.title) for r in results)
    lines = []
    for r in results:
        e = r.exercise
        line = f"{e.number:>2}  {e.title:<{width}}  {folder}/{e.name + '.py':<18}  {row_status(r)}"
        lines.append(line if len(line) <= WIDTH else line[:WIDTH - 3] + "...")
    return lines


def details(result, folder):
    e = result.exercise
    lines = [f"{e.number}. {e.title} ({folder}/{e.name}.py): {row_status(result)}"]
    if not result.checks and result.reason:
        lines.append(f"  {result.reason}")
    marks = {"pass": "pass", "skip": "not started", "fail": "FAIL"}
    for name, outcome, message in result.checks:
        lines.append(f"  {marks[outcome]:<11} {name}" + (f"\n      {message}" if message else ""))
    return lines


def main(argv=None):
    parser = OneLineParser(prog="python -m exercises", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help=f"exercises to show in full: {', '.join(BY_NAME)}")
    parser.add_argument("--solutions", action="store_true", help="check the reference solutions instead of yours")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BY_NAME]
    if unknown:
        parser.error(f"no exercise named {', '.join(unknown)}; the exercises are {', '.join(BY_NAME)}")
    package = SOLUTIONS if args.solutions else "exercises"
    if args.solutions:
        try:
            load_solutions()
        except FileNotFoundError as e:
            parser.exit(2, f"{parser.prog}: error: {e}\n")
    folder = "tests/support/exercise_solutions" if args.solutions else "exercises"
    results = check_all(package, args.names or None)
    if args.names:
        for r in results:
            print("\n".join(details(r, folder)))
    else:
        print("\n".join(table(results, folder)))
        if any(r.status == "failing" for r in results):
            print("(python -m exercises NAME shows every check of an exercise, with the whole message)")
    passing = sum(r.passing for r in results)
    print(f"{passing} of {len(results)} passing")
    if args.solutions:
        return 0 if passing == len(results) else 1
    return 1 if any(r.status == "failing" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
