"""Training text available offline: the Python standard library's sources, optionally the Python sources of the
installed packages (site-packages) and question/answer JSONL files.

Text becomes byte tokens (ids 0-255, as ``models.llada2.collect.Tokenizer`` reads a checkpoint without a
tokenizer.json); documents are joined with EOS so the model learns where an answer ends. A
``Corpus`` holds one token stream per source and samples fixed-length windows from them.
"""

from __future__ import annotations

import json
import math
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dllm_offload_sim.traces.errors import TraceError
from dllm_offload_sim.models.llada2.train.shard import Shard

EOS, PAD, MASK = 256, 257, 258  # special ids after the 256 byte values
VOCAB = 264  # byte ids + specials, padded to a multiple of 8
QA_TEMPLATE = "Question: {question}\nAnswer: {answer}"  # a JSONL record with question/answer as one document
PROMPT_TEMPLATE = "Question: {}\nAnswer:"  # the matching prompt (``dllm-trace-collect --template``)


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(ids) -> str:
    return bytes(int(t) for t in ids if int(t) < 256).decode("utf-8", errors="replace")


def stdlib_documents(root: str | None = None) -> list[str]:
    """The ``.py`` files of the standard library (sorted by path; site-packages excluded)."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = sorted(
        p for p in root.rglob("*.py") if "site-packages" not in p.parts and "dist-packages" not in p.parts
    )
    if not files:
        raise TraceError(f"{root}: no Python sources found for the training corpus")
    return [f.read_text(encoding="utf-8", errors="replace") for f in files]


def site_packages_documents(roots: list[str] | None = None) -> list[str]:
    """The ``.py`` files of the installed packages (default: this Python's purelib and platlib directories),
    sorted by path. What they hold depends on the machine, so ``Corpus.describe`` reports each source's size."""
    paths = sysconfig.get_paths()
    dirs = sorted({Path(r).resolve() for r in (roots or [paths["purelib"], paths["platlib"]])})
    files = sorted({p for d in dirs for p in d.rglob("*.py")})
    if not files:
        raise TraceError(f"{', '.join(map(str, dirs))}: no Python sources found for the training corpus")
    return [f.read_text(encoding="utf-8", errors="replace") for f in files]


def jsonl_documents(path) -> list[str]:
    """Question/answer documents from a JSONL file with ``question`` and ``answer`` fields (GSM8K)."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such training JSONL file")
    docs = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            docs.append(QA_TEMPLATE.format(question=obj["question"], answer=obj["answer"]))
        except (json.JSONDecodeError, KeyError) as e:
            raise TraceError(f"{path}, line {n}: needs JSON with 'question' and 'answer' ({e!r})") from None
    return docs


def token_stream(docs: list[str]) -> np.ndarray:
    """All documents as one uint16 stream, each followed by EOS."""
    parts = []
    for d in docs:
        parts.append(np.frombuffer(d.encode("utf-8"), np.uint8).astype(np.uint16))
        parts.append(np.array([EOS], np.uint16))
    return np.concatenate(parts)


@dataclass
class Corpus:
    """Token streams (one per source) split into train and held-out tails; samples windows, each from a source drawn
    with probability proportional to its weight (``None``: uniformly)."""

    names: list[str]
    train: list[np.ndarray]
    val: list[np.ndarray]
    weights: list[float] | None = None

    @classmethod
    def build(
        cls,
        sources: dict[str, list[str]],
        val_fraction: float = 0.01,
        weights: dict[str, float] | None = None,
    ) -> "Corpus":
        """``weights`` maps source names to sampling weights; a source it does not name weighs 1."""
        unknown = sorted(set(weights or {}) - set(sources))
        if unknown:
            raise TraceError(
                f"source weights name {unknown}, which are not among the corpus' sources {list(sources)}"
            )
        bad = {k: v for k, v in (weights or {}).items() if not (v >= 0 and math.isfinite(v))}
        if bad or (weights and not any((weights or {}).get(n, 1.0) > 0 for n in sources)):
            raise TraceError(f"source weights {bad or weights} must be finite, >= 0 and not all 0")
        names, train, val = [], [], []
        for name, docs in sources.items():
            s = token_stream(docs)
            cut = int(len(s) * (1 - val_fraction))
            names.append(name)
            train.append(s[:cut])
            val.append(s[cut:])
        w = [float((weights or {}).get(n, 1.0)) for n in names] if weights else None
        return cls(names, train, val, w)

    def sample(self, rng: np.random.Generator, batch: int, length: int, split: str = "train") -> np.ndarray:
        """``batch`` windows of ``length`` tokens, each from a source drawn by the weights (training windows) or
        uniformly (held-out windows, so that the held-out loss weighs every source the same)."""
        streams = self.train if split == "train" else self.val
        out = np.empty((batch, length), np.int64)
        if self.weights is not None and split == "train":
            p = np.asarray(self.weights) / sum(self.weights)
            src = rng.choice(len(streams), batch, p=p)
        else:
            src = rng.integers(0, len(streams), batch)
        for b in range(batch):
            s = streams[src[b]]
            if len(s) <= length:
                raise TraceError(
                    f"source '{self.names[src[b]]}' has {len(s)} {split} tokens, fewer than {length}"
                )
            o = rng.integers(0, len(s) - length)
            out[b] = s[o : o + length]
        return out

    def describe(self) -> str:
        w = self.weights or [1.0] * len(self.names)
        return ", ".join(
            f"{n}: {len(t) / 1e6:.1f}M train / {len(v) / 1e3:.0f}k val tokens"
            + (f", weight {x:g}" if self.weights else "")
            for n, t, v, x in zip(self.names, self.train, self.val, w)
        )


class PrefetchedBatches:
    """Training windows sampled ahead in a background thread, ``depth`` at most, so that sampling and the copy to
    the device stay off the training step's path. The thread alone draws from ``rng``, in order, so the windows
    are exactly those that sampling in the loop would give. In a data-parallel run each process draws the global
    batch (``shard.world * batch`` windows) and keeps its ``shard``'s rows. ``next()`` returns the next window batch
    on ``device``; an error while sampling is raised there. ``rng_state`` is the generator's state after the batches
    handed out so far: a generator set to it draws the next batch (how a resumed run continues the stream).
    ``wait_s`` is the time ``next()`` has spent waiting for the thread: 0 while sampling keeps ahead of training."""

    def __init__(
        self,
        corpus: "Corpus",
        rng: np.random.Generator,
        batch: int,
        length: int,
        device="cpu",
        depth: int = 4,
        shard: Shard = Shard(),
    ):
        import queue
        import threading

        import torch

        self.corpus, self.rng, self.batch, self.length, self.shard = corpus, rng, batch, length, shard
        self.rng_state = rng.bit_generator.state
        self.wait_s = 0.0
        self.device = torch.device(device)
        self.pin = self.device.type == "cuda"
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fill, name="batch-prefetch", daemon=True)
        self._thread.start()

    def _fill(self) -> None:
        import queue

        import torch

        while not self._stop.is_set():
            try:
                x = self.corpus.sample(self.rng, self.batch * self.shard.world, self.length)
                x = torch.from_numpy(np.ascontiguousarray(x[self.shard.rows(self.batch)]))
                item = (x.pin_memory() if self.pin else x, self.rng.bit_generator.state)
            except Exception as e:  # handed to the consumer, which raises it
                item = e
            while not self._stop.is_set():
                try:
                    self._q.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item, Exception):
                return

    def next(self):
        import time

        t0 = time.perf_counter()
        item = self._q.get()
        self.wait_s += time.perf_counter() - t0
        if isinstance(item, Exception):
            raise item
        x, self.rng_state = item
        return x.to(self.device, non_blocking=self.pin)

    def close(self) -> None:
        """Stop the thread (what it sampled ahead is dropped)."""
        self._stop.set()
        self._thread.join(timeout=5)
