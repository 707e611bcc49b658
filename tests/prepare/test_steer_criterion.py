"""The steering success criterion of ``prepare``: French function words counted from the text alone, by the
steering-success study's own functions (one criterion, not a copy)."""

from __future__ import annotations

import pytest

from trajscope.prepare import steer_stage
from trajscope.prepare.steer_stage import is_french, language_counts


def test_french_and_english_answers():
    assert is_french("Pour faire une sauce tomate, il faut des tomates et de l'huile dans la poêle.")
    assert not is_french("To make a simple tomato sauce, you need tomatoes and some oil in the pan.")


def test_too_few_words_or_mixed_text_is_not_french():
    assert not is_french("la")  # fewer than MIN_WORDS French function words
    assert not is_french("The sauce de la maison is the best in the city and it is very good.")
    assert language_counts("l'huile et le pain") == (2, 0)


def test_the_stage_counts_with_the_steering_success_criterion():
    """The stage's rows come from :mod:`trajscope.metrics.steering` (a curly apostrophe elides like a straight
    one: "it’s" counts no English word, where the stage's former copy counted "it")."""
    from trajscope.metrics import steering

    assert steer_stage.is_french is steering.is_french and steer_stage.language_counts is steering.language_counts
    assert language_counts("it’s what they’re for") == language_counts("it's what they're for") == (0, 1)


def test_distinct_share_flags_repetition():
    from trajscope.prepare.steer_stage import distinct_share

    assert distinct_share("la la la la la la") == pytest.approx(1 / 6)
    assert distinct_share("Le chat dort sur la chaise.") == 1.0 and distinct_share("") == 1.0
