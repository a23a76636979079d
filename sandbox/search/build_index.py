"""Build the local BM25 index declared in params.yaml: `python -m sandbox.search.build_index --params PATH`.

Reads `search.corpus_path`, `search.corpus_format`, `search.passage_words`; writes `search.index_dir`
(relative paths are under the repository root). The DVC stage `build-index` calls `build_index(cfg)`.
"""

from __future__ import annotations

import argparse
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import load_config
from pipeline.config.search import SearchConfig
from pipeline.paths import REPO_ROOT
from sandbox.search.bm25 import BM25Index
from pipeline.paths import embedded_wiki_dump, file_sha256
from sandbox.search.corpus import load_corpus


@dataclass(frozen=True)
class IndexReport:
    index_dir: Path
    corpus: str
    n_passages: int
    seconds: float


def build_index(cfg: SearchConfig, root: Path = REPO_ROOT) -> IndexReport:
    """Load the corpus, index it, and replace `cfg.index_dir` atomically (a half-built index never shows)."""
    started = time.perf_counter()
    corpus = Path(cfg.corpus_path) if cfg.corpus_path else embedded_wiki_dump()
    passages = load_corpus(cfg.corpus_path, cfg.corpus_format, cfg.passage_words)
    index_dir = Path(cfg.index_dir) if Path(cfg.index_dir).is_absolute() else root / cfg.index_dir
    staging = index_dir.with_name(index_dir.name + ".building")
    shutil.rmtree(staging, ignore_errors=True)
    manifest = {"corpus": corpus.name, "corpus_sha256": file_sha256(corpus), "corpus_format": cfg.corpus_format,
                "passage_words": cfg.passage_words, "n_passages": len(passages)}
    BM25Index.build(passages).save(staging, manifest)
    shutil.rmtree(index_dir, ignore_errors=True)
    staging.rename(index_dir)
    return IndexReport(index_dir, str(corpus), len(passages), time.perf_counter() - started)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sandbox.search.build_index", description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=str(REPO_ROOT / "params.yaml"))
    args = parser.parse_args(argv)
    report = build_index(load_config(args.params).search)
    print(f"indexed {report.n_passages} passages from {report.corpus} into {report.index_dir} in {report.seconds:.1f}s")


if __name__ == "__main__":
    main()
