"""`first_free`: lowest-first by default; a stripe starts further in and wraps around; a
search may skip the positions its caller knows are used (`scan_position`)."""

from __future__ import annotations

import ipaddress

from roost.domain.network import Subnet, first_free, scan_position


def _subnet(cidr: str = "10.0.0.0/28") -> Subnet:
    return Subnet("subnet-1", "vpc-1", cidr, "roost-1a", "000000000000")


def _n(ip: str) -> int:
    return int(ipaddress.IPv4Address(ip))


def test_lowest_first_skips_the_reserved_and_the_used() -> None:
    assert first_free(_subnet(), set()) == "10.0.0.4"
    assert first_free(_subnet(), {_n("10.0.0.4"), _n("10.0.0.5")}) == "10.0.0.6"


def test_stripes_start_apart_and_wrap_around() -> None:
    # /28: usable .4 .. .14 (the broadcast .15 is reserved); two stripes start 5 apart.
    assert first_free(_subnet(), set(), stripe=(0, 2)) == "10.0.0.4"
    assert first_free(_subnet(), set(), stripe=(1, 2)) == "10.0.0.9"
    upper = {_n(f"10.0.0.{k}") for k in range(9, 15)}
    assert first_free(_subnet(), upper, stripe=(1, 2)) == "10.0.0.4"  # wrapped
    everything = {_n(f"10.0.0.{k}") for k in range(4, 15)}
    assert first_free(_subnet(), everything, stripe=(1, 2)) is None


def test_a_search_may_skip_positions_known_used_in_its_own_order() -> None:
    # Stripe (1, 2) searches .9 .. .14, then .4 .. .8: position 0 is .9, 6 is .4.
    assert scan_position(_subnet(), _n("10.0.0.9"), stripe=(1, 2)) == 0
    assert scan_position(_subnet(), _n("10.0.0.4"), stripe=(1, 2)) == 6
    assert scan_position(_subnet(), _n("10.0.0.4")) == 0
    assert first_free(_subnet(), set(), skip=3) == "10.0.0.7"
    assert first_free(_subnet(), set(), stripe=(1, 2), skip=7) == "10.0.0.5"
    assert first_free(_subnet(), set(), skip=11) is None  # past the end: the caller looks again


def test_a_skip_lands_on_the_same_address_as_stepping_over_the_positions() -> None:
    # Reference: walk the search order from its start and drop the first `skip`.
    sub = _subnet()
    for index, count in ((0, 1), (1, 2), (2, 3), (1, 4)):
        first = next(k for k in range(4, 15)
                     if scan_position(sub, _n(f"10.0.0.{k}"), stripe=(index, count)) == 0)
        order = [*range(first, 15), *range(4, first)]
        for skip in range(13):
            used = {_n("10.0.0.6"), _n("10.0.0.12")}
            want = next((f"10.0.0.{k}" for k in order[skip:] if _n(f"10.0.0.{k}") not in used),
                        None)
            assert first_free(sub, used, stripe=(index, count), skip=skip) == want
