"""What the tokenizer process's allowances leave to real tokenizers: for each real tokenizer structure
(tests/tokenizer_files.py: GPT-2-style byte-level BPE, Llama-3's and Qwen2's splits, Llama-2's
SentencePiece-style BPE), the rate of tokenising in the library in this process and through attnspec's
child process, and the child's peak address space per byte of text, beside the allowances of
attnspec/tokenizer_worker.py.

    python benchmarks/tokenizer_limits.py              # the topics as 79 documents, and one 4 MB document
    python benchmarks/tokenizer_limits.py --megabytes 20

Rates are the median of 2 rounds (in-process and child interleaved, each round a fresh child); the
library's thread pool uses the machine's cores (say how many, and whether the machine was quiet).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attnspec import tokenizer as tokenizer_module  # noqa: E402
from attnspec import tokenizer_worker as worker  # noqa: E402
from tests.tokenizer_files import REAL, topics, write_tokenizer  # noqa: E402


def _peak_bytes(pid: int) -> tuple[int, int]:
    """(current, peak) address space of process ``pid``."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmSize"].split()[0]) << 10, int(fields["VmPeak"].split()[0]) << 10


def measure(path: Path, texts: list[str]) -> dict:
    from tokenizers import Tokenizer

    size = sum(len(t.encode()) for t in texts)
    library = Tokenizer.from_file(str(path))
    inside, child, peaks = [], [], []
    for _ in range(2):
        start = time.perf_counter()
        expected = [e.ids for e in library.encode_batch(texts, add_special_tokens=False)]
        inside.append(time.perf_counter() - start)
        tokenizer_module._stop_processes()
        loaded = tokenizer_module.load_tokenizer(path)
        process = tokenizer_module._process(loaded).process
        before, _ = _peak_bytes(process.pid)
        start = time.perf_counter()
        found = loaded.encode_batch(texts)
        child.append(time.perf_counter() - start)
        peaks.append(_peak_bytes(process.pid)[1] - before)
        assert found == expected, "the child's ids differ from the library's"
    return {"bytes": size, "inside": statistics.median(inside), "child": statistics.median(child),
            "peak": max(peaks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=4, help="the size of the one long document")
    args = parser.parse_args()
    corpus = topics()
    repeats = args.megabytes * (1 << 20) // sum(len(t) for t in corpus) + 1
    long = ("\n\n".join(corpus) * repeats)[: args.megabytes << 20]
    print(f"allowances: time {worker.TIME_FLOOR:.0f} s + 1 s per {worker.BYTES_PER_SECOND >> 10} KiB; memory "
          f"{worker.MEMORY_FLOOR >> 20} MiB + {worker.MEMORY_PER_BYTE} B per byte\n")
    print(f"{'structure':<10} {'text':<16} {'MB/s library':>13} {'MB/s child':>11} {'child/library':>14} "
          f"{'peak B/byte':>12} {'time used':>10} {'memory used':>12}")
    with tempfile.TemporaryDirectory() as directory:
        for structure in REAL:
            path = write_tokenizer(Path(directory) / f"{structure}.json", structure)
            for label, texts in ((f"{len(corpus)} documents", corpus), (f"1 of {args.megabytes} MB", [long])):
                found = measure(path, texts)
                size = found["bytes"]
                print(f"{structure:<10} {label:<16} {size / found['inside'] / 1e6:>13.2f} "
                      f"{size / found['child'] / 1e6:>11.2f} {found['child'] / found['inside']:>14.2f} "
                      f"{found['peak'] / size:>12.1f} {found['child'] / worker.time_allowance(size):>10.1%} "
                      f"{found['peak'] / worker.memory_allowance(size):>12.1%}")
    tokenizer_module._stop_processes()


if __name__ == "__main__":
    main()
