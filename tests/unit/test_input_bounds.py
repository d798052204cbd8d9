"""The depth bound (#52), without a server: check_input walks a value of any depth, a
cycle too, with a stack of its own and refuses past MAX_DEPTH; too_deep tells a JSON
text's depth without parsing it (strings and their escapes skipped) exactly as a parser
would count it, whatever the bytes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cairn.core.errors import InvalidInput
from cairn.core.inputs import BODY_DEPTH, MAX_DEPTH, check_input, too_deep

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab', max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(alphabet='[]{}"\\ab', max_size=3), inner, max_size=3)
    ),
    max_leaves=40,
)


def depth_of(value: Any) -> int:
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d + 1)
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


@given(value=JSON, most=st.integers(0, 8))
def test_too_deep_counts_as_a_parser_does(value: Any, most: int) -> None:
    text = json.dumps(value).encode()
    assert too_deep(text, most) == (depth_of(value) > most)


@given(st.binary(max_size=300), st.integers(0, 5))
def test_too_deep_takes_any_bytes(body: bytes, most: int) -> None:
    too_deep(body, most)  # no exception, whatever it is


def test_the_body_bound_is_a_value_at_the_bound_in_its_envelope() -> None:
    at = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert not too_deep(('{"input": %s}' % at).encode())  # noqa: UP031
    assert too_deep(('{"input": [%s]}' % at).encode())  # noqa: UP031
    assert BODY_DEPTH == MAX_DEPTH + 1
    # A megabyte of the worst kind: an answer well inside a request's time.
    assert too_deep(b"[" * 500_000 + b"]" * 500_000)
    assert not too_deep(b"[" + b"[1]," * 250_000 + b"[1]]")


def _deep(depth: int, leaf: Any = 1) -> Any:
    """Objects and lists within one another, an object outermost, built without recursion."""
    value = leaf
    for i in range(depth):
        value = {"k": value} if (depth - i) % 2 else [value]
    return value


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 256, 1_000, 100_000])
def test_check_input_refuses_a_value_too_deep_at_any_depth(depth: int) -> None:
    value = _deep(depth)
    with pytest.raises(InvalidInput, match=f"deeper than {MAX_DEPTH} levels"):
        check_input(value, 10**9)


def test_check_input_takes_the_bound_and_an_envelope_adds_its_levels() -> None:
    at = _deep(MAX_DEPTH)
    assert depth_of(at) == MAX_DEPTH and check_input(at, 10**9) is at
    with pytest.raises(InvalidInput, match="payload nests deeper"):
        check_input({"payload": at}, 10**9, what="payload")
    assert check_input({"payload": at}, 10**9, what="payload", envelope=1)
    with pytest.raises(InvalidInput, match="payload nests deeper"):
        check_input({"payload": [at]}, 10**9, what="payload", envelope=1)


def test_check_input_refuses_a_cycle_and_a_nul_anywhere() -> None:
    cycle: dict[str, Any] = {}
    cycle["me"] = cycle
    with pytest.raises(InvalidInput, match="deeper than"):
        check_input(cycle, 10**9)
    for hidden in (_deep(40, "a\x00b"), {"k\x00": 1}, [{"deep\x00key": None}]):
        with pytest.raises(InvalidInput, match="NUL"):
            check_input({"v": hidden}, 10**9)
