"""The instruction tokenizer: a word-level ``tokenizers`` model trained on the task family's text.

Trained once on every instruction the task family can produce
(:meth:`TaskFamily.instructions <sim_scenes.tasks.TaskFamily.instructions>`; touch: templates x
colours x shape words), saved as ``tokenizer.json`` beside the model and shipped with the
exported policy, so the edge runtime tokenizes exactly as training did. Unknown words map to
``[UNK]`` instead of failing.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

PAD, UNK = "[PAD]", "[UNK]"
TOKENIZER_FILE = "tokenizer.json"


class InstructionTokenizer:
    """Text -> fixed-length token ids (int64) plus an attention mask."""

    def __init__(self, tokenizer: Tokenizer, max_tokens: int) -> None:
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.tokenizer.enable_padding(pad_id=self.pad_id, pad_token=PAD, length=max_tokens)
        self.tokenizer.enable_truncation(max_length=max_tokens)

    @classmethod
    def train(cls, corpus: Iterable[str], max_tokens: int = 12) -> InstructionTokenizer:
        """Train a lower-cased, whitespace-split word-level vocabulary on ``corpus``."""
        tok = Tokenizer(models.WordLevel(unk_token=UNK))
        tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.train_from_iterator(list(corpus), trainers.WordLevelTrainer(special_tokens=[PAD, UNK]))
        return cls(tok, max_tokens)

    @classmethod
    def load(cls, directory: str | Path, max_tokens: int) -> InstructionTokenizer:
        """Load ``directory/tokenizer.json``."""
        return cls(Tokenizer.from_file(str(Path(directory) / TOKENIZER_FILE)), max_tokens)

    def save(self, directory: str | Path) -> None:
        """Write ``directory/tokenizer.json``."""
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.tokenizer.save(str(Path(directory) / TOKENIZER_FILE))

    @property
    def pad_id(self) -> int:
        """Id of the padding token."""
        pad = self.tokenizer.token_to_id(PAD)
        assert pad is not None
        return int(pad)

    @property
    def vocab_size(self) -> int:
        """Number of token ids."""
        return int(self.tokenizer.get_vocab_size())

    def __call__(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and attention mask (1 = real token), int64 ``(len(texts), max_tokens)``."""
        encodings = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        return ids, mask
