"""The stage calls this process cancelled, by Serve's request id and replica.

Serve tells a request router of every call's end through ``on_request_completed(replica,
internal_request_id)``, answered or not. Over Serve's gRPC transport (the one ``deploy``'s apps
use) cancelling a call ends it at once on the caller's side, also on a replica that is frozen
and answers nothing. The capacity router (:mod:`serving.runtime.routing`) reads an end as a word
from the replica: read so, the copy of a call on a silent replica, once it answers and its first
call is cancelled, made the silent replica look alive again and stretched its bound by the
"gap" since its last answer, so the next call sent there waited out the freeze (measured:
one cancel on a SIGSTOPped replica set its gap from 0.015 to 1.52 s and cleared its silence).
The caller notes each call it cancels here first; the router takes the note and books the end
as no answer.

A call is known by Serve's internal request id: a call made from the ingress's coalescer (every
stage call of ``/predict``) gets one of its own, while calls made in a request's context (top-K's,
the monitor's) share the request's. Where the cancelled call was sent (a replica accepted it) its
replica's actor tells it apart; where it still waits for a replica to accept it (a frozen replica
never does, and Serve's router has picked it by then), the next end of that id at any replica but
the one whose copy answered is taken for it. Notes are not scoped to a deployment: with a
shared id, a later stage's answer could be taken for a cancelled call of another stage (that
replica's answer then goes uncounted; rare, and no worse than before). Both are read from
Serve's ``DeploymentResponse`` (``_request_metadata`` and the ``_actor_id`` of its
``_replica_result``: private names, checked against Serve in
tests/serving/runtime/test_cancelled_calls.py), or from a wrapper that holds one as
``response`` (a node pool's response, :mod:`serving.runtime.pools`). The router may run on a
thread of its own (Serve's ray transport), so the notes are kept under a lock. Plain Python, no
Ray.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

#: request ids kept at most (oldest dropped first): a note whose end never reaches a router here
#: (a call cancelled before Serve picked its replica) is never taken
MAX_NOTES = 4096
#: notes kept per request id (its stage calls cancelled and not ended yet)
MAX_PER_REQUEST = 64


@dataclass(frozen=True)
class _Note:
    actor: str | None  # the cancelled call's replica's actor, where it was sent
    not_actor: str | None  # else: the actor whose copy answered (its end is that answer)


_notes: dict[str, list[_Note]] = {}
_lock = threading.Lock()


def _serve_response(response: Any) -> Any:
    for _ in range(4):  # a wrapper of a wrapper at most
        inner = getattr(response, "response", None)
        if inner is None:
            break
        response = inner
    return response


def request_id(response: Any) -> str | None:
    """Serve's internal request id of a handle call's ``response`` (None where not Serve's)."""
    found = getattr(getattr(_serve_response(response), "_request_metadata", None), "internal_request_id", None)
    return found if isinstance(found, str) else None


def actor(response: Any) -> str | None:
    """The actor id (hex) of the replica ``response``'s call was sent to (None: not sent yet)."""
    found = getattr(getattr(_serve_response(response), "_replica_result", None), "_actor_id", None)
    to_hex = getattr(found, "hex", None)
    return str(to_hex()) if callable(to_hex) else None


def note(response: Any, answered_by: Any = None) -> None:
    """``response``'s call is being cancelled by this process: its end is not an answer.
    ``answered_by``: the response of its copy that answered, if one did."""
    key = request_id(response)
    if key is None:
        return
    sent_to = actor(response)
    entry = _Note(sent_to, None if sent_to is not None or answered_by is None else actor(answered_by))
    with _lock:
        entries = _notes.setdefault(key, [])
        entries.append(entry)
        del entries[:-MAX_PER_REQUEST]
        while len(_notes) > MAX_NOTES:
            _notes.pop(next(iter(_notes)), None)


def take(internal_request_id: str, actor_hex: str) -> bool:
    """Whether the call that ended (Serve's request id, its replica's actor) was one this
    process cancelled; the note is used up."""
    with _lock:
        entries = _notes.get(internal_request_id)
        if not entries:
            return False
        for i, entry in enumerate(entries):
            if entry.actor == actor_hex or (entry.actor is None and entry.not_actor != actor_hex):
                del entries[i]
                if not entries:
                    _notes.pop(internal_request_id, None)
                return True
        return False
