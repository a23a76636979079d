"""Where things are: the repository root, the shared benchmark data beside it, the embedded Wikipedia dump;
and `file_sha256`, what a file holds, for records that name their inputs."""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# The real English Wikipedia dump excerpt in the gensim wheel's test data (106 articles), pinned by gensim's version
GENSIM_DUMP = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"


def shared_data_dir() -> Path:
    """Real benchmark files (never copied into the repo).

    `TAPO_SHARED_DATA` overrides; otherwise `../shared/data` beside the repository.
    """
    env = os.environ.get("TAPO_SHARED_DATA")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


def embedded_wiki_dump() -> Path:
    """The Wikipedia dump excerpt in the installed gensim package: the default search corpus and the source of
    the offline default's fact questions (`pipeline.data.wiki_facts`)."""
    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the default search corpus needs the 'gensim' package (pip install gensim==4.4.0)")
    path = Path(spec.submodule_search_locations[0]) / "test" / "test_data" / GENSIM_DUMP
    if not path.is_file():
        raise FileNotFoundError(f"{path}: gensim's Wikipedia test dump is missing from this gensim install")
    return path


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()
