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
    # a config whose app has no room for a replica beside the plan's: the hand-over is no surge
    import yaml

    app = {"name": "plan", "import_path": "serving.launch.graph:app_builder", "args": {"surge_percent": 0}}
    (config := tmp_path / "serve.yaml").write_text(yaml.safe_dump({"applications": [app]}))
    assert main(["recertify", str(art), "--labels", str(fresh), "-o", str(tmp_path / "new2"), "--config",
                 str(config)]) == 0
    assert "plan had no room for a replica" in capsys.readouterr().err
    served = yaml.safe_load(config.read_text())["applications"][0]["args"]["artifact"]["path"]
    assert served == str((tmp_path / "new2").resolve())


def test_the_new_certificate_replaces_the_old_figures_and_keeps_its_metric(certified, monkeypatch):
    """Scores (the label join's floor is read from them), bound detail and confidence all come
    from the new rows; another metric or a 2-D y is refused; missing columns are named."""
    monkeypatch.setattr(synth, "SLEEPING", False)
    X, y = make_rows(4000, seed=99)
    result = certified.recertify(X, y, confidence=0.9)
    report = result.pipeline().report()
    assert report.confidence == 0.9 != certified.report().confidence
    assert report.baseline_score == pytest.approx(np.mean(certified.baseline.predict(X) == y))
    assert report.optimized_score == pytest.approx(np.mean(certified.predict(X) == y))
    assert report.bound_detail == result.gears[0].detail and report.bound_detail
    assert report.bound_request == certified.report().bound_request == "auto"
    with pytest.raises(ValueError, match="certified on 'accuracy'"):
        certified.recertify(X, y, metric="f1")
    with pytest.raises(ValueError, match=r"1-D"):
        certified.recertify(X, y.reshape(-1, 1))
    with pytest.raises(ValueError, match="lack column"):
        certified.recertify(X.drop(columns=["b"]), y)
    with pytest.raises(ValueError, match="not certified per segment"):
        certified.recertify(X, y, segments=np.zeros(len(X)))


def test_a_plan_certified_per_segment_is_bounded_per_segment_again(monkeypatch, tmp_path):
    """The old per-segment bounds speak of the old rows: each segment is bounded on its own new
    rows, and a segment the cheap level now gets wrong is named among those refusing it."""
    monkeypatch.setattr(synth, "SLEEPING", False)

    def rows(n: int, seed: int, shifted: bool = False):
        X, y = make_rows(n, seed=seed)
        region = np.where(np.random.default_rng(seed).random(n) < 0.15, "south", "north")
        if shifted:  # in the south, the label now follows b, which the cheap level does not read
            Xb, yb = make_rows(n, seed=seed + 1, weights=(0.3, 3.0, 0.3))
            south = region == "south"
            X.loc[south, :], y = Xb.loc[south, :].to_numpy(), np.where(south, yb, y)
        return X.assign(region=region), y

    X, y = rows(12_000, 3)
    opt = willump.optimize(three_groups, LogisticRegression(), X, y, max_loss=0.03, segments="region",
                           segment_max_loss=0.06, **quiet(three_groups))
    if opt.report().plan != "cascade":
        pytest.skip("no cascade certified per segment on these rows")
    assert {s["segment"] for s in opt.report().segments} == {"north", "south"}
    Xn, yn = rows(6000, 11)
    held = opt.recertify(Xn, yn)
    assert held.certified, held.to_dict()
    segments = {s["segment"]: s for s in held.pipeline().report().segments}
    assert segments["south"]["rows"] == int(np.sum(Xn["region"] == "south"))
    assert sum(s["rows"] for s in segments.values()) == 6000
    Xs, ys = rows(6000, 12, shifted=True)
    broken = opt.recertify(Xs, ys)
    assert not broken.certified and "south" in broken.gears[0].detail
    assert [s["segment"] for s in broken.gears[0].segments if s["bound"] > 0.06] == ["south"]
    with pytest.raises(ValueError, match="names no column"):
        opt.recertify(Xs.drop(columns=["region"]), ys)
    keys = Xs["region"].to_numpy()
    assert not opt.recertify(Xs.drop(columns=["region"]), ys, segments=keys).certified
    # rows whose segment is missing make a segment of their own, not one of no rows
    keys = Xn["region"].to_numpy().astype(object)
    keys[:40] = None
    missing = opt.recertify(Xn.drop(columns=["region"]), yn, segments=keys)
    assert {s["segment"]: s["rows"] for s in missing.gears[0].segments}["<none>"] == 40
    # the command line names the column
    from serving.cli import main

    opt.save(art := tmp_path / "plan")
    Xn.rename(columns={"region": "area"}).assign(label=yn).to_csv(fresh := tmp_path / "fresh.csv", index=False)
    assert main(["recertify", str(art), "--labels", str(fresh)]) == 1  # optimize's column, region, is not there
    assert main(["recertify", str(art), "--labels", str(fresh), "--segments", "area"]) == 0


def test_the_labels_file_is_read_as_the_served_app_reads_rows(tmp_path):
    """Text columns stay text ("02139"), labels name classes by their text as the labels route
    matches them, a JSON array is read as rows, and a label naming no class is refused by repr."""
    import pandas as pd

    from serving.cli_recertify import as_classes, read_rows

    sample = pd.DataFrame({"zip": ["10001"], "amount": [3.5]})
    (csv := tmp_path / "rows.csv").write_text("zip,amount,label\n02139,1.5,1\n10001,2.0,0\n")
    X, y = read_rows(str(csv), "label", sample)
    assert list(X["zip"]) == ["02139", "10001"] and list(X["amount"]) == [1.5, 2.0]
    assert list(as_classes(y, np.array([0, 1]))) == [1, 0]
    assert list(as_classes(y, np.array(["0", "1"]))) == ["1", "0"]
    assert list(as_classes(np.array([1.0, 0.0]), np.array([0, 1]))) == [1, 0]
    (js := tmp_path / "rows.json").write_text('[{"zip": "02139", "amount": 1.5, "label": "spam"}]')
    X, y = read_rows(str(js), "label", sample)
    assert list(X["zip"]) == ["02139"] and list(as_classes(y, np.array(["ham", "spam"]))) == ["spam"]
    with pytest.raises(ValueError, match=r"name no class.*'maybe'"):
        as_classes(np.array(["spam", "maybe"]), np.array(["ham", "spam"]))
    (na := tmp_path / "na.csv").write_text("zip,amount,label\nNA,,None\n,2.0,ham\n")
    X, y = read_rows(str(na), "label", sample)  # Namibia's code and a class named None stay text
    assert X["zip"].iloc[0] == "NA" and pd.isna(X["zip"].iloc[1]) and pd.isna(X["amount"].iloc[0])
    assert list(as_classes(y, np.array(["None", "ham"]))) == ["None", "ham"]
    assert list(as_classes(np.array(["1", "0", "True", "false"]), np.array([False, True]))) == [True, False, True, False]
    X, _ = read_rows(str(csv), "label", np.zeros((2, 2)))  # sample rows that are no table: no text columns known
    assert len(X) == 2
    (bad := tmp_path / "bad.json").write_text('{"zip": "1"}\n{"zip": "2"}\n')
    with pytest.raises(ValueError, match="JSON array"):
        read_rows(str(bad), "label", sample)


def test_the_command_line_never_overwrites_the_artifact_it_re_certifies(certified, tmp_path, monkeypatch, capsys):
    import json

    from serving.cli import main

    monkeypatch.setattr(synth, "SLEEPING", False)
    certified.save(art := tmp_path / "plan")
    X, y = make_rows(300, seed=99)
    X.assign(label=y).to_csv(fresh := tmp_path / "fresh.csv", index=False)
    assert main(["recertify", str(art), "--labels", str(fresh), "-o", str(tmp_path / "plan" / ".." / "plan")]) == 1
    assert "is the artifact being re-certified" in capsys.readouterr().err
    # too few rows to certify: exit 4, and the JSON strict (no NaN or Infinity literals)
    Xf, yf = make_rows(20, seed=99)
    Xf.assign(label=yf).to_csv(few := tmp_path / "few.csv", index=False)
    assert main(["recertify", str(art), "--labels", str(few), "--json"]) == 4
    out = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert out["certified"] is False and all(g["certified"] is False for g in out["gears"])
