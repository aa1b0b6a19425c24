"""moto 5.2.5's ``tests/test_ec2/test_instances.py`` in server mode against a roost cluster
(see moto_peer.py for what the shim in between does, and does not, touch).

The committed expected-pass list (``moto_instances_expected.txt``) is the ratchet: a test
on it that fails now fails here. A test that passes and is not on it is printed, so the
list can grow. The failures left are described by category in docs/gateway.md.

The clusters are configured as the suite assumes its account and regions to be: account
123456789012 (moto's default, which its tests compare owner ids with), one cluster per
region it signs requests for (``us-east-1`` with nodes in ``us-east-1a``..``c``, and
the others of `moto_peer.REGIONS`). Set ``ROOST_CONFORMANCE_VERBOSE=1`` to
see the peer's own pytest output.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conformance import moto_peer
from tests.e2e.conftest import ThreadedCluster, make_cluster

EXPECTED = Path(__file__).with_name("moto_instances_expected.txt")
def expected_passes() -> set[str]:
    lines = EXPECTED.read_text().splitlines()
    return {ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")}


@pytest.fixture(scope="session")
def moto_suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """moto's sdist, fetched once per test run."""
    return moto_peer.fetch_suite(tmp_path_factory.mktemp("moto"))


@pytest.fixture(scope="module")
def regions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ThreadedCluster]]:
    """One cluster per region the suite signs for (`moto_peer.REGIONS`), a node a zone."""
    clusters: dict[str, ThreadedCluster] = {}
    try:
        for region, zones in moto_peer.REGIONS.items():
            clusters[region] = make_cluster(
                tmp_path_factory.mktemp(f"conformance-{region}"), nodes=len(zones),
                capacity="64vcpu,256GiB", region=region, zones=list(zones),
                owner_id=moto_peer.MOTO_ACCOUNT)
        yield clusters
    finally:
        for c in clusters.values():
            c.stop()


@pytest.mark.timeout(1500)  # ~60 s of CPU; wall time is what a loaded machine makes it
def test_moto_instances_conformance(moto_suite: Path, regions: dict[str, ThreadedCluster]
                                    ) -> None:
    targets = {region: moto_peer.Target(c.endpoint, region, c.key, c.secret,
                                        moto_peer.MOTO_ACCOUNT, moto_peer.REGIONS[region])
               for region, c in regions.items()}
    workdir = regions["us-east-1"].spec.data_dir
    with moto_peer.shim(targets, workdir) as (endpoint, shim_errors):
        outcome = moto_peer.run_suite(moto_suite, endpoint, targets["us-east-1"])
    print("moto test_instances.py:", moto_peer.summary(outcome))
    for name, why in outcome.failed.items():
        print(f"  FAIL {name}: {why}")
    expected = expected_passes()
    newly = sorted(set(outcome.passed) - expected)
    if newly:
        print("passing, not yet in", EXPECTED.name, ":", " ".join(newly))
    assert not shim_errors, shim_errors
    regressed = sorted(expected - set(outcome.passed))
    assert not regressed, f"expected passes that fail now: {regressed}"
    assert outcome.ran > 100, "the peer suite did not run (collection failed?)"
