"""What a ``torch.save`` file holds, read without running code from it: :func:`load_torch_file`.

A ``torch.save`` file is a zip archive whose ``<name>/data.pkl`` is a pickle; its tensors' bytes lie beside it. A
pickle can call any function it names, so it is read here by Python's own (C) unpickler allowed only a short list
of harmless names: a tensor (``torch._utils._rebuild_tensor_v2``) becomes a :class:`TensorShape`, its shape without
its values (none is read), and ``OrderedDict``, ``set``, ``frozenset``, ``complex`` and bytes (``_codecs.encode``,
latin-1) are what they are. A pickle that names anything else is read by ``torch.load(weights_only=True)``, which
allows more of torch's own types (a ``torch.device``, a dtype) and refuses all else; its tensors are tensors.

Why not ``torch.load(weights_only=True)`` for everything: its unpickler is written in Python, over 10x slower on
lists of numbers (a slime rollout of 512 responses of 8,000 tokens, its token ids and log-probs Python lists, a
50 MB file: 15 s against 1.1 s here, on the development machine's CPU), and it reads every tensor's bytes, which a
length trace does not need. Nor is torch needed here, unless a file names one of its types.
"""

from __future__ import annotations

import collections
import pickle
import re
import zipfile
from pathlib import Path

from pdsr_sdk.errors import DataError


class TensorShape:
    """A tensor of the file, as its shape only (its values are not read)."""

    __slots__ = ("shape",)

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape

    def __repr__(self) -> str:
        return f"TensorShape({self.shape})"


class _UnsupportedGlobal(Exception):
    """The pickle names a function or class outside the list read here."""


def _tensor(storage, storage_offset, size, *rest) -> TensorShape:   # torch._utils._rebuild_tensor_v2's arguments
    return TensorShape(tuple(int(s) for s in size))


def _latin1_bytes(text: str, encoding: str = "utf-8") -> bytes:
    # protocol 2 pickles bytes as _codecs.encode(text, "latin1"); another codec could be anything (zlib, ...)
    if encoding != "latin1":
        raise pickle.UnpicklingError(f"_codecs.encode with encoding {encoding!r}")
    return text.encode("latin1")


class _Storage:
    """A storage class named in a tensor's persistent id (``torch.LongStorage``, ...); never called."""


_ALLOWED = {
    ("torch._utils", "_rebuild_tensor_v2"): _tensor,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("_codecs", "encode"): _latin1_bytes,
    **{(module, name): value for module in ("builtins", "__builtin__")
       for name, value in (("set", set), ("frozenset", frozenset), ("complex", complex))},
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module == "torch" and name.endswith("Storage"):
            return _Storage
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise _UnsupportedGlobal(f"{module}.{name}") from None

    def persistent_load(self, pid):
        return None   # a tensor's storage: its bytes are not read


def load_torch_file(path: str | Path) -> object:
    """What the ``torch.save`` file ``path`` holds (tensors as :class:`TensorShape`, unless torch read the file). A
    file that is not one, or that holds objects other than tensors, numbers, text and containers of them (a numpy
    array, a class of the program that saved it), is a DataError naming it."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = [n for n in archive.namelist() if n.count("/") <= 1 and n.rsplit("/", 1)[-1] == "data.pkl"]
            if not pickles:
                raise DataError(f"{path}: a zip archive without data.pkl, not a torch.save file")
            with archive.open(pickles[0]) as fh:
                return _Unpickler(fh).load()
    except _UnsupportedGlobal as exc:
        return _torch_load(path, str(exc))
    except (DataError, OSError):
        raise
    except zipfile.BadZipFile as exc:
        raise DataError(f"{path}: not a torch.save file (a zip archive): {exc}") from None
    except Exception as exc:  # noqa: BLE001 - a broken pickle raises many types
        raise DataError(f"{path}: cannot read the torch.save file: {type(exc).__name__}: {exc}") from None


def _torch_load(path: Path, name: str):
    try:
        import torch
    except ImportError:
        raise DataError(f"{path}: holds {name}, which only torch reads; install torch to read it") from None
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        raise DataError(f"{path}: holds {found.group(1) if found else name}, which is not read: only tensors, "
                        f"numbers, text and lists or dicts of them are (torch.load(weights_only=True)), as "
                        f"anything else could run code of the file") from None
    except OSError:
        raise
    except Exception as exc:  # noqa: BLE001 - torch raises many types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{path}: cannot read the torch.save file: {first}") from None
