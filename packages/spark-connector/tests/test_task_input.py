"""TaskInput: an input the executor cut short is told from a complete one (a socket pair stands for the JVM's)."""

import fcntl
import os
import socket

from josef_spark.task_input import TaskInput


def test_a_connection_at_end_of_file_or_closed_is_an_input_cut_short():
    worker, jvm = socket.socketpair()
    with worker, jvm:
        task_input = TaskInput((worker.fileno(),))
        assert not task_input.cut_short()  # open, nothing sent: the JVM waits for the task's result
        jvm.sendall(b"\xff\xff\xff\xfc")
        assert not task_input.cut_short()  # what follows a complete input (END_OF_STREAM), not read yet
        assert worker.recv(4) == b"\xff\xff\xff\xfc"
        jvm.shutdown(socket.SHUT_WR)  # what the JVM does when it cannot produce the rest
        assert task_input.cut_short()
        assert not fcntl.fcntl(worker.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK  # the worker's socket is untouched
    other, peer = socket.socketpair()
    with other:
        peer.close()  # what the kernel does when the JVM dies
        assert TaskInput((other.fileno(),)).cut_short()


def test_outside_a_spark_task_there_is_no_input_to_check():
    assert TaskInput.of_this_task() is None
