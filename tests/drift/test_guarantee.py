"""The live guarantee (drift._confseq, drift._guarantee): the confidence sequences cover the
true rate at every look, the alarm stays quiet on stationary streams and fires on a doubled
disagreement rate, per gear, and on a late one within a few epochs where the whole-history test
would not; epochs form by audited counts; loss_upper bounds a loss built row by row; segments,
state and bad input; the edge cases (no audits, every audit disagreeing, no certification
counts). Seeded, no timing."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from drift._confseq import (
    _log_mixture,
    lower_bound,
    rejects_at_most,
    tuned_prior,
    upper_bound,
)
from drift._guarantee import OTHER, AuditCounts, GearTerms, GuaranteeLedger

STREAMS = 200
ROWS = 20_000
EVERY = 100
ALPHA = 0.05


def _tolerance(alpha: float, runs: int) -> float:
    """Three binomial standard deviations of a share of ``runs`` runs at rate ``alpha``: with a
    fixed seed the test is deterministic, and a valid sequence passes it with room to spare."""
    return 3.0 * math.sqrt(alpha * (1.0 - alpha) / runs)


def _streams(rate: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Audited rows and cumulative disagreements after every ``EVERY`` rows, per stream."""
    rng = np.random.default_rng(seed)
    s = rng.binomial(EVERY, rate, size=(STREAMS, ROWS // EVERY)).cumsum(axis=1)
    n = np.arange(1, ROWS // EVERY + 1) * EVERY
    return n, s


# ---------------------------------------------------------------- confidence sequences
@pytest.mark.parametrize("rate", [0.01, 0.05, 0.2])
def test_lower_sequence_covers_at_every_look(rate):
    n, s = _streams(rate, seed=int(rate * 1000))
    # the alarm's prior is centred on twice the rate it tests: validity must not depend on it
    prior = tuned_prior(min(2 * rate, 0.999))
    missed = 0
    for row in s:
        for k in np.flatnonzero(row > rate * n):  # the lower bound can only pass the rate here
            if rejects_at_most(int(n[k]), int(row[k]), rate, ALPHA, prior):
                assert lower_bound(int(n[k]), int(row[k]), ALPHA, prior) > rate
                missed += 1
                break
    assert missed / STREAMS <= ALPHA + _tolerance(ALPHA, STREAMS)


@pytest.mark.parametrize("rate", [0.01, 0.05, 0.2])
def test_upper_sequence_covers_at_every_look(rate):
    n, s = _streams(rate, seed=7 + int(rate * 1000))
    prior = tuned_prior(rate / 2)
    level = math.log(1 / ALPHA)
    missed = 0
    for row in s:
        for k in np.flatnonzero(row < rate * n):  # the upper bound can only fall below it here
            # upper_bound < rate exactly when the lower-side mixture against rate reaches 1/alpha
            if _log_mixture(int(n[k]), int(row[k]), rate, prior, "below") >= level:
                assert upper_bound(int(n[k]), int(row[k]), ALPHA, prior) < rate
                missed += 1
                break
    assert missed / STREAMS <= ALPHA + _tolerance(ALPHA, STREAMS)
    # the shortcut and the bound agree where the bound does not exclude the rate, too
    for row in s[:10]:
        for k in (0, 9, 99, 199):
            nk, sk = int(n[k]), int(row[k])
            shortcut = sk < rate * nk and _log_mixture(nk, sk, rate, prior, "below") >= level
            assert (upper_bound(nk, sk, ALPHA, prior) < rate) == shortcut


def test_sequences_bracket_the_estimate_and_shrink():
    prior = tuned_prior(0.05)
    widths = []
    for n in (100, 1_000, 20_000):
        s = n // 20
        lo, hi = lower_bound(n, s, ALPHA, prior), upper_bound(n, s, ALPHA, prior)
        assert 0.0 <= lo <= s / n <= hi <= 1.0
        widths.append(hi - lo)
    assert widths[0] > widths[1] > widths[2] and widths[2] < 0.01
    assert lower_bound(0, 0, ALPHA, prior) == 0.0 and upper_bound(0, 0, ALPHA, prior) == 1.0
    assert lower_bound(500, 0, ALPHA, prior) == 0.0 and upper_bound(500, 500, ALPHA, prior) == 1.0


def test_every_row_disagreeing_has_a_lower_bound():
    """s == n: the search used to evaluate log(1 - p) at p = 1 (math domain error)."""
    prior = tuned_prior(0.02)
    bounds = [lower_bound(n, n, ALPHA, prior) for n in (1, 10, 100, 10_000)]
    assert all(0.0 < b < 1.0 for b in bounds) and bounds == sorted(bounds)
    assert lower_bound(100, 100, ALPHA, prior) >= lower_bound(100, 99, ALPHA, prior)
    assert rejects_at_most(100, 100, 0.5, ALPHA, tuned_prior(0.6))


# ---------------------------------------------------------------- the ledger
def _gear(rows=4_000, disagreed=96, max_loss=0.02, gear=0):
    return {"gear": gear, "max_loss": max_loss, "cert_rows": rows, "cert_disagreed": disagreed}


def _serve(ledger, rng, gear, batches, d_cheap, served=50_000, share=0.8, audit=0.01, check=None):
    """Serve ``batches`` batches; ``check`` is called with the ledger after each."""
    for _ in range(batches):
        cheap = rng.binomial(served, share)
        audited = rng.binomial(cheap, audit)
        ledger.add(gear, served, cheap, audited, rng.binomial(audited, d_cheap))
        if check is not None:
            check(ledger)


def _alarm(ledger: GuaranteeLedger) -> bool:
    """Gear 0's alarm (every run of epochs ending now is tested: a run's estimate can pass the
    reference while the whole history's does not, so there is no shortcut on the total counts)."""
    return ledger.verdict(0)["alarm"]


def test_alarm_is_quiet_on_stationary_streams():
    rng = np.random.default_rng(11)
    runs, share, d_cheap, cert_rows = 100, 0.8, 0.03, 4_000
    alarmed = 0
    for _ in range(runs):
        # the certification rows come from the same traffic as the served ones
        ledger = GuaranteeLedger([_gear(cert_rows, int(rng.binomial(cert_rows, share * d_cheap)))])
        fired: list[bool] = []
        _serve(ledger, rng, 0, 10, d_cheap, served=100_000, check=lambda lg, f=fired: f.append(_alarm(lg)))
        alarmed += any(fired)
    confidence = GuaranteeLedger([_gear()]).confidence
    assert alarmed / runs <= (1 - confidence) + _tolerance(1 - confidence, runs)


def test_epochs_close_by_audited_counts():
    quiet, risen = GuaranteeLedger([_gear()], epoch_rows=2_000), GuaranteeLedger([_gear()], epoch_rows=2_000)
    for ledger, disagreed in ((quiet, (19, 20, 19, 20, 19)), (risen, (19, 20, 19, 20, 400))):
        for d in disagreed:
            ledger.add(0, 100_000, 80_000, 800, d)
        # an epoch takes batches until it holds 2,000 audited rows, the next batch opens a new one
        assert [e.audited for e in ledger.epochs[0]] == [2_400, 1_600]
        assert sum(e.disagreed for e in ledger.epochs[0]) == ledger.counts[0].disagreed
        assert GuaranteeLedger.from_state(json.loads(json.dumps(ledger.state()))).epochs == ledger.epochs
    assert not quiet.verdict(0)["alarm"] and quiet.verdict(0)["alarm_audited_rows"] is None
    # the newest run (the last epoch, 1,600 rows) fires first; the reported size is that run's
    v = risen.verdict(0)
    assert v["alarm"] and v["alarm_audited_rows"] == 1_600
    assert risen.verdict(0, risen.counts[0])["alarm_audited_rows"] is None  # a segment's counts


def test_a_late_rise_is_judged_on_the_rows_since_it():
    """A 2x rise (2% -> 4% served) after 30,000 quiet audited rows: the epoch runs find it within
    6,000 audited rows in most runs; the whole-history test (what ``verdict(gear, counts)`` does
    with the total counts: 30,000 quiet rows dilute the rise) in few."""
    rng = np.random.default_rng(2026)
    runs, found, found_whole, quiet_alarms = 20, 0, 0, 0
    for _ in range(runs):
        ledger = GuaranteeLedger([_gear(20_000, 400)])

        def batch(d_cheap, lg=ledger):
            cheap = rng.binomial(25_000, 0.8)
            audited = rng.binomial(cheap, 0.01)
            lg.add(0, 25_000, cheap, audited, rng.binomial(audited, d_cheap))

        batch(0.025)
        while ledger.counts[0].audited < 30_000:
            batch(0.025)
        quiet_alarms += ledger.verdict(0)["alarm"]
        onset, epoch_alarm, whole_alarm = ledger.counts[0].audited, None, False
        while ledger.counts[0].audited - onset < 6_000:
            batch(0.05)
            if epoch_alarm is None and ledger.verdict(0)["alarm"]:
                epoch_alarm = ledger.verdict(0)
            whole_alarm = whole_alarm or ledger.verdict(0, ledger.counts[0])["alarm"]
        found += epoch_alarm is not None
        found_whole += whole_alarm
        if epoch_alarm is not None:  # fired on a recent run of epochs, not the whole history
            assert epoch_alarm["alarm_audited_rows"] < ledger.counts[0].audited - onset + 2 * ledger.epoch_rows
    assert quiet_alarms <= 1
    assert found >= 0.8 * runs and found_whole <= 0.2 * runs


def test_alarm_fires_on_a_doubled_rate_and_is_counted_per_gear():
    rng = np.random.default_rng(3)
    ledger = GuaranteeLedger([_gear(20_000, 480, gear=0), _gear(20_000, 480, 0.04, gear=1)])
    _serve(ledger, rng, 0, 10, 0.03)          # gear 0 as certified (0.8 x 0.03 = 480 / 20,000)
    _serve(ledger, rng, 1, 10, 0.06)          # gear 1: twice the certified rate
    g0, g1 = ledger.verdict(0), ledger.verdict(1)
    assert not g0["alarm"] and g1["alarm"]
    assert g1["disagreement_lower"] > g1["alarm_reference"] > g1["certified_rate"] == 0.024
    assert ledger.counts[0].audited > 0 and ledger.counts[1].audited > 0
    assert ledger.counts[0] != ledger.counts[1]
    report = ledger.report()
    assert report["alarm"] and [g["alarm"] for g in report["gears"]] == [False, True]
    # each gear spends half the budget (Bonferroni over two gears)
    assert ledger.alpha_gear == pytest.approx((1 - ledger.confidence) / 2)


def _rows(rng, n, share, d_cheap, lose):
    """Rows with a label, the full pipeline's class and the served class: the cheap level
    answers ``share`` of them, disagrees with the full pipeline on ``d_cheap`` of those, and a
    disagreement costs the served answer with probability ``lose`` (else it gains)."""
    y = rng.integers(0, 2, n)
    full = np.where(rng.random(n) < 0.85, y, 1 - y)
    cheap = rng.random(n) < share
    disagree = cheap & (rng.random(n) < d_cheap)
    served = np.where(disagree, 1 - full, full)
    flip = disagree & (rng.random(n) < lose)
    full = np.where(flip, y, full)            # the disagreement costs the served answer
    served = np.where(flip, 1 - y, served)
    return y, full, served, cheap


def test_loss_upper_bounds_a_constructed_loss():
    rng = np.random.default_rng(5)
    runs, below = 60, 0
    for _ in range(runs):
        y, full, served, cheap = _rows(rng, 20_000, 0.7, 0.04, 0.9)
        audited = cheap & (rng.random(len(y)) < 0.2)
        ledger = GuaranteeLedger([_gear(max_loss=0.05)])
        ledger.add_rows(np.zeros(len(y), int), cheap, audited, audited & (served != full))
        true_loss = np.mean(full == y) - np.mean(served == y)
        v = ledger.verdict(0)
        assert true_loss > 0.01 and v["loss_upper"] == pytest.approx(v["disagreement_upper"])
        below += v["loss_upper"] < true_loss
    assert below / runs <= ALPHA + _tolerance(ALPHA, runs)
    # every disagreement a loss, every cheap row audited: the bound is the disagreement
    # rate's upper bound, above the (known) loss
    y, full, served, cheap = _rows(rng, 20_000, 0.7, 0.04, 1.0)
    ledger = GuaranteeLedger([_gear(max_loss=0.05)])
    ledger.add_rows(np.zeros(len(y), int), cheap, cheap, served != full)
    v = ledger.verdict(0)
    true_loss = np.mean(full == y) - np.mean(served == y)
    assert true_loss == pytest.approx(np.mean(served != full))
    assert true_loss <= v["loss_upper"] <= true_loss + 0.01 and v["supported"]


def test_add_rows_counts_like_add():
    rng = np.random.default_rng(2)
    n = 5_000
    gear = rng.integers(0, 2, n)
    cheap = rng.random(n) < 0.7
    audited = cheap & (rng.random(n) < 0.1)
    disagreed = audited & (rng.random(n) < 0.2)
    shed = cheap & ~audited & (rng.random(n) < 0.01)
    rows = GuaranteeLedger([_gear(), _gear(gear=1)])
    rows.add_rows(gear, cheap, audited, disagreed, shed)
    batch = GuaranteeLedger([_gear(), _gear(gear=1)])
    for g in (0, 1):
        m = gear == g
        batch.add(g, m.sum(), cheap[m].sum(), audited[m].sum(), disagreed[m].sum(), shed[m].sum())
    assert rows.counts == batch.counts and rows.report() == batch.report()
    assert rows.counts[1].shed == int(shed[gear == 1].sum()) > 0


def test_segments_are_reported_and_capped():
    rng = np.random.default_rng(9)
    values = np.array(["eu", "us", "ap", "sa", "af"])
    n = 10_000
    region = values[rng.choice(5, n, p=[0.1, 0.4, 0.3, 0.15, 0.05])]
    region[:5] = values          # every value appears in the first rows: eu, us, ap are followed
    cheap = rng.random(n) < 0.8
    audited = cheap & (rng.random(n) < 0.1)
    disagreed = audited & (rng.random(n) < np.where(region == "ap", 0.2, 0.02))
    ledger = GuaranteeLedger([_gear()], segments=["region"], max_segments=3)
    ledger.add_rows(np.zeros(n, int), cheap, audited, disagreed,
                    attributes={"region": region, "ignored": region})
    entries = ledger.report("region")["gears"][0]["segments"]
    # by served rows: "(other)" (sa + af, 20%) above eu (10%)
    assert [e["value"] for e in entries] == ["us", "ap", OTHER, "eu"]
    assert len(entries) == ledger.max_segments + 1
    other = entries[2]
    assert other["served_rows"] == int(np.isin(region, ["sa", "af"]).sum())
    for key in ("served_rows", "audited_rows", "disagreed_rows"):
        assert sum(e[key] for e in entries) == ledger.verdict(0)[key]
    by_value = {e["value"]: e for e in entries}
    assert by_value["ap"]["disagreement_lower"] > by_value["us"]["disagreement_upper"]
    # segments never raise the alarm; an unfollowed attribute is not counted
    assert set(ledger.by_segment[0]) == {"region"}
    # add(): one value per batch, missing values count as "null"
    ledger.add(0, 10, 8, 1, 0, segment={"region": None, "ignored": "x"})
    assert ledger.by_segment[0]["region"][OTHER].served == other["served_rows"] + 10
    wide = GuaranteeLedger([_gear()], segments=["region"], max_segments=10)
    wide.add(0, 10, 8, 1, 0, segment={"region": float("nan")})
    assert list(wide.by_segment[0]["region"]) == ["null"]


def test_state_round_trips_through_json():
    rng = np.random.default_rng(4)
    ledger = GuaranteeLedger([_gear(), {"gear": 1, "max_loss": 0.04}], segments=["region"],
                             max_segments=2, rise=3.0, horizon=500)
    n = 3_000
    region = rng.choice(["a", "b", "c"], n)
    cheap = rng.random(n) < 0.8
    audited = cheap & (rng.random(n) < 0.2)
    ledger.add_rows(rng.integers(0, 2, n), cheap, audited, audited & (rng.random(n) < 0.05),
                    attributes={"region": region})
    state = json.loads(json.dumps(ledger.state()))
    back = GuaranteeLedger.from_state(state)
    assert back.state() == ledger.state()
    assert back.report("region") == ledger.report("region")
    assert back.report() == ledger.report()
    assert back.gears[1].cert_rows is None and back.reference_rate(1) == (0.04, "max_loss")


def test_bad_input_names_the_argument():
    ledger = GuaranteeLedger([_gear()], segments=["region"])
    with pytest.raises(ValueError, match=r"non-negative.*served=-1"):
        ledger.add(0, -1, 0, 0, 0)
    with pytest.raises(ValueError, match=r"non-negative.*shed=-2"):
        ledger.add(0, 10, 5, 1, 0, shed=-2)
    with pytest.raises(ValueError, match="disagreed <= audited"):
        ledger.add(0, 10, 5, 1, 2)
    with pytest.raises(ValueError, match="cheap <= served"):
        ledger.add(0, 10, 11, 1, 0)
    with pytest.raises(ValueError, match=r"gear must be in \[0, 0\], got 1"):
        ledger.add(1, 10, 5, 1, 0)
    with pytest.raises(ValueError, match="gear must be"):
        ledger.verdict(-1)
    with pytest.raises(ValueError, match=r"segment must be one of .*'region'.*got 'nope'"):
        ledger.report("nope")
    with pytest.raises(ValueError, match="one value per row"):
        ledger.add_rows([0, 0, 0], [True, True], [False, False], [False, False])
    with pytest.raises(ValueError, match="attribute 'region' must have one value per row"):
        ledger.add_rows([0, 0], [True, True], [True, False], [False, False], attributes={"region": ["a"]})
    with pytest.raises(ValueError, match="only cheap rows are audited"):
        ledger.add_rows([0], [False], [True], [False])
    with pytest.raises(ValueError, match="gear must be"):
        ledger.add_rows([0, 3], [True, True], [True, True], [False, False])
    with pytest.raises(ValueError, match="gears"):
        GuaranteeLedger([])
    with pytest.raises(ValueError, match="confidence"):
        GuaranteeLedger([_gear()], confidence=1.0)
    with pytest.raises(ValueError, match="rise"):
        GuaranteeLedger([_gear()], rise=1.0)
    with pytest.raises(ValueError, match="horizon"):
        GuaranteeLedger([_gear()], horizon=3)
    with pytest.raises(ValueError, match="disagreements <= audited rows"):
        lower_bound(10, 11, ALPHA, tuned_prior(0.1))
    with pytest.raises(ValueError, match="disagreements <= audited rows"):
        upper_bound(10, -1, ALPHA, tuned_prior(0.1))
    with pytest.raises(ValueError, match="alpha"):
        rejects_at_most(10, 1, 0.1, 0.0, tuned_prior(0.1))
    with pytest.raises(ValueError, match="mean"):
        tuned_prior(0.0)
    with pytest.raises(ValueError, match="horizon"):
        tuned_prior(0.1, horizon=3)


def test_a_gear_out_of_range_counts_nothing():
    """add_rows with one bad gear used to count the good gears' rows before raising."""
    ledger = GuaranteeLedger([_gear()])
    with pytest.raises(ValueError, match="gear must be"):
        ledger.add_rows([0, 3], [True, True], [True, True], [False, False])
    assert ledger.counts == {}


# ---------------------------------------------------------------- edge cases
def test_no_audits_yet():
    ledger = GuaranteeLedger([_gear()])
    empty = ledger.verdict(0)
    assert empty["loss_upper"] is None and empty["supported"] is None and not empty["alarm"]
    assert empty["disagreement_rate"] is None and empty["cheap_share"] == 0.0
    ledger.add(0, 1_000, 800, 0, 0, shed=8)
    v = ledger.verdict(0)
    # nothing audited: the cheap rows may all disagree, so the bound is the cheap share
    assert v["loss_upper"] == pytest.approx(0.8 * 1.0) and v["supported"] is False
    assert not v["alarm"] and v["disagreement_rate"] is None and v["shed_audits"] == 8
    assert v["disagreement_lower"] == 0.0 and v["disagreement_upper"] == pytest.approx(0.8)
    assert not ledger.report()["alarm"]


def test_every_audit_disagreeing():
    ledger = GuaranteeLedger([_gear()])
    ledger.add(0, 1_000, 800, 200, 200)
    v = ledger.verdict(0)
    assert v["alarm"] and v["disagreement_rate"] == pytest.approx(0.8)
    assert v["loss_upper"] == pytest.approx(0.8) and v["disagreement_upper"] == pytest.approx(0.8)
    assert v["alarm_reference"] < v["disagreement_lower"] < 0.8


def test_without_certification_counts_the_reference_is_max_loss():
    for terms in ({"gear": 0, "max_loss": 0.02}, {"gear": 0, "max_loss": 0.02, "cert_rows": 0},
                  GearTerms(0, 0.02, None, None)):
        ledger = GuaranteeLedger([terms])
        assert ledger.reference_rate(0) == (0.02, "max_loss")
        ledger.add(0, 10_000, 8_000, 2_000, 20)           # 0.8 x 1% served: below max_loss
        v = ledger.verdict(0)
        assert v["alarm_reference_source"] == "max_loss" and v["certified_rate"] is None
        assert not v["alarm"] and v["supported"]
        ledger.add(0, 10_000, 8_000, 2_000, 200)          # 0.8 x 5.5% over both batches
        assert ledger.verdict(0)["alarm"]
    # certification rows without a disagreement count: none disagreed
    ledger = GuaranteeLedger([{"gear": 0, "max_loss": 0.02, "cert_rows": 1_000}])
    upper, source = ledger.reference_rate(0)
    assert source == "certification" and 0 < upper < 0.01
    # neither: no reference, never an alarm
    bare = GuaranteeLedger([{"gear": 0}])
    bare.add(0, 100, 100, 100, 100)
    assert bare.reference_rate(0) == (None, "none")
    assert not bare.verdict(0)["alarm"] and bare.verdict(0)["supported"] is None


def test_metrics_that_are_not_rowwise_get_no_loss_bound():
    ledger = GuaranteeLedger([_gear()], rowwise=False)
    ledger.add(0, 1_000, 800, 100, 1)
    v = ledger.verdict(0)
    assert v["loss_upper"] is None and v["supported"] is None
    assert v["disagreement_upper"] > v["disagreement_rate"] > v["disagreement_lower"]
    assert AuditCounts(1, 1, 1, 1, 0) != AuditCounts()


# ---------------------------------------------------------------- the hold (deploy(on_alarm="step"))
def _batch(ledger, rng, d_cheap, gear=0, served=10_000, share=0.8, audit=0.05):
    cheap = int(rng.binomial(served, share))
    audited = int(rng.binomial(cheap, audit))
    ledger.add(gear, served, cheap, audited, int(rng.binomial(audited, d_cheap)))


def test_an_alarm_holds_its_gear_until_the_rows_since_pass_the_release_test():
    """A doubled rate holds gear 0; rows audited at the doubled rate keep it held; rows at the
    certified rate release it, and the alarm then tests only the epochs since the release; a
    second rise holds it again. Without ``hold`` the same counts hold nothing."""
    rng = np.random.default_rng(7)
    ledger, plain = GuaranteeLedger([_gear()], hold=True), GuaranteeLedger([_gear()])
    certified = 96 / 4_000
    for _ in range(40):
        if ledger.held:
            break
        _batch(ledger, rng, 2 * certified)
    assert ledger.report()["held"] == [0] and ledger.holds == {0: 1}
    v = ledger.verdict(0)
    assert v["held"] and v["alarm"] and v["holds"] == 1 and v["release_upper"] is None  # no row since
    for _ in range(40):  # still at the doubled rate: never released
        _batch(ledger, rng, 2 * certified)
    assert ledger.held.keys() == {0} and ledger.verdict(0)["release_upper"] > ledger.reference_rate(0)[0]
    for _ in range(200):  # back at the certified rate: released
        _batch(ledger, rng, certified)
        if not ledger.held:
            break
    assert not ledger.held and ledger.alarm_from[0] == len(ledger.epochs[0]) - 1
    after = ledger.verdict(0)
    assert not after["alarm"] and not after["held"] and after["release_upper"] is None
    assert after["audited_rows"] == ledger.counts[0].audited  # the totals keep every row
    for _ in range(100):  # a second rise
        if ledger.held:
            break
        _batch(ledger, rng, 3 * certified)
    assert ledger.holds == {0: 2} and ledger.held.keys() == {0}
    state = json.loads(json.dumps(ledger.state()))
    back = GuaranteeLedger.from_state(state)
    assert (back.hold, back.held, back.holds, back.alarm_from) == (True, ledger.held, ledger.holds, ledger.alarm_from)
    plain.add(0, 10_000, 8_000, 8_000, 8_000)
    assert plain.verdict(0)["alarm"] and not plain.held and "held" not in plain.report()
    assert "held" not in plain.verdict(0)


def test_a_held_gear_is_rarely_released_while_its_rate_stays_above_the_reference():
    """The release test's error: streams held at a rate 1.5x the alarm's reference are released
    in at most alpha (+ binomial tolerance) of runs, over 100 batches of 400 audited rows."""
    rng = np.random.default_rng(11)
    runs, released = 100, 0
    for _ in range(runs):
        ledger = GuaranteeLedger([_gear()], hold=True)
        ledger.held[0] = AuditCounts()
        rate = 1.5 * ledger.reference_rate(0)[0] / 0.8
        for _ in range(100):
            _batch(ledger, rng, rate, audit=0.05)
        released += 0 not in ledger.held
    assert released / runs <= ledger._live_alpha(0) + _tolerance(ledger._live_alpha(0), runs)


def test_a_saved_hold_is_dropped_when_the_app_no_longer_holds(tmp_path):
    path = tmp_path / "guarantee.json"
    ledger = GuaranteeLedger([_gear()], hold=True)
    ledger.add(0, 10_000, 8_000, 8_000, 8_000)
    assert ledger.held
    ledger.save(path)
    assert GuaranteeLedger.open(path, gears=[_gear()], hold=True).held.keys() == {0}
    reopened = GuaranteeLedger.open(path, gears=[_gear()])
    assert not reopened.hold and not reopened.held and reopened.holds == {0: 1}


def test_entries_added_without_deciding_hold_only_when_decided():
    """The monitor adds a flush's entries (one per gear and segment) with decide=False and decides
    the holds once after the last: the same verdict as deciding after each, for one alarm test."""
    ledger = GuaranteeLedger([_gear()], hold=True, segments=["client"])
    for client in "abcd":
        ledger.add(0, 2_500, 2_000, 2_000, 500, segment={"client": client}, decide=False)
    assert not ledger.held
    assert ledger.decide_holds() == [0] and ledger.holds == {0: 1}


def test_shed_audits_only_widen_the_bounds():
    """A sampled row whose audit was shed (under load, which may come with harder rows) is a
    disagreement to the upper bound and an agreement to the alarm: shedding can neither lower
    loss_upper nor raise the alarm."""
    kept, shed = GuaranteeLedger([_gear()]), GuaranteeLedger([_gear()])
    kept.add(0, 100_000, 80_000, 800, 8)
    shed.add(0, 100_000, 80_000, 800, 8, shed=800)  # as many again sampled, and shed
    k, s = kept.verdict(0), shed.verdict(0)
    assert s["shed_audits"] == 800 and s["loss_upper"] > 0.4 > k["loss_upper"]
    assert s["disagreement_lower"] <= k["disagreement_lower"]
    loud, loud_shed = GuaranteeLedger([_gear()]), GuaranteeLedger([_gear()])
    loud.add(0, 10_000, 8_000, 400, 100)
    loud_shed.add(0, 10_000, 8_000, 400, 100, shed=20_000)
    assert loud.verdict(0)["alarm"] and not loud_shed.verdict(0)["alarm"]


def test_a_held_gears_census_counts_for_its_release_only():
    """While gear 0 is held the full pipeline answers, and every row its cheap level decided is
    compared (a census, sent as shadow counts): the release test reads them, the served rows'
    counts, epochs and segments do not. Shadow counts of a gear not held count nowhere."""
    ledger = GuaranteeLedger([_gear()], hold=True, segments=["client"])
    ledger.add(0, 10_000, 8_000, 8_000, 8_000)
    assert ledger.held.keys() == {0}
    before = (vars(ledger.counts[0]).copy(), sum(e.audited for e in ledger.epochs[0]))
    ledger.add_batch([{"gear": 0, "served": 50_000, "cheap": 40_000, "audited": 40_000, "disagreed": 0,
                       "segment": {"client": "a"}, "shadow": True}])
    assert (vars(ledger.counts[0]), sum(e.audited for e in ledger.epochs[0])) == before
    assert not ledger.by_segment.get(0)
    assert not ledger.held, "the census at a rate far under the reference released the hold"
    ledger.add(0, 1_000, 800, 800, 0, shadow=True)
    assert vars(ledger.counts[0]) == before[0]


def test_an_alarm_diluted_away_is_still_on_record_and_a_reopen_takes_the_deploys_settings(tmp_path):
    """Without holds, later rows at the certified rate dilute a burst's alarm away: `alarm` is
    the verdict now, `alarm_rang` records that it rang (saved, and exported). A reopened ledger
    keeps its counts under the settings the deploy asks for now."""
    ledger = GuaranteeLedger([_gear()], segments=["client"])
    ledger.add_batch([{"gear": 0, "served": 10_000, "cheap": 8_000, "audited": 8_000, "disagreed": 800}])
    assert ledger.verdict(0)["alarm"] and ledger.alarmed_at == {0: 8_000}
    for _ in range(200):
        ledger.add_batch([{"gear": 0, "served": 100_000, "cheap": 80_000, "audited": 80_000, "disagreed": 0}])
    v = ledger.verdict(0)
    assert not v["alarm"] and v["alarm_rang"] and v["alarm_rang_at_audited_rows"] == 8_000
    direct = GuaranteeLedger([_gear()])
    direct.add(0, 10_000, 8_000, 8_000, 800)  # counted without a send: ringing now is having rung
    assert direct.verdict(0)["alarm"] and direct.verdict(0)["alarm_rang"]
    exposition = _exposition(ledger)
    assert 'drift_guarantee_alarm_rang{gear="0"} 1.0' in exposition
    assert 'drift_guarantee_degraded_rows_total{gear="0"} 0.0' in exposition
    ledger.save(path := tmp_path / "guarantee.json")
    reopened = GuaranteeLedger.open(path, gears=[_gear()], confidence=0.99, segments=["region"])
    assert reopened.alarmed_at == {0: 8_000} and reopened.counts == ledger.counts
    assert (reopened.confidence, reopened.segments) == (0.99, ["region"])
    assert reopened.reference_rate(0)[0] > ledger.reference_rate(0)[0], "the reference read at the new confidence"


def _exposition(ledger: GuaranteeLedger) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    from drift import GuaranteeCollector

    registry = CollectorRegistry()
    registry.register(GuaranteeCollector(ledger))
    return generate_latest(registry).decode()
