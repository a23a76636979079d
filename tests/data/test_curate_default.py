"""The default params curate offline (calculator problems and the embedded Wikipedia dump's fact questions, each
kept only when the real search service answers it), and byte-identically on re-run."""

from __future__ import annotations

from pathlib import Path

from pipeline.config import load_config
from pipeline.data.answerable import service_probe, shows_answer
from pipeline.jsonl import read_problems


def test_default_params_curate_calculator_and_answerable_wiki_facts(repo_root: Path, tmp_path: Path,
                                                                    wiki_search_url: str) -> None:
    from pipeline.data.curate import run

    full = load_config(repo_root / "params.yaml", {"curate.output_dir": str(tmp_path / "a")})
    cfg = full.curate
    assert cfg.sources == () and cfg.needs_search()  # the default pipeline needs no shared data, but the search
    probe = service_probe(full.search, wiki_search_url, full.rollout.max_tool_output_chars)
    report = run(cfg, search=probe)
    train = read_problems(tmp_path / "a" / "train.jsonl")
    test = read_problems(tmp_path / "a" / "test.jsonl")
    assert (report.n_train, report.n_test) == (len(train), len(test))
    assert len(test) >= 100  # one held-out problem is at most a point
    by_source = {s: [p for p in train + test if p.source == s] for s in ("calculator", "wiki_facts")}
    assert len(by_source["calculator"]) == cfg.calculator.n_train + cfg.calculator.n_test
    assert len(by_source["wiki_facts"]) >= 80
    assert {p.type for p in train + test} == {"complex"}  # both tools offered; the source routes the verifier
    assert not {p.id for p in train} & {p.id for p in test}
    assert not {p.meta["page"] for p in train if p.source == "wiki_facts"} & {
        p.meta["page"] for p in test if p.source == "wiki_facts"}  # no entity on both sides
    facts = by_source["wiki_facts"]  # the filter's promise, checked again against the service
    assert all(shows_answer(shown, p.answers) for p, shown in zip(facts, probe([p.question for p in facts])))
    assert report.per_filter["unanswerable"] > 0

    again = cfg.model_copy(update={"output_dir": str(tmp_path / "b")})
    run(again, search=probe)
    for name in ("train.jsonl", "test.jsonl", "rejected.jsonl", "report.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
