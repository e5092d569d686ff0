"""Issue 15's attacks on the agent boundary, each tried against the real API: a node speaks only for itself (no
GPU or MIG UUID of another live node, no re-registering another node with a join token alone) and the register
throttle counts the real client address, not a header the client writes."""

import pytest

from agents.authentication import AgentRegisterThrottle
from tests.agents.conftest import register

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_throttle_counts_and_writes_at_once")]


# --- the register throttle keys on the real client address -------------------------------------------------------


def test_a_forged_x_forwarded_for_does_not_reset_the_register_throttle(cluster, monkeypatch):
    monkeypatch.setattr(AgentRegisterThrottle, "THROTTLE_RATES", {"agent": "2/min"})
    codes = [register("tsj_guess_x", "n", HTTP_X_FORWARDED_FOR=f"10.9.0.{i}").status_code for i in range(4)]
    assert codes == [403, 403, 429, 429]


def test_behind_trusted_proxies_the_address_they_vouch_for_is_counted(cluster, monkeypatch, settings):
    settings.TESSERA = {**settings.TESSERA, "TRUSTED_PROXY_COUNT": 1}
    monkeypatch.setattr(AgentRegisterThrottle, "THROTTLE_RATES", {"agent": "1/min"})
    # The proxy appends the address it was connected from; what the client wrote before it does not count.
    first = register("tsj_guess_x", "n", HTTP_X_FORWARDED_FOR="1.1.1.1, 198.51.100.7").status_code
    forged = register("tsj_guess_x", "n", HTTP_X_FORWARDED_FOR="2.2.2.2, 198.51.100.7").status_code
    other = register("tsj_guess_x", "n", HTTP_X_FORWARDED_FOR="198.51.100.8").status_code
    assert (first, forged, other) == (403, 429, 403)
