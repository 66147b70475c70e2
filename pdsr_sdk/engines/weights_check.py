"""What a model folder's checkpoint holds (names, shapes, dtypes from its safetensors headers), and the check
of an update's tensors against it that names a bad parameter (before anything is copied, and in the engine)."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from pdsr_sdk.errors import DataError, DataValueError

#: names a Hugging Face state dict may hold that vLLM's loaders skip
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
#: what a tied model's input embedding, the tensor its LM head uses, is called in its checkpoint
_EMBEDDING_SUFFIXES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight")


@dataclass
class ModelWeights:
    """The parameters a model folder's checkpoint holds: name -> (shape, dtype), from the
    safetensors headers (no tensor is read)."""

    folder: str
    shapes: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)
    tied_embeddings: bool = False

    @classmethod
    def read(cls, folder: str | Path) -> "ModelWeights":
        folder = Path(folder)
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise DataError(f"{folder}: no *.safetensors files (update_weights reads safetensors checkpoints)")
        shapes: dict[str, tuple[tuple[int, ...], str]] = {}
        for f in files:
            for name, (shape, dtype) in safetensors_header(f).items():
                shapes[name] = (shape, dtype)
        tied = False
        cfg = folder / "config.json"
        if cfg.exists():
            try:
                conf = json.loads(cfg.read_text())
                tied = bool(conf.get("tie_word_embeddings",
                                     conf.get("text_config", {}).get("tie_word_embeddings", False)))
            except (OSError, ValueError):
                pass
        return cls(str(folder), shapes, tied)

    def check(self, items: Iterable[tuple[str, tuple[int, ...]]], *, what: str = "weights",
              seen: set[str] | None = None, complete: bool = True) -> set[str]:
        """Check ``(name, shape)`` pairs: every name known with its shape, every checkpoint tensor given.
        Returns the names to leave out (present in a trainer's state dict, skipped by vLLM: a tied
        ``lm_head.weight``, rotary ``inv_freq`` buffers). Raises a DataError naming the parameter.

        A bucket of an update checks with the update's ``seen`` names so far (added to), and only the last
        bucket with ``complete`` (every checkpoint tensor given by then)."""
        skip: set[str] = set()
        seen = set() if seen is None else seen
        for name, shape in items:
            ref = self.shapes.get(name)
            if ref is None:
                if name.endswith(_IGNORED_SUFFIXES) or (self.tied_embeddings and name == "lm_head.weight"):
                    skip.add(name)
                    continue
                close = _closest(name, self.shapes)
                hint = f" (did you mean {close!r}?)" if close else ""
                raise DataValueError(f"{what}: unknown parameter {name!r}: the model in {self.folder} has no such "
                                f"tensor{hint}")
            if tuple(shape) != tuple(ref[0]):
                raise DataValueError(f"{what}: parameter {name!r} has shape {list(shape)}; the model in {self.folder} "
                                f"expects {list(ref[0])}")
            if name in seen:
                raise DataValueError(f"{what}: parameter {name!r} is given twice")
            seen.add(name)
        missing = [n for n in self.shapes if n not in seen] if complete else []
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise DataValueError(f"{what}: {len(missing)} parameter(s) of the model in {self.folder} are missing: "
                            f"{', '.join(repr(m) for m in missing[:3])}{more} (an update gives every tensor "
                            f"of the model)")
        return skip


    def check_tensors(self, items: Iterable[tuple[str, Any]], *, what: str = "update_weights") -> None:
        """What names and shapes do not show, checked before anything is copied: a tensor whose data the session
        cannot read (a DTensor, a shard of FSDP2 or tensor parallelism; a meta tensor), an integer or bool tensor
        for a floating-point parameter (it would load as its values converted), a NaN or an infinity
        (:func:`check_finite`). A DataValueError naming it."""
        for name, t in items:
            if type(t).__name__ == "DTensor":
                raise DataValueError(
                    f"{what}: parameter {name!r} is a DTensor (sharded: FSDP2 or tensor parallelism); give full "
                    f"tensors: gather them on every rank, e.g. torch.distributed.checkpoint.state_dict."
                    f"get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)), "
                    f"and call update_weights with rank 0's")
            if getattr(t, "is_meta", False):
                raise DataValueError(f"{what}: parameter {name!r} is a meta tensor: it has no data (a model built "
                                     f"on the meta device and not loaded yet?)")
            ref = self.shapes.get(name)
            is_float = getattr(t, "is_floating_point", None)
            if ref is not None and _floating(ref[1]) and is_float is not None and not is_float():
                raise DataValueError(f"{what}: parameter {name!r} is {str(t.dtype).removeprefix('torch.')}; the "
                                     f"model in {self.folder} holds it as {ref[1]} (floating point): an integer or "
                                     f"bool tensor would load as its values converted")
            check_finite(name, t, what=what)

    def check_tied_head(self, items: Iterable[tuple[str, Any]], *, what: str = "update_weights",
                        pending: dict[str, Any] | None = None) -> None:
        """A tied model's engines skip a given ``lm_head.weight`` and use the embedding as their head: one that
        differs from the update's embedding (a trainer whose head is not tied) would leave them sampling from
        another model than the trainer's, without a word. A DataValueError naming both. ``pending``: what an
        update's earlier buckets held of the two (their fingerprints, :func:`_fingerprint`), added to."""
        embedding = self._embedding_name() if self.tied_embeddings else None
        if embedding is None:
            return
        pending = {} if pending is None else pending
        for name, t in items:
            if name in (embedding, "lm_head.weight"):
                pending[name] = _fingerprint(t)
        if len(pending) == 2 and not _same_fingerprint(pending[embedding], pending["lm_head.weight"]):
            raise DataValueError(f"{what}: 'lm_head.weight' differs from {embedding!r}, but the model in "
                                 f"{self.folder} ties them (tie_word_embeddings): the engines would use {embedding!r} "
                                 f"as their head, not the trainer's; give the tied head (or leave it out)")

    def _embedding_name(self) -> str | None:
        names = [n for n in self.shapes if n.endswith(_EMBEDDING_SUFFIXES)]
        return names[0] if len(names) == 1 else None


def _fingerprint(tensor: Any) -> tuple:
    """A 2-D tensor's shape and row and column sums (float64, no temporary of its size): equal for the same values
    in any layout or bucket, unequal for a head that has drifted from its embedding. Else its shape and a copy."""
    import torch

    t = tensor.detach()
    if t.dim() != 2 or not t.is_floating_point():
        return tuple(t.shape), t.cpu().clone()
    with torch.no_grad():
        return tuple(t.shape), torch.cat([t.sum(1, dtype=torch.float64), t.sum(0, dtype=torch.float64)]).cpu()


def _same_fingerprint(a: tuple, b: tuple) -> bool:
    import torch

    if a[0] != b[0] or a[1].dtype != b[1].dtype:
        return False
    if a[1].is_floating_point():
        return bool(torch.allclose(a[1], b[1], rtol=1e-10, atol=1e-10))
    return bool(torch.equal(a[1], b[1]))


def check_finite(name: str, tensor: Any, *, what: str = "update_weights") -> None:
    """A DataValueError naming ``name`` if the floating-point ``tensor`` holds a NaN or an infinity (a diverged
    trainer's weights would otherwise make the engines generate garbage, silently). One read of the tensor where
    it is (``torch.aminmax``: NaN propagates into both, an infinity shows in one; no temporary of its size)."""
    import torch

    if not tensor.is_floating_point() or tensor.numel() == 0:
        return
    with torch.no_grad():
        try:
            lo, hi = (float(v) for v in torch.aminmax(tensor.detach()))
        except (RuntimeError, NotImplementedError):   # a dtype aminmax lacks (float8): through float32
            lo, hi = (float(v) for v in torch.aminmax(tensor.detach().float()))
    if math.isnan(lo) or math.isnan(hi):
        raise DataValueError(f"{what}: parameter {name!r} holds NaN values (a diverged trainer?); refused")
    if math.isinf(lo) or math.isinf(hi):
        raise DataValueError(f"{what}: parameter {name!r} holds infinite values (a diverged trainer?); refused")


def folder_tensors(folder: str | Path, skip: Iterable[str] = ()) -> Iterator[tuple[str, Any]]:
    """``(name, tensor)`` of every tensor in a model folder's ``*.safetensors`` files, read one at a time."""
    from safetensors import safe_open

    skip = set(skip)
    for path in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                if name not in skip:
                    yield name, f.get_tensor(name)


def _floating(dtype: str) -> bool:
    """Whether a safetensors dtype (``F32``, ``BF16``, ``F8_E4M3``, ``I64``, ...) is a floating-point one."""
    return dtype.startswith("F") or dtype == "BF16"


def safetensors_header(path: str | Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype) of one safetensors file, from its JSON header."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {k: (tuple(v["shape"]), v["dtype"]) for k, v in header.items() if k != "__metadata__"}


def _closest(name: str, known: Mapping[str, Any]) -> str | None:
    import difflib

    hits = difflib.get_close_matches(name, list(known), n=1, cutoff=0.8)
    return hits[0] if hits else None
