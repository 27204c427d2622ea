"""``tinygpt.cli.fold``: a reader's text mapped to the characters a model knows."""

from __future__ import annotations

import string

from hypothesis import given
from hypothesis import strategies as st

from tinygpt.cli.fold import Change, describe, fold

PLAYS = set(string.ascii_letters + " ,.;:!?'-\n" + "2468")  # a vocabulary without 0 1 3 5 7 9


def test_the_nearest_known_characters():
    folded = fold("\u201cCaf\u00e9\u201d \u2014 \ufb01ne\u2026 in 1603, or 246 \u20ac", PLAYS)
    assert folded.text == "'Cafe' - fine... in one six nought three, or 246 "
    assert Change(0, "\u201c", "'") in folded.changes
    assert Change(17, "1603", "one six nought three") in folded.changes
    assert folded.dropped == (Change(30, "\u20ac", ""),)


def test_another_case_when_only_one_is_known():
    assert fold("To BE", set("tobe ")).text == "to be"


def test_describe_counts_from_the_readers_first_character():
    said = describe(fold("a\u20acb\u00e9", set("abe")), first=10)
    assert said == "mapped 1 ('é' at 13 -> 'e'); dropped 1 ('€' at 11)"
    assert describe(fold("abc", set("abc"))) is None


@given(st.text())
def test_the_result_holds_only_known_characters(text):
    folded = fold(text, PLAYS)
    assert set(folded.text) <= PLAYS
    assert all(0 <= c.position < len(text) and text.startswith(c.original, c.position)
               for c in folded.changes)


@given(st.text(alphabet=sorted(PLAYS)))
def test_known_text_is_left_as_it_is(text):
    assert fold(text, PLAYS).text == text and fold(text, PLAYS).changes == ()
