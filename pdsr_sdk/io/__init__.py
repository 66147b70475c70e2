"""Reading and writing tables: atomic writes, streamed record batches, ragged columns and their padding; and what
``pdsr rollout`` and ``pdsr score`` share about their output: the settings check of a ``--resume``
(:mod:`pdsr_sdk.io.resume_check`) and the lock held while one run writes it (:mod:`pdsr_sdk.io.output_lock`).

The names load on first use (pyarrow is imported then, not with the package).
"""

from __future__ import annotations

from pdsr_sdk.lazy import lazy_attributes as _lazy_attributes

_LAZY = {name: "pdsr_sdk.io.tables" for name in (
    "atomic_path", "check_writable", "iter_rows_as_lists", "list_column_to_numpy", "numpy_to_list_array",
    "padded_to_ragged", "ragged_to_padded", "read_table", "write_png", "write_table_atomic", "write_text_atomic",
)}

_LAZY["pad_rows"] = "pdsr_sdk.io.padding"

__all__ = sorted(_LAZY)

__getattr__, __dir__ = _lazy_attributes(__name__, _LAZY)
