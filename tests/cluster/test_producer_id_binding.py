"""Producer ids bound to principals (with an authorizer): only the principal an id was issued to
passes the check, ids cannot be made or guessed for another, and a transactional id gives each
principal its own id, the same every time."""

from __future__ import annotations

from deltabus.cluster.metadata_state import MetadataState
from deltabus.cluster.producer_id_control import bind, init_producer_id, issued_to
from deltabus.security.principal import user

KEY = b"k" * 32


def test_an_id_passes_only_for_its_principal_and_key() -> None:
    alice, mallory = user("alice"), user("mallory")
    pid = bind(7, alice, KEY)
    assert issued_to(pid, alice, KEY)
    assert not issued_to(pid, mallory, KEY)
    assert not issued_to(pid, alice, b"another key")
    assert not issued_to(pid + 1, alice, KEY) and not issued_to(7, alice, KEY)
    assert not issued_to(-1, alice, KEY) and not issued_to(pid, alice, b"")
    # Neighbouring counters give unrelated ids: the next one cannot be guessed from this one.
    assert len({bind(c, alice, KEY) & 0x3FFFFF for c in range(100)}) > 90


def test_a_transactional_id_gives_each_principal_its_own_stable_id() -> None:
    state = MetadataState(producer_id_key=KEY)
    first = init_producer_id(state, 0, "tx", principal=user("alice"), bound=True)
    for record in first.records:
        state.replay(record)
    again = init_producer_id(state, 1, "tx", principal=user("alice"), bound=True)
    other = init_producer_id(state, 1, "tx", principal=user("bob"), bound=True)
    assert again.records == [] and again.response == first.response
    assert other.response != first.response
    assert issued_to(other.response[0], user("bob"), KEY)
    unbound = init_producer_id(state, 1, "tx")  # no authorizer: the plain counter, as before
    assert unbound.response == (0, 0)
