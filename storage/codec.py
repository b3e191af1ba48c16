"""Packing of token arrays into bytes: int32 ids, uint8 loss masks, float32 log-probs.

Packed bytea beats Postgres int[] on write throughput (see benchmarks/storage_throughput.py)
and is identical on SQLite, so one code path serves both databases.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np


def pack_ids(ids: Sequence[int]) -> bytes:
    return array("i", ids).tobytes()


def unpack_ids(data: bytes | None) -> tuple[int, ...]:
    if not data:
        return ()
    return tuple(np.frombuffer(data, dtype="<i4").tolist())


def pack_mask(mask: Sequence[int]) -> bytes:
    return bytes(mask)


def unpack_mask(data: bytes | None) -> tuple[int, ...]:
    return tuple(data) if data else ()


def pack_floats(values: Sequence[float]) -> bytes:
    return array("f", values).tobytes()


def unpack_floats(data: bytes | None) -> tuple[float, ...]:
    if not data:
        return ()
    return tuple(np.frombuffer(data, dtype="<f4").astype(np.float64).tolist())
