"""PNG checks shared by the picture tests: header, dimensions from the IHDR chunk, size."""
from __future__ import annotations

import struct
from pathlib import Path

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path) -> tuple[int, int]:
    """(width, height) of a PNG file; asserts the signature and the IHDR chunk."""
    data = Path(path).read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    return struct.unpack(">II", data[16:24])


def assert_picture(path, *, min_kib: float = 15, min_w: int = 500, min_h: int = 300):
    w, h = png_size(path)
    size_kib = Path(path).stat().st_size / 1024
    assert w >= min_w and h >= min_h, (w, h)
    assert w <= 4000 and h <= 4000, (w, h)
    assert size_kib >= min_kib, size_kib
    return w, h
