"""Requests as the counted unit, where a combination holds whole requests and the outcome is
the request's.

Why: a slow request makes all its rows outliers, and a client, replica or model version is
the same on every row of a request. For such a combination, counting rows weights each
request by its size; the sandwich variance (drift._clusters) then keeps the interval honest
but pays for the unequal weights: with requests of 1-32 rows an interval carries about 0.76
of the information of the same requests counted once each (Kish's 1 + CV^2 of the sizes).
A slow (client, replica) pair with 5-7 slow requests in a window was found top-1 in 84% of
windows where an oracle counting requests could pass in 91%.

So where every request's rows agree on the outcome (the target's share of the row weight
is one value per request) and were sampled at one weight, each row carries 1/m of its
weights (m: the request's rows in the sample): a combination of request-level attributes then sums to whole requests, the
requests are the independent units (design effect 1), and the ratio is the request-level
one (how much likelier a request of the group is to be slow). Combinations holding a
row-level attribute, and outcomes that differ within a request, stay counted in rows with
the sandwich variance.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from drift._apriori import Rows
    from drift._clusters import Clusters

#: Relative tolerance of "every row of a request has the same outcome share".
SAME_OUTCOME_RTOL = 1e-9


def whole_requests(rows: Rows, clusters: Clusters) -> bool:
    """Whether every request is one unit: its rows agree on the outcome (an outlier request's
    rows are all outliers; a window request's rows all in the window) and were sampled at one
    weight. A request split across sampling strata (rows flagged by a classifier other than
    the one explained are kept at weight 1, the others only with the request's priority) is
    not: 1/m of its kept rows' weights would not estimate one request, and a null stream then
    read a ratio of 1.6 with a lower bound of 1.2."""
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(clusters.c > 0, clusters.t / clusters.c, 0.0)
    checks = [share, clusters.c]
    checks += [w for w in (rows.target_var, rows.count_var) if w is not None]
    return all(clusters.within_requests_equal(np.asarray(w, dtype=np.float64), SAME_OUTCOME_RTOL)
               for w in checks)


def per_request(rows: Rows, clusters: Clusters) -> Rows | None:
    """`rows` with each request's weights spread over its rows (1/m each), so that sums over
    whole requests count requests; None where a request is not one unit (`whole_requests`)
    or the metric is a mean (values are per row)."""
    if rows.value is not None or not whole_requests(rows, clusters):
        return None
    inv = 1.0 / clusters.sizes[clusters.index]
    count = inv if rows.count is None else rows.count * inv
    # a request's Horvitz-Thompson variance is that of one sampled unit: its rows' shares
    # of it sum to the unit's w (w - 1) y^2 when each row carries var / m
    return replace(
        rows,
        target=rows.target * inv,
        count=count,
        target_var=None if rows.target_var is None else rows.target_var * inv,
        count_var=None if rows.count_var is None else rows.count_var * inv,
        cluster=None,
    )
