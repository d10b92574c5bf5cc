"""Artifacts: round trip, loading in a fresh process, checksums and versions."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

import willump
from willump import ArtifactError

from . import synth
from .synth import make_rows, quiet, three_groups


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    X, y = make_rows(3000, seed=8)
    opt = willump.optimize(three_groups, LogisticRegression(), X, y, max_loss=0.02, verbose=False,
                           profile_repeats=1, profile_single_rows=2, importance_repeats=1)
    path = tmp_path_factory.mktemp("art") / "three.willump"
    opt.save(path)
    return opt, path, make_rows(500, seed=9)[0]


def test_round_trip_predictions_equal(saved):
    opt, path, X = saved
    loaded = willump.load(path)
    np.testing.assert_array_equal(loaded.predict_proba(X), opt.predict_proba(X))
    np.testing.assert_array_equal(loaded.baseline.predict_proba(X), opt.baseline.predict_proba(X))
    assert [lv.threshold for lv in loaded.levels] == [lv.threshold for lv in opt.levels]
    np.testing.assert_array_equal(loaded.top_k(X, 20).indices, opt.top_k(X, 20).indices)
    assert loaded.report().to_dict() == opt.report().to_dict()


def test_the_plans_certified_disagreement_survives_a_round_trip_and_older_reports_load(tmp_path, monkeypatch):
    """Gear 0 is rebuilt from the report on load: its cert_rows / cert_disagreed (a live audit's
    baseline) come back; a report saved before they were kept loads with None. Fixed costs, not
    the timed ``saved`` fixture: on a loaded machine that one may keep the full pipeline."""
    import hashlib
    import shutil

    monkeypatch.setattr(synth, "SLEEPING", False)
    X, y = make_rows(3000, seed=8)
    opt = willump.optimize(three_groups, LogisticRegression(), X, y, max_loss=0.02, **quiet(three_groups))
    opt.save(path := tmp_path / "new")
    gear = opt.gears_[0]
    assert opt.report().plan == "cascade" and gear.cert_rows == opt.report().splits["certification"]
    assert 0 <= gear.cert_disagreed <= gear.cert_rows
    loaded = willump.load(path).gears_[0]
    assert (loaded.cert_rows, loaded.cert_disagreed) == (gear.cert_rows, gear.cert_disagreed)
    copy = tmp_path / "old"
    shutil.copytree(path, copy)
    report = json.loads((copy / "report.json").read_text())
    del report["cert_rows"], report["cert_disagreed"]
    (copy / "report.json").write_text(json.dumps(report))
    data = (copy / "report.json").read_bytes()
    _rewrite_manifest(copy, lambda m: m["files"].update(
        {"report.json": {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}}))
    old = willump.load(copy).gears_[0]
    assert (old.cert_rows, old.cert_disagreed, old.loss_bound) == (None, None, gear.loss_bound)


def test_manifest_lists_versions_groups_thresholds_checksums(saved):
    _, path, _ = saved
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["groups"] == ["cheap", "medium", "costly"]
    assert manifest["levels"][-1]["threshold"] is None
    assert {"python", "numpy", "scikit-learn", "cloudpickle"} <= set(manifest["versions"])
    assert all(len(f["sha256"]) == 64 for f in manifest["files"].values())
    assert "tests.willump.synth" in manifest["stored_by_value"]


def test_tampered_file_is_refused(saved, tmp_path):
    _, path, _ = saved
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    with (copy / "models" / "level_0.pkl").open("ab") as fh:
        fh.write(b"x")
    with pytest.raises(ArtifactError, match="checksum mismatch"):
        willump.load(copy)
    (copy / "models" / "level_0.pkl").unlink()
    with pytest.raises(ArtifactError, match="is missing"):
        willump.load(copy)


def test_version_mismatch_is_refused(saved, tmp_path):
    _, path, _ = saved
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["versions"]["scikit-learn"] = "0.1.0"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=r"scikit-learn saved with 0.1.0, running .*: pip install 'scikit-learn==0.1.0'"):
        willump.load(copy)
    with pytest.warns(UserWarning, match="other library versions"):
        willump.load(copy, check_versions=False)
    manifest["format_version"] = 99
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="format version 99"):
        willump.load(copy)


def test_not_an_artifact(tmp_path):
    with pytest.raises(ArtifactError, match="not a willump artifact"):
        willump.load(tmp_path)
    (tmp_path / "manifest.json").write_text("{")
    with pytest.raises(ArtifactError, match="not valid JSON"):
        willump.load(tmp_path)


def test_save_refuses_to_clobber_other_directories(saved, tmp_path):
    opt, _, _ = saved
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ArtifactError, match="not a willump artifact"):
        opt.save(tmp_path)


SCRIPT = textwrap.dedent('''
    import sys
    import numpy as np, pandas as pd
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    import willump
    import local_helpers  # a module next to the script, not installed anywhere

    rng = np.random.default_rng(0)
    words = np.array(["good", "bad", "fine", "awful", "great", "meh"])
    n = 2000
    df = pd.DataFrame({"text": [" ".join(rng.choice(words, 4)) for _ in range(n)],
                       "x": rng.normal(size=n)})
    y = ((df.text.str.count("good|great") - df.text.str.count("bad|awful") + df.x) > 0).astype(int)
    vectorizer = TfidfVectorizer().fit(df.text)

    @willump.feature
    def x_feature(frame):
        return local_helpers.scaled(frame)

    @willump.feature
    def text_feature(frame):
        return vectorizer.transform(frame.text)

    @willump.pipeline
    def notebook_pipeline(frame):
        return [x_feature(frame), text_feature(frame)]

    opt = willump.optimize(notebook_pipeline, LogisticRegression(), df, y, max_loss=0.05,
                           verbose=False)
    opt.save(sys.argv[1])
    df.iloc[:200].to_pickle(sys.argv[2])
    np.save(sys.argv[3], opt.predict_proba(df.iloc[:200]))
''')

LOADER = textwrap.dedent('''
    import sys
    import numpy as np, pandas as pd
    import willump
    assert "local_helpers" not in sys.modules
    opt = willump.load(sys.argv[1])
    rows = pd.read_pickle(sys.argv[2])
    np.save(sys.argv[3], opt.predict_proba(rows))
    assert "local_helpers" not in sys.modules  # stored by value, never imported
''')


def test_loads_in_a_fresh_process_without_the_users_code(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "local_helpers.py").write_text("def scaled(frame):\n    return frame[['x']].to_numpy() * 2.0\n")
    (src / "make.py").write_text(SCRIPT)
    art, rows, expected, got = (tmp_path / n for n in ("a.willump", "rows.pkl", "e.npy", "g.npy"))
    subprocess.run([sys.executable, str(src / "make.py"), str(art), str(rows), str(expected)],
                   check=True, cwd=src, capture_output=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "load.py").write_text(LOADER)
    result = subprocess.run([sys.executable, str(elsewhere / "load.py"), str(art), str(rows), str(got)],
                            cwd=elsewhere, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    np.testing.assert_array_equal(np.load(got), np.load(expected))
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["stored_by_value"] == ["local_helpers"]


class _Tripwire:
    """Unpickling it writes a file: proof that a load ran code it should have refused."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _rewrite_manifest(root, change) -> None:
    manifest = json.loads((root / "manifest.json").read_text())
    change(manifest)
    (root / "manifest.json").write_text(json.dumps(manifest))


def test_a_file_the_manifest_names_but_does_not_list_is_refused_before_unpickling(saved, tmp_path):
    """Someone who can write the artifact points a level at a file of their own that the manifest
    does not list (so no checksum covers it): refused, and the file is never unpickled."""
    import pickle
    import shutil

    _, path, _ = saved
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    marker = tmp_path / "ran"
    (copy / "models" / "evil.pkl").write_bytes(pickle.dumps(_Tripwire(str(marker))))
    _rewrite_manifest(copy, lambda m: m["levels"][0].update(file="models/evil.pkl"))
    with pytest.raises(ArtifactError, match="does not list"):
        willump.load(copy)
    assert not marker.exists()
    _rewrite_manifest(copy, lambda m: m["files"].update({"../outside.pkl": {"sha256": "0" * 64, "bytes": 1}}))
    with pytest.raises(ArtifactError, match="outside the artifact"):
        willump.load(copy)


def test_a_signed_artifact_loads_only_with_its_key_and_unaltered(saved, tmp_path):
    """Checksums catch accidents; a signature catches someone who rewrote a file *and* its
    checksum: with trusted_key, nothing is unpickled unless the manifest is signed with it."""
    import pickle
    import shutil

    opt, _, X = saved
    signed = tmp_path / "signed.willump"
    opt.save(signed, signing_key="k" * 32)
    np.testing.assert_array_equal(willump.load(signed, trusted_key="k" * 32).predict_proba(X), opt.predict_proba(X))
    with pytest.raises(ArtifactError, match="does not match"):
        willump.load(signed, trusted_key="another key")
    tampered = tmp_path / "tampered.willump"
    shutil.copytree(signed, tampered)
    marker = tmp_path / "ran"
    evil = tampered / "models" / "level_0.pkl"
    evil.write_bytes(pickle.dumps(_Tripwire(str(marker))))
    from willump._artifact import _sha256

    _rewrite_manifest(tampered, lambda m: m["files"]["models/level_0.pkl"].update(sha256=_sha256(evil)))
    with pytest.raises(ArtifactError, match="does not match"):
        willump.load(tampered, trusted_key="k" * 32)
    assert not marker.exists()
    unsigned = tmp_path / "unsigned.willump"
    opt.save(unsigned)
    with pytest.raises(ArtifactError, match="not signed"):
        willump.load(unsigned, trusted_key="k" * 32)
    with pytest.raises(ValueError, match="empty"):
        opt.save(tmp_path / "x.willump", signing_key="")


def test_a_library_absent_here_is_named_only_where_the_artifact_needs_it(saved, tmp_path, monkeypatch):
    """Saved where torch and lightgbm were installed, loaded where one is not (the core install):
    no mismatch for a library the artifact does not use; one it does use is named with its pip line."""
    import shutil
    import sys

    import willump._artifact as artifact

    _, path, _ = saved
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["versions"]["torch"] = "9.9.0"  # installed at save time, in another version
    (copy / "manifest.json").write_text(json.dumps(manifest))
    versions = artifact._library_versions()
    monkeypatch.setattr(artifact, "_library_versions", lambda: {k: v for k, v in versions.items() if k != "torch"})
    assert willump.load(copy) is not None  # torch absent here: the artifact does not need it
    monkeypatch.setitem(sys.modules, "sklearn", None)  # the artifact's models need scikit-learn
    with pytest.raises(ArtifactError, match="sklearn"):
        willump.load(copy)
