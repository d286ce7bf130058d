"""The simulators' faults, one declared object each: set from Python, the command line and
``POST /_control/faults``, validated, and every switch read by the server it belongs to."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import requests

from include.simulators.faults import Faults, faults_from_arguments
from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from include.simulators.oai_pmh.__main__ import _parser as oai_parser
from include.simulators.oai_pmh.faults import OaiFaults
from include.simulators.sierra import SierraSimulator, SimulatedCatalogue
from include.simulators.sierra.__main__ import _parser as sierra_parser
from include.simulators.sierra.faults import SierraFaults

SIMULATORS = Path(__file__).resolve().parents[2] / "include" / "simulators"


@pytest.mark.parametrize(("faults", "server"), [(OaiFaults, "oai_pmh/server.py"), (SierraFaults, "sierra/server.py")])
def test_every_switch_has_an_effect(faults: type[Faults], server: str) -> None:
    """A field nobody reads is a fault the simulator only pretends to play."""
    source = (SIMULATORS / server).read_text()
    unread = [name for name in faults.model_fields
              if not re.search(rf'faults\.{name}\b|"{name}"', source)]
    assert unread == []


def test_the_command_line_sets_any_switch() -> None:
    args = oai_parser().parse_args(["--token-markup", "cdata", "--repeat-token", "--response-delay-ms", "20",
                                    "--faults", '{"fail_next": {"count": 2, "status": 429}}'])
    faults = faults_from_arguments(args, OaiFaults)
    assert (faults.token_markup, faults.repeat_token, faults.response_delay_ms) == ("cdata", True, 20.0)
    assert faults.fail_next is not None and (faults.fail_next.count, faults.fail_next.status) == (2, 429)
    assert faults_from_arguments(oai_parser().parse_args([]), OaiFaults) == OaiFaults()
    args = sierra_parser().parse_args(["--legacy-deleted-stubs", "--export-quota", "3", "--rate-limit-style", "429",
                                       "--file-origin", "http://127.0.0.1:9/"])
    sierra = faults_from_arguments(args, SierraFaults)
    assert (sierra.legacy_deleted_stubs, sierra.export_quota, sierra.rate_limit_style) == (True, 3, "429")
    assert sierra.file_origin == "http://127.0.0.1:9"
    with pytest.raises(SystemExit):
        oai_parser().parse_args(["--token-markup", "nonsense"])


def test_faults_over_the_control_api() -> None:
    with OaiSimulator(SimulatedRepository(records=10, page_size=5), token_markup="padded") as sim:
        control = sim.base_url.replace("/oai", "/_control/faults")
        assert requests.get(control, timeout=10).json()["token_markup"] == "padded"
        answer = requests.post(control, json={"html_next": True, "refuse_windows": {"longer_than": 60}}, timeout=10)
        assert answer.json()["refuse_windows"] == {"longer_than": 60, "how": "413"} and answer.json()["html_next"]
        assert "text/html" in requests.get(sim.base_url, params={"verb": "Identify"}, timeout=10).headers["Content-Type"]
        assert requests.get(control, timeout=10).json()["html_next"] is False  # spent by the request it hit
        for bad in ({"token_markup": "nonsense"}, {"no_such_fault": 1}, {"response_delay_ms": -1}):
            assert requests.post(control, json=bad, timeout=10).status_code == 400
        assert sim.faults.token_markup == "padded" and sim.errors == []


def test_counted_faults_are_spent_one_request_at_a_time() -> None:
    with SierraSimulator(SimulatedCatalogue(bibs=5), export_quota=1) as sim:
        sim.fail_next(2, 503, path_prefix="/bibs")
        assert sim.faults.export_quota == 1 and sim.faults.fail_next is not None
        assert sim.take_fault("fail_next", applies=lambda _, fail: fail.matches("/token")) == ("", None)
        for left in (1, None):
            name, fail = sim.take_fault("fail_next")
            assert name == "fail_next" and fail.status == 503
            assert (sim.faults.fail_next.count if sim.faults.fail_next else None) == left
        sim.fail_next(0)
        assert sim.faults.fail_next is None
        with pytest.raises(ValueError):
            sim.set_faults(expired_token_code=401)
