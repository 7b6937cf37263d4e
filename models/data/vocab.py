"""Joint German+English SentencePiece vocabulary trained on the training split."""
from __future__ import annotations

from pathlib import Path

import sentencepiece as spm

# Ids the model code relies on (pad must be 0 so zero-padded batches are pads).
SPECIAL_IDS = {"pad_id": 0, "unk_id": 1, "bos_id": 2, "eos_id": 3}


def train(inputs: list[Path], model_prefix: Path, vocab_size: int, seed: int = 1,
          threads: int = 1, hard_vocab_limit: bool = True,
          input_sentence_size: int = 2_000_000, model_type: str = "unigram") -> Path:
    """Unigram model, full character coverage (German umlauts/ß and the odd
    symbol must not become <unk>), nmt_nfkc normalisation; returns spm.model.
    (Tests build `word` models: one piece per word.)"""
    spm.set_random_generator_seed(seed)      # sampling of input sentences
    spm.SentencePieceTrainer.train(
        input=[str(p) for p in inputs],
        model_prefix=str(model_prefix),
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=1.0,
        normalization_rule_name="nmt_nfkc",
        input_sentence_size=input_sentence_size,
        shuffle_input_sentence=True,
        hard_vocab_limit=hard_vocab_limit,
        num_threads=threads,
        minloglevel=2,
        **SPECIAL_IDS,
    )
    return Path(str(model_prefix) + ".model")


def size(model: Path) -> int:
    return spm.SentencePieceProcessor(model_file=str(model)).get_piece_size()
