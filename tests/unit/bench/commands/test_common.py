"""What the `ucmctl bench` commands share: the option parsers, the cache salt, the exit status
on failed requests."""

from __future__ import annotations

import pytest

from ucmctl.bench.commands.common import cache_salt_of, fail_on_errors, parse_ints, parse_trace_rate
from ucmctl.core.errors import ExitStatus, UcmctlError


def test_a_run_salts_its_requests_with_its_own_salt_unless_given_one() -> None:
    first, second = cache_salt_of(None), cache_salt_of(None)
    assert first is not None and second is not None
    assert first != second and first.startswith("ucmctl-") and len(first) == 23
    assert cache_salt_of("nightly") == "nightly"
    assert cache_salt_of("off") is None and cache_salt_of("OFF") is None
    for bad in ("x" * 129, "a/b", "me@host", ""):
        with pytest.raises(UcmctlError) as caught:
            cache_salt_of(bad)
        assert "1 to 128 characters" in str(caught.value) and "--cache-salt" in str(caught.value)


def test_a_trace_rate_is_none_for_inf_else_a_positive_finite_number() -> None:
    assert parse_trace_rate("inf", "--rate") is None
    assert parse_trace_rate(" Infinity ", "--rate") is None
    assert parse_trace_rate("2", "--rate") == 2.0
    assert parse_trace_rate("0.5", "--rate") == 0.5
    for bad in ("0", "-1", "nan", "abc", "", "1e400"):
        with pytest.raises(UcmctlError) as caught:
            parse_trace_rate(bad, "--rate")
        assert str(caught.value) == f"--rate: '{bad}' is not a request rate (inf or requests/s > 0)"


def test_a_list_of_positive_integers() -> None:
    assert parse_ints("4096,8192", "--input-len") == [4096, 8192]
    assert parse_ints(" 1, 2 ,", "--input-len") == [1, 2]
    for bad in ("", "0", "1,-2", "a", "1.5"):
        with pytest.raises(UcmctlError) as caught:
            parse_ints(bad, "--input-len")
        said = f"--input-len: '{bad}' is not a list of positive integers (e.g. 4096,8192)"
        assert str(caught.value) == said


def test_failed_requests_exit_with_their_count_aggregates_not_counted_twice() -> None:
    fail_on_errors([{"preseed": {"failed": 0}, "measure": {"failed": 0}}])  # none: no error
    cells = [
        {"preseed": {"failed": 1}, "measure": {"failed": 2}},
        {"preseed": None, "measure": {"failed": 4}},
        {"aggregate": True, "measure": {"failed": 7}},
    ]
    with pytest.raises(UcmctlError) as caught:
        fail_on_errors(cells)
    assert caught.value.status == ExitStatus.REQUESTS_FAILED
    assert str(caught.value) == "7 request(s) failed (counted above, excluded from the figures)"
