"""The steering success criterion of ``prepare``: French function words counted from the text alone."""

from __future__ import annotations

import pytest

from trajscope.prepare.steer_stage import is_french, word_counts


def test_french_and_english_answers():
    assert is_french("Pour faire une sauce tomate, il faut des tomates et de l'huile dans la poêle.")
    assert not is_french("To make a simple tomato sauce, you need tomatoes and some oil in the pan.")


def test_too_few_words_or_mixed_text_is_not_french():
    assert not is_french("la")  # fewer than MIN_WORDS French function words
    assert not is_french("The sauce de la maison is the best in the city and it is very good.")
    assert word_counts("l'huile et le pain") == (2, 0)


def test_distinct_share_flags_repetition():
    from trajscope.prepare.steer_stage import distinct_share

    assert distinct_share("la la la la la la") == pytest.approx(1 / 6)
    assert distinct_share("Le chat dort sur la chaise.") == 1.0 and distinct_share("") == 1.0
