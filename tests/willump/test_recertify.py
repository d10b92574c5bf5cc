"""opt.recertify(X, y): the certified plan bounded again on fresh labelled rows, plan unchanged;
every gear judged jointly; the new certificate saved and served; a shift that breaks the plan is
refused; bad arguments name themselves."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

import willump
from tests.willump import synth
from tests.willump.synth import make_rows, quiet, three_groups


@pytest.fixture(scope="module")
def certified():
    synth.SLEEPING = False
    try:
        X, y = make_rows(3000, seed=8)
        opt = willump.optimize(three_groups, LogisticRegression(), X, y, max_loss=0.02, gears=(0.05,),
                               **quiet(three_groups))
    finally:
        synth.SLEEPING = True
    assert opt.report().plan == "cascade" and len(opt.gears_) == 2
    return opt


def test_fresh_rows_from_the_same_distribution_re_certify_the_plan(certified, tmp_path, monkeypatch):
    monkeypatch.setattr(synth, "SLEEPING", False)
    X, y = make_rows(4000, seed=99)
    result = certified.recertify(X, y)
    assert result.certified and [g.gear for g in result.gears] == [0, 1]
    for gear, r in zip(certified.gears_, result.gears, strict=True):
        assert r.rows == 4000 and r.loss_bound <= gear.max_loss and r.method
        served = certified.gear(r.gear).predict(X)
        assert r.disagreed == int(np.sum(served != certified.baseline.predict(X)))  # recounted independently
        assert r.calibration is not None
    new = result.pipeline()
    assert new.gears_[0].loss_bound == result.gears[0].loss_bound and new.gears_[0].cert_rows == 4000
    assert certified.gears_[0].cert_rows != 4000  # the original is left as it was
    assert "re-certified on 4000 fresh rows" in " ".join(new.report().notes)
    np.testing.assert_array_equal(new.predict(X.iloc[:200]), certified.predict(X.iloc[:200]))  # plan unchanged
    new.save(tmp_path / "recertified")
    loaded = willump.load(tmp_path / "recertified")
    assert (loaded.gears_[0].loss_bound, loaded.gears_[0].cert_rows) == (result.gears[0].loss_bound, 4000)
    assert loaded.report().loss_bound == result.gears[0].loss_bound


def test_a_shift_that_breaks_the_plan_is_not_re_certified(certified, monkeypatch):
    """Rows where the label follows b, not a (the cheap level reads a only): the cheap level's
    answers lose accuracy against the full pipeline, so no new certificate is given."""
    monkeypatch.setattr(synth, "SLEEPING", False)
    X, y = make_rows(4000, seed=5, weights=(0.3, 3.0, 0.3))
    result = certified.recertify(X, y)
    assert not result.certified and result.gears[0].loss_bound > certified.gears_[0].max_loss
    with pytest.raises(ValueError, match="not re-certified"):
        result.pipeline()
    assert result.to_dict()["certified"] is False


def test_bad_arguments_name_themselves(certified, monkeypatch):
    monkeypatch.setattr(synth, "SLEEPING", False)
    X, y = make_rows(100, seed=1)
    with pytest.raises(ValueError, match="one label per row"):
        certified.recertify(X, y[:50])
    with pytest.raises(ValueError, match="not classes of the plan"):
        certified.recertify(X, np.full(100, 7))
    with pytest.raises(ValueError, match="confidence"):
        certified.recertify(X, y, confidence=1.0)


def test_the_command_line_writes_the_new_artifact_only_when_the_plan_holds(certified, tmp_path, monkeypatch, capsys):
    from serving.cli import main

    monkeypatch.setattr(synth, "SLEEPING", False)
    certified.save(art := tmp_path / "plan")
    X, y = make_rows(4000, seed=99)
    X.assign(label=y).to_csv(fresh := tmp_path / "fresh.csv", index=False)
    assert main(["recertify", str(art), "--labels", str(fresh), "-o", str(out := tmp_path / "new")]) == 0
    assert "gear 0:" in capsys.readouterr().out and willump.load(out).gears_[0].cert_rows == 4000
    Xs, ys = make_rows(4000, seed=5, weights=(0.3, 3.0, 0.3))
    Xs.assign(label=ys).to_csv(shifted := tmp_path / "shifted.csv", index=False)
    assert main(["recertify", str(art), "--labels", str(shifted), "-o", str(tmp_path / "no"), "--json"]) == 4
    assert not (tmp_path / "no").exists() and '"certified": false' in capsys.readouterr().out
    assert main(["recertify", str(art), "--labels", str(fresh), "--label-column", "nope"]) == 1
    assert "--label-column 'nope'" in capsys.readouterr().err
