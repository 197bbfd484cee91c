"""Raw byte mutations of captured traffic: real clients' request frames, flipped, cut, spliced and resized.

The structured strategies (:mod:`josef.testing.fuzz.requests`) break
requests where the schema says; these break them anywhere, starting from
what real clients send (a produce session's batches, a group's JoinGroup
metadata, an admin client's CreateTopics), so the frame readers, the header
parser and the hand-written codecs of Produce and Fetch see the bytes no
schema would write: a size prefix that lies, a frame cut in two, two frames
spliced, a bit flipped in a record batch's CRC or in an array's count.
"""

from __future__ import annotations

import struct
from typing import Any, Callable, Sequence

import attrs
from hypothesis import strategies as st

#: Sizes a rewritten size prefix takes: empty, tiny, negative, just over the default socket.request.max.bytes, huge.
_SIZES = (0, 1, 3, 7, -1, -(2**31), 100 * 1024 * 1024 + 1, 2**31 - 1, 0x16030100)
_BYTES = (0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF)
_INTS = {2: (0, -1, 0x7FFF, -0x8000), 4: (0, -1, 0x7FFFFFFF, -0x80000000, 1 << 20)}


@attrs.frozen
class RawInput:
    """Bytes written to a fresh connection (which is then half-closed), and how they were made."""

    data: bytes
    #: The mutations applied, for the report and to replay a finding.
    how: str


def split_frames(data: bytes | bytearray) -> tuple[list[bytes], bytes]:
    """The whole size-prefixed frames at the start of ``data`` (prefixes included), and what is left after them."""
    frames = []
    pos = 0
    while len(data) - pos >= 4:
        (size,) = struct.unpack_from(">i", data, pos)
        if size < 0 or len(data) - pos - 4 < size:
            break
        frames.append(bytes(data[pos:pos + 4 + size]))
        pos += 4 + size
    return frames, bytes(data[pos:])


def _at(draw: Callable[..., Any], length: int) -> int:
    """A position in ``length`` bytes (drawn independently of the length, which keeps the draws stable)."""
    return draw(st.integers(0, 2**20)) % max(length, 1)


@st.composite
def mutated_traffic(draw: Callable[..., Any], corpus: Sequence[bytes], max_mutations: int = 4) -> RawInput:
    """One to three frames of ``corpus`` (captured requests, size prefixes included), mutated one to
    ``max_mutations`` times."""
    frames = [draw(st.sampled_from(corpus)) for _ in range(draw(st.integers(1, 3)))]
    starts = []
    data = bytearray()
    for frame in frames:
        starts.append(len(data))
        data += frame
    done = []
    for _ in range(draw(st.integers(1, max_mutations))):
        op = draw(st.sampled_from(("flip", "byte", "int", "cut", "delete", "insert", "splice", "resize",
                                   "duplicate")))
        if op == "flip":
            pos = _at(draw, len(data))
            bit = draw(st.integers(0, 7))
            if data:
                data[pos] ^= 1 << bit
            done.append(f"flip bit {bit} at {pos}")
        elif op == "byte":
            pos = _at(draw, len(data))
            value = draw(st.sampled_from(_BYTES))
            if data:
                data[pos] = value
            done.append(f"byte {value:#x} at {pos}")
        elif op == "int":
            width = draw(st.sampled_from((2, 4)))
            pos = _at(draw, len(data) - width + 1)
            value = draw(st.sampled_from(_INTS[width]))
            if len(data) >= width:
                data[pos:pos + width] = struct.pack(">h" if width == 2 else ">i", value)
            done.append(f"int{width * 8} {value} at {pos}")
        elif op == "cut":
            pos = _at(draw, len(data))
            del data[pos:]
            done.append(f"cut at {pos}")
        elif op == "delete":
            pos = _at(draw, len(data))
            n = draw(st.integers(1, 64))
            del data[pos:pos + n]
            done.append(f"delete {n} at {pos}")
        elif op == "insert":
            pos = _at(draw, len(data))
            extra = draw(st.binary(min_size=1, max_size=32))
            data[pos:pos] = extra
            done.append(f"insert {len(extra)} at {pos}")
        elif op == "splice":
            other = draw(st.sampled_from(corpus))
            pos = _at(draw, len(data))
            start = _at(draw, len(other))
            n = draw(st.integers(1, 256))
            data[pos:pos + n] = other[start:start + n]
            done.append(f"splice {n} from another frame at {pos}")
        elif op == "resize":
            index = draw(st.integers(0, len(starts) - 1))
            pos = starts[index]
            if draw(st.booleans()):
                size = draw(st.sampled_from(_SIZES))
            else:
                old = struct.unpack_from(">i", data, pos)[0] if len(data) >= pos + 4 else 0
                size = old + draw(st.sampled_from((-1, 1, -4, 4, -100, 100)))
            if len(data) >= pos + 4:
                data[pos:pos + 4] = struct.pack(">i", max(-(2**31), min(size, 2**31 - 1)))
            done.append(f"size of frame {index} set to {size}")
        else:
            pos = _at(draw, len(data))
            n = draw(st.integers(1, 128))
            data[pos:pos] = data[pos:pos + n]
            done.append(f"duplicate {n} at {pos}")
    return RawInput(bytes(data), f"{len(frames)} captured frame(s): " + "; ".join(done))
