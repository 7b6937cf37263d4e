"""Tokenizer.decode_word, the remembered form of decode(ids).strip() that the step calls once per target word:
the same text for every piece of the shipped vocabulary and for runs of pieces, before and after its memory
starts afresh; a word with <unk> is what SentencePiece decodes without its " ⁇ " (given no source text to copy)."""
from __future__ import annotations

import random
from pathlib import Path

import models.tokenizer as tokenizer_module
from models.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]


def test_a_remembered_word_is_what_sentencepiece_decodes(monkeypatch):
    tok = Tokenizer(ROOT / "models/checkpoints/gma_delta1/spm.model")
    rng = random.Random(0)
    words = [[i] for i in range(tok.vocab_size)]   # every piece, the control pieces and <unk> included
    words += [[rng.randrange(tok.vocab_size) for _ in range(rng.randint(2, 5))] for _ in range(5000)]
    for ids in words[-500:]:   # words with <unk> anywhere, as the model may write them
        ids.insert(rng.randint(0, len(ids)), tok.unk_id)
    monkeypatch.setattr(tokenizer_module, "WORD_MEMO", 3000)   # so that the memory starts afresh on the way
    for _ in range(2):   # the second pass answers from memory where it can
        for ids in words:
            assert tok.decode_word(ids) == tok.decode([i for i in ids if i != tok.unk_id]).strip(), ids
    assert 0 < len(tok._words) <= 3000
    assert tok.decode_word([]) == ""
    assert sum(tok.unk_id in ids for ids in words) > 100   # (the <unk> words were exercised)


def test_vocabularies_compare_by_their_pieces_not_their_bytes(tmp_path):
    """Trained alike from two paths: other bytes (SentencePiece records the input's path), the same ids. Other
    pieces at one id, another size, another score or normalisation: a reason naming it."""
    from models.data.synthetic import make_pairs, make_tokenizer
    from models.tokenizer import vocabulary_difference
    pairs = make_pairs(300, seed=5)
    a, b = (make_tokenizer(tmp_path / d, "word", pairs=pairs) for d in ("a", "b"))
    assert a.proto != b.proto and vocabulary_difference(a, b) is None
    upper = make_tokenizer(tmp_path / "upper", "word", pairs=[(s.title(), t.title()) for s, t in pairs])
    assert upper.vocab_size == a.vocab_size
    assert vocabulary_difference(a, upper).startswith("piece ")
    pieces = make_tokenizer(tmp_path / "pieces", "unigram", vocab_size=30, pairs=pairs)
    assert vocabulary_difference(a, pieces) == f"{a.vocab_size} pieces against {pieces.vocab_size}"
    shipped = Tokenizer(ROOT / "models/checkpoints/gma_delta1/spm.model")
    assert vocabulary_difference(shipped, Tokenizer(ROOT / "models/checkpoints/offline/spm.model")) is None
    # the same pieces, scored or normalised otherwise (edited in the model file itself)
    from sentencepiece import sentencepiece_model_pb2 as pb
    proto = pb.ModelProto.FromString(a.proto)
    proto.pieces[7].score -= 1.0
    assert vocabulary_difference(a, Tokenizer(proto.SerializeToString())) == \
        f"piece 7 ({a.sp.id_to_piece(7)!r}) has another kind or score"
    proto = pb.ModelProto.FromString(a.proto)
    proto.normalizer_spec.name, proto.normalizer_spec.precompiled_charsmap = "identity", b""
    assert vocabulary_difference(a, Tokenizer(proto.SerializeToString())) == "they normalise text differently"
