"""Event ids: UUIDv7, unique, time-ordered within a process, distinct across a fork."""

from __future__ import annotations

import os
import time
import uuid

from cardbus.eventstore import id_time, new_id


def test_ids_are_uuid7_unique_and_sorted() -> None:
    ids = [new_id() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    parsed = uuid.UUID(ids[0])
    assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122)
    assert abs(id_time(ids[-1]) - time.time()) < 5


def test_a_forked_child_does_not_repeat_the_parents_ids() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report ids, then leave without running pytest's cleanup
        os.write(write, ",".join(new_id() for _ in range(50)).encode())
        os._exit(0)
    os.close(write)
    parent = {new_id() for _ in range(50)}
    os.waitpid(pid, 0)
    child = set(os.read(read, 1 << 16).decode().split(","))
    os.close(read)
    assert len(child) == 50
    assert not parent & child
    # the random tails differ too, not only the counters
    assert not {i[-12:] for i in parent} & {i[-12:] for i in child}
