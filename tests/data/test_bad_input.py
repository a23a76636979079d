"""Malformed rows are rejected with a reason and the run goes on; unusable sources fail at once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.config import ConfigError, config_from_dict
from pipeline.config.curate import CurateConfig, SourceConfig
from pipeline.data.curate import run
from pipeline.data.formats import SourceError


def _curate(tmp_path: Path, *sources: SourceConfig, **filters: object) -> tuple[dict, list[dict]]:
    cfg = CurateConfig(calculator={"n_train": 0, "n_test": 0}, sources=sources, filters=filters,
                       output_dir=str(tmp_path / "out"))
    report = run(cfg)
    rejected = [json.loads(line) for line in (tmp_path / "out" / "rejected.jsonl").read_text().splitlines()]
    return report.to_dict(), rejected


def test_malformed_jsonl_rows_are_rejected_with_reasons(tmp_path: Path) -> None:
    good = json.dumps({"question": "Who wrote Hamlet?", "answer": "Shakespeare"})
    lines = [
        good.encode(),
        b'{"question": "broken json", ',
        json.dumps({"answer": "x"}).encode(),
        json.dumps({"question": 17, "answer": "x"}).encode(),
        json.dumps({"question": "Empty answer?", "answer": "  "}).encode(),
        json.dumps({"question": "No answer list?", "answer": []}).encode(),
        json.dumps({"question": "Bad alias type?", "answer": [{"a": 1}]}).encode(),
        '{"question": "Caf\u00e9 bytes?", "answer": "ok"}'.encode("latin-1"),  # invalid UTF-8
        json.dumps(["not", "an", "object"]).encode(),
        json.dumps({"question": "x" * 5000, "answer": "long"}).encode(),
        json.dumps({"question": "Long answer?", "answer": "y" * 400}).encode(),
        json.dumps({"question": "Boolean answer?", "answer": True}).encode(),
        json.dumps({"question": "Who painted the Mona Lisa?", "answer": "Leonardo da Vinci"}).encode(),
    ]
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    src = SourceConfig(name="qa", path=str(path), adapter="hotpotqa", type="fact", split="train")
    report, rejected = _curate(tmp_path, src)
    assert report["n_train"] == 2
    by_line = {r["line"]: r for r in rejected}
    expected = {2: "not valid JSON", 3: "missing field", 4: "must be a string", 5: "empty answer", 6: "empty answer",
                7: "must be a string or number", 8: "invalid UTF-8", 9: "expected a JSON object",
                10: "question has 5000 chars", 11: "answer has 400 chars", 12: "got bool"}
    assert set(by_line) == set(expected)
    for line, needle in expected.items():
        assert needle in by_line[line]["reason"], (line, by_line[line])
        assert by_line[line]["file"] == str(path) and by_line[line]["source"] == "qa"
    assert report["per_source"]["qa"]["read"] == 13
    assert report["per_filter"]["malformed"] == len(expected)


def test_malformed_csv_and_json_rows(tmp_path: Path) -> None:
    csv_path = tmp_path / "qa.csv"
    csv_path.write_text('Question,Answer\nWho wrote Hamlet?,Shakespeare\n"only one column"\n,empty question\n'
                        'What is the capital of Peru?,Lima\n', encoding="utf-8")
    json_path = tmp_path / "qa.json"
    json_path.write_text(json.dumps([{"question": "What is 2+2?", "answer": "4"}, 5, {"question": "Q?"}]))
    _, rejected = _curate(
        tmp_path,
        SourceConfig(name="csvqa", path=str(csv_path), adapter="bamboogle", type="multihop", split="train"),
        SourceConfig(name="jsonqa", path=str(json_path), adapter="hotpotqa", type="multihop", split="train"),
    )
    reasons = {(r["source"], r["line"]): r["reason"] for r in rejected}
    assert "columns" in reasons[("csvqa", 3)]
    assert "empty" in reasons[("csvqa", 4)]
    assert "expected a JSON object" in reasons[("jsonqa", 2)]
    assert "missing field 'golden_answers' or 'answer'" in reasons[("jsonqa", 3)]
    assert len(rejected) == 4


def test_missing_file_fails_at_once_naming_it(tmp_path: Path) -> None:
    src = SourceConfig(name="gone", path=str(tmp_path / "nope.jsonl"), adapter="gsm8k", type="math", split="train")
    with pytest.raises(SourceError, match=r"'gone'.*nope\.jsonl"):
        run(CurateConfig(sources=(src,), output_dir=str(tmp_path / "out")))
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_unreadable_whole_file_and_unknown_extension_fail_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text("[{")
    src = SourceConfig(name="b", path=str(bad), adapter="hotpotqa", type="multihop", split="train")
    with pytest.raises(SourceError, match="broken.json"):
        run(CurateConfig(sources=(src,), output_dir=str(tmp_path / "out")))
    odd = tmp_path / "data.txt"
    odd.write_text("x")
    with pytest.raises(SourceError, match=r"data\.txt.*format"):
        run(CurateConfig(sources=(src.model_copy(update={"path": str(odd)}),), output_dir=str(tmp_path / "out")))


@pytest.mark.parametrize(("source", "needle"), [
    ({"name": "x", "path": "a.jsonl", "adapter": "nosuch", "type": "math", "split": "train"}, "curate.sources.0.adapter"),
    ({"name": "x", "adapter": "gsm8k", "type": "math", "split": "train"}, "exactly one of path or hub_id"),
    ({"name": "x", "path": "a.jsonl", "adapter": "gsm8k", "type": "maths", "split": "train"}, "curate.sources.0.type"),
    ({"name": "x", "path": "a.jsonl", "adapter": "gsm8k", "type": "math", "split": "dev"}, "curate.sources.0.split"),
    ({"name": "x", "path": "a.jsonl", "adapter": "gsm8k", "type": "math", "split": "train", "judge": True}, "multi_llm.judges is empty"),
])
def test_bad_source_config_is_named(source: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        config_from_dict({"curate": {"sources": [source]}}, "params.yaml")


def test_duplicate_source_names_are_refused() -> None:
    src = {"name": "x", "path": "a.jsonl", "adapter": "gsm8k", "type": "math", "split": "train"}
    with pytest.raises(ConfigError, match="repeated"):
        config_from_dict({"curate": {"sources": [src, src]}}, "params.yaml")
