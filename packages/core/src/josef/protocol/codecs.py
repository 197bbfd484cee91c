"""Compression codecs of Kafka record batches (attributes bits 0-2).

Only used where records must be read (ListOffsets by timestamp, the metadata
log, josef's client, tests): the broker's produce and fetch paths keep
batches compressed as the producer sent them.
"""

from __future__ import annotations

import enum
import gzip
import struct

import cramjam
import lz4.frame
import zstandard


class Compression(enum.IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @classmethod
    def from_name(cls, name: str) -> Compression:
        return {"none": cls.NONE, "uncompressed": cls.NONE, "gzip": cls.GZIP, "snappy": cls.SNAPPY,
                "lz4": cls.LZ4, "zstd": cls.ZSTD}[name]


_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024


def compress(codec: Compression, data: bytes) -> bytes:
    if codec is Compression.NONE:
        return data
    if codec is Compression.GZIP:
        return gzip.compress(data, compresslevel=6)
    if codec is Compression.SNAPPY:
        # xerial framing, as the Java client writes it and every client reads it.
        out = bytearray(_XERIAL_HEADER)
        for start in range(0, len(data), _XERIAL_BLOCK):
            block = bytes(cramjam.snappy.compress_raw(data[start : start + _XERIAL_BLOCK]))
            out += struct.pack(">i", len(block)) + block
        return bytes(out)
    if codec is Compression.LZ4:
        return lz4.frame.compress(data)
    if codec is Compression.ZSTD:
        return zstandard.ZstdCompressor(level=3).compress(data)
    raise ValueError(f"unknown compression codec {codec}")


def decompress(codec: int, data: bytes) -> bytes:
    if codec == Compression.NONE:
        return data
    if codec == Compression.GZIP:
        return gzip.decompress(data)
    if codec == Compression.SNAPPY:
        if data[:8] == _XERIAL_MAGIC:
            out = bytearray()
            pos = 16
            while pos < len(data):
                (size,) = struct.unpack_from(">i", data, pos)
                out += bytes(cramjam.snappy.decompress_raw(data[pos + 4 : pos + 4 + size]))
                pos += 4 + size
            return bytes(out)
        return bytes(cramjam.snappy.decompress_raw(data))
    if codec == Compression.LZ4:
        return lz4.frame.decompress(data)
    if codec == Compression.ZSTD:
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    raise ValueError(f"unknown compression codec {codec}")
