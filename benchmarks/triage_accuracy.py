"""How often ``trainguard triage`` gets real logs right: the corpus of public excerpts, scored.

Runs triage (the default detectors and thresholds) on every excerpt of ``tests/triage/corpus``
and scores it as ``tests/triage/corpus/README.md`` says: an excerpt is right when triage reports
exactly the expected categories with the expected key values; a thread (the public issue or
post the excerpts come from) scores the share of its excerpts that are right, a category the
mean over its threads, and ``corpus_accuracy`` the mean over every failure category's threads.
Clean logs must produce nothing; ``clean_false`` counts those that did.

    .venv/bin/python -m benchmarks.triage_accuracy [--verbose]

The last line is ``corpus_accuracy=<x> files=<n> threads=<t> clean_false=<k>``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainguard.thresholds import load_default
from trainguard.triage import corpus

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "triage" / "corpus"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--verbose", action="store_true", help="say why each wrong one is wrong")
    args = parser.parse_args()
    try:
        excerpts = corpus.load(args.corpus)
    except corpus.CorpusError as exc:
        print(f"triage_accuracy: {exc}", file=sys.stderr)
        return 2
    score = corpus.score(excerpts, load_default())
    print(f"{'category':<14} {'score':>6} {'excerpts':>9} {'threads':>8}")
    for category, (share, count, threads) in score.by_category().items():
        print(f"{category:<14} {share:>6.1%} {count:>9} {threads:>8}")
    for verdict in score.failures():
        line = f"wrong: {verdict.excerpt.path.relative_to(args.corpus)}"
        print(f"{line}: {'; '.join(verdict.reasons)}" if args.verbose else line)
    print(
        f"corpus_accuracy={score.accuracy:.4f} files={len(excerpts)} "
        f"threads={score.threads} clean_false={score.clean_false}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
