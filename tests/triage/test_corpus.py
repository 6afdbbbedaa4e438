"""``trainguard triage`` on real log excerpts from public threads (``corpus/README.md``).

The corpus is scored per category, one vote per source thread; every category must reach
``TARGET`` and no clean log may produce a finding.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.contract import Failure
from trainguard.thresholds import load_default
from trainguard.triage import corpus

CORPUS = Path(__file__).parent / "corpus"
TARGET = 0.97
# Every failure triage has a detector for.
CATEGORIES = {
    Failure.OOM.value,
    Failure.NCCL_TIMEOUT.value,
    Failure.NCCL_ERROR.value,
    Failure.GPU_FAULT.value,
    Failure.RANK_FAILURE.value,
    Failure.STRAGGLER.value,
}


@pytest.fixture(scope="module")
def excerpts() -> list[corpus.Excerpt]:
    return corpus.load(CORPUS)


@pytest.fixture(scope="module")
def score(excerpts: list[corpus.Excerpt]) -> corpus.Score:
    return corpus.score(excerpts, load_default())


def test_corpus_has_enough_real_excerpts(excerpts: list[corpus.Excerpt]) -> None:
    failures = [e for e in excerpts if e.category != corpus.CLEAN]
    assert len(failures) >= 100
    assert sum(e.category == corpus.CLEAN for e in excerpts) >= 8
    assert all(e.source.startswith("https://") for e in excerpts)


@pytest.mark.parametrize("category", sorted(CATEGORIES))
def test_corpus_has_eight_threads_of_each_category(
    excerpts: list[corpus.Excerpt], category: str
) -> None:
    # eight sources, not eight excerpts: one thread's several excerpts vote once in the score
    assert len({e.thread for e in excerpts if e.category == category}) >= 8


def test_corpus_score_per_category(score: corpus.Score) -> None:
    table = score.by_category()
    wrong = "\n".join(
        f"{v.excerpt.path.relative_to(CORPUS)}: {'; '.join(v.reasons)}" for v in score.failures()
    )
    assert set(table) == CATEGORIES | {corpus.CLEAN}
    for category, (share, _, _) in table.items():
        if category != corpus.CLEAN:
            assert share >= TARGET, f"{category} scores {share:.3f}\n{wrong}"
    assert score.clean_false == 0, wrong


def _excerpt(category: str, thread: str, *expect: corpus.Expected) -> corpus.Excerpt:
    return corpus.Excerpt(Path("x.log"), category, "https://example.org", thread, expect)


def _finding(failure: str, **fields: object) -> dict[str, object]:
    return {"failure": failure, "fields": fields}


def test_judge_wants_every_category_and_every_key_value() -> None:
    oom = corpus.Expected("oom", {"tried_bytes": 20 << 20, "gpu": 0})
    excerpt = _excerpt("oom", "t", oom)
    assert corpus.judge(excerpt, [_finding("oom", tried_bytes=20 << 20, gpu=0, rank=1)]).correct
    assert not corpus.judge(excerpt, [_finding("oom", tried_bytes=20 << 20, gpu=1)]).correct
    assert not corpus.judge(excerpt, [_finding("oom", tried_bytes=20 << 20)]).correct
    # A finding of another category too is wrong, unless it is expected as well.
    extra = [_finding("oom", tried_bytes=20 << 20, gpu=0), _finding("straggler", rank=3)]
    assert not corpus.judge(excerpt, extra).correct
    assert not corpus.judge(excerpt, []).correct
    nested = _excerpt("rank_failure", "t", corpus.Expected("rank_failure", {"root_cause.rank": 3}))
    assert corpus.judge(nested, [_finding("rank_failure", root_cause={"rank": 3})]).correct
    assert not corpus.judge(nested, [_finding("rank_failure", root_cause={"rank": 2})]).correct


def test_a_thread_counts_once_however_many_excerpts_it_has() -> None:
    expected = corpus.Expected("oom", {})
    right: list[dict[str, object]] = [_finding("oom")]
    wrong: list[dict[str, object]] = []
    verdicts = [corpus.judge(_excerpt("oom", "long", expected), right) for _ in range(9)]
    verdicts.append(corpus.judge(_excerpt("oom", "short", expected), wrong))
    share, excerpts, threads = corpus.Score(verdicts).by_category()["oom"]
    assert (excerpts, threads) == (10, 2)
    assert share == pytest.approx(0.5)  # not 0.9: the long thread has one vote


def test_malformed_metadata_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "oom").mkdir()
    (tmp_path / "oom" / "a.log").write_text("CUDA out of memory.\n")
    with pytest.raises(corpus.CorpusError, match=r"no a\.yml"):
        corpus.load(tmp_path)
    (tmp_path / "oom" / "a.yml").write_text("source: https://x\nexpect: []\n")
    with pytest.raises(corpus.CorpusError, match="only clean logs"):
        corpus.load(tmp_path)
