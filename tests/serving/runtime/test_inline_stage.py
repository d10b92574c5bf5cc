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


def test_a_cheap_stage_canary_may_hand_its_row_on(synth_opt, request_rows, monkeypatch):
    """A replica's health check runs one sample row through its stage. A first stage that is
    unsure of that row hands it on (its probability NaN, the row in ``unsure`` with its blocks):
    healthy, not a stage that cannot compute (adult's cheap stage failed every health check and
    never started when it had a deployment of its own). A stage that answers NaN without handing
    the row on still fails."""
    import numpy as np
    import pytest

    from serving.core.specs import StageSpec
    from serving.runtime.stage_runner import StageRunner

    unsure = synth_opt.run_levels(request_rows, 0, 0).unsure
    assert unsure.size, "the synthetic cascade is unsure of some rows at its first level"
    monkeypatch.setattr(synth_opt, "sample_rows_", request_rows.iloc[unsure[:1]].reset_index(drop=True))
    cheap = StageRunner(synth_opt, StageSpec("cheap", 0, 0))
    assert cheap.canary()["canary"] == "ok (handed on to the next stage)"
    last = len(synth_opt.levels) - 1
    assert StageRunner(synth_opt, StageSpec("expensive", 1, last)).canary()["canary"] == "ok"
    broken = StageRunner(synth_opt, StageSpec("cheap", 0, 0))
    monkeypatch.setattr(broken, "run", lambda rows, blocks=None: {"proba": np.full((1, 2), np.nan),
                                                                  "unsure": np.zeros(0, dtype=int), "blocks": None})
    with pytest.raises(RuntimeError, match="not one probability row"):
        broken.canary()
