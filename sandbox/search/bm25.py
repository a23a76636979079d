"""BM25 over passages with bm25s (numpy/scipy sparse matrices; no Java, unlike pyserini).

Choice: bm25s over pyserini (Lucene needs a JDK and a ~7 GB environment) and rank-bm25 (pure Python,
orders of magnitude slower; see benchmarks/RESULTS.md). Search-R1 uses pyserini's Lucene BM25 with
its default parameters (k1=0.9, b=0.4); we use bm25s's "lucene" method with the same k1 and b, and
the same English stop-word list at index and query time, without stemming.

An index directory holds the bm25s matrices plus `passages.jsonl` (our Passage rows, in index order)
and `manifest.json` (corpus source, passage count, build parameters, the passages' digest).
`index_fingerprint` names what a search over it is a function of; the search cache keeps its entries
under it, so a rebuilt index with other passages never answers from the old one's cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import bm25s
import numpy as np

from pipeline.jsonl import iter_json_lines, write_json_lines
from pipeline.paths import file_sha256
from sandbox.search.results import Passage

logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets its logger to DEBUG at import

PASSAGES_FILE = "passages.jsonl"
MANIFEST_FILE = "manifest.json"
BM25S_PARAMS_FILE = "params.index.json"  # written by bm25s: its method, k1, b, delta, vocabulary size
PASSAGES_DIGEST = "passages_sha256"
K1, B = 0.9, 0.4


def _tokenize(texts: list[str]) -> list[list[str]]:
    return bm25s.tokenize(texts, lower=True, stopwords="en", return_ids=False, show_progress=False)


@dataclass
class BM25Index:
    """A loaded index: `search(query, k)` returns passages with BM25 scores, best first."""

    retriever: bm25s.BM25
    passages: list[Passage]

    @classmethod
    def build(cls, passages: list[Passage]) -> BM25Index:
        """The same passages give the same index, byte for byte: bm25s numbers the words in the order of a
        `set` of them, which follows the interpreter's string hashing (random per process), and the word
        numbers order the matrices' columns (rankings came out the same; the files, and so DVC's hash, did not).
        So the words are numbered here, in the order they first occur."""
        retriever = bm25s.BM25(method="lucene", k1=K1, b=B)
        documents = _tokenize([f"{p.title} {p.text}" for p in passages])
        vocabulary = {word: i for i, word in enumerate(dict.fromkeys(w for doc in documents for w in doc))}
        retriever.index(([[vocabulary[w] for w in doc] for doc in documents], vocabulary), show_progress=False)
        return cls(retriever, passages)

    def save(self, directory: Path, manifest: dict) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.retriever.save(str(directory), show_progress=False)
        write_json_lines(directory / PASSAGES_FILE, [p.to_dict() for p in self.passages])
        manifest = {**manifest, PASSAGES_DIGEST: file_sha256(directory / PASSAGES_FILE)}
        (directory / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, directory: Path) -> BM25Index:
        if not (directory / MANIFEST_FILE).is_file():
            raise FileNotFoundError(f"{directory}: no BM25 index here (run: python -m sandbox.search.build_index)")
        retriever = bm25s.BM25.load(str(directory), show_progress=False)
        passages = [Passage.from_dict(row) for _, row in iter_json_lines(directory / PASSAGES_FILE)]
        return cls(retriever, passages)

    def search_many(self, queries: list[str], k: int) -> list[list[Passage]]:
        """Top-k passages per query; queries with no indexed word get no results."""
        k = min(k, len(self.passages))
        tokens = _tokenize(queries)
        known = [[t for t in q if t in self.retriever.vocab_dict] for q in tokens]
        answers: list[list[Passage]] = [[] for _ in queries]
        rows = [i for i, q in enumerate(known) if q]
        if not rows:
            return answers
        ids, scores = self.retriever.retrieve([known[i] for i in rows], k=k, show_progress=False, n_threads=1)
        for row, doc_ids, doc_scores in zip(rows, np.asarray(ids), np.asarray(scores)):
            answers[row] = [_scored(self.passages[int(d)], float(s)) for d, s in zip(doc_ids, doc_scores) if s > 0]
        return answers

    def search(self, query: str, k: int) -> list[Passage]:
        return self.search_many([query], k)[0]


def index_fingerprint(directory: Path) -> str:
    """A short digest of everything a search over the index in `directory` depends on: the manifest (corpus
    digest, format, passage size, the passages' own digest), bm25s's parameters, the scoring constants and
    the bm25s version. Two indexes with the same fingerprint answer every query alike."""
    manifest = json.loads((directory / MANIFEST_FILE).read_text())
    if PASSAGES_DIGEST not in manifest:  # built before the manifest recorded it
        manifest[PASSAGES_DIGEST] = file_sha256(directory / PASSAGES_FILE)
    digest = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode())
    digest.update((directory / BM25S_PARAMS_FILE).read_bytes())
    digest.update(f"k1={K1} b={B} bm25s={bm25s.__version__}".encode())
    return digest.hexdigest()[:16]


def index_vocabulary(directory: Path) -> frozenset[str]:
    """The words of a built index (empty when there is none): the cache's list of real words."""
    vocab_file = directory / "vocab.index.json"
    if not vocab_file.is_file():
        return frozenset()
    return frozenset(w for w in json.loads(vocab_file.read_text(encoding="utf-8")) if w.isalpha())


def _scored(passage: Passage, score: float) -> Passage:
    return Passage(id=passage.id, title=passage.title, text=passage.text, url=passage.url, score=score)
