"""Reading a GGUF checkpoint: metadata, tensor index, and single tensors as float32 arrays.

GGUF (llama.cpp's format) is one file: a header of typed key/value metadata (architecture,
shapes, tokenizer vocabulary and merges, chat template), an index of tensors (name, shape,
type, offset) and the tensor data. The file is memory-mapped and a tensor is decoded only when
asked for, so a pipeline stage reads only its own layers.

The `gguf` package's `GGUFReader` builds a Python object per array element, which takes ~9 s
on SmolLM2's 49k-token vocabulary; this reader parses the header itself (well under a second)
and leaves dequantisation (Q4_1, Q8_0, K-quants, ...) to `gguf.quants`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from coral.errors import CoralError

GGUF_MAGIC = b"GGUF"
#: Versions whose layout this reader knows (v1 used 32-bit counts and is long gone).
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# GGUF metadata value types (gguf spec, `gguf_metadata_value_type`).
_SCALARS: dict[int, str] = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4",
                            6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8", 12: "<f8"}
_BOOL, _STRING, _ARRAY = 7, 8, 9


class GgufError(CoralError, ValueError):
    """The file is not a GGUF checkpoint this runtime can read."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # GGUF order: the fastest-varying (row) dimension first
    ggml_type: int  # gguf.GGMLQuantizationType value
    offset_bytes: int  # from the start of the file

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy (row-major) shape: GGUF's dims reversed, e.g. (out_features, in_features)."""
        return tuple(reversed(self.dims))


class _Cursor:
    def __init__(self, buf: memoryview, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise GgufError(f"{self.path}: truncated header at byte {self.pos}")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.take("<Q")
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item_type, count = self.take("<I"), self.take("<Q")
            if item_type in _SCALARS:  # one numpy view, no per-element objects
                dtype = np.dtype(_SCALARS[item_type])
                arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos)
                self.pos += dtype.itemsize * count
                return arr.astype(bool) if item_type == _BOOL else arr
            return [self.value(item_type) for _ in range(count)]
        if vtype in _SCALARS:
            dtype = np.dtype(_SCALARS[vtype])
            (value,) = np.frombuffer(self.buf, dtype=dtype, count=1, offset=self.pos)
            self.pos += dtype.itemsize
            return bool(value) if vtype == _BOOL else value.item()
        raise GgufError(f"{self.path}: unknown metadata value type {vtype} at byte {self.pos}")


class GgufFile:
    """One GGUF file: `metadata` (key -> value) and `tensors` (name -> `TensorInfo`)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise GgufError(f"GGUF file {self.path} does not exist")
        self._data = np.memmap(self.path, dtype=np.uint8, mode="r")
        cur = _Cursor(memoryview(self._data), self.path)
        if bytes(self._data[:4]) != GGUF_MAGIC:
            raise GgufError(f"{self.path} is not a GGUF file (it does not start with 'GGUF')")
        cur.pos = 4
        self.version = cur.take("<I")
        if self.version not in SUPPORTED_VERSIONS:
            raise GgufError(f"{self.path}: GGUF version {self.version} is not supported "
                            f"(supported: {SUPPORTED_VERSIONS})")
        n_tensors, n_kv = cur.take("<Q"), cur.take("<Q")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            self.metadata[key] = cur.value(cur.take("<I"))
        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            dims = tuple(cur.take("<Q") for _ in range(cur.take("<I")))
            infos.append((name, dims, cur.take("<I"), cur.take("<Q")))
        align = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        data_start = -(-cur.pos // align) * align
        self.tensors = {name: TensorInfo(name, dims, t, data_start + off)
                        for name, dims, t, off in infos}
        self._decoded: dict[str, np.ndarray] = {}

    # ---- metadata ----
    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise GgufError(f"{self.path}: metadata key '{key}' is missing")
        return self.metadata[key]

    @property
    def architecture(self) -> str:
        return str(self.require("general.architecture"))

    def arch_key(self, suffix: str) -> str:
        return f"{self.architecture}.{suffix}"

    # ---- tensors ----
    def tensor(self, name: str) -> np.ndarray:
        """The tensor as a float32 array in numpy shape (dequantised if quantised).

        Decoded tensors are kept: stages built again in this process (data-parallel nodes of
        one pipeline, tests) share them instead of decoding again. The array is read-only.
        """
        if name not in self._decoded:
            out = self._decode(name)
            out.flags.writeable = False
            self._decoded[name] = out
        return self._decoded[name]

    def _decode(self, name: str) -> np.ndarray:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
        from gguf.quants import dequantize

        info = self.tensors.get(name)
        if info is None:
            raise GgufError(f"{self.path}: no tensor named '{name}'")
        qtype = GGMLQuantizationType(info.ggml_type)
        block, type_bytes = GGML_QUANT_SIZES[qtype]
        rows = int(np.prod(info.shape[:-1], dtype=np.int64))
        cols = info.dims[0]
        if cols % block:
            raise GgufError(f"{self.path}: tensor '{name}' row of {cols} values is not a "
                            f"multiple of the {qtype.name} block ({block})")
        row_bytes = cols // block * type_bytes
        raw = np.asarray(self._data[info.offset_bytes:info.offset_bytes + rows * row_bytes])
        if qtype == GGMLQuantizationType.F32:
            out = raw.view(np.float32).copy()
        elif qtype == GGMLQuantizationType.F16:
            out = raw.view(np.float16).astype(np.float32)
        else:  # block formats (Q4_1, Q8_0, K-quants, ...): the gguf package's decoders
            out = dequantize(raw.reshape(rows, row_bytes), qtype).astype(np.float32, copy=False)
        return out.reshape(info.shape)


@lru_cache(maxsize=4)
def open_gguf(path: str) -> GgufFile:
    """A parsed GGUF file, parsed once per process and path."""
    return GgufFile(path)
