"""Compression bombs: a body that inflates to gigabytes, made from a few megabytes, lazily.

``bomb(encoding, prefix, total)`` yields a gzip (RFC 1952) or deflate (zlib, RFC 1950) stream that
decompresses to ``prefix`` followed by spaces up to ``total`` bytes (JSON whitespace, and a
Prometheus text comment when ``prefix`` is ``#``). One MiB of spaces is compressed once and
closed with a full flush (zlib's Z_FULL_FLUSH: byte-aligned, the dictionary reset), so the same
bytes repeat for every MiB; the trailer carries the real check value and length. 2 GB inflate
from about 2 MB, generated in about 2 s (the check value), not the half minute a compressor takes.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator

MiB = 1024 * 1024
_BLOCK = b" " * MiB


def bomb(encoding: str, prefix: bytes, total: int) -> Iterator[bytes]:
    if encoding not in ("gzip", "deflate"):
        raise ValueError(encoding)
    wbits = 31 if encoding == "gzip" else 15
    c = zlib.compressobj(9, zlib.DEFLATED, wbits)
    head = c.compress(prefix) + c.flush(zlib.Z_FULL_FLUSH)
    segment = c.compress(_BLOCK) + c.flush(zlib.Z_FULL_FLUSH)
    check = zlib.crc32(prefix) if encoding == "gzip" else zlib.adler32(prefix)
    blocks = max(0, (total - len(prefix)) // MiB)
    yield head
    for _ in range(blocks):
        check = zlib.crc32(_BLOCK, check) if encoding == "gzip" else zlib.adler32(_BLOCK, check)
        yield segment
    # The final block: an empty one with BFINAL set (what flush() ends a stream with), then the trailer.
    end = zlib.compressobj(9, zlib.DEFLATED, -15).flush()
    size = len(prefix) + blocks * MiB
    if encoding == "gzip":
        yield end + struct.pack("<II", check & 0xFFFFFFFF, size & 0xFFFFFFFF)
    else:
        yield end + struct.pack(">I", check & 0xFFFFFFFF)
