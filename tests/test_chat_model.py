"""The book's chat model (``tinygpt.book.chat_model``): its conversations and its recipe.

The held-out conversations come from plays the book's model never trained on (wholly in the
validation text, by position in the complete plays) and the training ones from other plays;
the recipe fits its conversations and replies in the book model's context.
"""

from __future__ import annotations

import pytest

from tinygpt import chat, data
from tinygpt.book import chat_model
from tinygpt.shakespeare import IambicNotFoundError, plays, shakespeare


@pytest.fixture(scope="module")
def split():
    try:
        return chat_model.conversations()
    except IambicNotFoundError as err:
        pytest.skip(str(err))


def test_no_play_is_in_both_and_the_held_out_ones_are_validation_text(split):
    train, held_out = split
    train_titles, held_out_titles = {c.title for c in train}, {c.title for c in held_out}
    assert train_titles and held_out_titles and not train_titles & held_out_titles
    validation = data.split_train_val(shakespeare())[1]
    for play in plays():
        if play.title in held_out_titles:
            assert play.text in validation
        if play.title in train_titles:
            assert play.text not in validation


def test_every_conversation_and_reply_fits_the_context(split):
    train, held_out = split
    T = chat_model.BASE_RECIPE.model.block_size
    longest_prompt = max(len(chat.prompt(c.speaker, c.speech, c.replier))
                         for c in train + held_out)
    assert max(len(chat.render(c)) for c in train + held_out) <= T + 1
    # sample_replies writes up to max_chars and a ■ after the longest prompt
    assert longest_prompt + chat_model.CHAT_RECIPE.max_chars + 1 <= T + 1
