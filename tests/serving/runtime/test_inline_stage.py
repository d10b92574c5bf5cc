"""An inline stage (serving.runtime.stage_runner.serial_when_inline) computes its feature groups
on its replica's event loop, one after another."""

from __future__ import annotations


def test_an_inline_stage_computes_its_groups_one_after_another():
    """The artifact's one-thread-per-group choice (an in-process timing) is dropped where the
    stage runs inline on the replica's event loop, and kept where it runs in threads."""
    import types

    from serving.runtime.stage_runner import serial_when_inline

    opt = types.SimpleNamespace(workers=4)
    assert serial_when_inline(opt, inline=False) == [] and opt.workers == 4
    notes = serial_when_inline(opt, inline=True)
    assert opt.workers == 1 and "4 threads" in notes[0]
    assert serial_when_inline(opt, inline=True) == []  # already serial: nothing to say
