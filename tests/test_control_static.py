"""FixedPolicy and TablePolicy."""

from __future__ import annotations

import pytest

from vspec_runtime.control.static import FixedPolicy, TablePolicy


def test_fixed_is_constant_and_capped():
    policy = FixedPolicy(4)
    assert [policy.choose(batch, 6).gamma for batch in (1, 8, 64)] == [4, 4, 4]
    assert policy.choose(1, 6).reason == "fixed"
    capped = policy.choose(64, 2)
    assert (capped.gamma, capped.reason) == (2, "infeasible")


@pytest.mark.parametrize("batch, expected", [(1, 6), (3, 6), (4, 3), (7, 3), (8, 1), (500, 1)])
def test_table_uses_largest_listed_batch_at_or_below(batch, expected):
    assert TablePolicy({1: 6, 4: 3, 8: 1}).choose(batch, 6).gamma == expected


def test_table_below_every_entry_uses_the_smallest_entry():
    policy = TablePolicy({4: 5, 16: 2})
    assert policy.choose(1, 6).gamma == 5
    assert policy.choose(2, 3).reason == "infeasible"


def test_table_accepts_string_keys_from_json():
    assert TablePolicy({"1": 6, "8": "1"}).table == {1: 6, 8: 1}


@pytest.mark.parametrize("table", [{}, {0: 1}, {4: -1}, {"x": 1}])
def test_table_rejects_bad_tables(table):
    with pytest.raises(ValueError, match="table policy"):
        TablePolicy(table)


@pytest.mark.parametrize("gamma", [-1, 1.5, True])
def test_fixed_rejects_bad_gamma(gamma):
    with pytest.raises(ValueError, match="fixed policy"):
        FixedPolicy(gamma)
