"""A minimal PNG encoder for 8-bit RGB: one fixed "Up" row filter (a numpy subtraction) compresses these smooth
renders as well as Pillow's per-row filter search, the generator's slowest step, in under half the time.
"""

import struct
import zlib

import numpy as np

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_FILTER_UP = 2


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def encode_png(rgb: np.ndarray, level: int = 3) -> bytes:
    """PNG bytes of an (H, W, 3) uint8 array."""
    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    if rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"expected an (H, W, 3) uint8 array, got shape {rgb.shape}")
    height, width, _ = rgb.shape
    rows = rgb.reshape(height, width * 3)
    scanlines = np.empty((height, width * 3 + 1), dtype=np.uint8)
    scanlines[:, 0] = _FILTER_UP
    scanlines[0, 1:] = rows[0]
    np.subtract(rows[1:], rows[:-1], out=scanlines[1:, 1:])  # uint8 arithmetic wraps modulo 256, as PNG wants
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit truecolour, no interlace
    return (
        _SIGNATURE
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(scanlines.tobytes(), level))
        + _chunk(b"IEND", b"")
    )
