"""GGUF block access shared by the decoders of gguf_loader.py and gguf_lowbit.py."""
from __future__ import annotations

import numpy as np


class Blocks:
    """The blocks of N rows of one tensor: b uint8 [N, nb, bytes per block]; name for errors."""

    def __init__(self, b: np.ndarray, name: str, head: np.ndarray = None):
        self.b, self.name, self.head = b, name, head   # head: uint8 [N, bytes] before each row's blocks (ik's types)

    def row_scale(self, dtype: type) -> np.ndarray:
        """The scale at the start of every row (fp16 or float32) as float32 [N, 1]; NaN / inf raise."""
        v = np.ascontiguousarray(self.head).view(np.dtype(dtype).newbyteorder("<"))[:, :1].astype(np.float32)
        bad = ~np.isfinite(v[:, 0])
        if bad.any():
            r = int(np.nonzero(bad)[0][0])
            raise ValueError(f"tensor {self.name}: row {r} has a non-finite row scale ({v[r, 0]}); the file is corrupted")
        return v

    def finite(self, v: np.ndarray, what: str) -> np.ndarray:
        """v (float32 [N, nb], one field per block) after checking it is finite (ValueError naming the block)."""
        bad = ~np.isfinite(v)
        if bad.any():
            r, blk = (int(i[0]) for i in np.nonzero(bad))
            raise ValueError(f"tensor {self.name}: block {blk} of row {r} has a non-finite {what} ({v[r, blk]}); "
                             "the file is corrupted")
        return v

    def f16(self, off: int, what: str = "d") -> np.ndarray:
        """The fp16 field at byte ``off`` of every block as float32 [N, nb]; NaN / inf raise."""
        v = np.ascontiguousarray(self.b[..., off:off + 2]).view(np.float16)[..., 0].astype(np.float32)
        return self.finite(v, what)

    def words(self, off: int, n: int, dtype: type) -> np.ndarray:
        """n little-endian words of ``dtype`` (uint16 / uint32) from byte ``off`` of every block: [N, nb, n]."""
        size = np.dtype(dtype).itemsize
        return np.ascontiguousarray(self.b[..., off:off + n * size]).view(np.dtype(dtype).newbyteorder("<"))

    def nibbles(self, off: int, n: int) -> np.ndarray:
        """Bytes [off, off + n) as 2n 4-bit codes: low nibbles first, then high (uint8 [N, nb, 2n])."""
        q = self.b[..., off:off + n]
        return np.concatenate([q & 15, q >> 4], axis=-1)


def rows(q: np.ndarray) -> np.ndarray:
    """[N, nb, ...] -> [N, K]."""
    return np.ascontiguousarray(q.reshape(q.shape[0], -1))
