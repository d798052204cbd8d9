"""The sealing path on its own (cairn.core.sealing, store/payloads.py): any JSON value, with
members named like the envelope at any depth, forged tokens among them, comes back from
dump and load exactly as it was given, with a key ring and without; and the store builds
no jsonb parameter anywhere but through store/payloads.py, so nothing goes around it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from cairn.core import sealing
from cairn.core.events import Event, encode
from cairn.core.sealing import SEALED, KeyMissing, KeyRing, new_key

ROOT = Path(__file__).resolve().parents[2]
K1 = f"k1:{new_key()}"
K2 = f"k2:{new_key()}"

_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=8)
# Strings a forger would use: a token of the right shape, one of another key, junk.
_forged = st.sampled_from(["v1.k1.AAAA", "v1.k2.AAAA", "v2.x.y", "", SEALED])
_leaf = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | _text | _forged


def _nest(kids: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return (
        st.lists(kids, max_size=3)
        | st.dictionaries(st.sampled_from([SEALED, "a", "b"]) | _text, kids, max_size=3)
        # the envelope's shape itself: one member named "cairn.sealed" (its token a
        # string, a list of one, anything)
        | kids.map(lambda v: {SEALED: v})
        | kids.map(lambda v: {SEALED: [v]})
    )


# Any JSON; floats apart, as jsonb gives 1e16 back as an int (Postgres's, not ours).
JSON = st.recursive(_leaf, _nest, max_leaves=16)
FLOATS = st.recursive(
    _leaf | st.floats(allow_nan=False, allow_infinity=False), _nest, max_leaves=16
)


@pytest.fixture(params=[None, K1], ids=["no keys", "keys"])
def keys(request: pytest.FixtureRequest) -> Iterator[str | None]:
    sealing.use(KeyRing(request.param))
    yield request.param
    sealing.use(None)


@hsettings(max_examples=300, deadline=None)
@given(value=FLOATS)
def test_any_value_comes_back_exactly_and_a_user_envelope_is_never_opened(value: Any) -> None:
    for ring in (KeyRing(None), KeyRing(K1)):
        sealing.use(ring)
        try:
            stored = sealing.dumps(value)  # what a jsonb parameter carries
            assert sealing.open_text(stored) == value  # what the connection's loader gives
            assert sealing.open_text(json.dumps(sealing.dump(value))) == value
            # An event's data takes the same path through the stream.
            assert Event.parse("1-0", encode("note", value)[1:]).data == value
        finally:
            sealing.use(None)


@given(value=JSON)
def test_with_keys_nothing_a_user_gave_is_left_at_the_top_but_the_envelope(value: Any) -> None:
    sealing.use(KeyRing(K1))
    try:
        stored = json.loads(sealing.dumps(value))
    finally:
        sealing.use(None)
    assert list(stored) == [SEALED] and stored[SEALED].startswith("v1.k1.")


def test_a_forged_envelope_in_an_input_stays_the_users_value(keys: str | None) -> None:
    forged = {"note": {SEALED: "v1.k9.AAAA"}, "list": [{SEALED: ["x"]}]}
    stored = sealing.dumps(forged)
    assert sealing.open_text(stored) == forged  # not opened: no KeyMissing for k9


def test_a_key_the_ring_lacks_is_named_and_is_an_interruption() -> None:
    sealed = KeyRing(K2).seal({"a": 1})
    with pytest.raises(KeyMissing, match="sealed under key 'k2'.*its ids: k1") as got:
        KeyRing(K1).load(sealed)
    assert got.value.key_id == "k2" and isinstance(got.value, sealing.PayloadKeyError)
    from cairn.core.errors import Interrupted, Transient

    # The loop lets it through (the run is handed back, never failed), not as an outage
    # a step's Retry policy would count.
    assert isinstance(got.value, Interrupted) and not isinstance(got.value, Transient)


def test_the_store_builds_jsonb_only_through_the_payloads_module() -> None:
    """Every jsonb parameter of the store is a Payload (sealed) or a Clear (escaped): a
    plain Jsonb, or a json dumps of the driver's, would go around the sealing path."""
    found = []
    for path in sorted((ROOT / "store").rglob("*.py")):
        if path.name == "payloads.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\bJsonb\b|\bJson\b|set_json_dumps", line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == []
