"""The read side decodes a run's token ids as ``transformers`` would, without importing it (`stepwise.views.store`)."""

from __future__ import annotations

import json
import shutil

from hypothesis import given, settings
from hypothesis import strategies as st

from local.simulator.model import ASSETS_DIR
from stepwise.views import store as views_store

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def _auto(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def test_a_tokenizer_json_is_decoded_by_the_tokenizers_library_as_transformers_decodes_it(tmp_path):
    for name in _TOKENIZER_FILES:
        shutil.copy(ASSETS_DIR / name, tmp_path / name)
    decoder, auto = views_store._decoder(str(tmp_path)), _auto(tmp_path)
    assert type(decoder).__module__.startswith("tokenizers")  # no transformers import for the views
    vocab = auto.vocab_size + len(auto.get_added_vocab())

    @settings(max_examples=200, deadline=None)
    @given(st.lists(st.integers(0, vocab - 1), max_size=40))
    def same(ids):
        assert views_store.Tokenizer(decoder).decode(ids) == auto.decode(ids, skip_special_tokens=False)

    same()
    text = auto.apply_chat_template([{"role": "user", "content": "What digit comes after 3?"}], tokenize=False,
                                    add_generation_prompt=True)
    ids = auto.encode(text, add_special_tokens=False)
    assert views_store.Tokenizer(decoder).decode(ids) == text


def test_a_tokenizer_whose_config_cleans_up_spaces_is_loaded_by_transformers(tmp_path):
    for name in _TOKENIZER_FILES:
        shutil.copy(ASSETS_DIR / name, tmp_path / name)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "clean_up_tokenization_spaces": True}))
    assert not type(views_store._decoder(str(tmp_path))).__module__.startswith("tokenizers")
