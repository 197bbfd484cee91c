"""Whether a task's input reached its end, or was cut short by the executor.

A Python data source writer gets its rows from the executor's JVM over a
socket, as an Arrow stream that the JVM ends with Arrow's end-of-stream
marker. When the JVM cannot produce the rows (an exception upstream: it
shuts its side of the socket down) or dies (SIGKILL, a lost container: the
kernel closes the socket), the stream ends without the marker, and pyarrow,
so pyspark, takes an end of file between two batches for the end of the
stream: the writer sees fewer rows and no error. An exactly-once writer
must not commit such a partition: its progress record would make the
task's next attempt skip the rows that never came.

After a complete input the JVM keeps the socket open (it waits for the
task's result, then reuses the worker); after a cut-short one the socket is
at end of file. So a writer notes the task's connections to the JVM when it
starts (the connected sockets the Python worker holds before the writer
opens its own) and, before committing, peeks at them: an end of file, or a
reset, means the input was cut short.
"""

from __future__ import annotations

import os
import socket
import stat

import attrs
from pyspark import TaskContext

#: The open file descriptors of this process (Linux's /proc/self/fd, also on macOS and the BSDs).
FD_DIRECTORY = "/dev/fd"


class InputCutShort(RuntimeError):
    """The executor closed the task's input before its end: the rows are not committed, so the next attempt writes them."""


@attrs.frozen
class TaskInput:
    """The connections to the executor of the Spark task this Python worker runs."""

    fds: tuple[int, ...]

    @classmethod
    def of_this_task(cls) -> TaskInput | None:
        """This worker's connections to its executor; call it before opening any. None outside a Spark task."""
        if TaskContext.get() is None:
            return None
        try:
            fds = tuple(fd for fd in sorted(int(name) for name in os.listdir(FD_DIRECTORY)) if _connected(fd))
        except OSError:
            return None  # no listing of open files here: the input cannot be checked
        return cls(fds) if fds else None

    def cut_short(self) -> bool:
        """Whether the executor shut down its side of a connection, or reset it: the input ended early."""
        for fd in self.fds:
            try:
                peer = socket.socket(fileno=os.dup(fd))
            except OSError:
                return True  # the worker closed it: no task is being served on it
            with peer:  # closes the duplicate only
                try:
                    if peer.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                        return True
                except BlockingIOError:
                    continue  # open, nothing to read yet: the JVM waits for the task's result
                except OSError:
                    return True
        return False


def _connected(fd: int) -> bool:
    """Whether ``fd`` is a connected stream socket (the listing's own descriptor is gone by now)."""
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            return False
        with socket.socket(fileno=os.dup(fd)) as sock:
            if sock.type != socket.SOCK_STREAM:
                return False
            sock.getpeername()
    except OSError:
        return False
    return True
